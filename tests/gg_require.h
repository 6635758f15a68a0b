/* Fatal checks for test programs whose later steps depend on earlier
 * ones: a failed check prints where and why, then exits 1. (gg_check.h
 * has the counting CHECK for tests that report every broken case.) */
#ifndef GG_REQUIRE_H
#define GG_REQUIRE_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                          \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                                              \
	do {                                                                                            \
		long long a_ = (long long)(a), b_ = (long long)(b);                                     \
		if (a_ != b_) {                                                                         \
			fprintf(stderr, "%s:%d: %s is %lld, expected %lld\n", __FILE__, __LINE__, #a, a_, b_); \
			exit(1);                                                                        \
		}                                                                                       \
	} while (0)

#endif
