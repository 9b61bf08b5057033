/*
 * One rank of a multi-host run: `netns_rank RANK NRANKS` joins the communicator at NCCL_COMM_ID, runs every
 * collective kind on a spread of types and sizes, checks each result, and exits 0 only if all were right.
 * test_netns.sh starts one per network namespace (one "host" each).
 */
#include <stdio.h>
#include <stdlib.h>

#include "coll_check.h"
#include "harness.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: netns_rank RANK NRANKS (with NCCL_COMM_ID set)\n");
    return 2;
  }
  int rank = atoi(argv[1]), n = atoi(argv[2]);
  ncclUniqueId id;
  EXPECT_OK(ncclGetUniqueId(&id)); /* with NCCL_COMM_ID, every rank derives the same id */
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  static const ncclDataType_t types[] = {ncclInt32, ncclFloat32, ncclBfloat16, ncclUint8};
  static const size_t counts[] = {0, 1, 1023, 500001};
  uint64_t seed = 42;
  for (int k = 0; k < K_COUNT; k++)
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
      for (size_t s = 0; s < sizeof counts / sizeof counts[0]; s++) {
        coll_case_t c = {.kind = k,
                         .type = types[t],
                         .op = (int)(seed % ncclNumOps),
                         .count = counts[s],
                         .inplace = (int)(seed % 2),
                         .root = (int)(seed % n),
                         .seed = seed};
        seed++;
        coll_check(comm, &c);
      }
  EXPECT_OK(ncclCommFinalize(comm));
  EXPECT_OK(ncclCommDestroy(comm));
  printf("rank %d of %d: all collectives correct\n", rank, n);
  return 0;
}
