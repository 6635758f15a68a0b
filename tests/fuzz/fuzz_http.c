/* libFuzzer target: the metrics endpoint's request parser
 * (gg_http_check_request()) on any bytes, given as the server gives them
 * (the head up to its first empty line, in a buffer of that size, so that
 * a read past it is caught) and whole. Beyond "no crash, no read past the
 * end": the answer is one of the statuses the server sends, the same
 * every time; HEAD is told only of a request line that starts with it;
 * what is served is a GET or HEAD of the path, in HTTP/1.x, with a head
 * that ends in its empty line; and the path decides between served and
 * 404, nothing else. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, int st)
{
	fprintf(stderr, "http: %s (status %d)\n", what, st);
	abort();
}

static void check(const char *head, size_t len)
{
	bool head_only, again_only;
	int st = gg_http_check_request(head, len, "/metrics", &head_only);

	if (st != 0 && st != 400 && st != 404 && st != 405 && st != 505)
		fail("a status the server does not send", st);
	if (gg_http_check_request(head, len, "/metrics", &again_only) != st || again_only != head_only)
		fail("a second look answered otherwise", st);
	size_t skip = 0;
	while (skip + 1 < len && head[skip] == '\r' && head[skip + 1] == '\n')
		skip += 2;
	const char *line = head + skip;
	if (head_only && (len - skip < 5 || memcmp(line, "HEAD ", 5)))
		fail("HEAD told of a request line that does not start with it", st);
	if (st != 0)
		return;
	if (!head_only && (len - skip < 4 || memcmp(line, "GET ", 4)))
		fail("served a method other than GET and HEAD", st);
	const char *eol = memchr(line, '\r', len - skip);
	if (!eol || eol - line < 9 || memcmp(eol - 8, "HTTP/1.", 7))
		fail("served a request line that does not end in HTTP/1.x", st);
	if (len < 4 || memcmp(head + len - 4, "\r\n\r\n", 4))
		fail("served a head that does not end with its empty line", st);
	for (size_t i = 0; i < len; i++)
		if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r'))
			fail("served a head with a bare LF", st);
	/* Another path: the same request is not served, and only for its path. */
	if (gg_http_check_request(head, len, "/other", &again_only) != 404)
		fail("a request served for /metrics is not a 404 for /other", st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* As the server: up to and including the first empty line. */
	size_t len = size;
	for (size_t i = 0; i + 4 <= size; i++)
		if (!memcmp(data + i, "\r\n\r\n", 4)) {
			len = i + 4;
			break;
		}
	char *head = malloc(len ? len : 1);
	if (!head)
		return 0; /* the replay's injected allocation failure */
	memcpy(head, data, len);
	check(head, len);
	free(head);
	if (len < size) {
		char *whole = malloc(size);
		if (!whole)
			return 0;
		memcpy(whole, data, size);
		check(whole, size);
		free(whole);
	}
	return 0;
}
