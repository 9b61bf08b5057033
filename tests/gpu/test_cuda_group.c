/*
 * Groups and several communicators on GPUs:
 *   procs_group_mix    one ncclGroupStart/End holding every collective, with different types, operations,
 *                      counts and roots, plus a ring send/recv and a send/recv to self, on one stream;
 *   procs_group_streams the same group with its calls spread over two streams;
 *   single_group_mix   the same group issued for every GPU by one thread (ncclCommInitAll);
 *   procs_split_streams a communicator and two splits of it (one with the ranks reversed), each with its own
 *                      stream, with many calls in flight on all three at once before anything is waited for;
 *   procs_two_streams  one communicator whose calls alternate between two streams, all in flight before
 *                      anything is waited for (ranks sharing a GPU: each call waits for the last);
 *   procs_wide_mixed   transfers of 8 MiB and more, whose channels each follows from its own size on two
 * ranks (BRAID_WIDE_STEPS=3), where the ranks' steps differ: an all-to-all and an all-gather out of place on
 * rank 0 and in place on the others, a send/receive ring beside a send and receive to self on rank 0 only, in
 * one group. Every call's outputs are checked as in the matrix (cuda_case.h); a hang is reported by the
 * watchdog.
 */
#include <string.h>

#include "coll_check.h"
#include "cuda_case.h"
#include "data.h"
#include "harness.h"

#define TIMEOUT_S 60
#define POOL      ((size_t)64 << 20)

/* The calls of the mixed group (roots are reduced modulo the number of ranks). */
static const coll_case_t mix[] = {
    {.kind = K_ALLREDUCE, .type = ncclFloat32, .op = ncclSum, .count = 1031},
    {.kind = K_BROADCAST, .type = ncclInt32, .count = 65539, .root = 1, .inplace = 1},
    {.kind = K_REDUCESCATTER, .type = ncclBfloat16, .op = ncclMax, .count = 500001},
    {.kind = K_ALLGATHER, .type = ncclInt8, .count = 7, .inplace = 1},
    {.kind = K_ALLTOALL, .type = ncclFloat64, .count = 4099},
    {.kind = K_SENDRECV, .type = ncclUint8, .count = 100003},
    {.kind = K_REDUCE, .type = ncclFloat16, .op = ncclNumOps + 1, .count = 1031, .root = 0},
    {.kind = K_GATHER, .type = ncclUint64, .count = 513, .root = 1},
    {.kind = K_SCATTER, .type = ncclFloat8e4m3, .count = 1001, .root = 0},
    {.kind = K_ALLREDUCE, .type = ncclInt64, .op = ncclProd, .count = 1},
    {.kind = K_ALLREDUCE, .type = ncclUint32, .op = ncclAvg, .count = 2000003, .inplace = 1},
    {.kind = K_SENDRECV, .type = ncclFloat8e5m2, .count = 0},
    {.kind = K_REDUCE, .type = ncclInt32, .op = ncclMin, .count = 3000001, .root = 1},
};
#define N_MIX ((int)(sizeof mix / sizeof mix[0]))

/* A send to self and a receive from self, inside the caller's group. */
typedef struct {
  cuda_rank_t *r;
  int rank;
  size_t count;
  char *in, *out;
} self_t;

static void self_prepare(self_t *s, cuda_rank_t *r, int rank, size_t count) {
  s->r = r;
  s->rank = rank;
  s->count = count;
  size_t bytes = s->count * sizeof(int32_t);
  char *img = cuda_halloc(r, bytes);
  data_fill(img, s->count, 99, rank, ncclInt32, ncclSum);
  s->in = cuda_dalloc(r, bytes);
  s->out = cuda_dalloc(r, bytes);
  cuda_upload(r, s->in, img, bytes);
  cuda_fill(r, s->out, 0x7b, bytes);
}

static void self_launch(self_t *s, ncclComm_t comm) {
  NCCL_OK(ncclSend(s->in, s->count, ncclInt32, s->rank, comm, s->r->stream), "send to self", comm);
  NCCL_OK(ncclRecv(s->out, s->count, ncclInt32, s->rank, comm, s->r->stream), "receive from self", comm);
}

static void self_check(self_t *s) {
  size_t bytes = s->count * sizeof(int32_t);
  char *got = cuda_halloc(s->r, bytes);
  cuda_sync(s->r->stream, "send/recv to self");
  cuda_download(s->r, got, s->out, bytes);
  for (size_t i = 0; i < s->count; i++) {
    double want = data_value(99, s->rank, i, ncclInt32, ncclSum), v = data_get(got, i, ncclInt32);
    EXPECT(v == want, "send/recv to self on rank %d: element %zu of %zu is %g, expected %g", s->rank, i,
           s->count, v, want);
  }
}

/* Prepares the mixed group's calls of one rank; call i runs on rs[i % nstreams]. */
static void mix_prepare(cuda_case_t *k, self_t *self, ncclComm_t comm, cuda_rank_t *rs, int nstreams, int n,
                        int rank, const char *mode) {
  for (int i = 0; i < N_MIX; i++) {
    coll_case_t c = mix[i];
    c.root %= n;
    c.offset = (int)((i % 3) * data_esize(c.type));
    c.seed = 4000 + (uint64_t)i;
    cuda_case_prepare(&k[i], comm, &rs[i % nstreams], &c, mode);
  }
  self_prepare(self, &rs[0], rank, 12345);
}

static void mix_launch(cuda_case_t *k, self_t *self, ncclComm_t comm) {
  for (int i = 0; i < N_MIX; i++) {
    cuda_case_launch(&k[i]);
    if (i == N_MIX / 2) self_launch(self, comm);
  }
}

static void mix_check(cuda_case_t *k, self_t *self) {
  for (int i = 0; i < N_MIX; i++) cuda_case_check(&k[i]);
  self_check(self);
}

static void group_end(const char *what, ncclComm_t comm) {
  NCCL_OK(ncclGroupEnd(), what, comm);
}

/* ---- One process per GPU ---- */

static void mix_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  int nstreams = *(int *)arg;
  const char *mode = nstreams == 1 ? "procs, one group" : "procs, one group over two streams";
  cuda_rank_t rs[2];
  for (int s = 0; s < nstreams; s++) cuda_rank_open(&rs[s], rank, POOL, 2 * POOL, NULL);
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank", TIMEOUT_S);
  EXPECT_OK(ncclCommInitRank(&comm, n, *id, rank));
  static cuda_case_t k[N_MIX];
  self_t self;
  for (int round = 0; round < 3; round++) {
    char what[128];
    snprintf(what, sizeof what, "[%s] round %d: %d calls in one group, rank %d of %d", mode, round, N_MIX + 2,
             rank, n);
    cuda_watch(what, TIMEOUT_S);
    mix_prepare(k, &self, comm, rs, nstreams, n, rank, mode);
    EXPECT_OK(ncclGroupStart());
    mix_launch(k, &self, comm);
    group_end(what, comm);
    mix_check(k, &self);
    for (int s = 0; s < nstreams; s++) cuda_rank_reset(&rs[s]);
  }
  cuda_watch("ncclCommDestroy", TIMEOUT_S);
  EXPECT_OK(ncclCommDestroy(comm));
  cuda_unwatch();
  for (int s = 0; s < nstreams; s++) cuda_rank_close(&rs[s]);
}

static void procs_group_mix(void) {
  int nstreams = 1;
  EXPECT(cuda_run_ranks(cuda_nranks, 3 * TIMEOUT_S, mix_rank, &nstreams) == 0, "a rank failed");
}

static void procs_group_streams(void) {
  int nstreams = 2;
  EXPECT(cuda_run_ranks(cuda_nranks, 3 * TIMEOUT_S, mix_rank, &nstreams) == 0, "a rank failed");
}

/* ---- One thread for every GPU ---- */

static void single_group_mix(void) {
  int n = cuda_nranks;
  static ncclComm_t comms[8];
  static cuda_rank_t rs[8];
  static cuda_case_t k[8][N_MIX];
  static self_t self[8];
  for (int i = 0; i < n; i++) cuda_rank_open(&rs[i], i, POOL, 2 * POOL, NULL);
  cuda_watch("ncclCommInitAll", TIMEOUT_S);
  EXPECT_OK(cuda_comm_init_all(comms, n));
  const char *what = "[single] every rank's mixed calls in one group";
  cuda_watch(what, TIMEOUT_S);
  for (int i = 0; i < n; i++) mix_prepare(k[i], &self[i], comms[i], &rs[i], 1, n, i, "single, one group");
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < n; i++) mix_launch(k[i], &self[i], comms[i]);
  group_end(what, comms[0]);
  for (int i = 0; i < n; i++) mix_check(k[i], &self[i]);
  cuda_watch("ncclCommDestroy", TIMEOUT_S);
  for (int i = 0; i < n; i++) EXPECT_OK(ncclCommDestroy(comms[i]));
  cuda_unwatch();
  for (int i = 0; i < n; i++) cuda_rank_close(&rs[i]);
}

/* ---- Several communicators, several streams ---- */

#define N_COMMS  3
#define N_ROUNDS 8

static void split_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  ncclComm_t comms[N_COMMS];
  cuda_rank_t rs[N_COMMS];
  for (int i = 0; i < N_COMMS; i++) cuda_rank_open(&rs[i], rank, POOL, 2 * POOL, NULL);
  cuda_watch("ncclCommInitRank and two ncclCommSplit", TIMEOUT_S);
  EXPECT_OK(ncclCommInitRank(&comms[0], n, *id, rank));
  EXPECT_OK(ncclCommSplit(comms[0], 0, rank, &comms[1], NULL));
  EXPECT_OK(ncclCommSplit(comms[0], 0, n - rank, &comms[2], NULL));
  int reversed;
  EXPECT_OK(ncclCommUserRank(comms[2], &reversed));
  EXPECT(reversed == n - 1 - rank, "rank %d is rank %d in the reversed split, expected %d", rank, reversed,
         n - 1 - rank);
  static cuda_case_t k[N_ROUNDS][N_COMMS];
  static const kind_t kinds[] = {K_ALLREDUCE, K_ALLGATHER, K_REDUCESCATTER, K_SENDRECV, K_BROADCAST};
  char what[160];
  snprintf(what, sizeof what,
           "[procs, 3 communicators on 3 streams] %d rounds of calls in flight at once, rank %d of %d",
           N_ROUNDS, rank, n);
  cuda_watch(what, 2 * TIMEOUT_S);
  for (int round = 0; round < N_ROUNDS; round++)
    for (int c = 0; c < N_COMMS; c++) {
      coll_case_t cc = {.kind = kinds[(round + c) % 5],
                        .type = c == 1 ? ncclBfloat16 : ncclFloat32,
                        .op = ncclSum,
                        .count = round % 2 ? 262147 : 4099,
                        .root = round % n,
                        .seed = 9000 + (uint64_t)(round * N_COMMS + c)};
      cuda_case_prepare(&k[round][c], comms[c], &rs[c], &cc, "procs, 3 communicators on 3 streams");
    }
  /* Nothing waits between these: all rounds of all communicators are queued before the first check. */
  for (int round = 0; round < N_ROUNDS; round++)
    for (int c = 0; c < N_COMMS; c++) cuda_case_launch(&k[round][c]);
  for (int round = 0; round < N_ROUNDS; round++)
    for (int c = 0; c < N_COMMS; c++) cuda_case_check(&k[round][c]);
  cuda_watch("ncclCommDestroy of a communicator and its splits", TIMEOUT_S);
  for (int c = N_COMMS - 1; c >= 0; c--) EXPECT_OK(ncclCommDestroy(comms[c]));
  cuda_unwatch();
  for (int i = 0; i < N_COMMS; i++) cuda_rank_close(&rs[i]);
}

static void procs_split_streams(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 4 * TIMEOUT_S, split_rank, NULL) == 0, "a rank failed");
}

/* ---- One communicator, calls alternating between two streams ---- */

#define N_ALTERNATE 16

static void alternate_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  (void)arg;
  const char *mode = "procs, one communicator on two streams";
  cuda_rank_t rs[2];
  for (int i = 0; i < 2; i++) cuda_rank_open(&rs[i], rank, POOL, 2 * POOL, NULL);
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank", TIMEOUT_S);
  EXPECT_OK(ncclCommInitRank(&comm, n, *id, rank));
  static cuda_case_t k[N_ALTERNATE];
  char what[160];
  snprintf(what, sizeof what, "[%s] %d calls in flight at once, rank %d of %d", mode, N_ALTERNATE, rank, n);
  cuda_watch(what, 2 * TIMEOUT_S);
  for (int i = 0; i < N_ALTERNATE; i++) {
    coll_case_t cc = {.kind = i % 3 == 2 ? K_BROADCAST : K_ALLREDUCE,
                      .type = ncclFloat32,
                      .op = ncclSum,
                      .count = i % 2 ? 4099 : 1,
                      .root = i % n,
                      .seed = 9500 + (uint64_t)i};
    cuda_case_prepare(&k[i], comm, &rs[i % 2], &cc, mode);
  }
  /* Nothing waits between these: every call is queued, alternating streams, before the first check. */
  for (int i = 0; i < N_ALTERNATE; i++) cuda_case_launch(&k[i]);
  for (int i = 0; i < N_ALTERNATE; i++) cuda_case_check(&k[i]);
  cuda_watch("ncclCommDestroy", TIMEOUT_S);
  EXPECT_OK(ncclCommDestroy(comm));
  cuda_unwatch();
  for (int i = 0; i < 2; i++) cuda_rank_close(&rs[i]);
}

static void procs_two_streams(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 3 * TIMEOUT_S, alternate_rank, NULL) == 0, "a rank failed");
}

/* ---- Large transfers where the ranks' steps differ ---- */

#define WIDE_POOL ((size_t)160 << 20)

static void wide_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  (void)arg;
  const char *mode = "procs, ranks' steps differing";
  cuda_rank_t r;
  cuda_rank_open(&r, rank, WIDE_POOL, 2 * WIDE_POOL, NULL);
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank", TIMEOUT_S);
  EXPECT_OK(ncclCommInitRank(&comm, n, *id, rank));
  /* blocks just over 8 MiB, odd counts, out of place on rank 0 only */
  const coll_case_t cases[] = {
      {.kind = K_ALLTOALL, .type = ncclFloat32, .count = (2u << 20) + 3, .inplace = rank != 0, .seed = 7100},
      {.kind = K_ALLGATHER, .type = ncclFloat32, .count = (2u << 20) + 5, .inplace = rank != 0, .seed = 7200},
      {.kind = K_SENDRECV, .type = ncclFloat32, .count = (2u << 20) + 7, .offset = 4, .seed = 7300},
  };
  const int ncases = (int)(sizeof cases / sizeof cases[0]);
  static cuda_case_t k[3];
  self_t self;
  for (int round = 0; round < 2; round++) {
    char what[160];
    snprintf(what, sizeof what, "[%s] round %d: all-to-all, all-gather, send/receive%s, rank %d of %d", mode,
             round, rank == 0 ? " and to itself" : "", rank, n);
    cuda_watch(what, TIMEOUT_S);
    for (int i = 0; i < ncases; i++) cuda_case_prepare(&k[i], comm, &r, &cases[i], mode);
    if (rank == 0) self_prepare(&self, &r, rank, (2u << 20) + 1);
    cuda_case_launch(&k[0]);
    cuda_case_launch(&k[1]);
    EXPECT_OK(ncclGroupStart());
    cuda_case_launch(&k[2]);
    if (rank == 0) self_launch(&self, comm);
    group_end(what, comm);
    for (int i = 0; i < ncases; i++) cuda_case_check(&k[i]);
    if (rank == 0) self_check(&self);
    cuda_rank_reset(&r);
  }
  cuda_watch("ncclCommDestroy", TIMEOUT_S);
  EXPECT_OK(ncclCommDestroy(comm));
  cuda_unwatch();
  cuda_rank_close(&r);
}

static void procs_wide_mixed(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 3 * TIMEOUT_S, wide_rank, NULL) == 0, "a rank failed");
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(procs_group_mix, 4 * TIMEOUT_S);
  TEST(procs_group_streams, 4 * TIMEOUT_S);
  TEST(single_group_mix, 4 * TIMEOUT_S);
  TEST(procs_split_streams, 5 * TIMEOUT_S);
  TEST(procs_two_streams, 4 * TIMEOUT_S);
  TEST(procs_wide_mixed, 4 * TIMEOUT_S);
  return test_summary();
}
