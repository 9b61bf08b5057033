/*
 * What gpu.c (backend choice, ncclMemAlloc) needs from the CUDA implementation. Two files provide it:
 * gpu_cuda.c, built when CUDA's headers are found, and gpu_none.c otherwise, which finds no device and
 * refuses every device call. Private to src/gpu.
 */
#ifndef BRAID_GPU_GPU_CUDA_H
#define BRAID_GPU_GPU_CUDA_H

#include <stddef.h>

#include "nccl.h"

/* Loads the CUDA driver once (thread-safe) and writes how many devices it offers: 0 when there is no usable
 * driver or device, which is not an error; then *what_p says why in words ("no CUDA driver found (...)"),
 * otherwise it describes the driver ("CUDA driver 12.8, 8 devices"). */
ncclResult_t gpu_cuda_probe(int *ndev_p, const char **what_p);
/* ncclMemAlloc / ncclMemFree on the CUDA backend (see gpu_mem_alloc in gpu.h). Freeing a pointer this did not
 * allocate is ncclInvalidArgument. */
ncclResult_t gpu_cuda_mem_alloc(size_t bytes, void **ptr_p);
ncclResult_t gpu_cuda_mem_free(void *ptr);

#endif
