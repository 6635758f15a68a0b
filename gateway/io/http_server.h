/* A small HTTP/1.1 server on an io_uring loop, for one read-only page
 * (the metrics endpoint): GET and HEAD of one path, one request per
 * connection, closed after the answer.
 *
 * It is an open port, so everything is bounded: connections at once (more
 * are answered 503 and closed), the request's size (431 past it), the time
 * the request may take to arrive (408) and the answer to leave, and the
 * answer's size. Requests are parsed strictly: a malformed request line or
 * header is answered 400, a method other than GET or HEAD 405, another
 * path 404, another HTTP version 505. A body is never read; after the
 * answer the server stops sending and reads what the client still sends,
 * for a short while, so that closing does not reset the connection under
 * an answer the client has not read yet.
 *
 * It runs on the loop of the thread that calls gg_http_server_start():
 * completions of its kinds go to gg_http_server_on_cqe(), and
 * gg_http_server_tick() fires its deadlines. */
#ifndef GG_HTTP_SERVER_H
#define GG_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "gg_common.h"
#include "strbuf.h"
#include "uring_loop.h"

#define GG_HTTP_KINDS 4u /* user_data kinds used from kind_base on */
#define GG_HTTP_ERROR_MAX 256

struct gg_http_options {
	const struct sockaddr *addr; /* where to listen; copied */
	socklen_t addr_len;
	const char *path;            /* the one path served, "/metrics"; copied */
	const char *content_type;    /* of its answers; copied */
	/* Writes the page into `out` (bounded by max_response_bytes); returns
	 * 0, or a negative errno for a 500 answer. Runs on the loop's thread. */
	int (*render)(void *arg, struct gg_strbuf *out);
	void *arg;
	unsigned max_conns;          /* connections at once, 1..1024 */
	size_t max_request_bytes;    /* request line and headers, 256..65536 */
	size_t max_response_bytes;   /* the page, at least 4096 */
	uint64_t request_timeout_us; /* for the request to arrive, and again for the answer to leave */
	unsigned kind_base;          /* >= GG_OP_USER; kinds kind_base..+GG_HTTP_KINDS-1 */
};

struct gg_http_stats {
	uint64_t requests;    /* answered, whatever the status */
	uint64_t refused;     /* connections over max_conns, answered 503 */
	unsigned conns;       /* open now */
};

struct gg_http_server;

/* Listens and starts accepting on `loop`. Returns 0 with *out, or a
 * negative errno with `err` saying why (an address in use, say). */
GG_MUST_CHECK int gg_http_server_start(const struct gg_http_options *opts, struct gg_loop *loop,
				       struct gg_http_server **out, char *err, size_t err_size);
/* The address it listens on ("127.0.0.1:9464"). */
const char *gg_http_server_address(const struct gg_http_server *s, char *buf, size_t size);
/* Handles a completion of its kinds; false for any other kind. */
bool gg_http_server_on_cqe(struct gg_http_server *s, const struct io_uring_cqe *cqe);
/* Fires deadlines due at now_us; returns the next one (0: none). */
uint64_t gg_http_server_tick(struct gg_http_server *s, uint64_t now_us);
/* Stops accepting and closes every connection (idempotent); true once
 * nothing is in flight, when gg_http_server_free() may be called. */
bool gg_http_server_stop(struct gg_http_server *s);
/* Frees it: after gg_http_server_stop() returned true, or when its loop
 * is torn down with it. NULL is allowed. */
void gg_http_server_free(struct gg_http_server *s);
void gg_http_server_get_stats(const struct gg_http_server *s, struct gg_http_stats *out);

/* Tests: parses one request's head (up to and including its empty line),
 * as the server does. Returns the status it would answer when the request
 * is not served (400, 405, 404, 505), or 0; *head_only says the method is
 * HEAD, whose answer, whatever its status, has no body. */
int gg_http_check_request(const char *head, size_t len, const char *path, bool *head_only);

#endif
