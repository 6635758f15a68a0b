/* The ABI of libgradgate.so.0 as gradgate.h defines it today, frozen: a
 * program built against this header must keep working with every later
 * 0.x library (gradgate.h, gg_version()). Each function's type, each enum
 * value and the layout of each public struct is checked at build time, so
 * a change that would break such programs stops the build here, naming
 * what changed. What may change without breaking them: new functions (in
 * a new symbol version of libgradgate.map), new enum values, new fields at
 * the end of a struct that carries its size (gg_session_info). What may
 * not: anything below. Run, it checks that the library's gg_strerror()
 * knows every code and no other. Layouts are those of 64-bit targets. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gradgate.h"

#define SAME_TYPE(fn, type) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type), #fn " changed its type: programs built " \
		       "against libgradgate.so.0 would call it wrongly; add a new function instead")

SAME_TYPE(gg_session_open, int (*)(const char *, const char *, int, int, struct gg_session **, struct gg_error *));
SAME_TYPE(gg_session_get_info, int (*)(const struct gg_session *, struct gg_session_info *));
SAME_TYPE(gg_buffer_alloc, int (*)(struct gg_session *, size_t, void **, struct gg_error *));
SAME_TYPE(gg_buffer_free, int (*)(struct gg_session *, void *, struct gg_error *));
SAME_TYPE(gg_allreduce, int (*)(struct gg_session *, void *, size_t, enum gg_dtype, uint32_t, int, struct gg_error *));
SAME_TYPE(gg_allreduce_start, int (*)(struct gg_session *, void *, size_t, enum gg_dtype, uint32_t, int,
				      struct gg_request **, struct gg_error *));
SAME_TYPE(gg_wait, int (*)(struct gg_request *, int, struct gg_error *));
SAME_TYPE(gg_allreduce_cuda, int (*)(struct gg_session *, void *, size_t, enum gg_dtype, uint32_t, void *, int,
				     struct gg_error *));
SAME_TYPE(gg_allreduce_nccl, int (*)(struct gg_session *, void *, size_t, enum gg_dtype, uint32_t, void *, int,
				     struct gg_error *));
SAME_TYPE(gg_request_free, void (*)(struct gg_request *));
SAME_TYPE(gg_session_close, void (*)(struct gg_session *));
SAME_TYPE(gg_strerror, const char *(*)(int));
SAME_TYPE(gg_dtype_size, size_t (*)(enum gg_dtype));
SAME_TYPE(gg_version, const char *(*)(void));

#define SAME_VALUE(name, v) \
	_Static_assert((name) == (v), #name " changed its value: programs built against libgradgate.so.0 hold the old one")

SAME_VALUE(GG_DTYPE_F32, 1);
SAME_VALUE(GG_DTYPE_BF16, 2);
SAME_VALUE(GG_OK, 0);
SAME_VALUE(GG_ERR_INVALID, -1);
SAME_VALUE(GG_ERR_NOMEM, -2);
SAME_VALUE(GG_ERR_SYSTEM, -3);
SAME_VALUE(GG_ERR_CONNECT, -4);
SAME_VALUE(GG_ERR_REFUSED, -5);
SAME_VALUE(GG_ERR_PROTOCOL, -6);
SAME_VALUE(GG_ERR_CLOSED, -7);
SAME_VALUE(GG_ERR_TIMEOUT, -8);
SAME_VALUE(GG_ERR_TOO_LARGE, -9);
SAME_VALUE(GG_ERR_MISMATCH, -10);
SAME_VALUE(GG_ERR_RANK, -11);
SAME_VALUE(GG_ERR_SITE, -12);
SAME_VALUE(GG_ERR_BUSY, -13);
SAME_VALUE(GG_ERR_AGAIN, -14);
SAME_VALUE(GG_ERR_LIMIT, -15);
SAME_VALUE(GG_ERROR_MESSAGE_MAX, 256);
_Static_assert(sizeof(enum gg_dtype) == sizeof(int) && sizeof(enum gg_errc) == sizeof(int),
	       "an enum of gradgate.h changed its size");

#define SAME_PLACE(type, field, offset, size)                                                               \
	_Static_assert(offsetof(type, field) == (offset) && sizeof(((type *)0)->field) == (size),              \
		       #type "." #field " moved or changed its size: programs built against libgradgate.so.0 " \
		       "read and write the old place")

#if SIZE_MAX > UINT32_MAX
/* struct gg_error: filled by the library in the caller's memory. */
SAME_PLACE(struct gg_error, code, 0, 4);
SAME_PLACE(struct gg_error, message, 4, 256);
_Static_assert(sizeof(struct gg_error) == 260, "struct gg_error changed its size: callers allocate the old one");

/* struct gg_session_info in its first version: it may grow at its end. */
SAME_PLACE(struct gg_session_info, size, 0, 8);
SAME_PLACE(struct gg_session_info, site, 8, 64);
SAME_PLACE(struct gg_session_info, max_message_bytes, 72, 8);
SAME_PLACE(struct gg_session_info, max_inflight, 80, 4);
SAME_PLACE(struct gg_session_info, step_timeout_ms, 84, 4);
SAME_PLACE(struct gg_session_info, max_buffers, 88, 4);
#define INFO_FIRST_SIZE 96 /* up to max_buffers, padding included */
_Static_assert(sizeof(struct gg_session_info) >= INFO_FIRST_SIZE, "struct gg_session_info shrank");
#endif

int main(void)
{
	int failures = 0;

	for (int code = GG_ERR_LIMIT; code <= GG_OK; code++)
		if (!strcmp(gg_strerror(code), "unknown error")) {
			printf("FAIL gg_strerror(%d) does not know the code\n", code);
			failures++;
		}
	if (strcmp(gg_strerror(GG_ERR_LIMIT - 1), "unknown error")) {
		printf("FAIL gg_strerror(%d) names a code gradgate.h does not have\n", GG_ERR_LIMIT - 1);
		failures++;
	}
	printf("ABI of libgradgate.so.0 (library %s): 14 functions, 2 types and 16 codes, 2 structs as first released%s\n",
	       gg_version(), failures ? "; FAILED" : "");
	return failures != 0;
}
