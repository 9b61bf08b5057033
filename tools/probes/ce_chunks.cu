/*
 * Probe: what each chunk of a copy-engine reduction costs the link, by how the receiver learns that the chunk
 * landed (src/core/ce.c, reduce_step: chunk copies into the peer's buffer, each followed by a stream write of
 * its number into a word of the receiver, whose combine kernel waits for it). One process drives two GPUs
 * with peer access; S bytes go from GPU 0 to GPU 1 in N chunks on one stream of GPU 0 (and, with -2, from
 * GPU 1 to GPU 0 at the same time, as a reduce-scatter's two directions). Variants:
 *   one       one copy of S: the link's time for the bytes alone;
 *   bare      the N copies back to back, nothing between them;
 *   write     each copy followed by cuStreamWriteValue32 of its number into the receiver's word (Braid);
 *   flagcopy  each copy followed by a 4-byte copy of its number, from a table in the sender's memory, into
 *             the word;
 *   event     each copy followed by an event record; a second stream waits for the event and writes the word;
 *   lanes     the chunks dealt to two streams in turn (even chunks on the first, odd on the second, each
 *             stream's copies back to back), nothing between them: whether one stream's copy fills the
 *             other's pause.
 * In every variant that signals, a kernel on the receiving GPU waits for each number in turn and then checks
 * the chunk's first, middle and last words against what the sender's chunk holds in that run (each run fills
 * the source with a value of its own per chunk): a word that does not match means the signal overtook the
 * data. Not part of the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o ce_chunks tools/probes/ce_chunks.cu -lcuda && ./ce_chunks [-2]
 *
 * Prints, per chunk count and variant: the median time of 9 runs (events on GPU 0's stream), the cost per
 * chunk beyond `one` ((t - t_one) / (N - 1)), and the words found stale.
 */
#include <string.h>

#include <algorithm>
#include <vector>

#include "probe.h"

static const size_t kBytes = 256ull << 20;
enum { RUNS = 9, MAX_CHUNKS = 64 };
enum variant { ONE, BARE, WRITE, FLAGCOPY, EVENT, LANES, NVARIANTS };
static const char *names[NVARIANTS] = {"one", "bare", "write", "flagcopy", "event", "lanes"};

/* Waits for each chunk's number in *word (raised by the sender after the chunk), then checks three words of
 * the chunk against the run's value for it. */
__global__ void checker(const volatile unsigned *word, const unsigned *dst, const size_t *ends, int n,
                        unsigned base, unsigned *stale) {
  size_t at = 0;
  for (int k = 0; k < n; k++) {
    while (*word < (unsigned)k + 1) {
    }
    __threadfence_system();
    const size_t words = (ends[k] - at) / 4, first = at / 4;
    const size_t idx[3] = {first, first + words / 2, first + words - 1};
    for (int i = 0; i < 3; i++)
      if (((const volatile unsigned *)dst)[idx[i]] != base + (unsigned)k) atomicAdd(stale, 1u);
    at = ends[k];
  }
}

struct side {
  int dev, peer;
  cudaStream_t s, sig;
  cudaEvent_t t0, t1, ev[MAX_CHUNKS];
  unsigned *src, *dst; /* src on dev, dst on peer */
  unsigned *word;      /* on peer: the receiver's word */
  unsigned *numbers;   /* on dev: 1 .. MAX_CHUNKS, for flagcopy */
  size_t *ends;        /* on peer: the chunks' ends, for the checker */
  unsigned *stale;     /* on peer */
  cudaStream_t check;  /* on peer */
};

static void setup(side &x, int dev, int peer) {
  x.dev = dev;
  x.peer = peer;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceEnablePeerAccess(peer, 0));
  CK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&x.sig, cudaStreamNonBlocking));
  CK(cudaEventCreate(&x.t0));
  CK(cudaEventCreate(&x.t1));
  for (int i = 0; i < MAX_CHUNKS; i++) CK(cudaEventCreateWithFlags(&x.ev[i], cudaEventDisableTiming));
  CK(cudaMalloc(&x.src, kBytes));
  CK(cudaMalloc(&x.numbers, MAX_CHUNKS * sizeof(unsigned)));
  std::vector<unsigned> nums(MAX_CHUNKS);
  for (int i = 0; i < MAX_CHUNKS; i++) nums[i] = i + 1;
  CK(cudaMemcpy(x.numbers, nums.data(), MAX_CHUNKS * sizeof(unsigned), cudaMemcpyHostToDevice));
  CK(cudaSetDevice(peer));
  CK(cudaMalloc(&x.dst, kBytes));
  CK(cudaMalloc(&x.word, sizeof(unsigned)));
  CK(cudaMalloc(&x.ends, MAX_CHUNKS * sizeof(size_t)));
  CK(cudaMalloc(&x.stale, sizeof(unsigned)));
  CK(cudaStreamCreateWithFlags(&x.check, cudaStreamNonBlocking));
}

/* Chunk ends of kBytes: n equal chunks (n > 0), or Braid's (n = 0: each half of what is left, at least 8
 * MiB). */
static std::vector<size_t> chunks(int n) {
  std::vector<size_t> ends;
  if (n > 0) {
    for (int k = 1; k <= n; k++) ends.push_back(kBytes / n * k);
    return ends;
  }
  for (size_t at = 0; at < kBytes;) {
    size_t left = kBytes - at, c = left / 2 / 65536 * 65536;
    if (c < (8ull << 20)) c = 8ull << 20;
    if (c > left) c = left;
    at += c;
    ends.push_back(at);
  }
  return ends;
}

/* Fills each chunk of x's source with its run value, resets the word, and starts the checker. */
static void prepare(side &x, const std::vector<size_t> &ends, unsigned base) {
  CK(cudaSetDevice(x.dev));
  size_t at = 0;
  for (size_t k = 0; k < ends.size(); k++) {
    DK(cuMemsetD32((CUdeviceptr)(x.src + at / 4), base + (unsigned)k, (ends[k] - at) / 4));
    at = ends[k];
  }
  CK(cudaDeviceSynchronize());
  CK(cudaSetDevice(x.peer));
  CK(cudaMemset(x.word, 0, sizeof(unsigned)));
  CK(cudaMemcpy(x.ends, ends.data(), ends.size() * sizeof(size_t), cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());
}

/* Starts the kernel that checks x's chunks as they are signalled (after every side's prepare: it spins). */
static void start_check(side &x, const std::vector<size_t> &ends, unsigned base) {
  CK(cudaSetDevice(x.peer));
  checker<<<1, 1, 0, x.check>>>(x.word, x.dst, x.ends, (int)ends.size(), base, x.stale);
}

static void issue(side &x, const std::vector<size_t> &ends, int v) {
  CK(cudaSetDevice(x.dev));
  CK(cudaEventRecord(x.t0, x.s));
  if (v == ONE) {
    CK(cudaMemcpyAsync(x.dst, x.src, kBytes, cudaMemcpyDefault, x.s));
  } else {
    size_t at = 0;
    if (v == LANES) {
      CK(cudaEventRecord(x.ev[0], x.s));
      CK(cudaStreamWaitEvent(x.sig, x.ev[0], 0));
    }
    for (size_t k = 0; k < ends.size(); k++) {
      cudaStream_t on = v == LANES && k % 2 ? x.sig : x.s;
      CK(cudaMemcpyAsync((char *)x.dst + at, (char *)x.src + at, ends[k] - at, cudaMemcpyDefault, on));
      if (v == WRITE) DK(cuStreamWriteValue32((CUstream)x.s, (CUdeviceptr)x.word, (unsigned)k + 1, 0));
      if (v == FLAGCOPY) CK(cudaMemcpyAsync(x.word, x.numbers + k, sizeof(unsigned), cudaMemcpyDefault, x.s));
      if (v == EVENT) {
        CK(cudaEventRecord(x.ev[k], x.s));
        CK(cudaStreamWaitEvent(x.sig, x.ev[k], 0));
        DK(cuStreamWriteValue32((CUstream)x.sig, (CUdeviceptr)x.word, (unsigned)k + 1, 0));
      }
      at = ends[k];
    }
  }
  if (v == EVENT || v == LANES) {
    CK(cudaEventRecord(x.ev[MAX_CHUNKS - 1], x.sig));
    CK(cudaStreamWaitEvent(x.s, x.ev[MAX_CHUNKS - 1], 0));
  }
  CK(cudaEventRecord(x.t1, x.s));
}

int main(int argc, char **argv) {
  const int both = argc > 1 && strcmp(argv[1], "-2") == 0;
  DK(cuInit(0));
  side a, b;
  setup(a, 0, 1);
  if (both) setup(b, 1, 0);
  printf("%zu MiB from GPU 0 to GPU 1%s; medians of %d runs\n", kBytes >> 20,
         both ? ", and back at once" : "", RUNS);
  unsigned base = 1000;
  for (int n : {0, 8, 32}) {
    const std::vector<size_t> ends = chunks(n);
    const int nch = (int)ends.size();
    double t_one = 0;
    for (int v = 0; v < NVARIANTS; v++) {
      std::vector<double> ts;
      unsigned stale_total = 0;
      for (int r = 0; r < RUNS; r++) {
        base += 100;
        const int check = v >= WRITE && v <= EVENT;
        for (side *x : {&a, &b}) {
          if (x == &b && !both) continue;
          CK(cudaSetDevice(x->peer));
          CK(cudaMemset(x->stale, 0, sizeof(unsigned)));
          prepare(*x, ends, base);
        }
        for (side *x : {&a, &b})
          if (check && (x == &a || both)) start_check(*x, ends, base);
        issue(a, ends, v);
        if (both) issue(b, ends, v);
        for (side *x : {&a, &b}) {
          if (x == &b && !both) continue;
          CK(cudaSetDevice(x->dev));
          CK(cudaStreamSynchronize(x->s));
          CK(cudaStreamSynchronize(x->sig));
          CK(cudaSetDevice(x->peer));
          CK(cudaStreamSynchronize(x->check));
          unsigned st = 0;
          CK(cudaMemcpy(&st, x->stale, sizeof st, cudaMemcpyDeviceToHost));
          stale_total += st;
        }
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a.t0, a.t1));
        ts.push_back(ms * 1e3);
      }
      std::sort(ts.begin(), ts.end());
      const double t = ts[RUNS / 2];
      if (v == ONE) t_one = t;
      printf("%2d chunks%s  %-8s %9.2f us  %6.1f GB/s  per chunk %+6.2f us  stale %u\n", nch,
             n == 0 ? " (Braid's)" : "          ", names[v], t, kBytes / t / 1e3,
             v == ONE ? 0.0 : (t - t_one) / (nch - 1), stale_total);
    }
  }
  return 0;
}
