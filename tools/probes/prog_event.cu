/*
 * Probe: whether an event recorded by a launch itself (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, no explicit
 * trigger in the kernel, so each block triggers as it ends) orders work on another stream that waits for it
 * as an event recorded after the launch does: the waiting stream's kernel must see every store of the
 * launch, and so must a copy on that stream. One GPU, two streams; each round, a writer kernel (132 blocks,
 * block b spinning b * 40 ns before it stores the round's number into its own words, the last store just
 * before the block ends) runs on the first stream, and after the wait on the second stream:
 *   kernel    a checker kernel counts the words that do not hold the round's number;
 *   gdwait    the same, after griddepcontrol.wait (the programmatic dependency's own wait);
 *   copy      a copy of the words, then the checker on the copy.
 * Each mode runs with the event recorded after the launch (record) and by the launch (progev). It also
 * checks that cuEventSynchronize and cuEventQuery end on a launch's event. Not part of the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o prog_event tools/probes/prog_event.cu -lcuda && ./prog_event
 *
 * Prints, per mode and recording, the rounds and the stale words seen (0 wherever the ordering holds), and
 * the microseconds per round.
 */
#include <time.h>

#include "probe.h"

enum { BLOCKS = 132, THREADS = 256, WORDS = BLOCKS * THREADS * 4, ROUNDS = 2000 };

__global__ void writer(unsigned *words, unsigned round) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - start >= 40ull * blockIdx.x) break;
  }
  unsigned *w = words + (size_t)blockIdx.x * THREADS * 4;
  for (int k = 0; k < 4; k++) w[k * THREADS + threadIdx.x] = round;
}

__global__ void checker(const unsigned *words, unsigned round, unsigned *stale, int gdwait) {
  if (gdwait) asm volatile("griddepcontrol.wait;" ::: "memory");
  unsigned bad = 0;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < WORDS; i += gridDim.x * blockDim.x)
    bad += words[i] != round;
  if (bad) atomicAdd(stale, bad);
}

static double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

enum mode { KERNEL, GDWAIT, COPY, NMODES };
static const char *mode_names[NMODES] = {"kernel", "gdwait", "copy"};

int main() {
  DK(cuInit(0));
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUstream s1, s2;
  DK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  DK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CUevent ev;
  DK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  unsigned *words, *copy, *stale;
  CK(cudaMalloc(&words, WORDS * sizeof(unsigned)));
  CK(cudaMalloc(&copy, WORDS * sizeof(unsigned)));
  CK(cudaMalloc(&stale, sizeof(unsigned)));
  cudaFunction_t fw, fc;
  CK(cudaGetFuncBySymbol(&fw, (const void *)writer));
  CK(cudaGetFuncBySymbol(&fc, (const void *)checker));
  unsigned round = 0;
  for (int prog = 0; prog < 2; prog++) {
    for (int m = 0; m < NMODES; m++) {
      CK(cudaMemset(words, 0xff, WORDS * sizeof(unsigned)));
      CK(cudaMemset(stale, 0, sizeof(unsigned)));
      CK(cudaDeviceSynchronize());
      double t0 = now_us();
      for (int r = 0; r < ROUNDS; r++) {
        round++;
        void *wargs[] = {&words, &round};
        CUlaunchAttribute attr = {};
        attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT;
        attr.value.programmaticEvent.event = ev;
        CUlaunchConfig cfg = {};
        cfg.gridDimX = BLOCKS;
        cfg.gridDimY = cfg.gridDimZ = 1;
        cfg.blockDimX = THREADS;
        cfg.blockDimY = cfg.blockDimZ = 1;
        cfg.hStream = s1;
        cfg.attrs = &attr;
        cfg.numAttrs = prog;
        DK(cuLaunchKernelEx(&cfg, (CUfunction)fw, wargs, nullptr));
        if (!prog) DK(cuEventRecord(ev, s1));
        DK(cuStreamWaitEvent(s2, ev, 0));
        const unsigned *src = words;
        if (m == COPY) {
          DK(cuMemcpyDtoDAsync((CUdeviceptr)copy, (CUdeviceptr)words, WORDS * sizeof(unsigned), s2));
          src = copy;
        }
        int gd = m == GDWAIT;
        void *cargs[] = {&src, &round, &stale, &gd};
        DK(cuLaunchKernel((CUfunction)fc, BLOCKS, 1, 1, THREADS, 1, 1, 0, s2, cargs, nullptr));
        /* the writer of the next round must not overwrite what this round's checker reads */
        CUevent back;
        DK(cuEventCreate(&back, CU_EVENT_DISABLE_TIMING));
        DK(cuEventRecord(back, s2));
        DK(cuStreamWaitEvent(s1, back, 0));
        DK(cuEventDestroy(back));
      }
      DK(cuEventSynchronize(ev));
      CUresult q = cuEventQuery(ev);
      DK(cuStreamSynchronize(s1));
      DK(cuStreamSynchronize(s2));
      double t1 = now_us();
      unsigned bad = 0;
      CK(cudaMemcpy(&bad, stale, sizeof bad, cudaMemcpyDeviceToHost));
      printf("%-7s %-6s rounds %d  stale words %u  query after sync %s  %.2f us per round\n",
             prog ? "progev" : "record", mode_names[m], ROUNDS, bad, q == CUDA_SUCCESS ? "done" : "NOT DONE",
             (t1 - t0) / ROUNDS);
    }
  }
  return 0;
}
