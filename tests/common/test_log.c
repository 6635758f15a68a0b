/* Log lines and escaped peer strings: one event is one line whatever the
 * strings it carries, and gg_escape never overruns its buffer. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gg_check.h"
#include "log.h"

static void test_escape(void)
{
	char buf[64];
	const char forged[] = "a\nts=x level=error\x1b[31m\"q\"\\\xc3\xa9";

	gg_escape(buf, sizeof(buf), forged, sizeof(forged) - 1);
	CHECK(!strcmp(buf, "a\\x0ats=x level=error\\x1b[31m\\\"q\\\"\\\\\\xc3\\xa9"), "got %s", buf);

	/* Cut short at an escape's boundary, never inside one. */
	gg_escape(buf, 6, "ab\ncd", 5);
	CHECK(!strcmp(buf, "ab"), "got %s", buf);
	gg_escape(buf, 7, "ab\ncd", 5);
	CHECK(!strcmp(buf, "ab\\x0a"), "got %s", buf);
	memset(buf, 'z', sizeof(buf));
	gg_escape(buf, 1, "abc", 3);
	CHECK(buf[0] == '\0' && buf[1] == 'z', "wrote past a 1-byte buffer");
	/* Embedded NUL bytes are data, not the end. */
	gg_escape(buf, sizeof(buf), "a\0b", 3);
	CHECK(!strcmp(buf, "a\\x00b"), "got %s", buf);
}

/* What `emit` logs, as text; false (and a failure) when nothing came. */
static bool logged(void (*emit)(void), char *text, size_t size)
{
	char path[] = "/tmp/gg-test-log-XXXXXX";
	int fd = mkstemp(path), saved = dup(STDERR_FILENO);

	CHECK(fd >= 0 && saved >= 0, "cannot make a temporary file");
	if (fd < 0 || saved < 0)
		return false;
	fflush(stderr);
	dup2(fd, STDERR_FILENO);
	emit();
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	ssize_t n = pread(fd, text, size - 1, 0);
	close(fd);
	unlink(path);
	CHECK(n > 0, "nothing logged");
	if (n <= 0)
		return false;
	text[n] = '\0';
	return true;
}

static void emit_forged(void)
{
	gg_log(GG_LOG_WARN, "probe", "reason=\"%s\"", "x\nts=2026 level=error event=forged\x1b[0m\r");
	gg_log(GG_LOG_DEBUG, "dropped", "below the level");
}

static void test_log_line(void)
{
	char text[4096];

	if (!logged(emit_forged, text, sizeof(text)))
		return;
	CHECK(strchr(text, '\n') == text + strlen(text) - 1, "not exactly one line: %s", text);
	CHECK(!strchr(text, '\x1b') && !strchr(text, '\r'), "a control byte reached the log: %s", text);
	CHECK(strstr(text, " level=warn event=probe reason=\"x\\x0ats=2026 level=error event=forged\\x1b[0m\\x0d\"\n"),
	      "got %s", text);
}

static void emit_three(void)
{
	gg_log(GG_LOG_INFO, "one", "k=v");
	gg_log_set_tags(true);
	gg_log(GG_LOG_INFO, "two", "k=v");
	gg_log_set_thread_site(NULL);
	gg_log(GG_LOG_INFO, "three", "k=v");
	gg_log_set_tags(false);
}

/* A gateway thread's lines name its site only once tags are on. */
static void test_tags(void)
{
	char text[4096];

	gg_log_set_thread_site("site-b");
	if (!logged(emit_three, text, sizeof(text)))
		return;
	CHECK(strstr(text, " event=one k=v\n"), "a line tagged while tags are off: %s", text);
	CHECK(strstr(text, " event=two k=v at=site-b\n"), "no tag: %s", text);
	CHECK(strstr(text, " event=three k=v\n"), "a tag once the thread's site was cleared: %s", text);
}

static void emit_long(void)
{
	static char value[2 * GG_LOG_LINE_MAX], escapes[2 * GG_LOG_LINE_MAX];

	memset(value, 'v', sizeof(value) - 1);
	/* A value as gg_escape() writes one: \x0a after \x0a, four bytes each. */
	for (size_t i = 0; i + 4 < sizeof(escapes); i += 4)
		memcpy(escapes + i, "\\x0a", 4);
	gg_log_set_tags(true);
	gg_log(GG_LOG_INFO, "long", "name=%s", value);
	for (int shift = 0; shift < 4; shift++)
		gg_log(GG_LOG_INFO, "quoted", "%.*sname=\"%s\" after=1", shift, "xxx", escapes);
	gg_log(GG_LOG_INFO, "fits", "name=%.*s", 3800, value);
	gg_log_set_tags(false);
}

/* Splits text into its lines, in place; returns how many (at most max). */
static unsigned split_lines(char *text, char **lines, unsigned max)
{
	unsigned n = 0;

	for (char *p = text; *p && n < max; n++) {
		lines[n] = p;
		char *nl = strchr(p, '\n');
		if (!nl)
			return n + 1;
		*nl = '\0';
		p = nl + 1;
	}
	return n;
}

/* A line past GG_LOG_LINE_MAX is cut, says by how many bytes, and keeps
 * its site tag; the cut never splits an escape, and closes a quoted value
 * it falls in; a line that fits is whole. */
static void test_long_line(void)
{
	static char text[12 * GG_LOG_LINE_MAX];
	char *line[8];

	gg_log_set_thread_site("site-c");
	if (!logged(emit_long, text, sizeof(text)))
		return;
	gg_log_set_thread_site(NULL);
	unsigned n = split_lines(text, line, 8);
	CHECK(n == 6, "%u lines, not 6", n);
	if (n != 6)
		return;
	for (unsigned l = 0; l < 5; l++) {
		char *cut = strstr(line[l], " cut=");
		CHECK(cut && !strcmp(strstr(cut, " at="), " at=site-c"), "line %u: no cut mark before the tag: %.80s...",
		      l, line[l]);
		CHECK(strlen(line[l]) < 4096, "line %u is %zu bytes, past PIPE_BUF", l, strlen(line[l]));
	}
	char *cut = strstr(line[0], " cut=");
	if (cut) {
		size_t kept = (size_t)(cut - line[0]), shown = strtoul(cut + 5, NULL, 10);
		CHECK(kept == GG_LOG_LINE_MAX, "kept %zu bytes", kept);
		/* Everything but what was kept: the whole value, less its kept part. */
		size_t head = (size_t)(strstr(line[0], "name=") + 5 - line[0]);
		CHECK(shown == 2 * GG_LOG_LINE_MAX - 1 - (kept - head), "cut=%zu of a value of %d kept from %zu", shown,
		      2 * GG_LOG_LINE_MAX - 1, head);
	}
	/* Cut at each of the four places in an escape: only whole ones kept,
	 * then the value's closing quote, and the count of what is left out. */
	const size_t whole_value = (2 * GG_LOG_LINE_MAX - 1) / 4 * 4;
	for (unsigned l = 1; l <= 4; l++) {
		char *value = strstr(line[l], "name=\"");
		char *end = strstr(line[l], "\" cut=");
		CHECK(value && end, "line %u: no closed value before the cut: %.80s", l, line[l]);
		if (!value || !end)
			continue;
		value += 6;
		size_t len = (size_t)(end - value);
		bool whole = len % 4 == 0;
		for (size_t i = 0; whole && i < len; i += 4)
			whole = !memcmp(value + i, "\\x0a", 4);
		CHECK(whole, "line %u: a split escape: ...%.12s", l, end - GG_MIN(len, 12));
		size_t shown = strtoul(end + 6, NULL, 10);
		CHECK(shown == whole_value - len + strlen("\" after=1"), "line %u: cut=%zu, %zu of %zu kept", l, shown,
		      len, whole_value);
		CHECK((size_t)(end - line[l]) > GG_LOG_LINE_MAX - 4, "line %u: cut at %zu, long before %d", l,
		      (size_t)(end - line[l]), GG_LOG_LINE_MAX);
	}
	CHECK(!strstr(line[5], "cut=") && strstr(line[5], " at=site-c"), "a whole line marked: %.80s", line[5]);
	char *name = strstr(line[5], "name=");
	CHECK(name && strspn(name + 5, "v") == 3800, "the line that fits was not whole");
}

/* Three lines a second of a kind: 10 tried at t=0 log 3; the flush says
 * nothing before the second is over, then the 7 left out, once. And a
 * flood that comes before each flush: the second that held lines lasts
 * until the flush tells them, and the next starts after it. */
static struct gg_log_limit limit;
static uint64_t flush_next[3];
static unsigned limited_logged, flooded_logged;

static void emit_limited(void)
{
	for (unsigned i = 0; i < 10; i++)
		if (gg_log_limit_now(&limit, 5000000, 3)) {
			gg_log(GG_LOG_INFO, "refused", "n=%u", i);
			limited_logged++;
		}
	flush_next[0] = gg_log_limit_flush(&limit, 5999999, GG_LOG_WARN, "refused", "site=b");
	flush_next[1] = gg_log_limit_flush(&limit, 6000000, GG_LOG_WARN, "refused", "site=b");
	flush_next[2] = gg_log_limit_flush(&limit, 6000001, GG_LOG_WARN, "refused", "");
	/* Turns of a loop every half second, each with 10 lines and then the
	 * tick's flush, from t=7 s to t=10 s. */
	for (uint64_t t = 7000000; t <= 10000000; t += 500000) {
		for (unsigned i = 0; i < 10; i++)
			flooded_logged += gg_log_limit_now(&limit, t, 3);
		(void)gg_log_limit_flush(&limit, t, GG_LOG_WARN, "flooded", "");
	}
	(void)gg_log_limit_flush(&limit, 11000000, GG_LOG_WARN, "flooded", "");
}

static void test_limit(void)
{
	char text[4096];

	if (!logged(emit_limited, text, sizeof(text)))
		return;
	CHECK(limited_logged == 3 && strstr(text, " event=refused n=2\n") && !strstr(text, " n=3"),
	      "%u lines let out of 10 at 3 a second: %s", limited_logged, text);
	/* The second from 7 s holds 27 lines by its end at 8 s, told then; the
	 * next starts at 8.5 s and tells 27 at 9.5 s; the last, from 10 s,
	 * tells its 7 at the end: 9 logged and 61 told of 70. */
	const char *first = strstr(text, " event=lines_unlogged of=flooded count=27\n");
	CHECK(flooded_logged == 9 && first && strstr(first + 1, " event=lines_unlogged of=flooded count=27\n") &&
		      strstr(text, " event=lines_unlogged of=flooded count=7\n"),
	      "a flood before each flush: %u logged (not 9), and not told as 27, 27 and 7: %s", flooded_logged, text);
	CHECK(flush_next[0] == 6000000,
	      "a flush within the second said to come back at %llu, not at its end (6000000)",
	      (unsigned long long)flush_next[0]);
	CHECK(flush_next[1] == UINT64_MAX && flush_next[2] == UINT64_MAX, "flushes after the second: %llu %llu",
	      (unsigned long long)flush_next[1], (unsigned long long)flush_next[2]);
	static const char line[] = " level=warn event=lines_unlogged of=refused site=b count=7\n";
	const char *held = strstr(text, line);
	CHECK(held && !strstr(held + sizeof(line) - 1, "of=refused"), "not one line saying 7 were left out: %s", text);
	CHECK(limit.held == 0, "%u still held after the flush", limit.held);
}

int main(void)
{
	test_escape();
	test_log_line();
	test_tags();
	test_long_line();
	test_limit();
	if (!failures)
		printf("test_log: ok\n");
	return failures ? 1 : 0;
}
