/* For tests of code that keeps tensors on the gateway's GPU (dev_mem.h):
 * the skip when there is no GPU to use. */
#ifndef GG_DEV_SKIP_H
#define GG_DEV_SKIP_H

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_mem.h"

/* Returns once a stream on the gateway's GPU can be made. Exits 77
 * (skipped), saying why, where there is no GPU: no CUDA driver at all, or
 * a driver that sees no device. Any other failure (a driver too old for
 * this CUDA, a device that cannot be used) fails the test, as in
 * tests/gpu/gpu_test.h: a machine with a GPU must not pass by skipping. */
static inline void dev_require_gpu(void)
{
	char why[256];
	void *probe;
	int rc = gg_dev_stream_new(&probe, why, sizeof(why));

	if (!rc) {
		gg_dev_stream_free(probe);
		return;
	}
	if (rc == -ENODEV && (strstr(why, "cudaErrorNoDevice") || !dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL))) {
		printf("skipped: no GPU: %s\n", why);
		exit(77);
	}
	printf("FAIL: the GPU cannot be used: %s\n", why);
	exit(1);
}

#endif
