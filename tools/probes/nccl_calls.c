/*
 * Probe: which NCCL calls a program makes and how long each takes, whichever libnccl.so.2 is under it.
 * Preloaded ahead of the library, it takes the program's calls of the functions below, forwards each to the
 * next definition (the library's), and counts calls and nanoseconds per function and thread.
 * `nccl_calls_reset()` zeroes the counts and `nccl_calls_dump(path)` appends them to a file (or prints them
 * at exit when NCCL_CALLS_OUT names a file). Not part of the build:
 *
 *   cc -O2 -shared -fPIC -Iinclude -o nccl_calls.so tools/probes/nccl_calls.c -ldl -lpthread
 *   LD_PRELOAD="$PWD/nccl_calls.so /path/to/libnccl.so.2" program
 *
 * With PyTorch, preload the reference NCCL too (its own DT_RPATH copy would otherwise be found only in its
 * local scope, where the probe cannot forward to it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { F_MAX = 32 };

/* One function's counts: calls, nanoseconds inside, and calls made from a thread other than the first
 * caller's. */
typedef struct {
  const char *name;
  atomic_ulong calls, ns, other_thread;
  atomic_ulong first_tid;
} stat_t;

static stat_t stats[F_MAX];
static atomic_int nstats;

static unsigned long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long)ts.tv_sec * 1000000000ul + (unsigned long)ts.tv_nsec;
}

static stat_t *stat_of(const char *name, int *slot) {
  if (*slot == 0) {
    int i = atomic_fetch_add(&nstats, 1);
    if (i >= F_MAX) abort();
    stats[i].name = name;
    *slot = i + 1;
  }
  return &stats[*slot - 1];
}

static void account(stat_t *s, unsigned long t0) {
  unsigned long tid = (unsigned long)pthread_self(), zero = 0;
  atomic_fetch_add(&s->calls, 1);
  atomic_fetch_add(&s->ns, now_ns() - t0);
  if (!atomic_compare_exchange_strong(&s->first_tid, &zero, tid) && zero != tid)
    atomic_fetch_add(&s->other_thread, 1);
}

static void *next_fn(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
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
    static int slot;                                                                                         \
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
WRAP(ncclResult_t, ncclRedOpCreatePreMulSum,
     (ncclRedOp_t * a, void *b, ncclDataType_t c, ncclScalarResidence_t d, ncclComm_t e), (a, b, c, d, e))
WRAP(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t a, ncclComm_t b), (a, b))
WRAP(ncclResult_t, ncclCommRegister, (const ncclComm_t a, void *b, size_t c, void **d), (a, b, c, d))
WRAP(ncclResult_t, ncclCommDeregister, (const ncclComm_t a, void *b), (a, b))

void nccl_calls_reset(void) {
  for (int i = 0; i < atomic_load(&nstats) && i < F_MAX; i++) {
    atomic_store(&stats[i].calls, 0);
    atomic_store(&stats[i].ns, 0);
    atomic_store(&stats[i].other_thread, 0);
  }
}

void nccl_calls_dump(const char *path, const char *label) {
  FILE *f = path != NULL ? fopen(path, "a") : stdout;
  if (f == NULL) return;
  for (int i = 0; i < atomic_load(&nstats) && i < F_MAX; i++) {
    unsigned long c = atomic_load(&stats[i].calls);
    if (c == 0) continue;
    fprintf(f, "%s\t%s\t%lu\t%.3f\t%lu\n", label ? label : "", stats[i].name, c,
            atomic_load(&stats[i].ns) / 1e3 / (double)c, atomic_load(&stats[i].other_thread));
  }
  if (f != stdout) fclose(f);
}

__attribute__((destructor)) static void at_exit_dump(void) {
  const char *p = getenv("NCCL_CALLS_OUT");
  if (p != NULL) nccl_calls_dump(p, "exit");
}
