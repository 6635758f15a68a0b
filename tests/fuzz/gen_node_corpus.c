/* Writes the seed corpus of the node fuzz target (fuzz_node.c): for each
 * configuration a step that completes (every peer's DATA, the ACKs, every
 * DONE), then the ways a step fails: a peer's ABORT or END, a local abort,
 * a missed deadline, a peer that restarts, a corrupt frame, a peer that
 * announced another tensor, DATA that comes before its step, and a few
 * malformed messages.
 * usage: gen-node-corpus DIR */
#include <stdio.h>

#include "fuzz_script.h"
#include "wire.h"

/* As fuzz_node.c's variants: sites, streams, ring or not. */
static const struct {
	unsigned sites, streams;
	bool ring;
} variants[] = {
	{ 2, 1, false }, { 3, 2, true }, { 3, 1, false }, { 2, 2, true }, { 3, 1, true }, { 2, 1, false },
};

static struct script_out o;
static const char *dir;
static int rc;

static void op(enum node_op what)
{
	script_put(&o, what, 1);
}

/* An operation on `peer`'s stream `stream`; its other arguments follow. */
static void on_stream(enum node_op what, unsigned peer, unsigned stream)
{
	op(what);
	script_put(&o, peer, 1);
	script_put(&o, stream, 1);
}

static void open_all(unsigned v, uint8_t instance)
{
	for (unsigned p = 0; p + 1 < variants[v].sites; p++) {
		for (unsigned s = 0; s < variants[v].streams; s++) {
			on_stream(NODE_OPEN, p, s);
			script_put(&o, instance, 1);
		}
	}
}

/* A script for configuration v, with every stream to every peer open. */
static void begin(unsigned v)
{
	script_put(&o, v, 1);
	open_all(v, 1);
}

static void save(const char *what, unsigned v)
{
	char name[64];

	snprintf(name, sizeof(name), "%s-%u", what, v);
	rc |= script_save(&o, dir, name);
}

static void submit(unsigned job, uint16_t count)
{
	op(NODE_SUBMIT);
	script_put(&o, job, 1);
	script_put(&o, 1, 1); /* the job's next step */
	script_put(&o, 7, 1);
	script_put(&o, count, 2);
	script_put(&o, 1, 1);
	script_put(&o, 0, 2);
}

static void data(unsigned peer, unsigned job, int8_t seq, uint8_t flags, enum gg_ar_phase phase, unsigned origin,
		 unsigned chunk)
{
	op(NODE_DATA);
	script_put(&o, peer, 1);
	script_put(&o, chunk, 1); /* the stream the chunk's index picks */
	script_put(&o, job, 1);
	script_put(&o, (uint8_t)seq, 1);
	script_put(&o, flags, 1);
	script_put(&o, phase, 1);
	script_put(&o, origin, 1);
	script_put(&o, chunk, 1);
	script_put(&o, 3, 1);
}

/* Every DATA the node (the last site) needs for a 1000-element step. */
static void all_data(unsigned v, unsigned job)
{
	unsigned K = variants[v].sites, self = K - 1, pred = self - 1;

	if (!variants[v].ring) {
		for (unsigned p = 0; p < self; p++)
			data(p, job, 0, 0, GG_AR_DIRECT, p, 0);
		return;
	}
	/* Shard j is summed along j+1, j+2, ..., j and then sent on around:
	 * the node gets the partial of every shard it does not start, and the
	 * result of every shard but its own, from its predecessor. */
	for (unsigned j = 0; j < K; j++) {
		if ((j + 1) % K != self)
			data(pred, job, 0, 0, GG_AR_SCATTER, j, 0);
		if (j != self)
			data(pred, job, 0, 0, GG_AR_GATHER, j, 0);
	}
}

static void acks(unsigned v, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		on_stream(NODE_ACK, i % (variants[v].sites - 1), 0);
		script_put(&o, i, 1);
		script_put(&o, 0, 1);
	}
}

static void dones(unsigned v, unsigned job)
{
	for (unsigned p = 0; p + 1 < variants[v].sites; p++) {
		on_stream(NODE_DONE, p, 0);
		script_put(&o, job, 1);
		script_put(&o, 0, 1);
	}
}

static void run(uint8_t turns)
{
	op(NODE_RUN);
	script_put(&o, turns, 1);
}

/* ABORT or END (the code's byte: its high four bits are an END's age). */
static void steps_message(enum node_op what, unsigned peer, unsigned job, uint8_t more, uint8_t code,
			  const char *reason)
{
	op(what);
	script_put(&o, peer, 1);
	script_put(&o, 0, 1);
	script_put(&o, job, 1);
	script_put(&o, 0, 1);
	script_put(&o, more, 1);
	script_put(&o, code, 1);
	script_put_text(&o, reason);
}

int main(int argc, char **argv)
{
	if (!(dir = script_dir(argc, argv)))
		return 2;
	for (unsigned v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
		/* Two steps that complete. */
		begin(v);
		for (int step = 0; step < 2; step++) {
			submit(0, 1000);
			run(2);
			all_data(v, 0);
			run(2);
			acks(v, 6);
			dones(v, 0);
			run(3);
		}
		save("complete", v);

		/* With three sites: one peer's DONE never comes, the other
		 * says it completed the step (the DONE's flag bit 2); then the
		 * same peer asks whether this site completed it (bit 3). */
		if (variants[v].sites == 3) {
			begin(v);
			submit(0, 1000);
			run(2);
			all_data(v, 0);
			run(2);
			acks(v, 6);
			on_stream(NODE_DONE, 1, 0);
			script_put(&o, 0, 1);                /* job */
			script_put(&o, 0, 1);                /* step */
			script_put(&o, 0, 2);                /* links */
			script_put(&o, 4, 1);                /* flags: completed */
			script_put(&o, 0, 1);                /* direct up to */
			run(3);
			on_stream(NODE_DONE, 1, 0);
			script_put(&o, 0, 1);
			script_put(&o, 0, 1);
			script_put(&o, 0, 2);
			script_put(&o, 8, 1);                /* flags: asks */
			script_put(&o, 0, 1);
			run(2);
			save("completed-word", v);
		}

		/* A peer aborts the step, then ends the job. */
		begin(v);
		submit(1, 3000);
		all_data(v, 1);
		steps_message(NODE_ABORT, 0, 1, 0, 11, "rank 3 of job 'j1' disconnected during step 1");
		run(2);
		submit(1, 3000);
		steps_message(NODE_END, 0, 1, 2, 11, "its ranks at site s0 are gone");
		run(2);
		save("peer-abort", v);

		/* This site aborts, then its ranks leave; a step misses its deadline. */
		begin(v);
		submit(2, 100);
		op(NODE_LOCAL_ABORT);
		script_put(&o, 2, 1);
		script_put(&o, 0, 1);
		script_put(&o, 9, 1);
		script_put_text(&o, "ranks disagree");
		run(2);
		op(NODE_LOCAL_END);
		script_put(&o, 2, 1);
		submit(0, 5000);
		op(NODE_TIME);
		script_put(&o, 3000, 2);
		run(3);
		save("local-abort", v);

		/* A peer restarts mid-step; DATA comes before its step, corrupt, and
		 * for another tensor; the stream is closed. */
		begin(v);
		data(0, 0, 1, 0, variants[v].ring ? GG_AR_SCATTER : GG_AR_DIRECT, 0, 0);
		submit(0, 1000);
		data(0, 0, 0, NODE_DATA_CORRUPT | NODE_DATA_SPLIT, GG_AR_DIRECT, 0, 0);
		script_put(&o, 40, 2);
		script_put(&o, 20, 2);
		data(0, 0, 0, NODE_DATA_COUNT | NODE_DATA_SPECIAL, GG_AR_DIRECT, 0, 0);
		script_put(&o, 999, 2);
		open_all(v, 2);
		on_stream(NODE_PING, 0, 0);
		script_put(&o, 0, 1);
		script_put(&o, 12345, 8);
		on_stream(NODE_CLOSE, 0, 0);
		run(2);
		save("restart", v);

		/* Ranks of job 0 connect; a peer's END of a run that ended 20 s
		 * before comes (sent again once a stream came back), then one
		 * of their run; job 1's ranks hear only the latter kind. */
		begin(v);
		op(NODE_LOCAL_END); /* 0xe1, 0xe2: open j0 and j1 */
		script_put(&o, 0xe1, 1);
		op(NODE_LOCAL_END);
		script_put(&o, 0xe2, 1);
		run(1);
		steps_message(NODE_END, 0, 0, 0, 0xdc, "its ranks at site s0 are gone"); /* code 11, 19.5 s old */
		submit(0, 1000);
		run(2);
		steps_message(NODE_END, 0, 1, 0, 11, "its ranks at site s0 are gone");
		submit(1, 1000);
		run(2);
		steps_message(NODE_END, 0, 0, 0, 11, "rank 1 of job 'j0' disconnected before its first step");
		run(2);
		save("ended-before", v);
	}

	/* Messages the node must refuse: a second HELLO, garbage, a cut header. */
	static const uint8_t junk[] = { 0x47, 0x47, 0x57, 0x31, 0x02, 0x03, 0x00, 0x00, 0xff, 0xff, 0xff, 0x7f };
	begin(1);
	on_stream(NODE_HELLO, 0, 0);
	script_put(&o, 0, 2);
	on_stream(NODE_RAW, 1, 1);
	script_put(&o, sizeof(junk), 2);
	script_put_bytes(&o, junk, sizeof(junk));
	on_stream(NODE_RAW, 0, 1);
	script_put(&o, 5, 2);
	script_put_bytes(&o, junk, 5);
	op(NODE_STOP);
	rc |= script_save(&o, dir, "refused");
	return rc ? 1 : 0;
}
