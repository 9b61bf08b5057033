/*
 * The planner as a pure function: for every collective, rank count and size, the plans of all ranks agree
 * (the k-th transfer rank a sends to rank b has the size of the k-th transfer b receives from a), every
 * ring transfer fits in a slice, building twice gives the same plan, and local mistakes are refused.
 */
#include <stdlib.h>
#include <string.h>

#include "core/plan.h"
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
  EXPECT_OK(plan_build(p, rank, n, SLICE));
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
  task_t recv = {.kind = OP_RECV, .recvbuff = buf, .count = 4, .type = ncclFloat32, .root = 1};
  task_t ar = {.kind = OP_ALLREDUCE, .sendbuff = buf, .recvbuff = buf, .count = 8, .type = ncclFloat32};
  EXPECT_OK(plan_add_task(&p, &send));
  EXPECT_OK(plan_add_task(&p, &ar));
  EXPECT_OK(plan_add_task(&p, &recv));
  EXPECT_OK(plan_add_task(&p, &ar));
  EXPECT_OK(plan_build(&p, 0, 2, SLICE));
  EXPECT(p.nsteps == 3, "%d steps", p.nsteps);
  EXPECT(p.steps[0].task->kind == OP_ALLREDUCE && p.steps[1].task->kind == OP_ALLREDUCE, "collectives first");
  EXPECT(p.steps[2].task->kind == OP_SEND && p.steps[2].count == 2, "then the point-to-point step");
  plan_free(&p);
}

/* A receive from self needs a send to self of the same size in the group. */
static void self_p2p(void) {
  plan_t p = {0};
  char buf[64];
  task_t send = {.kind = OP_SEND, .sendbuff = buf, .count = 4, .type = ncclFloat32, .root = 0};
  task_t recv = {.kind = OP_RECV, .recvbuff = buf + 16, .count = 4, .type = ncclFloat32, .root = 0};
  EXPECT_OK(plan_add_task(&p, &send));
  EXPECT_OK(plan_add_task(&p, &recv));
  EXPECT_OK(plan_build(&p, 0, 3, SLICE));
  EXPECT(p.nxfers == 1 && p.xfers[0].recv_peer < 0 && p.xfers[0].send_peer < 0, "a local copy");
  plan_reset(&p);
  recv.count = 5;
  EXPECT_OK(plan_add_task(&p, &send));
  EXPECT_OK(plan_add_task(&p, &recv));
  EXPECT_RES(plan_build(&p, 0, 3, SLICE), ncclInvalidUsage);
  plan_free(&p);
}

int main(void) {
  TEST(plans_agree, 120);
  TEST(rings_are_sliced, 30);
  TEST(deterministic, 30);
  TEST(steps, 30);
  TEST(self_p2p, 30);
  return test_summary();
}
