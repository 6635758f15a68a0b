/* The gateway's configuration: one struct, filled from a TOML file with
 * defaults, and validated so that every problem is reported at once with
 * the place it comes from. */
#ifndef GG_CONFIG_H
#define GG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "codec.h"
#include "gg_common.h"

#define GG_MAX_PEERS 7          /* eight sites in all */
#define GG_SITE_NAME_MAX 63

enum gg_allreduce_algo {
	GG_ALLREDUCE_DIRECT,
	GG_ALLREDUCE_RING,
	GG_ALLREDUCE_AUTO, /* direct or ring per step, from the measured links */
};

/* Who opens the streams between this site and a peer: [[peers]] dial. */
enum gg_peer_dial {
	GG_DIAL_BOTH, /* either site may dial; of two connections for one stream, the one the site
		       * whose name sorts first dialed is kept */
	GG_DIAL_OUT,  /* this site dials the peer, and refuses the peer's connections */
	GG_DIAL_IN,   /* this site never dials the peer: it takes the peer's connections */
};

/* Where a value is in its file: line and column, from 1. Line 0: the file
 * leaves the setting at its default. */
struct gg_config_pos {
	unsigned line, col;
};

struct gg_peer_config {
	char *site;     /* the peer's site name, as its own config says */
	char *address;  /* "host:port" it listens on; NULL: none given (dial = "in" only) */
	char *identity; /* "dns:NAME" or "uri:URI" its certificate must carry */
	enum gg_peer_dial dial;
	struct gg_config_pos dial_at; /* for --check-config's problems between files */
};

struct gg_config {
	char *source; /* the file this came from, as given */

	struct {
		char *name;
		char *listen;   /* "host:port" for peer gateways */
		char *control;  /* "unix:/PATH" for local clients */
		int threads;    /* lanes: threads with an io_uring loop each (default: one per CPU) */
	} site;

	struct {
		char *ca;        /* absolute paths; relative ones resolved against the config file's folder */
		char *cert;
		char *key;
		char *crl;       /* NULL when not configured */
		char *ciphersuites; /* OpenSSL TLS 1.3 list, ':'-separated, in preference order */
		char *groups;       /* key-exchange groups, ':'-separated, in preference order */
	} tls;

	struct gg_peer_config *peers;
	size_t peer_count;

	struct {
		int streams_per_peer;
		uint64_t chunk_bytes;
		uint64_t socket_buffer_bytes;     /* 0: auto */
		uint64_t socket_buffer_max_bytes; /* auto's bound */
		char *congestion_control; /* NULL: the system's default */
		uint64_t heartbeat_interval_us;
		uint64_t heartbeat_timeout_us;
		uint64_t connect_timeout_us;
		uint64_t handshake_timeout_us;
		uint64_t step_timeout_us;
		uint64_t reconnect_min_us;
		uint64_t reconnect_max_us;
	} transport;

	struct {
		enum gg_codec codec;
		int block_size;  /* int8/int4 elements per scale */
		enum gg_scale_kind scale; /* int8/int4 block scales */
		int zstd_level;  /* 0: zstd stage off */
		bool error_feedback;
	} compression;

	struct {
		enum gg_allreduce_algo algorithm;
	} allreduce;

	struct {
		uint64_t memory_bytes;
		uint64_t inflight_bytes_per_peer;
		uint64_t max_message_bytes;
		int max_clients;
		uint64_t session_idle_us;
	} limits;

	struct {
		char *listen;      /* "host:port" of the Prometheus endpoint; NULL: off */
		bool allow_remote; /* listen may be a non-loopback address */
	} metrics;

	/* Where the settings are that only the host can judge (an address no
	 * interface has, a congestion control the kernel lacks, the control
	 * socket's folder): --check-config names the place of such a problem. */
	struct {
		struct gg_config_pos listen, control, congestion_control, metrics_listen;
	} at;
};

/* Problems found while loading, each one line ready for a person:
 * "site.toml:12:1: error: unknown key 'chunk_sise' in [transport] (did you
 * mean 'chunk_size'?)". Control characters and bytes that are not UTF-8
 * (from keys, values, the file's name) are written as \xNN. */
struct gg_diag {
	char **lines;
	size_t count;
	size_t cap;
	bool lost; /* a problem could not be kept (out of memory) */
};

void gg_diag_free(struct gg_diag *diag);
/* Adds a line, formatted, its control characters escaped as the loader's
 * own (a file name may hold any byte). */
GG_PRINTF(2, 3) void gg_diag_add(struct gg_diag *diag, const char *fmt, ...);
void gg_diag_print(const struct gg_diag *diag, FILE *out);

/* Reads, parses and validates `path`. Returns 0 with *cfg filled (free with
 * gg_config_free), or -EINVAL with every problem found in `diag` (the
 * caller frees it with gg_diag_free; *cfg is then left zeroed), or another
 * negative errno (-ENOMEM, or the file could not be read: also in diag). */
GG_MUST_CHECK int gg_config_load(const char *path, struct gg_config *cfg, struct gg_diag *diag);

/* The same for TOML text already in memory; relative paths resolve against
 * `base_dir` (NULL: the current directory), and a relative `base_dir`
 * against the current directory. */
GG_MUST_CHECK int gg_config_load_text(const char *text, size_t len, const char *source,
				      const char *base_dir, struct gg_config *cfg, struct gg_diag *diag);
/* The same without the checks of the files the config names (as
 * gg_config_load_settings_report()). */
GG_MUST_CHECK int gg_config_load_settings_text(const char *text, size_t len, const char *source,
					       const char *base_dir, struct gg_config *cfg, struct gg_diag *diag);

/* gg_config_load(), and when it fails every problem and their count
 * ("site.toml: 2 problems found") on `out`. */
GG_MUST_CHECK int gg_config_load_report(const char *path, struct gg_config *cfg, FILE *out);
/* The same without the checks of the files the config names (readable, a
 * regular file, the key's mode): for tools that only read its settings,
 * such as `gradgate status`. */
GG_MUST_CHECK int gg_config_load_settings_report(const char *path, struct gg_config *cfg, FILE *out);

void gg_config_free(struct gg_config *cfg);

/* Prints the resolved configuration as TOML that loads back to the same
 * struct; values left at their default are marked "# default". Returns
 * 0, or -ENOMEM when memory ran out: to print at all (nothing is), or
 * to tell the defaults (the marks may then be missing). */
int gg_config_print(const struct gg_config *cfg, FILE *out);

const char *gg_allreduce_algo_name(enum gg_allreduce_algo algo);
/* "both", "out", "in": the value as the config file writes it. */
const char *gg_peer_dial_name(enum gg_peer_dial dial);
/* The [[peers]] entry of `site`, or NULL. */
const struct gg_peer_config *gg_config_peer(const struct gg_config *cfg, const char *site);

#endif
