/* For tests of code that keeps tensors on the gateway's GPU (dev_mem.h):
 * the skip when there is no GPU to use. */
#ifndef GG_DEV_SKIP_H
#define GG_DEV_SKIP_H

#include <stdio.h>
#include <stdlib.h>

#include "dev_mem.h"

/* Exits 77 (skipped), saying why, unless a stream on the gateway's GPU
 * can be made. */
static inline void dev_require_gpu(void)
{
	char why[256];
	void *probe;

	if (gg_dev_stream_new(&probe, why, sizeof(why))) {
		printf("skipped: no GPU: %s\n", why);
		exit(77);
	}
	gg_dev_stream_free(probe);
}

#endif
