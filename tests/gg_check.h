/* CHECK for test programs: on failure prints where, the condition and a
 * printf-style explanation, counts the failure and carries on, so one run
 * reports every broken case. Tests return failures ? 1 : 0. */
#ifndef GG_CHECK_H
#define GG_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			printf(__VA_ARGS__);                               \
			printf("\n");                                      \
			fflush(stdout);                                    \
			failures++;                                        \
		}                                                          \
	} while (0)

#endif
