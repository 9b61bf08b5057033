/*
 * Probe: what the driver calls of one eager launch cost the host, one by one, with one thread driving every
 * GPU as `braid bench --resources` does (one call per rank per iteration, the ranks' devices in turn). Each
 * variant adds calls to the one before, so the differences are what each call costs:
 *   floor    make the rank's primary context current, launch an empty kernel (a 256-byte parameter block);
 *   scope    the same, between reading the current context and setting it back afterwards;
 *   capture  and a cuStreamGetCaptureInfo before the launch;
 *   event    and a cuEventRecord after it, on the same stream;
 *   group    as event, but the caller's context read once per iteration and set back once, after every rank's
 *            launch, instead of around each one;
 *   write    as capture, but a cuStreamWriteValue32 of the call's number into a word of host-mapped memory
 *            after the launch instead of the event record (what a launch would cost whose completion the host
 *            and other streams read from a word instead of an event);
 *   ex       as event, but launched with cuLaunchKernelEx (no attribute): what the extended entry costs;
 *   progev   as capture, launched with cuLaunchKernelEx and the event recorded by the launch itself
 *            (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, triggered as each block ends) instead of a record after
 *            it.
 * The variants take turns, run by run, so that a drift of the host's speed falls on all of them alike.
 * Not part of the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o host_calls tools/probes/host_calls.cu -lcuda && ./host_calls
 *
 * Prints, per variant, the host microseconds per call (per rank and iteration): the median of 15 runs of 500
 * iterations, each after 100 untimed ones and a synchronisation.
 */
#include <algorithm>
#include <time.h>

#include "probe.h"

enum { MAX_DEVS = 8, WARMUP = 100, ITERS = 500, RUNS = 15 };

struct params {
  unsigned long long words[32];
};

__global__ void empty_kernel(params p) {
  (void)p;
}

static double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int ndev;
static CUcontext ctxs[MAX_DEVS];
static CUstream streams[MAX_DEVS];
static CUevent events[MAX_DEVS];
static CUfunction fns[MAX_DEVS];
static CUdeviceptr words[MAX_DEVS];
static unsigned calls;

enum variant { FLOOR, SCOPE, CAPTURE, EVENT, GROUP, WRITE, EX, PROGEV, NVARIANTS };
static const char *names[NVARIANTS] = {"floor", "scope", "capture", "event",
                                       "group", "write", "ex",      "progev"};

static void one_call(int v, int d, params *p) {
  CUcontext saved = nullptr;
  if (v >= SCOPE && v != GROUP) DK(cuCtxGetCurrent(&saved));
  if (v == FLOOR || v == GROUP || saved != ctxs[d]) DK(cuCtxSetCurrent(ctxs[d]));
  if (v >= CAPTURE) {
    CUstreamCaptureStatus status;
    cuuint64_t id;
    CUgraph graph;
    DK(cuStreamGetCaptureInfo(streams[d], &status, &id, &graph, nullptr, nullptr, nullptr));
  }
  void *args[] = {p};
  if (v == EX || v == PROGEV) {
    CUlaunchAttribute attr = {};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT;
    attr.value.programmaticEvent.event = events[d];
    CUlaunchConfig cfg = {};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = streams[d];
    cfg.attrs = &attr;
    cfg.numAttrs = v == PROGEV ? 1 : 0;
    DK(cuLaunchKernelEx(&cfg, fns[d], args, nullptr));
  } else {
    DK(cuLaunchKernel(fns[d], 1, 1, 1, 32, 1, 1, 0, streams[d], args, nullptr));
  }
  if (v == EVENT || v == GROUP || v == EX) DK(cuEventRecord(events[d], streams[d]));
  if (v == WRITE) DK(cuStreamWriteValue32(streams[d], words[d], ++calls, CU_STREAM_WRITE_VALUE_DEFAULT));
  if (v >= SCOPE && v != GROUP && saved != ctxs[d]) DK(cuCtxSetCurrent(saved));
}

static void iterations(int v, int n, params *p) {
  for (int k = 0; k < n; k++) {
    CUcontext saved = nullptr;
    if (v == GROUP) DK(cuCtxGetCurrent(&saved));
    for (int d = 0; d < ndev; d++) one_call(v, d, p);
    if (v == GROUP) DK(cuCtxSetCurrent(saved));
  }
}

int main() {
  DK(cuInit(0));
  CK(cudaGetDeviceCount(&ndev));
  ndev = std::min(ndev, (int)MAX_DEVS);
  for (int d = 0; d < ndev; d++) {
    CK(cudaSetDevice(d));
    CK(cudaFree(nullptr)); /* the runtime's primary context */
    DK(cuCtxGetCurrent(&ctxs[d]));
    DK(cuStreamCreate(&streams[d], CU_STREAM_NON_BLOCKING));
    DK(cuEventCreate(&events[d], CU_EVENT_DISABLE_TIMING));
    void *host;
    DK(cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    DK(cuMemHostGetDevicePointer(&words[d], host, 0));
    cudaFunction_t f;
    CK(cudaGetFuncBySymbol(&f, (const void *)empty_kernel));
    fns[d] = (CUfunction)f;
  }
  CK(cudaSetDevice(0));
  params p = {};
  printf("%d GPUs, one thread; host us per call (per rank and iteration), median of %d runs of %d\n", ndev,
         RUNS, ITERS);
  double runs[NVARIANTS][RUNS];
  for (int r = 0; r < RUNS; r++) {
    for (int v = 0; v < NVARIANTS; v++) {
      iterations(v, WARMUP, &p);
      for (int d = 0; d < ndev; d++) DK(cuStreamSynchronize(streams[d]));
      double t0 = now_us();
      iterations(v, ITERS, &p);
      double t1 = now_us();
      for (int d = 0; d < ndev; d++) DK(cuStreamSynchronize(streams[d]));
      runs[v][r] = (t1 - t0) / ((double)ITERS * ndev);
    }
  }
  for (int v = 0; v < NVARIANTS; v++) {
    std::sort(runs[v], runs[v] + RUNS);
    printf("%-8s %7.3f us  (min %.3f, max %.3f)\n", names[v], runs[v][RUNS / 2], runs[v][0],
           runs[v][RUNS - 1]);
  }
  return 0;
}
