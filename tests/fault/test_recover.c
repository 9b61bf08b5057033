/*
 * Recovery from a lost rank, on the host backend with one process per rank:
 *
 * - 8 ranks run a stream of all-reduces; rank 5 is killed (SIGKILL) or stopped (SIGSTOP) in the middle.
 *   Every survivor gets an error within a bound, shrinks the communicator (NCCL_SHRINK_ABORT) without rank 5,
 *   and the 7 ranks, renumbered, run every collective correctly; then ncclCommGrow brings in a process that
 *   took no part so far as rank 7, and the 8 ranks are correct again. Over shared memory and over TCP.
 * - A shrink that excludes a live rank, in default mode: the parent stays usable, with that rank too.
 * - ncclCommRevoke from a side thread while the main thread waits in a receive that nothing matches, on one
 *   rank only, while the others wait for it in an all-reduce: every rank's pending call fails within a
 *   bound; a split of the revoked (or failed) parent then works.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "coll_check.h"
#include "harness.h"
#include "nccl.h"

#define VICTIM 5
#define NRANKS 8

/* What the rank processes share: the first communicator's id, the grow token, the victim's pid. */
typedef struct {
  ncclUniqueId id;
  ncclUniqueId grow_id;
  int grow_ready; /* written last by the coordinator (release), polled by the joiner (acquire) */
  pid_t victim;
  int stop; /* 1: SIGSTOP the victim, 0: SIGKILL it */
} shared_t;

static shared_t *sh;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void share(void) {
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(sh != MAP_FAILED, "mmap");
  memset(sh, 0, sizeof *sh);
  EXPECT_OK(ncclGetUniqueId(&sh->id));
}

/* Every collective, odd counts, checked against references; `seed` varies the data per round. */
static void check_all(ncclComm_t comm, uint64_t seed) {
  for (int k = 0; k < K_COUNT; k++) {
    coll_case_t c = {
        .kind = (kind_t)k, .type = ncclFloat, .op = ncclSum, .count = 1001 + 2 * k, .seed = seed + k};
    coll_check(comm, &c);
    c.type = ncclInt32;
    c.count = 77;
    coll_check(comm, &c);
  }
}

static void *fell_later(void *arg) {
  usleep(300 * 1000);
  raise(sh->stop ? SIGSTOP : SIGKILL);
  return NULL;
}

/* Grows `comm` (NRANKS - 1 ranks) by the joiner; the new communicator's rank 0 coordinates. */
static ncclComm_t grow(ncclComm_t comm) {
  int rank = -1;
  EXPECT_OK(ncclCommUserRank(comm, &rank));
  ncclUniqueId token;
  if (rank == 0) {
    EXPECT_OK(ncclCommGetUniqueId(comm, &token));
    sh->grow_id = token;
    __atomic_store_n(&sh->grow_ready, 1, __ATOMIC_RELEASE);
  }
  ncclComm_t grown = NULL;
  EXPECT_OK(ncclCommGrow(comm, NRANKS, rank == 0 ? &token : NULL, -1, &grown, NULL));
  int r = -1, n = 0;
  EXPECT_OK(ncclCommUserRank(grown, &r));
  EXPECT_OK(ncclCommCount(grown, &n));
  EXPECT(r == rank && n == NRANKS, "grown: rank %d of %d (was %d)", r, n, rank);
  return grown;
}

/* The process that joins by ncclCommGrow only, once the coordinator has published its token. */
static void joiner(void) {
  double limit = now() + 60;
  while (!__atomic_load_n(&sh->grow_ready, __ATOMIC_ACQUIRE)) {
    EXPECT(now() < limit, "no grow token came");
    usleep(1000);
  }
  ncclComm_t grown = NULL;
  ncclUniqueId token = sh->grow_id;
  EXPECT_OK(ncclCommGrow(NULL, NRANKS, &token, NRANKS - 1, &grown, NULL));
  check_all(grown, 500);
  EXPECT_OK(ncclCommDestroy(grown));
}

static void survivor(ncclComm_t parent, int rank, ncclResult_t res, double waited, double bound) {
  EXPECT(res == ncclRemoteError || res == ncclSystemError, "rank %d: the collective returned %d", rank, res);
  EXPECT(waited < bound, "rank %d: the error took %.1f s", rank, waited);
  int gone = VICTIM;
  ncclComm_t child = NULL;
  double t0 = now();
  EXPECT_OK(ncclCommShrink(parent, &gone, 1, &child, NULL, NCCL_SHRINK_ABORT));
  EXPECT(now() - t0 < 20, "rank %d: the shrink took %.1f s", rank, now() - t0);
  int r = -1, n = 0;
  EXPECT_OK(ncclCommUserRank(child, &r));
  EXPECT_OK(ncclCommCount(child, &n));
  EXPECT(n == NRANKS - 1 && r == (rank < VICTIM ? rank : rank - 1), "rank %d became %d of %d", rank, r, n);
  float x = 1;
  EXPECT_RES(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, parent, NULL), ncclInvalidUsage); /* aborted mode */
  check_all(child, 100);
  ncclComm_t grown = grow(child);
  check_all(grown, 500);
  EXPECT_OK(ncclCommDestroy(grown));
  EXPECT_OK(ncclCommDestroy(child));
  EXPECT_OK(ncclCommAbort(parent));
  if (rank == 0 && sh->stop) kill(sh->victim, SIGKILL); /* the stopped rank never exits by itself */
}

static void lost_rank(int rank, int n, void *arg) {
  if (rank == NRANKS) {
    joiner();
    return;
  }
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, NRANKS, sh->id, rank));
  size_t count = 1 << 20;
  float *buf = calloc(count, sizeof(float));
  pthread_t t;
  if (rank == VICTIM) {
    sh->victim = getpid();
    pthread_create(&t, NULL, fell_later, NULL);
  }
  double t0 = 0;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 1000000 && res == ncclSuccess; i++) {
    t0 = now();
    res = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
  }
  free(buf);
  double bound = sh->stop ? 6 + 10 : 10; /* a stopped rank is noticed after BRAID_TIMEOUT_S */
  survivor(comm, rank, res, now() - t0, bound);
}

static void run_lost(int stop, const char *shm_disable) {
  setenv("NCCL_SHM_DISABLE", shm_disable, 1);
  setenv("BRAID_HOST_BUFFSIZE", "262144", 1);
  if (stop) setenv("BRAID_TIMEOUT_S", "6", 1);
  share();
  sh->stop = stop;
  unsigned bad = run_ranks_mask(NRANKS + 1, 150, lost_rank, NULL);
  EXPECT(bad == 1u << VICTIM, "failed ranks mask 0x%x, expected only rank %d", bad, VICTIM);
}

static void killed_shm(void) {
  run_lost(0, "0");
}

static void killed_net(void) {
  run_lost(0, "1");
}

static void stopped_shm(void) {
  run_lost(1, "0");
}

static void stopped_net(void) {
  run_lost(1, "1");
}

/* Rank 3 stays alive and takes no part; the others shrink without it in default mode, then all four use
 * the parent again. */
static void alive_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, sh->id, rank));
  check_all(comm, 1);
  if (rank != 3) {
    int gone = 3;
    ncclComm_t child = NULL;
    EXPECT_OK(ncclCommShrink(comm, &gone, 1, &child, NULL, NCCL_SHRINK_DEFAULT));
    check_all(child, 10);
    EXPECT_OK(ncclCommDestroy(child));
  }
  check_all(comm, 20);
  EXPECT_OK(ncclCommDestroy(comm));
}

static void shrink_alive(void) {
  share();
  EXPECT(run_ranks(4, 90, alive_rank, NULL) == 0, "a rank failed");
}

/* Rank 3's main thread waits for a message that never comes while ranks 0-2 wait in an all-reduce that rank 3
 * never joins; rank 3's side thread (a watchdog) revokes. */
static void *revoke_later(void *arg) {
  usleep(200 * 1000); /* most likely while the receive waits; a revoke before it must fail it as well */
  EXPECT_OK(ncclCommRevoke((ncclComm_t)arg, NCCL_REVOKE_DEFAULT));
  return NULL;
}

static void revoke_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, sh->id, rank));
  coll_case_t all = {.kind = K_ALLTOALL, .type = ncclFloat, .op = ncclSum, .count = 33, .seed = 7};
  coll_check(comm, &all); /* every connection exists */
  float x[64];
  pthread_t t;
  if (rank == 3) pthread_create(&t, NULL, revoke_later, comm);
  double t0 = now();
  ncclResult_t res = rank == 3 ? ncclRecv(x, 64, ncclFloat, 0, comm, NULL)
                               : ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comm, NULL);
  double waited = now() - t0;
  EXPECT(res != ncclSuccess, "rank %d: the receive succeeded", rank);
  EXPECT(waited < 10, "rank %d: the receive failed after %.1f s", rank, waited);
  if (rank == 3) {
    pthread_join(t, NULL);
    EXPECT(strstr(ncclGetLastError(NULL), "revoked") != NULL, "rank 3: \"%s\"", ncclGetLastError(NULL));
  }
  EXPECT_RES(ncclAllReduce(x, x, 1, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage);
  ncclComm_t child = NULL;
  EXPECT_OK(ncclCommSplit(comm, 0, rank, &child, NULL));
  check_all(child, 30);
  EXPECT_OK(ncclCommDestroy(child));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void revoke_waiting(void) {
  share();
  EXPECT(run_ranks(4, 90, revoke_rank, NULL) == 0, "a rank failed");
}

static void revoke_waiting_net(void) {
  setenv("NCCL_SHM_DISABLE", "1", 1);
  revoke_waiting();
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(killed_shm, 180);
  TEST(killed_net, 180);
  TEST(stopped_shm, 180);
  TEST(stopped_net, 180);
  TEST(shrink_alive, 120);
  TEST(revoke_waiting, 120);
  TEST(revoke_waiting_net, 120);
  return test_summary();
}
