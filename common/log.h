/* Structured logs: one line per event on stderr,
 *   ts=2026-12-02T10:00:00.123Z level=info event=peer_up site=b stream=0
 * The caller formats the key=value pairs after the event name. */
#ifndef GG_LOG_H
#define GG_LOG_H

#include <stdbool.h>
#include <stdint.h>

#include "gg_common.h"

/* GG_LOG_NONE is for gg_log_set_level() only: nothing is logged. */
enum gg_log_level { GG_LOG_DEBUG, GG_LOG_INFO, GG_LOG_WARN, GG_LOG_ERROR, GG_LOG_NONE };

/* Copies `len` bytes of src into dst as text safe inside a log value or an
 * error message: printable ASCII stays, a backslash or a double quote gets a
 * backslash, every other byte (control characters, ESC, non-ASCII) becomes
 * \xNN. dst is always terminated; the output is cut short, never overrun.
 * For strings a peer or a certificate chose. Returns dst. */
char *gg_escape(char *dst, size_t size, const char *src, size_t len);
/* The dst size gg_escape() needs for `len` bytes to come out whole. */
#define GG_ESCAPED_SIZE(len) (4 * (len) + 1)

/* Messages below `level` are dropped (default: info). */
void gg_log_set_level(enum gg_log_level level);
/* Where several gateways share one process (tests), each line may name the
 * one that wrote it: gateway threads tell their site's name (NULL for
 * none), and once tags are on, a line from such a thread ends in
 * " at=NAME". Off by default. */
void gg_log_set_thread_site(const char *name);
void gg_log_set_tags(bool on);
/* Any control character that reaches a line (a caller that forgot
 * gg_escape) is written as \xNN: one event is always one line. A line's
 * text past GG_LOG_LINE_MAX bytes (the time stamp, level and event
 * included) is left out, and the line then ends in " cut=N", N the bytes
 * left out (before \xNN escaping), ahead of " at=SITE": the cut never
 * splits an escape, and closes a quoted value it falls in (of text
 * escaped as gg_escape() does). A line so cut stays within PIPE_BUF (4096
 * bytes), which one write() keeps whole, unless control characters the
 * caller left in it grew it past that. */
#define GG_LOG_LINE_MAX 3968
GG_PRINTF(3, 4) void gg_log(enum gg_log_level level, const char *event, const char *fmt, ...);

/* Lines of one kind that others can cause at will (refused connections,
 * failed handshakes, a peer's aborts): at most `per_second` of them a
 * second. */
struct gg_log_limit {
	uint64_t window_end_us;
	unsigned lines; /* logged in the window */
	unsigned held;  /* left out, not told yet */
};
/* Whether a line may go out now (now_us: a monotonic clock); if not, it
 * counts in `held`. A second that held lines back lasts until they are
 * told (gg_log_limit_take()), so a line that goes out never follows
 * untold ones. */
bool gg_log_limit_now(struct gg_log_limit *l, uint64_t now_us, unsigned per_second);
/* For a tick: once the second in which lines were held back is over, how
 * many (`held`, then zeroed), for the caller to tell; else 0, and *next
 * lowered to when that second ends while lines are held. */
unsigned gg_log_limit_take(struct gg_log_limit *l, uint64_t now_us, uint64_t *next);
/* gg_log_limit_take(), told in one line at `level`,
 *   event=lines_unlogged of=EVENT ABOUT count=N
 * (`about`: the caller's key=value pairs, "" for none). Returns when to
 * call again: the second's end while lines are held, else UINT64_MAX. */
uint64_t gg_log_limit_flush(struct gg_log_limit *l, uint64_t now_us, enum gg_log_level level, const char *event,
			    const char *about);

#endif
