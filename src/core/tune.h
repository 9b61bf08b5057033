/*
 * How a call runs on the GPU executor, read from one table (DESIGN.md, principle 8).
 *
 * tune_call maps a call (collective, type, operation, size, ranks, channels, links, placement, capture) and
 * the knobs every rank agreed on to the call's shape: the algorithm the planner builds, and what the executor
 * makes of the call's transfers (protocol, channels, wider steps, dealt pieces, batches). It is a pure
 * function of its arguments and the table: it never reads the executor's state, so every rank derives the
 * same shape from the same call (principle 2). The planner receives the algorithm in task_t.algo; the
 * executor the rest. Which kernel entry point a launch takes is not a row: it follows from the launch's
 * transfers alone (core/gpu_work.c), so that fewer entry points is a change of the device side only.
 *
 * The table has two parts (tune.c). Algorithm rows are keyed by collective, rank count and the call's bytes
 * (plan_call_bytes); the first that matches names the algorithm, Ring where none does. Transfer rows are
 * keyed by collective, rank count and link, and give bands on the bytes of each transfer: LL up to one size,
 * LL128 above it up to another, Simple beyond, a channel per so many bytes, and when a step takes the rings'
 * wider channels, deals its pieces or caps its batches. One-rank communicators, or four and eight GPUs, are
 * rows to add, not code.
 *
 * Knobs override rows: NCCL_ALGO and NCCL_PROTO exclude algorithms and protocols (NCCL's syntax), and each
 * BRAID_* tuning knob, where set, replaces the value of every row it names (tune_knobs).
 */
#ifndef BRAID_CORE_TUNE_H
#define BRAID_CORE_TUNE_H

#include <stdint.h>

#include "nccl.h"
#include "core/plan.h"
#include "gpu/host_reduce.h"
#include "transport/transport.h"

/* What the tuner is asked: one call of a communicator. */
typedef struct {
  op_kind_t kind;
  ncclDataType_t type;
  red_kind_t red; /* the resolved reduction (task_t.red.kind) */
  uint64_t bytes; /* plan_call_bytes */
  int nranks;
  int nch;                             /* channels a transfer takes at most, agreed at init (tune_channels) */
  tp_link_t link;                      /* the slowest link to a peer (p2p links carry LL rings) */
  uint8_t in_place, graph, registered; /* no row tells these apart yet */
} tune_call_t;

/* When a step's transfers take the rings' channels (tune_rings) instead of the communicator's: never; every
 * step; a step with a transfer of at least wide_min bytes; each transfer between the ranks of at least
 * wide_min bytes by its own size, the step's local copies joining a peer's lane (core/gpu_work.c). */
typedef enum { TUNE_WIDE_NONE, TUNE_WIDE_STEP, TUNE_WIDE_BIG, TUNE_WIDE_EACH } tune_wide_t;

/* The answer: how the call runs. */
typedef struct {
  plan_algo_t algo;
  uint8_t split;   /* a ring all-reduce on two ranks as two steps (plan.h, task_t.split) */
  const char *why; /* the row or knob that chose the algorithm, in a few words */
  /* each transfer, by its bytes */
  uint64_t ll_max;    /* at most this: LL (0: none) */
  uint64_t ll128_max; /* above ll_max with a peer, at most this: LL128 (0: none) */
  uint64_t ll_part;   /* an LL transfer takes a channel per this many bytes, at most ll_nch */
  uint64_t ch_bytes;  /* a Simple transfer a channel per this many, at most the step's cap */
  uint8_t ll_nch;     /* channels of an LL transfer at most */
  uint8_t ll128_nch;  /* channels of an LL128 transfer (and of an LL copy beside one) */
  uint8_t wide;       /* tune_wide_t */
  uint64_t wide_min;
  uint64_t dealt_min, dealt_max; /* Simple transfers in this band that only send or receive over links with
                                  * chunk marks have their pieces dealt (dev.h; 0: none) */
  /* a launch's cap on Simple batches (dev_comm_t.batch_pieces), read from its first step's call */
  int16_t batch;        /* >= 0: this, whatever the launch (BRAID_BATCH_PIECES); -1: as below */
  uint8_t duplex_batch; /* one step moving data both ways whose transfers are at most duplex_max or
                         * dealt */
  uint64_t duplex_max;
  uint8_t oneway_batch; /* one-way steps only, where the largest part per channel is more than
                         * oneway_lo and at most oneway_hi slots (0: no cap) */
  uint8_t oneway_lo, oneway_hi;
  uint64_t local_ce_min; /* a step of plain local copies (no peer, nothing combined or scaled) of at least
                          * this many bytes goes to the copy engines instead of a kernel (0: never) */
} tune_shape_t;

/* The knobs in effect, read once per process. TUNE_UNSET: the table's value. */
#define TUNE_UNSET INT64_MIN
typedef struct {
  uint8_t algos[OP_COUNT]; /* NCCL_ALGO: the algorithms each collective may use, bit (1 << plan_algo_t) */
  uint8_t ll, ll128;       /* NCCL_PROTO allows LL, LL128 */
  int64_t oneshot_max, ar_split, ll_max, ll128_min, ll128_oneway, ll128_max, ll_part, ch_bytes, wide,
      dealt_min, batch, local_ce_min;
} tune_knobs_t;

const tune_knobs_t *tune_knobs(void);
/* Fills `k` from the parameters (tune_knobs does, once). */
void tune_knobs_read(tune_knobs_t *k);

/* The shape of `call` under knobs `k`. Pure. */
void tune_call(const tune_call_t *call, const tune_knobs_t *k, tune_shape_t *shape);
/* Logs the choice at INFO (TUNING) once per collective and power-of-two size class, every call at TRACE. */
void tune_log(const tune_call_t *call, const task_t *task, const tune_shape_t *shape);

/* A communicator's channels: what a transfer takes at most on `nranks` ranks of a GPU of `sms`
 * multiprocessors (BRAID_CHANNELS); the same on every rank once they take the fewest. */
int tune_channels(int nranks, int sms);
/* The most channels whose widest launch fits `sms` multiprocessors at once (tune_channels' bound). */
int tune_channels_fit(int nranks, int sms);
/* Rings per connection for nch such channels: more where some steps have fewer lanes than the widest. */
int tune_rings(int nranks, int nch);
/* The grid, in lanes, over which launches narrower than it spread their blocks (BRAID_SPREAD; 0: none). */
int tune_spread(int nranks);
/* The most lanes a step can have: a send to every peer, a receive from every peer and one local. */
int tune_lanes_max(int nranks);

/* Where steps bypass the rings to a peer over p2p (core/ce.h), as this rank's knobs say (the two ranks take
 * the larger of each); UINT64_MAX: never. Returns whether the table has a direct path for `nranks` ranks
 * (two: the one row so far); the launch parameters are filled either way. */
typedef struct {
  uint64_t copy_min;                    /* the copy engines, for steps that only copy */
  uint64_t reduce_min;                  /* the copy engines, for a reduction's transfers */
  uint64_t chunk_min;                   /* a reduction lands in chunks of at least this many bytes */
  uint64_t pull_min;                    /* a reduce's root reads the sender's input */
  uint64_t push_min;                    /* one kernel pushes a step that only copies, one way */
  uint64_t push_xmin;                   /* the same where each rank sends and receives */
  unsigned combine_blocks, pull_blocks; /* the combine kernel's grid (0 pull blocks: one per SM) */
  uint32_t pull_tile;                   /* a pull's tile (0: equal parts per block) */
} tune_direct_t;
int tune_direct(int nranks, tune_direct_t *d);

/* The knob values that must be equal on every rank of a GPU communicator (core/comm.c compares them), and
 * the knob each one comes from. */
enum { TUNE_AGREED_COUNT = 12 };
void tune_agreed(uint64_t v[TUNE_AGREED_COUNT]);
const char *tune_agreed_name(int k);

/* NCCL_ALGO into algos (NCCL's syntax: a comma list of names, "^" first to exclude them, optionally per
 * collective as "allreduce:list;broadcast:^list"; Braid's names: Ring, OneShot, case-insensitive; other
 * names are ignored with an INFO line, and a list that leaves a collective nothing it can run leaves it
 * Ring). */
void tune_parse_algo(const char *spec, uint8_t algos[OP_COUNT]);
/* Whether NCCL_PROTO allows LL or LL128 (`which`): a list of none of Braid's protocols (LL, LL128, Simple)
 * allows every one; a list allows those it names, or with "^" those it does not. Simple always stays. */
int tune_parse_proto(const char *spec, const char *which);

#endif
