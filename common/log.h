/* Structured logs: one line per event on stderr,
 *   ts=2026-12-02T10:00:00.123Z level=info event=peer_up site=b stream=0
 * The caller formats the key=value pairs after the event name. */
#ifndef GG_LOG_H
#define GG_LOG_H

#include "gg_common.h"

enum gg_log_level { GG_LOG_DEBUG, GG_LOG_INFO, GG_LOG_WARN, GG_LOG_ERROR };

/* Messages below `level` are dropped (default: info). */
void gg_log_set_level(enum gg_log_level level);
GG_PRINTF(3, 4) void gg_log(enum gg_log_level level, const char *event, const char *fmt, ...);

#endif
