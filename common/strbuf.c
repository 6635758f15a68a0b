#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gg_strbuf_init(struct gg_strbuf *b, size_t max_bytes)
{
	*b = (struct gg_strbuf){ .max = max_bytes };
}

void gg_strbuf_free(struct gg_strbuf *b)
{
	free(b->buf);
	gg_strbuf_init(b, b->max);
}

/* Room for `more` characters and the NUL; false (overflow set) when the
 * bound or memory does not allow it. */
static bool reserve(struct gg_strbuf *b, size_t more)
{
	if (b->overflow || more >= b->max - b->len)
		return !(b->overflow = true);
	if (b->len + more < b->cap)
		return true;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap <= b->len + more)
		cap *= 2;
	cap = GG_MIN(cap, b->max);
	char *grown = realloc(b->buf, cap);
	if (!grown)
		return !(b->overflow = true);
	b->buf = grown;
	b->cap = cap;
	return true;
}

void gg_strbuf_add(struct gg_strbuf *b, const char *text, size_t len)
{
	if (!reserve(b, len))
		return;
	memcpy(b->buf + b->len, text, len);
	b->len += len;
	b->buf[b->len] = '\0';
}

void gg_strbuf_printf(struct gg_strbuf *b, const char *fmt, ...)
{
	va_list ap;
	char small[256];

	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0 || !reserve(b, (size_t)n))
		return;
	if ((size_t)n < sizeof(small)) {
		memcpy(b->buf + b->len, small, (size_t)n + 1);
	} else {
		va_start(ap, fmt);
		vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
		va_end(ap);
	}
	b->len += (size_t)n;
}

char *gg_strbuf_take(struct gg_strbuf *b, size_t *len)
{
	char *text = b->buf;

	*len = b->len;
	gg_strbuf_init(b, b->max);
	return text;
}
