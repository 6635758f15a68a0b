/* nccl_double.h: one process's NCCL communicators, on the host. */
#include "nccl_double.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RANKS 64

/* One communicator, shared by the handles of its ranks. Steps go in
 * rounds: every rank but the root posts its buffer, the root's reduce sums
 * them, its broadcast publishes the result, every rank copies it, and the
 * round ends. */
struct comm {
	struct comm *next;
	unsigned char id[GG_SITE_NCCL_ID_SIZE];
	unsigned nranks;
	unsigned joined;
	unsigned refs;
	uint64_t round;
	unsigned posted, taken;
	float *in[MAX_RANKS];
	uint64_t in_count[MAX_RANKS];
	const float *result; /* the root's broadcast of this round, once made */
	uint64_t result_count;
	/* What the root enqueued and poll() has not seen done, and its buffer. */
	enum { NONE, REDUCE, BROADCAST } pending;
	float *sum;
	uint64_t sum_count;
};

/* A handle. A rank's has a worker thread, its "stream": what the rank
 * enqueues runs there, waiting for its partners as a kernel would, until
 * done or the rank aborts. */
struct nd_rank {
	struct comm *c;
	unsigned rank;
	uint64_t next_round;
	pthread_t worker;
	bool has_worker;
	bool queued, reduce_only, stop;
	float *buf;
	uint64_t count;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct comm *comms;
/* The ids unique_id() made, whose bootstrap root waits, as NCCL's does,
 * until every rank of the communicator has checked in, or end_id() stops
 * it. */
#define MAX_ROOTS 256
static struct {
	unsigned char id[GG_SITE_NCCL_ID_SIZE];
	bool waiting;
	bool ended; /* end_id() came for it */
} roots[MAX_ROOTS];
static unsigned nroots;
static enum nd_fault fault;
static unsigned ids, finishes, frees, busy_frees;

static void init_cond(void)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&cond, &a);
	pthread_condattr_destroy(&a);
}

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Waits on the condition until `until_us`; false once it has passed. */
static bool wait_until(uint64_t until_us)
{
	if (now_us() >= until_us)
		return false;
	struct timespec ts = { (time_t)(until_us / 1000000u), (long)(until_us % 1000000u) * 1000 };
	pthread_cond_timedwait(&cond, &lock, &ts);
	return true;
}

static bool injected(enum nd_fault what, char *err, size_t err_size)
{
	if (fault != what)
		return false;
	fault = ND_NONE;
	snprintf(err, err_size, "nccl_double: injected failure");
	return true;
}

void nd_fail_next(enum nd_fault what)
{
	pthread_once(&once, init_cond);
	pthread_mutex_lock(&lock);
	fault = what;
	pthread_mutex_unlock(&lock);
}

/* The communicator of `id`, made by its first rank; NULL when out of
 * memory. Under the lock. */
static struct comm *comm_get(const unsigned char *id, unsigned nranks)
{
	struct comm *c;

	for (c = comms; c; c = c->next)
		if (!memcmp(c->id, id, sizeof(c->id)))
			break;
	if (!c) {
		if (nranks > MAX_RANKS || !(c = calloc(1, sizeof(*c))))
			return NULL;
		memcpy(c->id, id, sizeof(c->id));
		c->nranks = nranks;
		c->next = comms;
		comms = c;
	}
	c->refs++;
	return c;
}

/* The root of `id` waits no more. Under the lock. */
static void root_done(const unsigned char *id)
{
	for (unsigned i = 0; i < nroots; i++)
		if (!memcmp(roots[i].id, id, GG_SITE_NCCL_ID_SIZE))
			roots[i].waiting = false;
}

/* A rank checked in: the root is done once all have. Under the lock. */
static void checked_in(struct comm *c)
{
	c->joined++;
	if (c->joined == c->nranks)
		root_done(c->id);
	pthread_cond_broadcast(&cond);
}

unsigned nd_roots_waiting(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < nroots; i++)
		n += roots[i].waiting;
	pthread_mutex_unlock(&lock);
	return n;
}

unsigned nd_ids_unended(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < nroots; i++)
		n += !roots[i].ended;
	pthread_mutex_unlock(&lock);
	return n;
}

/* Under the lock. */
static void comm_put(struct comm *c)
{
	if (--c->refs)
		return;
	for (struct comm **p = &comms; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			break;
		}
	free(c);
}

unsigned nd_live(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (struct comm *c = comms; c; c = c->next)
		n++;
	pthread_mutex_unlock(&lock);
	return n;
}

/* ---- the gateway's side: site_nccl.h ---------------------------------- */

static int d_unique_id(unsigned char id[GG_SITE_NCCL_ID_SIZE], char *err, size_t err_size)
{
	pthread_once(&once, init_cond);
	pthread_mutex_lock(&lock);
	bool fail = injected(ND_UNIQUE_ID, err, err_size);
	unsigned n = ++ids;
	if (!fail && nroots == MAX_ROOTS) {
		snprintf(err, err_size, "nccl_double: more than %u ids in one test", MAX_ROOTS);
		fail = true;
	} else if (!fail) {
		memset(id, 0, GG_SITE_NCCL_ID_SIZE);
		snprintf((char *)id, GG_SITE_NCCL_ID_SIZE, "nccl-double-%u", n);
		memcpy(roots[nroots].id, id, GG_SITE_NCCL_ID_SIZE);
		roots[nroots].waiting = true;
		roots[nroots++].ended = false;
	}
	pthread_mutex_unlock(&lock);
	return fail ? -EIO : 0;
}

static void d_end_id(const unsigned char id[GG_SITE_NCCL_ID_SIZE])
{
	pthread_mutex_lock(&lock);
	root_done(id);
	for (unsigned i = 0; i < nroots; i++)
		if (!memcmp(roots[i].id, id, GG_SITE_NCCL_ID_SIZE))
			roots[i].ended = true;
	pthread_mutex_unlock(&lock);
}

static int d_open(void **comm, const unsigned char id[GG_SITE_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
		  char *err, size_t err_size)
{
	pthread_once(&once, init_cond);
	pthread_mutex_lock(&lock);
	int rc = 0;
	struct nd_rank *r = NULL;
	if (injected(ND_OPEN, err, err_size)) {
		rc = -EIO;
	} else if (rank != nranks - 1 || !(r = calloc(1, sizeof(*r))) || !(r->c = comm_get(id, nranks))) {
		snprintf(err, err_size, "nccl_double: cannot open rank %u of %u", rank, nranks);
		free(r);
		r = NULL;
		rc = -EINVAL;
	} else {
		r->rank = rank;
		checked_in(r->c);
	}
	pthread_mutex_unlock(&lock);
	*comm = r;
	return rc;
}

static int d_alloc(float **sum, uint64_t count, char *err, size_t err_size)
{
	if (!(*sum = malloc(count * sizeof(float)))) {
		snprintf(err, err_size, "nccl_double: out of memory");
		return -ENOMEM;
	}
	return 0;
}

static bool busy_locked(void)
{
	for (const struct comm *c = comms; c; c = c->next)
		if (c->pending != NONE)
			return true;
	return false;
}

bool nd_busy(void)
{
	pthread_mutex_lock(&lock);
	bool busy = busy_locked();
	pthread_mutex_unlock(&lock);
	return busy;
}

/* As cudaFree(), which waits for every kernel on the GPU: a free while a
 * root call is enqueued and not done would wait for it (for ever, for a
 * reduce whose rank never comes). Counted, to be checked. */
static void d_free(float *sum)
{
	if (!sum)
		return;
	pthread_mutex_lock(&lock);
	frees++;
	busy_frees += busy_locked();
	pthread_mutex_unlock(&lock);
	free(sum);
}

void nd_frees(unsigned *all, unsigned *busy)
{
	pthread_mutex_lock(&lock);
	*all = frees;
	*busy = busy_frees;
	pthread_mutex_unlock(&lock);
}

static bool all_posted(const struct comm *c)
{
	return c->posted == c->nranks - 1;
}

static int d_reduce(void *comm, float *sum, uint64_t count, char *err, size_t err_size)
{
	struct comm *c = ((struct nd_rank *)comm)->c;
	int rc = 0;

	pthread_mutex_lock(&lock);
	if (injected(ND_REDUCE, err, err_size)) {
		rc = -EIO;
	} else if (c->pending || c->result) {
		snprintf(err, err_size, "nccl_double: a reduce before the last call was done");
		rc = -EINVAL;
	} else {
		c->pending = REDUCE;
		c->sum = sum;
		c->sum_count = count;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

static int d_broadcast(void *comm, const float *sum, uint64_t count, char *err, size_t err_size)
{
	struct comm *c = ((struct nd_rank *)comm)->c;
	int rc = 0;

	pthread_mutex_lock(&lock);
	if (injected(ND_BROADCAST, err, err_size)) {
		rc = -EIO;
	} else if (c->pending || !all_posted(c)) {
		snprintf(err, err_size, "nccl_double: a broadcast without its round's reduce done");
		rc = -EINVAL;
	} else {
		/* Published by the next poll, as a GPU runs what was enqueued
		 * a little later. */
		c->pending = BROADCAST;
		c->sum = (float *)sum;
		c->sum_count = count;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* The root's reduce, once every rank's part is there: -0.0 and the ranks'
 * parts in rank order. Under the lock. */
static int reduce_now(struct comm *c, char *err, size_t err_size)
{
	for (unsigned k = 0; k < c->nranks - 1; k++)
		if (!c->in[k])
			return -EINPROGRESS; /* that rank aborted: NCCL's reduce would wait for ever */
	for (unsigned k = 0; k < c->nranks - 1; k++)
		if (c->in_count[k] != c->sum_count) {
			snprintf(err, err_size, "nccl_double: rank %u reduces %llu elements, the root %llu", k,
				 (unsigned long long)c->in_count[k], (unsigned long long)c->sum_count);
			return -EINVAL;
		}
	for (uint64_t i = 0; i < c->sum_count; i++) {
		float s = -0.0f;
		for (unsigned k = 0; k < c->nranks - 1; k++)
			s += c->in[k][i];
		c->sum[i] = s;
	}
	return 0;
}

static int d_poll(void *comm, char *err, size_t err_size)
{
	struct comm *c = ((struct nd_rank *)comm)->c;
	int rc = -EINPROGRESS;

	pthread_mutex_lock(&lock);
	if ((c->pending == REDUCE && injected(ND_POLL_REDUCE, err, err_size)) ||
	    (c->pending == BROADCAST && injected(ND_POLL_BROADCAST, err, err_size))) {
		rc = -EIO;
	} else if (c->joined < c->nranks) {
		rc = -EINPROGRESS;
	} else if (c->pending == NONE) {
		rc = 0;
	} else if (c->pending == REDUCE && all_posted(c)) {
		rc = reduce_now(c, err, err_size);
		if (rc != -EINPROGRESS)
			c->pending = NONE;
	} else if (c->pending == BROADCAST && !c->result) {
		c->result = c->sum;
		c->result_count = c->sum_count;
		pthread_cond_broadcast(&cond);
	} else if (c->pending == BROADCAST && c->taken == c->nranks - 1) {
		c->pending = NONE;
		c->result = NULL;
		c->posted = c->taken = 0;
		c->round++;
		pthread_cond_broadcast(&cond);
		rc = 0;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* The gateway's abort ends its own calls only: as with NCCL, each rank's
 * end when that rank aborts its own handle. */
static void d_close(void *comm)
{
	struct nd_rank *r = comm;

	pthread_mutex_lock(&lock);
	/* Its calls end; what it published goes with it: ranks that have not
	 * taken it wait. One that never came up never will: ranks still
	 * joining wait on. */
	r->c->pending = NONE;
	r->c->result = NULL;
	if (r->c->joined < r->c->nranks)
		r->c->joined--;
	comm_put(r->c);
	pthread_mutex_unlock(&lock);
	free(r);
}

/* Nothing is ever in flight once the root's calls are done: a clean end,
 * which the other ranks' handles do not notice. */
static void d_finish(void *comm)
{
	struct nd_rank *r = comm;

	pthread_mutex_lock(&lock);
	finishes++;
	comm_put(r->c);
	pthread_mutex_unlock(&lock);
	free(r);
}

unsigned nd_finishes(void)
{
	pthread_mutex_lock(&lock);
	unsigned n = finishes;
	pthread_mutex_unlock(&lock);
	return n;
}

static int d_version(void)
{
	return ND_NCCL_VERSION;
}

const struct gg_site_nccl_ops nccl_double_ops = {
	.version = d_version,
	.unique_id = d_unique_id,
	.end_id = d_end_id,
	.open = d_open,
	.poll = d_poll,
	.alloc = d_alloc,
	.free = d_free,
	.reduce = d_reduce,
	.broadcast = d_broadcast,
	.close = d_close,
	.finish = d_finish,
};

/* ---- the ranks' side ---------------------------------------------------- */

/* A rank's stream: each enqueued step posts its part when the round is
 * its, then waits for the root's broadcast (unless reduce_only), as
 * NCCL's kernels wait for their partners: for ever, until done or the
 * rank aborts. */
static void *worker(void *arg)
{
	struct nd_rank *r = arg;
	struct comm *c = r->c;

	pthread_mutex_lock(&lock);
	for (;;) {
		while (!r->stop && !r->queued)
			pthread_cond_wait(&cond, &lock);
		while (!r->stop && c->round != r->next_round)
			pthread_cond_wait(&cond, &lock);
		if (r->stop)
			break;
		c->in[r->rank] = r->buf;
		c->in_count[r->rank] = r->count;
		c->posted++;
		pthread_cond_broadcast(&cond);
		while (!r->stop && (r->reduce_only || !c->result))
			pthread_cond_wait(&cond, &lock);
		if (r->stop) {
			c->in[r->rank] = NULL; /* gone: the root's reduce may not read it */
			break;
		}
		memcpy(r->buf, c->result, GG_MIN(r->count, c->result_count) * sizeof(float));
		c->taken++;
		r->next_round++;
		r->queued = false;
		pthread_cond_broadcast(&cond);
	}
	pthread_mutex_unlock(&lock);
	return NULL;
}

struct nd_rank *nd_join(const unsigned char id[GG_SITE_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
			int timeout_ms, const bool *cancel)
{
	uint64_t until = now_us() + (uint64_t)timeout_ms * 1000u;
	struct nd_rank *r = calloc(1, sizeof(*r));

	pthread_once(&once, init_cond);
	pthread_mutex_lock(&lock);
	if (!r || rank + 1 >= nranks || !(r->c = comm_get(id, nranks))) {
		pthread_mutex_unlock(&lock);
		free(r);
		return NULL;
	}
	r->rank = rank;
	checked_in(r->c);
	while (r->c->joined < r->c->nranks && !(cancel && *cancel) && wait_until(until))
		;
	bool up = r->c->joined == r->c->nranks;
	if (!up)
		r->c->joined--; /* the others wait on */
	pthread_mutex_unlock(&lock);
	if (!up || pthread_create(&r->worker, NULL, worker, r)) {
		nd_abort(r);
		return NULL;
	}
	r->has_worker = true;
	return r;
}

void nd_cancel(bool *cancel)
{
	pthread_once(&once, init_cond);
	pthread_mutex_lock(&lock);
	*cancel = true;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
}

void nd_enqueue(struct nd_rank *r, float *buf, uint64_t count, bool reduce_only)
{
	pthread_mutex_lock(&lock);
	r->buf = buf;
	r->count = count;
	r->reduce_only = reduce_only;
	r->queued = true;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
}

int nd_sync(struct nd_rank *r, int timeout_ms)
{
	uint64_t until = now_us() + (uint64_t)timeout_ms * 1000u;
	int rc = 0;

	pthread_mutex_lock(&lock);
	while (r->queued && !rc)
		if (!wait_until(until))
			rc = -ETIMEDOUT;
	pthread_mutex_unlock(&lock);
	return rc;
}

void nd_abort(struct nd_rank *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&lock);
	r->stop = true;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
	if (r->has_worker)
		pthread_join(r->worker, NULL);
	pthread_mutex_lock(&lock);
	comm_put(r->c);
	pthread_mutex_unlock(&lock);
	free(r);
}
