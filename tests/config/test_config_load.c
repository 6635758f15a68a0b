/* Valid configs load to the exact values they say (defaults included), and
 * the printed form loads back to the same configuration. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "units.h"

static int failures;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);        \
			failures++;                                                   \
		}                                                                     \
	} while (0)
#define CHECK_STR(a, b)                                                                         \
	do {                                                                                    \
		const char *a_ = (a), *b_ = (b);                                                \
		if (!a_ || !b_ || strcmp(a_, b_)) {                                             \
			printf("FAIL %s:%d: %s is \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #a, \
			       a_ ? a_ : "(null)", b_);                                         \
			failures++;                                                             \
		}                                                                               \
	} while (0)

static char dir[] = "/tmp/gg-config-load-XXXXXX";

static void put(const char *name, const char *text, mode_t mode)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
	if (fd < 0 || write(fd, text, strlen(text)) < 0 || fchmod(fd, mode) || close(fd)) {
		perror(path);
		exit(1);
	}
}

/* Writes `text` as NAME in the scratch folder and loads it; problems are
 * printed. */
static int load(const char *name, const char *text, struct gg_config *cfg, char *path, size_t size)
{
	struct gg_diag diag = { 0 };

	put(name, text, 0644);
	snprintf(path, size, "%s/%s", dir, name);
	int rc = gg_config_load(path, cfg, &diag);
	gg_diag_print(&diag, stdout);
	gg_diag_free(&diag);
	CHECK(rc == 0);
	return rc;
}

static void test_units(void)
{
	const char *why;
	uint64_t v;
	char buf[32];

	CHECK(gg_parse_size("4MiB", &v, &why) == 0 && v == 4u << 20);
	CHECK(gg_parse_size("64 KiB", &v, &why) == 0 && v == 64u << 10);
	CHECK(gg_parse_size("1500", &v, &why) == 0 && v == 1500);
	CHECK(gg_parse_size("1_000kB", &v, &why) == 0 && v == 1000000);
	CHECK(gg_parse_size("2GB", &v, &why) == 0 && v == 2000000000ull);
	CHECK(gg_parse_size("1__000", &v, &why) == -EINVAL);
	CHECK(gg_parse_size("1000_", &v, &why) == -EINVAL);
	CHECK(gg_parse_size("1_000_", &v, &why) == -EINVAL);
	CHECK(gg_parse_size("4mib", &v, &why) == -EINVAL);
	CHECK(gg_parse_size("", &v, &why) == -EINVAL);
	CHECK(gg_parse_size("MiB", &v, &why) == -EINVAL);
	CHECK(gg_parse_size("-1", &v, &why) == -EINVAL);
	CHECK(gg_parse_size("18446744073709551616", &v, &why) == -ERANGE);
	CHECK(gg_parse_size("17179869184GiB", &v, &why) == -ERANGE);
	CHECK(gg_parse_duration("500ms", &v, &why) == 0 && v == 500000);
	CHECK(gg_parse_duration("1m30s", &v, &why) == 0 && v == 90000000);
	CHECK(gg_parse_duration("1h", &v, &why) == 0 && v == 3600000000ull);
	CHECK(gg_parse_duration("10us", &v, &why) == 0 && v == 10);
	CHECK(gg_parse_duration("1h2m3s4ms5us", &v, &why) == 0 && v == 3723004005ull);
	CHECK(gg_parse_duration("30s1m", &v, &why) == -EINVAL);
	CHECK_STR(why, "units must go from the largest to the smallest, each once, as in \"1m30s\"");
	CHECK(gg_parse_duration("1h1h", &v, &why) == -EINVAL);
	CHECK(gg_parse_duration("1_000ms", &v, &why) == 0 && v == 1000000);
	CHECK(gg_parse_duration("5", &v, &why) == -EINVAL);
	CHECK(gg_parse_duration("1.5s", &v, &why) == -EINVAL);
	CHECK_STR(why, "durations are whole numbers: use a smaller unit, as in \"500ms\" for 0.5s, or parts, as in "
		       "\"1m30s\"");
	CHECK(gg_parse_duration(" 1m 30 s ", &v, &why) == 0 && v == 90000000);
	CHECK(gg_parse_duration("1s ", &v, &why) == 0 && v == 1000000);
	/* Blanks are TOML's: tabs too. */
	CHECK(gg_parse_duration("\t1m\t30s", &v, &why) == 0 && v == 90000000);
	CHECK(gg_parse_size("4\tKiB\t", &v, &why) == 0 && v == 4u << 10);
	CHECK(gg_parse_size("4\nKiB", &v, &why) == -EINVAL);
	CHECK(gg_parse_duration("  ", &v, &why) == -EINVAL);
	CHECK(gg_parse_size("1.5MiB", &v, &why) == -EINVAL);
	CHECK_STR(why, "sizes are whole numbers: use a smaller unit, as in \"1536KiB\" for 1.5MiB");
	CHECK(gg_parse_duration("", &v, &why) == -EINVAL);
	CHECK(gg_parse_duration("99999999999999999h", &v, &why) == -ERANGE);
	CHECK_STR(gg_format_size(4u << 20, buf, sizeof(buf)), "4MiB");
	CHECK_STR(gg_format_size(1500, buf, sizeof(buf)), "1500B");
	CHECK_STR(gg_format_size(0, buf, sizeof(buf)), "0B");
	/* A decimal unit only where it is shorter. */
	CHECK_STR(gg_format_size(1000000000000ull, buf, sizeof(buf)), "1TB");
	CHECK_STR(gg_format_size(1000, buf, sizeof(buf)), "1kB");
	CHECK_STR(gg_format_size(4096000, buf, sizeof(buf)), "4096kB");
	CHECK_STR(gg_format_size(1000ull << 20, buf, sizeof(buf)), "1000MiB");
	CHECK_STR(gg_format_size(1ull << 40, buf, sizeof(buf)), "1TiB");
	CHECK_STR(gg_format_duration(90000000, buf, sizeof(buf)), "90s");
	CHECK_STR(gg_format_duration(500000, buf, sizeof(buf)), "500ms");
	CHECK_STR(gg_format_duration(120000000, buf, sizeof(buf)), "2m");
	CHECK_STR(gg_format_duration(0, buf, sizeof(buf)), "0s");
	/* Elapsed times, rounded down for people to read. */
	static const struct {
		uint64_t us;
		const char *text;
	} elapsed[] = { { 850, "850us" },     { 3448, "3ms" },          { 2001096, "2.0s" },
			{ 9999999, "9.9s" },  { 40500000, "40s" },      { 360000000, "6m" },
			{ 372000000, "6m12s" }, { 7200000000ull, "2h" }, { 7500000000ull, "2h5m" } };
	for (size_t i = 0; i < sizeof(elapsed) / sizeof(elapsed[0]); i++)
		CHECK_STR(gg_format_elapsed(elapsed[i].us, buf, sizeof(buf)), elapsed[i].text);
}

static const char minimal[] = "[site]\nname = \"site-a\"\nlisten = \"127.0.0.1:7101\"\n"
			      "[tls]\nca = \"ca.pem\"\ncert = \"cert.pem\"\nkey = \"key.pem\"\n"
			      "[[peers]]\nsite = \"site-b\"\naddress = \"[::1]:7102\"\n";

static void test_defaults(void)
{
	struct gg_config cfg;
	char path[256], want[256];

	if (load("minimal.toml", minimal, &cfg, path, sizeof(path)))
		return;
	CHECK_STR(cfg.source, path);
	CHECK_STR(cfg.site.name, "site-a");
	CHECK_STR(cfg.site.listen, "127.0.0.1:7101");
	CHECK_STR(cfg.site.control, "unix:/run/gradgate/site-a.sock");
	cpu_set_t cpus;
	CHECK(sched_getaffinity(0, sizeof(cpus), &cpus) == 0);
	CHECK(cfg.site.threads == GG_MIN(CPU_COUNT(&cpus), 64)); /* one per CPU */
	snprintf(want, sizeof(want), "%s/ca.pem", dir);
	CHECK_STR(cfg.tls.ca, want);
	snprintf(want, sizeof(want), "%s/key.pem", dir);
	CHECK_STR(cfg.tls.key, want);
	CHECK(cfg.tls.crl == NULL);
	CHECK_STR(cfg.tls.ciphersuites,
		  "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256");
	CHECK_STR(cfg.tls.groups, "X25519:P-256");
	CHECK(cfg.peer_count == 1);
	CHECK_STR(cfg.peers[0].site, "site-b");
	CHECK_STR(cfg.peers[0].address, "[::1]:7102");
	CHECK_STR(cfg.peers[0].identity, "dns:site-b");
	CHECK(cfg.peers[0].dial == GG_DIAL_BOTH);
	CHECK(cfg.transport.streams_per_peer == 4);
	CHECK(cfg.transport.chunk_bytes == 1u << 20);
	CHECK(cfg.transport.socket_buffer_bytes == 0); /* auto */
	CHECK(cfg.transport.socket_buffer_max_bytes == 64u << 20);
	CHECK(cfg.transport.heartbeat_interval_us == 1000000);
	CHECK(cfg.transport.heartbeat_timeout_us == 10000000);
	CHECK(cfg.transport.connect_timeout_us == 5000000);
	CHECK(cfg.transport.handshake_timeout_us == 5000000);
	CHECK(cfg.transport.step_timeout_us == 60000000);
	CHECK(cfg.transport.reconnect_min_us == 100000);
	CHECK(cfg.transport.reconnect_max_us == 10000000);
	CHECK(cfg.compression.codec == GG_CODEC_BF16_SPLIT);
	CHECK(cfg.compression.block_size == 256);
	CHECK(cfg.compression.scale == GG_SCALE_F32);
	CHECK(cfg.compression.zstd_level == 1);
	CHECK(cfg.compression.error_feedback);
	CHECK(cfg.allreduce.algorithm == GG_ALLREDUCE_RING);
	CHECK(cfg.limits.memory_bytes == 4ull << 30);
	CHECK(cfg.limits.inflight_bytes_per_peer == 256u << 20);
	CHECK(cfg.limits.max_message_bytes == 2ull << 30);
	CHECK(cfg.limits.max_clients == 64);
	CHECK(cfg.metrics.listen == NULL); /* no [metrics]: no endpoint */
	CHECK(!cfg.metrics.allow_remote);

	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);
	CHECK(gg_config_print(&cfg, f) == 0);
	fclose(f);
	CHECK(strstr(out, "\nstreams_per_peer = 4  # default; ") != NULL);
	CHECK(strstr(out, "\nchunk_size = \"1MiB\"  # default; ") != NULL);
	CHECK(strstr(out, "\nname = \"site-a\"  # this site") != NULL);
	CHECK(strstr(out, "\n# crl: not set") != NULL);
	CHECK(strstr(out, "\n[metrics]\n# listen: not set") != NULL);
	CHECK(strstr(out, "\ndial = \"both\"  # default; ") != NULL);
	free(out);
	gg_config_free(&cfg);
}

static const char full[] =
	"[site]\nname = \"eu-west-1\"\nlisten = \"gw.eu.example.net:443\"\n"
	"control = \"unix:/run/gradgate/eu.sock\"\nthreads = 1\n"
	"[tls]\nca = \"ca.pem\"\ncert = \"cert.pem\"\nkey = \"key.pem\"\ncrl = \"crl.pem\"\n"
	"ciphersuites = [\"TLS_CHACHA20_POLY1305_SHA256\", \"TLS_AES_128_GCM_SHA256\"]\n"
	"groups = [\"P-384\", \"X25519\"]\n"
	"[[peers]]\nsite = \"us-east-1\"\naddress = \"203.0.113.7:7101\"\n"
	"identity = \"uri:spiffe://gradgate.test/us-east-1\"\ndial = \"out\"\n"
	"[[peers]]\nsite = \"ap-south-1\"\nidentity = \"dns:ap.gradgate.test\"\n" /* behind NAT: it dials in */
	"dial = \"in\"\n"
	"[[peers]]\nsite = \"sa-east-1\"\naddress = \"[2001:db8::1]:7101\"\n"
	"[transport]\nstreams_per_peer = 16\nchunk_size = 262144\nsocket_buffer = \"16MiB\"\n"
	"heartbeat_interval = \"250ms\"\nheartbeat_timeout = \"1m30s\"\nconnect_timeout = \"3s\"\n"
	"handshake_timeout = \"2s\"\nstep_timeout = \"2m\"\nreconnect_min = \"50ms\"\nreconnect_max = \"30s\"\n"
	"[compression]\ncodec = \"int4\"\nblock_size = 128\nscale = \"fp16\"\nzstd_level = 0\nerror_feedback = false\n"
	"[allreduce]\nalgorithm = \"direct\"\n"
	"[limits]\nmemory = \"8GiB\"\ninflight_per_peer = \"1GiB\"\nmax_message = \"512MiB\"\nmax_clients = 16\n"
	"[metrics]\nlisten = \"0.0.0.0:9464\"\nallow_remote = true\n";

static void test_full_and_round_trip(void)
{
	struct gg_config cfg, again;
	struct gg_diag diag = { 0 };
	char path[256];

	put("crl.pem", "x\n", 0644);
	if (load("full.toml", full, &cfg, path, sizeof(path)))
		return;
	CHECK_STR(cfg.site.name, "eu-west-1");
	CHECK_STR(cfg.site.listen, "gw.eu.example.net:443");
	CHECK_STR(cfg.site.control, "unix:/run/gradgate/eu.sock");
	CHECK(cfg.site.threads == 1);
	CHECK(cfg.tls.crl != NULL && strstr(cfg.tls.crl, "/crl.pem"));
	CHECK_STR(cfg.tls.ciphersuites, "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256");
	CHECK_STR(cfg.tls.groups, "P-384:X25519");
	CHECK(cfg.peer_count == 3);
	CHECK_STR(cfg.peers[0].identity, "uri:spiffe://gradgate.test/us-east-1");
	CHECK(cfg.peers[1].address == NULL);
	CHECK_STR(cfg.peers[2].address, "[2001:db8::1]:7101");
	CHECK_STR(cfg.peers[1].identity, "dns:ap.gradgate.test");
	CHECK(cfg.peers[0].dial == GG_DIAL_OUT && cfg.peers[1].dial == GG_DIAL_IN);
	CHECK(gg_config_peer(&cfg, "ap-south-1") == &cfg.peers[1] && !gg_config_peer(&cfg, "eu-west-1"));
	CHECK(cfg.transport.streams_per_peer == 16);
	CHECK(cfg.transport.chunk_bytes == 262144);
	CHECK(cfg.transport.socket_buffer_bytes == 16u << 20);
	CHECK(cfg.transport.heartbeat_interval_us == 250000);
	CHECK(cfg.transport.heartbeat_timeout_us == 90000000);
	CHECK(cfg.transport.step_timeout_us == 120000000);
	CHECK(cfg.transport.reconnect_min_us == 50000);
	CHECK(cfg.compression.codec == GG_CODEC_INT4);
	CHECK(cfg.compression.block_size == 128);
	CHECK(cfg.compression.scale == GG_SCALE_F16);
	CHECK(cfg.compression.zstd_level == 0);
	CHECK(!cfg.compression.error_feedback);
	CHECK(cfg.allreduce.algorithm == GG_ALLREDUCE_DIRECT);
	CHECK(cfg.limits.memory_bytes == 8ull << 30);
	CHECK(cfg.limits.max_message_bytes == 512u << 20);
	CHECK(cfg.limits.max_clients == 16);
	CHECK_STR(cfg.metrics.listen, "0.0.0.0:9464");
	CHECK(cfg.metrics.allow_remote);

	/* What --check-config prints must load back to the same settings. */
	char *first = NULL, *second = NULL;
	size_t n1 = 0, n2 = 0;
	FILE *f = open_memstream(&first, &n1);
	CHECK(gg_config_print(&cfg, f) == 0);
	fclose(f);
	int rc = gg_config_load_text(first, n1, path, NULL, &again, &diag);
	gg_diag_print(&diag, stdout);
	CHECK(rc == 0);
	gg_diag_free(&diag);
	if (rc == 0) {
		f = open_memstream(&second, &n2);
		CHECK(gg_config_print(&again, f) == 0);
		fclose(f);
		CHECK(n1 == n2 && !strcmp(first, second));
		gg_config_free(&again);
	}
	free(first);
	free(second);
	gg_config_free(&cfg);
}

/* Relative paths print absolute, so what --check-config prints loads back
 * to the same files from another folder, and prints the same again (but
 * for the first line, which names the file). */
static void test_relative_paths_round_trip(void)
{
	static const char text[] = "[site]\nname = \"site-a\"\nlisten = \"127.0.0.1:7101\"\n"
				   "[tls]\nca = \"certs/ca.pem\"\ncert = \"./certs//cert.pem\"\n"
				   "key = \"certs/key.pem\"\ncrl = \"../crl.pem\"\n"
				   "[[peers]]\nsite = \"site-b\"\naddress = \"127.0.0.1:7102\"\n";
	struct gg_config cfg, again;
	struct gg_diag diag = { 0 };
	char cwd[PATH_MAX], path[256], want[512];
	char *first = NULL, *second = NULL;
	size_t n1 = 0, n2 = 0;

	snprintf(path, sizeof(path), "%s/sub", dir);
	CHECK(mkdir(path, 0755) == 0);
	snprintf(path, sizeof(path), "%s/sub/certs", dir);
	CHECK(mkdir(path, 0755) == 0);
	put("sub/certs/ca.pem", "x\n", 0644);
	put("sub/certs/cert.pem", "x\n", 0644);
	put("sub/certs/key.pem", "x\n", 0600);
	put("crl.pem", "x\n", 0644);
	put("sub/base.toml", text, 0644);
	if (!getcwd(cwd, sizeof(cwd)) || chdir(dir)) {
		perror(dir);
		failures++;
		return;
	}
	int rc = gg_config_load("sub/base.toml", &cfg, &diag);
	gg_diag_print(&diag, stdout);
	gg_diag_free(&diag);
	CHECK(rc == 0);
	if (rc == 0) {
		snprintf(want, sizeof(want), "%s/sub/certs/ca.pem", dir);
		CHECK_STR(cfg.tls.ca, want);
		snprintf(want, sizeof(want), "%s/sub/certs/cert.pem", dir);
		CHECK_STR(cfg.tls.cert, want);
		snprintf(want, sizeof(want), "%s/sub/../crl.pem", dir);
		CHECK_STR(cfg.tls.crl, want);
		FILE *f = open_memstream(&first, &n1);
		CHECK(gg_config_print(&cfg, f) == 0);
		fclose(f);
		put("sub/printed.toml", first, 0644);
		gg_config_free(&cfg);
	}
	rc = rc ? rc : chdir("sub");
	if (rc == 0) {
		rc = gg_config_load("printed.toml", &again, &diag);
		gg_diag_print(&diag, stdout);
		gg_diag_free(&diag);
		CHECK(rc == 0);
	}
	if (rc == 0) {
		FILE *f = open_memstream(&second, &n2);
		CHECK(gg_config_print(&again, f) == 0);
		fclose(f);
		const char *body1 = strchr(first, '\n'), *body2 = strchr(second, '\n');
		CHECK(body1 && body2 && !strcmp(body1, body2));
		gg_config_free(&again);
	}
	CHECK(chdir(cwd) == 0);
	free(first);
	free(second);
	const char *names[] = { "sub/certs/ca.pem", "sub/certs/cert.pem", "sub/certs/key.pem", "sub/base.toml",
				"sub/printed.toml", "sub/certs", "sub" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		remove(path);
	}
}

/* The metrics endpoint listens on loopback unless allow_remote says
 * otherwise; every spelling of loopback counts as one. */
static void test_metrics_listen(void)
{
	static const struct {
		const char *listen;
		bool loopback;
	} cases[] = {
		{ "127.0.0.1:9464", true },    { "127.1.2.3:1", true },       { "[::1]:9464", true },
		{ "[0:0:0:0:0:0:0:1]:9464", true }, { "[::ffff:127.0.0.1]:9464", true }, { "localhost:9464", true },
		{ "LocalHost:9464", true },     { "0.0.0.0:9464", false },     { "10.0.0.5:9464", false },
		{ "[::]:9464", false },         { "[::ffff:10.0.0.1]:9464", false }, { "128.0.0.1:9464", false },
		{ "metrics.example.net:9464", false }, { "localhost.example.net:9464", false },
	};
	char text[1024], path[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		for (int remote = 0; remote < 2; remote++) {
			struct gg_config cfg;
			struct gg_diag diag = { 0 };
			snprintf(text, sizeof(text), "%s[metrics]\nlisten = \"%s\"\n%s", minimal, cases[i].listen,
				 remote ? "allow_remote = true\n" : "");
			put("metrics.toml", text, 0644);
			snprintf(path, sizeof(path), "%s/metrics.toml", dir);
			int rc = gg_config_load(path, &cfg, &diag);
			bool want_ok = cases[i].loopback || remote;
			if ((rc == 0) != want_ok) {
				printf("FAIL %s, allow_remote %d: loaded with rc %d\n", cases[i].listen, remote, rc);
				gg_diag_print(&diag, stdout);
				failures++;
			}
			if (rc == 0) {
				CHECK_STR(cfg.metrics.listen, cases[i].listen);
				CHECK(cfg.metrics.allow_remote == (remote != 0));
				gg_config_free(&cfg);
			} else if (!want_ok) {
				char want[512];
				snprintf(want, sizeof(want), "%s:12:10: 'listen' in [metrics] is %s, not a loopback address;",
					 path, cases[i].listen);
				CHECK(diag.count == 1 && !strncmp(diag.lines[0], want, strlen(want)));
			}
			gg_diag_free(&diag);
		}
	}
}

int main(void)
{
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	put("ca.pem", "x\n", 0644);
	put("cert.pem", "x\n", 0644);
	put("key.pem", "x\n", 0600);
	test_units();
	test_defaults();
	test_full_and_round_trip();
	test_metrics_listen();
	test_relative_paths_round_trip();
	const char *names[] = { "ca.pem", "cert.pem", "key.pem", "crl.pem", "minimal.toml", "full.toml", "metrics.toml" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char path[256];
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		unlink(path);
	}
	rmdir(dir);
	if (failures) {
		printf("%d check(s) failed\n", failures);
		return 1;
	}
	printf("all config load checks passed\n");
	return 0;
}
