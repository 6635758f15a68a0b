/* Dials after a loss wait out the back-off less a spread that both ends
 * of a pair compute alike and that differs between pairs, so sites that
 * lost one peer at once do not all dial it in the same instant. */
#include <stdio.h>

#include "gg_check.h"
#include "mesh.h"

#define MIN_US 100000u
#define MAX_US 10000000u

int main(void)
{
	static const char *const sites[] = { "eu-west", "eu-central", "us-east", "us-west", "ap-south", "ap-east",
					     "sa-east", "me-south" };
	uint64_t hub_waits[sizeof(sites) / sizeof(sites[0]) * 4];
	unsigned n = 0;

	CHECK(gg_mesh_backoff_wait(MIN_US, MIN_US, "a", "b", 0) == MIN_US, "the first retry waits reconnect_min");
	CHECK(gg_mesh_backoff_wait(0, 0, "a", "b", 0) == 0, "a zero back-off");
	for (unsigned i = 0; i < sizeof(sites) / sizeof(sites[0]); i++)
		for (unsigned s = 0; s < 4; s++)
			for (uint64_t b = MIN_US; b <= MAX_US; b = b * 2 > MAX_US && b < MAX_US ? MAX_US : b * 2) {
				uint64_t w = gg_mesh_backoff_wait(b, MIN_US, sites[i], "hub", s);
				CHECK(w <= b && w >= b - (b - MIN_US) / 4, "%s stream %u back-off %llu: waits %llu",
				      sites[i], s, (unsigned long long)b, (unsigned long long)w);
				CHECK(w == gg_mesh_backoff_wait(b, MIN_US, "hub", sites[i], s),
				      "%s and hub, stream %u back-off %llu: both ends wait alike", sites[i], s,
				      (unsigned long long)b);
				if (b == MAX_US)
					hub_waits[n++] = w;
			}

	/* Every site loses "hub" at once and backs off to reconnect_max: their
	 * 32 dials spread over most of the quarter below it. */
	uint64_t lo = MAX_US, hi = 0;
	unsigned distinct = 0;
	for (unsigned i = 0; i < n; i++) {
		lo = hub_waits[i] < lo ? hub_waits[i] : lo;
		hi = hub_waits[i] > hi ? hub_waits[i] : hi;
		unsigned j = 0;
		while (j < i && hub_waits[j] != hub_waits[i])
			j++;
		distinct += j == i;
	}
	CHECK(distinct >= n * 3 / 4, "%u distinct waits of %u", distinct, n);
	CHECK(hi - lo >= (MAX_US - MIN_US) / 4 * 3 / 4, "the waits span %llu us", (unsigned long long)(hi - lo));
	printf("%u dials to one site at back-off %u us: %u distinct waits over %llu-%llu us\n", n, MAX_US, distinct,
	       (unsigned long long)lo, (unsigned long long)hi);
	return failures ? 1 : 0;
}
