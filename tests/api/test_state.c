/*
 * A communicator's resources through the public API, on the host backend with one process per rank:
 * ncclCommSuspend gives back the staging rings (ncclCommMemStats says so, consistently, and drops to zero
 * on what can be suspended), calls on a suspended communicator fail and say why, ncclCommResume brings back
 * a communicator whose collectives are correct again; and ncclCommQueryProperties, ncclWinGetUserPtr.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll_check.h"
#include "harness.h"
#include "nccl.h"

#define EXPECT_ERR(call, code, what)                                                                         \
  do {                                                                                                       \
    EXPECT_RES(call, code);                                                                                  \
    EXPECT(strstr(ncclGetLastError(NULL), what) != NULL, "last error \"%s\" does not mention \"%s\"",        \
           ncclGetLastError(NULL), what);                                                                    \
  } while (0)

#define RING_BYTES 65536

static ncclUniqueId id;

typedef struct {
  uint64_t suspend, suspended, persist, total;
} stats_t;

static stats_t stats(ncclComm_t comm) {
  stats_t s;
  EXPECT_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &s.suspend));
  EXPECT_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &s.suspended));
  EXPECT_OK(ncclCommMemStats(comm, ncclStatGpuMemPersist, &s.persist));
  EXPECT_OK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &s.total));
  EXPECT(s.total == s.persist + s.suspend, "total %llu != persist %llu + suspendable %llu",
         (unsigned long long)s.total, (unsigned long long)s.persist, (unsigned long long)s.suspend);
  return s;
}

static void check_all(ncclComm_t comm, uint64_t seed) {
  for (int k = 0; k < K_COUNT; k++) {
    coll_case_t c = {.kind = (kind_t)k, .type = ncclFloat, .op = ncclSum, .count = 1001, .seed = seed + k};
    coll_check(comm, &c);
  }
}

static void suspend_rank(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  stats_t fresh = stats(comm);
  check_all(comm, 1);
  stats_t used = stats(comm);
  /* every rank receives from at least one peer through a ring it owns */
  EXPECT(used.suspend >= fresh.suspend + RING_BYTES, "rings: %llu -> %llu bytes",
         (unsigned long long)fresh.suspend, (unsigned long long)used.suspend);
  EXPECT(used.persist == fresh.persist && used.suspended == 0, "persist %llu -> %llu",
         (unsigned long long)fresh.persist, (unsigned long long)used.persist);
  EXPECT_ERR(ncclCommSuspend(comm, 0x10), ncclInvalidArgument, "flags");
  EXPECT_OK(ncclCommSuspend(comm, 0)); /* nothing to give back */
  EXPECT_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  stats_t asleep = stats(comm);
  EXPECT(asleep.suspend == 0 && asleep.suspended == 1 && asleep.persist == used.persist,
         "suspended: %llu suspendable, flag %llu, persist %llu", (unsigned long long)asleep.suspend,
         (unsigned long long)asleep.suspended, (unsigned long long)asleep.persist);
  float x = 1;
  EXPECT_ERR(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage, "suspended");
  EXPECT_ERR(ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage, "ncclCommResume");
  EXPECT_OK(ncclCommResume(comm));
  stats_t awake = stats(comm);
  EXPECT(awake.suspended == 0 && awake.suspend == fresh.suspend, "resumed: %llu suspendable (fresh %llu)",
         (unsigned long long)awake.suspend, (unsigned long long)fresh.suspend);
  check_all(comm, 100);
  stats_t again = stats(comm);
  EXPECT(again.suspend == used.suspend, "rings after resume %llu, before %llu",
         (unsigned long long)again.suspend, (unsigned long long)used.suspend);
  EXPECT_OK(ncclCommResume(comm)); /* not suspended: nothing to do */
  EXPECT_ERR(ncclCommMemStats(comm, (ncclCommMemStat_t)7, &again.total), ncclInvalidArgument, "stat");
  EXPECT_ERR(ncclCommMemStats(comm, ncclStatGpuMemTotal, NULL), ncclInvalidArgument, "value");
  EXPECT_OK(ncclCommDestroy(comm));
}

static void run_suspend(const char *shm_disable) {
  setenv("BRAID_HOST_BUFFSIZE", "65536", 1);
  setenv("NCCL_SHM_DISABLE", shm_disable, 1);
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(3, 120, suspend_rank, NULL) == 0, "a rank failed");
}

static void suspend_shm(void) {
  run_suspend("0");
}

static void suspend_net(void) {
  run_suspend("1");
}

/* NCCL's ncclCommProperties_t (nccl_device.h), as a caller built against it lays it out. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank, nRanks, cudaDev, nvmlDev;
  bool deviceApiSupport, multimemSupport;
  int ginType;
  int nLsaTeams;
  bool hostRmaSupport;
  int railedGinType;
} props_t;
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, props_t *props);

static void properties_and_windows(void) {
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));
  props_t p;
  memset(&p, 0x55, sizeof p);
  p.size = sizeof p;
  p.magic = 0x1234;
  EXPECT_ERR(ncclCommQueryProperties(comm, &p), ncclInvalidUsage, "magic");
  p.magic = NCCL_API_MAGIC;
  p.version = NCCL_VERSION_CODE;
  EXPECT_OK(ncclCommQueryProperties(comm, &p));
  EXPECT(p.rank == 0 && p.nRanks == 1 && p.cudaDev == -1 && !p.deviceApiSupport && !p.multimemSupport &&
             p.ginType == 0 && p.nLsaTeams == 1 && !p.hostRmaSupport,
         "properties rank %d nRanks %d cudaDev %d", p.rank, p.nRanks, p.cudaDev);
  /* the layout of NCCL 2.29.2 ends at ginType: nothing after it is written */
  memset(&p, 0x55, sizeof p);
  p.magic = NCCL_API_MAGIC;
  p.size = offsetof(props_t, nLsaTeams);
  EXPECT_OK(ncclCommQueryProperties(comm, &p));
  EXPECT(p.nRanks == 1 && p.nLsaTeams == 0x55555555, "an old layout was written past its size");
  static char buf[8192] __attribute__((aligned(4096)));
  ncclWindow_t win;
  void *got = NULL;
  EXPECT_OK(ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_STRICT_ORDERING));
  EXPECT_OK(ncclWinGetUserPtr(comm, win, &got));
  EXPECT(got == buf, "window pointer %p, buffer %p", got, (void *)buf);
  EXPECT_ERR(ncclWinGetUserPtr(comm, (ncclWindow_t)buf, &got), ncclInvalidArgument, "not a window");
  EXPECT_OK(ncclCommWindowDeregister(comm, win));
  EXPECT_OK(ncclCommDestroy(comm));
}

int main(void) {
  TEST(suspend_shm, 180);
  TEST(suspend_net, 180);
  TEST(properties_and_windows, 30);
  return test_summary();
}
