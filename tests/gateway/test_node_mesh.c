/* Gateways of K sites, each on its own threads (2 or 3 lanes with 4 streams
 * per peer, so lanes own different numbers of streams and some frames
 * reach another lane first), connected over loopback TLS: steps complete
 * with bit-identical results equal to the fixed-order sum (fp32), survive
 * a stream cut mid-transfer, and fail at every site, with a message naming
 * both announcements, when sites announce different collectives; a DONE
 * lost with every stream that carried it is sent again on a new one; a
 * peer that sends DATA for steps that never come fills neither memory nor
 * the job table.
 *
 *
 * Built with GG_NODE_GPU it runs only scenarios where every other site's
 * tensors are device memory of the gateway's GPU (gg_node_step.device):
 * with tests/gateway/cuda_double.c standing in for the GPU on the host
 * (node-gpu-ops: that memory is fenced, so a lane touching it directly
 * faults), or on a GPU (tests/gpu, node-cuda). Their results must equal
 * the host sites' bit for bit.
 *
 *   test_node_mesh CERT_DIR (certificates from examples/make-certs.sh for
 *   sites s0..s3) */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gg_build_config.h"
#include "gg_check.h"
#include "gg_sites.h"
#include "gradgate.h"
#include "allreduce.h"
#ifdef GG_NODE_GPU
#include "dev_mem.h"
#include "dev_skip.h"
#endif
#include "log.h"
#include "net_addr.h"
#include "node.h"

#define MAX_K 4
#define MAX_STEPS 80

static const char *cert_dir;
static int ports[MAX_K];
static atomic_uint flushed_sites; /* of the scenario running */
static atomic_bool restarted;      /* site 1 is back (restart_step) */

struct scenario {
	unsigned K;
	const char *codec;
	const char *algo;
	uint64_t count;
	unsigned steps;
	int cut_at_step;      /* cut streams 0 and 1 (two lanes) of site 0 towards site 1 during this step */
	bool mismatch;        /* site K-1 announces one element more */
	bool tensor_per_step; /* step t is tensor t: a new error feedback state each step */
	int freeze_site;      /* this site dies once it has the result; -1: none. Its step has a 1 s
			       * deadline, and the others wait a 3 s heartbeat_timeout past it */
	int done_lost_step;   /* site 0's DONE of this step never reaches site 1, whose streams it then cuts */
	bool end_after_lost;  /* and site 0 ends the job at once (it was the last step): its END stands for the DONE */
	int restart_step;     /* site 1's DONE of this step reaches site 0 only, then site 1 crashes and restarts;
			       * site 0's reaches site 2 only once site 1 is back */
	bool flood;           /* site 1 ignores site 0's budget (its own window, 1 GiB, not site 0's): DATA of steps that never
			       * come, for one job and for 40 jobs, before the real steps */
	int plan_split_step;  /* algorithm auto: site K-1's plan goes ring for every size before this step */
	bool plan_all;        /* and every other site's too: the step goes by ring everywhere */
	const char *chunk;    /* chunk_size; NULL: 256KiB. Set: each step's chunk at every site is checked */
	bool device;          /* sites 1 (in place), 3: tensors on the gateway's GPU (GG_NODE_GPU builds only) */
	bool alternate;       /* and site 1's move between GPU (odd steps) and host memory (even ones) */
	bool own_blocks;      /* site k's block_size is 64 << k, which a codec without blocks does not use */
};

struct site {
	pthread_t thread;
	const struct scenario *sc;
	unsigned index;
	struct gg_config cfg;
	float *input, *result;
	float *results;       /* every step's result, for comparison */
	int status[MAX_STEPS];
	uint32_t chunk[MAX_STEPS]; /* the chunk each step was cut in */
	enum gg_allreduce_algo algo[MAX_STEPS]; /* and its algorithm */
	char message[MAX_STEPS][GG_NODE_ERROR_MAX];
	bool done;
	double seconds;
	bool device;          /* input and result below are device memory */
	float *dev_input, *dev_result;
	void *stream;         /* the test's own, for copies to and from them */
};

#ifdef GG_NODE_GPU
/* dst[0..count) = src[0..count) between host and device memory. */
static bool dev_copy(struct site *s, void *dst, const void *src, uint64_t count)
{
	char why[256];

	if (gg_dev_copy(dst, src, count * sizeof(float), s->stream, why, sizeof(why)) ||
	    gg_dev_sync(s->stream, why, sizeof(why))) {
		CHECK(0, "site %u: copying %llu floats: %s", s->index, (unsigned long long)count, why);
		return false;
	}
	return true;
}
#endif

static float value(unsigned site, unsigned step, uint64_t i)
{
	/* Multiples of 1/64 below 2^10: every fixed-order sum is exact, so
	 * fp32 results can be checked bit for bit whatever the order. */
	return (float)((int)((i * 2654435761u + site * 40503u + step * 977u) % 4096u) - 2048) / 64.0f;
}

static void on_done(void *arg, struct gg_node_step *st, int status, const char *message)
{
	struct site *s = arg;
	s->status[st->seq - 1] = status;
	if (message)
		snprintf(s->message[st->seq - 1], sizeof(s->message[0]), "%s", message);
	s->done = true;
}

static int write_config(const struct scenario *sc, unsigned k, char *path, size_t size)
{
	char text[4096];
	size_t n = 0;

	n += gg_test_site_toml(text, sizeof(text), k, sc->K, ports, 2 + k % 2, cert_dir);
	n += (size_t)snprintf(text + n, sizeof(text) - n,
			      "[transport]\nstreams_per_peer = 4\nchunk_size = \"%s\"\nstep_timeout = \"%s\"\n"
			      "heartbeat_interval = \"%s\"\nheartbeat_timeout = \"%s\"\n"
			      "reconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n"
			      "[compression]\ncodec = \"%s\"\nblock_size = %u\n[allreduce]\nalgorithm = \"%s\"\n"
			      "[limits]\nmax_message = \"1GiB\"\ninflight_per_peer = \"%s\"\nmemory = \"%s\"\n",
			      sc->chunk ? sc->chunk : "256KiB", sc->freeze_site >= 0 ? "1s" : "20s", sc->freeze_site >= 0 ? "250ms" : "1s",
			      sc->freeze_site >= 0 ? "3s" : "10s", sc->codec, sc->own_blocks ? 64u << k : 256u, sc->algo,
			      sc->flood && k == 1 ? "1GiB" : "8MiB", sc->flood && k == 1 ? "4GiB" : "64MiB");
	snprintf(path, size, "%s/s%u-%d.toml", cert_dir, k, ports[0]);
	FILE *f = fopen(path, "w");
	if (!f || fputs(text, f) < 0 || fclose(f))
		return -1;
	return 0;
}

static int fresh_status;
static char fresh_message[GG_NODE_ERROR_MAX];

static void on_fresh(void *arg, struct gg_node_step *st, int status, const char *message)
{
	(void)arg;
	(void)st;
	fresh_status = status ? status : 1;
	snprintf(fresh_message, sizeof(fresh_message), "%s", message ? message : "");
}

/* Site 1 sends one frame for each of 63 jobs that never start, then 96
 * frames of 200 KiB for steps 2..97 of another: the 64 jobs fill lane 0's
 * job table (GG_NODE_LANE_JOBS). Site 0 must hold no more than its budget
 * (inflight_per_peer, 8 MiB, half as much again, and one frame per
 * stream, each frame counted with 384 bytes of bookkeeping), refuse the
 * rest, and still start a job of its own.
 * Then site 1 sends a frame for each of 9 more jobs, more than the table
 * holds: they take the entries of jobs that never started. (Were they
 * sent with the first 31, a late copy of one of theirs, sent again or
 * hedged, could take the flood's entry, and its frames would go before
 * they reach the budget.) */
static atomic_bool flood_seen; /* site 0 saw the flood (or gave up): site 1 stops sending */
static atomic_bool flood_freed; /* site 0 let the ended jobs' frames go (or gave up) */

static void flood(struct gg_node *node, unsigned index)
{
	const uint64_t limit = (8u << 20) + (4u << 20) + 4 * ((256u << 10) + 384) + 4 * 1024;
	uint64_t most = 0;

	if (index == 1) {
		for (unsigned j = 0; j < GG_NODE_LANE_JOBS - 1; j++) {
			char job[16];
			snprintf(job, sizeof(job), "never-%u", j);
			CHECK(gg_node_test_send_data(node, 0, job, 1, 0, 1024) == 0, "flood");
		}
		for (unsigned step = 2; step < 98; step++)
			CHECK(gg_node_test_send_data(node, 0, "flood", step, 0, 200u << 10) == 0, "flood");
	}
	/* Until site 0 has refused some (or 30 s passed): a loaded machine
	 * may take a while to move 20 MB through both sites' TLS. A turn of
	 * the loop ends at the first event, so the bound is in time. */
	const uint64_t until = gg_monotonic_us() + 30000000;
	while (!atomic_load(&flood_seen) && gg_monotonic_us() < until) {
		if (gg_node_run_once(node, 10000, NULL, NULL))
			break;
		most = GG_MAX(most, gg_node_stats(node)->early_bytes);
		if (index == 0 && most > (4u << 20) && gg_node_stats(node)->early_refused)
			atomic_store(&flood_seen, true);
	}
	if (index == 0) {
		atomic_store(&flood_seen, true);
		const struct gg_node_stats *st = gg_node_stats(node);
		printf("  site 0 held at most %llu bytes of early frames (budget %llu), refused %llu frames\n",
		       (unsigned long long)most, (unsigned long long)limit, (unsigned long long)st->early_refused);
		CHECK(most > (4u << 20) && most <= limit, "site 0 held %llu bytes of early frames", (unsigned long long)most);
		CHECK(st->early_refused > 0, "nothing was refused");
		/* Lane 0's job table is full of jobs that never started here: a
		 * job starting here takes one of their entries. It times out
		 * (site 1 never joins), but it must get that far. */
		static float x[4], y[4];
		struct gg_node_step fresh = { .seq = 1, .tensor_id = 1, .count = 4, .dtype = 1, .input = x, .result = y,
					      .deadline_us = gg_monotonic_us() + 300000, .timeout_us = 300000,
					      .done = on_fresh };
		char err[GG_NODE_ERROR_MAX];
		snprintf(fresh.job, sizeof(fresh.job), "fresh");
		fresh_status = 0;
		CHECK(gg_node_submit(node, &fresh, err, sizeof(err)) == 0, "fresh: %s", err);
		for (const uint64_t by = gg_monotonic_us() + 2000000; !fresh_status && gg_monotonic_us() < by;)
			if (gg_node_run_once(node, 10000, NULL, NULL))
				break;
		printf("  site 0, a job among those: %s\n", fresh_message);
		CHECK(fresh_status == GG_ERR_TIMEOUT && strstr(fresh_message, "missed its 300ms deadline"),
		      "fresh job: %d: %s", fresh_status, fresh_message);
	} else {
		for (unsigned j = GG_NODE_LANE_JOBS - 1; j < GG_NODE_LANE_JOBS + 8; j++) {
			char job[16];
			snprintf(job, sizeof(job), "never-%u", j);
			CHECK(gg_node_test_send_data(node, 0, job, 1, 0, 1024) == 0, "more jobs");
		}
		/* The flooder ends its jobs: site 0 lets their frames go. Of
		 * more jobs ended at once than a lane's table holds, the late
		 * frames of the first ones may find their entries taken by the
		 * last ones' and be kept as early frames until a job needs the
		 * room: "flood", whose late frames are megabytes, ends last. */
		for (unsigned j = 0; j < GG_NODE_LANE_JOBS + 8; j++) {
			char job[16];
			snprintf(job, sizeof(job), "never-%u", j);
			gg_node_end_job(node, job);
		}
		gg_node_end_job(node, "flood");
	}
	/* Up to 10 s: a loaded machine may take a while to carry the ENDs. */
	const uint64_t left = 1u << 20;
	const uint64_t freed_by = gg_monotonic_us() + 10000000;
	while (!atomic_load(&flood_freed) && gg_monotonic_us() < freed_by) {
		if (gg_node_run_once(node, 10000, NULL, NULL))
			break;
		if (index == 0 && gg_node_stats(node)->early_bytes < left)
			atomic_store(&flood_freed, true);
	}
	if (index == 0)
		atomic_store(&flood_freed, true);
	/* What may be left is site 1's first step of the real job (400 KB).
	 * The flood frames its streams had taken when the jobs ended (in
	 * their queues and socket buffers, a few megabytes) may come after
	 * the END, on other streams: they are let go as they come, and those
	 * it had not given to a stream yet it forgets. */
	if (index == 0)
		CHECK(gg_node_stats(node)->early_bytes < left,
		      "site 0 still holds %llu bytes of early frames of ended jobs",
		      (unsigned long long)gg_node_stats(node)->early_bytes);
}

static void *run_site(void *arg)
{
	struct site *s = arg;
	const struct scenario *sc = s->sc;
	struct gg_node *node;
	char err[GG_NODE_ERROR_MAX];
	struct timespec t0, t1;

	if (gg_node_new(&s->cfg, &node, err, sizeof(err))) {
		printf("site %u: %s\n", s->index, err);
		for (unsigned t = 0; t < sc->steps; t++)
			s->status[t] = -EIO;
		return NULL;
	}
	for (int spins = 0; spins < 500 && !gg_node_connected(node); spins++)
		if (gg_node_run_once(node, 20000, NULL, NULL))
			break;
	CHECK(gg_node_connected(node), "site %u did not connect to every peer", s->index);
	if (sc->flood) {
		if (s->index == 1)
			gg_node_test_own_window(node);
		flood(node, s->index);
	}
	bool frozen = (int)s->index == sc->freeze_site;
	if (frozen)
		gg_node_test_freeze_at_result(node);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (unsigned t = 1; t <= sc->steps; t++) {
		uint64_t count = sc->count + (sc->mismatch && s->index == sc->K - 1);
		for (uint64_t i = 0; i < count; i++)
			s->input[i] = value(s->index, t, i);
		struct gg_node_step st = { .seq = t, .tensor_id = sc->tensor_per_step ? t : 7, .count = count, .dtype = 1,
					   .input = s->input, .result = s->result, .done = on_done, .arg = s };
#ifdef GG_NODE_GPU
		const bool on_gpu = s->device && !(sc->alternate && s->index == 1 && t % 2 == 0);
		if (on_gpu) {
			/* Site 1 sums in place, as the gateway's backends do. */
			float *in = s->index == 1 ? s->dev_result : s->dev_input;
			if (!dev_copy(s, in, s->input, count))
				break;
			st.input = in;
			st.result = s->dev_result;
			st.device = true;
		}
#endif
		snprintf(st.job, sizeof(st.job), "mesh");
		s->done = false;
		bool lose_done = (int)t == sc->done_lost_step && s->index == 0;
		if (lose_done)
			gg_node_test_drop_done(node, 1);
		if ((int)t == sc->restart_step && s->index < 2)
			gg_node_test_drop_done(node, 2);
		if ((int)t == sc->plan_split_step && (sc->plan_all || s->index == sc->K - 1))
			gg_node_test_set_plan(node, "mesh", 0);
		if (gg_node_submit(node, &st, err, sizeof(err))) {
			s->status[t - 1] = -EINVAL;
			snprintf(s->message[t - 1], sizeof(s->message[0]), "%s", err);
			continue;
		}
		bool cut = false;
		/* A frozen site never finishes: it runs until the others gave up
		 * (their 1 s deadline), then dies with its streams cut. */
		for (int spins = 0; !s->done && spins < (frozen ? 200 : 200000); spins++) {
			if (gg_node_run_once(node, 10000, NULL, NULL))
				break;
			if ((int)t == sc->cut_at_step && s->index == 0 && !cut &&
			    gg_node_stats(node)->data_bytes_out > 0) {
				/* Stream 0 is lane 0's, cut right here; stream 1 is lane
				 * 1's, cut on its own thread a moment later. */
				CHECK(gg_node_test_cut_stream(node, 1, 0) == 0, "cut");
				CHECK(gg_node_test_cut_stream(node, 1, 1) == 0, "cut");
				cut = true;
			}
		}
		if (frozen) {
			/* The others' ABORT may have reached it: failed, never done. */
			CHECK(!s->done || s->status[t - 1] != 0, "the frozen site %u completed its step", s->index);
			atomic_fetch_add(&flushed_sites, 1); /* nobody waits for a dead site */
			gg_node_free(node); /* sockets closed with no close_notify, as a crash does */
			return NULL;
		}
		CHECK(s->done, "site %u: step %u never finished", s->index, t);
		s->chunk[t - 1] = gg_node_test_step_chunk(node, "mesh", &s->algo[t - 1]);
		if ((int)t == sc->restart_step && s->index == 1) {
			/* Site 2 holds the result and waits for this DONE, which
			 * the new gateway cannot send: its restart must complete
			 * the step there as it completed at site 0. */
			memcpy(s->results + (t - 1) * sc->count, s->result, sc->count * sizeof(float));
			gg_node_free(node); /* sockets closed with no close_notify, as a crash does */
			if (gg_node_new(&s->cfg, &node, err, sizeof(err))) {
				CHECK(0, "site 1 restarting: %s", err);
				atomic_fetch_add(&flushed_sites, 1);
				return NULL;
			}
			for (int spins = 0; spins < 500 && !gg_node_connected(node); spins++)
				if (gg_node_run_once(node, 20000, NULL, NULL))
					break;
			CHECK(gg_node_connected(node), "site 1 did not reconnect after its restart");
			atomic_store(&restarted, true);
			continue;
		}
		if ((int)t == sc->restart_step && s->index == 0) {
			/* Site 0's DONE reaches site 2 only after site 2 saw site 1
			 * restart: until then site 2 must wait for it, not fail. */
			for (int spins = 0; spins < 1000 && !atomic_load(&restarted); spins++)
				if (gg_node_run_once(node, 10000, NULL, NULL))
					break;
			for (int spins = 0; spins < 20; spins++)
				if (gg_node_run_once(node, 10000, NULL, NULL))
					break;
			for (int i = 0; i < 4; i++) {
				int crc = gg_node_test_cut_stream(node, 2, i);
				CHECK(crc == 0 || crc == -ENOTCONN, "cut: %s", strerror(-crc));
			}
		}
		if (lose_done) {
			/* Site 1 waits for the DONE it never got: it must come again
			 * on a new stream (while this site runs its next step), not
			 * leave site 1 to fail a step that completed here. */
			for (int i = 0; i < 4; i++) {
				int crc = gg_node_test_cut_stream(node, 1, i);
				CHECK(crc == 0 || crc == -ENOTCONN, "cut: %s", strerror(-crc));
			}
			if (sc->end_after_lost)
				gg_node_end_job(node, "mesh");
		}
#ifdef GG_NODE_GPU
		if (on_gpu && !dev_copy(s, s->result, s->dev_result, sc->count))
			break;
		if (sc->alternate && s->index == 1) {
			/* The tensor's residuals start afresh where it moved: one
			 * set is held, never two. */
			struct gg_node_metrics nm;
			gg_node_get_metrics(node, &nm);
			CHECK(nm.feedback_bytes >= sc->count * sizeof(float) &&
				      nm.feedback_bytes < 2 * sc->count * sizeof(float),
			      "site 1 step %u: %llu bytes of residuals held for one tensor of %llu elements", t,
			      (unsigned long long)nm.feedback_bytes, (unsigned long long)sc->count);
		}
#endif
		memcpy(s->results + (t - 1) * sc->count, s->result, sc->count * sizeof(float));
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* Steps of a job only go forward: a second run under the same name is
	 * refused with a hint, not mistaken for re-sent steps of the first. */
	struct gg_node_step again = { .seq = 1, .tensor_id = 7, .count = sc->count, .dtype = 1, .input = s->input,
				      .result = s->result, .done = on_done, .arg = s };
	snprintf(again.job, sizeof(again.job), "mesh");
	CHECK((sc->end_after_lost && s->index == 0) || (sc->restart_step && s->index == 1) ||
		      (gg_node_submit(node, &again, err, sizeof(err)) == -EINVAL && strstr(err, "comes after step") &&
		       strstr(err, "a new job name")),
	      "site %u: a rerun of step 1 was not refused: %s", s->index, err);
#if !HAVE_CUDA
	/* Without CUDA a step in GPU memory is refused before anything is read. */
	struct gg_node_step gpu = { .seq = sc->steps + 1, .tensor_id = 7, .count = sc->count, .dtype = 1,
				    .input = s->input, .result = s->result, .device = true, .done = on_done, .arg = s };
	snprintf(gpu.job, sizeof(gpu.job), "mesh");
	CHECK(gg_node_submit(node, &gpu, err, sizeof(err)) == -EINVAL && strstr(err, "built without CUDA"),
	      "site %u: a step in GPU memory was not refused without CUDA: %s", s->index, err);
#endif
	if (sc->tensor_per_step) {
		/* Residuals are bounded by [limits] memory (64 MiB here): a tensor
		 * of 17 Mi elements is refused before anything is read. */
		struct gg_node_step big = { .seq = sc->steps + 1, .tensor_id = 1000, .count = 17u << 20, .dtype = 1,
					    .input = s->input, .result = s->result, .done = on_done, .arg = s };
		snprintf(big.job, sizeof(big.job), "mesh");
		CHECK(gg_node_submit(node, &big, err, sizeof(err)) == -ENOSPC &&
			      !strncmp(err, "error feedback for tensor 1000 (17825792 elements) does not fit: ", 64) &&
			      strstr(err, "set [compression] error_feedback = false") &&
			      strstr(err, "[limits] memory = 64MiB"),
		      "site %u: a tensor past the feedback memory was not refused: %s", s->index, err);
		if (s->index == 0)
			printf("  site 0: %s\n", err);
		/* ... and the tensors by their number: with room for the job's
		 * own alone, one more is refused, however small. */
		char want[GG_NODE_ERROR_MAX];
		gg_node_test_feedback_max(node, sc->steps);
		struct gg_node_step more = big;
		more.tensor_id = 1001;
		more.count = 1;
		snprintf(want, sizeof(want),
			 "error feedback for tensor 1001 of job 'mesh' does not fit: the gateway keeps it for %u tensors "
			 "at most, and holds it for as many (each job's until it ends)", sc->steps);
		CHECK(gg_node_submit(node, &more, err, sizeof(err)) == -ENOSPC && !strcmp(err, want),
		      "site %u: a tensor past the number kept was not refused: %s", s->index, err);
		if (s->index == 0)
			printf("  site 0: %s\n", err);
		/* Each tensor's error feedback counts what it holds: the
		 * residuals, the scratch of a chunk (all of a tensor smaller
		 * than one) and its slot, not the residuals alone. */
		struct gg_node_metrics nm;
		gg_node_get_metrics(node, &nm);
		const uint64_t held = (uint64_t)sc->steps * sc->count * 2 * sizeof(float);
		CHECK(nm.feedback_bytes > held && nm.feedback_bytes < held + (uint64_t)sc->steps * 4096,
		      "site %u: %llu bytes counted for the error feedback of %u tensors of %llu elements, which hold "
		      "%llu bytes of residuals and scratch", s->index, (unsigned long long)nm.feedback_bytes,
		      sc->steps, (unsigned long long)sc->count, (unsigned long long)held);
	}
	s->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	if (sc->cut_at_step)
		CHECK(s->index != 0 || gg_node_stats(node)->resent_messages > 0, "nothing was re-sent after the cut");
	/* A site shuts down only once every site has its frames acknowledged:
	 * one that stopped early could no longer acknowledge what a slower
	 * site still sends it. */
	bool counted = sc->flood && s->index == 1;
	if (counted)
		atomic_fetch_add(&flushed_sites, 1);
	for (int spins = 0; spins < 1000 && atomic_load(&flushed_sites) < sc->K; spins++) {
		if (!counted && gg_node_flushed(node)) {
			atomic_fetch_add(&flushed_sites, 1);
			counted = true;
		}
		if (gg_node_run_once(node, 10000, NULL, NULL))
			break;
	}
	/* The flooder's frames for steps that never come stay unacknowledged. */
	CHECK(gg_node_flushed(node) || (sc->flood && s->index == 1), "site %u: frames still unacknowledged after 10 s",
	      s->index);
#ifdef GG_NODE_GPU
	struct gg_node_metrics nm;
	gg_node_get_metrics(node, &nm);
	if (s->device && !sc->alternate && nm.feedback_bytes) {
		/* Every site is done with the job. While an NCCL call of the
		 * gateway's may run, the residuals of the job, on the GPU, stay
		 * when it ends, and go once the backend lets them. */
		uint64_t held = nm.feedback_bytes;
		gg_node_gpu_frees(node, false);
		gg_node_end_job(node, "mesh");
		gg_node_get_metrics(node, &nm);
		CHECK(nm.feedback_bytes == held, "site %u: residuals freed while GPU frees were held (%llu of %llu bytes)",
		      s->index, (unsigned long long)nm.feedback_bytes, (unsigned long long)held);
		/* They still take their share of [limits] memory, and say so. */
		struct gg_node_step big = { .seq = 1, .tensor_id = 1, .count = 17u << 20, .dtype = 1,
					    .input = s->input, .result = s->result, .done = on_done, .arg = s };
		snprintf(big.job, sizeof(big.job), "big");
		CHECK(gg_node_submit(node, &big, err, sizeof(err)) == -ENOSPC &&
			      strstr(err, "the error feedback of 1 tensor (1 of them given up, on the GPU, freed once no NCCL "
					  "call"),
		      "site %u: a tensor past the memory left beside held residuals: %s", s->index, err);
		gg_node_gpu_frees(node, true);
		gg_node_get_metrics(node, &nm);
		CHECK(nm.feedback_bytes == 0, "site %u: %llu bytes of residuals left once GPU frees were let go", s->index,
		      (unsigned long long)nm.feedback_bytes);
	}
#endif
	gg_node_shutdown(node);
	for (int spins = 0; spins < 100 && !gg_node_idle(node); spins++)
		if (gg_node_run_once(node, 10000, NULL, NULL))
			break;
	gg_node_free(node);
	return NULL;
}

/* The gateways' log of one scenario (info and up) goes to a file, and
 * reaches stderr only when the scenario failed: what the streams did is
 * then on record, and passing scenarios stay quiet. */
static int log_saved_fd = -1;
static FILE *log_capture;

static void capture_log(void)
{
	if (getenv("MESH_VERBOSE"))
		return;
	fflush(stderr);
	log_capture = tmpfile();
	log_saved_fd = log_capture ? dup(STDERR_FILENO) : -1;
	if (log_saved_fd < 0 || dup2(fileno(log_capture), STDERR_FILENO) < 0) {
		if (log_capture)
			fclose(log_capture);
		log_capture = NULL;
		return;
	}
	gg_log_set_level(GG_LOG_INFO);
}

static void release_log(bool show)
{
	if (!log_capture)
		return;
	fflush(stderr);
	dup2(log_saved_fd, STDERR_FILENO);
	close(log_saved_fd);
	gg_log_set_level(GG_LOG_ERROR);
	if (show) {
		char line[1024];
		rewind(log_capture);
		fprintf(stderr, "--- the gateways' log of the failed scenario:\n");
		while (fgets(line, sizeof(line), log_capture))
			fputs(line, stderr);
	}
	fclose(log_capture);
	log_capture = NULL;
}

/* When set: where run() leaves site 0's results of every step, and the
 * results it must equal. */
static float *keep_results;
static const float *want_results;

static void run(const struct scenario *sc)
{
	static struct site sites[MAX_K];
	char path[512];
	int failures_before = failures;

	printf("%u sites, %s, %s, %llu elements, %u steps%s%s%s%s%s%s%s%s%s\n", sc->K, sc->codec, sc->algo,
	       (unsigned long long)sc->count, sc->steps, sc->cut_at_step ? ", stream cut" : "",
	       sc->own_blocks ? ", each site's own block_size" : "",
	       sc->mismatch ? ", mismatched announcement" : "",
	       sc->freeze_site >= 0 ? ", a site dies holding the result" : "",
	       sc->done_lost_step ? ", a DONE lost with its streams" : "", sc->end_after_lost ? ", then the job ends" : "",
	       sc->flood ? ", a peer floods DATA of steps that never come" : "",
	       sc->restart_step ? ", a site restarts between its DONE messages" : "",
	       !sc->plan_split_step ? ""
	       : sc->plan_all       ? ", every site's plan goes ring for a step, chunks as auto cuts them"
				    : ", a site's plan differs for a step");
	if (sc->device)
		printf("  sites 1 (in place) and 3 hold their tensors on the gateway's GPU%s\n",
		       sc->alternate ? ", site 1 on odd steps only" : "");
	fflush(stdout);
	int rc = gg_net_free_loopback_ports(ports, sc->K);
	CHECK(rc == 0, "no free loopback ports: %s", strerror(-rc));
	for (unsigned k = 0; k < sc->K; k++) {
		struct site *s = &sites[k];
		struct gg_diag diag = { 0 };
		memset(s, 0, sizeof(*s));
		s->sc = sc;
		s->index = k;
		if (write_config(sc, k, path, sizeof(path)) || gg_config_load(path, &s->cfg, &diag)) {
			gg_diag_print(&diag, stdout);
			gg_diag_free(&diag);
			CHECK(0, "config of site %u", k);
			return;
		}
		unlink(path);
		s->input = malloc((sc->count + 1) * sizeof(float));
		s->result = malloc((sc->count + 1) * sizeof(float));
		s->results = malloc(sc->count * sc->steps * sizeof(float));
#ifdef GG_NODE_GPU
		s->device = sc->device && k % 2;
		char why[256];
		if (s->device && (gg_dev_stream_new(&s->stream, why, sizeof(why)) ||
				  gg_dev_alloc((void **)&s->dev_input, (sc->count + 1) * sizeof(float), why, sizeof(why)) ||
				  gg_dev_alloc((void **)&s->dev_result, (sc->count + 1) * sizeof(float), why, sizeof(why)))) {
			CHECK(0, "site %u: GPU memory: %s", k, why);
			return;
		}
#endif
	}
	atomic_store(&flushed_sites, 0);
	atomic_store(&restarted, false);
	capture_log();
	for (unsigned k = 0; k < sc->K; k++)
		pthread_create(&sites[k].thread, NULL, run_site, &sites[k]);
	for (unsigned k = 0; k < sc->K; k++)
		pthread_join(sites[k].thread, NULL);

	for (unsigned t = 0; t < sc->steps; t++) {
		if (sc->freeze_site >= 0) {
			char want[64];
			snprintf(want, sizeof(want), "but site s%d never said so too", sc->freeze_site);
			for (unsigned k = 0; k < sc->K; k++)
				CHECK((int)k == sc->freeze_site || (sites[k].status[t] != 0 && strstr(sites[k].message[t], want)),
				      "site %u: status %d: %s", k, sites[k].status[t], sites[k].message[t]);
			printf("  site 0: %s\n", sites[0].message[t]);
			continue;
		}
		if (sc->mismatch) {
			for (unsigned k = 0; k < sc->K; k++)
				CHECK(sites[k].status[t] != 0 && strstr(sites[k].message[t], "announced tensor 7 with"),
				      "site %u: status %d: %s", k, sites[k].status[t], sites[k].message[t]);
			printf("  site 0: %s\n", sites[0].message[t]);
			continue;
		}
		if ((int)t + 1 == sc->plan_split_step && !sc->plan_all) {
			/* Fails everywhere as a mismatch that names both algorithms;
			 * every site drops its plan, and the next step completes. */
			for (unsigned k = 0; k < sc->K; k++)
				CHECK(sites[k].status[t] == GG_ERR_MISMATCH &&
					      (strstr(sites[k].message[t], "runs it direct, site ") ||
					       strstr(sites[k].message[t], "runs it by ring, site ") ||
					       strstr(sites[k].message[t], "aborted step")),
				      "site %u: status %d: %s", k, sites[k].status[t], sites[k].message[t]);
			printf("  site %u: %s\n", sc->K - 1, sites[sc->K - 1].message[t]);
			continue;
		}
		bool all_done = true;
		for (unsigned k = 0; k < sc->K; k++) {
			CHECK(sites[k].status[t] == 0, "site %u step %u: %s", k, t + 1, sites[k].message[t]);
			all_done &= sites[k].status[t] == 0;
		}
		if (!all_done)
			continue; /* a failed step's result buffer holds nothing to compare */
		if (sc->chunk) {
			/* auto: a ring step of 2000003 elements over 3 sites has
			 * shards of about 666667, fewer than 16 chunks of 1 MiB and
			 * more than four of 512 KiB: it goes in 512 KiB ones (131072
			 * elements); direct keeps 1 MiB. The
			 * first step goes direct (no plan), the planned one by ring. */
			for (unsigned k = 0; k < sc->K; k++) {
				const bool ring = sites[k].algo[t] == GG_ALLREDUCE_RING;
				CHECK(ring == ((int)t + 1 >= sc->plan_split_step) || (int)t + 1 > sc->plan_split_step,
				      "site %u step %u went %s", k, t + 1, ring ? "by ring" : "direct");
				CHECK(sites[k].algo[t] == sites[0].algo[t], "site %u step %u: another algorithm than site 0's",
				      k, t + 1);
				CHECK(sites[k].chunk[t] == (ring ? 131072u : 262144u),
				      "site %u step %u (%s): chunk of %u elements", k, t + 1, ring ? "ring" : "direct",
				      sites[k].chunk[t]);
			}
		}
		const float *r0 = sites[0].results + t * sc->count;
		for (unsigned k = 1; k < sc->K; k++)
			CHECK(!memcmp(r0, sites[k].results + t * sc->count, sc->count * sizeof(float)),
			      "step %u: site %u's result differs from site 0's", t + 1, k);
		if (!strcmp(sc->codec, "fp32")) {
			uint64_t bad = 0;
			for (uint64_t i = 0; i < sc->count && bad < 3; i++) {
				float want = 0;
				for (unsigned k = 0; k < sc->K; k++)
					want += value(k, t + 1, i);
				if (r0[i] != want) {
					bad++;
					CHECK(0, "step %u element %llu: %g, expected %g", t + 1, (unsigned long long)i,
					      r0[i], want);
				}
			}
		}
	}
	if (!sc->mismatch && sc->freeze_site < 0)
		printf("  %.3f s for %u steps at site 0\n", sites[0].seconds, sc->steps);
	if (keep_results)
		memcpy(keep_results, sites[0].results, sc->count * sc->steps * sizeof(float));
	if (want_results)
		CHECK(!memcmp(want_results, sites[0].results, sc->count * sc->steps * sizeof(float)),
		      "the results differ from those of the same steps with every tensor in host memory");
	release_log(failures != failures_before);
	for (unsigned k = 0; k < sc->K; k++) {
		gg_config_free(&sites[k].cfg);
		free(sites[k].input);
		free(sites[k].result);
		free(sites[k].results);
#ifdef GG_NODE_GPU
		gg_dev_free(sites[k].dev_input);
		gg_dev_free(sites[k].dev_result);
		gg_dev_stream_free(sites[k].stream);
#endif
	}
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CERT_DIR [--large]\n", argv[0]);
		return 2;
	}
	cert_dir = argv[1];
	gg_log_set_level(GG_LOG_ERROR);
	gg_log_set_tags(true); /* which of the sites in this process wrote a line */
	setvbuf(stdout, NULL, _IOLBF, 0);

	const struct scenario scenarios[] = {
		{ .K = 2, .codec = "fp32", .algo = "direct", .count = 1, .steps = 2, .freeze_site = -1 },
		{ .K = 2, .codec = "fp32", .algo = "ring", .count = 1000003, .steps = 2, .freeze_site = -1 },
		{ .K = 3, .codec = "fp32", .algo = "direct", .count = 1000003, .steps = 2, .freeze_site = -1 },
		{ .K = 3, .codec = "fp32", .algo = "ring", .count = 1000003, .steps = 2, .freeze_site = -1 },
		{ .K = 4, .codec = "fp32", .algo = "ring", .count = 1000003, .steps = 1, .freeze_site = -1 },
		{ .K = 4, .codec = "bf16-split", .algo = "direct", .count = 1000003, .steps = 1, .freeze_site = -1 },
		{ .K = 3, .codec = "int8", .algo = "ring", .count = 1000003, .steps = 3, .freeze_site = -1 },
		{ .K = 3, .codec = "int4", .algo = "direct", .count = 4099, .steps = 2, .freeze_site = -1 },
		{ .K = 3, .codec = "fp32", .algo = "ring", .count = 4000000, .steps = 2, .cut_at_step = 1, .freeze_site = -1 },
		  
		{ .K = 3, .codec = "fp32", .algo = "direct", .count = 4000000, .steps = 2, .cut_at_step = 2, .freeze_site = -1 },
		  
		{ .K = 3, .codec = "fp32", .algo = "direct", .count = 1000, .steps = 1, .mismatch = true, .freeze_site = -1 },
		/* Block sizes that differ, of a codec that has none, agree. */
		{ .K = 3, .codec = "bf16", .algo = "ring", .count = 1000, .steps = 1, .own_blocks = true, .freeze_site = -1 },
		  
		/* More tensors than a fixed table of feedback states once held. */
		{ .K = 2, .codec = "int8", .algo = "direct", .count = 1000, .steps = 70, .tensor_per_step = true, .freeze_site = -1 },
		  
		/* A site dies holding the whole result: the others hold it too,
		 * yet must not complete, since it never will. */
		{ .K = 3, .codec = "fp32", .algo = "direct", .count = 100000, .steps = 1, .freeze_site = 2 },
		{ .K = 3, .codec = "fp32", .algo = "ring", .count = 100000, .steps = 1, .freeze_site = 1 },
		/* A DONE lost with every stream that carried it comes again. */
		{ .K = 3, .codec = "fp32", .algo = "ring", .count = 100000, .steps = 3, .freeze_site = -1,
		  .done_lost_step = 2 },
		{ .K = 2, .codec = "fp32", .algo = "direct", .count = 100000, .steps = 2, .freeze_site = -1,
		  .done_lost_step = 2 },
		/* ... or its END, once the sender forgot the job, stands for it. */
		{ .K = 3, .codec = "fp32", .algo = "direct", .count = 100000, .steps = 2, .freeze_site = -1,
		  .done_lost_step = 2, .end_after_lost = true },
		/* A peer floods DATA for steps that never come. */
		{ .K = 2, .codec = "fp32", .algo = "ring", .count = 100000, .steps = 2, .freeze_site = -1,
		  .flood = true },
		/* A site crashes between its DONE messages, and restarts. */
		{ .K = 3, .codec = "fp32", .algo = "ring", .count = 100000, .steps = 2, .freeze_site = -1,
		  .restart_step = 2 },
		{ .K = 3, .codec = "fp32", .algo = "direct", .count = 100000, .steps = 2, .freeze_site = -1,
		  .restart_step = 2 },
		/* algorithm auto, and a site whose plan went astray. */
		{ .K = 3, .codec = "fp32", .algo = "auto", .count = 100000, .steps = 4, .freeze_site = -1,
		  .plan_split_step = 2 },
		/* algorithm auto and 1 MiB chunks: step 2 by ring everywhere, in
		 * the smaller chunks auto cuts it in, exact; the others direct. */
		{ .K = 3, .codec = "fp32", .algo = "auto", .count = 2000003, .steps = 3, .freeze_site = -1,
		  .plan_split_step = 2, .plan_all = true, .chunk = "1MiB" },
	};
	const char *only = getenv("MESH_ONLY");
	if (getenv("MESH_VERBOSE"))
		gg_log_set_level(GG_LOG_DEBUG);
#ifdef GG_NODE_GPU
	/* Each with every tensor in host memory first, then with sites 1 and
	 * 3 on the GPU: the same results, bit for bit. Lossy codecs run with
	 * error feedback, its residuals then on the GPU too. */
	const struct scenario gpu[] = {
		{ .K = 2, .codec = "fp32", .algo = "direct", .count = 1000003, .steps = 2, .freeze_site = -1 },
		{ .K = 3, .codec = "fp32", .algo = "ring", .count = 1000003, .steps = 2, .freeze_site = -1 },
		{ .K = 4, .codec = "bf16-split", .algo = "ring", .count = 1000003, .steps = 2, .freeze_site = -1 },
		{ .K = 3, .codec = "int8", .algo = "direct", .count = 1000003, .steps = 3, .freeze_site = -1 },
		{ .K = 3, .codec = "int8", .algo = "ring", .count = 100003, .steps = 3, .freeze_site = -1 },
		{ .K = 4, .codec = "int4", .algo = "direct", .count = 4099, .steps = 3, .freeze_site = -1 },
		{ .K = 2, .codec = "bf16", .algo = "ring", .count = 1, .steps = 2, .freeze_site = -1 },
		/* Frames sent again after a cut stream. */
		{ .K = 3, .codec = "int8", .algo = "ring", .count = 4000000, .steps = 2, .cut_at_step = 1,
		  .freeze_site = -1 },
	};
	/* Site 1's tensor moves between GPU and host memory every step: its
	 * residuals start afresh each time, so the results are its own. */
	const struct scenario moving = { .K = 2, .codec = "int8", .algo = "direct", .count = 100003, .steps = 4,
					 .freeze_site = -1, .device = true, .alternate = true };
	dev_require_gpu();
	for (size_t i = 0; i < sizeof(gpu) / sizeof(gpu[0]); i++) {
		if (only && atoi(only) != (int)i)
			continue;
		struct scenario sc = gpu[i];
		float *host = malloc(sc.count * sc.steps * sizeof(float));
		CHECK(host, "no memory");
		if (!host)
			break;
		keep_results = host;
		run(&sc);
		keep_results = NULL;
		sc.device = true;
		want_results = host;
		run(&sc);
		want_results = NULL;
		free(host);
	}
	if (!only)
		run(&moving);
	printf("mesh: %d failure(s)\n", failures);
	return failures ? 1 : 0;
#endif
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		if (!only || atoi(only) == (int)i)
			run(&scenarios[i]);
	if (argc > 2 && !strcmp(argv[2], "--large")) {
		const struct scenario large = { .K = 2, .codec = "fp32", .algo = "ring", .count = 64u << 20, .steps = 1, .freeze_site = -1 };
		run(&large);
	}
	printf("mesh: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
