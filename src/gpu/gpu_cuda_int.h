/*
 * What gpu_cuda.c and gpu_cuda_stream.c share: the driver's entry points as loaded, the calls' error
 * reporting, and the checks every entry point makes first. Only those two files include it.
 */
#ifndef BRAID_GPU_GPU_CUDA_INT_H
#define BRAID_GPU_GPU_CUDA_INT_H

#include <cuda.h>

#include "nccl.h"
#include "gpu_cuda.h"

/* The resolved entry points. A field's name is the macro-expanded one (cuMemAlloc_v2); call them as
 * drv.cuMemAlloc, which expands the same way. */
#define CU_FIELD(name)             __typeof__(&name) name;
#define CU_FIELD_TYPED(name, type) type name;
typedef struct {
  GPU_CUDA_FUNCS(CU_FIELD)
  GPU_CUDA_FUNCS_TYPED(CU_FIELD_TYPED)
} gpu_cuda_drv_t;
extern gpu_cuda_drv_t drv; /* defined in gpu_cuda.c, filled once when the driver is loaded */

/* Calls drv.fn args; on failure reports the call (by base name), its CUresult and the values, and returns. */
#define CU_CALL(fn, args, ...)                                                                               \
  do {                                                                                                       \
    CUresult cu_res_ = drv.fn args;                                                                          \
    if (cu_res_ != CUDA_SUCCESS) return cu_fail(cu_res_, #fn, __VA_ARGS__);                                  \
  } while (0)
/* The same, storing the result in `res` and jumping to `label`. */
#define CU_GOTO(fn, args, res, label, ...)                                                                   \
  do {                                                                                                       \
    CUresult cu_res_ = drv.fn args;                                                                          \
    if (cu_res_ != CUDA_SUCCESS) {                                                                           \
      (res) = cu_fail(cu_res_, #fn, __VA_ARGS__);                                                            \
      goto label;                                                                                            \
    }                                                                                                        \
  } while (0)
/* The same in teardown paths, where the failure is reported and teardown goes on. */
#define CU_WARN(fn, args, ...)                                                                               \
  do {                                                                                                       \
    CUresult cu_res_ = drv.fn args;                                                                          \
    if (cu_res_ != CUDA_SUCCESS) cu_fail(cu_res_, #fn, __VA_ARGS__);                                         \
  } while (0)

/* Reports a failed driver call once: its name, the CUresult's name and the values involved. */
ncclResult_t cu_fail(CUresult r, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The driver is loaded and has a usable device (else a usage error naming `what`). */
ncclResult_t gpu_cuda_ready(const char *what);
/* The same, and `dev` is one of its devices. */
ncclResult_t gpu_cuda_check_dev(int dev, const char *what);
/* The error for a fatbin without code device `dev` runs: the device's architecture and the build's. */
ncclResult_t gpu_cuda_no_code(int dev);

#endif
