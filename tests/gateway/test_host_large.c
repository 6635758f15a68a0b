/* One 64 Mi-element float32 all-reduce of two ranks (256 MiB each), bit
 * for bit against the sum in rank order: the shared regions, the sum and
 * the copies at a size where bounds and 32-bit arithmetic would show. */
#include <time.h>

#include "host_harness.h"

#define COUNT (64u << 20)
#define NRANKS 2

static struct harness h;
static float *inputs[NRANKS];

static void large_rank(unsigned rank, void *arg)
{
	struct gg_session *s;
	struct gg_error err;

	(void)arg;
	if (gg_session_open(h.endpoint, "large", (int)rank, NRANKS, &s, &err) ||
	    gg_allreduce(s, inputs[rank], COUNT, GG_DTYPE_F32, 1, 0, &err)) {
		fprintf(stderr, "rank %u: %s\n", rank, err.message);
		exit(1);
	}
	gg_session_close(s);
}

static double seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void)
{
	float *want = malloc((size_t)COUNT * sizeof(float));

	CHECK(want);
	for (unsigned r = 0; r < NRANKS; r++) {
		inputs[r] = malloc((size_t)COUNT * sizeof(float));
		CHECK(inputs[r]);
		fill_input_f32(inputs[r], COUNT, 64, r);
	}
	reference_f32(want, inputs, NRANKS, COUNT);

	harness_start(&h, NULL);
	double t0 = seconds();
	run_ranks(NRANKS, large_rank, NULL);
	double t1 = seconds();
	for (unsigned r = 0; r < NRANKS; r++)
		check_same_bytes(inputs[r], want, COUNT, sizeof(float), r ? "rank 1" : "rank 0");
	harness_wait_connections(&h, 0);
	CHECK_EQ_INT(harness_stats(&h).steps_done, 1);
	harness_stop(&h);
	printf("host large: %u float32 elements, %u ranks, %.3f s\n", COUNT, NRANKS, t1 - t0);
	for (unsigned r = 0; r < NRANKS; r++)
		free(inputs[r]);
	free(want);
	return 0;
}
