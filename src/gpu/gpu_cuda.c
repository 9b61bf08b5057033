/*
 * The CUDA implementation of the device interface (gpu.h), on the CUDA driver API alone.
 *
 * libcuda.so.1 is opened at run time, so nothing links against CUDA and the library loads on machines without
 * a driver. Every entry point is resolved by its base name through cuGetProcAddress for CUDA 12.0, which
 * returns the variant (_v2, ...) that cuda.h's macros give that base name; the pointers keep cuda.h's exact
 * types (__typeof__), so a mismatch is a compile error, not a crash. Only entry points whose 12.0 variant is
 * the one in the headers are used that way; the few whose headers declare a newer variant
 * (cuStreamGetCaptureInfo) are resolved the same way with their 12.0 signature written out in gpu_cuda.h.
 * This is the only host file of the library that sees CUDA's headers (with cu_launch.h, which it includes).
 *
 * Device memory is of two kinds: cuMem allocations (cuMemCreate, exportable as a POSIX file descriptor,
 * passed to other processes by base/fdpass) where the device supports them, else cuMemAlloc (exported through
 * legacy CUDA IPC). Every call that needs a context runs in the device's primary context (gpu_enter).
 */
#include <cuda.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/check.h"
#include "base/fdpass.h"
#include "base/log.h"
#include "cu_launch.h"
#include "device/dev.h"
#include "gpu.h"
#include "gpu_cuda.h"
#include "gpu_cuda_int.h"

/* The CUDA version whose entry-point variants we ask for. */
#define CU_API_VERSION 12000

/* Every driver entry point used here, by base name. */

/* The resolved entry points (gpu_cuda_int.h). */
gpu_cuda_drv_t drv;

/* One device. `ctx` is its primary context, retained at the first gpu_enter and kept for the process's life;
 * it is published with a release store after the retain and read with an acquire load, so gpu_enter takes no
 * lock once the context exists. */
typedef struct {
  CUdevice dev;
  CUcontext ctx;
} device_t;

/* What loading the driver found; written once under `load_once`, read-only after. */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int ndevs;           /* usable devices; 0 when the driver is missing or unusable */
static device_t *devs;      /* [ndevs] */
static char load_what[256]; /* why ndevs is 0, or a description of the driver */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER; /* serialises the primary-context retains */

/* Reports a failed driver call once: its name, the CUresult's name and the values involved. */
ncclResult_t cu_fail(CUresult r, const char *call, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  const char *name = NULL;
  if (drv.cuGetErrorName == NULL || drv.cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
    name = "unknown CUresult";
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return log_err(ncclUnhandledCudaError, "out of device memory allocating %s: %s (%s) failed: %s",
                   mem_doing_name("memory"), call, what, name);
  return log_err(ncclUnhandledCudaError, "%s (%s) failed: %s (%d)", call, what, name, (int)r);
}

/* ---- Loading the driver ---- */

/* cuGetProcAddress before CUDA 12.0 had no status argument. */
typedef CUresult (*get_proc_v1_fn_t)(const char *, void **, int, cuuint64_t);
static __typeof__(&cuGetProcAddress) get_proc_v2;
static get_proc_v1_fn_t get_proc_v1;

/* Legacy-stream variants: stream 0 means the legacy default stream, as in a program built with nvcc's
 * defaults. */
static CUresult get_proc(const char *name, void **fn) {
  if (get_proc_v2 != NULL) {
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = get_proc_v2(name, fn, CU_API_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);
    return r == CUDA_SUCCESS && status != CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_ERROR_NOT_FOUND : r;
  }
  return get_proc_v1(name, fn, CU_API_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
}

static void describe_resolve_failure(const char *name, CUresult r) {
  const char *rname = NULL;
  if (drv.cuGetErrorName == NULL || drv.cuGetErrorName(r, &rname) != CUDA_SUCCESS || rname == NULL)
    rname = "unknown CUresult";
  if (r == CUDA_ERROR_NOT_FOUND || r == CUDA_SUCCESS)
    snprintf(load_what, sizeof load_what, "the CUDA driver lacks %s for CUDA %d.%d", name,
             CU_API_VERSION / 1000, CU_API_VERSION % 1000 / 10);
  else
    snprintf(load_what, sizeof load_what,
             "the CUDA driver could not resolve %s: cuGetProcAddress failed: %s (%d)", name, rname, (int)r);
}

/* Finds cuGetProcAddress in the library and resolves every entry point with it. Failures are written to
 * load_what (a missing or old driver is a fact to report, not an error) and returned. */
static ncclResult_t resolve_all(void *lib) {
  void *sym = dlsym(lib, "cuGetProcAddress_v2");
  if (sym != NULL) {
    memcpy(&get_proc_v2, &sym, sizeof sym);
  } else if ((sym = dlsym(lib, "cuGetProcAddress")) != NULL) {
    memcpy(&get_proc_v1, &sym, sizeof sym);
  } else {
    snprintf(load_what, sizeof load_what, "the CUDA driver is too old (it has no cuGetProcAddress)");
    return ncclSystemError;
  }
  /* cuGetErrorName first, straight from the library, so that the failures below can be named. */
  void *fn = dlsym(lib, "cuGetErrorName");
  memcpy(&drv.cuGetErrorName, &fn, sizeof fn);
  CUresult r;
/* `str` is the base name (stringized before cuda.h's macros rename it); `field` expands like drv's field. */
#define CU_RESOLVE_NAMED(str, field)                                                                         \
  fn = NULL;                                                                                                 \
  if ((r = get_proc(str, &fn)) != CUDA_SUCCESS || fn == NULL) {                                              \
    describe_resolve_failure(str, r);                                                                        \
    return ncclSystemError;                                                                                  \
  }                                                                                                          \
  memcpy(&drv.field, &fn, sizeof fn);
#define CU_RESOLVE(name)             CU_RESOLVE_NAMED(#name, name)
#define CU_RESOLVE_TYPED(name, type) CU_RESOLVE_NAMED(#name, name)
  GPU_CUDA_FUNCS(CU_RESOLVE)
  GPU_CUDA_FUNCS_TYPED(CU_RESOLVE_TYPED)
#undef CU_RESOLVE_TYPED
#undef CU_RESOLVE
#undef CU_RESOLVE_NAMED
  return ncclSuccess;
}

/* Initialises the driver and lists its devices. */
static ncclResult_t init_devices(void) {
  CUresult r = drv.cuInit(0);
  const char *name = "?";
  if (r != CUDA_SUCCESS) {
    drv.cuGetErrorName(r, &name);
    snprintf(load_what, sizeof load_what, "%s (cuInit: %s)",
             r == CUDA_ERROR_NO_DEVICE ? "no CUDA device found" : "the CUDA driver failed to initialise",
             name);
    return ncclSystemError;
  }
  int version = 0, n = 0;
  drv.cuDriverGetVersion(&version);
  if ((r = drv.cuDeviceGetCount(&n)) != CUDA_SUCCESS || n <= 0) {
    drv.cuGetErrorName(r, &name);
    snprintf(load_what, sizeof load_what, "no CUDA device found (cuDeviceGetCount: %s, %d devices)",
             r == CUDA_SUCCESS ? "CUDA_SUCCESS" : name, n);
    return ncclSystemError;
  }
  device_t *list = calloc((size_t)n, sizeof *list);
  if (list == NULL) {
    snprintf(load_what, sizeof load_what, "out of host memory listing %d CUDA devices", n);
    return ncclSystemError;
  }
  for (int i = 0; i < n; i++) {
    if ((r = drv.cuDeviceGet(&list[i].dev, i)) != CUDA_SUCCESS) {
      drv.cuGetErrorName(r, &name);
      snprintf(load_what, sizeof load_what, "cuDeviceGet(%d) failed: %s", i, name);
      free(list);
      return ncclSystemError;
    }
  }
  devs = list;
  ndevs = n;
  snprintf(load_what, sizeof load_what, "CUDA driver %d.%d, %d device%s", version / 1000, version % 1000 / 10,
           n, n == 1 ? "" : "s");
  return ncclSuccess;
}

static void load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(load_what, sizeof load_what, "no CUDA driver found (%s)", dlerror());
    return;
  }
  /* The library stays loaded for the process's life: the resolved pointers point into it. */
  if (resolve_all(lib) != ncclSuccess || init_devices() != ncclSuccess) ndevs = 0;
}

ncclResult_t gpu_cuda_probe(int *ndev_p, const char **what_p) {
  pthread_once(&load_once, load);
  *ndev_p = ndevs;
  *what_p = load_what;
  return ncclSuccess;
}

/* Fails unless the driver is loaded with at least one device; `what` names the caller. */
ncclResult_t gpu_cuda_ready(const char *what) {
  pthread_once(&load_once, load);
  if (ndevs == 0) return log_err(ncclInvalidUsage, "%s: no usable CUDA device: %s", what, load_what);
  return ncclSuccess;
}

ncclResult_t gpu_cuda_check_dev(int dev, const char *what) {
  CHECK(gpu_cuda_ready(what));
  if (dev < 0 || dev >= ndevs)
    return log_err(ncclInvalidArgument, "%s: device %d does not exist (this process sees %d)", what, dev,
                   ndevs);
  return ncclSuccess;
}

/* ---- Devices and contexts ---- */

ncclResult_t gpu_device_count(int *count_p) {
  CHECK(gpu_cuda_ready("gpu_device_count"));
  *count_p = ndevs;
  return ncclSuccess;
}

ncclResult_t gpu_current_device(int *dev_p) {
  CHECK(gpu_cuda_ready("gpu_current_device"));
  CUcontext ctx = NULL;
  CU_CALL(cuCtxGetCurrent, (&ctx), "current device");
  if (ctx == NULL) {
    *dev_p = 0;
    return ncclSuccess;
  }
  CUdevice d;
  CU_CALL(cuCtxGetDevice, (&d), "current context %p", (void *)ctx);
  for (int i = 0; i < ndevs; i++) {
    if (devs[i].dev != d) continue;
    *dev_p = i;
    return ncclSuccess;
  }
  return log_err(ncclInternalError,
                 "gpu_current_device: the current context's device %d is not among the %d listed", (int)d,
                 ndevs);
}

ncclResult_t gpu_device_sms(int dev, int *sms_p) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_device_sms"));
  int n = 0;
  CU_CALL(cuDeviceGetAttribute, (&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, devs[dev].dev),
          "multiprocessor count of device %d", dev);
  *sms_p = n;
  return ncclSuccess;
}

ncclResult_t gpu_cuda_no_code(int dev) {
  int major = 0, minor = 0;
  drv.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, devs[dev].dev);
  drv.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, devs[dev].dev);
  return log_err(
      ncclUnhandledCudaError,
      "device %d is sm_%d%d (compute capability %d.%d), and this build of Braid has no GPU code it runs: "
      "it carries %s; build Braid with BRAID_CUDA_ARCHS including %d%d",
      dev, major, minor, major, minor, dev_fatbin_archs[0] != '\0' ? dev_fatbin_archs : "none", major, minor);
}

ncclResult_t gpu_overlap_support(int dev, int *eager_p, int *captured_p) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_overlap_support"));
  int major = 0, version = 0;
  CU_CALL(cuDeviceGetAttribute, (&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, devs[dev].dev),
          "compute capability of device %d", dev);
  CU_CALL(cuDriverGetVersion, (&version), "the driver's version");
  *eager_p = cu_overlap_allowed(major, version, 0);
  *captured_p = cu_overlap_allowed(major, version, 1);
  return ncclSuccess;
}

ncclResult_t gpu_device_busid(int dev, char busid[16]) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_device_busid"));
  char id[16] = "";
  CU_CALL(cuDeviceGetPCIBusId, (id, (int)sizeof id, devs[dev].dev), "device %d", dev);
  /* Lower case, as sysfs writes it, so the id can name /sys/bus/pci/devices entries. */
  for (int i = 0; id[i] != '\0'; i++)
    if (id[i] >= 'A' && id[i] <= 'F') id[i] = (char)(id[i] - 'A' + 'a');
  memcpy(busid, id, sizeof id);
  busid[15] = '\0';
  return ncclSuccess;
}

ncclResult_t gpu_can_access_peer(int dev, int peer_dev, int *yes_p) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_can_access_peer"));
  CHECK(gpu_cuda_check_dev(peer_dev, "gpu_can_access_peer"));
  int yes = 1;
  if (dev != peer_dev)
    CU_CALL(cuDeviceCanAccessPeer, (&yes, devs[dev].dev, devs[peer_dev].dev), "device %d to peer device %d",
            dev, peer_dev);
  *yes_p = yes;
  return ncclSuccess;
}

/* The primary context of `dev`, retained the first time. */
static ncclResult_t primary_ctx(int dev, CUcontext *ctx_p) {
  CUcontext ctx = __atomic_load_n(&devs[dev].ctx, __ATOMIC_ACQUIRE);
  if (ctx != NULL) {
    *ctx_p = ctx;
    return ncclSuccess;
  }
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&ctx_lock);
  ctx = devs[dev].ctx;
  if (ctx == NULL) {
    CU_GOTO(cuDevicePrimaryCtxRetain, (&ctx, devs[dev].dev), res, unlock, "device %d", dev);
    __atomic_store_n(&devs[dev].ctx, ctx, __ATOMIC_RELEASE);
  }
  *ctx_p = ctx;
unlock:
  pthread_mutex_unlock(&ctx_lock);
  return res;
}

ncclResult_t gpu_enter(int dev, gpu_scope_t *scope) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_enter"));
  CUcontext ctx, cur = NULL;
  CHECK(primary_ctx(dev, &ctx));
  CU_CALL(cuCtxGetCurrent, (&cur), "entering device %d", dev);
  scope->saved = cur;
  scope->switched = 0;
  if (cur != ctx) {
    CU_CALL(cuCtxSetCurrent, (ctx), "entering device %d", dev);
    scope->switched = 1;
  }
  return ncclSuccess;
}

void gpu_leave(gpu_scope_t *scope) {
  if (!scope->switched) return;
  CU_WARN(cuCtxSetCurrent, ((CUcontext)scope->saved), "restoring context %p", scope->saved);
  scope->switched = 0;
}

ncclResult_t gpu_enable_peer_access(int dev, int peer_dev) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_enable_peer_access"));
  CHECK(gpu_cuda_check_dev(peer_dev, "gpu_enable_peer_access"));
  if (dev == peer_dev) return ncclSuccess;
  CUcontext peer_ctx;
  CHECK(primary_ctx(peer_dev, &peer_ctx));
  gpu_scope_t scope;
  CHECK(gpu_enter(dev, &scope));
  CUresult r = drv.cuCtxEnablePeerAccess(peer_ctx, 0);
  gpu_leave(&scope);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    return cu_fail(r, "cuCtxEnablePeerAccess", "device %d to peer device %d", dev, peer_dev);
  return ncclSuccess;
}

/* Enters the calling thread's current device (device 0 when no context is current). */
static ncclResult_t enter_current(gpu_scope_t *scope) {
  int dev;
  CHECK(gpu_current_device(&dev));
  return gpu_enter(dev, scope);
}

/* ---- Device memory ---- */

enum { MEM_VMM = 1, MEM_LEGACY = 2 };
#define EXPORT_MAGIC 0x42524d58u /* "BRMX" */

struct gpu_mem {
  int kind;     /* MEM_VMM (cuMem) or MEM_LEGACY (cuMemAlloc, CUDA IPC) */
  int imported; /* mapped from another process's export */
  int dev;      /* the device it is on (own) or mapped for (imported) */
  CUdeviceptr ptr;
  size_t size;                         /* bytes mapped */
  CUmemGenericAllocationHandle handle; /* MEM_VMM */
  uint64_t token;                      /* fd_serve token once exported (MEM_VMM, own); 0 before */
  gpu_mem_t *next;                     /* in the ncclMemAlloc registry */
};

/* What gpu_mem_export writes. */
typedef struct {
  uint32_t magic;
  uint32_t kind;
  uint64_t size;
  int32_t pid; /* the owner, which serves the descriptor */
  int32_t dev; /* the owner's device, for messages */
  uint64_t token;
  CUipcMemHandle ipc; /* MEM_LEGACY */
} export_blob_t;
_Static_assert(sizeof(export_blob_t) <= GPU_EXPORT_BYTES, "an export blob fits in gpu_export_t");

/* Serialises the first export of an allocation (which starts serving its descriptor). */
static pthread_mutex_t export_lock = PTHREAD_MUTEX_INITIALIZER;
/* ncclMemAlloc's allocations, for ncclMemFree. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static gpu_mem_t *registry;

/* Whether `dev` can make cuMem allocations exportable as POSIX file descriptors. */
static ncclResult_t vmm_supported(int dev, int *yes_p) {
  int vmm = 0, fd = 0;
  CU_CALL(cuDeviceGetAttribute,
          (&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, devs[dev].dev),
          "virtual memory management support of device %d", dev);
  CU_CALL(cuDeviceGetAttribute,
          (&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, devs[dev].dev),
          "POSIX file descriptor support of device %d", dev);
  *yes_p = vmm && fd;
  return ncclSuccess;
}

static CUmemAllocationProp vmm_prop(int dev) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = devs[dev].dev;
  return prop;
}

static ncclResult_t granularity(int dev, size_t *gran_p) {
  CUmemAllocationProp prop = vmm_prop(dev);
  size_t g = 0;
  CU_CALL(cuMemGetAllocationGranularity, (&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "device %d", dev);
  *gran_p = g > 0 ? g : 1;
  return ncclSuccess;
}

/* Reserves an address range for `handle` (size bytes), maps it and grants read/write to `dev` and, when
 * `peers` is set, to every device that can access `dev`'s memory. */
static ncclResult_t map_handle(int dev, CUmemGenericAllocationHandle handle, size_t size, int peers,
                               CUdeviceptr *ptr_p) {
  ncclResult_t res = ncclSuccess;
  size_t gran;
  CHECK(granularity(dev, &gran));
  CUdeviceptr ptr = 0;
  CU_CALL(cuMemAddressReserve, (&ptr, size, gran, 0, 0), "%zu bytes of address space for device %d", size,
          dev);
  CU_GOTO(cuMemMap, (ptr, size, 0, handle, 0), res, err_free, "%zu bytes on device %d", size, dev);
  CUmemAccessDesc *desc = calloc((size_t)ndevs, sizeof *desc);
  if (desc == NULL) {
    res = log_err(ncclSystemError, "out of host memory mapping %zu bytes on device %d", size, dev);
    goto err_unmap;
  }
  int n = 0;
  for (int d = 0; d < ndevs; d++) {
    int yes = d == dev;
    if (!yes && peers) CHECK_GOTO(gpu_can_access_peer(d, dev, &yes), res, err_desc);
    if (!yes) continue;
    desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[n].location.id = devs[d].dev;
    desc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    n++;
  }
  CU_GOTO(cuMemSetAccess, (ptr, size, desc, (size_t)n), res, err_desc,
          "read/write access for %d device(s) to %zu bytes of device %d", n, size, dev);
  free(desc);
  *ptr_p = ptr;
  return ncclSuccess;
err_desc:
  free(desc);
err_unmap:
  CU_WARN(cuMemUnmap, (ptr, size), "%zu bytes on device %d", size, dev);
err_free:
  CU_WARN(cuMemAddressFree, (ptr, size), "%zu bytes on device %d", size, dev);
  return res;
}

static ncclResult_t alloc_vmm(int dev, size_t bytes, gpu_mem_t *m) {
  size_t gran;
  CHECK(granularity(dev, &gran));
  size_t size = (bytes + gran - 1) / gran * gran;
  CUmemAllocationProp prop = vmm_prop(dev);
  CUmemGenericAllocationHandle handle;
  CU_CALL(cuMemCreate, (&handle, size, &prop, 0), "%zu bytes on device %d", size, dev);
  ncclResult_t res = map_handle(dev, handle, size, 1, &m->ptr);
  if (res != ncclSuccess) {
    CU_WARN(cuMemRelease, (handle), "%zu bytes on device %d", size, dev);
    return res;
  }
  m->kind = MEM_VMM;
  m->handle = handle;
  m->size = size;
  return ncclSuccess;
}

static ncclResult_t alloc_legacy(int dev, size_t bytes, gpu_mem_t *m) {
  CU_CALL(cuMemAlloc, (&m->ptr, bytes), "%zu bytes on device %d", bytes, dev);
  m->kind = MEM_LEGACY;
  m->size = bytes;
  return ncclSuccess;
}

/* Unmaps and frees what `m` holds (not `m` itself). The caller has entered m->dev. */
static void release_mapping(gpu_mem_t *m) {
  if (m->kind == MEM_VMM) {
    if (m->token != 0) fd_unserve(m->token);
    CU_WARN(cuMemUnmap, (m->ptr, m->size), "%zu bytes at %p on device %d", m->size, (void *)m->ptr, m->dev);
    CU_WARN(cuMemRelease, (m->handle), "%zu bytes on device %d", m->size, m->dev);
    CU_WARN(cuMemAddressFree, (m->ptr, m->size), "%zu bytes at %p", m->size, (void *)m->ptr);
  } else if (m->imported) {
    CU_WARN(cuIpcCloseMemHandle, (m->ptr), "%zu bytes at %p on device %d", m->size, (void *)m->ptr, m->dev);
  } else {
    CU_WARN(cuMemFree, (m->ptr), "%zu bytes at %p on device %d", m->size, (void *)m->ptr, m->dev);
  }
}

/* Device memory on `dev`, zeroed when `zero` is set. */
static ncclResult_t dev_alloc(int dev, size_t bytes, int zero, gpu_mem_t **mem_p) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_dev_alloc"));
  if (bytes == 0) return log_err(ncclInvalidArgument, "gpu_dev_alloc: 0 bytes requested on device %d", dev);
  CHECK(mem_fault(NULL, bytes, 1));
  gpu_mem_t *m = calloc(1, sizeof *m);
  if (m == NULL) return log_err(ncclSystemError, "gpu_dev_alloc: out of host memory");
  m->dev = dev;
  gpu_scope_t scope;
  ncclResult_t res;
  CHECK_GOTO(gpu_enter(dev, &scope), res, err_free);
  int vmm = 0;
  CHECK_GOTO(vmm_supported(dev, &vmm), res, err_leave);
  CHECK_GOTO(vmm ? alloc_vmm(dev, bytes, m) : alloc_legacy(dev, bytes, m), res, err_leave);
  if (zero) {
    /* Synchronous, because the first users may be other processes or streams that do not wait for the
     * legacy stream the memset runs on. */
    CU_GOTO(cuMemsetD8, (m->ptr, 0, m->size), res, err_release, "zeroing %zu bytes on device %d", m->size,
            dev);
    CU_GOTO(cuStreamSynchronize, (NULL), res, err_release, "zeroing %zu bytes on device %d", m->size, dev);
  }
  gpu_leave(&scope);
  INFO(LOG_ALLOC, "device %d: %zu bytes at %p (%s)", dev, m->size, (void *)m->ptr,
       m->kind == MEM_VMM ? "cuMem, exportable as a file descriptor" : "cuMemAlloc");
  *mem_p = m;
  return ncclSuccess;
err_release:
  release_mapping(m);
err_leave:
  gpu_leave(&scope);
err_free:
  free(m);
  return res;
}

ncclResult_t gpu_dev_alloc(int dev, size_t bytes, gpu_mem_t **mem_p) {
  return dev_alloc(dev, bytes, 1, mem_p);
}

void *gpu_mem_ptr(const gpu_mem_t *mem) {
  return (void *)mem->ptr;
}

size_t gpu_mem_size(const gpu_mem_t *mem) {
  return mem->size;
}

void gpu_mem_release(gpu_mem_t *mem) {
  if (mem == NULL) return;
  gpu_scope_t scope;
  int entered = gpu_enter(mem->dev, &scope) == ncclSuccess;
  release_mapping(mem);
  if (entered) gpu_leave(&scope);
  free(mem);
}

/* The descriptor of a cuMem allocation, served from its first export until its release. */
static ncclResult_t serve_once(gpu_mem_t *m) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&export_lock);
  if (m->token == 0) {
    int fd = -1;
    CU_GOTO(cuMemExportToShareableHandle, (&fd, m->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), res,
            unlock, "file descriptor of %zu bytes on device %d", m->size, m->dev);
    res = fd_serve(fd, &m->token);
    close(fd);
  }
unlock:
  pthread_mutex_unlock(&export_lock);
  return res;
}

/* An export blob of this process's allocation of `kind`, without its handle yet. */
static export_blob_t blob_header(int kind, size_t size, int dev) {
  export_blob_t b;
  memset(&b, 0, sizeof b);
  b.magic = EXPORT_MAGIC;
  b.kind = (uint32_t)kind;
  b.size = size;
  b.pid = (int32_t)getpid();
  b.dev = dev;
  return b;
}

/* The blob of a cuMemAlloc allocation at `base`, through legacy IPC. The caller has entered `dev`. */
static ncclResult_t legacy_blob(int dev, CUdeviceptr base, size_t size, gpu_export_t *blob_p) {
  export_blob_t b = blob_header(MEM_LEGACY, size, dev);
  CU_CALL(cuIpcGetMemHandle, (&b.ipc, base), "%zu bytes at %p on device %d", size, (void *)base, dev);
  memset(blob_p, 0, sizeof *blob_p);
  memcpy(blob_p->bytes, &b, sizeof b);
  return ncclSuccess;
}

ncclResult_t gpu_mem_export(const gpu_mem_t *mem, gpu_export_t *blob_p) {
  /* The allocation is never a const object: serve_once records its token in it. */
  gpu_mem_t *m = (gpu_mem_t *)mem;
  if (m->imported)
    return log_err(ncclInvalidUsage, "gpu_mem_export: %zu bytes at %p were imported; only the owner exports",
                   m->size, (void *)m->ptr);
  if (m->kind != MEM_VMM) {
    gpu_scope_t scope;
    CHECK(gpu_enter(m->dev, &scope));
    ncclResult_t res = legacy_blob(m->dev, m->ptr, m->size, blob_p);
    gpu_leave(&scope);
    return res;
  }
  CHECK(serve_once(m));
  export_blob_t b = blob_header(MEM_VMM, m->size, m->dev);
  b.token = m->token;
  memset(blob_p, 0, sizeof *blob_p);
  memcpy(blob_p->bytes, &b, sizeof b);
  return ncclSuccess;
}

/* Maps a cuMem allocation of another process: its descriptor comes from the owner's fdpass server. */
static ncclResult_t import_vmm(int dev, const export_blob_t *b, gpu_mem_t *m) {
  int fd = -1;
  CHECK(fd_fetch(b->pid, b->token, NULL, &fd));
  CUmemGenericAllocationHandle handle;
  CUresult r = drv.cuMemImportFromShareableHandle(&handle, (void *)(uintptr_t)fd,
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(fd); /* the handle holds the memory now */
  if (r != CUDA_SUCCESS)
    return cu_fail(r, "cuMemImportFromShareableHandle", "%llu bytes of process %d's device %d",
                   (unsigned long long)b->size, (int)b->pid, (int)b->dev);
  ncclResult_t res = map_handle(dev, handle, (size_t)b->size, 0, &m->ptr);
  if (res != ncclSuccess) {
    CU_WARN(cuMemRelease, (handle), "imported %llu bytes", (unsigned long long)b->size);
    return res;
  }
  m->handle = handle;
  return ncclSuccess;
}

ncclResult_t gpu_mem_import(int dev, const gpu_export_t *blob, gpu_mem_t **mem_p) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_mem_import"));
  export_blob_t b;
  memcpy(&b, blob->bytes, sizeof b);
  if (b.magic != EXPORT_MAGIC || (b.kind != MEM_VMM && b.kind != MEM_LEGACY) || b.size == 0)
    return log_err(ncclInvalidArgument, "gpu_mem_import: the blob is not an exported allocation (magic %08x)",
                   b.magic);
  if (b.pid == (int32_t)getpid())
    return log_err(
        ncclInvalidUsage,
        "gpu_mem_import: %llu bytes on device %d were exported by this same process (pid %d); use the "
        "allocation's pointer instead of importing it",
        (unsigned long long)b.size, (int)b.dev, (int)b.pid);
  gpu_mem_t *m = calloc(1, sizeof *m);
  if (m == NULL) return log_err(ncclSystemError, "gpu_mem_import: out of host memory");
  *m = (gpu_mem_t){.kind = (int)b.kind, .imported = 1, .dev = dev, .size = (size_t)b.size};
  gpu_scope_t scope;
  ncclResult_t res;
  CHECK_GOTO(gpu_enter(dev, &scope), res, err_free);
  if (b.kind == MEM_VMM)
    res = import_vmm(dev, &b, m);
  else
    CU_GOTO(cuIpcOpenMemHandle, (&m->ptr, b.ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), res, err_leave,
            "%llu bytes of process %d's device %d, mapped on device %d", (unsigned long long)b.size,
            (int)b.pid, (int)b.dev, dev);
  gpu_leave(&scope);
  if (res != ncclSuccess) goto err_free;
  INFO(LOG_ALLOC, "device %d: mapped %zu bytes of process %d's device %d at %p", dev, m->size, (int)b.pid,
       (int)b.dev, (void *)m->ptr);
  *mem_p = m;
  return ncclSuccess;
err_leave:
  gpu_leave(&scope);
err_free:
  free(m);
  return res;
}

/* ---- Host memory ---- */

ncclResult_t gpu_host_alloc(size_t bytes, void **host_p, void **dev_p) {
  CHECK(mem_fault(NULL, bytes, 0));
  gpu_scope_t scope;
  CHECK(enter_current(&scope));
  ncclResult_t res = ncclSuccess;
  void *host = NULL;
  CUdeviceptr dptr = 0;
  CU_GOTO(cuMemHostAlloc, (&host, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), res, leave,
          "%zu bytes of page-locked host memory", bytes);
  memset(host, 0, bytes);
  CU_GOTO(cuMemHostGetDevicePointer, (&dptr, host, 0), res, err_free, "%zu bytes of host memory at %p", bytes,
          host);
  *host_p = host;
  *dev_p = (void *)dptr;
  goto leave;
err_free:
  CU_WARN(cuMemFreeHost, (host), "%zu bytes at %p", bytes, host);
leave:
  gpu_leave(&scope);
  return res;
}

void gpu_host_free(void *host) {
  gpu_scope_t scope;
  if (host == NULL || enter_current(&scope) != ncclSuccess) return;
  CU_WARN(cuMemFreeHost, (host), "host memory at %p", host);
  gpu_leave(&scope);
}

ncclResult_t gpu_host_register(void *host, size_t bytes, void **dev_p) {
  CHECK(mem_fault(NULL, bytes, 0));
  gpu_scope_t scope;
  CHECK(enter_current(&scope));
  ncclResult_t res = ncclSuccess;
  CUdeviceptr dptr = 0;
  CU_GOTO(cuMemHostRegister, (host, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP), res,
          leave, "%zu bytes of host memory at %p", bytes, host);
  CU_GOTO(cuMemHostGetDevicePointer, (&dptr, host, 0), res, err_unregister, "%zu bytes of host memory at %p",
          bytes, host);
  *dev_p = (void *)dptr;
  goto leave;
err_unregister:
  CU_WARN(cuMemHostUnregister, (host), "host memory at %p", host);
leave:
  gpu_leave(&scope);
  return res;
}

void gpu_host_unregister(void *host) {
  gpu_scope_t scope;
  if (host == NULL || enter_current(&scope) != ncclSuccess) return;
  CU_WARN(cuMemHostUnregister, (host), "host memory at %p", host);
  gpu_leave(&scope);
}

ncclResult_t gpu_copy_to_device(void *dst, const void *src, size_t bytes) {
  gpu_scope_t scope;
  CHECK(enter_current(&scope));
  CUresult r = drv.cuMemcpyHtoD((CUdeviceptr)dst, src, bytes);
  gpu_leave(&scope);
  if (r != CUDA_SUCCESS) return cu_fail(r, "cuMemcpyHtoD", "%zu bytes from %p to %p", bytes, src, dst);
  return ncclSuccess;
}

/* ---- ncclMemAlloc ---- */

ncclResult_t gpu_cuda_mem_alloc(size_t bytes, void **ptr_p) {
  int dev;
  CHECK(gpu_current_device(&dev));
  gpu_mem_t *m;
  CHECK(dev_alloc(dev, bytes, 0, &m));
  pthread_mutex_lock(&registry_lock);
  m->next = registry;
  registry = m;
  pthread_mutex_unlock(&registry_lock);
  *ptr_p = (void *)m->ptr;
  return ncclSuccess;
}

ncclResult_t gpu_cuda_mem_free(void *ptr) {
  gpu_mem_t *m = NULL;
  pthread_mutex_lock(&registry_lock);
  for (gpu_mem_t **p = &registry; *p != NULL; p = &(*p)->next) {
    if ((void *)(*p)->ptr != ptr) continue;
    m = *p;
    *p = m->next;
    break;
  }
  pthread_mutex_unlock(&registry_lock);
  if (m == NULL)
    return log_err(ncclInvalidArgument,
                   "ncclMemFree: %p was not allocated by ncclMemAlloc (or was freed already)", ptr);
  gpu_mem_release(m);
  return ncclSuccess;
}

/* The ncclMemAlloc allocation holding ptr, or NULL. */
static gpu_mem_t *registered(const void *ptr) {
  gpu_mem_t *found = NULL;
  pthread_mutex_lock(&registry_lock);
  for (gpu_mem_t *m = registry; m != NULL && found == NULL; m = m->next)
    if ((CUdeviceptr)ptr >= m->ptr && (CUdeviceptr)ptr < m->ptr + m->size) found = m;
  pthread_mutex_unlock(&registry_lock);
  return found;
}

ncclResult_t gpu_ptr_export(int dev, const void *ptr, gpu_ptr_export_t *x, int *ok_p) {
  CHECK(gpu_cuda_check_dev(dev, "gpu_ptr_export"));
  *ok_p = 0;
  if (x != NULL) memset(x, 0, sizeof *x);
  gpu_mem_t *m = registered(ptr);
  if (m != NULL && m->kind == MEM_VMM) { /* ncclMemAlloc's cuMem memory: its descriptor, as for our own */
    if (m->dev != dev) return ncclSuccess;
    if (x == NULL) {
      *ok_p = 1;
      return ncclSuccess;
    }
    CHECK(gpu_mem_export(m, &x->blob));
    export_blob_t b;
    memcpy(&b, x->blob.bytes, sizeof b);
    /* the descriptor's random token: a new allocation gets a new one */
    x->buffer_id = b.token & ~(1ull << 63);
    x->offset = (uint64_t)((CUdeviceptr)ptr - m->ptr);
    *ok_p = x->buffer_id != 0;
    return ncclSuccess;
  }
  CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID};
  unsigned type = 0;
  int ordinal = -1, legacy = 0;
  unsigned long long id = 0;
  void *data[4] = {&type, &ordinal, &legacy, &id};
  gpu_scope_t scope;
  CHECK(gpu_enter(dev, &scope));
  ncclResult_t res = ncclSuccess;
  /* a pointer the driver does not know (host memory) is no error here: it is simply not exportable */
  if (drv.cuPointerGetAttributes(4, attrs, data, (CUdeviceptr)ptr) != CUDA_SUCCESS) goto leave;
  if (type != CU_MEMORYTYPE_DEVICE || ordinal != (int)devs[dev].dev || !legacy || id == 0) goto leave;
  if (x == NULL) {
    *ok_p = 1;
    goto leave;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  CU_GOTO(cuMemGetAddressRange, (&base, &size, (CUdeviceptr)ptr), res, leave, "the allocation holding %p",
          ptr);
  CHECK_GOTO(legacy_blob(dev, base, size, &x->blob), res, leave);
  /* the driver's buffer ids are unique in the process; keep them apart from the tokens above */
  x->buffer_id = (uint64_t)id | 1ull << 63;
  x->offset = (uint64_t)((CUdeviceptr)ptr - base);
  *ok_p = 1;
leave:
  gpu_leave(&scope);
  return res;
}
