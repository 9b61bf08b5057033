/*
 * The bench's CUDA driver calls (see cuda_drv.h). With CUDA's headers (BRAID_TOOL_CUDA_HEADERS, set by the
 * build when it finds them) the entry points are resolved through cuGetProcAddress for CUDA 12.0 by base
 * name, and stored with the header's types (__typeof__), so a signature that does not match is a compile
 * error. Only entry points whose 12.0 variant has the header's signature are used: cuEventElapsedTime's
 * newer variant has the same one; cuGraphInstantiateWithFlags is asked for by that name. Without the
 * headers, every call but drv_open refuses.
 */
#include "cuda_drv.h"

#include <stdio.h>

#ifdef BRAID_TOOL_CUDA_HEADERS
#include <cuda.h>

#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cu_launch.h"

/* The CUDA version whose entry-point variants are asked for. */
#define DRV_API_VERSION 12000

/* Every entry point the bench uses, by the name cuda.h declares it under. */
// clang-format off
#define DRV_FUNCS(X) \
  X(cuGetErrorName) X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) \
  X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuMemcpyHtoDAsync) \
  X(cuMemcpyDtoHAsync) X(cuMemsetD8Async) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) \
  X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) \
  X(cuLaunchKernel) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle) X(cuCtxEnablePeerAccess) \
  X(cuLaunchKernelEx) X(cuDeviceGetAttribute) X(cuDriverGetVersion)
// clang-format on

/* The resolved entry points; fields carry the macro-expanded names (cuMemAlloc_v2), and drv.cuMemAlloc
 * expands the same way. */
#define DRV_FIELD(name) __typeof__(&name) name;
static struct { DRV_FUNCS(DRV_FIELD) } drv;
#undef DRV_FIELD

/* What drv_open found; written once, read-only after. */
static int opened;      /* drv_open ran */
static int ndevs;       /* usable devices; 0 when the driver is missing or unusable */
static char why0[256];  /* why ndevs is 0 */
static CUcontext *ctxs; /* [ndevs] retained primary contexts, NULL until first used */

static ncclResult_t fail(CUresult r, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reports a failed driver call once: its name, the CUresult's name and the values involved. */
static ncclResult_t fail(CUresult r, const char *call, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  const char *name = NULL;
  if (drv.cuGetErrorName == NULL || drv.cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
    name = "unknown CUresult";
  fprintf(stderr, "braid bench: %s (%s) failed: %s (%d)\n", call, what, name, (int)r);
  return ncclUnhandledCudaError;
}

/* Calls drv.fn args; on failure reports it (with the printf-style values) and returns. */
#define DRV_CALL(fn, args, ...)                                                                              \
  do {                                                                                                       \
    CUresult drv_res_ = drv.fn args;                                                                         \
    if (drv_res_ != CUDA_SUCCESS) return fail(drv_res_, #fn, __VA_ARGS__);                                   \
  } while (0)

static CUdeviceptr dptr(const void *p) {
  return (CUdeviceptr)(uintptr_t)p;
}

/* Resolves every entry point; writes why0 and returns -1 when one is missing. */
static int resolve(void *lib) {
  void *sym = dlsym(lib, "cuGetProcAddress_v2");
  if (sym == NULL) {
    snprintf(why0, sizeof(why0), "the CUDA driver is older than 12.0 (no cuGetProcAddress_v2)");
    return -1;
  }
  __typeof__(&cuGetProcAddress) get_proc;
  memcpy(&get_proc, &sym, sizeof(sym));
  void *fn;
  CUdriverProcAddressQueryResult found;
#define DRV_RESOLVE(name)                                                                                    \
  fn = NULL;                                                                                                 \
  if (get_proc(#name, &fn, DRV_API_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found) != CUDA_SUCCESS ||    \
      found != CU_GET_PROC_ADDRESS_SUCCESS || fn == NULL) {                                                  \
    snprintf(why0, sizeof(why0), "the CUDA driver lacks %s for CUDA 12.0", #name);                           \
    return -1;                                                                                               \
  }                                                                                                          \
  memcpy(&drv.name, &fn, sizeof(fn));
  DRV_FUNCS(DRV_RESOLVE)
#undef DRV_RESOLVE
  return 0;
}

/* Initialises the driver and counts its devices; writes why0 when there are none. */
static int count_devices(void) {
  const char *name = "?";
  CUresult r = drv.cuInit(0);
  int n = 0;
  if (r == CUDA_SUCCESS) r = drv.cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS || n <= 0) {
    drv.cuGetErrorName(r, &name);
    snprintf(why0, sizeof(why0), "no usable CUDA device (cuInit/cuDeviceGetCount: %s, %d devices)",
             r == CUDA_SUCCESS ? "CUDA_SUCCESS" : name, n);
    return 0;
  }
  ctxs = calloc((size_t)n, sizeof(*ctxs));
  if (ctxs == NULL) {
    snprintf(why0, sizeof(why0), "out of host memory listing %d CUDA devices", n);
    return 0;
  }
  return n;
}

ncclResult_t drv_open(int *ndev_p, char *why, size_t len) {
  if (!opened) {
    opened = 1;
    /* The library stays loaded for the process's life: the resolved pointers point into it. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
      snprintf(why0, sizeof(why0), "no CUDA driver (%s)", dlerror());
    else if (resolve(lib) == 0)
      ndevs = count_devices();
  }
  *ndev_p = ndevs;
  snprintf(why, len, "%s", why0);
  return ncclSuccess;
}

ncclResult_t drv_device_name(int dev, char *buf, size_t len) {
  CUdevice d;
  DRV_CALL(cuDeviceGet, (&d, dev), "device %d", dev);
  DRV_CALL(cuDeviceGetName, (buf, (int)len, d), "device %d", dev);
  return ncclSuccess;
}

ncclResult_t drv_can_overlap(int dev, int captured, int *yes_p) {
  CUdevice d;
  int major = 0, version = 0;
  DRV_CALL(cuDeviceGet, (&d, dev), "device %d", dev);
  DRV_CALL(cuDeviceGetAttribute, (&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d), "device %d", dev);
  DRV_CALL(cuDriverGetVersion, (&version), "the driver's version");
  *yes_p = cu_overlap_allowed(major, version, captured);
  return ncclSuccess;
}

ncclResult_t drv_use_device(int dev) {
  if (dev < 0 || dev >= ndevs) {
    if (ndevs > 0)
      fprintf(stderr, "braid bench: CUDA device %d does not exist (the driver has %d)\n", dev, ndevs);
    else
      fprintf(stderr, "braid bench: CUDA device %d: %s\n", dev, opened ? why0 : "the driver is not loaded");
    return ncclInvalidUsage;
  }
  if (ctxs[dev] == NULL) {
    CUdevice d;
    DRV_CALL(cuDeviceGet, (&d, dev), "device %d", dev);
    DRV_CALL(cuDevicePrimaryCtxRetain, (&ctxs[dev], d), "device %d", dev);
  }
  DRV_CALL(cuCtxSetCurrent, (ctxs[dev]), "primary context of device %d", dev);
  return ncclSuccess;
}

ncclResult_t drv_mem_alloc(void **ptr_p, size_t bytes) {
  CUdeviceptr p;
  DRV_CALL(cuMemAlloc, (&p, bytes), "%zu bytes", bytes);
  *ptr_p = (void *)(uintptr_t)p;
  return ncclSuccess;
}

ncclResult_t drv_mem_free(void *ptr) {
  DRV_CALL(cuMemFree, (dptr(ptr)), "%p", ptr);
  return ncclSuccess;
}

ncclResult_t drv_mem_info(int dev, size_t *free_p, size_t *total_p) {
  size_t free_bytes, total;
  ncclResult_t res = drv_use_device(dev);
  if (res != ncclSuccess) return res;
  DRV_CALL(cuMemGetInfo, (&free_bytes, &total), "device %d", dev);
  *free_p = free_bytes;
  *total_p = total;
  return ncclSuccess;
}

ncclResult_t drv_upload(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  DRV_CALL(cuMemcpyHtoDAsync, (dptr(dst), src, bytes, stream), "%zu bytes to %p", bytes, dst);
  return ncclSuccess;
}

ncclResult_t drv_download(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  DRV_CALL(cuMemcpyDtoHAsync, (dst, dptr(src), bytes, stream), "%zu bytes from %p", bytes, src);
  return ncclSuccess;
}

ncclResult_t drv_memset(void *dst, unsigned char value, size_t bytes, cudaStream_t stream) {
  DRV_CALL(cuMemsetD8Async, (dptr(dst), value, bytes, stream), "%zu bytes at %p", bytes, dst);
  return ncclSuccess;
}

ncclResult_t drv_stream_create(cudaStream_t *stream_p) {
  CUstream s;
  DRV_CALL(cuStreamCreate, (&s, CU_STREAM_NON_BLOCKING), "non-blocking");
  *stream_p = s;
  return ncclSuccess;
}

ncclResult_t drv_stream_destroy(cudaStream_t stream) {
  DRV_CALL(cuStreamDestroy, (stream), "stream %p", (void *)stream);
  return ncclSuccess;
}

ncclResult_t drv_stream_sync(cudaStream_t stream) {
  DRV_CALL(cuStreamSynchronize, (stream), "stream %p", (void *)stream);
  return ncclSuccess;
}

ncclResult_t drv_event_create(drv_event_t *event_p) {
  CUevent e;
  DRV_CALL(cuEventCreate, (&e, CU_EVENT_DEFAULT), "timing event");
  *event_p = (drv_event_t)e;
  return ncclSuccess;
}

ncclResult_t drv_event_destroy(drv_event_t event) {
  DRV_CALL(cuEventDestroy, ((CUevent)event), "event %p", (void *)event);
  return ncclSuccess;
}

ncclResult_t drv_event_record(drv_event_t event, cudaStream_t stream) {
  DRV_CALL(cuEventRecord, ((CUevent)event, stream), "event %p on stream %p", (void *)event, (void *)stream);
  return ncclSuccess;
}

ncclResult_t drv_event_elapsed_ms(drv_event_t start, drv_event_t stop, float *ms_p) {
  DRV_CALL(cuEventSynchronize, ((CUevent)stop), "event %p", (void *)stop);
  DRV_CALL(cuEventElapsedTime, (ms_p, (CUevent)start, (CUevent)stop), "events %p to %p", (void *)start,
           (void *)stop);
  return ncclSuccess;
}

ncclResult_t drv_capture_begin(cudaStream_t stream) {
  DRV_CALL(cuStreamBeginCapture, (stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "stream %p", (void *)stream);
  return ncclSuccess;
}

ncclResult_t drv_capture_end(cudaStream_t stream, void **captured_p) {
  CUgraph graph;
  DRV_CALL(cuStreamEndCapture, (stream, &graph), "stream %p", (void *)stream);
  *captured_p = graph;
  return ncclSuccess;
}

ncclResult_t drv_graph_instantiate(void *captured, drv_graph_t *graph_p) {
  CUgraphExec exec;
  CUresult r = drv.cuGraphInstantiateWithFlags(&exec, (CUgraph)captured, 0);
  /* The instantiated graph is independent of the captured one, which is not needed any more. */
  drv.cuGraphDestroy((CUgraph)captured);
  if (r != CUDA_SUCCESS) return fail(r, "cuGraphInstantiateWithFlags", "graph %p", captured);
  *graph_p = (drv_graph_t)exec;
  return ncclSuccess;
}

ncclResult_t drv_graph_launch(drv_graph_t graph, cudaStream_t stream) {
  DRV_CALL(cuGraphLaunch, ((CUgraphExec)graph, stream), "graph %p on stream %p", (void *)graph,
           (void *)stream);
  return ncclSuccess;
}

ncclResult_t drv_graph_destroy(drv_graph_t graph) {
  DRV_CALL(cuGraphExecDestroy, ((CUgraphExec)graph), "graph %p", (void *)graph);
  return ncclSuccess;
}

ncclResult_t drv_module_load(const void *image, drv_module_t *module_p) {
  CUmodule m;
  DRV_CALL(cuModuleLoadData, (&m, image), "fatbin at %p", image);
  *module_p = (drv_module_t)m;
  return ncclSuccess;
}

ncclResult_t drv_module_unload(drv_module_t module) {
  DRV_CALL(cuModuleUnload, ((CUmodule)module), "module %p", (void *)module);
  return ncclSuccess;
}

ncclResult_t drv_module_function(drv_module_t module, const char *name, drv_function_t *function_p) {
  CUfunction f;
  DRV_CALL(cuModuleGetFunction, (&f, (CUmodule)module, name), "kernel %s", name);
  *function_p = (drv_function_t)f;
  return ncclSuccess;
}

ncclResult_t drv_launch(drv_function_t function, unsigned grid, unsigned block, void *param,
                        cudaStream_t stream, int overlap) {
  void *params[] = {param};
  if (!overlap) {
    DRV_CALL(cuLaunchKernel, ((CUfunction)function, grid, 1, 1, block, 1, 1, 0, stream, params, NULL),
             "%u x %u threads on stream %p", grid, block, (void *)stream);
    return ncclSuccess;
  }
  CUlaunchAttribute attr;
  const CUlaunchConfig cfg = cu_overlap_config(grid, block, (CUstream)stream, &attr);
  DRV_CALL(cuLaunchKernelEx, (&cfg, (CUfunction)function, params, NULL),
           "%u x %u threads on stream %p, overlapping the previous kernel", grid, block, (void *)stream);
  return ncclSuccess;
}

_Static_assert(sizeof(CUipcMemHandle) == DRV_IPC_HANDLE_BYTES, "an IPC handle fills DRV_IPC_HANDLE_BYTES");

ncclResult_t drv_ipc_handle(void *ptr, void *handle) {
  CUipcMemHandle h;
  DRV_CALL(cuIpcGetMemHandle, (&h, dptr(ptr)), "%p", ptr);
  memcpy(handle, &h, sizeof(h));
  return ncclSuccess;
}

ncclResult_t drv_ipc_open(const void *handle, void **ptr_p) {
  CUipcMemHandle h;
  CUdeviceptr p;
  memcpy(&h, handle, sizeof(h));
  DRV_CALL(cuIpcOpenMemHandle, (&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "another process's allocation");
  *ptr_p = (void *)(uintptr_t)p;
  return ncclSuccess;
}

ncclResult_t drv_ipc_close(void *ptr) {
  DRV_CALL(cuIpcCloseMemHandle, (dptr(ptr)), "%p", ptr);
  return ncclSuccess;
}

ncclResult_t drv_peer_access(int dev, int peer) {
  if (dev == peer) return drv_use_device(dev); /* a device reaches its own memory */
  ncclResult_t res = drv_use_device(peer);     /* retains the peer's primary context */
  if (res == ncclSuccess) res = drv_use_device(dev);
  if (res != ncclSuccess) return res;
  CUresult r = drv.cuCtxEnablePeerAccess(ctxs[peer], 0);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    return fail(r, "cuCtxEnablePeerAccess", "device %d to device %d", dev, peer);
  return ncclSuccess;
}

#else /* built without CUDA's headers: no device, every device call refused */

static ncclResult_t refuse(const char *call) {
  fprintf(stderr, "braid bench: %s: this braid was built without CUDA headers\n", call);
  return ncclInvalidUsage;
}

ncclResult_t drv_open(int *ndev_p, char *why, size_t len) {
  *ndev_p = 0;
  snprintf(why, len, "built without CUDA headers");
  return ncclSuccess;
}

ncclResult_t drv_device_name(int dev, char *buf, size_t len) {
  return refuse("drv_device_name");
}

ncclResult_t drv_use_device(int dev) {
  return refuse("drv_use_device");
}

ncclResult_t drv_mem_alloc(void **ptr_p, size_t bytes) {
  return refuse("drv_mem_alloc");
}

ncclResult_t drv_mem_free(void *ptr) {
  return refuse("drv_mem_free");
}

ncclResult_t drv_mem_info(int dev, size_t *free_p, size_t *total_p) {
  return refuse("drv_mem_info");
}

ncclResult_t drv_upload(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  return refuse("drv_upload");
}

ncclResult_t drv_download(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  return refuse("drv_download");
}

ncclResult_t drv_memset(void *dst, unsigned char value, size_t bytes, cudaStream_t stream) {
  return refuse("drv_memset");
}

ncclResult_t drv_stream_create(cudaStream_t *stream_p) {
  return refuse("drv_stream_create");
}

ncclResult_t drv_stream_destroy(cudaStream_t stream) {
  return refuse("drv_stream_destroy");
}

ncclResult_t drv_stream_sync(cudaStream_t stream) {
  return refuse("drv_stream_sync");
}

ncclResult_t drv_event_create(drv_event_t *event_p) {
  return refuse("drv_event_create");
}

ncclResult_t drv_event_destroy(drv_event_t event) {
  return refuse("drv_event_destroy");
}

ncclResult_t drv_event_record(drv_event_t event, cudaStream_t stream) {
  return refuse("drv_event_record");
}

ncclResult_t drv_event_elapsed_ms(drv_event_t start, drv_event_t stop, float *ms_p) {
  return refuse("drv_event_elapsed_ms");
}

ncclResult_t drv_capture_begin(cudaStream_t stream) {
  return refuse("drv_capture_begin");
}

ncclResult_t drv_capture_end(cudaStream_t stream, void **captured_p) {
  return refuse("drv_capture_end");
}

ncclResult_t drv_graph_instantiate(void *captured, drv_graph_t *graph_p) {
  return refuse("drv_graph_instantiate");
}

ncclResult_t drv_graph_launch(drv_graph_t graph, cudaStream_t stream) {
  return refuse("drv_graph_launch");
}

ncclResult_t drv_graph_destroy(drv_graph_t graph) {
  return refuse("drv_graph_destroy");
}

ncclResult_t drv_module_load(const void *image, drv_module_t *module_p) {
  return refuse("drv_module_load");
}

ncclResult_t drv_module_unload(drv_module_t module) {
  return refuse("drv_module_unload");
}

ncclResult_t drv_module_function(drv_module_t module, const char *name, drv_function_t *function_p) {
  return refuse("drv_module_function");
}

ncclResult_t drv_launch(drv_function_t function, unsigned grid, unsigned block, void *param,
                        cudaStream_t stream, int overlap) {
  return refuse("drv_launch");
}

ncclResult_t drv_can_overlap(int dev, int captured, int *yes_p) {
  return refuse("drv_can_overlap");
}

ncclResult_t drv_ipc_handle(void *ptr, void *handle) {
  return refuse("drv_ipc_handle");
}

ncclResult_t drv_ipc_open(const void *handle, void **ptr_p) {
  return refuse("drv_ipc_open");
}

ncclResult_t drv_ipc_close(void *ptr) {
  return refuse("drv_ipc_close");
}

ncclResult_t drv_peer_access(int dev, int peer) {
  return refuse("drv_peer_access");
}

#endif
