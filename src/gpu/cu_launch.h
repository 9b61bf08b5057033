/*
 * Launches that may overlap the stream's previous kernel (programmatic dependent launch): where they can, and
 * the configuration cuLaunchKernelEx takes for one. Shared by the library's driver layer (gpu_cuda.c) and the
 * bench's (tools/cuda_drv.c), the two host files that see CUDA's headers.
 */
#ifndef BRAID_GPU_CU_LAUNCH_H
#define BRAID_GPU_CU_LAUNCH_H

#include <cuda.h>
#include <string.h>

/* Whether a launch on a device of compute capability `cc_major`, under a driver of `driver_version`
 * (cuDriverGetVersion's), can overlap the previous kernel: from compute capability 9.0; into a graph being
 * captured (`captured`), as a programmatic edge of the graph, only from a CUDA 12.3 driver. */
static inline int cu_overlap_allowed(int cc_major, int driver_version, int captured) {
  return cc_major >= 9 && (!captured || driver_version >= 12030);
}

/* The launch of `grid` blocks of `block` threads on `stream`: its one attribute is written into *attr, which
 * must outlive the launch call. */
static inline CUlaunchConfig cu_overlap_config(unsigned grid, unsigned block, CUstream stream,
                                               CUlaunchAttribute *attr) {
  memset(attr, 0, sizeof *attr);
  attr->id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr->value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDimX = grid;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = block;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

#endif
