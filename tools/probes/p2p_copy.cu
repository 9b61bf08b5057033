/*
 * Probe: how fast a kernel moves 1 GiB from one GPU to another over NVLink, four ways: 16-byte loads and
 * stores by every thread, run on the sender (push: local reads, remote writes) or on the receiver (pull:
 * remote reads, local writes); and bulk copies (cp.async.bulk, sm_90) through shared memory, one thread per
 * block driving a ring of stages (bulk load into shared memory, completing on an mbarrier, then bulk store
 * out), pushed or pulled. One way and both ways at once, for several grid sizes, chunk sizes and stages.
 * Not part of the build; one process drives both GPUs:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o p2p_copy tools/probes/p2p_copy.cu && ./p2p_copy
 *
 * Times are host clock around the launches and synchronize, medians of 6 runs after 2.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "probe.h"

/* Every thread copies 16-byte words, four in flight. */
__global__ void sm_copy(uint4 *dst, const uint4 *src, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__device__ __forceinline__ uint32_t smem(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* One thread per block: block b copies chunks [b n / grid, (b + 1) n / grid) of C bytes through S stages.
 * The load of chunk i + S - 1 reuses the stage of chunk i - 1 once that chunk's store has read it. */
template <int S> __global__ void bulk_copy(char *dst, const char *src, size_t bytes, int C) {
  extern __shared__ __align__(128) char stage[];
  __shared__ __align__(8) uint64_t bar[S];
  if (threadIdx.x != 0) return;
  const size_t chunks = bytes / C;
  const size_t first = chunks * blockIdx.x / gridDim.x, n = chunks * (blockIdx.x + 1) / gridDim.x - first;
  for (int s = 0; s < S; s++) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem(&bar[s])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  auto load = [&](size_t i) {
    const int s = (int)(i % S);
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem(&bar[s])), "r"(C) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem(stage + (size_t)s * C)),
        "l"(src + (first + i) * C), "r"(C), "r"(smem(&bar[s]))
        : "memory");
  };
  for (size_t i = 0; i < n && i < S; i++) load(i);
  for (size_t i = 0; i < n; i++) {
    const int s = (int)(i % S);
    const uint32_t phase = (uint32_t)(i / S) & 1;
    asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" ::"r"(
                     smem(&bar[s])),
                 "r"(phase)
                 : "memory");
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + (first + i) * C),
                 "r"(smem(stage + (size_t)s * C)), "r"(C)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (i >= 1 && i - 1 + S < n) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      load(i - 1 + S);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

int main() {
  const size_t bytes = 1ull << 30;
  const int max_smem = 200 * 1024;
  char *buf[2][2]; /* [gpu][0: source, 1: destination] */
  for (int g = 0; g < 2; g++) {
    CK(cudaSetDevice(g));
    CK(cudaDeviceEnablePeerAccess(1 - g, 0));
    for (int k = 0; k < 2; k++) CK(cudaMalloc(&buf[g][k], bytes));
    CK(cudaMemset(buf[g][0], g + 1, bytes));
    CK(cudaFuncSetAttribute(bulk_copy<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    CK(cudaFuncSetAttribute(bulk_copy<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
  }
  const char *names[] = {"sm push", "sm pull", "bulk push", "bulk pull"};
  const int grids[] = {16, 32, 66, 132, 264};
  const int chunk_sizes[] = {8192, 16384, 32768};
  for (int dirs = 1; dirs <= 2; dirs++)
    for (int mode = 0; mode < 4; mode++)
      for (int grid : grids)
        for (int ci = 0; ci < (mode >= 2 ? 3 : 1); ci++)
          for (int S : {4, 8}) {
            const int C = chunk_sizes[ci];
            if ((mode < 2 && S == 8) || S * C > max_smem) continue;
            std::vector<float> ts;
            for (int it = 0; it < 8; it++) {
              for (int g = 0; g < 2; g++) {
                CK(cudaSetDevice(g));
                CK(cudaDeviceSynchronize());
              }
              auto t0 = std::chrono::steady_clock::now();
              for (int from = 0; from < dirs; from++) {
                const int to = 1 - from;
                CK(cudaSetDevice((mode & 1) ? to : from)); /* pull runs on the receiver */
                char *dst = buf[to][1];
                const char *src = buf[from][0];
                if (mode < 2)
                  sm_copy<<<grid, 512>>>((uint4 *)dst, (const uint4 *)src, bytes / 16);
                else if (S == 4)
                  bulk_copy<4><<<grid, 32, S * C>>>(dst, src, bytes, C);
                else
                  bulk_copy<8><<<grid, 32, S * C>>>(dst, src, bytes, C);
                CK(cudaGetLastError());
              }
              for (int g = 0; g < 2; g++) {
                CK(cudaSetDevice(g));
                CK(cudaDeviceSynchronize());
              }
              float us =
                  std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - t0).count();
              if (it >= 2) ts.push_back(us);
            }
            std::sort(ts.begin(), ts.end());
            const float med = ts[ts.size() / 2];
            char h[16];
            CK(cudaMemcpy(h, buf[1][1] + bytes - 16, 16, cudaMemcpyDefault));
            const bool ok = h[0] == 1;
            for (int g = 0; g < 2; g++) {
              CK(cudaSetDevice(g));
              CK(cudaMemset(buf[g][1], 0, bytes));
            }
            printf("%d-way %-9s grid %3d chunk %5d stages %d: %8.1f us %6.1f GB/s%s\n", dirs, names[mode],
                   grid, mode >= 2 ? C : 0, mode >= 2 ? S : 0, med, bytes / med / 1e3, ok ? "" : " WRONG");
          }
  return 0;
}
