/*
 * The planner: turns the calls of one group on one communicator (tasks) into a plan of transfers.
 *
 * A plan is a list of steps, one per collective (all point-to-point calls of the group share one last step);
 * a step is a set of transfers that run concurrently, each streaming bytes through the connections. A
 * transfer may receive from one peer, combine what it receives with local data, store the result and forward
 * it to another peer, all piece by piece, so a ring or chain algorithm is a single pipelined step. Transfers
 * of one step that use the same connection run in list order; that order is what keeps data dependencies.
 *
 * plan_build is a pure function of (rank, nranks, tasks, tuning): every rank derives the same algorithm,
 * chunking and connections from the same calls (DESIGN.md, principle 2). The algorithm of a collective is a
 * function of the call (kind, size, type, operation) and of knobs that must be equal on every rank, never of
 * the rank or of its buffers.
 *
 * Two families: rings (chains along the ring for broadcast and reduce), which every executor runs, and
 * one-shot algorithms for small calls on the GPU executor, where every rank sends its data straight to the
 * ranks that need it (one hop instead of up to 2 (n - 1)) and reduces what arrives in rank order.
 */
#ifndef BRAID_CORE_PLAN_H
#define BRAID_CORE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "gpu/host_reduce.h"

/* What a call asks for. */
typedef enum {
  OP_ALLREDUCE,
  OP_BROADCAST,
  OP_REDUCE,
  OP_ALLGATHER,
  OP_REDUCESCATTER,
  OP_ALLTOALL,
  OP_GATHER,
  OP_SCATTER,
  OP_SEND,
  OP_RECV,
  OP_COUNT
} op_kind_t;

/* One collective or point-to-point call, as enqueued. */
typedef struct {
  op_kind_t kind;
  const void *sendbuff;
  void *recvbuff;
  size_t count; /* elements, as the call gave them (per rank / per block as NCCL defines) */
  ncclDataType_t type;
  ncclRedOp_t op;      /* as the call gave it (ncclSum for non-reducing calls) */
  int root;            /* root of rooted collectives, peer of send/recv, -1 otherwise */
  red_t red;           /* the reduction, resolved when the call was enqueued */
  uint64_t seq;        /* this call's sequence number on its communicator, for diagnostics */
  cudaStream_t stream; /* the call's stream (GPU backend) */
  /* how the call runs, chosen by the tuner (core/tune.h) before plan_build on the GPU executor; the host
   * executor runs rings */
  uint8_t algo;  /* plan_algo_t */
  uint8_t split; /* a ring all-reduce on two ranks as two steps: a reduce-scatter, then an all-gather of the
                    reduced halves */
} task_t;

/* Flags of a transfer. */
enum {
  XF_REDUCE = 1 << 0,  /* combine `src` with what is received */
  XF_PREPARE = 1 << 1, /* `src` is this rank's raw input: prepare it (PreMulSum scaling) before use */
  XF_LAST = 1 << 2,    /* the final combine of a reduction (integer average divides here) */
  /* GPU executor only (one-shot algorithms; the host executor never sees them): */
  XF_SEQ = 1 << 3,      /* runs in one lane with every other XF_SEQ transfer of its step, in list order, so a
                           transfer may read what an earlier one of them stored at the same offsets (each block
                           moves the same part of each), whatever their connections; all of a step's XF_SEQ
                           transfers are of one size */
  XF_PREPARED = 1 << 4, /* `src` holds prepared contributions (a running result): combined as a plain sum for
                           PreMulSum instead of being scaled again */
};
/* A transfer with XF_REDUCE and no receive peer (GPU executor only) combines two local operands:
 * dst = prepare(src) (+) dst. */

/* One streaming transfer. Without a receive peer the data comes from `src` (a local copy or a send). */
typedef struct {
  int recv_peer;      /* rank to receive from, -1 for none */
  int send_peer;      /* rank to send (or forward) to, -1 for none */
  const char *src;    /* local operand: data to send or copy, or to combine with what arrives; may be NULL */
  char *dst;          /* where the result is stored; NULL when it is only forwarded */
  size_t bytes;       /* data bytes (wire bytes are rounded up to XF_ALIGN) */
  uint32_t esize;     /* element size: pieces are whole elements */
  uint32_t flags;     /* XF_* */
  const red_t *red;   /* the reduction for XF_REDUCE / XF_PREPARE */
  size_t done;        /* progress: wire bytes moved so far */
  char *ce_dst;       /* a send the copy engines move: the receiver's output, mapped here (core/ce.h) */
  const char *ce_src; /* a receive pulled by this rank's combine (STEP_CE_PULL): the sender's input, mapped
                         here */
} xfer_t;

/* Every transfer starts at a multiple of this many bytes of its connection's stream. */
#define XF_ALIGN 16

/* A set of transfers that run concurrently; the next step starts when all are done. */
typedef struct {
  int first, count;   /* range in plan_t.xfers */
  const task_t *task; /* the call this step serves (the first point-to-point call for the p2p step) */
  int ce;             /* 0, or how it bypasses the rings, as both ranks agreed (core/ce.h): STEP_CE_* */
  int oneshot;        /* a one-shot algorithm built it (every rank's step of the call alike) */
} step_t;

/* step_t.ce: the copy engines write the receiver's outputs; or a reduction's receiver combines the sender's
 * input, read where it is by its combine kernel; or one kernel of the sender writes the receiver's outputs
 * (a step that only copies, below the copy engines' threshold). */
enum { STEP_CE_COPY = 1, STEP_CE_PULL = 2, STEP_CE_PUSH = 3 };

/* A communicator's plan for one group. Its arrays grow and are reused, so building allocates nothing once
 * warm. */
typedef struct {
  task_t *tasks; /* the group's calls, in call order */
  int ntasks, cap_tasks;
  xfer_t *xfers;
  int nxfers, cap_xfers;
  step_t *steps;
  int nsteps, cap_steps;
  char *scratch; /* staging for in-place all-to-all (host memory) */
  size_t scratch_bytes;
  char *ext_scratch; /* when set, staging provided by the executor (device memory) instead of `scratch` */
  size_t ext_scratch_bytes;
} plan_t;

/* Algorithms of a collective (NCCL_ALGO's names). */
typedef enum { ALGO_RING, ALGO_ONESHOT, ALGO_COUNT } plan_algo_t;
#define ALGO_MASK_ALL ((1u << ALGO_COUNT) - 1)

/* Ranks of a communicator up to which one-shot algorithms can run: each rank receives from every other in
 * one lane, whose rings the GPU executor bounds (gpu_work.c checks this against the kernel's limit). */
#define PLAN_ONESHOT_MAX_RANKS 32

/* The LL protocol carries transfers of at most this many bytes, in one slice (device/dev.h); the tuner also
 * holds each channel's part within half of its LL ring (tune.c). */
#define PLAN_LL_MAX (1024ull * 1024)

/* The size of a call as the tuning sees it: the per-rank buffer of all-reduce, broadcast and reduce; the
 * whole output of all-gather and the whole input of reduce-scatter (as NCCL counts them). */
uint64_t plan_call_bytes(const task_t *t, int nranks);
/* Whether a call leaves every buffer as it is: on one rank, in place, with an operation that keeps a lone
 * operand (every built-in one, the average included). Such a call is not planned, launched or captured. */
int plan_call_is_noop(const task_t *t, int nranks);
/* "Ring", "OneShot". */
const char *plan_algo_name(plan_algo_t algo);

/* Appends a call to the plan's task list. */
ncclResult_t plan_add_task(plan_t *plan, const task_t *task);
/* Builds steps and transfers for the tasks of the plan, for `rank` of `nranks`. Rings move their blocks in
 * slices of at most `slice_bytes`, which must be at most the connections' ring size: a transfer larger than
 * the ring would wait for a peer that waits for it. `tuned`: each task's algorithm is its task_t.algo and
 * .split (GPU executor); 0: rings only, what the host executor runs. */
ncclResult_t plan_build(plan_t *plan, int rank, int nranks, size_t slice_bytes, int tuned);
/* Bytes of staging the plan's calls need on `rank` (in-place all-to-all, in-place one-shot reductions):
 * what plan_build takes from plan->scratch or plan->ext_scratch. */
size_t plan_scratch_need(const plan_t *plan, int rank, int nranks, int tuned);
/* Building blocks of a plan built by hand (the shared-GPU path's local work): appends a transfer; opens a
 * step for `task` at the next transfer, and closes the last one, dropping it when it got no transfer. */
ncclResult_t plan_add_xfer(plan_t *plan, const xfer_t *x);
ncclResult_t plan_open_step(plan_t *plan, const task_t *task);
void plan_close_step(plan_t *plan);
/* Forgets the tasks and steps (keeps the arrays). */
void plan_reset(plan_t *plan);
/* Frees the arrays. */
void plan_free(plan_t *plan);
/* Estimated time of the plan in microseconds, from a simple latency/bandwidth model (ncclGroupSimulateEnd).
 */
double plan_estimate_us(const plan_t *plan, int nranks);
/* The name of a call kind ("AllReduce", ...). */
const char *plan_op_name(op_kind_t kind);
/* Whether bytes [a, a + na) and [b, b + nb) share a byte (an empty range, or NULL, shares none): where one
 * transfer writes what another reads. */
static inline int plan_overlap(const void *a, uint64_t na, const void *b, uint64_t nb) {
  const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return a != NULL && b != NULL && na > 0 && nb > 0 && x < y + nb && y < x + na;
}

#endif
