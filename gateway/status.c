/* gradgate status: asks a running gateway for its status over its control
 * socket (a STATUS request, control_proto.h) and prints it. */
#include "status.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "control_conn.h"
#include "control_proto.h"
#include "units.h"

#define ANSWER_TIMEOUT_MS 10000

enum status_exit {
	STATUS_OK = 0,
	STATUS_CONFIG = 1,  /* the config named by --config has problems */
	STATUS_USAGE = 2,
	STATUS_NO_ANSWER = 3, /* no gateway there, it refused, or its answer broke the protocol */
};

struct answer {
	struct gg_ctrl_status_site site;
	struct gg_ctrl_status_peer peers[GG_MAX_PEERS];
	struct gg_ctrl_status_job jobs[GG_CTRL_STATUS_MAX_JOBS];
	struct gg_ctrl_status_failure failures[GG_CTRL_STATUS_MAX_FAILURES];
};

static void usage(FILE *out)
{
	fprintf(out,
		"usage: gradgate status (--config FILE | --control unix:/PATH) [--json]\n"
		"\n"
		"  Asks the gateway that runs with this config (its [site] control socket),\n"
		"  or listens on this control socket, for its status: the site, its peers,\n"
		"  the jobs of its ranks and its last step failures. Root and the gateway's\n"
		"  own user may ask. Exit status: 0 answered, 1 bad config, 2 usage,\n"
		"  3 no answer (no gateway there, refused, or a broken answer)\n"
		"\n"
		"  --config FILE           the site's config file (its settings only: the files\n"
		"                          it names are the gateway's to check)\n"
		"  --control unix:/PATH    the gateway's control socket\n"
		"  --json                  one JSON object instead of tables\n");
}

/* Receives the next message of the answer and checks it is `type`.
 * Returns 0 or STATUS_NO_ANSWER with the problem printed. */
static int receive(int fd, const char *path, enum gg_ctrl_type type, union gg_ctrl_msg *m, uint64_t deadline)
{
	char why[160];
	ssize_t n = gg_ctrl_recv(fd, m, deadline);

	if (n == -EAGAIN) {
		fprintf(stderr, "gradgate status: the gateway at unix:%s did not answer within %d ms\n", path,
			ANSWER_TIMEOUT_MS);
		return STATUS_NO_ANSWER;
	}
	if (n <= 0) {
		fprintf(stderr, "gradgate status: the gateway at unix:%s closed the connection %s (%s)\n", path,
			type == GG_CTRL_STATUS_SITE ? "without an answer" : "in the middle of its answer",
			n == 0 ? "end of stream" : strerror((int)-n));
		return STATUS_NO_ANSWER;
	}
	int got = gg_ctrl_check(m, (size_t)n, why, sizeof(why));
	if (got == GG_CTRL_REFUSE) {
		fprintf(stderr, "gradgate status: refused: %s\n", m->error.message);
		return STATUS_NO_ANSWER;
	}
	if (got != (int)type) {
		fprintf(stderr, "gradgate status: the gateway at unix:%s answered %s where %s belongs\n", path,
			got < 0 ? why : gg_ctrl_type_name((unsigned)got), gg_ctrl_type_name(type));
		return STATUS_NO_ANSWER;
	}
	return 0;
}

/* Asks and reads the whole answer, checking its counts against its bounds. */
static int ask(const struct sockaddr_un *addr, struct answer *a)
{
	uint64_t deadline = gg_ctrl_now_ms() + ANSWER_TIMEOUT_MS;
	const char *path = addr->sun_path;
	struct gg_error err;
	union gg_ctrl_msg m;
	int rc;

	int fd = gg_ctrl_connect(addr, deadline, &err);
	if (fd < 0) {
		fprintf(stderr, "gradgate status: %s\n", err.message);
		return STATUS_NO_ANSWER;
	}
	size_t len = gg_ctrl_init(&m, GG_CTRL_STATUS);
	m.status.version = GG_CTRL_STATUS_VERSION;
	rc = gg_ctrl_send(fd, &m, len, -1, deadline);
	/* A gateway that refuses at once has closed already; its REFUSE waits. */
	if (rc && rc != -EPIPE && rc != -ECONNRESET) {
		fprintf(stderr, "gradgate status: sending STATUS to unix:%s: %s\n", path, strerror(-rc));
		close(fd);
		return STATUS_NO_ANSWER;
	}
	if ((rc = receive(fd, path, GG_CTRL_STATUS_SITE, &m, deadline)))
		goto out;
	a->site = m.status_site;
	if (a->site.version != GG_CTRL_STATUS_VERSION || a->site.peers > GG_MAX_PEERS ||
	    a->site.jobs > GG_CTRL_STATUS_MAX_JOBS || a->site.failures > GG_CTRL_STATUS_MAX_FAILURES) {
		fprintf(stderr, "gradgate status: the gateway at unix:%s answered with status version %u, %u peers, %u "
			"jobs and %u failures, which this gradgate cannot read\n", path, (unsigned)a->site.version,
			(unsigned)a->site.peers, (unsigned)a->site.jobs, (unsigned)a->site.failures);
		rc = STATUS_NO_ANSWER;
		goto out;
	}
	for (unsigned i = 0; !rc && i < a->site.peers; i++)
		if (!(rc = receive(fd, path, GG_CTRL_STATUS_PEER, &m, deadline)))
			a->peers[i] = m.status_peer;
	for (unsigned i = 0; !rc && i < a->site.jobs; i++)
		if (!(rc = receive(fd, path, GG_CTRL_STATUS_JOB, &m, deadline)))
			a->jobs[i] = m.status_job;
	for (unsigned i = 0; !rc && i < a->site.failures; i++)
		if (!(rc = receive(fd, path, GG_CTRL_STATUS_FAILURE, &m, deadline)))
			a->failures[i] = m.status_failure;
out:
	close(fd);
	return rc;
}

static const char *state_name(uint32_t state)
{
	switch (state) {
	case GG_CTRL_JOB_IDLE: return "idle";
	case GG_CTRL_JOB_GATHERING: return "gathering";
	case GG_CTRL_JOB_RUNNING: return "running";
	case GG_CTRL_JOB_FAILED: return "failed";
	}
	return "unknown";
}

static const char *code_name(int code)
{
	const char *name = gg_errc_name(code);

	return name ? name : "unknown";
}

/* A JSON string: the gateway's strings hold no control characters, but
 * may hold quotes and backslashes. */
static void json_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			putchar('\\');
		if ((unsigned char)*s < 0x20)
			printf("\\u%04x", (unsigned char)*s);
		else
			putchar(*s);
	}
	putchar('"');
}

static void print_json(const struct answer *a)
{
	const struct gg_ctrl_status_site *s = &a->site;

	printf("{\"site\":");
	json_string(s->site);
	printf(",\"version\":");
	json_string(s->gateway_version);
	printf(",\"uptime_s\":%.3f,\"steps_completed\":%llu,\"steps_failed\":%llu,\"peers\":[",
	       (double)s->uptime_ms / 1e3, (unsigned long long)s->steps_done, (unsigned long long)s->steps_failed);
	for (unsigned i = 0; i < s->peers; i++) {
		const struct gg_ctrl_status_peer *p = &a->peers[i];
		printf("%s{\"site\":", i ? "," : "");
		json_string(p->site);
		printf(",\"address\":");
		if (p->address[0])
			json_string(p->address);
		else
			printf("null"); /* a peer that dials in, to no address of its own */
		printf(",\"streams_up\":%u,\"streams\":%u,\"rtt_ms\":", p->streams_up, p->streams);
		if (p->rtt_us)
			printf("%.3f", (double)p->rtt_us / 1e3);
		else
			printf("null");
		printf(",\"bytes_in\":%llu,\"bytes_out\":%llu,\"last_heard_s\":", (unsigned long long)p->bytes_in,
		       (unsigned long long)p->bytes_out);
		if (p->heard_ms_ago != UINT64_MAX)
			printf("%.3f}", (double)p->heard_ms_ago / 1e3);
		else
			printf("null}");
	}
	printf("],\"jobs\":[");
	for (unsigned i = 0; i < s->jobs; i++) {
		const struct gg_ctrl_status_job *j = &a->jobs[i];
		printf("%s{\"name\":", i ? "," : "");
		json_string(j->job);
		printf(",\"ranks\":%u,\"connected\":%u,\"last_step\":%llu,\"state\":\"%s\",\"uid\":%u}", j->nranks,
		       j->connected, (unsigned long long)j->last_step, state_name(j->state), j->uid);
	}
	printf("],\"jobs_total\":%llu,\"failures\":[", (unsigned long long)s->jobs_total);
	for (unsigned i = 0; i < s->failures; i++) {
		const struct gg_ctrl_status_failure *f = &a->failures[i];
		printf("%s{\"job\":", i ? "," : "");
		json_string(f->job);
		printf(",\"step\":%llu,\"code\":\"%s\",\"age_s\":%.3f,\"unix_ms\":%llu,\"message\":",
		       (unsigned long long)f->step, code_name(f->code), (double)f->age_ms / 1e3,
		       (unsigned long long)f->unix_ms);
		json_string(f->message);
		putchar('}');
	}
	printf("]}\n");
}

/* A time for people to read, its two largest units: "212 ms", "45s",
 * "12m30s", "2h5m", "3d4h". The JSON form has the exact figures. */
static const char *human_duration(uint64_t ms, char *buf, size_t size)
{
	const unsigned long long s = ms / 1000, m = s / 60, h = m / 60, d = h / 24;

	if (ms < 1000)
		snprintf(buf, size, "%llu ms", (unsigned long long)ms);
	else if (s < 60)
		snprintf(buf, size, "%llus", s);
	else if (m < 60)
		snprintf(buf, size, "%llum%llus", m, s % 60);
	else if (h < 24)
		snprintf(buf, size, "%lluh%llum", h, m % 60);
	else
		snprintf(buf, size, "%llud%lluh", d, h % 24);
	return buf;
}

/* A byte count for people to read: "512B", "88.6GiB". */
static const char *human_size(uint64_t bytes, char *buf, size_t size)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)bytes;
	unsigned u = 0;

	if (bytes < 1024) {
		snprintf(buf, size, "%lluB", (unsigned long long)bytes);
		return buf;
	}
	for (v /= 1024; v >= 1023.95 && u + 1 < GG_ARRAY_LEN(units); u++)
		v /= 1024;
	snprintf(buf, size, "%.1f%s", v, units[u]);
	return buf;
}

static const char *ago(uint64_t ms, char *buf, size_t size)
{
	char d[32];

	if (ms == UINT64_MAX)
		return "never";
	snprintf(buf, size, "%s ago", human_duration(ms, d, sizeof(d)));
	return buf;
}

static void print_table(const struct answer *a)
{
	const struct gg_ctrl_status_site *s = &a->site;
	char b1[32], b2[32], b3[48];

	printf("site %s  gradgate %s  up %s  steps completed %llu, failed %llu\n", s->site, s->gateway_version,
	       human_duration(s->uptime_ms, b1, sizeof(b1)), (unsigned long long)s->steps_done,
	       (unsigned long long)s->steps_failed);

	printf("\n%-20s %-24s %-8s %9s %12s %12s  %s\n", "PEER", "ADDRESS", "STREAMS", "RTT ms", "BYTES IN", "BYTES OUT",
	       "LAST HEARD");
	for (unsigned i = 0; i < s->peers; i++) {
		const struct gg_ctrl_status_peer *p = &a->peers[i];
		char streams[24], rtt[24];
		snprintf(streams, sizeof(streams), "%u/%u", p->streams_up, p->streams);
		if (p->rtt_us)
			snprintf(rtt, sizeof(rtt), "%.3f", (double)p->rtt_us / 1e3);
		else
			snprintf(rtt, sizeof(rtt), "-");
		printf("%-20s %-24s %-8s %9s %12s %12s  %s\n", p->site, p->address[0] ? p->address : "-", streams, rtt,
		       human_size(p->bytes_in, b1, sizeof(b1)), human_size(p->bytes_out, b2, sizeof(b2)),
		       ago(p->heard_ms_ago, b3, sizeof(b3)));
	}

	printf("\n%-32s %-7s %-10s %-10s %s\n", "JOB", "RANKS", "LAST STEP", "STATE", "UID");
	for (unsigned i = 0; i < s->jobs; i++) {
		const struct gg_ctrl_status_job *j = &a->jobs[i];
		char ranks[24];
		snprintf(ranks, sizeof(ranks), "%u/%u", j->connected, j->nranks);
		printf("%-32s %-7s %-10llu %-10s %u\n", j->job, ranks, (unsigned long long)j->last_step,
		       state_name(j->state), j->uid);
	}
	if (!s->jobs)
		printf("(no jobs)\n");
	else if (s->jobs_total > s->jobs)
		printf("(and %llu more jobs)\n", (unsigned long long)(s->jobs_total - s->jobs));

	printf("\nRECENT FAILURES (%u of %llu, newest first)\n", s->failures, (unsigned long long)s->steps_failed);
	if (s->failures)
		printf("%-14s %-20s %-8s %-17s %s\n", "WHEN", "JOB", "STEP", "CODE", "MESSAGE");
	for (unsigned i = 0; i < s->failures; i++) {
		const struct gg_ctrl_status_failure *f = &a->failures[i];
		printf("%-14s %-20s %-8llu %-17s %s\n", ago(f->age_ms, b3, sizeof(b3)), f->job,
		       (unsigned long long)f->step, code_name(f->code), f->message);
	}
}

/* The control socket a config names. Returns 0 or STATUS_CONFIG. */
static int control_of_config(const char *path, char *out, size_t size)
{
	struct gg_config cfg;

	/* Only its control socket matters: a key file whose mode drifted is
	 * the gateway's business at its next start or reload. */
	if (gg_config_load_settings_report(path, &cfg, stderr))
		return STATUS_CONFIG;
	snprintf(out, size, "%s", cfg.site.control);
	gg_config_free(&cfg);
	return 0;
}

int gg_status_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'f' },
		{ "control", required_argument, NULL, 'c' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *config = NULL, *control = NULL;
	char endpoint[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	struct sockaddr_un addr;
	struct gg_error err;
	bool json = false;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
		case 'c': {
			/* One gateway: the last of two would win unseen. */
			const char **slot = c == 'f' ? &config : &control;
			if (*slot) {
				fprintf(stderr, "gradgate status: --%s is given twice ('%s', then '%s')\n",
					c == 'f' ? "config" : "control", *slot, optarg);
				return STATUS_USAGE;
			}
			*slot = optarg;
			break;
		}
		case 'j':
			json = true;
			break;
		case 'h':
			usage(stdout);
			return STATUS_OK;
		default:
			usage(stderr);
			return STATUS_USAGE;
		}
	}
	if (optind != argc || !config == !control) {
		if (optind != argc)
			fprintf(stderr, "gradgate status: unexpected argument '%s'\n", argv[optind]);
		else
			fprintf(stderr, "gradgate status: give --config FILE or --control unix:/PATH (one of them)\n");
		usage(stderr);
		return STATUS_USAGE;
	}
	if (config && (rc = control_of_config(config, endpoint, sizeof(endpoint))))
		return rc;
	if (control)
		snprintf(endpoint, sizeof(endpoint), "%s", control);
	if (gg_ctrl_parse_endpoint(endpoint, &addr, &err)) {
		fprintf(stderr, "gradgate status: %s\n", err.message);
		return STATUS_USAGE;
	}
	static struct answer a;
	if ((rc = ask(&addr, &a)))
		return rc;
	if (json)
		print_json(&a);
	else
		print_table(&a);
	return fflush(stdout) ? STATUS_NO_ANSWER : STATUS_OK;
}
