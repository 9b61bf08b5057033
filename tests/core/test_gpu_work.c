/*
 * The GPU executor's work (core/gpu_work.c) against the tests' stand-in driver: which entry point a launch
 * takes, which transfers are LL, LL128 or Simple on how many channels, wide steps and channels both ranks
 * settle on, dealt transfers, and the pair kernel's shapes, checked by hand on chosen calls (the whole grid
 * is test_decisions'). Without CUDA's headers there is no stand-in driver and nothing to test.
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
  const int spread = param_int(P_BRAID_SPREAD) != 0, split = bulk;
  const dev_work_t *lw = (const dev_work_t *)s->last_work;
  EXPECT(lw->comm.split == 0, "an all-reduce out of place is not a split lane");
  /* its receives reduce: its sends fence per warp; an all-gather's bulk launch (4 MiB a rank) reduces
   * nothing and fences per wave */
  EXPECT(lw->comm.wave_fence == 0, "a 16 MiB all-reduce: waves %d", lw->comm.wave_fence);
  EXPECT_OK(ncclAllGather(buf, out, 1u << 20, ncclFloat, comm, NULL));
  EXPECT(last_entry(s) == simple && lw->comm.wave_fence == bulk,
         "an 8 MiB all-gather: entry point %c, waves %d", last_entry(s), lw->comm.wave_fence);
  EXPECT_OK(ncclAllReduce(buf, buf, 4u << 20, ncclFloat, ncclSum, comm, NULL));
  EXPECT(last_entry(s) == (split ? 'b' : 's') && last_batch(s) == 0 && lw->comm.split == split,
         "a 16 MiB all-reduce in place: entry point %c, batch %d, split %d", last_entry(s), last_batch(s),
         lw->comm.split);
  EXPECT(lw->comm.wave_fence == 0, "a 16 MiB all-reduce in place: waves %d", lw->comm.wave_fence);
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
  send_recv_group(buf, out, 1u << 18, 4, peer, comm);
  int n = 0;
  if (getenv("NCCL_PROTO") != NULL)
    EXPECT(last_entry(s) == simple && (!bulk || s->last_block == 256),
           "4 sends and receives of 1 MiB: entry point %c, %u threads", last_entry(s), s->last_block);
  else
    EXPECT(last_entry(s) == 's' && last_launch_ll128(s, 40, &n) && n == 8,
           "4 sends and receives of 1 MiB: LL128 through entry point %c (%d transfers)", last_entry(s), n);
  /* 8 MiB each, on the rings' 60 channels (BRAID_WIDE_STEPS=3): 2 pieces per channel, 8 per ring; 16 MiB:
   * 3 pieces, 12 per ring, more than the slots */
  send_recv_group(buf, out, 2u << 20, 4, peer, comm);
  EXPECT(last_entry(s) == simple && lw->nch == 60,
         "4 sends and receives of 8 MiB: entry point %c, %u channels", last_entry(s), (unsigned)lw->nch);
  send_recv_group(buf, out, 4u << 20, 4, peer, comm);
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
  const int ll_kernel = !simple, bulk = 1; /* small LL launches take the pair or LL entry point */
  void *buf = (void *)(uintptr_t)0x10000000, *out = (void *)(uintptr_t)0x20000000;
  int n;
  EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, ncclSum, comm, NULL));
  const char tiny = ll_kernel ? 'p' : simple && bulk ? 'b' : 's';
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
  EXPECT((s->last_pair ? ((const dev_pair_t *)s->last_work)->nch : ((const dev_work_t *)s->last_work)->nch) ==
             (simple ? 1 : 16),
         "16 KiB: blocks per lane");
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
    EXPECT((s->last_ll || s->last_pair) == ll_kernel &&
               s->last_block == (simple && bulk ? 256u : DEV_THREADS),
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
    EXPECT(last_entry(s) == 'p', "256 KiB + 4: entry point %c", last_entry(s));
  } else {
    EXPECT(last_launch_ll(s, !simple, 32, &n), "256 KiB + 4: LL on 32 channels, or Simple");
  }
  EXPECT_OK(ncclAllReduce(buf, out, 131072, ncclFloat, ncclSum, comm, NULL));
  if (ll128) {
    EXPECT(last_launch_ll128(s, 40, &n) && n == 2, "512 KiB: LL128 on 40 channels (%d transfers)", n);
  } else {
    EXPECT(last_launch_ll(s, !simple, 32, &n), "512 KiB: the largest LL transfer by default, on 32 channels");
    EXPECT((s->last_ll || s->last_pair) == ll_kernel &&
               s->last_block == (simple && bulk ? 256u : DEV_THREADS),
           "512 KiB: one LL piece per channel%s, %u threads", ll_kernel ? ", the pair entry point" : "",
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
    send_recv_group(buf, out, 2, calls, peer, comm);
    EXPECT(last_launch_ll(s, !simple, 1, &n) && n == 2 * calls, "%d sends and receives: %d transfers", calls,
           n);
    EXPECT(last_entry(s) == (calls == 4 ? (ll_kernel ? 'l' : tiny) : 'f'),
           "%d sends and receives: entry point %c", calls, last_entry(s));
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

/* Which entry point a launch takes, and which transfers the executor marks LL, as NCCL_PROTO says, and how
 * BRAID_SPREAD places a launch of one lane. */
static void protocol_marks(void) {
  static const char *const modes[] = {"defaults", "NCCL_PROTO=Simple", "NCCL_PROTO=Simple BRAID_SPREAD=0",
                                      "NCCL_PROTO=^LL128"};
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  unsetenv("NCCL_WORK_FIFO_BYTES");
  for (int mode = 0; mode < 4; mode++) {
    unsetenv("NCCL_PROTO");
    unsetenv("BRAID_SPREAD");
    if (mode == 1 || mode == 2) setenv("NCCL_PROTO", "Simple", 1);
    if (mode == 2) setenv("BRAID_SPREAD", "0", 1);
    if (mode == 3) setenv("NCCL_PROTO", "^LL128", 1);
    shared_t sh;
    EXPECT_OK(ncclGetUniqueId(&sh.id));
    EXPECT(run_ranks(2, 60, protocol_rank, &sh) == 0, "a rank failed (%s)", modes[mode]);
  }
  unsetenv("NCCL_PROTO");
  unsetenv("BRAID_SPREAD");
}

/* Channels per connection: the widest launch (2 * nranks - 1 lanes) fits ten elevenths of the GPU's SMs,
 * whatever BRAID_CHANNELS asks; 40 at most by default. */
static void channel_budget(void) {
  unsetenv("BRAID_CHANNELS");
  param_reload();
  EXPECT(tune_channels(2, 132) == 40, "2 ranks on 132 SMs: %d", tune_channels(2, 132));
  EXPECT(tune_channels(2, 114) == 34, "2 ranks on 114 SMs: %d", tune_channels(2, 114));
  EXPECT(tune_channels(8, 132) == 8, "8 ranks on 132 SMs: %d", tune_channels(8, 132));
  EXPECT(tune_channels(1, 132) == 40, "1 rank: %d", tune_channels(1, 132));
  EXPECT(tune_channels(64, 132) == 1, "64 ranks: %d", tune_channels(64, 132));
  setenv("BRAID_CHANNELS", "64", 1);
  param_reload();
  EXPECT(tune_channels(1, 132) == 64 && tune_channels(2, 132) == 40 && tune_channels(2, 58) == 17,
         "BRAID_CHANNELS=64 is held to the SMs");
  setenv("BRAID_CHANNELS", "8", 1);
  param_reload();
  EXPECT(tune_channels(2, 132) == 8);
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
  if (s->last_pair) return step == 0 ? 0 : 0xff; /* LL transfers: never dealt */
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

/* Which transfers are dealt (dev.h, "Dealt transfers"; BRAID_DEALT_MIN_BYTES=1 MiB here): on two ranks, a
 * ring collective's transfers with one peer, each alone in its lane, from 1 MiB, whatever either rank's
 * buffers do; not a local copy, a fused all-reduce's
 * chain, a one-shot step, a point-to-point step, an LL transfer or a smaller one; and a launch with one never
 * takes the bulk kernel. */
static void dealt_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  ncclComm_t comm = dealt_open(sh, rank, nranks, "1048576");
  mock_cuda_stats_t *s = mock_stats();
  char *b = (char *)(uintptr_t)0x10000000;
  const size_t mib = 1 << 18; /* floats in 1 MiB */
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
  unsetenv("BRAID_CE_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES");
  unsetenv("BRAID_DEALT_MIN_BYTES");
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
  dev_xfer_t xs[DEV_MAX_XFERS];
  EXPECT(last_xfers(s, xs) == 2 && xs[0].nch == 4, "rank %d: a 64 KiB LL transfer on %d channels of 4", rank,
         xs[0].nch);
  EXPECT(s->last_pair, "rank %d: 16 KiB per channel is one LL piece: the pair entry point", rank);
  w = (const dev_work_t *)s->last_work;
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
  unsetenv("BRAID_CE_PUSH_MIN_BYTES");
  unsetenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES");
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

/* Which launches take braid_kernel_pair, and with what: every LL launch of at most one plain send, one
 * receive and one local copy where nothing written is read by another transfer (an in-place all-reduce
 * fused), on two ranks; nothing else. An all-reduce, in place or out of place (joined), runs in one pass
 * per thread (fused 1) on braid_kernel_pair_ar, in LL128 braid_kernel_pair_ar128. */
static void pair_rank(int rank, int nranks, void *arg) {
  const shared_t *sh = arg;
  param_reload();
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  mock_cuda_stats_t *s = mock_stats();
  const char *in_place_ll = "SR-FA"; /* an all-reduce in one pass */
  char *buf = (char *)(uintptr_t)0x10000000, *out = (char *)(uintptr_t)0x20000000;
  const int peer = 1 - rank;
  EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "8-byte all-reduce");
  {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    EXPECT(p->send.send_peer == peer && p->send.src == buf && p->recv.recv_peer == peer &&
               p->recv.src == buf && p->recv.dst == out && (p->recv.flags & DEV_XF_REDUCE) && p->nch == 1,
           "rank %d: the all-reduce's send and combine", rank);
    EXPECT(s->last_block == 32 && s->last_pair_ar == 1,
           "rank %d: 8 bytes out of place: one warp (%u threads), LL's entry %d", rank, s->last_block,
           s->last_pair_ar);
  }
  const uint64_t first_seq = ((const dev_pair_t *)s->last_work)->seq;
  EXPECT_OK(ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "16 KiB all-reduce in place");
  {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    EXPECT(p->nch == 16 && p->send.nch == 16 && p->recv.nch == 16 && p->recv.dst == buf,
           "rank %d: 16 KiB in place: %d channels", rank, p->nch);
    EXPECT(p->fused == 1 && s->last_block == 128,
           "rank %d: 16 KiB in place: 1 KiB per channel, one pass per thread (fused %d, %u threads)", rank,
           p->fused, s->last_block);
  }
  EXPECT_OK(ncclAllReduce(buf, buf, 2, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "8-byte all-reduce in place");
  EXPECT(((const dev_pair_t *)s->last_work)->seq == first_seq + 2,
         "rank %d: the third call's launch carries its sequence number, the first's + 2", rank);
  EXPECT((((const dev_pair_t *)s->last_work)->fused == 1 && s->last_block == 32),
         "rank %d: 8 bytes in place: one warp, one pass (%u threads)", rank, s->last_block);
  EXPECT_OK(ncclAllReduce(buf, buf, 128, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "512-byte all-reduce in place");
  EXPECT((((const dev_pair_t *)s->last_work)->fused == 1 && s->last_block == 64),
         "rank %d: 512 bytes in place: a line per thread, one pass (%u threads)", rank, s->last_block);
  EXPECT_OK(ncclAllReduce(buf, buf + 4, 1024, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR("-", "an all-reduce whose output overlaps its input 4 bytes on");
  /* 128 KiB in place, the largest in LL (BRAID_LL128_MIN_BYTES): 4 KiB, 512 lines, per channel of 32 */
  EXPECT_OK(ncclAllReduce(buf, buf, 32768, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "128 KiB all-reduce in place");
  EXPECT((((const dev_pair_t *)s->last_work)->fused == 1 && s->last_block == DEV_THREADS &&
          ((const dev_pair_t *)s->last_work)->recv.proto == DEV_PROTO_LL && s->last_pair_ar == 1),
         "rank %d: 128 KiB in place: LL, a line per thread (%u threads), LL's entry (%d)", rank,
         s->last_block, s->last_pair_ar);
  EXPECT_OK(ncclAllReduce(buf, out, 131072, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "512 KiB all-reduce: one LL128 piece per channel");
  EXPECT(
      (((const dev_pair_t *)s->last_work)->nch == 40 && s->last_block == DEV_THREADS && s->last_pair_ar == 2),
      "rank %d: 512 KiB out of place: 13120 bytes on each of 40 channels (%d), %u threads, LL128's entry "
      "(%d)",
      rank, ((const dev_pair_t *)s->last_work)->nch, s->last_block, s->last_pair_ar);
  /* in LL128 the in-place all-reduce takes braid_kernel_pair_ar128 */
  EXPECT_OK(ncclAllReduce(buf, buf, 131072, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "512 KiB all-reduce in place");
  EXPECT((((const dev_pair_t *)s->last_work)->fused == 1 && s->last_block == DEV_THREADS &&
          s->last_pair_ar == 2),
         "rank %d: 512 KiB in place: one pass per thread (%u threads), LL128's entry (%d)", rank,
         s->last_block, s->last_pair_ar);
  /* LL128 (512 KiB + 4 to 1.5 MiB): the pair kernel, in place fused 1 (never a half block per side) */
  EXPECT_OK(ncclAllReduce(buf, out, 131073, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "512 KiB + 4: LL128");
  {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    EXPECT(p->nch == 40 && p->send.proto == DEV_PROTO_LL128 && p->recv.proto == DEV_PROTO_LL128 &&
               p->send.nch == 40 && p->recv.nch == 40 && s->last_block == DEV_THREADS,
           "rank %d: 512 KiB + 4: LL128 on 40 channels, %u threads", rank, s->last_block);
  }
  EXPECT_OK(ncclAllReduce(buf, buf, 262144, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR(in_place_ll, "1 MiB all-reduce in place");
  EXPECT(((const dev_pair_t *)s->last_work)->fused == 1, "rank %d: 1 MiB in place: fused 1", rank);
  EXPECT_OK(ncclAllReduce(buf, out, 393217, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR("-", "1.5 MiB + 4: Simple");
  ncclRedOp_t premul;
  float two = 2.0f;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&premul, &two, ncclFloat, ncclScalarHostImmediate, comm));
  EXPECT_OK(ncclAllReduce(buf, out, 2, ncclFloat, premul, comm, NULL));
  EXPECT_PAIR("-", "a PreMulSum all-reduce: its send scales");
  EXPECT_OK(ncclRedOpDestroy(premul, comm));
  EXPECT_OK(ncclAllGather(buf, out, 16, ncclFloat, comm, NULL));
  EXPECT_PAIR("SRC", "all-gather out of place");
  EXPECT_OK(ncclAllGather(out + 64 * rank, out, 16, ncclFloat, comm, NULL));
  EXPECT_PAIR("SR-", "all-gather in place");
  EXPECT_OK(ncclReduceScatter(buf, out, 16, ncclFloat, ncclSum, comm, NULL));
  EXPECT_PAIR("SR-", "reduce-scatter");
  EXPECT_OK(ncclBroadcast(buf, out, 16, ncclFloat, 0, comm, NULL));
  EXPECT_PAIR(rank == 0 ? "S-C" : "-R-", "broadcast out of place");
  EXPECT_OK(ncclReduce(buf, out, 16, ncclFloat, ncclSum, 1, comm, NULL));
  EXPECT_PAIR(rank == 0 ? "S--" : "-R-", "reduce to rank 1");
  EXPECT_OK(ncclGather(buf, out, 16, ncclFloat, 0, comm, NULL));
  EXPECT_PAIR(rank == 0 ? "-RC" : "S--", "gather to rank 0 out of place");
  EXPECT_OK(ncclAlltoAll(buf, out, 16, ncclFloat, comm, NULL));
  EXPECT_PAIR("SRC", "all-to-all");
  /* in LL128's band, the copy of this rank's own block is an LL copy on as many channels, beside the LL128
   * send and receive on the pair kernel */
  EXPECT_OK(ncclAllGather(buf, out, 196608, ncclFloat, comm, NULL));
  EXPECT_PAIR("SRC", "768 KiB all-gather out of place");
  {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    EXPECT(p->send.proto == DEV_PROTO_LL128 && p->recv.proto == DEV_PROTO_LL128 &&
               p->copy.proto == DEV_PROTO_LL && (p->copy.flags & DEV_XF_LL) && p->copy.nch == 40 &&
               p->copy.bytes == 786432 && p->nch == 40,
           "rank %d: 768 KiB all-gather: LL128 send and receive, an LL copy on 40 channels", rank);
  }
  EXPECT_OK(ncclBroadcast(buf, out, 393216, ncclFloat, 0, comm, NULL));
  EXPECT_PAIR(rank == 0 ? "S-C" : "-R-", "1.5 MiB broadcast out of place");
  EXPECT_OK(ncclAlltoAll(buf, out, 262144, ncclFloat, comm, NULL));
  EXPECT_PAIR("SRC", "2 MiB all-to-all (1 MiB a block)");
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
  EXPECT_PAIR("SR-", "a send and a receive of different sizes");
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
  shared_t sh;
  EXPECT_OK(ncclGetUniqueId(&sh.id));
  EXPECT(run_ranks(2, 60, pair_rank, &sh) == 0, "a rank failed");
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  test_filter(argc - 1, argv + 1);
  /* the rank processes share the stand-in's device 0: keep each rank's own kernels (the shared-GPU path,
   * where rank 0 moves all, is test_shared_path's) */
  setenv("BRAID_SHARED_GPU_LEADER", "0", 1);
  TEST(channel_budget, 10);
  TEST(channels_agree, 60);
  TEST(dealt_marks, 60);
  TEST(protocol_marks, 60);
  TEST(pair_shapes, 60);
  return test_summary();
}

#else

int main(void) {
  printf("built without CUDA's headers: no stand-in driver, nothing to test\n");
  return 0;
}

#endif
