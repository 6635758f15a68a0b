#include "http_server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "acceptor.h"
#include "net_addr.h"

enum { K_ACCEPT, K_RECV, K_SEND, K_CANCEL };

#define LINGER_US 1000000u      /* reading what a client still sends after its answer */
#define LINGER_MAX_BYTES 65536u /* ... and no more than this */
#define HEADER_MAX_BYTES 512u   /* an answer's status line and headers */

enum conn_state { H_FREE, H_READ, H_WRITE, H_LINGER, H_CLOSING };

struct http_conn {
	enum conn_state state;
	int fd;
	uint32_t index, gen;
	uint64_t deadline_us;
	bool recv_busy, send_busy, cancel_busy;
	char *in;              /* max_request_bytes: the request, then what lingers */
	size_t in_len;
	size_t lingered;
	char *out;             /* the answer */
	size_t out_len, out_sent;
};

struct gg_http_server {
	struct gg_http_options opts;
	char *path, *content_type;
	struct gg_loop *loop;
	struct sockaddr_storage addr;
	int listen_fd;
	struct gg_acceptor accept;
	bool stopping;
	unsigned cancels;      /* of the listener */
	struct http_conn *conns;
	struct gg_http_stats stats;
};

static uint64_t ud(const struct gg_http_server *s, unsigned kind, const struct http_conn *c)
{
	return gg_loop_ud(s->opts.kind_base + kind, c ? c->index : s->opts.max_conns, c ? c->gen : 0);
}

/* ---- parsing -------------------------------------------------------------- */

/* RFC 9110 token characters. */
static bool tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

static size_t token_len(const char *p, const char *end)
{
	const char *q = p;

	while (q < end && tchar((unsigned char)*q))
		q++;
	return (size_t)(q - p);
}

/* A header value: visible characters, spaces and tabs, and bytes above
 * 0x7f (obs-text); never a control character. */
static bool value_ok(const char *p, const char *end)
{
	for (; p < end; p++) {
		unsigned char c = (unsigned char)*p;
		if (c != '\t' && (c < 0x20 || c == 0x7f))
			return false;
	}
	return true;
}

/* The line that starts at p (inside head, which ends with CRLF CRLF):
 * its end, where the CRLF starts, or NULL for a bare CR or LF in it. */
static const char *line_end(const char *p, const char *end)
{
	for (; p + 1 < end; p++) {
		if (p[0] == '\r' && p[1] == '\n')
			return p;
		if (p[0] == '\r' || p[0] == '\n')
			return NULL;
	}
	return NULL;
}

/* Past the empty lines (CRLF) at p, which RFC 9112 (2.2) has a server pass
 * over before a request line. */
static const char *past_empty_lines(const char *p, const char *end)
{
	while (end - p >= 2 && p[0] == '\r' && p[1] == '\n')
		p += 2;
	return p;
}

/* A field's value without the spaces and tabs around it: [*p, *end). */
static void trim(const char **p, const char **end)
{
	while (*p < *end && (**p == ' ' || **p == '\t'))
		(*p)++;
	while (*end > *p && ((*end)[-1] == ' ' || (*end)[-1] == '\t'))
		(*end)--;
}

static bool hex_digit(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A Host value: uri-host [ ":" port ] (RFC 9112, 3.2; RFC 3986, 3.2.2):
 * an IP literal in brackets, or a reg-name (unreserved characters,
 * sub-delims, %XX), then a colon and digits or nothing. Empty is allowed. */
static bool host_ok(const char *p, const char *end)
{
	trim(&p, &end);
	if (p < end && *p == '[') {
		const char *close = memchr(p, ']', (size_t)(end - p));
		if (!close || close == p + 1)
			return false;
		for (const char *q = p + 1; q < close; q++)
			if (!hex_digit((unsigned char)*q) && !strchr(":.vV-_~!$&'()*+,;=", *q))
				return false;
		p = close + 1;
	} else {
		for (; p < end && *p != ':'; p++) {
			unsigned char c = (unsigned char)*p;
			if (c == '%') {
				if (end - p < 3 || !hex_digit((unsigned char)p[1]) || !hex_digit((unsigned char)p[2]))
					return false;
				p += 2;
			} else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
				     strchr("-._~!$&'()*+,;=", c))) {
				return false;
			}
		}
	}
	if (p == end)
		return true;
	if (*p++ != ':')
		return false;
	for (; p < end; p++)
		if (*p < '0' || *p > '9')
			return false;
	return true;
}

/* What the header fields say of a body, which this server never reads
 * but must not misjudge (RFC 9112, 6.3). */
struct framing {
	bool length_seen, length_bad, te_seen, te_chunked_last;
	unsigned te_chunked; /* how often chunked is applied: once at most */
	unsigned long long length;
};

static void content_length(struct framing *f, const char *p, const char *end)
{
	unsigned long long v = 0;

	trim(&p, &end);
	if (p == end || end - p > 18)
		f->length_bad = true;
	for (; p < end && !f->length_bad; p++) {
		if (*p < '0' || *p > '9')
			f->length_bad = true;
		else
			v = v * 10 + (unsigned)(*p - '0');
	}
	if (f->length_seen)
		f->length_bad = true; /* doubled, equal or not: as "1, 1" is */
	f->length_seen = true;
	f->length = v;
}

/* Transfer-Encoding: whether its last coding (of this field, which
 * follows those of earlier ones) is chunked. Empty list elements, and
 * fields with none, count for nothing (RFC 9110, 5.6.1). */
static void transfer_encoding(struct framing *f, const char *p, const char *end)
{
	while (p < end) {
		const char *comma = memchr(p, ',', (size_t)(end - p));
		const char *e = comma ? comma : end, *s = p;
		trim(&s, &e);
		if (s < e) {
			f->te_seen = true;
			f->te_chunked_last = e - s == 7 && !strncasecmp(s, "chunked", 7);
			f->te_chunked += f->te_chunked_last;
		}
		p = comma ? comma + 1 : end;
	}
}

int gg_http_check_request(const char *head, size_t len, const char *path, bool *head_only)
{
	const char *end = head + len, *p = past_empty_lines(head, end);

	*head_only = false;
	const char *eol = line_end(p, end);
	if (!eol)
		return 400;
	/* method SP request-target SP HTTP-version */
	size_t mlen = token_len(p, eol);
	if (!mlen || p + mlen >= eol || p[mlen] != ' ')
		return 400;
	const char *method = p;
	*head_only = mlen == 4 && !memcmp(method, "HEAD", 4); /* whatever the answer, it has no body */
	const char *target = p + mlen + 1, *tend = target;
	while (tend < eol && (unsigned char)*tend > 0x20 && *tend != 0x7f)
		tend++;
	if (tend == target || tend >= eol || *tend != ' ')
		return 400;
	const char *version = tend + 1;
	if (eol - version != 8 || memcmp(version, "HTTP/", 5) || version[5] < '0' || version[5] > '9' ||
	    version[6] != '.' || version[7] < '0' || version[7] > '9')
		return 400;
	if (version[5] != '1')
		return 505;
	bool http11 = version[7] >= '1';

	/* Header fields, up to the empty line. */
	unsigned hosts = 0;
	struct framing body = { 0 };
	for (p = eol + 2; p < end; p = eol + 2) {
		if (!(eol = line_end(p, end)))
			return 400;
		if (eol == p)
			break;
		size_t nlen = token_len(p, eol);
		if (!nlen || p[nlen] != ':' || !value_ok(p + nlen + 1, eol))
			return 400; /* no name, whitespace before the colon, a folded line, a control character */
		const char *value = p + nlen + 1;
		if (nlen == 4 && !strncasecmp(p, "host", 4)) {
			hosts++;
			if (!host_ok(value, eol))
				return 400;
		} else if (nlen == 14 && !strncasecmp(p, "content-length", 14)) {
			content_length(&body, value, eol);
		} else if (nlen == 17 && !strncasecmp(p, "transfer-encoding", 17)) {
			transfer_encoding(&body, value, eol);
		}
	}
	if (p >= end || eol + 2 != end)
		return 400; /* the head must end exactly with its empty line */
	if (hosts > 1 || (http11 && hosts == 0))
		return 400;
	/* A body whose length cannot be told: a bad or doubled length, or a
	 * transfer coding that does not end in chunked (or applies it twice),
	 * or both framings, or a transfer coding in HTTP/1.0, whose framing
	 * RFC 9112 (6.1) has taken as faulty. */
	if ((body.length_seen && (body.length_bad || body.te_seen)) ||
	    (body.te_seen && (!body.te_chunked_last || body.te_chunked > 1 || !http11)))
		return 400;

	/* asterisk-form is OPTIONS's alone, and authority-form CONNECT's:
	 * methods this server does not do */
	if (tend - target == 1 && *target == '*')
		return mlen == 7 && !memcmp(method, "OPTIONS", 7) ? 405 : 400;
	if (mlen == 7 && !memcmp(method, "CONNECT", 7))
		return 405;
	/* origin-form, or absolute-form (whose path is what counts) */
	if (tend - target > 7 && !strncasecmp(target, "http://", 7)) {
		const char *slash = memchr(target + 7, '/', (size_t)(tend - target - 7));
		target = slash ? slash : tend;
	} else if (*target != '/') {
		return 400;
	}
	const char *query = memchr(target, '?', (size_t)(tend - target));
	size_t plen = (size_t)((query ? query : tend) - target);
	if (plen != strlen(path) || memcmp(target, path, plen))
		return 404;
	if ((mlen == 3 && !memcmp(method, "GET", 3)) || *head_only)
		return 0;
	return 405;
}

/* ---- connections ---------------------------------------------------------- */

static void conn_settle(struct gg_http_server *s, struct http_conn *c)
{
	if (c->state != H_CLOSING || c->recv_busy || c->send_busy || c->cancel_busy)
		return;
	close(c->fd);
	free(c->out);
	c->out = NULL;
	c->fd = -1;
	c->state = H_FREE;
	c->gen = (c->gen + 1) & GG_LOOP_AUX_MAX;
	s->stats.conns--;
}

/* Closes the connection once the kernel is done with its buffers. */
static void conn_close(struct gg_http_server *s, struct http_conn *c)
{
	if (c->state == H_FREE)
		return;
	c->state = H_CLOSING;
	if ((c->recv_busy || c->send_busy) && !c->cancel_busy &&
	    gg_loop_cancel_fd(s->loop, c->fd, ud(s, K_CANCEL, c)) == 0)
		c->cancel_busy = true;
	conn_settle(s, c);
}

static void arm_recv(struct gg_http_server *s, struct http_conn *c)
{
	char *dst = c->state == H_READ ? c->in + c->in_len : c->in;
	size_t room = c->state == H_READ ? s->opts.max_request_bytes - c->in_len : s->opts.max_request_bytes;

	if (c->recv_busy)
		return;
	if (gg_loop_recv(s->loop, c->fd, dst, room, 0, ud(s, K_RECV, c))) {
		conn_close(s, c);
		return;
	}
	c->recv_busy = true;
}

static void arm_send(struct gg_http_server *s, struct http_conn *c)
{
	if (gg_loop_send(s->loop, c->fd, c->out + c->out_sent, c->out_len - c->out_sent, ud(s, K_SEND, c))) {
		conn_close(s, c);
		return;
	}
	c->send_busy = true;
}

static const char *reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 503: return "Service Unavailable";
	case 505: return "HTTP Version Not Supported";
	}
	return "Error";
}

/* Status line, headers and (unless head_only) the body, in one buffer;
 * NULL without memory. */
static char *answer_text(int status, const char *type, const char *body, size_t body_len, bool head_only,
			 size_t *len)
{
	struct gg_strbuf b;

	gg_strbuf_init(&b, HEADER_MAX_BYTES + body_len + 1);
	gg_strbuf_printf(&b, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
			 status, reason(status), type, body_len, status == 405 ? "Allow: GET, HEAD\r\n" : "");
	if (!head_only)
		gg_strbuf_add(&b, body, body_len);
	if (b.overflow) {
		gg_strbuf_free(&b);
		return NULL;
	}
	return gg_strbuf_take(&b, len);
}

/* The answer to a request that is not served, in words. */
static const char *error_body(const struct gg_http_server *s, int status, char *buf, size_t size)
{
	switch (status) {
	case 404:
		snprintf(buf, size, "not found: this endpoint serves %s only\n", s->path);
		break;
	case 405:
		snprintf(buf, size, "method not allowed: %s answers GET and HEAD only\n", s->path);
		break;
	case 408:
		snprintf(buf, size, "request timeout: the request did not arrive within %llu ms\n",
			 (unsigned long long)(s->opts.request_timeout_us / 1000));
		break;
	case 431:
		snprintf(buf, size, "request too large: request line and headers may take %zu bytes\n",
			 s->opts.max_request_bytes);
		break;
	case 500:
		snprintf(buf, size, "internal error: the page could not be made\n");
		break;
	case 505:
		snprintf(buf, size, "HTTP version not supported: speak HTTP/1.1 or HTTP/1.0\n");
		break;
	default:
		snprintf(buf, size, "bad request\n");
		break;
	}
	return buf;
}

/* Answers and moves on to writing; status 200 makes the page. */
/* Where the request so far starts, past empty lines before it. */
static size_t request_start(const struct http_conn *c)
{
	return (size_t)(past_empty_lines(c->in, c->in + c->in_len) - c->in);
}

/* The request so far names the method HEAD: its answer has no body. */
static bool starts_head(const struct http_conn *c)
{
	size_t lead = request_start(c);

	return c->in_len - lead >= 5 && !memcmp(c->in + lead, "HEAD ", 5);
}

static void respond(struct gg_http_server *s, struct http_conn *c, int status, bool head_only)
{
	struct gg_strbuf page;
	char small[256];
	const char *body = NULL;
	size_t body_len = 0;
	char *text;

	gg_strbuf_init(&page, s->opts.max_response_bytes);
	if (status == 200) {
		int rc = s->opts.render(s->opts.arg, &page);
		if (rc || page.overflow) {
			status = 500;
		} else {
			body = page.buf ? page.buf : "";
			body_len = page.len;
		}
	}
	if (status != 200) {
		body = error_body(s, status, small, sizeof(small));
		body_len = strlen(body);
	}
	text = answer_text(status, status == 200 ? s->content_type : "text/plain; charset=utf-8", body, body_len,
			   head_only, &c->out_len);
	gg_strbuf_free(&page);
	s->stats.requests++;
	if (!text) {
		conn_close(s, c);
		return;
	}
	c->out = text;
	c->out_sent = 0;
	c->state = H_WRITE;
	c->deadline_us = s->loop->now_us + s->opts.request_timeout_us;
	arm_send(s, c);
}

/* Whether the bytes from `from` on hold a line end that is not CRLF: a
 * bare LF, or a CR before anything but LF. Such a head never ends with
 * CRLF CRLF, and the parser would refuse it anyway. */
static bool bare_line_end(const char *in, size_t len, size_t from)
{
	for (size_t i = from; i < len; i++) {
		bool after_cr = i > 0 && in[i - 1] == '\r';
		if ((in[i] == '\n' && !after_cr) || (after_cr && in[i] != '\n'))
			return true;
	}
	return false;
}

/* The request so far: answered once its head is whole, too large or
 * broken by a line end that is not CRLF. */
static void on_request_bytes(struct gg_http_server *s, struct http_conn *c, size_t before)
{
	size_t from = before > 3 ? before - 3 : 0, lead = request_start(c);
	const char *blank = NULL;

	from = from > lead ? from : lead; /* empty lines before the request line end no head */

	for (size_t i = from; i + 4 <= c->in_len && !blank; i++)
		if (!memcmp(c->in + i, "\r\n\r\n", 4))
			blank = c->in + i;
	if (!blank && bare_line_end(c->in, c->in_len, before)) {
		respond(s, c, 400, starts_head(c));
	} else if (blank) {
		bool head_only;
		int st = gg_http_check_request(c->in, (size_t)(blank + 4 - c->in), s->path, &head_only);
		respond(s, c, st ? st : 200, head_only);
	} else if (c->in_len == s->opts.max_request_bytes) {
		respond(s, c, 431, starts_head(c));
	} else {
		arm_recv(s, c);
	}
}

static void on_recv(struct gg_http_server *s, struct http_conn *c, int res)
{
	c->recv_busy = false;
	switch (c->state) {
	case H_READ:
		if (res == 0 && c->in_len > request_start(c)) {
			respond(s, c, 400, starts_head(c)); /* cut short: the client ended its side */
			return;
		}
		if (res <= 0) {
			conn_close(s, c);
			return;
		}
		c->in_len += (size_t)res;
		on_request_bytes(s, c, c->in_len - (size_t)res);
		return;
	case H_LINGER:
		c->lingered += res > 0 ? (size_t)res : 0;
		if (res <= 0 || c->lingered > LINGER_MAX_BYTES)
			conn_close(s, c);
		else
			arm_recv(s, c);
		return;
	default:
		return; /* writing: LINGER reads again; closing: settled by the caller */
	}
}

static void on_send(struct gg_http_server *s, struct http_conn *c, int res)
{
	c->send_busy = false;
	if (c->state != H_WRITE)
		return;
	if (res <= 0) {
		conn_close(s, c);
		return;
	}
	c->out_sent += (size_t)res;
	if (c->out_sent < c->out_len) {
		arm_send(s, c);
		return;
	}
	free(c->out);
	c->out = NULL;
	shutdown(c->fd, SHUT_WR);
	c->state = H_LINGER;
	c->lingered = 0;
	c->deadline_us = s->loop->now_us + LINGER_US;
	arm_recv(s, c);
}

static void conn_new(struct gg_http_server *s, int fd)
{
	struct http_conn *c = NULL;

	for (unsigned i = 0; i < s->opts.max_conns && !c; i++)
		if (s->conns[i].state == H_FREE)
			c = &s->conns[i];
	if (!c) {
		char body[128];
		size_t len;
		snprintf(body, sizeof(body), "service unavailable: %u connections at once at most\n", s->opts.max_conns);
		char *text = answer_text(503, "text/plain; charset=utf-8", body, strlen(body), false, &len);
		/* A fresh socket's buffer is empty: this cannot block. What the
		 * client sent already is read, so that the close does not reset
		 * the connection under the answer. */
		if (text)
			(void)!send(fd, text, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		free(text);
		shutdown(fd, SHUT_WR);
		(void)!recv(fd, body, sizeof(body), MSG_DONTWAIT);
		close(fd);
		s->stats.refused++;
		return;
	}
	c->state = H_READ;
	c->fd = fd;
	c->in_len = 0;
	c->deadline_us = s->loop->now_us + s->opts.request_timeout_us;
	s->stats.conns++;
	arm_recv(s, c);
}

bool gg_http_server_on_cqe(struct gg_http_server *s, const struct io_uring_cqe *cqe)
{
	unsigned kind = gg_loop_ud_kind(cqe->user_data);
	uint32_t index = gg_loop_ud_index(cqe->user_data);

	if (kind < s->opts.kind_base || kind >= s->opts.kind_base + GG_HTTP_KINDS)
		return false;
	kind -= s->opts.kind_base;
	if (kind == K_ACCEPT) {
		int fd = gg_acceptor_on_cqe(&s->accept, cqe, s->stopping);
		if (fd >= 0 && s->stopping)
			close(fd);
		else if (fd >= 0)
			conn_new(s, fd);
		return true;
	}
	if (index == s->opts.max_conns) { /* the listener's cancel */
		s->cancels--;
		return true;
	}
	struct http_conn *c = index < s->opts.max_conns ? &s->conns[index] : NULL;
	if (!c || c->state == H_FREE || c->gen != gg_loop_ud_aux(cqe->user_data))
		return true;
	if (kind == K_RECV)
		on_recv(s, c, cqe->res);
	else if (kind == K_SEND)
		on_send(s, c, cqe->res);
	else
		c->cancel_busy = false;
	conn_settle(s, c);
	return true;
}

uint64_t gg_http_server_tick(struct gg_http_server *s, uint64_t now_us)
{
	uint64_t next = gg_acceptor_tick(&s->accept, now_us, s->stopping);

	for (unsigned i = 0; i < s->opts.max_conns; i++) {
		struct http_conn *c = &s->conns[i];
		if (c->state == H_FREE || c->state == H_CLOSING)
			continue;
		if (now_us >= c->deadline_us) {
			if (c->state == H_READ)
				respond(s, c, 408, starts_head(c));
			else
				conn_close(s, c);
		}
		if (c->state != H_FREE && c->state != H_CLOSING && (!next || c->deadline_us < next))
			next = c->deadline_us;
	}
	return next;
}

bool gg_http_server_stop(struct gg_http_server *s)
{
	s->stopping = true;
	for (unsigned i = 0; i < s->opts.max_conns; i++)
		conn_close(s, &s->conns[i]);
	if (s->accept.armed && !s->cancels &&
	    gg_loop_cancel_fd(s->loop, s->listen_fd, ud(s, K_CANCEL, NULL)) == 0)
		s->cancels++;
	if (s->listen_fd >= 0 && !s->accept.armed && !s->cancels) {
		close(s->listen_fd);
		s->listen_fd = -1;
	}
	return s->listen_fd < 0 && !s->stats.conns;
}

void gg_http_server_free(struct gg_http_server *s)
{
	if (!s)
		return;
	for (unsigned i = 0; s->conns && i < s->opts.max_conns; i++) {
		struct http_conn *c = &s->conns[i];
		if (c->state != H_FREE)
			close(c->fd);
		free(c->out);
		free(c->in);
	}
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	free(s->conns);
	free(s->path);
	free(s->content_type);
	free(s);
}

void gg_http_server_get_stats(const struct gg_http_server *s, struct gg_http_stats *out)
{
	*out = s->stats;
}

const char *gg_http_server_address(const struct gg_http_server *s, char *buf, size_t size)
{
	return s->listen_fd >= 0 ? gg_net_local_addr(s->listen_fd, buf, size)
				 : gg_net_addr_format((const struct sockaddr *)&s->addr, buf, size);
}

int gg_http_server_start(const struct gg_http_options *opts, struct gg_loop *loop, struct gg_http_server **out,
			 char *err, size_t err_size)
{
	char where[GG_NET_ADDR_TEXT_MAX];
	struct gg_http_server *s;

	*out = NULL;
	if (!opts->addr || opts->addr_len > sizeof(s->addr) || !opts->path || opts->path[0] != '/' ||
	    !opts->content_type || !opts->render || opts->max_conns < 1 || opts->max_conns > 1024 ||
	    opts->max_request_bytes < 256 || opts->max_request_bytes > 65536 || opts->max_response_bytes < 4096 ||
	    !opts->request_timeout_us || opts->kind_base < GG_OP_USER || opts->kind_base + GG_HTTP_KINDS > 256)
		return gg_errf(err, err_size, -EINVAL, "HTTP server: options out of range");
	if (!(s = calloc(1, sizeof(*s))))
		return gg_errf(err, err_size, -ENOMEM, "HTTP server: out of memory");
	s->opts = *opts;
	s->listen_fd = -1;
	s->loop = loop;
	memcpy(&s->addr, opts->addr, opts->addr_len);
	s->opts.addr = (const struct sockaddr *)&s->addr;
	s->path = strdup(opts->path);
	s->content_type = strdup(opts->content_type);
	s->conns = calloc(opts->max_conns, sizeof(*s->conns));
	bool ok = s->path && s->content_type && s->conns;
	for (unsigned i = 0; ok && i < opts->max_conns; i++) {
		s->conns[i] = (struct http_conn){ .fd = -1, .index = i, .in = malloc(opts->max_request_bytes) };
		ok = s->conns[i].in != NULL;
	}
	if (!ok) {
		gg_http_server_free(s);
		return gg_errf(err, err_size, -ENOMEM, "HTTP server: out of memory");
	}
	gg_net_addr_format(s->opts.addr, where, sizeof(where));
	int fd = gg_net_listen(s->opts.addr, opts->addr_len, (int)opts->max_conns * 2, 0);
	if (fd < 0) {
		gg_http_server_free(s);
		return gg_errf(err, err_size, fd, "cannot listen on %s: %s", where, strerror(-fd));
	}
	s->listen_fd = fd;
	s->accept = (struct gg_acceptor){ .loop = loop, .fd = fd, .ud = ud(s, K_ACCEPT, NULL) };
	if (gg_acceptor_arm(&s->accept)) {
		gg_http_server_free(s);
		return gg_errf(err, err_size, -EIO, "cannot queue accept on %s", where);
	}
	*out = s;
	return 0;
}
