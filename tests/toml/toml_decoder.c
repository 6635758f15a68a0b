/* toml-test decoder: TOML on stdin, toml-test's tagged JSON on stdout.
 * Exit 0 on success; on invalid TOML the message goes to stderr, exit 1.
 * With files as arguments it decodes each in turn, a line each on stdout
 * ("ok JSON" or "refused MESSAGE"): one process for many files, which
 * matters when each start costs a sanitizer's set-up. */
#include "toml.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_value(const struct gg_toml_value *v);

static void print_string(const char *s, size_t len)
{
	size_t i;

	putchar('"');
	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void print_tagged(const char *type, const char *value)
{
	printf("{\"type\":\"%s\",\"value\":\"%s\"}", type, value);
}

static void print_table(const struct gg_toml_table *t)
{
	size_t i, n = gg_toml_table_count(t);

	putchar('{');
	for (i = 0; i < n; i++) {
		size_t len;
		const char *key = gg_toml_table_key(t, i, &len);

		if (i)
			putchar(',');
		print_string(key, len);
		putchar(':');
		print_value(gg_toml_table_value(t, i));
	}
	putchar('}');
}

static void print_array(const struct gg_toml_array *a)
{
	size_t i, n = gg_toml_array_len(a);

	putchar('[');
	for (i = 0; i < n; i++) {
		if (i)
			putchar(',');
		print_value(gg_toml_array_at(a, i));
	}
	putchar(']');
}

/* RFC 3339 with 'T' and 'Z'; fractional seconds without trailing zeros. */
static void format_datetime(char *out, size_t size, const struct gg_toml_value *v)
{
	const struct gg_toml_datetime *dt = &v->u.dt;
	size_t n = 0;

	if (v->kind != GG_TOML_LOCAL_TIME)
		n += (size_t)snprintf(out + n, size - n, "%04d-%02u-%02u", dt->year,
				      (unsigned)dt->month, (unsigned)dt->day);
	if (v->kind == GG_TOML_LOCAL_DATE)
		return;
	if (v->kind != GG_TOML_LOCAL_TIME)
		out[n++] = 'T';
	n += (size_t)snprintf(out + n, size - n, "%02u:%02u:%02u", (unsigned)dt->hour,
			      (unsigned)dt->minute, (unsigned)dt->second);
	if (dt->nanosecond) {
		n += (size_t)snprintf(out + n, size - n, ".%09" PRIu32, dt->nanosecond);
		while (out[n - 1] == '0')
			out[--n] = '\0';
	}
	if (v->kind != GG_TOML_DATETIME)
		return;
	if (dt->offset_minutes == 0) {
		snprintf(out + n, size - n, "Z");
	} else {
		int off = dt->offset_minutes < 0 ? -dt->offset_minutes : dt->offset_minutes;

		snprintf(out + n, size - n, "%c%02d:%02d", dt->offset_minutes < 0 ? '-' : '+',
			 off / 60, off % 60);
	}
}

static void print_value(const struct gg_toml_value *v)
{
	char buf[64];

	switch (v->kind) {
	case GG_TOML_TABLE:
		print_table(v->u.table);
		break;
	case GG_TOML_ARRAY:
		print_array(v->u.array);
		break;
	case GG_TOML_STRING:
		printf("{\"type\":\"string\",\"value\":");
		print_string(v->u.str.ptr, v->u.str.len);
		putchar('}');
		break;
	case GG_TOML_INTEGER:
		snprintf(buf, sizeof(buf), "%" PRId64, v->u.integer);
		print_tagged("integer", buf);
		break;
	case GG_TOML_FLOAT:
		if (isnan(v->u.flt))
			snprintf(buf, sizeof(buf), "nan");
		else if (isinf(v->u.flt))
			snprintf(buf, sizeof(buf), "%sinf", v->u.flt < 0 ? "-" : "");
		else
			snprintf(buf, sizeof(buf), "%.17g", v->u.flt);
		print_tagged("float", buf);
		break;
	case GG_TOML_BOOL:
		print_tagged("bool", v->u.boolean ? "true" : "false");
		break;
	case GG_TOML_DATETIME:
		format_datetime(buf, sizeof(buf), v);
		print_tagged("datetime", buf);
		break;
	case GG_TOML_LOCAL_DATETIME:
		format_datetime(buf, sizeof(buf), v);
		print_tagged("datetime-local", buf);
		break;
	case GG_TOML_LOCAL_DATE:
		format_datetime(buf, sizeof(buf), v);
		print_tagged("date-local", buf);
		break;
	case GG_TOML_LOCAL_TIME:
		format_datetime(buf, sizeof(buf), v);
		print_tagged("time-local", buf);
		break;
	}
}

/* Reads all of f, up to one byte past the parser's limit (enough for it
 * to refuse the input). Returns the text (free it), or NULL. */
static char *read_all(FILE *f, size_t *out_len)
{
	size_t cap = 1 << 16, len = 0, max = (size_t)GG_TOML_MAX_INPUT_BYTES + 1;
	char *text = malloc(cap);

	if (!text)
		return NULL;
	for (;;) {
		char *grown;

		len += fread(text + len, 1, cap - len, f);
		if (len < cap || len == max)
			break;
		cap = cap * 2 < max ? cap * 2 : max;
		grown = realloc(text, cap);
		if (!grown) {
			free(text);
			return NULL;
		}
		text = grown;
	}
	if (ferror(f)) {
		free(text);
		return NULL;
	}
	*out_len = len;
	return text;
}

/* Parses text and prints what toml-test expects. Alone (stdin): the JSON
 * on stdout, or the message on stderr and 1. In a batch: a line "ok JSON"
 * or "refused MESSAGE" on stdout, flushed, so that a run cut short by a
 * sanitizer leaves whole lines. */
static int decode(const char *text, size_t len, const char *source, bool batch)
{
	char err[512];
	struct gg_toml_doc *doc;

	if (gg_toml_parse(text, len, source, &doc, err, sizeof(err))) {
		if (!batch) {
			fprintf(stderr, "%s\n", err);
			return 1;
		}
		for (char *c = err; *c; c++)
			if (*c == '\n' || *c == '\r')
				*c = ' ';
		printf("refused %s\n", err);
	} else {
		if (batch)
			fputs("ok ", stdout);
		print_table(gg_toml_root(doc)); /* control characters come escaped: one line */
		putchar('\n');
		gg_toml_free(doc);
	}
	return fflush(stdout) == 0 ? 0 : 2;
}

int main(int argc, char **argv)
{
	size_t len = 0;

	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		char *text = f ? read_all(f, &len) : NULL;

		if (f)
			fclose(f);
		if (!text) {
			fprintf(stderr, "toml_decoder: cannot read %s\n", argv[i]);
			return 2;
		}
		int rc = decode(text, len, argv[i], true);
		free(text);
		if (rc)
			return rc;
	}
	if (argc > 1)
		return 0;
	char *text = read_all(stdin, &len);
	if (!text) {
		fprintf(stderr, "toml_decoder: cannot read stdin\n");
		return 2;
	}
	int rc = decode(text, len, "<stdin>", false);
	free(text);
	return rc;
}
