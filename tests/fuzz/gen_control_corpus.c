/* Writes the seed corpus of the control fuzz target (fuzz_control.c):
 * jobs of one and two ranks that complete steps (the core answering at
 * once, later, or failing them), bfloat16 steps against the memory limit,
 * ranks that disagree, miss the deadline or leave mid-step, the gateway
 * stopping, and each way a client can break the protocol or be refused.
 * usage: gen-control-corpus DIR */
#include <stdio.h>

#include "control_proto.h"
#include "fuzz_script.h"

static struct script_out o;

/* max_clients 4, max_message 32 KiB, memory 8 KiB, step timeout 2.56 s,
 * hello timeout 1 s, the core's manner. */
static void limits(uint8_t manner)
{
	static const uint8_t l[] = { 3, 31, 3, 255, 99 };

	script_put_bytes(&o, l, sizeof(l));
	script_put(&o, manner, 1);
}

static void op(enum control_op what, unsigned client)
{
	script_put(&o, what, 1);
	if (what != CONTROL_RUN && what != CONTROL_TIME && what != CONTROL_CORE && what != CONTROL_STOP)
		script_put(&o, client, 1);
}

static void hello(unsigned client, uint8_t version, uint8_t rank, uint8_t nranks, uint8_t job)
{
	op(CONTROL_CONNECT, client);
	op(CONTROL_HELLO, client);
	script_put(&o, version, 1);
	script_put(&o, rank, 1);
	script_put(&o, nranks, 1);
	script_put(&o, job, 1);
}

static void map(unsigned client, uint8_t region, uint8_t pages, enum control_fd kind)
{
	op(CONTROL_MAP, client);
	script_put(&o, region, 1);
	script_put(&o, pages, 1);
	script_put(&o, kind, 1);
}

static void allreduce(unsigned client, uint8_t seq, uint8_t dtype, uint16_t count, uint32_t offset, uint8_t region)
{
	op(CONTROL_ALLREDUCE, client);
	script_put(&o, seq, 1);
	script_put(&o, 1, 1);
	script_put(&o, dtype, 1);
	script_put(&o, count, 2);
	script_put(&o, offset, 4);
	script_put(&o, region, 1);
	script_put(&o, 0, 2);
}

static void core(uint8_t what)
{
	op(CONTROL_CORE, 0);
	script_put(&o, what, 1);
}

/* Two ranks of job j0 with a region each, ready for steps. */
static void two_ranks(void)
{
	hello(0, 0, 0, 2, 0);
	hello(1, 0, 1, 2, 0);
	map(0, 0, 8, CONTROL_FD_SEALED);
	map(1, 0, 8, CONTROL_FD_SEALED);
}

static void step_both(uint8_t dtype, uint16_t count)
{
	allreduce(0, 0, dtype, count, 0, 0);
	allreduce(1, 0, dtype, count, 0, 0);
}

int main(int argc, char **argv)
{
	int rc = 0;

	const char *dir = script_dir(argc, argv);

	if (!dir)
		return 2;

	/* Steps that complete, the core answering at once. */
	limits(0);
	two_ranks();
	step_both(GG_DTYPE_F32, 1000);
	step_both(GG_DTYPE_F32, 1000);
	op(CONTROL_UNMAP, 0);
	script_put(&o, 0, 1);
	rc |= script_save(&o, dir, "sync");

	/* The core holds steps: completes one, fails the next; bfloat16 steps
	 * need sums of their own, which the memory limit bounds. */
	limits(1);
	two_ranks();
	step_both(GG_DTYPE_F32, 500);
	step_both(GG_DTYPE_BF16, 1000);
	core(0);
	core(1);
	step_both(GG_DTYPE_BF16, 4000);
	core(2);
	rc |= script_save(&o, dir, "held");

	/* One rank, several requests in flight, in place and at offsets. */
	limits(1);
	hello(0, 0, 0, 1, 2);
	map(0, 3, 16, CONTROL_FD_SEALED);
	for (uint8_t i = 0; i < 4; i++)
		allreduce(0, 0, GG_DTYPE_F32, 256, i * 1024u, 3);
	core(2);
	core(3);
	allreduce(0, 0, GG_DTYPE_BF16, 300, 0, 3);
	rc |= script_save(&o, dir, "one-rank");

	/* Ranks that disagree; a deadline missed; a rank that leaves mid-step. */
	limits(1);
	two_ranks();
	allreduce(0, 0, GG_DTYPE_F32, 100, 0, 0);
	allreduce(1, 0, GG_DTYPE_F32, 101, 0, 0);
	allreduce(0, 0, GG_DTYPE_F32, 100, 0, 0);
	op(CONTROL_TIME, 0);
	script_put(&o, 3000, 2);
	op(CONTROL_RUN, 0);
	script_put(&o, 1, 1);
	step_both(GG_DTYPE_F32, 100);
	op(CONTROL_CLOSE, 1);
	core(0x80);
	rc |= script_save(&o, dir, "failures");

	/* The core says too late when the job breaks; then the gateway stops. */
	limits(4);
	two_ranks();
	step_both(GG_DTYPE_F32, 64);
	op(CONTROL_CLOSE, 0);
	core(0x80);
	op(CONTROL_STOP, 0);
	rc |= script_save(&o, dir, "too-late");

	/* The core refuses steps. */
	limits(2);
	two_ranks();
	step_both(GG_DTYPE_F32, 64);
	rc |= script_save(&o, dir, "refused-by-core");

	/* Refusals: another version, a bad job name, ranks out of range or
	 * twice, nranks that disagree, more clients than allowed, no HELLO. */
	limits(0);
	hello(0, 1, 0, 1, 0);
	hello(1, 0, 0, 1, 3);
	script_put_text(&o, "bad name!");
	hello(2, 0, 5, 2, 1);
	hello(3, 0, 0, 2, 1);
	hello(4, 0, 1, 3, 1);
	hello(5, 0, 0, 2, 1);
	op(CONTROL_CONNECT, 0);
	op(CONTROL_TIME, 0);
	script_put(&o, 2000, 2);
	rc |= script_save(&o, dir, "refusals");

	/* Violations: descriptors of every wrong kind, regions out of range or
	 * mapped twice, UNMAP in use, wrong seq, too many in flight. */
	static const enum control_fd kinds[] = { CONTROL_FD_UNSEALED, CONTROL_FD_SHORT, CONTROL_FD_NONE,
						 CONTROL_FD_TWO, CONTROL_FD_PIPE };
	for (unsigned k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		char name[32];
		limits(1);
		hello(0, 0, 0, 1, 0);
		map(0, 1, 4, kinds[k]);
		snprintf(name, sizeof(name), "bad-map-%u", k);
		rc |= script_save(&o, dir, name);
	}
	limits(1);
	hello(0, 0, 0, 1, 0);
	map(0, 1, 4, CONTROL_FD_SEALED);
	map(0, 1, 4, CONTROL_FD_SEALED);
	rc |= script_save(&o, dir, "map-twice");
	limits(1);
	hello(0, 0, 0, 1, 0);
	map(0, 1, 4, CONTROL_FD_SEALED);
	allreduce(0, 0, GG_DTYPE_F32, 64, 0, 1);
	op(CONTROL_UNMAP, 0);
	script_put(&o, 1, 1);
	rc |= script_save(&o, dir, "unmap-in-use");
	limits(1);
	hello(0, 0, 0, 1, 0);
	map(0, 1, 4, CONTROL_FD_SEALED);
	for (unsigned i = 0; i < GG_CTRL_MAX_INFLIGHT + 1; i++)
		allreduce(0, 0, GG_DTYPE_F32, 8, 64u * i, 1);
	rc |= script_save(&o, dir, "too-many");
	limits(1);
	hello(0, 0, 0, 1, 0);
	map(0, 1, 4, CONTROL_FD_SEALED);
	allreduce(0, 7, GG_DTYPE_F32, 8, 0, 1);
	rc |= script_save(&o, dir, "wrong-seq");

	/* Packets of every shape: truncated, oversized, with a bad header. */
	limits(0);
	op(CONTROL_CONNECT, 0);
	union gg_ctrl_msg m = { 0 };
	size_t len = gg_ctrl_init(&m, GG_CTRL_HELLO);
	m.hello.version = GG_CTRL_VERSION;
	m.hello.nranks = 1;
	gg_ctrl_set_text(m.hello.job, sizeof(m.hello.job), "raw");
	const size_t lens[] = { len - 1, len, len + 1, 12, sizeof(m) + 8 };
	for (unsigned i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		op(CONTROL_RAW, 0);
		script_put(&o, lens[i], 2);
		script_put_bytes(&o, &m, lens[i] < sizeof(m) ? lens[i] : sizeof(m));
		if (lens[i] > sizeof(m))
			script_put_bytes(&o, &m, lens[i] - sizeof(m));
	}
	rc |= script_save(&o, dir, "raw");
	return rc ? 1 : 0;
}
