/*
 * Waits that stall: a rank that stays alive but never joins a collective (stopped, or busy elsewhere). Every
 * other rank must print one stall report by default (stderr, NCCL's format, without NCCL_DEBUG) that names
 * that rank as the one behind, not its own ring neighbour, and then fail with ncclRemoteError naming it (NCCL
 * 2.30's ncclTimeout, 8, for a caller whose config says it was built against 2.30).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"

static ncclUniqueId id;
static char dir[64];

/* What the case expects: the caller's NCCL version (0: no config) and the result of the wait. */
typedef struct {
  unsigned version;
  int result;
  int warm; /* a first all-reduce connects every rank before rank 2 stops joining */
} expect_t;

static void stderr_path(int rank, char *buf, size_t len) {
  snprintf(buf, len, "%s/stderr.%d", dir, rank);
}

static void stalled_rank(int rank, int n, void *arg) {
  const expect_t *want = arg;
  char path[128];
  stderr_path(rank, path, sizeof path);
  EXPECT(freopen(path, "w", stderr) != NULL, "cannot write %s", path);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (want->version != 0) config.version = want->version;
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRankConfig(&comm, n, id, rank, &config));
  size_t count = 1 << 20;
  float *buf = calloc(count, sizeof *buf);
  if (want->warm) EXPECT_OK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL));
  if (rank == 2) { /* alive, connected, and never in the call */
    sleep(12);
    EXPECT_OK(ncclCommAbort(comm));
    return;
  }
  ncclResult_t res = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
  EXPECT(res == (ncclResult_t)want->result, "rank %d: the all-reduce returned %d, expected %d", rank, res,
         want->result);
  EXPECT(strstr(ncclGetLastError(NULL), "rank 2 is behind") != NULL,
         "rank %d: the error does not blame rank 2: %s", rank, ncclGetLastError(NULL));
  EXPECT_OK(ncclCommAbort(comm));
  free(buf);
}

/* Lines of `path` that are stall reports in NCCL's format naming rank `behind`. */
static void check_report(int rank, int behind) {
  char path[128], want[64];
  stderr_path(rank, path, sizeof path);
  snprintf(want, sizeof want, "rank %d is behind", behind);
  int reports = test_file_lines(path, "NCCL WARN"), named = test_file_lines(path, want),
      stalls = test_file_lines(path, "no progress for");
  EXPECT(stalls >= 1, "rank %d printed no stall report (%s)", rank, path);
  EXPECT(named >= stalls && reports >= stalls,
         "rank %d: %d stall lines, %d in NCCL's format, %d naming rank %d", rank, stalls, reports, named,
         behind);
  /* one report while it waited, and the error when it gave up */
  EXPECT(stalls <= 2, "rank %d reported the stall %d times", rank, stalls);
}

static void run_stall(unsigned version, int result, int warm) {
  unsetenv("NCCL_DEBUG");
  setenv("BRAID_DEVICE", "host", 1);
  setenv("BRAID_STALL_WARN_S", "2", 1);
  setenv("BRAID_TIMEOUT_S", "5", 1);
  snprintf(dir, sizeof dir, "/tmp/braid_stall_XXXXXX");
  EXPECT(mkdtemp(dir) != NULL);
  EXPECT_OK(ncclGetUniqueId(&id));
  expect_t want = {version, result, warm};
  EXPECT(run_ranks(4, 50, stalled_rank, &want) == 0, "a rank failed");
  for (int r = 0; r < 4; r++)
    if (r != 2) check_report(r, 2);
}

/* Every rank is connected and waits in the host executor; a caller built against NCCL 2.28 gets
 * ncclRemoteError. */
static void stopped_rank(void) {
  run_stall(22809, ncclRemoteError, 1);
}

/* The first call: rank 2's neighbours wait for its connection's details from the bootstrap. A caller built
 * against NCCL 2.30 gets its ncclTimeout. */
static void stopped_rank_2_30(void) {
  run_stall(23000, 8, 0);
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(stopped_rank, 60);
  TEST(stopped_rank_2_30, 60);
  return test_summary();
}
