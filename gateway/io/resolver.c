#include "resolver.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net_addr.h"
#include "uring_loop.h"

/* An address text's latest answer. `busy`: a lookup thread works on it and
 * will store its answer here (an entry is never taken for another text
 * while it is busy). */
struct entry {
	char text[GG_NET_ADDR_TEXT_MAX + 256];
	bool used, busy, answered;
	bool told; /* a failure: some caller was given it */
	int rc; /* the latest answer: 0 or -EINVAL */
	struct sockaddr_storage ss;
	socklen_t len;
	char why[320];
	uint64_t at_us;   /* when it came */
	uint64_t used_us; /* last asked for: the least recently asked is taken for another */
};

struct gg_resolver {
	pthread_mutex_t lock;
	unsigned refs; /* the owner's, and one per lookup thread running */
	bool closed;   /* the owner let go: lookups drop their answers */
	uint64_t started;
	unsigned running;
	struct entry entries[GG_RESOLVE_ENTRIES];
};

struct lookup {
	struct gg_resolver *r;
	unsigned index;
	char host[256];
	char port[6];
};

int gg_resolver_new(struct gg_resolver **out)
{
	struct gg_resolver *r = calloc(1, sizeof(*r));

	*out = NULL;
	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->lock, NULL);
	r->refs = 1;
	*out = r;
	return 0;
}

/* Drops a reference with the lock held, and unlocks; the last one frees. */
static void put_unlock(struct gg_resolver *r)
{
	bool last = --r->refs == 0;

	pthread_mutex_unlock(&r->lock);
	if (last) {
		pthread_mutex_destroy(&r->lock);
		free(r);
	}
}

void gg_resolver_free(struct gg_resolver *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->lock);
	r->closed = true;
	put_unlock(r);
}

static void *lookup_main(void *arg)
{
	struct lookup *lk = arg;
	struct gg_resolver *r = lk->r;
	struct sockaddr_storage ss;
	socklen_t len;
	const char *why;
	int gai = gg_net_addr_lookup(lk->host, lk->port, false, &ss, &len, &why);

	pthread_mutex_lock(&r->lock);
	struct entry *e = &r->entries[lk->index];
	if (!r->closed) {
		uint64_t now = gg_monotonic_us();
		e->busy = false;
		if (!gai) {
			e->ss = ss;
			e->len = len;
			e->rc = 0;
			e->at_us = now;
		} else if (!e->answered || e->rc) {
			e->rc = -EINVAL;
			e->told = false;
			e->at_us = now;
			snprintf(e->why, sizeof(e->why), "host name lookup of '%s' failed: %s", lk->host, why);
		}
		/* else a refresh failed: the address found before stays, and
		 * the next ask looks again. */
		e->answered = true;
	}
	r->running--;
	put_unlock(r);
	free(lk);
	return NULL;
}

/* Starts the lookup of entry i (lock held). Returns 0 or a negative errno
 * with `why`. */
static int start_lookup(struct gg_resolver *r, unsigned i, const char *host, const char *port, char *why,
			size_t why_size)
{
	struct lookup *lk = calloc(1, sizeof(*lk));
	pthread_attr_t attr;
	pthread_t t;
	sigset_t all, old;
	int rc;

	if (!lk)
		return gg_errf(why, why_size, -ENOMEM, "out of memory for a host name lookup");
	lk->r = r;
	lk->index = i;
	snprintf(lk->host, sizeof(lk->host), "%s", host);
	snprintf(lk->port, sizeof(lk->port), "%s", port);
	/* The thread takes no signal: they are the process's main thread's. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&t, &attr, lookup_main, lk);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc) {
		free(lk);
		return gg_errf(why, why_size, -rc, "cannot start a host name lookup: %s", strerror(rc));
	}
	pthread_setname_np(t, "gg-resolve");
	r->refs++;
	r->running++;
	r->started++;
	r->entries[i].busy = true;
	return 0;
}

/* The entry of `text`, or one taken for it: a free one, else the least
 * recently asked for of those without a lookup running (lock held).
 * Returns its index, or -1 when every entry has a lookup running. */
static int entry_for(struct gg_resolver *r, const char *text)
{
	int pick = -1;

	for (unsigned i = 0; i < GG_RESOLVE_ENTRIES; i++) {
		const struct entry *e = &r->entries[i];
		if (e->used && !strcmp(e->text, text))
			return (int)i;
		if (e->busy || (pick >= 0 && !r->entries[pick].used))
			continue;
		if (pick < 0 || !e->used || e->used_us < r->entries[pick].used_us)
			pick = (int)i;
	}
	if (pick >= 0) {
		struct entry *e = &r->entries[pick];
		memset(e, 0, sizeof(*e));
		e->used = true;
		snprintf(e->text, sizeof(e->text), "%s", text);
	}
	return pick;
}

int gg_resolver_get(struct gg_resolver *r, const char *text, struct sockaddr_storage *out, socklen_t *len,
		    char *why, size_t why_size, bool *first)
{
	char host[256], port[6];
	const char *bad;
	int rc = gg_net_addr_split(text, host, sizeof(host), port, &bad);

	*first = true;
	if (rc)
		return gg_errf(why, why_size, rc, "%s", bad);
	if (strlen(text) >= sizeof(r->entries[0].text))
		return gg_errf(why, why_size, -EINVAL, "the address is too long");
	/* An address, not a name: nothing to wait for. */
	int gai = gg_net_addr_lookup(host, port, true, out, len, &bad);
	if (!gai)
		return 0;
	if (gai != EAI_NONAME)
		return gg_errf(why, why_size, -EINVAL, "%s", bad);

	pthread_mutex_lock(&r->lock);
	/* Read under the lock: an answer stored meanwhile is never newer. */
	const uint64_t now = gg_monotonic_us();
	int i = entry_for(r, text);
	if (i < 0) {
		pthread_mutex_unlock(&r->lock);
		return -EAGAIN;
	}
	struct entry *e = &r->entries[i];
	bool look = false;
	e->used_us = now;
	rc = -EAGAIN;
	if (e->answered && e->rc == 0) {
		/* Used while it is fresh, and while the next lookup runs. */
		memcpy(out, &e->ss, e->len);
		*len = e->len;
		rc = 0;
		look = now - e->at_us >= GG_RESOLVE_KEEP_US;
	} else if (e->answered && now - e->at_us < GG_RESOLVE_FAIL_KEEP_US) {
		rc = gg_errf(why, why_size, e->rc, "%s", e->why);
		*first = !e->told;
		e->told = true;
	} else {
		look = true;
	}
	if (look && !e->busy) {
		int started = start_lookup(r, (unsigned)i, host, port, why, why_size);
		if (started && rc == -EAGAIN)
			rc = started;
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

void gg_resolver_counts(struct gg_resolver *r, uint64_t *started, unsigned *running)
{
	pthread_mutex_lock(&r->lock);
	*started = r->started;
	*running = r->running;
	pthread_mutex_unlock(&r->lock);
}
