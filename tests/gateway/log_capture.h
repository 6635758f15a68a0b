/* For the tests that read what the gateway's code logs: stderr into a
 * file for a while. Include after gg_check.h. */
#ifndef GG_LOG_CAPTURE_H
#define GG_LOG_CAPTURE_H

#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include "log.h"

/* The log lines at info and above, from capture_start() to capture_end(),
 * which sets the level back to error (the tests' own). */
struct capture {
	FILE *log;
	int saved;
};

static inline bool capture_start(struct capture *c)
{
	c->log = tmpfile();
	c->saved = dup(STDERR_FILENO);
	CHECK(c->log && c->saved >= 0, "cannot capture the log");
	if (!c->log || c->saved < 0) {
		if (c->log)
			fclose(c->log);
		if (c->saved >= 0)
			close(c->saved);
		return false;
	}
	fflush(stderr);
	if (dup2(fileno(c->log), STDERR_FILENO) < 0) {
		fclose(c->log);
		close(c->saved);
		return false;
	}
	gg_log_set_level(GG_LOG_INFO);
	return true;
}

/* Ends the capture and leaves what it holds in text (cut short to size). */
static inline void capture_end(struct capture *c, char *text, size_t size)
{
	gg_log_set_level(GG_LOG_ERROR);
	fflush(stderr);
	dup2(c->saved, STDERR_FILENO);
	close(c->saved);
	rewind(c->log);
	text[fread(text, 1, size - 1, c->log)] = '\0';
	fclose(c->log);
}

#endif
