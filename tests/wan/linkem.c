/* linkem: a userspace TCP link emulator for the integration tests (these
 * kernels have no netem). It accepts on --listen, connects each accepted
 * connection to --target and forwards both directions, each with a fixed
 * one-way delay and an optional token-bucket rate limit, through bounded
 * buffers. Faults for tests: SIGUSR1 resets (RST, via SO_LINGER 0) every
 * connection open at that moment; SIGUSR2 holds the "down" direction of
 * every connection, open or to come, from then on (a link that loses
 * everything one way, silently: what was read is kept, and the rest waits
 * in the sender's socket), and a second SIGUSR2 lets it go again;
 * --cut-after-bytes resets a connection
 * once it has forwarded that many bytes (both directions together).
 * --slow-every N --slow-rate RATE gives every Nth connection accepted
 * that rate instead: with N streams dialed together, one slow stream among
 * fast ones.
 *
 *   linkem --listen HOST:PORT --target HOST:PORT [--delay-ms MS]
 *          [--rate RATE] [--buffer BYTES] [--cut-after-bytes N]
 *          [--cut-count N] [--max-conns N] [--report-every BYTES]
 *          [--socket-buffer BYTES] [--slow-every N --slow-rate RATE]
 *
 * "up" is the direction from the accepted (dialing) side to the target.
 * Prints "listening on ADDR" once it accepts (port 0 picks a free port),
 * one line per connection event on stderr, and exits 0 on SIGTERM/SIGINT. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_RECORDS 1024      /* delay records per direction */
#define COALESCE_NS 1000000ll /* reads closer than this share a release time */
#define TAG_LISTEN UINT64_MAX
#define TAG_SIGNAL (UINT64_MAX - 1)

static inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

struct record {
	uint64_t end;   /* stream offset this record's bytes end at */
	int64_t due_ns; /* when they may leave */
};

/* One direction of a forwarded connection. */
struct dir {
	int src, dst;
	uint8_t *buf;
	size_t cap;
	uint64_t in, out; /* stream offsets read from src / written to dst */
	struct record rec[MAX_RECORDS];
	unsigned rec_head, rec_count;
	bool eof;         /* src said FIN */
	int64_t eof_due_ns;
	bool shut;        /* FIN passed on to dst */
	bool blocked;     /* dst said EAGAIN: wait for EPOLLOUT */
	double rate_Bps;  /* this direction's limit; 0: none */
	double burst;
	double tokens;    /* bytes the rate limit allows now */
	int64_t refill_ns;
};

struct link {
	bool used;
	unsigned id;
	int cfd, tfd;     /* client side, target side */
	bool connecting;  /* target connect in progress */
	struct dir up, down;
	uint64_t forwarded;
	uint32_t ev_c, ev_t; /* epoll interest registered */
};

static struct {
	int64_t delay_ns;
	double rate_Bps;  /* 0: unlimited */
	double slow_rate_Bps;
	unsigned slow_every; /* connections N, 2N, ... get slow_rate_Bps */
	size_t buffer;
	uint64_t cut_after;
	uint64_t report_every;
	int socket_buffer; /* SO_RCVBUF/SO_SNDBUF of both sockets; 0: the kernel's */
	unsigned cut_count, cuts;
	unsigned max_conns;
	struct sockaddr_storage target;
	socklen_t target_len;
	int epfd;
	struct link *links;
	unsigned next_id;
	bool hold_down; /* SIGUSR2: nothing moves from the target to the dialer */
} L;

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static int parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len)
{
	char host[256];
	const char *colon = strrchr(text, ':');
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
	struct addrinfo *ai;

	if (!colon || (size_t)(colon - text) >= sizeof(host))
		return -1;
	memcpy(host, text, (size_t)(colon - text));
	host[colon - text] = '\0';
	char *h = host;
	if (h[0] == '[' && h[strlen(h) - 1] == ']') {
		h[strlen(h) - 1] = '\0';
		h++;
	}
	if (getaddrinfo(h, colon + 1, &hints, &ai))
		return -1;
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

static void format_addr(const struct sockaddr_storage *ss, char *buf, size_t size)
{
	char host[INET6_ADDRSTRLEN + 2], port[8];

	if (getnameinfo((const struct sockaddr *)ss, sizeof(*ss), host, sizeof(host), port, sizeof(port),
			NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(buf, size, "?");
		return;
	}
	snprintf(buf, size, ss->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

/* "2gbit", "100mbit", "64kbit", "1000000" (bits per second). */
static int parse_rate(const char *text, double *bytes_per_s)
{
	char *end;
	double v = strtod(text, &end);
	double mult = !strcmp(end, "") || !strcmp(end, "bit") ? 1
		    : !strcmp(end, "kbit") ? 1e3
		    : !strcmp(end, "mbit") ? 1e6
		    : !strcmp(end, "gbit") ? 1e9
		    : 0;
	if (end == text || mult == 0 || !(v > 0))
		return -1;
	*bytes_per_s = v * mult / 8;
	return 0;
}

/* "4MiB", "64KiB", "1000" (bytes). */
static int parse_size(const char *text, uint64_t *out)
{
	char *end;
	unsigned long long v = strtoull(text, &end, 10);
	uint64_t mult = !strcmp(end, "") ? 1
		      : !strcmp(end, "KiB") ? 1ull << 10
		      : !strcmp(end, "MiB") ? 1ull << 20
		      : !strcmp(end, "GiB") ? 1ull << 30
		      : 0;
	if (end == text || mult == 0)
		return -1;
	*out = v * mult;
	return 0;
}

static void set_interest(int fd, uint32_t *have, uint32_t want, uint64_t tag)
{
	struct epoll_event ev = { .events = want, .data.u64 = tag };

	if (*have == want)
		return;
	if (epoll_ctl(L.epfd, EPOLL_CTL_MOD, fd, &ev))
		fprintf(stderr, "linkem: epoll_ctl: %s\n", strerror(errno));
	*have = want;
}

static bool dir_wants_read(const struct dir *d)
{
	return !d->eof && d->in - d->out < d->cap;
}

static void update_interest(struct link *k)
{
	uint32_t c = 0, t = 0;

	if (k->connecting) {
		set_interest(k->cfd, &k->ev_c, 0, (uint64_t)(k - L.links) * 2);
		set_interest(k->tfd, &k->ev_t, EPOLLOUT, (uint64_t)(k - L.links) * 2 + 1);
		return;
	}
	if (dir_wants_read(&k->up))
		c |= EPOLLIN;
	if (k->down.blocked && !L.hold_down) /* held: nothing to write, and no spinning on EPOLLOUT */
		c |= EPOLLOUT;
	if (dir_wants_read(&k->down))
		t |= EPOLLIN;
	if (k->up.blocked || k->connecting)
		t |= EPOLLOUT;
	set_interest(k->cfd, &k->ev_c, c, (uint64_t)(k - L.links) * 2);
	set_interest(k->tfd, &k->ev_t, t, (uint64_t)(k - L.links) * 2 + 1);
}

static void reset_fd(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };

	if (fd < 0)
		return;
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

static void link_free(struct link *k, bool reset)
{
	if (reset) {
		reset_fd(k->cfd);
		reset_fd(k->tfd);
	} else {
		close(k->cfd);
		if (k->tfd >= 0)
			close(k->tfd);
	}
	free(k->up.buf);
	free(k->down.buf);
	k->used = false;
}

static void link_reset(struct link *k, const char *why)
{
	fprintf(stderr, "linkem: connection %u reset after %llu bytes: %s\n", k->id,
		(unsigned long long)k->forwarded, why);
	link_free(k, true);
}

/* A burst of 10 ms at the rate, and never less than 64 KiB, so that a
 * limit does not turn into one write per byte. */
static double burst_of(double rate_Bps)
{
	return rate_Bps > 0 ? (rate_Bps / 100 > 65536 ? rate_Bps / 100 : 65536) : 0;
}

static int dir_init(struct dir *d, int src, int dst, double rate_Bps)
{
	memset(d, 0, sizeof(*d));
	d->src = src;
	d->dst = dst;
	d->cap = L.buffer;
	d->buf = malloc(d->cap);
	d->rate_Bps = rate_Bps;
	d->burst = burst_of(rate_Bps);
	d->tokens = d->burst;
	d->refill_ns = now_ns();
	return d->buf ? 0 : -1;
}

/* Reads what src has into the buffer, stamping it with its due time.
 * Returns -1 when the connection broke. */
static int dir_read(struct dir *d, int64_t now)
{
	while (d->in - d->out < d->cap && !d->eof) {
		size_t pos = (size_t)(d->in % d->cap);
		size_t room = min_u64(d->cap - (size_t)(d->in - d->out), d->cap - pos);
		ssize_t got = recv(d->src, d->buf + pos, room, 0);
		if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -1;
		int64_t due = now + L.delay_ns;
		if (got == 0) {
			d->eof = true;
			d->eof_due_ns = due;
			return 0;
		}
		d->in += (uint64_t)got;
		struct record *last = d->rec_count ? &d->rec[(d->rec_head + d->rec_count - 1) % MAX_RECORDS] : NULL;
		if (last && (due - last->due_ns < COALESCE_NS || d->rec_count == MAX_RECORDS)) {
			/* Close enough (or out of records): these bytes leave with the
			 * previous ones, at the later of the two times. */
			last->end = d->in;
			if (d->rec_count == MAX_RECORDS)
				last->due_ns = due;
		} else {
			d->rec[(d->rec_head + d->rec_count) % MAX_RECORDS] = (struct record){ d->in, due };
			d->rec_count++;
		}
	}
	return 0;
}

/* Bytes that are due by `now`. */
static uint64_t dir_due(struct dir *d, int64_t now)
{
	while (d->rec_count && d->rec[d->rec_head].end <= d->out) {
		d->rec_head = (d->rec_head + 1) % MAX_RECORDS;
		d->rec_count--;
	}
	uint64_t end = d->out;
	for (unsigned i = 0; i < d->rec_count; i++) {
		const struct record *r = &d->rec[(d->rec_head + i) % MAX_RECORDS];
		if (r->due_ns > now)
			break;
		end = r->end;
	}
	return end - d->out;
}

static void refill(struct dir *d, int64_t now)
{
	if (d->rate_Bps <= 0)
		return;
	d->tokens += (double)(now - d->refill_ns) * 1e-9 * d->rate_Bps;
	if (d->tokens > d->burst)
		d->tokens = d->burst;
	d->refill_ns = now;
}

/* Writes due bytes to dst within the rate limit. Returns -1 when the
 * connection broke, 1 when it was cut on purpose. */
static int dir_write(struct link *k, struct dir *d, int64_t now)
{
	refill(d, now);
	for (;;) {
		uint64_t due = dir_due(d, now);
		if (d->rate_Bps > 0 && d->tokens < (double)min_u64(due, 1024))
			due = 0;
		if (!due)
			break;
		if (d->rate_Bps > 0 && (double)due > d->tokens)
			due = (uint64_t)d->tokens;
		if (L.cut_after && (L.cut_count == 0 || L.cuts < L.cut_count) && due > L.cut_after - k->forwarded)
			due = L.cut_after - k->forwarded;
		size_t pos = (size_t)(d->out % d->cap);
		size_t len = (size_t)min_u64(due, d->cap - pos);
		ssize_t w = len ? send(d->dst, d->buf + pos, len, MSG_NOSIGNAL) : 0;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			d->blocked = true;
			return 0;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		d->blocked = false;
		d->out += (uint64_t)w;
		if (L.report_every && d->out / L.report_every != (d->out - (uint64_t)w) / L.report_every)
			fprintf(stderr, "linkem: connection %u %s %llu bytes\n", k->id, d == &k->up ? "up" : "down",
				(unsigned long long)(d->out / L.report_every * L.report_every));
		k->forwarded += (uint64_t)w;
		if (d->rate_Bps > 0)
			d->tokens -= (double)w;
		if (L.cut_after && k->forwarded >= L.cut_after && (L.cut_count == 0 || L.cuts < L.cut_count)) {
			L.cuts++;
			return 1;
		}
	}
	d->blocked = false;
	if (d->eof && !d->shut && d->out == d->in && now >= d->eof_due_ns) {
		shutdown(d->dst, SHUT_WR);
		d->shut = true;
	}
	return 0;
}

/* When this direction next has something to do, or INT64_MAX. */
static int64_t dir_next(const struct dir *d)
{
	if (d->blocked)
		return INT64_MAX;
	for (unsigned i = 0; i < d->rec_count; i++) {
		const struct record *r = &d->rec[(d->rec_head + i) % MAX_RECORDS];
		if (r->end > d->out) {
			int64_t t = r->due_ns;
			if (d->rate_Bps > 0 && d->tokens < 1024)
				t = max_i64(t, d->refill_ns + (int64_t)((1024 - d->tokens) / d->rate_Bps * 1e9) + 1);
			return t;
		}
	}
	if (d->eof && !d->shut)
		return d->eof_due_ns;
	return INT64_MAX;
}

/* Moves what can move on link k; frees it when both directions ended. */
static void link_pump(struct link *k, int64_t now)
{
	if (k->connecting)
		return;
	struct dir *dirs[2] = { &k->up, &k->down };
	for (int i = 0; i < 2; i++) {
		if (dir_read(dirs[i], now)) {
			link_reset(k, "connection broken");
			return;
		}
		if (dirs[i] == &k->down && L.hold_down)
			continue;
		int rc = dir_write(k, dirs[i], now);
		if (rc) {
			link_reset(k, rc > 0 ? "cut after bytes" : "connection broken");
			return;
		}
	}
	if (k->up.shut && k->down.shut) {
		fprintf(stderr, "linkem: connection %u closed after %llu bytes\n", k->id,
			(unsigned long long)k->forwarded);
		link_free(k, false);
		return;
	}
	update_interest(k);
}

static void tune(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (L.socket_buffer) {
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &L.socket_buffer, sizeof(L.socket_buffer));
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &L.socket_buffer, sizeof(L.socket_buffer));
	}
}

static void on_accept(int lfd)
{
	for (;;) {
		int cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (cfd < 0)
			return;
		struct link *k = NULL;
		for (unsigned i = 0; i < L.max_conns; i++)
			if (!L.links[i].used) {
				k = &L.links[i];
				break;
			}
		if (!k) {
			fprintf(stderr, "linkem: refused a connection: --max-conns %u reached\n", L.max_conns);
			reset_fd(cfd);
			continue;
		}
		int tfd = socket(L.target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		tune(cfd);
		if (tfd >= 0)
			tune(tfd);
		memset(k, 0, sizeof(*k));
		k->cfd = cfd;
		k->tfd = tfd;
		k->id = ++L.next_id;
		double rate = L.slow_every && k->id % L.slow_every == 0 ? L.slow_rate_Bps : L.rate_Bps;
		if (tfd < 0 || dir_init(&k->up, cfd, tfd, rate) || dir_init(&k->down, tfd, cfd, rate)) {
			k->used = true;
			link_reset(k, "out of resources");
			continue;
		}
		k->used = true;
		int rc = connect(tfd, (struct sockaddr *)&L.target, L.target_len);
		if (rc && errno != EINPROGRESS) {
			link_reset(k, strerror(errno));
			continue;
		}
		k->connecting = rc != 0;
		struct epoll_event ev = { .events = 0, .data.u64 = (uint64_t)(k - L.links) * 2 };
		epoll_ctl(L.epfd, EPOLL_CTL_ADD, cfd, &ev);
		ev.data.u64++;
		epoll_ctl(L.epfd, EPOLL_CTL_ADD, tfd, &ev);
		fprintf(stderr, "linkem: connection %u accepted\n", k->id);
		link_pump(k, now_ns());
		if (k->used)
			update_interest(k);
	}
}

static void on_link_event(struct link *k, bool target_side, uint32_t events, int64_t now)
{
	if (!k->used)
		return;
	if (target_side && k->connecting) {
		int err = 0;
		socklen_t len = sizeof(err);
		if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return;
		getsockopt(k->tfd, SOL_SOCKET, SO_ERROR, &err, &len);
		if (err) {
			link_reset(k, strerror(err));
			return;
		}
		k->connecting = false;
	} else if (events & EPOLLERR) {
		int err = 0;
		socklen_t len = sizeof(err);
		getsockopt(target_side ? k->tfd : k->cfd, SOL_SOCKET, SO_ERROR, &err, &len);
		link_reset(k, err ? strerror(err) : "socket error");
		return;
	}
	if (events & EPOLLOUT)
		(target_side ? &k->up : &k->down)->blocked = false;
	link_pump(k, now);
}

static void reset_all(void)
{
	unsigned n = 0;

	for (unsigned i = 0; i < L.max_conns; i++)
		if (L.links[i].used) {
			link_free(&L.links[i], true);
			n++;
		}
	fprintf(stderr, "linkem: reset %u connection%s on request\n", n, n == 1 ? "" : "s");
}

static void usage(FILE *f)
{
	fprintf(f, "usage: linkem --listen HOST:PORT --target HOST:PORT [--delay-ms MS] [--rate RATE]\n"
		   "              [--buffer BYTES] [--cut-after-bytes N] [--cut-count N] [--max-conns N]\n"
		   "  --delay-ms MS         one-way delay added in each direction (default 0)\n"
		   "  --rate RATE           per-direction limit: 2gbit, 100mbit, 64kbit (default none)\n"
		   "  --buffer BYTES        bytes buffered per direction: 4MiB, 64KiB (default 4MiB)\n"
		   "  --cut-after-bytes N   reset a connection once it forwarded N bytes\n"
		   "  --cut-count N         cut at most N connections that way (default: every one)\n"
		   "  --max-conns N         connections forwarded at once (default 256)\n"
		   "  --report-every BYTES  print a line each time a direction forwarded BYTES more\n"
		   "  --socket-buffer BYTES kernel buffers of each socket (default: autotuned), which\n"
		   "                        bounds what a sender may push beyond --buffer\n"
		   "  --slow-every N        connections N, 2N, ... get --slow-rate instead of --rate\n"
		   "  --slow-rate RATE      (both needed together)\n"
		   "  SIGUSR1 resets every open connection; SIGUSR2 holds (again: lets go) what the\n"
		   "  target sends, on every connection; SIGTERM exits.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "listen", required_argument, NULL, 'l' },	    { "target", required_argument, NULL, 't' },
		{ "delay-ms", required_argument, NULL, 'd' },	    { "rate", required_argument, NULL, 'r' },
		{ "buffer", required_argument, NULL, 'b' },	    { "cut-after-bytes", required_argument, NULL, 'c' },
		{ "cut-count", required_argument, NULL, 'n' },	    { "max-conns", required_argument, NULL, 'm' },
		{ "report-every", required_argument, NULL, 'R' }, { "socket-buffer", required_argument, NULL, 'S' },
		{ "slow-every", required_argument, NULL, 's' },   { "slow-rate", required_argument, NULL, 'w' },
		{ "help", no_argument, NULL, 'h' },		    { NULL, 0, NULL, 0 },
	};
	const char *listen_text = NULL, *target_text = NULL;
	uint64_t buffer = 4u << 20, v;
	int c;

	L.max_conns = 256;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'l': listen_text = optarg; break;
		case 't': target_text = optarg; break;
		case 'd': {
			char *end;
			double ms = strtod(optarg, &end);
			if (end == optarg || *end || !(ms >= 0 && ms <= 60000)) {
				fprintf(stderr, "linkem: --delay-ms must be a number of milliseconds from 0 to 60000, not '%s'\n",
					optarg);
				return 2;
			}
			L.delay_ns = (int64_t)(ms * 1e6);
			break;
		}
		case 'r':
			if (parse_rate(optarg, &L.rate_Bps)) {
				fprintf(stderr, "linkem: bad --rate '%s' (e.g. 2gbit, 100mbit)\n", optarg);
				return 2;
			}
			break;
		case 'b':
			if (parse_size(optarg, &buffer) || buffer < 4096 || buffer > (1ull << 30)) {
				fprintf(stderr, "linkem: --buffer must be 4096 bytes to 1GiB, not '%s'\n", optarg);
				return 2;
			}
			break;
		case 'c':
			if (parse_size(optarg, &L.cut_after) || L.cut_after == 0) {
				fprintf(stderr, "linkem: bad --cut-after-bytes '%s'\n", optarg);
				return 2;
			}
			break;
		case 'S':
			if (parse_size(optarg, &v) || v < 4096 || v > (64u << 20)) {
				fprintf(stderr, "linkem: --socket-buffer must be 4096 bytes to 64MiB, not '%s'\n", optarg);
				return 2;
			}
			L.socket_buffer = (int)v;
			break;
		case 'R':
			if (parse_size(optarg, &L.report_every) || L.report_every == 0) {
				fprintf(stderr, "linkem: bad --report-every '%s'\n", optarg);
				return 2;
			}
			break;
		case 'n':
		case 'm':
			if (parse_size(optarg, &v) || v > 65536 || (c == 'm' && v == 0)) {
				fprintf(stderr, "linkem: bad --%s '%s'\n", c == 'n' ? "cut-count" : "max-conns", optarg);
				return 2;
			}
			*(c == 'n' ? &L.cut_count : &L.max_conns) = (unsigned)v;
			break;
		case 's':
			if (parse_size(optarg, &v) || v == 0 || v > 65536) {
				fprintf(stderr, "linkem: bad --slow-every '%s'\n", optarg);
				return 2;
			}
			L.slow_every = (unsigned)v;
			break;
		case 'w':
			if (parse_rate(optarg, &L.slow_rate_Bps) || L.slow_rate_Bps <= 0) {
				fprintf(stderr, "linkem: bad --slow-rate '%s' (e.g. 2gbit, 100mbit)\n", optarg);
				return 2;
			}
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!listen_text || !target_text || optind != argc) {
		usage(stderr);
		return 2;
	}
	if (!L.slow_every != !(L.slow_rate_Bps > 0)) {
		fprintf(stderr, "linkem: --slow-every and --slow-rate go together\n");
		return 2;
	}
	L.buffer = (size_t)buffer;
	struct sockaddr_storage lss;
	socklen_t llen;
	if (parse_addr(listen_text, &lss, &llen)) {
		fprintf(stderr, "linkem: --listen '%s' is not a HOST:PORT that resolves\n", listen_text);
		return 2;
	}
	if (parse_addr(target_text, &L.target, &L.target_len)) {
		fprintf(stderr, "linkem: --target '%s' is not a HOST:PORT that resolves\n", target_text);
		return 2;
	}
	L.links = calloc(L.max_conns, sizeof(*L.links));
	if (!L.links) {
		fprintf(stderr, "linkem: out of memory\n");
		return 1;
	}

	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGUSR2);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);

	int lfd = socket(lss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (lfd >= 0)
		setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (sfd < 0 || lfd < 0 || bind(lfd, (struct sockaddr *)&lss, llen) || listen(lfd, 128)) {
		fprintf(stderr, "linkem: cannot listen on %s: %s\n", listen_text, strerror(errno));
		return 1;
	}
	L.epfd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = TAG_LISTEN };
	epoll_ctl(L.epfd, EPOLL_CTL_ADD, lfd, &ev);
	ev.data.u64 = TAG_SIGNAL;
	epoll_ctl(L.epfd, EPOLL_CTL_ADD, sfd, &ev);

	char addr[INET6_ADDRSTRLEN + 16];
	socklen_t alen = sizeof(lss);
	getsockname(lfd, (struct sockaddr *)&lss, &alen);
	format_addr(&lss, addr, sizeof(addr));
	printf("listening on %s\n", addr);
	fflush(stdout);

	bool stop = false;
	while (!stop) {
		int64_t now = now_ns(), next = INT64_MAX;
		for (unsigned i = 0; i < L.max_conns; i++) {
			struct link *k = &L.links[i];
			if (!k->used || k->connecting)
				continue;
			next = min_i64(next, min_i64(dir_next(&k->up), L.hold_down ? INT64_MAX : dir_next(&k->down)));
		}
		int timeout_ms = next == INT64_MAX ? 1000 : next <= now ? 0 : (int)((next - now + 999999) / 1000000);
		struct epoll_event evs[64];
		int n = epoll_wait(L.epfd, evs, 64, timeout_ms);
		if (n < 0 && errno != EINTR) {
			fprintf(stderr, "linkem: epoll_wait: %s\n", strerror(errno));
			return 1;
		}
		now = now_ns();
		for (int i = 0; i < n; i++) {
			uint64_t tag = evs[i].data.u64;
			if (tag == TAG_LISTEN) {
				on_accept(lfd);
			} else if (tag == TAG_SIGNAL) {
				struct signalfd_siginfo si;
				while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
					if (si.ssi_signo == SIGUSR1) {
						reset_all();
					} else if (si.ssi_signo == SIGUSR2) {
						L.hold_down = !L.hold_down;
						fprintf(stderr, "linkem: %s what the target sends\n",
							L.hold_down ? "holding" : "letting go");
					} else {
						stop = true;
					}
				}
			} else if (tag / 2 < L.max_conns) {
				on_link_event(&L.links[tag / 2], tag & 1, evs[i].events, now);
			}
		}
		/* Timers: bytes whose delay passed, tokens that refilled. */
		for (unsigned i = 0; i < L.max_conns; i++)
			if (L.links[i].used && !L.links[i].connecting)
				link_pump(&L.links[i], now);
	}
	for (unsigned i = 0; i < L.max_conns; i++)
		if (L.links[i].used)
			link_free(&L.links[i], false);
	fprintf(stderr, "linkem: stopped after %u connections, %u cut\n", L.next_id, L.cuts);
	free(L.links);
	close(lfd);
	close(sfd);
	close(L.epfd);
	return 0;
}
