/* Algorithm auto: whether a step goes direct or by ring, and in which
 * chunks, planned at the first site from the links every site measures
 * and the steps it times, and carried to the others by its DONE
 * (docs/design.md, "Choosing the algorithm"). Runs on the coordinator's
 * thread. */
#include "node_internal.h"

#include <stdio.h>
#include <string.h>


/* A lane whose uplink figure is older than this before the newest one
 * carried none of the latest steps: it is left out. */
#define LINK_FRESH_US 2000000u

/* This site's links, for its DONEs: the uplink rates of the lanes that
 * carried the latest steps, added up (they share the uplink), and the
 * longest of the shortest recent round trips to a peer. A figure not
 * measured again keeps its last value. */
void gg_plan_measure_links(struct gg_node *n)
{
	struct gg_wire_links *own = &n->links[n->self];
	uint64_t newest = 0, sum = 0, rtt = 0;

	for (unsigned l = 0; l < n->nlanes; l++)
		newest = GG_MAX(newest, (uint64_t)load(&n->lanes[l].uplink_at_us));
	for (unsigned l = 0; l < n->nlanes; l++) {
		uint64_t at = load(&n->lanes[l].uplink_at_us);
		if (at && at + LINK_FRESH_US >= newest)
			sum += load(&n->lanes[l].uplink_bps);
	}
	for (unsigned p = 0; p < n->sites; p++) {
		uint64_t best = 0;
		for (unsigned l = 0; l < n->nlanes; l++) {
			uint64_t r = load(&n->lanes[l].rtt_min_us[p]);
			if (r && (!best || r < best))
				best = r;
		}
		rtt = GG_MAX(rtt, best);
	}
	if (sum)
		own->uplink_bytes_per_s = sum;
	if (rtt)
		own->rtt_us = (uint32_t)GG_MIN(rtt, (uint64_t)UINT32_MAX);
}

/* Bytes on the wire per element: as the frames sent so far had them
 * (zstd included, like the uplink figure), else the codec's own. */
static double elem_bytes(const struct gg_node *n)
{
	const struct gg_codec_params cp = n->frame_cfg.codec;
	uint64_t bytes = 0, raw = 0;
	const uint64_t elems = 1u << 20;

	for (unsigned l = 0; l < n->nlanes; l++)
		for (unsigned p = 0; p < n->sites; p++) {
			bytes += load(&n->lanes[l].stats.peers[p].data_out);
			raw += load(&n->lanes[l].stats.peers[p].raw_out);
		}
	if (raw >= elems * sizeof(float))
		return (double)bytes * sizeof(float) / (double)raw;
	if (gg_codec_encoded_bytes(&cp, elems, &bytes))
		return 4;
	return (double)bytes / (double)elems;
}

/* A job's first steps go direct, over every link, until the links were
 * measured and this many more steps ran: a window opens over round trips,
 * and where a step's bytes are a fraction of the bandwidth-delay product
 * that takes steps (at 5 Gbit/s and 300 ms, 64 MiB steps direct took 1.3
 * s for the first eight, 0.6 s after). Compared on cold links, direct
 * looks slower than it is, and ring, which leaves half of them idle,
 * keeps them cold. The last PROBE_FIRST of them are direct's first timed
 * steps. */
#define WARM_STEPS 8u
/* Steps of the algorithm not chosen for a job's size run now and then (at
 * 3 sites or more), to time it again: the links change, and its windows
 * may have been cold when it ran. PROBE_SOON steps after it ran or was
 * dropped, while each of its probes is more than PROBE_GAIN faster than
 * the ones before (against the model), beyond what steps vary by; twice
 * as many steps after each that is not, up to PROBE_EVERY, or more where
 * the other algorithm is so much slower that probing it that often would
 * cost more than PROBE_BUDGET of the job's time (probe_interval()). A
 * probe runs PROBE_FIRST steps, and more while each step gains
 * PROBE_STEP_GAIN (probe_goes_on()), up to PROBE_RUN. */
#define PROBE_SOON 4u
#define PROBE_EVERY 32u
#define PROBE_BUDGET 0.01
#define PROBE_EVERY_MAX 256u
#define PROBE_GAIN 0.2
#define PROBE_STEP_GAIN 0.1
#define PROBE_RUN 8u
#define PROBE_CLOSE 1.25
/* An algorithm is timed this many steps in a row before its factor is
 * trusted: the first step of one that did not run lately meets streams
 * whose congestion windows went cold. */
#define PROBE_FIRST 2u
/* Steps the model gives less time than this are set by what the model
 * leaves out (a step's fixed costs): they neither time an algorithm nor
 * probe one. */
#define MODEL_MIN_S 0.005
/* A job keeps its algorithm for a size unless the other is predicted this
 * much faster: times that close swap places with every measurement. */
#define SWITCH_GAIN 0.05

/* The slowest uplink and the longest round trip any site reported; false
 * while either is unknown. */
static bool worst_links(const struct gg_node *n, struct gg_wire_links *worst)
{
	*worst = (struct gg_wire_links){ 0 };
	for (unsigned s = 0; s < n->sites; s++) {
		const struct gg_wire_links *l = &n->links[s];
		if (l->uplink_bytes_per_s &&
		    (!worst->uplink_bytes_per_s || l->uplink_bytes_per_s < worst->uplink_bytes_per_s))
			worst->uplink_bytes_per_s = l->uplink_bytes_per_s;
		worst->rtt_us = GG_MAX(worst->rtt_us, l->rtt_us);
	}
	return worst->uplink_bytes_per_s && worst->rtt_us;
}

/* model_factor() over the steps after `after` up to `last`; 0 where none. */
static double factor_between(const struct gg_node *n, const struct job *j, enum gg_allreduce_algo a, double eb,
			     double up, double one_way, uint64_t after, uint64_t last)
{
	double f = 0;

	for (unsigned i = 0; i < j->timed_n[a]; i++) {
		const struct timed_step *t = &j->timed[a][i];
		double model = gg_ar_model_seconds(a, n->sites, t->count, eb, up, one_way);
		if (t->seq > after && t->seq <= last && model > 0 && (!f || t->seconds / model < f))
			f = t->seconds / model;
	}
	return f;
}

/* At the first site: the factor by which algorithm a's model time is
 * scaled, the least over its latest timed steps of measured time over
 * what the model says for the step's size on the links as measured now
 * (a slow step was slowed by something, a fast one was not). What the
 * model leaves out (losses when a site sends to all its peers at once, the
 * CPU, ring's pipelining, latency in the uplink figure) shows in the
 * factors. Both algorithms' factors come from the same figures, so where
 * both ran steps of a size, comparing them compares those steps' times,
 * however the figures moved since. 1 when none was timed. */
static double model_factor(const struct gg_node *n, const struct job *j, enum gg_allreduce_algo a, double eb,
			   double up, double one_way)
{
	double f = factor_between(n, j, a, eb, up, one_way, 0, UINT64_MAX);

	return f ? f : 1;
}

/* How long j's step took at the first site, from its submission to its
 * result there: what a probe's steps are compared by while the plan for
 * the next one is made. gg_plan_time_step() keeps the time to completion, once
 * every site has its result (by ring, the others have it later). */
static double result_seconds(const struct job *j)
{
	return j->has_result_us > j->submit_us ? (double)(j->has_result_us - j->submit_us) / 1e6 : 0;
}

/* At the first site, once j's step completed: how long it took, kept with
 * the latest of its algorithm. The steps before the job's first plan are
 * not, but for the last PROBE_FIRST (WARM_STEPS): they ran while the links
 * were being measured and warmed, on cold streams and into memory touched
 * for the first time, and would make direct, which they all go by, look
 * slower than it is for many steps to come. */
void gg_plan_time_step(struct gg_node *n, struct job *j)
{
	struct gg_wire_links w;
	const enum gg_allreduce_algo a = j->run_algo;

	if (n->self != 0 || n->cfg->allreduce.algorithm != GG_ALLREDUCE_AUTO || n->sites <= 2 ||
	    (!j->using.has_plan && j->warm_steps + PROBE_FIRST < WARM_STEPS) || !worst_links(n, &w))
		return;
	double model = gg_ar_model_seconds(a, n->sites, j->wstep.count, elem_bytes(n), (double)w.uplink_bytes_per_s,
					   w.rtt_us / 2e6);
	const uint64_t now = gg_node_loop(n)->now_us;
	if (model < MODEL_MIN_S || now <= j->submit_us)
		return;
	const double seconds = (double)(now - j->submit_us) / 1e6;
	if (j->timed_n[a] == TIMED_KEPT)
		memmove(j->timed[a], j->timed[a] + 1, (TIMED_KEPT - 1) * sizeof(j->timed[a][0]));
	else
		j->timed_n[a]++;
	j->timed[a][j->timed_n[a] - 1] = (struct timed_step){ j->step->seq, j->wstep.count, seconds };
	j->timed_seq[a] = j->step->seq;
}

/* At the first site, as j's step has its result: whether it is a probe of
 * algorithm a to be followed by another, `chosen` the time predicted for
 * the algorithm chosen. A probe meets windows that went cold while a did
 * not run, and each step warms them for the next: after PROBE_FIRST steps
 * a probe goes on while each step is more than PROBE_STEP_GAIN faster than
 * the probe's best before it and within PROBE_CLOSE of `chosen`, up to
 * PROBE_RUN steps. */
static bool probe_goes_on(struct job *j, enum gg_allreduce_algo a, double chosen)
{
	const double t = result_seconds(j);

	if (!j->using.probe || j->run_algo != a) {
		j->probe_len = 0;
		return false;
	}
	const bool better = !j->probe_len || t < j->probe_best * (1 - PROBE_STEP_GAIN);
	j->probe_best = !j->probe_len ? t : GG_MIN(j->probe_best, t);
	j->probe_len++;
	return j->probe_len < PROBE_FIRST ||
	       (j->probe_len < PROBE_RUN && better && t > 0 && t < chosen * PROBE_CLOSE);
}

/* Steps until the next probe of an algorithm whose last probe did not
 * show it faster than before: twice as many as last time, up to
 * PROBE_EVERY; and at least as many as keep the probes' cost within
 * PROBE_BUDGET of the job's time, where `slower` is how many times the
 * chosen algorithm's time the probed one takes (its PROBE_FIRST steps
 * then cost that much more each), up to PROBE_EVERY_MAX. */
static unsigned probe_interval(unsigned last, double slower)
{
	unsigned every = GG_MIN(2 * GG_MAX(last, PROBE_SOON), PROBE_EVERY);
	double affordable = slower > 1 ? PROBE_FIRST * (slower - 1) / PROBE_BUDGET : 0;

	return affordable > every ? (unsigned)GG_MIN(affordable, (double)PROBE_EVERY_MAX) : every;
}

/* At the first site: the plan its DONE of j's step carries, from the
 * slowest uplink and the longest round trip any site reported, each
 * algorithm's model time scaled by its factor. Now and then the plan is a
 * probe: one step of the algorithm not chosen for the step's size. */
void gg_plan_make(struct gg_node *n, struct job *j)
{
	struct gg_wire_links worst;

	if (!worst_links(n, &worst) && n->sites > 2)
		return; /* not measured yet: the plan stays */
	if (n->sites > 2 && j->warm_steps < WARM_STEPS && ++j->warm_steps < WARM_STEPS)
		return;
	const double eb = elem_bytes(n), up = (double)worst.uplink_bytes_per_s, one_way = worst.rtt_us / 2e6;
	const double fd = model_factor(n, j, GG_ALLREDUCE_DIRECT, eb, up, one_way),
		     fr = model_factor(n, j, GG_ALLREDUCE_RING, eb, up, one_way);
	const uint64_t count = j->wstep.count, seq = j->step->seq;
	j->plan = (struct gg_wire_plan){
		.has_plan = true,
		.direct_max = gg_ar_direct_max_scaled(n->sites, eb, up, one_way, fd, fr),
		.links = worst,
	};
	if (n->sites <= 2)
		return;
	/* The size of this step keeps its algorithm unless the other gains. */
	const double td = fd * gg_ar_model_seconds(GG_ALLREDUCE_DIRECT, n->sites, count, eb, up, one_way);
	const double tr = fr * gg_ar_model_seconds(GG_ALLREDUCE_RING, n->sites, count, eb, up, one_way);
	if (j->using.has_plan && j->algo_count == count) {
		if (j->algo == GG_ALLREDUCE_DIRECT && tr > td * (1 - SWITCH_GAIN))
			j->plan.direct_max = GG_MAX(j->plan.direct_max, count);
		else if (j->algo == GG_ALLREDUCE_RING && td > tr * (1 - SWITCH_GAIN))
			j->plan.direct_max = GG_MIN(j->plan.direct_max, count - 1);
	}
	const enum gg_allreduce_algo other = count <= j->plan.direct_max ? GG_ALLREDUCE_RING : GG_ALLREDUCE_DIRECT;
	/* A probe of the other that ended (the step now is not one): was it
	 * faster than its steps before? */
	if (j->run_algo != other && j->timed_seq[other] > j->judged_seq[other]) {
		const double before = factor_between(n, j, other, eb, up, one_way, 0, j->judged_seq[other]),
			     now = factor_between(n, j, other, eb, up, one_way, j->judged_seq[other], UINT64_MAX);
		const double slower = other == GG_ALLREDUCE_DIRECT ? td / tr : tr / td;
		j->probe_every[other] = !before || now < before * (1 - PROBE_GAIN) ?
						PROBE_SOON :
						probe_interval(j->probe_every[other], slower);
		j->judged_seq[other] = j->timed_seq[other];
	}
	const unsigned every = j->probe_every[other] ? j->probe_every[other] : PROBE_SOON;
	const bool goes_on = probe_goes_on(j, other, other == GG_ALLREDUCE_DIRECT ? tr : td);
	if (GG_MIN(td, tr) >= MODEL_MIN_S && (goes_on || j->timed_n[other] < PROBE_FIRST ||
					      seq >= GG_MAX(j->timed_seq[other], j->chosen_seq) + every)) {
		j->plan.direct_max = other == GG_ALLREDUCE_DIRECT ? count : count - 1;
		j->plan.probe = true;
	}
}

/* The algorithm of a step of `count` elements of job j. */
enum gg_allreduce_algo gg_plan_step_algo(const struct gg_node *n, const struct job *j, uint64_t count)
{
	if (n->cfg->allreduce.algorithm != GG_ALLREDUCE_AUTO)
		return n->cfg->allreduce.algorithm;
	return !j->using.has_plan || count <= j->using.direct_max ? GG_ALLREDUCE_DIRECT : GG_ALLREDUCE_RING;
}

/* The chunk of a step of `count` elements by `algo`: auto's choice
 * (gg_ar_auto_chunk()), else the configured one. */
uint32_t gg_plan_step_chunk(const struct gg_node *n, enum gg_allreduce_algo algo, uint64_t count)
{
	if (n->cfg->allreduce.algorithm != GG_ALLREDUCE_AUTO)
		return n->chunk_elems;
	return gg_ar_auto_chunk(algo, n->sites, count, n->chunk_elems);
}

/* A chunk of `elems` elements in KiB of float32, as chunk_size counts it. */
static unsigned chunk_kib(uint32_t elems)
{
	return (unsigned)((uint64_t)elems * sizeof(float) / 1024);
}

/* Step st of job j goes by `algo` in chunks of `chunk` elements: logged for the job's first step, its
 * first step by a plan, and when a step of the same size as the one
 * before goes otherwise (the plan changed; steps of sizes either side of
 * the threshold alternating are no news, nor a probe). */
void gg_plan_note_algo(struct gg_node *n, struct job *j, const struct gg_node_step *st, enum gg_allreduce_algo algo,
		      uint32_t chunk)
{
	const bool tell = !j->algo_told || (j->using.has_plan && !j->plan_told) ||
			  (algo != j->algo && st->count == j->algo_count);

	j->run_algo = algo;
	if (n->cfg->allreduce.algorithm != GG_ALLREDUCE_AUTO || j->using.probe)
		return; /* a probe is no news, nor the step after it going back */
	if (algo != j->algo || st->count != j->algo_count)
		j->chosen_seq = st->seq;
	j->algo = algo;
	j->algo_count = st->count;
	if (!tell)
		return;
	j->algo_told = true;
	j->plan_told = j->using.has_plan;
	if (!j->using.has_plan) {
		gg_log(GG_LOG_INFO, "algorithm", "job=%s step=%llu algorithm=%s count=%llu chunk_kib=%u reason=\"%s\"",
		       j->name, (unsigned long long)st->seq, gg_allreduce_algo_name(algo), (unsigned long long)st->count,
		       chunk_kib(chunk), "no plan yet: the links are measured as steps go direct");
		return;
	}
	const struct gg_wire_links *l = &j->using.links;
	const double eb = elem_bytes(n), up = (double)l->uplink_bytes_per_s, one_way = l->rtt_us / 2e6;
	/* The factors are the first site's, which made the plan. */
	char factors[64] = "";
	if (n->self == 0 && n->sites > 2)
		snprintf(factors, sizeof(factors), " factor_direct=%.3f factor_ring=%.3f",
			 model_factor(n, j, GG_ALLREDUCE_DIRECT, eb, up, one_way),
			 model_factor(n, j, GG_ALLREDUCE_RING, eb, up, one_way));
	/* direct at every size: "any", not the largest count there is */
	char up_to[24] = "any";
	if (j->using.direct_max != UINT64_MAX)
		snprintf(up_to, sizeof(up_to), "%llu", (unsigned long long)j->using.direct_max);
	gg_log(GG_LOG_INFO, "algorithm",
	       "job=%s step=%llu algorithm=%s count=%llu chunk_kib=%u direct_up_to=%s uplink_mbit=%.1f rtt_ms=%.3f "
	       "model_direct_ms=%.3f model_ring_ms=%.3f%s",
	       j->name, (unsigned long long)st->seq, gg_allreduce_algo_name(algo), (unsigned long long)st->count,
	       chunk_kib(chunk), up_to, up * 8 / 1e6, l->rtt_us / 1e3,
	       gg_ar_model_seconds(GG_ALLREDUCE_DIRECT, n->sites, st->count, eb, up, one_way) * 1e3,
	       gg_ar_model_seconds(GG_ALLREDUCE_RING, n->sites, st->count, eb, up, one_way) * 1e3, factors);
}

