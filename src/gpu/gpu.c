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

/* ---- Without a CUDA implementation: every device call is refused. ---- */

static ncclResult_t no_cuda(const char *what) {
  return log_err(ncclInvalidUsage, "%s: this build of Braid has no CUDA support", what);
}

ncclResult_t gpu_current_device(int *dev_p) {
  return no_cuda("gpu_current_device");
}
ncclResult_t gpu_device_count(int *count_p) {
  return no_cuda("gpu_device_count");
}
ncclResult_t gpu_device_sms(int dev, int *sms_p) {
  return no_cuda("gpu_device_sms");
}
ncclResult_t gpu_device_busid(int dev, char busid[16]) {
  return no_cuda("gpu_device_busid");
}
ncclResult_t gpu_can_access_peer(int dev, int peer_dev, int *yes_p) {
  return no_cuda("gpu_can_access_peer");
}
ncclResult_t gpu_enable_peer_access(int dev, int peer_dev) {
  return no_cuda("gpu_enable_peer_access");
}
ncclResult_t gpu_enter(int dev, gpu_scope_t *scope) {
  return no_cuda("gpu_enter");
}
void gpu_leave(gpu_scope_t *scope) {}
ncclResult_t gpu_dev_alloc(int dev, size_t bytes, gpu_mem_t **mem_p) {
  return no_cuda("gpu_dev_alloc");
}
void *gpu_mem_ptr(const gpu_mem_t *mem) {
  return NULL;
}
size_t gpu_mem_size(const gpu_mem_t *mem) {
  return 0;
}
void gpu_mem_release(gpu_mem_t *mem) {}
ncclResult_t gpu_mem_export(const gpu_mem_t *mem, gpu_export_t *blob_p) {
  return no_cuda("gpu_mem_export");
}
ncclResult_t gpu_mem_import(int dev, const gpu_export_t *blob, gpu_mem_t **mem_p) {
  return no_cuda("gpu_mem_import");
}
ncclResult_t gpu_host_alloc(size_t bytes, void **host_p, void **dev_p) {
  return no_cuda("gpu_host_alloc");
}
void gpu_host_free(void *host) {}
ncclResult_t gpu_host_register(void *host, size_t bytes, void **dev_p) {
  return no_cuda("gpu_host_register");
}
void gpu_host_unregister(void *host) {}
ncclResult_t gpu_copy_to_device(void *dst, const void *src, size_t bytes) {
  return no_cuda("gpu_copy_to_device");
}
ncclResult_t gpu_event_create(gpu_event_t **event_p) {
  return no_cuda("gpu_event_create");
}
void gpu_event_destroy(gpu_event_t *event) {}
ncclResult_t gpu_event_record(gpu_event_t *event, cudaStream_t stream) {
  return no_cuda("gpu_event_record");
}
ncclResult_t gpu_event_query(gpu_event_t *event, int *done_p) {
  return no_cuda("gpu_event_query");
}
ncclResult_t gpu_stream_wait(cudaStream_t stream, gpu_event_t *event) {
  return no_cuda("gpu_stream_wait");
}
ncclResult_t gpu_stream_capturing(cudaStream_t stream, int *yes_p) {
  return no_cuda("gpu_stream_capturing");
}
ncclResult_t gpu_stream_sync(cudaStream_t stream) {
  return no_cuda("gpu_stream_sync");
}
ncclResult_t gpu_func_load(int dev, const void *fatbin, const char *name, gpu_func_t **func_p) {
  return no_cuda("gpu_func_load");
}
ncclResult_t gpu_launch(gpu_func_t *func, unsigned grid, unsigned block, void *param, size_t param_bytes,
                        cudaStream_t stream) {
  return no_cuda("gpu_launch");
}
