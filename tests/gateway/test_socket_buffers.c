/* socket_buffer = "auto": when a stream's buffers go past what the kernel's
 * autotuning gives (gg_net_buffer_targets()), and how far; and that
 * gg_net_set_buffer() sets what it is asked within what the kernel allows
 * and reports what it set. Sizes as the kernel counts them: twice what
 * SO_RCVBUF sets. */
#include <stdbool.h>
#include <stdint.h>
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
	const uint64_t max = 64 * MiB; /* socket_buffer_max */
	uint64_t rcv, snd;

	/* A stream that takes 512 KiB per round trip: autotuning's business. */
	struct gg_net_buffer_state st = { .rcv_now = 2 * MiB, .snd_now = 1 * MiB, .rcv_space = 512 * KiB,
					  .cwnd_bytes = 512 * KiB };
	gg_net_buffer_targets(&st, &lim, max, &rcv, &snd);
	CHECK(rcv == 0 && snd == 0, "within autotuning: %llu %llu", (unsigned long long)rcv, (unsigned long long)snd);

	/* At autotuning's limit, taking what its window allows: 4 x. */
	st = (struct gg_net_buffer_state){ .rcv_now = 6 * MiB, .snd_now = 4 * MiB, .rcv_space = 3 * MiB,
					   .cwnd_bytes = 2 * MiB, .snd_limited = true };
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
					   .cwnd_bytes = 60 * MiB, .snd_limited = true };
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
	set_buffer();
	printf("socket buffers: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
