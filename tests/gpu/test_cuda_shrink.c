/*
 * A rank lost on the GPU, one process per rank (ranks may share a GPU: --devices 1): every rank runs a stream
 * of all-reduces; one rank (2, or 1 with two ranks) leaves abruptly in the middle, without ncclCommAbort or
 * destroy, as a crashed process does. Each survivor watches its stream and ncclCommGetAsyncError, as a
 * framework's watchdog does, until its work is stuck or failed; then ncclCommShrink with NCCL_SHRINK_ABORT
 * without the lost rank must come back, the survivor's stream must complete (its kernels stopped), and the
 * shrunk communicator must run every collective correctly, renumbered. Before that, every rank suspends
 * and resumes the communicator between two checked all-reduces, and ncclCommMemStats must show the device
 * memory given back and taken again. With --host, the same on the host backend.
 *
 * The lost rank leaves with _exit(0) rather than SIGKILL because the harness counts a killed rank as a
 * failed run; for its peers the two are the same: the process and its CUDA context are gone mid-call.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "coll_check.h"
#include "cuda_case.h"
#include "harness.h"

#define COUNT ((size_t)1 << 20)
#define STUCK_S                                                                                              \
  15 /* the watchdog's patience: above BRAID_TIMEOUT_S (10), so a failure usually comes first                \
      */
#define BOUND_S 60

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int victim_of(int n) {
  return n >= 3 ? 2 : 1;
}

static void *leave_later(void *arg) {
  usleep(300 * 1000);
  _exit(0);
  return NULL;
}

/* Issues all-reduces until one fails, the communicator reports an error, or the stream stops moving for
 * STUCK_S: what a watchdog sees of a lost peer. */
static void until_stuck(ncclComm_t comm, cuda_rank_t *r, int rank) {
  void *buf = cuda_dalloc(r, COUNT * sizeof(float));
  cuda_fill(r, buf, 0, COUNT * sizeof(float));
  double last = now();
  for (;;) {
    if (ncclAllReduce(buf, buf, COUNT, ncclFloat32, ncclSum, comm, r->stream) != ncclSuccess) return;
    while (r->stream != NULL && !cuda_stream_done(r->stream)) {
      ncclResult_t async = ncclSuccess;
      EXPECT_OK(ncclCommGetAsyncError(comm, &async));
      if (async != ncclSuccess) return;
      if (now() - last > STUCK_S) return;
      usleep(1000);
    }
    last = now();
  }
}

/* A suspend between two checked all-reduces: the memory the statistics call suspendable is given back. */
static void suspend_resume(ncclComm_t comm, cuda_rank_t *r) {
  coll_case_t c = {.kind = K_ALLREDUCE, .type = ncclFloat32, .op = ncclSum, .count = 300007, .seed = 4};
  cuda_case_run(comm, r, &c, "procs, before a suspend", BOUND_S);
  uint64_t held = 0, left = 1, flag = 0;
  EXPECT_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &held));
  cuda_watch("ncclCommSuspend and ncclCommResume", BOUND_S);
  EXPECT_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  EXPECT_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &left));
  EXPECT_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &flag));
  EXPECT(held > 0 && left == 0 && flag == 1, "suspend: %llu bytes before, %llu after, flag %llu",
         (unsigned long long)held, (unsigned long long)left, (unsigned long long)flag);
  EXPECT_OK(ncclCommResume(comm));
  cuda_unwatch();
  c.seed = 5;
  cuda_case_run(comm, r, &c, "procs, after a resume", BOUND_S);
  EXPECT_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &left));
  EXPECT(left == held, "resume: %llu bytes, %llu before the suspend", (unsigned long long)left,
         (unsigned long long)held);
}

static void shrink_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  cuda_rank_t r;
  cuda_rank_open(&r, rank, 256 << 20, 64 << 20, NULL);
  ncclComm_t comm, child = NULL;
  cuda_watch("ncclCommInitRank", BOUND_S);
  EXPECT_OK(ncclCommInitRank(&comm, n, *id, rank));
  cuda_unwatch();
  suspend_resume(comm, &r);
  int victim = victim_of(n);
  pthread_t t;
  if (rank == victim) pthread_create(&t, NULL, leave_later, NULL);
  cuda_watch("the all-reduces before and after the peer was lost", BOUND_S);
  until_stuck(comm, &r, rank);
  cuda_watch("ncclCommShrink(NCCL_SHRINK_ABORT) without the lost rank", BOUND_S);
  double t0 = now();
  EXPECT_OK(ncclCommShrink(comm, &victim, 1, &child, NULL, NCCL_SHRINK_ABORT));
  cuda_watch("the survivor's stream after the shrink stopped its kernels", BOUND_S);
  while (r.stream != NULL && !cuda_stream_done(r.stream)) usleep(1000);
  cuda_unwatch();
  printf("rank %d: the shrink took %.2f s\n", rank, now() - t0);
  int cr = -1, cn = 0;
  EXPECT_OK(ncclCommUserRank(child, &cr));
  EXPECT_OK(ncclCommCount(child, &cn));
  EXPECT(cn == n - 1 && cr == (rank < victim ? rank : rank - 1), "rank %d became %d of %d", rank, cr, cn);
  cuda_rank_reset(&r);
  for (int k = 0; k < K_COUNT; k++) {
    coll_case_t c = {.kind = (kind_t)k, .type = ncclFloat32, .op = ncclSum, .count = 100003, .seed = 9 + k};
    cuda_case_run(child, &r, &c, "procs, after a shrink", BOUND_S);
  }
  cuda_watch("ncclCommDestroy of the shrunk communicator, ncclCommAbort of the parent", BOUND_S);
  EXPECT_OK(ncclCommDestroy(child));
  EXPECT_OK(ncclCommAbort(comm));
  cuda_unwatch();
  cuda_rank_close(&r);
}

static void lost_rank_shrink(void) {
  setenv("BRAID_TIMEOUT_S", "10", 1);
  EXPECT(cuda_run_ranks(cuda_nranks, 4 * BOUND_S, shrink_rank, NULL) == 0, "a rank failed");
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(lost_rank_shrink, 5 * BOUND_S);
  return test_summary();
}
