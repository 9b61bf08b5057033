/*
 * The kernels' entry points; dev.h is their contract with the host executor. Each entry point is a few lines
 * here, its machinery in a header of its own, all in one translation unit so that nvcc inlines the shared
 * device routines (reduce.cuh, ll.cuh, wait.cuh) the same way for every entry:
 * - braid_kernel, braid_kernel_small: the general kernel (general.cuh), any launch, a grid barrier between
 *   its steps; the small entry takes a work description that fits fewer transfers, read faster;
 * - braid_kernel_ll: one step of LL transfers, one piece per channel, latency alone (ll_entry.cuh);
 * - braid_kernel_bulk: one step of Simple transfers that each fit one slice, over p2p (bulk.cuh);
 * - braid_kernel_pair, braid_kernel_pair_ar, braid_kernel_pair_ar128: a two-rank exchange or all-reduce
 *   between p2p peers (pair.cuh);
 * - braid_kernel_wait, braid_kernel_push, braid_kernel_combine: the waits, pushes and reductions that go with
 *   the copy engines (below).
 */
#include <stddef.h>
#include <stdint.h>

#include "device/bulk.cuh"
#include "device/dev.h"
#include "device/general.cuh"
#include "device/ll_entry.cuh"
#include "device/pair.cuh"
#include "device/wait.cuh"

static_assert(sizeof(dev_work_t) <= 4096, "the work is passed in the kernel parameters (4 KiB at most)");
static_assert(offsetof(dev_work_t, xfers) == offsetof(dev_work_small_t, xfers),
              "the small entry point's work is a prefix of the full one");
static_assert(DEV_LANE_RINGS < 0xff, "ring indices of a lane fit a byte, NO_RING excluded");
static_assert(DEV_SMALL_XFERS <= DEV_LL_SLOTS && 2 * DEV_SMALL_XFERS <= 32,
              "braid_kernel_ll: a ring's pieces of a launch fit its slots, and a warp has a lane per side");

extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel(const __grid_constant__ dev_work_t work) {
  after_previous_kernel();
  kernel_run(work);
}

extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel_small(const __grid_constant__ dev_work_small_t work) {
  after_previous_kernel();
  kernel_run(work);
}

extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel_ll(const __grid_constant__ dev_work_small_t work) {
  after_previous_kernel();
  __shared__ ll_task tasks[DEV_SMALL_XFERS];
  TRACE_BEGIN();
  const uint32_t nch = work.nch > 0 ? work.nch : 1, lane = blockIdx.x / nch, c = blockIdx.x % nch;
  ll_side sd = {};
  int failed = 0;
  if (threadIdx.x < 32) {
    const bool valid = __all_sync(0xffffffffu, ll_work_valid(work));
    if (!valid && threadIdx.x == 0) error_record(&work.comm, DEV_ERR_INVALID, -1, (int)c, 0, work.seq, 0);
    TRACE_AT(TRACE_VALID);
    failed = !valid || !ll_open(work, lane, c, sd, tasks);
    TRACE_AT(TRACE_OPENED);
  }
  if (__syncthreads_or(failed)) return;
  TRACE_AT(TRACE_BARRIER);
  const bool ok = ll_run(work, c, tasks);
  TRACE_AT(TRACE_RUN);
  if (__syncthreads_or(!ok) == 0 && threadIdx.x < 32) ll_side_close(sd);
  TRACE_AT(TRACE_CLOSED);
  TRACE_END(work.comm.rank, work.seq);
}

/* The pair entry point (pair.cuh). */
extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel_pair(const __grid_constant__ dev_pair_t p) {
  after_previous_kernel();
  TRACE_BEGIN();
  const bool sender = blockIdx.x < p.send_blocks;
  const uint32_t c = sender ? blockIdx.x : blockIdx.x - p.send_blocks;
  if (!pair_valid(p)) {
    if (threadIdx.x == 0) error_record(&p.comm, DEV_ERR_INVALID, -1, (int)c, 0, p.seq, 0);
    return;
  }
  TRACE_AT(TRACE_VALID);
  pair_out o = {};
  pair_in in = {};
  bool ok = true;
  if (sender) { /* a sending block: its part of the send (if any), then of the copy */
    if (!pair_send_open(p, c, threadIdx.x, true, o)) return;
    pair_send_lines(o, threadIdx.x, blockDim.x);
    pair_copy(p, c, threadIdx.x, blockDim.x);
    __syncthreads();
    pair_send_close(o);
    return;
  }
  /* In place with a part of a line per thread at most (fused 2), the first half of the block sends and the
   * second receives. Each sending thread loads its line before the barrier, and the receiving half stores
   * after it, so no line is overwritten before it is read. */
  const uint32_t skip = p.fused == 2 ? blockDim.x / 2 : 0;
  const bool receives = threadIdx.x >= skip;
  if (p.fused == 2) {
    const uint32_t t = threadIdx.x % skip;
    if (!pair_send_open(p, c, t, !receives, o)) return;
    __syncthreads();
    if (!receives) {
      pair_send_lines(o, t, skip);
      pair_copy(p, c, t, skip);
    }
  } else {
    if (p.fused == 1) { /* each thread sends the lines it then overwrites; no sending blocks copy */
      if (!pair_send_open(p, c, threadIdx.x, true, o)) return;
      if (p.send.proto != DEV_PROTO_LL128) pair_send_lines(o, threadIdx.x, blockDim.x);
      pair_copy(p, c, threadIdx.x, blockDim.x);
    }
  }
  /* LL128 in place: each warp sends its units within the receive, before it awaits and overwrites them */
  const bool one_pass = p.fused == 1 && p.send.proto == DEV_PROTO_LL128;
  if (receives) ok = pair_recv_lines(p, c, skip, in, one_pass ? &o : NULL);
  if (__syncthreads_or(!ok) == 0) {
    pair_recv_close(in, skip);
    pair_send_close(o); /* fused: thread 0 sent too */
  }
  TRACE_AT(TRACE_CLOSED);
  TRACE_END(p.comm.rank, p.seq);
}

extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel_pair_ar(const __grid_constant__ dev_pair_t p) {
  after_previous_kernel();
  pair_ar_run<false>(p);
}

extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel_pair_ar128(const __grid_constant__ dev_pair_t p) {
  after_previous_kernel();
  pair_ar_run<true>(p);
}

extern "C" __global__ void __launch_bounds__(32, 1) braid_kernel_wait(const __grid_constant__ dev_wait_t w) {
  after_previous_kernel();
  if (threadIdx.x != 0) return;
  if (w.raise != NULL) { /* what the stream ran before this kernel is complete; publish after it */
    fence_acq_rel_sys();
    *(volatile uint32_t *)w.raise = 1;
  }
  if (!word_wait_at_least(&w.comm, w.word, 1, {w.peer, -1, w.is_send, w.seq})) return;
  *(volatile uint32_t *)w.word = 0; /* the stream's next operation (a copy, or the next wait) comes after */
}

/* The copy-engine path's push (dev.h, dev_push_t). */
extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel_push(const __grid_constant__ dev_push_t w) {
  after_previous_kernel();
  int failed = 0;
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0 && w.raise_ready != NULL) { /* the stream's earlier work is complete */
      fence_acq_rel_sys();
      *(volatile uint32_t *)w.raise_ready = 1;
    }
    if (w.ready != NULL) failed = !word_wait_at_least(&w.comm, w.ready, 1, {w.peer, -1, 1, w.seq});
  }
  if (__syncthreads_or(failed)) return;
  const uint64_t grid = gridDim.x;
  uint64_t base = 0; /* tiles of the copies before this one: the blocks take them round robin throughout */
  for (uint32_t c = 0; c < w.ncopies && c < DEV_PUSH_COPIES; c++) {
    const dev_copy_t &k = w.copies[c];
    const uint64_t ntiles = (k.bytes + DEV_PUSH_TILE - 1) / DEV_PUSH_TILE;
    for (uint64_t t = (blockIdx.x + grid - base % grid) % grid; t < ntiles; t += grid) {
      const uint64_t off = t * DEV_PUSH_TILE;
      const piece_t pc = {k.src + off, NULL, k.dst + off, NULL,
                          (uint32_t)min(k.bytes - off, (uint64_t)DEV_PUSH_TILE)};
      copy_piece<DEV_THREADS>(pc, threadIdx.x);
    }
    base += ntiles;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  fence_acq_rel_sys(); /* the block's stores (ordered before thread 0's by the barrier), then its count */
  if (atomicAdd(w.blocks, 1u) != gridDim.x - 1) return;
  fence_acq_rel_sys(); /* the last block: every block's stores before what it stores next */
  *(volatile uint32_t *)w.blocks = 0;
  if (w.ready != NULL) *(volatile uint32_t *)w.ready = 0;
  if (w.raise_done != NULL) {
    fence_acq_rel_sys(); /* the words cleared before the peer can raise them again */
    *(volatile uint32_t *)w.raise_done = 1;
  }
  if (w.done != NULL && word_wait_at_least(&w.comm, w.done, 1, {w.peer, -1, 0, w.seq}))
    *(volatile uint32_t *)w.done = 0;
}

/* The copy-engine path's combine (dev.h, dev_combine_t): chunk by chunk, every block waits for the chunk's
 * word itself (no grid barrier) and combines its part, in pieces of at most COMBINE_PIECE bytes (piece_t
 * counts bytes in 32 bits); or, with `tile`, the chunk's tiles dealt round robin. */
#define COMBINE_PIECE (1u << 30)
__device__ __forceinline__ void combine_at(const dev_combine_t &w, uint64_t off, uint64_t n) {
  const dev_xfer_t &x = w.x;
  const piece_t pc = {x.src + off, (w.from != NULL ? w.from : x.dst) + off, x.dst + off, NULL, (uint32_t)n};
  piece_combine(x, pc);
}

extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel_combine(const __grid_constant__ dev_combine_t w) {
  after_previous_kernel();
  const wait_what what = {w.peer, -1, 0, w.seq};
  uint64_t begin = 0;
  for (uint32_t c = 0; c < w.nchunks && c < DEV_COMBINE_CHUNKS; c++) {
    const int failed = threadIdx.x == 0 && !word_wait_at_least(&w.comm, w.word, c + 1, what);
    if (__syncthreads_or(failed)) return;
    const uint64_t len = w.ends[c] - begin;
    if (w.tile != 0) {
      for (uint64_t lo = (uint64_t)blockIdx.x * w.tile; lo < len; lo += (uint64_t)gridDim.x * w.tile)
        combine_at(w, begin + lo, min(len - lo, (uint64_t)w.tile));
    } else {
      const uint64_t part = ((len + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
      const uint64_t lo = min((uint64_t)blockIdx.x * part, len), hi = min(lo + part, len);
      for (uint64_t off = begin + lo; off < begin + hi; off += COMBINE_PIECE)
        combine_at(w, off, min(begin + hi - off, (uint64_t)COMBINE_PIECE));
    }
    begin = w.ends[c];
  }
}
