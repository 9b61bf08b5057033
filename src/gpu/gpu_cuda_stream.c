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

ncclResult_t gpu_stream_wait32(cudaStream_t stream, void *word, uint32_t value) {
  CHECK(gpu_cuda_ready("gpu_stream_wait32"));
  CU_CALL(cuStreamWaitValue32, (stream, (CUdeviceptr)word, value, CU_STREAM_WAIT_VALUE_GEQ),
          "until %p holds %u or more, on stream %p", word, value, (void *)stream);
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

/* Modules are loaded once per (device, fatbin) and kept for the process's life, as are the kernels found in
 * them. A module of NULL: the fatbin has no code the device runs. */
typedef struct module_entry {
  int dev;
  const void *fatbin;
  CUmodule module;
  struct module_entry *next;
} module_entry_t;

typedef struct func_entry {
  int dev;
  const void *fatbin; /* where the kernel was found */
  char name[64];
  CUfunction func;
  struct func_entry *next;
} func_entry_t;

static pthread_mutex_t func_lock = PTHREAD_MUTEX_INITIALIZER;
static module_entry_t *modules;
static func_entry_t *funcs;

/* The module of (dev, fatbin), loaded on first use (*module_p NULL: no code for the device). Called with
 * func_lock held. */
static ncclResult_t module_get(int dev, const void *fatbin, CUmodule *module_p) {
  for (module_entry_t *m = modules; m != NULL; m = m->next)
    if (m->dev == dev && m->fatbin == fatbin) {
      *module_p = m->module;
      return ncclSuccess;
    }
  module_entry_t *m = calloc(1, sizeof *m);
  if (m == NULL) return log_err(ncclSystemError, "gpu_func_load: out of host memory");
  gpu_scope_t scope;
  ncclResult_t res = gpu_enter(dev, &scope);
  if (res != ncclSuccess) {
    free(m);
    return res;
  }
  CUmodule module = NULL;
  const CUresult r = drv.cuModuleLoadData(&module, fatbin);
  gpu_leave(&scope);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_NO_BINARY_FOR_GPU) {
    free(m);
    return cu_fail(r, "cuModuleLoadData", "the kernels' fatbin on device %d", dev);
  }
  *m = (module_entry_t){
      .dev = dev, .fatbin = fatbin, .module = r == CUDA_SUCCESS ? module : NULL, .next = modules};
  modules = m;
  *module_p = m->module;
  return ncclSuccess;
}

/* Kernel `name` of fatbin's module on `dev`, or NULL where the module lacks it; *code_p says whether the
 * module has code for the device. Called with func_lock held. */
static ncclResult_t func_in(int dev, const void *fatbin, const char *name, func_entry_t **entry_p,
                            int *code_p) {
  *entry_p = NULL;
  *code_p = 1;
  for (func_entry_t *e = funcs; e != NULL; e = e->next)
    if (e->dev == dev && e->fatbin == fatbin && strcmp(e->name, name) == 0) {
      *entry_p = e;
      return ncclSuccess;
    }
  CUmodule module = NULL;
  CHECK(module_get(dev, fatbin, &module));
  *code_p = module != NULL;
  if (module == NULL) return ncclSuccess;
  CUfunction func;
  const CUresult r = drv.cuModuleGetFunction(&func, module, name);
  if (r == CUDA_ERROR_NOT_FOUND) return ncclSuccess;
  if (r != CUDA_SUCCESS) return cu_fail(r, "cuModuleGetFunction", "kernel %s on device %d", name, dev);
  func_entry_t *e = calloc(1, sizeof *e);
  if (e == NULL) return log_err(ncclSystemError, "gpu_func_load: out of host memory");
  *e = (func_entry_t){.dev = dev, .fatbin = fatbin, .func = func, .next = funcs};
  snprintf(e->name, sizeof e->name, "%s", name);
  funcs = e;
  *entry_p = e;
  return ncclSuccess;
}

ncclResult_t gpu_func_load(int dev, const void *const *fatbins, int nfatbins, const char *name,
                           gpu_func_t **func_p) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_func_load"));
  if (strlen(name) >= sizeof(((func_entry_t *)0)->name))
    return log_err(ncclInvalidArgument, "gpu_func_load: kernel name %s is too long", name);
  ncclResult_t res = ncclSuccess;
  func_entry_t *e = NULL;
  int with_code = 0;
  pthread_mutex_lock(&func_lock);
  for (int i = 0; i < nfatbins && e == NULL && res == ncclSuccess; i++) {
    int code = 0;
    res = func_in(dev, fatbins[i], name, &e, &code);
    with_code += code;
  }
  pthread_mutex_unlock(&func_lock);
  if (res != ncclSuccess) return res;
  if (e == NULL && with_code == 0 && nfatbins > 0) return gpu_cuda_no_code(dev);
  if (e == NULL)
    return log_err(ncclUnhandledCudaError,
                   "gpu_func_load: kernel %s is in none of the %d fatbins on device %d "
                   "(cuModuleGetFunction: CUDA_ERROR_NOT_FOUND)",
                   name, nfatbins, dev);
  *func_p = (gpu_func_t *)e->func;
  return ncclSuccess;
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
