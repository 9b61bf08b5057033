/*
 * The CUDA implementation of the device interface (gpu.h), its second half: streams, events, graphs'
 * capture state and user objects, and kernels (modules loaded once per device and fatbin). gpu_cuda.c loads
 * the driver and holds devices, contexts and memory.
 */
#include <cuda.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "cu_launch.h"
#include "gpu.h"
#include "gpu_cuda_int.h"

/* ---- Streams, events, kernels ---- */

ncclResult_t gpu_event_create(gpu_event_t **event_p) {
  CHECK(gpu_cuda_ready("gpu_event_create"));
  CUevent ev;
  CU_CALL(cuEventCreate, (&ev, CU_EVENT_DISABLE_TIMING), "an event without timing");
  *event_p = (gpu_event_t *)ev;
  return ncclSuccess;
}

void gpu_event_destroy(gpu_event_t *event) {
  if (event != NULL) CU_WARN(cuEventDestroy, ((CUevent)event), "event %p", (void *)event);
}

ncclResult_t gpu_event_record(gpu_event_t *event, cudaStream_t stream) {
  CHECK(gpu_cuda_ready("gpu_event_record"));
  CU_CALL(cuEventRecord, ((CUevent)event, stream), "event %p on stream %p", (void *)event, (void *)stream);
  return ncclSuccess;
}

ncclResult_t gpu_event_query(gpu_event_t *event, int *done_p) {
  CHECK(gpu_cuda_ready("gpu_event_query"));
  CUresult r = drv.cuEventQuery((CUevent)event);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY)
    return cu_fail(r, "cuEventQuery", "event %p", (void *)event);
  *done_p = r == CUDA_SUCCESS;
  return ncclSuccess;
}

ncclResult_t gpu_stream_wait(cudaStream_t stream, gpu_event_t *event) {
  CHECK(gpu_cuda_ready("gpu_stream_wait"));
  CU_CALL(cuStreamWaitEvent, (stream, (CUevent)event, 0), "stream %p waiting for event %p", (void *)stream,
          (void *)event);
  return ncclSuccess;
}

ncclResult_t gpu_stream_capture(cudaStream_t stream, int *yes_p, void **graph_p, uint64_t *id_p) {
  CHECK(gpu_cuda_ready("gpu_stream_capture"));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = NULL;
  cuuint64_t id = 0;
  CU_CALL(cuStreamGetCaptureInfo, (stream, &status, &id, &graph, NULL, NULL), "stream %p", (void *)stream);
  if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    return log_err(ncclInvalidUsage,
                   "the capture on stream %p was invalidated by an earlier error; end it and capture again",
                   (void *)stream);
  *yes_p = status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  *graph_p = graph;
  *id_p = id;
  return ncclSuccess;
}

ncclResult_t gpu_graph_hold(void *graph, void (*release)(void *), void *arg) {
  CHECK(gpu_cuda_ready("gpu_graph_hold"));
  CUuserObject obj;
  /* the object's one reference moves to the graph; copies made by instantiation hold their own */
  CU_CALL(cuUserObjectCreate, (&obj, arg, release, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC), "graph %p", graph);
  CU_CALL(cuGraphRetainUserObject, ((CUgraph)graph, obj, 1, CU_GRAPH_USER_OBJECT_MOVE), "graph %p", graph);
  return ncclSuccess;
}

ncclResult_t gpu_capture_relax(int *saved_p) {
  CHECK(gpu_cuda_ready("gpu_capture_relax"));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_CALL(cuThreadExchangeStreamCaptureMode, (&mode), "relaxed");
  *saved_p = (int)mode;
  return ncclSuccess;
}

void gpu_capture_restore(int saved) {
  CUstreamCaptureMode mode = (CUstreamCaptureMode)saved;
  CU_WARN(cuThreadExchangeStreamCaptureMode, (&mode), "mode %d", saved);
}

ncclResult_t gpu_copy_async(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  CHECK(gpu_cuda_ready("gpu_copy_async"));
  CU_CALL(cuMemcpyHtoDAsync, ((CUdeviceptr)dst, src, bytes, stream), "%zu bytes from %p to %p on stream %p",
          bytes, src, dst, (void *)stream);
  return ncclSuccess;
}

ncclResult_t gpu_stream_write32(cudaStream_t stream, void *word, uint32_t value) {
  CHECK(gpu_cuda_ready("gpu_stream_write32"));
  CU_CALL(cuStreamWriteValue32, (stream, (CUdeviceptr)word, value, CU_STREAM_WRITE_VALUE_DEFAULT),
          "%u into %p on stream %p", value, word, (void *)stream);
  return ncclSuccess;
}

ncclResult_t gpu_copy_dd_async(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  CHECK(gpu_cuda_ready("gpu_copy_dd_async"));
  CU_CALL(cuMemcpyDtoDAsync, ((CUdeviceptr)dst, (CUdeviceptr)src, bytes, stream),
          "%zu bytes from %p to %p on stream %p", bytes, src, dst, (void *)stream);
  return ncclSuccess;
}

ncclResult_t gpu_stream_create(cudaStream_t *stream_p) {
  CHECK(gpu_cuda_ready("gpu_stream_create"));
  CUstream s = NULL;
  CU_CALL(cuStreamCreate, (&s, CU_STREAM_NON_BLOCKING), "a non-blocking stream");
  *stream_p = (cudaStream_t)s;
  return ncclSuccess;
}

void gpu_stream_destroy(cudaStream_t stream) {
  if (stream != NULL) CU_WARN(cuStreamDestroy, ((CUstream)stream), "stream %p", (void *)stream);
}

ncclResult_t gpu_event_sync(gpu_event_t *event) {
  CHECK(gpu_cuda_ready("gpu_event_sync"));
  CU_CALL(cuEventSynchronize, ((CUevent)event), "event %p", (void *)event);
  return ncclSuccess;
}

ncclResult_t gpu_stream_sync(cudaStream_t stream) {
  CHECK(gpu_cuda_ready("gpu_stream_sync"));
  CU_CALL(cuStreamSynchronize, (stream), "stream %p", (void *)stream);
  return ncclSuccess;
}

/* A loaded kernel; modules are loaded once per (device, fatbin) and kept for the process's life. */
typedef struct func_entry {
  int dev;
  const void *fatbin;
  char name[64];
  CUmodule module;
  CUfunction func;
  struct func_entry *next;
} func_entry_t;

static pthread_mutex_t func_lock = PTHREAD_MUTEX_INITIALIZER;
static func_entry_t *funcs;

/* Finds `name` in the cache, or the module of (dev, fatbin) when the function is not there yet. Called with
 * func_lock held. */
static func_entry_t *func_find(int dev, const void *fatbin, const char *name, CUmodule *module_p) {
  *module_p = NULL;
  for (func_entry_t *e = funcs; e != NULL; e = e->next) {
    if (e->dev != dev || e->fatbin != fatbin) continue;
    if (strcmp(e->name, name) == 0) return e;
    *module_p = e->module;
  }
  return NULL;
}

/* Loads `name` (and its module, unless `module` is already loaded) on `dev`. Called with func_lock held. */
static ncclResult_t func_add(int dev, const void *fatbin, const char *name, CUmodule module,
                             func_entry_t **entry_p) {
  func_entry_t *e = calloc(1, sizeof *e);
  if (e == NULL) return log_err(ncclSystemError, "gpu_func_load: out of host memory");
  ncclResult_t res = ncclSuccess;
  int loaded = 0;
  gpu_scope_t scope;
  CHECK_GOTO(gpu_enter(dev, &scope), res, err_free);
  if (module == NULL) {
    CUresult r = drv.cuModuleLoadData(&module, fatbin);
    if (r != CUDA_SUCCESS) {
      res = r == CUDA_ERROR_NO_BINARY_FOR_GPU
                ? gpu_cuda_no_code(dev)
                : cu_fail(r, "cuModuleLoadData", "the kernels' fatbin on device %d", dev);
      goto err_leave;
    }
    loaded = 1;
  }
  CUfunction func;
  CU_GOTO(cuModuleGetFunction, (&func, module, name), res, err_unload, "kernel %s on device %d", name, dev);
  gpu_leave(&scope);
  *e = (func_entry_t){.dev = dev, .fatbin = fatbin, .module = module, .func = func, .next = funcs};
  snprintf(e->name, sizeof e->name, "%s", name);
  funcs = e;
  *entry_p = e;
  return ncclSuccess;
err_unload:
  if (loaded) CU_WARN(cuModuleUnload, (module), "the kernels' module on device %d", dev);
err_leave:
  gpu_leave(&scope);
err_free:
  free(e);
  return res;
}

ncclResult_t gpu_func_load(int dev, const void *fatbin, const char *name, gpu_func_t **func_p) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_func_load"));
  if (strlen(name) >= sizeof(((func_entry_t *)0)->name))
    return log_err(ncclInvalidArgument, "gpu_func_load: kernel name %s is too long", name);
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&func_lock);
  CUmodule module;
  func_entry_t *e = func_find(dev, fatbin, name, &module);
  if (e == NULL) res = func_add(dev, fatbin, name, module, &e);
  pthread_mutex_unlock(&func_lock);
  if (res == ncclSuccess) *func_p = (gpu_func_t *)e->func;
  return res;
}

ncclResult_t gpu_launch(gpu_func_t *func, unsigned grid, unsigned block, void *param, size_t param_bytes,
                        cudaStream_t stream, int overlap) {
  CHECK(gpu_cuda_ready("gpu_launch"));
  void *params[1] = {param};
  if (!overlap) {
    CU_CALL(cuLaunchKernel, ((CUfunction)func, grid, 1, 1, block, 1, 1, 0, stream, params, NULL),
            "%u blocks of %u threads, %zu parameter bytes, stream %p", grid, block, param_bytes,
            (void *)stream);
    return ncclSuccess;
  }
  CUlaunchAttribute attr;
  const CUlaunchConfig cfg = cu_overlap_config(grid, block, (CUstream)stream, &attr);
  CU_CALL(cuLaunchKernelEx, (&cfg, (CUfunction)func, params, NULL),
          "%u blocks of %u threads, %zu parameter bytes, stream %p, overlapping the previous kernel", grid,
          block, param_bytes, (void *)stream);
  return ncclSuccess;
}
