/* Socket addresses and listening sockets: setup-time helpers around the
 * io_uring data path. */
#ifndef GG_NET_ADDR_H
#define GG_NET_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "gg_common.h"

#define GG_NET_ADDR_TEXT_MAX 64 /* "[ffff:...]:65535" fits */

/* Splits "host:port" or "[v6addr]:port" into the host (without brackets,
 * a name or an address) and the port's digits (0-65535). Returns 0, or
 * -EINVAL with `why`. */
GG_MUST_CHECK int gg_net_addr_split(const char *text, char *host, size_t host_size, char port[6], const char **why);

/* getaddrinfo() of `host` and `port` for a TCP stream, its first answer in
 * *out; `numeric`: host must be an address, which never blocks (a name
 * gets EAI_NONAME). Returns 0, or the EAI_ code with the reason in `why`. */
GG_MUST_CHECK int gg_net_addr_lookup(const char *host, const char *port, bool numeric, struct sockaddr_storage *out,
				     socklen_t *len, const char **why);

/* Parses "host:port" or "[v6addr]:port"; host may be a name, resolved
 * here (startup only: this may block; a dial asks resolver.h). Returns 0,
 * or -EINVAL with `why`. */
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
/* Whether socket fd's own address is `want`: family, address and port. */
bool gg_net_local_addr_is(int fd, const struct sockaddr_storage *want);

/* A listening TCP socket (SO_REUSEADDR, close-on-exec), with both socket
 * buffers set to buffer_bytes where that is > 0 (gg_net_set_buffer()):
 * the window scale of the connections it accepts comes from its receive
 * buffer, as a dialed one's comes from the dialer's. Returns the fd or a
 * negative errno. Port 0 picks a free port: see gg_net_local_addr(). A
 * port in use is tried again for up to GG_NET_LISTEN_WAIT_MS, blocking:
 * a gateway restarted on it may find it held a moment longer by the one
 * it replaces. */
#define GG_NET_LISTEN_WAIT_MS 1000
GG_MUST_CHECK int gg_net_listen(const struct sockaddr *sa, socklen_t len, int backlog, int buffer_bytes);

/* Whether this host could listen on the address: a listen on it with port
 * 0 tells, without the port, which a running gateway may hold. Returns 0,
 * or a negative errno with `why` ("no interface of this host has that
 * address" for -EADDRNOTAVAIL). */
GG_MUST_CHECK int gg_net_addr_is_local(const struct sockaddr *sa, socklen_t len, const char **why);

/* n distinct loopback TCP ports nobody listens on right now (the kernel's
 * picks for port 0), for tests and benchmarks that start gateways; another
 * process may take one before it is used. n <= 64. Returns 0 or a negative
 * errno. */
GG_MUST_CHECK int gg_net_free_loopback_ports(int *ports, unsigned n);

/* Bytes a stream's socket holds written but not yet sent
 * (TCP_NOTSENT_LOWAT): past them the socket takes no more, so data waits
 * where the sender can still choose a stream for it, however large the
 * send buffer grows for what is in flight. gg_net_notsent_lowat() gives
 * what the stream sends in GG_NET_NOTSENT_SPAN_US at its delivery rate,
 * within MIN and MAX (MIN until a rate is known): a slow stream holds
 * little, a fast one enough to stay fed while its thread is busy elsewhere
 * (a fixed 512 KiB made 100 ms-round-trip steps at 1 Gbit/s 12% slower on
 * a busy two-core host). */
#define GG_NET_NOTSENT_LOWAT_MIN (512u << 10)
#define GG_NET_NOTSENT_LOWAT_MAX (8u << 20)
#define GG_NET_NOTSENT_SPAN_US 100000u

uint64_t gg_net_notsent_lowat(uint64_t delivery_bytes_per_s);

/* TCP_NODELAY, TCP_NOTSENT_LOWAT, both socket buffers when buffer_bytes > 0
 * (gg_net_set_buffer(); 0 keeps the kernel's autotuning), and
 * TCP_CONGESTION when `congestion` is not NULL. Returns 0 or a negative
 * errno. */
GG_MUST_CHECK int gg_net_tune(int fd, int buffer_bytes, const char *congestion);

/* Socket buffer sizes are counted here as the kernel counts them: twice
 * what SO_SNDBUF/SO_RCVBUF set (the rest is for its bookkeeping), as
 * getsockopt() reports them. */
struct gg_net_buffer_limits {
	uint64_t rmem_max, wmem_max; /* net.core.{r,w}mem_max, doubled: the most a process
					without CAP_NET_ADMIN may set */
	uint64_t tcp_rmem, tcp_wmem; /* net.ipv4.tcp_{r,w}mem, third figure: the most autotuning gives */
	bool may_force;              /* the process may pass {r,w}mem_max (CAP_NET_ADMIN) */
};

/* This network namespace's limits, and whether this process may pass
 * them; a figure it cannot read is 0 (rmem_max and wmem_max: what a
 * request past them gets, where that cannot be read either). */
void gg_net_buffer_limits(struct gg_net_buffer_limits *out);

/* Sets the send or receive buffer to hold `bytes` (set_bytes, as SO_SNDBUF
 * takes it), past net.core.{r,w}mem_max where the process has
 * CAP_NET_ADMIN (SO_SNDBUFFORCE), within it otherwise. Returns 0 and
 * *got, the size the kernel reports now (doubled), or a negative errno. */
GG_MUST_CHECK int gg_net_set_buffer(int fd, bool send, uint64_t set_bytes, uint64_t *got);

/* socket_buffer = "auto": the kernel's autotuning sizes a stream's buffers
 * from what it measures, up to tcp_rmem / tcp_wmem. Past that, a stream
 * whose path holds more needs them set: the receive buffer to 4 x
 * rcv_space (the bytes the receiver took in its last round trip, which is
 * what autotuning sizes from: twice that, doubled for bookkeeping), the
 * send buffer, when it held the sender back, to twice what it is, or to
 * 4 x the congestion window if more. Both stay within 2 x max_bytes
 * (socket_buffer_max). */
struct gg_net_buffer_state {
	uint64_t rcv_now, snd_now; /* as getsockopt() reports them */
	uint64_t rcv_space;        /* tcpi_rcv_space */
	uint64_t cwnd_bytes;       /* tcpi_snd_cwnd x tcpi_snd_mss */
	bool snd_limited;          /* tcpi_sndbuf_limited grew since the last look */
	unsigned rcv_wscale;       /* tcpi_rcv_wscale */
};

/* The sizes the stream needs (doubled, as getsockopt() would report
 * them), or 0 for one to leave as it is. The receive side needs no more
 * than four times the largest window its connection may offer (the
 * kernel may count as little as a quarter of a buffer as window): 64 KiB
 * shifted by the scale fixed when it opened (rcv_wscale), from the larger
 * of tcp_rmem and rmem_max then. */
void gg_net_buffer_targets(const struct gg_net_buffer_state *st, const struct gg_net_buffer_limits *lim,
			   uint64_t max_bytes, uint64_t *rcv, uint64_t *snd);

/* What of `want` (a size gg_net_buffer_targets() gave for the send or
 * receive buffer, which holds `now`) may be set: all of it where the
 * process may pass the kernel's limit, as much as the limit allows
 * otherwise (nothing where it is not known), and 0 where that is no more than
 * `now`: a buffer set stops the kernel's autotuning of it for good, and
 * autotuning may have given more than the limit allows a process to set. */
uint64_t gg_net_buffer_allowed(const struct gg_net_buffer_limits *lim, bool send, uint64_t want, uint64_t now);

/* Opens the receive window of a connected socket whose receive buffer was
 * raised to `rcvbuf` (as getsockopt() reports it) up to that buffer: the
 * kernel's clamp on it stays where autotuning left it otherwise
 * (TCP_WINDOW_CLAMP). Returns 0 or a negative errno. */
int gg_net_open_window(int fd, uint64_t rcvbuf);

/* Whether TCP sockets of this process may use congestion control `name`:
 * 0, or a negative errno with a message that says what this kernel offers
 * (net.ipv4.tcp_available_congestion_control) and how to add more. */
GG_MUST_CHECK int gg_net_check_congestion(const char *name, char *err, size_t err_size);

#endif
