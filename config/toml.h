/* TOML 1.0 parser: text -> immutable document tree.
 *
 * The whole document lives in one arena owned by struct gg_toml_doc; every
 * pointer handed out below stays valid until gg_toml_free(). Tables keep
 * their keys in document order. Parsing is iterative or depth-bounded
 * (GG_TOML_MAX_DEPTH), so no input can exhaust the stack, and lookups are
 * hashed, so no input makes parsing quadratic. */
#ifndef GG_TOML_H
#define GG_TOML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_TOML_MAX_DEPTH 64            /* nested arrays / inline tables / dotted keys */
#define GG_TOML_MAX_INPUT_BYTES (16u << 20)

enum gg_toml_kind {
	GG_TOML_TABLE,
	GG_TOML_ARRAY,
	GG_TOML_STRING,
	GG_TOML_INTEGER,
	GG_TOML_FLOAT,
	GG_TOML_BOOL,
	GG_TOML_DATETIME,       /* offset date-time: 1979-05-27T07:32:00Z */
	GG_TOML_LOCAL_DATETIME, /* 1979-05-27T07:32:00 */
	GG_TOML_LOCAL_DATE,     /* 1979-05-27 */
	GG_TOML_LOCAL_TIME,     /* 07:32:00 */
};

struct gg_toml_pos {
	uint32_t line; /* 1-based */
	uint32_t col;  /* 1-based, in characters (UTF-8 sequences) */
};

struct gg_toml_datetime {
	int16_t year;
	uint8_t month, day;          /* date part; zero for GG_TOML_LOCAL_TIME */
	uint8_t hour, minute, second; /* time part; zero for GG_TOML_LOCAL_DATE */
	uint32_t nanosecond;         /* fractional seconds, truncated past 9 digits */
	int16_t offset_minutes;      /* GG_TOML_DATETIME only; 0 for Z */
};

struct gg_toml_table;
struct gg_toml_array;
struct gg_toml_doc;

struct gg_toml_value {
	enum gg_toml_kind kind;
	struct gg_toml_pos pos; /* where the value starts */
	union {
		struct {
			const char *ptr; /* NUL-terminated; may also hold NUL (\u0000) */
			size_t len;
		} str;
		int64_t integer;
		double flt;
		bool boolean;
		struct gg_toml_datetime dt;
		const struct gg_toml_table *table;
		const struct gg_toml_array *array;
	} u;
};

/* Parses `len` bytes of `text` (need not be NUL-terminated). `source` names
 * the input in messages (a file name, or "<stdin>").
 * Returns 0 and sets *out (free with gg_toml_free), or a negative errno:
 * -EINVAL for invalid TOML, -E2BIG when the input exceeds
 * GG_TOML_MAX_INPUT_BYTES or GG_TOML_MAX_DEPTH, -ENOMEM. On failure *out is
 * NULL and `err` (if err_size > 0) holds one line
 * "source:line:col: message", the message saying what was expected or what
 * is wrong, e.g. "expected '=' after key 'port'", "duplicate key 'port'
 * (first defined at 3:1)". */
int gg_toml_parse(const char *text, size_t len, const char *source,
		  struct gg_toml_doc **out, char *err, size_t err_size);
void gg_toml_free(struct gg_toml_doc *doc);

const struct gg_toml_table *gg_toml_root(const struct gg_toml_doc *doc);

size_t gg_toml_table_count(const struct gg_toml_table *t);
/* i-th key in document order; *len gets its length (keys may hold NUL). */
const char *gg_toml_table_key(const struct gg_toml_table *t, size_t i, size_t *len);
struct gg_toml_pos gg_toml_table_key_pos(const struct gg_toml_table *t, size_t i);
const struct gg_toml_value *gg_toml_table_value(const struct gg_toml_table *t, size_t i);
/* NULL when absent. `key` is NUL-terminated. */
const struct gg_toml_value *gg_toml_table_get(const struct gg_toml_table *t, const char *key);

size_t gg_toml_array_len(const struct gg_toml_array *a);
const struct gg_toml_value *gg_toml_array_at(const struct gg_toml_array *a, size_t i);

/* "table", "array", "string", "integer", "float", "boolean",
 * "offset date-time", "local date-time", "local date", "local time". */
const char *gg_toml_kind_name(enum gg_toml_kind kind);

#endif
