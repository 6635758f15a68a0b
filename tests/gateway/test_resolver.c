/* The dials' resolver (gateway/io/resolver.h): addresses parsed at once,
 * host names looked up on threads of their own, one lookup per name at a
 * time, answers kept and refreshed, failures reported with the name and
 * given once as news, malformed text refused with the reason. How it keeps
 * a loop turning while a name server does not answer is
 * tests/integration/named_peers.sh's to show. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gg_check.h"
#include "resolver.h"

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };
	nanosleep(&ts, NULL);
}

static unsigned port_of(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)ss)->sin_port);
	if (ss->ss_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
	return 0;
}

static uint64_t started(struct gg_resolver *r)
{
	uint64_t s;
	unsigned running;
	gg_resolver_counts(r, &s, &running);
	return s;
}

/* Asks until the answer is not -EAGAIN, for at most `seconds`. */
static int ask_until(struct gg_resolver *r, const char *text, struct sockaddr_storage *ss, socklen_t *len,
		     char *why, size_t why_size, bool *first, unsigned seconds)
{
	int rc = -EAGAIN;
	for (unsigned i = 0; i < seconds * 100 && rc == -EAGAIN; i++) {
		rc = gg_resolver_get(r, text, ss, len, why, why_size, first);
		if (rc == -EAGAIN)
			sleep_ms(10);
	}
	return rc;
}

static void numeric(struct gg_resolver *r)
{
	struct sockaddr_storage ss;
	socklen_t len = 0;
	char why[256] = "";
	bool first;

	CHECK(gg_resolver_get(r, "127.0.0.1:7100", &ss, &len, why, sizeof(why), &first) == 0, "IPv4: %s", why);
	CHECK(ss.ss_family == AF_INET && len == sizeof(struct sockaddr_in) && port_of(&ss) == 7100,
	      "IPv4: family %d, length %u, port %u", ss.ss_family, (unsigned)len, port_of(&ss));
	CHECK(gg_resolver_get(r, "[::1]:65535", &ss, &len, why, sizeof(why), &first) == 0, "IPv6: %s", why);
	CHECK(ss.ss_family == AF_INET6 && port_of(&ss) == 65535, "IPv6: family %d, port %u", ss.ss_family,
	      port_of(&ss));
	CHECK(started(r) == 0, "addresses need no lookup, yet %llu started", (unsigned long long)started(r));
}

static void malformed(struct gg_resolver *r)
{
	static const struct {
		const char *text, *why;
	} cases[] = {
		{ "no-port", "expected \"host:port\"" },
		{ ":7100", "expected \"host:port\"" },
		{ "[::1]7100", "expected \"[v6address]:port\"" },
		{ "[::1:7100", "expected \"[v6address]:port\"" },
		{ "host:", "the port is a number from 0 to 65535, without leading zeros" },
		{ "host:65536", "the port is a number from 0 to 65535, without leading zeros" },
		{ "host:12x", "the port is a number from 0 to 65535, without leading zeros" },
		{ "host:0080", "the port is a number from 0 to 65535, without leading zeros" },
		{ "host:029101", "the port is a number from 0 to 65535, without leading zeros" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct sockaddr_storage ss;
		socklen_t len;
		char why[256] = "";
		bool first = false;
		int rc = gg_resolver_get(r, cases[i].text, &ss, &len, why, sizeof(why), &first);
		CHECK(rc == -EINVAL && !strcmp(why, cases[i].why) && first, "'%s': rc %d, why '%s', first %d",
		      cases[i].text, rc, why, first);
	}
	char longname[400];
	memset(longname, 'a', sizeof(longname));
	memcpy(longname + sizeof(longname) - 6, ":7100", 6);
	struct sockaddr_storage ss;
	socklen_t len;
	char why[256] = "";
	bool first;
	CHECK(gg_resolver_get(r, longname, &ss, &len, why, sizeof(why), &first) == -EINVAL &&
		      !strcmp(why, "the host is too long"),
	      "a 393-character host: '%s'", why);
	CHECK(started(r) == 0, "malformed text starts no lookup, yet %llu started", (unsigned long long)started(r));
}

/* localhost is in /etc/hosts: its lookup needs no name server. */
static void found_and_kept(struct gg_resolver *r)
{
	struct sockaddr_storage ss;
	socklen_t len = 0;
	char why[256] = "";
	bool first;
	uint64_t before = started(r);

	int rc = gg_resolver_get(r, "localhost:7101", &ss, &len, why, sizeof(why), &first);
	CHECK(rc == -EAGAIN, "the first ask for a name waits for its lookup: rc %d (%s)", rc, why);
	rc = gg_resolver_get(r, "localhost:7101", &ss, &len, why, sizeof(why), &first);
	CHECK(rc == -EAGAIN || rc == 0, "asked again meanwhile: rc %d (%s)", rc, why);
	CHECK(started(r) == before + 1, "one lookup for a name however often it is asked: %llu",
	      (unsigned long long)(started(r) - before));
	rc = ask_until(r, "localhost:7101", &ss, &len, why, sizeof(why), &first, 10);
	CHECK(rc == 0, "localhost found within 10 s: rc %d (%s)", rc, why);
	CHECK(rc || (port_of(&ss) == 7101 && (ss.ss_family == AF_INET || ss.ss_family == AF_INET6)),
	      "localhost: family %d, port %u", ss.ss_family, port_of(&ss));
	for (int i = 0; i < 100; i++)
		CHECK(gg_resolver_get(r, "localhost:7101", &ss, &len, why, sizeof(why), &first) == 0,
		      "a found address is kept (ask %d)", i);
	CHECK(started(r) == before + 1, "answers are kept: %llu lookups", (unsigned long long)(started(r) - before));
	/* Another port is another text, and another lookup. */
	rc = ask_until(r, "localhost:7102", &ss, &len, why, sizeof(why), &first, 10);
	CHECK(rc == 0 && port_of(&ss) == 7102, "localhost:7102: rc %d, port %u", rc, port_of(&ss));
}

/* A name under .invalid (RFC 6761) is never found: wherever a name server
 * answers, at once, and where none does, once its lookup times out. */
static void not_found(struct gg_resolver *r)
{
	struct sockaddr_storage ss;
	socklen_t len;
	char why[400] = "";
	bool first = false;
	const char *text = "gg-resolver-test.invalid:7100";

	int rc = ask_until(r, text, &ss, &len, why, sizeof(why), &first, 60);
	CHECK(rc == -EINVAL, "a name not found: rc %d", rc);
	CHECK(strstr(why, "host name lookup of 'gg-resolver-test.invalid' failed: ") == why,
	      "the failure names the host: '%s'", why);
	CHECK(first, "the first caller given the failure is told it is the first");
	uint64_t before = started(r);
	rc = gg_resolver_get(r, text, &ss, &len, why, sizeof(why), &first);
	/* Within a second of the failure it is given again, as old news. */
	CHECK(rc == -EAGAIN || (rc == -EINVAL && !first), "asked again at once: rc %d, first %d", rc, first);
	if (rc == -EINVAL)
		CHECK(started(r) == before, "a fresh failure is not looked up again at once");
	sleep_ms(1100);
	rc = gg_resolver_get(r, text, &ss, &len, why, sizeof(why), &first);
	CHECK(rc == -EAGAIN && started(r) > before, "a second after the failure, an ask looks again: rc %d", rc);
	rc = ask_until(r, text, &ss, &len, why, sizeof(why), &first, 60);
	CHECK(rc == -EINVAL && first, "the new lookup's failure is news again: rc %d, first %d", rc, first);
}

/* Many names at once: lookups run side by side, at most one per entry,
 * and a full table makes the next name wait rather than start a thread. */
static void bounded(struct gg_resolver *r)
{
	char text[64], why[400];
	struct sockaddr_storage ss;
	socklen_t len;
	bool first;
	uint64_t s;
	unsigned running;

	for (unsigned i = 0; i < 3 * GG_RESOLVE_ENTRIES; i++) {
		snprintf(text, sizeof(text), "gg-resolver-%u.invalid:7100", i);
		int rc = gg_resolver_get(r, text, &ss, &len, why, sizeof(why), &first);
		CHECK(rc == -EAGAIN || rc == -EINVAL, "%s: rc %d", text, rc);
		gg_resolver_counts(r, &s, &running);
		CHECK(running <= GG_RESOLVE_ENTRIES, "%u lookups at once, more than the table's %u", running,
		      GG_RESOLVE_ENTRIES);
	}
	/* Each ends on its own. */
	for (int i = 0; i < 6000; i++) {
		gg_resolver_counts(r, &s, &running);
		if (!running)
			break;
		sleep_ms(10);
	}
	CHECK(running == 0, "%u lookups still run after 60 s", running);
}

int main(void)
{
	/* Bounds a lookup where no name server answers. */
	setenv("RES_OPTIONS", "timeout:1 attempts:1", 1);
	struct gg_resolver *r;
	if (gg_resolver_new(&r)) {
		printf("FAIL gg_resolver_new\n");
		return 1;
	}
	numeric(r);
	malformed(r);
	found_and_kept(r);
	not_found(r);
	bounded(r);
	gg_resolver_free(r);

	/* Freed with a lookup running: the lookup drops its answer. */
	if (!gg_resolver_new(&r)) {
		struct sockaddr_storage ss;
		socklen_t len;
		char why[256];
		bool first;
		CHECK(gg_resolver_get(r, "localhost:7103", &ss, &len, why, sizeof(why), &first) == -EAGAIN,
		      "a lookup started");
		gg_resolver_free(r);
		sleep_ms(200);
	}
	printf("resolver: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
