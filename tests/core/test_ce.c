/*
 * The direct path (core/ce.h) against the tests' stand-in driver, which executes its stream memory
 * operations and copies on memory both rank processes map: broadcast, all-gather, gather, scatter,
 * all-to-all, send/receive and the reductions must deliver every element by the copy engines, pushes and
 * pulls; steps either rank refuses must stay on the kernels on both; the path or a threshold turned off on
 * one rank is off on both; and the step messages' waits end on a timeout, an abort or the peer's exit.
 * Without CUDA's headers there is no stand-in driver and nothing to test.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "data.h"
#include "harness.h"
#include "nccl.h"

#ifdef BRAID_MOCK_CUDA_DIR

#include "core/comm.h"
#include "core/gpu_exec.h"
#include "core/tune.h"
#include "core/workq.h"
#include "device/dev.h"
#include "gpu/gpu.h"
#include "gx_mock.h"

/* ---- Copy engines straight into the peer's buffer (core/ce.h) ----
 * The stand-in driver runs stream memory operations and copies at once, in the calling process, on memory
 * both rank processes map (cuMemAlloc is POSIX shared memory there): the copy-engine steps really move the
 * data between the two processes, and their handshake really waits for the peer. Kernels move nothing, so
 * every call checked here must go the copy engines' way, and the log says it did. */

enum { CE_N = 100003 }; /* floats per rank: odd, and the buffers start one float past an aligned address */

typedef struct {
  float *send, *recv; /* one float past ncclMemAlloc'd memory */
  int rank;
  uint64_t seed;
} ce_bufs_t;

/* Element i of rank r's input in the current call. */
static float ce_in(const ce_bufs_t *b, int r, size_t i) {
  return (float)data_value(b->seed, r, i, ncclFloat, ncclSum);
}

/* Fresh inputs (2 * CE_N floats) for a new call, and poisoned outputs. */
static void ce_fresh(ce_bufs_t *b) {
  b->seed++;
  data_fill(b->send, 2 * CE_N, b->seed, b->rank, ncclFloat, ncclSum);
  data_poison(b->recv, 2 * CE_N * sizeof(float));
}

/* This rank's buffers for the copy-engine cases (2 * CE_N floats each, one float past ncclMemAlloc'd
 * memory, freed by ce_close), with inputs from `seed` on. */
static ce_bufs_t ce_open(int rank, uint64_t seed, void **s, void **r) {
  EXPECT_OK(ncclMemAlloc(s, (2 * CE_N + 1) * sizeof(float)));
  EXPECT_OK(ncclMemAlloc(r, (2 * CE_N + 1) * sizeof(float)));
  return (ce_bufs_t){(float *)*s + 1, (float *)*r + 1, rank, seed};
}

/* The stand-in's counts of combines, of their chunks and of kernel launches. */
typedef struct {
  uint64_t combines, chunks;
  int launches;
} ce_counts_t;

static ce_counts_t ce_counts(void) {
  const mock_cuda_stats_t *st = mock_stats();
  return (ce_counts_t){st->combine_launches, st->combine_chunks, st->launches};
}

/* Expects the calls since `before` to have run `combines` combines of `chunks` chunks in all and `launches`
 * kernel launches. */
static void ce_expect_counts(int rank, const ce_counts_t *before, uint64_t combines, uint64_t chunks,
                             int launches, const char *what) {
  const ce_counts_t now = ce_counts();
  if (now.combines != before->combines + combines || now.chunks != before->chunks + chunks ||
      now.launches != before->launches + launches)
    test_fail(__FILE__, __LINE__, "rank %d: %s: %llu combines of %llu chunks, %d launches", rank, what,
              (unsigned long long)(now.combines - before->combines),
              (unsigned long long)(now.chunks - before->chunks), now.launches - before->launches);
}

/* Checks n floats of out against the sum of the two ranks' inputs from element `first` on (the host's sum
 * of two floats, in either order, is the one the combine computes). */
static void ce_expect_sum(const ce_bufs_t *b, const float *out, size_t n, size_t first, const char *what) {
  for (size_t i = 0; i < n; i++) {
    const float want = ce_in(b, 0, first + i) + ce_in(b, 1, first + i);
    if (out[i] != want) {
      test_fail(__FILE__, __LINE__, "rank %d: %s: element %zu is %g, expected %g", b->rank, what, i,
                (double)out[i], (double)want);
      return;
    }
  }
}

/* Checks n floats of out against rank r's input from element `first` on. */
static void ce_expect(const ce_bufs_t *b, const float *out, size_t n, int r, size_t first, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (out[i] != ce_in(b, r, first + i)) {
      test_fail(__FILE__, __LINE__, "rank %d: %s: element %zu is %g, expected rank %d's %g", b->rank, what, i,
                (double)out[i], r, (double)ce_in(b, r, first + i));
      return;
    }
}

/* Reductions through the copy engines: the sender's chunks land in the receiver's output and its combine
 * kernel (run at once by the stand-in, with the host's arithmetic) adds its own operand, chunk by chunk. A
 * reduce in place is pulled: the root's combine reads the sender's input. On the ring only: PreMulSum (a
 * float average) would need the peer's bytes scaled; one-shot steps differ between the ranks. They stay on
 * the kernels, which move nothing here. */
static void ce_reductions(ce_bufs_t *b, ncclComm_t comm) {
  mock_cuda_stats_t *st = mock_stats();
  const int rank = b->rank;
  for (int root = 0; root < 2; root++) {
    ce_fresh(b);
    const uint64_t combines = st->combine_launches, chunks = st->combine_chunks;
    EXPECT_OK(ncclReduce(b->send, b->recv, CE_N, ncclFloat, ncclSum, root, comm, NULL));
    if (rank == root) ce_expect_sum(b, b->recv, CE_N, 0, "reduce");
    EXPECT(st->combine_launches == combines + (rank == root) &&
               st->combine_chunks >= chunks + 3 * (uint64_t)(rank == root),
           "rank %d: a reduce to %d: %llu combines of %llu chunks", rank, root,
           (unsigned long long)(st->combine_launches - combines),
           (unsigned long long)(st->combine_chunks - chunks));
  }
  ce_fresh(b); /* each rank's block of the output is the sum of the two inputs' blocks */
  EXPECT_OK(ncclReduceScatter(b->send, b->recv, CE_N, ncclFloat, ncclSum, comm, NULL));
  ce_expect_sum(b, b->recv, CE_N, (size_t)rank * CE_N, "reduce-scatter");
  ce_fresh(b); /* both steps of a split all-reduce by the copy engines */
  EXPECT_OK(ncclAllReduce(b->send, b->recv, CE_N, ncclFloat, ncclSum, comm, NULL));
  ce_expect_sum(b, b->recv, CE_N, 0, "all-reduce");
  /* integers averaged: the combine divides the sum (wrapping, then truncating) */
  int32_t *in = (int32_t *)b->send, *out = (int32_t *)b->recv;
  b->seed++;
  data_fill(in, CE_N, b->seed, rank, ncclInt32, ncclAvg);
  data_poison(out, CE_N * sizeof(int32_t));
  EXPECT_OK(ncclReduce(in, out, CE_N, ncclInt32, ncclAvg, 1, comm, NULL));
  for (size_t i = 0; rank == 1 && i < CE_N; i++) {
    const int32_t want = (int32_t)((uint32_t)data_value(b->seed, 0, i, ncclInt32, ncclAvg) +
                                   (uint32_t)data_value(b->seed, 1, i, ncclInt32, ncclAvg)) /
                         2;
    if (out[i] != want) {
      test_fail(__FILE__, __LINE__, "integer average: element %zu is %d, expected %d", i, out[i], want);
      break;
    }
  }
  /* in place: the root's combine reads the other rank's input where it lies, in one chunk (a pull) */
  for (int root = 0; root < 2; root++) {
    ce_fresh(b);
    float *io = rank == root ? b->recv : b->send;
    if (rank == root) memcpy(io, b->send, CE_N * sizeof(float));
    const ce_counts_t before = ce_counts();
    EXPECT_OK(ncclReduce(io, io, CE_N, ncclFloat, ncclSum, root, comm, NULL));
    if (rank == root)
      ce_expect_sum(b, io, CE_N, 0, "reduce in place");
    else
      ce_expect(b, io, CE_N, rank, 0, "reduce in place: the sender's input");
    ce_expect_counts(rank, &before, rank == root, rank == root, 0, "a reduce in place");
  }
  const uint64_t combines = st->combine_launches;
  const int launches = st->launches;
  ce_fresh(b); /* a float average is a PreMulSum: the kernels */
  EXPECT_OK(ncclReduceScatter(b->send, b->recv, CE_N, ncclFloat, ncclAvg, comm, NULL));
  /* one-shot (at most BRAID_ONESHOT_MAX_BYTES): the root combines in a lane of its own while the other
   * rank's send looks like the ring's; both must leave it to the kernels, not wait for each other */
  ce_fresh(b);
  EXPECT_OK(ncclReduce(b->send, b->recv, 4096, ncclFloat, ncclSum, 0, comm, NULL));
  EXPECT(st->combine_launches == combines && st->launches == launches + 2,
         "rank %d: averaged or one-shot: %llu combines, %d launches", rank,
         (unsigned long long)(st->combine_launches - combines), st->launches - launches);
}

/* A last broadcast from `root` that the copy engines must move (the ranks still pair after what the test
 * did), then the buffers (s and r, from ncclMemAlloc) and the communicator go. */
static void ce_close(ce_bufs_t *b, void *s, void *r, ncclComm_t comm, int root, const char *what) {
  ce_fresh(b);
  EXPECT_OK(ncclBroadcast(b->send, b->recv, CE_N, ncclFloat, root, comm, NULL));
  ce_expect(b, b->recv, CE_N, root, 0, what);
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void ce_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "copy engines move steps whose every transfer") == 1,
         "rank %d: the communicator has no copy-engine path", rank);
  const int peer = 1 - rank;
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 77, &s, &r); /* the same sequence of seeds on both ranks */
  for (int root = 0; root < 2; root++) {
    ce_fresh(&b);
    EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, root, comm, NULL));
    ce_expect(&b, b.recv, CE_N, root, 0, "broadcast");
  }
  ce_fresh(&b); /* in place: the root's buffer is its input */
  float *io = rank == 1 ? b.send : b.recv;
  EXPECT_OK(ncclBroadcast(io, io, CE_N, ncclFloat, 1, comm, NULL));
  ce_expect(&b, io, CE_N, 1, 0, "broadcast in place");
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather");
  ce_fresh(&b); /* in place: this rank's block already holds its input */
  memcpy(b.recv + (size_t)rank * CE_N, b.send, CE_N * sizeof(float));
  EXPECT_OK(ncclAllGather(b.recv + (size_t)rank * CE_N, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather in place");
  ce_fresh(&b);
  EXPECT_OK(ncclGather(b.send, b.recv, CE_N, ncclFloat, 0, comm, NULL));
  if (rank == 0)
    for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "gather");
  ce_fresh(&b);
  EXPECT_OK(ncclScatter(b.send, b.recv, CE_N, ncclFloat, 1, comm, NULL));
  ce_expect(&b, b.recv, CE_N, 1, (size_t)rank * CE_N, "scatter");
  ce_fresh(&b);
  EXPECT_OK(ncclAlltoAll(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++)
    ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, (size_t)rank * CE_N, "alltoall");
  ce_fresh(&b); /* two sends each way in one group, of different sizes */
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b.send, CE_N, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclSend(b.send + CE_N, CE_N - 2, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b.recv, CE_N, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b.recv + CE_N, CE_N - 2, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  ce_expect(&b, b.recv, 2 * CE_N - 2, peer, 0, "send/receive");
  /* An all-reduce in place past BRAID_AR_SPLIT_BYTES: its reduce-scatter step is the kernels' (which move
   * nothing here), its all-gather step the copy engines'. Each rank's half of the buffer holds a pattern
   * standing in for its reduced half; afterwards both halves must be on both ranks. Halves of an odd count:
   * the first one element longer. */
  ce_fresh(&b);
  const size_t half[2] = {CE_N / 2 + 1, CE_N / 2}, first[2] = {0, CE_N / 2 + 1};
  memcpy(b.recv + first[rank], b.send + CE_N + first[rank], half[rank] * sizeof(float)); /* not the input */
  EXPECT_OK(ncclAllReduce(b.recv, b.recv, CE_N, ncclFloat, ncclSum, comm, NULL));
  for (int p = 0; p < 2; p++)
    ce_expect(&b, b.recv + first[p], half[p], p, CE_N + first[p], "all-reduce's halves");
  ce_reductions(&b, comm);
  /* one INFO line per collective and size class: broadcast, all-gather, gather, scatter, alltoall, send,
   * all-reduce, reduce, reduce-scatter */
  EXPECT(test_file_lines(log_path, "by the copy engines") == 9,
         "rank %d: %d kinds logged as copy-engine steps", rank,
         test_file_lines(log_path, "by the copy engines"));
  /* Each rank refuses once, the other agrees: both must leave the step to the kernels (which here move
   * nothing, so the poisoned output stays), and the next call must still pair with the peer's. */
  mock_cuda_stats_t *st = mock_stats();
  const uint64_t copies = st->dd_copies;
  const int launches = st->launches;
  float *host = malloc(2 * CE_N * sizeof(float)); /* an output legacy IPC cannot export */
  EXPECT(host != NULL);
  for (int refuser = 0; refuser < 2; refuser++) {
    ce_fresh(&b);
    EXPECT_OK(ncclAllGather(b.send, rank == refuser ? host : b.recv, CE_N, ncclFloat, comm, NULL));
  }
  free(host);
  EXPECT(st->dd_copies == copies && st->launches == launches + 2,
         "rank %d: a refused step: %llu copies, %d launches", rank,
         (unsigned long long)(st->dd_copies - copies), st->launches - launches);
  ce_fresh(&b); /* below the threshold: the kernels */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, 100, ncclFloat, 0, comm, NULL));
  EXPECT(st->dd_copies == copies && st->launches == launches + 3, "rank %d: a small broadcast took copies",
         rank);
  ce_close(&b, s, r, comm, 0, "broadcast after refusals");
}

/* Mapped allocations of the peer, as the stand-in driver counts them (cuMem mappings and opened IPC). */
static int live_mappings(const mock_cuda_stats_t *st) {
  return st->live_maps + st->live_legacy;
}

/* Captured calls. Both ranks capturing take the copy engines: the stand-in runs what is captured at once, as
 * one replay would, so the data moves; each step waits through the wait kernel, once per direction it has,
 * raising the peer's word in the same kernel where the rank sends and receives (no stream write then), and
 * the graph keeps its own mapping of the peer's output until it is destroyed. One rank capturing
 * and the other eager stay on the kernels, without a warning. */
static void ce_capture_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  cudaStream_t cap = (cudaStream_t)MOCK_CUDA_CAPTURING;
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 91, &s, &r);
  mock_cuda_stats_t *st = mock_stats();
  const int maps = live_mappings(st);
  const uint64_t copies = st->dd_copies, waits = st->wait_launches;
  uint64_t writes = st->stream_writes, raises = st->wait_raises;
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, cap));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "captured all-gather");
  EXPECT(st->dd_copies == copies + 2 && st->wait_launches == waits + 2,
         "rank %d: a captured all-gather took %llu copies and %llu waits", rank,
         (unsigned long long)(st->dd_copies - copies), (unsigned long long)(st->wait_launches - waits));
  /* it sends and receives: `ready` and `done` each raised by the wait that follows it */
  EXPECT(st->stream_writes == writes && st->wait_raises == raises + 2,
         "rank %d: a captured all-gather took %llu stream writes and %llu raising waits", rank,
         (unsigned long long)(st->stream_writes - writes), (unsigned long long)(st->wait_raises - raises));
  writes = st->stream_writes;
  raises = st->wait_raises;
  EXPECT(live_mappings(st) == maps + 1, "rank %d: %d mappings for the graph", rank, live_mappings(st) - maps);
  ce_fresh(&b); /* in the same graph: only the root maps its peer's output */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, 0, comm, cap));
  ce_expect(&b, b.recv, CE_N, 0, 0, "captured broadcast");
  EXPECT(live_mappings(st) == maps + 1 + (rank == 0), "rank %d: %d mappings for the graph", rank,
         live_mappings(st) - maps);
  /* one way: the root raises `done`, the other rank `ready`, each with a stream write */
  EXPECT(st->stream_writes == writes + 1 && st->wait_raises == raises,
         "rank %d: a captured broadcast took %llu stream writes and %llu raising waits", rank,
         (unsigned long long)(st->stream_writes - writes), (unsigned long long)(st->wait_raises - raises));
  ce_fresh(&b); /* a reduction: each rank maps its peer's output, and combines in the graph */
  const uint64_t combines = st->combine_launches;
  EXPECT_OK(ncclReduceScatter(b.send, b.recv, CE_N, ncclFloat, ncclSum, comm, cap));
  ce_expect_sum(&b, b.recv, CE_N, (size_t)rank * CE_N, "captured reduce-scatter");
  EXPECT(live_mappings(st) == maps + 2 + (rank == 0) && st->combine_launches == combines + 1,
         "rank %d: %d mappings for the graph, %llu combines", rank, live_mappings(st) - maps,
         (unsigned long long)(st->combine_launches - combines));
  EXPECT(mock_graph_destroy() == 1, "rank %d: the graph held more than the communicator's token", rank);
  ce_fresh(&b); /* below the threshold: the kernels; the launch frees what the graph held */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, 100, ncclFloat, 0, comm, NULL));
  EXPECT(live_mappings(st) == maps, "rank %d: %d mappings outlived the graph", rank,
         live_mappings(st) - maps);
  const int launches = st->launches;
  const uint64_t copies_now = st->dd_copies;
  ce_fresh(&b); /* rank 0 captures, rank 1 runs eagerly: the kernels (which move nothing here) */
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, rank == 0 ? cap : NULL));
  EXPECT(st->dd_copies == copies_now && st->launches == launches + 1,
         "rank %d: a half-captured all-gather took %llu copies, %d launches", rank,
         (unsigned long long)(st->dd_copies - copies_now), st->launches - launches);
  EXPECT(test_file_lines(log_path, "describes a different step") == 0, "rank %d: warned", rank);
  mock_graph_destroy();
  ce_fresh(&b); /* and the path still pairs the ranks' next step */
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather after");
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
  EXPECT_OK(ncclCommDestroy(comm));
}

/* One process, a thread per rank of a communicator from ncclCommInitAll: each rank writes straight into the
 * other's output at the address that rank gave, with nothing exported or mapped. */
typedef struct {
  ncclComm_t comm;
  int rank;
  void *s, *r; /* ncclMemAlloc'd on the rank's device (by the main thread: the stand-in's allocations are
                * not thread-safe) */
} ce_local_t;

static void *ce_local_thread(void *arg) {
  const ce_local_t *t = arg;
  ce_bufs_t b = {(float *)t->s + 1, (float *)t->r + 1, t->rank, 0};
  b.seed = 123;
  const int peer = 1 - t->rank;
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, t->comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather, one process");
  for (int root = 0; root < 2; root++) {
    ce_fresh(&b);
    EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, root, t->comm, NULL));
    ce_expect(&b, b.recv, CE_N, root, 0, "broadcast, one process");
  }
  ce_fresh(&b);
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b.send, CE_N - 1, ncclFloat, peer, t->comm, NULL));
  EXPECT_OK(ncclRecv(b.recv, CE_N - 1, ncclFloat, peer, t->comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  ce_expect(&b, b.recv, CE_N - 1, peer, 0, "send/receive, one process");
  ce_fresh(&b);
  EXPECT_OK(ncclReduceScatter(b.send, b.recv, CE_N, ncclFloat, ncclSum, t->comm, NULL));
  ce_expect_sum(&b, b.recv, CE_N, (size_t)t->rank * CE_N, "reduce-scatter, one process");
  ce_fresh(&b); /* captured by both ranks (ce_local_proc checks that nothing was mapped for the graph) */
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, t->comm, (cudaStream_t)MOCK_CUDA_CAPTURING));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "captured, one process");
  return NULL;
}

/* Gives each rank of comms its buffers (ncclMemAlloc'd on its device by this thread: the stand-in's
 * allocations are not thread-safe), then runs `thread` for both ranks at once and joins them. */
static void local_pair_run(ncclComm_t comms[2], ce_local_t t[2], void *(*thread)(void *)) {
  for (int i = 0; i < 2; i++) {
    t[i] = (ce_local_t){comms[i], i, NULL, NULL};
    gpu_scope_t scope; /* ncclMemAlloc allocates on the current device */
    EXPECT_OK(gpu_enter(i, &scope));
    EXPECT_OK(ncclMemAlloc(&t[i].s, (2 * CE_N + 1) * sizeof(float)));
    EXPECT_OK(ncclMemAlloc(&t[i].r, (2 * CE_N + 1) * sizeof(float)));
    gpu_leave(&scope);
  }
  pthread_t th[2];
  for (int i = 0; i < 2; i++) EXPECT(pthread_create(&th[i], NULL, thread, &t[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
}

/* Destroys both communicators and frees the buffers local_pair_run gave them. */
static void local_pair_close(ncclComm_t comms[2], ce_local_t t[2]) {
  for (int i = 0; i < 2; i++) {
    EXPECT_OK(ncclCommDestroy(comms[i]));
    EXPECT_OK(ncclMemFree(t[i].s));
    EXPECT_OK(ncclMemFree(t[i].r));
  }
}

static void ce_local_proc(int rank, int nranks, void *arg) {
  char log_path[128];
  rank_log(arg, rank, log_path, sizeof log_path);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING,ALLOC", 1);
  param_reload();
  log_init();
  ncclComm_t comms[2];
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL));
  EXPECT(test_file_lines(log_path, "copy engines move steps whose every transfer") == 2,
         "the communicators of one process have no copy-engine path");
  const uint64_t copies = mock_stats()->dd_copies;
  ce_local_t t[2];
  local_pair_run(comms, t, ce_local_thread);
  EXPECT(mock_stats()->dd_copies >= copies + 6, "%llu copies in one process",
         (unsigned long long)(mock_stats()->dd_copies - copies));
  EXPECT(test_file_lines(log_path, "memory for the copy engines") == 0 &&
             test_file_lines(log_path, "memory for a captured copy") == 0,
         "a rank mapped its peer's memory in one process");
  /* the capture's graph held both communicators, one token each */
  EXPECT(mock_graph_destroy() == 2, "the graph held other than one token per communicator");
  local_pair_close(comms, t);
}

/* BRAID_CE_MIN_BYTES=0 on one rank only: both ranks go without the path, and say so. */
static void ce_off_rank(int rank, int nranks, void *arg) {
  if (rank == 1) setenv("BRAID_CE_MIN_BYTES", "0", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "no copy-engine path") == 1 &&
             test_file_lines(log_path, "copy engines move steps") == 0,
         "rank %d: the path is not off on both ranks", rank);
  void *buf = (void *)(uintptr_t)0x10000000, *out = (void *)(uintptr_t)0x20000000;
  EXPECT_OK(ncclBroadcast(buf, out, 1u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(test_file_lines(log_path, "by the copy engines") == 0, "rank %d: a copy-engine step", rank);
  EXPECT_OK(ncclCommDestroy(comm));
}

/* BRAID_CE_REDUCE_MIN_BYTES=0 on one rank only: reductions leave the copy engines on both ranks, while the
 * other steps still take them: the reduce-scatter goes to the kernels (which move nothing here), the reduce
 * is pulled (BRAID_CE_PULL_MIN_BYTES), in one chunk. */
static void ce_reduce_off_rank(int rank, int nranks, void *arg) {
  if (rank == 1) setenv("BRAID_CE_REDUCE_MIN_BYTES", "0", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "out-of-place reductions from 0 bytes") == 1,
         "rank %d: reductions still take the copy engines", rank);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 91, &s, &r);
  const ce_counts_t before = ce_counts();
  ce_fresh(&b);
  EXPECT_OK(ncclReduce(b.send, b.recv, CE_N, ncclFloat, ncclSum, 0, comm, NULL));
  if (rank == 0) ce_expect_sum(&b, b.recv, CE_N, 0, "reduce pulled");
  ce_fresh(&b);
  EXPECT_OK(ncclReduceScatter(b.send, b.recv, CE_N, ncclFloat, ncclSum, comm, NULL));
  ce_expect_counts(rank, &before, rank == 0, rank == 0, 1, "reductions with the copy engines off for them");
  ce_close(&b, s, r, comm, 1, "broadcast beside reductions left to the kernels");
}

/* BRAID_CE_PULL_MIN_BYTES=0 on one rank: a reduce in place stays on the kernels on both (which move nothing
 * here); below BRAID_CE_REDUCE_MIN_BYTES (mode 2): an out-of-place reduce is pulled too (one chunk, not the
 * copy engines' several). */
static void ce_pull(int rank, int nranks, const shared_t *sh, int mode) {
  if (mode == 0 && rank == 1) setenv("BRAID_CE_PULL_MIN_BYTES", "0", 1);
  if (mode == 2) setenv("BRAID_CE_REDUCE_MIN_BYTES", "1073741824", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(sh, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path,
                         mode == 0 ? "where it lies from 0 bytes" : "where it lies from 1024 bytes") == 1,
         "rank %d: the log does not give the agreed BRAID_CE_PULL_MIN_BYTES", rank);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 57, &s, &r);
  const ce_counts_t before = ce_counts();
  ce_fresh(&b);
  /* mode 0 in place (the root's output holds its input), mode 2 out of place */
  float *in = b.send, *out = b.recv;
  if (mode == 0) {
    in = out = rank == 0 ? b.recv : b.send;
    if (rank == 0) memcpy(b.recv, b.send, CE_N * sizeof(float));
  }
  EXPECT_OK(ncclReduce(in, out, CE_N, ncclFloat, ncclSum, 0, comm, NULL));
  if (mode == 2 && rank == 0) ce_expect_sum(&b, b.recv, CE_N, 0, "reduce pulled out of place");
  const int pulled = mode == 2 && rank == 0;
  ce_expect_counts(rank, &before, pulled, pulled, mode == 0,
                   mode == 0 ? "no pulls" : "a reduce pulled out of place");
  ce_close(&b, s, r, comm, 1, "broadcast after a reduce");
}

static void ce_pull_off_rank(int rank, int nranks, void *arg) {
  ce_pull(rank, nranks, arg, 0);
}

static void ce_pull_all_rank(int rank, int nranks, void *arg) {
  ce_pull(rank, nranks, arg, 2);
}

/* ---- Steps that only copy, pushed by one kernel (core/ce.h, STEP_CE_PUSH) ----
 * With BRAID_CE_PUSH_MIN_BYTES below BRAID_CE_MIN_BYTES, the copy-engine path's steps that only copy go by
 * the push kernel, which the stand-in runs at once: its handshake, then its copies (the sends straight into
 * the peer's outputs, mapped here, and the local copies). A rank that only receives and copies nothing
 * raises `ready` with a stream write and waits in a wait kernel. Every call checked here moves its data that
 * way: the other kernels move nothing. */

/* The stand-in's counts of what a pushed step enqueues. */
typedef struct {
  uint64_t pushes, copies, writes, waits, dd;
} push_counts_t;

static push_counts_t push_counts(void) {
  const mock_cuda_stats_t *st = mock_stats();
  return (push_counts_t){st->push_launches, st->push_copies, st->stream_writes, st->wait_launches,
                         st->dd_copies};
}

/* Expects the calls since `before` to have enqueued `pushes` push kernels making `copies` copies, `writes`
 * stream writes, `waits` wait kernels and `dd` copies by the copy engines. */
static void push_expect(int rank, const push_counts_t *before, uint64_t pushes, uint64_t copies,
                        uint64_t writes, uint64_t waits, uint64_t dd, const char *what) {
  const push_counts_t n = push_counts();
  if (n.pushes - before->pushes != pushes || n.copies - before->copies != copies ||
      n.writes - before->writes != writes || n.waits - before->waits != waits || n.dd - before->dd != dd)
    test_fail(__FILE__, __LINE__,
              "rank %d: %s: %llu pushes of %llu copies, %llu stream writes, %llu waits, %llu engine copies",
              rank, what, (unsigned long long)(n.pushes - before->pushes),
              (unsigned long long)(n.copies - before->copies),
              (unsigned long long)(n.writes - before->writes), (unsigned long long)(n.waits - before->waits),
              (unsigned long long)(n.dd - before->dd));
}

static void push_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "pushed by one kernel from 1024 bytes a transfer") == 1,
         "rank %d: the log does not give the agreed BRAID_CE_PUSH_MIN_BYTES", rank);
  const int peer = 1 - rank;
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 31, &s, &r);
  push_counts_t c = push_counts();
  for (int root = 0; root < 2; root++) { /* the root pushes; the other rank writes `ready` and waits */
    ce_fresh(&b);
    EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, root, comm, NULL));
    ce_expect(&b, b.recv, CE_N, root, 0, "broadcast pushed");
    /* out of place, the root also copies its input into its output */
    push_expect(rank, &c, rank == root, rank == root ? 2 : 0, rank != root, rank != root, 0,
                "a broadcast pushed");
    c = push_counts();
  }
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather pushed");
  push_expect(rank, &c, 1, 2, 0, 0, 0, "an all-gather pushed"); /* the send and the local copy */
  c = push_counts();
  ce_fresh(&b); /* in place: nothing to copy locally */
  memcpy(b.recv + (size_t)rank * CE_N, b.send, CE_N * sizeof(float));
  EXPECT_OK(ncclAllGather(b.recv + (size_t)rank * CE_N, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather in place");
  push_expect(rank, &c, 1, 1, 0, 0, 0, "an all-gather in place pushed");
  c = push_counts();
  ce_fresh(&b); /* the root receives and copies its own block: a push kernel with a local copy only */
  EXPECT_OK(ncclGather(b.send, b.recv, CE_N, ncclFloat, 0, comm, NULL));
  if (rank == 0)
    for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "gather pushed");
  push_expect(rank, &c, 1, 1, 0, 0, 0, "a gather pushed");
  c = push_counts();
  ce_fresh(&b);
  EXPECT_OK(ncclAlltoAll(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++)
    ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, (size_t)rank * CE_N, "alltoall pushed");
  c = push_counts();
  /* A group of two sends each way, of different sizes, and nine copies to this rank itself: one kernel
   * takes the two sends and six copies, the other three follow it by the copy engines. */
  ce_fresh(&b);
  enum { SELF = 9, SELF_N = 1001 };
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b.send, CE_N, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclSend(b.send + CE_N, CE_N - 2 * SELF_N * SELF, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b.recv, CE_N, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b.recv + CE_N, CE_N - 2 * SELF_N * SELF, ncclFloat, peer, comm, NULL));
  float *self_out = b.recv + 2 * CE_N - SELF_N * SELF;
  for (int i = 0; i < SELF; i++) {
    EXPECT_OK(ncclSend(b.send + 2 * CE_N - SELF_N * (i + 1), SELF_N, ncclFloat, rank, comm, NULL));
    EXPECT_OK(ncclRecv(self_out + SELF_N * i, SELF_N, ncclFloat, rank, comm, NULL));
  }
  EXPECT_OK(ncclGroupEnd());
  ce_expect(&b, b.recv, 2 * CE_N - 2 * SELF_N * SELF, peer, 0, "send/receive pushed");
  for (int i = 0; i < SELF; i++)
    ce_expect(&b, self_out + SELF_N * i, SELF_N, rank, 2 * CE_N - SELF_N * (i + 1), "a copy to itself");
  push_expect(rank, &c, 1, DEV_PUSH_COPIES, 0, 0, 2 + SELF - DEV_PUSH_COPIES, "a group pushed");
  /* broadcast, all-gather, gather, alltoall, send: one INFO line each */
  EXPECT(test_file_lines(log_path, "pushed by one kernel: ") == 5, "rank %d: %d kinds logged as pushed", rank,
         test_file_lines(log_path, "pushed by one kernel: "));
  EXPECT(test_file_lines(log_path, "by the copy engines") == 0, "rank %d: a copy-engine step", rank);
  /* Captured by both ranks: the same kernel in the graph, and the graph keeps its mapping of the peer's
   * output. */
  const int maps = live_mappings(mock_stats());
  c = push_counts();
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, (cudaStream_t)MOCK_CUDA_CAPTURING));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "captured all-gather");
  push_expect(rank, &c, 1, 2, 0, 0, 0, "a captured all-gather pushed");
  EXPECT(live_mappings(mock_stats()) == maps + 1, "rank %d: %d mappings for the graph", rank,
         live_mappings(mock_stats()) - maps);
  EXPECT(mock_graph_destroy() == 1, "rank %d: the graph held more than the communicator's token", rank);
  ce_close(&b, s, r, comm, 0, "broadcast after pushes");
}

/* A push threshold 0 on one rank turns those pushes off on both, the other kind staying on: mode 0,
 * BRAID_CE_PUSH_MIN_BYTES on rank 1 (one-way steps: a broadcast goes to the kernels, which move nothing
 * here, an all-gather is still pushed); mode 1, BRAID_CE_PUSH_EXCHANGE_MIN_BYTES on rank 0 (the other way
 * round). The copy engines keep their steps. */
static void push_off(int rank, int nranks, const shared_t *sh, int mode) {
  if (mode == 0 && rank == 1) setenv("BRAID_CE_PUSH_MIN_BYTES", "0", 1);
  if (mode == 1 && rank == 0) setenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES", "0", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(sh, rank, nranks, log_path, sizeof log_path);
  const char *agreed = mode == 0 ? "from 0 bytes a transfer (BRAID_CE_PUSH_MIN_BYTES, 0: never), from 1024 "
                                 : "from 1024 bytes a transfer (BRAID_CE_PUSH_MIN_BYTES, 0: never), from 0 ";
  EXPECT(test_file_lines(log_path, agreed) == 1, "rank %d: the log does not give the agreed push thresholds",
         rank);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 41, &s, &r);
  push_counts_t c = push_counts();
  ce_fresh(&b); /* one way, root 0 */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N / 4, ncclFloat, 0, comm, NULL));
  if (mode == 1) ce_expect(&b, b.recv, CE_N / 4, 0, 0, "broadcast pushed");
  const int root_push = mode == 1 && rank == 0, other = mode == 1 && rank == 1;
  push_expect(rank, &c, root_push, root_push ? 2 : 0, other, other, 0, "a broadcast");
  c = push_counts();
  ce_fresh(&b); /* an exchange */
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N / 4, ncclFloat, comm, NULL));
  if (mode == 0)
    for (int p = 0; p < 2; p++)
      ce_expect(&b, b.recv + (size_t)p * (CE_N / 4), CE_N / 4, p, 0, "all-gather pushed");
  push_expect(rank, &c, mode == 0, mode == 0 ? 2 : 0, 0, 0, 0, "an all-gather");
  ce_fresh(&b); /* at the threshold: the copy engines */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, 2 * CE_N, ncclFloat, 1, comm, NULL));
  ce_expect(&b, b.recv, 2 * CE_N, 1, 0, "broadcast by the copy engines");
  EXPECT(test_file_lines(log_path, "by the copy engines") == 1, "rank %d: no copy-engine step", rank);
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void push_off_rank(int rank, int nranks, void *arg) {
  push_off(rank, nranks, arg, 0);
}

static void push_exchange_off_rank(int rank, int nranks, void *arg) {
  push_off(rank, nranks, arg, 1);
}

/* Ranks of one process (ncclCommInitAll, a thread per rank, their mailboxes in this process's memory) take
 * BRAID_CE_PUSH_EXCHANGE_MIN_BYTES for exchanges as ranks of separate processes do: with
 * BRAID_CE_PUSH_MIN_BYTES above CE_N floats and the exchange threshold at 1 KiB, an all-gather of CE_N floats
 * a rank is pushed by both ranks, a broadcast of 2 * CE_N - 1 floats by its root. */
static void *push_local_thread(void *arg) {
  const ce_local_t *t = arg;
  ce_bufs_t b = {(float *)t->s + 1, (float *)t->r + 1, t->rank, 200};
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, t->comm, NULL));
  for (int p = 0; p < 2; p++)
    ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather pushed, one process");
  ce_fresh(&b);
  EXPECT_OK(ncclBroadcast(b.send, b.recv, 2 * CE_N - 1, ncclFloat, 1, t->comm, NULL));
  ce_expect(&b, b.recv, 2 * CE_N - 1, 1, 0, "broadcast pushed, one process");
  return NULL;
}

static void push_local_proc(int rank, int nranks, void *arg) {
  setenv("BRAID_CE_PUSH_MIN_BYTES", "400100", 1);
  param_reload();
  ncclComm_t comms[2];
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL));
  const push_counts_t c = push_counts();
  ce_local_t t[2];
  local_pair_run(comms, t, push_local_thread);
  /* each rank pushes the all-gather's send and local copy; the broadcast's root pushes its send and its
   * local copy, the other rank writes `ready` and waits */
  push_expect(rank, &c, 3, 6, 1, 1, 0, "an all-gather and a broadcast in one process");
  local_pair_close(comms, t);
  setenv("BRAID_CE_PUSH_MIN_BYTES", "1024", 1);
}

/* The step-message mailbox (core/ce.c): of a group with more candidate steps than half a mailbox, the first
 * CE_OFFERS_MAX (32) take the copy engines and the rest the kernels (both ranks count alike), and the path
 * still pairs the next call; a peer late by more than the receive's spin is waited for (rank 1 sleeps before
 * its calls). */
static void mbox_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 61, &s, &r);
  uint64_t copies = mock_stats()->dd_copies;
  ce_fresh(&b);
  EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, 0, comm, NULL));
  ce_expect(&b, b.recv, CE_N, 0, 0, "one broadcast");
  const uint64_t one = mock_stats()->dd_copies - copies; /* the root's send and local copy */
  EXPECT(rank != 0 || one == 2, "rank 0: one broadcast made %llu engine copies", (unsigned long long)one);
  copies = mock_stats()->dd_copies;
  ce_fresh(&b);
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < 33; i++) EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(mock_stats()->dd_copies - copies == 32 * one,
         "rank %d: a group of 33 large broadcasts made %llu engine copies, not %llu", rank,
         (unsigned long long)(mock_stats()->dd_copies - copies), (unsigned long long)(32 * one));
  for (int i = 0; i < 3; i++) {
    if (rank == 1) usleep(100000);
    ce_fresh(&b);
    EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
    for (int p = 0; p < 2; p++)
      ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather, a peer late");
  }
  ce_close(&b, s, r, comm, 0, "broadcast after the mailbox cases");
}

/* A peer that never sends its step message: the receive gives up after BRAID_TIMEOUT_S (1 s here) with an
 * error that says what it waited for, instead of hanging. */
static void mbox_timeout_rank(int rank, int nranks, void *arg) {
  setenv("BRAID_TIMEOUT_S", "1", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 71, &s, &r);
  if (rank == 0) {
    ce_fresh(&b);
    const ncclResult_t res = ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL);
    EXPECT(res == ncclRemoteError && strstr(ncclGetLastError(comm), "step message") != NULL,
           "rank 0: a step message that never came: %d (%s)", (int)res, ncclGetLastError(comm));
  } else {
    sleep(3);
  }
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
  unsetenv("BRAID_TIMEOUT_S");
}

static void *mbox_abort_later(void *arg) {
  const aborter_t *a = arg;
  usleep(300000);
  EXPECT_OK(ncclCommAbort(a->comm));
  return NULL;
}

/* ncclCommAbort from another thread while a rank waits for its peer's step message (the peer never calls):
 * the wait ends on the abort flag, long before BRAID_TIMEOUT_S (its default, 1800 s), and says so. */
static void mbox_abort_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 81, &s, &r);
  if (rank == 0) {
    pthread_t aborter;
    aborter_t a = {comm, log_path};
    EXPECT(pthread_create(&aborter, NULL, mbox_abort_later, &a) == 0);
    ce_fresh(&b);
    const ncclResult_t res = ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL);
    pthread_join(aborter, NULL);
    EXPECT(res != ncclSuccess, "rank 0: an all-gather whose peer never came succeeded");
    EXPECT(test_file_lines(log_path, "aborted while waiting for rank 1's step message"),
           "rank 0: the log does not say that the abort ended the wait for the step message");
  } else {
    sleep(2);
    EXPECT_OK(ncclCommAbort(comm));
  }
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
}

/* With ncclMemAlloc's memory from cuMem (exported as a file descriptor), then from cuMemAlloc (legacy IPC).
 */
static void copy_engines(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_CE_MIN_BYTES", "1024", 1);
  setenv("BRAID_CE_REDUCE_MIN_BYTES", "1024", 1);
  setenv("BRAID_CE_PULL_MIN_BYTES", "1024", 1);
  setenv("BRAID_AR_SPLIT_BYTES", "1024", 1);
  setenv("BRAID_CE_CHUNK_BYTES", "1", 1);   /* the least there is: 64 KiB, five chunks of CE_N floats */
  setenv("NCCL_ALGO", "allreduce:ring", 1); /* not one-shot, which two ranks' all-reduce is up to 16 MiB */
  unsetenv("MOCK_CUDA_STUCK");
  run_with_logs(ce_rank, 60);
  run_with_logs(ce_capture_rank, 60);
  run_one_process(ce_local_proc, 60);
  setenv("MOCK_CUDA_NO_VMM", "1", 1);
  run_with_logs(ce_rank, 60);
  run_with_logs(ce_capture_rank, 60);
  run_one_process(ce_local_proc, 60);
  run_with_logs(ce_off_rank, 60);
  run_with_logs(ce_reduce_off_rank, 60);
  run_with_logs(ce_pull_off_rank, 60);
  run_with_logs(ce_pull_all_rank, 60);
  run_with_logs(mbox_rank, 60);
  run_with_logs(mbox_timeout_rank, 60);
  run_with_logs(mbox_abort_rank, 60);
  setenv("BRAID_CE_CHUNK_BYTES", "65541", 1); /* not a multiple of 64 KiB: rounded up, chunks still whole */
  run_with_logs(ce_rank, 60);
  unsetenv("BRAID_CE_MIN_BYTES");
  unsetenv("BRAID_CE_REDUCE_MIN_BYTES");
  unsetenv("BRAID_CE_PULL_MIN_BYTES");
  unsetenv("BRAID_AR_SPLIT_BYTES");
  unsetenv("BRAID_CE_CHUNK_BYTES");
  unsetenv("NCCL_ALGO");
  unsetenv("MOCK_CUDA_NO_VMM");
}

/* Pushes below the copy engines' threshold (2 * CE_N floats: every case's transfers are below it), with
 * ncclMemAlloc's cuMem memory, then with cuMemAlloc's (legacy IPC). */
static void pushes(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_CE_MIN_BYTES", "800024", 1);
  setenv("BRAID_CE_PUSH_MIN_BYTES", "1024", 1);
  setenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES", "1024", 1);
  setenv("BRAID_CE_REDUCE_MIN_BYTES", "0", 1);
  unsetenv("MOCK_CUDA_STUCK");
  run_with_logs(push_rank, 60);
  run_with_logs(push_off_rank, 60);
  run_with_logs(push_exchange_off_rank, 60);
  run_one_process(push_local_proc, 60);
  setenv("MOCK_CUDA_NO_VMM", "1", 1);
  run_with_logs(push_rank, 60);
  unsetenv("MOCK_CUDA_NO_VMM");
  unsetenv("BRAID_CE_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES");
  unsetenv("BRAID_CE_REDUCE_MIN_BYTES");
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  test_filter(argc - 1, argv + 1);
  /* the rank processes share the stand-in's device 0: keep each rank's own kernels (the shared-GPU path,
   * where rank 0 moves all, is test_shared_path's) */
  setenv("BRAID_SHARED_GPU_LEADER", "0", 1);
  TEST(copy_engines, 90);
  TEST(pushes, 90);
  return test_summary();
}

#else

int main(void) {
  printf("built without CUDA's headers: no stand-in driver, nothing to test\n");
  return 0;
}

#endif
