/* fake_cuda_driver.h: the driver calls of gateway/client/cuda_driver.c,
 * with the driver's error codes, over ranges the test declares. */
#include "fake_cuda_driver.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#define API __attribute__((visibility("default")))
#define MAX_RANGES 32

/* The driver's values that cuda_driver.c relies on. */
enum {
	SUCCESS = 0,
	ERROR_INVALID_VALUE = 1,
	ERROR_INVALID_CONTEXT = 201,
	ERROR_NOT_READY = 600,
	ATTR_CONTEXT = 1,
	ATTR_MEMORY_TYPE = 2,
	ATTR_BUFFER_ID = 7,
	ATTR_IS_MANAGED = 8,
	ATTR_DEVICE_ORDINAL = 9,
	ATTR_IS_LEGACY_IPC_CAPABLE = 10,
	ATTR_RANGE_START_ADDR = 11,
	ATTR_RANGE_SIZE = 12,
	MEMTYPE_HOST = 1,
	MEMTYPE_DEVICE = 2,
};

/* The calls, as cuda_driver.c looks them up (cuda.h's types spelled out). */
API int cuInit(unsigned flags);
API int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr);
API int cuCtxPushCurrent_v2(void *ctx);
API int cuCtxPopCurrent_v2(void **ctx);
API int cuCtxGetDevice(int *device);
API int cuIpcGetMemHandle(void *handle, unsigned long long ptr);
API int cuStreamQuery(void *stream);
API int cuStreamSynchronize(void *stream);
API int cuGetErrorName(int r, const char **name);

struct range {
	uintptr_t base;
	size_t size;
	enum fcd_kind kind;
	int device;
	unsigned long long id;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range ranges[MAX_RANGES];
static unsigned long long next_id = 1;
static bool (*stream_done)(void *stream);
static __thread int current = -1;
/* One context per device: its address stands for it. */
static char contexts[16];

API void fcd_add(void *p, size_t size, enum fcd_kind kind, int device)
{
	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < MAX_RANGES; i++)
		if (!ranges[i].size) {
			ranges[i] = (struct range){ (uintptr_t)p, size, kind, device, next_id++ };
			break;
		}
	pthread_mutex_unlock(&lock);
}

API void fcd_remove(void *p)
{
	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < MAX_RANGES; i++)
		if (ranges[i].size && ranges[i].base == (uintptr_t)p)
			ranges[i].size = 0;
	pthread_mutex_unlock(&lock);
}

API void fcd_set_current(int device)
{
	current = device;
}

API void fcd_set_stream_hook(bool (*done)(void *stream))
{
	pthread_mutex_lock(&lock);
	stream_done = done;
	pthread_mutex_unlock(&lock);
}

API bool fcd_is_stand_in(void)
{
	return true;
}

static bool find(uintptr_t p, struct range *out)
{
	bool found = false;

	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < MAX_RANGES && !found; i++)
		if (ranges[i].size && p >= ranges[i].base && p - ranges[i].base < ranges[i].size) {
			*out = ranges[i];
			found = true;
		}
	pthread_mutex_unlock(&lock);
	return found;
}

API int cuInit(unsigned flags)
{
	return flags ? ERROR_INVALID_VALUE : SUCCESS;
}

/* As the driver: plain host memory is unknown to it. */
API int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
	struct range r;

	if (!find((uintptr_t)ptr, &r))
		return ERROR_INVALID_VALUE;
	switch (attribute) {
	case ATTR_MEMORY_TYPE:
		*(unsigned *)data = r.kind == FCD_PINNED ? MEMTYPE_HOST : MEMTYPE_DEVICE;
		return SUCCESS;
	case ATTR_IS_MANAGED:
		*(unsigned *)data = r.kind == FCD_MANAGED;
		return SUCCESS;
	case ATTR_DEVICE_ORDINAL:
		*(int *)data = r.device;
		return SUCCESS;
	case ATTR_IS_LEGACY_IPC_CAPABLE:
		*(unsigned *)data = r.kind == FCD_DEVICE;
		return SUCCESS;
	case ATTR_CONTEXT:
		*(void **)data = &contexts[r.device];
		return SUCCESS;
	case ATTR_RANGE_START_ADDR:
		*(unsigned long long *)data = r.base;
		return SUCCESS;
	case ATTR_RANGE_SIZE:
		*(size_t *)data = r.size;
		return SUCCESS;
	case ATTR_BUFFER_ID:
		*(unsigned long long *)data = r.id;
		return SUCCESS;
	default:
		return ERROR_INVALID_VALUE;
	}
}

/* One level of pushed context is all cuda_driver.c uses. */
static __thread int pushed_over = -2;

API int cuCtxPushCurrent_v2(void *ctx)
{
	char *c = ctx;

	if (c < contexts || c >= contexts + sizeof(contexts) || pushed_over != -2)
		return ERROR_INVALID_CONTEXT;
	pushed_over = current;
	current = (int)(c - contexts);
	return SUCCESS;
}

API int cuCtxPopCurrent_v2(void **ctx)
{
	if (pushed_over == -2)
		return ERROR_INVALID_CONTEXT;
	if (ctx)
		*ctx = &contexts[current];
	current = pushed_over;
	pushed_over = -2;
	return SUCCESS;
}

API int cuCtxGetDevice(int *device)
{
	if (current < 0)
		return ERROR_INVALID_CONTEXT;
	*device = current;
	return SUCCESS;
}

API int cuIpcGetMemHandle(void *handle, unsigned long long ptr)
{
	struct range r;

	if (!find((uintptr_t)ptr, &r) || r.kind != FCD_DEVICE)
		return ERROR_INVALID_VALUE;
	memset(handle, 0, 64);
	memcpy(handle, &r.id, sizeof(r.id));
	return SUCCESS;
}

API int cuStreamQuery(void *stream)
{
	pthread_mutex_lock(&lock);
	bool (*done)(void *) = stream_done;
	pthread_mutex_unlock(&lock);
	return !done || done(stream) ? SUCCESS : ERROR_NOT_READY;
}

API int cuStreamSynchronize(void *stream)
{
	while (cuStreamQuery(stream) == ERROR_NOT_READY)
		sched_yield();
	return SUCCESS;
}

API int cuGetErrorName(int r, const char **name)
{
	switch (r) {
	case SUCCESS:
		*name = "CUDA_SUCCESS";
		return SUCCESS;
	case ERROR_INVALID_VALUE:
		*name = "CUDA_ERROR_INVALID_VALUE";
		return SUCCESS;
	case ERROR_INVALID_CONTEXT:
		*name = "CUDA_ERROR_INVALID_CONTEXT";
		return SUCCESS;
	case ERROR_NOT_READY:
		*name = "CUDA_ERROR_NOT_READY";
		return SUCCESS;
	default:
		return ERROR_INVALID_VALUE;
	}
}
