/*
 * Cycle checkpoints in the kernels' entry points (kernels.cu and the headers of each), for finding where a
 * call's time goes. They exist only in a build configured with -DBRAID_TRACE_LL=ON,
 * which defines BRAID_TRACE_LL for the kernels; in any other build every macro here is empty and the kernels
 * are byte for byte those the file would give without them.
 *
 * Thread 0 of each block notes clock64() minus the block's start at each checkpoint it passes, in shared
 * memory, and at the block's end prints one line for the launches whose sequence number (dev_work_t.seq) lies
 * in [BRAID_TRACE_LL_SEQ, BRAID_TRACE_LL_SEQ + 3) (default 30: past the warm-up of `braid bench -n 20`):
 *
 *   TRACE rank R seq S block B: valid C sides C early C sent C opened C barrier C task C piece C called C
 *   lines C arrived C run C closed C cycles; N ns; waited C publishing C cycles; batches K lane L sm M
 *
 * with -1 for a checkpoint the block did not pass. The clock runs at the SM's clock (about 2 cycles per ns on
 * an H200 under load); N is the block's time by the global timer. The checkpoints from `task` to `arrived`
 * are those of the block's last part moved after the barrier: its task read (ll_run), the dispatch entered
 * (ll_piece), the line routine entered (ll_lines), thread 0's first line with its operands loaded, and the
 * arriving line seen.
 *
 * In the all-reduce's pair entries (braid_kernel_pair_ar, braid_kernel_pair_ar128): `sides` both rings
 * loaded (the send's open returned), `run` before the barrier; in LL128 (ll128_lines) `called` the routine
 * entered, `sent` warp 0's units of the operand sent, `lines` its first unit's operands loaded, `arrived`
 * that unit's arriving lines seen.
 *
 * In the bulk entry (bulk.cuh) thread 0 is lane 0 of the first warp, and the points mean: `valid`, `opened`,
 * `barrier`, `run` and `closed` as above (bulk_open for ll_open, bulk_close for the counts); `sides` its
 * side's ring, count and head loaded and the transfer checked, `early` the pieces on the block's rings
 * counted, `sent` room for them waited for; `task` its last chunk sent or copied stored, `piece` the system
 * fence after them done (the chunk's mark is stored next); `lines` its last received chunk's mark seen,
 * `arrived` that chunk combined. `called` stays -1.
 *
 * In the general kernel (general.cuh, kernel_run; Simple batches in part_run): `opened` the block's lane
 * opened (its transfers and rings found), `early` thread 0's first batch waited for (room to send, or data
 * received), `sent` that batch published, `piece` the block's last batch published, `run` every step run,
 * `closed` the block past the grid's end. Four more fields end the line: `waited` and `publishing`, the
 * cycles thread 0 spent waiting for batches and publishing them (a send's publish is a system-scope fence,
 * then the sizes and the tail), summed over the launch; `batches`, how many; and `lane`, the block's lane
 * times 1000 plus its channel. The other points stay -1, and these four are 0 in the other entry points.
 * Every entry point's line ends with `sm`, the SM its block ran on.
 */
#ifndef BRAID_DEVICE_TRACE_CUH
#define BRAID_DEVICE_TRACE_CUH

#ifdef BRAID_TRACE_LL

#include <stdint.h>
#include <stdio.h>

#ifndef BRAID_TRACE_LL_SEQ
#define BRAID_TRACE_LL_SEQ 30
#endif

enum {
  TRACE_VALID,   /* the launch checked (the first read of the parameters) */
  TRACE_SIDES,   /* every side's transfer, ring, count and head found, room waited for */
  TRACE_EARLY,   /* the first warp about to store an early part's lines */
  TRACE_SENT,    /* those lines stored */
  TRACE_OPENED,  /* ll_open returned (tasks written) */
  TRACE_BARRIER, /* past the block barrier after ll_open */
  TRACE_TASK,    /* a part's task read from shared memory */
  TRACE_PIECE,   /* its dispatch entered */
  TRACE_CALLED,  /* its line routine entered */
  TRACE_LINES,   /* its first line: operands loaded */
  TRACE_ARRIVED, /* its first line: the arriving line seen */
  TRACE_RUN,     /* every part moved */
  TRACE_CLOSED,  /* counts stored */
  TRACE_WAITED,  /* the general kernel: cycles waiting for batches, summed */
  TRACE_PUBLISH, /* and publishing them, summed */
  TRACE_BATCHES, /* batches moved (a count) */
  TRACE_LANE,    /* lane * 1000 + channel (a label) */
  TRACE_POINTS
};

/* The points that sum or label rather than mark a moment: 0, not -1, until something is added. */
enum { TRACE_FIRST_SUM = TRACE_WAITED };

__shared__ long long trace_cycles[TRACE_POINTS];
__shared__ long long trace_start;
__shared__ unsigned long long trace_ns;
__shared__ unsigned trace_sm;

__device__ __forceinline__ unsigned trace_smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

__device__ __forceinline__ unsigned long long trace_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

#define TRACE_BEGIN()                                                                                        \
  do {                                                                                                       \
    if (threadIdx.x == 0) {                                                                                  \
      trace_start = clock64();                                                                               \
      trace_ns = trace_globaltimer();                                                                        \
      trace_sm = trace_smid();                                                                               \
      for (int trace_i = 0; trace_i < TRACE_POINTS; trace_i++)                                               \
        trace_cycles[trace_i] = trace_i < TRACE_FIRST_SUM ? -1 : 0;                                          \
    }                                                                                                        \
  } while (0)

#define TRACE_AT(point)                                                                                      \
  do {                                                                                                       \
    if (threadIdx.x == 0) trace_cycles[point] = clock64() - trace_start;                                     \
  } while (0)

/* The first time thread 0 passes: TRACE_AT. */
#define TRACE_FIRST(point)                                                                                   \
  do {                                                                                                       \
    if (threadIdx.x == 0 && trace_cycles[point] < 0) trace_cycles[point] = clock64() - trace_start;          \
  } while (0)

/* A span summed into `point`: TRACE_SPAN(t) starts it in a variable of that name, TRACE_SPAN_ADD ends it. */
#define TRACE_SPAN(t) const long long t = clock64()
#define TRACE_SPAN_ADD(point, t)                                                                             \
  do {                                                                                                       \
    if (threadIdx.x == 0) trace_cycles[point] += clock64() - (t);                                            \
  } while (0)

/* Adds a count or sets a label. */
#define TRACE_ADD(point, n)                                                                                  \
  do {                                                                                                       \
    if (threadIdx.x == 0) trace_cycles[point] += (n);                                                        \
  } while (0)
#define TRACE_SET(point, v)                                                                                  \
  do {                                                                                                       \
    if (threadIdx.x == 0) trace_cycles[point] = (v);                                                         \
  } while (0)

/* Thread 0, at the block's end: the line above, for the launches of the chosen sequence numbers. */
__device__ __noinline__ void trace_print(int rank, uint64_t seq) {
  if (threadIdx.x != 0 || seq < BRAID_TRACE_LL_SEQ || seq >= BRAID_TRACE_LL_SEQ + 3) return;
  const long long *c = trace_cycles;
  printf(
      "TRACE rank %d seq %llu block %u: valid %lld sides %lld early %lld sent %lld opened %lld barrier %lld "
      "task %lld piece %lld called %lld lines %lld arrived %lld run %lld closed %lld cycles; %llu ns; waited "
      "%lld publishing %lld cycles; batches %lld lane %lld sm %u\n",
      rank, (unsigned long long)seq, blockIdx.x, c[TRACE_VALID], c[TRACE_SIDES], c[TRACE_EARLY],
      c[TRACE_SENT], c[TRACE_OPENED], c[TRACE_BARRIER], c[TRACE_TASK], c[TRACE_PIECE], c[TRACE_CALLED],
      c[TRACE_LINES], c[TRACE_ARRIVED], c[TRACE_RUN], c[TRACE_CLOSED], trace_globaltimer() - trace_ns,
      c[TRACE_WAITED], c[TRACE_PUBLISH], c[TRACE_BATCHES], c[TRACE_LANE], trace_sm);
}

#define TRACE_END(rank, seq) trace_print(rank, seq)

#else

#define TRACE_BEGIN()                                                                                        \
  do {                                                                                                       \
  } while (0)
#define TRACE_AT(point)                                                                                      \
  do {                                                                                                       \
  } while (0)
#define TRACE_END(rank, seq)                                                                                 \
  do {                                                                                                       \
  } while (0)
#define TRACE_FIRST(point)                                                                                   \
  do {                                                                                                       \
  } while (0)
#define TRACE_SPAN(t)                                                                                        \
  do {                                                                                                       \
  } while (0)
#define TRACE_SPAN_ADD(point, t)                                                                             \
  do {                                                                                                       \
  } while (0)
#define TRACE_ADD(point, n)                                                                                  \
  do {                                                                                                       \
  } while (0)
#define TRACE_SET(point, v)                                                                                  \
  do {                                                                                                       \
  } while (0)

#endif

#endif
