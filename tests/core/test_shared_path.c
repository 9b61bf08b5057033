/*
 * The shared-GPU path (core/shared_gpu.h) against the tests' stand-in driver: two and three rank processes on
 * its device 0, where rank 0 moves every rank's data. The stand-in runs the stream waits (spinning in the
 * calling thread), the copies and the launches whose transfers are all local, block by block as the kernels
 * cut them (tests/gpu/mock_cuda.h), so the leader's work really reads and writes the other processes'
 * buffers, in an order a GPU may take. Checked: every collective, type family and operation at sizes 0, 1,
 * odd, a few thousand and one the kernels cut into several channels, in and out of place, against
 * independently computed values (tests/common/coll_check.h) in poisoned outputs; that ranks other than the
 * leader launch no kernel at all; point-to-point calls grouped with a collective; calls on two streams, and a
 * call through rank 0 beside a launch on another stream, wait for each other in the order made; groups that
 * must go the ordinary way (a buffer no other process can map, a captured call) go it on every rank; calls
 * that differ fail on every rank with a message that says how, and the next calls still pair; a rank whose
 * stream never comes fails the leader's communicator within BRAID_TIMEOUT_S, and releases both ranks'
 * streams; a rank whose process is killed meanwhile releases the leader at once; a leader whose launch fails
 * still releases the others.
 *
 * Without CUDA's headers there is no stand-in driver and nothing to test.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "coll_check.h"
#include "data.h"
#include "harness.h"
#include "nccl.h"

#ifdef BRAID_MOCK_CUDA_DIR

#include "gx_mock.h"

/* What the rank processes share beyond the unique id: where rank 1 says its pid. */
typedef struct {
  shared_t sh;
  volatile int pid[4];
} procs_t;

static ncclComm_t open_comm(procs_t *p, int rank, int nranks, char *log, size_t len) {
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,TUNING", 1);
  rank_log(&p->sh, rank, log, len);
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, p->sh.id, rank));
  return comm;
}

/* Runs fn on `n` rank processes sharing a procs_t, each logging into a fresh folder, with `helper` (or NULL)
 * on a thread of this process meanwhile; the ranks in `dying` (a bit each) must fail, the others succeed. */
static void run_procs_with(int n, void (*fn)(int rank, int nranks, void *arg), int timeout_s,
                           void *(*helper)(void *), unsigned dying) {
  procs_t *p = mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(p != MAP_FAILED);
  snprintf(p->sh.log_dir, sizeof p->sh.log_dir, "/tmp/braid-test-shared-XXXXXX");
  EXPECT(mkdtemp(p->sh.log_dir) != NULL);
  EXPECT_OK(ncclGetUniqueId(&p->sh.id));
  pthread_t t;
  if (helper != NULL) EXPECT(pthread_create(&t, NULL, helper, p) == 0);
  const unsigned failed = run_ranks_mask(n, timeout_s, fn, p);
  if (helper != NULL) pthread_join(t, NULL);
  EXPECT(failed == dying, "ranks 0x%x failed, 0x%x should have", failed, dying);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", p->sh.log_dir);
  EXPECT(system(cmd) == 0);
  munmap(p, sizeof *p);
}

static void run_procs(int n, void (*fn)(int rank, int nranks, void *arg), int timeout_s) {
  run_procs_with(n, fn, timeout_s, NULL, 0);
}

/* Device memory every process can map (ncclMemAlloc), for coll_check_in. */
static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  return ncclMemAlloc(&p, bytes) == ncclSuccess ? p : NULL;
}
static void dev_free(void *p) {
  EXPECT_OK(ncclMemFree(p));
}

/* The same list of cases on every rank: each collective (not the point-to-point ring, a group of
 * point-to-point calls alone, which goes the ordinary way), a float, an integer and a 16-bit float type,
 * every operation that applies (PreMulSum with its factor on the host), sizes 0, 1, odd and larger (up to
 * where the kernels cut transfers into several channels), in and out of place, roots first and last. */
static void every_case(ncclComm_t comm, int n) {
  static const size_t counts[] = {0, 1, 7, 1001, 4099, 65537};
  static const ncclDataType_t types[] = {ncclFloat32, ncclInt32, ncclBfloat16};
  uint64_t seed = 1;
  for (int k = 0; k < K_SENDRECV; k++)
    for (int t = 0; t < 3; t++)
      for (int op = 0; op <= (coll_reduces((kind_t)k) ? (int)ncclNumOps : 0); op++)
        for (int ci = 0; ci < 6; ci++)
          for (int inplace = 0; inplace < 2; inplace++) {
            if (ci > 1 && ci < 4 && op != 0 && op != ncclAvg && t == 2) continue; /* a few are enough */
            if (ci == 5 && (t != 0 || (op != 0 && op != ncclAvg))) continue;
            if (inplace && k == K_ALLTOALL) continue; /* the ordinary way: checked in ordinary_ways */
            const coll_case_t c = {.kind = (kind_t)k,
                                   .type = types[t],
                                   .op = op,
                                   .count = counts[ci],
                                   .inplace = inplace,
                                   .root = (int)(seed % 2) * (n - 1),
                                   .offset = (int)(seed % 3) * 4,
                                   .seed = seed};
            seed++;
            coll_check_in(comm, &c, dev_alloc, dev_free);
          }
}

static void collectives_rank(int rank, int n, void *arg) {
  char log[128];
  ncclComm_t comm = open_comm(arg, rank, n, log, sizeof log);
  EXPECT(test_file_lines(log, "moves the data of every rank's collectives") == 1,
         "rank %d: the communicator is not on the shared-GPU path", rank);
  EXPECT(test_file_lines(log, "time-slices their kernels: rank 0 moves the data of their collectives") == 1,
         "rank %d: init did not warn that the GPU time-slices the processes' own kernels", rank);
  mock_cuda_stats_t *st = mock_stats();
  const int launches = st->launches;
  const uint64_t waits = st->stream_waits, local = st->local_launches;
  every_case(comm, n);
  /* the leader waits for every other rank at each call, which each wait for the leader */
  if (rank == 0) {
    EXPECT(st->local_launches > local, "rank 0 ran no local launch");
    EXPECT(st->stream_waits - waits >= (uint64_t)(n - 1), "rank 0: %llu stream waits",
           (unsigned long long)(st->stream_waits - waits));
  } else {
    EXPECT(st->launches == launches, "rank %d launched %d kernels", rank, st->launches - launches);
    EXPECT(st->stream_waits > waits, "rank %d: no stream wait", rank);
  }
  EXPECT(st->stream_waits_cut == 0, "rank %d: %llu stream waits never came", rank,
         (unsigned long long)st->stream_waits_cut);
  EXPECT(test_file_lines(log, "goes the ordinary way") == 0, "rank %d: a call went the ordinary way", rank);
  EXPECT_OK(ncclCommDestroy(comm));
}

/* Point-to-point calls in a group with a collective: a ring shift of two sizes beside an all-reduce. */
static void p2p_rank(int rank, int n, void *arg) {
  char log[128];
  ncclComm_t comm = open_comm(arg, rank, n, log, sizeof log);
  enum { N = 333 };
  float *buf;
  EXPECT_OK(ncclMemAlloc((void **)&buf, 6 * N * sizeof(float)));
  float *send = buf, *recv = buf + 2 * N, *ar = buf + 4 * N;
  data_fill(send, 2 * N, 5, rank, ncclFloat, ncclSum);
  data_fill(ar, N, 6, rank, ncclFloat, ncclSum);
  data_poison(recv, 2 * N * sizeof(float));
  const int to = (rank + 1) % n, from = (rank + n - 1) % n;
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(send, N, ncclFloat, to, comm, NULL));
  EXPECT_OK(ncclRecv(recv, N, ncclFloat, from, comm, NULL));
  EXPECT_OK(ncclAllReduce(ar, ar + N, N, ncclFloat, ncclSum, comm, NULL));
  EXPECT_OK(ncclSend(send + N, N - 2, ncclFloat, to, comm, NULL));
  EXPECT_OK(ncclRecv(recv + N, N - 2, ncclFloat, from, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  for (size_t i = 0; i < 2 * N - 2; i++)
    EXPECT(recv[i] == (float)data_value(5, from, i, ncclFloat, ncclSum), "rank %d: element %zu", rank, i);
  for (size_t i = 0; i < N; i++)
    EXPECT(data_match(ar[N + i], data_expect(6, n, i, ncclFloat, ncclSum, 1.0), ncclFloat, ncclSum, n),
           "rank %d: all-reduce element %zu", rank, i);
  EXPECT(test_file_lines(log, "goes the ordinary way") == 0, "rank %d: the group went the ordinary way",
         rank);
  EXPECT_OK(ncclMemFree(buf));
  EXPECT_OK(ncclCommDestroy(comm));
}

/* What the stand-in was asked to enqueue, in order: the kind, stream and event (or word) of each. */
enum { MAX_OPS = 256 };
typedef struct {
  int kind;
  const void *stream, *obj;
} op_seen_t;
static op_seen_t ops[MAX_OPS];
static int nops;

static void record_op(const mock_cuda_op_t *op) {
  if (nops < MAX_OPS)
    ops[nops++] = (op_seen_t){(int)op->kind, op->stream, op->src != NULL ? op->src : op->dst};
}

/* Whether the first operation on stream b from operation `from` on comes after b waits for an event recorded
 * on stream a after a's last operation before it. */
static int ordered_after_from(const void *a, const void *b, int from) {
  int first_b = -1, last_a = -1;
  for (int i = 0; i < nops && first_b < 0; i++) {
    const int work = ops[i].kind != MOCK_OP_EVENT_RECORD && ops[i].kind != MOCK_OP_EVENT_WAIT;
    if (work && ops[i].stream == b && i >= from) first_b = i;
    if (work && ops[i].stream == a) last_a = i;
  }
  if (first_b < 0 || last_a < 0) return 0;
  for (int j = last_a + 1; j < first_b; j++) {
    if (ops[j].kind != MOCK_OP_EVENT_WAIT || ops[j].stream != b) continue;
    for (int k = last_a + 1; k < j; k++)
      if (ops[k].kind == MOCK_OP_EVENT_RECORD && ops[k].stream == a && ops[k].obj == ops[j].obj) return 1;
  }
  return 0;
}

static int ordered_after(const void *a, const void *b) {
  return ordered_after_from(a, b, 0);
}

/* Two all-reduces of `count` floats on streams a and b, in one group or not, with what the stand-in was asked
 * to enqueue recorded in ops; checks every element and that neither went the ordinary way. */
static void two_reduces(ncclComm_t comm, int rank, int n, const char *log, size_t count, int grouped,
                        cudaStream_t a, cudaStream_t b) {
  mock_cuda_op_fn *hook = mock_sym(MOCK_CUDA_ON_OP);
  float *dev;
  EXPECT_OK(ncclMemAlloc((void **)&dev, 4 * count * sizeof(float)));
  data_fill(dev, count, 11, rank, ncclFloat, ncclSum);
  data_fill(dev + 2 * count, count, 12, rank, ncclFloat, ncclSum);
  data_poison(dev + count, count * sizeof(float));
  data_poison(dev + 3 * count, count * sizeof(float));
  nops = 0;
  *hook = record_op;
  if (grouped) EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(dev, dev + count, count, ncclFloat, ncclSum, comm, a));
  EXPECT_OK(ncclAllReduce(dev + 2 * count, dev + 3 * count, count, ncclFloat, ncclSum, comm, b));
  if (grouped) EXPECT_OK(ncclGroupEnd());
  *hook = NULL;
  for (size_t i = 0; i < count; i++) {
    EXPECT(data_match(dev[count + i], data_expect(11, n, i, ncclFloat, ncclSum, 1.0), ncclFloat, ncclSum, n),
           "rank %d: first all-reduce, element %zu", rank, i);
    EXPECT(
        data_match(dev[3 * count + i], data_expect(12, n, i, ncclFloat, ncclSum, 1.0), ncclFloat, ncclSum, n),
        "rank %d: second all-reduce, element %zu", rank, i);
  }
  EXPECT(test_file_lines(log, "goes the ordinary way") == 0, "rank %d: a call went the ordinary way", rank);
  EXPECT_OK(ncclMemFree(dev));
}

/* Two calls on two streams, nothing between them: each rank has one word the leader waits on, so the second
 * call's operations must wait for the first's, as launches on different streams do (else a GPU could raise
 * the word again before the leader saw it the first time, and the leader would wait forever). */
static void two_streams_rank(int rank, int n, void *arg) {
  char log[128];
  ncclComm_t comm = open_comm(arg, rank, n, log, sizeof log);
  cudaStream_t a = (cudaStream_t)(uintptr_t)0x5a, b = (cudaStream_t)(uintptr_t)0x5b;
  two_reduces(comm, rank, n, log, 1001, 0, a, b);
  EXPECT(ordered_after(a, b),
         "rank %d: the call on the second stream does not wait for the first (%d operations)", rank, nops);
  int waits = 0;
  for (int i = 0; i < nops; i++) waits += ops[i].kind == MOCK_OP_EVENT_WAIT && ops[i].stream == b;
  EXPECT(waits == 1, "rank %d: the second stream waited %d times for the first, not once", rank, waits);
  EXPECT_OK(ncclCommDestroy(comm));
}

/* A collective through rank 0, point-to-point calls alone on another stream (the ordinary way: a launch),
 * then a collective on the first stream again, as PyTorch orders its collectives and its point-to-point
 * calls on one communicator: each waits for the one before it, whichever way either went. */
static void path_and_launch_rank(int rank, int n, void *arg) {
  char log[128];
  ncclComm_t comm = open_comm(arg, rank, n, log, sizeof log);
  mock_cuda_op_fn *hook = mock_sym(MOCK_CUDA_ON_OP);
  enum { N = 777 };
  float *dev;
  EXPECT_OK(ncclMemAlloc((void **)&dev, 4 * N * sizeof(float)));
  data_fill(dev, N, 13, rank, ncclFloat, ncclSum);
  data_poison(dev + N, N * sizeof(float));
  cudaStream_t a = (cudaStream_t)(uintptr_t)0x6a, b = (cudaStream_t)(uintptr_t)0x6b;
  nops = 0;
  *hook = record_op;
  EXPECT_OK(ncclAllReduce(dev, dev + N, N, ncclFloat, ncclSum, comm, a));
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(dev + 2 * N, N, ncclFloat, 1 - rank, comm, b));
  EXPECT_OK(ncclRecv(dev + 3 * N, N, ncclFloat, 1 - rank, comm, b));
  EXPECT_OK(ncclGroupEnd());
  const int third = nops;
  EXPECT_OK(ncclAllReduce(dev, dev + N, N, ncclFloat, ncclSum, comm, a));
  *hook = NULL;
  EXPECT(ordered_after(a, b), "rank %d: the launch does not wait for the call through rank 0 (%d operations)",
         rank, nops);
  EXPECT(ordered_after_from(b, a, third),
         "rank %d: the call through rank 0 does not wait for the launch before it (%d operations)", rank,
         nops);
  int launches = 0;
  for (int i = 0; i < nops; i++) launches += ops[i].kind == MOCK_OP_LAUNCH && ops[i].stream == b;
  EXPECT(launches > 0, "rank %d: the point-to-point calls launched nothing on their stream", rank);
  for (size_t i = 0; i < N; i++)
    EXPECT(data_match(dev[N + i], data_expect(13, n, i, ncclFloat, ncclSum, 1.0), ncclFloat, ncclSum, n),
           "rank %d: element %zu", rank, i);
  EXPECT_OK(ncclMemFree(dev));
  EXPECT_OK(ncclCommDestroy(comm));
}

/* Whether stream `to` waits for an event recorded on `from`: after `from`'s last move of data (late = 1), or
 * before `to`'s first (late = 0). A move is a launch or a copy; on a rank that moves none, any operation. */
static int joined(const void *from, const void *to, int late) {
  int first_to = nops, first_move = nops, last_from = -1, last_move = -1;
  for (int i = 0; i < nops; i++) {
    const int work = ops[i].kind != MOCK_OP_EVENT_RECORD && ops[i].kind != MOCK_OP_EVENT_WAIT;
    const int move = ops[i].kind == MOCK_OP_LAUNCH || ops[i].kind == MOCK_OP_COPY;
    if (work && ops[i].stream == to && first_to == nops) first_to = i;
    if (move && ops[i].stream == to && first_move == nops) first_move = i;
    if (work && ops[i].stream == from) last_from = i;
    if (move && ops[i].stream == from) last_move = i;
  }
  const int since = !late ? 0 : last_move >= 0 ? last_move + 1 : last_from + 1;
  const int until = late ? nops : first_move < nops ? first_move : first_to;
  for (int k = since; k < until; k++) {
    if (ops[k].kind != MOCK_OP_EVENT_RECORD || ops[k].stream != from) continue;
    for (int j = k + 1; j < until; j++)
      if (ops[j].kind == MOCK_OP_EVENT_WAIT && ops[j].stream == to && ops[j].obj == ops[k].obj) return 1;
  }
  return 0;
}

/* One group with calls on two streams: the group's work (on its first stream) waits for the second stream's
 * work before it, and the second stream for the group's work, as around a launch. */
static void group_streams_rank(int rank, int n, void *arg) {
  char log[128];
  ncclComm_t comm = open_comm(arg, rank, n, log, sizeof log);
  cudaStream_t a = (cudaStream_t)(uintptr_t)0x7a, b = (cudaStream_t)(uintptr_t)0x7b;
  two_reduces(comm, rank, n, log, 515, 1, a, b);
  EXPECT(joined(b, a, 0), "rank %d: the group's work does not wait for its second stream (%d operations)",
         rank, nops);
  EXPECT(joined(a, b, 1), "rank %d: the second stream does not wait for the group's work (%d operations)",
         rank, nops);
  EXPECT_OK(ncclCommDestroy(comm));
}

/* Groups that go the ordinary way on every rank (the stand-in's kernels move nothing there): a buffer no
 * other process can map on one rank, an in-place all-to-all, a captured call; then calls that differ fail on
 * every rank, and a matching call after them still goes through rank 0. */
static void ordinary_rank(int rank, int n, void *arg) {
  char log[128];
  ncclComm_t comm = open_comm(arg, rank, n, log, sizeof log);
  mock_cuda_stats_t *st = mock_stats();
  enum { N = 1000 };
  float *dev, *host = malloc(n * N * sizeof(float));
  EXPECT(host != NULL);
  EXPECT_OK(ncclMemAlloc((void **)&dev, n * N * sizeof(float)));
  const uint64_t waits = st->stream_waits;
  EXPECT_OK(ncclAllReduce(dev, rank == n - 1 ? host : dev, N, ncclFloat, ncclSum, comm, NULL));
  EXPECT_OK(ncclAlltoAll(dev, dev, N, ncclFloat, comm, NULL));
  /* captured into a CUDA graph: a graph would keep rank 0's waits and the other ranks' buffers */
  EXPECT_OK(ncclAllReduce(dev, dev + N, N, ncclFloat, ncclSum, comm, (cudaStream_t)MOCK_CUDA_CAPTURING));
  EXPECT(st->stream_waits == waits, "rank %d: an ordinary group waited on the stream", rank);
  EXPECT(test_file_lines(log, "goes the ordinary way") == 1, "rank %d: the refusal was not logged once",
         rank);
  /* rank 1 asks for one element more */
  ncclResult_t res = ncclAllReduce(dev, dev, N + (rank == 1), ncclFloat, ncclSum, comm, NULL);
  EXPECT(res == ncclInvalidUsage, "rank %d: calls that differ gave %s", rank, ncclGetErrorString(res));
  EXPECT(strstr(ncclGetLastError(comm), "1000 x") != NULL && strstr(ncclGetLastError(comm), "1001 x") != NULL,
         "rank %d: the error does not say how the calls differ: %s", rank, ncclGetLastError(comm));
  data_fill(dev, N, 9, rank, ncclFloat, ncclSum);
  EXPECT_OK(ncclAllReduce(dev, dev + N, N, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < N; i++)
    EXPECT(data_match(dev[N + i], data_expect(9, n, i, ncclFloat, ncclSum, 1.0), ncclFloat, ncclSum, n),
           "rank %d: element %zu after the refusals", rank, i);
  ncclResult_t async;
  EXPECT_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "rank %d: %s", rank, ncclGetErrorString(async));
  free(host);
  EXPECT_OK(ncclMemFree(dev));
  EXPECT_OK(ncclCommDestroy(comm));
}

/* A communicator (logging into `log`) and a device buffer of two floats that every process can map. */
static ncclComm_t open_with_dev(procs_t *p, int rank, int n, char *log, size_t len, float **dev) {
  ncclComm_t comm = open_comm(p, rank, n, log, len);
  EXPECT_OK(ncclMemAlloc((void **)dev, 2 * sizeof(float)));
  return comm;
}

/* Both ranks: an all-reduce once (rank 0 maps rank 1's buffer now: a stopped process serves no descriptor),
 * then again, rank 1 first; rank 0 stops rank 1 while it waits for the answer to its calls, so that rank 1's
 * stream never raises its word, and returns how long its own call took (released), with rank 1 still
 * stopped (-1 on rank 1, whose call returns whatever its waits found). */
static double stop_rank1(procs_t *p, int rank, ncclComm_t comm, float *dev) {
  EXPECT_OK(ncclAllReduce(dev, dev + 1, 1, ncclFloat, ncclSum, comm, NULL));
  if (rank == 1) {
    p->pid[1] = (int)getpid();
    ncclAllReduce(dev, dev + 1, 1, ncclFloat, ncclSum, comm, NULL);
    return -1;
  }
  while (p->pid[1] == 0) usleep(1000);
  usleep(500 * 1000); /* rank 1 is waiting for the answer to its calls by now */
  EXPECT(kill(p->pid[1], SIGSTOP) == 0);
  p->pid[0] = 1; /* for a helper of the runner's */
  const double t0 = time_now();
  EXPECT_OK(ncclAllReduce(dev, dev + 1, 1, ncclFloat, ncclSum, comm, NULL)); /* returns once released */
  return time_now() - t0;
}

/* The communicator's asynchronous error, once the watch (which looks every few milliseconds) found one. */
static ncclResult_t async_error(ncclComm_t comm) {
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 2000 && async == ncclSuccess; i++) {
    EXPECT_OK(ncclCommGetAsyncError(comm, &async));
    usleep(1000);
  }
  return async;
}

/* Rank 1's stream never reaches the call (the process is stopped after sending its calls): rank 0's wait
 * fails after BRAID_TIMEOUT_S, naming rank 1, and is released; once rank 1 goes on, its own wait finds the
 * leader's release and its communicator fails too. */
static void stalled_rank(int rank, int n, void *arg) {
  procs_t *p = arg;
  char log[128];
  float *dev;
  ncclComm_t comm = open_with_dev(p, rank, n, log, sizeof log, &dev);
  const double waited = stop_rank1(p, rank, comm, dev);
  if (rank == 0) {
    EXPECT(kill(p->pid[1], SIGCONT) == 0);
    EXPECT(waited > 1.5 && waited < 20, "rank 0's wait lasted %.1f s (BRAID_TIMEOUT_S 2)", waited);
    EXPECT(test_file_lines(log, "(BRAID_TIMEOUT_S) for rank 1 (whose stream never reached it)") == 1,
           "rank 0: the failure does not name rank 1");
  }
  const ncclResult_t async = async_error(comm);
  EXPECT(async != ncclSuccess, "rank %d: the communicator did not fail", rank);
  if (rank == 0)
    EXPECT(async == ncclRemoteError, "rank 0: the communicator says %s", ncclGetErrorString(async));
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT_OK(ncclMemFree(dev));
}

/* Rank 1's process is killed while rank 0's stream waits for it: rank 0's wait is released at once (not
 * after BRAID_TIMEOUT_S), and its communicator fails, naming rank 1's exit. */
static void killed_rank(int rank, int n, void *arg) {
  procs_t *p = arg;
  char log[128];
  float *dev;
  ncclComm_t comm = open_with_dev(p, rank, n, log, sizeof log, &dev);
  const double waited = stop_rank1(p, rank, comm, dev);
  if (rank == 1) pause(); /* killed meanwhile */
  EXPECT(waited < 20, "rank 0's wait lasted %.1f s (BRAID_TIMEOUT_S 60)", waited);
  const ncclResult_t async = async_error(comm);
  EXPECT(async == ncclRemoteError, "rank 0: the communicator says %s", ncclGetErrorString(async));
  EXPECT(test_file_lines(log, "rank 1's process") == 1, "rank 0: the failure does not name rank 1's exit");
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT_OK(ncclMemFree(dev));
}

/* Rank 0's launch fails (the stand-in refuses it): its call fails, and the other rank's stream, which waits
 * for rank 0's, is still released and its communicator fails too, without waiting for a timeout. */
static void launch_fails_rank(int rank, int n, void *arg) {
  char log[128];
  float *dev;
  ncclComm_t comm = open_with_dev(arg, rank, n, log, sizeof log, &dev);
  mock_cuda_stats_t *st = mock_stats();
  EXPECT_OK(ncclAllReduce(dev, dev + 1, 1, ncclFloat, ncclSum, comm, NULL));
  if (rank == 0) setenv("MOCK_CUDA_FAIL_LAUNCHES", "1", 1);
  const double t0 = time_now();
  const ncclResult_t res = ncclAllReduce(dev, dev + 1, 1, ncclFloat, ncclSum, comm, NULL);
  unsetenv("MOCK_CUDA_FAIL_LAUNCHES");
  EXPECT(rank != 0 || res != ncclSuccess, "rank 0: a call whose launch failed succeeded");
  EXPECT(time_now() - t0 < 20, "rank %d: the call took %.1f s", rank, time_now() - t0);
  EXPECT(st->stream_waits_cut == 0, "rank %d: a stream wait was never released", rank);
  EXPECT(async_error(comm) != ncclSuccess, "rank %d: the communicator did not fail", rank);
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT_OK(ncclMemFree(dev));
}

/* The runner's side of killed_rank: kills rank 1 one second after rank 0 stopped it. */
static void *killer(void *arg) {
  procs_t *p = arg;
  while (p->pid[0] == 0) usleep(1000);
  usleep(1000 * 1000);
  kill(p->pid[1], SIGKILL);
  return NULL;
}

static void killed(void) {
  setenv("BRAID_TIMEOUT_S", "60", 1);
  run_procs_with(2, killed_rank, 60, killer, 2);
  unsetenv("BRAID_TIMEOUT_S");
}

static void shared_path(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_SHARED_GPU_LEADER", "1", 1);
  setenv("MOCK_CUDA_RUN_LOCAL", "1", 1);
  unsetenv("MOCK_CUDA_STUCK");
  run_procs(2, collectives_rank, 120);
  run_procs(3, collectives_rank, 120);
  run_procs(3, p2p_rank, 60);
  run_procs(3, two_streams_rank, 60);
  run_procs(2, path_and_launch_rank, 60);
  run_procs(3, group_streams_rank, 60);
  run_procs(2, ordinary_rank, 60);
  setenv("BRAID_TIMEOUT_S", "2", 1);
  run_procs(2, stalled_rank, 60);
  unsetenv("BRAID_TIMEOUT_S");
  killed();
  run_procs(2, launch_fails_rank, 60);
}

/* BRAID_SHARED_GPU_LEADER 0 on one rank, 1 on the other: no rank takes the path. */
static void off_rank(int rank, int n, void *arg) {
  if (rank == 1) setenv("BRAID_SHARED_GPU_LEADER", "0", 1);
  char log[128];
  ncclComm_t comm = open_comm(arg, rank, n, log, sizeof log);
  EXPECT(test_file_lines(log, "ranks share this GPU but not the shared-GPU path") == 1,
         "rank %d: the path is not off", rank);
  mock_cuda_stats_t *st = mock_stats();
  const uint64_t waits = st->stream_waits;
  float *dev;
  EXPECT_OK(ncclMemAlloc((void **)&dev, 2 * sizeof(float)));
  EXPECT_OK(ncclAllReduce(dev, dev + 1, 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(st->stream_waits == waits, "rank %d waited on the stream", rank);
  EXPECT_OK(ncclMemFree(dev));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void shared_path_off(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_SHARED_GPU_LEADER", "1", 1);
  run_procs(2, off_rank, 60);
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  test_filter(argc - 1, argv + 1);
  TEST(shared_path, 400);
  TEST(shared_path_off, 60);
  return test_summary();
}

#else

int main(void) {
  printf("built without CUDA's headers: no stand-in driver, nothing to test\n");
  return 0;
}

#endif
