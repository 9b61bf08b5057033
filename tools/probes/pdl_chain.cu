/*
 * Probe: what programmatic dependent launch (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) saves
 * between back-to-back launches on one stream, and whether an event recorded after each launch (as every
 * eager Braid launch records one) keeps it from saving anything. One GPU, one stream; a chain of launches of
 * a kernel of 16 blocks of 512 threads that busy-waits `spin` ns, then stores its launch's number into its
 * block's word. Each launch first reads the word of the next block (written by the previous launch) and
 * counts it where it is not the previous launch's number: with the programmatic wait before the read, that
 * count must stay 0. Modes:
 *   plain       cuLaunchKernel, the kernel without griddepcontrol
 *   record      the same, an event recorded after each launch
 *   noattr      a plain launch of the kernel that triggers and waits (griddepcontrol on a launch without the
 *               attribute: both must be no-ops)
 *   implicit    the attribute, the kernel waits but never triggers (its blocks trigger as they end)
 *   early       the attribute, each block triggers first and then waits
 *   early+rec   early, an event recorded after each launch
 * Not part of the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o pdl_chain tools/probes/pdl_chain.cu -lcuda && ./pdl_chain
 *
 * Prints, per spin and mode, the microseconds per launch (the chain's wall time over its launches, the host's
 * launch rate where the kernel is shorter than it) and the stale reads seen.
 */
#include <time.h>

#include "probe.h"

enum { BLOCKS = 16, THREADS = 512, LAUNCHES = 4000 };

__global__ void step(unsigned *words, unsigned n, unsigned long long spin, int gd, unsigned *stale) {
  if (gd & 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (gd & 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) {
    const unsigned prev = *(volatile unsigned *)&words[(blockIdx.x + 1) % BLOCKS];
    if (prev != n - 1) atomicAdd(stale, 1);
  }
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - start >= spin) break;
  }
  __syncthreads();
  if (threadIdx.x == 0) *(volatile unsigned *)&words[blockIdx.x] = n;
}

static double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

struct mode {
  const char *name;
  int attr, gd, record;
};

int main() {
  DK(cuInit(0));
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUstream s;
  DK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent ev;
  DK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  unsigned *words, *stale;
  CK(cudaMalloc(&words, BLOCKS * sizeof(unsigned)));
  CK(cudaMalloc(&stale, sizeof(unsigned)));
  cudaFunction_t f;
  CK(cudaGetFuncBySymbol(&f, (const void *)step));
  const mode modes[] = {{"plain", 0, 0, 0},    {"record", 0, 0, 1}, {"noattr", 0, 3, 0},
                        {"implicit", 1, 1, 0}, {"early", 1, 3, 0},  {"early+rec", 1, 3, 1}};
  const unsigned long long spins[] = {0, 1000, 2000, 4000, 8000};
  for (unsigned long long spin : spins) {
    for (int rep = 0; rep < 2; rep++) {
      for (const mode &m : modes) {
        CK(cudaMemset(words, 0, BLOCKS * sizeof(unsigned)));
        CK(cudaMemset(stale, 0, sizeof(unsigned)));
        CK(cudaDeviceSynchronize());
        unsigned n = 0;
        double t0 = 0;
        for (int i = 0; i < LAUNCHES + 200; i++) {
          if (i == 200) { /* the first 200 warm up */
            DK(cuStreamSynchronize(s));
            t0 = now_us();
          }
          n++;
          int gd = m.gd;
          void *args[] = {&words, &n, &spin, &gd, &stale};
          CUlaunchAttribute attr = {};
          attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
          attr.value.programmaticStreamSerializationAllowed = 1;
          CUlaunchConfig cfg = {};
          cfg.gridDimX = BLOCKS;
          cfg.gridDimY = cfg.gridDimZ = 1;
          cfg.blockDimX = THREADS;
          cfg.blockDimY = cfg.blockDimZ = 1;
          cfg.hStream = s;
          cfg.attrs = &attr;
          cfg.numAttrs = m.attr;
          DK(cuLaunchKernelEx(&cfg, (CUfunction)f, args, nullptr));
          if (m.record) DK(cuEventRecord(ev, s));
        }
        DK(cuStreamSynchronize(s));
        const double t1 = now_us();
        unsigned bad = 0;
        CK(cudaMemcpy(&bad, stale, sizeof bad, cudaMemcpyDeviceToHost));
        printf("spin %5llu ns  %-10s %.3f us per launch  stale reads %u\n", spin, m.name,
               (t1 - t0) / LAUNCHES, bad);
      }
    }
  }
  return 0;
}
