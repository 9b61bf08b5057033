/*
 * Every collective x data type x operation x in/out of place x size (0, 1, odd, about 1 MiB, and larger than
 * the transport's staging ring), with 1, 2, 3, 4, 5 and 8 ranks, each rank a process on the host backend,
 * checked against independently computed references.
 */
#include <stdlib.h>

#include "coll_check.h"
#include "harness.h"

/* Ops checked for reducing collectives: the five built-ins and PreMulSum with the scalar on the host and in
 * "device" residence (ncclNumOps, ncclNumOps + 1 in coll_case_t). */
#define N_OPS (ncclNumOps + 2)

static ncclUniqueId id;

static int reduces(kind_t k) {
  return k == K_ALLREDUCE || k == K_REDUCE || k == K_REDUCESCATTER;
}

/* Small sizes: every type and operation. */
static void run_small(ncclComm_t comm, int n, uint64_t *seed) {
  static const size_t counts[] = {0, 1, 7, 1031};
  for (int k = 0; k < K_COUNT; k++)
    for (int t = 0; t < ncclNumTypes; t++)
      for (int op = 0; op < (reduces(k) ? N_OPS : 1); op++)
        for (size_t s = 0; s < sizeof counts / sizeof counts[0]; s++)
          for (int inplace = 0; inplace < 2; inplace++) {
            coll_case_t c = {.kind = k,
                             .type = t,
                             .op = op,
                             .count = counts[s],
                             .inplace = inplace,
                             .root = (int)(*seed % n),
                             .offset = (int)(*seed % 3),
                             .seed = (*seed)++};
            coll_check(comm, &c);
          }
}

/* Large sizes (about 1 MiB per rank, and 3 MiB + a few bytes): a few types, sum, both placements. The
 * staging ring is set to 64 KiB for this test, so both exceed it many times. */
static void run_large(ncclComm_t comm, int n, uint64_t *seed) {
  static const struct {
    ncclDataType_t type;
    size_t count;
  } sizes[] = {{ncclFloat32, 262147}, {ncclInt8, 3 * 1048576 + 5}, {ncclBfloat16, 524289}};
  for (int k = 0; k < K_COUNT; k++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
      for (int inplace = 0; inplace < 2; inplace++) {
        size_t count = sizes[s].count / (k == K_ALLGATHER || k == K_ALLTOALL || k == K_GATHER ||
                                                 k == K_SCATTER || k == K_REDUCESCATTER
                                             ? (size_t)n
                                             : 1);
        coll_case_t c = {.kind = k,
                         .type = sizes[s].type,
                         .op = ncclSum,
                         .count = count,
                         .inplace = inplace,
                         .root = n - 1,
                         .offset = inplace,
                         .seed = (*seed)++};
        coll_check(comm, &c);
      }
}

static void rank_main(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  uint64_t seed = 1000 * n;
  run_small(comm, n, &seed);
  run_large(comm, n, &seed);
  EXPECT_OK(ncclCommFinalize(comm));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void run_with(int n) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(n, 500, rank_main, NULL) == 0, "a rank failed");
}

static void ranks_1(void) {
  run_with(1);
}
static void ranks_2(void) {
  run_with(2);
}
static void ranks_3(void) {
  run_with(3);
}
static void ranks_4(void) {
  run_with(4);
}
static void ranks_5(void) {
  run_with(5);
}
static void ranks_8(void) {
  run_with(8);
}

int main(void) {
  setenv("BRAID_HOST_BUFFSIZE", "65536", 1);
  TEST(ranks_1, 500);
  TEST(ranks_2, 500);
  TEST(ranks_3, 500);
  TEST(ranks_4, 500);
  TEST(ranks_5, 500);
  TEST(ranks_8, 500);
  return test_summary();
}
