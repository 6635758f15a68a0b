/* Reference-counted byte buffers, kept in pools for reuse.
 *
 * Frames, received messages and early data are a chunk each, about a
 * megabyte: a fresh malloc of that size is a fresh mapping, and its page
 * faults cost more than encoding the chunk. A pool keeps up to `max`
 * buffers of `cap` bytes; buffers return to it when their last reference
 * goes, and larger ones are malloc'd and freed as usual. Pools of smaller
 * sizes may hang off one (`smaller`, each smaller than the one before): a
 * request goes to the smallest that fits, so a small frame does not hold a
 * large buffer; the chain is trimmed, counted and finished as one.
 *
 * A buffer may be handed between threads: references are atomic and a
 * pool has a lock (taken once per buffer, not per byte). A pool must
 * outlive its buffers. */
#ifndef GG_BUF_H
#define GG_BUF_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct gg_buf_pool;

struct gg_buf {
	atomic_uint refs;
	size_t len;              /* bytes in use, set by the owner */
	size_t cap;              /* bytes data[] holds */
	struct gg_buf_pool *pool; /* where it returns; NULL: freed */
	struct gg_buf *next_free;
	_Alignas(64) uint8_t data[];
};

struct gg_buf_pool {
	pthread_mutex_t lock;
	struct gg_buf *free;
	size_t cap;
	unsigned count, max;
	struct gg_buf_pool *smaller; /* the next size down, or NULL */
};

void gg_buf_pool_init(struct gg_buf_pool *p, size_t cap, unsigned max);
/* Frees the buffers the pool and its smaller ones keep (they stay
 * usable): when idle, and last. */
void gg_buf_pool_trim(struct gg_buf_pool *p);
void gg_buf_pool_fini(struct gg_buf_pool *p);
/* Buffers the pool and its smaller ones keep now. */
unsigned gg_buf_pool_count(struct gg_buf_pool *p);

/* A buffer with room for `cap` bytes, len 0 and one reference, or NULL,
 * from the smallest pool of the chain it fits. `pool` may be NULL. */
struct gg_buf *gg_buf_new(struct gg_buf_pool *pool, size_t cap);
static inline void gg_buf_get(struct gg_buf *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}
/* Drops a reference (NULL is allowed); the last one returns the buffer. */
void gg_buf_put(struct gg_buf *b);

#endif
