/*
 * Misuse on error paths: what an application (or a framework's watchdog thread) does to a communicator that
 * is busy, failing or gone must end in a clear error, never in a crash, a hang or a silent loss of data.
 * Abort or destroy while a group holds the communicator's calls; frees and deregistrations of what Braid did
 * not hand out (or handed out and took back); destroy during a non-blocking init; the last error of a thread
 * and of a communicator; a send to self nobody receives; bad thread-block counts; the result of an aborted
 * call; many PreMulSum operations; many destroyed communicators.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"

static ncclUniqueId id;

/* The calling thread's last error must contain `what`. */
#define EXPECT_ERR(call, code, what)                                                                         \
  do {                                                                                                       \
    EXPECT_RES(call, code);                                                                                  \
    EXPECT(strstr(ncclGetLastError(NULL), what) != NULL, "last error \"%s\" does not mention \"%s\"",        \
           ncclGetLastError(NULL), what);                                                                    \
  } while (0)

static ncclComm_t one_rank_comm(void) {
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));
  return comm;
}

static void *abort_comm(void *arg) {
  EXPECT_OK(ncclCommAbort((ncclComm_t)arg));
  return NULL;
}

/* How each rank of group_gone ends its communicator while its group holds calls on it. */
enum { END_ABORT, END_ABORT_THREAD, END_DESTROY };

static void group_gone_rank(int rank, int n, void *arg) {
  int how = *(int *)arg;
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  float buf[64] = {0};
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(buf, buf, 64, ncclFloat, ncclSum, comm, NULL));
  EXPECT_OK(ncclSend(buf, 8, ncclFloat, (rank + 1) % n, comm, NULL));
  EXPECT_OK(ncclRecv(buf + 8, 8, ncclFloat, (rank + n - 1) % n, comm, NULL));
  if (how == END_ABORT_THREAD) { /* a framework's watchdog thread */
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, abort_comm, comm) == 0);
    pthread_join(t, NULL);
  } else if (how == END_ABORT) {
    EXPECT_OK(ncclCommAbort(comm));
  } else {
    EXPECT_OK(ncclCommDestroy(comm));
  }
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "while the group was open");
  /* the thread's next group is unaffected */
  ncclComm_t solo = one_rank_comm();
  EXPECT_OK(ncclAllReduce(buf, buf, 64, ncclFloat, ncclSum, solo, NULL));
  EXPECT_OK(ncclCommDestroy(solo));
}

static void group_gone(int how) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(2, 60, group_gone_rank, &how) == 0, "a rank failed");
}

static void group_abort(void) {
  group_gone(END_ABORT);
}

static void group_abort_thread(void) {
  group_gone(END_ABORT_THREAD);
}

static void group_destroy(void) {
  group_gone(END_DESTROY);
}

/* Inits, finalizes and splits deferred to a group's end, whose communicator is gone by then. */
static void group_jobs_gone(void) {
  ncclComm_t comm = one_rank_comm(), child = NULL;
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclCommFinalize(comm));
  EXPECT_OK(ncclCommDestroy(comm));
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "destroyed");
  comm = one_rank_comm();
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclCommSplit(comm, 0, 0, &child, NULL));
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "destroyed");
  EXPECT(child == NULL, "a split of an aborted communicator made %p", (void *)child);
  ncclComm_t pending;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclCommInitRank(&pending, 1, id, 0));
  EXPECT_OK(ncclCommDestroy(pending));
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "destroyed");
}

/* ncclMemFree of memory ncclMemAlloc did not hand out, or handed out and took back. */
static void mem_free_foreign(void) {
  setenv("BRAID_DEVICE", "host", 1);
  char stack[64];
  EXPECT_ERR(ncclMemFree(stack), ncclInvalidArgument, "not allocated by ncclMemAlloc");
  void *p = NULL;
  EXPECT_OK(ncclMemAlloc(&p, 1 << 16));
  EXPECT_ERR(ncclMemFree((char *)p + 64), ncclInvalidArgument, "not allocated by ncclMemAlloc");
  void *heap = malloc(100);
  EXPECT_ERR(ncclMemFree(heap), ncclInvalidArgument, "not allocated by ncclMemAlloc");
  free(heap);
  EXPECT_OK(ncclMemFree(p));
  EXPECT_ERR(ncclMemFree(p), ncclInvalidArgument, "freed already");
}

/* A handle deregistered once is not a handle any more, even when a new registration takes its memory. */
static void deregister_twice(void) {
  ncclComm_t comm = one_rank_comm();
  static char buf[1 << 12] __attribute__((aligned(4096)));
  void *a, *b;
  EXPECT_OK(ncclCommRegister(comm, buf, sizeof buf, &a));
  EXPECT_OK(ncclCommDeregister(comm, a));
  EXPECT_OK(ncclCommRegister(comm, buf, sizeof buf, &b));
  EXPECT_ERR(ncclCommDeregister(comm, a), ncclInvalidArgument, "not a registration");
  EXPECT_OK(ncclCommDeregister(comm, b));
  EXPECT_ERR(ncclCommDeregister(comm, b), ncclInvalidArgument, "not a registration");
  ncclWindow_t w1, w2;
  EXPECT_OK(ncclCommWindowRegister(comm, buf, sizeof buf, &w1, NCCL_WIN_COLL_SYMMETRIC));
  EXPECT_OK(ncclCommWindowDeregister(comm, w1));
  EXPECT_OK(ncclCommWindowRegister(comm, buf, sizeof buf, &w2, NCCL_WIN_COLL_SYMMETRIC));
  EXPECT_ERR(ncclCommWindowDeregister(comm, w1), ncclInvalidArgument, "not a window");
  EXPECT_ERR(ncclCommDeregister(comm, w2), ncclInvalidArgument, "is a window");
  EXPECT_OK(ncclCommWindowDeregister(comm, w2));
  EXPECT_OK(ncclCommDestroy(comm));
}

/* ncclCommDestroy of a non-blocking init that waits for a rank that never comes returns at once. */
static void destroy_pending_init(void) {
  setenv("BRAID_BOOTSTRAP_TIMEOUT_S", "600", 1);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_RES(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInProgress);
  usleep(100 * 1000);
  EXPECT_OK(ncclCommDestroy(comm)); /* the case's timeout (30 s) is far below the bootstrap's */
  EXPECT_ERR(ncclCommDestroy(comm), ncclInvalidUsage, "destroyed");
}

static void *fail_elsewhere(void *arg) {
  (void)arg;
  EXPECT_RES(ncclCommCount(NULL, NULL), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "ncclCommCount") != NULL, "other thread read \"%s\"",
         ncclGetLastError(NULL));
  return NULL;
}

/* Each thread reads its own last error; a communicator that failed keeps the message of its failure. */
static void last_error_scopes(void) {
  setenv("BRAID_BOOTSTRAP_TIMEOUT_S", "1", 1);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_RES(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInProgress);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    EXPECT_OK(ncclCommGetAsyncError(comm, &state));
    usleep(10 * 1000);
  }
  EXPECT(state != ncclSuccess, "init without rank 1 succeeded");
  EXPECT_ERR(ncclGetVersion(NULL), ncclInvalidArgument, "ncclGetVersion");
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, fail_elsewhere, NULL) == 0);
  pthread_join(t, NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "ncclGetVersion") != NULL, "this thread's last error is \"%s\"",
         ncclGetLastError(NULL));
  EXPECT(strstr(ncclGetLastError(comm), "rank 1") != NULL, "the communicator's last error is \"%s\"",
         ncclGetLastError(comm));
  EXPECT_OK(ncclCommDestroy(comm));
}

/* A send to self that no receive in the group takes is refused, not dropped. */
static void self_send_unmatched(void) {
  ncclComm_t comm = one_rank_comm();
  float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {0};
  EXPECT_ERR(ncclSend(buf, 8, ncclFloat, 0, comm, NULL), ncclInvalidUsage, "itself");
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(buf, 8, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclSend(buf, 4, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclRecv(out, 8, ncclFloat, 0, comm, NULL));
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "itself");
  /* the communicator stays usable, and matched pairs still move */
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(buf, 8, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclRecv(out, 8, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(memcmp(buf, out, sizeof buf) == 0, "the matched send to self did not arrive");
  EXPECT_OK(ncclCommDestroy(comm));
}

/* Thread-block counts and cluster sizes below their least value are refused by name. */
static void bad_cta_config(void) {
  static const struct {
    size_t offset;
    int value;
    const char *name;
  } cases[] = {
      {offsetof(ncclConfig_t, minCTAs), -1, "minCTAs"},
      {offsetof(ncclConfig_t, minCTAs), 0, "minCTAs"},
      {offsetof(ncclConfig_t, maxCTAs), -5, "maxCTAs"},
      {offsetof(ncclConfig_t, maxCTAs), 0, "maxCTAs"},
      {offsetof(ncclConfig_t, cgaClusterSize), -1, "cgaClusterSize"},
      {offsetof(ncclConfig_t, nvlsCTAs), -2, "nvlsCTAs"},
  };
  EXPECT_OK(ncclGetUniqueId(&id));
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    *(int *)((char *)&config + cases[i].offset) = cases[i].value;
    ncclComm_t comm = NULL;
    EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, cases[i].name);
  }
}

/* An all-reduce that another thread aborts returns what NCCL returns for it: ncclInternalError. */
static void *abort_soon(void *arg) {
  usleep(300 * 1000);
  EXPECT_OK(ncclCommAbort((ncclComm_t)arg));
  return NULL;
}

static void abort_code_rank(int rank, int n, void *arg) {
  (void)arg;
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  if (rank == 1) {
    sleep(5); /* never joins */
    return;
  }
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, abort_soon, comm) == 0);
  float x[4] = {0};
  EXPECT_RES(ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, NULL), ncclInternalError);
  EXPECT(strstr(ncclGetLastError(NULL), "abort") != NULL, "last error \"%s\"", ncclGetLastError(NULL));
  pthread_join(t, NULL);
}

static void aborted_call_code(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(2, 60, abort_code_rank, NULL) == 0, "a rank failed");
}

/* Making and destroying many PreMulSum operations takes time in proportion to their number: 400,000 would
 * take minutes if each creation searched the table (this case's timeout is 60 s). */
static void premulsum_many(void) {
  enum { N = 400000 };
  ncclComm_t comm = one_rank_comm();
  ncclRedOp_t *ops = malloc(N * sizeof *ops);
  float scalar = 0.5f;
  for (int i = 0; i < N; i++)
    EXPECT_OK(ncclRedOpCreatePreMulSum(&ops[i], &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  for (int i = 0; i < N; i += 2) EXPECT_OK(ncclRedOpDestroy(ops[i], comm));
  for (int i = 0; i < N; i += 2)
    EXPECT_OK(ncclRedOpCreatePreMulSum(&ops[i], &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  float buf[4] = {2, 4, 6, 8};
  EXPECT_OK(ncclAllReduce(buf, buf, 4, ncclFloat, ops[N - 1], comm, NULL));
  EXPECT(buf[0] == 1 && buf[3] == 4, "PreMulSum gave %g %g", buf[0], buf[3]);
  for (int i = 0; i < N; i++) EXPECT_OK(ncclRedOpDestroy(ops[i], comm));
  free(ops);
  EXPECT_OK(ncclCommDestroy(comm));
}

static size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

/* What destroyed communicators leave behind is bounded: a thousand more of them cost no more memory. */
static void dead_comms_bounded(void) {
  for (int i = 0; i < 1500; i++) EXPECT_OK(ncclCommDestroy(one_rank_comm()));
  size_t before = heap_in_use();
  for (int i = 0; i < 1000; i++) EXPECT_OK(ncclCommDestroy(one_rank_comm()));
  size_t after = heap_in_use();
  EXPECT(after < before + 100 * 1024, "1000 destroyed communicators kept %zu bytes", after - before);
  /* a handle destroyed recently is still recognised */
  ncclComm_t comm = one_rank_comm();
  int count;
  EXPECT_OK(ncclCommDestroy(comm));
  EXPECT_ERR(ncclCommCount(comm, &count), ncclInvalidUsage, "destroyed");
}

int main(int argc, char **argv) {
  setenv("BRAID_DEVICE", "host", 1);
  test_filter(argc - 1, argv + 1);
  TEST(group_abort, 90);
  TEST(group_abort_thread, 90);
  TEST(group_destroy, 90);
  TEST(group_jobs_gone, 30);
  TEST(mem_free_foreign, 30);
  TEST(deregister_twice, 30);
  TEST(destroy_pending_init, 30);
  TEST(last_error_scopes, 30);
  TEST(self_send_unmatched, 30);
  TEST(bad_cta_config, 30);
  TEST(aborted_call_code, 60);
  TEST(premulsum_many, 60);
  TEST(dead_comms_bounded, 120);
  return test_summary();
}
