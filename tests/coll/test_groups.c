/*
 * Groups and communicators beyond single calls: collectives mixed with many send/recv pairs in one group,
 * self-sends, two communicators used at once, split communicators, non-blocking init, one thread driving
 * every rank (ncclCommInitAll), nested groups, and ncclGroupSimulateEnd.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "coll_check.h"
#include "data.h"
#include "harness.h"

static ncclUniqueId id, id2;

/* Each rank sends a block to every rank (itself included) with several sends per pair, plus an all-reduce
 * in the same group, and checks everything it received. */
static void p2p_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  const int per_pair = 3;
  const size_t cnt = 1001;
  int *send = malloc(n * per_pair * cnt * sizeof(int)), *recv = malloc(n * per_pair * cnt * sizeof(int));
  float *ar_in = malloc(513 * sizeof(float)), *ar_out = malloc(513 * sizeof(float));
  for (size_t j = 0; j < n * per_pair * cnt; j++) send[j] = (int)(rank * 1000003 + j * 7);
  data_fill(ar_in, 513, 77, rank, ncclFloat32, ncclSum);
  data_poison(recv, n * per_pair * cnt * sizeof(int));
  data_poison(ar_out, 513 * sizeof(float));
  EXPECT_OK(ncclGroupStart());
  for (int k = 0; k < per_pair; k++)
    for (int s = 0; s < n; s++) {
      int to = (rank + s) % n, from = (rank - s + n) % n;
      EXPECT_OK(ncclSend(send + (to * per_pair + k) * cnt, cnt, ncclInt32, to, comm, NULL));
      EXPECT_OK(ncclRecv(recv + (from * per_pair + k) * cnt, cnt, ncclInt32, from, comm, NULL));
    }
  EXPECT_OK(ncclAllReduce(ar_in, ar_out, 513, ncclFloat32, ncclSum, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  for (int from = 0; from < n; from++)
    for (int k = 0; k < per_pair; k++)
      for (size_t j = 0; j < cnt; j++) {
        int want = (int)(from * 1000003 + ((rank * per_pair + k) * cnt + j) * 7);
        int got = recv[(from * per_pair + k) * cnt + j];
        EXPECT(got == want, "rank %d: element %zu of send %d from rank %d is %d, expected %d", rank, j, k,
               from, got, want);
      }
  for (size_t i = 0; i < 513; i++)
    EXPECT(ar_out[i] == data_expect(77, n, i, ncclFloat32, ncclSum, 0), "rank %d: all-reduce element %zu",
           rank, i);
  EXPECT_OK(ncclCommDestroy(comm));
}

static void p2p_mixed(void) {
  for (int n = 1; n <= 5; n += 2) {
    EXPECT_OK(ncclGetUniqueId(&id));
    EXPECT(run_ranks(n, 120, p2p_rank, NULL) == 0, "%d ranks failed", n);
  }
}

/* Two communicators over the same ranks, used alternately and inside one group. */
static void two_comms_rank(int rank, int n, void *arg) {
  ncclComm_t a, b;
  EXPECT_OK(ncclCommInitRank(&a, n, id, rank));
  EXPECT_OK(ncclCommInitRank(&b, n, id2, n - 1 - rank));
  for (int i = 0; i < 4; i++) {
    coll_case_t c = {.kind = K_ALLREDUCE, .type = ncclInt32, .op = ncclSum, .count = 4099, .seed = 500 + i};
    coll_check(i % 2 ? a : b, &c);
  }
  float x[3] = {1, 2, 3}, ya[3], yb[3];
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(x, ya, 3, ncclFloat32, ncclSum, a, NULL));
  EXPECT_OK(ncclAllReduce(x, yb, 3, ncclFloat32, ncclMax, b, NULL));
  EXPECT_OK(ncclGroupEnd());
  for (int i = 0; i < 3; i++) EXPECT(ya[i] == x[i] * n && yb[i] == x[i], "two communicators in one group");
  EXPECT_OK(ncclCommDestroy(a));
  EXPECT_OK(ncclCommDestroy(b));
}

static void two_comms(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclGetUniqueId(&id2));
  EXPECT(run_ranks(3, 120, two_comms_rank, NULL) == 0, "a rank failed");
}

/* Split 5 ranks by parity (keys reversing the order) and with one rank opting out. */
static void split_rank(int rank, int n, void *arg) {
  ncclComm_t comm, half, none;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  EXPECT_OK(ncclCommSplit(comm, rank % 2, -rank, &half, NULL));
  int hn, hr;
  EXPECT_OK(ncclCommCount(half, &hn));
  EXPECT_OK(ncclCommUserRank(half, &hr));
  int members = rank % 2 ? n / 2 : (n + 1) / 2;
  EXPECT(hn == members, "rank %d: split has %d ranks, expected %d", rank, hn, members);
  int higher = 0;
  for (int r = rank + 2; r < n; r += 2) higher++;
  EXPECT(hr == higher, "rank %d: rank %d in split, expected %d (keys reverse the order)", rank, hr, higher);
  int v = rank, sum = -1;
  EXPECT_OK(ncclAllReduce(&v, &sum, 1, ncclInt32, ncclSum, half, NULL));
  int want = 0;
  for (int r = rank % 2; r < n; r += 2) want += r;
  EXPECT(sum == want, "rank %d: sum over split is %d, expected %d", rank, sum, want);
  EXPECT_OK(ncclCommSplit(comm, rank == 0 ? NCCL_SPLIT_NOCOLOR : 7, 0, &none, NULL));
  EXPECT((rank == 0) == (none == NULL), "rank %d: NOCOLOR gives NULL, others a communicator", rank);
  if (none != NULL) {
    coll_case_t c = {.kind = K_ALLGATHER, .type = ncclUint8, .count = 33, .seed = 9};
    coll_check(none, &c);
    EXPECT_OK(ncclCommDestroy(none));
  }
  EXPECT_OK(ncclCommDestroy(half));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void split(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(5, 120, split_rank, NULL) == 0, "a rank failed");
}

/* Non-blocking init: ncclInProgress, then ncclCommGetAsyncError until ncclSuccess. */
static void nonblocking_rank(int rank, int n, void *arg) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm;
  ncclResult_t res = ncclCommInitRankConfig(&comm, n, id, rank, &config);
  EXPECT(res == ncclInProgress || res == ncclSuccess, "non-blocking init returned %d", res);
  ncclResult_t state;
  do EXPECT_OK(ncclCommGetAsyncError(comm, &state));
  while (state == ncclInProgress);
  EXPECT(state == ncclSuccess, "init ended with %d", state);
  coll_case_t c = {.kind = K_BROADCAST, .type = ncclFloat64, .count = 1000, .root = 1, .seed = 3};
  coll_check(comm, &c);
  EXPECT_OK(ncclCommDestroy(comm));
}

static void nonblocking_init(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(3, 120, nonblocking_rank, NULL) == 0, "a rank failed");
}

/* One thread drives 4 ranks: ncclCommInitAll, then grouped calls over all of them, nested groups. */
static void init_all(void) {
  enum { N = 4, CNT = 100003 };
  ncclComm_t comms[N];
  EXPECT_OK(ncclCommInitAll(comms, N, NULL));
  float *in[N], *out[N];
  for (int r = 0; r < N; r++) {
    in[r] = malloc(CNT * sizeof(float));
    out[r] = malloc(CNT * sizeof(float));
    data_fill(in[r], CNT, 11, r, ncclFloat32, ncclSum);
    data_poison(out[r], CNT * sizeof(float));
  }
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupStart());
  for (int r = 0; r < N; r++)
    EXPECT_OK(ncclAllReduce(in[r], out[r], CNT, ncclFloat32, ncclSum, comms[r], NULL));
  EXPECT_OK(ncclGroupEnd());
  for (int r = 0; r < N; r++) EXPECT_OK(ncclSend(in[r], 10, ncclFloat32, (r + 1) % N, comms[r], NULL));
  for (int r = 0; r < N; r++)
    EXPECT_OK(ncclRecv(in[r] + 10, 10, ncclFloat32, (r + N - 1) % N, comms[r], NULL));
  EXPECT_OK(ncclGroupEnd());
  for (int r = 0; r < N; r++)
    for (size_t i = 0; i < CNT; i++)
      EXPECT(out[r][i] == data_expect(11, N, i, ncclFloat32, ncclSum, 0), "rank %d element %zu", r, i);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_OK(ncclGroupStart());
  for (int r = 0; r < N; r++)
    EXPECT_OK(ncclAllReduce(in[r], out[r], CNT, ncclFloat32, ncclSum, comms[r], NULL));
  EXPECT_OK(ncclGroupSimulateEnd(&sim));
  EXPECT(sim.estimatedTime > 0, "simulated time %f", sim.estimatedTime);
  /* one thread finalizes every rank: inside a group, the finalizes wait for each other at ncclGroupEnd */
  EXPECT_OK(ncclGroupStart());
  for (int r = 0; r < N; r++) EXPECT_OK(ncclCommFinalize(comms[r]));
  EXPECT_OK(ncclGroupEnd());
  for (int r = 0; r < N; r++) EXPECT_OK(ncclCommDestroy(comms[r]));
}

/* Ranks as threads of one process, each with its own ncclCommInitRank. */
static void *thread_rank(void *arg) {
  int rank = (int)(intptr_t)arg;
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, 3, id, rank));
  coll_case_t c = {.kind = K_REDUCESCATTER, .type = ncclInt64, .op = ncclMax, .count = 777, .seed = 21};
  coll_check(comm, &c);
  EXPECT_OK(ncclCommDestroy(comm));
  return NULL;
}

static void threads(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  pthread_t t[3];
  for (int r = 0; r < 3; r++) pthread_create(&t[r], NULL, thread_rank, (void *)(intptr_t)r);
  for (int r = 0; r < 3; r++) pthread_join(t[r], NULL);
}

/* Calls of one group run in order: an in-place all-to-all sends what the all-reduce before it produced. */
static void ordered_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  enum { CNT = 1000 };
  int x[3 * CNT], y[3 * CNT];
  for (int i = 0; i < n * CNT; i++) x[i] = i * (rank + 1);
  data_poison(y, sizeof y);
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(x, y, n * CNT, ncclInt32, ncclSum, comm, NULL));
  EXPECT_OK(ncclAlltoAll(y, y, CNT, ncclInt32, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  /* Every rank holds the same sums, so block p of the result is block `rank` of the sums. */
  for (int p = 0; p < n; p++)
    for (int i = 0; i < CNT; i++) {
      int j = rank * CNT + i, want = j * n * (n + 1) / 2;
      EXPECT(y[p * CNT + i] == want, "rank %d block %d element %d is %d, expected %d", rank, p, i,
             y[p * CNT + i], want);
    }
  EXPECT_OK(ncclCommDestroy(comm));
}

static void ordered_in_group(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(3, 120, ordered_rank, NULL) == 0, "a rank failed");
}

/* ncclCommInitRankScalable: 5 ranks spread over two roots. */
static void scalable_rank(int rank, int n, void *arg) {
  ncclUniqueId ids[2] = {id, id2};
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRankScalable(&comm, n, rank, 2, ids, NULL));
  coll_case_t c = {.kind = K_ALLTOALL, .type = ncclUint64, .count = 301, .seed = 31};
  coll_check(comm, &c);
  EXPECT_OK(ncclCommDestroy(comm));
}

static void scalable_init(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclGetUniqueId(&id2));
  EXPECT(run_ranks(5, 120, scalable_rank, NULL) == 0, "a rank failed");
}

/* A PreMulSum operation destroyed inside the group, after the call that uses it and before ncclGroupEnd (as
 * nccl-tests does): the call keeps the reduction it was made with. */
static void premul_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  enum { CNT = 257 };
  double in[CNT], out[CNT], scalar = 2.0;
  for (int i = 0; i < CNT; i++) in[i] = rank + i * 0.5;
  data_poison(out, sizeof out);
  ncclRedOp_t op;
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat64, ncclScalarHostImmediate, comm));
  EXPECT_OK(ncclAllReduce(in, out, CNT, ncclFloat64, op, comm, NULL));
  EXPECT_OK(ncclRedOpDestroy(op, comm));
  EXPECT_OK(ncclGroupEnd());
  for (int i = 0; i < CNT; i++) {
    double want = 2.0 * (n * (n - 1) / 2.0 + n * i * 0.5);
    EXPECT(out[i] == want, "rank %d element %d is %g, expected %g", rank, i, out[i], want);
  }
  EXPECT_OK(ncclCommDestroy(comm));
}

static void premul_destroyed_in_group(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(3, 120, premul_rank, NULL) == 0, "a rank failed");
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(p2p_mixed, 300);
  TEST(two_comms, 200);
  TEST(split, 200);
  TEST(nonblocking_init, 200);
  TEST(init_all, 200);
  TEST(threads, 200);
  TEST(scalable_init, 200);
  TEST(ordered_in_group, 200);
  TEST(premul_destroyed_in_group, 200);
  return test_summary();
}
