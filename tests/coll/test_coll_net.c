/*
 * Collectives over the net transport (TCP sockets) between ranks of one machine, forced with
 * NCCL_SHM_DISABLE=1: every kind, a spread of types and operations, small and large sizes.
 */
#include <stdlib.h>

#include "coll_check.h"
#include "harness.h"

static ncclUniqueId id;

static void rank_main(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  static const ncclDataType_t types[] = {ncclInt8,    ncclUint32,   ncclFloat16,   ncclFloat32,
                                         ncclFloat64, ncclBfloat16, ncclFloat8e5m2};
  static const size_t counts[] = {0, 1, 999, 300007};
  uint64_t seed = 1;
  for (int k = 0; k < K_COUNT; k++)
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
      for (size_t s = 0; s < sizeof counts / sizeof counts[0]; s++) {
        coll_case_t c = {.kind = k,
                         .type = types[t],
                         .op = (int)((seed + t) % (ncclNumOps + 1)),
                         .count = counts[s],
                         .inplace = (int)(seed % 2),
                         .root = (int)(seed % n),
                         .offset = (int)(seed % 5),
                         .seed = seed};
        seed++;
        coll_check(comm, &c);
      }
  EXPECT_OK(ncclCommDestroy(comm));
}

static void run_with(int n) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(n, 300, rank_main, NULL) == 0, "a rank failed");
}

static void net_2(void) {
  run_with(2);
}
static void net_3(void) {
  run_with(3);
}
static void net_4(void) {
  run_with(4);
}

int main(void) {
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("BRAID_HOST_BUFFSIZE", "131072", 1);
  TEST(net_2, 300);
  TEST(net_3, 300);
  TEST(net_4, 300);
  return test_summary();
}
