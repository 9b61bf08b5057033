/*
 * What the GPU executor's three files share (gpu_exec.c, gpu_work.c, gpu_graphs.c); nothing else includes
 * it. gpu_exec.h says what the executor does.
 */
#ifndef BRAID_CORE_GPU_EXEC_INT_H
#define BRAID_CORE_GPU_EXEC_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/gpu_exec.h"
#include "core/tune.h"
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
  int nch;        /* channels a transfer takes at most: what the widest step's lanes fit (tune_channels) */
  int rings;      /* rings per connection (tune_rings): the channels of wide steps' transfers (wide_step) */
  tp_link_t link; /* the slowest link to a peer (tune_call_t.link) */
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
  int overlap;               /* BRAID_LAUNCH_PDL, as far as the device and driver have it: which launches may
                              * overlap the stream's previous kernel (1: eager ones, 2: captured ones too;
                              * launch_overlap) */
  int one_way;               /* the launch being built has one-way steps only (one_way_kind) */
  const tune_shape_t *first; /* the shape of its first step's call (launch_batch) */
  tune_shape_t *shapes;      /* [ntasks] each call's shape (gx_tune) */
  int cap_shapes;
  ce_t *ce;                  /* moves the steps marked for the copy engines (gx_set_ce); owned */
  int spread;                /* lanes of the widest step (BRAID_SPREAD): narrower launches spread their blocks
                              * over a grid of that many lanes (dev_comm_t.interleave); 0: never */
  uint8_t *peer_caps;        /* [nranks] PEER_* bits: what the connections to and from each peer have */
  gpu_mem_t *mem;            /* the ring tables, counters and barrier dcomm points at */
  dev_comm_t dcomm;          /* the kernels' view, passed by value in every launch's work */
  flags_t *flags;            /* host address of the host-mapped flags */
  gpu_event_t *done;         /* recorded after each eager launch */
  gpu_event_t *capture_join; /* joins a captured group's streams */
  int launched;              /* done was recorded at least once */
  int copies_only;           /* the launch being built has only enqueued copies (no kernel) so far */
  int last_captured;         /* the last gx_launch was captured (gx_captured) */
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

/* Ranks of one GPU communicator at most (lane assignment works on the stack). */
enum { GX_MAX_RANKS = 1024 };

/* Seconds past BRAID_TIMEOUT_S after which a launch that has not finished means the GPU is stuck. */
enum { GX_STUCK_MARGIN_S = 5 };

/* One allocation a token owns: device memory, and the page-locked copy it is filled from (or NULL); or a
 * mapping of the peer's memory that a copy-engine step writes (ce_exec_t.keep). */
typedef struct tbuf {
  struct tbuf *next;
  gpu_mem_t *mem;
  void *stage;
  size_t stage_bytes;
  gpu_mem_t *mapped;
} tbuf_t;

/* What every launch of one gx_launch shares. */
typedef struct {
  cudaStream_t s;
  int capturing;
  token_t *token; /* captured: the storage the graph owns */
  const char *op; /* the group's first call, for messages */
} launch_ctx_t;

/* Whether a launch may overlap the stream's previous kernel (gpu_launch): every entry point waits for that
 * kernel's stores before it touches memory, so the GPU can take the launch in and place its blocks while the
 * previous kernel ends, which hides part of the launch gap. Eager launches with BRAID_LAUNCH_PDL >= 1,
 * captured ones with 2 (the default) on a driver that keeps it in a graph. */
static inline int gx_overlaps(const gx_t *gx, int capturing) {
  return gx->overlap >= (capturing ? 2 : 1);
}

/* gpu_work.c: appends step s of the plan to the launch being built (launching first when it would not fit);
 * launches what was built (if anything) and starts the next launch as call `seq`; launches the memo again as
 * call `seq` (gx_relaunch). */
ncclResult_t gx_add_step(gx_t *gx, const plan_t *plan, int s, const launch_ctx_t *lc);
ncclResult_t gx_flush(gx_t *gx, const launch_ctx_t *lc, uint64_t seq);
ncclResult_t gx_memo_fire(gx_t *gx, uint64_t seq, cudaStream_t s);
/* gpu_exec.c: an eager launch's spilled list in a work-queue entry. */
ncclResult_t gx_queue_place(gx_t *gx, const launch_ctx_t *lc, uint64_t spill, wq_slot_t *slot);
/* gpu_graphs.c: the token of the graph being captured (made at its first launch); storage it owns; a
 * mapping it keeps; a captured launch's spilled list in storage it owns; and the freeing of tokens whose
 * graphs are gone. */
ncclResult_t gx_token_for(gx_t *gx, void *graph, uint64_t capture_id, token_t **t_p);
ncclResult_t gx_token_alloc(gx_t *gx, token_t *t, size_t bytes, int staged, tbuf_t **b_p);
ncclResult_t gx_token_keep(gx_t *gx, token_t *t, gpu_mem_t *mapping);
ncclResult_t gx_capture_place(gx_t *gx, const launch_ctx_t *lc, uint64_t spill);
void gx_tokens_sweep(gx_t *gx);

#endif
