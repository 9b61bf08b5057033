/*
 * Backend selection and backend-specific memory (see gpu.h). The CUDA driver is probed with dlopen so that
 * nothing here links against CUDA.
 */
#include "gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static gpu_backend_t chosen;
static int cuda_devices;       /* devices the CUDA driver reports (0 without a driver) */
static const char *choice_err; /* why no usable backend could be chosen, or NULL */

typedef int (*cu_init_fn_t)(unsigned);
typedef int (*cu_count_fn_t)(int *);

/* Number of CUDA devices, 0 when there is no driver or no device. */
static int probe_cuda(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return 0;
  cu_init_fn_t cu_init = (cu_init_fn_t)dlsym(lib, "cuInit");
  cu_count_fn_t cu_count = (cu_count_fn_t)dlsym(lib, "cuDeviceGetCount");
  int n = 0;
  if (cu_init == NULL || cu_count == NULL || cu_init(0) != 0 || cu_count(&n) != 0) n = 0;
  dlclose(lib);
  return n;
}

static void choose(void) {
  const char *want = param_str(P_BRAID_DEVICE);
  if (strcmp(want, "host") == 0) {
    chosen = GPU_BACKEND_HOST;
  } else if (strcmp(want, "auto") == 0 || strcmp(want, "cuda") == 0) {
    cuda_devices = probe_cuda();
    if (cuda_devices > 0)
      choice_err =
          "this build of Braid has no CUDA executor yet; set BRAID_DEVICE=host to run on host memory";
    else if (strcmp(want, "cuda") == 0)
      choice_err = "BRAID_DEVICE=cuda but no CUDA driver or device was found";
    chosen = GPU_BACKEND_HOST;
  } else {
    choice_err = "BRAID_DEVICE must be auto, host or cuda";
  }
  if (choice_err == NULL)
    INFO(LOG_INIT, "executor: host backend (collectives on host memory)%s",
         cuda_devices == 0 ? "; no CUDA driver or device found" : "");
}

ncclResult_t gpu_backend(gpu_backend_t *backend_p) {
  pthread_once(&once, choose);
  if (choice_err != NULL)
    return log_err(ncclInvalidUsage, "%s (BRAID_DEVICE=%s)", choice_err, param_str(P_BRAID_DEVICE));
  *backend_p = chosen;
  return ncclSuccess;
}

ncclResult_t gpu_mem_alloc(size_t bytes, void **ptr_p) {
  gpu_backend_t backend;
  CHECK(gpu_backend(&backend));
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes > 0 ? bytes : 1) != 0)
    return log_err(ncclSystemError, "ncclMemAlloc: out of host memory allocating %zu bytes", bytes);
  *ptr_p = p;
  return ncclSuccess;
}

ncclResult_t gpu_mem_free(void *ptr) {
  free(ptr);
  return ncclSuccess;
}
