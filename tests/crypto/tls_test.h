/* Checks shared by the crypto tests: a failed check prints where and why,
 * then exits 1. */
#ifndef GG_TLS_TEST_H
#define GG_TLS_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gg_require.h"

#define CHECK_STR(got, want)                                                                                    \
	do {                                                                                                    \
		const char *g_ = (got), *w_ = (want);                                                           \
		if (strcmp(g_, w_)) {                                                                           \
			fprintf(stderr, "%s:%d: %s is\n  \"%s\"\nexpected\n  \"%s\"\n", __FILE__, __LINE__, #got, g_, w_); \
			exit(1);                                                                                \
		}                                                                                               \
	} while (0)

#define CHECK_CONTAINS(got, want)                                                                                     \
	do {                                                                                                          \
		const char *g_ = (got), *w_ = (want);                                                                 \
		if (!strstr(g_, w_)) {                                                                                \
			fprintf(stderr, "%s:%d: %s is\n  \"%s\"\nwhich lacks\n  \"%s\"\n", __FILE__, __LINE__, #got, g_, w_); \
			exit(1);                                                                                      \
		}                                                                                                     \
	} while (0)

#endif
