/* A stand-in CUDA driver, built as libcuda.so.1 for tests that link it:
 * the client library's dlopen("libcuda.so.1") then finds it loaded
 * already, so gg_allreduce_nccl()'s checks of the caller's memory and
 * stream run on every machine. "Device memory" is host memory the test
 * declares with fcd_add(); a stream is any pointer, its work as done as
 * the hook the test sets says. Only what gateway/client/cuda_driver.c
 * calls is there. */
#ifndef GG_FAKE_CUDA_DRIVER_H
#define GG_FAKE_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>

enum fcd_kind {
	FCD_DEVICE,  /* cudaMalloc'd memory of a device */
	FCD_PINNED,  /* cudaMallocHost'd memory */
	FCD_MANAGED, /* cudaMallocManaged'd memory */
};

/* The `size` bytes at `p` are memory of that kind on `device` from now on
 * (until fcd_remove(p)); at most 32 ranges. */
void fcd_add(void *p, size_t size, enum fcd_kind kind, int device);
void fcd_remove(void *p);
/* The calling thread's current device; -1: it has no current context
 * (the start). */
void fcd_set_current(int device);
/* Whether the work on `stream` is done (cuStreamQuery); NULL: always. */
void fcd_set_stream_hook(bool (*done)(void *stream));
/* True: this is the stand-in (a real libcuda.so.1 has no such symbol). */
bool fcd_is_stand_in(void);

#endif
