/* TOML 1.0 parser; see toml.h.
 *
 * One pass over the input with a hand-written scanner. The tree is built in
 * an arena as it is read; table bookkeeping (how each table came to exist)
 * enforces the redefinition rules, which are the subtle part of TOML:
 *
 *   implicit  created as a parent by a [header]; may later get its own
 *             [header] once, or be extended with dotted keys
 *   header    defined by [header] or as an [[array]] element
 *   dotted    created by a dotted key; only dotted keys may add to it, but
 *             headers may pass through it to define sub-tables
 *   inline    { ... }; sealed as soon as it is closed
 */
#include "toml.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__GNUC__)
#define GG_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define GG_PRINTF(fmt, args)
#endif

/* ---- arena ------------------------------------------------------------ */

#define ARENA_FIRST_CHUNK 4096u
#define ARENA_MAX_CHUNK (1u << 20)

struct arena_chunk {
	struct arena_chunk *next;
	size_t size;
	size_t used;
	max_align_t data[];
};

struct arena {
	struct arena_chunk *head;
	size_t next_size;
	void *last; /* latest allocation in head: the only one that can grow in place */
};

static void arena_release(struct arena *a)
{
	struct arena_chunk *c, *next;

	for (c = a->head; c; c = next) {
		next = c->next;
		free(c);
	}
	a->head = NULL;
	a->last = NULL;
}

static void *arena_alloc(struct arena *a, size_t size, size_t align)
{
	struct arena_chunk *c = a->head;
	size_t want;

	if (c) {
		size_t off = (c->used + align - 1) & ~(align - 1);

		if (off <= c->size && size <= c->size - off) {
			c->used = off + size;
			a->last = (char *)c->data + off;
			return a->last;
		}
	}
	want = a->next_size ? a->next_size : ARENA_FIRST_CHUNK;
	if (size > want / 2) {
		/* Big blocks get a chunk of their own behind the head, so the
		 * head's free space is not abandoned. */
		if (size > SIZE_MAX - sizeof(*c))
			return NULL;
		c = malloc(sizeof(*c) + size);
		if (!c)
			return NULL;
		c->size = c->used = size;
		if (a->head) {
			c->next = a->head->next;
			a->head->next = c;
		} else {
			c->next = NULL;
			a->head = c;
			a->last = c->data;
		}
		return c->data;
	}
	c = malloc(sizeof(*c) + want);
	if (!c)
		return NULL;
	c->next = a->head;
	c->size = want;
	c->used = size;
	a->head = c;
	a->last = c->data;
	if (want < ARENA_MAX_CHUNK)
		a->next_size = want * 2;
	return c->data;
}

/* Grows the block `p` (old bytes long) to `size` bytes, in place when it is
 * the latest allocation; otherwise the old block is abandoned to the arena.
 * Callers grow geometrically, so abandoned space stays proportional. */
static void *arena_grow(struct arena *a, void *p, size_t old, size_t size)
{
	struct arena_chunk *c = a->head;
	void *n;

	if (p && p == a->last && c) {
		size_t off = (size_t)((char *)p - (char *)c->data);

		if (size <= c->size - off) {
			c->used = off + size;
			return p;
		}
	}
	n = arena_alloc(a, size, _Alignof(max_align_t));
	if (n && p)
		memcpy(n, p, old);
	return n;
}

/* ---- document --------------------------------------------------------- */

enum table_origin {
	TABLE_IMPLICIT,
	TABLE_HEADER,
	TABLE_DOTTED,
	TABLE_INLINE,
};

struct entry {
	const char *key; /* arena, NUL-terminated */
	size_t key_len;
	uint64_t hash;
	struct gg_toml_pos key_pos;
	struct gg_toml_value value;
};

/* Small tables are scanned; from this many keys on, a hash index is kept. */
#define TABLE_INDEX_MIN 8

struct gg_toml_table {
	struct entry *entries;
	size_t count, cap;
	uint32_t *slots; /* open addressing, entry index + 1, 0 = free */
	size_t nslots;   /* 0 or a power of two */
	const uint64_t *seed;
	struct gg_toml_pos defined_at;
	uint8_t origin;
	uint8_t depth;
};

struct gg_toml_array {
	struct gg_toml_value *items;
	size_t len, cap;
	bool of_tables; /* made by [[header]]; only those may be appended to */
	uint8_t depth;
};

struct gg_toml_doc {
	struct arena arena;
	uint64_t seed[2];
	struct gg_toml_table root;
};

/* The public union hands out const pointers; the parser owns the tree and
 * needs to extend it while reading. */
static struct gg_toml_table *table_of(const struct gg_toml_value *v)
{
	return (struct gg_toml_table *)v->u.table;
}

static struct gg_toml_array *array_of(const struct gg_toml_value *v)
{
	return (struct gg_toml_array *)v->u.array;
}

static uint64_t rotl64(uint64_t x, unsigned b)
{
	return (x << b) | (x >> (64 - b));
}

static void sip_round(uint64_t v[4])
{
	v[0] += v[1]; v[1] = rotl64(v[1], 13); v[1] ^= v[0]; v[0] = rotl64(v[0], 32);
	v[2] += v[3]; v[3] = rotl64(v[3], 16); v[3] ^= v[2];
	v[0] += v[3]; v[3] = rotl64(v[3], 21); v[3] ^= v[0];
	v[2] += v[1]; v[1] = rotl64(v[1], 17); v[1] ^= v[2]; v[2] = rotl64(v[2], 32);
}

/* SipHash-1-3 with a per-document key, so that crafted key sets cannot be
 * made to collide and turn lookups quadratic. */
static uint64_t key_hash(const uint64_t k[2], const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	uint64_t v[4] = {
		k[0] ^ 0x736f6d6570736575ull, k[1] ^ 0x646f72616e646f6dull,
		k[0] ^ 0x6c7967656e657261ull, k[1] ^ 0x7465646279746573ull,
	};
	uint64_t m;
	size_t i, j;

	for (i = 0; len - i >= 8; i += 8) {
		m = 0;
		for (j = 0; j < 8; j++)
			m |= (uint64_t)p[i + j] << (8 * j);
		v[3] ^= m;
		sip_round(v);
		v[0] ^= m;
	}
	m = (uint64_t)len << 56;
	for (j = 0; i + j < len; j++)
		m |= (uint64_t)p[i + j] << (8 * j);
	v[3] ^= m;
	sip_round(v);
	v[0] ^= m;
	v[2] ^= 0xff;
	sip_round(v);
	sip_round(v);
	sip_round(v);
	return v[0] ^ v[1] ^ v[2] ^ v[3];
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The key only has to be unpredictable from the input; address-space
 * randomisation and the clock are enough for that, and portable. */
static void seed_hash(struct gg_toml_doc *doc)
{
	int on_stack;
	uint64_t x = (uint64_t)(uintptr_t)doc;

	x = x * 31 + (uint64_t)(uintptr_t)&on_stack;
	x = x * 31 + (uint64_t)time(NULL);
	x = x * 31 + (uint64_t)clock();
	doc->seed[0] = splitmix64(&x);
	doc->seed[1] = splitmix64(&x);
}

static struct entry *table_find(const struct gg_toml_table *t, const char *key, size_t len)
{
	size_t i, mask;
	uint64_t h;

	if (!t->nslots) {
		for (i = 0; i < t->count; i++) {
			struct entry *e = &t->entries[i];

			if (e->key_len == len && memcmp(e->key, key, len) == 0)
				return e;
		}
		return NULL;
	}
	h = key_hash(t->seed, key, len);
	mask = t->nslots - 1;
	for (i = (size_t)h & mask;; i = (i + 1) & mask) {
		uint32_t idx = t->slots[i];
		struct entry *e;

		if (!idx)
			return NULL;
		e = &t->entries[idx - 1];
		if (e->hash == h && e->key_len == len && memcmp(e->key, key, len) == 0)
			return e;
	}
}

static void slot_put(struct gg_toml_table *t, size_t idx)
{
	size_t mask = t->nslots - 1;
	size_t i;

	for (i = (size_t)t->entries[idx].hash & mask; t->slots[i]; i = (i + 1) & mask)
		;
	t->slots[i] = (uint32_t)(idx + 1);
}

/* Keeps the index at most half full. */
static int table_reindex(struct arena *a, struct gg_toml_table *t, size_t count)
{
	size_t n = t->nslots ? t->nslots : 32;
	size_t i;

	while (count > n / 2) {
		if (n > SIZE_MAX / 2 / sizeof(*t->slots))
			return -ENOMEM;
		n *= 2;
	}
	if (n == t->nslots)
		return 0;
	t->slots = arena_alloc(a, n * sizeof(*t->slots), _Alignof(uint32_t));
	if (!t->slots)
		return -ENOMEM;
	memset(t->slots, 0, n * sizeof(*t->slots));
	t->nslots = n;
	for (i = 0; i < t->count; i++)
		slot_put(t, i);
	return 0;
}

/* Appends an entry; the caller has checked that the key is absent. */
static int table_add(struct arena *a, struct gg_toml_table *t, const char *key, size_t len,
		     struct gg_toml_pos key_pos, const struct gg_toml_value *v)
{
	struct entry *e;

	if (t->count == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 4;

		if (cap > SIZE_MAX / sizeof(*e) || cap > UINT32_MAX)
			return -ENOMEM;
		e = arena_grow(a, t->entries, t->count * sizeof(*e), cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		t->entries = e;
		t->cap = cap;
	}
	if (t->count + 1 >= TABLE_INDEX_MIN && table_reindex(a, t, t->count + 1))
		return -ENOMEM;
	e = &t->entries[t->count];
	e->key = key;
	e->key_len = len;
	e->hash = key_hash(t->seed, key, len);
	e->key_pos = key_pos;
	e->value = *v;
	if (t->nslots)
		slot_put(t, t->count);
	t->count++;
	return 0;
}

static int array_push(struct arena *a, struct gg_toml_array *arr, const struct gg_toml_value *v)
{
	if (arr->len == arr->cap) {
		size_t cap = arr->cap ? arr->cap * 2 : 4;
		struct gg_toml_value *items;

		if (cap > SIZE_MAX / sizeof(*items))
			return -ENOMEM;
		items = arena_grow(a, arr->items, arr->len * sizeof(*items), cap * sizeof(*items));
		if (!items)
			return -ENOMEM;
		arr->items = items;
		arr->cap = cap;
	}
	arr->items[arr->len++] = *v;
	return 0;
}

/* ---- parser state and errors ------------------------------------------ */

struct key_part {
	const char *str; /* arena, NUL-terminated */
	size_t len;
	struct gg_toml_pos pos;
};

struct parser {
	const char *p, *end;
	const char *line_start;
	uint32_t line;
	const char *col_at; /* pos_at()'s last position, and its column */
	uint32_t col;
	const char *source;
	char *err;
	size_t err_size;
	struct gg_toml_doc *doc;
	struct gg_toml_table *cur; /* receives key/value pairs */
	/* The key being read; reused by nested inline tables, so only valid
	 * until the value after '=' is parsed. */
	struct key_part key[GG_TOML_MAX_DEPTH];
	unsigned nkey;
	char *buf; /* scratch for decoding strings and floats */
	size_t buf_len, buf_cap;
};

/* Columns count characters, as an editor shows them: UTF-8 continuation
 * bytes do not start one. Positions are asked for mostly in order, so the
 * count goes on from the last one asked for on the same line; a long line
 * of many keys stays linear. */
static struct gg_toml_pos pos_at(struct parser *P, const char *s)
{
	const char *c = P->line_start;
	uint32_t col = 1;

	if (P->col_at && P->col_at >= P->line_start && P->col_at <= s) {
		c = P->col_at;
		col = P->col;
	}
	for (; c < s; c++)
		if (((unsigned char)*c & 0xc0) != 0x80)
			col++;
	P->col_at = s;
	P->col = col;
	return (struct gg_toml_pos){ P->line, col };
}

static struct gg_toml_pos here(struct parser *P)
{
	return pos_at(P, P->p);
}

static int GG_PRINTF(4, 0) verror(struct parser *P, struct gg_toml_pos pos, int rc,
				  const char *fmt, va_list ap)
{
	int n;
	char *c;

	if (!P->err || !P->err_size)
		return rc;
	n = snprintf(P->err, P->err_size, "%s:%u:%u: ", P->source, (unsigned)pos.line,
		     (unsigned)pos.col);
	if (n >= 0 && (size_t)n < P->err_size)
		vsnprintf(P->err + n, P->err_size - (size_t)n, fmt, ap);
	/* Keys are escaped when quoted, but the source name is the caller's:
	 * keep the promise of a single line regardless. */
	for (c = P->err; *c; c++) {
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
	}
	return rc;
}

static int GG_PRINTF(3, 4) fail(struct parser *P, struct gg_toml_pos pos, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	verror(P, pos, -EINVAL, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int GG_PRINTF(4, 5) fail_rc(struct parser *P, struct gg_toml_pos pos, int rc,
				   const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	verror(P, pos, rc, fmt, ap);
	va_end(ap);
	return rc;
}

static int oom(struct parser *P)
{
	return fail_rc(P, here(P), -ENOMEM, "out of memory");
}

static int too_deep(struct parser *P, struct gg_toml_pos pos)
{
	return fail_rc(P, pos, -E2BIG, "nesting deeper than %d levels", GG_TOML_MAX_DEPTH);
}

static bool is_digit(int c)
{
	return c >= '0' && c <= '9';
}

static bool is_alpha(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_bare(int c)
{
	return is_alpha(c) || is_digit(c) || c == '_' || c == '-';
}

static bool is_ctrl(int c)
{
	return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7f;
}

/* Characters that may continue a number or date-time; used to find the
 * extent of a malformed one for the message. */
static bool is_scalar_char(int c)
{
	return is_bare(c) || c == '.' || c == ':' || c == '+';
}

/* Byte i past the cursor, or -1 past the end. */
static int at(const struct parser *P, size_t i)
{
	return (size_t)(P->end - P->p) > i ? (unsigned char)P->p[i] : -1;
}

/* Length of the valid UTF-8 sequence at s (0 if invalid), code point in *cp. */
static size_t utf8_decode(const unsigned char *s, const unsigned char *end, uint32_t *cp)
{
	size_t n, i;
	uint32_t c = s[0], min;

	if (c < 0x80) {
		*cp = c;
		return 1;
	} else if (c >= 0xc2 && c <= 0xdf) {
		n = 2, c &= 0x1f, min = 0x80;
	} else if (c >= 0xe0 && c <= 0xef) {
		n = 3, c &= 0x0f, min = 0x800;
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4, c &= 0x07, min = 0x10000;
	} else {
		return 0;
	}
	if ((size_t)(end - s) < n)
		return 0;
	for (i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		c = (c << 6) | (s[i] & 0x3f);
	}
	if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return 0;
	*cp = c;
	return n;
}

struct found {
	char s[24];
};

/* Describes what the input holds at s, for "expected X, found Y". */
static struct found found_at(const struct parser *P, const char *s)
{
	struct found f;
	uint32_t cp;
	unsigned char c;

	if (s >= P->end) {
		snprintf(f.s, sizeof(f.s), "end of input");
		return f;
	}
	c = (unsigned char)*s;
	if (c == '\n' || (c == '\r' && P->end - s > 1 && s[1] == '\n'))
		snprintf(f.s, sizeof(f.s), "end of line");
	else if (c == '\r')
		snprintf(f.s, sizeof(f.s), "bare carriage return");
	else if (c >= 0x20 && c < 0x7f)
		snprintf(f.s, sizeof(f.s), "'%c'", c);
	else if (utf8_decode((const unsigned char *)s, (const unsigned char *)P->end, &cp))
		snprintf(f.s, sizeof(f.s), "U+%04X", (unsigned)cp);
	else
		snprintf(f.s, sizeof(f.s), "byte 0x%02X", c);
	return f;
}

/* A key path for messages: bare parts as they are, others quoted and
 * escaped, cut to fit the buffer. */
struct key_name {
	char s[96];
};

static void name_put(struct key_name *n, size_t *len, char c)
{
	if (*len + 1 < sizeof(n->s))
		n->s[*len] = c;
	(*len)++;
}

static struct key_name key_name(const struct key_part *parts, unsigned count)
{
	struct key_name n;
	size_t len = 0, i, j;
	unsigned k;

	for (k = 0; k < count; k++) {
		const struct key_part *p = &parts[k];
		bool bare = p->len > 0;

		for (i = 0; i < p->len && bare; i++)
			bare = is_bare((unsigned char)p->str[i]);
		if (k)
			name_put(&n, &len, '.');
		if (bare) {
			for (i = 0; i < p->len; i++)
				name_put(&n, &len, p->str[i]);
			continue;
		}
		name_put(&n, &len, '"');
		for (i = 0; i < p->len; i++) {
			unsigned char c = (unsigned char)p->str[i];
			char esc[8];

			if (c == '"' || c == '\\') {
				name_put(&n, &len, '\\');
				name_put(&n, &len, (char)c);
			} else if (c < 0x20 || c == 0x7f) {
				snprintf(esc, sizeof(esc), "\\u%04X", c);
				for (j = 0; esc[j]; j++)
					name_put(&n, &len, esc[j]);
			} else {
				name_put(&n, &len, (char)c);
			}
		}
		name_put(&n, &len, '"');
	}
	if (len < sizeof(n.s)) {
		n.s[len] = '\0';
	} else {
		/* Cut on a UTF-8 boundary and mark the cut. */
		i = sizeof(n.s) - 4;
		while (i > 0 && ((unsigned char)n.s[i] & 0xc0) == 0x80)
			i--;
		memcpy(n.s + i, "...", 4);
	}
	return n;
}

static const char *origin_note(const struct gg_toml_table *t)
{
	switch (t->origin) {
	case TABLE_IMPLICIT:
		return " as the parent of another table";
	case TABLE_DOTTED:
		return " by dotted keys";
	case TABLE_INLINE:
		return " as an inline table";
	default:
		return "";
	}
}

/* ---- scanner helpers -------------------------------------------------- */

static void skip_ws(struct parser *P)
{
	while (P->p < P->end && (*P->p == ' ' || *P->p == '\t'))
		P->p++;
}

static void count_newline(struct parser *P)
{
	P->line++;
	P->line_start = P->p;
}

static bool eat_newline(struct parser *P)
{
	if (at(P, 0) == '\n')
		P->p++;
	else if (at(P, 0) == '\r' && at(P, 1) == '\n')
		P->p += 2;
	else
		return false;
	count_newline(P);
	return true;
}

/* At '#': skips to the end of the line, leaving the newline. */
static int skip_comment(struct parser *P)
{
	for (P->p++; P->p < P->end; P->p++) {
		int c = (unsigned char)*P->p;

		if (c == '\n' || (c == '\r' && at(P, 1) == '\n'))
			break;
		if (is_ctrl(c))
			return fail(P, here(P), "control character U+%04X not allowed in comment",
				    (unsigned)c);
	}
	return 0;
}

/* Whitespace, newlines and comments, as allowed between array elements. */
static int skip_blank(struct parser *P)
{
	int rc;

	for (;;) {
		skip_ws(P);
		if (at(P, 0) == '#') {
			rc = skip_comment(P);
			if (rc)
				return rc;
		}
		if (!eat_newline(P))
			return 0;
	}
}

/* After a header or key/value pair: only a comment may share the line. */
static int end_of_line(struct parser *P, const char *after)
{
	int rc;

	skip_ws(P);
	if (at(P, 0) == '#') {
		rc = skip_comment(P);
		if (rc)
			return rc;
	}
	if (P->p == P->end || eat_newline(P))
		return 0;
	return fail(P, here(P), "expected end of line after %s, found %s", after,
		    found_at(P, P->p).s);
}

static int buf_grow(struct parser *P)
{
	size_t cap = P->buf_cap ? P->buf_cap * 2 : 256;
	char *n;

	if (cap < P->buf_cap)
		return -ENOMEM;
	n = realloc(P->buf, cap);
	if (!n)
		return -ENOMEM;
	P->buf = n;
	P->buf_cap = cap;
	return 0;
}

static bool buf_putc(struct parser *P, char c)
{
	if (P->buf_len == P->buf_cap && buf_grow(P))
		return false;
	P->buf[P->buf_len++] = c;
	return true;
}

/* Copies n bytes into the arena as a NUL-terminated string. */
static const char *arena_strdup(struct arena *a, const char *s, size_t n)
{
	char *d;

	if (n == SIZE_MAX)
		return NULL;
	d = arena_alloc(a, n + 1, 1);
	if (!d)
		return NULL;
	if (n)
		memcpy(d, s, n);
	d[n] = '\0';
	return d;
}

/* ---- strings ---------------------------------------------------------- */

static int hex_value(int c)
{
	if (is_digit(c))
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static bool put_utf8(struct parser *P, uint32_t cp)
{
	if (cp < 0x80)
		return buf_putc(P, (char)cp);
	if (cp < 0x800)
		return buf_putc(P, (char)(0xc0 | (cp >> 6))) &&
		       buf_putc(P, (char)(0x80 | (cp & 0x3f)));
	if (cp < 0x10000)
		return buf_putc(P, (char)(0xe0 | (cp >> 12))) &&
		       buf_putc(P, (char)(0x80 | ((cp >> 6) & 0x3f))) &&
		       buf_putc(P, (char)(0x80 | (cp & 0x3f)));
	return buf_putc(P, (char)(0xf0 | (cp >> 18))) &&
	       buf_putc(P, (char)(0x80 | ((cp >> 12) & 0x3f))) &&
	       buf_putc(P, (char)(0x80 | ((cp >> 6) & 0x3f))) &&
	       buf_putc(P, (char)(0x80 | (cp & 0x3f)));
}

/* At a backslash in a basic string: decodes one escape into the buffer. */
static int parse_escape(struct parser *P)
{
	struct gg_toml_pos pos = here(P);
	int c = at(P, 1);
	char out;
	size_t n, i;
	uint32_t cp = 0;

	switch (c) {
	case 'b': out = '\b'; break;
	case 't': out = '\t'; break;
	case 'n': out = '\n'; break;
	case 'f': out = '\f'; break;
	case 'r': out = '\r'; break;
	case '"': out = '"'; break;
	case '\\': out = '\\'; break;
	case 'u':
	case 'U':
		n = c == 'u' ? 4 : 8;
		for (i = 0; i < n; i++) {
			int h = hex_value(at(P, 2 + i));

			if (h < 0)
				return fail(P, pos, "invalid escape '\\%c': expected %zu hex digits",
					    c, n);
			cp = cp << 4 | (uint32_t)h;
		}
		if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return fail(P, pos, "invalid escape '\\%c%.*s': not a Unicode scalar value",
				    c, (int)n, P->p + 2);
		if (!put_utf8(P, cp))
			return oom(P);
		P->p += 2 + n;
		return 0;
	case -1:
		return fail(P, pos, "unterminated string");
	default:
		if (c >= 0x20 && c < 0x7f)
			return fail(P, pos, "invalid escape '\\%c' in string", c);
		return fail(P, pos, "invalid escape in string: backslash followed by %s",
			    found_at(P, P->p + 1).s);
	}
	if (!buf_putc(P, out))
		return oom(P);
	P->p += 2;
	return 0;
}

static int string_char_error(struct parser *P, struct gg_toml_pos start, bool multiline)
{
	int c = at(P, 0);

	if (c == -1)
		return fail(P, start, "unterminated %sstring", multiline ? "multi-line " : "");
	if (c == '\n' || (c == '\r' && at(P, 1) == '\n'))
		return fail(P, start, "unterminated string (use a multi-line string for line breaks)");
	return fail(P, here(P), "control character U+%04X must be escaped in string", (unsigned)c);
}

static int parse_basic(struct parser *P, struct gg_toml_pos start)
{
	int rc, c;

	for (P->p++;;) {
		c = at(P, 0);
		if (c == '"') {
			P->p++;
			return 0;
		}
		if (c == '\\') {
			rc = parse_escape(P);
			if (rc)
				return rc;
			continue;
		}
		if (c == -1 || is_ctrl(c))
			return string_char_error(P, start, false);
		if (!buf_putc(P, (char)c))
			return oom(P);
		P->p++;
	}
}

static int parse_literal(struct parser *P, struct gg_toml_pos start)
{
	int c;

	for (P->p++;;) {
		c = at(P, 0);
		if (c == '\'') {
			P->p++;
			return 0;
		}
		if (c == -1 || is_ctrl(c))
			return string_char_error(P, start, false);
		if (!buf_putc(P, (char)c))
			return oom(P);
		P->p++;
	}
}

/* At a quote inside a multi-line string: up to two quotes are content,
 * three end the string, and four or five are one or two quotes of content
 * followed by the delimiter. Returns 1 at the end of the string. */
static int ml_quotes(struct parser *P, char q)
{
	size_t n = 0, i;

	while (at(P, n) == q)
		n++;
	if (n > 5)
		return fail(P, here(P), "too many %s in a row in multi-line string",
			    q == '"' ? "quotation marks" : "apostrophes");
	for (i = 0; i < (n < 3 ? n : n - 3); i++) {
		if (!buf_putc(P, q))
			return oom(P);
	}
	P->p += n;
	return n >= 3;
}

/* A backslash followed only by whitespace up to the end of the line trims
 * that line break and all whitespace after it. Returns 1 if it was one. */
static int line_ending_backslash(struct parser *P)
{
	size_t i = 1;

	while (at(P, i) == ' ' || at(P, i) == '\t')
		i++;
	if (at(P, i) != '\n' && !(at(P, i) == '\r' && at(P, i + 1) == '\n'))
		return 0;
	P->p += i;
	for (;;) {
		skip_ws(P);
		if (!eat_newline(P))
			return 1;
	}
}

static int parse_ml(struct parser *P, struct gg_toml_pos start, char q)
{
	int rc, c;

	P->p += 3;
	eat_newline(P);
	for (;;) {
		c = at(P, 0);
		if (c == q) {
			rc = ml_quotes(P, q);
			if (rc)
				return rc < 0 ? rc : 0;
			continue;
		}
		if (c == '\\' && q == '"') {
			if (line_ending_backslash(P))
				continue;
			rc = parse_escape(P);
			if (rc)
				return rc;
			continue;
		}
		if (eat_newline(P)) {
			if (!buf_putc(P, '\n'))
				return oom(P);
			continue;
		}
		if (c == -1 || is_ctrl(c))
			return string_char_error(P, start, true);
		if (!buf_putc(P, (char)c))
			return oom(P);
		P->p++;
	}
}

/* At a quote: decodes any kind of string into the arena. */
static int parse_string(struct parser *P, bool is_key, const char **str, size_t *len)
{
	struct gg_toml_pos start = here(P);
	char q = *P->p;
	bool multiline = at(P, 1) == q && at(P, 2) == q;
	int rc;

	if (multiline && is_key)
		return fail(P, start, "multi-line strings cannot be used as keys");
	P->buf_len = 0;
	if (multiline)
		rc = parse_ml(P, start, q);
	else if (q == '"')
		rc = parse_basic(P, start);
	else
		rc = parse_literal(P, start);
	if (rc)
		return rc;
	*str = arena_strdup(&P->doc->arena, P->buf ? P->buf : "", P->buf_len);
	if (!*str)
		return oom(P);
	*len = P->buf_len;
	return 0;
}

/* ---- keys ------------------------------------------------------------- */

/* Reads a possibly dotted key into P->key. */
static int parse_key(struct parser *P)
{
	int rc, c;

	for (P->nkey = 0;; P->nkey++) {
		struct key_part *k;

		if (P->nkey == GG_TOML_MAX_DEPTH)
			return too_deep(P, here(P));
		k = &P->key[P->nkey];
		k->pos = here(P);
		c = at(P, 0);
		if (c == '"' || c == '\'') {
			rc = parse_string(P, true, &k->str, &k->len);
			if (rc)
				return rc;
		} else if (is_bare(c)) {
			const char *s = P->p;

			while (is_bare(at(P, 0)))
				P->p++;
			k->len = (size_t)(P->p - s);
			k->str = arena_strdup(&P->doc->arena, s, k->len);
			if (!k->str)
				return oom(P);
		} else {
			return fail(P, here(P), "expected a key%s, found %s",
				    P->nkey ? " after '.'" : "", found_at(P, P->p).s);
		}
		skip_ws(P);
		if (at(P, 0) != '.') {
			P->nkey++;
			return 0;
		}
		P->p++;
		skip_ws(P);
	}
}

/* ---- table bookkeeping ------------------------------------------------ */

static struct gg_toml_table *new_table(struct parser *P, unsigned depth, enum table_origin origin,
				       struct gg_toml_pos defined_at)
{
	struct gg_toml_table *t = arena_alloc(&P->doc->arena, sizeof(*t), _Alignof(struct gg_toml_table));

	if (!t)
		return NULL;
	memset(t, 0, sizeof(*t));
	t->seed = P->doc->seed;
	t->origin = (uint8_t)origin;
	t->depth = (uint8_t)depth;
	t->defined_at = defined_at;
	return t;
}

static struct gg_toml_array *new_array(struct parser *P, unsigned depth, bool of_tables)
{
	struct gg_toml_array *a = arena_alloc(&P->doc->arena, sizeof(*a), _Alignof(struct gg_toml_array));

	if (!a)
		return NULL;
	memset(a, 0, sizeof(*a));
	a->of_tables = of_tables;
	a->depth = (uint8_t)depth;
	return a;
}

/* Creates the sub-table for key part i of P->key under parent. */
static int add_subtable(struct parser *P, struct gg_toml_table *parent, unsigned i,
			enum table_origin origin, struct gg_toml_pos defined_at,
			struct gg_toml_table **out)
{
	const struct key_part *k = &P->key[i];
	struct gg_toml_value v = { .kind = GG_TOML_TABLE, .pos = defined_at };
	struct gg_toml_table *t;

	if (parent->depth >= GG_TOML_MAX_DEPTH)
		return too_deep(P, k->pos);
	t = new_table(P, parent->depth + 1u, origin, defined_at);
	if (!t)
		return oom(P);
	v.u.table = t;
	if (table_add(&P->doc->arena, parent, k->str, k->len, k->pos, &v))
		return oom(P);
	*out = t;
	return 0;
}

/* Appends a fresh table to an array of tables. */
static int add_aot_element(struct parser *P, struct gg_toml_array *arr, struct gg_toml_pos pos,
			   struct gg_toml_table **out)
{
	struct gg_toml_value v = { .kind = GG_TOML_TABLE, .pos = pos };
	struct gg_toml_table *t;

	if (arr->depth >= GG_TOML_MAX_DEPTH)
		return too_deep(P, pos);
	t = new_table(P, arr->depth + 1u, TABLE_HEADER, pos);
	if (!t)
		return oom(P);
	v.u.table = t;
	if (array_push(&P->doc->arena, arr, &v))
		return oom(P);
	*out = t;
	return 0;
}

static const char *a_kind(const struct gg_toml_value *v)
{
	switch (v->kind) {
	case GG_TOML_TABLE: return "a table";
	case GG_TOML_ARRAY: return array_of(v)->of_tables ? "an array of tables" : "an array";
	case GG_TOML_STRING: return "a string";
	case GG_TOML_INTEGER: return "an integer";
	case GG_TOML_FLOAT: return "a float";
	case GG_TOML_BOOL: return "a boolean";
	case GG_TOML_DATETIME: return "an offset date-time";
	case GG_TOML_LOCAL_DATETIME: return "a local date-time";
	case GG_TOML_LOCAL_DATE: return "a local date";
	case GG_TOML_LOCAL_TIME: return "a local time";
	}
	return "a value";
}

/* Message for a key that holds something other than a table. */
static int not_a_table(struct parser *P, struct gg_toml_pos pos, unsigned nparts,
		       const struct entry *e)
{
	const char *why = "";

	if (e->value.kind == GG_TOML_ARRAY)
		why = array_of(&e->value)->of_tables ? " (only [[headers]] can extend it)" :
		      " (static arrays cannot be extended)";
	return fail(P, pos, "key '%s' is already defined at %u:%u as %s%s",
		    key_name(P->key, nparts).s, (unsigned)e->key_pos.line,
		    (unsigned)e->key_pos.col, a_kind(&e->value), why);
}

/* One step along a [header] path: into tables that are not inline, and into
 * the latest element of an array of tables. */
static int header_descend(struct parser *P, struct gg_toml_table **t, unsigned i)
{
	const struct key_part *k = &P->key[i];
	struct entry *e = table_find(*t, k->str, k->len);
	struct gg_toml_table *sub;
	struct gg_toml_array *arr;

	if (!e)
		return add_subtable(P, *t, i, TABLE_IMPLICIT, k->pos, t);
	if (e->value.kind == GG_TOML_TABLE) {
		sub = table_of(&e->value);
		if (sub->origin == TABLE_INLINE)
			return fail(P, k->pos, "cannot extend table '%s' defined at %u:%u as an inline table",
				    key_name(P->key, i + 1).s, (unsigned)sub->defined_at.line,
				    (unsigned)sub->defined_at.col);
		*t = sub;
		return 0;
	}
	if (e->value.kind == GG_TOML_ARRAY && array_of(&e->value)->of_tables) {
		arr = array_of(&e->value);
		*t = table_of(&arr->items[arr->len - 1]);
		return 0;
	}
	return not_a_table(P, k->pos, i + 1, e);
}

/* One step along a dotted key in a key/value pair. */
static int dotted_descend(struct parser *P, struct gg_toml_table **t, unsigned i)
{
	const struct key_part *k = &P->key[i];
	struct entry *e = table_find(*t, k->str, k->len);
	struct gg_toml_table *sub;

	if (!e)
		return add_subtable(P, *t, i, TABLE_DOTTED, k->pos, t);
	if (e->value.kind != GG_TOML_TABLE)
		return not_a_table(P, k->pos, i + 1, e);
	sub = table_of(&e->value);
	switch (sub->origin) {
	case TABLE_IMPLICIT:
		/* Adding to it defines it; a [header] for it is now a redefinition. */
		sub->origin = TABLE_DOTTED;
		sub->defined_at = k->pos;
		break;
	case TABLE_DOTTED:
		break;
	case TABLE_HEADER:
		return fail(P, k->pos, "cannot add to table '%s' with dotted keys: it is defined by a header at %u:%u",
			    key_name(P->key, i + 1).s, (unsigned)sub->defined_at.line,
			    (unsigned)sub->defined_at.col);
	default:
		return fail(P, k->pos, "cannot extend table '%s' defined at %u:%u as an inline table",
			    key_name(P->key, i + 1).s, (unsigned)sub->defined_at.line,
			    (unsigned)sub->defined_at.col);
	}
	*t = sub;
	return 0;
}

static int define_table(struct parser *P, struct gg_toml_table *parent, struct gg_toml_pos start)
{
	unsigned last = P->nkey - 1;
	const struct key_part *k = &P->key[last];
	struct entry *e = table_find(parent, k->str, k->len);
	struct gg_toml_table *t;

	if (!e)
		return add_subtable(P, parent, last, TABLE_HEADER, start, &P->cur);
	if (e->value.kind != GG_TOML_TABLE)
		return not_a_table(P, start, P->nkey, e);
	t = table_of(&e->value);
	if (t->origin != TABLE_IMPLICIT)
		return fail(P, start, "table '%s' already defined at %u:%u%s",
			    key_name(P->key, P->nkey).s, (unsigned)t->defined_at.line,
			    (unsigned)t->defined_at.col, origin_note(t));
	t->origin = TABLE_HEADER;
	t->defined_at = start;
	P->cur = t;
	return 0;
}

static int define_aot_element(struct parser *P, struct gg_toml_table *parent,
			      struct gg_toml_pos start)
{
	unsigned last = P->nkey - 1;
	const struct key_part *k = &P->key[last];
	struct entry *e = table_find(parent, k->str, k->len);
	struct gg_toml_value v = { .kind = GG_TOML_ARRAY, .pos = start };
	struct gg_toml_array *arr;

	if (e && e->value.kind == GG_TOML_ARRAY && array_of(&e->value)->of_tables)
		return add_aot_element(P, array_of(&e->value), start, &P->cur);
	if (e && e->value.kind == GG_TOML_TABLE) {
		const struct gg_toml_table *t = table_of(&e->value);

		return fail(P, start, "table '%s' already defined at %u:%u%s; it cannot become an array of tables",
			    key_name(P->key, P->nkey).s, (unsigned)t->defined_at.line,
			    (unsigned)t->defined_at.col, origin_note(t));
	}
	if (e)
		return not_a_table(P, start, P->nkey, e);
	if (parent->depth >= GG_TOML_MAX_DEPTH)
		return too_deep(P, k->pos);
	arr = new_array(P, parent->depth + 1u, true);
	if (!arr)
		return oom(P);
	v.u.array = arr;
	if (table_add(&P->doc->arena, parent, k->str, k->len, k->pos, &v))
		return oom(P);
	return add_aot_element(P, arr, start, &P->cur);
}

/* At '[': a [table] or [[array of tables]] header. */
static int parse_header(struct parser *P)
{
	struct gg_toml_pos start = here(P);
	bool aot = at(P, 1) == '[';
	struct gg_toml_table *t = &P->doc->root;
	unsigned i;
	int rc;

	P->p += aot ? 2 : 1;
	skip_ws(P);
	rc = parse_key(P);
	if (rc)
		return rc;
	skip_ws(P);
	if (aot) {
		if (at(P, 0) != ']' || at(P, 1) != ']')
			return fail(P, here(P), "expected ']]' to close array of tables header, found %s",
				    found_at(P, P->p).s);
		P->p += 2;
	} else {
		if (at(P, 0) != ']')
			return fail(P, here(P), "expected ']' to close table header, found %s",
				    found_at(P, P->p).s);
		P->p++;
	}
	for (i = 0; i + 1 < P->nkey; i++) {
		rc = header_descend(P, &t, i);
		if (rc)
			return rc;
	}
	return aot ? define_aot_element(P, t, start) : define_table(P, t, start);
}

/* ---- values ----------------------------------------------------------- */

static int parse_value(struct parser *P, unsigned depth, struct gg_toml_value *v);

/* Extent of a malformed scalar starting at s, for the message. */
static int scalar_len(const struct parser *P, const char *s)
{
	const char *e = s;

	while (e < P->end && e - s < 40 && is_scalar_char((unsigned char)*e))
		e++;
	return (int)(e - s);
}

static int bad_value(struct parser *P)
{
	if (is_bare(at(P, 0)))
		return fail(P, here(P), "invalid value '%.*s'%s", scalar_len(P, P->p), P->p,
			    is_alpha(at(P, 0)) ? " (strings must be quoted)" : "");
	return fail(P, here(P), "expected a value, found %s", found_at(P, P->p).s);
}

static int bad_number(struct parser *P, const char *s, const char *why)
{
	int len = scalar_len(P, s);

	/* Digits and then a unit ("1MiB", "500ms") are meant as a string. */
	if (!why && len && is_digit((unsigned char)s[0]) && is_alpha((unsigned char)s[len - 1]))
		return fail(P, pos_at(P, s), "invalid number '%.*s' (strings must be quoted: \"%.*s\")", len, s,
			    len, s);
	return fail(P, pos_at(P, s), "invalid number '%.*s'%s%s", len, s, why ? ": " : "", why ? why : "");
}

static int parse_bool(struct parser *P, struct gg_toml_value *v)
{
	size_t n = at(P, 0) == 't' ? 4 : 5;

	if ((size_t)(P->end - P->p) < n || memcmp(P->p, n == 4 ? "true" : "false", n) != 0 ||
	    is_scalar_char(at(P, n)))
		return bad_value(P);
	v->kind = GG_TOML_BOOL;
	v->u.boolean = n == 4;
	P->p += n;
	return 0;
}

static int digit_value(int c, int base)
{
	int d = hex_value(c);

	return d >= 0 && d < base ? d : -1;
}

/* Digits with single underscores between them; returns where they stop,
 * or NULL if s does not start with a digit. */
static const char *scan_digits(const char *s, const char *end, int base)
{
	if (s == end || digit_value((unsigned char)*s, base) < 0)
		return NULL;
	for (s++; s < end; s++) {
		if (*s == '_' && end - s > 1 && digit_value((unsigned char)s[1], base) >= 0)
			s++;
		else if (digit_value((unsigned char)*s, base) < 0)
			break;
	}
	return s;
}

static int to_integer(struct parser *P, const char *tok, const char *s, const char *end,
		      int base, bool neg, int64_t *out)
{
	uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
	uint64_t v = 0;

	for (; s < end; s++) {
		unsigned d;

		if (*s == '_')
			continue;
		d = (unsigned)digit_value((unsigned char)*s, base);
		if (v > (limit - d) / (unsigned)base)
			return fail(P, pos_at(P, tok), "integer out of range: TOML integers are 64-bit, "
				    "-9223372036854775808 to 9223372036854775807");
		v = v * (unsigned)base + d;
	}
	if (!neg)
		*out = (int64_t)v;
	else
		*out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
	return 0;
}

/* strtod with the underscores removed and '.' in the locale's spelling. */
static int to_float(struct parser *P, const char *tok, const char *end, double *out)
{
	const char *point = localeconv()->decimal_point;
	const char *s;
	char *stop;

	bool ok = true;

	P->buf_len = 0;
	for (s = tok; s < end && ok; s++) {
		if (*s == '.') {
			const char *d;

			for (d = point; *d && ok; d++)
				ok = buf_putc(P, *d);
		} else if (*s != '_') {
			ok = buf_putc(P, *s);
		}
	}
	if (!ok || !buf_putc(P, '\0'))
		return oom(P);
	*out = strtod(P->buf, &stop);
	if (*stop)
		return bad_number(P, tok, NULL);
	return 0;
}

/* Integers and floats, including inf and nan. */
static int parse_number(struct parser *P, struct gg_toml_value *v)
{
	const char *tok = P->p, *end = P->p, *s, *q;
	bool neg = false, sign = false, is_float = false;
	int base = 10, rc;

	while (end < P->end && is_scalar_char((unsigned char)*end))
		end++;
	s = tok;
	if (*s == '+' || *s == '-') {
		neg = *s == '-';
		sign = true;
		s++;
	}
	if (end - s == 3 && (memcmp(s, "inf", 3) == 0 || memcmp(s, "nan", 3) == 0)) {
		v->kind = GG_TOML_FLOAT;
		v->u.flt = s[0] == 'i' ? (neg ? -HUGE_VAL : HUGE_VAL) : (neg ? -NAN : NAN);
		P->p = end;
		return 0;
	}
	if (!sign && is_alpha((unsigned char)*s))
		return bad_value(P);
	if (end - s >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o' || s[1] == 'b')) {
		base = s[1] == 'x' ? 16 : s[1] == 'o' ? 8 : 2;
		if (sign)
			return bad_number(P, tok, "only decimal integers may have a sign");
		s += 2;
		q = scan_digits(s, end, base);
		if (!q)
			return bad_number(P, tok, s < end && *s == '_' ? "'_' must be between digits" :
					  "expected digits after the prefix");
	} else {
		q = scan_digits(s, end, 10);
		if (!q)
			return bad_number(P, tok, s < end && *s == '_' ? "'_' must be between digits" : NULL);
		if (*s == '0' && q - s > 1)
			return bad_number(P, tok, "leading zeros are not allowed");
		if (q < end && *q == '.') {
			is_float = true;
			q = scan_digits(q + 1, end, 10);
			if (!q)
				return bad_number(P, tok, "expected digits after '.'");
		}
		if (q < end && (*q == 'e' || *q == 'E')) {
			is_float = true;
			q++;
			if (q < end && (*q == '+' || *q == '-'))
				q++;
			q = scan_digits(q, end, 10);
			if (!q)
				return bad_number(P, tok, "expected digits in the exponent");
		}
	}
	if (q != end)
		return bad_number(P, tok, *q == '_' ? "'_' must be between digits" : NULL);
	if (is_float) {
		v->kind = GG_TOML_FLOAT;
		rc = to_float(P, tok, end, &v->u.flt);
	} else {
		v->kind = GG_TOML_INTEGER;
		rc = to_integer(P, tok, s, end, base, neg, &v->u.integer);
	}
	if (!rc)
		P->p = end;
	return rc;
}

static int two_digits(const char *s, const char *end)
{
	if (end - s < 2 || !is_digit((unsigned char)s[0]) || !is_digit((unsigned char)s[1]))
		return -1;
	return (s[0] - '0') * 10 + (s[1] - '0');
}

static bool looks_like_date(const struct parser *P)
{
	return is_digit(at(P, 0)) && is_digit(at(P, 1)) && is_digit(at(P, 2)) &&
	       is_digit(at(P, 3)) && at(P, 4) == '-';
}

static bool looks_like_time(const struct parser *P)
{
	return is_digit(at(P, 0)) && is_digit(at(P, 1)) && at(P, 2) == ':';
}

static int bad_datetime(struct parser *P, const char *s, const char *why)
{
	const char *e = s;

	while (e < P->end && e - s < 40 && (is_scalar_char((unsigned char)*e) ||
	       (*e == ' ' && e + 1 < P->end && is_digit((unsigned char)e[1]))))
		e++;
	return fail(P, pos_at(P, s), "invalid date-time '%.*s': %s", (int)(e - s), s, why);
}

static int days_in_month(int year, int month)
{
	static const unsigned char days[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;

	return month == 2 && leap ? 29 : days[month - 1];
}

/* RFC 3339 as TOML restricts it: dates, times (seconds required), both
 * joined by 'T', 't' or a space, and an optional offset. */
static int parse_datetime(struct parser *P, struct gg_toml_value *v)
{
	const char *s = P->p, *q = s, *end = P->end;
	struct gg_toml_datetime dt = { 0 };
	bool has_date = false, has_time = true;
	int a, b, c;

	if (looks_like_date(P)) {
		a = two_digits(q + 5, end);
		b = end - q > 7 && q[7] == '-' ? two_digits(q + 8, end) : -1;
		if (a < 0 || b < 0 || (end - q > 10 && is_digit((unsigned char)q[10])))
			return bad_datetime(P, s, "expected a date as YYYY-MM-DD");
		dt.year = (int16_t)((q[0] - '0') * 1000 + (q[1] - '0') * 100 + (q[2] - '0') * 10 +
				    (q[3] - '0'));
		if (a < 1 || a > 12)
			return bad_datetime(P, s, "month out of range");
		if (b < 1 || b > days_in_month(dt.year, a))
			return bad_datetime(P, s, "day out of range");
		dt.month = (uint8_t)a;
		dt.day = (uint8_t)b;
		has_date = true;
		q += 10;
		if (q < end && (*q == 'T' || *q == 't'))
			q++;
		else if (end - q > 1 && *q == ' ' && is_digit((unsigned char)q[1]))
			q++;
		else
			has_time = false;
	}
	if (has_time) {
		a = two_digits(q, end);
		b = end - q > 2 && q[2] == ':' ? two_digits(q + 3, end) : -1;
		c = end - q > 5 && q[5] == ':' ? two_digits(q + 6, end) : -1;
		if (a < 0 || b < 0 || c < 0)
			return bad_datetime(P, s, "expected a time as HH:MM:SS");
		if (a > 23)
			return bad_datetime(P, s, "hour out of range");
		if (b > 59)
			return bad_datetime(P, s, "minute out of range");
		if (c > 60) /* 60 is a leap second */
			return bad_datetime(P, s, "second out of range");
		dt.hour = (uint8_t)a;
		dt.minute = (uint8_t)b;
		dt.second = (uint8_t)c;
		q += 8;
		if (q < end && *q == '.') {
			uint32_t scale = 100000000;

			if (++q == end || !is_digit((unsigned char)*q))
				return bad_datetime(P, s, "expected digits after '.'");
			for (; q < end && is_digit((unsigned char)*q); q++) {
				dt.nanosecond += (uint32_t)(*q - '0') * scale;
				scale /= 10;
			}
		}
	}
	if (has_date && has_time) {
		v->kind = GG_TOML_LOCAL_DATETIME;
		if (q < end && (*q == 'Z' || *q == 'z')) {
			v->kind = GG_TOML_DATETIME;
			q++;
		} else if (q < end && (*q == '+' || *q == '-')) {
			a = two_digits(q + 1, end);
			b = end - q > 3 && q[3] == ':' ? two_digits(q + 4, end) : -1;
			if (a < 0 || b < 0)
				return bad_datetime(P, s, "expected an offset as Z, +HH:MM or -HH:MM");
			if (a > 23 || b > 59)
				return bad_datetime(P, s, "offset out of range");
			dt.offset_minutes = (int16_t)((*q == '-' ? -1 : 1) * (a * 60 + b));
			v->kind = GG_TOML_DATETIME;
			q += 6;
		}
	} else {
		v->kind = has_date ? GG_TOML_LOCAL_DATE : GG_TOML_LOCAL_TIME;
	}
	if (q < end && is_scalar_char((unsigned char)*q))
		return bad_datetime(P, s, "unexpected characters after it");
	v->u.dt = dt;
	P->p = q;
	return 0;
}

static int parse_array(struct parser *P, unsigned depth, struct gg_toml_value *v)
{
	struct gg_toml_pos start = here(P);
	struct gg_toml_array *arr;
	struct gg_toml_value item;
	int rc;

	if (depth > GG_TOML_MAX_DEPTH)
		return too_deep(P, start);
	arr = new_array(P, depth, false);
	if (!arr)
		return oom(P);
	v->kind = GG_TOML_ARRAY;
	v->u.array = arr;
	for (P->p++;;) {
		rc = skip_blank(P);
		if (rc)
			return rc;
		if (at(P, 0) == ']')
			break;
		if (at(P, 0) == -1)
			return fail(P, here(P), "expected ']' to close array opened at %u:%u, found end of input",
				    (unsigned)start.line, (unsigned)start.col);
		rc = parse_value(P, depth + 1, &item);
		if (rc)
			return rc;
		if (array_push(&P->doc->arena, arr, &item))
			return oom(P);
		rc = skip_blank(P);
		if (rc)
			return rc;
		if (at(P, 0) == ']')
			break;
		if (at(P, 0) != ',')
			return fail(P, here(P), "expected ',' or ']' after array element, found %s",
				    found_at(P, P->p).s);
		P->p++;
	}
	P->p++;
	return 0;
}

static int parse_keyval(struct parser *P, struct gg_toml_table *t);

static int parse_inline_table(struct parser *P, unsigned depth, struct gg_toml_value *v)
{
	struct gg_toml_pos start = here(P);
	struct gg_toml_table *t;
	int rc;

	if (depth > GG_TOML_MAX_DEPTH)
		return too_deep(P, start);
	t = new_table(P, depth, TABLE_INLINE, start);
	if (!t)
		return oom(P);
	v->kind = GG_TOML_TABLE;
	v->u.table = t;
	P->p++;
	skip_ws(P);
	if (at(P, 0) == '}') {
		P->p++;
		return 0;
	}
	for (;;) {
		rc = parse_keyval(P, t);
		if (rc)
			return rc;
		skip_ws(P);
		if (at(P, 0) == '}')
			break;
		if (at(P, 0) != ',')
			return fail(P, here(P), "expected ',' or '}' after inline table entry, found %s%s",
				    found_at(P, P->p).s,
				    at(P, 0) == '\n' || at(P, 0) == '\r' ?
				    " (inline tables must be on one line)" : "");
		P->p++;
		skip_ws(P);
		if (at(P, 0) == '}')
			return fail(P, here(P), "trailing comma not allowed in inline table");
	}
	P->p++;
	return 0;
}

/* `depth` is what an array or inline table here would have. */
static int parse_value(struct parser *P, unsigned depth, struct gg_toml_value *v)
{
	int c = at(P, 0);

	memset(v, 0, sizeof(*v));
	v->pos = here(P);
	switch (c) {
	case '"':
	case '\'':
		v->kind = GG_TOML_STRING;
		return parse_string(P, false, &v->u.str.ptr, &v->u.str.len);
	case '[':
		return parse_array(P, depth, v);
	case '{':
		return parse_inline_table(P, depth, v);
	case 't':
	case 'f':
		return parse_bool(P, v);
	}
	if (looks_like_date(P) || looks_like_time(P))
		return parse_datetime(P, v);
	if (is_digit(c) || c == '+' || c == '-' || c == 'i' || c == 'n')
		return parse_number(P, v);
	return bad_value(P);
}

/* key = value, into table t (the current section or an inline table). */
static int parse_keyval(struct parser *P, struct gg_toml_table *t)
{
	struct key_part last;
	struct gg_toml_value v;
	struct entry *e;
	unsigned i, nkey;
	int rc;

	rc = parse_key(P);
	if (rc)
		return rc;
	nkey = P->nkey;
	skip_ws(P);
	if (at(P, 0) != '=')
		return fail(P, here(P), "expected '=' after key '%s', found %s",
			    key_name(P->key, nkey).s, found_at(P, P->p).s);
	P->p++;
	skip_ws(P);
	for (i = 0; i + 1 < nkey; i++) {
		rc = dotted_descend(P, &t, i);
		if (rc)
			return rc;
	}
	last = P->key[nkey - 1];
	e = table_find(t, last.str, last.len);
	if (e)
		return fail(P, P->key[0].pos, "duplicate key '%s' (first defined at %u:%u)",
			    key_name(P->key, nkey).s, (unsigned)e->key_pos.line,
			    (unsigned)e->key_pos.col);
	rc = parse_value(P, t->depth + 1u, &v);
	if (rc)
		return rc;
	if (table_add(&P->doc->arena, t, last.str, last.len, last.pos, &v))
		return oom(P);
	return 0;
}

/* ---- document --------------------------------------------------------- */

static int check_utf8(struct parser *P)
{
	const unsigned char *s = (const unsigned char *)P->p;
	const unsigned char *end = (const unsigned char *)P->end;
	const char *bad;
	uint32_t cp;

	while (s < end) {
		size_t n;

		if (*s < 0x80) {
			s++;
			continue;
		}
		n = utf8_decode(s, end, &cp);
		if (!n)
			break;
		s += n;
	}
	if (s == end)
		return 0;
	/* Rare, so the position is found by rescanning. */
	bad = (const char *)s;
	for (; P->p < bad; P->p++) {
		if (*P->p == '\n') {
			P->line++;
			P->line_start = P->p + 1;
		}
	}
	return fail(P, here(P), "invalid UTF-8 (byte 0x%02X)", *s);
}

static int parse_document(struct parser *P)
{
	int rc;

	if (P->end - P->p >= 3 && memcmp(P->p, "\xef\xbb\xbf", 3) == 0)
		P->p += 3;
	for (;;) {
		skip_ws(P);
		if (at(P, 0) == -1)
			return 0;
		if (eat_newline(P))
			continue;
		if (at(P, 0) == '#') {
			rc = skip_comment(P);
		} else if (at(P, 0) == '[') {
			rc = parse_header(P);
			if (!rc)
				rc = end_of_line(P, "table header");
		} else {
			rc = parse_keyval(P, P->cur);
			if (!rc)
				rc = end_of_line(P, "value");
		}
		if (rc)
			return rc;
	}
}

int gg_toml_parse(const char *text, size_t len, const char *source,
		  struct gg_toml_doc **out, char *err, size_t err_size)
{
	static const char nothing[1];
	struct parser P = {
		.p = text ? text : nothing,
		.end = text ? text + len : nothing,
		.line = 1,
		.source = source ? source : "<input>",
		.err = err,
		.err_size = err_size,
	};
	struct gg_toml_doc *doc;
	int rc;

	/* The byte order mark (skipped by parse_document) is no column. */
	P.line_start = text && len >= 3 && !memcmp(P.p, "\xef\xbb\xbf", 3) ? P.p + 3 : P.p;
	if (out)
		*out = NULL;
	if (err && err_size)
		err[0] = '\0';
	if (!out || (!text && len))
		return fail(&P, here(&P), "invalid arguments");
	if (len > GG_TOML_MAX_INPUT_BYTES)
		return fail_rc(&P, here(&P), -E2BIG, "input is %zu bytes, more than the limit of %u",
			       len, (unsigned)GG_TOML_MAX_INPUT_BYTES);
	doc = calloc(1, sizeof(*doc));
	if (!doc)
		return oom(&P);
	seed_hash(doc);
	doc->root.seed = doc->seed;
	doc->root.origin = TABLE_HEADER;
	doc->root.defined_at = (struct gg_toml_pos){ 1, 1 };
	P.doc = doc;
	P.cur = &doc->root;
	rc = check_utf8(&P);
	if (!rc)
		rc = parse_document(&P);
	free(P.buf);
	if (rc) {
		gg_toml_free(doc);
		return rc;
	}
	*out = doc;
	return 0;
}

void gg_toml_free(struct gg_toml_doc *doc)
{
	if (!doc)
		return;
	arena_release(&doc->arena);
	free(doc);
}

/* ---- accessors -------------------------------------------------------- */

const struct gg_toml_table *gg_toml_root(const struct gg_toml_doc *doc)
{
	return &doc->root;
}

size_t gg_toml_table_count(const struct gg_toml_table *t)
{
	return t->count;
}

const char *gg_toml_table_key(const struct gg_toml_table *t, size_t i, size_t *len)
{
	if (i >= t->count)
		return NULL;
	if (len)
		*len = t->entries[i].key_len;
	return t->entries[i].key;
}

struct gg_toml_pos gg_toml_table_key_pos(const struct gg_toml_table *t, size_t i)
{
	if (i >= t->count)
		return (struct gg_toml_pos){ 0, 0 };
	return t->entries[i].key_pos;
}

const struct gg_toml_value *gg_toml_table_value(const struct gg_toml_table *t, size_t i)
{
	return i < t->count ? &t->entries[i].value : NULL;
}

const struct gg_toml_value *gg_toml_table_get(const struct gg_toml_table *t, const char *key)
{
	const struct entry *e = table_find(t, key, strlen(key));

	return e ? &e->value : NULL;
}

size_t gg_toml_array_len(const struct gg_toml_array *a)
{
	return a->len;
}

const struct gg_toml_value *gg_toml_array_at(const struct gg_toml_array *a, size_t i)
{
	return i < a->len ? &a->items[i] : NULL;
}

const char *gg_toml_kind_name(enum gg_toml_kind kind)
{
	switch (kind) {
	case GG_TOML_TABLE: return "table";
	case GG_TOML_ARRAY: return "array";
	case GG_TOML_STRING: return "string";
	case GG_TOML_INTEGER: return "integer";
	case GG_TOML_FLOAT: return "float";
	case GG_TOML_BOOL: return "boolean";
	case GG_TOML_DATETIME: return "offset date-time";
	case GG_TOML_LOCAL_DATETIME: return "local date-time";
	case GG_TOML_LOCAL_DATE: return "local date";
	case GG_TOML_LOCAL_TIME: return "local time";
	}
	return "unknown";
}
