/*
 * The narrow device interface: which executor this process uses, and everything the layers above need from a
 * GPU: devices, memory (device, host-pinned, exportable to other processes), events, streams, kernels.
 *
 * Two implementations stand behind it: the host backend (collectives on host memory, moved by CPU threads)
 * and CUDA (gpu_cuda.c). CUDA's driver is loaded with dlopen at run time, so the library loads and runs the
 * host backend on a machine without a GPU driver. BRAID_DEVICE=host forces the host backend.
 *
 * Every call that touches a device runs in that device's primary context (the one the CUDA runtime uses);
 * callers make it current with gpu_enter and restore the caller's with gpu_leave. Streams are the caller's
 * cudaStream_t (the same object as a driver CUstream).
 */
#ifndef BRAID_GPU_GPU_H
#define BRAID_GPU_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

typedef enum { GPU_BACKEND_HOST = 0, GPU_BACKEND_CUDA = 1 } gpu_backend_t;

/* The process's backend, decided once (BRAID_DEVICE, then whether a CUDA driver, a device and this build's
 * kernels are present; the choice is logged at INFO). Fails with a clear message when BRAID_DEVICE=cuda is
 * asked for and cannot be had. */
ncclResult_t gpu_backend(gpu_backend_t *backend_p);

/* ---- Devices and contexts ---- */

/* The calling thread's current device, as cudaGetDevice reports it (0 when no context is current). */
ncclResult_t gpu_current_device(int *dev_p);
ncclResult_t gpu_device_count(int *count_p);
/* Multiprocessors of `dev`. */
ncclResult_t gpu_device_sms(int dev, int *sms_p);
/* Whether launches on `dev` can overlap the stream's previous kernel (gpu_launch's `overlap`): eager ones
 * (*eager_p), and ones into a graph being captured (*captured_p), as this device and driver allow. */
ncclResult_t gpu_overlap_support(int dev, int *eager_p, int *captured_p);
/* The device's PCI bus id in lower case, as sysfs names it ("0000:1b:00.0"), NUL-terminated in 16 bytes. */
ncclResult_t gpu_device_busid(int dev, char busid[16]);
/* Whether `dev` can map memory of `peer_dev` (always 1 for dev == peer_dev). */
ncclResult_t gpu_can_access_peer(int dev, int peer_dev, int *yes_p);
/* Lets `dev` access memory of `peer_dev` (cuCtxEnablePeerAccess; already enabled is fine). */
ncclResult_t gpu_enable_peer_access(int dev, int peer_dev);

/* What gpu_enter replaced, for gpu_leave. */
typedef struct {
  void *saved; /* the caller's current context (CUcontext) */
  int switched;
} gpu_scope_t;
/* Makes `dev`'s primary context current on the calling thread (retaining it the first time). */
ncclResult_t gpu_enter(int dev, gpu_scope_t *scope);
/* Restores the context that gpu_enter replaced. */
void gpu_leave(gpu_scope_t *scope);

/* ---- Memory ---- */

/* A device allocation (opaque). */
typedef struct gpu_mem gpu_mem_t;
/* Zeroed device memory on `dev` that other processes can import: a cuMem allocation exportable as a POSIX
 * file descriptor where the driver supports it, else cuMemAlloc (exported through legacy CUDA IPC). */
ncclResult_t gpu_dev_alloc(int dev, size_t bytes, gpu_mem_t **mem_p);
/* The allocation's device address. */
void *gpu_mem_ptr(const gpu_mem_t *mem);
/* Bytes actually reserved (rounded up to the allocation granularity). */
size_t gpu_mem_size(const gpu_mem_t *mem);
/* Unmaps and frees an allocation, or unmaps an imported one. */
void gpu_mem_release(gpu_mem_t *mem);

/* What another process needs to map an allocation. Fixed size: it travels in transport blobs. */
#define GPU_EXPORT_BYTES 112
typedef struct {
  unsigned char bytes[GPU_EXPORT_BYTES];
} gpu_export_t;
/* Describes `mem` for gpu_mem_import in another process (its file descriptor is served by this process
 * until the allocation is released). */
ncclResult_t gpu_mem_export(const gpu_mem_t *mem, gpu_export_t *blob_p);
/* Maps, on `dev`, an allocation another process exported. A cuMem allocation's file descriptor is fetched
 * from its owner (base/fdpass), waiting at most BRAID_BOOTSTRAP_TIMEOUT_S. Importing in the exporting process
 * is a usage error: it has the pointer already. */
ncclResult_t gpu_mem_import(int dev, const gpu_export_t *blob, gpu_mem_t **mem_p);

/* Zeroed page-locked host memory mapped into every device's address space; *dev_p is its device address. */
ncclResult_t gpu_host_alloc(size_t bytes, void **host_p, void **dev_p);
void gpu_host_free(void *host);
/* Page-locks existing host memory (e.g. POSIX shared memory) and maps it for devices. */
ncclResult_t gpu_host_register(void *host, size_t bytes, void **dev_p);
void gpu_host_unregister(void *host);
/* Synchronous copy from host memory to device memory (init time only). */
ncclResult_t gpu_copy_to_device(void *dst, const void *src, size_t bytes);

/* Memory for ncclMemAlloc: on CUDA, device memory on the current device, mapped for every device that can
 * access it, exportable; on the host backend, page-aligned host memory. */
ncclResult_t gpu_mem_alloc(size_t bytes, void **ptr_p);
ncclResult_t gpu_mem_free(void *ptr);

/* ---- Streams, events, kernels ---- */

typedef struct gpu_event gpu_event_t; /* a CUevent, without timing */
/* Creates an event in the current context (the caller has entered the device). */
ncclResult_t gpu_event_create(gpu_event_t **event_p);
void gpu_event_destroy(gpu_event_t *event);
ncclResult_t gpu_event_record(gpu_event_t *event, cudaStream_t stream);
/* *done_p = 1 when the work before the event's last record has finished (or it was never recorded). */
ncclResult_t gpu_event_query(gpu_event_t *event, int *done_p);
/* Makes `stream` wait for the event's last record. */
ncclResult_t gpu_stream_wait(cudaStream_t stream, gpu_event_t *event);
/* Whether `stream` is being captured into a CUDA graph and, when it is, the graph being built (an opaque
 * CUgraph) and the capture's id (unique in the process). A capture invalidated by an earlier error is refused
 * (ncclInvalidUsage): nothing enqueued now would ever run. */
ncclResult_t gpu_stream_capture(cudaStream_t stream, int *yes_p, void **graph_p, uint64_t *id_p);
/* Ties `release(arg)` to the graph's life: it is called once the graph, every executable graph made from it
 * and every launch of those are gone. It runs on a driver thread and must not call CUDA. */
ncclResult_t gpu_graph_hold(void *graph, void (*release)(void *), void *arg);
/* Lets the calling thread make calls a capture in progress would forbid (allocations) until
 * gpu_capture_restore puts the saved mode back. */
ncclResult_t gpu_capture_relax(int *saved_p);
void gpu_capture_restore(int saved);
/* Copies host memory (page-locked) to device memory in stream order. The caller has entered the device. */
ncclResult_t gpu_copy_async(void *dst, const void *src, size_t bytes, cudaStream_t stream);
/* Waits for everything enqueued on the stream (teardown only; collectives never call it). */
ncclResult_t gpu_stream_sync(cudaStream_t stream);

/* ---- Copy engines into another process's buffer (core/ce.h) ----
 * A stream memory operation on a 32-bit word of device memory (this device's or a peer's mapped one): a write
 * that follows everything before it on the stream (with a memory barrier). The caller has entered the
 * device. */
ncclResult_t gpu_stream_write32(cudaStream_t stream, void *word, uint32_t value);
/* Makes the stream wait until the 32-bit word (device memory, or host memory from gpu_host_alloc or
 * gpu_host_register) is at least `value` (compared as the driver does: the difference as a signed number): a
 * stream memory operation, which holds no multiprocessor while it waits, and never gives up by itself: the
 * caller must be able to release it by writing the word. The caller has entered the device. */
ncclResult_t gpu_stream_wait32(cudaStream_t stream, void *word, uint32_t value);
/* Copies device memory to device memory (of this device or mapped from a peer) in stream order. */
ncclResult_t gpu_copy_dd_async(void *dst, const void *src, size_t bytes, cudaStream_t stream);
/* A stream of the library's own that does not synchronise with the legacy default stream. */
ncclResult_t gpu_stream_create(cudaStream_t *stream_p);
void gpu_stream_destroy(cudaStream_t stream);
/* Waits until the work before the event's last record has finished. */
ncclResult_t gpu_event_sync(gpu_event_t *event);

/* What another process needs to map the allocation holding a user's buffer. */
typedef struct {
  gpu_export_t blob;  /* the allocation, for gpu_mem_import */
  uint64_t buffer_id; /* an id of the allocation, unique in the owner's process (0 never) */
  uint64_t offset;    /* of the buffer from the allocation's base */
} gpu_ptr_export_t;
/* Describes the allocation holding device address `ptr` on `dev` for gpu_mem_import in another process:
 * memory from ncclMemAlloc (exported as gpu_mem_export does), or from cuMemAlloc/cudaMalloc (legacy CUDA
 * IPC). *ok_p = 0 (and ncclSuccess) for anything else: other cuMem allocations, memory pools, host memory,
 * memory of another device. With x NULL, only says whether it is such memory: memory that another device of
 * this process can then write too (ncclMemAlloc maps it for every device that can access it; cudaMalloc
 * memory, once peer access is enabled). */
ncclResult_t gpu_ptr_export(int dev, const void *ptr, gpu_ptr_export_t *x, int *ok_p);

typedef struct gpu_func gpu_func_t; /* a kernel of a loaded module */
/* Loads kernel `name` in `dev`'s primary context from the first of `nfatbins` fatbins that has it (each
 * module once per device, each kernel once; later calls return the same). A fatbin without code for the
 * device is passed over; where none has code, the error names the device's architecture and the build's. */
ncclResult_t gpu_func_load(int dev, const void *const *fatbins, int nfatbins, const char *name,
                           gpu_func_t **func_p);
/* Launches with one by-value parameter of `param_bytes` bytes. The caller has entered the device. With
 * `overlap` (compute capability 9.0 and newer), the launch may overlap the stream's previous kernel
 * (programmatic dependent launch): its blocks may start as that kernel's blocks end, before its stores are
 * visible, so the kernel must wait for them before it touches memory (device/wait.cuh,
 * after_previous_kernel). */
ncclResult_t gpu_launch(gpu_func_t *func, unsigned grid, unsigned block, void *param, size_t param_bytes,
                        cudaStream_t stream, int overlap);

/* The CUDA implementation's own entry points, which gpu.c calls (gpu_cuda.c; gpu_none.c without CUDA's
 * headers). Loads the CUDA driver once (thread-safe) and writes how many devices it offers: 0 when there is
 * no usable driver or device, which is not an error; then *what_p says why in words ("no CUDA driver found
 * (...)"), otherwise it describes the driver ("CUDA driver 12.8, 8 devices"). */
ncclResult_t gpu_cuda_probe(int *ndev_p, const char **what_p);
/* ncclMemAlloc / ncclMemFree on the CUDA backend (see gpu_mem_alloc). Freeing a pointer this did not allocate
 * is ncclInvalidArgument. */
ncclResult_t gpu_cuda_mem_alloc(size_t bytes, void **ptr_p);
ncclResult_t gpu_cuda_mem_free(void *ptr);

#endif
