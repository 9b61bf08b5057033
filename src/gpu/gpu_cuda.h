/*
 * What gpu.c (backend choice, ncclMemAlloc) needs from the CUDA implementation. Two files provide it:
 * gpu_cuda.c, built when CUDA's headers are found, and gpu_none.c otherwise, which finds no device and
 * refuses every device call. Private to src/gpu.
 */
#ifndef BRAID_GPU_GPU_CUDA_H
#define BRAID_GPU_GPU_CUDA_H

#include <stddef.h>

#include "nccl.h"

/* (gpu_cuda_probe, gpu_cuda_mem_alloc and gpu_cuda_mem_free, which gpu.c calls, are declared in gpu.h.) */

/* Every driver entry point gpu_cuda.c resolves, by base name; the tests' stand-in driver provides the same
 * list, so the two cannot drift apart. */
// clang-format off
#define GPU_CUDA_FUNCS(X) \
  X(cuGetErrorName) X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) \
  X(cuDeviceGetAttribute) X(cuDeviceGetPCIBusId) X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain) \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxEnablePeerAccess) \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) \
  X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemExportToShareableHandle) \
  X(cuMemImportFromShareableHandle) X(cuMemAlloc) X(cuMemFree) X(cuMemsetD8) X(cuIpcGetMemHandle) \
  X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle) X(cuMemHostAlloc) X(cuMemFreeHost) \
  X(cuMemHostGetDevicePointer) X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemcpyHtoD) \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) X(cuStreamWaitEvent) \
  X(cuStreamSynchronize) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel) \
  X(cuLaunchKernelEx) \
  X(cuMemcpyHtoDAsync) X(cuUserObjectCreate) X(cuGraphRetainUserObject) X(cuThreadExchangeStreamCaptureMode) \
  X(cuStreamWriteValue32) X(cuStreamWaitValue32) X(cuMemcpyDtoDAsync) X(cuStreamCreate) X(cuStreamDestroy) \
  X(cuEventSynchronize) X(cuMemGetAddressRange) X(cuPointerGetAttributes)
// clang-format on

/* Entry points whose CUDA 12.0 variant is older than the one cuda.h declares under the base name: each with
 * the 12.0 signature spelled out (X(name, type)). */
#ifdef CUDA_VERSION
typedef CUresult (*gpu_cu_capture_info_t)(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id,
                                          CUgraph *graph, const CUgraphNode **deps, size_t *ndeps);
#endif
#define GPU_CUDA_FUNCS_TYPED(X) X(cuStreamGetCaptureInfo, gpu_cu_capture_info_t)

#endif
