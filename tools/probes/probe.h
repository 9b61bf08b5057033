/* What the standalone probes in this folder share: checks that stop at the first failing runtime (CK) or
 * driver (DK) call, naming the probe's rank where it has several (probe_rank, -1 where it has one). */
#ifndef BRAID_TOOLS_PROBES_PROBE_H
#define BRAID_TOOLS_PROBES_PROBE_H

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

static int probe_rank = -1;

#define CK(x)                                                                                                \
  do {                                                                                                       \
    cudaError_t e_ = (x);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                 \
      printf("rank %d: %s:%d: %s: %s\n", probe_rank, __FILE__, __LINE__, #x, cudaGetErrorString(e_));        \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)

#define DK(x)                                                                                                \
  do {                                                                                                       \
    CUresult e_ = (x);                                                                                       \
    if (e_ != CUDA_SUCCESS) {                                                                                \
      const char *s_ = "?";                                                                                  \
      cuGetErrorString(e_, &s_);                                                                             \
      printf("rank %d: %s:%d: %s: %s\n", probe_rank, __FILE__, __LINE__, #x, s_);                            \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)

#endif
