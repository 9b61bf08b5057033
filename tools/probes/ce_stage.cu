/*
 * Probe: an in-place reduce-scatter of two ranks on the copy engines, through a small landing area. In place,
 * the copy engines cannot land the peer's part in the receiver's output (src/core/ce.c: that is the operand),
 * so the kernels move it. Here each GPU's part
 * from the peer lands in chunks in a few slots of its own memory, and a combine kernel on a second stream
 * adds each chunk into the output as it lands; a slot is refilled once its combine has finished. One process
 * drives both GPUs with peer access; each holds 2 H bytes (H = 256 MiB, a 512 MiB reduce-scatter's half), in
 * place: GPU 0's output is its first half, GPU 1's its second. Variants:
 *   full      the whole part copied into a landing area of H bytes, then one combine (the copy engines' pace
 *             with memory to spare);
 *   pull S/N  the receiver's copy engine reads the peer's part, S-MiB chunks into N slots;
 *   push S/N  the sender's copy engine writes into the receiver's slots (a slot's reuse waits for the
 *             receiver's combine through an event of the other GPU);
 *   P% pulled a push S/N whose last P% of each part the receiver's kernel reads across the link and adds
 *             into the output itself (one block per SM, on a stream of its own, from the start), so that
 *             the kernel's reads fill the link while the engines wait between chunks.
 * Each variant runs both ways at once (the reduce-scatter) and one way, GPU 1 to GPU 0 only (a reduce whose
 * root, GPU 0, holds its operand in its output).
 * The chunks are S MiB, and the last S of the part is cut in halves down to 1 MiB (so that the combine left
 * after the last copy is short). Every run refills both buffers, and a kernel then counts the output words
 * that are not the sum (float, integer values: exact). Not part of the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o ce_stage tools/probes/ce_stage.cu -lcuda && ./ce_stage
 *
 * Prints per variant the median time of 9 runs (from GPU 0's start, which GPU 1 waits for, to the end of
 * both), H / t (the reduce-scatter's bus bandwidth; one way, GPU 0's rate), the chunks on the engines, and
 * the wrong words (one way, GPU 0's only).
 */
#include <string.h>

#include <algorithm>
#include <vector>

#include "probe.h"

static const size_t kHalf = 256ull << 20;
static const size_t kMiB = 1ull << 20;
enum { RUNS = 9, MAX_SLOTS = 4, MAX_CHUNKS = 256 };

__global__ void fill(float *x, size_t n, int who) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = who == 0 ? (float)(i % 1000) : (float)(i % 777) * 2.0f;
}

__global__ void combine(float4 *out, const float4 *in, size_t n4) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
       i += (size_t)gridDim.x * blockDim.x) {
    float4 a = out[i], b = in[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    out[i] = a;
  }
}

__global__ void verify(const float *x, size_t first, size_t n, unsigned *wrong) {
  unsigned bad = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t j = first + i;
    if (x[j] != (float)(j % 1000) + (float)(j % 777) * 2.0f) bad++;
  }
  if (bad) atomicAdd(wrong, bad);
}

struct gpu {
  int dev;
  cudaStream_t s, side, pull;
  float *buf; /* 2 H bytes: the user's buffer */
  char *land; /* H bytes: the full variant's landing area, and the slots at its start */
  unsigned *wrong;
  cudaEvent_t t0, t1, start, end, pulled, landed[MAX_CHUNKS], freed[MAX_CHUNKS];
};

static void setup(gpu &g, int dev) {
  g.dev = dev;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceEnablePeerAccess(1 - dev, 0));
  CK(cudaStreamCreateWithFlags(&g.s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&g.side, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&g.pull, cudaStreamNonBlocking));
  CK(cudaMalloc(&g.buf, 2 * kHalf));
  CK(cudaMalloc(&g.land, kHalf));
  CK(cudaMalloc(&g.wrong, sizeof(unsigned)));
  CK(cudaEventCreate(&g.t0));
  CK(cudaEventCreate(&g.t1));
  CK(cudaEventCreateWithFlags(&g.start, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&g.end, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&g.pulled, cudaEventDisableTiming));
  for (int i = 0; i < MAX_CHUNKS; i++) {
    CK(cudaEventCreateWithFlags(&g.landed[i], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&g.freed[i], cudaEventDisableTiming));
  }
}

/* Chunk sizes of `total` bytes: S-byte chunks, the last S cut in halves down to 1 MiB. */
static std::vector<size_t> chunks(size_t s, size_t total = kHalf) {
  std::vector<size_t> v;
  size_t left = total;
  while (left > s) {
    v.push_back(s);
    left -= s;
  }
  while (left > kMiB) {
    v.push_back(left / 2);
    left -= left / 2;
  }
  v.push_back(left);
  return v;
}

static void launch_combine(float *out, const void *in, size_t bytes, cudaStream_t on) {
  combine<<<132 * 4, 512, 0, on>>>((float4 *)out, (const float4 *)in, bytes / 16);
}

/* Issues one reduce-scatter (dirs 2) or its half towards GPU 0 (dirs 1). mode 0: full, 1: pull, 2: push;
 * `pulled` bytes at the end of each part go by the receiver's kernel instead. */
static void issue(gpu *g, int mode, size_t s, int nslots, int dirs, size_t pulled) {
  const std::vector<size_t> cs = chunks(s, kHalf - pulled);
  CK(cudaSetDevice(0));
  CK(cudaEventRecord(g[0].t0, g[0].s));
  CK(cudaEventRecord(g[0].start, g[0].s));
  CK(cudaSetDevice(1));
  CK(cudaStreamWaitEvent(g[1].s, g[0].start, 0));
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    CK(cudaEventRecord(g[d].start, g[d].s));
    CK(cudaStreamWaitEvent(g[d].side, g[d].start, 0));
    CK(cudaStreamWaitEvent(g[d].pull, g[d].start, 0));
  }
  for (int d = 0; d < dirs && pulled > 0; d++) {
    const size_t at = kHalf - pulled;
    CK(cudaSetDevice(d));
    combine<<<132, 512, 0, g[d].pull>>>((float4 *)((char *)g[d].buf + d * kHalf + at),
                                        (const float4 *)((const char *)g[1 - d].buf + d * kHalf + at),
                                        pulled / 16);
    CK(cudaEventRecord(g[d].pulled, g[d].pull));
  }
  /* GPU d's output starts at d * H bytes; the peer's part of it lies at the same place in its buffer */
  if (mode == 0) {
    for (int d = 0; d < dirs; d++) {
      gpu &me = g[d], &peer = g[1 - d];
      CK(cudaSetDevice(d));
      CK(cudaMemcpyAsync(me.land, (const char *)peer.buf + d * kHalf, kHalf, cudaMemcpyDefault, me.s));
      launch_combine((float *)((char *)me.buf + d * kHalf), me.land, kHalf, me.s);
    }
  } else {
    size_t at = 0;
    for (size_t k = 0; k < cs.size(); k++) {
      const int slot = (int)(k % nslots);
      for (int d = 0; d < dirs; d++) {
        gpu &me = g[d], &peer = g[1 - d];
        char *out = (char *)me.buf + d * kHalf + at;
        const char *theirs = (const char *)peer.buf + d * kHalf + at;
        char *land = me.land + slot * s;
        gpu &copier = mode == 1 ? me : peer;
        CK(cudaSetDevice(copier.dev));
        if (k >= (size_t)nslots) CK(cudaStreamWaitEvent(copier.s, me.freed[k - nslots], 0));
        CK(cudaMemcpyAsync(land, theirs, cs[k], cudaMemcpyDefault, copier.s));
        CK(cudaEventRecord(copier.landed[k], copier.s)); /* an event is recorded on its own GPU */
        CK(cudaSetDevice(d));
        CK(cudaStreamWaitEvent(me.side, copier.landed[k], 0));
        launch_combine((float *)out, land, cs[k], me.side);
        CK(cudaEventRecord(me.freed[k], me.side));
      }
      at += cs[k];
    }
    for (int d = 0; d < dirs; d++) {
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(g[d].end, g[d].side));
      CK(cudaStreamWaitEvent(g[d].s, g[d].end, 0));
    }
  }
  for (int d = 0; d < dirs && pulled > 0; d++) { /* the kernel's share joined at the end */
    CK(cudaSetDevice(d));
    CK(cudaStreamWaitEvent(g[d].s, g[d].pulled, 0));
  }
  CK(cudaSetDevice(1));
  CK(cudaEventRecord(g[1].end, g[1].s));
  CK(cudaSetDevice(0));
  CK(cudaStreamWaitEvent(g[0].s, g[1].end, 0));
  CK(cudaEventRecord(g[0].t1, g[0].s));
}

int main() {
  DK(cuInit(0));
  gpu g[2];
  setup(g[0], 0);
  setup(g[1], 1);
  struct {
    int mode;
    size_t s;
    int slots, pct; /* pct: the part's share pulled by the receiver's kernel */
  } vs[] = {{0, kHalf, 1, 0},      {1, 8 * kMiB, 2, 0},   {1, 16 * kMiB, 2, 0},  {1, 32 * kMiB, 2, 0},
            {1, 32 * kMiB, 3, 0},  {1, 64 * kMiB, 2, 0},  {2, 16 * kMiB, 2, 0},  {2, 32 * kMiB, 2, 0},
            {2, 64 * kMiB, 2, 0},  {2, 16 * kMiB, 2, 25}, {2, 32 * kMiB, 2, 25}, {2, 64 * kMiB, 2, 25},
            {2, 16 * kMiB, 2, 50}, {2, 32 * kMiB, 2, 50}, {2, 16 * kMiB, 2, 75}, {2, 16 * kMiB, 2, 100}};
  for (int dirs = 2; dirs >= 1; dirs--) {
    if (dirs == 2)
      printf("in-place reduce-scatter of %zu MiB on two GPUs (each receives %zu MiB); medians of %d runs\n",
             2 * kHalf >> 20, kHalf >> 20, RUNS);
    else
      printf("one way: GPU 0 receives %zu MiB and adds it into its own (a reduce in place); medians of %d "
             "runs\n",
             kHalf >> 20, RUNS);
    for (auto &v : vs) {
      if (v.pct > 0 && v.mode != 2) continue;
      const size_t pulled = kHalf / 100 * v.pct / kMiB * kMiB;
      std::vector<double> ts;
      unsigned wrong_total = 0;
      for (int r = 0; r < RUNS + 1; r++) {
        for (int d = 0; d < 2; d++) {
          CK(cudaSetDevice(d));
          fill<<<132 * 4, 512>>>(g[d].buf, 2 * kHalf / 4, d);
          CK(cudaMemset(g[d].wrong, 0, sizeof(unsigned)));
          CK(cudaDeviceSynchronize());
        }
        issue(g, v.mode, v.s, v.slots, dirs, pulled);
        for (int d = 0; d < 2; d++) {
          CK(cudaSetDevice(d));
          CK(cudaDeviceSynchronize());
        }
        for (int d = 0; d < dirs; d++) {
          CK(cudaSetDevice(d));
          verify<<<132 * 4, 512>>>(g[d].buf, d * kHalf / 4, kHalf / 4, g[d].wrong);
          unsigned w = 0;
          CK(cudaMemcpy(&w, g[d].wrong, sizeof w, cudaMemcpyDeviceToHost));
          wrong_total += w;
        }
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, g[0].t0, g[0].t1));
        if (r > 0) ts.push_back(ms * 1e3); /* the first run warms up */
      }
      std::sort(ts.begin(), ts.end());
      const double t = ts[RUNS / 2];
      const char *name = v.mode == 0 ? "full" : v.mode == 1 ? "pull" : "push";
      printf("%-4s %3zu MiB x %d  %3d%% pulled  %3zu chunks  %9.2f us  %6.1f GB/s  wrong %u\n", name,
             v.s >> 20, v.slots, v.pct, v.mode == 0 ? (size_t)1 : chunks(v.s, kHalf - pulled).size(), t,
             kHalf / t / 1e3, wrong_total);
      fflush(stdout);
    }
  }
  return 0;
}
