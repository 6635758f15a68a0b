/* The metrics endpoint's request parser: what it serves, and every way a
 * request head can be malformed, cut short or padded, answered with the
 * status it deserves and never read past its end. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gg_check.h"
#include "http_server.h"

static const struct {
	const char *head;
	int status; /* 0: served */
	bool head_only;
} cases[] = {
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 0, false },
	{ "HEAD /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 0, true },
	{ "GET /metrics HTTP/1.0\r\n\r\n", 0, false },
	{ "GET /metrics?name[]=x HTTP/1.1\r\nhOsT:a\r\nAccept: */*\r\nX-Tab:\tv \r\n\r\n", 0, false },
	{ "GET http://gw:9464/metrics HTTP/1.1\r\nHost: gw\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nX-Utf8: \xc3\xa9\r\n\r\n", 0, false },
	/* The answer to HEAD has no body, whatever its status. */
	{ "HEAD /other HTTP/1.1\r\nHost: a\r\n\r\n", 404, true },
	{ "HEAD /metrics HTTP/1.1\r\n\r\n", 400, true },
	{ "HEAD /metrics HTTP/3.0\r\nHost: a\r\n\r\n", 505, true },
	{ "head /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 405, false },
	{ "GET /other HTTP/1.1\r\nHost: a\r\n\r\n", 404, false },
	{ "GET /metrics/ HTTP/1.1\r\nHost: a\r\n\r\n", 404, false },
	{ "GET /METRICS HTTP/1.1\r\nHost: a\r\n\r\n", 404, false },
	{ "GET http://gw HTTP/1.1\r\nHost: gw\r\n\r\n", 404, false },
	{ "POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n", 405, false },
	{ "get /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 405, false },
	{ "GET /metrics HTTP/2.0\r\nHost: a\r\n\r\n", 505, false },
	{ "GET /metrics HTTP/0.9\r\nHost: a\r\n\r\n", 505, false },
	/* A later minor version is served as the highest known (RFC 9110,
	 * 2.5): as HTTP/1.1, Host and all. */
	{ "GET /metrics HTTP/1.9\r\nHost: a\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.2\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\n\r\n", 400, false },                        /* no Host */
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nHOST: b\r\n\r\n", 400, false },  /* two */
	{ "GET /metrics HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost : a\r\n\r\n", 400, false },           /* space before the colon */
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\n\tfolded\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\n: empty name\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\x7f\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\rb\r\n\r\n", 400, false },          /* a bare CR */
	{ "GET /metrics HTTP/1.1\nHost: a\r\n\r\n", 400, false },               /* a bare LF */
	{ "GET  /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 400, false },
	{ "GET /metrics  HTTP/1.1\r\nHost: a\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1 \r\nHost: a\r\n\r\n", 400, false },
	{ "GET metrics HTTP/1.1\r\nHost: a\r\n\r\n", 400, false },
	{ "GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400, false },
	{ "GET /metrics\r\nHost: a\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.x\r\nHost: a\r\n\r\n", 400, false },
	{ "GET /metrics FTP/1.1\r\nHost: a\r\n\r\n", 400, false },
	{ "G(T /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 400, false },
	{ " GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 400, false },
	{ "\r\n\r\n", 400, false },
	{ "GET /met\x01rics HTTP/1.1\r\nHost: a\r\n\r\n", 400, false },
	/* Empty lines before the request line are passed over (RFC 9112, 2.2). */
	{ "\r\nGET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 0, false },
	{ "\r\n\r\n\r\nHEAD /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 0, true },
	/* asterisk-form: OPTIONS only, which is not served. */
	{ "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 405, false },
	{ "OPTIONS /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 405, false },
	/* Host: uri-host [":" port], or empty. */
	{ "GET /metrics HTTP/1.1\r\nHost: [::1]:9464\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: gw-a.example:9464 \r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost:\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a b\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a@b\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.0\r\nHost: a\"b\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a:b\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a:80x\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a:1:2\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: [::1\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: []\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: [::1]x\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: %zz\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a%2\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: gw%2Da:\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: 10.0.0.1:9464\r\n\r\n", 0, false },
	{ "CONNECT gw:9464 HTTP/1.1\r\nHost: gw:9464\r\n\r\n", 405, false },
	/* A body's length that cannot be told (RFC 9112, 6.3). */
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-length:5\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 1234567890123456789\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, \r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding:\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,\r\nContent-Length: 0\r\n\r\n", 0, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
	  false },
	{ "GET /metrics HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, false },
	{ "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400,
	  false },
};

int main(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t len = strlen(cases[i].head);
		bool head_only = !cases[i].head_only;
		/* An exact-size copy, so a read past the end is a sanitizer's find. */
		char *copy = malloc(len);
		memcpy(copy, cases[i].head, len);
		int st = gg_http_check_request(copy, len, "/metrics", &head_only);
		CHECK(st == cases[i].status, "case %zu: %d, expected %d", i, st, cases[i].status);
		CHECK(head_only == cases[i].head_only, "case %zu: head_only %d", i, head_only);
		/* Every cut of the head, and the head with a byte changed, is
		 * answered without a crash. */
		for (size_t cut = 0; cut < len; cut++) {
			char *part = malloc(cut ? cut : 1);
			memcpy(part, copy, cut);
			(void)gg_http_check_request(part, cut, "/metrics", &head_only);
			free(part);
		}
		for (size_t at = 0; at < len; at++) {
			for (int v = 0; v < 256; v += 37) {
				char saved = copy[at];
				copy[at] = (char)v;
				(void)gg_http_check_request(copy, len, "/metrics", &head_only);
				copy[at] = saved;
			}
		}
		free(copy);
	}
	if (!failures)
		printf("http request parser: ok\n");
	return failures ? 1 : 0;
}
