#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Set at start, and by tests while a node's threads log. */
static atomic_int min_level = GG_LOG_INFO;
static atomic_bool tags;
static _Thread_local char thread_site[64];

void gg_log_set_level(enum gg_log_level level)
{
	atomic_store_explicit(&min_level, (int)level, memory_order_relaxed);
}

void gg_log_set_thread_site(const char *name)
{
	snprintf(thread_site, sizeof(thread_site), "%s", name ? name : "");
}

void gg_log_set_tags(bool on)
{
	atomic_store(&tags, on);
}

char *gg_escape(char *dst, size_t size, const char *src, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = 0;

	if (!size)
		return dst;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)src[i];
		size_t need = c == '\\' || c == '"' ? 2 : c < 0x20 || c >= 0x7f ? 4 : 1;
		if (n + need >= size)
			break;
		if (need == 2) {
			dst[n++] = '\\';
			dst[n++] = (char)c;
		} else if (need == 4) {
			dst[n++] = '\\';
			dst[n++] = 'x';
			dst[n++] = hex[c >> 4];
			dst[n++] = hex[c & 15];
		} else {
			dst[n++] = (char)c;
		}
	}
	dst[n] = '\0';
	return dst;
}

/* Where to cut `len` bytes of a line's text: never inside an escape
 * (\\, \", \xNN) whose end was lost. Returns the bytes to keep, and in
 * *quoted whether they end inside a quoted value, which the caller closes
 * so that what follows reads as keys again. */
static size_t log_cut(const char *line, size_t len, bool *quoted_out)
{
	size_t keep = 0;
	bool quoted = false;

	for (size_t i = 0; i < len;) {
		size_t step = line[i] != '\\' ? 1 : i + 1 < len && line[i + 1] == 'x' ? 4 : 2;
		if (i + step > len)
			break;
		if (line[i] == '"')
			quoted = !quoted;
		i += step;
		keep = i;
	}
	*quoted_out = quoted;
	return keep;
}

void gg_log(enum gg_log_level level, const char *event, const char *fmt, ...)
{
	static const char *const names[] = { "debug", "info", "warn", "error" };
	/* Room for the '"', " cut=N" and " at=SITE" that may follow the text. */
	enum { TAIL = 32 + sizeof(thread_site) };
	char line[GG_LOG_LINE_MAX + 1 + TAIL], safe[4 * sizeof(line)], ts[32];
	struct timespec now;
	struct tm tm;
	va_list ap;

	if ((int)level < atomic_load_explicit(&min_level, memory_order_relaxed))
		return;
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	int n = snprintf(line, GG_LOG_LINE_MAX + 1, "ts=%s.%03ldZ level=%s event=%s ", ts, now.tv_nsec / 1000000,
			 names[level], event);
	int more = 0;
	va_start(ap, fmt);
	if (n > 0 && n < GG_LOG_LINE_MAX)
		more = vsnprintf(line + n, GG_LOG_LINE_MAX + 1 - (size_t)n, fmt, ap);
	va_end(ap);
	size_t len = strlen(line);
	/* A line too long is cut, and says by how much: a reader must not
	 * take a cut value for the whole one. */
	if (more > 0 && (size_t)n + (size_t)more > len) {
		const size_t whole = (size_t)n + (size_t)more;
		bool quoted;
		const size_t keep = log_cut(line, len, &quoted);
		len = keep + (size_t)snprintf(line + keep, sizeof(line) - keep, "%s cut=%zu", quoted ? "\"" : "",
					      whole - keep);
	}
	if (thread_site[0] && atomic_load_explicit(&tags, memory_order_relaxed))
		snprintf(line + len, sizeof(line) - len, " at=%s", thread_site);
	size_t o = 0;
	for (const char *p = line; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c < 0x20 || c == 0x7f)
			o += (size_t)snprintf(safe + o, sizeof(safe) - o, "\\x%02x", c);
		else
			safe[o++] = (char)c;
	}
	safe[o++] = '\n';
	/* One write per line keeps lines whole when several processes share
	 * stderr (stdio would split a line past its buffer). */
	for (size_t done = 0; done < o;) {
		ssize_t w = write(STDERR_FILENO, safe + done, o - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		done += (size_t)w;
	}
}

bool gg_log_limit_now(struct gg_log_limit *l, uint64_t now_us, unsigned per_second)
{
	/* A window that held lines back lasts until the flush said so: under
	 * a flood that comes before every tick, a new window would otherwise
	 * start each time and the flush never find one over. */
	if (now_us >= l->window_end_us && !l->held) {
		l->window_end_us = now_us + 1000000;
		l->lines = 0;
	}
	if (l->lines < per_second) {
		l->lines++;
		return true;
	}
	l->held++;
	return false;
}

unsigned gg_log_limit_take(struct gg_log_limit *l, uint64_t now_us, uint64_t *next)
{
	unsigned held = l->held;

	if (!held)
		return 0;
	if (now_us < l->window_end_us) {
		*next = GG_MIN(*next, l->window_end_us);
		return 0;
	}
	l->held = 0;
	return held;
}

uint64_t gg_log_limit_flush(struct gg_log_limit *l, uint64_t now_us, enum gg_log_level level, const char *event,
			    const char *about)
{
	uint64_t next = UINT64_MAX;
	unsigned held = gg_log_limit_take(l, now_us, &next);

	if (held)
		gg_log(level, "lines_unlogged", "of=%s%s%s count=%u", event, *about ? " " : "", about, held);
	return next;
}
