/*
 * The narrow device interface: which executor this process uses, and the memory calls that depend on it.
 *
 * Two implementations stand behind it: the host backend (collectives on host memory, moved by CPU threads)
 * and CUDA. The CUDA driver is looked up at run time, so the library loads and runs the host backend on a
 * machine without a GPU driver. BRAID_DEVICE=host forces the host backend.
 */
#ifndef BRAID_GPU_GPU_H
#define BRAID_GPU_GPU_H

#include <stddef.h>

#include "nccl.h"

typedef enum { GPU_BACKEND_HOST = 0, GPU_BACKEND_CUDA = 1 } gpu_backend_t;

/* The process's backend, decided once (BRAID_DEVICE, then whether a CUDA device is present). Fails with a
 * clear message when a CUDA device is present but this build cannot drive it. */
ncclResult_t gpu_backend(gpu_backend_t *backend_p);
/* Memory for ncclMemAlloc: page-aligned, zero-copy capable on the active backend. */
ncclResult_t gpu_mem_alloc(size_t bytes, void **ptr_p);
ncclResult_t gpu_mem_free(void *ptr);

#endif
