/* The GPU this build targets runs our kernels and returns their bytes. */
#include <stdio.h>

#include "cuda_probe.h"
#include "gpu_test.h"

int main(void)
{
	struct gg_cuda_info info;
	char err[256];

	gpu_test_device_count(); /* skips without a GPU, fails with one it cannot use */
	gg_cuda_probe(&info);
	CHECK(info.device_count > 0, "the probe sees no GPU: %s", info.error);
	printf("device 0: %s (sm_%d%d), runtime %d, driver %d\n", info.device_name, info.cc_major,
	       info.cc_minor, info.runtime_version, info.driver_version);
	if (gg_cuda_selftest(err, sizeof(err))) {
		printf("FAIL: %s\n", err);
		return 1;
	}
	printf("kernel self-test passed\n");
	return 0;
}
