/* Pooled buffers: a request takes a buffer from the smallest pool of a
 * chain that fits it, goes back to that pool, and a chain is counted and
 * trimmed as one; requests larger than every pool are not pooled, and a
 * pool keeps no more than its `max`. */
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "gg_check.h"

int main(void)
{
	struct gg_buf_pool big, mid, small;

	gg_buf_pool_init(&big, 1 << 20, 2);
	gg_buf_pool_init(&mid, 512 << 10, 2);
	gg_buf_pool_init(&small, 256 << 10, 1);
	big.smaller = &mid;
	mid.smaller = &small;

	struct gg_buf *a = gg_buf_new(&big, 300 << 10), *b = gg_buf_new(&big, 1000), *c = gg_buf_new(&big, 1 << 20),
		      *d = gg_buf_new(&big, (1 << 20) + 1), *e = gg_buf_new(&big, 256 << 10);
	CHECK(a && b && c && d && e, "allocations");
	if (!a || !b || !c || !d || !e)
		return 1;
	CHECK(a->pool == &mid && a->cap == 512 << 10, "300 KiB from the 512 KiB pool: cap %zu", a->cap);
	CHECK(b->pool == &small && b->cap == 256 << 10, "1000 bytes from the smallest pool: cap %zu", b->cap);
	CHECK(e->pool == &small, "256 KiB exactly fits the smallest pool");
	CHECK(c->pool == &big && c->cap == 1 << 20, "1 MiB from the largest: cap %zu", c->cap);
	CHECK(!d->pool && d->cap == (1 << 20) + 1, "larger than every pool: its own size, not pooled (cap %zu)", d->cap);
	memset(c->data, 0xab, c->cap); /* the whole capacity is there */
	memset(d->data, 0xcd, d->cap);

	gg_buf_put(a);
	gg_buf_put(b);
	gg_buf_put(c);
	gg_buf_put(d);
	gg_buf_put(e); /* the smallest pool keeps one: this one is freed */
	CHECK(gg_buf_pool_count(&big) == 3, "the chain keeps 3 buffers, not %u", gg_buf_pool_count(&big));
	CHECK(gg_buf_pool_count(&mid) == 2, "the 512 KiB pool and below keep 2, not %u", gg_buf_pool_count(&mid));

	struct gg_buf *again = gg_buf_new(&big, 400 << 10);
	CHECK(again && again->pool == &mid && gg_buf_pool_count(&mid) == 1 && again == a,
	      "a request reuses the buffer its pool kept");
	if (!again)
		return 1;
	gg_buf_get(again);
	gg_buf_put(again);
	CHECK(gg_buf_pool_count(&big) == 2, "a buffer still referenced stays out of its pool");
	gg_buf_put(again);
	CHECK(gg_buf_pool_count(&big) == 3, "and goes back with its last reference");

	gg_buf_pool_trim(&big);
	CHECK(gg_buf_pool_count(&big) == 0, "trimmed along the chain: %u left", gg_buf_pool_count(&big));
	struct gg_buf *after = gg_buf_new(&big, 100);
	CHECK(after && after->pool == &small, "a trimmed chain still serves");
	gg_buf_put(after);
	gg_buf_pool_fini(&big);
	printf("buf: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
