/*
 * Probe: what the copy-engine path's handshake costs each call (src/core/ce.c, ce_step and copy_step). Two
 * GPUs driven by one process exchange S bytes at once, as a two-rank send/receive or all-to-all does on the
 * copy engines: each GPU's stream raises the peer's `ready` word, waits for its own, copies its S bytes into
 * the peer's buffer, raises the peer's `done` word and waits for its own. Variants of the two signals:
 *   none     the copies back to back, no handshake: the link's time for the bytes;
 *   split    Braid's way: cuStreamWriteValue32 into the peer's word, then a one-thread kernel that waits
 *            for its own word and clears it;
 *   merged   one one-thread kernel that raises the peer's word and then waits for its own (one stream
 *            operation per signal instead of two);
 *   memops   cuStreamWriteValue32, cuStreamWaitValue32 and a write of 0 (no kernel, no timeout: not a
 *            candidate for Braid, only for scale).
 * With -l, each GPU also copies S bytes within itself on a second stream, forked after the `ready` wait and
 * joined before the `done` signal, as an all-to-all's local block.
 * Every signalling variant checks that the data landed before the signal: the kernel that waits for `ready`
 * stamps the first and last words of its source with the iteration's number, and the kernel that waits for
 * `done` compares the two words of its destination with it and poisons them (the memops variant does not).
 * Not part of the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o ceh tools/probes/ce_handshake.cu -lcuda && ./ceh [-l]
 *
 * Prints, per size and variant, the median over 9 runs of the time per exchange (20 exchanges per run,
 * events on GPU 0's stream) and the words found stale.
 */
#include <string.h>

#include <algorithm>
#include <vector>

#include "probe.h"

enum { RUNS = 9, ITERS = 20 };
enum variant { NONE, SPLIT, MERGED, MEMOPS, NVARIANTS };
static const char *names[NVARIANTS] = {"none", "split", "merged", "memops"};
static const size_t kMax = 64ull << 20;

/* One thread: raises *raise (if any), stamps the source's two words (if any), waits for *wait to be 1 and
 * clears it, then checks and poisons the destination's two words (if any). */
__global__ void signal_wait(unsigned *raise, volatile unsigned *wait, unsigned *stamp, const unsigned *check,
                            size_t nwords, unsigned iter, unsigned *stale) {
  if (raise != NULL) {
    __threadfence_system();
    *(volatile unsigned *)raise = 1;
  }
  if (stamp != NULL) {
    stamp[0] = iter;
    stamp[nwords - 1] = iter;
  }
  while (*wait != 1) {
  }
  *wait = 0;
  if (check != NULL) {
    __threadfence_system();
    volatile unsigned *d = (volatile unsigned *)check;
    if (d[0] != iter) atomicAdd(stale, 1u);
    if (d[nwords - 1] != iter) atomicAdd(stale, 1u);
    d[0] = 0;
    d[nwords - 1] = 0;
  }
}

struct side {
  int dev, peer;
  cudaStream_t s, local;
  cudaEvent_t t0, t1, fork, join;
  unsigned *src, *dst;   /* src on dev; dst on dev, written by the peer */
  unsigned *lsrc, *ldst; /* the local copy's, on dev */
  unsigned *words;       /* on dev: [0] ready, [1] done, raised by the peer */
  unsigned *stale;       /* on dev */
  side *other;
};

static void setup(side &x, int dev, int peer) {
  x.dev = dev;
  x.peer = peer;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceEnablePeerAccess(peer, 0));
  CK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&x.local, cudaStreamNonBlocking));
  CK(cudaEventCreate(&x.t0));
  CK(cudaEventCreate(&x.t1));
  CK(cudaEventCreateWithFlags(&x.fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&x.join, cudaEventDisableTiming));
  CK(cudaMalloc(&x.src, kMax));
  CK(cudaMalloc(&x.dst, kMax));
  CK(cudaMalloc(&x.lsrc, kMax));
  CK(cudaMalloc(&x.ldst, kMax));
  CK(cudaMemset(x.src, 0x5a, kMax));
  CK(cudaMemset(x.lsrc, 0x3c, kMax));
  CK(cudaMalloc(&x.words, 2 * sizeof(unsigned)));
  CK(cudaMemset(x.words, 0, 2 * sizeof(unsigned)));
  CK(cudaMalloc(&x.stale, sizeof(unsigned)));
  CK(cudaMemset(x.stale, 0, sizeof(unsigned)));
  CK(cudaDeviceSynchronize());
}

/* Raises the peer's word w and waits for this GPU's word w, the variant's way. */
static void handshake(side &x, int v, int w, size_t nwords, unsigned iter) {
  unsigned *theirs = x.other->words + w, *mine = x.words + w;
  unsigned *stamp = w == 0 ? x.src : NULL;
  const unsigned *check = w == 1 ? x.dst : NULL;
  if (v == SPLIT) {
    DK(cuStreamWriteValue32((CUstream)x.s, (CUdeviceptr)theirs, 1, 0));
    signal_wait<<<1, 32, 0, x.s>>>(NULL, mine, stamp, check, nwords, iter, x.stale);
  } else if (v == MERGED) {
    signal_wait<<<1, 32, 0, x.s>>>(theirs, mine, stamp, check, nwords, iter, x.stale);
  } else if (v == MEMOPS) {
    DK(cuStreamWriteValue32((CUstream)x.s, (CUdeviceptr)theirs, 1, 0));
    DK(cuStreamWaitValue32((CUstream)x.s, (CUdeviceptr)mine, 1, CU_STREAM_WAIT_VALUE_EQ));
    DK(cuStreamWriteValue32((CUstream)x.s, (CUdeviceptr)mine, 0, 0));
  }
}

static void exchange(side &x, int v, size_t bytes, int local, unsigned iter) {
  const size_t nwords = bytes / 4;
  handshake(x, v, 0, nwords, iter);
  if (local) {
    CK(cudaEventRecord(x.fork, x.s));
    CK(cudaStreamWaitEvent(x.local, x.fork, 0));
    CK(cudaMemcpyAsync(x.ldst, x.lsrc, bytes, cudaMemcpyDeviceToDevice, x.local));
    CK(cudaEventRecord(x.join, x.local));
  }
  CK(cudaMemcpyAsync(x.other->dst, x.src, bytes, cudaMemcpyDefault, x.s));
  if (local) CK(cudaStreamWaitEvent(x.s, x.join, 0));
  handshake(x, v, 1, nwords, iter);
}

int main(int argc, char **argv) {
  const int local = argc > 1 && strcmp(argv[1], "-l") == 0;
  DK(cuInit(0));
  side a, b;
  setup(a, 0, 1);
  setup(b, 1, 0);
  a.other = &b;
  b.other = &a;
  printf("both GPUs exchange S bytes at once%s; time per exchange, median of %d runs of %d\n",
         local ? ", each also copying S bytes within itself" : "", RUNS, ITERS);
  printf("%10s %8s %10s %8s\n", "bytes", "variant", "us", "stale");
  unsigned iter = 1;
  for (size_t bytes : {1ull << 20, 4ull << 20, 16ull << 20, 32ull << 20, 64ull << 20}) {
    for (int v = 0; v < NVARIANTS; v++) {
      std::vector<double> ts;
      for (int r = 0; r < RUNS + 1; r++) { /* the first run warms up */
        CK(cudaSetDevice(0));
        CK(cudaEventRecord(a.t0, a.s));
        for (int i = 0; i < ITERS; i++, iter++)
          for (side *x : {&a, &b}) {
            CK(cudaSetDevice(x->dev));
            exchange(*x, v, bytes, local, iter);
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
      unsigned stale = 0;
      for (side *x : {&a, &b}) {
        unsigned st = 0;
        CK(cudaSetDevice(x->dev));
        CK(cudaMemcpy(&st, x->stale, sizeof st, cudaMemcpyDeviceToHost));
        CK(cudaMemset(x->stale, 0, sizeof(unsigned)));
        stale += st;
      }
      std::sort(ts.begin(), ts.end());
      printf("%10zu %8s %10.2f %8u\n", bytes, names[v], ts[ts.size() / 2], stale);
      fflush(stdout);
    }
  }
  return 0;
}
