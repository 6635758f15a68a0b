/* What tests may ask of cuda_double.c, the host stand-in for the gateway's
 * GPU (dev_mem.h and the codec kernels on fenced host memory). */
#ifndef GG_CUDA_DOUBLE_H
#define GG_CUDA_DOUBLE_H

/* Device allocations freed so far (gg_dev_free). */
unsigned cuda_double_device_frees(void);

#endif
