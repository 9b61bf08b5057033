/*
 * The work queue under CUDA graphs and large groups, and the lifetime of graphs against their communicator,
 * one process per GPU:
 *
 *   capture_modes     in each capture mode (global, thread-local, relaxed), one graph holding an all-reduce,
 * an in-place all-to-all (its scratch belongs to the graph), a group of send/recv exchanges and a group of
 * 200 all-reduces of 1..200 elements (a transfer list too long for one launch), replayed 5 times, each replay
 * checked; big_groups_eager  eager groups of 200 and of 1,000 all-reduces of different counts, and of 300
 * send/recv exchanges, each run twice and checked; queue_full        the smallest work queue
 * (NCCL_WORK_FIFO_BYTES=65536) and 20,000 all-reduces of one element issued without waiting for any, each
 * into its own slot of one output buffer; every slot, and the poison between slots, checked at the end;
 *   graph_lifetime    (a) a graph destroyed while the communicator lives: eager calls and another graph go
 * on, a new capture works, and finalize and destroy succeed once every graph is gone; (b) ncclCommFinalize
 * and ncclCommDestroy while a graph and its executable graph hold captured work succeed, and the graph
 * replayed after the destroy completes without an error on its stream; (c) ncclCommAbort while an
 * executable graph is kept; the graph replayed after the abort
 *                     completes without an error on its stream, and the process's CUDA context still works.
 *
 * Checked calls have their outputs poisoned first and are compared with references computed on the host
 * (cuda_case.h); a watchdog bounds every stage. capture_modes and graph_lifetime are about capture and skip
 * in
 * --host mode; the other two run there with fewer calls (graph_case.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_check.h"
#include "cuda_case.h"
#include "data.h"
#include "graph_case.h"
#include "harness.h"

#define POOL    ((size_t)64 << 20)
#define STAGE_S 60

/* ---- capture_modes ---- */

enum { N_SMALL_ARS = 200, N_REPLAYS = 5 };

typedef struct {
  enum cudaStreamCaptureMode mode;
  const char *name; /* for messages, as a case's mode */
} capture_mode_t;

static const capture_mode_t capture_modes_list[] = {
    {cudaStreamCaptureModeGlobal, "procs, captured in global mode"},
    {cudaStreamCaptureModeThreadLocal, "procs, captured in thread-local mode"},
    {cudaStreamCaptureModeRelaxed, "procs, captured in relaxed mode"},
};

/* The graph's calls, in the order they are captured. */
typedef struct {
  cuda_case_t ar, a2a, sr[2], many[N_SMALL_ARS];
  graph_calls_t calls[4];
} modes_t;

static void modes_issue(void *arg) {
  modes_t *m = arg;
  for (int i = 0; i < 4; i++) graph_calls_issue(&m->calls[i]);
}

static void modes_prepare(modes_t *m, ncclComm_t comm, cuda_rank_t *r, uint64_t seed, const char *mode) {
  coll_case_t ar = graph_coll(K_ALLREDUCE, ncclFloat32, 4099, seed),
              a2a = graph_coll(K_ALLTOALL, ncclBfloat16, 1031, seed + 1),
              sr[2] = {graph_coll(K_SENDRECV, ncclBfloat16, 10007, seed + 2),
                       graph_coll(K_SENDRECV, ncclFloat32, 1, seed + 3)};
  a2a.inplace = 1;
  cuda_case_prepare(&m->ar, comm, r, &ar, mode);
  cuda_case_prepare(&m->a2a, comm, r, &a2a, mode);
  for (int i = 0; i < 2; i++) cuda_case_prepare(&m->sr[i], comm, r, &sr[i], mode);
  for (int i = 0; i < N_SMALL_ARS; i++) {
    coll_case_t c = graph_coll(K_ALLREDUCE, i % 2 ? ncclBfloat16 : ncclFloat32, (size_t)i + 1, seed + 4 + i);
    cuda_case_prepare(&m->many[i], comm, r, &c, mode);
  }
  m->calls[0] = (graph_calls_t){&m->ar, 1, 0};
  m->calls[1] = (graph_calls_t){&m->a2a, 1, 0};
  m->calls[2] = (graph_calls_t){m->sr, 2, 1};
  m->calls[3] = (graph_calls_t){m->many, N_SMALL_ARS, 1};
}

static void modes_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  (void)arg;
  static modes_t m;
  cuda_rank_t r, *rp = &r;
  cuda_rank_open(&r, rank, POOL, POOL, NULL);
  ncclComm_t comm = graph_init_rank(rank, n, id);
  for (size_t mi = 0; mi < sizeof capture_modes_list / sizeof *capture_modes_list; mi++) {
    const capture_mode_t *cm = &capture_modes_list[mi];
    modes_prepare(&m, comm, &r, 100 + 1000 * mi, cm->name);
    graph_t g;
    char what[160];
    snprintf(what, sizeof what, "[%s] the capture of 204 calls", cm->name);
    cuda_watch(what, STAGE_S);
    graph_capture(&g, 1, &rp, cm->mode, modes_issue, &m);
    snprintf(what, sizeof what, "[%s] %d replays, each checked", cm->name, N_REPLAYS);
    cuda_watch(what, STAGE_S);
    for (int rep = 0; rep < N_REPLAYS; rep++) {
      for (int i = 0; i < 4; i++) graph_calls_rearm(&m.calls[i]);
      graph_replay(&g);
      for (int i = 0; i < 4; i++) graph_calls_check(&m.calls[i]);
    }
    cuda_unwatch();
    graph_destroy(&g);
    cuda_rank_reset(&r);
  }
  graph_destroy_comm(comm);
  cuda_rank_close(&r);
}

static void capture_modes(void) {
  if (graph_host_skip("capture_modes")) return;
  EXPECT(cuda_run_ranks(cuda_nranks, 200, modes_rank, NULL) == 0, "a rank failed");
}

/* ---- big_groups_eager ---- */

enum { MAX_GROUP = 1000 };

/* A group of `count` calls of `kind`, of counts spread over 1..span (all different when count <= span), each
 * run twice and checked. */
static void big_group(ncclComm_t comm, cuda_rank_t *r, kind_t kind, int count, size_t span, uint64_t seed) {
  static cuda_case_t k[MAX_GROUP];
  char mode[96], what[160];
  snprintf(mode, sizeof mode, "procs, an eager group of %d", count);
  for (int i = 0; i < count; i++) {
    /* 37 is prime to every span used here, so i -> 37 i mod span is one-to-one. */
    size_t elems = 1 + ((size_t)i * 37) % span;
    coll_case_t c = graph_coll(kind, i % 2 ? ncclBfloat16 : ncclFloat32, elems, seed + i);
    cuda_case_prepare(&k[i], comm, r, &c, mode);
  }
  graph_calls_t calls = {k, count, 1};
  snprintf(what, sizeof what, "an eager group of %d %s calls, twice", count, coll_kind_name(kind));
  graph_calls_run(&calls, 2, what, STAGE_S);
  cuda_rank_reset(r);
}

static void big_groups_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  (void)arg;
  cuda_rank_t r;
  cuda_rank_open(&r, rank, POOL, POOL, NULL);
  ncclComm_t comm = graph_init_rank(rank, n, id);
  big_group(comm, &r, K_ALLREDUCE, 200, 200, 2000);
  big_group(comm, &r, K_ALLREDUCE, MAX_GROUP, 1000, 3000);
  big_group(comm, &r, K_SENDRECV, 300, 3001, 5000);
  graph_destroy_comm(comm);
  cuda_rank_close(&r);
}

static void big_groups_eager(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 200, big_groups_rank, NULL) == 0, "a rank failed");
}

/* ---- queue_full ---- */

enum { QF_CALLS = 20000, QF_STRIDE = 4 /* floats per output slot: one written, three left poisoned */ };
#define QF_POISON 0x7b
#define QF_SEED   77

/* Every output slot: element 0 the sum over the ranks, elements 1..3 untouched. */
static void queue_full_verify(const float *got, int calls, int n, int rank) {
  unsigned char poison[(QF_STRIDE - 1) * sizeof(float)];
  memset(poison, QF_POISON, sizeof poison);
  for (int i = 0; i < calls; i++) {
    double want = data_expect(QF_SEED, n, (size_t)i, ncclFloat32, ncclSum, 1);
    double v = data_get(got, (size_t)i * QF_STRIDE, ncclFloat32);
    EXPECT(data_match(v, want, ncclFloat32, ncclSum, n), "rank %d: all-reduce %d of %d wrote %g, expected %g",
           rank, i, calls, v, want);
    EXPECT(memcmp(got + (size_t)i * QF_STRIDE + 1, poison, sizeof poison) == 0,
           "rank %d: bytes after the output of all-reduce %d of %d were written", rank, i, calls);
  }
}

static void queue_full_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  (void)arg;
  /* Read when the communicator is made: set in this rank's process, before init. */
  setenv("NCCL_WORK_FIFO_BYTES", "65536", 1);
  cuda_rank_t r;
  cuda_rank_open(&r, rank, POOL, POOL, NULL);
  ncclComm_t comm = graph_init_rank(rank, n, id);
  int calls = graph_scaled(QF_CALLS);
  size_t out_bytes = (size_t)calls * QF_STRIDE * sizeof(float);
  float *in = cuda_dalloc(&r, (size_t)calls * sizeof(float)), *out = cuda_dalloc(&r, out_bytes);
  float *img = cuda_halloc(&r, (size_t)calls * sizeof(float)), *got = cuda_halloc(&r, out_bytes);
  data_fill(img, (size_t)calls, QF_SEED, rank, ncclFloat32, ncclSum);
  cuda_upload(&r, in, img, (size_t)calls * sizeof(float));
  cuda_fill(&r, out, QF_POISON, out_bytes);
  char what[128];
  snprintf(what, sizeof what, "%d all-reduces of one element with nothing waited for, a 64 KiB work queue",
           calls);
  cuda_watch(what, 120);
  double t0 = graph_now();
  for (int i = 0; i < calls; i++)
    NCCL_OK(ncclAllReduce(in + i, out + (size_t)i * QF_STRIDE, 1, ncclFloat32, ncclSum, comm, r.stream), what,
            comm);
  double issued = graph_now() - t0;
  cuda_sync(r.stream, what);
  double done = graph_now() - t0;
  cuda_unwatch();
  cuda_download(&r, got, out, out_bytes);
  queue_full_verify(got, calls, n, rank);
  if (rank == 0)
    printf("queue_full: rank 0: %d all-reduces issued in %.2f s, all complete after %.2f s, work queue 65536 "
           "bytes (NCCL_WORK_FIFO_BYTES)\n",
           calls, issued, done);
  graph_destroy_comm(comm);
  cuda_rank_close(&r);
}

static void queue_full(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 200, queue_full_rank, NULL) == 0, "a rank failed");
}

/* ---- graph_lifetime ---- */

enum { LIFE_A, LIFE_B, LIFE_C };

typedef struct {
  int part;
  int fds[8][2]; /* fds[r]: the pipe rank r reads its barrier bytes from */
} life_arg_t;

/* Every rank writes a byte to each other rank and reads one from each: no rank leaves before all arrived. */
static void life_barrier(const life_arg_t *a, int rank, int n) {
  char b = 1;
  for (int j = 0; j < n; j++)
    if (j != rank) EXPECT(write(a->fds[j][1], &b, 1) == 1, "barrier: pipe write");
  for (int j = 1; j < n; j++) EXPECT(read(a->fds[rank][0], &b, 1) == 1, "barrier: pipe read");
}

/* A rank's communicator, stream and calls: a and b are captured, e is eager. */
typedef struct {
  cuda_rank_t r, *rp;
  ncclComm_t comm;
  cuda_case_t ka, kb, ke;
  graph_calls_t a, b, e;
} life_t;

static void life_open(life_t *l, int rank, int n, const ncclUniqueId *id) {
  cuda_rank_open(&l->r, rank, POOL, POOL, NULL);
  l->rp = &l->r;
  l->comm = graph_init_rank(rank, n, id);
  coll_case_t ca = graph_coll(K_ALLREDUCE, ncclBfloat16, 4099, 51),
              cb = graph_coll(K_ALLGATHER, ncclFloat32, 1031, 52),
              ce = graph_coll(K_ALLREDUCE, ncclFloat32, 65539, 53);
  cuda_case_prepare(&l->ka, l->comm, &l->r, &ca, "procs, captured");
  cuda_case_prepare(&l->kb, l->comm, &l->r, &cb, "procs, captured");
  cuda_case_prepare(&l->ke, l->comm, &l->r, &ce, "procs, eager");
  l->a = (graph_calls_t){&l->ka, 1, 0};
  l->b = (graph_calls_t){&l->kb, 1, 0};
  l->e = (graph_calls_t){&l->ke, 1, 0};
}

static void capture(life_t *l, graph_t *g, graph_calls_t *calls) {
  graph_capture(g, 1, &l->rp, cudaStreamCaptureModeGlobal, graph_calls_issue, calls);
}

/* Poisons the graph's outputs, replays it and checks them. */
static void replay_checked(graph_t *g, const graph_calls_t *calls) {
  graph_calls_rearm(calls);
  graph_replay(g);
  graph_calls_check(calls);
}

static void life_part_a(life_t *l) {
  graph_t ga, gb, gc;
  cuda_watch("(a) two graphs, one destroyed, eager calls and the other graph after it", STAGE_S);
  capture(l, &ga, &l->a);
  capture(l, &gb, &l->b);
  for (int i = 0; i < 2; i++) {
    replay_checked(&ga, &l->a);
    replay_checked(&gb, &l->b);
  }
  graph_destroy(&ga);
  graph_calls_run(&l->e, 3, "(a) eager all-reduces after a graph was destroyed", STAGE_S);
  cuda_watch("(a) the other graph, and a new capture, after a graph was destroyed", STAGE_S);
  replay_checked(&gb, &l->b);
  capture(l, &gc, &l->a);
  replay_checked(&gc, &l->a);
  replay_checked(&gb, &l->b);
  graph_destroy(&gb);
  graph_destroy(&gc);
  cuda_watch("(a) ncclCommFinalize and ncclCommDestroy once every graph is destroyed", STAGE_S);
  NCCL_OK(ncclCommFinalize(l->comm), "(a) finalize after every graph was destroyed", l->comm);
  NCCL_OK(ncclCommDestroy(l->comm), "(a) destroy after every graph was destroyed", NULL);
  cuda_unwatch();
}

/* Finalize and destroy while graphs hold captured work succeed, as NCCL's do (PyTorch's shutdown needs it);
 * the graph replayed after the destroy does nothing harmful: its stream completes without an error and the
 * context still works. */
static void life_part_b(life_t *l, const life_arg_t *a, int rank, int n) {
  graph_t g;
  cuda_watch("(b) finalize and destroy while a graph holds the communicator", STAGE_S);
  capture(l, &g, &l->a);
  replay_checked(&g, &l->a);
  NCCL_OK(ncclCommFinalize(l->comm), "(b) finalize while a graph and its executable graph are kept", l->comm);
  NCCL_OK(ncclCommDestroy(l->comm), "(b) destroy while a graph and its executable graph are kept", NULL);
  /* no rank replays before every rank has destroyed its communicator */
  life_barrier(a, rank, n);
  cuda_watch("(b) the graph replayed after ncclCommDestroy: its stream must complete", 20);
  graph_replay(&g);
  CUDA_OK(cudaStreamSynchronize(l->r.stream));
  graph_destroy(&g);
  cuda_fill(&l->r, l->ka.dregion[0], 0, l->ka.region_bytes[0]);
  CUDA_OK(cudaDeviceSynchronize());
  cuda_unwatch();
}

static void life_part_c(life_t *l, const life_arg_t *a, int rank, int n) {
  graph_t g;
  cuda_watch("(c) a graph captured and replayed before the abort", STAGE_S);
  capture(l, &g, &l->a);
  replay_checked(&g, &l->a);
  /* No rank aborts while a peer may still be finishing the replay above. */
  life_barrier(a, rank, n);
  cuda_watch("(c) ncclCommAbort while an executable graph is kept", STAGE_S);
  NCCL_OK(ncclCommAbort(l->comm), "(c) abort while a graph is kept", NULL);
  cuda_watch("(c) the graph replayed after ncclCommAbort: its stream must complete", 20);
  graph_replay(&g);
  CUDA_OK(cudaStreamSynchronize(l->r.stream));
  graph_destroy(&g);
  /* The context is still usable: a kernel that trapped would have left it broken. */
  cuda_fill(&l->r, l->ka.dregion[0], 0, l->ka.region_bytes[0]);
  CUDA_OK(cudaDeviceSynchronize());
  cuda_unwatch();
}

static void life_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  const life_arg_t *a = arg;
  static life_t l;
  life_open(&l, rank, n, id);
  if (a->part == LIFE_A) life_part_a(&l);
  if (a->part == LIFE_B) life_part_b(&l, a, rank, n);
  if (a->part == LIFE_C) life_part_c(&l, a, rank, n);
  cuda_rank_close(&l.r);
}

static void graph_lifetime(void) {
  if (graph_host_skip("graph_lifetime")) return;
  static const char *names[] = {
      "(a) a graph destroyed while the communicator lives",
      "(b) finalize and destroy while a graph holds the communicator, then a replay",
      "(c) ncclCommAbort, then the kept graph replayed"};
  life_arg_t a;
  for (int r = 0; r < cuda_nranks; r++) EXPECT(pipe(a.fds[r]) == 0, "pipe");
  for (a.part = LIFE_A; a.part <= LIFE_C; a.part++) {
    printf("graph_lifetime %s\n", names[a.part]);
    fflush(stdout);
    EXPECT(cuda_run_ranks(cuda_nranks, 3 * STAGE_S, life_rank, &a) == 0, "%s: a rank failed", names[a.part]);
  }
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(capture_modes, 220);
  TEST(big_groups_eager, 220);
  TEST(queue_full, 220);
  TEST(graph_lifetime, 600);
  return test_summary();
}
