/*
 * Faults: a rank killed in the middle of a collective makes the survivors fail within a bounded time (over
 * shared memory and over TCP); a rank that never arrives makes init fail with a message naming it; and
 * ncclCommAbort returns promptly from any state, including while another thread waits in a collective.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"

static ncclUniqueId id;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *kill_self_later(void *arg) {
  usleep(300 * 1000);
  raise(SIGKILL);
  return NULL;
}

/* Rank 1 dies 0.3 s into a stream of large all-reduces; the others must see an error within 10 s. */
static void killed_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  size_t count = 4 << 20;
  float *buf = calloc(count, sizeof(float));
  pthread_t killer;
  if (rank == 1) pthread_create(&killer, NULL, kill_self_later, NULL);
  double t0 = 0;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 100000 && res == ncclSuccess; i++) {
    t0 = now();
    res = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
  }
  double waited = now() - t0;
  EXPECT(res == ncclRemoteError || res == ncclSystemError, "rank %d: the collective returned %d", rank, res);
  EXPECT(waited < 10, "rank %d: the error took %.1f s", rank, waited);
  ncclResult_t async;
  EXPECT_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async != ncclSuccess, "rank %d: no async error recorded", rank);
  EXPECT_RES(ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage);
  double t1 = now();
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT(now() - t1 < 5, "rank %d: abort took %.1f s", rank, now() - t1);
}

static void run_killed(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  unsigned bad = run_ranks_mask(4, 60, killed_rank, NULL);
  EXPECT(bad == 2u, "failed ranks mask 0x%x, expected only rank 1 (0x2)", bad);
}

static void killed_shm(void) {
  run_killed();
}

static void killed_net(void) {
  setenv("NCCL_SHM_DISABLE", "1", 1);
  run_killed();
}

/* Three ranks are expected; rank 2 never comes. */
static void missing_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  double t0 = now();
  ncclResult_t res = ncclCommInitRank(&comm, 3, id, rank);
  EXPECT(res != ncclSuccess, "init succeeded without rank 2");
  EXPECT(now() - t0 < 20, "init took %.1f s to fail", now() - t0);
  EXPECT(strstr(ncclGetLastError(NULL), "rank 2") != NULL, "message \"%s\" does not name rank 2",
         ncclGetLastError(NULL));
}

static void never_arrives(void) {
  setenv("BRAID_BOOTSTRAP_TIMEOUT_S", "2", 1);
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(2, 60, missing_rank, NULL) == 0, "a rank failed");
}

/* Another thread aborts while this one waits in an all-reduce that its peer never joins. */
static void *abort_later(void *arg) {
  usleep(500 * 1000);
  double t0 = now();
  EXPECT_OK(ncclCommAbort((ncclComm_t)arg));
  EXPECT(now() - t0 < 5, "abort took %.1f s", now() - t0);
  return NULL;
}

static void abort_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  if (rank == 1) {
    sleep(8); /* never joins; exits after rank 0 is done */
    return;
  }
  pthread_t t;
  pthread_create(&t, NULL, abort_later, comm);
  float x[4] = {0};
  double t0 = now();
  ncclResult_t res = ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, NULL);
  EXPECT(res != ncclSuccess, "the all-reduce succeeded without its peer");
  EXPECT(now() - t0 < 5, "the all-reduce returned %.1f s after the abort", now() - t0 - 0.5);
  pthread_join(t, NULL);
}

static void abort_in_collective(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(2, 60, abort_rank, NULL) == 0, "a rank failed");
}

/* Abort right after init, and during a non-blocking init whose peer never comes. */
static void abort_states(void) {
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT_OK(ncclCommAbort(NULL));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  EXPECT_OK(ncclGetUniqueId(&id));
  ncclResult_t res = ncclCommInitRankConfig(&comm, 2, id, 0, &config);
  EXPECT(res == ncclInProgress, "non-blocking init returned %d", res);
  usleep(200 * 1000);
  double t0 = now();
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT(now() - t0 < 5, "abort during init took %.1f s", now() - t0);
}

int main(void) {
  TEST(killed_shm, 90);
  TEST(killed_net, 90);
  TEST(never_arrives, 90);
  TEST(abort_in_collective, 90);
  TEST(abort_states, 60);
  return test_summary();
}
