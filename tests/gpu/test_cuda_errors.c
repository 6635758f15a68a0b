/* What a failed CUDA call reports (cuda/cuda_check.h), with or without a
 * GPU: the call and where, CUDA's message and name, the errno the callers
 * act on, and whether the context is lost with it. Error names and strings
 * come from the runtime's tables, so no device is needed. */
#include <errno.h>
#include <stdio.h>
#include <stdbool.h>
#include <string.h>

#include "cuda_check.h"
#include "gg_check.h"

#define LOST "; the gateway's CUDA context is lost with it: every later step on its GPU fails until the gateway restarts"

static void check_runtime(cudaError_t e, int code, const char *name, bool lost)
{
	char err[512], want[256];

	CHECK(gg_cuda_fail(e, "cudaMemcpyAsync(d, s, n)", "../cuda/site_cuda.cu", 42, err, sizeof(err)) == code,
	      "%s: errno", name);
	snprintf(want, sizeof(want), "cuda/site_cuda.cu:42: cudaMemcpyAsync(d, s, n): %s (%s)", cudaGetErrorString(e),
		 name);
	CHECK(!strncmp(err, want, strlen(want)), "%s: got \"%s\", want it to start \"%s\"", name, err, want);
	size_t n = strlen(err), l = strlen(LOST);
	CHECK(lost == (n >= l && !strcmp(err + n - l, LOST)), "%s: \"%s\" %s say the context is lost", name, err,
	      lost ? "does not" : "must not");
}

static void check_driver(int result, bool lost)
{
	char err[512];

	CHECK(gg_cuda_driver_fail(result, "cuMemcpyDtoHAsync", "../gateway/client/cuda_driver.c", 7, err,
				  sizeof(err)) == -EIO,
	      "driver error %d: errno", result);
	char want[96];
	snprintf(want, sizeof(want), "(CUDA driver error %d)", result);
	static const char head[] = "gateway/client/cuda_driver.c:7: cuMemcpyDtoHAsync: ";
	CHECK(!strncmp(err, head, strlen(head)) && strstr(err, want),
	      "driver error %d: \"%s\"", result, err);
	size_t n = strlen(err), l = strlen(LOST);
	CHECK(lost == (n >= l && !strcmp(err + n - l, LOST)), "driver error %d: \"%s\" %s say the context is lost",
	      result, err, lost ? "does not" : "must not");
}

int main(void)
{
	check_runtime(cudaErrorIllegalAddress, -EIO, "cudaErrorIllegalAddress", true);
	check_runtime(cudaErrorLaunchFailure, -EIO, "cudaErrorLaunchFailure", true);
	check_runtime(cudaErrorECCUncorrectable, -EIO, "cudaErrorECCUncorrectable", true);
	check_runtime(cudaErrorMemoryAllocation, -ENOMEM, "cudaErrorMemoryAllocation", false);
	check_runtime(cudaErrorInvalidValue, -EINVAL, "cudaErrorInvalidValue", false);
	check_runtime(cudaErrorNoDevice, -ENODEV, "cudaErrorNoDevice", false);
	check_runtime(cudaErrorInsufficientDriver, -ENODEV, "cudaErrorInsufficientDriver", false);
	check_runtime(cudaErrorLaunchOutOfResources, -EIO, "cudaErrorLaunchOutOfResources", false);

	/* CUDA_ERROR_ILLEGAL_ADDRESS (700) and CUDA_ERROR_ECC_UNCORRECTABLE
	 * (214) stay with the context; CUDA_ERROR_OUT_OF_MEMORY (2) does not.
	 * Without a driver the name is "unknown": the number and the rest hold. */
	check_driver(700, true);
	check_driver(214, true);
	check_driver(2, false);

	char small[16];
	CHECK(gg_cuda_fail(cudaErrorIllegalAddress, "x", "f.c", 1, small, sizeof(small)) == -EIO &&
		      strlen(small) == sizeof(small) - 1,
	      "a short buffer holds the message's start: \"%s\"", small);
	CHECK(gg_cuda_fail(cudaErrorIllegalAddress, "x", "f.c", 1, NULL, 0) == -EIO, "no buffer at all");
	return failures ? 1 : 0;
}
