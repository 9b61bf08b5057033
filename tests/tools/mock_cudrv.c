/*
 * A stand-in CUDA driver for testing `braid bench --device cuda` without a GPU: the entry points the bench
 * resolves (tools/cuda_drv.c), with cuda.h's exact signatures, reached through cuGetProcAddress_v2 as the
 * bench reaches the real driver. It is built as libcuda.so.1 in a folder of its own; the test puts that
 * folder first on LD_LIBRARY_PATH and runs the measured library on its host backend (BRAID_DEVICE=host),
 * which takes the "device" pointers this hands out for what they are: host memory.
 *
 * It is strict where the bench could go wrong: every call but cuInit needs cuInit in this very process (as
 * after a fork, the real driver is unusable in a child of a process that initialised it), allocations and
 * streams need a current context, copies must stay inside one allocation of the stream's device, events and
 * streams must belong to the same device, nothing but kernels may be queued on a capturing stream. Events
 * record the host's clock (the host backend has finished each call when it returns). Graphs are empty: a
 * replay does nothing. Modules load from any non-empty image, and a kernel launch only checks its stream
 * and parameters (the bench's floor kernel does not run). An IPC handle names an allocation of the process
 * that made it; opening it in another process maps a fresh zeroed allocation of the same size, which is as
 * far as a stand-in can go without shared memory. BRAID_MOCK_GPUS sets the number of devices (default 4).
 *
 * Memory is accounted per device as the real driver's cuMemGetInfo sees it: a device's used memory is what
 * its primary context holds once retained (BRAID_MOCK_CTX_MIB: a comma-separated list of MiB per device, the
 * last entry for the devices after it; default 0) plus every live allocation on it rounded up to 2 MiB, so
 * that a test can tell an allocation's footprint from its nominal size; the total is BRAID_MOCK_MEM_MIB
 * (default 81920). Anything that allocates through this driver in the process (the bench, or a stand-in
 * library) moves the figures.
 */
#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 16
#define MAX_ALLOCS  256
#define MIB         ((size_t)1 << 20)
/* The granule an allocation's footprint is rounded up to. */
#define ALLOC_GRANULE (2 * MIB)

struct CUctx_st {
  int dev;
};
struct CUstream_st {
  int dev;
  int capturing;
};
struct CUevent_st {
  int dev;
  int recorded;
  double t;
};
struct CUgraph_st {
  int dev;
};
struct CUgraphExec_st {
  int dev;
};
struct CUmod_st {
  int dev;
};
struct CUfunc_st {
  int dev;
};

static pid_t init_pid; /* the process that called cuInit; 0 before */
static struct CUctx_st contexts[MAX_DEVICES];
static int retained[MAX_DEVICES]; /* device d's primary context exists */
static _Thread_local CUcontext current;
static struct {
  char *ptr;
  size_t size;
  int dev;
} allocs[MAX_ALLOCS];

static int ndevices(void) {
  const char *v = getenv("BRAID_MOCK_GPUS");
  int n = v != NULL ? atoi(v) : 4;
  return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

/* MiB that device dev's primary context holds: entry dev of BRAID_MOCK_CTX_MIB, or its last entry. */
static size_t context_mib(int dev) {
  const char *v = getenv("BRAID_MOCK_CTX_MIB");
  long mib = 0;
  for (int d = 0; v != NULL && *v != '\0' && d <= dev; d++) {
    char *end;
    mib = strtol(v, &end, 10);
    v = *end == ',' ? end + 1 : end;
  }
  return mib > 0 ? (size_t)mib : 0;
}

static size_t total_bytes(void) {
  const char *v = getenv("BRAID_MOCK_MEM_MIB");
  long mib = v != NULL ? atol(v) : 0;
  return (mib > 0 ? (size_t)mib : 81920) * MIB;
}

/* Device dev's used memory: its context and its allocations' footprints. */
static size_t used_bytes(int dev) {
  size_t used = retained[dev] ? context_mib(dev) * MIB : 0;
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].ptr != NULL && allocs[i].dev == dev)
      used += (allocs[i].size + ALLOC_GRANULE - 1) / ALLOC_GRANULE * ALLOC_GRANULE;
  return used;
}

/* Every entry point but cuInit starts here. */
static CUresult ready(void) {
  if (init_pid == 0) return CUDA_ERROR_NOT_INITIALIZED;
  if (init_pid != getpid()) return CUDA_ERROR_NOT_PERMITTED; /* used after a fork */
  return CUDA_SUCCESS;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static CUresult get_error_name(CUresult error, const char **name) {
  static char buf[32];
  snprintf(buf, sizeof(buf), "MOCK_CUDA_ERROR_%d", (int)error);
  *name = buf;
  return CUDA_SUCCESS;
}

static CUresult init(unsigned int flags) {
  if (init_pid != 0 && init_pid != getpid()) return CUDA_ERROR_NOT_PERMITTED;
  init_pid = getpid();
  return CUDA_SUCCESS;
}

static CUresult device_get_count(int *count) {
  *count = ndevices();
  return ready();
}

static CUresult device_get(CUdevice *device, int ordinal) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (ordinal < 0 || ordinal >= ndevices()) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

static CUresult device_get_name(char *name, int len, CUdevice dev) {
  if (ready() != CUDA_SUCCESS) return ready();
  snprintf(name, (size_t)len, "Mock GPU %d", (int)dev);
  return CUDA_SUCCESS;
}

static CUresult primary_ctx_retain(CUcontext *ctx, CUdevice dev) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (dev < 0 || dev >= ndevices()) return CUDA_ERROR_INVALID_DEVICE;
  contexts[dev].dev = dev;
  retained[dev] = 1;
  *ctx = &contexts[dev];
  return CUDA_SUCCESS;
}

static CUresult ctx_set_current(CUcontext ctx) {
  if (ready() != CUDA_SUCCESS) return ready();
  current = ctx;
  return CUDA_SUCCESS;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t bytes) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  for (int i = 0; i < MAX_ALLOCS; i++) {
    if (allocs[i].ptr != NULL) continue;
    if ((allocs[i].ptr = malloc(bytes)) == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(allocs[i].ptr, 0xa5, bytes); /* device memory starts as garbage */
    allocs[i].size = bytes;
    allocs[i].dev = current->dev;
    *dptr = (CUdeviceptr)(uintptr_t)allocs[i].ptr;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult mem_free(CUdeviceptr dptr) {
  if (ready() != CUDA_SUCCESS) return ready();
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].ptr != NULL && (CUdeviceptr)(uintptr_t)allocs[i].ptr == dptr) {
      free(allocs[i].ptr);
      allocs[i].ptr = NULL;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

/* The current context's device, as the real driver reports it: the whole device, whoever holds the memory. */
static CUresult mem_get_info(size_t *free_bytes, size_t *total) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  size_t used = used_bytes(current->dev), all = total_bytes();
  *total = all;
  *free_bytes = used < all ? all - used : 0;
  return CUDA_SUCCESS;
}

/* The host address of [dptr, dptr + bytes) when it lies in one allocation of the stream's device; a copy
 * may be queued on the stream. */
static CUresult device_range(CUdeviceptr dptr, size_t bytes, CUstream s, char **host) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE; /* the bench uses its own streams only */
  if (s->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  char *p = (char *)(uintptr_t)dptr;
  for (int i = 0; i < MAX_ALLOCS; i++) {
    if (allocs[i].ptr == NULL || p < allocs[i].ptr || p >= allocs[i].ptr + allocs[i].size) continue;
    if (bytes > allocs[i].size - (size_t)(p - allocs[i].ptr) || allocs[i].dev != s->dev)
      return CUDA_ERROR_INVALID_VALUE;
    *host = p;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult memcpy_htod(CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
  char *host;
  CUresult r = device_range(dst, bytes, s, &host);
  if (r == CUDA_SUCCESS) memcpy(host, src, bytes);
  return r;
}

static CUresult memcpy_dtoh(void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
  char *host;
  CUresult r = device_range(src, bytes, s, &host);
  if (r == CUDA_SUCCESS) memcpy(dst, host, bytes);
  return r;
}

static CUresult memset_d8(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream s) {
  char *host;
  CUresult r = device_range(dst, bytes, s, &host);
  if (r == CUDA_SUCCESS) memset(host, value, bytes);
  return r;
}

static CUresult stream_create(CUstream *s, unsigned int flags) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE; /* the bench wants non-blocking */
  *s = calloc(1, sizeof(**s));
  (*s)->dev = current->dev;
  return CUDA_SUCCESS;
}

static CUresult stream_destroy(CUstream s) {
  if (ready() != CUDA_SUCCESS) return ready();
  free(s);
  return CUDA_SUCCESS;
}

static CUresult stream_synchronize(CUstream s) {
  if (ready() != CUDA_SUCCESS) return ready();
  return s->capturing ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

static CUresult event_create(CUevent *e, unsigned int flags) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *e = calloc(1, sizeof(**e));
  (*e)->dev = current->dev;
  return CUDA_SUCCESS;
}

static CUresult event_destroy(CUevent e) {
  if (ready() != CUDA_SUCCESS) return ready();
  free(e);
  return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream s) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (s == NULL || e->dev != s->dev) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  e->recorded = 1;
  e->t = now_s();
  return CUDA_SUCCESS;
}

static CUresult event_synchronize(CUevent e) {
  if (ready() != CUDA_SUCCESS) return ready();
  return e->recorded ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult event_elapsed_time(float *ms, CUevent start, CUevent stop) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (!start->recorded || !stop->recorded || start->dev != stop->dev) return CUDA_ERROR_INVALID_HANDLE;
  *ms = (float)((stop->t - start->t) * 1e3);
  return CUDA_SUCCESS;
}

static CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = 1;
  return CUDA_SUCCESS;
}

static CUresult end_capture(CUstream s, CUgraph *graph) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (!s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = 0;
  *graph = calloc(1, sizeof(**graph));
  (*graph)->dev = s->dev;
  return CUDA_SUCCESS;
}

static CUresult graph_instantiate(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
  if (ready() != CUDA_SUCCESS) return ready();
  *exec = calloc(1, sizeof(**exec));
  (*exec)->dev = graph->dev;
  return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec exec, CUstream s) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (exec->dev != s->dev || s->capturing) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

static CUresult graph_exec_destroy(CUgraphExec exec) {
  free(exec);
  return ready();
}

static CUresult graph_destroy(CUgraph graph) {
  free(graph);
  return ready();
}

static CUresult module_load_data(CUmodule *module, const void *image) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (image == NULL || *(const unsigned char *)image == 0) return CUDA_ERROR_INVALID_IMAGE;
  *module = calloc(1, sizeof(**module));
  (*module)->dev = current->dev;
  return CUDA_SUCCESS;
}

static CUresult module_unload(CUmodule module) {
  free(module);
  return ready();
}

static CUresult module_get_function(CUfunction *fn, CUmodule module, const char *name) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (module == NULL || name == NULL || name[0] == '\0') return CUDA_ERROR_INVALID_VALUE;
  static struct CUfunc_st funcs[MAX_DEVICES];
  funcs[module->dev].dev = module->dev;
  *fn = &funcs[module->dev];
  return CUDA_SUCCESS;
}

static CUresult launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (s == NULL || f == NULL || f->dev != s->dev) return CUDA_ERROR_INVALID_HANDLE;
  if (gx * gy * gz == 0 || bx * by * bz == 0 || bx * by * bz > 1024 || params == NULL || params[0] == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

/* The one attribute the bench passes: overlap with the stream's previous kernel. */
static CUresult launch_kernel_ex(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
  if (cfg == NULL || cfg->numAttrs != 1 || cfg->attrs == NULL ||
      cfg->attrs[0].id != CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION ||
      cfg->attrs[0].value.programmaticStreamSerializationAllowed != 1)
    return CUDA_ERROR_INVALID_VALUE;
  return launch_kernel(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY,
                       cfg->blockDimZ, cfg->sharedMemBytes, cfg->hStream, params, extra);
}

/* Compute capability 9.0, the only attribute the bench asks for. */
static CUresult device_get_attribute(int *v, CUdevice_attribute attr, CUdevice dev) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (dev < 0 || dev >= ndevices()) return CUDA_ERROR_INVALID_DEVICE;
  if (v == NULL || attr != CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) return CUDA_ERROR_INVALID_VALUE;
  *v = 9;
  return CUDA_SUCCESS;
}

static CUresult driver_get_version(int *v) {
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
  *v = 12080;
  return CUDA_SUCCESS;
}

/* A handle: the allocation's size and address in the process that made it. */
typedef struct {
  pid_t pid;
  size_t size;
  CUdeviceptr ptr;
} mock_ipc_t;
_Static_assert(sizeof(mock_ipc_t) <= sizeof(CUipcMemHandle), "a mock handle fits an IPC handle");

static CUresult ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr dptr) {
  if (ready() != CUDA_SUCCESS) return ready();
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].ptr != NULL && (CUdeviceptr)(uintptr_t)allocs[i].ptr == dptr) {
      mock_ipc_t h = {.pid = getpid(), .size = allocs[i].size, .ptr = dptr};
      memset(handle, 0, sizeof(*handle));
      memcpy(handle, &h, sizeof(h));
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult ipc_open_mem_handle(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags) {
  if (ready() != CUDA_SUCCESS) return ready();
  mock_ipc_t h;
  memcpy(&h, &handle, sizeof(h));
  if (h.pid == getpid() || h.size == 0) return CUDA_ERROR_INVALID_VALUE; /* not another process's */
  CUresult r = mem_alloc(dptr, h.size);
  if (r == CUDA_SUCCESS) memset((void *)(uintptr_t)*dptr, 0, h.size);
  return r;
}

static CUresult ipc_close_mem_handle(CUdeviceptr dptr) {
  return mem_free(dptr);
}

static CUresult ctx_enable_peer_access(CUcontext peer, unsigned int flags) {
  if (ready() != CUDA_SUCCESS) return ready();
  if (current == NULL || peer == NULL || peer == current || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  static int enabled[MAX_DEVICES][MAX_DEVICES];
  if (enabled[current->dev][peer->dev]) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  enabled[current->dev][peer->dev] = 1;
  return CUDA_SUCCESS;
}

/* The entry points by base name, each checked against cuda.h's type for that name. */
// clang-format off
#define MOCK_ENTRIES(X) \
  X(cuGetErrorName, get_error_name) X(cuInit, init) X(cuDeviceGetCount, device_get_count) \
  X(cuDeviceGet, device_get) X(cuDeviceGetName, device_get_name) \
  X(cuDevicePrimaryCtxRetain, primary_ctx_retain) X(cuCtxSetCurrent, ctx_set_current) \
  X(cuMemAlloc, mem_alloc) X(cuMemFree, mem_free) X(cuMemGetInfo, mem_get_info) \
  X(cuMemcpyHtoDAsync, memcpy_htod) \
  X(cuMemcpyDtoHAsync, memcpy_dtoh) X(cuMemsetD8Async, memset_d8) X(cuStreamCreate, stream_create) \
  X(cuStreamDestroy, stream_destroy) X(cuStreamSynchronize, stream_synchronize) \
  X(cuEventCreate, event_create) X(cuEventDestroy, event_destroy) X(cuEventRecord, event_record) \
  X(cuEventSynchronize, event_synchronize) X(cuEventElapsedTime, event_elapsed_time) \
  X(cuStreamBeginCapture, begin_capture) X(cuStreamEndCapture, end_capture) \
  X(cuGraphInstantiateWithFlags, graph_instantiate) X(cuGraphLaunch, graph_launch) \
  X(cuGraphExecDestroy, graph_exec_destroy) X(cuGraphDestroy, graph_destroy) \
  X(cuModuleLoadData, module_load_data) X(cuModuleUnload, module_unload) \
  X(cuModuleGetFunction, module_get_function) X(cuLaunchKernel, launch_kernel) \
  X(cuIpcGetMemHandle, ipc_get_mem_handle) X(cuIpcOpenMemHandle, ipc_open_mem_handle) \
  X(cuIpcCloseMemHandle, ipc_close_mem_handle) X(cuCtxEnablePeerAccess, ctx_enable_peer_access) \
  X(cuLaunchKernelEx, launch_kernel_ex) X(cuDeviceGetAttribute, device_get_attribute) \
  X(cuDriverGetVersion, driver_get_version)
// clang-format on
#define CHECK_TYPE(name, fn)                                                                                 \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&name), __typeof__(&fn)),                           \
                 #fn " has " #name "'s type");
MOCK_ENTRIES(CHECK_TYPE)
#undef CHECK_TYPE
#define ENTRY(name, fn) {#name, (void *)fn},
static const struct {
  const char *name;
  void *fn;
} entries[] = {MOCK_ENTRIES(ENTRY)};
#undef ENTRY

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char *symbol, void **pfn,
                                                                    int version, cuuint64_t flags,
                                                                    CUdriverProcAddressQueryResult *status) {
  for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
    if (strcmp(entries[i].name, symbol) == 0) {
      *pfn = entries[i].fn;
      if (status != NULL) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (status != NULL) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
