/* Allocation failures on demand, for the replay programs (fuzz_alloc.c).
 * They are linked with -Wl,--wrap for malloc, calloc, realloc, strdup,
 * strndup, posix_memalign, aligned_alloc, asprintf and vasprintf, so every
 * call the project's own code makes goes through a counter; calls made
 * inside shared libraries (libc, OpenSSL, zstd) do not. */
#ifndef GG_FUZZ_ALLOC_H
#define GG_FUZZ_ALLOC_H

#include <stdbool.h>

/* From now on the n-th allocation fails (n >= 1), as if memory ran out;
 * 0: none fails. Resets the count and gg_fuzz_alloc_failed(). */
void gg_fuzz_alloc_fail_at(unsigned long n);

/* Whether the allocation chosen by gg_fuzz_alloc_fail_at() came, and so
 * failed. */
bool gg_fuzz_alloc_failed(void);

/* Counts the allocations from now on, as gg_fuzz_alloc_fail_at(0) does,
 * and keeps the calling code's address of each of the first `cap` in
 * sites[]; until the next gg_fuzz_alloc_fail_at(). */
void gg_fuzz_alloc_record(const void **sites, unsigned long cap);

/* Allocations counted since the last gg_fuzz_alloc_fail_at() or
 * gg_fuzz_alloc_record(). */
unsigned long gg_fuzz_alloc_calls(void);

#endif
