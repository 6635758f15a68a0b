/* What the CUDA runtime, driver and NCCL this build links against report. */
#ifndef GG_CUDA_PROBE_H
#define GG_CUDA_PROBE_H

#ifdef __cplusplus
extern "C" {
#endif

struct gg_cuda_info {
	int runtime_version; /* e.g. 13000 */
	int driver_version;  /* 0 when no driver is installed */
	int device_count;    /* 0 when no usable GPU */
	int nccl_version;    /* 0 when built without NCCL */
	char device_name[256];
	int cc_major, cc_minor;
	char error[160];     /* why device_count is 0, when it is */
};

/* Never fails: a machine without a GPU is a normal answer. */
void gg_cuda_probe(struct gg_cuda_info *info);

/* Writes a pattern on device 0 with a kernel and reads it back.
 * Returns 0, or -ENODEV without a GPU, or -EIO with `error` filled. */
int gg_cuda_selftest(char *error, unsigned long error_size);

#ifdef __cplusplus
}
#endif

#endif
