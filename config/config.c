#include "config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_check.h"
#include "toml.h"
#include "fileio.h"
#include "units.h"

enum field_kind {
	F_STRING,   /* char *, checked by field->check */
	F_PATH,     /* char *, resolved against the config's folder */
	F_INT,      /* int */
	F_BOOL,     /* bool */
	F_SIZE,     /* uint64_t bytes: integer or "4MiB" */
	F_SIZE_AUTO, /* F_SIZE, or "auto": 0 */
	F_DURATION, /* uint64_t microseconds: "500ms" */
	F_ENUM,     /* int index into choices */
	F_CODEC,    /* enum gg_codec, by its name */
	F_LIST,     /* char *, ':'-joined list of names from field->list */
};

/* The names a list field accepts, and those it knows but refuses (named,
 * so the message can say why). */
struct name_list {
	const char *noun; /* "TLS 1.3 ciphersuite" */
	const char *const *names;
	size_t count;
	const char *const *refused;
	size_t refused_count;
	const char *refused_why;
};

struct field {
	const char *key;
	enum field_kind kind;
	size_t offset;
	bool required;
	const char *def; /* default in the field's text form; NULL: none or derived */
	int64_t min, max;
	const char *const *choices;
	gg_check_fn check;
	const char *help;
};

struct section {
	const char *name;
	const struct field *fields;
	size_t count;
};

/* The longest string value of any setting: a path's (PATH_MAX). */
#define VALUE_MAX PATH_MAX

#define CFG(member) offsetof(struct gg_config, member)
#define PEER(member) offsetof(struct gg_peer_config, member)

/* The suites the gateway's record layer protects records with, and the
 * TLS 1.3 suites it does not. */
static const char *const tls13_suites[] = {
	"TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256",
};
static const char *const tls13_ccm_suites[] = { "TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256" };
static const struct name_list suite_list = {
	"TLS 1.3 ciphersuite", tls13_suites, GG_ARRAY_LEN(tls13_suites), tls13_ccm_suites,
	GG_ARRAY_LEN(tls13_ccm_suites),
	"records are protected with AES-GCM or ChaCha20-Poly1305 (TLS_AES_256_GCM_SHA384, "
	"TLS_AES_128_GCM_SHA256, TLS_CHACHA20_POLY1305_SHA256)",
};

/* Key-exchange groups: the elliptic-curve ones cost about a millisecond of
 * CPU per handshake; the finite-field ones up to hundreds, which lets any
 * client that reaches the port burn the gateway's CPU. */
static const char *const tls_groups[] = { "X25519", "P-256", "P-384", "P-521", "X448" };
static const char *const tls_ffdhe_groups[] = { "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192" };
static const struct name_list group_list = {
	"key-exchange group", tls_groups, GG_ARRAY_LEN(tls_groups), tls_ffdhe_groups, GG_ARRAY_LEN(tls_ffdhe_groups),
	"finite-field groups cost up to hundreds of milliseconds of CPU per handshake (supported: X25519, P-256, "
	"P-384, P-521, X448)",
};

static const char *const scale_names[] = { "fp32", "fp16", NULL };
static const char *const algo_names[] = { "direct", "ring", "auto", NULL };
static const char *const dial_names[] = { "both", "out", "in", NULL }; /* enum gg_peer_dial */

static const struct field site_fields[] = {
	{ "name", F_STRING, CFG(site.name), true, NULL, 0, 0, NULL, gg_check_site_name,
	  "this site's name; peers list it under this name" },
	{ "listen", F_STRING, CFG(site.listen), true, NULL, 0, 0, NULL, gg_check_address,
	  "host:port where peer gateways connect" },
	{ "control", F_STRING, CFG(site.control), false, NULL, 0, 0, NULL, gg_check_control,
	  "local client endpoint: unix:/absolute/path" },
	{ "threads", F_INT, CFG(site.threads), false, NULL, 1, 64, NULL, NULL,
	  "threads, each with an io_uring loop and a share of the streams and chunks (default: one per CPU)" },
};

static const struct field tls_fields[] = {
	{ "ca", F_PATH, CFG(tls.ca), true, NULL, 0, 0, NULL, NULL,
	  "CA bundle that every site certificate must chain to" },
	{ "cert", F_PATH, CFG(tls.cert), true, NULL, 0, 0, NULL, NULL,
	  "this site's certificate chain (PEM)" },
	{ "key", F_PATH, CFG(tls.key), true, NULL, 0, 0, NULL, NULL,
	  "this site's private key (PEM, mode 0600 or stricter)" },
	{ "crl", F_PATH, CFG(tls.crl), false, NULL, 0, 0, NULL, NULL,
	  "optional certificate revocation list (PEM)" },
	{ "ciphersuites", F_LIST, CFG(tls.ciphersuites), false,
	  "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256",
	  0, 0, NULL, NULL, "TLS 1.3 ciphersuites in preference order" },
	{ "groups", F_LIST, CFG(tls.groups), false, "X25519:P-256", 0, 0, NULL, NULL,
	  "key-exchange groups in preference order: X25519 P-256 P-384 P-521 X448" },
};

static const struct field peer_fields[] = {
	{ "site", F_STRING, PEER(site), true, NULL, 0, 0, NULL, gg_check_site_name,
	  "the peer's site name" },
	{ "address", F_STRING, PEER(address), false, NULL, 0, 0, NULL, gg_check_address,
	  "host:port the peer listens on; required unless dial = \"in\" (this site never dials it)" },
	{ "identity", F_STRING, PEER(identity), false, NULL, 0, 0, NULL, gg_check_identity,
	  "dns:NAME or uri:URI its certificate must carry (default dns:SITE)" },
	{ "dial", F_ENUM, PEER(dial), false, "both", 0, 0, dial_names, NULL,
	  "who opens the streams: out (this site dials, refuses the peer's) | in (only the peer dials) | both" },
};

static const struct field transport_fields[] = {
	{ "streams_per_peer", F_INT, CFG(transport.streams_per_peer), false, "4", 1, 64, NULL, NULL,
	  "TCP streams per peer site; each frame goes to one that is free" },
	{ "chunk_size", F_SIZE, CFG(transport.chunk_bytes), false, "1MiB", 4 << 10, 64 << 20, NULL, NULL,
	  "a chunk's elements as float32 bytes (chunk_size / 4 elements, whatever the codec)" },
	{ "socket_buffer", F_SIZE_AUTO, CFG(transport.socket_buffer_bytes), false, "auto", 64 << 10, 256 << 20,
	  NULL, NULL,
	  "SO_SNDBUF / SO_RCVBUF per stream; \"auto\": the kernel's autotuning, and past its limit sized from "
	  "what the stream measures, up to socket_buffer_max" },
	{ "socket_buffer_max", F_SIZE, CFG(transport.socket_buffer_max_bytes), false, "64MiB", 64 << 10, 1 << 30,
	  NULL, NULL, "the largest socket buffer socket_buffer = \"auto\" gives a stream" },
	{ "congestion_control", F_STRING, CFG(transport.congestion_control), false, NULL, 0, 0, NULL,
	  gg_check_congestion,
	  "TCP congestion control of the streams, as the kernel names it: bbr, cubic, ... (not set: the system's "
	  "default, net.ipv4.tcp_congestion_control)" },
	{ "heartbeat_interval", F_DURATION, CFG(transport.heartbeat_interval_us), false, "1s",
	  10000, 60000000, NULL, NULL, "how often a quiet stream is probed (a busy one every second interval: its round trip)" },
	{ "heartbeat_timeout", F_DURATION, CFG(transport.heartbeat_timeout_us), false, "10s",
	  20000, 600000000, NULL, NULL, "silence after which a stream is declared dead" },
	{ "connect_timeout", F_DURATION, CFG(transport.connect_timeout_us), false, "5s",
	  1000, 600000000, NULL, NULL, "TCP connect deadline of a stream this site dials" },
	{ "handshake_timeout", F_DURATION, CFG(transport.handshake_timeout_us), false, "5s",
	  1000, 600000000, NULL, NULL, "TLS handshake deadline (and a rank's HELLO)" },
	{ "step_timeout", F_DURATION, CFG(transport.step_timeout_us), false, "60s",
	  1000, 3600000000, NULL, NULL, "deadline of one all-reduce step at every site" },
	{ "reconnect_min", F_DURATION, CFG(transport.reconnect_min_us), false, "100ms",
	  1000, 600000000, NULL, NULL, "first reconnect back-off" },
	{ "reconnect_max", F_DURATION, CFG(transport.reconnect_max_us), false, "10s",
	  1000, 3600000000, NULL, NULL, "longest reconnect back-off" },
};

static const struct field compression_fields[] = {
	{ "codec", F_CODEC, CFG(compression.codec), false, "bf16-split", 0, 0, NULL, NULL,
	  "fp32 | bf16 | bf16-split | int8 | int4 (must match at every site)" },
	{ "block_size", F_INT, CFG(compression.block_size), false, "256", GG_CODEC_MIN_BLOCK_ELEMS,
	  GG_CODEC_MAX_BLOCK_ELEMS, NULL, NULL,
	  "elements per int8/int4 scale block, a multiple of 32 (must match at every site)" },
	{ "scale", F_ENUM, CFG(compression.scale), false, "fp32", 0, 0, scale_names, NULL,
	  "int8/int4 block scales: fp32 | fp16 (must match at every site)" },
	{ "zstd_level", F_INT, CFG(compression.zstd_level), false, "1", 0, 19, NULL, NULL,
	  "zstd stage level; 0 turns the stage off" },
	{ "error_feedback", F_BOOL, CFG(compression.error_feedback), false, "true", 0, 0, NULL, NULL,
	  "carry what a lossy codec dropped into the next step" },
};

static const struct field allreduce_fields[] = {
	{ "algorithm", F_ENUM, CFG(allreduce.algorithm), false, "ring", 0, 0, algo_names, NULL,
	  "direct | ring | auto (chosen per step from the measured links; must match at every site)" },
};

static const struct field limits_fields[] = {
	{ "memory", F_SIZE, CFG(limits.memory_bytes), false, "4GiB", 64 << 20, INT64_MAX, NULL, NULL,
	  "buffer memory the gateway may hold" },
	{ "inflight_per_peer", F_SIZE, CFG(limits.inflight_bytes_per_peer), false, "256MiB",
	  64 << 10, INT64_MAX, NULL, NULL, "unacknowledged bytes towards one peer" },
	{ "max_message", F_SIZE, CFG(limits.max_message_bytes), false, "2GiB", 4, 1ll << 40, NULL, NULL,
	  "largest all-reduce a client may submit" },
	{ "max_clients", F_INT, CFG(limits.max_clients), false, "64", 1, 4096, NULL, NULL,
	  "local client connections" },
	{ "session_idle", F_DURATION, CFG(limits.session_idle_us), false, "5m", 1000000, 30ull * 86400 * 1000000,
	  NULL, NULL,
	  "a job whose ranks sent nothing for this long gives up its sessions to a connection that needs "
	  "their slot or, of another user, its name" },
};

static const struct field metrics_fields[] = {
	{ "listen", F_STRING, CFG(metrics.listen), false, NULL, 0, 0, NULL, gg_check_address,
	  "host:port serving GET /metrics to Prometheus (not set: no endpoint)" },
	{ "allow_remote", F_BOOL, CFG(metrics.allow_remote), false, "false", 0, 0, NULL, NULL,
	  "let listen be an address other than loopback (the endpoint has no authentication)" },
};

static const struct section sections[] = {
	{ "site", site_fields, GG_ARRAY_LEN(site_fields) },
	{ "tls", tls_fields, GG_ARRAY_LEN(tls_fields) },
	{ "transport", transport_fields, GG_ARRAY_LEN(transport_fields) },
	{ "compression", compression_fields, GG_ARRAY_LEN(compression_fields) },
	{ "allreduce", allreduce_fields, GG_ARRAY_LEN(allreduce_fields) },
	{ "limits", limits_fields, GG_ARRAY_LEN(limits_fields) },
	{ "metrics", metrics_fields, GG_ARRAY_LEN(metrics_fields) },
};

static const struct section peers_section = { "peers", peer_fields, GG_ARRAY_LEN(peer_fields) };


#define MAX_SECTION_FIELDS 16

/* What the file made of one field of `sections`. */
struct setting {
	bool valid;                     /* it holds the file's value, or its default */
	const struct gg_toml_value *v; /* the file's value; NULL: not in the file */
};

struct loader {
	const char *source;
	const char *base_dir;
	struct gg_diag *diag;
	int oom;
	bool settings_only; /* no checks of the files the config names */
	struct setting settings[GG_ARRAY_LEN(sections)][MAX_SECTION_FIELDS];
};

/* ---- diagnostics -------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s that is not a C1 control
 * (U+0080-U+009F), or 0. */
static size_t printable_utf8_len(const unsigned char *s)
{
	size_t n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : 2;
	uint32_t cp = s[0] & (0x7f >> n);

	if (s[0] < 0xc2 || s[0] > 0xf4)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if (cp < 0xa0 || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* Keys and values echoed in a problem may hold any byte: a newline would
 * split the problem in two, an escape sequence would reach the terminal.
 * Control characters and bytes that are not UTF-8 are written as \xNN. */
static char *escape_controls(char *line)
{
	size_t bad = 0;

	for (const unsigned char *s = (const unsigned char *)line; *s;) {
		size_t n = *s >= 0x20 && *s < 0x7f ? 1 : printable_utf8_len(s);
		bad += !n;
		s += n ? n : 1;
	}
	if (!bad)
		return line;
	char *out = malloc(strlen(line) + 3 * bad + 1);
	if (!out) {
		free(line);
		return NULL;
	}
	char *w = out;
	for (const unsigned char *s = (const unsigned char *)line; *s;) {
		size_t n = *s >= 0x20 && *s < 0x7f ? 1 : printable_utf8_len(s);
		if (n) {
			memcpy(w, s, n);
			w += n;
			s += n;
		} else {
			w += sprintf(w, "\\x%02x", *s++);
		}
	}
	*w = '\0';
	free(line);
	return out;
}

void gg_diag_add(struct gg_diag *diag, const char *fmt, ...)
{
	va_list ap;
	char *line;

	/* A problem that cannot be kept is not a clean config: it is lost. */
	va_start(ap, fmt);
	int n = vasprintf(&line, fmt, ap);
	va_end(ap);
	if (n < 0) {
		diag->lost = true;
		return;
	}
	line = escape_controls(line);
	if (!line) {
		diag->lost = true;
		return;
	}
	if (diag->count == diag->cap) {
		size_t cap = diag->cap ? diag->cap * 2 : 8;
		char **lines = realloc(diag->lines, cap * sizeof(*lines));
		if (!lines) {
			free(line);
			diag->lost = true;
			return;
		}
		diag->lines = lines;
		diag->cap = cap;
	}
	diag->lines[diag->count++] = line;
}

void gg_diag_free(struct gg_diag *diag)
{
	for (size_t i = 0; i < diag->count; i++)
		free(diag->lines[i]);
	free(diag->lines);
	memset(diag, 0, sizeof(*diag));
}

void gg_diag_print(const struct gg_diag *diag, FILE *out)
{
	for (size_t i = 0; i < diag->count; i++)
		fprintf(out, "%s\n", diag->lines[i]);
}

#define AT(ld, pos) (ld)->source, (pos).line, (pos).col

/* ---- suggestions -------------------------------------------------------- */

/* Edits from a to b: insertions, deletions, substitutions and swaps of
 * two neighbours ("nmae" for "name"), letters compared without regard to
 * case ("CHUNK_SIZE", "[TLS]"). */
static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	size_t rows[3][64]; /* distances from a's first i - 2, i - 1 and i characters */

	if (la >= GG_ARRAY_LEN(rows[0]) || lb >= GG_ARRAY_LEN(rows[0]))
		return SIZE_MAX;
	for (size_t j = 0; j <= lb; j++)
		rows[1][j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t *two = rows[(i + 2) % 3], *up = rows[i % 3], *row = rows[(i + 1) % 3];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
			size_t d = GG_MIN(GG_MIN(up[j] + 1, row[j - 1] + 1), up[j - 1] + (ca != cb));
			if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
			    tolower((unsigned char)a[i - 2]) == cb)
				d = GG_MIN(d, two[j - 2] + 1);
			row[j] = d;
		}
	}
	return rows[(la + 1) % 3][lb];
}

/* The closest of `names` to `key`, or NULL when none is close enough to be
 * a plausible typo. */
static const char *closest(const char *key, const char *const *names, size_t count)
{
	const char *best = NULL;
	size_t best_d = SIZE_MAX;

	for (size_t i = 0; i < count; i++) {
		size_t d = edit_distance(key, names[i]);
		if (d < best_d) {
			best_d = d;
			best = names[i];
		}
	}
	size_t len = strlen(key);
	if (best_d <= (len < 6 ? 1u : len / 3 + 1))
		return best;
	/* A shortened name ("streams" for "streams_per_peer") is a typo too. */
	for (size_t i = 0; len >= 4 && i < count; i++)
		if (!strncmp(names[i], key, len))
			return names[i];
	return NULL;
}

static void report_unknown(struct loader *ld, struct gg_toml_pos pos, const char *key,
			   const char *where, const char *const *names, size_t count)
{
	const char *hint = closest(key, names, count);

	if (hint)
		gg_diag_add(ld->diag, "%s:%u:%u: unknown key '%s' in %s (did you mean '%s'?)", AT(ld, pos),
			 key, where, hint);
	else
		gg_diag_add(ld->diag, "%s:%u:%u: unknown key '%s' in %s", AT(ld, pos), key, where);
}

/* Reports the i-th key of `t` when it is none of `names`. */
static void check_known_key(struct loader *ld, const struct gg_toml_table *t, size_t i, const char *where,
			    const char *const *names, size_t count)
{
	size_t len;
	const char *key = gg_toml_table_key(t, i, &len);

	for (size_t k = 0; k < count; k++)
		if (strlen(names[k]) == len && !memcmp(key, names[k], len))
			return;
	if (strlen(key) != len)
		gg_diag_add(ld->diag, "%s:%u:%u: key in %s contains a NUL character", AT(ld, gg_toml_table_key_pos(t, i)),
			 where);
	else
		report_unknown(ld, gg_toml_table_key_pos(t, i), key, where, names, count);
}

/* ---- field parsing ------------------------------------------------------ */

static char *dup_or_oom(struct loader *ld, const char *s)
{
	char *d = strdup(s);
	if (!d)
		ld->oom = 1;
	return d;
}

/* Drops empty and "." components from a path, in place; not a final ".",
 * which says the path is a folder, nor "..", which a symbolic link before it
 * gives another meaning than the lexical one. */
static void tidy_path(char *path)
{
	const char *r = path;
	char *w = path;

	if (*r == '/')
		*w++ = *r++;
	while (*r) {
		size_t n = strcspn(r, "/");
		if (n == 0 || (n == 1 && r[0] == '.' && r[1] == '/')) {
			r += n + 1;
			continue;
		}
		memmove(w, r, n);
		w += n;
		r += n;
		if (*r == '/')
			*w++ = *r++;
	}
	*w = '\0';
}

/* Relative paths resolve against the config's folder, and come out
 * absolute: the printed config then loads back to the same files from any
 * folder (or under another name). The folder is not canonicalised, so the
 * path stays the one the person wrote. */
static char *resolve_path(struct loader *ld, const char *path)
{
	const char *base = ld->base_dir && ld->base_dir[0] ? ld->base_dir : ".";
	char cwd[PATH_MAX];
	char *out;
	int n;

	if (path[0] == '/')
		return dup_or_oom(ld, path);
	if (base[0] == '/')
		n = asprintf(&out, "%s/%s", base, path);
	else if (getcwd(cwd, sizeof(cwd)))
		n = asprintf(&out, "%s/%s/%s", cwd, base, path);
	else /* no name for the current folder (deleted, or longer than PATH_MAX) */
		n = asprintf(&out, "%s/%s", base, path);
	if (n < 0) {
		ld->oom = 1;
		return NULL;
	}
	tidy_path(out);
	return out;
}

static const char *article(enum gg_toml_kind kind)
{
	return strchr("aeiou", gg_toml_kind_name(kind)[0]) ? "an" : "a";
}

static bool want_kind(struct loader *ld, const struct field *f, const char *where,
		      const struct gg_toml_value *v, enum gg_toml_kind kind, const char *what)
{
	if (v->kind == kind)
		return true;
	gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s must be %s, not %s %s", AT(ld, v->pos), f->key, where,
		 what, article(v->kind), gg_toml_kind_name(v->kind));
	return false;
}

static char *format_int(uint64_t v, char *buf, size_t size)
{
	snprintf(buf, size, "%lld", (long long)v);
	return buf;
}

typedef char *(*format_fn)(uint64_t v, char *buf, size_t size);

/* How a number field writes its values: "4MiB", "500ms", "64". */
static format_fn formatter(const struct field *f)
{
	if (f->kind == F_SIZE || f->kind == F_SIZE_AUTO)
		return gg_format_size;
	return f->kind == F_DURATION ? gg_format_duration : format_int;
}

/* A value above the field's maximum, or too large to parse at all: `got`
 * is how the file writes it. */
static void too_large(struct loader *ld, const struct field *f, const char *where, struct gg_toml_pos pos,
		      const char *got)
{
	char hi[32];

	formatter(f)((uint64_t)f->max, hi, sizeof(hi));
	gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is %s, too large; it must be at most %s", AT(ld, pos), f->key,
		 where, got, hi);
}

/* `v` is read as signed for integer fields, unsigned for sizes/durations. */
static bool in_range(struct loader *ld, const struct field *f, const char *where,
		     struct gg_toml_pos pos, uint64_t v)
{
	format_fn fmt = formatter(f);
	bool ok = f->kind == F_INT ? (int64_t)v >= f->min && (int64_t)v <= f->max
				   : v >= (uint64_t)f->min && v <= (uint64_t)f->max;
	if (ok)
		return true;
	char lo[32], hi[32], got[32];
	fmt((uint64_t)f->min, lo, sizeof(lo));
	fmt((uint64_t)f->max, hi, sizeof(hi));
	fmt(v, got, sizeof(got));
	if (f->max == INT64_MAX && v > (uint64_t)f->max)
		too_large(ld, f, where, pos, got);
	else if (f->max == INT64_MAX)
		gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is %s; it must be at least %s", AT(ld, pos), f->key,
			 where, got, lo);
	else
		gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is %s; it must be between %s and %s", AT(ld, pos),
			 f->key, where, got, lo, hi);
	return false;
}

/* The names an F_LIST field accepts. */
static const struct name_list *list_of(const struct field *f)
{
	return f->offset == CFG(tls.groups) ? &group_list : &suite_list;
}

static bool in_names(const char *s, const char *const *names, size_t count, bool any_case)
{
	for (size_t i = 0; i < count; i++)
		if (!(any_case ? strcasecmp : strcmp)(s, names[i]))
			return true;
	return false;
}

static void set_list(struct loader *ld, const struct field *f, const char *where, const struct gg_toml_value *v,
		     void *dst)
{
	const struct name_list *l = list_of(f);
	const struct gg_toml_array *a = v->u.array;
	size_t n = gg_toml_array_len(a), total = 1;
	bool ok = true;

	if (n == 0) {
		gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is empty; name at least one %s", AT(ld, v->pos), f->key,
			 where, l->noun);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		const struct gg_toml_value *e = gg_toml_array_at(a, i);
		if (e->kind != GG_TOML_STRING) {
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s must list strings, not %s %s", AT(ld, e->pos),
				 f->key, where, article(e->kind), gg_toml_kind_name(e->kind));
			ok = false;
			continue;
		}
		if (strlen(e->u.str.ptr) != e->u.str.len) {
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s lists a string that contains a NUL character",
				 AT(ld, e->pos), f->key, where);
			ok = false;
			continue;
		}
		/* Refused in any case: "FFDHE2048" is no typo of a group taken. */
		if (in_names(e->u.str.ptr, l->refused, l->refused_count, true)) {
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s: '%s' is not supported: %s", AT(ld, e->pos), f->key,
				 where, e->u.str.ptr, l->refused_why);
			ok = false;
			continue;
		}
		if (!in_names(e->u.str.ptr, l->names, l->count, false)) {
			const char *hint = closest(e->u.str.ptr, l->names, l->count);
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s: '%s' is not a %s%s%s%s", AT(ld, e->pos), f->key, where,
				 e->u.str.ptr, l->noun, hint ? " (did you mean '" : "", hint ? hint : "",
				 hint ? "'?)" : "");
			ok = false;
			continue;
		}
		for (size_t j = 0; j < i; j++) {
			const struct gg_toml_value *p = gg_toml_array_at(a, j);
			if (p->kind == GG_TOML_STRING && !strcmp(p->u.str.ptr, e->u.str.ptr)) {
				gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s lists '%s' twice", AT(ld, e->pos),
					 f->key, where, e->u.str.ptr);
				ok = false;
			}
		}
		total += e->u.str.len + 1;
	}
	if (!ok)
		return;
	char *joined = calloc(1, total);
	if (!joined) {
		ld->oom = 1;
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (i)
			strcat(joined, ":");
		strcat(joined, gg_toml_array_at(a, i)->u.str.ptr);
	}
	free(*(char **)dst);
	*(char **)dst = joined;
}

/* Parses `v` (NULL: the field's default text) into the field's slot in
 * `base`. Problems go to the diagnostics; the slot keeps its old value. */
static void set_field(struct loader *ld, const struct field *f, const char *where,
		      const struct gg_toml_value *v, void *base)
{
	void *dst = (char *)base + f->offset;
	struct gg_toml_pos pos = v ? v->pos : (struct gg_toml_pos){ 0, 0 };
	const char *text = f->def;
	const char *why = NULL;
	/* A check's message repeats the value (at most VALUE_MAX bytes). */
	char buf[VALUE_MAX + 512];

	/* Every setting reads its string up to the first NUL: what follows
	 * one would be dropped unseen. */
	if (v && v->kind == GG_TOML_STRING && strlen(v->u.str.ptr) != v->u.str.len) {
		gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s contains a NUL character", AT(ld, pos), f->key, where);
		return;
	}
	switch (f->kind) {
	case F_STRING:
	case F_PATH:
	case F_ENUM:
	case F_CODEC:
		if (v) {
			if (!want_kind(ld, f, where, v, GG_TOML_STRING, "a string"))
				return;
			text = v->u.str.ptr;
		}
		if (strlen(text) > VALUE_MAX) {
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is %zu bytes long; it may be at most %d bytes",
				 AT(ld, pos), f->key, where, strlen(text), VALUE_MAX);
			return;
		}
		if (f->kind == F_CODEC) {
			enum gg_codec codec;
			if (gg_codec_from_name(text, &codec) == 0) {
				*(enum gg_codec *)dst = codec;
				return;
			}
			const char *names[GG_CODEC_LAST + 1];
			int n = 0;
			for (int i = GG_CODEC_FIRST; i <= GG_CODEC_LAST; i++)
				names[n++] = gg_codec_name((enum gg_codec)i);
			const char *hint = closest(text, names, (size_t)n);
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is \"%s\"; expected one of %s%s%s%s", AT(ld, pos),
				 f->key, where, text, gg_codec_names(), hint ? " (did you mean '" : "",
				 hint ? hint : "", hint ? "'?)" : "");
			return;
		}
		if (f->kind == F_ENUM) {
			for (int i = 0; f->choices[i]; i++) {
				if (!strcmp(text, f->choices[i])) {
					*(int *)dst = i;
					return;
				}
			}
			size_t n = 0;
			buf[0] = '\0';
			for (; f->choices[n]; n++)
				snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%s", n ? ", " : "",
					 f->choices[n]);
			const char *hint = closest(text, f->choices, n);
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is \"%s\"; expected one of %s%s%s%s", AT(ld, pos),
				 f->key, where, text, buf, hint ? " (did you mean '" : "", hint ? hint : "",
				 hint ? "'?)" : "");
			return;
		}
		if (f->check && f->check(text, buf, sizeof(buf))) {
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s: %s", AT(ld, pos), f->key, where, buf);
			return;
		}
		if (f->kind == F_PATH && !text[0]) {
			gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is empty; give a file path", AT(ld, pos),
				 f->key, where);
			return;
		}
		char *s = f->kind == F_PATH ? resolve_path(ld, text) : dup_or_oom(ld, text);
		if (s) {
			free(*(char **)dst);
			*(char **)dst = s;
		}
		return;
	case F_INT: {
		int64_t n;
		if (v) {
			if (!want_kind(ld, f, where, v, GG_TOML_INTEGER, "an integer"))
				return;
			n = v->u.integer;
		} else {
			n = strtoll(text, NULL, 10);
		}
		if (in_range(ld, f, where, pos, (uint64_t)n))
			*(int *)dst = (int)n;
		return;
	}
	case F_BOOL:
		if (v) {
			if (want_kind(ld, f, where, v, GG_TOML_BOOL, "a boolean"))
				*(bool *)dst = v->u.boolean;
		} else {
			*(bool *)dst = !strcmp(text, "true");
		}
		return;
	case F_SIZE:
	case F_SIZE_AUTO:
	case F_DURATION: {
		bool size = f->kind != F_DURATION;
		uint64_t n;
		if (f->kind == F_SIZE_AUTO && ((v && v->kind == GG_TOML_STRING && !strcmp(v->u.str.ptr, "auto")) ||
					       (!v && !strcmp(text, "auto")))) {
			*(uint64_t *)dst = 0;
			return;
		}
		if (v && size && v->kind == GG_TOML_INTEGER) {
			if (v->u.integer < 0) {
				gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is negative", AT(ld, pos), f->key, where);
				return;
			}
			n = (uint64_t)v->u.integer;
		} else {
			if (v && !want_kind(ld, f, where, v, GG_TOML_STRING,
					    f->kind == F_SIZE_AUTO ? "\"auto\", a size like \"4MiB\" or a byte count"
					    : size		   ? "a size like \"4MiB\" or a byte count"
								   : "a duration like \"500ms\""))
				return;
			if (v)
				text = v->u.str.ptr;
			int rc = (size ? gg_parse_size : gg_parse_duration)(text, &n, &why);
			if (rc == -ERANGE) {
				snprintf(buf, sizeof(buf), "\"%.200s\"", text);
				too_large(ld, f, where, pos, buf);
				return;
			}
			if (rc) {
				gg_diag_add(ld->diag, "%s:%u:%u: '%s' in %s is \"%s\": %s%s", AT(ld, pos), f->key, where,
					 text, why, f->kind == F_SIZE_AUTO ? " (or \"auto\")" : "");
				return;
			}
		}
		if (in_range(ld, f, where, pos, n))
			*(uint64_t *)dst = n;
		return;
	}
	case F_LIST:
		if (v) {
			char what[64];
			snprintf(what, sizeof(what), "an array of %s names", list_of(f)->noun);
			if (want_kind(ld, f, where, v, GG_TOML_ARRAY, what))
				set_list(ld, f, where, v, dst);
		} else {
			char *copy = dup_or_oom(ld, text);
			if (copy) {
				free(*(char **)dst);
				*(char **)dst = copy;
			}
		}
		return;
	}
}

/* Fills every field of one table (or of a missing one, t == NULL). */
static void load_table(struct loader *ld, const struct section *sec, const char *where,
		       const struct gg_toml_table *t, struct gg_toml_pos table_pos, void *base)
{
	const char *names[MAX_SECTION_FIELDS];
	struct setting *settings = sec == &peers_section ? NULL : ld->settings[sec - sections];

	assert(sec->count <= GG_ARRAY_LEN(names));
	for (size_t i = 0; i < sec->count; i++)
		names[i] = sec->fields[i].key;

	for (size_t i = 0; t && i < gg_toml_table_count(t); i++)
		check_known_key(ld, t, i, where, names, sec->count);
	for (size_t k = 0; k < sec->count; k++) {
		const struct field *f = &sec->fields[k];
		const struct gg_toml_value *v = t ? gg_toml_table_get(t, f->key) : NULL;
		size_t before = ld->diag->count;
		if (settings)
			settings[k].v = v;
		if (v) {
			set_field(ld, f, where, v, base);
		} else if (f->required) {
			if (t)
				gg_diag_add(ld->diag, "%s:%u:%u: missing required key '%s' in %s", AT(ld, table_pos),
					 f->key, where);
			else
				gg_diag_add(ld->diag, "%s: missing required key '%s' in %s", ld->source, f->key, where);
		} else if (f->def) {
			set_field(ld, f, where, NULL, base);
		}
		if (settings)
			settings[k].valid = ld->diag->count == before;
	}
}

static void load_peers(struct loader *ld, const struct gg_toml_value *v, struct gg_config *cfg)
{
	if (v->kind != GG_TOML_ARRAY) {
		gg_diag_add(ld->diag, "%s:%u:%u: 'peers' must be an array of tables: write each peer as [[peers]]",
			 AT(ld, v->pos));
		return;
	}
	const struct gg_toml_array *a = v->u.array;
	size_t n = gg_toml_array_len(a);
	if (n > GG_MAX_PEERS) {
		gg_diag_add(ld->diag, "%s:%u:%u: %zu peers configured; at most %d are supported (%d sites in all)",
			 AT(ld, gg_toml_array_at(a, GG_MAX_PEERS)->pos), n, GG_MAX_PEERS, GG_MAX_PEERS + 1);
		n = GG_MAX_PEERS;
	}
	cfg->peers = calloc(n ? n : 1, sizeof(*cfg->peers));
	if (!cfg->peers) {
		ld->oom = 1;
		return;
	}
	cfg->peer_count = n;
	for (size_t i = 0; i < n; i++) {
		const struct gg_toml_value *e = gg_toml_array_at(a, i);
		char where[32];
		snprintf(where, sizeof(where), "[[peers]] #%zu", i + 1);
		if (e->kind != GG_TOML_TABLE) {
			gg_diag_add(ld->diag, "%s:%u:%u: %s must be a table, not %s %s", AT(ld, e->pos), where,
				 article(e->kind), gg_toml_kind_name(e->kind));
			continue;
		}
		load_table(ld, &peers_section, where, e->u.table, e->pos, &cfg->peers[i]);
		const struct gg_toml_value *dial = gg_toml_table_get(e->u.table, "dial");
		if (dial)
			cfg->peers[i].dial_at = (struct gg_config_pos){ dial->pos.line, dial->pos.col };
	}
}

#define DERIVED_IDENTITY "dns:%s"

/* The identity a peer's certificate must carry: its own setting, or the
 * one its name gives (fill_derived() has not run yet). */
static const char *peer_identity(const struct gg_peer_config *p, char *buf, size_t size)
{
	if (p->identity)
		return p->identity;
	snprintf(buf, size, DERIVED_IDENTITY, p->site);
	return buf;
}

/* DNS names compare without regard to case, URIs byte for byte. */
static bool same_identity(const char *a, const char *b)
{
	return !strncmp(a, "dns:", 4) && !strncmp(b, "dns:", 4) ? !strcasecmp(a + 4, b + 4) : !strcmp(a, b);
}

/* Where [[peers]] #i+1 sets `key` (the first of the keys given that it
 * sets), for a problem to point at the value to change; else its table. */
static struct gg_toml_pos peer_pos(const struct gg_toml_value *pv, size_t i, const char *key, const char *or_key)
{
	const struct gg_toml_value *t = gg_toml_array_at(pv->u.array, i);
	const struct gg_toml_value *v = gg_toml_table_get(t->u.table, key);

	if (!v && or_key)
		v = gg_toml_table_get(t->u.table, or_key);
	return v ? v->pos : t->pos;
}

/* Site names, addresses and identities must be unique, and no peer may be
 * this site: a certificate that passes for two peers could pose as either. */
static void check_peers(struct loader *ld, const struct gg_config *cfg, const struct gg_toml_value *pv)
{
	for (size_t i = 0; i < cfg->peer_count; i++) {
		const struct gg_peer_config *p = &cfg->peers[i];
		const struct gg_toml_pos site_at = peer_pos(pv, i, "site", NULL),
					 address_at = peer_pos(pv, i, "address", NULL);
		if (!p->site)
			continue;
		/* (An address given but bad is reported as such, and so is a dial
		 * setting, which may have been meant as "in".) */
		const struct gg_toml_table *t = gg_toml_array_at(pv->u.array, i)->u.table;
		const struct gg_toml_value *dial = gg_toml_table_get(t, "dial");
		bool dial_ok = !dial || (dial->kind == GG_TOML_STRING && !strcmp(dial->u.str.ptr, dial_names[p->dial]));
		if (!p->address && p->dial != GG_DIAL_IN && dial_ok && !gg_toml_table_get(t, "address"))
			gg_diag_add(ld->diag, "%s:%u:%u: missing required key 'address' in [[peers]] #%zu (only a peer "
				 "this site never dials, with dial = \"in\", may go without one)", AT(ld, address_at), i + 1);
		if (cfg->site.name && !strcmp(p->site, cfg->site.name))
			gg_diag_add(ld->diag, "%s:%u:%u: [[peers]] #%zu is site '%s', which is this site itself",
				 AT(ld, site_at), i + 1, p->site);
		if (p->address && cfg->site.listen && gg_address_same_endpoint(cfg->site.listen, p->address, false))
			gg_diag_add(ld->diag, "%s:%u:%u: [[peers]] #%zu address %s is this site's own listen address (%s)",
				 AT(ld, address_at), i + 1, p->address, cfg->site.listen);
		for (size_t j = 0; j < i; j++) {
			const struct gg_peer_config *q = &cfg->peers[j];
			if (q->site && !strcmp(p->site, q->site))
				gg_diag_add(ld->diag, "%s:%u:%u: duplicate peer: site '%s' is already [[peers]] #%zu",
					 AT(ld, site_at), p->site, j + 1);
			else if (p->address && q->address && !strcmp(p->address, q->address))
				gg_diag_add(ld->diag, "%s:%u:%u: duplicate peer address %s: [[peers]] #%zu uses it too",
					 AT(ld, address_at), p->address, j + 1);
			else if (q->site) {
				char a[GG_SITE_NAME_MAX + 8], b[GG_SITE_NAME_MAX + 8];
				const char *pid = peer_identity(p, a, sizeof(a)), *qid = peer_identity(q, b, sizeof(b));
				if (same_identity(pid, qid))
					gg_diag_add(ld->diag,
						 "%s:%u:%u: duplicate peer identity %s: [[peers]] #%zu (site '%s') has it "
						 "too, so either site's certificate would pass for the other",
						 AT(ld, peer_pos(pv, i, "identity", "site")), pid, j + 1, q->site);
			}
		}
	}
}

/* One thread per CPU this process may run on, within the setting's range. */
static int default_threads(void)
{
	cpu_set_t set;
	int n = sched_getaffinity(0, sizeof(set), &set) ? 1 : CPU_COUNT(&set);

	return n < 1 ? 1 : n > 64 ? 64 : n;
}

/* The defaults that follow from other settings: the control socket from
 * the site's name, a peer's identity from its. */
#define DERIVED_CONTROL "unix:/run/gradgate/%s.sock"
static void fill_derived(struct loader *ld, struct gg_config *cfg)
{
	if (!cfg->site.threads)
		cfg->site.threads = default_threads();
	if (!cfg->site.control && cfg->site.name &&
	    asprintf(&cfg->site.control, DERIVED_CONTROL, cfg->site.name) < 0) {
		cfg->site.control = NULL;
		ld->oom = 1;
	}
	for (size_t i = 0; i < cfg->peer_count; i++) {
		struct gg_peer_config *p = &cfg->peers[i];
		if (!p->identity && p->site && asprintf(&p->identity, DERIVED_IDENTITY, p->site) < 0) {
			p->identity = NULL;
			ld->oom = 1;
		}
	}
}

/* What the file made of the struct gg_config member at `offset`. */
static const struct setting *setting_at(const struct loader *ld, size_t offset)
{
	for (size_t s = 0; s < GG_ARRAY_LEN(sections); s++)
		for (size_t k = 0; k < sections[s].count; k++)
			if (sections[s].fields[k].offset == offset)
				return &ld->settings[s][k];
	assert(!"not a field of sections[]");
	return NULL;
}

#define SETTING(ld, member) setting_at(ld, CFG(member))

/* Reports a problem with settings that are each valid, at the value of
 * `blamed`; at that of `other` when the file leaves `blamed` at its default;
 * with the file's name alone when the file sets neither. */
static GG_PRINTF(4, 5) void diag_blame(struct loader *ld, const struct setting *blamed,
				       const struct setting *other, const char *fmt, ...)
{
	const struct gg_toml_value *v = blamed->v ? blamed->v : other ? other->v : NULL;
	va_list ap;
	char *msg;

	va_start(ap, fmt);
	int n = vasprintf(&msg, fmt, ap);
	va_end(ap);
	if (n < 0) {
		ld->oom = 1;
		return;
	}
	if (v)
		gg_diag_add(ld->diag, "%s:%u:%u: %s", AT(ld, v->pos), msg);
	else
		gg_diag_add(ld->diag, "%s: %s", ld->source, msg);
	free(msg);
}

/* Settings that are valid alone but not together; each check runs when the
 * settings it compares are valid, whatever else is wrong in the file. */
static void check_combinations(struct loader *ld, const struct gg_config *cfg)
{
	const struct setting *hb_interval = SETTING(ld, transport.heartbeat_interval_us);
	const struct setting *hb_timeout = SETTING(ld, transport.heartbeat_timeout_us);
	const struct setting *rc_min = SETTING(ld, transport.reconnect_min_us);
	const struct setting *rc_max = SETTING(ld, transport.reconnect_max_us);
	const struct setting *chunk = SETTING(ld, transport.chunk_bytes);
	const struct setting *inflight = SETTING(ld, limits.inflight_bytes_per_peer);
	const struct setting *memory = SETTING(ld, limits.memory_bytes);
	const struct setting *block = SETTING(ld, compression.block_size);
	char a[32], b[32];

	if (hb_interval->valid && hb_timeout->valid &&
	    cfg->transport.heartbeat_timeout_us <= cfg->transport.heartbeat_interval_us)
		diag_blame(ld, hb_timeout, hb_interval,
			   "[transport] heartbeat_timeout (%s) must be longer than heartbeat_interval (%s)",
			   gg_format_duration(cfg->transport.heartbeat_timeout_us, a, sizeof(a)),
			   gg_format_duration(cfg->transport.heartbeat_interval_us, b, sizeof(b)));
	if (rc_min->valid && rc_max->valid && cfg->transport.reconnect_min_us > cfg->transport.reconnect_max_us)
		diag_blame(ld, rc_min, rc_max, "[transport] reconnect_min (%s) is longer than reconnect_max (%s)",
			   gg_format_duration(cfg->transport.reconnect_min_us, a, sizeof(a)),
			   gg_format_duration(cfg->transport.reconnect_max_us, b, sizeof(b)));
	if (chunk->valid && cfg->transport.chunk_bytes % sizeof(float))
		diag_blame(ld, chunk, NULL, "[transport] chunk_size (%" PRIu64 " bytes) must be a multiple of 4 bytes, "
			   "whole float32 elements", cfg->transport.chunk_bytes);
	if (chunk->valid && inflight->valid && cfg->limits.inflight_bytes_per_peer < cfg->transport.chunk_bytes)
		diag_blame(ld, inflight, chunk,
			   "[limits] inflight_per_peer (%s) is smaller than one chunk ([transport] chunk_size = %s)",
			   gg_format_size(cfg->limits.inflight_bytes_per_peer, a, sizeof(a)),
			   gg_format_size(cfg->transport.chunk_bytes, b, sizeof(b)));
	size_t peers = cfg->peer_count ? cfg->peer_count : 1;
	uint64_t need = cfg->limits.inflight_bytes_per_peer > UINT64_MAX / peers
				? UINT64_MAX
				: cfg->limits.inflight_bytes_per_peer * peers;
	if (inflight->valid && memory->valid && cfg->limits.memory_bytes < need) {
		char each[48] = "";
		if (peers > 1)
			snprintf(each, sizeof(each), "each of %zu peers (%s)", peers, gg_format_size(need, b, sizeof(b)));
		diag_blame(ld, memory, inflight, "[limits] memory (%s) cannot hold inflight_per_peer (%s) for %s",
			   gg_format_size(cfg->limits.memory_bytes, a, sizeof(a)),
			   gg_format_size(cfg->limits.inflight_bytes_per_peer, b, sizeof(b)), peers > 1 ? each : "1 peer");
	}
	if (block->valid && cfg->compression.block_size % GG_CODEC_BLOCK_ALIGN_ELEMS)
		diag_blame(ld, block, NULL, "[compression] block_size %d must be a multiple of %u",
			   cfg->compression.block_size, GG_CODEC_BLOCK_ALIGN_ELEMS);
}

/* The metrics endpoint has no authentication: it listens on loopback
 * unless the operator says otherwise, and not on the peers' port. */
static void check_metrics(struct loader *ld, const struct gg_config *cfg, const struct gg_toml_table *root)
{
	const struct gg_toml_value *t = gg_toml_table_get(root, "metrics");
	const struct gg_toml_table *mt = t && t->kind == GG_TOML_TABLE ? t->u.table : NULL;
	const struct gg_toml_value *v = mt ? gg_toml_table_get(mt, "listen") : NULL;
	const struct gg_toml_value *remote = mt ? gg_toml_table_get(mt, "allow_remote") : NULL;
	const char *listen = cfg->metrics.listen;

	/* Unset, or refused already (a bad address, allow_remote not a bool). */
	if (!v || !listen || (remote && remote->kind != GG_TOML_BOOL))
		return;
	if (cfg->site.listen && gg_address_same_endpoint(cfg->site.listen, listen, true))
		gg_diag_add(ld->diag, "%s:%u:%u: 'listen' in [metrics] is %s, which [site] listen (%s) uses for the "
			 "peers; give the metrics endpoint a port of its own", AT(ld, v->pos), listen, cfg->site.listen);
	else if (!cfg->metrics.allow_remote && !gg_address_is_loopback(listen))
		gg_diag_add(ld->diag, "%s:%u:%u: 'listen' in [metrics] is %s, not a loopback address; the endpoint "
			 "answers whoever reaches it, without authentication: listen on 127.0.0.1 or [::1] (and let "
			 "a local agent scrape it), or set allow_remote = true in [metrics]", AT(ld, v->pos), listen);
}

/* Why someone other than root and the gateway's user could change a file
 * that says whom the gateway trusts (the config, the CA, the CRL): it may
 * write it, own it (gg_owner_refusal()) or put another in its place
 * (gg_path_guarded()); as the rest of a sentence that starts with the
 * file, in why. NULL when nobody else could. */
static const char *trust_refusal(const char *path, const struct stat *st, char *why, size_t size)
{
	char inner[PATH_MAX + 256];

	if (st->st_mode & 022)
		gg_errf(why, size, 0, " may be written by group or others (mode %04o), who could so choose whom this "
			"gateway trusts; run: chmod go-w '%s'", (unsigned)(st->st_mode & 07777), path);
	else if (gg_owner_refusal(st->st_uid, path, inner, sizeof(inner)))
		gg_errf(why, size, 0, " %s", inner);
	else if (gg_path_guarded(path, GG_TRUST_PATH_CONSEQUENCE, inner, sizeof(inner)))
		gg_errf(why, size, 0, ": %s", inner);
	else
		return NULL;
	return why;
}

/* Whether the PEM text at the start of fd (its first 64 KiB) holds a
 * certificate and no private key: a certificate given as the key. */
static bool pem_holds_only_certificates(int fd)
{
	const size_t cap = 64 * 1024;
	char *text = malloc(cap);
	ssize_t n = text ? pread(fd, text, cap, 0) : -1;
	bool only = n > 0 && memmem(text, (size_t)n, "-----BEGIN CERTIFICATE-----", 27) &&
		    !memmem(text, (size_t)n, "PRIVATE KEY-----", 16);

	free(text);
	return only;
}

/* The certificate files must be readable now, not at the first handshake;
 * the key must not be accessible to anyone but its owner, nor the CA and
 * CRL files writable by anyone else, nor replaceable by anyone else
 * (gg_path_guarded()), and those three must belong to root or the
 * gateway's user. */
static void check_files(struct loader *ld, const struct gg_config *cfg)
{
	const struct {
		const char *key;
		const char *path;
		const struct setting *setting;
	} files[] = {
		{ "ca", cfg->tls.ca, SETTING(ld, tls.ca) },
		{ "cert", cfg->tls.cert, SETTING(ld, tls.cert) },
		{ "key", cfg->tls.key, SETTING(ld, tls.key) },
		{ "crl", cfg->tls.crl, SETTING(ld, tls.crl) },
	};

	for (size_t i = 0; i < GG_ARRAY_LEN(files); i++) {
		const char *path = files[i].path;
		char why[2 * PATH_MAX + 512];
		struct stat st;
		if (!path)
			continue;
		/* Non-blocking: a named pipe with no writer would hold the open
		 * for good; it is refused below as not a regular file. */
		int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		if (fd < 0 && errno == ELOOP)
			fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
		if (fd < 0) {
			diag_blame(ld, files[i].setting, NULL, "[tls] %s file '%s' cannot be read: %s", files[i].key,
				   path, strerror(errno));
			continue;
		}
		if (fstat(fd, &st))
			diag_blame(ld, files[i].setting, NULL, "[tls] %s file '%s' cannot be examined: %s",
				   files[i].key, path, strerror(errno));
		else if (!S_ISREG(st.st_mode))
			diag_blame(ld, files[i].setting, NULL, "[tls] %s file '%s' is not a regular file",
				   files[i].key, path);
		else if (!strcmp(files[i].key, "key") && pem_holds_only_certificates(fd))
			/* Said first: a certificate's mode is rightly loose, and
			 * chmod would not make it a key. */
			diag_blame(ld, files[i].setting, NULL, "[tls] key file '%s' holds a certificate, not a private key: "
				   "are [tls] cert and key swapped?", path);
		else if (!strcmp(files[i].key, "key") && (st.st_mode & 077))
			/* Any of the bits: a key others may write can be swapped for theirs. */
			diag_blame(ld, files[i].setting, NULL,
				   "[tls] key file '%s' is accessible by group or others (mode %04o); run: chmod 600 '%s'",
				   path, (unsigned)(st.st_mode & 07777), path);
		else if ((!strcmp(files[i].key, "ca") || !strcmp(files[i].key, "crl")) &&
			 trust_refusal(path, &st, why, sizeof(why)))
			diag_blame(ld, files[i].setting, NULL, "[tls] %s file '%s'%s", files[i].key, path, why);
		else if (!strcmp(files[i].key, "key") && gg_owner_refusal(st.st_uid, path, why, sizeof(why)))
			diag_blame(ld, files[i].setting, NULL, "[tls] key file '%s' %s", path, why);
		close(fd);
	}
}

static struct gg_config_pos position(const struct setting *s)
{
	return s->v ? (struct gg_config_pos){ s->v->pos.line, s->v->pos.col } : (struct gg_config_pos){ 0, 0 };
}

static void note_positions(const struct loader *ld, struct gg_config *cfg)
{
	cfg->at.listen = position(SETTING(ld, site.listen));
	cfg->at.control = position(SETTING(ld, site.control));
	cfg->at.congestion_control = position(SETTING(ld, transport.congestion_control));
	cfg->at.metrics_listen = position(SETTING(ld, metrics.listen));
}

static const char *const section_names[] = { "site", "tls", "peers", "transport", "compression",
					      "allreduce", "limits", "metrics" };

static int load_text(const char *text, size_t len, const char *source, const char *base_dir, bool settings_only,
		     struct gg_config *cfg, struct gg_diag *diag)
{
	struct loader ld = { .source = source, .base_dir = base_dir, .diag = diag, .settings_only = settings_only };
	struct gg_toml_doc *doc = NULL;
	char err[PATH_MAX + 512]; /* the file's name, where, and what */
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	rc = gg_toml_parse(text, len, source, &doc, err, sizeof(err));
	if (rc) {
		gg_diag_add(diag, "%s", err);
		return rc == -ENOMEM || diag->lost ? -ENOMEM : -EINVAL;
	}
	const struct gg_toml_table *root = gg_toml_root(doc);
	size_t before = diag->count;

	for (size_t i = 0; i < gg_toml_table_count(root); i++)
		check_known_key(&ld, root, i, "the top level", section_names, GG_ARRAY_LEN(section_names));
	for (size_t s = 0; s < GG_ARRAY_LEN(sections); s++) {
		const struct section *sec = &sections[s];
		const struct gg_toml_value *v = gg_toml_table_get(root, sec->name);
		char where[32];
		snprintf(where, sizeof(where), "[%s]", sec->name);
		if (v && v->kind != GG_TOML_TABLE) {
			gg_diag_add(diag, "%s:%u:%u: '%s' must be a table ([%s]), not %s %s", AT(&ld, v->pos),
				 sec->name, sec->name, article(v->kind), gg_toml_kind_name(v->kind));
			continue;
		}
		load_table(&ld, sec, where, v ? v->u.table : NULL, v ? v->pos : (struct gg_toml_pos){ 0, 0 }, cfg);
	}
	const struct gg_toml_value *pv = gg_toml_table_get(root, "peers");
	if (pv)
		load_peers(&ld, pv, cfg);
	if (cfg->peer_count == 0 && (!pv || pv->kind == GG_TOML_ARRAY))
		gg_diag_add(diag, "%s: no peers configured; add at least one [[peers]] table", source);
	else
		check_peers(&ld, cfg, pv);
	fill_derived(&ld, cfg);
	check_combinations(&ld, cfg);
	check_metrics(&ld, cfg, root);
	if (!ld.settings_only)
		check_files(&ld, cfg);
	note_positions(&ld, cfg);

	gg_toml_free(doc);
	if (ld.oom || diag->lost || diag->count > before) {
		gg_config_free(cfg);
		return ld.oom || diag->lost ? -ENOMEM : -EINVAL;
	}
	cfg->source = strdup(source);
	if (!cfg->source) {
		gg_config_free(cfg);
		return -ENOMEM;
	}
	return 0;
}

int gg_config_load_text(const char *text, size_t len, const char *source, const char *base_dir,
			struct gg_config *cfg, struct gg_diag *diag)
{
	return load_text(text, len, source, base_dir, false, cfg, diag);
}

int gg_config_load_settings_text(const char *text, size_t len, const char *source, const char *base_dir,
				 struct gg_config *cfg, struct gg_diag *diag)
{
	return load_text(text, len, source, base_dir, true, cfg, diag);
}

/* Whether `path` names a descriptor the process was started with
 * (/dev/stdin, a shell's <(...): /dev/fd/N), and nothing past it: the
 * caller opened it, whatever it is. */
static bool own_descriptor(const char *path)
{
	static const char *const folders[] = { "/dev/fd/", "/proc/self/fd/" };

	if (!strcmp(path, "/dev/stdin"))
		return true;
	for (size_t i = 0; i < GG_ARRAY_LEN(folders); i++) {
		const size_t len = strlen(folders[i]);
		if (!strncmp(path, folders[i], len) && path[len] && strspn(path + len, "0123456789") == strlen(path + len))
			return true;
	}
	return false;
}

/* The config names the CA, the key and whom to dial, so whoever may write
 * or replace it chooses whom the gateway trusts: it is held to the CA
 * file's rules, a named pipe too. A descriptor the caller opened
 * (own_descriptor()) is the caller's choice, and not judged. True when it
 * falls short, with the reason in diag. */
static bool config_file_exposed(const char *path, struct gg_diag *diag)
{
	char why[2 * PATH_MAX + 512];
	struct stat st;

	if (own_descriptor(path) || stat(path, &st) || !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode)) ||
	    !trust_refusal(path, &st, why, sizeof(why)))
		return false;
	gg_diag_add(diag, "%s: the config file%s", path, why);
	return true;
}

static int load_file(const char *path, bool settings_only, struct gg_config *cfg, struct gg_diag *diag)
{
	char *text = NULL, *dir = NULL;
	size_t len = 0;
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	rc = gg_read_small_file(path, GG_TOML_MAX_INPUT_BYTES, &text, &len);
	if (rc) {
		if (rc == -EFBIG)
			gg_diag_add(diag, "%s: file is larger than %u bytes; this is not a gateway config", path,
				 GG_TOML_MAX_INPUT_BYTES);
		else if (rc == -ETIMEDOUT)
			gg_diag_add(diag, "%s: a pipe nothing was written to within %d s", path, GG_PIPE_WAIT_MS / 1000);
		else
			gg_diag_add(diag, "%s: cannot read config: %s", path, strerror(-rc));
		return rc;
	}
	const char *slash = strrchr(path, '/');
	dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : NULL;
	if (slash && !dir) {
		free(text);
		return -ENOMEM;
	}
	const bool exposed = !settings_only && config_file_exposed(path, diag);
	rc = load_text(text, len, path, dir, settings_only, cfg, diag);
	free(dir);
	free(text);
	if (exposed && !rc) {
		gg_config_free(cfg);
		rc = -EINVAL;
	}
	return rc;
}

int gg_config_load(const char *path, struct gg_config *cfg, struct gg_diag *diag)
{
	return load_file(path, false, cfg, diag);
}

static int load_report(const char *path, bool settings_only, struct gg_config *cfg, FILE *out)
{
	struct gg_diag diag = { 0 };
	int rc = load_file(path, settings_only, cfg, &diag);

	if (rc) {
		/* The path as every line has it: control characters escaped. */
		const size_t problems = diag.count;
		if (diag.lost || rc == -ENOMEM)
			gg_diag_add(&diag, "%s: out of memory: the check is not complete", path);
		gg_diag_add(&diag, "%s: %zu problem%s found", path, problems, problems == 1 ? "" : "s");
		gg_diag_print(&diag, out);
	}
	gg_diag_free(&diag);
	return rc;
}

int gg_config_load_report(const char *path, struct gg_config *cfg, FILE *out)
{
	return load_report(path, false, cfg, out);
}

int gg_config_load_settings_report(const char *path, struct gg_config *cfg, FILE *out)
{
	return load_report(path, true, cfg, out);
}

void gg_config_free(struct gg_config *cfg)
{
	free(cfg->source);
	for (size_t s = 0; s < GG_ARRAY_LEN(sections); s++)
		for (size_t k = 0; k < sections[s].count; k++) {
			const struct field *f = &sections[s].fields[k];
			if (f->kind == F_STRING || f->kind == F_PATH || f->kind == F_LIST)
				free(*(char **)((char *)cfg + f->offset));
		}
	for (size_t i = 0; i < cfg->peer_count; i++)
		for (size_t k = 0; k < peers_section.count; k++)
			if (peer_fields[k].kind == F_STRING)
				free(*(char **)((char *)&cfg->peers[i] + peer_fields[k].offset));
	free(cfg->peers);
	memset(cfg, 0, sizeof(*cfg));
}

/* ---- printing ----------------------------------------------------------- */

/* Appends `s` to buf as a TOML basic string. */
static void render_string(char *buf, size_t size, const char *s)
{
	size_t n = strlen(buf);

	for (n += (size_t)snprintf(buf + n, size - n, "\""); *s && n + 8 < size; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			n += (size_t)snprintf(buf + n, size - n, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			n += (size_t)snprintf(buf + n, size - n, "\\u%04x", c);
		else
			buf[n++] = (char)c;
	}
	snprintf(buf + n, size - n, "\"");
}

/* Renders one field's value as TOML; returns false when it is unset. */
static bool render_value(const struct field *f, const void *base, char *buf, size_t size)
{
	const void *src = (const char *)base + f->offset;
	char tmp[32];

	buf[0] = '\0';
	switch (f->kind) {
	case F_STRING:
	case F_PATH:
		if (!*(char *const *)src)
			return false;
		render_string(buf, size, *(char *const *)src);
		return true;
	case F_INT:
		snprintf(buf, size, "%d", *(const int *)src);
		return true;
	case F_BOOL:
		snprintf(buf, size, "%s", *(const bool *)src ? "true" : "false");
		return true;
	case F_SIZE_AUTO:
	case F_SIZE:
		if (f->kind == F_SIZE_AUTO && !*(const uint64_t *)src)
			render_string(buf, size, "auto");
		else
			render_string(buf, size, gg_format_size(*(const uint64_t *)src, tmp, sizeof(tmp)));
		return true;
	case F_DURATION:
		render_string(buf, size, gg_format_duration(*(const uint64_t *)src, tmp, sizeof(tmp)));
		return true;
	case F_ENUM:
		render_string(buf, size, f->choices[*(const int *)src]);
		return true;
	case F_CODEC:
		render_string(buf, size, gg_codec_name(*(const enum gg_codec *)src));
		return true;
	case F_LIST: {
		const char *s = *(char *const *)src;
		size_t n = (size_t)snprintf(buf, size, "[");
		for (bool first = true; s && *s && n < size; first = false) {
			size_t len = strcspn(s, ":");
			n += (size_t)snprintf(buf + n, size - n, "%s\"%.*s\"", first ? "" : ", ", (int)len, s);
			s += len + (s[len] == ':');
		}
		if (n < size)
			snprintf(buf + n, size - n, "]");
		return true;
	}
	}
	return false;
}

/* True when the field holds exactly what its default gives; *oom set when
 * memory ran out to tell. */
static bool is_default(const struct field *f, const void *base, const char *rendered, bool *oom)
{
	struct gg_config scratch;
	struct gg_diag diag = { 0 };
	struct loader ld = { .source = "", .diag = &diag };
	char def[512];

	if (!f->def)
		return false;
	memset(&scratch, 0, sizeof(scratch));
	set_field(&ld, f, "", NULL, &scratch);
	*oom |= ld.oom;
	bool same = render_value(f, &scratch, def, sizeof(def)) && !strcmp(def, rendered);
	if (f->kind == F_LIST)
		free(*(char **)((char *)&scratch + f->offset));
	gg_diag_free(&diag);
	return same;
}

/* True when a field without a fixed default holds what fill_derived()
 * makes of the others: threads, control and a peer's identity. */
static bool is_derived_default(const struct gg_config *cfg, const struct section *sec, const struct field *f,
			       const void *base, const char *rendered)
{
	char want[512];

	if (sec == &peers_section) {
		const struct gg_peer_config *p = base;
		if (f->offset != PEER(identity) || !p->site)
			return false;
		snprintf(want, sizeof(want), "\"" DERIVED_IDENTITY "\"", p->site);
	} else if (f->offset == CFG(site.threads)) {
		snprintf(want, sizeof(want), "%d", default_threads());
	} else if (f->offset == CFG(site.control) && cfg->site.name) {
		snprintf(want, sizeof(want), "\"" DERIVED_CONTROL "\"", cfg->site.name);
	} else {
		return false;
	}
	return !strcmp(want, rendered);
}

/* A value as printed: a path made absolute (the config's folder and the
 * value, each up to PATH_MAX), each byte escaped to at most 6 ("\u0001"). */
#define PRINTED_MAX (2 * PATH_MAX * 6 + 64)

/* Prints a section's fields, each rendered into value[PRINTED_MAX]. */
static void print_fields(FILE *out, const struct gg_config *cfg, const struct section *sec, const void *base,
			 char *value, bool *oom)
{
	for (size_t k = 0; k < sec->count; k++) {
		const struct field *f = &sec->fields[k];
		if (!render_value(f, base, value, PRINTED_MAX))
			fprintf(out, "# %s: not set (%s)\n", f->key, f->help);
		else
			fprintf(out, "%s = %s  # %s%s\n", f->key, value,
				is_default(f, base, value, oom) || is_derived_default(cfg, sec, f, base, value)
					? "default; "
					: "",
				f->help);
	}
}

int gg_config_print(const struct gg_config *cfg, FILE *out)
{
	bool oom = false;
	/* A comment ends at a newline: the name's control characters are
	 * escaped, as in the problems' lines. */
	char *source = strdup(cfg->source ? cfg->source : "<memory>");
	char *value = malloc(PRINTED_MAX);

	source = source ? escape_controls(source) : NULL;
	if (!source || !value) {
		free(source);
		free(value);
		return -ENOMEM;
	}
	fprintf(out, "# resolved configuration of %s\n", source);
	free(source);
	for (size_t s = 0; s < GG_ARRAY_LEN(sections); s++) {
		fprintf(out, "\n[%s]\n", sections[s].name);
		print_fields(out, cfg, &sections[s], cfg, value, &oom);
		if (sections[s].fields == tls_fields)
			for (size_t i = 0; i < cfg->peer_count; i++) {
				fprintf(out, "\n[[peers]]\n");
				print_fields(out, cfg, &peers_section, &cfg->peers[i], value, &oom);
			}
	}
	free(value);
	return oom ? -ENOMEM : 0;
}

const char *gg_allreduce_algo_name(enum gg_allreduce_algo algo)
{
	return (unsigned)algo < GG_ARRAY_LEN(algo_names) - 1 ? algo_names[algo] : "?";
}

const char *gg_peer_dial_name(enum gg_peer_dial dial)
{
	return (unsigned)dial < GG_ARRAY_LEN(dial_names) - 1 ? dial_names[dial] : "?";
}

const struct gg_peer_config *gg_config_peer(const struct gg_config *cfg, const char *site)
{
	for (size_t i = 0; i < cfg->peer_count; i++)
		if (cfg->peers[i].site && !strcmp(cfg->peers[i].site, site))
			return &cfg->peers[i];
	return NULL;
}
