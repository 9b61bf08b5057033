/* What the standalone probes in this folder share: a check that stops at the first failing CUDA call. */
#ifndef BRAID_TOOLS_PROBES_PROBE_H
#define BRAID_TOOLS_PROBES_PROBE_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                                \
  do {                                                                                                       \
    cudaError_t e_ = (x);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                 \
      printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                             \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)

#endif
