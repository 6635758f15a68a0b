/* Fuzz inputs that are scripts: a run of operations, each an opcode byte
 * and the arguments after it, little-endian. Reading past the end gives
 * zeroes, so every input is a script and every script ends. The targets
 * read them with script_*(); the seed generators write them with
 * script_put_*() and script_save(). */
#ifndef GG_FUZZ_SCRIPT_H
#define GG_FUZZ_SCRIPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct script {
	const uint8_t *p;
	size_t left;
};

static inline bool script_more(const struct script *s)
{
	return s->left > 0;
}

static inline uint64_t script_uint(struct script *s, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes && s->left; i++, s->left--)
		v |= (uint64_t)*s->p++ << (8 * i);
	return v;
}

/* The next byte, left for the next read (0 at the end). */
static inline uint8_t script_peek(const struct script *s)
{
	return s->left ? *s->p : 0;
}

static inline uint8_t script_u8(struct script *s)
{
	return (uint8_t)script_uint(s, 1);
}

static inline uint16_t script_u16(struct script *s)
{
	return (uint16_t)script_uint(s, 2);
}

static inline uint32_t script_u32(struct script *s)
{
	return (uint32_t)script_uint(s, 4);
}

static inline uint64_t script_u64(struct script *s)
{
	return script_uint(s, 8);
}

/* Up to `n` bytes in place; *len says how many there were. */
static inline const uint8_t *script_bytes(struct script *s, size_t n, size_t *len)
{
	const uint8_t *p = s->p;

	*len = n < s->left ? n : s->left;
	s->p += *len;
	s->left -= *len;
	return p;
}

/* A length byte and that many bytes, as a C string in `buf` (cut to fit). */
static inline const char *script_text(struct script *s, char *buf, size_t size)
{
	size_t len;
	const uint8_t *p = script_bytes(s, script_u8(s), &len);

	if (len >= size)
		len = size - 1;
	memcpy(buf, p, len);
	buf[len] = '\0';
	return buf;
}

/* ---- fuzz_node.c: peers and the local side against one node ----------
 * The first byte picks the node's configuration. A peer is a site index
 * below the node's (the node is the last site), a stream a number below
 * streams_per_peer, a job one of three names; `seq` is an offset (i8) from
 * the job's last submitted step, `flags` bits say which optional
 * arguments follow. Every operation is followed by one turn of the node. */
enum node_op {
	NODE_SUBMIT,      /* job, u8 seq step (added), u8 tensor, u16 count, u8 dtype, u16 timeout ms */
	NODE_OPEN,        /* peer, stream, u8 instance id */
	NODE_RAW,         /* peer, stream, u16 length, bytes */
	NODE_DATA,        /* peer, stream, job, seq, flags, u8 phase, u8 origin, u8 chunk, u8 values,
			   * [u16 count], [u64 fingerprint], [u16 corrupt at], [u16 split at] */
	NODE_ACK,         /* peer, stream, u8 index of a DATA the node sent; flags, [job, seq, phase, origin, chunk] */
	NODE_DONE,        /* peer, stream, job, seq */
	NODE_ABORT,       /* peer, stream, job, seq, u8 more steps, u8 code, text reason */
	NODE_END,         /* peer, stream, job, seq (last done), u8 more steps, u8 code (its high
			   * four bits also the END's age: 1.5 s each), text reason */
	NODE_PING,        /* peer, stream, u8 pong, u64 value (pong: 0 echoes the node's last ping) */
	NODE_HELLO,       /* peer, stream, u16 stream index */
	NODE_CLOSE,       /* peer, stream: the peer closes it */
	NODE_RUN,         /* u8 turns */
	NODE_TIME,        /* u16 milliseconds the clock jumps ahead */
	NODE_LOCAL_ABORT, /* job, seq, u8 code, text reason: gg_node_abort() */
	NODE_LOCAL_END,   /* job: gg_node_end_job(); a job byte of 0xe0 or more: gg_node_job_opened(),
			   * as the job's first rank connects */
	NODE_STOP,        /* gg_node_stop_steps() */
	NODE_OPS
};

#define NODE_DATA_COUNT 1u       /* DATA flags */
#define NODE_DATA_FINGERPRINT 2u
#define NODE_DATA_CORRUPT 4u
#define NODE_DATA_SPLIT 8u
#define NODE_DATA_SPECIAL 16u    /* infinities and NaN among the values */
#define NODE_ACK_FIELDS 1u       /* ACK flags */

/* ---- fuzz_control.c: local clients against the host site backend ------
 * The first six bytes set the backend's limits and the core's manner
 * (fuzz_control.c, struct limits). A client is an index below
 * CONTROL_CLIENTS; a region an index in the control protocol's range. */
#define CONTROL_CLIENTS 6

enum control_op {
	CONTROL_CONNECT,   /* client */
	CONTROL_HELLO,     /* client, u8 version (0: the right one), u8 rank, u8 nranks, u8 job (3: text follows) */
	CONTROL_MAP,       /* client, u8 region, u8 pages, u8 descriptor kind (enum control_fd) */
	CONTROL_UNMAP,     /* client, u8 region */
	CONTROL_ALLREDUCE, /* client, u8 seq (0: the next), u8 tensor, u8 dtype, u16 count, u32 offset, u8 region,
			    * u16 timeout ms */
	CONTROL_RAW,       /* client, u16 length, bytes: any packet */
	CONTROL_CLOSE,     /* client: it closes its socket */
	CONTROL_RUN,       /* u8 turns of the loop */
	CONTROL_TIME,      /* u16 milliseconds the clock jumps ahead */
	CONTROL_CORE,      /* u8 what: the fake core completes (or fails) held steps, or changes its manner */
	CONTROL_STOP,      /* the gateway begins to stop */
	CONTROL_OPS
};

/* What a MAP carries. */
enum control_fd {
	CONTROL_FD_SEALED,   /* a memfd sealed against shrinking, of the size MAP says */
	CONTROL_FD_UNSEALED,
	CONTROL_FD_SHORT,    /* sealed, a page shorter than MAP says */
	CONTROL_FD_NONE,
	CONTROL_FD_TWO,      /* two sealed memfds */
	CONTROL_FD_PIPE,     /* not a memfd at all */
	CONTROL_FD_KINDS
};

/* ---- fuzz_client.c: a gateway's answers against the client library -----
 * What the gateway sends before CLIENT_OPEN waits until the library
 * connects; a gateway that has sent nothing by then closes at once. A
 * request or buffer is an index in the target's tables. */
enum client_op {
	CLIENT_OPEN,         /* u8 rank, u8 nranks */
	CLIENT_GW_ACCEPT,    /* u8 version (0: the right one), u8 max in flight, u32 max message, u32 max region
			      * (0: room for two messages), u8 max regions, u16 step timeout ms, u16 grace ms,
			      * text site */
	CLIENT_GW_DONE,      /* u8 seq (0: the oldest unanswered request), u8 status (negated), text message */
	CLIENT_GW_ERROR,     /* u8 refuse, u8 code (negated), u64 seq, text message */
	CLIENT_GW_RAW,       /* u16 length, bytes, u8 descriptors to attach */
	CLIENT_GW_CLOSE,     /* the gateway closes the connection */
	CLIENT_ALLREDUCE,    /* u8 buffer (0: private memory), u32 offset, u16 count, u8 dtype, u8 tensor,
			      * u16 timeout ms */
	CLIENT_WAIT,         /* u8 request: gg_wait() without waiting */
	CLIENT_FREE_REQUEST, /* u8 request */
	CLIENT_BUFFER_ALLOC, /* u16 bytes */
	CLIENT_BUFFER_FREE,  /* u8 buffer */
	CLIENT_CLOSE,        /* gg_session_close() */
	CLIENT_OPS
};

/* ---- writing seeds ---- */

struct script_out {
	uint8_t buf[1 << 16];
	size_t len;
};

static inline void script_put(struct script_out *o, uint64_t v, unsigned bytes)
{
	for (unsigned i = 0; i < bytes && o->len < sizeof(o->buf); i++)
		o->buf[o->len++] = (uint8_t)(v >> (8 * i));
}

static inline void script_put_bytes(struct script_out *o, const void *p, size_t n)
{
	if (n > sizeof(o->buf) - o->len)
		n = sizeof(o->buf) - o->len;
	memcpy(o->buf + o->len, p, n);
	o->len += n;
}

static inline void script_put_text(struct script_out *o, const char *text)
{
	size_t n = strlen(text);

	script_put(o, n, 1);
	script_put_bytes(o, text, n);
}

/* The folder a seed generator writes to, from its command line; NULL
 * once it said how to call it. */
static inline const char *script_dir(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return NULL;
	}
	return argv[1];
}

/* Writes the script to DIR/NAME and starts the next one. Returns 0 or -1. */
static inline int script_save(struct script_out *o, const char *dir, const char *name)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f) {
		perror(path);
		return -1;
	}
	bool ok = fwrite(o->buf, 1, o->len, f) == o->len;
	if (fclose(f) || !ok) {
		perror(path);
		return -1;
	}
	o->len = 0;
	return 0;
}

#endif
