/* The wrappers behind fuzz_alloc.h. The fuzz targets run on one thread, so
 * a plain counter numbers the allocations the same way run after run. */
#include "fuzz_alloc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each function as the linker names it: __real_ the original, __wrap_ the
 * one every call of the project's code reaches. */
#define WRAPPED(ret, name, ...)         \
	ret __real_##name(__VA_ARGS__); \
	ret __wrap_##name(__VA_ARGS__)

WRAPPED(void *, malloc, size_t size);
WRAPPED(void *, calloc, size_t n, size_t size);
WRAPPED(void *, realloc, void *p, size_t size);
WRAPPED(char *, strdup, const char *s);
WRAPPED(char *, strndup, const char *s, size_t n);
WRAPPED(int, posix_memalign, void **out, size_t align, size_t size);
WRAPPED(void *, aligned_alloc, size_t align, size_t size);
WRAPPED(int, vasprintf, char **out, const char *fmt, va_list ap);
int __wrap_asprintf(char **out, const char *fmt, ...);

static unsigned long calls, fail_at;
static bool failed;
static const void **record;
static unsigned long record_cap;

void gg_fuzz_alloc_fail_at(unsigned long n)
{
	calls = 0;
	fail_at = n;
	failed = false;
	record = NULL;
}

void gg_fuzz_alloc_record(const void **sites, unsigned long cap)
{
	gg_fuzz_alloc_fail_at(0);
	record = sites;
	record_cap = cap;
}

unsigned long gg_fuzz_alloc_calls(void)
{
	return calls;
}

bool gg_fuzz_alloc_failed(void)
{
	return failed;
}

/* site: the code that called the allocator. */
static bool fail_at_site(const void *site)
{
	calls++;
	if (record && calls <= record_cap)
		record[calls - 1] = site;
	if (calls != fail_at)
		return false;
	failed = true;
	errno = ENOMEM;
	return true;
}

#define fail_now() fail_at_site(__builtin_return_address(0))

void *__wrap_malloc(size_t size)
{
	return fail_now() ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return fail_now() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size)
{
	return fail_now() ? NULL : __real_realloc(p, size);
}

char *__wrap_strdup(const char *s)
{
	return fail_now() ? NULL : __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
	return fail_now() ? NULL : __real_strndup(s, n);
}

int __wrap_posix_memalign(void **out, size_t align, size_t size)
{
	return fail_now() ? ENOMEM : __real_posix_memalign(out, align, size);
}

void *__wrap_aligned_alloc(size_t align, size_t size)
{
	return fail_now() ? NULL : __real_aligned_alloc(align, size);
}

static int vasprintf_from(const void *site, char **out, const char *fmt, va_list ap)
{
	if (fail_at_site(site)) {
		*out = NULL;
		return -1;
	}
	return __real_vasprintf(out, fmt, ap);
}

int __wrap_vasprintf(char **out, const char *fmt, va_list ap)
{
	return vasprintf_from(__builtin_return_address(0), out, fmt, ap);
}

int __wrap_asprintf(char **out, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	int rc = vasprintf_from(__builtin_return_address(0), out, fmt, ap);
	va_end(ap);
	return rc;
}
