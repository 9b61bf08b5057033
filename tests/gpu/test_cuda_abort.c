/*
 * ncclCommAbort while a collective cannot finish, one process per GPU: rank 0 starts an all-reduce that rank
 * 1 never joins; another thread of rank 0 aborts the communicator about a second later. The abort must
 * return, the thread that made the call must get out of it, and the stream must complete (the kernel stopped
 * rather than trapped: a trap would leave the process's CUDA context unusable), each within a bound that the
 * watchdog enforces. Rank 1 then aborts its own communicator, whose peer is gone.
 *
 *   abort_stuck_kernel    after a warm-up all-reduce, so every connection exists and the call is a kernel
 *                         waiting for a peer;
 *   abort_first_call      on a fresh communicator, where the call may still be waiting for its connections.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "coll_check.h"
#include "cuda_case.h"
#include "harness.h"

#define COUNT   ((size_t)1 << 20)
#define BOUND_S 20 /* what "promptly" means here: generous, it only catches an abort that never ends */

typedef struct {
  int warm_up;
  int done[2]; /* pipe: rank 0 tells the others that it is finished */
} abort_arg_t;

typedef struct {
  ncclComm_t comm;
  cuda_rank_t *r;
  void *send, *recv;
  ncclResult_t res;
  double returned_at;
  atomic_int returned;
} call_t;

static double now(void);

static void *issue_all_reduce(void *p) {
  call_t *call = p;
  if (!cuda_host) CUDA_OK(cudaSetDevice(call->r->dev)); /* a new thread starts on device 0 */
  call->res = ncclAllReduce(call->send, call->recv, COUNT, ncclFloat32, ncclSum, call->comm, call->r->stream);
  call->returned_at = now();
  atomic_store_explicit(&call->returned, 1, memory_order_release);
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void rank0(ncclComm_t comm, cuda_rank_t *r) {
  call_t call = {.comm = comm, .r = r, .send = cuda_dalloc(r, COUNT * 4), .recv = cuda_dalloc(r, COUNT * 4)};
  cuda_fill(r, call.send, 0x3f, COUNT * 4);
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, issue_all_reduce, &call) == 0, "pthread_create");
  /* Let the call get as far as it can: into the kernel, or into waiting for connections. */
  sleep(1);
  cuda_watch("rank 0: ncclCommAbort while an all-reduce waits for rank 1", BOUND_S);
  double t0 = now();
  EXPECT_OK(ncclCommAbort(comm));
  double aborted = now();
  cuda_watch("rank 0: the thread in ncclAllReduce after ncclCommAbort returned", BOUND_S);
  while (!atomic_load_explicit(&call.returned, memory_order_acquire)) usleep(1000);
  pthread_join(th, NULL);
  cuda_watch("rank 0: the all-reduce's stream after ncclCommAbort (is the kernel still running?)", BOUND_S);
  while (!cuda_stream_done(r->stream)) usleep(1000);
  cuda_unwatch();
  /* For the log: on a GPU the call usually returns at once (the kernel is what waits); on the host backend
   * it returns when aborted. */
  printf("rank 0: ncclCommAbort took %.3f s; the stream completed %.3f s after it; the call returned %s %.3f "
         "s %s "
         "the abort began\n",
         aborted - t0, now() - aborted, ncclGetErrorString(call.res),
         call.returned_at < t0 ? t0 - call.returned_at : call.returned_at - t0,
         call.returned_at < t0 ? "before" : "after");
}

static void abort_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  abort_arg_t *a = arg;
  cuda_rank_t r;
  cuda_rank_open(&r, rank, 64 << 20, 64 << 20, NULL);
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank", BOUND_S);
  EXPECT_OK(ncclCommInitRank(&comm, n, *id, rank));
  cuda_unwatch();
  if (a->warm_up) {
    coll_case_t c = {.kind = K_ALLREDUCE, .type = ncclFloat32, .op = ncclSum, .count = COUNT, .seed = 5};
    cuda_case_run(comm, &r, &c, "procs, warm-up before the abort", BOUND_S);
  }
  if (rank == 0) {
    close(a->done[0]);
    rank0(comm, &r);
    char byte = 1;
    for (int i = 1; i < n; i++) EXPECT(write(a->done[1], &byte, 1) == 1, "pipe write");
  } else {
    close(a->done[1]);
    char byte;
    /* 1 byte when rank 0 is finished, end of file when it died: either way, this rank's turn. */
    EXPECT(read(a->done[0], &byte, 1) >= 0, "pipe read");
    cuda_watch("ncclCommAbort on a rank whose peer aborted", BOUND_S);
    EXPECT_OK(ncclCommAbort(comm));
    cuda_unwatch();
  }
  cuda_rank_close(&r);
}

static void run(int warm_up) {
  abort_arg_t a = {.warm_up = warm_up};
  EXPECT(pipe(a.done) == 0, "pipe");
  int res = cuda_run_ranks(cuda_nranks, 4 * BOUND_S, abort_rank, &a);
  close(a.done[0]);
  close(a.done[1]);
  EXPECT(res == 0, "a rank failed");
}

static void abort_stuck_kernel(void) {
  run(1);
}

static void abort_first_call(void) {
  run(0);
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(abort_stuck_kernel, 5 * BOUND_S);
  TEST(abort_first_call, 5 * BOUND_S);
  return test_summary();
}
