/*
 * The planner as a pure function: for every collective, rank count and size, the plans of all ranks agree
 * (the k-th transfer rank a sends to rank b has the size of the k-th transfer b receives from a), every
 * ring transfer fits in a slice, building twice gives the same plan, and local mistakes are refused.
 *
 * The one-shot algorithms (GPU executor) are checked the same way, and also run: every rank's plan is
 * executed under the GPU executor's rules (lanes: transfers sharing a connection or marked XF_SEQ run in list
 * order, other lanes concurrently), on real buffers, checking that no two lanes touch the same bytes where
 * one writes, that the results are right, and that every rank computing a reduced block gets the same bits.
 * The choice of algorithm (threshold, NCCL_ALGO) is checked as a function of the call.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/param.h"
#include "core/plan.h"
#include "core/tune.h"
#include "gpu/host_reduce.h"
#include "harness.h"

#define MAX_RANKS 8
#define SLICE     4096

/* Padded size of a transfer on its connection (as the engine moves it). */
static size_t wire(const xfer_t *x) {
  return (x->bytes + XF_ALIGN - 1) / XF_ALIGN * XF_ALIGN;
}

/* Builds rank r's plan for one call. Buffers are fake but distinct per rank: the planner only computes
 * addresses. */
static void build(plan_t *p, op_kind_t kind, size_t count, int root, int rank, int n) {
  static char buffers[MAX_RANKS][2];
  task_t t = {.kind = kind,
              .sendbuff = &buffers[rank][0],
              .recvbuff = &buffers[rank][1],
              .count = count,
              .type = ncclFloat32,
              .root = root};
  plan_reset(p);
  EXPECT_OK(plan_add_task(p, &t));
  EXPECT_OK(plan_build(p, rank, n, SLICE, 0));
}

/* The sizes rank `from` sends to `to`, in order, and those `to` receives from `from`, must be equal. */
static void check_pair(const plan_t *a, const plan_t *b, int from, int to, op_kind_t kind, size_t count) {
  int ia = 0, ib = 0;
  for (;;) {
    while (ia < a->nxfers && a->xfers[ia].send_peer != to) ia++;
    while (ib < b->nxfers && b->xfers[ib].recv_peer != from) ib++;
    if (ia == a->nxfers || ib == b->nxfers) break;
    EXPECT(wire(&a->xfers[ia]) == wire(&b->xfers[ib]),
           "%s count %zu: rank %d sends %zu bytes to rank %d, which expects %zu", plan_op_name(kind), count,
           from, a->xfers[ia].bytes, to, b->xfers[ib].bytes);
    ia++, ib++;
  }
  EXPECT(ia == a->nxfers && ib == b->nxfers,
         "%s count %zu: ranks %d and %d disagree on how many transfers pass", plan_op_name(kind), count, from,
         to);
}

static void plans_agree(void) {
  static const op_kind_t kinds[] = {OP_ALLREDUCE,     OP_BROADCAST, OP_REDUCE, OP_ALLGATHER,
                                    OP_REDUCESCATTER, OP_ALLTOALL,  OP_GATHER, OP_SCATTER};
  static const size_t counts[] = {0, 1, 5, 1023, 4097, 100003};
  static plan_t plans[MAX_RANKS];
  for (int n = 1; n <= MAX_RANKS; n++)
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (int r = 0; r < n; r++) build(&plans[r], kinds[k], counts[c], n - 1, r, n);
        for (int a = 0; a < n; a++)
          for (int b = 0; b < n; b++)
            if (a != b) check_pair(&plans[a], &plans[b], a, b, kinds[k], counts[c]);
      }
  for (int r = 0; r < MAX_RANKS; r++) plan_free(&plans[r]);
}

/* Ring transfers never exceed a slice; a large all-reduce is cut into many. */
static void rings_are_sliced(void) {
  plan_t p = {0};
  build(&p, OP_ALLREDUCE, 1 << 20, 0, 2, 4);
  EXPECT(p.nsteps == 1, "one step per collective, got %d", p.nsteps);
  for (int i = 0; i < p.nxfers; i++)
    EXPECT(p.xfers[i].bytes <= SLICE, "transfer %d has %zu bytes", i, p.xfers[i].bytes);
  /* 4 MiB over 4 ranks in 4 KiB slices: 256 slices of 2 * (4 - 1) + 1 transfers each. */
  EXPECT(p.nxfers == 256 * 7, "%d transfers", p.nxfers);
  plan_free(&p);
}

static void deterministic(void) {
  plan_t a = {0}, b = {0};
  build(&a, OP_REDUCESCATTER, 77777, 0, 3, 5);
  build(&b, OP_REDUCESCATTER, 77777, 0, 3, 5);
  EXPECT(a.nxfers == b.nxfers, "%d and %d transfers", a.nxfers, b.nxfers);
  for (int i = 0; i < a.nxfers; i++) {
    const xfer_t *x = &a.xfers[i], *y = &b.xfers[i];
    EXPECT(x->recv_peer == y->recv_peer && x->send_peer == y->send_peer && x->src == y->src &&
               x->dst == y->dst && x->bytes == y->bytes && x->flags == y->flags,
           "transfer %d differs", i);
  }
  plan_free(&a);
  plan_free(&b);
}

/* Collectives get a step each in call order; point-to-point calls share one last step. */
static void steps(void) {
  plan_t p = {0};
  char buf[64];
  task_t send = {.kind = OP_SEND, .sendbuff = buf, .count = 4, .type = ncclFloat32, .root = 1};
  task_t recv = {.kind = OP_RECV, .recvbuff = buf + 32, .count = 4, .type = ncclFloat32, .root = 1};
  task_t ar = {.kind = OP_ALLREDUCE, .sendbuff = buf, .recvbuff = buf, .count = 8, .type = ncclFloat32};
  EXPECT_OK(plan_add_task(&p, &send));
  EXPECT_OK(plan_add_task(&p, &ar));
  EXPECT_OK(plan_add_task(&p, &recv));
  EXPECT_OK(plan_add_task(&p, &ar));
  EXPECT_OK(plan_build(&p, 0, 2, SLICE, 0));
  EXPECT(p.nsteps == 3, "%d steps", p.nsteps);
  EXPECT(p.steps[0].task->kind == OP_ALLREDUCE && p.steps[1].task->kind == OP_ALLREDUCE, "collectives first");
  EXPECT(p.steps[2].task->kind == OP_SEND && p.steps[2].count == 2, "then the point-to-point step");
  plan_free(&p);
}

/* A receive from self needs a send to self of the same size in the group. */
/* A send whose bytes a receive of its group overwrites (an in-place exchange; here the receive overlaps the
 * send's tail) reads a copy staged in a step before the point-to-point step; a send beside it that nothing
 * overwrites, and the receive, keep their buffers. */
static void inplace_exchange(void) {
  plan_t p = {0};
  float buf[12];
  task_t send = {.kind = OP_SEND, .sendbuff = buf, .count = 4, .type = ncclFloat32, .root = 1};
  task_t recv = {.kind = OP_RECV, .recvbuff = buf + 3, .count = 4, .type = ncclFloat32, .root = 1};
  task_t other = {.kind = OP_SEND, .sendbuff = buf + 8, .count = 4, .type = ncclFloat32, .root = 2};
  EXPECT_OK(plan_add_task(&p, &send));
  EXPECT_OK(plan_add_task(&p, &recv));
  EXPECT_OK(plan_add_task(&p, &other));
  EXPECT(plan_scratch_need(&p, 0, 3, 0) == 16, "%zu bytes of staging", plan_scratch_need(&p, 0, 3, 0));
  EXPECT_OK(plan_build(&p, 0, 3, SLICE, 0));
  EXPECT(p.nsteps == 2 && p.steps[0].count == 1 && p.steps[1].count == 3, "%d steps", p.nsteps);
  const xfer_t *copy = &p.xfers[0], *x = &p.xfers[1];
  EXPECT(copy->send_peer < 0 && copy->recv_peer < 0 && copy->src == (void *)buf && copy->dst == p.scratch &&
             copy->bytes == 16,
         "first a local copy of the send into staging");
  EXPECT(x[0].send_peer == 1 && x[0].src == p.scratch && x[0].bytes == 16, "the send reads the staged copy");
  EXPECT(x[1].recv_peer == 1 && x[1].dst == (void *)(buf + 3), "the receive writes the caller's buffer");
  EXPECT(x[2].send_peer == 2 && x[2].src == (void *)(buf + 8), "a send nothing overwrites is not staged");
  /* disjoint buffers: nothing staged */
  plan_reset(&p);
  recv.recvbuff = buf + 4;
  EXPECT_OK(plan_add_task(&p, &send));
  EXPECT_OK(plan_add_task(&p, &recv));
  EXPECT(plan_scratch_need(&p, 0, 3, 0) == 0, "staging for disjoint buffers");
  EXPECT_OK(plan_build(&p, 0, 3, SLICE, 0));
  EXPECT(p.nsteps == 1 && p.xfers[0].src == (void *)buf, "disjoint buffers: one step, the send unstaged");
  plan_free(&p);
}

static void self_p2p(void) {
  plan_t p = {0};
  char buf[64];
  task_t send = {.kind = OP_SEND, .sendbuff = buf, .count = 4, .type = ncclFloat32, .root = 0};
  task_t recv = {.kind = OP_RECV, .recvbuff = buf + 16, .count = 4, .type = ncclFloat32, .root = 0};
  EXPECT_OK(plan_add_task(&p, &send));
  EXPECT_OK(plan_add_task(&p, &recv));
  EXPECT_OK(plan_build(&p, 0, 3, SLICE, 0));
  EXPECT(p.nxfers == 1 && p.xfers[0].recv_peer < 0 && p.xfers[0].send_peer < 0, "a local copy");
  plan_reset(&p);
  recv.count = 5;
  EXPECT_OK(plan_add_task(&p, &send));
  EXPECT_OK(plan_add_task(&p, &recv));
  EXPECT_RES(plan_build(&p, 0, 3, SLICE, 0), ncclInvalidUsage);
  plan_free(&p);
}

/* ---- One-shot algorithms ---- */

#define THR 4096 /* the one-shot threshold of these tests, in bytes */

/* The knobs of a rank with NCCL_ALGO=algo and BRAID_ONESHOT_MAX_BYTES=oneshot (TUNE_UNSET: the table's). */
static tune_knobs_t knobs_of(const char *algo, int64_t oneshot) {
  tune_knobs_t k;
  tune_parse_algo(algo, k.algos);
  k.ll = k.ll128 = 1;
  k.ll_max = k.ll128_min = k.ll128_oneway = k.ll128_max = k.ll_part = k.ch_bytes = k.wide = TUNE_UNSET;
  k.dealt_min = k.batch = k.ar_split = TUNE_UNSET;
  k.oneshot_max = oneshot;
  return k;
}

/* The tuner's shape of call t on n ranks (40 channels, p2p links). */
static tune_shape_t shape_of(const task_t *t, int n, const tune_knobs_t *k) {
  const tune_call_t c = {.kind = t->kind,
                         .type = t->type,
                         .red = t->red.kind,
                         .bytes = plan_call_bytes(t, n),
                         .nranks = n,
                         .nch = 40,
                         .link = TP_LINK_P2P};
  tune_shape_t s;
  tune_call(&c, k, &s);
  return s;
}

static plan_algo_t pick(const task_t *t, int n, const tune_knobs_t *k) {
  return shape_of(t, n, k).algo;
}

/* plan_build for rank r of n as the GPU executor runs it: each call tuned first (logged as gx_tune does);
 * with no knobs, as the host executor runs it. */
static ncclResult_t build_tuned(plan_t *p, int r, int n, const tune_knobs_t *k) {
  for (int i = 0; k != NULL && i < p->ntasks; i++) {
    task_t *t = &p->tasks[i];
    const tune_shape_t s = shape_of(t, n, k);
    const tune_call_t c = {.kind = t->kind, .type = t->type, .bytes = plan_call_bytes(t, n), .nranks = n};
    tune_log(&c, t, &s);
    t->algo = (uint8_t)s.algo;
    t->split = s.split;
  }
  return plan_build(p, r, n, SLICE, k != NULL);
}

static const op_kind_t choice_kinds[] = {OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER,
                                         OP_REDUCESCATTER};
#define NCHOICE (sizeof choice_kinds / sizeof choice_kinds[0])

/* A call of `count` elements on rank `rank` with buffers at send/recv, or in place as NCCL defines it for the
 * kind (recv is then ignored). */
static task_t call_of(op_kind_t kind, size_t count, int root, int rank, int inplace, char *send, char *recv,
                      red_t red) {
  size_t es = dtype_size(red.type);
  if (inplace) {
    if (kind == OP_ALLGATHER)
      send = recv + (size_t)rank * count * es;
    else if (kind == OP_REDUCESCATTER)
      recv = send + (size_t)rank * count * es;
    else
      recv = send;
  }
  return (task_t){.kind = kind,
                  .sendbuff = send,
                  .recvbuff = recv,
                  .count = count,
                  .type = red.type,
                  .root = root,
                  .red = red};
}

static red_t float_sum(void) {
  return (red_t){.kind = RED_SUM, .type = ncclFloat32, .fscale = 1, .iscale = 1, .divisor = 1};
}

/* Every rank's one-shot plan agrees with every other's, for 1..8 ranks, sizes around the threshold, in place
 * or not (and ranks that differ in that). */
/* One rank, in place, an operation that keeps a lone operand: nothing to plan. Anything else is planned. */
static void noop_calls(void) {
  char a[8], b[8];
  task_t t = {
      .kind = OP_ALLREDUCE, .sendbuff = a, .recvbuff = a, .count = 2, .type = ncclFloat, .op = ncclAvg};
  EXPECT(plan_call_is_noop(&t, 1), "an in-place average on one rank");
  EXPECT(!plan_call_is_noop(&t, 2), "two ranks");
  t.op = (ncclRedOp_t)ncclNumOps; /* a PreMulSum op: it may scale */
  EXPECT(!plan_call_is_noop(&t, 1), "a PreMulSum on one rank");
  t.op = ncclMax;
  t.recvbuff = b;
  EXPECT(!plan_call_is_noop(&t, 1), "out of place");
  t = (task_t){.kind = OP_SEND, .sendbuff = a, .recvbuff = a, .count = 2, .type = ncclFloat, .op = ncclSum};
  EXPECT(!plan_call_is_noop(&t, 1), "a send to oneself");
  for (op_kind_t k = OP_ALLREDUCE; k < OP_COUNT; k++) {
    t.kind = k;
    EXPECT(plan_call_is_noop(&t, 1) == (k != OP_SEND && k != OP_RECV), "kind %d in place on one rank",
           (int)k);
  }
}

static void oneshot_plans_agree(void) {
  static plan_t plans[MAX_RANKS];
  static char buffers[MAX_RANKS][2];
  tune_knobs_t tuning = knobs_of("", THR);
  for (int n = 1; n <= MAX_RANKS; n++)
    for (size_t k = 0; k < NCHOICE; k++) {
      op_kind_t kind = choice_kinds[k];
      size_t per = kind == OP_ALLGATHER || kind == OP_REDUCESCATTER ? (size_t)n * 4 : 4; /* bytes per count */
      size_t counts[] = {0, 1, 5, 97, THR / per - 1, THR / per, THR / per + 1};
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (int mode = 0; mode < 3; mode++) { /* out of place, in place, in place on odd ranks */
          for (int r = 0; r < n; r++) {
            int inplace = mode == 1 || (mode == 2 && r % 2 == 1);
            task_t t =
                call_of(kind, counts[c], n - 1, r, inplace, &buffers[r][0], &buffers[r][1], float_sum());
            plan_reset(&plans[r]);
            EXPECT_OK(plan_add_task(&plans[r], &t));
            EXPECT_OK(build_tuned(&plans[r], r, n, &tuning));
            plan_algo_t want = n > 1 && counts[c] * per <= THR ? ALGO_ONESHOT : ALGO_RING;
            EXPECT(pick(&t, n, &tuning) == want, "%s of %zu bytes on %d ranks: %s", plan_op_name(kind),
                   counts[c] * per, n, plan_algo_name(pick(&t, n, &tuning)));
          }
          for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
              if (a != b) check_pair(&plans[a], &plans[b], a, b, kind, counts[c]);
        }
    }
  for (int r = 0; r < MAX_RANKS; r++) plan_free(&plans[r]);
}

/* The choice: a function of the call and the tuning only. */
static void oneshot_choice(void) {
  tune_knobs_t tuning = knobs_of("", THR);
  char b[2];
  task_t t = call_of(OP_ALLREDUCE, THR / 4, 0, 0, 0, &b[0], &b[1], float_sum());
  EXPECT(pick(&t, 2, &tuning) == ALGO_ONESHOT, "at the threshold");
  EXPECT(pick(&t, 1, &tuning) == ALGO_RING, "one rank");
  EXPECT(pick(&t, PLAN_ONESHOT_MAX_RANKS, &tuning) == ALGO_ONESHOT);
  EXPECT(pick(&t, PLAN_ONESHOT_MAX_RANKS + 1, &tuning) == ALGO_RING, "too many ranks");
  t.count++;
  EXPECT(pick(&t, 2, &tuning) == ALGO_RING, "past the threshold");
  /* the table: two ranks' all-reduce has a row of its own, up to 16 MiB; the knob, where set, holds for both
   */
  const tune_knobs_t table = knobs_of("", TUNE_UNSET);
  t.count = (64 << 10) / 4 + 1;
  EXPECT(pick(&t, 2, &table) == ALGO_ONESHOT, "two ranks: up to the pair row's 16 MiB");
  EXPECT(pick(&t, 3, &table) == ALGO_RING, "three ranks: the general row's 64 KiB");
  t.count = (16 << 20) / 4 + 1;
  EXPECT(pick(&t, 2, &table) == ALGO_RING, "past the pair row");
  t.count = (32 << 20) / 4;
  EXPECT(pick(&t, 2, &table) == ALGO_RING && shape_of(&t, 2, &table).split, "from 32 MiB: two steps");
  EXPECT(!shape_of(&t, 3, &table).split, "two steps on two ranks only");
  t.kind = OP_BROADCAST;
  t.count = (64 << 10) + 1;
  EXPECT(pick(&t, 2, &table) == ALGO_RING, "the pair row is all-reduce's");
  t.kind = OP_ALLREDUCE;
  t.count = 1;
  t.red.kind = RED_MAX;
  EXPECT(pick(&t, 2, &tuning) == ALGO_RING, "float max is not bitwise commutative");
  t.kind = OP_REDUCE;
  EXPECT(pick(&t, 2, &tuning) == ALGO_ONESHOT, "one rank computes a reduce: any operation");
  t.kind = OP_ALLREDUCE;
  t.type = t.red.type = ncclInt32;
  EXPECT(pick(&t, 2, &tuning) == ALGO_ONESHOT, "integer max is");
  task_t ag = call_of(OP_ALLGATHER, THR / 16, 0, 0, 0, &b[0], &b[1], float_sum());
  EXPECT(plan_call_bytes(&ag, 4) == THR && pick(&ag, 4, &tuning) == ALGO_ONESHOT);
  EXPECT(pick(&ag, 5, &tuning) == ALGO_RING, "all-gather counts its whole output");
  tuning = knobs_of("", 0);
  EXPECT(pick(&ag, 4, &tuning) == ALGO_RING && shape_of(&ag, 4, &tuning).why != NULL,
         "a threshold of 0 turns one-shot off");
}

/* NCCL_ALGO's syntax. */
static void algo_knob(void) {
  tune_knobs_t t;
  const unsigned ring = 1u << ALGO_RING, one = 1u << ALGO_ONESHOT;
  t = knobs_of("Ring", THR);
  for (size_t k = 0; k < NCHOICE; k++) EXPECT(t.algos[choice_kinds[k]] == ring);
  t = knobs_of(" ^ring ", THR);
  EXPECT(t.algos[OP_ALLREDUCE] == one && t.algos[OP_BROADCAST] == one);
  t = knobs_of("allreduce:oneshot;Broadcast:^OneShot", THR);
  EXPECT(t.algos[OP_ALLREDUCE] == one && t.algos[OP_BROADCAST] == ring &&
         t.algos[OP_REDUCE] == ALGO_MASK_ALL);
  t = knobs_of("Tree,NVLS", THR);
  EXPECT(t.algos[OP_ALLREDUCE] == ALGO_MASK_ALL, "other libraries' names alone change nothing");
  t = knobs_of("Tree,Ring", THR);
  EXPECT(t.algos[OP_ALLREDUCE] == ring, "unknown names are ignored, known ones kept");
  t = knobs_of("^Ring,OneShot", THR);
  EXPECT(t.algos[OP_ALLREDUCE] == ring, "excluding everything keeps Ring");
  t = knobs_of("sendrecv:ring;reducescatter:oneshot", THR);
  EXPECT(t.algos[OP_REDUCESCATTER] == one && t.algos[OP_ALLREDUCE] == ALGO_MASK_ALL);
  t = knobs_of("ring;allgather:oneshot", THR);
  EXPECT(t.algos[OP_ALLGATHER] == one && t.algos[OP_ALLREDUCE] == ring, "later parts win");
  char b[2];
  task_t big = call_of(OP_ALLREDUCE, 1 << 20, 0, 0, 0, &b[0], &b[1], float_sum());
  t = knobs_of("OneShot", THR);
  EXPECT(pick(&big, 4, &t) == ALGO_ONESHOT, "OneShot alone: every size");
  t = knobs_of("Ring", THR);
  big.count = 1;
  EXPECT(pick(&big, 4, &t) == ALGO_RING, "Ring alone: every size");
}

/* NCCL_PROTO's syntax, and BRAID_LL_MAX_BYTES's bound. */
static void proto_knob(void) {
  EXPECT(tune_parse_proto(NULL, "LL") && tune_parse_proto("", "LL"), "unset: LL allowed");
  EXPECT(!tune_parse_proto("Simple", "LL"), "Simple alone: no LL");
  EXPECT(!tune_parse_proto("^LL", "LL") && !tune_parse_proto(" ^ ll ", "LL"), "^LL excludes it");
  EXPECT(tune_parse_proto("LL", "LL") && tune_parse_proto("ll,simple", "LL"));
  EXPECT(tune_parse_proto("^Simple", "LL"), "excluding Simple leaves LL (Simple still carries the rest)");
  EXPECT(tune_parse_proto("NVLS", "LL"), "other libraries' names alone change nothing");
  EXPECT(!tune_parse_proto("NVLS,Simple", "LL"), "unknown names are ignored, known ones kept");
  EXPECT(!tune_parse_proto("LL128", "LL") && tune_parse_proto("^LL128", "LL"), "LL128 is not LL");
  EXPECT(!tune_parse_proto("^LL128", "LL128") && !tune_parse_proto(" ^ ll128 ", "LL128"), "^LL128");
  EXPECT(!tune_parse_proto("LL,Simple", "LL128") && !tune_parse_proto("Simple", "LL128"), "not named: off");
  EXPECT(tune_parse_proto("LL,LL128", "LL128") && tune_parse_proto("^LL", "LL128"), "named or kept");
  /* the bands: LL held to half of each LL ring, 0 turns a protocol off, the list excludes it */
  char b[2];
  task_t t = call_of(OP_ALLREDUCE, 1, 0, 0, 0, &b[0], &b[1], float_sum());
  tune_knobs_t k = knobs_of("", THR);
  k.ll_max = 1ll << 30;
  EXPECT(shape_of(&t, 3, &k).ll_max == PLAN_LL_MAX, "the threshold is bounded by half of each LL ring");
  k.ll_max = 0;
  EXPECT(shape_of(&t, 3, &k).ll_max == 0, "0 turns LL off");
  k = knobs_of("", THR);
  EXPECT(shape_of(&t, 2, &k).ll128_max > 0 && shape_of(&t, 3, &k).ll128_max == 0, "LL128 on two ranks");
  k.ll128 = 0;
  EXPECT(shape_of(&t, 2, &k).ll128_max == 0, "NCCL_PROTO=^LL128 turns it off");
}

/* ---- Running plans under the GPU executor's rules ---- */

/* Messages in flight on the connection from one rank to another, oldest first. */
typedef struct {
  char *msg[64];
  size_t bytes[64];
  int head, tail;
} fifo_t;

static fifo_t fifos[MAX_RANKS][MAX_RANKS];

/* Whether transfers x and y share a lane: a connection (send peer, receive peer, or both local), or XF_SEQ.
 */
static int same_lane(const xfer_t *x, const xfer_t *y) {
  int xl = x->send_peer < 0 && x->recv_peer < 0, yl = y->send_peer < 0 && y->recv_peer < 0;
  return (x->send_peer >= 0 && x->send_peer == y->send_peer) ||
         (x->recv_peer >= 0 && x->recv_peer == y->recv_peer) || (xl && yl) ||
         ((x->flags & XF_SEQ) && (y->flags & XF_SEQ));
}

/* Lanes of a step, as the GPU executor forms them: the transitive closure of same_lane. */
static void lanes_of(const xfer_t *x, int n, int *lane) {
  for (int i = 0; i < n; i++) lane[i] = i;
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < n; i++)
      for (int j = i + 1; j < n; j++)
        if (lane[i] != lane[j] && same_lane(&x[i], &x[j])) {
          int to = lane[i] < lane[j] ? lane[i] : lane[j], from = lane[i] < lane[j] ? lane[j] : lane[i];
          for (int m = 0; m < n; m++)
            if (lane[m] == from) lane[m] = to;
          changed = 1;
        }
  }
}

static int overlap(const char *a, size_t an, const char *b, size_t bn) {
  return a != NULL && b != NULL && an > 0 && bn > 0 && a < b + bn && b < a + an;
}

/* What a transfer reads locally: src, and dst too for a local reduction. */
static int reads(const xfer_t *x, const char *p, size_t n) {
  return overlap(x->src, x->bytes, p, n) ||
         (x->recv_peer < 0 && (x->flags & XF_REDUCE) && overlap(x->dst, x->bytes, p, n));
}

/* No two lanes of a step touch the same bytes where one of them writes. */
static void check_races(const plan_t *p, int rank) {
  int lane[4096];
  for (int s = 0; s < p->nsteps; s++) {
    const xfer_t *x = &p->xfers[p->steps[s].first];
    int n = p->steps[s].count;
    EXPECT(n <= 4096);
    lanes_of(x, n, lane);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++)
        if (i != j && lane[i] != lane[j] && x[i].dst != NULL)
          EXPECT(!reads(&x[j], x[i].dst, x[i].bytes) && !overlap(x[i].dst, x[i].bytes, x[j].dst, x[j].bytes),
                 "rank %d step %d: transfer %d writes bytes that transfer %d of another lane uses", rank, s,
                 i, j);
  }
}

/* Runs transfer x of `rank` if what it receives has arrived, as the kernel would (reduce.cuh). */
static int run_xfer(const xfer_t *x, int rank) {
  char *in = NULL, *res = malloc(x->bytes + 1);
  size_t elems = x->bytes / x->esize;
  if (x->recv_peer >= 0) {
    fifo_t *f = &fifos[x->recv_peer][rank];
    if (f->head == f->tail) {
      free(res);
      return 0;
    }
    EXPECT(f->bytes[f->head % 64] == x->bytes, "rank %d receives %zu bytes from %d, expecting %zu", rank,
           f->bytes[f->head % 64], x->recv_peer, x->bytes);
    in = f->msg[f->head++ % 64];
  } else if (x->flags & XF_REDUCE) {
    in = malloc(x->bytes + 1);
    memcpy(in, x->dst, x->bytes);
  }
  red_t red = *x->red;
  if ((x->flags & XF_PREPARED) && red.kind == RED_PREMULSUM) red.kind = RED_SUM;
  if (in != NULL && (x->flags & XF_REDUCE))
    red_combine(&red, res, x->src, in, elems, (x->flags & XF_LAST) != 0);
  else if (in != NULL)
    memcpy(res, in, x->bytes);
  else if (x->flags & XF_PREPARE)
    red_prepare(&red, res, x->src, elems);
  else
    memcpy(res, x->src, x->bytes);
  free(in);
  if (x->dst != NULL) memcpy(x->dst, res, x->bytes);
  if (x->send_peer >= 0) {
    fifo_t *f = &fifos[rank][x->send_peer];
    EXPECT(f->tail - f->head < 64);
    f->bytes[f->tail % 64] = x->bytes;
    f->msg[f->tail++ % 64] = res;
  } else {
    free(res);
  }
  return 1;
}

/* Runs the plans of n ranks to the end: each rank's lanes in list order, step after step; a round in which
 * nothing can run means the plans disagree. */
static void run_plans(plan_t *plans, int n) {
  int step[MAX_RANKS] = {0}, lane[MAX_RANKS][4096];
  char *done[MAX_RANKS];
  memset(fifos, 0, sizeof fifos);
  for (int r = 0; r < n; r++) {
    done[r] = calloc((size_t)plans[r].nxfers + 1, 1);
    if (plans[r].nsteps > 0)
      lanes_of(&plans[r].xfers[plans[r].steps[0].first], plans[r].steps[0].count, lane[r]);
  }
  for (int left = 1; left;) {
    int moved = 0;
    left = 0;
    for (int r = 0; r < n; r++) {
      plan_t *p = &plans[r];
      if (step[r] >= p->nsteps) continue;
      const step_t *st = &p->steps[step[r]];
      int pending = 0;
      for (int i = 0; i < st->count; i++) {
        if (done[r][st->first + i]) continue;
        int blocked = 0; /* an earlier transfer of its lane is not done */
        for (int j = 0; j < i && !blocked; j++) blocked = lane[r][j] == lane[r][i] && !done[r][st->first + j];
        if (!blocked && run_xfer(&p->xfers[st->first + i], r)) {
          done[r][st->first + i] = 1;
          moved = 1;
        } else {
          pending = 1;
        }
      }
      if (!pending && ++step[r] < p->nsteps)
        lanes_of(&p->xfers[p->steps[step[r]].first], p->steps[step[r]].count, lane[r]);
      left |= step[r] < p->nsteps;
    }
    EXPECT(moved || !left, "the plans wait for each other");
  }
  for (int a = 0; a < n; a++) {
    for (int b = 0; b < n; b++)
      EXPECT(fifos[a][b].head == fifos[a][b].tail, "%d -> %d: data left over", a, b);
    free(done[a]);
  }
}

/* An operation of the run test and its inputs: element j of rank r. */
typedef struct {
  const char *name;
  red_t red;
  double (*value)(int r, size_t j);
} op_case_t;

static double val_float(int r, size_t j) { /* mantissas that make the order of a sum matter */
  return (double)(float)(((r * 7919 + (int)j * 104729) % 20011) / 1999.7 - 5.0);
}
static double val_int(int r, size_t j) {
  return (double)(((r * 31 + (int)j * 17) % 201) - 100);
}

/* Element j of a buffer of `type` (float or int32) as a double, and the reverse. */
static double get(const char *buf, size_t j, ncclDataType_t type) {
  if (type == ncclFloat32) {
    float f;
    memcpy(&f, buf + j * 4, 4);
    return f;
  }
  int32_t i;
  memcpy(&i, buf + j * 4, 4);
  return i;
}
static void put(char *buf, size_t j, ncclDataType_t type, double v) {
  if (type == ncclFloat32) {
    float f = (float)v;
    memcpy(buf + j * 4, &f, 4);
  } else {
    int32_t i = (int32_t)v;
    memcpy(buf + j * 4, &i, 4);
  }
}

/* The PreMulSum factor of rank r: a power of two, so that scaling is exact in any order. */
static double factor(int r) {
  return (double)(1 << (r % 3)) / 2.0;
}

/* Element j of the reduction over n ranks, combined in rank order as a float or an int32 would be. */
static double expect_reduced(const op_case_t *oc, int n, size_t j) {
  float f = 0;
  int64_t i = 0;
  for (int r = 0; r < n; r++) {
    double x = oc->value(r, j);
    float xf = (float)(oc->red.kind == RED_PREMULSUM ? x * factor(r) : x);
    switch (oc->red.kind) {
    case RED_PROD:
      f = r == 0 ? xf : f * xf;
      i = r == 0 ? (int64_t)x : i * (int64_t)x;
      break;
    case RED_MAX:
      i = r == 0 || (int64_t)x > i ? (int64_t)x : i;
      break;
    case RED_MIN:
      i = r == 0 || (int64_t)x < i ? (int64_t)x : i;
      break;
    default:
      f = r == 0 ? xf : f + xf;
      i += (int64_t)x;
    }
  }
  if (oc->red.kind == RED_SUM_POSTDIV) return (double)(int32_t)(i / n);
  return oc->red.type == ncclFloat32 ? (double)f : (double)(int32_t)i;
}

/* One collective on n ranks, planned with the tuning, run and checked. */
static void run_tuned(op_kind_t kind, const op_case_t *oc, int n, size_t count, int inplace_mask,
                      const tune_knobs_t *tuning) {
  static plan_t plans[MAX_RANKS];
  size_t es = 4, region = (size_t)n * count * es + 64;
  char *mem[MAX_RANKS];
  const char *out[MAX_RANKS];
  const int root = n > 2 ? 2 : n - 1;
  for (int r = 0; r < n; r++) {
    mem[r] = calloc(2, region);
    red_t red = oc->red;
    if (red.kind == RED_PREMULSUM) red.fscale = factor(r);
    task_t t = call_of(kind, count, root, r, (inplace_mask >> r) & 1, mem[r], mem[r] + region, red);
    size_t nin = kind == OP_REDUCESCATTER ? (size_t)n * count : count;
    for (size_t j = 0; j < nin; j++) put((char *)t.sendbuff, j, red.type, oc->value(r, j));
    out[r] = t.recvbuff;
    plan_reset(&plans[r]);
    EXPECT_OK(plan_add_task(&plans[r], &t));
    EXPECT_OK(build_tuned(&plans[r], r, n, tuning));
    check_races(&plans[r], r);
  }
  run_plans(plans, n);
  for (int r = 0; r < n; r++)
    for (size_t j = 0; j < (kind == OP_ALLGATHER ? (size_t)n * count : count); j++) {
      double want;
      if (kind == OP_ALLREDUCE || (kind == OP_REDUCE && r == root))
        want = expect_reduced(oc, n, j);
      else if (kind == OP_REDUCESCATTER)
        want = expect_reduced(oc, n, (size_t)r * count + j);
      else if (kind == OP_BROADCAST)
        want = oc->value(root, j);
      else if (kind == OP_ALLGATHER)
        want = oc->value((int)(j / count), j % count);
      else
        continue;
      double got = get(out[r], j, oc->red.type);
      EXPECT(got == want,
             "%s %s on %d ranks, count %zu, in place %#x: rank %d element %zu is %.9g, expected %.9g",
             plan_op_name(kind), oc->name, n, count, inplace_mask, r, j, got, want);
    }
  if (kind == OP_ALLREDUCE)
    for (int r = 1; r < n; r++)
      EXPECT(memcmp(out[r], out[0], count * es) == 0, "%s: ranks 0 and %d differ in the bits", oc->name, r);
  for (int r = 0; r < n; r++) free(mem[r]);
}

/* One collective on n ranks, one-shot, run and checked. */
static void run_case(op_kind_t kind, const op_case_t *oc, int n, size_t count, int inplace_mask) {
  tune_knobs_t tuning = knobs_of("OneShot", THR);
  run_tuned(kind, oc, n, count, inplace_mask, &tuning);
}

static const op_case_t run_ops[] = {
    {"float sum", {.kind = RED_SUM, .type = ncclFloat32, .fscale = 1, .iscale = 1, .divisor = 1}, val_float},
    {"float prod",
     {.kind = RED_PROD, .type = ncclFloat32, .fscale = 1, .iscale = 1, .divisor = 1},
     val_float},
    {"float premulsum", {.kind = RED_PREMULSUM, .type = ncclFloat32, .iscale = 1, .divisor = 1}, val_float},
    {"int32 max", {.kind = RED_MAX, .type = ncclInt32, .fscale = 1, .iscale = 1, .divisor = 1}, val_int},
    {"int32 min", {.kind = RED_MIN, .type = ncclInt32, .fscale = 1, .iscale = 1, .divisor = 1}, val_int},
    {"int32 avg", {.kind = RED_SUM_POSTDIV, .type = ncclInt32, .fscale = 1, .iscale = 1}, val_int},
};

static void oneshot_runs(void) {
  const op_case_t *ops = run_ops;
  const size_t nops = sizeof run_ops / sizeof run_ops[0];

  static const size_t counts[] = {1, 7, 33};
  for (int n = 2; n <= MAX_RANKS; n++)
    for (size_t k = 0; k < NCHOICE; k++)
      for (size_t o = 0; o < nops; o++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
          op_case_t oc = ops[o];
          if (oc.red.kind == RED_SUM_POSTDIV) oc.red.divisor = n;
          int masks[] = {0, (1 << n) - 1, 0x55 & ((1 << n) - 1)}; /* none, all, even ranks in place */
          for (int m = 0; m < 3; m++) run_case(choice_kinds[k], &oc, n, counts[c], masks[m]);
        }
}

/* A two-rank ring all-reduce past the split row (core/tune.c): two steps (each rank reduces its half, then
 * the halves cross), every operation, odd counts, in and out of place on either rank, checked element by
 * element; and below the threshold, or on three ranks, the fused ring's one step. */
static void split_runs(void) {
  tune_knobs_t tuning = knobs_of("Ring", THR);
  tuning.ar_split = 64;
  static const size_t counts[] = {16, 17, 1001};
  for (size_t o = 0; o < sizeof run_ops / sizeof run_ops[0]; o++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      op_case_t oc = run_ops[o];
      if (oc.red.kind == RED_SUM_POSTDIV) oc.red.divisor = 2;
      for (int m = 0; m < 4; m++) run_tuned(OP_ALLREDUCE, &oc, 2, counts[c], m, &tuning);
    }
  static char b[2 * 4096];
  for (int n = 2; n <= 3; n++)
    for (size_t count = 15; count <= 16; count++) {
      plan_t p = {0};
      task_t t = call_of(OP_ALLREDUCE, count, 0, 0, 0, &b[0], &b[4096], float_sum());
      EXPECT_OK(plan_add_task(&p, &t));
      EXPECT_OK(build_tuned(&p, 0, n, &tuning));
      int want = n == 2 && count * 4 >= 64 ? 2 : 1;
      EXPECT(p.nsteps == want, "%zu floats on %d ranks: %d steps, expected %d", count, n, p.nsteps, want);
      if (want == 2) /* the second step only copies: the copy engines may take it */
        for (int i = p.steps[1].first; i < p.steps[1].first + p.steps[1].count; i++)
          EXPECT(p.xfers[i].flags == 0 && (p.xfers[i].send_peer < 0 || p.xfers[i].recv_peer < 0),
                 "the all-gather step's transfer %d combines or forwards", i);
      plan_free(&p);
    }
}

/* Builds one all-reduce of `count` floats on rank 0 of 2 with the tuning. */
static void build_allreduce(size_t count, const tune_knobs_t *tuning) {
  static char b[2];
  plan_t p = {0};
  task_t t = call_of(OP_ALLREDUCE, count, 0, 0, 0, &b[0], &b[1], float_sum());
  EXPECT_OK(plan_add_task(&p, &t));
  EXPECT_OK(build_tuned(&p, 0, 2, tuning));
  plan_free(&p);
}

/* NCCL_DEBUG_SUBSYS=TUNING logs each choice once per collective and power-of-two size class at INFO, every
 * call at TRACE, and nothing for the host executor. */
static void tuning_log(void) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/braid_test_plan.%d.log", (int)getpid());
  setenv("NCCL_DEBUG_FILE", path, 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  param_reload();
  log_init();
  tune_knobs_t tuning = knobs_of("", THR);
  build_allreduce(2, &tuning);
  build_allreduce(3, &tuning); /* 8 and 12 bytes: one size class */
  build_allreduce(2, NULL);    /* the host executor: nothing logged */
  build_allreduce(1 << 20, &tuning);
  build_allreduce(1 << 20, &tuning);
  EXPECT(test_file_lines(path, "AllReduce of") == 2, "%d lines", test_file_lines(path, "AllReduce of"));
  EXPECT(test_file_lines(path, "AllReduce of 8 bytes (float sum, 2 ranks, call 0): OneShot") == 1);
  EXPECT(test_file_lines(path, ": Ring, more than BRAID_ONESHOT_MAX_BYTES") == 1);
  setenv("NCCL_DEBUG", "TRACE", 1);
  param_reload();
  log_init(); /* opens the file again, empty */
  for (int i = 0; i < 3; i++) build_allreduce(2, &tuning);
  EXPECT(test_file_lines(path, "AllReduce of 8 bytes") == 3, "TRACE logs every call");
  unlink(path);
}

int main(void) {
  TEST(plans_agree, 120);
  TEST(rings_are_sliced, 30);
  TEST(deterministic, 30);
  TEST(steps, 30);
  TEST(inplace_exchange, 30);
  TEST(self_p2p, 30);
  TEST(noop_calls, 10);
  TEST(oneshot_plans_agree, 120);
  TEST(oneshot_choice, 30);
  TEST(algo_knob, 30);
  TEST(proto_knob, 30);
  TEST(oneshot_runs, 300);
  TEST(split_runs, 60);
  TEST(tuning_log, 30);
  return test_summary();
}
