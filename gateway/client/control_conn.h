/* The client's side of a control connection: the gateway's socket from
 * an endpoint, a check that the process listening there may be trusted
 * with what the client sends, and one message at a time with a deadline.
 * Shared by the client library and `gradgate status`. */
#ifndef GG_CONTROL_CONN_H
#define GG_CONTROL_CONN_H

#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#include "control_proto.h"
#include "gg_common.h"

/* Fills `err` (may be NULL) with `code` and the message; returns code. */
GG_PRINTF(3, 4) int gg_ctrl_error(struct gg_error *err, int code, const char *fmt, ...);

/* CLOCK_MONOTONIC in milliseconds: what the deadlines below count in. */
uint64_t gg_ctrl_now_ms(void);

/* "unix:/absolute/path" into `addr`; NULL takes GRADGATE_ENDPOINT.
 * Returns 0 or GG_ERR_INVALID with err saying what is wrong. */
int gg_ctrl_parse_endpoint(const char *endpoint, struct sockaddr_un *addr, struct gg_error *err);

/* Connects (SOCK_SEQPACKET, non-blocking) and checks who listens: root,
 * this process's user, the owner of the socket's folder when nobody else
 * may write there or can have made it, or the user GRADGATE_GATEWAY_UID
 * names. Returns the descriptor, or a negative enum gg_errc with err:
 * GG_ERR_CONNECT when no gateway listens there or another user does. */
int gg_ctrl_connect(const struct sockaddr_un *addr, uint64_t deadline_ms, struct gg_error *err);

/* Sends one message (and at most one fd: -1 for none) before
 * `deadline_ms`. Returns 0 or a negative errno. */
int gg_ctrl_send(int fd, const void *msg, size_t len, int pass_fd, uint64_t deadline_ms);

/* Receives one message. Returns its length (above GG_CTRL_RECV_MAX when
 * it was longer), 0 at end of stream, -EAGAIN when none came before
 * `deadline_ms`, -EPROTO when it carried file descriptors (closed here),
 * or a negative errno. */
ssize_t gg_ctrl_recv(int fd, union gg_ctrl_msg *msg, uint64_t deadline_ms);

#endif
