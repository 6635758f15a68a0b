#include "net_addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int gg_net_addr_split(const char *text, char *host, size_t host_size, char port[6], const char **why)
{
	const char *p;
	size_t host_len;

	if (text[0] == '[') {
		const char *end = strchr(text, ']');
		if (!end || end[1] != ':') {
			*why = "expected \"[v6address]:port\"";
			return -EINVAL;
		}
		host_len = (size_t)(end - text - 1);
		text++;
		p = end + 2;
	} else {
		const char *colon = strrchr(text, ':');
		if (!colon || colon == text) {
			*why = "expected \"host:port\"";
			return -EINVAL;
		}
		host_len = (size_t)(colon - text);
		p = colon + 1;
	}
	if (host_len >= host_size) {
		*why = "the host is too long";
		return -EINVAL;
	}
	char *end;
	long v = strtol(p, &end, 10);
	if (!*p || *end || v < 0 || v > 65535 || end - p > 5 || (p[0] == '0' && end - p > 1)) {
		*why = "the port is a number from 0 to 65535, without leading zeros";
		return -EINVAL;
	}
	memcpy(host, text, host_len);
	host[host_len] = '\0';
	memcpy(port, p, (size_t)(end - p) + 1);
	return 0;
}

int gg_net_addr_lookup(const char *host, const char *port, bool numeric, struct sockaddr_storage *out,
		       socklen_t *len, const char **why)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = numeric ? AI_NUMERICHOST | AI_NUMERICSERV : 0 },
			*res = NULL;
	int gai = getaddrinfo(host, port, &hints, &res);

	if (gai == EAI_SYSTEM)
		*why = strerror(errno);
	else if (gai)
		*why = gai_strerror(gai);
	else if (!res || res->ai_addrlen > sizeof(*out)) {
		*why = "no address";
		gai = EAI_NONAME;
	}
	if (!gai) {
		memcpy(out, res->ai_addr, res->ai_addrlen);
		*len = res->ai_addrlen;
	}
	if (res)
		freeaddrinfo(res);
	return gai;
}

int gg_net_addr_parse(const char *text, struct sockaddr_storage *out, socklen_t *len, const char **why)
{
	char host[256], port[6];
	int rc = gg_net_addr_split(text, host, sizeof(host), port, why);

	if (rc)
		return rc;
	if (gg_net_addr_lookup(host, port, false, out, len, why)) {
		*why = "the host does not resolve to an address";
		return -EINVAL;
	}
	return 0;
}

bool gg_net_addr_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
	if (sa->sa_family != AF_INET6)
		return false;
	const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
	return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

const char *gg_net_addr_format(const struct sockaddr *sa, char *buf, size_t size)
{
	char ip[INET6_ADDRSTRLEN];

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		snprintf(buf, size, "%s:%u", ip, ntohs(in->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		snprintf(buf, size, "[%s]:%u", ip, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, size, "(unknown address family %d)", sa->sa_family);
	}
	return buf;
}

const char *gg_net_local_addr(int fd, char *buf, size_t size)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &len)) {
		snprintf(buf, size, "(unknown: %s)", strerror(errno));
		return buf;
	}
	return gg_net_addr_format((struct sockaddr *)&ss, buf, size);
}

const char *gg_net_peer_addr(int fd, char *buf, size_t size)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getpeername(fd, (struct sockaddr *)&ss, &len)) {
		snprintf(buf, size, "(unknown: %s)", strerror(errno));
		return buf;
	}
	return gg_net_addr_format((struct sockaddr *)&ss, buf, size);
}

bool gg_net_local_addr_is(int fd, const struct sockaddr_storage *want)
{
	struct sockaddr_storage own;
	socklen_t len = sizeof(own);

	if (getsockname(fd, (struct sockaddr *)&own, &len) || own.ss_family != want->ss_family)
		return false;
	if (own.ss_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)&own, *b = (const void *)want;
		return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
	}
	if (own.ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)&own, *b = (const void *)want;
		return a->sin6_port == b->sin6_port && !memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(a->sin6_addr));
	}
	return false;
}

static int listen_once(const struct sockaddr *sa, socklen_t len, int backlog, int buffer_bytes)
{
	int one = 1, rc;
	uint64_t got;
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	/* Set before listen(): the window scale an accepted connection
	 * offers in its SYN-ACK comes from the listener's receive buffer. */
	if (buffer_bytes > 0 && ((rc = gg_net_set_buffer(fd, false, (uint64_t)buffer_bytes, &got)) ||
				 (rc = gg_net_set_buffer(fd, true, (uint64_t)buffer_bytes, &got)))) {
		close(fd);
		return rc;
	}
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) || bind(fd, sa, len) || listen(fd, backlog)) {
		rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

int gg_net_listen(const struct sockaddr *sa, socklen_t len, int backlog, int buffer_bytes)
{
	int fd = listen_once(sa, len, backlog, buffer_bytes);

	/* A port in use may be on its way to free: a process that listened
	 * there and was killed keeps it until the kernel has torn down its
	 * io_uring rings, whose requests (an accept) hold the socket open,
	 * after the process itself is gone (a few milliseconds, measured;
	 * longer on a busy machine). */
	for (int waited_ms = 0; fd == -EADDRINUSE && waited_ms < GG_NET_LISTEN_WAIT_MS; waited_ms += 10) {
		usleep(10000);
		fd = listen_once(sa, len, backlog, buffer_bytes);
	}
	return fd;
}

int gg_net_addr_is_local(const struct sockaddr *sa, socklen_t len, const char **why)
{
	struct sockaddr_storage ss;

	*why = "not an IPv4 or IPv6 address";
	if (len > sizeof(ss))
		return -EINVAL;
	memcpy(&ss, sa, len);
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_port = 0;
	else if (ss.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&ss)->sin6_port = 0;
	else
		return -EAFNOSUPPORT;
	int fd = gg_net_listen((struct sockaddr *)&ss, len, 1, 0);
	if (fd < 0) {
		*why = fd == -EADDRNOTAVAIL ? "no interface of this host has that address" : strerror(-fd);
		return fd;
	}
	close(fd);
	return 0;
}

int gg_net_tune(int fd, int buffer_bytes, const char *congestion)
{
	int one = 1, lowat = GG_NET_NOTSENT_LOWAT_MIN;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) ||
	    setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat)))
		return -errno;
	uint64_t got;
	int rc;
	if (buffer_bytes > 0 && ((rc = gg_net_set_buffer(fd, true, (uint64_t)buffer_bytes, &got)) ||
				 (rc = gg_net_set_buffer(fd, false, (uint64_t)buffer_bytes, &got))))
		return rc;
	if (congestion && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion, (socklen_t)strlen(congestion)))
		return -errno;
	return 0;
}

uint64_t gg_net_notsent_lowat(uint64_t delivery_bytes_per_s)
{
	uint64_t v = delivery_bytes_per_s / (1000000u / GG_NET_NOTSENT_SPAN_US);

	return GG_MIN(GG_MAX(v, (uint64_t)GG_NET_NOTSENT_LOWAT_MIN), (uint64_t)GG_NET_NOTSENT_LOWAT_MAX);
}

int gg_net_set_buffer(int fd, bool send, uint64_t set_bytes, uint64_t *got)
{
	int v = (int)GG_MIN(set_bytes, (uint64_t)INT_MAX / 2), have = 0;
	socklen_t len = sizeof(have);

	if (setsockopt(fd, SOL_SOCKET, send ? SO_SNDBUFFORCE : SO_RCVBUFFORCE, &v, sizeof(v)) &&
	    (errno != EPERM || setsockopt(fd, SOL_SOCKET, send ? SO_SNDBUF : SO_RCVBUF, &v, sizeof(v))))
		return -errno;
	if (getsockopt(fd, SOL_SOCKET, send ? SO_SNDBUF : SO_RCVBUF, &have, &len))
		return -errno;
	*got = (uint64_t)have;
	return 0;
}

/* The n-th figure (from 0) of a /proc/sys file, or 0. */
static uint64_t proc_figure(const char *path, unsigned n)
{
	FILE *f = fopen(path, "re");
	unsigned long long v = 0;

	for (unsigned i = 0; f && i <= n; i++)
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
	if (f)
		fclose(f);
	return v;
}

void gg_net_buffer_limits(struct gg_net_buffer_limits *out)
{
	out->rmem_max = 2 * proc_figure("/proc/sys/net/core/rmem_max", 0);
	out->wmem_max = 2 * proc_figure("/proc/sys/net/core/wmem_max", 0);
	out->tcp_rmem = proc_figure("/proc/sys/net/ipv4/tcp_rmem", 2);
	out->tcp_wmem = proc_figure("/proc/sys/net/ipv4/tcp_wmem", 2);
	int v = 4096, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	out->may_force = fd >= 0 && !setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v));
	/* A limit not readable here (a container's namespace may not show
	 * net.core.*): what the kernel gives a plain request past any limit. */
	for (int send = 0; send < 2 && fd >= 0; send++) {
		uint64_t *limit = send ? &out->wmem_max : &out->rmem_max;
		int big = INT_MAX / 2, have = 0;
		socklen_t len = sizeof(have);
		if (!*limit && !setsockopt(fd, SOL_SOCKET, send ? SO_SNDBUF : SO_RCVBUF, &big, sizeof(big)) &&
		    !getsockopt(fd, SOL_SOCKET, send ? SO_SNDBUF : SO_RCVBUF, &have, &len) && have > 0)
			*limit = (uint64_t)have;
	}
	if (fd >= 0)
		close(fd);
}

void gg_net_buffer_targets(const struct gg_net_buffer_state *st, const struct gg_net_buffer_limits *lim,
			   uint64_t max_bytes, uint64_t *rcv, uint64_t *snd)
{
	const uint64_t top = 2 * max_bytes, window_max = (uint64_t)UINT16_MAX << GG_MIN(st->rcv_wscale, 14u);
	uint64_t r = GG_MIN(GG_MIN(4 * st->rcv_space, top), 4 * window_max);
	uint64_t s = GG_MIN(GG_MAX(2 * st->snd_now, 4 * st->cwnd_bytes), top);

	/* Autotuning reaches what it can itself: past it only. */
	*rcv = r > lim->tcp_rmem && r > st->rcv_now ? r : 0;
	*snd = st->snd_limited && s > lim->tcp_wmem && s > st->snd_now ? s : 0;
}

uint64_t gg_net_buffer_allowed(const struct gg_net_buffer_limits *lim, bool send, uint64_t want, uint64_t now)
{
	const uint64_t limit = send ? lim->wmem_max : lim->rmem_max;
	/* A limit not known (0): nothing is set, as a buffer set within it
	 * could be smaller than autotuning's. */
	uint64_t v = lim->may_force ? want : GG_MIN(want, limit);

	return v > now ? v : 0;
}

int gg_net_open_window(int fd, uint64_t rcvbuf)
{
	int v = (int)GG_MIN(rcvbuf, (uint64_t)INT_MAX);

	return setsockopt(fd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &v, sizeof(v)) ? -errno : 0;
}

/* The first line of a /proc file, or "?". */
static void read_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "re");

	if (!f || !fgets(buf, (int)size, f))
		snprintf(buf, size, "?");
	if (f)
		fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
}

int gg_net_check_congestion(const char *name, char *err, size_t err_size)
{
	char have[256], allowed[256];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 && errno == EAFNOSUPPORT)
		fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int rc = fd < 0 ? -errno : 0;

	if (!rc && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)))
		rc = -errno;
	if (fd >= 0)
		close(fd);
	if (!rc)
		return 0;
	read_line("/proc/sys/net/ipv4/tcp_available_congestion_control", have, sizeof(have));
	read_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control", allowed, sizeof(allowed));
	if (rc == -ENOENT)
		return gg_errf(err, err_size, rc, "[transport] congestion_control \"%s\": this kernel has no such TCP "
			    "congestion control (it has: %s; \"modprobe tcp_%s\" may add it)", name, have, name);
	if (rc == -EPERM)
		return gg_errf(err, err_size, rc, "[transport] congestion_control \"%s\": this user may not choose it "
			    "(net.ipv4.tcp_allowed_congestion_control is \"%s\"; root may choose any of: %s)", name,
			    allowed, have);
	return gg_errf(err, err_size, rc, "[transport] congestion_control \"%s\": %s", name, strerror(-rc));
}

int gg_net_free_loopback_ports(int *ports, unsigned n)
{
	int fds[64], rc = 0;
	unsigned open_fds = 0;

	if (n > GG_ARRAY_LEN(fds))
		return -EINVAL;
	/* Every socket stays bound until all ports are known, so the kernel
	 * cannot hand out one port twice. */
	for (; open_fds < n && !rc; open_fds++) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t len = sizeof(a);
		int fd = fds[open_fds] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || getsockname(fd, (struct sockaddr *)&a, &len))
			rc = -errno;
		else
			ports[open_fds] = ntohs(a.sin_port);
	}
	while (open_fds--)
		if (fds[open_fds] >= 0)
			close(fds[open_fds]);
	return rc;
}
