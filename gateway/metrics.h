/* The gateway's figures as a Prometheus page (text exposition format
 * 0.0.4): every family named gradgate_*, with HELP and TYPE, units in the
 * names. Made from snapshots the daemon takes on its own thread; nothing
 * here reads the lanes. */
#ifndef GG_METRICS_H
#define GG_METRICS_H

#include <stdint.h>

#include "host_backend.h"
#include "node.h"
#include "strbuf.h"

#define GG_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct gg_metrics_input {
	const char *site;
	const char *version;
	const char *peer_names[GG_AR_MAX_SITES]; /* by site index; NULL for this site */
	const struct gg_node_metrics *node;
	const struct gg_host_backend_stats *host;
	uint64_t memory_limit_bytes;    /* [limits] memory */
	double start_unix_s;            /* when the gateway started */
	double now_unix_s;              /* and now, with */
	uint64_t now_us;                /* gg_monotonic_us() at the same moment */
};

/* Appends the page to `out`. */
void gg_metrics_render(const struct gg_metrics_input *in, struct gg_strbuf *out);

#endif
