/* libFuzzer target for the TOML parser: parse, then visit every value and
 * check the invariants the API promises. */
#include "toml.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Checks that a failure is a documented code with a one-line message. */
static void check_error(int rc, const char *err)
{
	const char *prefix = "fuzz:", *c;

	if (rc != -EINVAL && rc != -E2BIG && rc != -ENOMEM)
		abort();
	if (strncmp(err, prefix, strlen(prefix)) != 0 || strlen(err) < 10)
		abort();
	for (c = err; *c; c++) {
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			abort();
	}
}

static void check_pos(struct gg_toml_pos pos)
{
	if (pos.line == 0 || pos.col == 0)
		abort();
}

static size_t walk(const struct gg_toml_value *v, unsigned depth);

static size_t walk_table(const struct gg_toml_table *t, unsigned depth)
{
	size_t i, n = gg_toml_table_count(t), sum = 0;

	for (i = 0; i < n; i++) {
		size_t len;
		const char *key = gg_toml_table_key(t, i, &len);
		const struct gg_toml_value *v = gg_toml_table_value(t, i);

		if (!key || !v || key[len] != '\0')
			abort();
		check_pos(gg_toml_table_key_pos(t, i));
		/* Keys holding NUL cannot be looked up by C string. */
		if (strlen(key) == len && gg_toml_table_get(t, key) != v)
			abort();
		sum += len + walk(v, depth + 1);
	}
	if (gg_toml_table_value(t, n) || gg_toml_table_key(t, n, NULL))
		abort();
	return sum;
}

static size_t walk(const struct gg_toml_value *v, unsigned depth)
{
	size_t i, n, sum = strlen(gg_toml_kind_name(v->kind));

	if (depth > 2 * GG_TOML_MAX_DEPTH + 2)
		abort();
	check_pos(v->pos);
	switch (v->kind) {
	case GG_TOML_TABLE:
		sum += walk_table(v->u.table, depth);
		break;
	case GG_TOML_ARRAY:
		n = gg_toml_array_len(v->u.array);
		for (i = 0; i < n; i++)
			sum += walk(gg_toml_array_at(v->u.array, i), depth + 1);
		if (gg_toml_array_at(v->u.array, n))
			abort();
		break;
	case GG_TOML_STRING:
		if (v->u.str.ptr[v->u.str.len] != '\0')
			abort();
		for (i = 0; i < v->u.str.len; i++)
			sum += (unsigned char)v->u.str.ptr[i];
		break;
	case GG_TOML_INTEGER:
		sum += (size_t)v->u.integer;
		break;
	case GG_TOML_FLOAT:
		sum += v->u.flt > 0;
		break;
	case GG_TOML_BOOL:
		sum += v->u.boolean;
		break;
	case GG_TOML_DATETIME:
	case GG_TOML_LOCAL_DATETIME:
	case GG_TOML_LOCAL_DATE:
	case GG_TOML_LOCAL_TIME:
		if (v->u.dt.month > 12 || v->u.dt.day > 31 || v->u.dt.hour > 23 ||
		    v->u.dt.minute > 59 || v->u.dt.second > 60 ||
		    v->u.dt.nanosecond > 999999999u)
			abort();
		sum += v->u.dt.second;
		break;
	default:
		abort();
	}
	return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gg_toml_doc *doc;
	char err[256];
	volatile size_t sink;
	int rc;

	rc = gg_toml_parse((const char *)data, size, "fuzz", &doc, err, sizeof(err));
	if (rc) {
		if (doc)
			abort();
		check_error(rc, err);
		return 0;
	}
	sink = walk_table(gg_toml_root(doc), 0);
	(void)sink;
	gg_toml_free(doc);
	return 0;
}
