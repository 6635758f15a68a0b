#include "units.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

struct unit {
	const char *name;
	uint64_t mult;
};

static const struct unit size_units[] = {
	{ "B", 1 },
	{ "KiB", 1ull << 10 }, { "MiB", 1ull << 20 }, { "GiB", 1ull << 30 }, { "TiB", 1ull << 40 },
	{ "kB", 1000ull }, { "KB", 1000ull }, { "MB", 1000000ull }, { "GB", 1000000000ull },
	{ "TB", 1000000000000ull },
};

static const struct unit duration_units[] = {
	{ "us", 1 }, { "ms", 1000 }, { "s", 1000000 }, { "m", 60000000 }, { "h", 3600000000ull },
};

/* Blanks, as TOML has them: spaces and tabs. */
static bool blank(char c)
{
	return c == ' ' || c == '\t';
}

static int parse_number(const char **p, uint64_t *v)
{
	const char *s = *p;
	uint64_t n = 0;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	/* Digits, with single underscores between them: 1_000. */
	for (; isdigit((unsigned char)*s) || (*s == '_' && isdigit((unsigned char)s[1])); s++) {
		if (*s == '_')
			continue;
		if (n > (UINT64_MAX - 9) / 10)
			return -ERANGE;
		n = n * 10 + (uint64_t)(*s - '0');
	}
	*p = s;
	*v = n;
	return 0;
}

/* Why digits go on past a point or comma after a number (1.5, 1,024),
 * which units do not allow; NULL when they do not. */
static const char *digits_after_mark(const char *p, bool size)
{
	if ((*p != '.' && *p != ',') || !isdigit((unsigned char)p[1]))
		return NULL;
	if (*p == '.')
		return size ? "sizes are whole numbers: use a smaller unit, as in \"1536KiB\" for 1.5MiB"
			    : "durations are whole numbers: use a smaller unit, as in \"500ms\" for 0.5s, or parts, "
			      "as in \"1m30s\"";
	return size ? "no commas in sizes: group digits with underscores, as in \"1_024KiB\" (and a fraction "
		      "in a smaller unit, as in \"1536KiB\" for 1.5MiB)"
		    : "no commas in durations: a fraction goes in a smaller unit, as in \"500ms\" for 0.5s";
}

static const struct unit *match_unit(const char **p, const struct unit *units, size_t n)
{
	const struct unit *best = NULL;
	size_t best_len = 0;

	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(units[i].name);
		if (len > best_len && strncmp(*p, units[i].name, len) == 0) {
			best = &units[i];
			best_len = len;
		}
	}
	if (best)
		*p += best_len;
	return best;
}

int gg_parse_size(const char *text, uint64_t *bytes, const char **why)
{
	const char *p = text;
	uint64_t n;
	int rc;

	while (blank(*p))
		p++;
	rc = parse_number(&p, &n);
	if (rc) {
		*why = rc == -ERANGE ? "size too large" : "expected a size like \"4MiB\", \"64KiB\" or \"1500B\"";
		return rc;
	}
	while (blank(*p))
		p++;
	if (*p == '\0') {
		*bytes = n;
		return 0;
	}
	if (*p == '_') {
		*why = "underscores go one at a time between digits, as in \"1_024KiB\"";
		return -EINVAL;
	}
	if ((*why = digits_after_mark(p, true)))
		return -EINVAL;
	const struct unit *u = match_unit(&p, size_units, GG_ARRAY_LEN(size_units));
	while (u && blank(*p))
		p++;
	if (!u || *p != '\0') {
		*why = "unknown size unit (use B, KiB, MiB, GiB, TiB, kB or KB, MB, GB or TB)";
		return -EINVAL;
	}
	if (n > UINT64_MAX / u->mult) {
		*why = "size too large";
		return -ERANGE;
	}
	*bytes = n * u->mult;
	return 0;
}

int gg_parse_duration(const char *text, uint64_t *usec, const char **why)
{
	const char *p = text;
	uint64_t total = 0, last_mult = UINT64_MAX;
	int parts = 0;

	for (;;) {
		/* Blanks around each part, as sizes have around the unit. */
		while (blank(*p))
			p++;
		if (!*p)
			break;
		uint64_t n;
		int rc = parse_number(&p, &n);
		if (rc) {
			*why = rc == -ERANGE ? "duration too long"
					     : "expected a duration like \"500ms\", \"2s\" or \"1m30s\"";
			return rc;
		}
		if ((*why = digits_after_mark(p, false)))
			return -EINVAL;
		while (blank(*p))
			p++;
		const struct unit *u = match_unit(&p, duration_units, GG_ARRAY_LEN(duration_units));
		if (!u) {
			*why = "missing or unknown duration unit (use us, ms, s, m or h)";
			return -EINVAL;
		}
		if (u->mult >= last_mult) {
			*why = "units must go from the largest to the smallest, each once, as in \"1m30s\"";
			return -EINVAL;
		}
		last_mult = u->mult;
		if (n > (UINT64_MAX - total) / u->mult) {
			*why = "duration too long";
			return -ERANGE;
		}
		total += n * u->mult;
		parts++;
	}
	if (!parts) {
		*why = "expected a duration like \"500ms\", \"2s\" or \"1m30s\"";
		return -EINVAL;
	}
	*usec = total;
	return 0;
}

static char *format_exact(uint64_t v, const struct unit *units, size_t n, char *buf, size_t size)
{
	const struct unit *best = &units[0];

	for (size_t i = 0; i < n; i++)
		if (units[i].mult > best->mult && v % units[i].mult == 0 && v != 0)
			best = &units[i];
	snprintf(buf, size, "%llu%s", (unsigned long long)(v / best->mult), best->name);
	return buf;
}

char *gg_format_size(uint64_t bytes, char *buf, size_t size)
{
	char other[32];

	/* The binary units, which configs use for buffers, unless a decimal
	 * one is shorter: "1TB", not "976562500KiB". */
	format_exact(bytes, size_units, 5, buf, size);
	for (size_t i = 5; i < GG_ARRAY_LEN(size_units); i++)
		if (bytes && bytes % size_units[i].mult == 0) {
			snprintf(other, sizeof(other), "%llu%s", (unsigned long long)(bytes / size_units[i].mult),
				 size_units[i].name);
			if (strlen(other) < strlen(buf))
				snprintf(buf, size, "%s", other);
		}
	return buf;
}

char *gg_format_duration(uint64_t usec, char *buf, size_t size)
{
	/* Zero is a whole number of every unit, so none is the exact one: say
	 * it as people write it. */
	if (!usec) {
		snprintf(buf, size, "0s");
		return buf;
	}
	return format_exact(usec, duration_units, GG_ARRAY_LEN(duration_units), buf, size);
}

char *gg_format_elapsed(uint64_t usec, char *buf, size_t size)
{
	const uint64_t ms = usec / 1000, s = usec / 1000000, m = s / 60, h = m / 60;

	if (usec < 1000)
		snprintf(buf, size, "%lluus", (unsigned long long)usec);
	else if (ms < 1000)
		snprintf(buf, size, "%llums", (unsigned long long)ms);
	else if (s < 10)
		snprintf(buf, size, "%llu.%llus", (unsigned long long)s, (unsigned long long)(ms % 1000 / 100));
	else if (s < 60)
		snprintf(buf, size, "%llus", (unsigned long long)s);
	else if (m < 60 && s % 60 == 0)
		snprintf(buf, size, "%llum", (unsigned long long)m);
	else if (m < 60)
		snprintf(buf, size, "%llum%llus", (unsigned long long)m, (unsigned long long)(s % 60));
	else if (m % 60 == 0)
		snprintf(buf, size, "%lluh", (unsigned long long)h);
	else
		snprintf(buf, size, "%lluh%llum", (unsigned long long)h, (unsigned long long)(m % 60));
	return buf;
}
