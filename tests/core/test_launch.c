/*
 * The GPU executor's waits against the tests' stand-in driver (tests/gpu/mock_cuda.c), on a machine without
 * a GPU: two rank processes make a GPU communicator whose kernels never finish (MOCK_CUDA_STUCK), so its
 * work queue fills up. The call that finds it full must wait, say so once at WARN (naming the queue's
 * bytes, the launches holding them and the oldest launch), and come back with an error when another thread,
 * which waits for that WARN, aborts the communicator; the abort itself must come back although the GPU never
 * finishes (the executor is left allocated, with a WARN, instead of freed under a kernel that may still run).
 *
 * The same two processes also run the copy-engine path (core/ce.h) for real: the stand-in driver executes its
 * stream memory operations and copies on memory both processes map, so broadcast, all-gather, gather,
 * scatter, all-to-all and send/receive must deliver every element, steps either rank refuses must stay on
 * the kernels on both, and the path turned off on one rank is off on both.
 *
 * Without CUDA's headers there is no stand-in driver and nothing to test.
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
#include "core/launch.h"
#include "core/workq.h"
#include "gpu/gpu.h"
#include "device/dev.h"
#include "../gpu/mock_cuda.h"

/* A group of GROUP sends and GROUP receives is one launch of 2 * GROUP transfers, more than the kernel
 * parameters carry: it spills its list into a work-queue entry (a launch whose list fits takes none). */
enum { CALLS = 5000, QUEUE = 65536, GROUP = 29 };

typedef struct {
  ncclUniqueId id;
  char log_dir[64];
} shared_t;

/* Sends this rank process's log to rank<rank>.log in the shared folder, whose name lands in path. */
static void rank_log(const shared_t *sh, int rank, char *path, size_t size) {
  snprintf(path, size, "%s/rank%d.log", sh->log_dir, rank);
  setenv("NCCL_DEBUG_FILE", path, 1);
  param_reload();
  log_init();
}

/* Runs fn on two rank processes that log into a fresh folder (rank_log), removed afterwards. */
static void run_with_logs(void (*fn)(int rank, int nranks, void *arg), int timeout_s) {
  shared_t sh;
  snprintf(sh.log_dir, sizeof sh.log_dir, "/tmp/braid-test-launch-XXXXXX");
  EXPECT(mkdtemp(sh.log_dir) != NULL);
  EXPECT_OK(ncclGetUniqueId(&sh.id));
  EXPECT(run_ranks(2, timeout_s, fn, &sh) == 0, "a rank failed");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", sh.log_dir);
  EXPECT(system(cmd) == 0);
}

/* Runs fn in one process (rank 0 of 1) that logs into a fresh folder, removed afterwards. */
static void run_one_process(void (*fn)(int rank, int nranks, void *arg), int timeout_s) {
  shared_t sh;
  snprintf(sh.log_dir, sizeof sh.log_dir, "/tmp/braid-test-launch-XXXXXX");
  EXPECT(mkdtemp(sh.log_dir) != NULL);
  EXPECT(run_ranks(1, timeout_s, fn, &sh) == 0, "the process failed");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", sh.log_dir);
  EXPECT(system(cmd) == 0);
}

/* The stand-in driver's record of what it saw (tests/gpu/mock_cuda.h), found in the loaded driver. */
static mock_cuda_stats_t *mock_stats(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  mock_cuda_stats_t *s = lib != NULL ? dlsym(lib, "mock_cuda_stats") : NULL;
  EXPECT(s != NULL, "the loaded libcuda.so.1 is not the stand-in driver");
  return s;
}

/* What the aborting thread needs: the communicator, and the log in which the WARN of the full queue shows. */
typedef struct {
  ncclComm_t comm;
  const char *log_path;
} aborter_t;

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
      if (res == ncclSuccess) res = ncclRecv(buf, 2, ncclFloat, 1 - rank, comm, NULL);
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

/* Whether every transfer of the last launch is (ll = 1) or is not (ll = 0) marked LL, an LL one on `nch`
 * channels, with each side that has a peer marked LL too (the stand-in's p2p connections all have LL rings)
 * or neither side; its transfer count in *n. */
static int last_launch_ll(const mock_cuda_stats_t *s, int ll, int nch, int *n) {
  const dev_work_t *w = (const dev_work_t *)s->last_work;
  *n = w->nxfers;
  for (int i = 0; i < w->nxfers && w->ext == NULL; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    int marked = (x->flags & DEV_XF_LL) != 0;
    if (marked != ll || (ll && x->nch != nch)) return 0;
    if (((x->flags & DEV_XF_LL_SEND) != 0) != (ll && x->send_peer >= 0)) return 0;
    if (((x->flags & DEV_XF_LL_RECV) != 0) != (ll && x->recv_peer >= 0)) return 0;
  }
  return w->nxfers > 0;
}

/* Whether every transfer of the last launch has a peer and is marked LL with the LL128 protocol on `nch`
 * channels, each side with a peer marked LL; its transfer count in *n. */
static int last_launch_ll128(const mock_cuda_stats_t *s, int nch, int *n) {
  const dev_work_t *w = (const dev_work_t *)s->last_work;
  *n = w->nxfers;
  for (int i = 0; i < w->nxfers && w->ext == NULL; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    if (!(x->flags & DEV_XF_LL) || x->proto != DEV_PROTO_LL128 || x->nch != nch) return 0;
    if (x->send_peer < 0 && x->recv_peer < 0) return 0;
    if (((x->flags & DEV_XF_LL_SEND) != 0) != (x->send_peer >= 0)) return 0;
    if (((x->flags & DEV_XF_LL_RECV) != 0) != (x->recv_peer >= 0)) return 0;
  }
  return w->nxfers > 0;
}

/* The entry point of the last launch: 'l' (LL), 'b' (bulk), 's' (small) or 'f' (full). */
static char last_entry(const mock_cuda_stats_t *s) {
  return s->last_ll ? 'l' : s->last_bulk ? 'b' : s->last_small ? 's' : 'f';
}

/* A group of `calls` sends and as many receives of `count` floats each, to and from `peer`. */
static void send_recv_group(void *buf, size_t count, int calls, int peer, ncclComm_t comm) {
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < calls; i++) {
    EXPECT_OK(ncclSend(buf, count, ncclFloat, peer, comm, NULL));
    EXPECT_OK(ncclRecv(buf, count, ncclFloat, peer, comm, NULL));
  }
  EXPECT_OK(ncclGroupEnd());
}

/* The cap on Simple batches the last launch passed its kernel (dev_comm_t.batch_pieces). */
static int last_batch(const mock_cuda_stats_t *s) {
  return ((const dev_work_t *)s->last_work)->comm.batch_pieces;
}

/* Which entry point one-step launches of Simple transfers take: the bulk one while every transfer fits one
 * slice, no ring carries more than DEV_SLOTS of the launch's pieces and the launch moves data both ways in
 * two lanes or more, else the small one; and the cap on batches, 2 pieces in such launches. The all-reduces
 * are out of place (sends and reduction in lanes of their own) where the bulk one may take them. */
static void bulk_entry(const mock_cuda_stats_t *s, int bulk, int peer, ncclComm_t comm) {
  void *buf = (void *)(uintptr_t)0x10000000, *out = (void *)(uintptr_t)0x20000000;
  const char simple = bulk ? 'b' : 's';
  /* 16 MiB: one-shot on two ranks, 40 channels of 419,440 bytes (4 pieces each), a warp per 4 KiB chunk */
  EXPECT_OK(ncclAllReduce(buf, out, 4u << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(last_entry(s) == simple && (!bulk || s->last_block == DEV_THREADS),
         "a 16 MiB all-reduce: entry point %c, %u threads", last_entry(s), s->last_block);
  EXPECT(last_batch(s) == 2 && ((const dev_work_t *)s->last_work)->comm.interleave == 0,
         "a 16 MiB all-reduce: batches of %d pieces, two lanes side by side", last_batch(s));
  /* in place the sends read what the reduction overwrites, in one lane; the bulk kernel splits it (its sends
   * on the first half of a grid of two lanes, the reduction on the second), else it runs on the small entry
   * point with no cap on batches */
  const int spread = param_int(P_BRAID_SPREAD) != 0, split = bulk && param_int(P_BRAID_SPLIT_LANE) != 0;
  const dev_work_t *lw = (const dev_work_t *)s->last_work;
  EXPECT(lw->comm.split == 0, "an all-reduce out of place is not a split lane");
  /* its receives reduce: its sends fence per warp, unless BRAID_WAVE_FENCE=2 asks waves of every launch;
   * an all-gather's bulk launch (4 MiB a rank) reduces nothing and fences per wave unless the knob is 0 */
  const int waves = (int)param_int(P_BRAID_WAVE_FENCE);
  EXPECT(lw->comm.wave_fence == (bulk && waves >= 2), "a 16 MiB all-reduce: waves %d (knob %d)",
         lw->comm.wave_fence, waves);
  EXPECT_OK(ncclAllGather(buf, out, 1u << 20, ncclFloat, comm, NULL));
  EXPECT(last_entry(s) == simple && lw->comm.wave_fence == (bulk && waves >= 1),
         "an 8 MiB all-gather: entry point %c, waves %d (knob %d)", last_entry(s), lw->comm.wave_fence,
         waves);
  EXPECT_OK(ncclAllReduce(buf, buf, 4u << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(last_entry(s) == (split ? 'b' : 's') && last_batch(s) == 0 && lw->comm.split == split,
         "a 16 MiB all-reduce in place: entry point %c, batch %d, split %d", last_entry(s), last_batch(s),
         lw->comm.split);
  EXPECT(lw->comm.wave_fence == (split && waves >= 2), "a 16 MiB all-reduce in place: waves %d",
         lw->comm.wave_fence);
  EXPECT(lw->xfers[0].lane == 0 && lw->xfers[1].lane == 0 && lw->xfers[0].send_peer == peer &&
             lw->xfers[1].recv_peer == peer && lw->xfers[1].dst == buf,
         "in place: the send, then the reduction, in one lane");
  /* not split, one lane of parts within a ring: with BRAID_SPREAD (the default) on the even blocks of a grid
   * twice as wide */
  const int wide = split || spread;
  EXPECT(lw->comm.interleave == (!split && spread ? 2 : 0) && s->last_grid == (wide ? 2u : 1u) * lw->nch,
         "in place: one lane of %u channels on %u blocks, interleave %d", (unsigned)lw->nch, s->last_grid,
         lw->comm.interleave);
  /* a group of two such all-reduces is two steps: not split */
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclAllReduce(buf, buf, 4u << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(lw->comm.split == 0 && last_entry(s) == 's',
         "two in-place all-reduces in a group: split %d, entry %c", lw->comm.split, last_entry(s));
  /* a broadcast's root only sends (its copy and its send in two lanes), the other rank only receives; a
   * one-way collective's transfers take half as many channels again (60) as the others (40) */
  EXPECT_OK(ncclBroadcast(buf, out, 4u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(last_entry(s) == 's' && last_batch(s) == 0, "a 16 MiB broadcast: entry point %c, batch %d",
         last_entry(s), last_batch(s));
  EXPECT(lw->comm.nch_max == 60 && lw->nch == 60 && lw->xfers[0].nch == 60,
         "a 16 MiB broadcast: %u channels of %d rings", (unsigned)lw->xfers[0].nch, lw->comm.nch_max);
  EXPECT(lw->comm.interleave == (peer == 1 || !spread ? 0 : 2) &&
             s->last_grid == (peer == 1 || spread ? 2u : 1u) * lw->nch,
         "a 16 MiB broadcast: two lanes on the root, one spread on the other rank (%u blocks, interleave %d)",
         s->last_grid, lw->comm.interleave);
  /* 64 MiB: 1.1 MiB per channel, more than a ring holds; the other rank's blocks on every second block of
   * a grid of two lanes (three lanes of 60 channels would be more blocks than a launch takes) */
  EXPECT_OK(ncclBroadcast(buf, out, 16u << 20, ncclFloat, 0, comm, NULL));
  const unsigned lanes = spread || peer == 1 ? 2u : 1u; /* the root copies and sends */
  EXPECT(lw->nch == 60 && lw->comm.interleave == (spread && peer == 0 ? 2 : 0) && s->last_grid == lanes * 60,
         "a 64 MiB broadcast: %u blocks for %u channels, interleave %d", s->last_grid, (unsigned)lw->nch,
         lw->comm.interleave);
  /* one-way launches of 4-16 pieces per channel signal every 2 pieces (launch_batch): 16 MiB is 2.1 pieces
   * per channel (above: no cap), 64 MiB 8.5, 128 MiB 17.1 */
  EXPECT(last_batch(s) == 2, "a 64 MiB broadcast: batches of %d pieces", last_batch(s));
  EXPECT_OK(ncclBroadcast(buf, out, 32u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(last_batch(s) == 0, "a 128 MiB broadcast: batches of %d pieces", last_batch(s));
  /* reduce, gather and scatter (root 0) alike: 60 channels, at most two lanes' blocks */
  EXPECT_OK(ncclReduce(buf, out, 16u << 20, ncclFloat, ncclSum, 0, comm, NULL));
  EXPECT(lw->nch == 60 && s->last_grid == (spread ? 120u : 60u), "a 64 MiB reduce: %u blocks for %u channels",
         s->last_grid, (unsigned)lw->nch);
  EXPECT(last_batch(s) == 2, "a 64 MiB reduce: batches of %d pieces", last_batch(s));
  EXPECT_OK(ncclGather(buf, out, 8u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(lw->nch == 60 && s->last_grid <= 120, "a 32 MiB gather: %u blocks for %u channels", s->last_grid,
         (unsigned)lw->nch);
  EXPECT(last_batch(s) == 2, "a 32 MiB gather: batches of %d pieces", last_batch(s));
  EXPECT_OK(ncclScatter(buf, out, 8u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(lw->nch == 60 && s->last_grid <= 120, "a 32 MiB scatter: %u blocks for %u channels", s->last_grid,
         (unsigned)lw->nch);
  /* an all-gather of 4 MiB blocks takes 40 channels, and its step three lanes: beside a broadcast's in one
   * group, it is a launch of its own (3 x 60 blocks would not all run at once) */
  EXPECT_OK(ncclAllGather(buf, out, 1u << 20, ncclFloat, comm, NULL));
  EXPECT(lw->nch == 40 && lw->comm.interleave == 0 && s->last_grid == 3 * 40,
         "an 8 MiB all-gather: %u blocks for %u channels", s->last_grid, (unsigned)lw->nch);
  /* from blocks of 8 MiB 60 channels (BRAID_WIDE_STEPS=3), its own block's copy in the receive's lane */
  EXPECT_OK(ncclAllGather(buf, out, 8u << 20, ncclFloat, comm, NULL));
  EXPECT(lw->nch == 60 && lw->nsteps == 1 && lw->step_lanes[0] == 2 && s->last_grid == 2 * 60,
         "a 64 MiB all-gather: %u blocks for %u channels", s->last_grid, (unsigned)lw->nch);
  const int before = s->launches;
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclBroadcast(buf, out, 16u << 20, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclAllGather(buf, out, 1u << 20, ncclFloat, comm, NULL));
  EXPECT_OK(ncclBroadcast(buf, out, 1u << 10, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(
      s->launches == before + 2 && lw->nsteps == 2 && lw->nch == 40 && s->last_grid == 3 * 40,
      "a broadcast, an all-gather and a small broadcast in a group: %d launches, the last of %u steps on %u "
      "blocks",
      s->launches - before, (unsigned)lw->nsteps, s->last_grid);
  /* but a ring all-reduce, whose lane receives and forwards, keeps two lanes' grid */
  EXPECT_OK(ncclAllReduce(buf, buf, 7u << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(lw->nsteps == 1 && lw->comm.interleave == (spread ? 2 : 0) &&
             s->last_grid == (spread ? 2u : 1u) * lw->nch,
         "a 28 MiB all-reduce: %u steps, %u blocks for %u channels, interleave %d", (unsigned)lw->nsteps,
         s->last_grid, (unsigned)lw->nch, lw->comm.interleave);
  /* from BRAID_AR_SPLIT_BYTES (32 MiB), a reduce-scatter step and an all-gather step (both on the kernels
   * here: the stand-in's buffers cannot be exported for the copy engines) */
  EXPECT_OK(ncclAllReduce(buf, buf, 8u << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(lw->nsteps == 2, "a 32 MiB all-reduce: %u steps", (unsigned)lw->nsteps);
  /* four 1 MiB sends and receives: 32 channels, one piece each per ring and transfer; LL128 unless
   * NCCL_PROTO=Simple, through the general entry point (the pair one takes one send and one receive) */
  send_recv_group(buf, 1u << 18, 4, peer, comm);
  int n = 0;
  if (getenv("NCCL_PROTO") != NULL)
    EXPECT(last_entry(s) == simple && (!bulk || s->last_block == 256),
           "4 sends and receives of 1 MiB: entry point %c, %u threads", last_entry(s), s->last_block);
  else
    EXPECT(last_entry(s) == 's' && last_launch_ll128(s, 40, &n) && n == 8,
           "4 sends and receives of 1 MiB: LL128 through entry point %c (%d transfers)", last_entry(s), n);
  /* 8 MiB each, on the rings' 60 channels (BRAID_WIDE_STEPS=3): 2 pieces per channel, 8 per ring; 16 MiB:
   * 3 pieces, 12 per ring, more than the slots */
  send_recv_group(buf, 2u << 20, 4, peer, comm);
  EXPECT(last_entry(s) == simple && lw->nch == 60,
         "4 sends and receives of 8 MiB: entry point %c, %u channels", last_entry(s), (unsigned)lw->nch);
  send_recv_group(buf, 4u << 20, 4, peer, comm);
  EXPECT(last_entry(s) == 's', "4 sends and receives of 16 MiB: entry point %c", last_entry(s));
  /* 64 MiB: the ring all-reduce, more than one slice */
  EXPECT_OK(ncclAllReduce(buf, out, 16u << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(last_entry(s) != 'b' && last_batch(s) == 0, "a 64 MiB all-reduce: entry point %c, batch %d",
         last_entry(s), last_batch(s));
}

static void protocol_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  param_reload();
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  mock_cuda_stats_t *s = mock_stats();
  const char *proto = getenv("NCCL_PROTO");
  const int simple = proto != NULL && strcmp(proto, "Simple") == 0, ll128 = proto == NULL;
  const int ll_kernel = param_int(P_BRAID_LL_KERNEL) != 0 && !simple;
  const int bulk = param_int(P_BRAID_BULK_KERNEL) != 0;
  void *buf = (void *)(uintptr_t)0x10000000, *out = (void *)(uintptr_t)0x20000000;
  int n;
  EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, ncclSum, comm, NULL));
  const char tiny = ll_kernel ? 'l' : simple && bulk ? 'b' : 's';
  EXPECT(last_entry(s) == tiny, "an 8-byte all-reduce takes entry point %c, not %c", tiny, last_entry(s));
  EXPECT(s->last_block == (tiny != 's' ? 32u : DEV_THREADS), "an 8-byte all-reduce: %u threads per block",
         s->last_block);
  EXPECT(last_launch_ll(s, !simple, 1, &n), "8-byte all-reduce (%d transfers): LL %s expected", n,
         simple ? "off" : "on");
  /* an LL transfer takes a channel per 1 KiB by default, up to 32 */
  EXPECT_OK(ncclAllReduce(buf, out, 1025, ncclFloat, ncclSum, comm, NULL));
  EXPECT(last_launch_ll(s, !simple, 5, &n), "4 KiB + 4: five LL channels");
  EXPECT(s->last_block == (ll_kernel        ? 128u
                           : simple && bulk ? 64u
                                            : DEV_THREADS),
         "4 KiB + 4: parts of 832 bytes (LL) or one of 4112 (Simple), %u threads", s->last_block);
  EXPECT_OK(ncclAllReduce(buf, out, 4096, ncclFloat, ncclSum, comm, NULL));
  EXPECT(last_launch_ll(s, !simple, 16, &n), "16 KiB: sixteen LL channels");
  EXPECT(((const dev_work_t *)s->last_work)->nch == (simple ? 1 : 16), "16 KiB: blocks per lane");
  EXPECT_OK(ncclAllReduce(buf, out, 16384, ncclFloat, ncclSum, comm, NULL));
  EXPECT(last_launch_ll(s, !simple, 32, &n), "64 KiB: LL on 32 channels");
  EXPECT_OK(ncclAllReduce(buf, out, 32768, ncclFloat, ncclSum, comm, NULL));
  EXPECT(last_launch_ll(s, !simple, 32, &n), "128 KiB: LL on 32 channels");
  /* above BRAID_LL128_MIN_BYTES (128 KiB), up to BRAID_LL128_MAX_BYTES (1.5 MiB): LL128 on two ranks, 40
   * channels of one piece each, through the general entry point here (the pair one is off); in a broadcast,
   * reduce, gather or scatter only above BRAID_LL128_ONE_WAY_MIN_BYTES (256 KiB); with LL128 left out, LL up
   * to BRAID_LL_MAX_BYTES (512 KiB), then Simple; all Simple under NCCL_PROTO=Simple */
  EXPECT_OK(ncclAllReduce(buf, out, 32769, ncclFloat, ncclSum, comm, NULL));
  if (ll128)
    EXPECT(last_launch_ll128(s, 40, &n) && n == 2, "128 KiB + 4: LL128 on 40 channels (%d transfers)", n);
  else
    EXPECT(last_launch_ll(s, !simple, 32, &n), "128 KiB + 4: LL on 32 channels, or Simple");
  EXPECT_OK(ncclAllReduce(buf, out, 65536, ncclFloat, ncclSum, comm, NULL));
  if (ll128) {
    EXPECT(last_launch_ll128(s, 40, &n) && n == 2, "256 KiB: LL128 on 40 channels (%d transfers)", n);
  } else {
    EXPECT(last_launch_ll(s, !simple, 32, &n), "256 KiB: LL on 32 channels, or Simple");
    EXPECT(s->last_ll == ll_kernel && s->last_block == (simple && bulk ? 256u : DEV_THREADS),
           "256 KiB: parts of 8 KiB (LL) or 32 KiB (Simple, a warp per 4 KiB), %u threads", s->last_block);
  }
  EXPECT_OK(ncclBroadcast(buf, buf, 65536, ncclFloat, 0, comm, NULL));
  EXPECT(last_launch_ll(s, !simple, 32, &n), "a 256 KiB broadcast: LL on 32 channels, or Simple");
  EXPECT_OK(ncclBroadcast(buf, buf, 65537, ncclFloat, 0, comm, NULL));
  EXPECT(ll128 ? last_launch_ll128(s, 40, &n) : last_launch_ll(s, !simple, 32, &n),
         "a 256 KiB + 4 broadcast: LL128 on 40 channels, or LL on 32, or Simple");
  EXPECT_OK(ncclAllReduce(buf, out, 65537, ncclFloat, ncclSum, comm, NULL));
  if (ll128) {
    EXPECT(last_launch_ll128(s, 40, &n) && n == 2, "256 KiB + 4: LL128 on 40 channels (%d transfers)", n);
    EXPECT(last_entry(s) == 's' && s->last_block == DEV_THREADS, "256 KiB + 4: entry point %c, %u threads",
           last_entry(s), s->last_block);
  } else {
    EXPECT(last_launch_ll(s, !simple, 32, &n), "256 KiB + 4: LL on 32 channels, or Simple");
  }
  EXPECT_OK(ncclAllReduce(buf, out, 131072, ncclFloat, ncclSum, comm, NULL));
  if (ll128) {
    EXPECT(last_launch_ll128(s, 40, &n) && n == 2, "512 KiB: LL128 on 40 channels (%d transfers)", n);
  } else {
    EXPECT(last_launch_ll(s, !simple, 32, &n), "512 KiB: the largest LL transfer by default, on 32 channels");
    EXPECT(s->last_ll == ll_kernel && s->last_block == (simple && bulk ? 256u : DEV_THREADS),
           "512 KiB: one LL piece per channel%s, %u threads", ll_kernel ? ", the LL entry point" : "",
           s->last_block);
  }
  EXPECT_OK(ncclAllReduce(buf, out, 131073, ncclFloat, ncclSum, comm, NULL));
  if (!ll128) {
    EXPECT(last_launch_ll(s, 0, 0, &n), "512 KiB + 4: Simple");
    EXPECT(last_entry(s) == (bulk ? 'b' : 's'), "512 KiB + 4: Simple through the %s entry point",
           bulk ? "bulk" : "small");
    EXPECT(!bulk || s->last_block == 256, "512 KiB + 4: 17 parts of 30,848 bytes, %u threads", s->last_block);
  } else {
    EXPECT(last_launch_ll128(s, 40, &n) && n == 2, "512 KiB + 4: LL128 on 40 channels (%d transfers)", n);
    EXPECT_OK(ncclAllReduce(buf, buf, 393216, ncclFloat, ncclSum, comm, NULL));
    EXPECT(last_launch_ll128(s, 40, &n) && n == 2, "1.5 MiB in place: LL128, its send and its receive");
    EXPECT_OK(ncclAllReduce(buf, out, 393217, ncclFloat, ncclSum, comm, NULL));
    EXPECT(last_launch_ll(s, 0, 0, &n), "1.5 MiB + 4: Simple");
    EXPECT(last_entry(s) == (bulk ? 'b' : 's'), "1.5 MiB + 4: Simple through the %s entry point",
           bulk ? "bulk" : "small");
    EXPECT(!bulk || s->last_block == 320, "1.5 MiB + 4: 40 parts of 39,328 bytes, %u threads", s->last_block);
  }
  /* the LL entry point takes a one-step launch of up to 8 transfers: a group of 4 sends and 4 receives, not
   * of 5 and 5, nor two all-reduces (a step each) */
  const int peer = 1 - rank;
  for (int calls = 4; calls <= 5; calls++) {
    send_recv_group(buf, 2, calls, peer, comm);
    EXPECT(last_launch_ll(s, !simple, 1, &n) && n == 2 * calls, "%d sends and receives: %d transfers", calls,
           n);
    EXPECT(last_entry(s) == (calls == 4 ? tiny : 'f'), "%d sends and receives: entry point %c", calls,
           last_entry(s));
  }
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, ncclSum, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(last_entry(s) == 's', "two all-reduces in a group: two steps, the small entry point");
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < 10; i++) EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, ncclSum, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(((const dev_work_t *)s->last_work)->done == NULL,
         "a launch whose list fits the parameters has no queue entry to report");
  EXPECT(last_entry(s) == 'f' && last_launch_ll(s, !simple, 1, &n) && n == 20,
         "a group of 10 all-reduces: 20 transfers through the full entry point (got %d, entry %c)", n,
         last_entry(s));
  bulk_entry(s, bulk, peer, comm);
  EXPECT_OK(ncclCommDestroy(comm));
}

/* Which entry point a launch takes, and which transfers the executor marks LL, as NCCL_PROTO,
 * BRAID_LL_KERNEL and BRAID_BULK_KERNEL say (the bulk kernel both on and off, whatever its default), and
 * how BRAID_SPREAD places a launch of one lane. */
static void protocol_marks(void) {
  static const char *const modes[] = {"defaults",
                                      "NCCL_PROTO=Simple",
                                      "BRAID_LL_KERNEL=0",
                                      "NCCL_PROTO=Simple BRAID_BULK_KERNEL=0 BRAID_SPREAD=0",
                                      "BRAID_BULK_KERNEL=1 BRAID_SPLIT_LANE=0 BRAID_WAVE_FENCE=0",
                                      "NCCL_PROTO=Simple BRAID_BULK_KERNEL=1 BRAID_WAVE_FENCE=2",
                                      "NCCL_PROTO=^LL128"};
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_PAIR_KERNEL", "0",
         1); /* the LL entry's work is what these look at (pair_shapes: the other) */
  unsetenv("MOCK_CUDA_STUCK");
  unsetenv("NCCL_WORK_FIFO_BYTES");
  for (int mode = 0; mode < 7; mode++) {
    unsetenv("NCCL_PROTO");
    unsetenv("BRAID_LL_KERNEL");
    unsetenv("BRAID_BULK_KERNEL");
    unsetenv("BRAID_SPREAD");
    unsetenv("BRAID_SPLIT_LANE");
    unsetenv("BRAID_WAVE_FENCE");
    if (mode == 1 || mode == 3 || mode == 5) setenv("NCCL_PROTO", "Simple", 1);
    if (mode == 2) setenv("BRAID_LL_KERNEL", "0", 1);
    if (mode == 3) setenv("BRAID_BULK_KERNEL", "0", 1);
    if (mode == 3) setenv("BRAID_SPREAD", "0", 1);
    if (mode >= 4) setenv("BRAID_BULK_KERNEL", "1", 1);
    if (mode == 4) setenv("BRAID_SPLIT_LANE", "0", 1);
    if (mode == 4 || mode == 5) setenv("BRAID_WAVE_FENCE", mode == 4 ? "0" : "2", 1);
    if (mode == 6) setenv("NCCL_PROTO", "^LL128", 1);
    shared_t sh;
    EXPECT_OK(ncclGetUniqueId(&sh.id));
    EXPECT(run_ranks(2, 60, protocol_rank, &sh) == 0, "a rank failed (%s)", modes[mode]);
  }
  unsetenv("NCCL_PROTO");
  unsetenv("BRAID_LL_KERNEL");
  unsetenv("BRAID_BULK_KERNEL");
  unsetenv("BRAID_SPREAD");
  unsetenv("BRAID_SPLIT_LANE");
  unsetenv("BRAID_WAVE_FENCE");
  unsetenv("BRAID_PAIR_KERNEL");
}

/* Channels per connection: the widest launch (2 * nranks - 1 lanes) fits ten elevenths of the GPU's SMs,
 * whatever BRAID_CHANNELS asks; 40 at most by default. */
static void channel_budget(void) {
  unsetenv("BRAID_CHANNELS");
  param_reload();
  EXPECT(gx_channels(2, 132) == 40, "2 ranks on 132 SMs: %d", gx_channels(2, 132));
  EXPECT(gx_channels(2, 114) == 34, "2 ranks on 114 SMs: %d", gx_channels(2, 114));
  EXPECT(gx_channels(8, 132) == 8, "8 ranks on 132 SMs: %d", gx_channels(8, 132));
  EXPECT(gx_channels(1, 132) == 40, "1 rank: %d", gx_channels(1, 132));
  EXPECT(gx_channels(64, 132) == 1, "64 ranks: %d", gx_channels(64, 132));
  setenv("BRAID_CHANNELS", "64", 1);
  param_reload();
  EXPECT(gx_channels(1, 132) == 64 && gx_channels(2, 132) == 40 && gx_channels(2, 58) == 17,
         "BRAID_CHANNELS=64 is held to the SMs");
  setenv("BRAID_CHANNELS", "8", 1);
  param_reload();
  EXPECT(gx_channels(2, 132) == 8);
  unsetenv("BRAID_CHANNELS");
  param_reload();
}

/* Whether the last launch is one step of `lanes` lanes, its transfers between the ranks on `nch` channels
 * each (local copies on any), and local copies first in their lane. */
static int p2p_launch(const mock_cuda_stats_t *s, unsigned nch, int lanes) {
  const dev_work_t *w = (const dev_work_t *)s->last_work;
  int ok = w->nsteps == 1 && w->step_lanes[0] == lanes;
  for (unsigned i = 0; i < w->nxfers; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    const int local = x->send_peer < 0 && x->recv_peer < 0;
    ok &= local || x->nch == nch;
    ok &= !local || i == 0 || w->xfers[i - 1].lane != x->lane ||
          (w->xfers[i - 1].send_peer < 0 && w->xfers[i - 1].recv_peer < 0);
  }
  return ok;
}

/* Send/receive, all-to-all and all-gather on two ranks (BRAID_WIDE_STEPS=3, the default): a transfer between
 * the ranks takes the rings' channels from 8 MiB by its own size, whatever else either rank's step holds, so
 * that both ends agree: here rank 0 also sends to itself and rank 1 does not, and rank 1 receives in a group
 * of its own what rank 0 receives beside its send. A local copy then joins a lane and goes first in it. */
static void p2p_channels(int rank, ncclComm_t comm, const mock_cuda_stats_t *s, void *buf) {
  const int wide = param_int(P_BRAID_WIDE_STEPS) >= 3 ? 6 : 4, peer = 1 - rank;
  const int lanes = wide == 6 || rank == 1 ? 2 : 3; /* rank 0's copy in a lane of its own unless wide */
  char *b = buf;
  const size_t big = 2 << 20; /* 8 MiB of floats */
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b, big, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b + (8 << 20), big, ncclFloat, peer, comm, NULL));
  if (rank == 0) {
    EXPECT_OK(ncclSend(b + (16 << 20), big, ncclFloat, 0, comm, NULL));
    EXPECT_OK(ncclRecv(b + (24 << 20), big, ncclFloat, 0, comm, NULL));
  }
  EXPECT_OK(ncclGroupEnd());
  EXPECT(p2p_launch(s, wide, lanes), "rank %d: send/receive of 8 MiB (rank 0 to itself too) on %d channels",
         rank, wide);
  const dev_work_t *w = (const dev_work_t *)s->last_work;
  EXPECT(
      rank != 0 || wide != 6 ||
          (w->nxfers == 3 && w->xfers[w->nxfers - 2].send_peer < 0 && w->xfers[w->nxfers - 2].recv_peer < 0),
      "rank 0: its copy to itself before its receive, in the receive's lane");
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b, big - 1, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b + (8 << 20), big - 1, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(p2p_launch(s, 4, 2), "rank %d: send/receive of 8 MiB - 4 on 4 channels", rank);
  /* rank 0: one group of an 8 MiB send and a 4 MiB receive; rank 1: each alone */
  if (rank == 0) {
    EXPECT_OK(ncclGroupStart());
    EXPECT_OK(ncclSend(b, big, ncclFloat, peer, comm, NULL));
    EXPECT_OK(ncclRecv(b + (8 << 20), big / 2, ncclFloat, peer, comm, NULL));
    EXPECT_OK(ncclGroupEnd());
    EXPECT(w->nxfers == 2 && w->xfers[0].nch == (w->xfers[0].send_peer >= 0 ? wide : 4) &&
               w->xfers[1].nch == (w->xfers[1].send_peer >= 0 ? wide : 4),
           "rank 0: an 8 MiB send on %d channels beside a 4 MiB receive on 4", wide);
  } else {
    EXPECT_OK(ncclRecv(b, big, ncclFloat, peer, comm, NULL));
    EXPECT(w->nxfers == 1 && w->xfers[0].nch == (unsigned)wide, "rank 1: an 8 MiB receive on %d channels",
           wide);
    EXPECT_OK(ncclSend(b, big / 2, ncclFloat, peer, comm, NULL));
    EXPECT(w->nxfers == 1 && w->xfers[0].nch == 4, "rank 1: a 4 MiB send on 4 channels");
  }
  /* all-to-all and all-gather: rank 0 out of place (a local copy), rank 1 in place */
  EXPECT_OK(ncclAlltoAll(b, rank == 0 ? b + (16 << 20) : b, big, ncclFloat, comm, NULL));
  /* in place, a first step stages the input (a local copy alone) */
  EXPECT(w->nsteps == (rank == 0 ? 1 : 2) && w->step_lanes[w->nsteps - 1] == (wide == 6 ? 2 : 3) &&
             w->xfers[w->nxfers - 1].nch == (unsigned)wide,
         "rank %d: an all-to-all of 8 MiB blocks on %d channels, %d lanes", rank, wide, wide == 6 ? 2 : 3);
  EXPECT_OK(ncclAllGather(rank == 0 ? b + (32 << 20) : b + (8 << 20), b, big, ncclFloat, comm, NULL));
  EXPECT(p2p_launch(s, wide, lanes), "rank %d: an all-gather of 8 MiB blocks on %d channels", rank, wide);
}

/* The dealt transfers of the last launch's step s, one bit per transfer in list order; 0xff: no such step. */
static unsigned dealt_bits(const mock_cuda_stats_t *s, int step) {
  const dev_work_t *w = (const dev_work_t *)s->last_work;
  if (step >= w->nsteps) return 0xff;
  unsigned bits = 0;
  for (unsigned i = step > 0 ? w->step_end[step - 1] : 0, b = 0; i < w->step_end[step]; i++, b++)
    bits |= (unsigned)(w->xfers[i].dealt != 0) << b;
  return bits;
}

/* A communicator of this rank process with BRAID_DEALT_MIN_BYTES=min (in its environment, reloaded). */
static ncclComm_t dealt_open(const shared_t *sh, int rank, int nranks, const char *min) {
  setenv("BRAID_DEALT_MIN_BYTES", min, 1);
  param_reload();
  ncclComm_t comm = NULL;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  return comm;
}

/* Which transfers are dealt (dev.h, "Dealt transfers"; BRAID_DEALT_MIN_BYTES=1 MiB and
 * BRAID_DEALT_MAX_BYTES=32 MiB here): on two ranks, a ring collective's transfers with one peer, each alone
 * in its lane, of 1 to 32 MiB, whatever either rank's buffers do; not a local copy, a fused all-reduce's
 * chain, a one-shot step, a point-to-point step, an LL transfer or a smaller one; and a launch with one never
 * takes the bulk kernel. */
static void dealt_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  setenv("BRAID_DEALT_MAX_BYTES", "33554432", 1);
  ncclComm_t comm = dealt_open(sh, rank, nranks, "1048576");
  mock_cuda_stats_t *s = mock_stats();
  char *b = (char *)(uintptr_t)0x10000000;
  const size_t mib = 1 << 18; /* floats in 1 MiB */
  /* 32 MiB + 4 is above BRAID_DEALT_MAX_BYTES */
  EXPECT_OK(ncclReduceScatter(b, b + (256 << 20), 32 * mib + 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 0, "rank %d: a reduce-scatter of 32 MiB + 4 blocks is not dealt", rank);
  /* reduce-scatter of 2 MiB blocks, rank 0 in place and rank 1 not: its send and its receive */
  EXPECT_OK(ncclReduceScatter(b, rank == 0 ? b + rank * 8 * mib : b + (64 << 20), 2 * mib, ncclFloat, ncclSum,
                              comm, NULL));
  EXPECT(dealt_bits(s, 0) == 3 && dealt_bits(s, 1) == 0xff && last_entry(s) != 'b',
         "rank %d: a reduce-scatter's send and receive of 2 MiB are dealt (%x), on the general kernel (%c)",
         rank, dealt_bits(s, 0), last_entry(s));
  /* 1 MiB - 4 is below the threshold */
  EXPECT_OK(ncclReduceScatter(b, b + (64 << 20), mib - 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 0, "rank %d: a reduce-scatter of 1 MiB - 4 blocks is not dealt", rank);
  /* all-gather of 2 MiB blocks, rank 0 out of place (a local copy beside its send and receive), rank 1 in
   * place: the transfers with a peer on both */
  EXPECT_OK(ncclAllGather(rank == 0 ? b + (64 << 20) : b + 8 * mib, b, 2 * mib, ncclFloat, comm, NULL));
  const dev_work_t *w = (const dev_work_t *)s->last_work;
  unsigned want = 0;
  for (unsigned i = 0; i < w->nxfers; i++)
    want |= (unsigned)(w->xfers[i].send_peer >= 0 || w->xfers[i].recv_peer >= 0) << i;
  EXPECT(w->nxfers == (rank == 0 ? 3 : 2) && dealt_bits(s, 0) == want,
         "rank %d: an all-gather's transfers with a peer are dealt, its copy not (%x of %u transfers)", rank,
         dealt_bits(s, 0), w->nxfers);
  /* broadcast and reduce of 4 MiB: the root's send, the other's receive */
  EXPECT_OK(ncclBroadcast(b, b, 4 * mib, ncclFloat, 0, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 1, "rank %d: a broadcast's transfer is dealt (%x)", rank, dealt_bits(s, 0));
  EXPECT_OK(ncclReduce(b, b + (64 << 20), 4 * mib, ncclFloat, ncclSum, 1, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 1, "rank %d: a reduce's transfer is dealt (%x)", rank, dealt_bits(s, 0));
  /* all-reduce of 64 MiB in two steps (BRAID_AR_SPLIT_BYTES): each step's send and receive */
  EXPECT_OK(ncclAllReduce(b, b, 64 * mib, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 3 && dealt_bits(s, 1) == 3,
         "rank %d: a split all-reduce's steps are dealt (%x, %x)", rank, dealt_bits(s, 0), dealt_bits(s, 1));
  /* 24 MiB: one fused ring step, whose combine receives and forwards: nothing dealt */
  EXPECT_OK(ncclAllReduce(b, b, 24 * mib, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 0 && dealt_bits(s, 1) == 0xff, "rank %d: a fused all-reduce is not dealt", rank);
  /* 8 MiB: one-shot. In place its send and receive share a lane; out of place each has a lane of its own,
   * and only the one-shot mark keeps them from being dealt (a one-shot step's lanes may differ between the
   * ranks, one in place and one not, so the two ends of a connection could disagree) */
  EXPECT_OK(ncclAllReduce(b, b, 8 * mib, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 0, "rank %d: a one-shot all-reduce in place is not dealt", rank);
  EXPECT_OK(ncclAllReduce(b, b + (64 << 20), 8 * mib, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 0 && dealt_bits(s, 1) == 0xff,
         "rank %d: a one-shot all-reduce out of place is not dealt (%x)", rank, dealt_bits(s, 0));
  /* point-to-point of 8 MiB */
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b, 2 * mib, ncclFloat, 1 - rank, comm, NULL));
  EXPECT_OK(ncclRecv(b + (64 << 20), 2 * mib, ncclFloat, 1 - rank, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(dealt_bits(s, 0) == 0, "rank %d: send/receive is not dealt", rank);
  EXPECT_OK(ncclCommDestroy(comm));
}

/* BRAID_DEALT_MIN_BYTES=0: nothing is dealt. */
static void undealt_rank(int rank, int nranks, void *arg) {
  ncclComm_t comm = dealt_open(arg, rank, nranks, "0");
  mock_cuda_stats_t *s = mock_stats();
  char *b = (char *)(uintptr_t)0x10000000;
  EXPECT_OK(ncclReduceScatter(b, b + (64 << 20), 1 << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 0, "rank %d: BRAID_DEALT_MIN_BYTES=0 deals nothing", rank);
  /* transfers of more than 128 MiB move in batches as large as the ring allows */
  EXPECT_OK(ncclReduceScatter(b, b + (1ull << 30), 40 << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 0 && last_batch(s) == 0, "rank %d: 160 MiB blocks, not dealt, in batches of %d",
         rank, last_batch(s));
  EXPECT_OK(ncclCommDestroy(comm));
}

/* The defaults: from 64 MiB with no upper bound; a dealt transfer of more than 128 MiB moves in batches of 2
 * pieces (launch_batch). */
static void dealt_default_rank(int rank, int nranks, void *arg) {
  unsetenv("BRAID_DEALT_MAX_BYTES");
  ncclComm_t comm = dealt_open(arg, rank, nranks, "67108864");
  mock_cuda_stats_t *s = mock_stats();
  char *b = (char *)(uintptr_t)0x10000000;
  EXPECT_OK(ncclReduceScatter(b, b + (1ull << 30), 40 << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 3 && last_batch(s) == 2, "rank %d: 160 MiB blocks dealt (%x), in batches of %d",
         rank, dealt_bits(s, 0), last_batch(s));
  EXPECT_OK(ncclReduceScatter(b, b + (1ull << 30), (16 << 20) - 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(dealt_bits(s, 0) == 0, "rank %d: 64 MiB - 4 blocks are not dealt", rank);
  EXPECT_OK(ncclCommDestroy(comm));
}

static void dealt_marks(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_PAIR_KERNEL", "0", 1);
  setenv("BRAID_CE_MIN_BYTES", "0", 1); /* every step on the kernels */
  setenv("BRAID_CE_PUSH_MIN_BYTES", "0", 1);
  setenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES", "0", 1);
  unsetenv("MOCK_CUDA_STUCK");
  shared_t sh;
  EXPECT_OK(ncclGetUniqueId(&sh.id));
  EXPECT(run_ranks(2, 60, dealt_rank, &sh) == 0, "a rank failed");
  EXPECT_OK(ncclGetUniqueId(&sh.id));
  EXPECT(run_ranks(2, 60, undealt_rank, &sh) == 0, "a rank failed (BRAID_DEALT_MIN_BYTES=0)");
  EXPECT_OK(ncclGetUniqueId(&sh.id));
  EXPECT(run_ranks(2, 60, dealt_default_rank, &sh) == 0, "a rank failed (the defaults)");
  unsetenv("BRAID_PAIR_KERNEL");
  unsetenv("BRAID_CE_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES");
  unsetenv("BRAID_DEALT_MIN_BYTES");
  unsetenv("BRAID_DEALT_MAX_BYTES");
}

/* Ranks asking for different channel counts settle on the fewest: both ends of a connection need the same
 * rings (the work's communicator view says how many); on two ranks a connection has half as many rings
 * again, which one-way collectives use. */
static void channels_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  setenv("BRAID_CHANNELS", rank == 0 ? "4" : "16", 1);
  setenv("BRAID_LL_MAX_BYTES", "1048576", 1);
  param_reload();
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  mock_cuda_stats_t *s = mock_stats();
  void *buf = (void *)(uintptr_t)0x10000000;
  EXPECT_OK(ncclAllReduce(buf, buf, 1 << 20, ncclFloat, ncclSum, comm, NULL));
  const dev_work_t *w = (const dev_work_t *)s->last_work;
  EXPECT(w->comm.nch_max == 6 && w->nch <= 4, "rank %d: %d rings per connection, %d blocks per lane", rank,
         w->comm.nch_max, w->nch);
  /* a one-way collective's transfers take the rings' 6 channels: rank 1's receive, on rank 0's rings */
  EXPECT_OK(ncclBroadcast(buf, buf, 1 << 20, ncclFloat, 0, comm, NULL));
  EXPECT(w->nch == 6 && w->xfers[0].nch == 6, "rank %d: a 4 MiB broadcast on %d channels", rank, w->nch);
  /* so do an all-reduce's and a reduce-scatter's from transfers of 8 MiB (BRAID_WIDE_STEPS=2 or more, 3
   * by default), in place or not */
  const int wide = param_int(P_BRAID_WIDE_STEPS) >= 2 ? 6 : 4;
  EXPECT_OK(ncclAllReduce(buf, buf, 2 << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(w->nch == (unsigned)wide && w->xfers[0].nch == wide, "rank %d: an 8 MiB all-reduce on %d channels",
         rank, w->nch);
  EXPECT_OK(ncclAllReduce(buf, (char *)buf + (8 << 20), (2 << 20) - 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(w->nch == 4, "rank %d: an all-reduce of 8 MiB - 4 on %d channels", rank, w->nch);
  EXPECT_OK(ncclReduceScatter(buf, (char *)buf + (16 << 20), 2 << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(w->nch == (unsigned)wide, "rank %d: a reduce-scatter of 8 MiB blocks on %d channels", rank, w->nch);
  EXPECT_OK(ncclReduceScatter(buf, buf, 1 << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(w->nch == 4, "rank %d: a reduce-scatter of 4 MiB blocks on %d channels", rank, w->nch);
  p2p_channels(rank, comm, s, buf);
  EXPECT_OK(ncclAllReduce(buf, buf, 16384, ncclFloat, ncclSum, comm, NULL));
  w = (const dev_work_t *)s->last_work;
  EXPECT(w->nch == 4 && w->xfers[0].nch == 4, "rank %d: a 64 KiB LL transfer on %d channels of 4", rank,
         w->xfers[0].nch);
  EXPECT(s->last_ll, "rank %d: 16 KiB per channel is one LL piece: the LL entry point", rank);
  /* LL up to half an LL ring per channel: 4 channels carry 256 KiB, not BRAID_LL_MAX_BYTES' 1 MiB */
  EXPECT_OK(ncclAllReduce(buf, buf, 65536, ncclFloat, ncclSum, comm, NULL));
  EXPECT((w->xfers[0].flags & DEV_XF_LL) && w->xfers[0].nch == 4, "rank %d: 256 KiB is LL on 4 channels",
         rank);
  EXPECT(!s->last_ll, "rank %d: 64 KiB per channel is four LL pieces: not the LL entry point", rank);
  /* above it LL128 (BRAID_LL128_MIN_BYTES), up to half the LL128 slots per channel: 4 channels carry
   * 720 KiB, not BRAID_LL128_MAX_BYTES' 1.5 MiB; what is more is Simple */
  EXPECT_OK(ncclAllReduce(buf, buf, 65537, ncclFloat, ncclSum, comm, NULL));
  EXPECT((w->xfers[0].flags & DEV_XF_LL) && w->xfers[0].proto == DEV_PROTO_LL128 && w->xfers[0].nch == 4,
         "rank %d: 256 KiB + 4 is LL128 on 4 channels", rank);
  EXPECT(last_entry(s) == 's', "rank %d: two LL128 pieces per channel: the general entry point, not %c", rank,
         last_entry(s));
  EXPECT_OK(ncclAllReduce(buf, buf, 4 * DEV_LL128_PART_MAX / 4, ncclFloat, ncclSum, comm, NULL));
  EXPECT((w->xfers[0].flags & DEV_XF_LL) && w->xfers[0].proto == DEV_PROTO_LL128,
         "rank %d: 720 KiB is LL128 on 4 channels", rank);
  EXPECT_OK(ncclAllReduce(buf, buf, 4 * DEV_LL128_PART_MAX / 4 + 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(!(w->xfers[0].flags & DEV_XF_LL), "rank %d: 720 KiB + 4 is Simple", rank);
  unsetenv("BRAID_LL_MAX_BYTES");
  EXPECT_OK(ncclCommDestroy(comm));
}

static void channels_agree(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_PAIR_KERNEL", "0", 1);
  setenv("BRAID_CE_PUSH_MIN_BYTES", "0", 1); /* the kernels' channels: no step pushed */
  setenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES", "0", 1);
  unsetenv("MOCK_CUDA_STUCK");
  shared_t sh;
  EXPECT_OK(ncclGetUniqueId(&sh.id));
  EXPECT(run_ranks(2, 60, channels_rank, &sh) == 0, "a rank failed");
  setenv("BRAID_WIDE_STEPS", "1", 1);
  EXPECT_OK(ncclGetUniqueId(&sh.id));
  EXPECT(run_ranks(2, 60, channels_rank, &sh) == 0, "a rank failed (BRAID_WIDE_STEPS=1)");
  unsetenv("BRAID_WIDE_STEPS");
  unsetenv("BRAID_PAIR_KERNEL");
  unsetenv("BRAID_CE_PUSH_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES");
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
    {"BRAID_DEALT_MAX_BYTES", "268435456", "BRAID_DEALT_MAX_BYTES"},
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

/* What the last launch of braid_kernel_pair (or braid_kernel_pair_ar) carried: 'S', 'R' and 'C' for the
 * send, receive and copy it has (in that order, '-' for each it has not), then 'F' when fused and 'A' on
 * braid_kernel_pair_ar; and whether its blocks are as dev.h says. */
static const char *last_pair(const mock_cuda_stats_t *s, char shape[6]) {
  const dev_pair_t *p = (const dev_pair_t *)s->last_work;
  if (!s->last_pair) return "-";
  shape[0] = p->send.nch > 0 ? 'S' : '-';
  shape[1] = p->recv.nch > 0 ? 'R' : '-';
  shape[2] = p->copy.nch > 0 ? 'C' : '-';
  shape[3] = p->fused ? 'F' : 0;
  shape[4] = p->fused && s->last_pair_ar ? 'A' : 0;
  shape[5] = 0;
  if (!p->fused && s->last_pair_ar) return "braid_kernel_pair_ar, not fused";
  const int blocks = p->send_blocks == ((p->send.nch > 0 || p->copy.nch > 0) && !p->fused ? p->nch : 0) &&
                     p->recv_blocks == (p->recv.nch > 0 ? p->nch : 0) &&
                     s->last_grid == (unsigned)p->send_blocks + p->recv_blocks;
  return blocks ? shape : "bad blocks";
}

#define EXPECT_PAIR(want, what)                                                                              \
  do {                                                                                                       \
    char shape_[6] = "";                                                                                     \
    const char *got_ = last_pair(s, shape_);                                                                 \
    EXPECT(strcmp(got_, want) == 0, "rank %d, %s: pair kernel %s, got %s", rank, what, want, got_);          \
  } while (0)

/* The shape an out-of-place all-reduce whose part per channel is `part` bytes takes: joined, as in place
 * (in_place), from BRAID_PAIR_JOIN_BYTES (`join`) on, else blocks that send and blocks that receive. */
static const char *out_of_place(int on, const char *in_place, int64_t join, uint64_t part) {
  return !on ? "-" : join >= 0 && part >= (uint64_t)join ? in_place : "SR-";
}

/* Which launches take braid_kernel_pair, and with what: every LL launch of at most one plain send, one
 * receive and one local copy where nothing written is read by another transfer (an in-place all-reduce
 * fused), on two ranks; nothing else, and nothing at all with BRAID_PAIR_KERNEL=0. An in-place all-reduce
 * run in one pass (every part above BRAID_PAIR_HALVES_BYTES, 0 by default) takes braid_kernel_pair_ar, in
 * LL128 braid_kernel_pair_ar128, unless BRAID_PAIR_AR_KERNEL=0; so does an out-of-place one whose part is
 * at least BRAID_PAIR_JOIN_BYTES (0 by default: every one; -1: none), fused 1 as in place. */
static void pair_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  param_reload();
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  mock_cuda_stats_t *s = mock_stats();
  const int on = param_int(P_BRAID_PAIR_KERNEL) != 0, ar = param_int(P_BRAID_PAIR_AR_KERNEL) != 0;
  const int64_t halves = param_int(P_BRAID_PAIR_HALVES_BYTES), join = param_int(P_BRAID_PAIR_JOIN_BYTES);
  const char *in_place_ll = !on ? "-" : ar ? "SR-FA" : "SR-F"; /* an in-place all-reduce in one pass */
  char *buf = (char *)(uintptr_t)0x10000000, *out = (char *)(uintptr_t)0x20000000;
  const int peer = 1 - rank;
  EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(out_of_place(on, in_place_ll, join, 8), "8-byte all-reduce");
  if (on) {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    EXPECT(p->send.send_peer == peer && p->send.src == buf && p->recv.recv_peer == peer &&
               p->recv.src == buf && p->recv.dst == out && (p->recv.flags & DEV_XF_REDUCE) && p->nch == 1,
           "rank %d: the all-reduce's send and combine", rank);
    EXPECT(s->last_block == 32 && s->last_pair_ar == (ar && join >= 0 && join <= 8 ? 1 : 0),
           "rank %d: 8 bytes out of place: one warp (%u threads), LL's entry %d", rank, s->last_block,
           s->last_pair_ar);
  }
  const uint64_t first_seq = ((const dev_pair_t *)s->last_work)->seq;
  EXPECT_OK(ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "16 KiB all-reduce in place");
  if (on) {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    EXPECT(p->nch == 16 && p->send.nch == 16 && p->recv.nch == 16 && p->recv.dst == buf,
           "rank %d: 16 KiB in place: %d channels", rank, p->nch);
    EXPECT(p->fused == 1 && s->last_block == 128,
           "rank %d: 16 KiB in place: 1 KiB per channel, one pass per thread (fused %d, %u threads)", rank,
           p->fused, s->last_block);
  }
  EXPECT_OK(ncclAllReduce(buf, buf, 2, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(halves >= 8 ? (on ? "SR-F" : "-") : in_place_ll, "8-byte all-reduce in place");
  EXPECT(!on || ((const dev_pair_t *)s->last_work)->seq == first_seq + 2,
         "rank %d: the third call's launch carries its sequence number, the first's + 2", rank);
  if (halves >= 8)
    EXPECT(!on || (((const dev_pair_t *)s->last_work)->fused == 2 && s->last_block == 64),
           "rank %d: 8 bytes in place: a sending and a receiving warp (%u threads)", rank, s->last_block);
  else
    EXPECT(!on || (((const dev_pair_t *)s->last_work)->fused == 1 && s->last_block == 32),
           "rank %d: 8 bytes in place: one warp, one pass (%u threads)", rank, s->last_block);
  EXPECT_OK(ncclAllReduce(buf, buf, 128, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(halves >= 512 ? (on ? "SR-F" : "-") : in_place_ll, "512-byte all-reduce in place");
  if (halves >= 512)
    EXPECT(!on || (((const dev_pair_t *)s->last_work)->fused == 2 && s->last_block == 128),
           "rank %d: 512 bytes in place: a sending and a receiving half (BRAID_PAIR_HALVES_BYTES)", rank);
  else
    EXPECT(!on || (((const dev_pair_t *)s->last_work)->fused == 1 && s->last_block == 64),
           "rank %d: 512 bytes in place: a line per thread, one pass (%u threads)", rank, s->last_block);
  EXPECT_OK(ncclAllReduce(buf, buf + 4, 1024, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR("-", "an all-reduce whose output overlaps its input 4 bytes on");
  /* 128 KiB in place, the largest in LL (BRAID_LL128_MIN_BYTES): 4 KiB, 512 lines, per channel of 32 */
  EXPECT_OK(ncclAllReduce(buf, buf, 32768, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "128 KiB all-reduce in place");
  EXPECT(!on || (((const dev_pair_t *)s->last_work)->fused == 1 && s->last_block == DEV_THREADS &&
                 ((const dev_pair_t *)s->last_work)->recv.proto == DEV_PROTO_LL &&
                 s->last_pair_ar == (ar ? 1 : 0)),
         "rank %d: 128 KiB in place: LL, a line per thread (%u threads), LL's entry (%d)", rank,
         s->last_block, s->last_pair_ar);
  EXPECT_OK(ncclAllReduce(buf, out, 131072, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(out_of_place(on, in_place_ll, join, 13120), "512 KiB all-reduce: one LL128 piece per channel");
  EXPECT(!on || (((const dev_pair_t *)s->last_work)->nch == 40 && s->last_block == DEV_THREADS &&
                 s->last_pair_ar == (ar && join >= 0 ? 2 : 0)),
         "rank %d: 512 KiB out of place: 13120 bytes on each of 40 channels (%d), %u threads, LL128's entry "
         "(%d)",
         rank, ((const dev_pair_t *)s->last_work)->nch, s->last_block, s->last_pair_ar);
  /* in LL128 the in-place all-reduce takes braid_kernel_pair_ar128 */
  EXPECT_OK(ncclAllReduce(buf, buf, 131072, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "512 KiB all-reduce in place");
  EXPECT(!on || (((const dev_pair_t *)s->last_work)->fused == 1 && s->last_block == DEV_THREADS &&
                 s->last_pair_ar == (ar ? 2 : 0)),
         "rank %d: 512 KiB in place: one pass per thread (%u threads), LL128's entry (%d)", rank,
         s->last_block, s->last_pair_ar);
  /* LL128 (512 KiB + 4 to 1.5 MiB): the pair kernel, in place fused 1 (never a half block per side) */
  EXPECT_OK(ncclAllReduce(buf, out, 131073, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(out_of_place(on, in_place_ll, join, 13120), "512 KiB + 4: LL128");
  if (on) {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    EXPECT(p->nch == 40 && p->send.proto == DEV_PROTO_LL128 && p->recv.proto == DEV_PROTO_LL128 &&
               p->send.nch == 40 && p->recv.nch == 40 && s->last_block == DEV_THREADS,
           "rank %d: 512 KiB + 4: LL128 on 40 channels, %u threads", rank, s->last_block);
  }
  EXPECT_OK(ncclAllReduce(buf, buf, 262144, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "1 MiB all-reduce in place");
  EXPECT(!on || ((const dev_pair_t *)s->last_work)->fused == 1, "rank %d: 1 MiB in place: fused 1", rank);
  EXPECT_OK(ncclAllReduce(buf, out, 393217, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR("-", "1.5 MiB + 4: Simple");
  ncclRedOp_t premul;
  float two = 2.0f;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&premul, &two, ncclFloat, ncclScalarHostImmediate, comm));
  EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, premul, comm, NULL));
  EXPECT_PAIR("-", "a PreMulSum all-reduce: its send scales");
  EXPECT_OK(ncclRedOpDestroy(premul, comm));
  EXPECT_OK(ncclAllGather(buf, out, 16, ncclFloat, comm, NULL));
  EXPECT_PAIR(on ? "SRC" : "-", "all-gather out of place");
  EXPECT_OK(ncclAllGather(out + 64 * rank, out, 16, ncclFloat, comm, NULL));
  EXPECT_PAIR(on ? "SR-" : "-", "all-gather in place");
  EXPECT_OK(ncclReduceScatter(buf, out, 16, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(on ? "SR-" : "-", "reduce-scatter");
  EXPECT_OK(ncclBroadcast(buf, out, 16, ncclFloat, 0, comm, NULL));
  EXPECT_PAIR(!on ? "-" : rank == 0 ? "S-C" : "-R-", "broadcast out of place");
  EXPECT_OK(ncclReduce(buf, out, 16, ncclFloat, ncclSum, 1, comm, NULL));
  EXPECT_PAIR(!on ? "-" : rank == 0 ? "S--" : "-R-", "reduce to rank 1");
  EXPECT_OK(ncclGather(buf, out, 16, ncclFloat, 0, comm, NULL));
  EXPECT_PAIR(!on ? "-" : rank == 0 ? "-RC" : "S--", "gather to rank 0 out of place");
  EXPECT_OK(ncclAlltoAll(buf, out, 16, ncclFloat, comm, NULL));
  EXPECT_PAIR(on ? "SRC" : "-", "all-to-all");
  /* in LL128's band, the copy of this rank's own block is an LL copy on as many channels, beside the LL128
   * send and receive on the pair kernel */
  EXPECT_OK(ncclAllGather(buf, out, 196608, ncclFloat, comm, NULL));
  EXPECT_PAIR(on ? "SRC" : "-", "768 KiB all-gather out of place");
  if (on) {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    EXPECT(p->send.proto == DEV_PROTO_LL128 && p->recv.proto == DEV_PROTO_LL128 &&
               p->copy.proto == DEV_PROTO_LL && (p->copy.flags & DEV_XF_LL) && p->copy.nch == 40 &&
               p->copy.bytes == 786432 && p->nch == 40,
           "rank %d: 768 KiB all-gather: LL128 send and receive, an LL copy on 40 channels", rank);
  }
  EXPECT_OK(ncclBroadcast(buf, out, 393216, ncclFloat, 0, comm, NULL));
  EXPECT_PAIR(!on ? "-" : rank == 0 ? "S-C" : "-R-", "1.5 MiB broadcast out of place");
  EXPECT_OK(ncclAlltoAll(buf, out, 262144, ncclFloat, comm, NULL));
  EXPECT_PAIR(on ? "SRC" : "-", "2 MiB all-to-all (1 MiB a block)");
  /* a 1 MiB copy to itself alone: an LL copy of more than a piece per channel, which only the pair and the
   * general entry points take (the LL one moves one piece per channel) */
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(buf, 262144, ncclFloat, rank, comm, NULL));
  EXPECT_OK(ncclRecv(out, 262144, ncclFloat, rank, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(!s->last_ll && !s->last_pair && last_entry(s) == 's',
         "rank %d: a 1 MiB send/receive to itself: the general entry point (got %c, pair %d)", rank,
         last_entry(s), s->last_pair);
  EXPECT_OK(ncclAllGather(buf, out, 393217, ncclFloat, comm, NULL));
  EXPECT_PAIR("-", "1.5 MiB + 4 all-gather: Simple, its copy too");
  {
    const dev_work_t *w = (const dev_work_t *)s->last_work;
    int lls = 0;
    for (int i = 0; i < w->nxfers; i++) lls += (w->xfers[i].flags & DEV_XF_LL) != 0;
    EXPECT(w->nxfers == 3 && lls == 0, "rank %d: 1.5 MiB + 4 all-gather: %d transfers, %d LL", rank,
           w->nxfers, lls);
  }
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(buf, 16, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(out, 32, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT_PAIR(on ? "SR-" : "-", "a send and a receive of different sizes");
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(buf, 16, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(buf + 32, 16, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT_PAIR("-", "a receive into what the send reads");
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclSend(buf + 64 * i, 16, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT_PAIR("-", "two sends");
  EXPECT_OK(ncclCommDestroy(comm));
}

static void pair_shapes(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  /* BRAID_PAIR_KERNEL, BRAID_PAIR_AR_KERNEL, BRAID_PAIR_HALVES_BYTES, BRAID_PAIR_JOIN_BYTES (NULL: the
   * default) */
  static const char *const knobs[][4] = {
      {"1", NULL, NULL, NULL}, {"1", "0", NULL, NULL},    {"1", NULL, "512", NULL}, {"1", "0", "512", NULL},
      {"1", NULL, NULL, "-1"}, {"1", NULL, NULL, "4096"}, {"1", "0", NULL, "-1"},   {"0", NULL, NULL, NULL}};
  static const char *const names[4] = {"BRAID_PAIR_KERNEL", "BRAID_PAIR_AR_KERNEL", "BRAID_PAIR_HALVES_BYTES",
                                       "BRAID_PAIR_JOIN_BYTES"};
  for (size_t k = 0; k < sizeof knobs / sizeof knobs[0]; k++) {
    for (int i = 0; i < 4; i++)
      if (knobs[k][i] != NULL)
        setenv(names[i], knobs[k][i], 1);
      else
        unsetenv(names[i]);
    shared_t sh;
    EXPECT_OK(ncclGetUniqueId(&sh.id));
    EXPECT(run_ranks(2, 60, pair_rank, &sh) == 0,
           "a rank failed (BRAID_PAIR_KERNEL=%s, BRAID_PAIR_AR_KERNEL=%s, BRAID_PAIR_HALVES_BYTES=%s, "
           "BRAID_PAIR_JOIN_BYTES=%s)",
           knobs[k][0], knobs[k][1] ? knobs[k][1] : "unset", knobs[k][2] ? knobs[k][2] : "unset",
           knobs[k][3] ? knobs[k][3] : "unset");
  }
  for (int i = 0; i < 4; i++) unsetenv(names[i]);
}

/* Destroys the stand-in driver's one graph (mock_cuda.h); how many user objects it held. */
static int mock_graph_destroy(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *sym = lib != NULL ? dlsym(lib, MOCK_CUDA_GRAPH_DESTROY) : NULL;
  EXPECT(sym != NULL, "the stand-in driver exports no %s", MOCK_CUDA_GRAPH_DESTROY);
  mock_cuda_graph_destroy_fn destroy;
  memcpy(&destroy, &sym, sizeof sym);
  return destroy();
}

/* ---- The last LL launch remembered (launch.c, memo_launch) ---- */

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

/* A communicator of the rank process whose log (TUNING at INFO) goes to the file named in path. */
static ncclComm_t tuning_comm(const shared_t *sh, int rank, int nranks, char *path, size_t size) {
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  rank_log(sh, rank, path, size);
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  return comm;
}

/* NCCL_DEBUG_SUBSYS=TUNING logs a launch's shape once per entry point and size class at INFO, every launch at
 * TRACE: a 64 MiB broadcast twice is one line, with its batches of 2 pieces; a 16 MiB one has no cap. */
static void tuning_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  void *buf = (void *)(uintptr_t)0x10000000, *out = (void *)(uintptr_t)0x20000000;
  EXPECT(test_file_lines(log_path, "up to 60 channels for broadcast, reduce, gather and scatter steps, "
                                   "all-reduce and reduce-scatter steps with a transfer of at least 8 MiB, "
                                   "and send/receive, all-to-all and all-gather transfers of that size "
                                   "(BRAID_WIDE_STEPS)") == 1,
         "rank %d: init says which steps take 60 channels", rank);
  EXPECT(test_file_lines(log_path, "pieces dealt to the channels as they find room in ring collectives' "
                                   "transfers from 67108864 bytes") == 1,
         "rank %d: init says which transfers are dealt", rank);
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclBroadcast(buf, out, 16u << 20, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclBroadcast(buf, out, 4u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(test_file_lines(log_path, "the largest 67108864 bytes over 60 channels") == 1 &&
             test_file_lines(log_path, "the largest 67108864 bytes over 60 channels: small entry point") == 1,
         "rank %d: one line for two 64 MiB broadcasts", rank);
  EXPECT(test_file_lines(log_path, "Simple batches: 2 pieces") == 1,
         "rank %d: the 64 MiB broadcast's batches", rank);
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

/* ---- Copy engines straight into the peer's buffer (core/ce.h) ----
 * The stand-in driver runs stream memory operations and copies at once, in the calling process, on memory
 * both rank processes map (cuMemAlloc is POSIX shared memory there): the copy-engine steps really move the
 * data between the two processes, and their handshake really waits for the peer. Kernels move nothing, so
 * every call checked here must go the copy engines' way, and the log says it did. */

enum { CE_N = 100003 }; /* floats per rank: odd, and the buffers start one float past an aligned address */

typedef struct {
  float *send, *recv; /* one float past ncclMemAlloc'd memory */
  int rank;
  uint64_t seed;
} ce_bufs_t;

/* Element i of rank r's input in the current call. */
static float ce_in(const ce_bufs_t *b, int r, size_t i) {
  return (float)data_value(b->seed, r, i, ncclFloat, ncclSum);
}

/* Fresh inputs (2 * CE_N floats) for a new call, and poisoned outputs. */
static void ce_fresh(ce_bufs_t *b) {
  b->seed++;
  data_fill(b->send, 2 * CE_N, b->seed, b->rank, ncclFloat, ncclSum);
  data_poison(b->recv, 2 * CE_N * sizeof(float));
}

/* This rank's buffers for the copy-engine cases (2 * CE_N floats each, one float past ncclMemAlloc'd
 * memory, freed by ce_close), with inputs from `seed` on. */
static ce_bufs_t ce_open(int rank, uint64_t seed, void **s, void **r) {
  EXPECT_OK(ncclMemAlloc(s, (2 * CE_N + 1) * sizeof(float)));
  EXPECT_OK(ncclMemAlloc(r, (2 * CE_N + 1) * sizeof(float)));
  return (ce_bufs_t){(float *)*s + 1, (float *)*r + 1, rank, seed};
}

/* The stand-in's counts of combines, of their chunks and of kernel launches. */
typedef struct {
  uint64_t combines, chunks;
  int launches;
} ce_counts_t;

static ce_counts_t ce_counts(void) {
  const mock_cuda_stats_t *st = mock_stats();
  return (ce_counts_t){st->combine_launches, st->combine_chunks, st->launches};
}

/* Expects the calls since `before` to have run `combines` combines of `chunks` chunks in all and `launches`
 * kernel launches. */
static void ce_expect_counts(int rank, const ce_counts_t *before, uint64_t combines, uint64_t chunks,
                             int launches, const char *what) {
  const ce_counts_t now = ce_counts();
  if (now.combines != before->combines + combines || now.chunks != before->chunks + chunks ||
      now.launches != before->launches + launches)
    test_fail(__FILE__, __LINE__, "rank %d: %s: %llu combines of %llu chunks, %d launches", rank, what,
              (unsigned long long)(now.combines - before->combines),
              (unsigned long long)(now.chunks - before->chunks), now.launches - before->launches);
}

/* Checks n floats of out against the sum of the two ranks' inputs from element `first` on (the host's sum
 * of two floats, in either order, is the one the combine computes). */
static void ce_expect_sum(const ce_bufs_t *b, const float *out, size_t n, size_t first, const char *what) {
  for (size_t i = 0; i < n; i++) {
    const float want = ce_in(b, 0, first + i) + ce_in(b, 1, first + i);
    if (out[i] != want) {
      test_fail(__FILE__, __LINE__, "rank %d: %s: element %zu is %g, expected %g", b->rank, what, i,
                (double)out[i], (double)want);
      return;
    }
  }
}

/* Checks n floats of out against rank r's input from element `first` on. */
static void ce_expect(const ce_bufs_t *b, const float *out, size_t n, int r, size_t first, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (out[i] != ce_in(b, r, first + i)) {
      test_fail(__FILE__, __LINE__, "rank %d: %s: element %zu is %g, expected rank %d's %g", b->rank, what, i,
                (double)out[i], r, (double)ce_in(b, r, first + i));
      return;
    }
}

/* Reductions through the copy engines: the sender's chunks land in the receiver's output and its combine
 * kernel (run at once by the stand-in, with the host's arithmetic) adds its own operand, chunk by chunk. A
 * reduce in place is pulled: the root's combine reads the sender's input. On the ring only: PreMulSum (a
 * float average) would need the peer's bytes scaled; one-shot steps differ between the ranks. They stay on
 * the kernels, which move nothing here. */
static void ce_reductions(ce_bufs_t *b, ncclComm_t comm) {
  mock_cuda_stats_t *st = mock_stats();
  const int rank = b->rank;
  for (int root = 0; root < 2; root++) {
    ce_fresh(b);
    const uint64_t combines = st->combine_launches, chunks = st->combine_chunks;
    EXPECT_OK(ncclReduce(b->send, b->recv, CE_N, ncclFloat, ncclSum, root, comm, NULL));
    if (rank == root) ce_expect_sum(b, b->recv, CE_N, 0, "reduce");
    EXPECT(st->combine_launches == combines + (rank == root) &&
               st->combine_chunks >= chunks + 3 * (uint64_t)(rank == root),
           "rank %d: a reduce to %d: %llu combines of %llu chunks", rank, root,
           (unsigned long long)(st->combine_launches - combines),
           (unsigned long long)(st->combine_chunks - chunks));
  }
  ce_fresh(b); /* each rank's block of the output is the sum of the two inputs' blocks */
  EXPECT_OK(ncclReduceScatter(b->send, b->recv, CE_N, ncclFloat, ncclSum, comm, NULL));
  ce_expect_sum(b, b->recv, CE_N, (size_t)rank * CE_N, "reduce-scatter");
  ce_fresh(b); /* both steps of a split all-reduce by the copy engines */
  EXPECT_OK(ncclAllReduce(b->send, b->recv, CE_N, ncclFloat, ncclSum, comm, NULL));
  ce_expect_sum(b, b->recv, CE_N, 0, "all-reduce");
  /* integers averaged: the combine divides the sum (wrapping, then truncating) */
  int32_t *in = (int32_t *)b->send, *out = (int32_t *)b->recv;
  b->seed++;
  data_fill(in, CE_N, b->seed, rank, ncclInt32, ncclAvg);
  data_poison(out, CE_N * sizeof(int32_t));
  EXPECT_OK(ncclReduce(in, out, CE_N, ncclInt32, ncclAvg, 1, comm, NULL));
  for (size_t i = 0; rank == 1 && i < CE_N; i++) {
    const int32_t want = (int32_t)((uint32_t)data_value(b->seed, 0, i, ncclInt32, ncclAvg) +
                                   (uint32_t)data_value(b->seed, 1, i, ncclInt32, ncclAvg)) /
                         2;
    if (out[i] != want) {
      test_fail(__FILE__, __LINE__, "integer average: element %zu is %d, expected %d", i, out[i], want);
      break;
    }
  }
  /* in place: the root's combine reads the other rank's input where it lies, in one chunk (a pull) */
  for (int root = 0; root < 2; root++) {
    ce_fresh(b);
    float *io = rank == root ? b->recv : b->send;
    if (rank == root) memcpy(io, b->send, CE_N * sizeof(float));
    const ce_counts_t before = ce_counts();
    EXPECT_OK(ncclReduce(io, io, CE_N, ncclFloat, ncclSum, root, comm, NULL));
    if (rank == root)
      ce_expect_sum(b, io, CE_N, 0, "reduce in place");
    else
      ce_expect(b, io, CE_N, rank, 0, "reduce in place: the sender's input");
    ce_expect_counts(rank, &before, rank == root, rank == root, 0, "a reduce in place");
  }
  const uint64_t combines = st->combine_launches;
  const int launches = st->launches;
  ce_fresh(b); /* a float average is a PreMulSum: the kernels */
  EXPECT_OK(ncclReduceScatter(b->send, b->recv, CE_N, ncclFloat, ncclAvg, comm, NULL));
  /* one-shot (at most BRAID_ONESHOT_MAX_BYTES): the root combines in a lane of its own while the other
   * rank's send looks like the ring's; both must leave it to the kernels, not wait for each other */
  ce_fresh(b);
  EXPECT_OK(ncclReduce(b->send, b->recv, 4096, ncclFloat, ncclSum, 0, comm, NULL));
  EXPECT(st->combine_launches == combines && st->launches == launches + 2,
         "rank %d: averaged or one-shot: %llu combines, %d launches", rank,
         (unsigned long long)(st->combine_launches - combines), st->launches - launches);
}

/* A last broadcast from `root` that the copy engines must move (the ranks still pair after what the test
 * did), then the buffers (s and r, from ncclMemAlloc) and the communicator go. */
static void ce_close(ce_bufs_t *b, void *s, void *r, ncclComm_t comm, int root, const char *what) {
  ce_fresh(b);
  EXPECT_OK(ncclBroadcast(b->send, b->recv, CE_N, ncclFloat, root, comm, NULL));
  ce_expect(b, b->recv, CE_N, root, 0, what);
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void ce_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "copy engines move steps whose every transfer") == 1,
         "rank %d: the communicator has no copy-engine path", rank);
  const int peer = 1 - rank;
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 77, &s, &r); /* the same sequence of seeds on both ranks */
  for (int root = 0; root < 2; root++) {
    ce_fresh(&b);
    EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, root, comm, NULL));
    ce_expect(&b, b.recv, CE_N, root, 0, "broadcast");
  }
  ce_fresh(&b); /* in place: the root's buffer is its input */
  float *io = rank == 1 ? b.send : b.recv;
  EXPECT_OK(ncclBroadcast(io, io, CE_N, ncclFloat, 1, comm, NULL));
  ce_expect(&b, io, CE_N, 1, 0, "broadcast in place");
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather");
  ce_fresh(&b); /* in place: this rank's block already holds its input */
  memcpy(b.recv + (size_t)rank * CE_N, b.send, CE_N * sizeof(float));
  EXPECT_OK(ncclAllGather(b.recv + (size_t)rank * CE_N, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather in place");
  ce_fresh(&b);
  EXPECT_OK(ncclGather(b.send, b.recv, CE_N, ncclFloat, 0, comm, NULL));
  if (rank == 0)
    for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "gather");
  ce_fresh(&b);
  EXPECT_OK(ncclScatter(b.send, b.recv, CE_N, ncclFloat, 1, comm, NULL));
  ce_expect(&b, b.recv, CE_N, 1, (size_t)rank * CE_N, "scatter");
  ce_fresh(&b);
  EXPECT_OK(ncclAlltoAll(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++)
    ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, (size_t)rank * CE_N, "alltoall");
  ce_fresh(&b); /* two sends each way in one group, of different sizes */
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b.send, CE_N, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclSend(b.send + CE_N, CE_N - 2, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b.recv, CE_N, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b.recv + CE_N, CE_N - 2, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  ce_expect(&b, b.recv, 2 * CE_N - 2, peer, 0, "send/receive");
  /* An all-reduce in place past BRAID_AR_SPLIT_BYTES: its reduce-scatter step is the kernels' (which move
   * nothing here), its all-gather step the copy engines'. Each rank's half of the buffer holds a pattern
   * standing in for its reduced half; afterwards both halves must be on both ranks. Halves of an odd count:
   * the first one element longer. */
  ce_fresh(&b);
  const size_t half[2] = {CE_N / 2 + 1, CE_N / 2}, first[2] = {0, CE_N / 2 + 1};
  memcpy(b.recv + first[rank], b.send + CE_N + first[rank], half[rank] * sizeof(float)); /* not the input */
  EXPECT_OK(ncclAllReduce(b.recv, b.recv, CE_N, ncclFloat, ncclSum, comm, NULL));
  for (int p = 0; p < 2; p++)
    ce_expect(&b, b.recv + first[p], half[p], p, CE_N + first[p], "all-reduce's halves");
  ce_reductions(&b, comm);
  /* one INFO line per collective and size class: broadcast, all-gather, gather, scatter, alltoall, send,
   * all-reduce, reduce, reduce-scatter */
  EXPECT(test_file_lines(log_path, "by the copy engines") == 9,
         "rank %d: %d kinds logged as copy-engine steps", rank,
         test_file_lines(log_path, "by the copy engines"));
  /* Each rank refuses once, the other agrees: both must leave the step to the kernels (which here move
   * nothing, so the poisoned output stays), and the next call must still pair with the peer's. */
  mock_cuda_stats_t *st = mock_stats();
  const uint64_t copies = st->dd_copies;
  const int launches = st->launches;
  float *host = malloc(2 * CE_N * sizeof(float)); /* an output legacy IPC cannot export */
  EXPECT(host != NULL);
  for (int refuser = 0; refuser < 2; refuser++) {
    ce_fresh(&b);
    EXPECT_OK(ncclAllGather(b.send, rank == refuser ? host : b.recv, CE_N, ncclFloat, comm, NULL));
  }
  free(host);
  EXPECT(st->dd_copies == copies && st->launches == launches + 2,
         "rank %d: a refused step: %llu copies, %d launches", rank,
         (unsigned long long)(st->dd_copies - copies), st->launches - launches);
  ce_fresh(&b); /* below the threshold: the kernels */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, 100, ncclFloat, 0, comm, NULL));
  EXPECT(st->dd_copies == copies && st->launches == launches + 3, "rank %d: a small broadcast took copies",
         rank);
  ce_close(&b, s, r, comm, 0, "broadcast after refusals");
}

/* Mapped allocations of the peer, as the stand-in driver counts them (cuMem mappings and opened IPC). */
static int live_mappings(const mock_cuda_stats_t *st) {
  return st->live_maps + st->live_legacy;
}

/* Captured calls. Both ranks capturing take the copy engines: the stand-in runs what is captured at once, as
 * one replay would, so the data moves; each step waits through the wait kernel, once per direction it has,
 * raising the peer's word in the same kernel where the rank sends and receives (no stream write then), and
 * the graph keeps its own mapping of the peer's output until it is destroyed. One rank capturing
 * and the other eager stay on the kernels, without a warning. */
static void ce_capture_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  cudaStream_t cap = (cudaStream_t)MOCK_CUDA_CAPTURING;
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 91, &s, &r);
  mock_cuda_stats_t *st = mock_stats();
  const int maps = live_mappings(st);
  const uint64_t copies = st->dd_copies, waits = st->wait_launches;
  uint64_t writes = st->stream_writes, raises = st->wait_raises;
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, cap));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "captured all-gather");
  EXPECT(st->dd_copies == copies + 2 && st->wait_launches == waits + 2,
         "rank %d: a captured all-gather took %llu copies and %llu waits", rank,
         (unsigned long long)(st->dd_copies - copies), (unsigned long long)(st->wait_launches - waits));
  /* it sends and receives: `ready` and `done` each raised by the wait that follows it */
  EXPECT(st->stream_writes == writes && st->wait_raises == raises + 2,
         "rank %d: a captured all-gather took %llu stream writes and %llu raising waits", rank,
         (unsigned long long)(st->stream_writes - writes), (unsigned long long)(st->wait_raises - raises));
  writes = st->stream_writes;
  raises = st->wait_raises;
  EXPECT(live_mappings(st) == maps + 1, "rank %d: %d mappings for the graph", rank, live_mappings(st) - maps);
  ce_fresh(&b); /* in the same graph: only the root maps its peer's output */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, 0, comm, cap));
  ce_expect(&b, b.recv, CE_N, 0, 0, "captured broadcast");
  EXPECT(live_mappings(st) == maps + 1 + (rank == 0), "rank %d: %d mappings for the graph", rank,
         live_mappings(st) - maps);
  /* one way: the root raises `done`, the other rank `ready`, each with a stream write */
  EXPECT(st->stream_writes == writes + 1 && st->wait_raises == raises,
         "rank %d: a captured broadcast took %llu stream writes and %llu raising waits", rank,
         (unsigned long long)(st->stream_writes - writes), (unsigned long long)(st->wait_raises - raises));
  ce_fresh(&b); /* a reduction: each rank maps its peer's output, and combines in the graph */
  const uint64_t combines = st->combine_launches;
  EXPECT_OK(ncclReduceScatter(b.send, b.recv, CE_N, ncclFloat, ncclSum, comm, cap));
  ce_expect_sum(&b, b.recv, CE_N, (size_t)rank * CE_N, "captured reduce-scatter");
  EXPECT(live_mappings(st) == maps + 2 + (rank == 0) && st->combine_launches == combines + 1,
         "rank %d: %d mappings for the graph, %llu combines", rank, live_mappings(st) - maps,
         (unsigned long long)(st->combine_launches - combines));
  EXPECT(mock_graph_destroy() == 1, "rank %d: the graph held more than the communicator's token", rank);
  ce_fresh(&b); /* below the threshold: the kernels; the launch frees what the graph held */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, 100, ncclFloat, 0, comm, NULL));
  EXPECT(live_mappings(st) == maps, "rank %d: %d mappings outlived the graph", rank,
         live_mappings(st) - maps);
  const int launches = st->launches;
  const uint64_t copies_now = st->dd_copies;
  ce_fresh(&b); /* rank 0 captures, rank 1 runs eagerly: the kernels (which move nothing here) */
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, rank == 0 ? cap : NULL));
  EXPECT(st->dd_copies == copies_now && st->launches == launches + 1,
         "rank %d: a half-captured all-gather took %llu copies, %d launches", rank,
         (unsigned long long)(st->dd_copies - copies_now), st->launches - launches);
  EXPECT(test_file_lines(log_path, "describes a different step") == 0, "rank %d: warned", rank);
  mock_graph_destroy();
  ce_fresh(&b); /* and the path still pairs the ranks' next step */
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather after");
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
  EXPECT_OK(ncclCommDestroy(comm));
}

/* One process, a thread per rank of a communicator from ncclCommInitAll: each rank writes straight into the
 * other's output at the address that rank gave, with nothing exported or mapped. */
typedef struct {
  ncclComm_t comm;
  int rank;
  void *s, *r; /* ncclMemAlloc'd on the rank's device (by the main thread: the stand-in's allocations are
                * not thread-safe) */
} ce_local_t;

static void *ce_local_thread(void *arg) {
  const ce_local_t *t = arg;
  ce_bufs_t b = {(float *)t->s + 1, (float *)t->r + 1, t->rank, 0};
  b.seed = 123;
  const int peer = 1 - t->rank;
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, t->comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather, one process");
  for (int root = 0; root < 2; root++) {
    ce_fresh(&b);
    EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, root, t->comm, NULL));
    ce_expect(&b, b.recv, CE_N, root, 0, "broadcast, one process");
  }
  ce_fresh(&b);
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b.send, CE_N - 1, ncclFloat, peer, t->comm, NULL));
  EXPECT_OK(ncclRecv(b.recv, CE_N - 1, ncclFloat, peer, t->comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  ce_expect(&b, b.recv, CE_N - 1, peer, 0, "send/receive, one process");
  ce_fresh(&b);
  EXPECT_OK(ncclReduceScatter(b.send, b.recv, CE_N, ncclFloat, ncclSum, t->comm, NULL));
  ce_expect_sum(&b, b.recv, CE_N, (size_t)t->rank * CE_N, "reduce-scatter, one process");
  ce_fresh(&b); /* captured by both ranks (ce_local_proc checks that nothing was mapped for the graph) */
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, t->comm, (cudaStream_t)MOCK_CUDA_CAPTURING));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "captured, one process");
  return NULL;
}

/* Gives each rank of comms its buffers (ncclMemAlloc'd on its device by this thread: the stand-in's
 * allocations are not thread-safe), then runs `thread` for both ranks at once and joins them. */
static void local_pair_run(ncclComm_t comms[2], ce_local_t t[2], void *(*thread)(void *)) {
  for (int i = 0; i < 2; i++) {
    t[i] = (ce_local_t){comms[i], i, NULL, NULL};
    gpu_scope_t scope; /* ncclMemAlloc allocates on the current device */
    EXPECT_OK(gpu_enter(i, &scope));
    EXPECT_OK(ncclMemAlloc(&t[i].s, (2 * CE_N + 1) * sizeof(float)));
    EXPECT_OK(ncclMemAlloc(&t[i].r, (2 * CE_N + 1) * sizeof(float)));
    gpu_leave(&scope);
  }
  pthread_t th[2];
  for (int i = 0; i < 2; i++) EXPECT(pthread_create(&th[i], NULL, thread, &t[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
}

/* Destroys both communicators and frees the buffers local_pair_run gave them. */
static void local_pair_close(ncclComm_t comms[2], ce_local_t t[2]) {
  for (int i = 0; i < 2; i++) {
    EXPECT_OK(ncclCommDestroy(comms[i]));
    EXPECT_OK(ncclMemFree(t[i].s));
    EXPECT_OK(ncclMemFree(t[i].r));
  }
}

static void ce_local_proc(int rank, int nranks, void *arg) {
  char log_path[128];
  rank_log(arg, rank, log_path, sizeof log_path);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING,ALLOC", 1);
  param_reload();
  log_init();
  ncclComm_t comms[2];
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL));
  EXPECT(test_file_lines(log_path, "copy engines move steps whose every transfer") == 2,
         "the communicators of one process have no copy-engine path");
  const uint64_t copies = mock_stats()->dd_copies;
  ce_local_t t[2];
  local_pair_run(comms, t, ce_local_thread);
  EXPECT(mock_stats()->dd_copies >= copies + 6, "%llu copies in one process",
         (unsigned long long)(mock_stats()->dd_copies - copies));
  EXPECT(test_file_lines(log_path, "memory for the copy engines") == 0 &&
             test_file_lines(log_path, "memory for a captured copy") == 0,
         "a rank mapped its peer's memory in one process");
  /* the capture's graph held both communicators, one token each */
  EXPECT(mock_graph_destroy() == 2, "the graph held other than one token per communicator");
  local_pair_close(comms, t);
}

/* BRAID_CE_MIN_BYTES=0 on one rank only: both ranks go without the path, and say so. */
static void ce_off_rank(int rank, int nranks, void *arg) {
  if (rank == 1) setenv("BRAID_CE_MIN_BYTES", "0", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "no copy-engine path") == 1 &&
             test_file_lines(log_path, "copy engines move steps") == 0,
         "rank %d: the path is not off on both ranks", rank);
  void *buf = (void *)(uintptr_t)0x10000000, *out = (void *)(uintptr_t)0x20000000;
  EXPECT_OK(ncclBroadcast(buf, out, 1u << 20, ncclFloat, 0, comm, NULL));
  EXPECT(test_file_lines(log_path, "by the copy engines") == 0, "rank %d: a copy-engine step", rank);
  EXPECT_OK(ncclCommDestroy(comm));
}

/* BRAID_CE_REDUCE_MIN_BYTES=0 on one rank only: reductions leave the copy engines on both ranks, while the
 * other steps still take them: the reduce-scatter goes to the kernels (which move nothing here), the reduce
 * is pulled (BRAID_CE_PULL_MIN_BYTES), in one chunk. */
static void ce_reduce_off_rank(int rank, int nranks, void *arg) {
  if (rank == 1) setenv("BRAID_CE_REDUCE_MIN_BYTES", "0", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "out-of-place reductions from 0 bytes") == 1,
         "rank %d: reductions still take the copy engines", rank);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 91, &s, &r);
  const ce_counts_t before = ce_counts();
  ce_fresh(&b);
  EXPECT_OK(ncclReduce(b.send, b.recv, CE_N, ncclFloat, ncclSum, 0, comm, NULL));
  if (rank == 0) ce_expect_sum(&b, b.recv, CE_N, 0, "reduce pulled");
  ce_fresh(&b);
  EXPECT_OK(ncclReduceScatter(b.send, b.recv, CE_N, ncclFloat, ncclSum, comm, NULL));
  ce_expect_counts(rank, &before, rank == 0, rank == 0, 1, "reductions with the copy engines off for them");
  ce_close(&b, s, r, comm, 1, "broadcast beside reductions left to the kernels");
}

/* BRAID_CE_PULL_MIN_BYTES=0 on one rank: a reduce in place stays on the kernels on both (which move nothing
 * here); below BRAID_CE_REDUCE_MIN_BYTES (mode 2): an out-of-place reduce is pulled too (one chunk, not the
 * copy engines' several). */
static void ce_pull(int rank, int nranks, const shared_t *sh, int mode) {
  if (mode == 0 && rank == 1) setenv("BRAID_CE_PULL_MIN_BYTES", "0", 1);
  if (mode == 2) setenv("BRAID_CE_REDUCE_MIN_BYTES", "1073741824", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(sh, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path,
                         mode == 0 ? "where it lies from 0 bytes" : "where it lies from 1024 bytes") == 1,
         "rank %d: the log does not give the agreed BRAID_CE_PULL_MIN_BYTES", rank);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 57, &s, &r);
  const ce_counts_t before = ce_counts();
  ce_fresh(&b);
  /* mode 0 in place (the root's output holds its input), mode 2 out of place */
  float *in = b.send, *out = b.recv;
  if (mode == 0) {
    in = out = rank == 0 ? b.recv : b.send;
    if (rank == 0) memcpy(b.recv, b.send, CE_N * sizeof(float));
  }
  EXPECT_OK(ncclReduce(in, out, CE_N, ncclFloat, ncclSum, 0, comm, NULL));
  if (mode == 2 && rank == 0) ce_expect_sum(&b, b.recv, CE_N, 0, "reduce pulled out of place");
  const int pulled = mode == 2 && rank == 0;
  ce_expect_counts(rank, &before, pulled, pulled, mode == 0,
                   mode == 0 ? "no pulls" : "a reduce pulled out of place");
  ce_close(&b, s, r, comm, 1, "broadcast after a reduce");
}

static void ce_pull_off_rank(int rank, int nranks, void *arg) {
  ce_pull(rank, nranks, arg, 0);
}

static void ce_pull_all_rank(int rank, int nranks, void *arg) {
  ce_pull(rank, nranks, arg, 2);
}

/* ---- Steps that only copy, pushed by one kernel (core/ce.h, STEP_CE_PUSH) ----
 * With BRAID_CE_PUSH_MIN_BYTES below BRAID_CE_MIN_BYTES, the copy-engine path's steps that only copy go by
 * the push kernel, which the stand-in runs at once: its handshake, then its copies (the sends straight into
 * the peer's outputs, mapped here, and the local copies). A rank that only receives and copies nothing
 * raises `ready` with a stream write and waits in a wait kernel. Every call checked here moves its data that
 * way: the other kernels move nothing. */

/* The stand-in's counts of what a pushed step enqueues. */
typedef struct {
  uint64_t pushes, copies, writes, waits, dd;
} push_counts_t;

static push_counts_t push_counts(void) {
  const mock_cuda_stats_t *st = mock_stats();
  return (push_counts_t){st->push_launches, st->push_copies, st->stream_writes, st->wait_launches,
                         st->dd_copies};
}

/* Expects the calls since `before` to have enqueued `pushes` push kernels making `copies` copies, `writes`
 * stream writes, `waits` wait kernels and `dd` copies by the copy engines. */
static void push_expect(int rank, const push_counts_t *before, uint64_t pushes, uint64_t copies,
                        uint64_t writes, uint64_t waits, uint64_t dd, const char *what) {
  const push_counts_t n = push_counts();
  if (n.pushes - before->pushes != pushes || n.copies - before->copies != copies ||
      n.writes - before->writes != writes || n.waits - before->waits != waits || n.dd - before->dd != dd)
    test_fail(__FILE__, __LINE__,
              "rank %d: %s: %llu pushes of %llu copies, %llu stream writes, %llu waits, %llu engine copies",
              rank, what, (unsigned long long)(n.pushes - before->pushes),
              (unsigned long long)(n.copies - before->copies),
              (unsigned long long)(n.writes - before->writes), (unsigned long long)(n.waits - before->waits),
              (unsigned long long)(n.dd - before->dd));
}

static void push_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "pushed by one kernel from 1024 bytes a transfer") == 1,
         "rank %d: the log does not give the agreed BRAID_CE_PUSH_MIN_BYTES", rank);
  const int peer = 1 - rank;
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 31, &s, &r);
  push_counts_t c = push_counts();
  for (int root = 0; root < 2; root++) { /* the root pushes; the other rank writes `ready` and waits */
    ce_fresh(&b);
    EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, root, comm, NULL));
    ce_expect(&b, b.recv, CE_N, root, 0, "broadcast pushed");
    /* out of place, the root also copies its input into its output */
    push_expect(rank, &c, rank == root, rank == root ? 2 : 0, rank != root, rank != root, 0,
                "a broadcast pushed");
    c = push_counts();
  }
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather pushed");
  push_expect(rank, &c, 1, 2, 0, 0, 0, "an all-gather pushed"); /* the send and the local copy */
  c = push_counts();
  ce_fresh(&b); /* in place: nothing to copy locally */
  memcpy(b.recv + (size_t)rank * CE_N, b.send, CE_N * sizeof(float));
  EXPECT_OK(ncclAllGather(b.recv + (size_t)rank * CE_N, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather in place");
  push_expect(rank, &c, 1, 1, 0, 0, 0, "an all-gather in place pushed");
  c = push_counts();
  ce_fresh(&b); /* the root receives and copies its own block: a push kernel with a local copy only */
  EXPECT_OK(ncclGather(b.send, b.recv, CE_N, ncclFloat, 0, comm, NULL));
  if (rank == 0)
    for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "gather pushed");
  push_expect(rank, &c, 1, 1, 0, 0, 0, "a gather pushed");
  c = push_counts();
  ce_fresh(&b);
  EXPECT_OK(ncclAlltoAll(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
  for (int p = 0; p < 2; p++)
    ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, (size_t)rank * CE_N, "alltoall pushed");
  c = push_counts();
  /* A group of two sends each way, of different sizes, and nine copies to this rank itself: one kernel
   * takes the two sends and six copies, the other three follow it by the copy engines. */
  ce_fresh(&b);
  enum { SELF = 9, SELF_N = 1001 };
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(b.send, CE_N, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclSend(b.send + CE_N, CE_N - 2 * SELF_N * SELF, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b.recv, CE_N, ncclFloat, peer, comm, NULL));
  EXPECT_OK(ncclRecv(b.recv + CE_N, CE_N - 2 * SELF_N * SELF, ncclFloat, peer, comm, NULL));
  float *self_out = b.recv + 2 * CE_N - SELF_N * SELF;
  for (int i = 0; i < SELF; i++) {
    EXPECT_OK(ncclSend(b.send + 2 * CE_N - SELF_N * (i + 1), SELF_N, ncclFloat, rank, comm, NULL));
    EXPECT_OK(ncclRecv(self_out + SELF_N * i, SELF_N, ncclFloat, rank, comm, NULL));
  }
  EXPECT_OK(ncclGroupEnd());
  ce_expect(&b, b.recv, 2 * CE_N - 2 * SELF_N * SELF, peer, 0, "send/receive pushed");
  for (int i = 0; i < SELF; i++)
    ce_expect(&b, self_out + SELF_N * i, SELF_N, rank, 2 * CE_N - SELF_N * (i + 1), "a copy to itself");
  push_expect(rank, &c, 1, DEV_PUSH_COPIES, 0, 0, 2 + SELF - DEV_PUSH_COPIES, "a group pushed");
  /* broadcast, all-gather, gather, alltoall, send: one INFO line each */
  EXPECT(test_file_lines(log_path, "pushed by one kernel: ") == 5, "rank %d: %d kinds logged as pushed", rank,
         test_file_lines(log_path, "pushed by one kernel: "));
  EXPECT(test_file_lines(log_path, "by the copy engines") == 0, "rank %d: a copy-engine step", rank);
  /* Captured by both ranks: the same kernel in the graph, and the graph keeps its mapping of the peer's
   * output. */
  const int maps = live_mappings(mock_stats());
  c = push_counts();
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, (cudaStream_t)MOCK_CUDA_CAPTURING));
  for (int p = 0; p < 2; p++) ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "captured all-gather");
  push_expect(rank, &c, 1, 2, 0, 0, 0, "a captured all-gather pushed");
  EXPECT(live_mappings(mock_stats()) == maps + 1, "rank %d: %d mappings for the graph", rank,
         live_mappings(mock_stats()) - maps);
  EXPECT(mock_graph_destroy() == 1, "rank %d: the graph held more than the communicator's token", rank);
  ce_close(&b, s, r, comm, 0, "broadcast after pushes");
}

/* A push threshold 0 on one rank turns those pushes off on both, the other kind staying on: mode 0,
 * BRAID_CE_PUSH_MIN_BYTES on rank 1 (one-way steps: a broadcast goes to the kernels, which move nothing
 * here, an all-gather is still pushed); mode 1, BRAID_CE_PUSH_EXCHANGE_MIN_BYTES on rank 0 (the other way
 * round). The copy engines keep their steps. */
static void push_off(int rank, int nranks, const shared_t *sh, int mode) {
  if (mode == 0 && rank == 1) setenv("BRAID_CE_PUSH_MIN_BYTES", "0", 1);
  if (mode == 1 && rank == 0) setenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES", "0", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(sh, rank, nranks, log_path, sizeof log_path);
  const char *agreed = mode == 0 ? "from 0 bytes a transfer (BRAID_CE_PUSH_MIN_BYTES, 0: never), from 1024 "
                                 : "from 1024 bytes a transfer (BRAID_CE_PUSH_MIN_BYTES, 0: never), from 0 ";
  EXPECT(test_file_lines(log_path, agreed) == 1, "rank %d: the log does not give the agreed push thresholds",
         rank);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 41, &s, &r);
  push_counts_t c = push_counts();
  ce_fresh(&b); /* one way, root 0 */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N / 4, ncclFloat, 0, comm, NULL));
  if (mode == 1) ce_expect(&b, b.recv, CE_N / 4, 0, 0, "broadcast pushed");
  const int root_push = mode == 1 && rank == 0, other = mode == 1 && rank == 1;
  push_expect(rank, &c, root_push, root_push ? 2 : 0, other, other, 0, "a broadcast");
  c = push_counts();
  ce_fresh(&b); /* an exchange */
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N / 4, ncclFloat, comm, NULL));
  if (mode == 0)
    for (int p = 0; p < 2; p++)
      ce_expect(&b, b.recv + (size_t)p * (CE_N / 4), CE_N / 4, p, 0, "all-gather pushed");
  push_expect(rank, &c, mode == 0, mode == 0 ? 2 : 0, 0, 0, 0, "an all-gather");
  ce_fresh(&b); /* at the threshold: the copy engines */
  EXPECT_OK(ncclBroadcast(b.send, b.recv, 2 * CE_N, ncclFloat, 1, comm, NULL));
  ce_expect(&b, b.recv, 2 * CE_N, 1, 0, "broadcast by the copy engines");
  EXPECT(test_file_lines(log_path, "by the copy engines") == 1, "rank %d: no copy-engine step", rank);
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void push_off_rank(int rank, int nranks, void *arg) {
  push_off(rank, nranks, arg, 0);
}

static void push_exchange_off_rank(int rank, int nranks, void *arg) {
  push_off(rank, nranks, arg, 1);
}

/* Ranks of one process (ncclCommInitAll, a thread per rank, their mailboxes in this process's memory) take
 * BRAID_CE_PUSH_EXCHANGE_MIN_BYTES for exchanges as ranks of separate processes do: with
 * BRAID_CE_PUSH_MIN_BYTES above CE_N floats and the exchange threshold at 1 KiB, an all-gather of CE_N floats
 * a rank is pushed by both ranks, a broadcast of 2 * CE_N - 1 floats by its root. */
static void *push_local_thread(void *arg) {
  const ce_local_t *t = arg;
  ce_bufs_t b = {(float *)t->s + 1, (float *)t->r + 1, t->rank, 200};
  ce_fresh(&b);
  EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, t->comm, NULL));
  for (int p = 0; p < 2; p++)
    ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather pushed, one process");
  ce_fresh(&b);
  EXPECT_OK(ncclBroadcast(b.send, b.recv, 2 * CE_N - 1, ncclFloat, 1, t->comm, NULL));
  ce_expect(&b, b.recv, 2 * CE_N - 1, 1, 0, "broadcast pushed, one process");
  return NULL;
}

static void push_local_proc(int rank, int nranks, void *arg) {
  setenv("BRAID_CE_PUSH_MIN_BYTES", "400100", 1);
  param_reload();
  ncclComm_t comms[2];
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL));
  const push_counts_t c = push_counts();
  ce_local_t t[2];
  local_pair_run(comms, t, push_local_thread);
  /* each rank pushes the all-gather's send and local copy; the broadcast's root pushes its send and its
   * local copy, the other rank writes `ready` and waits */
  push_expect(rank, &c, 3, 6, 1, 1, 0, "an all-gather and a broadcast in one process");
  local_pair_close(comms, t);
  setenv("BRAID_CE_PUSH_MIN_BYTES", "1024", 1);
}

/* The step-message mailbox (core/ce.c): of a group with more candidate steps than half a mailbox, the first
 * CE_OFFERS_MAX (32) take the copy engines and the rest the kernels (both ranks count alike), and the path
 * still pairs the next call; a peer late by more than the receive's spin is waited for (rank 1 sleeps before
 * its calls). */
static void mbox_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 61, &s, &r);
  uint64_t copies = mock_stats()->dd_copies;
  ce_fresh(&b);
  EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, 0, comm, NULL));
  ce_expect(&b, b.recv, CE_N, 0, 0, "one broadcast");
  const uint64_t one = mock_stats()->dd_copies - copies; /* the root's send and local copy */
  EXPECT(rank != 0 || one == 2, "rank 0: one broadcast made %llu engine copies", (unsigned long long)one);
  copies = mock_stats()->dd_copies;
  ce_fresh(&b);
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < 33; i++) EXPECT_OK(ncclBroadcast(b.send, b.recv, CE_N, ncclFloat, 0, comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(mock_stats()->dd_copies - copies == 32 * one,
         "rank %d: a group of 33 large broadcasts made %llu engine copies, not %llu", rank,
         (unsigned long long)(mock_stats()->dd_copies - copies), (unsigned long long)(32 * one));
  for (int i = 0; i < 3; i++) {
    if (rank == 1) usleep(100000);
    ce_fresh(&b);
    EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
    for (int p = 0; p < 2; p++)
      ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather, a peer late");
  }
  ce_close(&b, s, r, comm, 0, "broadcast after the mailbox cases");
}

/* A peer that never sends its step message: the receive gives up after BRAID_TIMEOUT_S (1 s here) with an
 * error that says what it waited for, instead of hanging. */
static void mbox_timeout_rank(int rank, int nranks, void *arg) {
  setenv("BRAID_TIMEOUT_S", "1", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 71, &s, &r);
  if (rank == 0) {
    ce_fresh(&b);
    const ncclResult_t res = ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL);
    EXPECT(res == ncclRemoteError && strstr(ncclGetLastError(comm), "step message") != NULL,
           "rank 0: a step message that never came: %d (%s)", (int)res, ncclGetLastError(comm));
  } else {
    sleep(3);
  }
  EXPECT_OK(ncclCommAbort(comm));
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
  unsetenv("BRAID_TIMEOUT_S");
}

/* BRAID_CE_MAILBOX=0 on rank 1 only: both ranks send their step messages over the bootstrap instead, and
 * the copy engines still move an all-gather. */
static void mbox_off_rank(int rank, int nranks, void *arg) {
  if (rank == 1) setenv("BRAID_CE_MAILBOX", "0", 1);
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  EXPECT(test_file_lines(log_path, "step messages go over the bootstrap"),
         "rank %d: the log does not say that step messages go over the bootstrap", rank);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 91, &s, &r);
  const uint64_t copies = mock_stats()->dd_copies;
  for (int i = 0; i < 2; i++) {
    ce_fresh(&b);
    EXPECT_OK(ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL));
    for (int p = 0; p < 2; p++)
      ce_expect(&b, b.recv + (size_t)p * CE_N, CE_N, p, 0, "all-gather, messages over the bootstrap");
  }
  EXPECT(mock_stats()->dd_copies - copies == 4, "rank %d: %llu engine copies for two all-gathers, not 4",
         rank, (unsigned long long)(mock_stats()->dd_copies - copies));
  ce_close(&b, s, r, comm, 0, "broadcast, messages over the bootstrap");
  unsetenv("BRAID_CE_MAILBOX");
}

/* Aborts the communicator once its rank has waited a while for a step message that does not come. */
static void *mbox_abort_later(void *arg) {
  const aborter_t *a = arg;
  usleep(300000);
  EXPECT_OK(ncclCommAbort(a->comm));
  return NULL;
}

/* ncclCommAbort from another thread while a rank waits for its peer's step message (the peer never calls):
 * the wait ends on the abort flag, long before BRAID_TIMEOUT_S (its default, 1800 s), and says so. */
static void mbox_abort_rank(int rank, int nranks, void *arg) {
  char log_path[128];
  ncclComm_t comm = tuning_comm(arg, rank, nranks, log_path, sizeof log_path);
  void *s, *r;
  ce_bufs_t b = ce_open(rank, 81, &s, &r);
  if (rank == 0) {
    pthread_t aborter;
    aborter_t a = {comm, log_path};
    EXPECT(pthread_create(&aborter, NULL, mbox_abort_later, &a) == 0);
    ce_fresh(&b);
    const ncclResult_t res = ncclAllGather(b.send, b.recv, CE_N, ncclFloat, comm, NULL);
    pthread_join(aborter, NULL);
    EXPECT(res != ncclSuccess, "rank 0: an all-gather whose peer never came succeeded");
    EXPECT(test_file_lines(log_path, "aborted while waiting for rank 1's step message"),
           "rank 0: the log does not say that the abort ended the wait for the step message");
  } else {
    sleep(2);
    EXPECT_OK(ncclCommAbort(comm));
  }
  EXPECT_OK(ncclMemFree(s));
  EXPECT_OK(ncclMemFree(r));
}

/* ncclCommInitAll where one device's init fails (its memory runs out): the call returns that error, and the
 * other rank, which waits for the failed one, stops waiting at once instead of after BRAID_TIMEOUT_S (the
 * 60 s this process is given would end first). */
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

/* With ncclMemAlloc's memory from cuMem (exported as a file descriptor), then from cuMemAlloc (legacy IPC).
 */
static void copy_engines(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_CE_MIN_BYTES", "1024", 1);
  setenv("BRAID_CE_REDUCE_MIN_BYTES", "1024", 1);
  setenv("BRAID_CE_PULL_MIN_BYTES", "1024", 1);
  setenv("BRAID_AR_SPLIT_BYTES", "1024", 1);
  setenv("BRAID_CE_CHUNK_BYTES", "1", 1);   /* the least there is: 64 KiB, five chunks of CE_N floats */
  setenv("NCCL_ALGO", "allreduce:ring", 1); /* not one-shot, which two ranks' all-reduce is up to 16 MiB */
  unsetenv("MOCK_CUDA_STUCK");
  run_with_logs(ce_rank, 60);
  run_with_logs(ce_capture_rank, 60);
  run_one_process(ce_local_proc, 60);
  setenv("MOCK_CUDA_NO_VMM", "1", 1);
  run_with_logs(ce_rank, 60);
  run_with_logs(ce_capture_rank, 60);
  run_one_process(ce_local_proc, 60);
  run_with_logs(ce_off_rank, 60);
  run_with_logs(ce_reduce_off_rank, 60);
  run_with_logs(ce_pull_off_rank, 60);
  run_with_logs(ce_pull_all_rank, 60);
  run_with_logs(mbox_rank, 60);
  run_with_logs(mbox_timeout_rank, 60);
  run_with_logs(mbox_abort_rank, 60);
  run_with_logs(mbox_off_rank, 60);
  setenv("BRAID_CE_CHUNK_BYTES", "65541", 1); /* not a multiple of 64 KiB: rounded up, chunks still whole */
  run_with_logs(ce_rank, 60);
  unsetenv("BRAID_CE_MIN_BYTES");
  unsetenv("BRAID_CE_REDUCE_MIN_BYTES");
  unsetenv("BRAID_CE_PULL_MIN_BYTES");
  unsetenv("BRAID_AR_SPLIT_BYTES");
  unsetenv("BRAID_CE_CHUNK_BYTES");
  unsetenv("NCCL_ALGO");
  unsetenv("MOCK_CUDA_NO_VMM");
}

/* Pushes below the copy engines' threshold (2 * CE_N floats: every case's transfers are below it), with
 * ncclMemAlloc's cuMem memory, then with cuMemAlloc's (legacy IPC). */
static void pushes(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  setenv("BRAID_CE_MIN_BYTES", "800024", 1);
  setenv("BRAID_CE_PUSH_MIN_BYTES", "1024", 1);
  setenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES", "1024", 1);
  setenv("BRAID_CE_REDUCE_MIN_BYTES", "0", 1);
  unsetenv("MOCK_CUDA_STUCK");
  run_with_logs(push_rank, 60);
  run_with_logs(push_off_rank, 60);
  run_with_logs(push_exchange_off_rank, 60);
  run_one_process(push_local_proc, 60);
  setenv("MOCK_CUDA_NO_VMM", "1", 1);
  run_with_logs(push_rank, 60);
  unsetenv("MOCK_CUDA_NO_VMM");
  unsetenv("BRAID_CE_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES");
  unsetenv("BRAID_CE_REDUCE_MIN_BYTES");
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  test_filter(argc - 1, argv + 1);
  TEST(channel_budget, 10);
  TEST(channels_agree, 60);
  TEST(knobs_agree, 60);
  TEST(dealt_marks, 60);
  TEST(protocol_marks, 60);
  TEST(pair_shapes, 60);
  TEST(full_queue_wait, 90);
  TEST(tuning_log, 60);
  TEST(launch_memo, 60);
  TEST(launch_overlap, 120);
  TEST(copy_engines, 90);
  TEST(pushes, 90);
  TEST(init_all_failure, 90);
  return test_summary();
}

#else

int main(void) {
  printf("built without CUDA's headers: no stand-in driver, nothing to test\n");
  return 0;
}

#endif
