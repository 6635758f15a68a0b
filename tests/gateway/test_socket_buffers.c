/* socket_buffer = "auto": when a stream's buffers go past what the kernel's
 * autotuning gives (gg_net_buffer_targets()), and how far; what of that
 * may be set (gg_net_buffer_allowed()); that a raised receive buffer
 * opens the window (gg_net_open_window()); and that
 * gg_net_set_buffer() sets what it is asked within what the kernel allows
 * and reports what it set. Sizes as the kernel counts them: twice what
 * SO_RCVBUF sets. */
#include <stdbool.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gg_check.h"
#include "net_addr.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

static void targets(void)
{
	/* Debian's defaults: autotuning up to 6 MiB receive, 4 MiB send. */
	const struct gg_net_buffer_limits lim = { .rmem_max = 416 * KiB, .wmem_max = 416 * KiB,
						  .tcp_rmem = 6 * MiB, .tcp_wmem = 4 * MiB };
	const unsigned wscale = 14; /* windows of up to 1 GiB: no bound here */
	const uint64_t max = 64 * MiB; /* socket_buffer_max */
	uint64_t rcv, snd;

	/* A stream that takes 512 KiB per round trip: autotuning's business. */
	struct gg_net_buffer_state st = { .rcv_now = 2 * MiB, .snd_now = 1 * MiB, .rcv_space = 512 * KiB,
					  .cwnd_bytes = 512 * KiB, .rcv_wscale = wscale };
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(rcv == 0 && snd == 0, "within autotuning: %llu %llu", (unsigned long long)rcv, (unsigned long long)snd);

	/* At autotuning's limit, taking what its window allows: 4 x. */
	st = (struct gg_net_buffer_state){ .rcv_now = 6 * MiB, .snd_now = 4 * MiB, .rcv_space = 3 * MiB,
					   .cwnd_bytes = 2 * MiB, .snd_limited = true, .rcv_wscale = wscale };
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(rcv == 12 * MiB, "receive %llu, expected 12 MiB", (unsigned long long)rcv);
	CHECK(snd == 8 * MiB, "send %llu, expected 8 MiB (twice, the window needing less)", (unsigned long long)snd);

	/* A window that needs more than twice: 4 x the window. */
	st.cwnd_bytes = 5 * MiB;
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(snd == 20 * MiB, "send %llu, expected 20 MiB", (unsigned long long)snd);

	/* Not held back by its send buffer: the send side stays. */
	st.snd_limited = false;
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(snd == 0, "send %llu while not limited by it", (unsigned long long)snd);

	/* Never past 2 x socket_buffer_max, and never down. */
	st = (struct gg_net_buffer_state){ .rcv_now = 100 * MiB, .snd_now = 100 * MiB, .rcv_space = 50 * MiB,
					   .cwnd_bytes = 60 * MiB, .snd_limited = true, .rcv_wscale = wscale };
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(rcv == 128 * MiB && snd == 128 * MiB, "%llu %llu, expected both at 128 MiB",
	      (unsigned long long)rcv, (unsigned long long)snd);
	st.rcv_now = st.snd_now = 128 * MiB;
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(rcv == 0 && snd == 0, "at the bound: %llu %llu", (unsigned long long)rcv, (unsigned long long)snd);
	st.rcv_now = 20 * MiB;
	st.rcv_space = 1 * MiB;
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(rcv == 0, "receive shrunk to %llu", (unsigned long long)rcv);

	/* A connection that opened with window scale 7 (tcp_rmem and
	 * rmem_max of 6 MiB at most then) offers 8 MiB at most: a buffer
	 * past four times that holds nothing more. */
	st = (struct gg_net_buffer_state){ .rcv_now = 6 * MiB, .rcv_space = 20 * MiB, .rcv_wscale = 7 };
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(rcv == 4 * (65535ull << 7), "receive %llu with window scale 7, expected %llu", (unsigned long long)rcv,
	      4 * (65535ull << 7));
}

/* What of a target may be set: a process without CAP_NET_ADMIN may not
 * pass rmem_max, and setting a buffer below what autotuning gave would
 * shrink the stream's window for good. */
static void allowed(void)
{
	struct gg_net_buffer_limits lim = { .rmem_max = 416 * KiB, .wmem_max = 416 * KiB, .tcp_rmem = 6 * MiB,
					    .tcp_wmem = 4 * MiB, .may_force = false };
	uint64_t v;

	/* Autotuning gave 6 MiB; the stream needs 12: nothing may be set. */
	CHECK((v = gg_net_buffer_allowed(&lim, false, 12 * MiB, 6 * MiB)) == 0,
	      "receive buffer set to %llu without CAP_NET_ADMIN, below the 6 MiB autotuning gave",
	      (unsigned long long)v);
	CHECK((v = gg_net_buffer_allowed(&lim, true, 8 * MiB, 4 * MiB)) == 0, "send buffer set to %llu, below 4 MiB",
	      (unsigned long long)v);
	/* Limits raised to 64 MiB: up to them. */
	lim.rmem_max = lim.wmem_max = 128 * MiB;
	CHECK((v = gg_net_buffer_allowed(&lim, false, 12 * MiB, 6 * MiB)) == 12 * MiB, "receive %llu, expected 12 MiB",
	      (unsigned long long)v);
	lim.rmem_max = 8 * MiB;
	CHECK((v = gg_net_buffer_allowed(&lim, false, 12 * MiB, 6 * MiB)) == 8 * MiB,
	      "receive %llu, expected the 8 MiB limit", (unsigned long long)v);
	/* A limit not known: nothing, rather than a buffer below autotuning's. */
	lim.rmem_max = 0;
	CHECK((v = gg_net_buffer_allowed(&lim, false, 12 * MiB, 6 * MiB)) == 0,
	      "receive %llu with the limit unknown, expected nothing set", (unsigned long long)v);
	/* With CAP_NET_ADMIN: all of it. */
	lim.may_force = true;
	CHECK((v = gg_net_buffer_allowed(&lim, false, 12 * MiB, 6 * MiB)) == 12 * MiB, "receive %llu, expected 12 MiB",
	      (unsigned long long)v);
	CHECK(gg_net_buffer_allowed(&lim, false, 6 * MiB, 6 * MiB) == 0, "a buffer set to what it holds");
}

/* A receive buffer raised on a connected socket: the kernel's clamp on
 * its window stays where it was until gg_net_open_window() lifts it. */
static void open_window(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int lfd = gg_net_listen((struct sockaddr *)&sa, sizeof(sa), 1, 0), cfd = -1, afd = -1, clamp = 0;
	socklen_t il = sizeof(clamp);
	uint64_t got = 0;

	CHECK(lfd >= 0 && !getsockname(lfd, (struct sockaddr *)&sa, &sl), "listen");
	if (lfd >= 0 && (cfd = socket(AF_INET, SOCK_STREAM, 0)) >= 0 && !connect(cfd, (struct sockaddr *)&sa, sl))
		afd = accept(lfd, NULL, NULL);
	CHECK(afd >= 0, "no connection");
	if (afd >= 0) {
		CHECK(gg_net_set_buffer(afd, false, 1 * MiB, &got) == 0, "set the receive buffer");
		CHECK(!getsockopt(afd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &clamp, &il), "TCP_WINDOW_CLAMP");
		printf("receive buffer raised to %llu: window clamp %d", (unsigned long long)got, clamp);
		CHECK(gg_net_open_window(afd, got) == 0 && !getsockopt(afd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &clamp, &il) &&
			      (uint64_t)clamp == got,
		      "window clamp %d once opened, expected %llu", clamp, (unsigned long long)got);
		printf(", then %d\n", clamp);
	}
	if (afd >= 0)
		close(afd);
	if (cfd >= 0)
		close(cfd);
	if (lfd >= 0)
		close(lfd);
}

static void set_buffer(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint64_t got = 0;

	CHECK(fd >= 0, "socket");
	if (fd < 0)
		return;
	struct gg_net_buffer_limits lim;
	gg_net_buffer_limits(&lim);
	CHECK(lim.rmem_max > 0 && lim.tcp_rmem > 0 && lim.wmem_max > 0 && lim.tcp_wmem > 0,
	      "limits not read: %llu %llu %llu %llu", (unsigned long long)lim.rmem_max,
	      (unsigned long long)lim.tcp_rmem, (unsigned long long)lim.wmem_max, (unsigned long long)lim.tcp_wmem);
	/* 64 KiB is within every kernel's limit: the kernel counts twice. */
	CHECK(gg_net_set_buffer(fd, false, 64 * KiB, &got) == 0 && got == 128 * KiB, "receive: got %llu",
	      (unsigned long long)got);
	CHECK(gg_net_set_buffer(fd, true, 64 * KiB, &got) == 0 && got == 128 * KiB, "send: got %llu",
	      (unsigned long long)got);
	/* Past rmem_max: all of it with CAP_NET_ADMIN, the limit without. */
	uint64_t big = lim.rmem_max; /* twice the limit, as set */
	CHECK(gg_net_set_buffer(fd, false, big, &got) == 0 && (got == 2 * big || got == lim.rmem_max),
	      "receive past the limit: got %llu, expected %llu or %llu", (unsigned long long)got,
	      (unsigned long long)(2 * big), (unsigned long long)lim.rmem_max);
	printf("past net.core.rmem_max (%llu): the kernel reports %llu (%s)\n", (unsigned long long)(lim.rmem_max / 2),
	       (unsigned long long)got, got == 2 * big ? "set in full" : "capped: no CAP_NET_ADMIN");
	close(fd);
	CHECK(gg_net_set_buffer(-1, false, 64 * KiB, &got) < 0, "a bad fd is an error");
}

int main(void)
{
	targets();
	allowed();
	open_window();
	set_buffer();
	printf("socket buffers: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
