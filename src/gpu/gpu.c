/*
 * Backend selection and ncclMemAlloc (see gpu.h). The CUDA driver is probed through gpu_cuda_probe
 * (gpu_cuda.c loads it with dlopen, so nothing here links against CUDA).
 */
#include "gpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "device/dev.h"

/* The choice, made once under `once` and read-only after. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static gpu_backend_t chosen;
static char choice_err[512]; /* why no usable backend could be chosen; "" when one was */

/* Why CUDA cannot be used here, into buf; returns 1 when it can. */
static int cuda_usable(char *buf, size_t len) {
  int ndev = 0;
  const char *what = "";
  if (gpu_cuda_probe(&ndev, &what) != ncclSuccess) ndev = 0;
  if (ndev > 0 && dev_nfatbins > 0) {
    snprintf(buf, len, "%s", what);
    return 1;
  }
  if (ndev == 0)
    snprintf(buf, len, "%s", what);
  else
    snprintf(buf, len, "%s, but this build of Braid has no GPU kernels", what);
  return 0;
}

static void choose(void) {
  const char *want = param_str(P_BRAID_DEVICE);
  char why[400];
  if (strcmp(want, "host") == 0) {
    chosen = GPU_BACKEND_HOST;
    INFO(LOG_INIT, "executor: host backend (BRAID_DEVICE=host): collectives run on host memory");
  } else if (strcmp(want, "auto") != 0 && strcmp(want, "cuda") != 0) {
    snprintf(choice_err, sizeof choice_err, "BRAID_DEVICE must be auto, host or cuda");
  } else if (cuda_usable(why, sizeof why)) {
    chosen = GPU_BACKEND_CUDA;
    INFO(LOG_INIT, "executor: CUDA (%s)", why);
  } else if (strcmp(want, "cuda") == 0) {
    snprintf(choice_err, sizeof choice_err, "cannot use CUDA: %s", why);
  } else {
    chosen = GPU_BACKEND_HOST;
    /* With devices present, device buffers handed to the host backend would fault: worth a warning. */
    if (strstr(why, "no GPU kernels") != NULL)
      WARN("executor: host backend: %s; collectives run on host memory", why);
    else
      INFO(LOG_INIT, "executor: host backend: %s; running collectives on host memory", why);
  }
}

ncclResult_t gpu_backend(gpu_backend_t *backend_p) {
  pthread_once(&once, choose);
  if (choice_err[0] != '\0')
    return log_err(ncclInvalidUsage, "%s (BRAID_DEVICE=%s)", choice_err, param_str(P_BRAID_DEVICE));
  *backend_p = chosen;
  return ncclSuccess;
}

/* Host memory handed out by ncclMemAlloc on the host backend, so that ncclMemFree frees only that (as the
 * CUDA backend's registry does). */
typedef struct host_block {
  struct host_block *next;
  void *ptr;
} host_block_t;
static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static host_block_t *host_blocks;

ncclResult_t gpu_mem_alloc(size_t bytes, void **ptr_p) {
  gpu_backend_t backend = GPU_BACKEND_HOST;
  CHECK(gpu_backend(&backend));
  if (backend == GPU_BACKEND_CUDA) return gpu_cuda_mem_alloc(bytes, ptr_p);
  void *p = NULL;
  host_block_t *b = malloc(sizeof *b);
  if (b == NULL || posix_memalign(&p, 4096, bytes > 0 ? bytes : 1) != 0) {
    free(b);
    return log_err(ncclSystemError, "ncclMemAlloc: out of host memory allocating %zu bytes", bytes);
  }
  b->ptr = p;
  pthread_mutex_lock(&host_lock);
  b->next = host_blocks;
  host_blocks = b;
  pthread_mutex_unlock(&host_lock);
  *ptr_p = p;
  return ncclSuccess;
}

ncclResult_t gpu_mem_free(void *ptr) {
  gpu_backend_t backend = GPU_BACKEND_HOST;
  CHECK(gpu_backend(&backend));
  if (backend == GPU_BACKEND_CUDA) return gpu_cuda_mem_free(ptr);
  host_block_t *b = NULL;
  pthread_mutex_lock(&host_lock);
  for (host_block_t **link = &host_blocks; *link != NULL; link = &(*link)->next) {
    if ((*link)->ptr != ptr) continue;
    b = *link;
    *link = b->next;
    break;
  }
  pthread_mutex_unlock(&host_lock);
  if (b == NULL)
    return log_err(ncclInvalidArgument,
                   "ncclMemFree: %p was not allocated by ncclMemAlloc (or was freed already)", ptr);
  free(b->ptr);
  free(b);
  return ncclSuccess;
}
