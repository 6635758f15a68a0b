#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "control_conn.h"
#include "gradgate.h"

/* The few driver types and values used here (cuda.h), declared here so the
 * library builds without the CUDA toolkit. The driver's ABI keeps them. */
typedef int cu_result;                 /* CUresult; 0: CUDA_SUCCESS */
typedef unsigned long long cu_devptr;  /* CUdeviceptr */
enum {
	CU_ATTR_CONTEXT = 1,
	CU_ATTR_MEMORY_TYPE = 2,
	CU_ATTR_BUFFER_ID = 7,
	CU_ATTR_IS_MANAGED = 8,
	CU_ATTR_DEVICE_ORDINAL = 9,
	CU_ATTR_IS_LEGACY_IPC_CAPABLE = 10,
	CU_ATTR_RANGE_START_ADDR = 11,
	CU_ATTR_RANGE_SIZE = 12,
	CU_MEMTYPE_HOST = 1,
	CU_MEMTYPE_DEVICE = 2,
	CU_ERROR_INVALID_VALUE = 1,
	CU_ERROR_INVALID_CONTEXT = 201,
	CU_ERROR_NOT_READY = 600,
};

struct cu_driver {
	cu_result (*init)(unsigned flags);
	cu_result (*pointer_get_attribute)(void *data, int attribute, cu_devptr ptr);
	cu_result (*ctx_push)(void *ctx);
	cu_result (*ctx_pop)(void **ctx);
	cu_result (*ctx_get_device)(int *device);
	cu_result (*ipc_get_mem_handle)(void *handle, cu_devptr ptr);
	cu_result (*stream_synchronize)(void *stream);
	cu_result (*stream_query)(void *stream);
	cu_result (*get_error_name)(cu_result r, const char **name);
	char error[200]; /* why loading failed; "" when it worked */
};
static struct cu_driver drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

/* "file:line" of a failed driver call, as the gateway's CUDA errors name it. */
#define AT gg_source_path(__FILE__), __LINE__

static const char *cu_name(cu_result r)
{
	const char *name = NULL;

	return drv.get_error_name && !drv.get_error_name(r, &name) && name ? name : "unknown CUDA error";
}

static void drv_load(void)
{
	static const struct {
		const char *name;
		size_t offset;
	} syms[] = {
		{ "cuInit", offsetof(struct cu_driver, init) },
		{ "cuPointerGetAttribute", offsetof(struct cu_driver, pointer_get_attribute) },
		{ "cuCtxPushCurrent_v2", offsetof(struct cu_driver, ctx_push) },
		{ "cuCtxPopCurrent_v2", offsetof(struct cu_driver, ctx_pop) },
		{ "cuCtxGetDevice", offsetof(struct cu_driver, ctx_get_device) },
		{ "cuIpcGetMemHandle", offsetof(struct cu_driver, ipc_get_mem_handle) },
		{ "cuStreamSynchronize", offsetof(struct cu_driver, stream_synchronize) },
		{ "cuStreamQuery", offsetof(struct cu_driver, stream_query) },
		{ "cuGetErrorName", offsetof(struct cu_driver, get_error_name) },
	};
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!lib) {
		const char *why = dlerror();
		snprintf(drv.error, sizeof(drv.error), "the CUDA driver cannot be loaded: %s",
			 why ? why : "libcuda.so.1 not found");
		return;
	}
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *fn = dlsym(lib, syms[i].name);
		if (!fn) {
			snprintf(drv.error, sizeof(drv.error), "the CUDA driver (libcuda.so.1) has no %s", syms[i].name);
			return;
		}
		memcpy((char *)&drv + syms[i].offset, &fn, sizeof(fn));
	}
	cu_result r = drv.init(0);
	if (r)
		snprintf(drv.error, sizeof(drv.error), "%s:%d: cuInit failed: %s (CUDA error %d)", AT, cu_name(r), r);
}


static int drv_ready(char *err, size_t err_size)
{
	pthread_once(&drv_once, drv_load);
	if (drv.error[0]) {
		snprintf(err, err_size, "%s", drv.error);
		return GG_ERR_SYSTEM;
	}
	return 0;
}

#define ATTR(var, attr, ptr) drv.pointer_get_attribute(&(var), (attr), (cu_devptr)(uintptr_t)(ptr))

int gg_cudrv_locate(const void *ptr, struct gg_cudrv_alloc *out, char *err, size_t err_size)
{
	unsigned int type = 0, managed = 0, ipc_ok = 0;
	unsigned long long id = 0;
	cu_devptr base = 0;
	size_t size = 0;
	void *ctx = NULL;
	cu_result r;
	int rc;

	memset(out, 0, sizeof(*out));
	if ((rc = drv_ready(err, err_size)))
		return rc;
	r = ATTR(type, CU_ATTR_MEMORY_TYPE, ptr);
	if (r == CU_ERROR_INVALID_VALUE) {
		snprintf(err, err_size, "buf %p is not CUDA device memory (host memory goes through gg_allreduce)", ptr);
		return GG_ERR_INVALID;
	}
	if (!r)
		r = ATTR(managed, CU_ATTR_IS_MANAGED, ptr);
	if (!r && managed) {
		snprintf(err, err_size, "buf %p is CUDA managed memory, which the gateway cannot open: use cudaMalloc",
			 ptr);
		return GG_ERR_INVALID;
	}
	if (!r && type != CU_MEMTYPE_DEVICE) {
		if (type == CU_MEMTYPE_HOST)
			snprintf(err, err_size, "buf %p is not CUDA device memory (pinned host memory goes through "
				 "gg_allreduce)", ptr);
		else
			snprintf(err, err_size, "buf %p is not CUDA device memory (CUDA memory type %u)", ptr, type);
		return GG_ERR_INVALID;
	}
	if (!r)
		r = ATTR(ipc_ok, CU_ATTR_IS_LEGACY_IPC_CAPABLE, ptr);
	if (!r && !ipc_ok) {
		snprintf(err, err_size, "buf %p is CUDA memory that IPC cannot share (a stream-ordered pool of "
			 "cudaMallocAsync, or cuMemCreate): use cudaMalloc", ptr);
		return GG_ERR_INVALID;
	}
	if (!r)
		r = ATTR(base, CU_ATTR_RANGE_START_ADDR, ptr);
	if (!r)
		r = ATTR(size, CU_ATTR_RANGE_SIZE, ptr);
	if (!r)
		r = ATTR(id, CU_ATTR_BUFFER_ID, ptr);
	if (!r)
		r = ATTR(ctx, CU_ATTR_CONTEXT, ptr);
	if (r) {
		snprintf(err, err_size, "%s:%d: cuPointerGetAttribute on buf %p: %s", AT, ptr, cu_name(r));
		return GG_ERR_SYSTEM;
	}
	*out = (struct gg_cudrv_alloc){ .base = base, .size = size, .buffer_id = id, .ctx = ctx };
	return 0;
}

/* cuIpcGetMemHandle (ipc) or cuStreamSynchronize in the allocation's
 * context, whatever context the calling thread has current. */
static int in_context(const struct gg_cudrv_alloc *a, bool ipc, unsigned char *handle, void *stream, char *err,
		      size_t err_size)
{
	void *popped = NULL;
	cu_result r;
	int rc;

	if ((rc = drv_ready(err, err_size)))
		return rc;
	if ((r = drv.ctx_push(a->ctx))) {
		snprintf(err, err_size, "%s:%d: cuCtxPushCurrent (the buffer's context): %s", AT, cu_name(r));
		return GG_ERR_SYSTEM;
	}
	r = ipc ? drv.ipc_get_mem_handle(handle, a->base) : drv.stream_synchronize(stream);
	(void)drv.ctx_pop(&popped);
	if (r) {
		snprintf(err, err_size, "%s:%d: %s: %s", AT,
			 ipc ? "cuIpcGetMemHandle" : "cuStreamSynchronize (the caller's stream)", cu_name(r));
		return GG_ERR_SYSTEM;
	}
	return 0;
}

int gg_cudrv_ipc_handle(const struct gg_cudrv_alloc *a, unsigned char ipc[GG_CUDRV_IPC_SIZE], char *err,
			size_t err_size)
{
	return in_context(a, true, ipc, NULL, err, err_size);
}

int gg_cudrv_sync(const struct gg_cudrv_alloc *a, void *stream, char *err, size_t err_size)
{
	return in_context(a, false, NULL, stream, err, err_size);
}

/* One end of a tensor for gg_cudrv_device_of: `which` names it. */
static int device_byte(const void *ptr, const char *which, int *device, char *err, size_t err_size)
{
	unsigned int type = 0, managed = 0;
	int ordinal = -1;
	cu_result r = ATTR(type, CU_ATTR_MEMORY_TYPE, ptr);

	if (r == CU_ERROR_INVALID_VALUE) {
		snprintf(err, err_size, "%s is not CUDA device memory (host memory goes through gg_allreduce)", which);
		return GG_ERR_INVALID;
	}
	if (!r)
		r = ATTR(managed, CU_ATTR_IS_MANAGED, ptr);
	/* Managed memory may lie on the host when NCCL's kernels touch it,
	 * and has no one device to check against. */
	if (!r && managed) {
		snprintf(err, err_size, "%s is CUDA managed memory: use cudaMalloc or cudaMallocAsync", which);
		return GG_ERR_INVALID;
	}
	if (!r && type != CU_MEMTYPE_DEVICE) {
		snprintf(err, err_size, "%s is not CUDA device memory (%s)", which,
			 type == CU_MEMTYPE_HOST ? "pinned host memory goes through gg_allreduce" : "of another kind");
		return GG_ERR_INVALID;
	}
	if (!r)
		r = ATTR(ordinal, CU_ATTR_DEVICE_ORDINAL, ptr);
	if (r) {
		snprintf(err, err_size, "%s:%d: cuPointerGetAttribute on %s: %s", AT, which, cu_name(r));
		return GG_ERR_SYSTEM;
	}
	*device = ordinal;
	return 0;
}

int gg_cudrv_device_of(const void *ptr, uint64_t bytes, int *device, char *err, size_t err_size)
{
	const unsigned char *last = (const unsigned char *)ptr + (bytes ? bytes - 1 : 0);
	char which[96];
	int first_dev = -1, last_dev = -1;
	int rc;

	*device = -1;
	if ((rc = drv_ready(err, err_size)))
		return rc;
	snprintf(which, sizeof(which), "devbuf %p", ptr);
	if ((rc = device_byte(ptr, which, &first_dev, err, err_size)))
		return rc;
	/* An allocator may map one tensor from several allocations (PyTorch's
	 * expandable segments), so its end is looked at, not its allocation. */
	snprintf(which, sizeof(which), "the last of the %llu bytes at devbuf %p", (unsigned long long)bytes, ptr);
	if ((rc = device_byte(last, which, &last_dev, err, err_size)))
		return rc;
	if (last_dev != first_dev) {
		snprintf(err, err_size, "the %llu bytes at devbuf %p start in memory of GPU %d and end in memory of "
			 "GPU %d", (unsigned long long)bytes, ptr, first_dev, last_dev);
		return GG_ERR_INVALID;
	}
	*device = first_dev;
	return 0;
}

int gg_cudrv_current_device(int *device, char *err, size_t err_size)
{
	int rc;

	*device = -1;
	if ((rc = drv_ready(err, err_size)))
		return rc;
	cu_result r = drv.ctx_get_device(device);
	if (r == CU_ERROR_INVALID_CONTEXT) {
		*device = -1;
		return 0;
	}
	if (r) {
		snprintf(err, err_size, "%s:%d: cuCtxGetDevice: %s", AT, cu_name(r));
		return GG_ERR_SYSTEM;
	}
	return 0;
}

int gg_cudrv_stream_wait(const void *ptr, void *stream, uint64_t deadline_ms, char *err, size_t err_size)
{
	void *ctx = NULL, *popped = NULL;
	cu_result r;
	int rc;

	if ((rc = drv_ready(err, err_size)))
		return rc;
	/* Memory of a stream-ordered pool may name no context: the calling
	 * thread's current one is then the stream's. */
	if (ATTR(ctx, CU_ATTR_CONTEXT, ptr))
		ctx = NULL;
	if (ctx && (r = drv.ctx_push(ctx))) {
		snprintf(err, err_size, "%s:%d: cuCtxPushCurrent (the tensor's context): %s", AT, cu_name(r));
		return GG_ERR_SYSTEM;
	}
	for (unsigned looks = 0;; looks++) {
		r = drv.stream_query(stream);
		if (r != CU_ERROR_NOT_READY)
			break;
		if (gg_ctrl_now_ms() >= deadline_ms)
			break;
		struct timespec nap = { 0, looks < 64 ? 20000 : 500000 };
		nanosleep(&nap, NULL);
	}
	if (ctx)
		(void)drv.ctx_pop(&popped);
	if (r == CU_ERROR_NOT_READY) {
		snprintf(err, err_size, "the work on the caller's stream was not done in time");
		return GG_ERR_TIMEOUT;
	}
	if (r) {
		snprintf(err, err_size, "%s:%d: cuStreamQuery (the caller's stream): %s", AT, cu_name(r));
		return GG_ERR_SYSTEM;
	}
	return 0;
}
