/*
 * The CUDA driver as `braid bench` uses it: device memory, streams, timing events and graphs, for measuring
 * collectives on GPUs.
 *
 * libcuda.so.1 is loaded at run time (dlopen) and every entry point is resolved through cuGetProcAddress, so
 * the tool runs without CUDA on machines that have none and links nothing of CUDA's. The build includes
 * <cuda.h> when it finds CUDA's headers (the pointers then keep the driver's exact types); built without
 * them, drv_open finds no device and says why. Every call that needs a context runs in the current device's
 * PRIMARY context (drv_use_device): the one the measured library and the CUDA runtime use. One thread per
 * process calls these functions.
 *
 * Device memory is handed around as plain pointers (a CUdeviceptr's value), streams as cudaStream_t (the
 * type the NCCL API takes; the same handle as the driver's CUstream). Every failure is reported once on
 * stderr, naming the call, its CUresult and the values involved, and returned as ncclUnhandledCudaError.
 */
#ifndef BRAID_TOOLS_CUDA_DRV_H
#define BRAID_TOOLS_CUDA_DRV_H

#include <stddef.h>

#include "nccl.h"

/* A timing event (CUevent). */
typedef struct drv_event *drv_event_t;
/* An instantiated graph (CUgraphExec). */
typedef struct drv_graph *drv_graph_t;
/* A loaded module (CUmodule) and one of its kernels (CUfunction). */
typedef struct drv_module *drv_module_t;
typedef struct drv_function *drv_function_t;

/* Bytes of an IPC handle of device memory (CUipcMemHandle). */
#define DRV_IPC_HANDLE_BYTES 64

/* Loads the driver once, initialises it and counts its devices into *ndev_p. No driver, no device or a
 * build without CUDA headers is not an error: *ndev_p is then 0 and `why` says which. */
ncclResult_t drv_open(int *ndev_p, char *why, size_t len);
/* The device's name as the driver gives it ("NVIDIA H100 80GB HBM3"). */
ncclResult_t drv_device_name(int dev, char *buf, size_t len);
/* Makes device `dev`'s primary context (retained at the first call, kept for the process's life) the calling
 * thread's current context. */
ncclResult_t drv_use_device(int dev);

/* Device memory in the current context. */
ncclResult_t drv_mem_alloc(void **ptr_p, size_t bytes);
/* Device `dev`'s memory as its primary context sees it (made current first): free and total bytes. The
 * driver answers for the whole device, so what other contexts and processes hold counts as used. */
ncclResult_t drv_mem_info(int dev, size_t *free_p, size_t *total_p);
ncclResult_t drv_mem_free(void *ptr);
/* Copies and fills, ordered on `stream` (pageable host memory is staged by the driver); the host may reuse
 * or read its buffer after drv_stream_sync. */
ncclResult_t drv_upload(void *dst, const void *src, size_t bytes, cudaStream_t stream);
ncclResult_t drv_download(void *dst, const void *src, size_t bytes, cudaStream_t stream);
ncclResult_t drv_memset(void *dst, unsigned char value, size_t bytes, cudaStream_t stream);

/* A non-blocking stream of the current context (no implicit ordering with the legacy default stream). */
ncclResult_t drv_stream_create(cudaStream_t *stream_p);
ncclResult_t drv_stream_destroy(cudaStream_t stream);
ncclResult_t drv_stream_sync(cudaStream_t stream);

/* Timing events of the current context. */
ncclResult_t drv_event_create(drv_event_t *event_p);
ncclResult_t drv_event_destroy(drv_event_t event);
ncclResult_t drv_event_record(drv_event_t event, cudaStream_t stream);
/* Milliseconds between two recorded events; waits for `stop` to complete first. */
ncclResult_t drv_event_elapsed_ms(drv_event_t start, drv_event_t stop, float *ms_p);

/* Starts capturing `stream` into a graph (global capture mode). */
ncclResult_t drv_capture_begin(cudaStream_t stream);
/* Ends the capture of `stream`: *captured_p holds what it captured, for drv_graph_instantiate. */
ncclResult_t drv_capture_end(cudaStream_t stream, void **captured_p);
/* Instantiates a captured graph into *graph_p, and frees the captured one. Not while another stream of the
 * process is capturing in global mode: the driver refuses the call then and invalidates that capture
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), so one process capturing several ranks ends every capture first.
 */
ncclResult_t drv_graph_instantiate(void *captured, drv_graph_t *graph_p);
ncclResult_t drv_graph_launch(drv_graph_t graph, cudaStream_t stream);
ncclResult_t drv_graph_destroy(drv_graph_t graph);

/* Kernels: loads a fatbin image into the current context; finds a kernel by name; launches it on `stream`
 * with `grid` blocks of `block` threads and one by-value parameter, the struct at `param` (copied at the
 * launch). */
ncclResult_t drv_module_load(const void *image, drv_module_t *module_p);
ncclResult_t drv_module_unload(drv_module_t module);
ncclResult_t drv_module_function(drv_module_t module, const char *name, drv_function_t *function_p);
ncclResult_t drv_launch(drv_function_t function, unsigned grid, unsigned block, void *param,
                        cudaStream_t stream, int overlap);
/* Whether a launch on device `dev` (eager, or with `captured` into a graph) can overlap the stream's previous
 * kernel, as Braid's own launches do where they can (BRAID_LAUNCH_PDL): compute capability 9.0 or newer,
 * and for a graph a CUDA 12.3 driver. drv_launch with `overlap` then launches that way; the kernel must wait
 * for the previous kernel's stores (griddepcontrol.wait) before it touches memory. */
ncclResult_t drv_can_overlap(int dev, int captured, int *yes_p);

/* Device memory between processes: the handle (DRV_IPC_HANDLE_BYTES) of an allocation of the current
 * context; that allocation mapped into the current context of another process (access from its device
 * enabled as the mapping is made); the mapping undone. */
ncclResult_t drv_ipc_handle(void *ptr, void *handle);
ncclResult_t drv_ipc_open(const void *handle, void **ptr_p);
ncclResult_t drv_ipc_close(void *ptr);
/* Lets the current context (device `dev`'s primary context) reach device `peer`'s memory. Access already
 * enabled is not an error. */
ncclResult_t drv_peer_access(int dev, int peer);

#endif
