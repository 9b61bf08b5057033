/*
 * One rank of a job that the monitoring scripts query: `ras_rank RANK NRANKS STOPFILE` joins the communicator
 * at NCCL_COMM_ID, runs all-reduces (checking each result) until STOPFILE exists (all ranks stop after the
 * same call), then destroys it and exits 0. A wrong result exits 1. A failed call (a peer died) is reported,
 * and the process stays (its monitor answering) until STOPFILE exists, then aborts and exits 3.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: ras_rank RANK NRANKS STOPFILE (with NCCL_COMM_ID set)\n");
    return 2;
  }
  int rank = atoi(argv[1]), n = atoi(argv[2]);
  ncclUniqueId id;
  EXPECT_OK(ncclGetUniqueId(&id)); /* with NCCL_COMM_ID, every rank derives the same id */
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  static int32_t buf[65536];
  long calls = 0;
  ncclResult_t res = ncclSuccess;
  for (;;) {
    int32_t stop = access(argv[3], F_OK) == 0;
    if ((res = ncclAllReduce(&stop, &stop, 1, ncclInt32, ncclMax, comm, NULL)) != ncclSuccess) break;
    if (stop) break;
    size_t count = 1 + (size_t)(calls * 7919 % 65536);
    for (size_t i = 0; i < count; i++) buf[i] = rank + (int32_t)i;
    if ((res = ncclAllReduce(buf, buf, count, ncclInt32, ncclSum, comm, NULL)) != ncclSuccess) break;
    for (size_t i = 0; i < count; i++)
      EXPECT(buf[i] == n * (n - 1) / 2 + n * (int32_t)i, "call %ld [%zu] = %d", calls, i, buf[i]);
    calls++;
    usleep(1000);
  }
  if (res != ncclSuccess) {
    printf("rank %d of %d: call %ld failed (%s); waiting for the stop file\n", rank, n, calls,
           ncclGetErrorString(res));
    fflush(stdout);
    for (int i = 0; i < 1200 && access(argv[3], F_OK) != 0; i++) usleep(100000);
    ncclCommAbort(comm);
    return 3;
  }
  EXPECT_OK(ncclCommDestroy(comm));
  printf("rank %d of %d: %ld all-reduces correct\n", rank, n, calls);
  return 0;
}
