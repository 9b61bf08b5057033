/*
 * Probe: whether a two-GPU all-reduce out of place of 2-32 MiB gains from pushing, as the steps that only
 * copy did: each GPU stores its whole input straight into the other's
 * output, and combines its own input into its output tile by tile as the other's tiles land. Two GPUs
 * driven by one process, float sums, one kernel per GPU per all-reduce of G blocks (one per SM) of 512
 * threads:
 *   - block 0 raises the peer's `ready` to the all-reduce's number (this GPU's output is free); every block
 *     waits for its own;
 *   - the input goes in tiles of T bytes dealt to the blocks round robin; after storing a tile into the
 *     peer's output, a block fences at system scope and raises the peer's flag of that tile to the number;
 *   - combining tile t waits for this GPU's flag of t, then stores out = in + out;
 *   - variants: `xchg` pushes without combining (the exchange alone: what the link costs), `seq` pushes all
 *     of a block's tiles and then combines them, `ilv` combines each round's tile after pushing the next
 *     round's, so that the combine runs while the link carries the rest.
 * Each variant ends with a checked all-reduce: the outputs poisoned, then compared with the sums computed
 * on the host (every element; wrong ones counted). The combine reads the peer's tiles past L1 (`ld.cg`).
 * Waits give up after about 2 s (counted as timeouts) so that a mistake cannot hang the machine. Not part of
 * the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o push_reduce tools/probes/push_reduce.cu -lcuda && ./push_reduce
 *
 * Prints, per size, tile and variant, the median over 9 runs of the time per all-reduce (20 per run, events
 * on GPU 0's stream), the busbw nccl-tests would print, wrong elements and timeouts.
 */
#include <string.h>

#include <algorithm>
#include <vector>

#include "probe.h"

enum { RUNS = 9, ITERS = 20, THREADS = 512, MAX_TILES = 8192 };
static const size_t kMax = 32ull << 20;

enum { XCHG = 0, SEQ = 1, ILV = 2 };

struct words {
  unsigned ready, blocks, timeouts, pad;
  unsigned flags[MAX_TILES];
};

/* Spins until *w >= want (as a wrapping count), or about 2 s; a timeout is counted, not hung on. */
__device__ void await(volatile unsigned *w, unsigned want, unsigned *timeouts) {
  const long long t0 = clock64();
  while ((int)(*w - want) < 0)
    if (clock64() - t0 > 4000000000ll) {
      atomicAdd(timeouts, 1u);
      return;
    }
}

__device__ __forceinline__ void push_tile(const uint4 *src, uint4 *dst, uint32_t n) {
  uint32_t i = threadIdx.x;
  for (; i + 3 * THREADS < n; i += 4 * THREADS) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = src[i + k * THREADS];
#pragma unroll
    for (int k = 0; k < 4; k++) dst[i + k * THREADS] = v[k];
  }
  for (; i < n; i += THREADS) dst[i] = src[i];
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ __forceinline__ void combine_tile(const float4 *in, float4 *out, uint32_t n) {
  uint32_t i = threadIdx.x;
  for (; i + 3 * THREADS < n; i += 4 * THREADS) {
    float4 a[4], b[4];
#pragma unroll
    for (int k = 0; k < 4; k++) a[k] = in[i + k * THREADS], b[k] = __ldcg(out + i + k * THREADS);
#pragma unroll
    for (int k = 0; k < 4; k++) out[i + k * THREADS] = add4(a[k], b[k]);
  }
  for (; i < n; i += THREADS) out[i] = add4(in[i], __ldcg(out + i));
}

/* Waits for the peer's tile t of all-reduce `iter`, then combines it. */
__device__ void recv_tile(const char *in, char *out, size_t bytes, uint32_t tile, uint32_t t, words *mine,
                          unsigned iter, int combine) {
  if (threadIdx.x == 0) {
    await(&mine->flags[t], iter, &mine->timeouts);
    __threadfence_system(); /* the flag's read (after the peer's fence) before the tile's loads */
  }
  __syncthreads();
  if (!combine) return;
  const size_t off = (size_t)t * tile;
  const uint32_t n = (uint32_t)(min((size_t)tile, bytes - off) / 16);
  combine_tile((const float4 *)(in + off), (float4 *)(out + off), n);
}

/* One all-reduce of `bytes` (a multiple of 16) on this GPU; see the header. */
__global__ void push_reduce(const char *in, char *peer_out, char *out, size_t bytes, uint32_t tile,
                            words *mine, words *theirs, unsigned iter, int variant) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    __threadfence_system();
    *(volatile unsigned *)&theirs->ready = iter;
  }
  if (threadIdx.x == 0) await(&mine->ready, iter, &mine->timeouts);
  __syncthreads();
  const uint32_t ntiles = (uint32_t)((bytes + tile - 1) / tile), grid = gridDim.x;
  uint32_t prev = UINT32_MAX; /* the tile pushed last round, combined after this round's push (ilv) */
  for (uint32_t t = blockIdx.x; t < ntiles; t += grid) {
    const size_t off = (size_t)t * tile;
    const uint32_t n = (uint32_t)(min((size_t)tile, bytes - off) / 16);
    push_tile((const uint4 *)(in + off), (uint4 *)(peer_out + off), n);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      *(volatile unsigned *)&theirs->flags[t] = iter;
    }
    if (variant == ILV && prev != UINT32_MAX) recv_tile(in, out, bytes, tile, prev, mine, iter, 1);
    prev = t;
  }
  if (variant == ILV) {
    if (prev != UINT32_MAX) recv_tile(in, out, bytes, tile, prev, mine, iter, 1);
  } else {
    for (uint32_t t = blockIdx.x; t < ntiles; t += grid)
      recv_tile(in, out, bytes, tile, t, mine, iter, variant == SEQ);
  }
}

struct side {
  int dev;
  cudaStream_t s;
  cudaEvent_t t0, t1;
  char *in, *out; /* on dev; out is written by the peer too */
  words *w;       /* on dev, raised by the peer */
  side *other;
};

static float input_of(int gpu, size_t i) {
  return (float)((i * 2654435761u + (unsigned)gpu * 40503u) % 1021u) * 0.25f - 100.0f;
}

static void setup(side &x, int dev, int peer) {
  x.dev = dev;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceEnablePeerAccess(peer, 0));
  CK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking));
  CK(cudaEventCreate(&x.t0));
  CK(cudaEventCreate(&x.t1));
  CK(cudaMalloc(&x.in, kMax));
  CK(cudaMalloc(&x.out, kMax));
  std::vector<float> h(kMax / 4);
  for (size_t i = 0; i < h.size(); i++) h[i] = input_of(dev, i);
  CK(cudaMemcpy(x.in, h.data(), kMax, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&x.w, sizeof(words)));
  CK(cudaMemset(x.w, 0, sizeof(words)));
  CK(cudaDeviceSynchronize());
}

static void launch(side &x, int grid, size_t bytes, uint32_t tile, unsigned iter, int variant) {
  CK(cudaSetDevice(x.dev));
  push_reduce<<<grid, THREADS, 0, x.s>>>(x.in, x.other->out, x.out, bytes, tile, x.w, x.other->w, iter,
                                         variant);
}

/* Elements of both outputs that differ from the host's sums (the exchange alone: from the peer's input). */
static size_t wrong(side &a, side &b, size_t bytes, int variant) {
  size_t bad = 0;
  std::vector<float> h(bytes / 4);
  for (side *x : {&a, &b}) {
    CK(cudaSetDevice(x->dev));
    CK(cudaMemcpy(h.data(), x->out, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); i++) {
      const float peer = input_of(x->other->dev, i);
      const float want = variant == XCHG ? peer : input_of(x->dev, i) + peer;
      bad += h[i] != want;
    }
  }
  return bad;
}

int main() {
  DK(cuInit(0));
  side a, b;
  setup(a, 0, 1);
  setup(b, 1, 0);
  a.other = &b;
  b.other = &a;
  int grid = 0;
  CK(cudaDeviceGetAttribute(&grid, cudaDevAttrMultiProcessorCount, 0));
  printf("all-reduce out of place of S bytes of floats on two GPUs, %d blocks of %d threads each; median of "
         "%d runs of %d\n",
         grid, THREADS, RUNS, ITERS);
  printf("%10s %8s %6s %10s %9s %8s %8s\n", "bytes", "tile", "var", "us", "busbw", "wrong", "timeouts");
  const char *names[] = {"xchg", "seq", "ilv"};
  unsigned iter = 0;
  for (size_t mib : {2, 4, 8, 16, 32})
    for (uint32_t tile : {16384u, 65536u})
      for (int variant : {XCHG, SEQ, ILV}) {
        const size_t bytes = mib << 20;
        if ((bytes + tile - 1) / tile > MAX_TILES) continue;
        std::vector<double> ts;
        for (int r = 0; r < RUNS + 1; r++) { /* the first run warms up */
          CK(cudaSetDevice(0));
          CK(cudaEventRecord(a.t0, a.s));
          for (int i = 0; i < ITERS; i++) {
            ++iter;
            launch(a, grid, bytes, tile, iter, variant);
            launch(b, grid, bytes, tile, iter, variant);
          }
          CK(cudaSetDevice(0));
          CK(cudaEventRecord(a.t1, a.s));
          for (side *x : {&a, &b}) {
            CK(cudaSetDevice(x->dev));
            CK(cudaDeviceSynchronize());
          }
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, a.t0, a.t1));
          if (r > 0) ts.push_back(ms * 1000.0 / ITERS);
        }
        for (side *x : {&a, &b}) { /* poison, then one checked all-reduce */
          CK(cudaSetDevice(x->dev));
          CK(cudaMemset(x->out, 0xff, bytes));
          CK(cudaDeviceSynchronize());
        }
        ++iter;
        launch(a, grid, bytes, tile, iter, variant);
        launch(b, grid, bytes, tile, iter, variant);
        unsigned timeouts = 0;
        for (side *x : {&a, &b}) {
          CK(cudaSetDevice(x->dev));
          CK(cudaDeviceSynchronize());
          words w;
          CK(cudaMemcpy(&w, x->w, 4 * sizeof(unsigned), cudaMemcpyDeviceToHost));
          timeouts += w.timeouts;
        }
        const size_t bad = wrong(a, b, bytes, variant);
        std::sort(ts.begin(), ts.end());
        const double us = ts[ts.size() / 2];
        printf("%10zu %8u %6s %10.2f %9.1f %8zu %8u\n", bytes, tile, names[variant], us, bytes / us / 1e3,
               bad, timeouts);
        fflush(stdout);
      }
  return 0;
}
