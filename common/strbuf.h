/* A text buffer that grows up to a bound: for answers assembled from many
 * pieces (the metrics page, the status table). Past the bound it stops
 * growing and says so, rather than cut a line in the middle unnoticed. */
#ifndef GG_STRBUF_H
#define GG_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "gg_common.h"

struct gg_strbuf {
	char *buf;      /* NUL-terminated; NULL until the first append */
	size_t len, cap;
	size_t max;     /* bytes it may hold, the NUL included */
	bool overflow;  /* an append did not fit (or found no memory): the text is incomplete */
};

/* An empty buffer that holds at most max_bytes - 1 characters. */
void gg_strbuf_init(struct gg_strbuf *b, size_t max_bytes);
void gg_strbuf_free(struct gg_strbuf *b);
/* Appends; an append that does not fit whole is dropped and sets overflow. */
GG_PRINTF(2, 3) void gg_strbuf_printf(struct gg_strbuf *b, const char *fmt, ...);
void gg_strbuf_add(struct gg_strbuf *b, const char *text, size_t len);
/* Hands the text over (the caller frees it) and leaves the buffer empty. */
char *gg_strbuf_take(struct gg_strbuf *b, size_t *len);

#endif
