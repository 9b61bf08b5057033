/*
 * A stand-in CUDA driver (see mock_cuda.h): enough of the driver API, with cuda.h's exact signatures, for
 * gpu_cuda.c to run on a machine without a GPU. Every entry point is reached through cuGetProcAddress_v2, as
 * the library reaches the real driver. Single-threaded use per process is assumed except for the
 * thread-local current context.
 */
#include <cuda.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/dtype.h"
#include "device/dev.h"
#include "gpu/gpu_cuda.h"
#include "gpu/host_reduce.h"
#include "mock_cuda.h"

/* Adds to a counter of mock_cuda_stats. The ranks of one process call the driver from threads of their own,
 * so every count is an atomic add: a lost increment would fail a test that counts what its calls enqueued. */
#define STAT_ADD(field, n) __atomic_fetch_add(&mock_cuda_stats.field, (n), __ATOMIC_RELAXED)

__attribute__((visibility("default"))) mock_cuda_stats_t mock_cuda_stats;

struct CUctx_st {
  int dev;
  unsigned peers; /* bit p: peer access to device p enabled */
};
struct CUevent_st {
  int recorded;
};
struct CUmod_st {
  int dev;
  char only[256]; /* the kernels it holds, comma-separated, between commas; "": every kernel */
};
struct CUfunc_st {
  int unused;
};

#define MAX_DEVICES 8
#define MAX_LEGACY  64

static struct CUctx_st contexts[MAX_DEVICES];
/* The one graph the capturing stream builds, and the user objects it holds. */
struct mock_obj {
  CUhostFn fn;
  void *arg;
  int held;
};
/* The ranks of one process capture from threads of their own, into this one graph: the lock keeps two
 * ranks' user objects from taking the same slot. */
static struct {
  struct mock_obj objs[MOCK_CUDA_MAX_OBJS];
  int nobjs;
} mock_graph;
static pthread_mutex_t mock_graph_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local CUstreamCaptureMode mock_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

__attribute__((visibility("default"))) int mock_cuda_graph_destroy(void);
int mock_cuda_graph_destroy(void) {
  int n = 0;
  pthread_mutex_lock(&mock_graph_lock);
  for (int i = 0; i < mock_graph.nobjs; i++) {
    if (!mock_graph.objs[i].held) continue;
    mock_graph.objs[i].held = 0;
    mock_graph.objs[i].fn(mock_graph.objs[i].arg);
    n++;
  }
  mock_graph.nobjs = 0;
  pthread_mutex_unlock(&mock_graph_lock);
  return n;
}
static struct CUfunc_st kernel, kernel_small, kernel_ll, kernel_bulk, kernel_pair, kernel_pair_ar,
    kernel_pair_ar128, kernel_wait, kernel_combine, kernel_push;
static _Thread_local CUcontext current;

/* cuMemAlloc allocations (own and opened through IPC), backed by POSIX shared memory. */
static struct {
  CUdeviceptr ptr;
  size_t size;
  int own;
  char name[48];
  unsigned long long id; /* the allocation's buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID) */
} legacy[MAX_LEGACY];
static unsigned long long next_buffer_id = 1;

static int ndevices(void) {
  const char *v = getenv("MOCK_CUDA_DEVICES");
  int n = v != NULL ? atoi(v) : 2;
  return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

static CUresult check_dev(CUdevice dev) {
  return dev >= 0 && dev < ndevices() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* MOCK_CUDA_RECORD (mock_cuda.h): nothing runs, what is enqueued is told. */
static int recording(void) {
  static int on = -1;
  if (on < 0) on = getenv("MOCK_CUDA_RECORD") != NULL;
  return on;
}

__attribute__((visibility("default"))) mock_cuda_op_fn mock_cuda_on_op;

/* Tells the recorder (if any) about one operation the library enqueued. */
static void tell(mock_cuda_op_t op) {
  op.dev = current != NULL ? current->dev : -1;
  if (mock_cuda_on_op != NULL) mock_cuda_on_op(&op);
}

static void fill_garbage(void *p, size_t n) {
  if (!recording()) memset(p, MOCK_CUDA_GARBAGE, n);
}

/* ---- Initialisation, devices, contexts ---- */

static CUresult mock_cuGetErrorName(CUresult r, const char **name) {
  switch (r) {
  case CUDA_SUCCESS:
    *name = "CUDA_SUCCESS";
    break;
  case CUDA_ERROR_INVALID_VALUE:
    *name = "CUDA_ERROR_INVALID_VALUE";
    break;
  case CUDA_ERROR_OUT_OF_MEMORY:
    *name = "CUDA_ERROR_OUT_OF_MEMORY";
    break;
  case CUDA_ERROR_NO_DEVICE:
    *name = "CUDA_ERROR_NO_DEVICE";
    break;
  case CUDA_ERROR_INVALID_DEVICE:
    *name = "CUDA_ERROR_INVALID_DEVICE";
    break;
  case CUDA_ERROR_INVALID_CONTEXT:
    *name = "CUDA_ERROR_INVALID_CONTEXT";
    break;
  case CUDA_ERROR_INVALID_HANDLE:
    *name = "CUDA_ERROR_INVALID_HANDLE";
    break;
  case CUDA_ERROR_NOT_FOUND:
    *name = "CUDA_ERROR_NOT_FOUND";
    break;
  case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
    *name = "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    break;
  default:
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static CUresult mock_cuInit(unsigned int flags) {
  return ndevices() > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static CUresult mock_cuDriverGetVersion(int *v) {
  *v = getenv("MOCK_CUDA_DRIVER_VERSION") != NULL ? atoi(getenv("MOCK_CUDA_DRIVER_VERSION")) : 12080;
  return CUDA_SUCCESS;
}

static CUresult mock_cuDeviceGetCount(int *n) {
  *n = ndevices();
  return CUDA_SUCCESS;
}

static CUresult mock_cuDeviceGet(CUdevice *dev, int ordinal) {
  *dev = ordinal;
  return check_dev(ordinal);
}

static CUresult mock_cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice dev) {
  if (check_dev(dev) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
  int vmm = getenv("MOCK_CUDA_NO_VMM") == NULL;
  switch (attr) {
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
    *v = MOCK_CUDA_SMS;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    *v = getenv("MOCK_CUDA_CC_MAJOR") != NULL ? atoi(getenv("MOCK_CUDA_CC_MAJOR")) : MOCK_CUDA_CC_MAJOR;
    break;
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    *v = vmm;
    break;
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    *v = vmm;
    break;
  default:
    *v = 0;
  }
  return CUDA_SUCCESS;
}

static CUresult mock_cuDeviceGetPCIBusId(char *id, int len, CUdevice dev) {
  if (check_dev(dev) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(id, (size_t)len, "0000:%02X:00.0", 0x1A + dev); /* upper case, as the driver writes it */
  return CUDA_SUCCESS;
}

static CUresult mock_cuDeviceCanAccessPeer(int *yes, CUdevice dev, CUdevice peer) {
  if (check_dev(dev) != CUDA_SUCCESS || check_dev(peer) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
  *yes = dev != peer;
  return CUDA_SUCCESS;
}

static CUresult mock_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  if (check_dev(dev) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
  contexts[dev].dev = dev;
  *ctx = &contexts[dev];
  STAT_ADD(retains, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuCtxGetCurrent(CUcontext *ctx) {
  *ctx = current;
  return CUDA_SUCCESS;
}

static CUresult mock_cuCtxSetCurrent(CUcontext ctx) {
  current = ctx;
  return CUDA_SUCCESS;
}

static CUresult mock_cuCtxGetDevice(CUdevice *dev) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = current->dev;
  return CUDA_SUCCESS;
}

static CUresult mock_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (peer == NULL || peer == current || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (current->peers & (1u << peer->dev)) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  current->peers |= 1u << peer->dev;
  return CUDA_SUCCESS;
}

/* ---- cuMem: handles are memfds, address ranges are anonymous reservations ---- */

static CUresult mock_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                   CUmemAllocationGranularity_flags option) {
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || check_dev(prop->location.id) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_DEVICE;
  *g = MOCK_CUDA_GRANULARITY;
  return CUDA_SUCCESS;
}

/* Whether the current context's device is MOCK_CUDA_FAIL_DEVICE. */
static int failing_device(void) {
  const char *v = getenv("MOCK_CUDA_FAIL_DEVICE");
  return v != NULL && current != NULL && current->dev == atoi(v);
}

static CUresult mock_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (size == 0 || size % MOCK_CUDA_GRANULARITY != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      !(prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (size > MOCK_CUDA_MEM_LIMIT || failing_device()) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = memfd_create("mock-cuda-mem", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  fill_garbage(p, size);
  munmap(p, size);
  *handle = (CUmemGenericAllocationHandle)fd;
  mock_cuda_stats.last_create_device = prop->location.id;
  STAT_ADD(live_handles, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (close((int)handle) != 0) return CUDA_ERROR_INVALID_HANDLE;
  STAT_ADD(live_handles, -1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                         unsigned long long flags) {
  if (size % MOCK_CUDA_GRANULARITY != 0 || (align != 0 && align % MOCK_CUDA_GRANULARITY != 0))
    return CUDA_ERROR_INVALID_VALUE;
  void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = (CUdeviceptr)p;
  STAT_ADD(live_ranges, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  if (munmap((void *)ptr, size) != 0) return CUDA_ERROR_INVALID_VALUE;
  STAT_ADD(live_ranges, -1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags) {
  void *p =
      mmap((void *)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, (int)handle, (off_t)offset);
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  STAT_ADD(live_maps, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  void *p =
      mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  STAT_ADD(live_maps, -1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  if (count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; i++)
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        check_dev(desc[i].location.id) != CUDA_SUCCESS || desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  mock_cuda_stats.last_access_devices = (int)count;
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                                  CUmemAllocationHandleType type, unsigned long long flags) {
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl((int)handle, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  memcpy(shareable, &fd, sizeof fd);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os,
                                                    CUmemAllocationHandleType type) {
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl((int)(intptr_t)os, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  *handle = (CUmemGenericAllocationHandle)fd;
  STAT_ADD(live_handles, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemsetD8(CUdeviceptr ptr, unsigned char v, size_t n) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (recording() && n > (1u << 20)) return CUDA_SUCCESS; /* rings and buffers: nothing reads them */
  memset((void *)ptr, v, n);
  return CUDA_SUCCESS;
}

/* ---- cuMemAlloc and legacy IPC: POSIX shared memory named in the IPC handle ---- */

static int legacy_slot(CUdeviceptr ptr) {
  for (int i = 0; i < MAX_LEGACY; i++)
    if (legacy[i].ptr == ptr) return i;
  return -1;
}

/* The table is shared by the threads of a process (ncclCommInitAll initialises its ranks on threads of
 * their own): every function that reads or writes it holds this lock. */
static pthread_mutex_t legacy_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult map_shm(const char *name, size_t size, int create, CUdeviceptr *ptr) {
  int slot = legacy_slot(0);
  if (slot < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  void *p = create && ftruncate(fd, (off_t)size) != 0
                ? MAP_FAILED
                : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  legacy[slot].ptr = (CUdeviceptr)p;
  legacy[slot].size = size;
  legacy[slot].own = create;
  legacy[slot].id = next_buffer_id++;
  snprintf(legacy[slot].name, sizeof legacy[slot].name, "%s", name);
  *ptr = (CUdeviceptr)p;
  STAT_ADD(live_legacy, 1);
  return CUDA_SUCCESS;
}

static CUresult cuMemAlloc_unlocked(CUdeviceptr *ptr, size_t size) {
  static int serial;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (size > MOCK_CUDA_MEM_LIMIT || failing_device()) return CUDA_ERROR_OUT_OF_MEMORY;
  char name[48];
  snprintf(name, sizeof name, "/mock-cuda-%d-%d", (int)getpid(), serial++);
  /* A name of this pid can only be left by an earlier process that had the same pid and ended without
   * freeing it (the tests of stuck and aborted communicators leave memory allocated on purpose): it goes, or
   * the exclusive create below would fail and with it the allocation. */
  shm_unlink(name);
  CUresult r = map_shm(name, size, 1, ptr);
  if (r == CUDA_SUCCESS) fill_garbage((void *)*ptr, size);
  return r;
}

static CUresult unmap_legacy(CUdeviceptr ptr, int own) {
  int slot = legacy_slot(ptr);
  if (ptr == 0 || slot < 0 || legacy[slot].own != own) return CUDA_ERROR_INVALID_VALUE;
  munmap((void *)ptr, legacy[slot].size);
  if (own) shm_unlink(legacy[slot].name);
  legacy[slot].ptr = 0;
  STAT_ADD(live_legacy, -1);
  return CUDA_SUCCESS;
}

static CUresult cuMemFree_unlocked(CUdeviceptr ptr) {
  return unmap_legacy(ptr, 1);
}

static CUresult cuIpcGetMemHandle_unlocked(CUipcMemHandle *handle, CUdeviceptr ptr) {
  int slot = legacy_slot(ptr);
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (ptr == 0 || slot < 0 || !legacy[slot].own) return CUDA_ERROR_INVALID_VALUE;
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &legacy[slot].size, sizeof(size_t));
  snprintf(handle->reserved + sizeof(size_t), sizeof handle->reserved - sizeof(size_t), "%s",
           legacy[slot].name);
  return CUDA_SUCCESS;
}

static CUresult cuIpcOpenMemHandle_unlocked(CUdeviceptr *ptr, CUipcMemHandle handle, unsigned int flags) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
  size_t size;
  memcpy(&size, handle.reserved, sizeof size);
  return map_shm(handle.reserved + sizeof(size_t), size, 0, ptr);
}

static CUresult cuIpcCloseMemHandle_unlocked(CUdeviceptr ptr) {
  return unmap_legacy(ptr, 0);
}

/* The legacy allocation (own or opened) holding ptr, or -1. */
static int legacy_holding(CUdeviceptr ptr) {
  for (int i = 0; i < MAX_LEGACY; i++)
    if (legacy[i].ptr != 0 && ptr >= legacy[i].ptr && ptr < legacy[i].ptr + legacy[i].size) return i;
  return -1;
}

static CUresult cuMemGetAddressRange_unlocked(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  int slot = legacy_holding(ptr);
  if (slot < 0) return CUDA_ERROR_NOT_FOUND;
  *base = legacy[slot].ptr;
  *size = legacy[slot].size;
  return CUDA_SUCCESS;
}

/* Answers for cuMemAlloc allocations; anything else is unknown (an error, as host memory is). */
static CUresult cuPointerGetAttributes_unlocked(unsigned int n, CUpointer_attribute *attrs, void **data,
                                                CUdeviceptr ptr) {
  int slot = legacy_holding(ptr);
  if (slot < 0 || current == NULL) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; i++) {
    switch (attrs[i]) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned *)data[i] = CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *(int *)data[i] = current->dev;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *(int *)data[i] = legacy[slot].own;
      break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *(unsigned long long *)data[i] = legacy[slot].id;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

/* The legacy table's entry points: each runs its _unlocked body holding legacy_lock. */
#define LOCKED(name, params, args)                                                                           \
  static CUresult mock_##name params {                                                                       \
    pthread_mutex_lock(&legacy_lock);                                                                        \
    CUresult r = name##_unlocked args;                                                                       \
    pthread_mutex_unlock(&legacy_lock);                                                                      \
    return r;                                                                                                \
  }
LOCKED(cuMemAlloc, (CUdeviceptr * ptr, size_t size), (ptr, size))
LOCKED(cuMemFree, (CUdeviceptr ptr), (ptr))
LOCKED(cuIpcGetMemHandle, (CUipcMemHandle * handle, CUdeviceptr ptr), (handle, ptr))
LOCKED(cuIpcOpenMemHandle, (CUdeviceptr * ptr, CUipcMemHandle handle, unsigned int flags),
       (ptr, handle, flags))
LOCKED(cuIpcCloseMemHandle, (CUdeviceptr ptr), (ptr))
LOCKED(cuMemGetAddressRange, (CUdeviceptr * base, size_t *size, CUdeviceptr ptr), (base, size, ptr))
LOCKED(cuPointerGetAttributes, (unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr),
       (n, attrs, data, ptr))

/* ---- Host memory ---- */

static CUresult mock_cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)) return CUDA_ERROR_INVALID_VALUE;
  void *p = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  memset(p, MOCK_CUDA_GARBAGE, size); /* page-locked memory is small: filled even when recording */
  *pp = p;
  STAT_ADD(live_host, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemFreeHost(void *p) {
  free(p);
  STAT_ADD(live_host, -1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemHostGetDevicePointer(CUdeviceptr *dptr, void *p, unsigned int flags) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *dptr = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemHostRegister(void *p, size_t size, unsigned int flags) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)) return CUDA_ERROR_INVALID_VALUE;
  STAT_ADD(live_host, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemHostUnregister(void *p) {
  STAT_ADD(live_host, -1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  memcpy((void *)dst, src, n);
  return CUDA_SUCCESS;
}

/* ---- Events, streams, modules, launches ---- */

static CUresult mock_cuEventCreate(CUevent *ev, unsigned int flags) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (!(flags & CU_EVENT_DISABLE_TIMING)) return CUDA_ERROR_INVALID_VALUE;
  *ev = calloc(1, sizeof **ev);
  STAT_ADD(live_events, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuEventDestroy(CUevent ev) {
  free(ev);
  STAT_ADD(live_events, -1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuEventRecord(CUevent ev, CUstream stream) {
  if (ev == NULL) return CUDA_ERROR_INVALID_HANDLE;
  ev->recorded++;
  tell((mock_cuda_op_t){.kind = MOCK_OP_EVENT_RECORD, .src = ev, .stream = stream});
  return CUDA_SUCCESS;
}

static CUresult mock_cuEventQuery(CUevent ev) {
  if (ev == NULL) return CUDA_ERROR_INVALID_HANDLE;
  /* the mock runs nothing: recorded work is complete, or never completes (a stuck GPU) with
   * MOCK_CUDA_STUCK set */
  return ev->recorded > 0 && getenv("MOCK_CUDA_STUCK") != NULL ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

static CUresult mock_cuStreamWaitEvent(CUstream stream, CUevent ev, unsigned int flags) {
  if (ev == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  tell((mock_cuda_op_t){.kind = MOCK_OP_EVENT_WAIT, .src = ev, .stream = stream});
  return CUDA_SUCCESS;
}

static CUresult capture_status(CUstream stream, CUstreamCaptureStatus *status) {
  *status =
      (void *)stream == MOCK_CUDA_CAPTURING ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

static CUresult mock_cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id,
                                            CUgraph *graph, const CUgraphNode **deps, size_t *ndeps) {
  capture_status(stream, status);
  if (graph != NULL) *graph = *status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? (CUgraph)&mock_graph : NULL;
  if (id != NULL) *id = *status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? 7 : 0;
  return deps == NULL && ndeps == NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* User objects: the mock's one graph holds them until mock_cuda_graph_destroy releases them all. */
static CUresult mock_cuUserObjectCreate(CUuserObject *obj, void *ptr, CUhostFn destroy, unsigned int refs,
                                        unsigned int flags) {
  pthread_mutex_lock(&mock_graph_lock);
  CUresult res = CUDA_ERROR_INVALID_VALUE;
  if (refs == 1 && mock_graph.nobjs < MOCK_CUDA_MAX_OBJS) {
    *obj = (CUuserObject)&mock_graph.objs[mock_graph.nobjs];
    mock_graph.objs[mock_graph.nobjs].fn = destroy;
    mock_graph.objs[mock_graph.nobjs].arg = ptr;
    mock_graph.objs[mock_graph.nobjs].held = 0;
    mock_graph.nobjs++;
    res = CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&mock_graph_lock);
  return res;
}

static CUresult mock_cuGraphRetainUserObject(CUgraph graph, CUuserObject obj, unsigned int count,
                                             unsigned int flags) {
  if ((void *)graph != (void *)&mock_graph || count != 1 || flags != CU_GRAPH_USER_OBJECT_MOVE)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mock_graph_lock);
  ((struct mock_obj *)(void *)obj)->held = 1;
  pthread_mutex_unlock(&mock_graph_lock);
  return CUDA_SUCCESS;
}

static CUresult mock_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  CUstreamCaptureMode old = mock_capture_mode;
  mock_capture_mode = *mode;
  mock_cuda_stats.capture_mode = (int)*mode;
  *mode = old;
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
  return mock_cuMemcpyHtoD(dst, src, bytes);
}

/* Stream memory operations and copies run at once (and so does the wait kernel: run_wait). */
static CUresult mock_cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                          unsigned int flags) {
  if (flags != CU_STREAM_WRITE_VALUE_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
  tell((mock_cuda_op_t){.kind = MOCK_OP_WRITE, .dst = (void *)addr, .bytes = value, .stream = stream});
  if (recording()) return CUDA_SUCCESS;
  __atomic_store_n((cuuint32_t *)addr, value, __ATOMIC_SEQ_CST);
  STAT_ADD(stream_writes, 1);
  return CUDA_SUCCESS;
}

/* Spins in the calling thread until the word is at least `value` (the driver's signed difference), as the
 * stream would wait; gives up after MOCK_CUDA_WAIT_S, which a GPU would not (counted). */
static CUresult mock_cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                         unsigned int flags) {
  if (flags != CU_STREAM_WAIT_VALUE_GEQ) return CUDA_ERROR_INVALID_VALUE;
  tell((mock_cuda_op_t){.kind = MOCK_OP_WAIT, .dst = (void *)addr, .bytes = value, .stream = stream});
  if (recording()) return CUDA_SUCCESS;
  STAT_ADD(stream_waits, 1);
  for (long i = 0; i < MOCK_CUDA_WAIT_S * 100000L; i++) {
    if ((int32_t)(__atomic_load_n((cuuint32_t *)addr, __ATOMIC_SEQ_CST) - value) >= 0) return CUDA_SUCCESS;
    usleep(10);
  }
  STAT_ADD(stream_waits_cut, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  tell((mock_cuda_op_t){
      .kind = MOCK_OP_COPY, .dst = (void *)dst, .src = (const void *)src, .bytes = bytes, .stream = stream});
  if (!recording()) memmove((void *)dst, (const void *)src, bytes);
  STAT_ADD(dd_copies, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuStreamCreate(CUstream *stream, unsigned int flags) {
  static char streams[64];
  static int nstreams;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *stream = (CUstream)&streams[nstreams++ % 64];
  return CUDA_SUCCESS;
}

static CUresult mock_cuStreamDestroy(CUstream stream) {
  return stream == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

static CUresult mock_cuEventSynchronize(CUevent ev) {
  return ev == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

static CUresult mock_cuStreamSynchronize(CUstream stream) {
  return CUDA_SUCCESS;
}

static CUresult mock_cuModuleLoadData(CUmodule *mod, const void *image) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (image == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (strncmp(image, MOCK_CUDA_NO_CODE_IMAGE, sizeof MOCK_CUDA_NO_CODE_IMAGE) == 0)
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  *mod = calloc(1, sizeof **mod);
  (*mod)->dev = current->dev;
  if (strncmp(image, MOCK_CUDA_ONLY_IMAGE, strlen(MOCK_CUDA_ONLY_IMAGE)) == 0)
    snprintf((*mod)->only, sizeof(*mod)->only, ",%s,", (const char *)image + strlen(MOCK_CUDA_ONLY_IMAGE));
  STAT_ADD(module_loads, 1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuModuleUnload(CUmodule mod) {
  free(mod);
  STAT_ADD(module_loads, -1);
  return CUDA_SUCCESS;
}

static CUresult mock_cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name) {
  char key[80];
  snprintf(key, sizeof key, ",%s,", name);
  if (mod->only[0] != '\0' && strstr(mod->only, key) == NULL) return CUDA_ERROR_NOT_FOUND;
  if (strcmp(name, MOCK_CUDA_KERNEL) == 0) {
    *f = &kernel;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_SMALL) == 0) {
    *f = &kernel_small;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_LL) == 0) {
    *f = &kernel_ll;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_BULK) == 0) {
    *f = &kernel_bulk;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_PAIR) == 0) {
    *f = &kernel_pair;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_PAIR_AR) == 0) {
    *f = &kernel_pair_ar;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_PAIR_AR128) == 0) {
    *f = &kernel_pair_ar128;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_WAIT) == 0) {
    *f = &kernel_wait;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_COMBINE) == 0) {
    *f = &kernel_combine;
  } else if (strcmp(name, MOCK_CUDA_KERNEL_PUSH) == 0) {
    *f = &kernel_push;
  } else {
    return CUDA_ERROR_NOT_FOUND;
  }
  return CUDA_SUCCESS;
}

/* Spins until *word is at least `value` (written by another process sharing the memory, or another
 * thread); an abort, or MOCK_CUDA_WAIT_S without the value, records the kernel's error instead (false). */
static int word_wait(const dev_comm_t *comm, volatile uint32_t *word, uint32_t value, int peer, int is_send,
                     uint64_t seq) {
  for (long i = 0; i < MOCK_CUDA_WAIT_S * 100000L; i++) {
    if (__atomic_load_n(word, __ATOMIC_SEQ_CST) >= value) return 1;
    if (*comm->abort_flag != 0) break;
    usleep(10);
  }
  dev_error_t *e = comm->error;
  if (e->code == DEV_OK) {
    e->peer = peer;
    e->channel = -1;
    e->is_send = is_send;
    e->seq = seq;
    e->code = *comm->abort_flag != 0 ? DEV_ERR_ABORTED : DEV_ERR_TIMEOUT;
  }
  return 0;
}

/* MOCK_CUDA_KERNEL_WAIT, run at once as the kernel would run: raises the peer's word (if any), then waits
 * until its own word is 1, then sets it to 0 again. */
static CUresult run_wait(const dev_wait_t *w) {
  STAT_ADD(wait_launches, 1);
  if (w->raise != NULL) {
    __atomic_store_n(w->raise, 1, __ATOMIC_SEQ_CST);
    STAT_ADD(wait_raises, 1);
  }
  if (word_wait(&w->comm, w->word, 1, w->peer, w->is_send, w->seq))
    __atomic_store_n(w->word, 0, __ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}

/* MOCK_CUDA_KERNEL_COMBINE, run at once: each chunk once its word says it landed, combined with the
 * host's reductions (dst = local (+) dst, divided at LAST for SUM_POSTDIV), as the kernel computes it. */
static CUresult run_combine(const dev_combine_t *w) {
  STAT_ADD(combine_launches, 1);
  const dev_xfer_t *x = &w->x;
  if (w->nchunks < 1 || w->nchunks > DEV_COMBINE_CHUNKS || x->red == DEV_RED_PREMULSUM ||
      !(x->flags & DEV_XF_REDUCE) || w->ends[w->nchunks - 1] != x->bytes || w->tile % 16 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  const red_t red = {.kind = (red_kind_t)x->red, .type = (ncclDataType_t)x->type, .divisor = x->scalar.i};
  const size_t es = dtype_size(red.type);
  uint64_t at = 0;
  for (uint32_t c = 0; c < w->nchunks; c++) {
    if (w->ends[c] <= at || (w->ends[c] - at) % es != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!word_wait(&w->comm, w->word, c + 1, w->peer, 0, w->seq)) return CUDA_SUCCESS;
    red_combine(&red, x->dst + at, x->src + at, (w->from != NULL ? w->from : x->dst) + at,
                (w->ends[c] - at) / es, (x->flags & DEV_XF_LAST) != 0);
    STAT_ADD(combine_chunks, 1);
    at = w->ends[c];
  }
  return CUDA_SUCCESS;
}

/* MOCK_CUDA_KERNEL_PUSH, run at once as its blocks together would: raises the peer's `ready` (if any), waits
 * for its own (if any), copies, clears the words, raises the peer's `done` (if any) and waits for its own (if
 * any), clearing it. The block count word must be 0 before and after, as the kernel leaves it. */
static CUresult run_push(const dev_push_t *w) {
  STAT_ADD(push_launches, 1);
  if (w->ncopies > DEV_PUSH_COPIES || w->blocks == NULL || *w->blocks != 0) return CUDA_ERROR_INVALID_VALUE;
  if (w->raise_ready != NULL) __atomic_store_n(w->raise_ready, 1, __ATOMIC_SEQ_CST);
  if (w->ready != NULL && !word_wait(&w->comm, w->ready, 1, w->peer, 1, w->seq)) return CUDA_SUCCESS;
  for (uint32_t i = 0; i < w->ncopies; i++) {
    memmove(w->copies[i].dst, w->copies[i].src, w->copies[i].bytes);
    STAT_ADD(push_copies, 1);
    STAT_ADD(push_bytes, w->copies[i].bytes);
  }
  if (w->ready != NULL) __atomic_store_n(w->ready, 0, __ATOMIC_SEQ_CST);
  if (w->raise_done != NULL) __atomic_store_n(w->raise_done, 1, __ATOMIC_SEQ_CST);
  if (w->done != NULL && word_wait(&w->comm, w->done, 1, w->peer, 0, w->seq))
    __atomic_store_n(w->done, 0, __ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}

/* One channel's part of a local transfer: a copy, a prepared copy (PreMulSum's factor), or dst = prepare(src)
 * (+) dst, divided at LAST for SUM_POSTDIV. */
static void local_part(const dev_xfer_t *x, dev_span_t part) {
  const red_t red = {.kind = (red_kind_t)x->red,
                     .type = (ncclDataType_t)x->type,
                     .fscale = x->scalar.f,
                     .iscale = x->scalar.i,
                     .divisor = x->scalar.i};
  const size_t n = part.len / dtype_size(red.type);
  char *dst = (char *)x->dst + part.off;
  const char *src = (const char *)x->src + part.off;
  if (x->flags & DEV_XF_REDUCE)
    red_combine(&red, dst, src, dst, n, (x->flags & DEV_XF_LAST) != 0);
  else if (x->flags & DEV_XF_PREPARE)
    red_prepare(&red, dst, src, n);
  else
    memmove(dst, src, part.len);
}

/* A launch of the general, small, LL or bulk entry point whose every transfer is local (no peer), run as
 * the kernels cut it: step by step (a grid barrier between), each step's transfers one lane, block c moving
 * channel c's part of each transfer in list order (an LL transfer in one slice, dev_part). The blocks of a
 * step run in no order on a GPU; here the last channel's block runs first, so that a step whose transfers
 * read what another block of the same step writes gives wrong values, as it may on a GPU. Returns 0 (and
 * moves nothing) for any other launch, and for what it does not model: a device-resident factor, or
 * SUM_POSTDIV's division on a copy. */
static int run_local(const dev_work_t *w) {
  const dev_xfer_t *x = w->ext != NULL ? w->ext : w->xfers;
  for (int i = 0; i < w->nxfers; i++)
    if (x[i].recv_peer >= 0 || x[i].send_peer >= 0 || x[i].scalar_ptr != NULL ||
        (x[i].red == DEV_RED_SUM_POSTDIV && (x[i].flags & DEV_XF_LAST) && !(x[i].flags & DEV_XF_REDUCE)))
      return 0;
  for (int s = 0, first = 0; s < w->nsteps; first = w->step_end[s++]) {
    int nch = 1;
    for (int i = first; i < w->step_end[s]; i++) nch = x[i].nch > nch ? x[i].nch : nch;
    for (int c = nch - 1; c >= 0; c--)
      for (uint64_t j = 0, more = 1; more; j++) {
        more = 0;
        for (int i = first; i < w->step_end[s]; i++) {
          const int ll = (x[i].flags & DEV_XF_LL) != 0;
          if (c >= x[i].nch || (ll && j > 0)) continue;
          more |= !ll && (j + 1) * dev_slice_stride(x[i].nch) < x[i].bytes;
          const dev_span_t part = dev_part(x[i].bytes, x[i].nch, j, (uint32_t)c);
          if (part.len != 0) local_part(&x[i], part);
        }
      }
  }
  STAT_ADD(local_launches, 1);
  return 1;
}

/* A kernel runs as cuLaunchKernel's are run (kernel_launch); the plain entry point counts it as such. */
static _Thread_local int launch_overlaps; /* the launch in progress came through cuLaunchKernelEx */
static CUresult kernel_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                              unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                              CUstream stream, void **params, void **extra);

static CUresult mock_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                    CUstream stream, void **params, void **extra) {
  STAT_ADD(plain_launches, 1);
  return kernel_launch(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

/* The one attribute the library passes, overlap with the previous kernel, where the device has it. */
static CUresult mock_cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
  int major = 0;
  mock_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0);
  if (cfg == NULL || cfg->numAttrs != 1 || cfg->attrs == NULL ||
      cfg->attrs[0].id != CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION ||
      cfg->attrs[0].value.programmaticStreamSerializationAllowed != 1 || cfg->sharedMemBytes != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (major < 9) return CUDA_ERROR_NOT_SUPPORTED;
  STAT_ADD(overlap_launches, 1);
  launch_overlaps = 1;
  CUresult res = kernel_launch(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY,
                               cfg->blockDimZ, cfg->sharedMemBytes, cfg->hStream, params, extra);
  launch_overlaps = 0;
  return res;
}

/* The name a kernel was loaded by. */
static const char *kernel_name(CUfunction f) {
  return f == &kernel              ? MOCK_CUDA_KERNEL
         : f == &kernel_small      ? MOCK_CUDA_KERNEL_SMALL
         : f == &kernel_ll         ? MOCK_CUDA_KERNEL_LL
         : f == &kernel_bulk       ? MOCK_CUDA_KERNEL_BULK
         : f == &kernel_pair       ? MOCK_CUDA_KERNEL_PAIR
         : f == &kernel_pair_ar    ? MOCK_CUDA_KERNEL_PAIR_AR
         : f == &kernel_pair_ar128 ? MOCK_CUDA_KERNEL_PAIR_AR128
         : f == &kernel_wait       ? MOCK_CUDA_KERNEL_WAIT
         : f == &kernel_combine    ? MOCK_CUDA_KERNEL_COMBINE
         : f == &kernel_push       ? MOCK_CUDA_KERNEL_PUSH
                                   : "?";
}

static CUresult kernel_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                              unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                              CUstream stream, void **params, void **extra) {
  if (getenv("MOCK_CUDA_FAIL_LAUNCHES") != NULL) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  if (params != NULL)
    tell((mock_cuda_op_t){.kind = MOCK_OP_LAUNCH,
                          .kernel = kernel_name(f),
                          .grid = gx,
                          .block = bx,
                          .overlap = launch_overlaps,
                          .params = params[0],
                          .stream = stream});
  if (recording() && (f == &kernel_wait || f == &kernel_combine || f == &kernel_push)) return CUDA_SUCCESS;
  if (f == &kernel_wait)
    return gx == 1 && gy == 1 && gz == 1 && by == 1 && bz == 1 && params != NULL && extra == NULL
               ? run_wait(params[0])
               : CUDA_ERROR_INVALID_VALUE;
  if (f == &kernel_combine)
    return gx >= 1 && gy == 1 && gz == 1 && bx == DEV_THREADS && by == 1 && bz == 1 && params != NULL &&
                   extra == NULL
               ? run_combine(params[0])
               : CUDA_ERROR_INVALID_VALUE;
  if (f == &kernel_push)
    return gx >= 1 && gy == 1 && gz == 1 && bx == DEV_THREADS && by == 1 && bz == 1 && params != NULL &&
                   extra == NULL
               ? run_push(params[0])
               : CUDA_ERROR_INVALID_VALUE;
  const int small_work = f == &kernel_small || f == &kernel_ll || f == &kernel_bulk;
  const int pair = f == &kernel_pair || f == &kernel_pair_ar || f == &kernel_pair_ar128;
  if ((f != &kernel && !pair && !small_work) || gy != 1 || gz != 1 || by != 1 || bz != 1 || params == NULL ||
      extra != NULL)
    return CUDA_ERROR_INVALID_VALUE;
  memcpy(&mock_cuda_stats.last_param, params[0], sizeof mock_cuda_stats.last_param);
  mock_cuda_stats.last_param_at = params[0];
  mock_cuda_stats.last_grid = gx;
  mock_cuda_stats.last_small = f == &kernel_small;
  mock_cuda_stats.last_ll = f == &kernel_ll;
  mock_cuda_stats.last_bulk = f == &kernel_bulk;
  mock_cuda_stats.last_pair = pair;
  mock_cuda_stats.last_pair_ar = f == &kernel_pair_ar ? 1 : f == &kernel_pair_ar128 ? 2 : 0;
  memset(mock_cuda_stats.last_work, 0, sizeof mock_cuda_stats.last_work);
  memcpy(mock_cuda_stats.last_work, params[0],
         pair         ? sizeof(dev_pair_t)
         : small_work ? sizeof(dev_work_small_t)
                      : sizeof(dev_work_t));
  static int run_locals = -1;
  if (run_locals < 0) run_locals = getenv("MOCK_CUDA_RUN_LOCAL") != NULL;
  if (!pair && !recording() && run_locals) run_local(params[0]);
  if (f == &kernel_small) STAT_ADD(small_launches, 1);
  if (f == &kernel_ll) STAT_ADD(ll_launches, 1);
  if (f == &kernel_bulk) STAT_ADD(bulk_launches, 1);
  if (pair) STAT_ADD(pair_launches, 1);
  mock_cuda_stats.last_block = bx;
  STAT_ADD(launches, 1);
  return CUDA_SUCCESS;
}

/* ---- Entry points by name ---- */

/* Each entry's type is checked against cuda.h's declaration of the base name. */
#define ENTRY(name)             {#name, (void *)(__typeof__(&name))mock_##name},
#define ENTRY_TYPED(name, type) {#name, (void *)(type)mock_##name},
static const struct {
  const char *name;
  void *fn;
} entries[] = {GPU_CUDA_FUNCS(ENTRY) GPU_CUDA_FUNCS_TYPED(ENTRY_TYPED)};

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status) {
  mock_cuda_stats.proc_version = version;
  mock_cuda_stats.legacy_stream = flags == CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    if (strcmp(entries[i].name, symbol) != 0) continue;
    *pfn = entries[i].fn;
    if (status != NULL) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  *pfn = NULL;
  if (status != NULL) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

/* What is also found with dlsym: the library's first look-ups, and `braid info`'s probe. */
CUresult CUDAAPI cuGetErrorName(CUresult r, const char **name) {
  return mock_cuGetErrorName(r, name);
}
CUresult CUDAAPI cuInit(unsigned int flags) {
  return mock_cuInit(flags);
}
CUresult CUDAAPI cuDeviceGetCount(int *n) {
  return mock_cuDeviceGetCount(n);
}
