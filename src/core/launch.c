/*
 * The GPU executor (see launch.h).
 *
 * A plan's steps become the steps of a dev_work_t. Within a step, transfers that share a connection (the same
 * send peer or the same receive peer) must keep their list order, so they form one lane; local copies form
 * one lane of their own, and transfers the planner marks XF_SEQ (a one-shot reduction, whose combines read
 * what the one before stored) all join one lane. A Simple transfer is split over ceil(bytes / ch_bytes)
 * channels, an LL one over ceil(bytes / ll_part), at most nch (GX_LL_NCH for LL), an LL128 one (two ranks)
 * over nch (at most DEV_LL_CHANNELS): a function of its
 * size and of knobs that are the same on every rank, so both ends of a connection split it the same way
 * (DESIGN.md, principle 2). Lanes run concurrently, each on as many blocks as the launch's widest transfer
 * has channels (dev_work_t.nch): an 8-byte all-reduce runs on a block or two, not on nch per lane.
 *
 * Launches of one communicator are ordered even when the calls come on different streams: each launch waits
 * for the event recorded after the previous one. Inside CUDA graph capture the ordering is the graph's.
 *
 * Work storage. A launch's transfers travel in the kernel parameters when they fit (DEV_MAX_XFERS); a larger
 * launch spills its list to device memory. Eager launches take an entry of the communicator's work queue
 * (workq.h): a header in host-mapped memory the kernel writes when done, and the spill, staged in page-locked
 * memory and copied in stream order to the queue's device copy. Captured launches take nothing from the
 * queue: what they need (the spill, in-place all-to-all scratch) is owned by a graph token, tied to the
 * graph's life with a CUDA user object; the token is released when the graph, its executable copies and
 * their launches are gone, and its memory is freed by the next call of this module.
 *
 * Communicator and graph lifetimes. While a graph holds a token of the communicator, gx_graphs reports it,
 * and ncclCommDestroy / ncclCommFinalize refuse (comm.c). ncclCommAbort retires the executor instead
 * (gx_retire): the kernels see the abort flag (a replay after the abort leaves at once), and everything a
 * replay could reach (the kernel view, the flags, the connections' rings) is kept until the last graph is
 * gone, then freed by the next call of this module (gx_sweep).
 */
#include "launch.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "base/watchdog.h"
#include "core/workq.h"
#include "device/dev.h"
#include "gpu/gpu.h"

/* Host-mapped words the kernels and the host share. */
typedef struct {
  volatile int32_t abort; /* host writes 1 on abort; kernels poll it */
  int32_t pad;
  dev_error_t error; /* kernels write the first error; the host reads it */
} flags_t;

/* Storage a captured launch needs for the graph's life; one per captured gx_launch. */
typedef struct token {
  struct token *next;
  gx_t *gx;
  _Atomic int released; /* set by the graph's release callback (a driver thread) */
  struct tbuf *bufs;    /* what it owns: spilled transfer lists, in-place all-to-all staging */
} token_t;

/* The last eager launch of one step on the LL or pair entry point (memo_launch). */
typedef struct {
  int valid;
  int count;                      /* the step's transfers */
  int p2p;                        /* wide_p2p of the step (lanes) */
  dev_xfer_t xf[DEV_SMALL_XFERS]; /* as fill_xfer made them, before lanes */
  gpu_func_t *f;
  unsigned grid, threads;
  int pair; /* the parameters are `pair`, else the head of `work` (dev_work_small_t) */
  dev_pair_t pair_params;
  dev_work_small_t work;
} memo_t;

/* The calls of the last eager launch that the memo made or held (gx_relaunch). */
#define GX_RECALL_TASKS 4
typedef struct {
  int valid;
  int ntasks;
  task_t tasks[GX_RECALL_TASKS];
} recall_t;

struct gx {
  int dev, rank, nranks;
  int nch;   /* channels a transfer takes at most: what the widest step's lanes fit (gx_channels) */
  int rings; /* rings per connection (gx_rings): the channels of one-way collectives' transfers (wide_step) */
  int wide;  /* BRAID_WIDE_STEPS: which collectives' steps take `rings` channels (wide_step) */
  unsigned grid_max; /* blocks a launch takes at most: the widest step's lanes of nch channels */
  const char *name;
  alloc_acct_t *acct;
  gpu_func_t *func;       /* braid_kernel */
  gpu_func_t *func_small; /* braid_kernel_small, for launches of at most DEV_SMALL_XFERS transfers */
  gpu_func_t *func_ll;    /* braid_kernel_ll, for small launches of LL transfers only (ll_only) */
  gpu_func_t *func_bulk;  /* braid_kernel_bulk, for one-slice Simple launches over p2p (bulk_only) */
  gpu_func_t *func_pair;  /* braid_kernel_pair, for LL launches of one send, receive and copy (pair_shape) */
  gpu_func_t
      *func_pair_ar; /* braid_kernel_pair_ar, for such a launch of an all-reduce run fused (pair_func) */
  gpu_func_t *func_pair_ar128; /* braid_kernel_pair_ar128, the same in LL128 */
  gpu_func_t *func_wait;       /* braid_kernel_wait, the copy-engine steps' waits (ce_exec_t) */
  gpu_func_t *func_combine;    /* braid_kernel_combine, their combines (ce_exec_t) */
  gpu_func_t *func_push;       /* braid_kernel_push, the pushed steps (ce_exec_t) */
  unsigned push_blocks;        /* its grid: a block per SM */
  unsigned combine_blocks;     /* BRAID_CE_COMBINE_BLOCKS: the combine's grid */
  unsigned pull_blocks;        /* BRAID_CE_PULL_BLOCKS: its grid when it reads the peer's input */
  uint32_t pull_tile;          /* BRAID_CE_PULL_TILE: dev_combine_t.tile then */
  int ll_kernel;               /* BRAID_LL_KERNEL: such launches take func_ll */
  int bulk_kernel;             /* BRAID_BULK_KERNEL: such launches take func_bulk */
  int pair_kernel;             /* BRAID_PAIR_KERNEL: such launches take func_pair */
  int pair_ar_kernel;          /* BRAID_PAIR_AR_KERNEL: an all-reduce of them run fused takes func_pair_ar* */
  uint64_t pair_halves;        /* BRAID_PAIR_HALVES_BYTES: in-place parts up to this size run on two halves */
  int64_t pair_join;           /* BRAID_PAIR_JOIN_BYTES: out-of-place all-reduce parts from this size run as
                                  in place do, one block per channel (-1: never) */
  int overlap;               /* BRAID_LAUNCH_PDL, as far as the device and driver have it: which launches may
                              * overlap the stream's previous kernel (1: eager ones, 2: captured ones too;
                              * launch_overlap) */
  int split_lane;            /* BRAID_SPLIT_LANE: an in-place all-reduce's lane may run split (split_pair) */
  int wave_fence;            /* BRAID_WAVE_FENCE: which bulk launches send in waves (wave_fence) */
  int32_t batch_pieces;      /* BRAID_BATCH_PIECES (0: no cap), or -1: launch_batch decides */
  uint64_t dealt_min;        /* BRAID_DEALT_MIN_BYTES: the smallest dealt transfer (dealt_mark; 0: none) */
  uint64_t dealt_max;        /* BRAID_DEALT_MAX_BYTES: the largest (0: no bound) */
  int one_way;               /* the launch being built has one-way steps only (one_way_kind) */
  ce_t *ce;                  /* moves the steps marked for the copy engines (gx_set_ce); owned */
  int spread;                /* lanes of the widest step (BRAID_SPREAD): narrower launches spread their blocks
                              * over a grid of that many lanes (dev_comm_t.interleave); 0: never */
  uint64_t ll_max;           /* transfers of at most this many bytes are marked LL (0: none) */
  uint64_t ll_max_one_way;   /* the same in one-way collectives (one_way_kind) */
  uint64_t ll_part;          /* an LL transfer takes a channel per this many bytes (BRAID_LL_CHANNEL_BYTES) */
  int ll_nch;                /* and at most this many: GX_LL_NCH, or fewer when nch is */
  uint64_t ll128_max;        /* larger transfers of at most this many bytes with a peer are LL128 (0: none) */
  int ll128_nch;             /* the channels of an LL128 transfer: nch, at most DEV_LL_CHANNELS */
  uint64_t ch_bytes;         /* a Simple transfer takes a channel per this many bytes (BRAID_CHANNEL_BYTES) */
  uint8_t *peer_caps;        /* [nranks] PEER_* bits: what the connections to and from each peer have */
  gpu_mem_t *mem;            /* the ring tables, counters and barrier dcomm points at */
  dev_comm_t dcomm;          /* the kernels' view, passed by value in every launch's work */
  flags_t *flags;            /* host address of the host-mapped flags */
  gpu_event_t *done;         /* recorded after each eager launch */
  gpu_event_t *capture_join; /* joins a captured group's streams */
  int launched;              /* done was recorded at least once */
  cudaStream_t last;         /* stream of the last eager launch */
  gpu_event_t **joins;       /* one per extra stream of a group */
  int njoins;
  gpu_mem_t *scratch; /* in-place all-to-all staging of eager launches */
  int reported;       /* the kernel error was logged */
  dev_work_t work;    /* the launch being built */
  dev_pair_t pair;    /* its parameters when it takes braid_kernel_pair */
  dev_xfer_t *xf;     /* its transfer list while it is built (copied to work.xfers or spilled) */
  uint32_t xf_cap;
  memo_t memo;         /* the last eager LL or pair launch of one step (memo_launch) */
  int memo_staged;     /* the gx_launch in progress staged its one step in the memo (memo_launch) for flush */
  int memo_used;       /* the gx_launch in progress launched from the memo or filled it */
  recall_t recall;     /* the calls the memo's launch serves: the same calls again take gx_relaunch */
  uint64_t relaunches; /* launches gx_relaunch made (gx_relaunches) */
  /* the work queue: entries in host-mapped memory (headers, staged spills) and its device copy (spills) */
  workq_t wq;
  char *q_host, *q_host_dev;
  gpu_mem_t *q_dev;
  uint64_t group_first_tag; /* the first queue entry of the gx_launch in progress */
  /* captured launches */
  token_t *tokens;  /* every token made, released or not */
  token_t *pending; /* the token of the latest capture, and that capture's id */
  uint64_t pending_capture;
  _Atomic int graphs;  /* tokens held by graphs and not yet released */
  _Atomic int unswept; /* tokens released and not yet freed: tokens_sweep walks the list only then */
  void *retire_arg;    /* what gx_retire keeps alive with the executor */
  void (*retire_free)(void *);
  gx_t *retired_next;
};

/* gx_t.peer_caps' bits: the connection to (from) the peer has LL rings; its Simple rings have chunk marks
 * (dev.h). A transport has all its LL rings or none, and marks on all its rings or none. */
enum { PEER_LL_TO = 1, PEER_LL_FROM = 2, PEER_MARKS_TO = 4, PEER_MARKS_FROM = 8 };

/* Channels per connection unless BRAID_CHANNELS says otherwise (fewer when many ranks share the SMs). */
enum { GX_CHANNELS_DEFAULT = 40 };

/* Ranks of one GPU communicator at most (lane assignment works on the stack). */
enum { GX_MAX_RANKS = 1024 };
/* Seconds past BRAID_TIMEOUT_S after which a launch that has not finished means the GPU is stuck. */
enum { GX_STUCK_MARGIN_S = 5 };

/* The planner's transfer flags travel unchanged in dev_xfer_t.flags. */
_Static_assert((int)XF_REDUCE == (int)DEV_XF_REDUCE && (int)XF_PREPARE == (int)DEV_XF_PREPARE &&
                   (int)XF_LAST == (int)DEV_XF_LAST && (int)XF_SEQ == (int)DEV_XF_SEQ &&
                   (int)XF_PREPARED == (int)DEV_XF_PREPARED,
               "transfer flags differ between the planner and the kernel");
/* The executor's LL mark travels with them. */
_Static_assert((int)DEV_XF_LL > (int)XF_PREPARED, "the LL mark takes a bit the planner does not use");
/* braid_kernel_small reads the head of the same dev_work_t. */
_Static_assert(offsetof(dev_work_t, xfers) == offsetof(dev_work_small_t, xfers),
               "the small entry point's work is a prefix of the full one");
/* An LL transfer runs in one slice: each channel's part within half of its LL ring, and of a Simple ring for
 * a side without LL (gx_init bounds ll_max and ll_part to keep it so). */
enum { GX_LL_PART_MAX = DEV_LL_SLOTS / 2 * DEV_LL_PIECE };
/* LL transfers take at most 32 of the DEV_LL_CHANNELS LL rings: 40 blocks moved them no faster, and in place
 * slower, on two H200s (docs/perf-notes.md, 73). */
enum { GX_LL_NCH = 32 };
_Static_assert(GX_LL_NCH <= DEV_LL_CHANNELS, "LL transfers have an LL ring per channel");
_Static_assert(PLAN_LL_MAX <= (uint64_t)GX_LL_NCH * GX_LL_PART_MAX &&
                   GX_LL_PART_MAX <= DEV_SLOTS / 2 * DEV_SLOT_BYTES,
               "an LL transfer's part fits half a ring");
/* The kernels run an LL transfer, LL128 included, in one slice (lane_run). */
_Static_assert(DEV_LL128_PART_MAX <= DEV_SLICE_BYTES, "an LL128 transfer's part fits a slice");
/* An all-reduce's or a reduce-scatter's step on two ranks is wide (wide_step) where its largest transfer
 * moves at least this many bytes: on two H200s 60 channels instead of 40 took an all-reduce of 16 MiB from
 * 67.3 to 61.1 us and of 32 MiB from 131.9 to 117.5 (CUDA graphs), a reduce-scatter of 32 MiB from 70.6 to
 * 63.1, and transfers of 8 MiB 1-7% faster; but transfers of 4 MiB 4-6% slower (docs/perf-notes.md, 79).
 * Send/receive, all-to-all and all-gather transfers take the same bound (wide_p2p): a send/receive of 16 MiB
 * went from 63.6-64.8 to 61.8 us, an all-to-all of 32 MiB from 65.0-65.5 to 63.8-64.4 (perf-notes, 85). */
#define GX_WIDE_MIN_MIB 8
#define GX_WIDE_MIN     ((uint64_t)GX_WIDE_MIN_MIB << 20)
/* A one-shot reduction's lane receives from every peer and, in place, sends to every peer. */
_Static_assert(2 * (PLAN_ONESHOT_MAX_RANKS - 1) <= DEV_LANE_RINGS,
               "one-shot lanes exceed the kernel's rings");

/* The most lanes a step can have: a send to every peer, a receive from every peer and one local. */
static int lanes_max(int nranks) {
  return nranks > 1 ? 2 * nranks - 1 : 1;
}

/* The largest LL transfer where LL128 (ll128_max, set) takes the transfers above `ll128_min`: gx->ll_max as
 * the LL knobs and rings allow it, held to ll128_min. */
static uint64_t ll_below(const gx_t *gx, uint64_t ll128_min) {
  return gx->ll128_max > ll128_min && ll128_min < gx->ll_max ? ll128_min : gx->ll_max;
}

/* The largest LL128 transfer (dev.h): the knob's, held to half the LL128 slots on each of ll128_nch channels
 * (dev_ll128_fits), on a communicator of two ranks whose connections both ways have LL rings (both ranks see
 * the same two connections, so they agree); 0 elsewhere. Run after upload (peer_caps). */
static uint64_t ll128_max(const gx_t *gx) {
  const int peer = 1 - gx->rank;
  if (gx->nranks != 2 || (gx->peer_caps[peer] & (PEER_LL_TO | PEER_LL_FROM)) != (PEER_LL_TO | PEER_LL_FROM))
    return 0;
  const uint64_t cap = (uint64_t)gx->ll128_nch * DEV_LL128_PART_MAX, want = plan_tuning()->ll128_max;
  return want < cap ? want : cap;
}

int gx_channels(int nranks, int sms) {
  int lanes = lanes_max(nranks);
  /* a launch's blocks wait for each other, so they must all run at once, one per SM (the kernel takes a
   * whole SM's registers): the widest launch stays within ten elevenths of the SMs (120 of 132) */
  int fit = sms * 10 / 11 / lanes;
  if (fit < 1) fit = 1;
  if (fit > DEV_MAX_CHANNELS) fit = DEV_MAX_CHANNELS;
  int64_t want = param_int(P_BRAID_CHANNELS);
  if (want < 1) return fit < GX_CHANNELS_DEFAULT ? fit : GX_CHANNELS_DEFAULT;
  if (want > fit)
    INFO(LOG_INIT | LOG_TUNING, "BRAID_CHANNELS=%lld: %d ranks on %d SMs take at most %d channels",
         (long long)want, nranks, sms, fit);
  return want > fit ? fit : (int)want;
}

/* On two ranks a one-way collective's step (broadcast, reduce, gather, scatter: a transfer and at most a
 * local copy) has two lanes, not the three of the widest step, so its transfers take half as many channels
 * again in the same grid: on two H100s, 60 channels instead of 40 made reduce at 16 MiB 60.5 -> 57.0 us and
 * at 1 GiB 2,952-2,996 -> 2,936 us, broadcast in place at 16 MiB 60.0 -> 56.6 us (docs/perf-notes.md, 55).
 * A function of the ranks and of the channels every rank settled on, so both ends of a connection agree. */
int gx_rings(int nranks, int nch) {
  if (nranks != 2) return nch;
  int rings = nch * 3 / 2;
  return rings > DEV_MAX_CHANNELS ? DEV_MAX_CHANNELS : rings;
}

/* Byte offsets of the parts of the device allocation (dev_comm_t's tables). */
typedef struct {
  size_t send, recv, sent, recvd, heads, ll_send, ll_recv, ll_sent, ll_recvd, ll_heads, barrier, guards,
      total;
} layout_t;

static layout_t layout(int nranks, int nch) {
  layout_t l;
  size_t rings = (size_t)nranks * nch, ll_rings = (size_t)nranks * DEV_LL_CHANNELS;
  l.send = 0;
  l.recv = l.send + rings * sizeof(dev_ring_t);
  l.sent = l.recv + rings * sizeof(dev_ring_t);
  l.recvd = l.sent + rings * sizeof(uint64_t);
  l.heads = l.recvd + rings * sizeof(uint64_t);
  l.ll_send = l.heads + rings * sizeof(uint64_t);
  l.ll_recv = l.ll_send + ll_rings * sizeof(dev_ring_t);
  l.ll_sent = l.ll_recv + ll_rings * sizeof(dev_ring_t);
  l.ll_recvd = l.ll_sent + ll_rings * sizeof(uint64_t);
  l.ll_heads = l.ll_recvd + ll_rings * sizeof(uint64_t);
  l.barrier = l.ll_heads + ll_rings * sizeof(uint64_t);
  l.guards = l.barrier + (2 + DEV_DEALT_COUNTERS) * sizeof(uint32_t);
  l.total = l.guards + (nranks == 2 ? rings * DEV_MARKS_BYTES : 0); /* split lanes take two ranks (flush) */
  return l;
}

/* BRAID_BATCH_PIECES where it is set, held to what a ring has (DEV_SLOTS; 0 and the ring's size both mean no
 * cap); -1 where it is not: each launch then takes launch_batch's. */
static int32_t batch_pieces(void) {
  if (!param_is_set(P_BRAID_BATCH_PIECES)) return -1;
  int64_t v = param_int(P_BRAID_BATCH_PIECES);
  return v <= 0 || v >= DEV_SLOTS ? 0 : (int32_t)v;
}

/* The kernels' view of the communicator: its tables written once to device memory, the dev_comm_t that
 * points at them kept for the launches. */
static ncclResult_t upload(gx_t *gx, links_t *links) {
  layout_t l = layout(gx->nranks, gx->rings);
  char *base = gpu_mem_ptr(gx->mem);
  char *img = calloc(1, l.total);
  if (img == NULL) return log_err(ncclSystemError, "%s: out of host memory (%zu bytes)", gx->name, l.total);
  dev_ring_t *send = (dev_ring_t *)(img + l.send), *recv = (dev_ring_t *)(img + l.recv);
  dev_ring_t *ll_send = (dev_ring_t *)(img + l.ll_send), *ll_recv = (dev_ring_t *)(img + l.ll_recv);
  for (int p = 0; p < gx->nranks; p++) {
    tp_conn_t *s = links->send[p], *r = links->recv[p];
    for (int c = 0; c < DEV_LL_CHANNELS; c++) {
      if (s != NULL) ll_send[p * DEV_LL_CHANNELS + c] = s->ll[c];
      if (r != NULL) ll_recv[p * DEV_LL_CHANNELS + c] = r->ll[c];
    }
    for (int c = 0; c < gx->rings; c++) {
      if (s != NULL && c < s->nrings) send[p * gx->rings + c] = s->rings[c];
      if (r != NULL && c < r->nrings) recv[p * gx->rings + c] = r->rings[c];
    }
    gx->peer_caps[p] = (uint8_t)((ll_send[p * DEV_LL_CHANNELS].data != NULL ? PEER_LL_TO : 0) |
                                 (ll_recv[p * DEV_LL_CHANNELS].data != NULL ? PEER_LL_FROM : 0) |
                                 (send[p * gx->rings].marks != NULL ? PEER_MARKS_TO : 0) |
                                 (recv[p * gx->rings].marks != NULL ? PEER_MARKS_FROM : 0));
  }
  void *flags_dev = NULL;
  ncclResult_t res = gpu_host_alloc(sizeof(flags_t), (void **)&gx->flags, &flags_dev);
  if (res == ncclSuccess) {
    flags_t *fd = flags_dev;
    gx->dcomm = (dev_comm_t){.rank = gx->rank,
                             .nranks = gx->nranks,
                             .nch_max = gx->rings,
                             .send = (dev_ring_t *)(base + l.send),
                             .recv = (dev_ring_t *)(base + l.recv),
                             .sent = (uint64_t *)(base + l.sent),
                             .recvd = (uint64_t *)(base + l.recvd),
                             .heads = (uint64_t *)(base + l.heads),
                             .ll_send = (dev_ring_t *)(base + l.ll_send),
                             .ll_recv = (dev_ring_t *)(base + l.ll_recv),
                             .ll_sent = (uint64_t *)(base + l.ll_sent),
                             .ll_recvd = (uint64_t *)(base + l.ll_recvd),
                             .ll_heads = (uint64_t *)(base + l.ll_heads),
                             .barrier = (uint32_t *)(base + l.barrier),
                             .guards = l.total > l.guards ? (uint64_t *)(base + l.guards) : NULL,
                             .abort_flag = &fd->abort,
                             .error = &fd->error,
                             .timeout_ns = (uint64_t)param_int(P_BRAID_TIMEOUT_S) * 1000000000ull};
    res = gpu_copy_to_device(base, img, l.total);
  }
  free(img);
  return res;
}

/* The work queue: its accounting, its entries in host-mapped memory, and their device copy for spills. */
static ncclResult_t queue_init(gx_t *gx) {
  uint64_t cap = wq_size(param_int(P_NCCL_WORK_FIFO_BYTES), param_is_set(P_NCCL_WORK_FIFO_BYTES),
                         param_int(P_NCCL_WORK_FIFO_DEPTH), param_is_set(P_NCCL_WORK_FIFO_DEPTH));
  CHECK(wq_init(&gx->wq, cap));
  CHECK(gpu_host_alloc(cap, (void **)&gx->q_host, (void **)&gx->q_host_dev));
  mem_charge(gx->acct, cap, 0, "work queue (page-locked)");
  CHECK(gpu_dev_alloc(gx->dev, cap, &gx->q_dev));
  mem_charge(gx->acct, gpu_mem_size(gx->q_dev), 1, "work queue (device copy)");
  return ncclSuccess;
}

/* How many channels a step takes at most and which steps take the rings' (wide_step), in words for the init
 * log. */
static const char *wide_what(const gx_t *gx, char *buf, size_t size) {
  if (gx->rings <= gx->nch || gx->wide < 1)
    snprintf(buf, size, "up to %d channels for every step", gx->nch);
  else if (gx->wide < 2)
    snprintf(buf, size, "up to %d channels for broadcast, reduce, gather and scatter steps", gx->rings);
  else
    snprintf(buf, size,
             "up to %d channels for broadcast, reduce, gather and scatter steps, all-reduce and "
             "reduce-scatter steps with a transfer of at least %d MiB%s",
             gx->rings, GX_WIDE_MIN_MIB,
             gx->wide >= 3 && gx->nranks == 2
                 ? ", and send/receive, all-to-all and all-gather transfers of that size"
                 : "");
  return buf;
}

/* The grid, in lanes, that launches narrower than it spread their blocks over: the most lanes a step can
 * have (gx_channels sized the channels so that this many lanes of them fit the GPU), at most BRAID_SPREAD
 * when that is 2 or more; 0 (no spreading) when BRAID_SPREAD is 0 or a step has one lane at most. */
static int spread_lanes(int nranks) {
  int lanes = lanes_max(nranks);
  int64_t want = param_int(P_BRAID_SPREAD);
  if (want <= 0) return 0;
  if (want >= 2 && want < lanes) lanes = (int)want;
  return lanes >= 2 ? lanes : 0;
}

ncclResult_t gx_init(int dev, int rank, int nranks, int nch, links_t *links, alloc_acct_t *acct,
                     const char *name, gx_t **gx_p) {
  ncclResult_t res;
  gx_t *gx;
  if (nranks > GX_MAX_RANKS)
    return log_err(ncclInvalidUsage, "%s: %d ranks; the GPU executor takes at most %d", name, nranks,
                   GX_MAX_RANKS);
  gx_sweep();
  CHECK(MEM_CALLOC(acct, gx, 1, "GPU executor"));
  *gx = (gx_t){.dev = dev,
               .rank = rank,
               .nranks = nranks,
               .nch = nch,
               .rings = gx_rings(nranks, nch),
               .grid_max = (unsigned)(lanes_max(nranks) * nch),
               .name = name,
               .acct = acct};
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_NAME, &gx->func), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_SMALL_NAME, &gx->func_small), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_LL_NAME, &gx->func_ll), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_BULK_NAME, &gx->func_bulk), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_PAIR_NAME, &gx->func_pair), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_PAIR_AR_NAME, &gx->func_pair_ar), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_PAIR_AR128_NAME, &gx->func_pair_ar128), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_WAIT_NAME, &gx->func_wait), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_COMBINE_NAME, &gx->func_combine), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_PUSH_NAME, &gx->func_push), res, fail);
  int sms = 0, can_eager = 0, can_captured = 0;
  CHECK_GOTO(gpu_device_sms(dev, &sms), res, fail);
  CHECK_GOTO(gpu_overlap_support(dev, &can_eager, &can_captured), res, fail);
  const int64_t overlap = param_int(P_BRAID_LAUNCH_PDL);
  gx->overlap = !can_eager || overlap < 0 ? 0 : overlap > 2 ? 2 : (int)overlap;
  if (gx->overlap == 2 && !can_captured) gx->overlap = 1;
  gx->push_blocks = sms < 1 ? 1 : sms > 1024 ? 1024 : (unsigned)sms;
  int64_t blocks = param_int(P_BRAID_CE_COMBINE_BLOCKS);
  gx->combine_blocks = blocks < 1 ? 1 : blocks > 1024 ? 1024 : (unsigned)blocks;
  blocks = param_int(P_BRAID_CE_PULL_BLOCKS);
  if (blocks < 1) blocks = sms;
  gx->pull_blocks = blocks < 1 ? 1 : blocks > 1024 ? 1024 : (unsigned)blocks;
  int64_t tile = param_int(P_BRAID_CE_PULL_TILE);
  gx->pull_tile = tile < 16 ? 0 : tile > (1 << 30) ? 1u << 30 : (uint32_t)(tile / 16 * 16);
  gx->ll_kernel = param_int(P_BRAID_LL_KERNEL) != 0;
  gx->bulk_kernel = param_int(P_BRAID_BULK_KERNEL) != 0;
  gx->pair_kernel = param_int(P_BRAID_PAIR_KERNEL) != 0;
  gx->pair_ar_kernel = param_int(P_BRAID_PAIR_AR_KERNEL) != 0;
  gx->pair_halves = (uint64_t)param_int(P_BRAID_PAIR_HALVES_BYTES);
  gx->pair_join = param_int(P_BRAID_PAIR_JOIN_BYTES);
  gx->split_lane = param_int(P_BRAID_SPLIT_LANE) != 0;
  gx->wave_fence = (int)param_int(P_BRAID_WAVE_FENCE);
  gx->wide = (int)param_int(P_BRAID_WIDE_STEPS);
  gx->batch_pieces = batch_pieces();
  const int64_t dealt_min = param_int(P_BRAID_DEALT_MIN_BYTES),
                dealt_max = param_int(P_BRAID_DEALT_MAX_BYTES);
  gx->dealt_min = dealt_min > 0 ? (uint64_t)dealt_min : 0;
  gx->dealt_max = dealt_max > 0 ? (uint64_t)dealt_max : 0;
  gx->spread = spread_lanes(nranks);
  gx->ll_nch = nch < GX_LL_NCH ? nch : GX_LL_NCH;
  gx->ll128_nch = nch < DEV_LL_CHANNELS ? nch : DEV_LL_CHANNELS;
  /* every channel's part within half a ring: at most GX_LL_PART_MAX per channel, on at most ll_nch */
  uint64_t ll_cap = (uint64_t)gx->ll_nch * GX_LL_PART_MAX;
  gx->ll_max = plan_tuning()->ll_max < ll_cap ? plan_tuning()->ll_max : ll_cap;
  gx->ll_part = plan_tuning()->ll_part < GX_LL_PART_MAX ? plan_tuning()->ll_part : GX_LL_PART_MAX;
  gx->ch_bytes = plan_tuning()->ch_bytes;
  CHECK_GOTO(MEM_CALLOC(acct, gx->peer_caps, (size_t)nranks, "GPU executor: rings per peer"), res, fail);
  CHECK_GOTO(gpu_dev_alloc(dev, layout(nranks, gx->rings).total, &gx->mem), res, fail);
  mem_charge(acct, gpu_mem_size(gx->mem), 1, "kernel view of the communicator");
  CHECK_GOTO(upload(gx, links), res, fail);
  gx->ll128_max = ll128_max(gx);
  /* where LL128 runs, it takes the transfers above BRAID_LL128_MIN_BYTES from LL, and a one-way
   * collective's above BRAID_LL128_ONE_WAY_MIN_BYTES: on two H200s LL128 moved 512 KiB transfers 0.4-1.1 us
   * faster than LL (docs/perf-notes.md, 77), and 256 KiB ones both ways at once (an all-reduce's, a
   * send/receive's) 0.3-0.6 us faster, but one way 0.15-0.3 us slower (104) */
  gx->ll_max_one_way = ll_below(gx, plan_tuning()->ll128_oneway);
  gx->ll_max = ll_below(gx, plan_tuning()->ll128_min);
  CHECK_GOTO(gpu_event_create(&gx->done), res, fail);
  CHECK_GOTO(queue_init(gx), res, fail);
  const char *overlap_what = gx->overlap == 2 ? "eager and captured"
                             : gx->overlap == 1 && overlap >= 2
                                 ? "eager (a graph's launches need a CUDA 12.3 driver for it)"
                             : gx->overlap == 1 ? "eager"
                             : !can_eager       ? "none (the device has no programmatic dependent launch)"
                                                : "none";
  char wide[256], join[48], dealt[112];
  if (gx->dealt_min == 0 || nranks != 2)
    snprintf(dealt, sizeof dealt, "never%s", gx->dealt_min == 0 ? "" : " (two ranks only)");
  else if (gx->dealt_max == 0)
    snprintf(dealt, sizeof dealt, "in ring collectives' transfers from %llu bytes",
             (unsigned long long)gx->dealt_min);
  else
    snprintf(dealt, sizeof dealt, "in ring collectives' transfers of %llu to %llu bytes",
             (unsigned long long)gx->dealt_min, (unsigned long long)gx->dealt_max);
  if (gx->pair_join < 0)
    snprintf(join, sizeof join, "never");
  else if (gx->pair_join == 0)
    snprintf(join, sizeof join, "at every size");
  else
    snprintf(join, sizeof join, "from %lld bytes a channel", (long long)gx->pair_join);
  INFO(LOG_INIT | LOG_TUNING,
       "%s rank %d: GPU executor on device %d, %d channels, work queue of %llu bytes; launches of LL "
       "transfers alone through %s (BRAID_LL_KERNEL), of one LL send, receive and copy at most through %s "
       "(BRAID_PAIR_KERNEL; an in-place all-reduce in one pass through %s and its LL128 twin, "
       "BRAID_PAIR_AR_KERNEL, and so an out-of-place one %s, BRAID_PAIR_JOIN_BYTES), of "
       "one-slice Simple transfers on p2p through %s (BRAID_BULK_KERNEL); %s (BRAID_WIDE_STEPS); pieces "
       "dealt to the channels as they find room %s (BRAID_DEALT_MIN_BYTES, BRAID_DEALT_MAX_BYTES); launches "
       "that overlap the stream's previous kernel: %s (BRAID_LAUNCH_PDL)",
       name, rank, dev, nch, (unsigned long long)gx->wq.cap,
       gx->ll_kernel ? DEV_KERNEL_LL_NAME : "the general kernel",
       gx->pair_kernel ? DEV_KERNEL_PAIR_NAME : "the same",
       gx->pair_kernel && gx->pair_ar_kernel ? DEV_KERNEL_PAIR_AR_NAME : "the same", join,
       gx->bulk_kernel ? DEV_KERNEL_BULK_NAME : "the general kernel", wide_what(gx, wide, sizeof wide), dealt,
       overlap_what);
  INFO(LOG_INIT | LOG_TUNING,
       "%s rank %d: LL protocol for transfers of at most %llu bytes (%llu in broadcast, reduce, gather and "
       "scatter) on p2p connections, a channel per %llu bytes of one, up to %d (NCCL_PROTO, "
       "BRAID_LL_MAX_BYTES, BRAID_LL_CHANNEL_BYTES; BRAID_LL128_MIN_BYTES and BRAID_LL128_ONE_WAY_MIN_BYTES "
       "where LL128 runs); LL128 for larger transfers with a peer of at most %llu bytes over %d channels "
       "(NCCL_PROTO, BRAID_LL128_MAX_BYTES; two ranks on p2p both ways only); a Simple transfer takes a "
       "channel per %llu bytes (BRAID_CHANNEL_BYTES)",
       name, rank, (unsigned long long)gx->ll_max, (unsigned long long)gx->ll_max_one_way,
       (unsigned long long)gx->ll_part, gx->ll_nch, (unsigned long long)gx->ll128_max, gx->ll128_nch,
       (unsigned long long)gx->ch_bytes);
  *gx_p = gx;
  return ncclSuccess;
fail:
  gx_destroy(gx);
  return res;
}

/* Says what wait_last waits for (wd_describe_fn_t). */
static void last_describe(void *arg, char *buf, size_t len) {
  const gx_t *gx = arg;
  snprintf(buf, len,
           "%s rank %d: the communicator's last launch has not finished (the GPU makes no progress)",
           gx->name, gx->rank);
}

/* Waits until the communicator's last eager launch has finished. */
static ncclResult_t wait_last(gx_t *gx) {
  int done = !gx->launched;
  wd_timer_t t;
  if (!done) {
    wd_begin(&t, NULL, &(wd_wait_t){.kind = WD_QUEUE, .peer = -1, .channel = -1, .op = "last launch"},
             last_describe, gx);
    /* a kernel gives up waiting for a peer after BRAID_TIMEOUT_S (or at once after an abort); the margin
     * covers the work it still does after its last wait */
    t.margin_s = GX_STUCK_MARGIN_S;
    t.warn_s = 0;
  }
  while (!done) {
    CHECK(gpu_event_query(gx->done, &done));
    if (done) break;
    CHECK(wd_check(&t, time_now()));
    time_sleep_us(50);
  }
  return ncclSuccess;
}

/* ---- Graph tokens ---- */

/* One allocation a token owns: device memory, and the page-locked copy it is filled from (or NULL); or a
 * mapping of the peer's memory that a copy-engine step writes (ce_exec_t.keep). */
typedef struct tbuf {
  struct tbuf *next;
  gpu_mem_t *mem;
  void *stage;
  size_t stage_bytes;
  gpu_mem_t *mapped;
} tbuf_t;

/* The graph's release callback, on a driver thread: no CUDA call, only two atomic operations. The token is
 * marked released first (the next sweep may free it at once, so it is not touched after), then the count
 * drops: whoever sees the count reach zero sees every token released. The executor outlives the count
 * (gx_destroy runs only at zero; gx_retire keeps it until then). */
static void token_release(void *arg) {
  token_t *t = arg;
  gx_t *gx = t->gx;
  atomic_store_explicit(&t->released, 1, memory_order_release);
  atomic_fetch_add_explicit(&gx->unswept, 1, memory_order_release);
  atomic_fetch_sub_explicit(&gx->graphs, 1, memory_order_release);
}

static void token_free(gx_t *gx, token_t *t) {
  for (tbuf_t *b = t->bufs, *next; b != NULL; b = next) {
    next = b->next;
    if (b->mem != NULL) {
      mem_release(gx->acct, gpu_mem_size(b->mem), 1);
      gpu_mem_release(b->mem);
    }
    if (b->stage != NULL) {
      mem_release(gx->acct, b->stage_bytes, 0);
      gpu_host_free(b->stage);
    }
    if (b->mapped != NULL) gpu_mem_release(b->mapped);
    free(b);
  }
  free(t);
}

/* Frees the tokens whose graphs are gone (the caller has entered the device). */
static void tokens_sweep(gx_t *gx) {
  /* every launch calls this: with no token released since the last sweep, the list is not walked */
  if (atomic_load_explicit(&gx->unswept, memory_order_acquire) == 0) return;
  for (token_t **pp = &gx->tokens; *pp != NULL;) {
    token_t *t = *pp;
    if (!atomic_load_explicit(&t->released, memory_order_acquire)) {
      pp = &t->next;
      continue;
    }
    *pp = t->next;
    if (gx->pending == t) gx->pending = NULL;
    token_free(gx, t);
    atomic_fetch_sub_explicit(&gx->unswept, 1, memory_order_relaxed);
  }
}

/* The token of the capture `capture_id` (into `graph`): the one an earlier call of the same capture made, or
 * a new one that the graph holds from now on (so the communicator knows a graph uses it). Capture ids are
 * never reused in a process, unlike graph handles. */
static ncclResult_t token_for(gx_t *gx, void *graph, uint64_t capture_id, token_t **t_p) {
  if (gx->pending != NULL && gx->pending_capture == capture_id) {
    *t_p = gx->pending;
    return ncclSuccess;
  }
  token_t *t = calloc(1, sizeof *t);
  if (t == NULL) return log_err(ncclSystemError, "%s: out of host memory for a graph token", gx->name);
  t->gx = gx;
  atomic_fetch_add_explicit(&gx->graphs, 1, memory_order_relaxed);
  ncclResult_t res = gpu_graph_hold(graph, token_release, t);
  if (res != ncclSuccess) {
    /* not held: no callback will come, so the count goes back now */
    atomic_fetch_sub_explicit(&gx->graphs, 1, memory_order_relaxed);
    free(t);
    return res;
  }
  t->next = gx->tokens;
  gx->tokens = t;
  gx->pending = t;
  gx->pending_capture = capture_id;
  *t_p = t;
  return ncclSuccess;
}

/* Device memory of `bytes` owned by token t, with (stage != NULL) a page-locked copy to fill it from.
 * Allocation is one of the calls a capture forbids in its strict modes: the thread relaxes its mode around
 * it. */
static ncclResult_t token_alloc(gx_t *gx, token_t *t, size_t bytes, int staged, tbuf_t **b_p) {
  tbuf_t *b = calloc(1, sizeof *b);
  if (b == NULL) return log_err(ncclSystemError, "%s: out of host memory for a graph token", gx->name);
  b->next = t->bufs;
  t->bufs = b;
  int saved;
  CHECK(gpu_capture_relax(&saved));
  void *unused;
  ncclResult_t res = gpu_dev_alloc(gx->dev, bytes, &b->mem);
  if (res == ncclSuccess) mem_charge(gx->acct, gpu_mem_size(b->mem), 1, "graph-owned work or scratch");
  if (res == ncclSuccess && staged) {
    res = gpu_host_alloc(bytes, &b->stage, &unused);
    if (res == ncclSuccess) {
      b->stage_bytes = bytes;
      mem_charge(gx->acct, bytes, 0, "graph-owned work (page-locked)");
    }
  }
  gpu_capture_restore(saved);
  *b_p = b;
  return res;
}

/* ---- In-place all-to-all scratch ---- */

/* Eager launches share one staging buffer, grown when needed. */
static ncclResult_t scratch_eager(gx_t *gx, size_t need, gpu_mem_t **mem_p) {
  if (gx->scratch != NULL && gpu_mem_size(gx->scratch) >= need) goto out;
  if (gx->scratch != NULL) {
    /* A launch still in flight may stage in the old buffer: wait for the last one (bounded: kernels give up
     * after BRAID_TIMEOUT_S). This happens only when an in-place all-to-all grows. */
    CHECK(wait_last(gx));
    mem_release(gx->acct, gpu_mem_size(gx->scratch), 1);
    gpu_mem_release(gx->scratch);
    gx->scratch = NULL;
  }
  CHECK(gpu_dev_alloc(gx->dev, need, &gx->scratch));
  mem_charge(gx->acct, gpu_mem_size(gx->scratch), 1, "in-place all-to-all staging");
out:
  *mem_p = gx->scratch;
  return ncclSuccess;
}

ncclResult_t gx_scratch(gx_t *gx, plan_t *plan, int nranks) {
  size_t need = plan_scratch_need(plan, gx->rank, nranks, plan_tuning());
  plan->ext_scratch = NULL;
  plan->ext_scratch_bytes = 0;
  if (need == 0) return ncclSuccess;
  gpu_scope_t scope;
  CHECK(gpu_enter(gx->dev, &scope));
  int capturing = 0;
  void *graph = NULL;
  uint64_t id = 0;
  gpu_mem_t *mem = NULL;
  ncclResult_t res = gpu_stream_capture(plan->tasks[0].stream, &capturing, &graph, &id);
  if (res == ncclSuccess && !capturing) res = scratch_eager(gx, need, &mem);
  if (res == ncclSuccess && capturing) {
    /* a replay may run beside eager launches: the graph gets staging of its own */
    token_t *t;
    tbuf_t *b;
    res = token_for(gx, graph, id, &t);
    if (res == ncclSuccess) res = token_alloc(gx, t, need, 0, &b);
    if (res == ncclSuccess) mem = b->mem;
  }
  gpu_leave(&scope);
  CHECK(res);
  /* plan_build stages in-place all-to-alls here instead of in host memory */
  plan->ext_scratch = gpu_mem_ptr(mem);
  plan->ext_scratch_bytes = gpu_mem_size(mem);
  return ncclSuccess;
}

/* ---- Building a launch ---- */

/* Connection keys of a transfer: send peer p -> p, receive peer p -> nranks + p; local copies -> 2 nranks. */
static int find(int *parent, int k) {
  while (parent[k] != k) k = parent[k] = parent[parent[k]];
  return k;
}

/* Assigns lanes to the transfers [first, first + n) of the work: transfers that share a connection share a
 * lane, and so do all transfers marked XF_SEQ (with everything that shares a connection with them); lanes
 * are numbered in order of first appearance. With `local_joins`, local copies join the lane of the first
 * receive (or, with none, of the first send) and go first in it, so that the step has no lane of its own for
 * them (wide_p2p). Sorts them by lane, keeping list order otherwise. */
static int assign_lanes(dev_xfer_t *x, int n, int nranks, int local_joins, int *parent, int *lane_of) {
  int keys = 2 * nranks + 1, seq = -1, first_recv = -1, first_send = -1;
  for (int k = 0; k < keys; k++) parent[k] = k, lane_of[k] = -1;
  for (int i = 0; i < n; i++) {
    int a = x[i].send_peer >= 0 ? x[i].send_peer : -1;
    int b = x[i].recv_peer >= 0 ? nranks + x[i].recv_peer : -1;
    if (a < 0 && b < 0) a = 2 * nranks;
    if (a >= 0 && b >= 0) parent[find(parent, a)] = find(parent, b);
    if (x[i].flags & XF_SEQ) {
      int k = a >= 0 ? a : b;
      if (seq < 0) seq = k;
      parent[find(parent, k)] = find(parent, seq);
    }
    if (first_recv < 0) first_recv = b;
    if (first_send < 0 && x[i].send_peer >= 0) first_send = x[i].send_peer;
  }
  const int join = first_recv >= 0 ? first_recv : first_send;
  if (local_joins && join >= 0) parent[find(parent, 2 * nranks)] = find(parent, join);
  int lanes = 0;
  for (int i = 0; i < n; i++) {
    int k = x[i].send_peer >= 0 ? x[i].send_peer : x[i].recv_peer >= 0 ? nranks + x[i].recv_peer : 2 * nranks;
    int root = find(parent, k);
    if (lane_of[root] < 0) lane_of[root] = lanes++;
    x[i].lane = (uint16_t)lane_of[root];
  }
  /* stable insertion sort by lane, and with local_joins local copies first within it (steps are short) */
  for (int i = 1; i < n; i++) {
    dev_xfer_t v = x[i];
    const int v_local = local_joins && v.send_peer < 0 && v.recv_peer < 0;
    int j = i - 1;
    while (j >= 0 && (x[j].lane > v.lane ||
                      (x[j].lane == v.lane && v_local && (x[j].send_peer >= 0 || x[j].recv_peer >= 0))))
      x[j + 1] = x[j], j--;
    x[j + 1] = v;
  }
  return lanes;
}

/* Whether a collective moves data one way between any two ranks: a broadcast, a reduce, a gather or a
 * scatter, whose blocks only send, only receive, or do one after the other. */
static int one_way_kind(op_kind_t k) {
  return k == OP_BROADCAST || k == OP_REDUCE || k == OP_GATHER || k == OP_SCATTER;
}

/* The kernel's form of a planned transfer. A running result (XF_PREPARED) is combined as a plain sum where
 * PreMulSum would scale it again; the kernel never sees that flag's meaning. A transfer of at most ll_max
 * bytes (ll_max_one_way in a one-way collective: `one_way`, one_way_kind) is marked LL and runs on a channel
 * per ll_part bytes, at most ll_nch (dev.h); a larger one with a peer, of at most ll128_max bytes, is marked
 * LL with the LL128 protocol and runs on ll128_nch channels (at most `cap`), as long as that leaves each
 * channel at most half its LL128 slots (dev_ll128_fits); a plain local copy of at most one LL128 piece per
 * channel is marked LL (with the LL protocol, in pieces) on as many, so that the launches with one beside
 * one-piece LL128 transfers (an all-gather's own block out of place, a broadcast's root) stay LL launches, on
 * the pair kernel, instead of taking the general kernel for a Simple copy (larger LL128 transfers take the
 * general kernel, where a copy is Simple); a Simple one on a channel per ch_bytes, at most `cap` (wide_step).
 * The mark and the channels depend on the size, the knobs, the collective and the communicator's channels
 * only, so both ends of each of its connections agree. Each side of an LL transfer is also marked with its
 * protocol: LL when its connection has an LL ring, which both ends of the connection know alike (an LL128
 * transfer's sides always have one: ll128_max). */
static void fill_xfer(const gx_t *gx, const xfer_t *in, int one_way, uint16_t task, int cap,
                      dev_xfer_t *out) {
  const red_t *red = in->red;
  const int ll = in->bytes <= (one_way ? gx->ll_max_one_way : gx->ll_max);
  const uint64_t ll128_nch = (uint64_t)(gx->ll128_nch < cap ? gx->ll128_nch : cap);
  const int peers = in->send_peer >= 0 || in->recv_peer >= 0;
  const int ll128 = !ll && peers && in->bytes <= gx->ll128_max && in->bytes <= ll128_nch * DEV_LL128_PART_MAX;
  const int ll_copy = !ll && !peers && !(in->flags & (XF_REDUCE | XF_PREPARE)) &&
                      in->bytes <= gx->ll128_max && in->bytes <= ll128_nch * DEV_LL128_PIECE;
  int flags = (int)in->flags;
  if (ll || ll128 || ll_copy) {
    flags |= DEV_XF_LL;
    if (in->send_peer >= 0 && (gx->peer_caps[in->send_peer] & PEER_LL_TO)) flags |= DEV_XF_LL_SEND;
    if (in->recv_peer >= 0 && (gx->peer_caps[in->recv_peer] & PEER_LL_FROM)) flags |= DEV_XF_LL_RECV;
  }
  uint64_t nch = ll128 || ll_copy ? ll128_nch
                 : ll             ? (in->bytes + gx->ll_part - 1) / gx->ll_part
                                  : (in->bytes + gx->ch_bytes - 1) / gx->ch_bytes;
  if (ll && nch > (uint64_t)gx->ll_nch) nch = (uint64_t)gx->ll_nch;
  red_kind_t kind = (in->flags & XF_PREPARED) && red->kind == RED_PREMULSUM ? RED_SUM : red->kind;
  *out = (dev_xfer_t){.src = in->src,
                      .dst = in->dst,
                      .bytes = in->bytes,
                      .recv_peer = (int16_t)in->recv_peer,
                      .send_peer = (int16_t)in->send_peer,
                      .flags = (uint8_t)flags,
                      .type = (uint8_t)red->type,
                      .red = (uint8_t)kind,
                      .nch = (uint8_t)(nch < 1               ? 1
                                       : nch > (uint64_t)cap ? (uint64_t)cap
                                                             : nch),
                      .task = task,
                      .proto = (uint8_t)(ll128 ? DEV_PROTO_LL128 : DEV_PROTO_LL),
                      .scalar_ptr = red->scalar_dev};
  if (red->kind == RED_SUM_POSTDIV)
    out->scalar.i = red->divisor;
  else if (dtype_is_float(red->type))
    out->scalar.f = red->fscale;
  else
    out->scalar.i = red->iscale;
}

/* Whether task i is the first of the plan on its stream: the group's streams other than the launch's. */
static int first_on_stream(const plan_t *plan, int i) {
  for (int k = 0; k < i; k++)
    if (plan->tasks[k].stream == plan->tasks[i].stream) return 0;
  return 1;
}

/* Orders the launch on `s` after the group's other streams and after the previous eager launch. */
static ncclResult_t before(gx_t *gx, const plan_t *plan, cudaStream_t s, int capturing) {
  if (!capturing && gx->launched && gx->last != s) CHECK(gpu_stream_wait(s, gx->done));
  int j = 0;
  for (int i = 1; i < plan->ntasks; i++) {
    if (!first_on_stream(plan, i)) continue;
    cudaStream_t o = plan->tasks[i].stream;
    if (j == gx->njoins) {
      gpu_event_t **g = realloc(gx->joins, (j + 1) * sizeof *g);
      if (g == NULL) return log_err(ncclSystemError, "%s: out of host memory for stream events", gx->name);
      gx->joins = g;
      CHECK(gpu_event_create(&gx->joins[j]));
      gx->njoins++;
    }
    CHECK(gpu_event_record(gx->joins[j], o));
    CHECK(gpu_stream_wait(s, gx->joins[j]));
    j++;
  }
  return ncclSuccess;
}

/* After the launch: the group's other streams wait for it, and so will the next eager launch. Inside a
 * capture, `done` keeps its last eager record (an eager wait on an event recorded in a graph is not
 * allowed), and a separate event joins the streams. `done` is recorded after every eager launch, not lazily
 * on the old stream when a later launch comes on another: by then the caller may have destroyed that stream
 * (its handle is no longer valid) or begun capturing it (the record would land in the graph). */
static ncclResult_t after(gx_t *gx, const plan_t *plan, cudaStream_t s, int capturing) {
  gpu_event_t *ev = gx->done;
  if (capturing) {
    if (gx->capture_join == NULL) CHECK(gpu_event_create(&gx->capture_join));
    ev = gx->capture_join;
  }
  CHECK(gpu_event_record(ev, s));
  if (!capturing) {
    gx->launched = 1;
    gx->last = s;
  }
  for (int i = 1; i < plan->ntasks; i++)
    if (first_on_stream(plan, i)) CHECK(gpu_stream_wait(plan->tasks[i].stream, ev));
  return ncclSuccess;
}

/* What every launch of one gx_launch shares. */
typedef struct {
  cudaStream_t s;
  int capturing;
  token_t *token; /* captured: the storage the graph owns */
  const char *op; /* the group's first call, for messages */
} launch_ctx_t;

/* Whether a launch may overlap the stream's previous kernel (gpu_launch): every entry point waits for that
 * kernel's stores before it touches memory, so the GPU can take the launch in and place its blocks while the
 * previous kernel ends. On two H200s that took 1.15-1.35 us off an eager all-reduce of 256 KiB-4 MiB and
 * 0.2-0.3 us off a captured one (docs/perf-notes.md, 124). Eager launches with BRAID_LAUNCH_PDL >= 1,
 * captured ones with 2 (the default) on a driver that keeps it in a graph. */
static int launch_overlap(const gx_t *gx, int capturing) {
  return gx->overlap >= (capturing ? 2 : 1);
}

/* ---- The work queue ---- */

typedef struct {
  gx_t *gx;
  int all_before_group; /* the ordering event says every launch before this group has finished */
} done_ctx_t;

/* Whether an entry's kernel is done: it wrote the entry's tag into the header (acquire: what it read of the
 * entry was read before). */
static int entry_done(void *arg, const wq_entry_t *e) {
  const done_ctx_t *c = arg;
  if (__atomic_load_n((const uint64_t *)(c->gx->q_host + e->off), __ATOMIC_ACQUIRE) == e->tag) return 1;
  return c->all_before_group && e->tag < c->gx->group_first_tag;
}

/* A full queue's wait, for queue_describe. */
typedef struct {
  gx_t *gx;
  double start;
} queue_wait_t;

/* Says what a queue that stays full waits for (wd_describe_fn_t; the watchdog reports it once). */
static void queue_describe(void *arg, char *buf, size_t len) {
  const queue_wait_t *q = arg;
  gx_t *gx = q->gx;
  const wq_entry_t *e = wq_oldest(&gx->wq);
  if (e == NULL) {
    snprintf(buf, len, "%s rank %d: the work queue has been full for %.1f s", gx->name, gx->rank,
             time_now() - q->start);
    return;
  }
  snprintf(
      buf, len,
      "%s rank %d: the work queue has been full for %.1f s: %llu of %llu bytes (NCCL_WORK_FIFO_BYTES) are "
      "held by %u eager launches; "
      "waiting for the GPU to finish the oldest, %s (call %llu), enqueued %.1f s ago%s",
      gx->name, gx->rank, time_now() - q->start, (unsigned long long)wq_outstanding(&gx->wq),
      (unsigned long long)gx->wq.cap, gx->wq.count, e->op, (unsigned long long)e->seq, time_now() - e->t_enq,
      e->tag >= gx->group_first_tag ? "; it belongs to this same group, so if one thread drives several GPUs "
                                      "they wait for each other: raise NCCL_WORK_FIFO_BYTES"
                                    : "");
}

/* An entry of `bytes` for an eager launch, waiting while the queue is full: space comes back as kernels
 * finish. The wait ends with an error when the communicator is aborted or a kernel failed (a kernel gives
 * up on its own after BRAID_TIMEOUT_S); the watchdog reports it after BRAID_QUEUE_WARN_S. */
static ncclResult_t queue_reserve(gx_t *gx, uint64_t bytes, uint64_t seq, const char *op, wq_slot_t *slot) {
  done_ctx_t c = {gx, 0};
  wd_timer_t t;
  queue_wait_t q = {gx, 0};
  for (uint64_t round = 0;; round++) {
    wq_reclaim(&gx->wq, entry_done, &c);
    if (wq_reserve(&gx->wq, 0, bytes, seq, op, time_now(), slot)) return ncclSuccess;
    if (round == 0) {
      wd_wait_t w = {.kind = WD_QUEUE, .peer = -1, .seq = seq, .channel = -1};
      snprintf(w.op, sizeof w.op, "%s", op);
      q.start = time_now();
      wd_begin(&t, NULL, &w, queue_describe, &q);
      t.warn_s = param_int(P_BRAID_QUEUE_WARN_S);
      t.timeout_s = 0;
    }
    if (gx->launched && !c.all_before_group) CHECK(gpu_event_query(gx->done, &c.all_before_group));
    if (__atomic_load_n(&gx->flags->abort, __ATOMIC_ACQUIRE))
      return log_err(ncclInternalError, "%s rank %d: aborted while waiting for room in the work queue",
                     gx->name, gx->rank);
    CHECK(gx_error(gx));
    CHECK(wd_check(&t, time_now()));
    time_backoff(round);
  }
}

/* Where an eager launch's spilled list goes: a queue entry (its header cleared, the spill staged and copied
 * to the device copy in stream order). */
static ncclResult_t queue_place(gx_t *gx, const launch_ctx_t *lc, uint64_t spill, wq_slot_t *slot) {
  dev_work_t *w = &gx->work;
  CHECK(queue_reserve(gx, wq_entry_bytes(spill), w->seq, lc->op, slot));
  /* the launch is made after this store, so the kernel's write of the tag comes after it */
  __atomic_store_n((uint64_t *)(gx->q_host + slot->off), 0, __ATOMIC_RELAXED);
  w->done = (volatile uint64_t *)(gx->q_host_dev + slot->off);
  w->tag = slot->tag;
  char *stage = gx->q_host + slot->off + WQ_ALIGN,
       *dst = (char *)gpu_mem_ptr(gx->q_dev) + slot->off + WQ_ALIGN;
  memcpy(stage, gx->xf, spill);
  w->ext = (const dev_xfer_t *)dst;
  return gpu_copy_async(dst, stage, spill, lc->s);
}

/* Where a captured launch's spill goes: device memory the graph owns, filled by a copy node at each replay
 * from a page-locked copy it also owns. */
static ncclResult_t capture_place(gx_t *gx, const launch_ctx_t *lc, uint64_t spill) {
  tbuf_t *b;
  CHECK(token_alloc(gx, lc->token, spill, 1, &b));
  memcpy(b->stage, gx->xf, spill);
  gx->work.ext = gpu_mem_ptr(b->mem);
  return gpu_copy_async(gpu_mem_ptr(b->mem), b->stage, spill, lc->s);
}

/* Whether the work (one step, its list in the parameters) can take braid_kernel_ll (dev.h): every transfer
 * LL on each side that has a peer, one piece per channel, and few enough transfers for the small work.
 * 2: so, but with an LL128 transfer, which braid_kernel_pair can take and braid_kernel_ll cannot. */
static int ll_only(const gx_t *gx, const dev_work_t *w) {
  if (!gx->ll_kernel || w->nsteps != 1 || w->nxfers > DEV_SMALL_XFERS) return 0;
  int ll128 = 0, long_copy = 0;
  for (int i = 0; i < w->nxfers; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    if (!(x->flags & DEV_XF_LL) || (x->send_peer >= 0 && !(x->flags & DEV_XF_LL_SEND)) ||
        (x->recv_peer >= 0 && !(x->flags & DEV_XF_LL_RECV)))
      return 0;
    if (!dev_xf_one_piece(x)) {
      if (x->send_peer >= 0 || x->recv_peer >= 0) return 0;
      long_copy = 1;
    }
    ll128 |= x->proto == DEV_PROTO_LL128;
  }
  /* a local copy of more than a piece per channel (fill_xfer's LL copies) rides only with LL128 transfers,
   * on the pair or the general entry point, whose copies take any length */
  if (long_copy && !ll128) return 0;
  return ll128 ? 2 : 1;
}

/* Threads per block of a braid_kernel_ll launch: a line per thread of the largest part, in whole warps, at
 * most DEV_THREADS (an 8-byte all-reduce runs one warp per block, so its barriers are a warp's). */
static unsigned ll_threads(const dev_work_t *w) {
  uint64_t lines = 1;
  for (int i = 0; i < w->nxfers; i++) {
    uint64_t part = dev_part(w->xfers[i].bytes, w->xfers[i].nch, 0, 0).len; /* channel 0's is the largest */
    if ((part + 7) / 8 > lines) lines = (part + 7) / 8;
  }
  uint64_t threads = (lines + 31) / 32 * 32;
  return threads < DEV_THREADS ? (unsigned)threads : DEV_THREADS;
}

/* Whether an LL launch (ll_only) can take braid_kernel_pair (dev.h, dev_pair_t), and its parameters in *p:
 * at most one plain send, one receive and one local copy, and no transfer writing what another one reads,
 * since the blocks of the three run at once and in no order. The one exception is an in-place all-reduce,
 * whose receive overwrites exactly the bytes its send reads: the two run fused, each thread sending the
 * lines it then overwrites. ll_thr: the launch's threads per block on the LL kernel (ll_threads). */
static int pair_shape(const gx_t *gx, const dev_work_t *w, unsigned ll_thr, dev_pair_t *p) {
  if (!gx->pair_kernel || w->nxfers > 3) return 0;
  const dev_xfer_t *send = NULL, *recv = NULL, *copy = NULL;
  for (int i = 0; i < w->nxfers; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    if (x->nch < 1 || x->bytes == 0) return 0;
    if (send == NULL && dev_xf_plain_send(x))
      send = x;
    else if (recv == NULL && x->recv_peer >= 0 && x->send_peer < 0 && x->dst != NULL)
      recv = x;
    else if (copy == NULL && x->send_peer < 0 && x->recv_peer < 0 && x->dst != NULL && x->src != NULL &&
             !(x->flags & DEV_XF_REDUCE) && !dev_xf_scales(x))
      copy = x;
    else
      return 0;
  }
  if (send == NULL && recv == NULL) return 0;
  const dev_xfer_t none = {.send_peer = -1, .recv_peer = -1};
  const dev_xfer_t *s = send != NULL ? send : &none, *r = recv != NULL ? recv : &none,
                   *k = copy != NULL ? copy : &none;
  const int fused = plan_overlap(s->src, s->bytes, r->dst, r->bytes);
  if (fused && (s->src != r->dst || s->bytes != r->bytes || s->nch != r->nch)) return 0;
  if (plan_overlap(k->dst, k->bytes, s->src, s->bytes) || plan_overlap(k->dst, k->bytes, r->src, r->bytes) ||
      plan_overlap(k->dst, k->bytes, r->dst, r->bytes) || plan_overlap(k->src, k->bytes, r->dst, r->bytes))
    return 0;
  /* an absent transfer is `none`, of nch 0 */
  *p = (dev_pair_t){.comm = w->comm, .seq = w->seq, .send = *s, .recv = *r, .copy = *k, .nch = w->nch};
  /* an out-of-place all-reduce whose part is at least BRAID_PAIR_JOIN_BYTES runs joined, as in place does:
   * each block sends its channel's part, then receives it, and so takes the in-place all-reduce's entry
   * point (dev_pair_ar), whose threads load both rings in one trip */
  int joined = 0;
  if (!fused && send != NULL && recv != NULL && gx->pair_join >= 0 &&
      dev_part(s->bytes, s->nch, 0, 0).len >= (uint64_t)gx->pair_join) {
    p->fused = 1;
    joined = dev_pair_ar(p);
  }
  /* a copy beside a receive alone still gets blocks of its own, so that the receive waits for nothing else */
  p->send_blocks = (uint8_t)((send != NULL || copy != NULL) && !fused && !joined ? w->nch : 0);
  p->recv_blocks = (uint8_t)(recv != NULL ? w->nch : 0);
  /* in place, a part of a line per thread of half a block, and of at most BRAID_PAIR_HALVES_BYTES, runs on
   * two halves, as two blocks would (dev.h); above 512 bytes the halves' barrier cost more than the one pass
   * (docs/perf-notes.md, 93), and since an in-place all-reduce's one pass takes braid_kernel_pair_ar, at
   * every size (112): the knob is 0 unless set */
  p->fused = (uint8_t)(joined   ? 1
                       : !fused ? 0
                       : 2 * ll_thr <= DEV_THREADS && s->proto == DEV_PROTO_LL &&
                               dev_part(s->bytes, s->nch, 0, 0).len <= gx->pair_halves
                           ? 2
                           : 1);
  return 1;
}

/* The entry point of the pair launch in *p (pair_shape): for an all-reduce run in one pass per thread, in
 * place or joined (dev_pair_ar), braid_kernel_pair_ar, or braid_kernel_pair_ar128 in LL128; else
 * braid_kernel_pair. */
static gpu_func_t *pair_func(const gx_t *gx, const dev_pair_t *p) {
  if (!gx->pair_ar_kernel || !dev_pair_ar(p)) return gx->func_pair;
  return p->recv.proto == DEV_PROTO_LL128 ? gx->func_pair_ar128 : gx->func_pair_ar;
}

/* Pieces (slots) the launch moves on the ring of transfer i's send (or receive) side on channel 0, whose part
 * is the largest. */
static uint64_t ring_pieces(const dev_work_t *w, int i, int send) {
  const int peer = send ? w->xfers[i].send_peer : w->xfers[i].recv_peer;
  uint64_t pieces = 0;
  for (int k = 0; k < w->nxfers; k++) {
    const dev_xfer_t *x = &w->xfers[k];
    if ((send ? x->send_peer : x->recv_peer) == peer)
      pieces += dev_npieces(dev_part(x->bytes, x->nch, 0, 0).len);
  }
  return pieces;
}

/* Whether a launch moves data both ways at once: one step, at least two lanes, and both a send and a receive
 * (an all-reduce out of place, a reduce-scatter, an all-gather, an all-to-all, a send/receive); not a
 * broadcast, a reduce, a gather, a scatter nor an all-reduce in place, whose blocks only send, only
 * receive, or do one after the other. On two H100s the two kinds differed in what sped them up
 * (docs/perf-notes.md, 45): the bulk kernel and short batches made duplex launches up to 15% faster and the
 * others up to 20% slower. */
static int duplex(const gx_t *gx, const dev_work_t *w) {
  if (w->nsteps != 1 || w->step_lanes[0] < 2) return 0;
  int sends = 0, recvs = 0;
  for (int i = 0; i < w->nxfers; i++) {
    sends |= gx->xf[i].send_peer >= 0;
    recvs |= gx->xf[i].recv_peer >= 0;
  }
  return sends && recvs;
}

/* The largest batch (pieces between two signals to the peer, dev_comm_t.batch_pieces) of a duplex launch
 * whose transfers are at most GX_DUPLEX_BATCH_MAX bytes or dealt: the sender signals every 256 KiB instead of
 * once its share of the ring (1 MiB) is full, so the peer's receiving blocks work while it sends. Larger
 * transfers (1 GiB) ran 1-3% slower so, but dealt ones (dev.h) 2-4% faster: dealt in batches of up to 8
 * pieces, an in-place reduce-scatter of 512 MiB took 802.7-805.3 us against 787.9-790.0 not dealt, and in
 * batches of 2 755.5-756.4 (docs/perf-notes.md, 137). */
#define GX_DUPLEX_BATCH     2
#define GX_DUPLEX_BATCH_MAX (128ull << 20)

/* A one-way launch (one_way_kind: its blocks only send or only receive) signals every GX_ONEWAY_BATCH pieces
 * where its largest transfer moves more than GX_ONEWAY_MIN and at most GX_ONEWAY_MAX pieces per channel
 * (32-64 MiB over 60 channels): on two H200s a broadcast, reduce, gather or scatter of such a size ran 1-3%
 * faster so, one of fewer pieces (16 MiB) 2-3% slower, and of more about alike (docs/perf-notes.md, 57). */
#define GX_ONEWAY_BATCH 2
#define GX_ONEWAY_MIN   3
#define GX_ONEWAY_MAX   16

static int32_t launch_batch(const gx_t *gx, const dev_work_t *w, int dup) {
  if (gx->batch_pieces >= 0) return gx->batch_pieces;
  if (!dup) {
    if (!gx->one_way || gx->nranks != 2) return 0;
    uint64_t most = 0;
    for (int i = 0; i < w->nxfers; i++) {
      uint64_t per_ch = gx->xf[i].bytes / gx->xf[i].nch; /* fill_xfer gives every transfer a channel */
      if (per_ch > most) most = per_ch;
    }
    return most > GX_ONEWAY_MIN * DEV_SLOT_BYTES && most <= GX_ONEWAY_MAX * DEV_SLOT_BYTES ? GX_ONEWAY_BATCH
                                                                                           : 0;
  }
  for (int i = 0; i < w->nxfers; i++)
    if (gx->xf[i].bytes > GX_DUPLEX_BATCH_MAX && !gx->xf[i].dealt) return 0;
  return GX_DUPLEX_BATCH;
}

/* Whether the launch is one lane of a send to a peer and then a receive from it that overwrites what the
 * send reads, over the same bytes and channels: an in-place one-shot all-reduce on two ranks, which
 * braid_kernel_bulk can run split (dev.h, "A split lane"), its sends on blocks of their own as out of place.
 * In one lane (the general kernel) a block sends each piece before it combines it: on two H100s a 16 MiB
 * all-reduce in place took 78.7 us so, 72.4 split and 71.7 out of place (docs/perf-notes.md, 49). */
static int split_pair(const gx_t *gx, const dev_work_t *w) {
  if (!gx->split_lane || gx->dcomm.guards == NULL || w->nsteps != 1 || w->step_lanes[0] != 1 ||
      w->nxfers != 2)
    return 0;
  const dev_xfer_t *s = &gx->xf[0], *r = &gx->xf[1];
  return s->send_peer >= 0 && s->recv_peer < 0 && r->recv_peer == s->send_peer && r->send_peer < 0 &&
         s->src != NULL && r->dst == s->src && s->bytes == r->bytes && s->nch == r->nch;
}

/* Whether a launch on braid_kernel_bulk fences the parts it only sends once per block and wave of chunks
 * (dev_comm_t.wave_fence) rather than once per warp and chunk. On two H200s waves made send/receive of
 * 8-16 MiB and all-gather of 16-32 MiB 3-9% faster, and all-reduce and reduce-scatter of 4-16 MiB, whose
 * receivers combine each chunk as it comes, 1-5% slower (docs/perf-notes.md, 82): so by default (1) only
 * launches that reduce nothing they receive; 2: every launch; 0: none. */
static int wave_fence(const gx_t *gx, const dev_work_t *w) {
  if (gx->wave_fence != 1) return gx->wave_fence >= 2;
  for (int i = 0; i < w->nxfers; i++)
    if (w->xfers[i].recv_peer >= 0 && (w->xfers[i].flags & DEV_XF_REDUCE)) return 0;
  return 1;
}

/* Whether the work (one step, its list in the parameters) can take braid_kernel_bulk (dev.h): every transfer
 * Simple, not dealt and in one slice, each side that has a peer on a connection whose rings have chunk marks,
 * and no ring carrying more than DEV_SLOTS of the launch's pieces, so that room to send only waits for
 * earlier launches; and a duplex launch (duplex) or a split lane (split_pair). */
static int bulk_only(const gx_t *gx, const dev_work_t *w, int dup) {
  if (!gx->bulk_kernel || !dup || w->nxfers > DEV_SMALL_XFERS) return 0;
  for (int i = 0; i < w->nxfers; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    if ((x->flags & DEV_XF_LL) || x->dealt || dev_nslices(x->bytes, x->nch) > 1) return 0;
    if (x->send_peer >= 0 &&
        (!(gx->peer_caps[x->send_peer] & PEER_MARKS_TO) || ring_pieces(w, i, 1) > DEV_SLOTS))
      return 0;
    if (x->recv_peer >= 0 &&
        (!(gx->peer_caps[x->recv_peer] & PEER_MARKS_FROM) || ring_pieces(w, i, 0) > DEV_SLOTS))
      return 0;
  }
  return 1;
}

/* Threads per block of a braid_kernel_bulk launch: a warp per chunk of the largest part, at most
 * DEV_THREADS. */
static unsigned bulk_threads(const dev_work_t *w) {
  uint64_t chunks = 1;
  for (int i = 0; i < w->nxfers; i++) {
    uint64_t part = dev_part(w->xfers[i].bytes, w->xfers[i].nch, 0, 0).len;
    uint64_t n = (part + DEV_CHUNK_BYTES - 1) / DEV_CHUNK_BYTES;
    if (n > chunks) chunks = n;
  }
  return chunks * 32 < DEV_THREADS ? (unsigned)chunks * 32 : DEV_THREADS;
}

/* Whether the launch's blocks spread over the widest step's grid rather than two lanes' (flush): where a
 * transfer (gx->xf) moves more than a ring's DEV_SLOTS pieces per channel, so that its senders wait for
 * their receivers to free slots, and none receives and forwards (a ring all-reduce). */
static int spread_widest(const gx_t *gx) {
  int cycles = 0;
  for (int i = 0; i < gx->work.nxfers; i++) {
    const dev_xfer_t *x = &gx->xf[i];
    if (x->send_peer >= 0 && x->recv_peer >= 0) return 0;
    if (x->bytes > (uint64_t)x->nch * DEV_SLOTS * DEV_SLOT_BYTES) cycles = 1;
  }
  return cycles;
}

/* The most lanes a step of the work built so far has, at least `lanes`. */
static int widest_step(const dev_work_t *w, int lanes) {
  for (int i = 0; i < w->nsteps; i++)
    if (w->step_lanes[i] > lanes) lanes = w->step_lanes[i];
  return lanes;
}

/* One bit per power-of-two size class of a launch's largest transfer, per entry point (general, small, LL,
 * bulk, pair, fused all-reduce in LL and in LL128): the launch shapes logged at INFO so far. */
static _Atomic uint64_t logged_launches[7];

/* Logs a launch's shape at INFO (TUNING) once per entry point and size class of its largest transfer, or
 * every launch at TRACE: the entry point, the grid, its lanes and spread, and the cap on Simple batches.
 * Costs one test of the log level when TUNING is off. */
static void log_launch(const gx_t *gx, const dev_work_t *w, const gpu_func_t *f, int lanes, unsigned grid,
                       unsigned threads) {
  if (!log_enabled(LOG_INFO, LOG_TUNING)) return;
  uint64_t most = 0;
  for (int i = 0; i < w->nxfers; i++)
    if (gx->xf[i].bytes > most) most = gx->xf[i].bytes;
  const int entry = f == gx->func_small        ? 1
                    : f == gx->func_ll         ? 2
                    : f == gx->func_bulk       ? 3
                    : f == gx->func_pair       ? 4
                    : f == gx->func_pair_ar    ? 5
                    : f == gx->func_pair_ar128 ? 6
                                               : 0;
  static const char *const names[7] = {
      "general", "small", "LL", "bulk", "pair", "fused all-reduce", "fused LL128 all-reduce"};
  if (!log_enabled(LOG_TRACE, LOG_TUNING) && !log_first_of_class(&logged_launches[entry], most)) return;
  char batch[32] = "no cap";
  if (w->comm.batch_pieces > 0) snprintf(batch, sizeof batch, "%d pieces", (int)w->comm.batch_pieces);
  log_write(
      log_level >= LOG_TRACE ? LOG_TRACE : LOG_INFO, LOG_TUNING, __FILE__, __LINE__,
      "%s: a launch of %u transfers in %u step%s, the largest %llu bytes over %u channels: %s entry point, "
      "%u blocks of %u threads (%d lanes, interleave %d%s), Simple batches: %s",
      gx->name, (unsigned)w->nxfers, (unsigned)w->nsteps, w->nsteps == 1 ? "" : "s", (unsigned long long)most,
      (unsigned)w->nch, names[entry], grid, threads, lanes, (int)w->comm.interleave,
      w->comm.split ? ", split" : "", batch);
}

/* ---- The last LL launch, remembered ---- */

/* Launches the memo's parameters again as call `seq`, on `s`. */
static ncclResult_t memo_fire(gx_t *gx, uint64_t seq, cudaStream_t s) {
  memo_t *m = &gx->memo;
  if (m->pair) {
    m->pair_params.seq = seq;
    CHECK(gpu_launch(m->f, m->grid, m->threads, &m->pair_params, sizeof m->pair_params, s,
                     launch_overlap(gx, 0)));
  } else {
    m->work.seq = seq;
    CHECK(gpu_launch(m->f, m->grid, m->threads, &m->work, sizeof m->work, s, launch_overlap(gx, 0)));
  }
  gx->memo_used = 1;
  return ncclSuccess;
}

/* An eager launch of one step whose transfers come out of fill_xfer as the memo's did launches again with the
 * memo's parameters, only the call's number changed (a training loop's all-reduce of the same buffers, call
 * after call). What add_step and flush build from those transfers for the LL and pair entry points depends on
 * nothing else that changes while the executor lives (its settings are read at init, the kernels find their
 * rings' positions in device memory), so it is what they would build again; the lanes, their checks and the
 * choice of entry point are skipped, about 30% of the library's own instructions per small eager call
 * (docs/perf-notes.md, 88). Otherwise the step is staged in the memo, which flush keeps if the launch takes
 * the LL or pair entry point (memo_keep). At TRACE (TUNING) every launch is built, so that each is logged. */
static ncclResult_t memo_launch(gx_t *gx, const launch_ctx_t *lc, int count, int p2p, const dev_xfer_t *x,
                                int *launched) {
  memo_t *m = &gx->memo;
  *launched = 0;
  if (count > DEV_SMALL_XFERS || log_enabled(LOG_TRACE, LOG_TUNING)) return ncclSuccess;
  const size_t bytes = (size_t)count * sizeof *x; /* dev_xfer_t has no implicit padding (dev.h) */
  if (m->valid && m->count == count && m->p2p == p2p && memcmp(m->xf, x, bytes) == 0) {
    CHECK(memo_fire(gx, gx->work.seq, lc->s));
    *launched = 1;
    return ncclSuccess;
  }
  m->valid = 0;
  m->count = count;
  m->p2p = p2p;
  memcpy(m->xf, x, bytes);
  gx->memo_staged = 1;
  return ncclSuccess;
}

/* After flush launched the staged step on the LL or pair entry point: its parameters become the memo's. */
static void memo_keep(gx_t *gx, gpu_func_t *f, unsigned grid, unsigned threads, int pair) {
  memo_t *m = &gx->memo;
  m->f = f;
  m->grid = grid;
  m->threads = threads;
  m->pair = pair;
  if (pair)
    m->pair_params = gx->pair;
  else
    memcpy(&m->work, &gx->work, sizeof m->work);
  m->valid = 1;
  gx->memo_used = 1;
}

/* Launches the work built so far (if any) and starts a new one. */
static ncclResult_t flush(gx_t *gx, const launch_ctx_t *lc, uint64_t seq) {
  dev_work_t *w = &gx->work;
  if (w->nsteps > 0 && w->nxfers > 0) {
    int widest = widest_step(w, 1);
    uint64_t spill = w->nxfers > DEV_MAX_XFERS ? (uint64_t)w->nxfers * sizeof(dev_xfer_t) : 0;
    w->comm = gx->dcomm;
    w->ext = NULL;
    w->done = NULL;
    w->tag = 0;
    if (spill == 0) memcpy(w->xfers, gx->xf, (size_t)w->nxfers * sizeof(dev_xfer_t));
    /* A launch whose list fits the parameters needs nothing after the driver copied them: no queue entry,
     * and no tag for its kernel to write at the end, a store to host memory that the kernel's completion
     * (and so the next launch on the stream) waits for, about 0.85 us of every small eager call. */
    wq_slot_t slot = {0};
    if (spill != 0 && !lc->capturing)
      CHECK(queue_place(gx, lc, spill, &slot));
    else if (spill != 0)
      CHECK(capture_place(gx, lc, spill));
    /* a grid only as wide as the channels the launch's transfers use (w->nch, at least 1 per transfer); a
     * launch of a few transfers passes only the head of the work (dev_work_small_t), to braid_kernel_ll when
     * it is LL alone, to braid_kernel_bulk when it is Simple in one slice over p2p */
    int small = spill == 0 && w->nxfers <= DEV_SMALL_XFERS;
    const int lls = small ? ll_only(gx, w) : 0;
    const unsigned ll_thr = lls ? ll_threads(w) : 0;
    const int pair = lls && pair_shape(gx, w, ll_thr, &gx->pair);
    /* the LL or the pair entry point; LL128 transfers that do not take the pair entry take the general one */
    const int ll = pair || lls == 1;
    /* an LL launch (every small call) moves no Simple batch and takes no bulk kernel: it skips both scans */
    const int dup = !ll && duplex(gx, w), split = small && !ll && !dup && split_pair(gx, w);
    if (!ll) w->comm.batch_pieces = (int16_t)launch_batch(gx, w, dup);
    gpu_func_t *f = !small                          ? gx->func
                    : pair                          ? pair_func(gx, &gx->pair)
                    : ll                            ? gx->func_ll
                    : bulk_only(gx, w, dup | split) ? gx->func_bulk
                                                    : gx->func_small;
    if (split && f == gx->func_bulk) { /* sends on blocks [0, nch), the receive on [nch, 2 nch) */
      w->comm.split = 1;
      widest = 2;
    }
    w->comm.wave_fence = f == gx->func_bulk && wave_fence(gx, w);
    unsigned threads = pair && gx->pair.fused == 2 ? 2 * ll_thr
                       : ll                        ? ll_thr
                       : f == gx->func_bulk        ? bulk_threads(w)
                                                   : DEV_THREADS;
    /* a launch of fewer lanes than the widest step can have spreads its blocks over a wider grid (dev.h,
     * block_place): on two H100s a one-lane launch moved 4-7% more from 64 MiB up on every second block
     * than side by side, and a launch whose transfers cycle their rings 3-5% more from 256 MiB up on every
     * third; every third cost smaller launches up to 1 us and a ring all-reduce 3% at 256 MiB
     * (docs/perf-notes.md, 47 and 48) */
    if (gx->spread > widest && !ll && f != gx->func_bulk) {
      int k = gx->spread > 2 && !spread_widest(gx) ? 2 : gx->spread;
      while (k > widest && (unsigned)k * w->nch > gx->grid_max) k--; /* a wide step's channels */
      if (k > widest) {
        widest = k;
        w->comm.interleave = (int16_t)k;
      }
    }
    if ((unsigned)widest * w->nch > gx->grid_max) { /* add_step keeps launches within it */
      wq_cancel(&gx->wq, &slot);
      return log_err(ncclInternalError,
                     "%s: a launch of %d lanes of %u channels exceeds the %u blocks it may take", gx->name,
                     widest, (unsigned)w->nch, gx->grid_max);
    }
    const unsigned grid =
        pair ? (unsigned)gx->pair.send_blocks + gx->pair.recv_blocks : (unsigned)widest * w->nch;
    log_launch(gx, w, f, widest, grid, threads);
    const int overlap = launch_overlap(gx, lc->capturing);
    ncclResult_t res =
        pair ? gpu_launch(f, grid, threads, &gx->pair, sizeof gx->pair, lc->s, overlap)
             : gpu_launch(f, grid, threads, w, small ? sizeof(dev_work_small_t) : sizeof *w, lc->s, overlap);
    if (res != ncclSuccess) {
      wq_cancel(&gx->wq, &slot); /* it never reached the GPU */
      return res;
    }
    if (gx->memo_staged && w->nsteps == 1 && (pair || f == gx->func_ll))
      memo_keep(gx, f, grid, threads, pair);
  }
  w->nsteps = w->nxfers = w->nch = 0;
  w->seq = seq;
  gx->one_way = 1;
  return ncclSuccess;
}

/* Where lanes_check marks a ring: (direction, LL or Simple, peer); a lane may use both rings of a
 * connection when it has transfers on either side of the LL threshold. */
static int ring_mark(const gx_t *gx, const dev_xfer_t *x, int send) {
  int ll = (x->flags & (send ? DEV_XF_LL_SEND : DEV_XF_LL_RECV)) != 0;
  return ((send * 2 + ll) * gx->nranks) + (send ? x->send_peer : x->recv_peer);
}

/* Lanes of one step within the kernel's limits: transfers per lane, and rings (peer, direction, protocol)
 * per lane. `mark` has 4 * nranks entries. */
static ncclResult_t lanes_check(const gx_t *gx, const dev_xfer_t *x, int n, int *mark, uint64_t seq) {
  for (int k = 0; k < 4 * gx->nranks; k++) mark[k] = 0;
  for (int i = 0; i < n;) {
    int j = i, rings = 0;
    for (; j < n && x[j].lane == x[i].lane; j++) {
      if (x[j].send_peer >= 0 && !mark[ring_mark(gx, &x[j], 1)]++) rings++;
      if (x[j].recv_peer >= 0 && !mark[ring_mark(gx, &x[j], 0)]++) rings++;
    }
    for (int k = i; k < j; k++) { /* clear what this lane set, for the next */
      if (x[k].send_peer >= 0) mark[ring_mark(gx, &x[k], 1)] = 0;
      if (x[k].recv_peer >= 0) mark[ring_mark(gx, &x[k], 0)] = 0;
    }
    if (j - i > DEV_LANE_XFERS || rings > DEV_LANE_RINGS)
      return log_err(ncclInvalidUsage,
                     "%s: a group step (call %llu) puts %d transfers over %d connections in one lane; a lane "
                     "takes at most %d transfers and %d connections: split the group",
                     gx->name, (unsigned long long)seq, j - i, rings, DEV_LANE_XFERS, DEV_LANE_RINGS);
    i = j;
  }
  return ncclSuccess;
}

/* Room for n transfers in the list being built. */
static ncclResult_t xf_reserve(gx_t *gx, uint32_t n) {
  if (n <= gx->xf_cap) return ncclSuccess;
  uint32_t cap = gx->xf_cap < 64 ? 64 : gx->xf_cap;
  while (cap < n) cap *= 2;
  dev_xfer_t *xf = realloc(gx->xf, (size_t)cap * sizeof *xf);
  if (xf == NULL) return log_err(ncclSystemError, "%s: out of host memory for %u transfers", gx->name, cap);
  gx->xf = xf;
  gx->xf_cap = cap;
  return ncclSuccess;
}

/* Whether the step has a transfer of at least GX_WIDE_MIN bytes (with `peers`: between ranks, not a local
 * copy). */
static int step_has_wide(const plan_t *plan, const step_t *st, int peers) {
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    if ((!peers || x->send_peer >= 0 || x->recv_peer >= 0) && x->bytes >= GX_WIDE_MIN) return 1;
  }
  return 0;
}

/* Marks the step's dealt transfers (dev.h, "Dealt transfers"): on two ranks, in a ring all-reduce,
 * reduce-scatter, all-gather, broadcast or reduce, each Simple transfer of BRAID_DEALT_MIN_BYTES to
 * BRAID_DEALT_MAX_BYTES that only sends or only receives, over a connection whose rings have chunk marks
 * (p2p), and has no other transfer with a peer in its lane (x, sorted by lane). Both ends of a connection
 * must agree, and do: the step serves the same call on both ranks, the algorithm follows from the call and
 * the knobs (step_t.oneshot, as the planner chose it), and a ring's step on two ranks holds one send and one
 * receive of the same size on each rank, however either rank's buffers lie (a local copy, which one rank may
 * have and the other not, has no peer and changes nothing here), each alone in its lane unless a transfer
 * both receives and sends (the fused all-reduce: none is dealt then, on either rank). One-shot steps,
 * all-to-all, gather, scatter and point-to-point are left out: their ranks' steps may differ in which
 * transfers share a lane. Two ranks have one connection each way, so a step has at most one dealt send, which
 * the step's counters serve. */
static void dealt_mark(const gx_t *gx, const step_t *st, dev_xfer_t *x, int n) {
  const op_kind_t k = st->task->kind;
  if (gx->dealt_min == 0 || gx->nranks != 2 || st->oneshot ||
      (k != OP_ALLREDUCE && k != OP_REDUCESCATTER && k != OP_ALLGATHER && k != OP_BROADCAST &&
       k != OP_REDUCE))
    return;
  for (int i = 0; i < n; i++) {
    const int send = x[i].send_peer >= 0, peer = send ? x[i].send_peer : x[i].recv_peer;
    if (send == (x[i].recv_peer >= 0) || (x[i].flags & DEV_XF_LL) || x[i].bytes < gx->dealt_min ||
        (gx->dealt_max != 0 && x[i].bytes > gx->dealt_max) ||
        !(gx->peer_caps[peer] & (send ? PEER_MARKS_TO : PEER_MARKS_FROM)))
      continue;
    int alone = 1;
    for (int j = 0; j < n; j++)
      alone &= j == i || x[j].lane != x[i].lane || (x[j].send_peer < 0 && x[j].recv_peer < 0);
    x[i].dealt = (uint8_t)alone;
  }
}

/* Whether the step's transfers take up to gx->rings channels instead of gx->nch (gx_rings): on two ranks a
 * one-way collective's, and with BRAID_WIDE_STEPS=2 or more (3 by default) an all-reduce's or a
 * reduce-scatter's whose largest transfer moves at least GX_WIDE_MIN. On two ranks those have no local copy,
 * so at most two lanes (the send and the receive) however their buffers lie, and both ranks' steps hold
 * transfers of the same sizes (each rank sends one block and receives the other). Every rank's step of a
 * collective serves the same call, so both ends of its connections agree; point-to-point steps never do, as
 * their ranks' steps differ (wide_p2p takes their transfers one by one). */
static int wide_step(const gx_t *gx, const plan_t *plan, const step_t *st) {
  const op_kind_t k = st->task->kind;
  if (gx->rings <= gx->nch || gx->wide < 1) return 0;
  if (one_way_kind(k)) return 1;
  if (gx->wide < 2 || (k != OP_ALLREDUCE && k != OP_REDUCESCATTER)) return 0;
  return step_has_wide(plan, st, 0);
}

/* Whether a step of send/receive, all-to-all or all-gather takes the rings' channels for its transfers of at
 * least GX_WIDE_MIN (BRAID_WIDE_STEPS=3, two ranks). The channels of each transfer between the ranks follow
 * from its own size, which both ends know alike, since the two ranks' steps may hold different transfers:
 * one may copy its own block (out of place) where the other does not (in place), or send to itself, or group
 * its point-to-point calls differently. Returns 1 when some such transfer is that large; the step's local
 * copies then join a peer's lane (assign_lanes), so that it has two lanes at most, as the grid asks of lanes
 * of the rings' channels. */
static int wide_p2p(const gx_t *gx, const plan_t *plan, const step_t *st) {
  const op_kind_t k = st->task->kind;
  if (gx->rings <= gx->nch || gx->wide < 3 || gx->nranks != 2 ||
      (k != OP_SEND && k != OP_RECV && k != OP_ALLTOALL && k != OP_ALLGATHER))
    return 0;
  return step_has_wide(plan, st, 1);
}

/* ---- What the copy-engine path asks of the executor (ce_exec_t) ---- */

typedef struct {
  gx_t *gx;
  const launch_ctx_t *lc;
} exec_ctx_t;

static ncclResult_t exec_wait(void *arg, cudaStream_t stream, uint32_t *raise, uint32_t *word, int peer,
                              int is_send, uint64_t seq) {
  const exec_ctx_t *c = arg;
  dev_wait_t w = {
      .comm = c->gx->dcomm, .word = word, .raise = raise, .seq = seq, .peer = peer, .is_send = is_send};
  return gpu_launch(c->gx->func_wait, 1, 32, &w, sizeof w, stream, launch_overlap(c->gx, c->lc->capturing));
}

static ncclResult_t exec_combine(void *arg, cudaStream_t stream, const xfer_t *x, const char *from,
                                 uint32_t *word, int peer, uint64_t seq, uint32_t nchunks,
                                 const uint64_t *ends) {
  const exec_ctx_t *c = arg;
  dev_combine_t w = {.comm = c->gx->dcomm,
                     .word = word,
                     .from = from,
                     .seq = seq,
                     .peer = peer,
                     .nchunks = nchunks,
                     .tile = from != NULL ? c->gx->pull_tile : 0};
  fill_xfer(c->gx, x, 0, 0, 1, &w.x);
  memcpy(w.ends, ends, nchunks * sizeof *ends);
  return gpu_launch(c->gx->func_combine, from != NULL ? c->gx->pull_blocks : c->gx->combine_blocks,
                    DEV_THREADS, &w, sizeof w, stream, launch_overlap(c->gx, c->lc->capturing));
}

static ncclResult_t exec_push(void *arg, cudaStream_t stream, dev_push_t *w) {
  const exec_ctx_t *c = arg;
  w->comm = c->gx->dcomm;
  return gpu_launch(c->gx->func_push, c->gx->push_blocks, DEV_THREADS, w, sizeof *w, stream,
                    launch_overlap(c->gx, c->lc->capturing));
}

/* The graph being captured keeps `mapping` (its token unmaps it when the graph is destroyed); on failure
 * the caller still owns it. */
static ncclResult_t exec_keep(void *arg, gpu_mem_t *mapping) {
  const exec_ctx_t *c = arg;
  tbuf_t *b = calloc(1, sizeof *b);
  if (b == NULL) return log_err(ncclSystemError, "%s: out of host memory for a graph token", c->gx->name);
  b->mapped = mapping;
  b->next = c->lc->token->bufs;
  c->lc->token->bufs = b;
  return ncclSuccess;
}

/* Appends step `s` of the plan to the launch being built, launching first when it would not fit: in the
 * parameters or the work queue, or in the grid (a launch's blocks wait for each other, so they must all run
 * at once: at most grid_max of them, the widest step's lanes of nch channels, which a wide step's two lanes
 * of more channels also fit but not beside a wider step). */
static ncclResult_t add_step(gx_t *gx, const plan_t *plan, int s, const launch_ctx_t *lc) {
  const step_t *st = &plan->steps[s];
  dev_work_t *w = &gx->work;
  if (st->ce) { /* after the steps before it, on the same stream */
    if (gx->ce == NULL)
      return log_err(ncclInternalError, "%s: a copy-engine step (call %llu) on an executor without them",
                     gx->name, (unsigned long long)st->task->seq);
    CHECK(flush(gx, lc, st->task->seq));
    exec_ctx_t c = {gx, lc};
    const ce_exec_t ex = {
        .wait = exec_wait, .combine = exec_combine, .push = exec_push, .keep = exec_keep, .arg = &c};
    return ce_step(gx->ce, plan, s, lc->s, lc->capturing, &ex);
  }
  /* an eager launch's list must fit the queue (an entry is a header and the list) */
  uint64_t max = DEV_MAX_SPILL, fits = (gx->wq.cap - WQ_ALIGN) / sizeof(dev_xfer_t);
  if (!lc->capturing && fits < max) max = fits;
  if ((uint64_t)st->count > max)
    return log_err(ncclInvalidUsage,
                   "%s: a group step of %d transfers on one GPU exceeds the %llu a launch takes%s", gx->name,
                   st->count, (unsigned long long)max,
                   lc->capturing ? "" : " (with this NCCL_WORK_FIFO_BYTES)");
  if (w->nsteps == DEV_MAX_STEPS || w->nxfers + (uint64_t)st->count > max)
    CHECK(flush(gx, lc, st->task->seq));
  CHECK(xf_reserve(gx, w->nxfers + st->count));
  dev_xfer_t *x = &gx->xf[w->nxfers];
  const int p2p = wide_p2p(gx, plan, st);
  const int cap = p2p || wide_step(gx, plan, st) ? gx->rings : gx->nch;
  unsigned nch = 0;
  for (int i = 0; i < st->count; i++) {
    const xfer_t *in = &plan->xfers[st->first + i];
    /* wide_p2p: a transfer between the ranks by its own size, a local copy wide */
    const int own = p2p && (in->send_peer >= 0 || in->recv_peer >= 0) && in->bytes < GX_WIDE_MIN;
    fill_xfer(gx, in, one_way_kind(st->task->kind), (uint16_t)(st->task - plan->tasks), own ? gx->nch : cap,
              &x[i]);
    if (x[i].nch > nch) nch = x[i].nch;
  }
  if (w->nsteps == 0 && plan->nsteps == 1 && !lc->capturing) {
    int launched;
    CHECK(memo_launch(gx, lc, st->count, p2p, x, &launched));
    if (launched) return ncclSuccess;
  }
  int parent[2 * GX_MAX_RANKS + 1], lane_of[2 * GX_MAX_RANKS + 1], mark[4 * GX_MAX_RANKS];
  const int lanes = assign_lanes(x, st->count, gx->nranks, p2p, parent, lane_of);
  dealt_mark(gx, st, x, st->count);
  CHECK(lanes_check(gx, x, st->count, mark, st->task->seq));
  const unsigned widest = (unsigned)widest_step(w, lanes);
  if (w->nsteps > 0 && widest * (nch > w->nch ? nch : w->nch) > gx->grid_max) {
    const uint16_t before = w->nxfers; /* the earlier steps go alone; this one opens the next launch */
    CHECK(flush(gx, lc, st->task->seq));
    memmove(gx->xf, gx->xf + before, (size_t)st->count * sizeof *x);
  }
  if (!one_way_kind(st->task->kind)) gx->one_way = 0;
  if (nch > w->nch) w->nch = nch;
  w->step_lanes[w->nsteps] = (uint16_t)lanes;
  w->nxfers = (uint16_t)(w->nxfers + st->count);
  w->step_end[w->nsteps++] = w->nxfers;
  return ncclSuccess;
}

/* ---- The same calls again ---- */

/* A group's calls, enqueued again with the same arguments, build the same plan: plan_build depends on nothing
 * else that changes while the executor lives (rank, ranks and the knobs are fixed, and the in-place
 * all-to-all's staging is reached only through gx_scratch, which runs on the full path). When the last eager
 * gx_launch of the executor was one step that the memo launched or kept, and the copy engines had no
 * candidate in it (a candidate step is offered to the peer, which expects the offer whatever came before),
 * the same calls again (every argument but the call's number; the stream may change, as the memo's
 * parameters do not depend on it) are launched from the memo by gx_relaunch, before plan_build: the plan,
 * the copy engines' offer and the transfers are skipped as well as the lanes, about 38% of the instructions
 * of a small eager call (docs/perf-notes.md, 92). Any other gx_launch forgets the calls first, and so does a
 * gx_relaunch that finds other calls, or a capture, as the full path follows it. */
static int same_call(const task_t *a, const task_t *b) {
  return a->kind == b->kind && a->sendbuff == b->sendbuff && a->recvbuff == b->recvbuff &&
         a->count == b->count && a->type == b->type && a->op == b->op && a->root == b->root &&
         a->red.kind == b->red.kind && a->red.type == b->red.type && a->red.fscale == b->red.fscale &&
         a->red.iscale == b->red.iscale && a->red.divisor == b->red.divisor &&
         a->red.scalar_dev == b->red.scalar_dev;
}

static int recall_matches(const recall_t *r, const plan_t *plan) {
  if (plan->ntasks != r->ntasks) return 0;
  for (int i = 0; i < r->ntasks; i++)
    if (!same_call(&r->tasks[i], &plan->tasks[i])) return 0;
  return 1;
}

/* After a gx_launch: its calls become the recall's when its one step came from the memo or filled it. */
static void recall_keep(gx_t *gx, const plan_t *plan, int capturing) {
  if (capturing || !gx->memo_used || plan->nsteps != 1 || plan->ntasks > GX_RECALL_TASKS ||
      ce_offered(gx->ce))
    return;
  gx->recall.ntasks = plan->ntasks;
  memcpy(gx->recall.tasks, plan->tasks, (size_t)plan->ntasks * sizeof *plan->tasks);
  gx->recall.valid = 1;
}

/* What every launch, built or relaunched, does first: the executor's device current, retired executors and
 * released graph tokens freed, and whether `s` is capturing (into `graph`, capture `id`). On success the
 * caller leaves `scope`; on failure it is left here. */
static ncclResult_t launch_open(gx_t *gx, cudaStream_t s, gpu_scope_t *scope, int *capturing, void **graph,
                                uint64_t *id) {
  CHECK(gpu_enter(gx->dev, scope));
  gx_sweep();
  tokens_sweep(gx);
  ncclResult_t res = gpu_stream_capture(s, capturing, graph, id);
  if (res != ncclSuccess) gpu_leave(scope);
  return res;
}

ncclResult_t gx_launch(gx_t *gx, const plan_t *plan) {
  if (plan->ntasks == 0) return ncclSuccess;
  launch_ctx_t lc = {.s = plan->tasks[0].stream, .op = plan_op_name(plan->tasks[0].kind)};
  gpu_scope_t scope;
  void *graph = NULL;
  uint64_t capture_id = 0;
  CHECK(launch_open(gx, lc.s, &scope, &lc.capturing, &graph, &capture_id));
  ncclResult_t res;
  /* from here on the graph holds the communicator (gx_graphs) */
  if (lc.capturing) CHECK_GOTO(token_for(gx, graph, capture_id, &lc.token), res, out);
  CHECK_GOTO(before(gx, plan, lc.s, lc.capturing), res, out);
  gx->group_first_tag = gx->wq.next_tag;
  gx->work.nsteps = gx->work.nxfers = gx->work.nch = 0;
  gx->work.seq = plan->tasks[0].seq;
  gx->one_way = 1;
  gx->memo_staged = gx->memo_used = 0;
  gx->recall.valid = 0;
  for (int i = 0; i < plan->nsteps; i++) CHECK_GOTO(add_step(gx, plan, i, &lc), res, out);
  CHECK_GOTO(flush(gx, &lc, 0), res, out);
  res = after(gx, plan, lc.s, lc.capturing);
  if (res == ncclSuccess) recall_keep(gx, plan, lc.capturing);
out:
  gpu_leave(&scope);
  return res;
}

ncclResult_t gx_relaunch(gx_t *gx, const plan_t *plan, int *took) {
  *took = 0;
  if (!gx->recall.valid || !recall_matches(&gx->recall, plan) || log_enabled(LOG_TRACE, LOG_TUNING)) {
    gx->recall.valid = 0; /* the full path follows, which may change what the memo's launch depends on */
    return ncclSuccess;
  }
  const cudaStream_t s = plan->tasks[0].stream;
  gpu_scope_t scope;
  int capturing = 0;
  void *graph = NULL;
  uint64_t capture_id = 0;
  ncclResult_t res = launch_open(gx, s, &scope, &capturing, &graph, &capture_id);
  if (res != ncclSuccess || capturing) { /* a graph gets storage of its own: the full path */
    gx->recall.valid = 0;
    if (res == ncclSuccess) gpu_leave(&scope);
    return res;
  }
  *took = 1;
  res = before(gx, plan, s, 0);
  if (res == ncclSuccess) {
    gx->group_first_tag = gx->wq.next_tag;
    res = memo_fire(gx, plan->tasks[0].seq, s);
  }
  if (res == ncclSuccess) res = after(gx, plan, s, 0);
  if (res == ncclSuccess)
    gx->relaunches++;
  else
    gx->recall.valid = 0;
  gpu_leave(&scope);
  return res;
}

uint64_t gx_relaunches(const gx_t *gx) {
  return gx == NULL ? 0 : gx->relaunches;
}

void gx_set_ce(gx_t *gx, ce_t *ce) {
  if (gx != NULL) gx->ce = ce;
}

int gx_graphs(gx_t *gx) {
  return gx == NULL ? 0 : atomic_load_explicit(&gx->graphs, memory_order_acquire);
}

/* ---- Retired executors ---- */

/* Executors retired while graphs held them, until the last graph goes. */
static pthread_mutex_t retired_lock = PTHREAD_MUTEX_INITIALIZER;
static gx_t *retired;
static _Atomic int nretired;

void gx_retire(gx_t *gx, void (*release)(void *), void *arg) {
  gx->retire_free = release;
  gx->retire_arg = arg;
  INFO(LOG_INIT,
       "%s rank %d: %d CUDA graphs still hold the communicator; its device memory is kept until they "
       "are destroyed",
       gx->name, gx->rank, gx_graphs(gx));
  pthread_mutex_lock(&retired_lock);
  gx->retired_next = retired;
  retired = gx;
  atomic_fetch_add(&nretired, 1);
  pthread_mutex_unlock(&retired_lock);
}

void gx_sweep(void) {
  if (atomic_load_explicit(&nretired, memory_order_relaxed) == 0) return;
  gx_t *done = NULL;
  pthread_mutex_lock(&retired_lock);
  for (gx_t **pp = &retired; *pp != NULL;) {
    gx_t *gx = *pp;
    if (gx_graphs(gx) > 0) {
      pp = &gx->retired_next;
      continue;
    }
    *pp = gx->retired_next;
    gx->retired_next = done;
    done = gx;
    atomic_fetch_sub(&nretired, 1);
  }
  pthread_mutex_unlock(&retired_lock);
  while (done != NULL) {
    gx_t *gx = done;
    done = gx->retired_next;
    void (*release)(void *) = gx->retire_free;
    void *arg = gx->retire_arg;
    /* a stuck kernel keeps the connections too (gx_destroy said so) */
    if (gx_destroy(gx) == ncclSuccess && release != NULL) release(arg);
  }
}

void gx_abort(gx_t *gx) {
  if (gx != NULL && gx->flags != NULL) __atomic_store_n(&gx->flags->abort, 1, __ATOMIC_RELEASE);
}

ncclResult_t gx_error(gx_t *gx) {
  if (gx == NULL || gx->flags == NULL) return ncclSuccess;
  const dev_error_t *e = &gx->flags->error;
  int32_t code = __atomic_load_n(&e->code, __ATOMIC_ACQUIRE);
  if (code == DEV_OK) return ncclSuccess;
  ncclResult_t res = code == DEV_ERR_ABORTED   ? ncclInternalError
                     : code == DEV_ERR_TIMEOUT ? ncclRemoteError
                                               : ncclInternalError;
  if (gx->reported) return res;
  gx->reported = 1;
  if (code == DEV_ERR_ABORTED)
    return log_err(res, "%s rank %d: the communicator was aborted while a kernel waited", gx->name, gx->rank);
  if (e->channel < 0) /* a copy-engine step's wait (dev_wait_t) */
    return log_err(res,
                   "%s rank %d: a copy-engine step waited %.1f s for rank %d %s (call %lu) and gave up "
                   "(BRAID_TIMEOUT_S); the peer is gone or stuck",
                   gx->name, gx->rank, e->waited_ns / 1e9, e->peer,
                   e->is_send ? "to free its output" : "to finish its copy", (unsigned long)e->seq);
  return log_err(res,
                 "%s rank %d: a kernel waited %.1f s %s rank %d on channel %d (call %lu) and gave up "
                 "(BRAID_TIMEOUT_S); the peer is gone or stuck",
                 gx->name, gx->rank, e->waited_ns / 1e9, e->is_send ? "for room to send to" : "for data from",
                 e->peer, e->channel, (unsigned long)e->seq);
}

ncclResult_t gx_destroy(gx_t *gx) {
  if (gx == NULL) return ncclSuccess;
  gpu_scope_t scope;
  int entered = gpu_enter(gx->dev, &scope) == ncclSuccess;
  if (wait_last(gx) != ncclSuccess) {
    /* a kernel may still run: its memory stays allocated rather than freed under it */
    WARN(
        "%s rank %d: its device memory is left allocated rather than freed under a kernel that may still run",
        gx->name, gx->rank);
    if (entered) gpu_leave(&scope);
    return ncclSystemError;
  }
  for (int i = 0; i < gx->njoins; i++) gpu_event_destroy(gx->joins[i]);
  free(gx->joins);
  if (gx->done != NULL) gpu_event_destroy(gx->done);
  if (gx->capture_join != NULL) gpu_event_destroy(gx->capture_join);
  if (gx->scratch != NULL) {
    mem_release(gx->acct, gpu_mem_size(gx->scratch), 1);
    gpu_mem_release(gx->scratch);
  }
  if (gx->mem != NULL) {
    mem_release(gx->acct, gpu_mem_size(gx->mem), 1);
    gpu_mem_release(gx->mem);
  }
  if (gx->flags != NULL) gpu_host_free(gx->flags);
  tokens_sweep(gx); /* every graph is gone (the callers make sure): every token is released */
  if (gx->q_dev != NULL) {
    mem_release(gx->acct, gpu_mem_size(gx->q_dev), 1);
    gpu_mem_release(gx->q_dev);
  }
  if (gx->q_host != NULL) {
    mem_release(gx->acct, gx->wq.cap, 0);
    gpu_host_free(gx->q_host);
  }
  wq_free(&gx->wq);
  free(gx->xf);
  mem_free(gx->acct, gx->peer_caps, (size_t)gx->nranks);
  ce_destroy(gx->ce);
  if (entered) gpu_leave(&scope);
  mem_free(gx->acct, gx, sizeof *gx);
  return ncclSuccess;
}
