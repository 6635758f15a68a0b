#include "buf.h"

#include <stdlib.h>

void gg_buf_pool_init(struct gg_buf_pool *p, size_t cap, unsigned max)
{
	*p = (struct gg_buf_pool){ .cap = cap, .max = max };
	pthread_mutex_init(&p->lock, NULL);
}

void gg_buf_pool_trim(struct gg_buf_pool *p)
{
	for (; p; p = p->smaller) {
		pthread_mutex_lock(&p->lock);
		struct gg_buf *b = p->free;
		p->free = NULL;
		p->count = 0;
		pthread_mutex_unlock(&p->lock);
		while (b) {
			struct gg_buf *next = b->next_free;
			free(b);
			b = next;
		}
	}
}

void gg_buf_pool_fini(struct gg_buf_pool *p)
{
	gg_buf_pool_trim(p);
	for (; p; p = p->smaller)
		pthread_mutex_destroy(&p->lock);
}

unsigned gg_buf_pool_count(struct gg_buf_pool *p)
{
	unsigned n = 0;

	for (; p; p = p->smaller) {
		pthread_mutex_lock(&p->lock);
		n += p->count;
		pthread_mutex_unlock(&p->lock);
	}
	return n;
}

struct gg_buf *gg_buf_new(struct gg_buf_pool *pool, size_t cap)
{
	struct gg_buf *b = NULL;

	while (pool && pool->smaller && cap <= pool->smaller->cap)
		pool = pool->smaller;
	if (pool && cap <= pool->cap) {
		pthread_mutex_lock(&pool->lock);
		if ((b = pool->free)) {
			pool->free = b->next_free;
			pool->count--;
		}
		pthread_mutex_unlock(&pool->lock);
		cap = pool->cap; /* a pool-sized buffer, so it can go back */
	} else {
		pool = NULL;
	}
	if (!b) {
		void *mem;
		if (posix_memalign(&mem, _Alignof(struct gg_buf), sizeof(*b) + cap))
			return NULL;
		b = mem;
		b->pool = pool;
		b->cap = cap;
	}
	atomic_init(&b->refs, 1);
	b->len = 0;
	b->next_free = NULL;
	return b;
}

void gg_buf_put(struct gg_buf *b)
{
	if (!b || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
		return;
	struct gg_buf_pool *p = b->pool;
	if (p) {
		pthread_mutex_lock(&p->lock);
		if (p->count < p->max) {
			b->next_free = p->free;
			p->free = b;
			p->count++;
			b = NULL;
		}
		pthread_mutex_unlock(&p->lock);
	}
	free(b);
}
