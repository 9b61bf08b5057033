/*
 * Probe: whether a kernel that pushes a transfer straight into the peer's buffer, with the whole handshake
 * inside it, beats the copy-engine path at 4-128 MiB. Two GPUs driven by one process move S bytes each way
 * (an exchange, as a two-rank send/receive, all-to-all or all-gather step) or one way (a broadcast's step):
 *   ce     Braid's copy-engine step (src/core/ce.c): a one-thread kernel raises the peer's `ready` word and
 *          waits for its own, the copy engine copies S bytes into the peer's buffer, a one-thread kernel
 *          raises the peer's `done` word and waits for its own. One way, the receiver raises `ready` and
 *          the sender `done` with stream writes, as Braid does for ranks that only send or only receive.
 *   push G one kernel of G blocks of 512 threads per exchange: block 0 raises the peer's `ready` to the
 *          exchange's number, every block waits for its own `ready`, stores its share of the S bytes into
 *          the peer's buffer with 16-byte stores (four in flight a thread), fences at system scope and adds
 *          one to the peer's `done`; block 0 then waits until its own `done` holds every peer block's one.
 *          One way, the receiver runs a one-thread kernel that raises `ready` and waits for `done`.
 * Every variant checks that the data landed before the receiver's wait ended: the sender's first and last
 * words carry the exchange's number, and the receiver's last kernel compares and poisons them. Waits give up
 * after about 2 s (counted as timeouts) so that a mistake cannot hang the machine. Not part of the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o push_direct tools/probes/push_direct.cu -lcuda && ./push_direct
 *
 * Prints, per direction, size and variant, the median over 9 runs of the time per transfer (20 transfers
 * per run, events on GPU 0's stream), the stale words found and the timeouts.
 */
#include <string.h>

#include <algorithm>
#include <vector>

#include "probe.h"

enum { RUNS = 9, ITERS = 20, THREADS = 512 };
static const size_t kMax = 128ull << 20;

struct words {
  unsigned ready, done, stale, timeouts;
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

/* Checks the two stamped words of this GPU's destination for `iter`, then poisons them. */
__device__ void check_stamps(unsigned *dst, size_t nwords, unsigned iter, unsigned *stale) {
  __threadfence_system();
  volatile unsigned *d = dst;
  if (d[0] != iter) atomicAdd(stale, 1u);
  if (d[nwords - 1] != iter) atomicAdd(stale, 1u);
  d[0] = 0;
  d[nwords - 1] = 0;
}

/* One thread: raises the peer's word (to `raise_to`, if any), stamps the source's first and last words
 * with the transfer's number (if any: before the copy engine takes it), waits for its own word (`which`:
 * 0 ready, 1 done) to reach `want`, and checks the destination's stamps (if any). */
__global__ void signal_wait(unsigned *raise, unsigned raise_to, unsigned *stamp, words *mine, int which,
                            unsigned want, unsigned *check, size_t nwords, unsigned iter) {
  if (raise != NULL) {
    __threadfence_system();
    *(volatile unsigned *)raise = raise_to;
  }
  if (stamp != NULL) {
    stamp[0] = iter;
    stamp[nwords - 1] = iter;
  }
  await(which == 0 ? &mine->ready : &mine->done, want, &mine->timeouts);
  if (check != NULL) check_stamps(check, nwords, iter, &mine->stale);
}

/* The push: see the header. `theirs` and `mine` are the two GPUs' words; dst is the peer's buffer (NULL: this
 * GPU only receives, with one block). `recv` says whether the peer sends to this GPU too. */
__global__ void push(const uint4 *src, uint4 *dst, size_t n, words *theirs, words *mine, unsigned iter,
                     int recv, unsigned *check) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    __threadfence_system();
    *(volatile unsigned *)&theirs->ready = iter;
  }
  if (threadIdx.x == 0) await(&mine->ready, iter, &mine->timeouts);
  __syncthreads();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
    for (int k = 0; k < 4; k++) v[k] = src[i + k * stride];
    if (i == 0) v[0].x = iter;
    for (int k = 0; k < 4; k++) {
      if (i + k * stride == n - 1) v[k].w = iter;
      dst[i + k * stride] = v[k];
    }
  }
  for (; i < n; i += stride) {
    uint4 v = src[i];
    if (i == 0) v.x = iter;
    if (i == n - 1) v.w = iter;
    dst[i] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    atomicAdd_system(&theirs->done, 1u);
  }
  if (recv && blockIdx.x == 0 && threadIdx.x == 0) {
    await(&mine->done, iter * gridDim.x, &mine->timeouts);
    check_stamps(check, n * 4, iter, &mine->stale);
  }
}

struct side {
  int dev;
  cudaStream_t s;
  cudaEvent_t t0, t1;
  unsigned *src, *dst; /* src on dev; dst on dev, written by the peer */
  words *w;            /* on dev, raised by the peer */
  side *other;
};

static void setup(side &x, int dev, int peer) {
  x.dev = dev;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceEnablePeerAccess(peer, 0));
  CK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking));
  CK(cudaEventCreate(&x.t0));
  CK(cudaEventCreate(&x.t1));
  CK(cudaMalloc(&x.src, kMax));
  CK(cudaMalloc(&x.dst, kMax));
  CK(cudaMemset(x.src, 0x5a, kMax));
  CK(cudaMalloc(&x.w, sizeof(words)));
  CK(cudaMemset(x.w, 0, sizeof(words)));
  CK(cudaDeviceSynchronize());
}

/* One transfer of `iter` on side x (sender when send, receiver when recv), variant grid (0: ce). The words
 * count up: `ready` holds the last transfer's number, `done` (push) every peer block's one per transfer, or
 * (ce) the last transfer's number. */
static void transfer(side &x, int grid, size_t bytes, int send, int recv, unsigned iter) {
  const size_t nwords = bytes / 4;
  words *theirs = x.other->w, *mine = x.w;
  unsigned *check = recv ? x.dst : NULL;
  if (grid == 0) {
    if (send) {
      signal_wait<<<1, 32, 0, x.s>>>(recv ? &theirs->ready : NULL, iter, x.src, mine, 0, iter, NULL, nwords,
                                     iter);
      CK(cudaMemcpyAsync(x.other->dst, x.src, bytes, cudaMemcpyDefault, x.s));
      if (!recv) DK(cuStreamWriteValue32((CUstream)x.s, (CUdeviceptr)&theirs->done, iter, 0));
    } else {
      DK(cuStreamWriteValue32((CUstream)x.s, (CUdeviceptr)&theirs->ready, iter, 0));
    }
    if (recv)
      signal_wait<<<1, 32, 0, x.s>>>(send ? &theirs->done : NULL, iter, NULL, mine, 1, iter, check, nwords,
                                     iter);
    return;
  }
  if (send) {
    push<<<grid, THREADS, 0, x.s>>>((const uint4 *)x.src, (uint4 *)x.other->dst, bytes / 16, theirs, mine,
                                    iter, recv, check);
  } else { /* the peer's push adds `grid` to done per transfer */
    signal_wait<<<1, 32, 0, x.s>>>(&theirs->ready, iter, NULL, mine, 1, iter * grid, check, nwords, iter);
  }
}

int main() {
  DK(cuInit(0));
  side a, b;
  setup(a, 0, 1);
  setup(b, 1, 0);
  a.other = &b;
  b.other = &a;
  printf("time per transfer of S bytes (each way, or GPU 0 to GPU 1), median of %d runs of %d\n", RUNS,
         ITERS);
  printf("%8s %10s %8s %10s %8s %8s %8s\n", "way", "bytes", "variant", "us", "GB/s", "stale", "timeouts");
  const int grids[] = {0, 66, 132, 264};
  for (int both = 1; both >= 0; both--)
    for (size_t mib : {1, 4, 8, 16, 32, 64, 128}) {
      const size_t bytes = mib << 20;
      for (int grid : grids) {
        /* the words count from 0 again for every variant: `done` grows by the grid per transfer */
        for (side *x : {&a, &b}) {
          CK(cudaSetDevice(x->dev));
          CK(cudaDeviceSynchronize());
          CK(cudaMemset(x->w, 0, sizeof(words)));
          CK(cudaDeviceSynchronize());
        }
        unsigned iter = 1;
        std::vector<double> ts;
        for (int r = 0; r < RUNS + 1; r++) { /* the first run warms up */
          CK(cudaSetDevice(0));
          CK(cudaEventRecord(a.t0, a.s));
          for (int i = 0; i < ITERS; i++, iter++) {
            CK(cudaSetDevice(0));
            transfer(a, grid, bytes, 1, both, iter);
            CK(cudaSetDevice(1));
            transfer(b, grid, bytes, both, 1, iter);
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
        words tot = {0, 0, 0, 0};
        for (side *x : {&a, &b}) {
          words w;
          CK(cudaSetDevice(x->dev));
          CK(cudaMemcpy(&w, x->w, sizeof w, cudaMemcpyDeviceToHost));
          tot.stale += w.stale;
          tot.timeouts += w.timeouts;
        }
        std::sort(ts.begin(), ts.end());
        const double us = ts[ts.size() / 2];
        char name[16];
        snprintf(name, sizeof name, grid == 0 ? "ce" : "push %d", grid);
        printf("%8s %10zu %8s %10.2f %8.1f %8u %8u\n", both ? "exchange" : "one way", bytes, name, us,
               bytes / us / 1e3, tot.stale, tot.timeouts);
        fflush(stdout);
      }
    }
  return 0;
}
