/*
 * Collectives over a network plugin that misbehaves within what the plugin interface allows
 * (tests/net/fake_net.c, "Fake"): an accept that takes many calls, a connect that blocks until the peer
 * accepts, a test that never reports sizes, requests refused and completions that take several tests. Each
 * must give correct results. A network that fails mid-transfer must give every rank an error, never a hang.
 *
 * Ranks are child processes on "different hosts" (NCCL_HOSTID), so every connection goes over the network.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/param.h"
#include "coll_check.h"
#include "harness.h"

static ncclUniqueId id;

static void as_host(int rank) {
  char host[32];
  snprintf(host, sizeof host, "host%d", rank);
  setenv("NCCL_HOSTID", host, 1);
  param_reload();
}

static void correct_rank(int rank, int n, void *arg) {
  as_host(rank);
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  static const ncclDataType_t types[] = {ncclInt32, ncclFloat16};
  static const size_t counts[] = {1, 1023, 70001};
  uint64_t seed = 5;
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
  EXPECT_OK(ncclCommDestroy(comm));
}

static void correct_with(const char *faults) {
  setenv("BRAID_FAKE_NET", faults, 1);
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(3, 240, correct_rank, NULL) == 0, "a rank failed with faults %s", faults);
}

static void test_slow_accept(void) {
  correct_with("slow_accept");
}

static void test_blocking_connect(void) {
  correct_with("blocking_connect");
}

static void test_sizes_unset(void) {
  correct_with("sizes_unset");
}

static void test_partial(void) {
  correct_with("partial,sizes_unset");
}

/* Rank 0's network fails after 300000 bytes: every rank's all-reduce fails (the others because rank 0 closes
 * its connections when it fails), within BRAID_TIMEOUT_S at worst, and rank 0's message names the network. */
static void failing_rank(int rank, int n, void *arg) {
  as_host(rank);
  if (rank == 0) setenv("BRAID_FAKE_NET", "fail_after=300000", 1);
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  size_t count = 1 << 20;
  float *buf = calloc(count, sizeof *buf);
  EXPECT(buf != NULL);
  ncclResult_t res = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
  EXPECT(res != ncclSuccess, "rank %d: the all-reduce succeeded over a failing network", rank);
  const char *err = ncclGetLastError(comm);
  EXPECT(strstr(err, "rank") != NULL && (rank > 0 || strstr(err, "network Fake") != NULL),
         "rank %d: message '%s'", rank, err);
  printf("rank %d: %s\n", rank, err);
  ncclCommAbort(comm);
  free(buf);
}

static void test_fails_mid_transfer(void) {
  setenv("BRAID_FAKE_NET", "", 1);
  setenv("BRAID_TIMEOUT_S", "30", 1);
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(3, 120, failing_rank, NULL) == 0, "a rank did not see the failure");
}

int main(int argc, char **argv) {
  setenv("NCCL_NET_PLUGIN", BRAID_NET_PLUGIN_DIR "/libnccl-net-fake.so", 1);
  setenv("NCCL_NET", "Fake", 1);
  setenv("BRAID_HOST_BUFFSIZE", "65536", 1);
  test_filter(argc - 1, argv + 1);
  TEST(test_slow_accept, 240);
  TEST(test_blocking_connect, 240);
  TEST(test_sizes_unset, 240);
  TEST(test_partial, 240);
  TEST(test_fails_mid_transfer, 150);
  return test_summary();
}
