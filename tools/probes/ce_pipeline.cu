/*
 * Probe: how fast the copy engines move data from one GPU to another, straight into the destination buffer
 * ("direct": one cudaMemcpyAsync) and through a staging ring in the receiver's memory driven by stream memory
 * operations ("staged": per chunk, the sender waits for a free slot, copies into it and raises the slot's
 * ready flag; the receiver waits for the flag, copies the slot out and hands the slot back), one way and
 * both ways at once. The flags return to their first state after each transfer, so a captured copy would
 * replay as well. Not part of the build; one process drives both GPUs:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o ce_pipeline tools/probes/ce_pipeline.cu -lcuda && ./ce_pipeline
 *
 * Times are host clock around enqueue and synchronize, medians of 10 runs after 2.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "probe.h"

static const int kMaxSlots = 8;
static const size_t kRingBytes = 256ull << 20;

/* One direction: data from GPU src to GPU dst. ready[] lives on the receiver, credit[] on the sender. */
struct Dir {
  int src, dst;
  char *sbuf, *dbuf, *ring;
  unsigned *ready, *credit;
  cudaStream_t ss, rs;
};

static void enqueue(Dir &d, size_t bytes, size_t chunk, int slots, bool direct) {
  if (direct) {
    CK(cudaSetDevice(d.src));
    CK(cudaMemcpyAsync(d.dbuf, d.sbuf, bytes, cudaMemcpyDefault, d.ss));
    return;
  }
  for (size_t i = 0, n = (bytes + chunk - 1) / chunk; i < n; i++) {
    int s = (int)(i % slots);
    size_t off = i * chunk, len = std::min(chunk, bytes - off);
    CK(cudaSetDevice(d.src));
    DK(cuStreamWaitValue32(d.ss, (CUdeviceptr)(d.credit + s), 1, CU_STREAM_WAIT_VALUE_EQ));
    DK(cuStreamWriteValue32(d.ss, (CUdeviceptr)(d.credit + s), 0, 0));
    CK(cudaMemcpyAsync(d.ring + s * chunk, d.sbuf + off, len, cudaMemcpyDefault, d.ss));
    DK(cuStreamWriteValue32(d.ss, (CUdeviceptr)(d.ready + s), 1, 0));
    CK(cudaSetDevice(d.dst));
    DK(cuStreamWaitValue32(d.rs, (CUdeviceptr)(d.ready + s), 1, CU_STREAM_WAIT_VALUE_EQ));
    DK(cuStreamWriteValue32(d.rs, (CUdeviceptr)(d.ready + s), 0, 0));
    CK(cudaMemcpyAsync(d.dbuf + off, d.ring + s * chunk, len, cudaMemcpyDefault, d.rs));
    DK(cuStreamWriteValue32(d.rs, (CUdeviceptr)(d.credit + s), 1, 0));
  }
}

int main() {
  const size_t max_bytes = 1ull << 30;
  Dir d[2];
  for (int g = 0; g < 2; g++) {
    CK(cudaSetDevice(g));
    CK(cudaDeviceEnablePeerAccess(1 - g, 0));
  }
  for (int k = 0; k < 2; k++) {
    d[k].src = k;
    d[k].dst = 1 - k;
    CK(cudaSetDevice(d[k].src));
    CK(cudaMalloc(&d[k].sbuf, max_bytes));
    CK(cudaMemset(d[k].sbuf, k + 1, max_bytes));
    CK(cudaMalloc(&d[k].credit, kMaxSlots * sizeof(unsigned)));
    std::vector<unsigned> ones(kMaxSlots, 1);
    CK(cudaMemcpy(d[k].credit, ones.data(), kMaxSlots * sizeof(unsigned), cudaMemcpyDefault));
    CK(cudaStreamCreateWithFlags(&d[k].ss, cudaStreamNonBlocking));
    CK(cudaSetDevice(d[k].dst));
    CK(cudaMalloc(&d[k].dbuf, max_bytes));
    CK(cudaMalloc(&d[k].ring, kRingBytes));
    CK(cudaMalloc(&d[k].ready, kMaxSlots * sizeof(unsigned)));
    CK(cudaMemset(d[k].ready, 0, kMaxSlots * sizeof(unsigned)));
    CK(cudaStreamCreateWithFlags(&d[k].rs, cudaStreamNonBlocking));
  }
  const size_t sizes[] = {4ull << 20, 16ull << 20, 64ull << 20, 256ull << 20, 1ull << 30};
  const size_t chunks[] = {2ull << 20, 4ull << 20, 8ull << 20, 16ull << 20, 32ull << 20};
  for (int both = 0; both < 2; both++)
    for (size_t bytes : sizes)
      for (int ci = -1; ci < 5; ci++) {
        const bool direct = ci < 0;
        const size_t chunk = direct ? bytes : chunks[ci];
        const int slots = (int)std::min<size_t>(kMaxSlots, kRingBytes / chunk);
        if (!direct && chunk > bytes) continue;
        std::vector<float> ts;
        for (int it = 0; it < 12; it++) {
          for (int g = 0; g < 2; g++) {
            CK(cudaSetDevice(g));
            CK(cudaDeviceSynchronize());
          }
          auto t0 = std::chrono::steady_clock::now();
          for (int k = 0; k < 1 + both; k++) enqueue(d[k], bytes, chunk, slots, direct);
          for (int g = 0; g < 2; g++) {
            CK(cudaSetDevice(g));
            CK(cudaDeviceSynchronize());
          }
          float us = std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - t0).count();
          if (it >= 2) ts.push_back(us);
        }
        std::sort(ts.begin(), ts.end());
        const float med = ts[ts.size() / 2];
        bool ok = true;
        std::vector<char> h(1 << 20);
        for (int k = 0; k < 1 + both; k++) {
          CK(cudaMemcpy(h.data(), d[k].dbuf + bytes - h.size(), h.size(), cudaMemcpyDefault));
          ok = ok && h.front() == k + 1 && h.back() == k + 1;
          CK(cudaSetDevice(d[k].dst));
          CK(cudaMemset(d[k].dbuf, 0, bytes));
        }
        printf("%s %5zu MiB %-6s chunk %4zu MiB slots %d: %9.1f us %6.1f GB/s%s\n", both ? "both" : "one ",
               bytes >> 20, direct ? "direct" : "staged", chunk >> 20, direct ? 0 : slots, med,
               bytes / med / 1e3, ok ? "" : " WRONG");
      }
  return 0;
}
