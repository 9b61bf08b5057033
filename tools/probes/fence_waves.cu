/*
 * Probe: what a chunk's system fence costs a two-GPU exchange of 2-32 MiB, the sizes where Braid's bulk
 * kernel carries a one-shot all-reduce at 230-275 GB/s each way against the 350-380 its kernels reach at
 * 256 MiB. Both GPUs send their whole operand to the other at once and add what arrives to their own, as
 * the bulk kernel runs a two-rank all-reduce: nb sending and nb receiving blocks of 512 threads, a part per
 * block pair, moved in chunks of `chunk` bytes, chunk q by warp q % 16. A receiving warp waits for its
 * chunk's mark (an acquire load by lane 0), then adds the chunk to its own operand. How a sending warp
 * publishes a chunk is the mode:
 *
 *   fence    a warp barrier, lane 0 fences at system scope and stores the mark (the bulk kernel's way);
 *   release  a warp barrier, lane 0 stores the mark with release order at system scope, no fence;
 *   none     a warp barrier and the mark, no fence: not a correct protocol (the mark may pass its bytes),
 *            the pace of the same stores unpublished;
 *   end      no mark until the warp's last chunk, then one fence and every mark: the pace of the stores
 *            with one fence per warp, receivers starting late;
 *   block    the block's warps store a wave of 16 chunks, a block barrier, one thread fences, then each
 *            warp marks its chunk (one fence per wave instead of one per warp);
 *   wave     the same, but the fencing thread stores the wave's marks and the other warps go on to the
 *            next wave meanwhile (what Braid's bulk kernel does).
 *
 * Timed only (the received sums are not checked): each configuration's kernels are captured 20 in a row
 * into a CUDA graph per GPU, both graphs launched together; microseconds per exchange, the median of 7 runs
 * after a warm-up, and the bytes each way over that time. One process drives both GPUs; not part of the
 * build:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -o fence_waves tools/probes/fence_waves.cu && ./fence_waves
 *
 * -DPROBE_THREADS=N: blocks of N threads instead of 512. PROBE_MODES=a,b,...: those modes alone (names as
 * above); PROBE_CHUNKS: chunk sizes (default 4096,16384); PROBE_NB: sending blocks (default 40,60).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "probe.h"

#ifndef PROBE_THREADS
#define PROBE_THREADS 512
#endif
enum { THREADS = PROBE_THREADS, WARPS = THREADS / 32, ITERS = 20, RUNS = 7, MAX_MARKS = 1 << 16 };
enum { M_FENCE, M_RELEASE, M_NONE, M_END, M_BLOCK, M_WAVE, M_COUNT };
static const char *mode_name[M_COUNT] = {"fence", "release", "none", "end", "block", "wave"};

struct args {
  const uint4 *src;      /* this GPU's operand */
  uint4 *dst;            /* the sum */
  char *peer_ring;       /* where this GPU's chunks land, in the peer's memory */
  uint64_t *peer_marks;  /* their marks, in the peer's memory */
  const char *ring;      /* where the peer's chunks land, here */
  const uint64_t *marks; /* their marks, here */
  const uint64_t *base;  /* the run's first epoch (set by the host before each run) */
  size_t bytes;
  uint32_t nb, chunk, mode, index;
};

__device__ __forceinline__ uint64_t ld_acquire(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint4 add4(uint4 a, uint4 b) {
  float4 x = *(float4 *)&a, y = *(float4 *)&b, r = {x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w};
  return *(uint4 *)&r;
}

__global__ void __launch_bounds__(THREADS, 1) exchange(args a) {
  const uint32_t wid = threadIdx.x / 32, l = threadIdx.x % 32;
  const bool sender = blockIdx.x < a.nb;
  const uint32_t b = sender ? blockIdx.x : blockIdx.x - a.nb;
  const size_t part = (a.bytes / a.nb + 15) / 16 * 16, first = (size_t)b * part;
  const size_t end = a.bytes < first + part ? a.bytes : first + part;
  if (first >= end) return;
  const uint32_t chunks = (uint32_t)((end - first + a.chunk - 1) / a.chunk);
  const uint32_t mark0 = b * (uint32_t)((part + a.chunk - 1) / a.chunk);
  const uint64_t epoch = *a.base + a.index + 1;
  const uint32_t waves = (chunks + WARPS - 1) / WARPS;
  for (uint32_t wv = 0; wv < waves; wv++) {
    const uint32_t q = wv * WARPS + wid;
    const bool have = q < chunks;
    const size_t at = first + (size_t)q * a.chunk;
    const uint32_t n =
        have ? (uint32_t)(end - at < a.chunk ? end - at : a.chunk) / 16 : 0; /* 16-byte words */
    if (sender) {
      for (uint32_t i = l; i < n; i += 32 * 8) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
          if (i + u * 32 < n) v[u] = a.src[at / 16 + i + u * 32];
#pragma unroll
        for (int u = 0; u < 8; u++)
          if (i + u * 32 < n) ((uint4 *)(a.peer_ring + at))[i + u * 32] = v[u];
      }
      __syncwarp();
      if (a.mode == M_BLOCK) {
        __syncthreads();
        if (threadIdx.x == 0) __threadfence_system();
        __syncthreads();
      } else if (a.mode == M_WAVE) {
        __syncthreads();
        if (threadIdx.x == 0) {
          __threadfence_system();
          for (uint32_t j = wv * WARPS; j < chunks && j < (wv + 1) * WARPS; j++)
            *(volatile uint64_t *)&a.peer_marks[mark0 + j] = epoch;
        }
      }
      if (l == 0 && have) {
        uint64_t *m = &a.peer_marks[mark0 + q];
        if (a.mode == M_FENCE) {
          __threadfence_system();
          *(volatile uint64_t *)m = epoch;
        } else if (a.mode == M_RELEASE) {
          st_release(m, epoch);
        } else if (a.mode == M_NONE || a.mode == M_BLOCK) {
          *(volatile uint64_t *)m = epoch;
        }
      }
    } else if (have) {
      if (l == 0)
        while (ld_acquire(&a.marks[mark0 + q]) < epoch) {
        }
      __syncwarp();
      for (uint32_t i = l; i < n; i += 32 * 4) {
        uint4 x[4], y[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
          if (i + u * 32 < n) {
            x[u] = ((const uint4 *)(a.ring + at))[i + u * 32];
            y[u] = a.src[at / 16 + i + u * 32];
          }
#pragma unroll
        for (int u = 0; u < 4; u++)
          if (i + u * 32 < n) a.dst[at / 16 + i + u * 32] = add4(x[u], y[u]);
      }
    }
  }
  if (sender && a.mode == M_END) {
    __syncwarp();
    if (l == 0) {
      __threadfence_system();
      for (uint32_t q = wid; q < chunks; q += WARPS) *(volatile uint64_t *)&a.peer_marks[mark0 + q] = epoch;
    }
  }
}

/* The numbers of a comma-separated list in the environment variable `name`, or of `fallback`. */
static std::vector<uint32_t> env_list(const char *name, const char *fallback) {
  const char *s = getenv(name) != NULL ? getenv(name) : fallback;
  std::vector<uint32_t> v;
  for (char *e; *s != 0; s = *e == ',' ? e + 1 : e) {
    v.push_back((uint32_t)strtoul(s, &e, 10));
    if (e == s) break;
  }
  return v;
}

/* Whether `word` is one of the comma-separated words of `list`. */
static bool in_list(const char *list, const char *word) {
  const size_t n = strlen(word);
  for (const char *s = list; s != NULL; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL)
    if (strncmp(s, word, n) == 0 && (s[n] == ',' || s[n] == 0)) return true;
  return false;
}

int main() {
  const size_t max_bytes = 32u << 20;
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    printf("needs two GPUs\n");
    return 1;
  }
  cudaStream_t st[2];
  uint4 *src[2], *dst[2];
  char *ring[2];
  uint64_t *marks[2], *base[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
    CK(cudaMalloc(&src[d], max_bytes));
    CK(cudaMalloc(&dst[d], max_bytes));
    CK(cudaMalloc(&ring[d], max_bytes));
    CK(cudaMalloc(&marks[d], MAX_MARKS * sizeof(uint64_t)));
    CK(cudaMalloc(&base[d], sizeof(uint64_t)));
    CK(cudaMemset(src[d], 0x3c, max_bytes));
    CK(cudaMemset(marks[d], 0, MAX_MARKS * sizeof(uint64_t)));
  }
  uint64_t epoch = 0;
  const size_t sizes[] = {2u << 20, 4u << 20, 8u << 20, 16u << 20, 32u << 20};
  const std::vector<uint32_t> nbs = env_list("PROBE_NB", "40,60"),
                              chunks = env_list("PROBE_CHUNKS", "4096,16384");
  const char *modes = getenv("PROBE_MODES");
  printf("%8s %3s %6s %8s %9s %8s\n", "bytes", "nb", "chunk", "mode", "us", "GB/s");
  for (size_t bytes : sizes)
    for (uint32_t nb : nbs)
      for (uint32_t chunk : chunks)
        for (uint32_t mode = 0; mode < M_COUNT; mode++) {
          if (modes != NULL && !in_list(modes, mode_name[mode])) continue;
          if ((size_t)nb * ((bytes / nb + chunk - 1) / chunk + 1) > MAX_MARKS) continue;
          cudaGraphExec_t ge[2];
          for (int d = 0; d < 2; d++) {
            CK(cudaSetDevice(d));
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(st[d], cudaStreamCaptureModeThreadLocal));
            for (uint32_t i = 0; i < ITERS; i++) {
              args a = {src[d],  dst[d], ring[1 - d], marks[1 - d], ring[d], marks[d],
                        base[d], bytes,  nb,          chunk,        mode,    i};
              exchange<<<2 * nb, THREADS, 0, st[d]>>>(a);
            }
            CK(cudaStreamEndCapture(st[d], &g));
            CK(cudaGraphInstantiate(&ge[d], g, 0));
            CK(cudaGraphDestroy(g));
          }
          std::vector<double> us;
          for (int r = 0; r < RUNS + 1; r++) {
            cudaEvent_t e0[2], e1[2];
            for (int d = 0; d < 2; d++) {
              CK(cudaSetDevice(d));
              CK(cudaMemcpyAsync(base[d], &epoch, sizeof epoch, cudaMemcpyHostToDevice, st[d]));
              CK(cudaStreamSynchronize(st[d]));
              CK(cudaEventCreate(&e0[d]));
              CK(cudaEventCreate(&e1[d]));
            }
            for (int d = 0; d < 2; d++) {
              CK(cudaSetDevice(d));
              CK(cudaEventRecord(e0[d], st[d]));
              CK(cudaGraphLaunch(ge[d], st[d]));
              CK(cudaEventRecord(e1[d], st[d]));
            }
            float worst = 0;
            for (int d = 0; d < 2; d++) {
              CK(cudaSetDevice(d));
              CK(cudaStreamSynchronize(st[d]));
              float ms = 0;
              CK(cudaEventElapsedTime(&ms, e0[d], e1[d]));
              worst = std::max(worst, ms);
              CK(cudaEventDestroy(e0[d]));
              CK(cudaEventDestroy(e1[d]));
            }
            epoch += ITERS;
            if (r > 0) us.push_back(worst * 1000.0 / ITERS);
          }
          std::sort(us.begin(), us.end());
          const double med = us[us.size() / 2];
          printf("%8zu %3u %6u %8s %9.2f %8.1f\n", bytes, nb, chunk, mode_name[mode], med, bytes / med / 1e3);
          fflush(stdout);
          for (int d = 0; d < 2; d++) {
            CK(cudaSetDevice(d));
            CK(cudaGraphExecDestroy(ge[d]));
          }
        }
  return 0;
}
