/* What gg_allreduce_cuda() and gg_allreduce_nccl() need of the CUDA
 * driver, which the library loads on first use (libcuda.so.1): so
 * libgradgate links and loads without any CUDA library, and programs that
 * never pass device memory never load one. */
#ifndef GG_CUDA_DRIVER_H
#define GG_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#define GG_CUDRV_IPC_SIZE 64

/* The CUDA allocation a device pointer lies in. */
struct gg_cudrv_alloc {
	uint64_t base;      /* its first byte */
	uint64_t size;      /* its bytes */
	uint64_t buffer_id; /* unique to the allocation for the process's life */
	void *ctx;          /* the CUcontext it belongs to */
};

/* Finds the allocation `ptr` lies in. Returns 0, or GG_ERR_INVALID for
 * memory that is not a CUDA device allocation IPC can share (host memory,
 * managed memory, stream-ordered pools) and GG_ERR_SYSTEM when the driver
 * cannot be loaded or fails; `err` (one line) says why. */
int gg_cudrv_locate(const void *ptr, struct gg_cudrv_alloc *out, char *err, size_t err_size);

/* The IPC handle of allocation `a` into `ipc`, and waits for the work on
 * `stream` (a CUstream / cudaStream_t of a's context; NULL: its legacy
 * default stream). Returns 0 or GG_ERR_SYSTEM with `err`. */
int gg_cudrv_ipc_handle(const struct gg_cudrv_alloc *a, unsigned char ipc[GG_CUDRV_IPC_SIZE], char *err,
			size_t err_size);
int gg_cudrv_sync(const struct gg_cudrv_alloc *a, void *stream, char *err, size_t err_size);

/* The device (ordinal) whose memory the `bytes` at `ptr` are, into
 * *device, for gg_allreduce_nccl: the tensor's first and last bytes must
 * be CUDA device memory (any allocator's, IPC or not) of one device; what
 * a kernel of NCCL's could not read is refused with GG_ERR_INVALID before
 * it faults on the GPU. Returns 0, GG_ERR_INVALID or GG_ERR_SYSTEM with
 * `err`. */
int gg_cudrv_device_of(const void *ptr, uint64_t bytes, int *device, char *err, size_t err_size);

/* Waits until the work on `stream` (a CUstream of the context of the
 * memory at `ptr`; NULL: the legacy default stream) is done, looking
 * until `deadline_ms` (CLOCK_MONOTONIC milliseconds). Returns 0,
 * GG_ERR_TIMEOUT, or GG_ERR_SYSTEM with `err`. */
int gg_cudrv_stream_wait(const void *ptr, void *stream, uint64_t deadline_ms, char *err, size_t err_size);

/* The device of the calling thread's current CUDA context into *device,
 * -1 when it has none. Returns 0 or GG_ERR_SYSTEM with `err`. */
int gg_cudrv_current_device(int *device, char *err, size_t err_size);

#endif
