/* The gradgate daemon: one site's gateway, serving its local ranks through
 * a site backend and exchanging their sums with the other sites. */
#ifndef GG_DAEMON_H
#define GG_DAEMON_H

#include <sys/socket.h>

#include "config.h"
#include "gg_common.h"

enum gg_daemon_exit {
	GG_EXIT_OK = 0,
	GG_EXIT_CONFIG = 1,  /* the configuration has problems */
	GG_EXIT_USAGE = 2,
	GG_EXIT_STARTUP = 3, /* could not start: credentials, sockets, io_uring */
	GG_EXIT_RUNTIME = 4, /* the event loop broke */
};

/* Runs until SIGTERM or SIGINT (then drains and exits GG_EXIT_OK); SIGHUP
 * reloads the certificates and key, and warns when the file cfg was read
 * from (cfg->source) changed since: the rest of it is read at start only.
 * Returns an enum gg_daemon_exit. */
int gg_daemon_run(const struct gg_config *cfg);

/* The address [metrics] listen (set) resolves to, which must be a loopback
 * one unless allow_remote: 0, or -EINVAL with err saying why (start and
 * --check-config alike). */
GG_MUST_CHECK int gg_daemon_metrics_address(const struct gg_config *cfg, struct sockaddr_storage *ss, socklen_t *len,
					    char *err, size_t err_size);

#endif
