/*
 * The GPU executor proper (core/gpu_exec.h) against the tests' stand-in driver (tests/gpu/mock_cuda.c), on a
 * machine without a GPU: a work queue that fills up behind kernels that never finish (MOCK_CUDA_STUCK) must
 * wait, say so once at WARN (naming the queue's bytes, the launches holding them and the oldest launch) and
 * come back with an error on an abort, and the abort must come back although the GPU never finishes; ranks
 * whose tuning knobs differ fail init; the last launch is launched again from memory; launches overlap the
 * previous kernel as the device allows; the tuner's choices are logged; and a failed ncclCommInitAll cleans
 * up. Without CUDA's headers there is no stand-in driver and nothing to test.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "data.h"
#include "harness.h"
#include "nccl.h"

#ifdef BRAID_MOCK_CUDA_DIR

#include "core/comm.h"
#include "core/gpu_exec.h"
#include "core/tune.h"
#include "core/workq.h"
#include "device/dev.h"
#include "gpu/gpu.h"
#include "gx_mock.h"

/* A group of GROUP sends and GROUP receives is one launch of 2 * GROUP transfers, more than the kernel
 * parameters carry: it spills its list into a work-queue entry (a launch whose list fits takes none). */
enum { CALLS = 5000, QUEUE = 65536, GROUP = 29 };

/* Aborts once the full queue was reported (the harness's time limit bounds the wait). */
static void *abort_after_warn(void *arg) {
  const aborter_t *a = arg;
  while (!test_file_lines(a->log_path, "the work queue has been full for")) usleep(50000);
  EXPECT_OK(ncclCommAbort(a->comm));
  return NULL;
}

static void full_queue_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  char log_path[128];
  rank_log(sh, rank, log_path, sizeof log_path);
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  pthread_t aborter;
  aborter_t a = {comm, log_path};
  EXPECT(pthread_create(&aborter, NULL, abort_after_warn, &a) == 0);
  /* the stand-in driver never touches buffers: any address will do */
  void *buf = (void *)(uintptr_t)0x10000000;
  int stopped_at = -1, entries = 0;
  for (int i = 0; i < CALLS; i++) {
    ncclResult_t res = ncclGroupStart();
    for (int j = 0; j < GROUP && res == ncclSuccess; j++) {
      res = ncclSend(buf, 2, ncclFloat, 1 - rank, comm, NULL);
      if (res == ncclSuccess) res = ncclRecv((char *)buf + 64, 2, ncclFloat, 1 - rank, comm, NULL);
    }
    ncclResult_t end = ncclGroupEnd();
    if (res != ncclSuccess || end != ncclSuccess) {
      stopped_at = i;
      break;
    }
    if (i == 0) { /* one launch per group, its list spilled: the queue holds this many before one waits */
      const dev_work_t *w = (const dev_work_t *)mock_stats()->last_work;
      EXPECT(w->ext != NULL && w->done != NULL && w->nxfers == 2 * GROUP, "rank %d: %d transfers, spilled %d",
             rank, w->nxfers, w->ext != NULL);
      entries = (int)(QUEUE / wq_entry_bytes((uint64_t)w->nxfers * sizeof(dev_xfer_t)));
    }
  }
  pthread_join(aborter, NULL);
  EXPECT(stopped_at >= entries, "rank %d: the calls stopped at %d, before the queue was full (%d entries)",
         rank, stopped_at, entries);
  EXPECT(test_file_lines(log_path, "the work queue has been full for"), "rank %d: no WARN of the full queue",
         rank);
  char held[64];
  snprintf(held, sizeof held, "held by %d eager launches", entries);
  EXPECT(test_file_lines(log_path, held), "rank %d: the WARN misses the launch count (%s)", rank, held);
  EXPECT(test_file_lines(log_path, "the oldest, Send (call "), "rank %d: the WARN misses the oldest launch",
         rank);
  EXPECT(test_file_lines(log_path, "its device memory is left allocated"),
         "rank %d: no WARN of the stuck GPU", rank);
}

/* Eager launches with spilled lists on a GPU whose kernels never finish: the wait for queue space is reported
 * and abort-aware. */
static void full_queue_wait(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("MOCK_CUDA_STUCK", "1", 1);
  setenv("NCCL_WORK_FIFO_BYTES", "65536", 1);
  setenv("BRAID_QUEUE_WARN_S", "1", 1);
  setenv("BRAID_TIMEOUT_S", "1", 1);
  setenv("NCCL_DEBUG", "WARN", 1);
  run_with_logs(full_queue_rank, 60);
}

/* Ranks whose GPU algorithm or protocol knobs differ would each wait for transfers the other never sends:
 * init fails on both, naming the knob. The same value spelled another way (an NCCL_PROTO listing every
 * protocol) is no difference. */
static const char *const knob_cases[][3] = {
    /* name, rank 1's value, what the error names */
    {"BRAID_LL128_MIN_BYTES", "65536", "BRAID_LL128_MIN_BYTES"},
    {"BRAID_LL128_ONE_WAY_MIN_BYTES", "131072", "BRAID_LL128_ONE_WAY_MIN_BYTES"},
    {"NCCL_PROTO", "Simple", "NCCL_PROTO"},
    {"NCCL_ALGO", "allreduce:ring", "NCCL_ALGO"},
    {"BRAID_WIDE_STEPS", "1", "BRAID_WIDE_STEPS"},
    {"BRAID_AR_SPLIT_BYTES", "0", "BRAID_AR_SPLIT_BYTES"},
    {"BRAID_DEALT_MIN_BYTES", "1048576", "BRAID_DEALT_MIN_BYTES"},
    {"NCCL_PROTO", "LL,LL128,Simple", NULL},
};

static int knob_case;

static void knob_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  const char *const *c = knob_cases[knob_case];
  if (rank == 1) setenv(c[0], c[1], 1);
  param_reload(); /* this rank process's environment, not the one it was forked with */
  ncclComm_t comm = (ncclComm_t)1;
  const ncclResult_t res = ncclCommInitRank(&comm, nranks, sh->id, rank);
  if (c[2] == NULL) {
    EXPECT(res == ncclSuccess, "rank %d: %s=%s on rank 1 only: init returned %d (%s)", rank, c[0], c[1],
           (int)res, ncclGetLastError(NULL));
    if (res == ncclSuccess) EXPECT_OK(ncclCommDestroy(comm));
    return;
  }
  const char *err = ncclGetLastError(NULL);
  EXPECT(res == ncclInvalidUsage && comm == NULL, "rank %d: %s=%s on rank 1 only: init returned %d", rank,
         c[0], c[1], (int)res);
  EXPECT(strstr(err, c[2]) != NULL && strstr(err, "same on all ranks") != NULL,
         "rank %d: %s=%s on rank 1 only: the error does not name %s: %s", rank, c[0], c[1], c[2], err);
}

static void knobs_agree(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  for (knob_case = 0; knob_case < (int)(sizeof knob_cases / sizeof knob_cases[0]); knob_case++) {
    unsetenv(knob_cases[knob_case][0]);
    shared_t sh;
    EXPECT_OK(ncclGetUniqueId(&sh.id));
    EXPECT(run_ranks(2, 60, knob_rank, &sh) == 0, "a rank failed (%s=%s on rank 1)", knob_cases[knob_case][0],
           knob_cases[knob_case][1]);
  }
}

/* ---- The last LL launch remembered (gpu_work.c, memo_launch) ---- */

/* One launch as the stand-in driver saw it. */
typedef struct {
  char entry; /* last_entry, or 'p': the pair kernel */
  unsigned grid, block;
  const void *at; /* where the library passed its parameter from */
  uint64_t seq;   /* the call's number in the parameter */
  unsigned char work[4096];
} seen_t;

static void seen(const mock_cuda_stats_t *s, seen_t *l) {
  l->entry = s->last_pair ? 'p' : last_entry(s);
  l->grid = s->last_grid;
  l->block = s->last_block;
  l->at = s->last_param_at;
  memcpy(l->work, s->last_work, sizeof l->work);
  /* the number's place: dev_pair_t's, or the work's (the small work shares the head of dev_work_t) */
  uint64_t *seq = s->last_pair ? &((dev_pair_t *)l->work)->seq : &((dev_work_t *)l->work)->seq;
  l->seq = *seq;
  *seq = 0;
}

/* memo_rank's all-reduces by call number (count 0: another call): in place, or the output's offset; count,
 * type and operation. */
typedef struct {
  int in_place;
  size_t out_at, count;
  ncclDataType_t type;
  ncclRedOp_t op;
} memo_ar_t;

static const memo_ar_t memo_ars[18] = {
    [1] = {0, 0, 2, ncclFloat, ncclSum},      [2] = {1, 0, 4096, ncclFloat, ncclSum},
    [3] = {0, 64, 2, ncclFloat, ncclSum},     [4] = {0, 0, 3, ncclFloat, ncclSum},
    [5] = {0, 0, 2, ncclInt32, ncclMax},      [6] = {0, 0, 2, ncclFloat, ncclProd},
    [7] = {0, 0, 131072, ncclFloat, ncclSum}, [14] = {0, 0, 393217, ncclFloat, ncclSum}, /* Simple */
    [17] = {0, 0, 2, ncclFloat16, ncclSum}};

/* The calls of memo_rank, by number (1-17): the same number makes the same call. */
static void memo_call(int k, int rank, ncclComm_t comm, char *buf, char *out) {
  const memo_ar_t *a = &memo_ars[k];
  if (a->count > 0) {
    EXPECT_OK(ncclAllReduce(buf, a->in_place ? buf : out + a->out_at, a->count, a->type, a->op, comm, NULL));
    return;
  }
  const int peer = 1 - rank;
  ncclRedOp_t premul;
  float scale = k == 8 ? 2.0f : 3.0f;
  switch (k) {
  case 8: /* PreMulSum by 2, then (9) by 3 over the same buffers */
  case 9:
    EXPECT_OK(ncclRedOpCreatePreMulSum(&premul, &scale, ncclFloat, ncclScalarHostImmediate, comm));
    EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, premul, comm, NULL));
    EXPECT_OK(ncclRedOpDestroy(premul, comm));
    break;
  case 10:
  case 11:
    EXPECT_OK(ncclBroadcast(buf, out, 16, ncclFloat, k - 10, comm, NULL));
    break;
  case 12:
    EXPECT_OK(ncclAllGather(buf, out, 196608, ncclFloat, comm, NULL));
    break;
  case 13:
    EXPECT_OK(ncclReduceScatter(buf, out, 16, ncclFloat, ncclSum, comm, NULL));
    break;
  case 15: /* a group of two calls: two steps */
    EXPECT_OK(ncclGroupStart());
    EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, ncclSum, comm, NULL));
    EXPECT_OK(ncclAllReduce(buf + 64, out + 64, 2, ncclFloat, ncclSum, comm, NULL));
    EXPECT_OK(ncclGroupEnd());
    break;
  case 16:
    EXPECT_OK(ncclGroupStart());
    EXPECT_OK(ncclSend(buf, 16, ncclFloat, peer, comm, NULL));
    EXPECT_OK(ncclRecv(out, 16, ncclFloat, peer, comm, NULL));
    EXPECT_OK(ncclGroupEnd());
    break;
  default:
    EXPECT(0, "memo_call: no call %d", k);
  }
}

/* Each call of a sequence that repeats, alternates and varies its calls must launch what the full path
 * builds for it, which the same call at TRACE (TUNING) rebuilds right after on the same communicator: the
 * same entry point, grid and block, the same parameter bytes but the call's number, and that number one lower
 * (two for a group of two calls). A call comes from the memo (whose parameters the library passes from a
 * place of their own) exactly when the memo holds the same call: the last call at WARN of one step on the LL
 * or pair entry point, unless a call of one step on another entry point came after it (the TRACE calls leave
 * the memo alone). After the rebuild the call goes twice more at WARN: the first takes the full path (the
 * TRACE call made the executor forget its calls), the second is launched again unplanned (gx_relaunch)
 * exactly when the call is one step from the memo; and so is the next number's first call when it is the
 * same call, not when it is another. */
static void memo_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  char log_path[128];
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  rank_log(sh, rank, log_path, sizeof log_path);
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  mock_cuda_stats_t *s = mock_stats();
  char *buf = (char *)(uintptr_t)0x10000000, *out = (char *)(uintptr_t)0x20000000;
  static const int calls[] = {1,  1,  1,  2,  2, 1,  3,  3, 4, 5,  5, 6,  7,  7,  8,  9,  9, 8, 10, 10, 11,
                              12, 12, 13, 14, 1, 14, 14, 1, 1, 15, 1, 15, 16, 16, 17, 17, 1, 4, 1,  8};
  const int n = (int)(sizeof calls / sizeof calls[0]);
  int hits = 0, held = 0, recalled = 0, relaunched = 0;
  for (int i = 0; i < n; i++) {
    const int k = calls[i];
    const uint64_t ncalls = k == 15 || k == 16 ? 2 : 1; /* the group's calls */
    /* 0: the call; 1: its rebuild at TRACE; 2 and 3: the call again at WARN */
    seen_t l[4];
    uint64_t again[4];
    for (int j = 0; j < 4; j++) {
      const int trace = j == 1;
      if (trace || j == 2) {
        setenv("NCCL_DEBUG", trace ? "TRACE" : "WARN", 1);
        param_reload();
        log_init();
      }
      const uint64_t launches = s->launches, before = gx_relaunches(comm->gx);
      memo_call(k, rank, comm, buf, out);
      seen(s, &l[j]);
      again[j] = gx_relaunches(comm->gx) - before;
      EXPECT(s->launches - launches >= 1, "rank %d, call %d (%d), turn %d: %llu launches", rank, i, k, j,
             (unsigned long long)(s->launches - launches));
    }
    const seen_t *rebuilt = &l[1];
    for (int j = 0; j < 4; j++) {
      if (j == 1) continue;
      const seen_t *first = &l[j];
      EXPECT(first->entry == rebuilt->entry && first->grid == rebuilt->grid && first->block == rebuilt->block,
             "rank %d, call %d (%d), turn %d: entry %c, %u blocks of %u against %c, %u of %u rebuilt", rank,
             i, k, j, first->entry, first->grid, first->block, rebuilt->entry, rebuilt->grid, rebuilt->block);
      EXPECT(memcmp(first->work, rebuilt->work, sizeof first->work) == 0,
             "rank %d, call %d (%d), turn %d: the parameters differ from the rebuilt ones", rank, i, k, j);
      EXPECT(first->seq == l[0].seq + (uint64_t)j * ncalls,
             "rank %d, call %d (%d), turn %d: call number %llu", rank, i, k, j,
             (unsigned long long)first->seq);
    }
    EXPECT(rebuilt->seq == l[0].seq + ncalls, "rank %d, call %d (%d): call number %llu, rebuilt %llu", rank,
           i, k, (unsigned long long)l[0].seq, (unsigned long long)rebuilt->seq);
    const int hit = l[0].at != rebuilt->at;
    EXPECT(hit == (held == k), "rank %d, call %d (%d, entry %c): %s the memo, which holds call %d", rank, i,
           k, l[0].entry, hit ? "launched from" : "not launched from", held);
    hits += hit;
    /* what the memo holds next: this call if it launched one step on the LL or pair entry point; nothing if
     * it launched one step otherwise; the group of two calls, two steps, leaves it alone */
    if (k != 15) held = l[0].entry == 'l' || l[0].entry == 'p' ? k : 0;
    const int one_step = k != 15 && (l[0].entry == 'l' || l[0].entry == 'p');
    EXPECT(
        again[0] == (recalled == k) && again[1] == 0 && again[2] == 0 && again[3] == (uint64_t)one_step,
        "rank %d, call %d (%d): launched again unplanned %llu, %llu, %llu, %llu times (the last calls: %d)",
        rank, i, k, (unsigned long long)again[0], (unsigned long long)again[1], (unsigned long long)again[2],
        (unsigned long long)again[3], recalled);
    relaunched += (int)(again[0] + again[3]);
    recalled = one_step ? k : 0;
  }
  EXPECT(hits >= 10, "rank %d: %d calls came from the memo", rank, hits);
  EXPECT(relaunched >= 25, "rank %d: %d calls were launched again unplanned", rank, relaunched);
  /* the same call captured takes the full path, and the eager call after it too (a capture forgets) */
  for (int j = 0; j < 2; j++) memo_call(1, rank, comm, buf, out);
  uint64_t before = gx_relaunches(comm->gx);
  EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, ncclSum, comm, (cudaStream_t)MOCK_CUDA_CAPTURING));
  EXPECT(gx_relaunches(comm->gx) == before, "rank %d: a captured call was launched again unplanned", rank);
  mock_graph_destroy();
  memo_call(1, rank, comm, buf, out);
  EXPECT(gx_relaunches(comm->gx) == before, "rank %d: the call after a capture was launched again", rank);
  memo_call(1, rank, comm, buf, out);
  EXPECT(gx_relaunches(comm->gx) == before + 1, "rank %d: the next one was not", rank);
  EXPECT_OK(ncclCommDestroy(comm));
}

static void launch_memo(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  run_with_logs(memo_rank, 60);
  unsetenv("NCCL_DEBUG_SUBSYS");
  setenv("NCCL_DEBUG", "WARN", 1);
}

/* NCCL_DEBUG_SUBSYS=TUNING logs a launch's shape once per entry point and size class at INFO, every launch at
 * TRACE: a 64 MiB broadcast twice is one line, with its batches of 2 pieces; a 16 MiB one has no cap. */
static void tuning_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  void *buf = (void *)(uintptr_t)0x10000000, *out = (void *)(uintptr_t)0x20000000;
  EXPECT(test_file_lines(log_path, "40 channels, 60 rings a connection") == 1,
         "rank %d: init says how many channels and rings", rank);
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclBroadcast(buf, out, 16u << 20, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclBroadcast(buf, out, 4u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(test_file_lines(log_path, "the largest 67108864 bytes over 60 channels") == 1 &&
             test_file_lines(log_path, "the largest 67108864 bytes over 60 channels: small entry point") == 1,
         "rank %d: one line for two 64 MiB broadcasts", rank);
  EXPECT(test_file_lines(log_path, "Simple batches: 2 pieces") == 1,
         "rank %d: the 64 MiB broadcast's batches", rank);
  EXPECT(test_file_lines(log_path, "Broadcast of 67108864 bytes (float, 2 ranks, call ") == 1,
         "rank %d: the tuner's choice for the 64 MiB broadcasts, once", rank);
  EXPECT(test_file_lines(log_path, "the largest 16777216 bytes") == 1 &&
             test_file_lines(log_path, "batches: no cap") == 1,
         "rank %d: the 16 MiB broadcast, no cap", rank);
  setenv("NCCL_DEBUG", "TRACE", 1);
  param_reload();
  log_init(); /* opens the file again, empty */
  for (int i = 0; i < 3; i++) EXPECT_OK(ncclBroadcast(buf, out, 16u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(test_file_lines(log_path, "the largest 67108864 bytes") == 3, "rank %d: TRACE logs every launch",
         rank);
  EXPECT_OK(ncclCommDestroy(comm));
}

static void tuning_log(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  run_with_logs(tuning_rank, 60);
}

/* ---- Launches that overlap the stream's previous kernel (BRAID_LAUNCH_PDL) ----
 * Each case: the knob, the device's compute capability, whether eager and captured launches then go through
 * cuLaunchKernelEx with the overlap attribute (the others through cuLaunchKernel), and what init's log
 * says. */
typedef struct {
  const char *knob, *cc, *driver;
  int eager, captured;
  const char *says;
} overlap_case_t;

static const overlap_case_t overlap_cases[] = {
    {NULL, "9", "12080", 1, 1, "overlap the stream's previous kernel: eager and captured (BRAID_LAUNCH_PDL)"},
    {"1", "9", "12080", 1, 0, "overlap the stream's previous kernel: eager (BRAID_LAUNCH_PDL)"},
    {NULL, "9", "12020", 1, 0,
     "overlap the stream's previous kernel: eager (a graph's launches need a CUDA 12.3 driver for it)"},
    {"0", "9", "12080", 0, 0, "overlap the stream's previous kernel: none (BRAID_LAUNCH_PDL)"},
    {"2", "8", "12080", 0, 0, "none (the device has no programmatic dependent launch) (BRAID_LAUNCH_PDL)"},
};

static int overlap_case;

/* Counts the launches of `calls` calls of an all-reduce, an all-gather and a large broadcast on `s`: plain
 * ones into *plain, overlapping ones into *overlap. */
static void overlap_calls(ncclComm_t comm, cudaStream_t s, const mock_cuda_stats_t *st, uint64_t *plain,
                          uint64_t *overlap) {
  void *buf = (void *)(uintptr_t)0x10000000, *out = (void *)(uintptr_t)0x20000000;
  const uint64_t p0 = st->plain_launches, o0 = st->overlap_launches;
  EXPECT_OK(ncclAllReduce(buf, out, 1001, ncclFloat, ncclSum, comm, s));
  EXPECT_OK(ncclAllGather(buf, out, 77, ncclBfloat16, comm, s));
  EXPECT_OK(ncclBroadcast(buf, out, 4u << 20, ncclFloat, 1, comm, s));
  *plain = st->plain_launches - p0;
  *overlap = st->overlap_launches - o0;
}

static void overlap_rank(int rank, int nranks, void *arg) {
  const overlap_case_t *c = &overlap_cases[overlap_case];
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, c->says) == 1,
         "rank %d, BRAID_LAUNCH_PDL=%s, compute capability %s: init's log lacks \"%s\"", rank,
         c->knob != NULL ? c->knob : "(unset)", c->cc, c->says);
  const mock_cuda_stats_t *st = mock_stats();
  uint64_t plain, overlap;
  overlap_calls(comm, NULL, st, &plain, &overlap);
  EXPECT(plain + overlap >= 3 && (c->eager ? plain == 0 : overlap == 0),
         "rank %d, BRAID_LAUNCH_PDL=%s, compute capability %s: eagerly %llu plain and %llu overlapping "
         "launches",
         rank, c->knob != NULL ? c->knob : "(unset)", c->cc, (unsigned long long)plain,
         (unsigned long long)overlap);
  overlap_calls(comm, (cudaStream_t)MOCK_CUDA_CAPTURING, st, &plain, &overlap);
  EXPECT(plain + overlap >= 3 && (c->captured ? plain == 0 : overlap == 0),
         "rank %d, BRAID_LAUNCH_PDL=%s, compute capability %s: captured %llu plain and %llu overlapping "
         "launches",
         rank, c->knob != NULL ? c->knob : "(unset)", c->cc, (unsigned long long)plain,
         (unsigned long long)overlap);
  mock_graph_destroy();
  EXPECT_OK(ncclCommDestroy(comm));
}

static void launch_overlap(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  for (overlap_case = 0; overlap_case < (int)(sizeof overlap_cases / sizeof overlap_cases[0]);
       overlap_case++) {
    const overlap_case_t *c = &overlap_cases[overlap_case];
    if (c->knob != NULL)
      setenv("BRAID_LAUNCH_PDL", c->knob, 1);
    else
      unsetenv("BRAID_LAUNCH_PDL");
    setenv("MOCK_CUDA_CC_MAJOR", c->cc, 1);
    setenv("MOCK_CUDA_DRIVER_VERSION", c->driver, 1);
    run_with_logs(overlap_rank, 60);
  }
  unsetenv("BRAID_LAUNCH_PDL");
  unsetenv("MOCK_CUDA_CC_MAJOR");
  unsetenv("MOCK_CUDA_DRIVER_VERSION");
}

/* ncclCommInitAll where one device's init fails (its memory runs out): the call returns that error, and the
 * other rank, which waits for the failed one, stops waiting at once instead of after BRAID_TIMEOUT_S (the
 * 60 s this process is given would end first). */
/* Two processes on one GPU: init says so once at WARN, naming both ranks and the device. */
static void shared_rank(int rank, int nranks, void *arg) {
  char path[128], want[64];
  setenv("NCCL_DEBUG", "WARN", 1);
  rank_log(arg, rank, path, sizeof path);
  ncclComm_t comm, again;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, ((const shared_t *)arg)->id, rank));
  EXPECT_OK(ncclCommSplit(comm, 0, rank, &again, NULL)); /* a second communicator: no second warning */
  snprintf(want, sizeof want, "ranks %d, %d share CUDA device 0", rank, 1 - rank);
  EXPECT(test_file_lines(path, want) == 1 && test_file_lines(path, "time-slices") == 1,
         "rank %d: the log has %d lines with \"%s\" and %d in all", rank, test_file_lines(path, want), want,
         test_file_lines(path, "time-slices"));
  EXPECT_OK(ncclCommDestroy(again));
  EXPECT_OK(ncclCommDestroy(comm));
  unsetenv("NCCL_DEBUG");
}

/* Two ranks of one process on two GPUs share nothing: no warning. */
static void unshared_proc(int rank, int nranks, void *arg) {
  char path[128];
  setenv("NCCL_DEBUG", "WARN", 1);
  rank_log(arg, rank, path, sizeof path);
  ncclComm_t comms[2];
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL));
  EXPECT(test_file_lines(path, "time-slices") == 0, "a warning about a shared GPU without one");
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclCommDestroy(comms[i]));
  unsetenv("NCCL_DEBUG");
}

static void shared_gpu_warning(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  run_with_logs(shared_rank, 60);
  run_one_process(unshared_proc, 60);
}

static void init_all_fail_proc(int rank, int nranks, void *arg) {
  char log_path[128];
  rank_log(arg, rank, log_path, sizeof log_path);
  setenv("MOCK_CUDA_FAIL_DEVICE", "1", 1);
  ncclComm_t comms[2] = {(ncclComm_t)1, (ncclComm_t)1};
  ncclResult_t res = ncclCommInitAll(comms, 2, NULL);
  EXPECT(res != ncclSuccess && res != ncclInvalidUsage, "ncclCommInitAll returned %d", (int)res);
  EXPECT(comms[0] == NULL && comms[1] == NULL, "a communicator is left after the failed init");
  unsetenv("MOCK_CUDA_FAIL_DEVICE");
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL)); /* and the next one works */
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclCommDestroy(comms[i]));
}

static void init_all_failure(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  run_one_process(init_all_fail_proc, 60);
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  test_filter(argc - 1, argv + 1);
  /* the rank processes share the stand-in's device 0: keep each rank's own kernels (the shared-GPU path,
   * where rank 0 moves all, is test_shared_path's) */
  setenv("BRAID_SHARED_GPU_LEADER", "0", 1);
  TEST(knobs_agree, 60);
  TEST(full_queue_wait, 90);
  TEST(tuning_log, 60);
  TEST(launch_memo, 60);
  TEST(launch_overlap, 120);
  TEST(init_all_failure, 90);
  TEST(shared_gpu_warning, 60);
  return test_summary();
}

#else

int main(void) {
  printf("built without CUDA's headers: no stand-in driver, nothing to test\n");
  return 0;
}

#endif
