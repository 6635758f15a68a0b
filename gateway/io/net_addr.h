/* Socket addresses and listening sockets: setup-time helpers around the
 * io_uring data path. */
#ifndef GG_NET_ADDR_H
#define GG_NET_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "gg_common.h"

#define GG_NET_ADDR_TEXT_MAX 64 /* "[ffff:...]:65535" fits */

/* Parses "host:port" or "[v6addr]:port"; host may be a name, resolved
 * here (startup only: this may block). Returns 0, or -EINVAL with `why`. */
GG_MUST_CHECK int gg_net_addr_parse(const char *text, struct sockaddr_storage *out, socklen_t *len,
				    const char **why);

/* Whether the address is this host's loopback: 127.0.0.0/8, ::1, or
 * ::ffff:127.x.y.z. */
bool gg_net_addr_is_loopback(const struct sockaddr *sa);

/* "10.0.0.1:7001" or "[::1]:7001"; returns buf. */
const char *gg_net_addr_format(const struct sockaddr *sa, char *buf, size_t size);

/* The local / remote address of a socket, formatted. */
const char *gg_net_local_addr(int fd, char *buf, size_t size);
const char *gg_net_peer_addr(int fd, char *buf, size_t size);

/* A listening TCP socket (SO_REUSEADDR, close-on-exec). Returns the fd or
 * a negative errno. Port 0 picks a free port: see gg_net_local_addr(). */
GG_MUST_CHECK int gg_net_listen(const struct sockaddr *sa, socklen_t len, int backlog);

/* n distinct loopback TCP ports nobody listens on right now (the kernel's
 * picks for port 0), for tests and benchmarks that start gateways; another
 * process may take one before it is used. n <= 64. Returns 0 or a negative
 * errno. */
GG_MUST_CHECK int gg_net_free_loopback_ports(int *ports, unsigned n);

/* TCP_NODELAY, SO_SNDBUF/SO_RCVBUF when buffer_bytes > 0 (0 keeps the
 * kernel's autotuning), and TCP_CONGESTION when `congestion` is not NULL.
 * Returns 0 or a negative errno. */
GG_MUST_CHECK int gg_net_tune(int fd, int buffer_bytes, const char *congestion);

/* Whether TCP sockets of this process may use congestion control `name`:
 * 0, or a negative errno with a message that says what this kernel offers
 * (net.ipv4.tcp_available_congestion_control) and how to add more. */
GG_MUST_CHECK int gg_net_check_congestion(const char *name, char *err, size_t err_size);

#endif
