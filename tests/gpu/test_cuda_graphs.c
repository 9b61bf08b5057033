/*
 * CUDA graphs mixed with eager calls on one communicator, starting from the sequence that made NCCL's work
 * FIFO look full forever (a captured all-reduce advanced a host-side counter; eager all-reduces then
 * stalled).
 *
 *   fifo_repro       one process per GPU: two eager all-reduces of 100,000 bf16 elements, one all-reduce
 *                    captured into a graph, then 100,000 eager all-reduces of 49,000 bf16 elements with a
 *                    stream synchronisation after each, the graph replayed every 1,000 iterations;
 *   fifo_repro_min   the same with the smallest work queue (NCCL_WORK_FIFO_BYTES=65536);
 *   two_graphs       two graphs (an all-reduce; a group of an all-gather and a send/recv exchange) replayed
 * in turn between eager all-reduces issued on a second stream; several_graphs   three graphs (an all-reduce;
 * a group of an all-gather and a send/recv exchange; a reduce-scatter then a broadcast) replayed in a
 * rotating order between eager calls on two more streams, ordered by events only, 3,000 iterations;
 *   graphs_ce        two_graphs and several_graphs with the copy engines from 4 KiB (BRAID_CE_MIN_BYTES);
 *   graphs_push      the same with steps that only copy pushed by one kernel from 4 KiB
 *                    (BRAID_CE_PUSH_MIN_BYTES, BRAID_CE_PUSH_EXCHANGE_MIN_BYTES);
 *   graphs_dealt     the same with every Simple ring transfer with a peer dealt (BRAID_DEALT_MIN_BYTES=1,
 *                    with ring algorithms and the Simple protocol only);
 *   groups_repro     the reproduction with every eager and captured call a group (an all-reduce, an
 *                    all-gather and a send/recv exchange), 20,000 iterations, a replay every 500;
 *   one_thread       the reproduction with one thread driving every GPU (ncclCommInitAll): each call is a
 *                    group of every rank's all-reduce, and the capture makes one graph per rank's stream.
 *
 * Every checked call has its outputs poisoned first and is compared element by element with a reference
 * computed on the host (cuda_case.h); inputs are small integers, so bf16 sums are exact. A watchdog bounds
 * every stage. Each fifo_repro run prints one line starting with "fifo_repro:" (iterations, seconds, queue).
 * In --host mode the iteration counts shrink and replays issue the graph's calls again (graph_case.h); with
 * ranks sharing GPUs they shrink too (graph_scaled).
 */
#include <stdio.h>
#include <stdlib.h>

#include "coll_check.h"
#include "cuda_case.h"
#include "graph_case.h"
#include "harness.h"

#define POOL ((size_t)64 << 20)

/* ---- The reproduction's loop ---- */

/* Eager calls issued every iteration, each followed by a synchronisation of every stream; the graph replayed
 * every replay_every iterations. Eager results are checked every check_every iterations, a replay's every
 * check_replays replays, and both once more at the end. */
typedef struct {
  const graph_calls_t *eager, *captured;
  graph_t *g;
  cuda_rank_t **r; /* the streams synchronised after each iteration */
  int nr;
  int iters, replay_every, check_every, check_replays;
} loop_t;

/* Returns the number of replays. */
static int repro_loop(const loop_t *l) {
  int replays = 0;
  for (int it = 0; it < l->iters; it++) {
    int checked = it % l->check_every == 0;
    if (checked) graph_calls_rearm(l->eager);
    graph_calls_issue((void *)l->eager);
    for (int i = 0; i < l->nr; i++) cuda_sync(l->r[i]->stream, "an eager iteration");
    if (checked) graph_calls_check(l->eager);
    if (it % l->replay_every != l->replay_every - 1) continue;
    int verify = ++replays % l->check_replays == 0;
    if (verify) graph_calls_rearm(l->captured);
    graph_replay(l->g);
    if (verify) graph_calls_check(l->captured);
  }
  for (int i = 0; i < l->nr; i++) cuda_sync(l->r[i]->stream, "the last iteration");
  graph_calls_rearm(l->captured);
  graph_replay(l->g);
  graph_calls_check(l->captured);
  graph_calls_rearm(l->eager);
  graph_calls_issue((void *)l->eager);
  graph_calls_check(l->eager);
  return replays + 1;
}

/* ---- fifo_repro, fifo_repro_min ---- */

enum { BIG = 100000, SMALL = 49000, ITERS = 100000, REPLAY_EVERY = 1000, CHECK_EVERY = 5000 };

typedef struct {
  const char *name;
  const char *fifo_bytes; /* NCCL_WORK_FIFO_BYTES for the ranks; NULL: the library's default */
} fifo_arg_t;

static void fifo_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  const fifo_arg_t *a = arg;
  /* Read when the communicator is made: set in this rank's process, before init. */
  if (a->fifo_bytes != NULL) setenv("NCCL_WORK_FIFO_BYTES", a->fifo_bytes, 1);
  cuda_rank_t r, *rp = &r;
  cuda_rank_open(&r, rank, POOL, POOL, NULL);
  ncclComm_t comm = graph_init_rank(rank, n, id);
  coll_case_t cb = graph_coll(K_ALLREDUCE, ncclBfloat16, BIG, 1),
              cs = graph_coll(K_ALLREDUCE, ncclBfloat16, SMALL, 2),
              cg = graph_coll(K_ALLREDUCE, ncclBfloat16, BIG, 3);
  cuda_case_t big, small, cap;
  cuda_case_prepare(&big, comm, &r, &cb, "procs, eager");
  cuda_case_prepare(&small, comm, &r, &cs, "procs, eager between replays");
  cuda_case_prepare(&cap, comm, &r, &cg, "procs, captured");
  graph_calls_t cbig = {&big, 1, 0}, csmall = {&small, 1, 0}, ccap = {&cap, 1, 0};
  graph_calls_run(&cbig, 2, "two eager all-reduces of 100,000 bf16", 30);
  graph_t g;
  cuda_watch("the capture of an all-reduce", 30);
  graph_capture(&g, 1, &rp, cudaStreamCaptureModeGlobal, graph_calls_issue, &ccap);
  loop_t l = {.eager = &csmall,
              .captured = &ccap,
              .g = &g,
              .r = &rp,
              .nr = 1,
              .iters = graph_scaled(ITERS),
              .replay_every = graph_scaled(REPLAY_EVERY),
              .check_every = graph_scaled(CHECK_EVERY),
              .check_replays = 10};
  char what[160];
  snprintf(what, sizeof what, "[%s] %d eager all-reduces with a graph replay every %d", a->name, l.iters,
           l.replay_every);
  cuda_watch(what, 300);
  double t0 = graph_now();
  int replays = repro_loop(&l);
  double t = graph_now() - t0;
  cuda_unwatch();
  if (rank == 0)
    printf("fifo_repro: %s, rank 0: %d eager all-reduces and %d graph replays in %.2f s (%.1f us per "
           "iteration), work queue %s%s\n",
           a->name, l.iters, replays, t, t * 1e6 / l.iters,
           a->fifo_bytes != NULL ? a->fifo_bytes : "of the default size",
           a->fifo_bytes != NULL ? " bytes (NCCL_WORK_FIFO_BYTES)" : "");
  graph_destroy(&g);
  graph_destroy_comm(comm);
  cuda_rank_close(&r);
}

static void fifo_repro(void) {
  fifo_arg_t a = {"fifo_repro", NULL};
  EXPECT(cuda_run_ranks(cuda_nranks, 400, fifo_rank, &a) == 0, "a rank failed");
}

static void fifo_repro_min(void) {
  fifo_arg_t a = {"fifo_repro_min", "65536"};
  EXPECT(cuda_run_ranks(cuda_nranks, 400, fifo_rank, &a) == 0, "a rank failed");
}

/* ---- two_graphs ---- */

/* Two graphs (an all-reduce; a group of an all-gather and a ring send/recv) replayed in turn on one stream,
 * each followed by an eager all-reduce on another stream; the host waits for each in turn. */
static void two_graphs_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  enum { CNT = 4099, ROUNDS = 300, CHECK_EVERY_ROUND = 50 };
  (void)arg;
  cuda_rank_t rs[2], *s = &rs[0], *e = &rs[1];
  for (int i = 0; i < 2; i++) cuda_rank_open(&rs[i], rank, POOL, POOL, NULL);
  ncclComm_t comm = graph_init_rank(rank, n, id);
  cuda_case_t ka, kgroup[2], ke;
  coll_case_t ca = graph_coll(K_ALLREDUCE, ncclBfloat16, CNT, 4),
              cg = graph_coll(K_ALLGATHER, ncclBfloat16, CNT, 5),
              cx = graph_coll(K_SENDRECV, ncclBfloat16, CNT, 6),
              ce = graph_coll(K_ALLREDUCE, ncclBfloat16, CNT, 7);
  cuda_case_prepare(&ka, comm, s, &ca, "procs, graph 0");
  cuda_case_prepare(&kgroup[0], comm, s, &cg, "procs, graph 1");
  cuda_case_prepare(&kgroup[1], comm, s, &cx, "procs, graph 1");
  cuda_case_prepare(&ke, comm, e, &ce, "procs, eager on a second stream");
  graph_calls_t calls[2] = {{&ka, 1, 0}, {kgroup, 2, 1}}, eager = {&ke, 1, 0};
  graph_t g[2];
  cuda_watch("the capture of two graphs", 30);
  for (int i = 0; i < 2; i++)
    graph_capture(&g[i], 1, &s, cudaStreamCaptureModeGlobal, graph_calls_issue, &calls[i]);
  cuda_watch("graph replays between eager calls", 120);
  int rounds = graph_scaled(ROUNDS) < 4 ? 4 : graph_scaled(ROUNDS);
  for (int round = 0; round < rounds; round++) {
    int checked = round % CHECK_EVERY_ROUND < 2 || round >= rounds - 2; /* both graphs, now and then */
    const graph_calls_t *c = &calls[round % 2];
    if (checked) {
      graph_calls_rearm(c);
      graph_calls_rearm(&eager);
    }
    graph_replay(&g[round % 2]);
    cuda_sync(s->stream, "a replay");
    graph_calls_issue(&eager);
    cuda_sync(e->stream, "an eager all-reduce between replays");
    if (checked) {
      graph_calls_check(c);
      graph_calls_check(&eager);
    }
  }
  cuda_unwatch();
  for (int i = 0; i < 2; i++) graph_destroy(&g[i]);
  graph_destroy_comm(comm);
  for (int i = 0; i < 2; i++) cuda_rank_close(&rs[i]);
}

static void two_graphs(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 200, two_graphs_rank, NULL) == 0, "a rank failed");
}

/* ---- several_graphs ---- */

/* Three graphs on stream 0; eager calls alternate between streams 1 and 2. Each iteration replays one graph,
 * makes the next eager stream wait for it, issues the eager call there and makes stream 0 wait for that: the
 * communicator's work is in one order on the GPU while the host never waits, except before a check. Blocks of
 * three iterations replay the three graphs, in each of the six orders in turn; every SG_CHECK_BLOCKS-th block
 * and the last are checked (every graph and both eager streams). */
enum { SG_ITERS = 3000, SG_CHECK_BLOCKS = 33 };

static const int rotation[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};

typedef struct {
  cuda_rank_t rs[3];
  cuda_case_t kg[5], ke[2];
  graph_calls_t graphs[3], eager[2];
  graph_t g[3];
  cudaEvent_t ev;
} several_t;

static void several_prepare(several_t *sv, ncclComm_t comm, int n) {
  coll_case_t c[] = {
      graph_coll(K_ALLREDUCE, ncclBfloat16, 65539, 11), graph_coll(K_ALLGATHER, ncclFloat32, 4099, 12),
      graph_coll(K_SENDRECV, ncclBfloat16, 10007, 13),  graph_coll(K_REDUCESCATTER, ncclBfloat16, 8191, 14),
      graph_coll(K_BROADCAST, ncclFloat32, 30011, 15),  graph_coll(K_ALLREDUCE, ncclFloat32, 1031, 16),
      graph_coll(K_ALLGATHER, ncclBfloat16, 2053, 17),
  };
  c[4].root = 1 % n;
  c[4].inplace = 1;
  for (int i = 0; i < 5; i++) cuda_case_prepare(&sv->kg[i], comm, &sv->rs[0], &c[i], "procs, graph");
  for (int i = 0; i < 2; i++) cuda_case_prepare(&sv->ke[i], comm, &sv->rs[1 + i], &c[5 + i], "procs, eager");
  sv->graphs[0] = (graph_calls_t){&sv->kg[0], 1, 0};
  sv->graphs[1] = (graph_calls_t){&sv->kg[1], 2, 1};
  sv->graphs[2] = (graph_calls_t){&sv->kg[3], 2, 0}; /* two launches, not grouped */
  for (int i = 0; i < 2; i++) sv->eager[i] = (graph_calls_t){&sv->ke[i], 1, 0};
}

static void several_iteration(several_t *sv, int it, int iters) {
  int gi = rotation[(it / 3) % 6][it % 3], k = it % 2;
  int checked = (it / 3) % SG_CHECK_BLOCKS == SG_CHECK_BLOCKS - 1 || it >= iters - 3;
  cuda_rank_t *s = &sv->rs[0], *e = &sv->rs[1 + k];
  if (checked) {
    for (int i = 0; i < 3; i++) cuda_sync(sv->rs[i].stream, "before a check");
    graph_calls_rearm(&sv->graphs[gi]);
    graph_calls_rearm(&sv->eager[k]);
  }
  graph_replay(&sv->g[gi]);
  graph_order(e, s, sv->ev);
  graph_calls_issue(&sv->eager[k]);
  graph_order(s, e, sv->ev);
  if (checked) {
    graph_calls_check(&sv->graphs[gi]);
    graph_calls_check(&sv->eager[k]);
  }
}

static void several_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  (void)arg;
  static several_t sv;
  for (int i = 0; i < 3; i++) cuda_rank_open(&sv.rs[i], rank, POOL, POOL, NULL);
  ncclComm_t comm = graph_init_rank(rank, n, id);
  several_prepare(&sv, comm, n);
  sv.ev = graph_event();
  cuda_rank_t *s = &sv.rs[0];
  cuda_watch("the capture of three graphs", 30);
  for (int i = 0; i < 3; i++)
    graph_capture(&sv.g[i], 1, &s, cudaStreamCaptureModeGlobal, graph_calls_issue, &sv.graphs[i]);
  int iters = graph_scaled(SG_ITERS) / 3 * 3; /* whole blocks */
  cuda_watch("three graphs replayed in turn between eager calls on two streams", 120);
  double t0 = graph_now();
  for (int it = 0; it < iters; it++) several_iteration(&sv, it, iters);
  for (int i = 0; i < 3; i++) cuda_sync(sv.rs[i].stream, "the last iteration");
  cuda_unwatch();
  if (rank == 0)
    printf("several_graphs: rank 0: %d replays (three graphs in turn) and as many eager calls in %.2f s\n",
           iters, graph_now() - t0);
  for (int i = 0; i < 3; i++) graph_destroy(&sv.g[i]);
  graph_event_destroy(sv.ev);
  graph_destroy_comm(comm);
  for (int i = 0; i < 3; i++) cuda_rank_close(&sv.rs[i]);
}

static void several_graphs(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 200, several_rank, NULL) == 0, "a rank failed");
}

/* two_graphs and several_graphs with BRAID_CE_MIN_BYTES=4096: on two GPUs the copy engines move the
 * all-gathers, send/receive exchanges and broadcast of 4 KiB and more, in the graphs and eagerly between
 * their replays, through the same words. */
static void graphs_ce(void) {
  setenv("BRAID_CE_MIN_BYTES", "4096", 1);
  EXPECT(cuda_run_ranks(cuda_nranks, 200, two_graphs_rank, NULL) == 0, "a rank failed (two graphs)");
  EXPECT(cuda_run_ranks(cuda_nranks, 200, several_rank, NULL) == 0, "a rank failed (several graphs)");
  unsetenv("BRAID_CE_MIN_BYTES");
}

/* The same with steps that only copy pushed by one kernel from 4 KiB (BRAID_CE_PUSH_MIN_BYTES), below the
 * copy engines' default threshold: the push kernels in the graphs and eagerly between their replays. */
static void graphs_push(void) {
  setenv("BRAID_CE_PUSH_MIN_BYTES", "4096", 1);
  setenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES", "4096", 1);
  EXPECT(cuda_run_ranks(cuda_nranks, 200, two_graphs_rank, NULL) == 0, "a rank failed (two graphs)");
  EXPECT(cuda_run_ranks(cuda_nranks, 200, several_rank, NULL) == 0, "a rank failed (several graphs)");
  unsetenv("BRAID_CE_PUSH_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES");
}

/* The same with every Simple ring transfer with a peer dealt (cuda_dealt_env), from 1 byte: the counters
 * that the sending blocks share must be back at zero after every launch, replayed or eager, or the next
 * one would find no pieces left. */
static void graphs_dealt(void) {
  cuda_dealt_env(1);
  EXPECT(cuda_run_ranks(cuda_nranks, 200, two_graphs_rank, NULL) == 0, "a rank failed (two graphs)");
  EXPECT(cuda_run_ranks(cuda_nranks, 200, several_rank, NULL) == 0, "a rank failed (several graphs)");
  cuda_dealt_env(0);
}

/* ---- groups_repro ---- */

enum { GR_ITERS = 20000, GR_REPLAY_EVERY = 500, GR_CHECK_EVERY = 1000 };

/* An all-reduce, an all-gather and a send/recv exchange in one group, from seed on. */
static void group_of_three(cuda_case_t *k, ncclComm_t comm, cuda_rank_t *r, size_t ar_count, uint64_t seed,
                           const char *mode) {
  coll_case_t c[3] = {graph_coll(K_ALLREDUCE, ncclBfloat16, ar_count, seed),
                      graph_coll(K_ALLGATHER, ncclBfloat16, 4099, seed + 1),
                      graph_coll(K_SENDRECV, ncclFloat32, 7001, seed + 2)};
  for (int i = 0; i < 3; i++) cuda_case_prepare(&k[i], comm, r, &c[i], mode);
}

static void groups_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  (void)arg;
  cuda_rank_t r, *rp = &r;
  cuda_rank_open(&r, rank, POOL, POOL, NULL);
  ncclComm_t comm = graph_init_rank(rank, n, id);
  cuda_case_t big[3], small[3], cap[3];
  group_of_three(big, comm, &r, BIG, 21, "procs, eager group");
  group_of_three(small, comm, &r, SMALL, 24, "procs, eager group between replays");
  group_of_three(cap, comm, &r, BIG, 27, "procs, captured group");
  graph_calls_t cbig = {big, 3, 1}, csmall = {small, 3, 1}, ccap = {cap, 3, 1};
  graph_calls_run(&cbig, 2, "two eager groups", 30);
  graph_t g;
  cuda_watch("the capture of a group", 30);
  graph_capture(&g, 1, &rp, cudaStreamCaptureModeGlobal, graph_calls_issue, &ccap);
  loop_t l = {.eager = &csmall,
              .captured = &ccap,
              .g = &g,
              .r = &rp,
              .nr = 1,
              .iters = graph_scaled(GR_ITERS),
              .replay_every = graph_scaled(GR_REPLAY_EVERY),
              .check_every = graph_scaled(GR_CHECK_EVERY),
              .check_replays = 4};
  cuda_watch("eager groups with a captured group replayed now and then", 120);
  double t0 = graph_now();
  int replays = repro_loop(&l);
  cuda_unwatch();
  if (rank == 0)
    printf("groups_repro: rank 0: %d eager groups and %d replays in %.2f s\n", l.iters, replays,
           graph_now() - t0);
  graph_destroy(&g);
  graph_destroy_comm(comm);
  cuda_rank_close(&r);
}

static void groups_repro(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 200, groups_rank, NULL) == 0, "a rank failed");
}

/* ---- one_thread ---- */

enum { OT_ITERS = 20000, OT_REPLAY_EVERY = 1000, OT_CHECK_EVERY = 2000 };

static void one_thread(void) {
  int n = cuda_nranks;
  static ncclComm_t comms[8];
  static cuda_rank_t rs[8];
  static cuda_case_t big[8], small[8], cap[8];
  cuda_rank_t *rp[8];
  for (int i = 0; i < n; i++) {
    rp[i] = &rs[i];
    cuda_rank_open(&rs[i], i, POOL, POOL, NULL);
  }
  cuda_watch("ncclCommInitAll", GRAPH_INIT_S);
  NCCL_OK(cuda_comm_init_all(comms, n), "ncclCommInitAll", NULL);
  for (int i = 0; i < n; i++) {
    coll_case_t cb = graph_coll(K_ALLREDUCE, ncclBfloat16, BIG, 31),
                cs = graph_coll(K_ALLREDUCE, ncclBfloat16, SMALL, 32),
                cg = graph_coll(K_ALLREDUCE, ncclBfloat16, BIG, 33);
    cuda_case_prepare(&big[i], comms[i], &rs[i], &cb, "single, eager");
    cuda_case_prepare(&small[i], comms[i], &rs[i], &cs, "single, eager between replays");
    cuda_case_prepare(&cap[i], comms[i], &rs[i], &cg, "single, captured");
  }
  graph_calls_t cbig = {big, n, 1}, csmall = {small, n, 1}, ccap = {cap, n, 1};
  graph_calls_run(&cbig, 2, "two eager groups of every rank's all-reduce", 30);
  graph_t g;
  cuda_watch("the capture of every rank's all-reduce, a graph per stream", 30);
  graph_capture(&g, n, rp, cudaStreamCaptureModeGlobal, graph_calls_issue, &ccap);
  loop_t l = {.eager = &csmall,
              .captured = &ccap,
              .g = &g,
              .r = rp,
              .nr = n,
              .iters = graph_scaled(OT_ITERS),
              .replay_every = graph_scaled(OT_REPLAY_EVERY),
              .check_every = graph_scaled(OT_CHECK_EVERY),
              .check_replays = 2};
  cuda_watch("one thread: eager groups with the graphs replayed now and then", 120);
  double t0 = graph_now();
  int replays = repro_loop(&l);
  cuda_unwatch();
  printf("one_thread: %d eager groups of %d all-reduces and %d replays in %.2f s\n", l.iters, n, replays,
         graph_now() - t0);
  graph_destroy(&g);
  cuda_watch("ncclCommDestroy", GRAPH_INIT_S);
  for (int i = 0; i < n; i++) NCCL_OK(ncclCommDestroy(comms[i]), "destroy", NULL);
  cuda_unwatch();
  for (int i = 0; i < n; i++) cuda_rank_close(&rs[i]);
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(fifo_repro, 420);
  TEST(fifo_repro_min, 420);
  TEST(two_graphs, 220);
  TEST(several_graphs, 220);
  TEST(graphs_ce, 420);
  TEST(graphs_push, 420);
  TEST(graphs_dealt, 420);
  TEST(groups_repro, 220);
  TEST(one_thread, 220);
  return test_summary();
}
