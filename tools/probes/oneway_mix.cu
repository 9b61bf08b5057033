/*
 * Probe: whether two mechanisms moving bytes the same way over NVLink at once beat either alone. 1 GiB
 * goes from GPU 1 to GPU 0 (as a reduce's root, GPU 0, takes the other rank's input), a fraction f of it by
 * one mechanism and the rest by another, both started together on streams of their own:
 *   push     GPU 1's kernel: local 16-byte loads, remote stores;
 *   pull     GPU 0's kernel: remote loads, local stores;
 *   pull+    GPU 0's kernel: remote loads added to the local destination's own words (an in-place reduce);
 *   ce1      GPU 1's copy engine (cudaMemcpyAsync on GPU 1's stream);
 *   ce0      GPU 0's copy engine (the same on GPU 0's stream).
 * If the kernels' ceiling (about 370 GB/s one way) is what the SMs issue, a second issuer adds to it; if it
 * is what the link carries of SM traffic, it does not. Not part of the build; one process drives both
 * GPUs:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o oneway_mix tools/probes/oneway_mix.cu && ./oneway_mix
 *
 * Times are host clock around the launches and synchronize, medians of 8 runs after 2; each run checks
 * the first and last word of both parts.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "probe.h"

enum mech { PUSH, PULL, PULL_ADD, CE1, CE0, NONE };
static const char *mech_names[] = {"push", "pull", "pull+", "ce1", "ce0", "-"};

/* Every thread copies (or adds) 16-byte words of floats, four in flight. */
template <bool ADD> __global__ void sm_move(float4 *dst, const float4 *src, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  auto put = [&](size_t k, float4 v) {
    if (ADD) {
      const float4 o = dst[k];
      v = make_float4(v.x + o.x, v.y + o.y, v.z + o.z, v.w + o.w);
    }
    dst[k] = v;
  };
  for (; i + 3 * stride < n; i += 4 * stride) {
    const float4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    put(i, a);
    put(i + stride, b);
    put(i + 2 * stride, c);
    put(i + 3 * stride, d);
  }
  for (; i < n; i += stride) put(i, src[i]);
}

__global__ void fill(float *p, size_t n, float v) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = v;
}

static cudaStream_t streams[2];

/* Starts moving bytes [off, off + len) of src (GPU 1) to dst (GPU 0) by m. */
static void start(mech m, float *dst, const float *src, size_t off, size_t len, int grid) {
  if (len == 0 || m == NONE) return;
  const size_t n = len / 16;
  float4 *d = (float4 *)((char *)dst + off);
  const float4 *s = (const float4 *)((const char *)src + off);
  switch (m) {
  case PUSH:
    CK(cudaSetDevice(1));
    sm_move<false><<<grid, 512, 0, streams[1]>>>(d, s, n);
    break;
  case PULL:
  case PULL_ADD:
    CK(cudaSetDevice(0));
    if (m == PULL)
      sm_move<false><<<grid, 512, 0, streams[0]>>>(d, s, n);
    else
      sm_move<true><<<grid, 512, 0, streams[0]>>>(d, s, n);
    break;
  case CE1:
  case CE0:
    CK(cudaSetDevice(m == CE1 ? 1 : 0));
    CK(cudaMemcpyAsync(d, s, len, cudaMemcpyDefault, streams[m == CE1 ? 1 : 0]));
    break;
  default:
    break;
  }
  CK(cudaGetLastError());
}

int main() {
  const size_t bytes = 1ull << 30, count = bytes / sizeof(float);
  float *src, *dst;
  CK(cudaSetDevice(1));
  CK(cudaDeviceEnablePeerAccess(0, 0));
  CK(cudaMalloc(&src, bytes));
  CK(cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking));
  fill<<<264, 512>>>(src, count, 3.0f);
  CK(cudaDeviceSynchronize());
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaMalloc(&dst, bytes));
  CK(cudaStreamCreateWithFlags(&streams[0], cudaStreamNonBlocking));

  struct variant {
    mech a, b;
    int grid;
  };
  /* grid: the blocks of each kernel in the variant (512 threads each) */
  const variant variants[] = {
      {PUSH, NONE, 132}, {PULL, NONE, 132}, {PULL_ADD, NONE, 132}, {PULL, NONE, 264},   {CE1, NONE, 0},
      {CE0, NONE, 0},    {PUSH, PULL, 132}, {PUSH, PULL_ADD, 132}, {CE1, PULL, 132},    {CE1, PULL_ADD, 132},
      {CE0, PULL, 132},  {CE1, PUSH, 132},  {PUSH, PULL_ADD, 66},  {CE1, PULL_ADD, 66},
  };
  const double fractions[] = {0.125, 0.25, 0.5, 0.75};
  for (const variant &v : variants)
    for (double f : fractions) {
      if (v.b == NONE && f != fractions[0]) continue;
      const double fa = v.b == NONE ? 1.0 : f;
      const size_t cut = (size_t)(bytes * fa) / 4096 * 4096;
      std::vector<float> ts;
      int wrong = 0;
      for (int it = 0; it < 10; it++) {
        CK(cudaSetDevice(0));
        fill<<<264, 512, 0, streams[0]>>>(dst, count, 1.0f);
        for (int g = 0; g < 2; g++) {
          CK(cudaSetDevice(g));
          CK(cudaDeviceSynchronize());
        }
        auto t0 = std::chrono::steady_clock::now();
        start(v.a, dst, src, 0, cut, v.grid);
        start(v.b, dst, src, cut, bytes - cut, v.grid);
        for (int g = 0; g < 2; g++) {
          CK(cudaSetDevice(g));
          CK(cudaDeviceSynchronize());
        }
        const float us =
            std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (it >= 2) ts.push_back(us);
        /* the first and last word of each part: 3 copied, 4 added */
        const size_t at[] = {0, cut / 4 - 1, cut / 4, count - 1};
        for (int k = 0; k < 4; k++) {
          if (at[k] >= count || (k == 1 && cut == 0) || (k == 2 && cut == bytes)) continue;
          const mech m = at[k] < cut / 4 ? v.a : v.b;
          float h;
          CK(cudaMemcpy(&h, dst + at[k], sizeof h, cudaMemcpyDefault));
          if (h != (m == PULL_ADD ? 4.0f : 3.0f)) wrong++;
        }
      }
      std::sort(ts.begin(), ts.end());
      const float med = ts[ts.size() / 2];
      printf("%-6s %5.1f%% + %-6s grid %3d: %8.1f us %6.1f GB/s%s\n", mech_names[v.a], 100 * fa,
             mech_names[v.b], v.grid, med, bytes / med / 1e3, wrong ? " WRONG" : "");
      fflush(stdout);
    }
  return 0;
}
