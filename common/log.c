#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static enum gg_log_level min_level = GG_LOG_INFO;

void gg_log_set_level(enum gg_log_level level)
{
	min_level = level;
}

void gg_log(enum gg_log_level level, const char *event, const char *fmt, ...)
{
	static const char *const names[] = { "debug", "info", "warn", "error" };
	char line[1024], ts[32];
	struct timespec now;
	struct tm tm;
	va_list ap;

	if (level < min_level)
		return;
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	int n = snprintf(line, sizeof(line), "ts=%s.%03ldZ level=%s event=%s ", ts, now.tv_nsec / 1000000,
			 names[level], event);
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One write per line keeps lines whole when several processes share stderr. */
	fprintf(stderr, "%s\n", line);
}
