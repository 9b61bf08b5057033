/*
 * Probe: which NCCL and CUDA runtime calls a program makes and how long each takes, whichever libnccl.so.2 is
 * under it. Preloaded ahead of the library, it takes the program's calls of the functions below, forwards
 * each to the next definition (the library's, or the CUDA runtime's that the program loaded), and counts
 * calls and nanoseconds per function, apart for the thread that last called `nccl_calls_reset()` (the "main"
 * thread) and for every other thread. `nccl_calls_dump(path, label)` appends the counts to a file
 * (tab-separated: label, function, thread, calls, microseconds per call). Not part of the build:
 *
 *   cc -O2 -shared -fPIC -Iinclude -I$CUDA_HOME/include -o nccl_calls.so tools/probes/nccl_calls.c -ldl
 * -lpthread LD_PRELOAD="$PWD/nccl_calls.so /path/to/libnccl.so.2" program
 *
 * With PyTorch, preload the reference NCCL too (its own DT_RPATH copy would otherwise be found only in its
 * local scope, where the probe cannot forward to it).
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { F_MAX = 64 };

/* One function's counts, for the main thread [0] and for the others [1]. */
typedef struct {
  const char *name;
  atomic_ulong calls[2], ns[2];
} stat_t;

static stat_t stats[F_MAX];
static atomic_int nstats;
static _Atomic(unsigned long) main_tid;

static unsigned long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long)ts.tv_sec * 1000000000ul + (unsigned long)ts.tv_nsec;
}

static stat_t *stat_of(const char *name, _Atomic int *slot) {
  int s = atomic_load(slot);
  if (s == 0) {
    int i = atomic_fetch_add(&nstats, 1);
    if (i >= F_MAX) abort();
    stats[i].name = name;
    int zero = 0;
    if (!atomic_compare_exchange_strong(slot, &zero, i + 1)) return &stats[zero - 1];
    s = i + 1;
  }
  return &stats[s - 1];
}

static void account(stat_t *s, unsigned long t0) {
  int other = (unsigned long)pthread_self() != atomic_load(&main_tid);
  atomic_fetch_add(&s->calls[other], 1);
  atomic_fetch_add(&s->ns[other], now_ns() - t0);
}

/* The next definition of name: after the probe, else in the CUDA runtime the program loaded (which a library
 * loaded in a local scope hides from RTLD_NEXT). */
static void *next_fn(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  static const char *rt[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  for (int i = 0; f == NULL && i < 3; i++) {
    void *h = dlopen(rt[i], RTLD_LAZY | RTLD_NOLOAD);
    if (h != NULL) f = dlsym(h, name);
  }
  if (f == NULL) {
    fprintf(stderr, "nccl_calls: no definition of %s after the probe\n", name);
    abort();
  }
  return f;
}

/* WRAP(ret, name, (params), (args)): a definition of name that times the next one. */
#define WRAP(ret, name, params, args)                                                                        \
  ret name params {                                                                                          \
    static ret(*fn) params;                                                                                  \
    static _Atomic int slot;                                                                                 \
    if (fn == NULL) fn = (ret(*) params)next_fn(#name);                                                      \
    stat_t *s = stat_of(#name, &slot);                                                                       \
    unsigned long t0 = now_ns();                                                                             \
    ret r = fn args;                                                                                         \
    account(s, t0);                                                                                          \
    return r;                                                                                                \
  }

WRAP(ncclResult_t, ncclAllReduce,
     (const void *a, void *b, size_t c, ncclDataType_t d, ncclRedOp_t e, ncclComm_t f, cudaStream_t g),
     (a, b, c, d, e, f, g))
WRAP(ncclResult_t, ncclAllGather,
     (const void *a, void *b, size_t c, ncclDataType_t d, ncclComm_t f, cudaStream_t g), (a, b, c, d, f, g))
WRAP(ncclResult_t, ncclReduceScatter,
     (const void *a, void *b, size_t c, ncclDataType_t d, ncclRedOp_t e, ncclComm_t f, cudaStream_t g),
     (a, b, c, d, e, f, g))
WRAP(ncclResult_t, ncclBroadcast,
     (const void *a, void *b, size_t c, ncclDataType_t d, int e, ncclComm_t f, cudaStream_t g),
     (a, b, c, d, e, f, g))
WRAP(ncclResult_t, ncclSend, (const void *a, size_t c, ncclDataType_t d, int e, ncclComm_t f, cudaStream_t g),
     (a, c, d, e, f, g))
WRAP(ncclResult_t, ncclRecv, (void *a, size_t c, ncclDataType_t d, int e, ncclComm_t f, cudaStream_t g),
     (a, c, d, e, f, g))
WRAP(ncclResult_t, ncclGroupStart, (void), ())
WRAP(ncclResult_t, ncclGroupEnd, (void), ())
WRAP(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t a, ncclResult_t *b), (a, b))
WRAP(ncclResult_t, ncclCommCount, (const ncclComm_t a, int *b), (a, b))
WRAP(ncclResult_t, ncclCommUserRank, (const ncclComm_t a, int *b), (a, b))
WRAP(ncclResult_t, ncclCommCuDevice, (const ncclComm_t a, int *b), (a, b))
WRAP(ncclResult_t, ncclGetVersion, (int *a), (a))
WRAP(const char *, ncclGetLastError, (ncclComm_t a), (a))
WRAP(ncclResult_t, ncclCommRegister, (const ncclComm_t a, void *b, size_t c, void **d), (a, b, c, d))
WRAP(ncclResult_t, ncclCommDeregister, (const ncclComm_t a, void *b), (a, b))
WRAP(cudaError_t, cudaEventRecord, (cudaEvent_t a, cudaStream_t b), (a, b))
WRAP(cudaError_t, cudaEventRecordWithFlags, (cudaEvent_t a, cudaStream_t b, unsigned int c), (a, b, c))
WRAP(cudaError_t, cudaStreamWaitEvent, (cudaStream_t a, cudaEvent_t b, unsigned int c), (a, b, c))
WRAP(cudaError_t, cudaEventQuery, (cudaEvent_t a), (a))
WRAP(cudaError_t, cudaStreamQuery, (cudaStream_t a), (a))
WRAP(cudaError_t, cudaEventCreateWithFlags, (cudaEvent_t * a, unsigned int b), (a, b))
WRAP(cudaError_t, cudaEventDestroy, (cudaEvent_t a), (a))
WRAP(cudaError_t, cudaGetDevice, (int *a), (a))
WRAP(cudaError_t, cudaSetDevice, (int a), (a))
WRAP(cudaError_t, cudaStreamIsCapturing, (cudaStream_t a, enum cudaStreamCaptureStatus *b), (a, b))
WRAP(cudaError_t, cudaLaunchKernel, (const void *a, dim3 b, dim3 c, void **d, size_t e, cudaStream_t f),
     (a, b, c, d, e, f))
WRAP(cudaError_t, cudaMemsetAsync, (void *a, int b, size_t c, cudaStream_t d), (a, b, c, d))
WRAP(cudaError_t, cudaMemcpyAsync, (void *a, const void *b, size_t c, enum cudaMemcpyKind d, cudaStream_t e),
     (a, b, c, d, e))
WRAP(cudaError_t, cudaStreamSynchronize, (cudaStream_t a), (a))
WRAP(cudaError_t, cudaDeviceSynchronize, (void), ())

void nccl_calls_reset(void) {
  atomic_store(&main_tid, (unsigned long)pthread_self());
  for (int i = 0; i < atomic_load(&nstats) && i < F_MAX; i++) {
    for (int t = 0; t < 2; t++) {
      atomic_store(&stats[i].calls[t], 0);
      atomic_store(&stats[i].ns[t], 0);
    }
  }
}

void nccl_calls_dump(const char *path, const char *label) {
  FILE *f = path != NULL ? fopen(path, "a") : stdout;
  if (f == NULL) return;
  for (int i = 0; i < atomic_load(&nstats) && i < F_MAX; i++) {
    for (int t = 0; t < 2; t++) {
      unsigned long c = atomic_load(&stats[i].calls[t]);
      if (c == 0) continue;
      fprintf(f, "%s\t%s\t%s\t%lu\t%.3f\n", label ? label : "", stats[i].name, t ? "other" : "main", c,
              atomic_load(&stats[i].ns[t]) / 1e3 / (double)c);
    }
  }
  if (f != stdout) fclose(f);
}
