/*
 * The GPU data path's kernel; dev.h is its contract with the host executor.
 *
 * One launch runs a group's steps one after another, a grid barrier between them. In a step, block b serves
 * lane b / work.nch on channel c = b % work.nch: it walks the lane's transfers slice by slice and moves
 * channel c's part of each through ring c of the transfer's connections, one slot per piece. Thread 0 does
 * every wait and every publication; the other threads meet it at block barriers, so a batch of pieces costs
 * two barriers: thread 0 waits until the pieces can move and says how many (as many ready pieces of the part
 * as the rings allow: never more than it would wait for one by one, so waiting stays deadlock-free), all
 * threads combine them (reduce.cuh), then thread 0 publishes.
 *
 * A block starts by copying the launch's work from the kernel parameters into shared memory, every thread a
 * word of it: one parallel trip instead of the chain of parameter reads that finding a lane's transfers
 * otherwise is, and every later read of the work (each piece reads its transfer's fields) is a shared-memory
 * one. The first warp then checks the work and opens the step, its lanes side by side: 32 transfers' lanes
 * are compared by ballot to find the block's range, and each lane looks up the ring of one side (a
 * transfer's send or receive), one trip to memory for all; serial code in one thread costs a few hundred
 * cycles per dependent read, which is where a small call's time went.
 *
 * Even so, that setup took a block about 3 us of an 8-byte all-reduce's 5.5. A launch that is latency alone
 * (one step of LL transfers, one piece per channel) takes a third entry point, braid_kernel_ll, at the end of
 * this file: its first warp finds the block's rings and counts in one trip and sends a small first transfer
 * of this rank's data at once, and every thread then moves its lines of the other transfers from start to
 * end (ll.cuh) with no barrier in between. A launch of Simple transfers that each fit one slice, over p2p
 * connections, takes a fourth, braid_kernel_bulk (bulk.cuh), whose warps move chunks of the part on their
 * own, each announced by its mark (dev.h).
 *
 * Every spin loop looks at the clock every WAIT_CHECK_SPINS spins, and at the abort flag and the error word
 * (another block failed) every WAIT_HOST_SPINS (wait.cuh). The first block that fails records the error;
 * every block then leaves through the end of the kernel, where the last one out resets the grid barrier for
 * the next launch.
 */
#include <stddef.h>
#include <stdint.h>

#include "device/bulk.cuh"
#include "device/dev.h"
#include "device/ll.cuh"
#include "device/reduce.cuh"
#include "device/trace.cuh"
#include "device/wait.cuh"
#include "device/xfer.cuh"

static_assert(sizeof(dev_work_t) <= 4096, "the work is passed in the kernel parameters (4 KiB at most)");
static_assert(offsetof(dev_work_t, xfers) == offsetof(dev_work_small_t, xfers),
              "the small entry point's work is a prefix of the full one");
static_assert(DEV_LANE_RINGS < 0xff, "ring indices of a lane fit a byte, NO_RING excluded");
static_assert(DEV_SMALL_XFERS <= DEV_LL_SLOTS && 2 * DEV_SMALL_XFERS <= 32,
              "braid_kernel_ll: a ring's pieces of a launch fit its slots, and a warp has a lane per side");

/* Transfer k of the launch: in the parameters, or in the spilled list. */
template <class W> __device__ __forceinline__ const dev_xfer_t &xfer_at(const W &w, uint32_t k) {
  return w.ext != NULL ? w.ext[k] : w.xfers[k];
}

/* No ring (in block_state's per-transfer indices). */
#define NO_RING 0xff

/* A ring the current lane uses, and this rank's count of the slots it moved on it. */
struct ring_use {
  char *data;
  dev_ctrl_t *ctrl;
  uint64_t *marks;     /* chunk marks (dev.h), or NULL */
  uint64_t *home;      /* where the count lives between lanes: an entry of comm->sent or comm->recvd */
  uint64_t *head_home; /* send rings: where head_seen lives between lanes (comm->heads); NULL otherwise */
  uint64_t head_seen;  /* send rings: the consumer's head as last read (a lower bound of it) */
  uint64_t count;      /* slots produced (send ring) or consumed (receive ring) */
  bool ll;             /* an LL ring (dev.h): lines with flags, no tail */
};

/* Slots of a ring. */
__device__ __forceinline__ uint32_t ring_slots(const ring_use &r) {
  return r.ll ? DEV_LL_SLOTS : DEV_SLOTS;
}

/* Where piece i from a Simple ring's count on lives: its slot. */
__device__ __forceinline__ char *slot_at(const ring_use &r, uint32_t i) {
  return r.data + (size_t)((r.count + i) % DEV_SLOTS) * DEV_SLOT_BYTES;
}

/* A block's shared state while it runs a lane. Only thread 0 writes it; the others read it after a block
 * barrier that follows the write, and thread 0 writes again only after a barrier that follows the reads. */
struct block_state {
  ring_use rings[DEV_LANE_RINGS];
  uint8_t send_ring[DEV_LANE_XFERS], recv_ring[DEV_LANE_XFERS]; /* per transfer of the lane, or NO_RING */
  uint32_t nrings;
  uint32_t lane, channel; /* what the block serves, set once at the start */
  uint32_t step;          /* the current step */
  uint32_t first, end;    /* the lane's transfers in the current step */
  uint32_t batch;         /* pieces of the current batch; 0: stop */
  /* a dealt transfer (dev.h): the batch's pieces, whether its last slot is the end slot, and where the
   * shared counter stood at the block's last take (a guess at how many pieces are left) */
  uint32_t dealt[DEV_SLOTS];
  uint32_t dealt_seen;
  uint8_t ended, dealt_over; /* dealt_over: the block took its last piece */
};

/* ---- Grid barrier ---- */

template <class W> __device__ bool step_open(const W &w, block_state &st);

/* Every thread: waits until every block of the grid has finished step st.step, then thread 0 moves st.step
 * on and the first warp opens the next step (step_open). barrier[0] counts arrivals and only grows during a
 * launch: after step s it reaches (s + 1) * blocks. Ordering: each block's writes before the barrier (its
 * data, its slot counts) are ordered before its arrival by a block barrier and a gpu-scope fence; a block
 * goes on after an acquire load that saw every arrival, then a warp or block barrier. Returns false (in every
 * thread) when the wait or the opening failed. */
template <class W> __device__ bool grid_sync(const W &w, block_state &st) {
  __syncthreads();
  int failed = 0;
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) {
      uint32_t *count = w.comm.barrier, target = (st.step + 1) * gridDim.x;
      __threadfence();
      atomicAdd(count, 1u);
      spin_t s = {0, 0};
      const wait_what what = {-1, -1, 0, w.seq};
      while (load_acquire_gpu(count) < target) {
        if (spin_fails(&w.comm, &s, what)) {
          failed = 1;
          break;
        }
      }
      st.step++;
    }
    __syncwarp();
    failed = __shfl_sync(0xffffffffu, failed, 0);
    if (!failed) failed = !step_open(w, st);
  }
  return __syncthreads_or(failed) == 0;
}

/* The end of every block, whether it finished or failed: the last block to finish resets both counters, so
 * the next launch (stream-ordered after this one) starts from zero. A block counts itself in barrier[1] only
 * after its last use of barrier[0], so the reset never races with a waiter. */
template <class W> __device__ void grid_finish(const W &w) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  /* One step and no spilled list: the grid barrier was never used and the launch has no queue entry to
   * report done (dev.h), so the block just leaves: no fence, no atomics on the way out. */
  if (w.nsteps <= 1 && w.ext == NULL) return;
  uint32_t *bar = w.comm.barrier;
  __threadfence();
  if (atomicAdd(&bar[1], 1u) == gridDim.x - 1) {
    atomicExch(&bar[0], 0u);
    atomicExch(&bar[1], 0u);
    __threadfence();
    /* Every block is past its last read of the work: its queue entry can go. No system fence: the word
     * publishes nothing else (a spill's device copy is overwritten only by a later copy that stream order or
     * the ordering event puts after this kernel, and the kernel never reads the entry's host memory), so a
     * plain store, seen by the host whenever it lands, is enough; a fence here cost every launch
     * microseconds. */
    if (w.done != NULL) *w.done = w.tag;
  }
}

/* ---- Validation ---- */

/* The first warp: whether the launch's shape is something this kernel can run (the same answer in every
 * lane). The host builds the work, so a failure here is a bug, reported as DEV_ERR_INVALID rather than a
 * wild access. The conditions are combined without short cuts and lane s checks step s, so the reads go out
 * together instead of one after another. Each block checks its own lane's transfers when it opens them
 * (xfer_valid). */
template <class W> __device__ bool work_valid(const W &w) {
  static_assert(DEV_MAX_STEPS <= 32, "a lane checks a step");
  const dev_comm_t *comm = &w.comm;
  const uint32_t slots = sizeof w.xfers / sizeof w.xfers[0], nch = w.nch, nsteps = w.nsteps, s = threadIdx.x;
  bool bad = (comm->nch_max < 1) | (comm->nch_max > DEV_MAX_CHANNELS) | (nch < 1) |
             (nch > (uint32_t)comm->nch_max) | (blockDim.x != DEV_THREADS) |
             (w.nxfers > (w.ext != NULL ? DEV_MAX_SPILL : slots)) | (nsteps > DEV_MAX_STEPS);
  if (!bad) bad = gridDim.x % nch != 0;
  if (!bad && s < nsteps) {
    const uint32_t first = s > 0 ? w.step_end[s - 1] : 0;
    bad =
        (w.step_end[s] < first) | (w.step_end[s] > w.nxfers) | ((uint32_t)w.step_lanes[s] * nch > gridDim.x);
  }
  return __all_sync(0xffffffffu, !bad);
}

/* ---- Lanes ---- */

/* One side (send or receive) of a transfer of the lane as a lane of the first warp finds it (lane_open): its
 * ring's table entry and count, or why there is none. */
struct side_find {
  dev_ring_t ring;
  uint64_t *home;      /* the count's entry in comm->sent / recvd (or the LL ones) */
  uint64_t *head_home; /* send sides: the cached head's entry; NULL otherwise */
  uint64_t count, seen;
  uint32_t xi;  /* the transfer's index in the lane */
  uint8_t used; /* a side on the block's channel with a peer */
  uint8_t bad;  /* the transfer is malformed, or its ring is not connected */
  uint8_t send; /* 1: the send side */
  uint8_t ll;   /* the side runs LL (its transfer's DEV_XF_LL_SEND / _RECV) */
};

/* One lane of the first warp: looks up side `l % 2` (0: send) of transfer first + l / 2 on the block's
 * channel. The loads are independent of each other and of the other lanes': one trip to memory for the
 * warp. The counts come from L2 (.cg): another block may have stored them in an earlier step. */
template <class W>
__device__ side_find side_look(const W &w, const block_state &st, uint32_t first, uint32_t l) {
  const dev_comm_t *comm = &w.comm;
  side_find f = {};
  const uint32_t k = first + l / 2;
  if (k >= st.end) return f;
  const dev_xfer_t &x = xfer_at(w, k);
  f.xi = k - st.first;
  f.send = (l & 1) == 0;
  if (!xfer_valid(x, w)) {
    f.bad = 1;
    return f;
  }
  const int peer = f.send ? x.send_peer : x.recv_peer;
  if (st.channel >= x.nch || peer < 0) return f;
  f.ll = (x.flags & (f.send ? DEV_XF_LL_SEND : DEV_XF_LL_RECV)) != 0;
  const int idx = (f.ll ? peer * DEV_LL_CHANNELS : peer * comm->nch_max) + (int)st.channel;
  const dev_ring_t *rings =
      f.ll ? (f.send ? comm->ll_send : comm->ll_recv) : (f.send ? comm->send : comm->recv);
  uint64_t *homes = f.ll ? (f.send ? comm->ll_sent : comm->ll_recvd) : (f.send ? comm->sent : comm->recvd);
  uint64_t *heads = !f.send ? NULL : f.ll ? comm->ll_heads : comm->heads;
  f.ring = rings[idx];
  f.count = __ldcg(&homes[idx]);
  f.seen = heads != NULL ? __ldcg(&heads[idx]) : 0;
  f.home = &homes[idx];
  f.head_home = heads != NULL ? &heads[idx] : NULL;
  f.used = 1;
  f.bad = f.ring.data == NULL || f.ring.ctrl == NULL;
  return f;
}

/* The first warp: checks the lane's transfers, finds their rings on the block's channel and loads their
 * counts, 16 transfers (32 sides) at a time, each lane one side. A side whose ring an earlier round added
 * takes its index; among the rest, lanes naming the same ring (two transfers of a lane may share one, and
 * then its count) elect the lowest as its owner, and the owners take the next indices in lane order. The grid
 * barrier before the step ordered the counts' last stores (by whichever block used the ring before). Returns
 * the same in every lane of the warp. */
template <class W> __device__ bool lane_open(const W &w, block_state &st) {
  const uint32_t l = threadIdx.x, below = (1u << l) - 1;
  uint32_t nrings = 0;
  bool ok = true;
  for (uint32_t first = st.first; first < st.end && ok; first += 16) {
    const side_find f = side_look(w, st, first, l);
    uint32_t r = NO_RING;
    for (uint32_t i = 0; f.used && i < nrings; i++) {
      if (st.rings[i].home == f.home) r = i;
    }
    const bool fresh = f.used && !f.bad && r == NO_RING;
    const uint32_t same = __match_any_sync(0xffffffffu, fresh ? (unsigned long long)f.home : 0ull);
    const uint32_t owners = __ballot_sync(0xffffffffu, fresh && (same & below) == 0);
    if (fresh) r = nrings + __popc(owners & ((1u << (__ffs(same) - 1)) - 1));
    const bool room = nrings + __popc(owners) <= DEV_LANE_RINGS;
    if (fresh && room && (same & below) == 0) {
      ring_use &u = st.rings[r];
      u.data = f.ring.data;
      u.ctrl = f.ring.ctrl;
      u.marks = f.ring.marks;
      u.home = f.home;
      u.count = f.count;
      u.head_home = f.head_home;
      u.head_seen = f.seen;
      u.ll = f.ll;
    }
    if (first + l / 2 < st.end) (f.send ? st.send_ring : st.recv_ring)[f.xi] = f.used ? (uint8_t)r : NO_RING;
    ok = __all_sync(0xffffffffu, !f.bad) && room;
    nrings += __popc(owners);
    __syncwarp(); /* the rings added are seen by every lane in the next round */
  }
  if (l == 0) st.nrings = nrings;
  if (!ok && l == 0) error_record(&w.comm, DEV_ERR_INVALID, -1, (int)st.channel, 0, w.seq, 0);
  return ok;
}

/* Thread 0: stores the lane's counts back for the next step or launch (to L2, where side_look reads them;
 * the grid barrier or the kernel's end orders them before those reads). */
__device__ void lane_close(block_state &st) {
  for (uint32_t r = 0; r < st.nrings; r++) {
    __stcg(st.rings[r].home, st.rings[r].count);
    if (st.rings[r].head_home != NULL) __stcg(st.rings[r].head_home, st.rings[r].head_seen);
  }
}

/* Thread 0: waits until the next piece of the part can move and returns how many of the `want` next pieces
 * can, at most dev_comm_t.batch_pieces where it is set (0: the wait failed). A receive needs tail > count (an
 * LL receive waits on the lines themselves, in every thread: ll_read); a send needs head + nslots > count. */
template <class W>
__device__ uint32_t batch_wait(const W &w, const dev_xfer_t &x, uint32_t xi, uint32_t want, block_state &st) {
  uint64_t v;
  const uint32_t cap = (uint32_t)w.comm.batch_pieces;
  if (cap != 0 && want > cap) want = cap;
  if (x.recv_peer >= 0 && !st.rings[st.recv_ring[xi]].ll) {
    ring_use &r = st.rings[st.recv_ring[xi]];
    const wait_what what = {x.recv_peer, (int)st.channel, 0, w.seq + x.task};
    if (!wait_at_least(&w.comm, &r.ctrl->tail, r.count + 1, what, &v)) return 0;
    if (v - r.count < want) want = (uint32_t)(v - r.count);
  }
  if (x.send_peer >= 0) {
    ring_use &r = st.rings[st.send_ring[xi]];
    const wait_what what = {x.send_peer, (int)st.channel, 1, w.seq + x.task};
    /* the head last read may already free every slot wanted: then the link is not crossed */
    const uint32_t nslots = ring_slots(r);
    if (r.head_seen + nslots - r.count < want) {
      uint64_t target = r.count + 1 > nslots ? r.count + 1 - nslots : 0;
      if (!wait_at_least(&w.comm, &r.ctrl->head, target, what, &v)) return 0;
      r.head_seen = v;
    }
    if (r.head_seen + nslots - r.count < want) want = (uint32_t)(r.head_seen + nslots - r.count);
  }
  return want;
}

/* Thread 0, after the system fence that follows a batch of nb pieces starting at byte `done` of a part of
 * `len` bytes on ring r: the marks of every chunk of those pieces that holds data (dev.h). */
__device__ void batch_mark(const ring_use &r, uint32_t done, uint32_t nb, uint32_t len) {
  for (uint32_t i = 0, at = done; i < nb; i++, at += DEV_SLOT_BYTES) {
    const uint32_t bytes = len - at < DEV_SLOT_BYTES ? len - at : DEV_SLOT_BYTES;
    volatile uint64_t *m = r.marks + (size_t)((r.count + i) % DEV_SLOTS) * DEV_MARKS;
    for (uint32_t q = 0; q * DEV_CHUNK_BYTES < bytes; q++) m[q] = r.count + i + 1;
  }
}

/* Thread 0, after the block barrier that ends a batch in which the block read nb slots of receive ring r
 * (every thread's reads have completed: their values were stored): frees them to the sender (head). */
__device__ __forceinline__ void recv_free(ring_use &r, uint32_t nb) {
  r.count += nb;
  r.ctrl->head = r.count;
}

/* Thread 0, after the block barrier that ends a batch of nb pieces starting at byte `done` of a part of
 * `len` bytes. Send: the slots' sizes, a system fence (the whole block's slot stores, ordered before it by
 * the barrier, become visible first), then the chunk marks where the ring has them, and tail; an LL send
 * only counts (its lines carry their flags). Receive: head, once every thread has read its share (the
 * barrier; the reads have completed since their values were stored). */
__device__ void batch_publish(const dev_xfer_t &x, uint32_t xi, uint32_t done, uint32_t nb, uint32_t len,
                              block_state &st) {
  if (x.send_peer >= 0 && st.rings[st.send_ring[xi]].ll) {
    st.rings[st.send_ring[xi]].count += nb;
  } else if (x.send_peer >= 0) {
    ring_use &r = st.rings[st.send_ring[xi]];
    for (uint32_t i = 0, at = done; i < nb; i++, at += DEV_SLOT_BYTES) {
      r.ctrl->sizes[(r.count + i) % DEV_SLOTS] = len - at < DEV_SLOT_BYTES ? len - at : DEV_SLOT_BYTES;
    }
    fence_acq_rel_sys();
    if (r.marks != NULL) batch_mark(r, done, nb, len);
    r.count += nb;
    r.ctrl->tail = r.count;
  }
  if (x.recv_peer >= 0) recv_free(st.rings[st.recv_ring[xi]], nb);
}

/* Every thread: piece i of a batch, at byte `at` of the transfer. A local reduction takes its second operand
 * from dst: the running result an earlier transfer of the lane stored there, ordered before this read by
 * the block barriers between pieces (the same block handles the same bytes of every transfer of the lane,
 * as they all have the transfer's size and channels). */
__device__ __forceinline__ void piece_run(const dev_xfer_t &x, uint32_t xi, uint32_t i, uint64_t at,
                                          uint32_t bytes, const block_state &st) {
  piece_t pc;
  pc.local = x.src != NULL ? x.src + at : NULL;
  pc.dst = x.dst != NULL ? x.dst + at : NULL;
  pc.in = NULL;
  pc.out = NULL;
  pc.bytes = bytes;
  if (x.recv_peer >= 0) {
    const ring_use &r = st.rings[st.recv_ring[xi]];
    pc.in = slot_at(r, i);
  } else if (x.flags & DEV_XF_REDUCE) {
    pc.in = pc.dst;
  }
  if (x.send_peer >= 0) {
    const ring_use &r = st.rings[st.send_ring[xi]];
    pc.out = slot_at(r, i);
  }
  piece_combine(x, pc);
}

/* Every thread: moves the block's part [off, off + len) of transfer k, in batches of pieces. Returns false
 * (in every thread) when a wait failed. */
template <class W>
__device__ bool part_run(const W &w, uint32_t k, uint64_t off, uint32_t len, block_state &st) {
  const dev_xfer_t &x = xfer_at(w, k);
  const uint32_t xi = k - st.first;
  for (uint32_t done = 0; done < len;) {
    TRACE_SPAN(waiting);
    if (threadIdx.x == 0) st.batch = batch_wait(w, x, xi, dev_npieces(len - done), st);
    TRACE_SPAN_ADD(TRACE_WAITED, waiting);
    TRACE_FIRST(TRACE_EARLY);
    __syncthreads();
    const uint32_t nb = st.batch;
    if (nb == 0) return false;
    for (uint32_t i = 0, at = done; i < nb; i++, at += DEV_SLOT_BYTES) {
      piece_run(x, xi, i, off + at, len - at < DEV_SLOT_BYTES ? len - at : DEV_SLOT_BYTES, st);
    }
    __syncthreads();
    TRACE_SPAN(publishing);
    if (threadIdx.x == 0) batch_publish(x, xi, done, nb, len, st);
    TRACE_SPAN_ADD(TRACE_PUBLISH, publishing);
    TRACE_ADD(TRACE_BATCHES, 1);
    TRACE_FIRST(TRACE_SENT);
    TRACE_AT(TRACE_PIECE);
    done = len - done > nb * DEV_SLOT_BYTES ? done + nb * DEV_SLOT_BYTES : len;
  }
  return true;
}

/* ---- Dealt transfers (dev.h) ---- */

/* A sending block takes one of the last pieces of a dealt transfer only once its ring holds at most this
 * many pieces its receiver has not yet read. */
#define DEALT_BACKLOG 1

/* Bytes of piece i of a transfer of `bytes`. */
__device__ __forceinline__ uint32_t dealt_bytes(uint64_t bytes, uint32_t i) {
  const uint64_t at = (uint64_t)i * DEV_SLOT_BYTES;
  return bytes - at < DEV_SLOT_BYTES ? (uint32_t)(bytes - at) : DEV_SLOT_BYTES;
}

/* Thread 0 of a sending block: waits for room on its ring, then takes as many pieces as it found room for
 * from the step's counter, but no more than one per two channels of what is left (a guess from the
 * counter's value at its last take): towards the end the pieces go one by one to whichever block is free
 * and whose ring is nearly drained (DEALT_BACKLOG), so the channels end within a piece of each other. A take
 * that reaches the end is the block's last: it adds the end slot (in this batch where there is room, else
 * alone in the next) and counts itself done; the last of the channels to do so resets the counters. Sets
 * st.batch (slots, the end slot included; 0: the wait failed), st.dealt and st.ended. */
template <class W>
__device__ void dealt_take(const W &w, const dev_xfer_t &x, uint32_t xi, uint32_t total, block_state &st) {
  const uint32_t left = st.dealt_seen < total ? total - st.dealt_seen : 0;
  const uint32_t room = batch_wait(w, x, xi, st.dealt_over ? 1 : left + 1, st);
  st.ended = 0;
  st.batch = room;
  if (room == 0) return;
  if (st.dealt_over) { /* the end slot that did not fit the last batch */
    st.batch = 1;
    st.ended = 1;
    return;
  }
  const uint32_t per = 2 * (uint32_t)x.nch;
  uint32_t want = left / per > room ? room : left / per;
  if (want < 1) {
    /* among the last pieces: one, and only once the ring holds at most DEALT_BACKLOG unread, so that it
     * goes to a channel whose receiver is about to be free rather than behind a full ring */
    want = 1;
    ring_use &r = st.rings[st.send_ring[xi]];
    if (r.head_seen + DEALT_BACKLOG < r.count) {
      const wait_what what = {x.send_peer, (int)st.channel, 1, w.seq + x.task};
      uint64_t v;
      if (!wait_at_least(&w.comm, &r.ctrl->head, r.count - DEALT_BACKLOG, what, &v)) {
        st.batch = 0;
        return;
      }
      r.head_seen = v;
    }
  }
  uint32_t *counters = w.comm.barrier + 2 + 2 * st.step;
  const uint32_t first = atomicAdd(&counters[0], want);
  st.dealt_seen = first + want;
  const uint32_t got = first >= total ? 0 : total - first < want ? total - first : want;
  for (uint32_t i = 0; i < got; i++) st.dealt[i] = first + i;
  st.batch = got;
  if (first + want < total) return;
  /* no piece left for this block after these: it takes no more, and its end slot follows its last piece,
   * in this batch if there is room */
  st.dealt_over = 1;
  if (got < room) {
    st.batch = got + 1;
    st.ended = 1;
  }
  if (atomicAdd(&counters[1], 1u) == (uint32_t)x.nch - 1) {
    atomicExch(&counters[0], 0u);
    atomicExch(&counters[1], 0u);
  }
}

/* Thread 0 of a receiving block: waits for slots, then reads each one's size and piece, up to and including
 * an end slot. A size or piece that does not fit the transfer is a bug, reported as DEV_ERR_INVALID. Sets
 * st.batch (0: the wait failed or a slot was wrong), st.dealt and st.ended. */
template <class W>
__device__ void dealt_arrivals(const W &w, const dev_xfer_t &x, uint32_t xi, uint32_t total,
                               block_state &st) {
  const uint32_t n = batch_wait(w, x, xi, DEV_SLOTS, st);
  const ring_use &r = st.rings[st.recv_ring[xi]];
  st.ended = 0;
  st.batch = n;
  for (uint32_t i = 0; i < n; i++) {
    const uint32_t slot = (uint32_t)((r.count + i) % DEV_SLOTS);
    const uint64_t size = r.ctrl->sizes[slot], piece = r.ctrl->pieces[slot];
    if (size == 0) {
      st.batch = i + 1;
      st.ended = 1;
      return;
    }
    if (piece >= total || size != dealt_bytes(x.bytes, (uint32_t)piece)) {
      error_record(&w.comm, DEV_ERR_INVALID, x.recv_peer, (int)st.channel, 0, w.seq + x.task, 0);
      st.batch = 0;
      return;
    }
    st.dealt[i] = (uint32_t)piece;
  }
}

/* Thread 0, after the block barrier that ends a batch of a dealt transfer: a send stores each slot's size
 * (0 for the end slot) and piece, fences, then stores tail (no chunk marks: dev.h); a receive stores head. */
__device__ void dealt_publish(const dev_xfer_t &x, uint32_t xi, block_state &st) {
  const uint32_t nb = st.batch;
  if (x.send_peer >= 0) {
    ring_use &r = st.rings[st.send_ring[xi]];
    for (uint32_t i = 0; i < nb; i++) {
      const uint32_t slot = (uint32_t)((r.count + i) % DEV_SLOTS);
      const bool end = st.ended && i == nb - 1;
      r.ctrl->sizes[slot] = end ? 0 : dealt_bytes(x.bytes, st.dealt[i]);
      r.ctrl->pieces[slot] = end ? 0 : st.dealt[i];
    }
    fence_acq_rel_sys();
    r.count += nb;
    r.ctrl->tail = r.count;
  } else {
    recv_free(st.rings[st.recv_ring[xi]], nb);
  }
}

/* Every thread: runs the block's share of dealt transfer k (dev.h) on its channel, batch by batch, until
 * its end slot. Returns false (in every thread) when a wait failed or a slot was wrong. */
template <class W> __device__ bool dealt_run(const W &w, uint32_t k, block_state &st) {
  const dev_xfer_t &x = xfer_at(w, k);
  const uint32_t xi = k - st.first, total = dev_npieces(x.bytes);
  if (threadIdx.x == 0) {
    st.dealt_seen = 0;
    st.dealt_over = 0;
  }
  for (;;) {
    TRACE_SPAN(waiting);
    if (threadIdx.x == 0) {
      if (x.send_peer >= 0)
        dealt_take(w, x, xi, total, st);
      else
        dealt_arrivals(w, x, xi, total, st);
    }
    TRACE_SPAN_ADD(TRACE_WAITED, waiting);
    TRACE_FIRST(TRACE_EARLY);
    __syncthreads();
    const uint32_t nb = st.batch, ended = st.ended;
    if (nb == 0) return false;
    for (uint32_t i = 0; i < nb - ended; i++) {
      const uint32_t piece = st.dealt[i];
      piece_run(x, xi, i, (uint64_t)piece * DEV_SLOT_BYTES, dealt_bytes(x.bytes, piece), st);
    }
    __syncthreads();
    TRACE_SPAN(publishing);
    if (threadIdx.x == 0) dealt_publish(x, xi, st);
    TRACE_SPAN_ADD(TRACE_PUBLISH, publishing);
    TRACE_ADD(TRACE_BATCHES, 1);
    TRACE_FIRST(TRACE_SENT);
    TRACE_AT(TRACE_PIECE);
    if (ended) return true;
  }
}

/* ---- The LL protocol (dev.h) ---- */

/* Staging of an LL piece in shared memory: what arrived (decoded from the lines) and what goes out (before
 * it is encoded), so that the combine is the Simple protocol's, on plain buffers. */
struct ll_stage {
  uint2 in[DEV_LL_PIECE / 8];
  uint2 out[DEV_LL_PIECE / 8];
};

/* The LL flag and lines of a ring's next piece. */
__device__ __forceinline__ uint32_t ll_flag(const ring_use &r) {
  return (uint32_t)(r.count + 1);
}

__device__ __forceinline__ uint4 *ll_slot(const ring_use &r) {
  return (uint4 *)(r.data + dev_ll_slot_at(r.count, DEV_PROTO_LL));
}

/* Every thread: piece [at, at + len) of LL128 transfer x (dev.h) by ll128_lines, from this rank's operands
 * and the lines arriving on rr to the destination and the lines sent on rs, in the slots of the rings'
 * current counts. False when the wait failed. */
__device__ __forceinline__ bool ll128_piece(const dev_xfer_t &x, const ring_use *rr, const ring_use *rs,
                                            uint64_t at, uint32_t len, const dev_comm_t *comm,
                                            const wait_what &what) {
  ll_io io;
  io.local = x.src != NULL ? x.src + at : NULL;
  io.dst = x.dst != NULL ? x.dst + at : NULL;
  io.mem = rr == NULL && (x.flags & DEV_XF_REDUCE) ? io.dst : NULL;
  io.in = rr != NULL ? (const uint4 *)(rr->data + dev_ll_slot_at(rr->count, DEV_PROTO_LL128)) : NULL;
  io.out = rs != NULL ? (uint4 *)(rs->data + dev_ll_slot_at(rs->count, DEV_PROTO_LL128)) : NULL;
  io.in_flag = rr != NULL ? ll_flag(*rr) : 0;
  io.out_flag = rs != NULL ? ll_flag(*rs) : 0;
  io.len = len;
  io.skip = 0;
  io.send_local = 0;
  return ll_piece(x, io, comm, what);
}

/* Every thread: moves the block's part of LL transfer k (its channel's part of the one slice, dev.h, in
 * pieces of its protocol, DEV_LL_PIECE or DEV_LL128_PIECE bytes, one slot each), each side on its own
 * protocol: thread 0 waits for room (and for a Simple receive's data) unless nothing is to be waited for and
 * `synced` says no piece was published since the last barrier; then an LL128 piece runs by ll128_lines, a
 * plain send and a receive that combines and stores without sending run line by line in registers
 * (ll_lines, ll.cuh), and any other piece reads an LL receive's lines into the staging, combines there and
 * writes an LL send's lines from it; thread 0 publishes. Each thread takes the rings' counts (the slots and
 * flags of the piece) before the barrier after which thread 0 moves them on. The host marks a transfer LL128
 * only where each side it has runs LL rings (both connections of a two-rank communicator), and at most half
 * the LL128 slots per channel (xfer_valid). Returns false (in every thread) when a wait failed, or an LL128
 * side has no LL ring. */
template <class W>
__device__ bool ll_run(const W &w, uint32_t k, block_state &st, ll_stage &sm, bool &synced) {
  const dev_xfer_t &x = xfer_at(w, k);
  const uint32_t xi = k - st.first;
  const ring_use *rr = x.recv_peer >= 0 ? &st.rings[st.recv_ring[xi]] : NULL;
  const ring_use *rs = x.send_peer >= 0 ? &st.rings[st.send_ring[xi]] : NULL;
  const bool ll128 = x.proto == DEV_PROTO_LL128;
  if (ll128 && ((rr != NULL && !rr->ll) || (rs != NULL && !rs->ll))) {
    if (threadIdx.x == 0) error_record(&w.comm, DEV_ERR_INVALID, -1, (int)st.channel, 0, w.seq + x.task, 0);
    return false;
  }
  const uint32_t piece = ll128 ? DEV_LL128_PIECE : DEV_LL_PIECE;
  const dev_span_t part = dev_part(x.bytes, x.nch, 0, st.channel);
  const uint64_t end = part.off + part.len;
  for (uint64_t at = part.off; at < end; at += piece) {
    const uint32_t len = end - at < piece ? (uint32_t)(end - at) : piece;
    /* Thread 0 waits and says so at a barrier, unless nothing is to be waited for and every thread sees
     * that alike: both sides LL (a receive waits on its lines) and the head last read leaves the send room,
     * read by every thread from the lane's rings while thread 0 has not moved them since a barrier. Thread
     * 0's wait moves the head last read, so where `synced` let the rings decide, the block meets first:
     * else a warp that read them after the wait would skip the barrier the others meet, and from there on
     * every barrier of the launch would pair the warp with the wrong one of the others'. */
    const bool quick = synced && (rr == NULL || rr->ll) &&
                       (rs == NULL || (rs->ll && rs->head_seen + DEV_LL_SLOTS > rs->count));
    if (!quick) {
      if (synced) __syncthreads(); /* every thread has read the rings */
      if (threadIdx.x == 0) st.batch = batch_wait(w, x, xi, 1, st);
      __syncthreads();
      if (st.batch == 0) return false;
    }
    synced = false; /* thread 0 publishes at the end of the piece */
    if (ll128) {
      const wait_what what = {x.recv_peer, (int)st.channel, 0, w.seq + x.task};
      const bool ok = ll128_piece(x, rr, rs, at, len, &w.comm, what);
      if (__syncthreads_or(!ok)) return false; /* every line read and every count taken */
      if (threadIdx.x == 0) batch_publish(x, xi, 0, 1, len, st);
      continue;
    }
    if (rs != NULL && rs->ll && dev_xf_plain_send(&x)) {
      const ll_io io = {x.src + at, NULL, NULL, NULL, ll_slot(*rs), 0, ll_flag(*rs), len};
      ll_lines(line_copy{false}, io, &w.comm, wait_what{});
      __syncthreads(); /* every thread took the count before thread 0 moves it on */
      if (threadIdx.x == 0) batch_publish(x, xi, 0, 1, len, st);
      continue;
    }
    piece_t pc;
    pc.local = x.src != NULL ? x.src + at : NULL;
    pc.dst = x.dst != NULL ? x.dst + at : NULL;
    pc.in = rr == NULL && (x.flags & DEV_XF_REDUCE) ? pc.dst : NULL;
    pc.out = NULL;
    pc.bytes = len;
    if (rr != NULL && rr->ll && rs == NULL && pc.local != NULL && pc.dst != NULL &&
        (x.flags & DEV_XF_REDUCE)) {
      const wait_what what = {x.recv_peer, (int)st.channel, 0, w.seq + x.task};
      const ll_io io = {pc.local, ll_slot(*rr), NULL, pc.dst, NULL, ll_flag(*rr), 0, len};
      const bool ok = ll_piece(x, io, &w.comm, what);
      if (__syncthreads_or(!ok)) return false; /* every line read: thread 0 frees the slot */
      if (threadIdx.x == 0) batch_publish(x, xi, 0, 1, len, st);
      continue;
    }
    if (rr != NULL && rr->ll) {
      /* the local operand is combined right after the lines arrive: read it while they travel, into the
       * outgoing staging when nothing is sent through it (an LL send needs it), else into L2 */
      if (pc.local != NULL && (x.flags & DEV_XF_REDUCE) && (rs == NULL || !rs->ll)) {
        ll_stage_local(sm.out, pc.local, len);
        pc.local = (const char *)sm.out;
      } else if (pc.local != NULL && threadIdx.x * 32 < len) {
        prefetch_l2(pc.local + threadIdx.x * 32);
      }
      const wait_what what = {x.recv_peer, (int)st.channel, 0, w.seq + x.task};
      const bool ok = ll_read(&w.comm, ll_slot(*rr), ll_flag(*rr), len, sm.in, what);
      if (__syncthreads_or(!ok)) return false;
      pc.in = (const char *)sm.in;
    } else if (rr != NULL) {
      pc.in = slot_at(*rr, 0);
    }
    uint4 *lines = NULL;
    uint32_t flag = 0;
    if (rs != NULL && rs->ll) {
      lines = ll_slot(*rs);
      flag = ll_flag(*rs);
      pc.out = (char *)sm.out;
    } else if (rs != NULL) {
      pc.out = slot_at(*rs, 0);
    }
    piece_combine(x, pc);
    __syncthreads();
    if (lines != NULL) ll_write(lines, flag, len, sm.out);
    if (threadIdx.x == 0) batch_publish(x, xi, 0, 1, len, st);
  }
  return true;
}

/* Every thread: runs the lane's transfers [st.first, st.end) on the block's channel, interleaved slice by
 * slice: slice j of each transfer in list order, then slice j + 1; a transfer with no bytes left in slice j
 * is skipped. */
template <class W> __device__ bool lane_run(const W &w, block_state &st, ll_stage &sm) {
  const uint32_t c = st.channel;
  bool ok = true;
  bool synced = true; /* no piece published since the block barrier that opened the step */
  for (uint32_t j = 0; ok; j++) {
    bool more = false; /* a transfer has bytes past slice j */
    for (uint32_t k = st.first; k < st.end && ok; k++) {
      const dev_xfer_t &x = xfer_at(w, k);
      if (x.dealt) { /* all of it in slice 0 */
        if (j == 0 && c < x.nch) ok = dealt_run(w, k, st);
        synced = false;
        continue;
      }
      const uint64_t stride = dev_slice_stride(x.nch);
      if (j * stride >= x.bytes) continue;
      more |= (j + 1) * stride < x.bytes;
      if (c >= x.nch) continue;
      if (x.flags & DEV_XF_LL) { /* one slice: the host keeps LL transfers within half a ring */
        ok = ll_run(w, k, st, sm, synced);
        continue;
      }
      dev_span_t part = dev_part(x.bytes, x.nch, j, c);
      if (part.len != 0) ok = part_run(w, k, part.off, (uint32_t)part.len, st);
      synced = false;
    }
    if (!more) break;
  }
  if (threadIdx.x == 0) lane_close(st);
  return ok;
}

/* The first warp: the transfers of the block's lane in step s, a range since a step's transfers are sorted
 * by lane: from the first transfer of a lane >= the block's to the next one of another lane, which must be a
 * later lane. The lanes of 32 transfers are read at once and compared by ballot. Returns the same in every
 * lane of the warp; thread 0 stores the range. */
template <class W> __device__ bool lane_range(const W &w, int s, block_state &st) {
  const uint32_t l = threadIdx.x, lane = st.lane, end = w.step_end[s], none = 0xffffffffu;
  uint32_t first = none, last = none;
  bool ordered = true;
  for (uint32_t base = s > 0 ? w.step_end[s - 1] : 0; base < end && last == none; base += 32) {
    const uint32_t k = base + l, kl = k < end ? xfer_at(w, k).lane : none;
    if (first == none) {
      const uint32_t ge = __ballot_sync(0xffffffffu, k < end && kl >= lane);
      if (ge != 0) first = base + __ffs(ge) - 1;
    }
    if (first != none) {
      const uint32_t other = __ballot_sync(0xffffffffu, k >= first && k < end && kl != lane);
      if (other != 0) {
        last = base + __ffs(other) - 1;
        ordered = __shfl_sync(0xffffffffu, kl, __ffs(other) - 1) > lane;
      }
    }
  }
  if (first == none) first = end;
  if (last == none) last = end;
  if (l == 0) {
    st.first = first;
    st.end = last;
  }
  return ordered && last - first <= DEV_LANE_XFERS; /* the host splits no lane this long */
}

/* The first warp: finds the block's lane's transfers in step st.step and their rings, when the step has the
 * lane. Returns the same in every lane of the warp. */
template <class W> __device__ bool step_open(const W &w, block_state &st) {
  if (st.lane >= w.step_lanes[st.step]) return true;
  const bool ok = lane_range(w, (int)st.step, st);
  if (!ok && threadIdx.x == 0) error_record(&w.comm, DEV_ERR_INVALID, -1, (int)st.channel, 0, w.seq, 0);
  __syncwarp(); /* the range is seen by every lane */
  return ok && lane_open(w, st);
}

/* Every thread: copies the launch's work from the parameters to shared memory, a word per thread. */
template <class W> __device__ __forceinline__ void work_copy(const W &param, W &w) {
  static_assert(sizeof(W) % sizeof(uint64_t) == 0 && sizeof(W) / sizeof(uint64_t) <= DEV_THREADS,
                "the work is copied in one word per thread");
  const uint32_t i = threadIdx.x;
  if (i < sizeof(W) / sizeof(uint64_t)) ((uint64_t *)&w)[i] = ((const uint64_t *)&param)[i];
  __syncthreads();
}

/* The block's lane and channel: block b serves lane b / nch and channel b % nch, or, where the host
 * interleaved the lanes (dev_comm_t.interleave, the grid's lanes), lane b % interleave and channel
 * b / interleave, so that neighbouring blocks serve different lanes. A launch of fewer lanes than that is so
 * spread over a wider grid: the blocks of lanes it does not have only meet the grid barriers. */
template <class W>
__device__ __forceinline__ void block_place(const W &w, uint32_t nch, uint32_t &lane, uint32_t &c) {
  const uint32_t k = (uint32_t)w.comm.interleave;
  lane = k > 1 ? blockIdx.x % k : blockIdx.x / nch;
  c = k > 1 ? blockIdx.x / k : blockIdx.x % nch;
}

/* The kernel (dev.h), for either entry point. The work is read from its copy in shared memory. A block's
 * position in the work (lane, channel, step, the lane's transfers) lives in shared memory too: thread 0 moves
 * it on between barriers, and keeping it out of registers leaves them to the reduction loops, whose calls
 * would otherwise push it to local memory. */
template <class W> __device__ __forceinline__ void kernel_run(const W &param) {
  __shared__ __align__(16) W w;
  __shared__ block_state st;
  __shared__ __align__(16) ll_stage sm;
  TRACE_BEGIN();
  work_copy(param, w);
  int failed = 0;
  if (threadIdx.x < 32) {
    failed = !work_valid(w);
    if (threadIdx.x == 0) {
      if (!failed) {
        uint32_t lane, c;
        block_place(w, (uint32_t)w.nch, lane, c);
        st.lane = lane;
        st.channel = c;
        st.step = 0;
      } else {
        error_record(&w.comm, DEV_ERR_INVALID, -1, -1, 0, w.seq, 0);
      }
    }
    __syncwarp();
    if (!failed && w.nsteps > 0) failed = !step_open(w, st);
    TRACE_AT(TRACE_OPENED);
  }
  if (__syncthreads_or(failed) == 0 && w.nsteps > 0) {
    for (;;) {
      if (st.lane < w.step_lanes[st.step] && !lane_run(w, st, sm)) break;
      if (st.step + 1 >= w.nsteps || !grid_sync(w, st)) break;
    }
  }
  TRACE_AT(TRACE_RUN);
  TRACE_SET(TRACE_LANE, (long long)st.lane * 1000 + st.channel);
  grid_finish(w);
  TRACE_AT(TRACE_CLOSED);
  TRACE_END(w.comm.rank, w.seq);
}

/* ---- The LL entry point (dev.h) ----
 *
 * A launch of one step whose transfers are all LL, each channel's part one piece, needs none of the general
 * kernel's machinery: no work copy, no lane scan, no ring table in shared memory, no per-piece barriers. Its
 * first warp opens the block (ll_open): a lane per side of a transfer, it reads its transfer from the
 * parameters, finds the side's ring and count and waits for room where the last reading of the head does not
 * show it, all lanes at once; then each transfer's send lane writes the transfer's task for every thread
 * (ll_task). The block's first transfer, when it only sends this rank's data and is at most LL_EARLY_BYTES,
 * is sent by the first warp there and then, before the barrier: that line is what the peer waits for, and it
 * need not wait for this block's barrier and dispatch. Then every thread moves its lines of the other
 * transfers in list order (ll_piece), and after one barrier the first warp stores the counts.
 *
 * A single warp's serial code costs about as many cycles as its instructions take to complete one after
 * another, so the way to the first line is kept short: the parameters are read once, in one trip; the rings,
 * counts and heads in a second; nothing after the barrier reads the parameters again. */

/* One side of a transfer on the block's channel, as a lane of the first warp holds it from ll_open to
 * ll_side_close. */
struct ll_side {
  uint4 *lines;        /* the piece's slot */
  dev_ctrl_t *ctrl;    /* its ring's control block */
  uint64_t *home;      /* the ring's count in dev_comm_t.ll_sent / ll_recvd */
  uint64_t *head_home; /* send sides: the head's last reading in dev_comm_t.ll_heads; else NULL */
  uint64_t count;      /* the piece's index on the ring: its flag is count + 1 */
  uint64_t head_seen;  /* send sides: the consumer's head as last read */
  uint32_t last;       /* the ring's last piece of the launch: this side stores the counts at the end */
};

/* One transfer of the launch as the first warp prepared it for the block (shared memory). */
struct ll_task {
  dev_xfer_t x; /* the transfer, read from the parameters once */
  ll_io io;     /* the block's part of it: operands, lines and flags */
  uint8_t run;  /* every thread moves the part after the barrier (0: no part here, or sent early) */
  uint8_t sync; /* a block barrier first: its part differs in size or place from the previous one moved */
};

/* The largest part the first warp sends before the barrier: 4 lines per lane, loaded together. */
#define LL_EARLY_LINES 4
#define LL_EARLY_BYTES (32 * 8 * LL_EARLY_LINES)

/* The launch has the shape this entry point runs (the host chose it for that; anything else is a bug,
 * reported as DEV_ERR_INVALID). */
__device__ bool ll_work_valid(const dev_work_small_t &w) {
  const dev_comm_t *comm = &w.comm;
  return (comm->nch_max >= 1) & (w.nch >= 1) & (w.nch <= (uint32_t)comm->nch_max) &
         (w.nch <= DEV_LL_CHANNELS) & (blockDim.x % 32 == 0) & (blockDim.x <= DEV_THREADS) & (w.ext == NULL) &
         (w.nsteps == 1) & (w.nxfers <= DEV_SMALL_XFERS) & (w.step_end[0] == w.nxfers) &
         (gridDim.x == (uint32_t)w.step_lanes[0] * w.nch);
}

/* The first warp: sends `len` bytes of `local` (at most LL_EARLY_BYTES) in the lines at `out`, 4 lines per
 * lane, every load before the first store. */
__device__ __forceinline__ void ll_send_early(const char *local, uint4 *out, uint32_t flag, uint32_t len) {
  const uint32_t l = threadIdx.x % 32, lines = (len + 7) / 8;
  uint2 v[LL_EARLY_LINES];
#pragma unroll
  for (uint32_t j = 0; j < LL_EARLY_LINES; j++) {
    if (l + 32 * j < lines) v[j] = load8(local, l + 32 * j, len);
  }
#pragma unroll
  for (uint32_t j = 0; j < LL_EARLY_LINES; j++) {
    const uint32_t i = l + 32 * j;
    if (i >= lines) break;
    store_line(out + i, make_uint4(v[j].x, flag, v[j].y, flag));
  }
}

/* The first warp: lane l takes side l % 2 (0: send) of transfer l / 2 on the block's channel. Each side's
 * piece takes the next index of its ring after those of the sides before it in list order that share the
 * ring (match), and the last of them waits for room for all: the head must have passed every piece up to
 * DEV_LL_SLOTS before it (the host keeps a ring's pieces of one launch within DEV_LL_SLOTS, so room only
 * waits for earlier launches). Then the block's first transfer goes out early when it can, and lane 2k
 * writes task k. Returns the same in every lane: false when a transfer is malformed or a wait failed (nothing
 * sent). */
__device__ bool ll_open(const dev_work_small_t &w, uint32_t lane, uint32_t c, ll_side &sd, ll_task *tasks) {
  const uint32_t all = 0xffffffffu;
  const dev_comm_t *comm = &w.comm;
  const uint32_t l = threadIdx.x, k = l / 2, below = (1u << l) - 1;
  const bool send = (l & 1) == 0, have = k < w.nxfers;
  dev_xfer_t x = {};
  if (have) x = w.xfers[k]; /* every field in one trip; nothing below reads the parameters' list again */
  x.recv_peer = have ? x.recv_peer : -1;
  x.send_peer = have ? x.send_peer : -1;
  const int peer = send ? x.send_peer : x.recv_peer;
  const dev_span_t part = dev_part(x.bytes, x.nch > 0 ? x.nch : 1, 0, c);
  const bool mine = have & (x.lane == lane) & (c < x.nch) & (part.len != 0);
  const bool side_ll = (x.flags & (send ? DEV_XF_LL_SEND : DEV_XF_LL_RECV)) != 0;
  bool bad = have && (!xfer_valid(x, w) | !(x.flags & DEV_XF_LL) | (x.proto != DEV_PROTO_LL) |
                      ((peer >= 0) & !side_ll) | !dev_ll_one_piece(x.bytes, x.nch));
  const bool used = mine && peer >= 0 && !bad;
  const int idx = peer * DEV_LL_CHANNELS + (int)c;
  dev_ring_t ring = {NULL, NULL, NULL};
  sd = ll_side{};
  if (used) {
    ring = (send ? comm->ll_send : comm->ll_recv)[idx];
    sd.home = &(send ? comm->ll_sent : comm->ll_recvd)[idx];
    sd.count = __ldcg(sd.home);
    if (send) {
      sd.head_home = &comm->ll_heads[idx];
      sd.head_seen = __ldcg(sd.head_home);
    }
    bad = ring.data == NULL || ring.ctrl == NULL;
  }
  const bool live = used && !bad;
  const uint32_t same = __match_any_sync(all, live ? (unsigned long long)sd.home : 0ull);
  sd.count += __popc(same & below);
  sd.last = live && (same >> l) == 1;
  sd.ctrl = live ? ring.ctrl : NULL;
  sd.lines = live ? (uint4 *)(ring.data + dev_ll_slot_at(sd.count, DEV_PROTO_LL)) : NULL;
  bool ok = !bad;
  if (live && send && sd.last && sd.head_seen + DEV_LL_SLOTS <= sd.count) {
    const wait_what what = {peer, (int)c, 1, w.seq + x.task};
    ok = wait_at_least(comm, &ring.ctrl->head, sd.count + 1 - DEV_LL_SLOTS, what, &sd.head_seen);
  }
  if (bad) error_record(comm, DEV_ERR_INVALID, peer, (int)c, send, w.seq, 0);
  if (!__all_sync(all, ok)) return false;
  TRACE_AT(TRACE_SIDES);

  /* Task k, by its send lane: the receive side's lines come from the next lane; the barrier rule compares
   * the part with the previous one the block moves. */
  const uint4 *in_lines = (const uint4 *)__shfl_down_sync(all, (unsigned long long)sd.lines, 1);
  const uint32_t in_flag = (uint32_t)__shfl_down_sync(all, sd.count, 1) + 1;
  const uint32_t movers = __ballot_sync(all, send && mine) & below;
  const int prev = movers != 0 ? 31 - __clz(movers) : (int)l;
  const uint64_t prev_bytes = __shfl_sync(all, x.bytes, prev);
  const uint32_t prev_nch = __shfl_sync(all, (uint32_t)x.nch, prev);
  const bool local_reduce = x.recv_peer < 0 && (x.flags & DEV_XF_REDUCE) != 0;
  const ll_io io = {x.src != NULL ? x.src + part.off : NULL,
                    x.recv_peer >= 0 ? in_lines : NULL,
                    local_reduce && x.dst != NULL ? x.dst + part.off : NULL,
                    x.dst != NULL ? x.dst + part.off : NULL,
                    sd.lines,
                    in_flag,
                    (uint32_t)(sd.count + 1),
                    (uint32_t)part.len};
  /* The block's first part, when it only sends this rank's data, goes now, from the first warp. */
  const bool early = send && mine && movers == 0 && dev_xf_plain_send(&x) && part.len <= LL_EARLY_BYTES;
  const uint32_t early_lane = __ballot_sync(all, early);
  if (early_lane != 0) {
    const int e = __ffs(early_lane) - 1;
    TRACE_AT(TRACE_EARLY);
    ll_send_early((const char *)__shfl_sync(all, (unsigned long long)io.local, e),
                  (uint4 *)__shfl_sync(all, (unsigned long long)io.out, e), __shfl_sync(all, io.out_flag, e),
                  __shfl_sync(all, io.len, e));
    TRACE_AT(TRACE_SENT);
  }
  if (send && have) {
    ll_task &t = tasks[k];
    t.x = x;
    t.io = io;
    t.run = mine && !early;
    t.sync = movers != 0 && (prev_bytes != x.bytes || prev_nch != x.nch);
  }
  return true;
}

/* The first warp, after every thread's last line: stores the counts of the rings whose last piece of the
 * launch its lane holds. A receive also frees its slots for the sender (head, in its ring's control block;
 * the barrier before this ordered every thread's reads of the lines first). */
__device__ void ll_side_close(const ll_side &sd) {
  if (!sd.last) return;
  __stcg(sd.home, sd.count + 1);
  if (sd.head_home != NULL) {
    __stcg(sd.head_home, sd.head_seen);
  } else {
    sd.ctrl->head = sd.count + 1;
  }
}

/* Every thread: the block's tasks in list order, each part by ll_piece. A barrier separates two whose parts
 * differ in size or place (then a thread's lines of one are not its lines of the other, and a later transfer
 * may read what an earlier one stored); parts of one size and channels each touch the same bytes in the same
 * thread, in order, so they need none (a one-shot all-reduce in place sends its data and then overwrites it
 * with the result). A part sent early by the first warp is ordered before the rest by the barrier after
 * ll_open. */
__device__ bool ll_run(const dev_work_small_t &w, uint32_t c, const ll_task *tasks) {
  bool ok = true; /* a thread whose wait failed still meets the others at each barrier */
  for (uint32_t k = 0; k < w.nxfers; k++) {
    const ll_task &t = tasks[k];
    if (!t.run) continue;
    if (t.sync) __syncthreads();
    TRACE_AT(TRACE_TASK);
    const wait_what what = {t.x.recv_peer, (int)c, 0, w.seq + t.x.task};
    if (ok) ok = ll_piece(t.x, t.io, &w.comm, what);
  }
  return ok;
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

/* ---- The pair entry point (dev.h, dev_pair_t) ---- */

/* Channel c's part of p.send as one thread holds it: the slot its lines go to, with their flag, the count to
 * store, and the thread's first line of data. */
struct pair_out {
  uint4 *lines;   /* NULL: nothing to send on this channel */
  uint64_t *home; /* the ring's count in dev_comm_t.ll_sent */
  uint64_t count;
  const char *src;
  uint32_t len;
  uint32_t proto; /* the send's DEV_PROTO_* */
  uint2 first;    /* line t of the part, for a thread t that sends (LL) */
};

/* pair_send_open from the ring's table entry (ring, at idx), the head last read and o's count as loaded:
 * checks the ring, waits for room where the head shows none, and points o at the slot. */
__device__ __forceinline__ bool pair_send_ready(const dev_pair_t &p, uint32_t c, int idx, dev_ring_t ring,
                                                uint64_t head, pair_out &o) {
  const dev_xfer_t &x = p.send;
  const dev_comm_t *comm = &p.comm;
  if (ring.data == NULL || ring.ctrl == NULL) {
    if (threadIdx.x == 0) error_record(comm, DEV_ERR_INVALID, x.send_peer, (int)c, 1, p.seq + x.task, 0);
    return false;
  }
  if (head + DEV_LL_SLOTS <= o.count) { /* the same loads in every thread: the block agrees */
    int failed = 0;
    if (threadIdx.x == 0) {
      const wait_what what = {x.send_peer, (int)c, 1, p.seq + x.task};
      failed = !wait_at_least(comm, &ring.ctrl->head, o.count + 1 - DEV_LL_SLOTS, what, &head);
    }
    if (__syncthreads_or(failed)) return false;
    if (threadIdx.x == 0) __stcg(&comm->ll_heads[idx], head);
  }
  o.lines = (uint4 *)(ring.data + dev_ll_slot_at(o.count, x.proto));
  return true;
}

/* Every thread of the block: opens channel c's part of p.send. It loads the ring's table entry, its count,
 * the head last read and, for a thread that sends (t < the part's lines, `loads`), its first line of data
 * (the compiler issues the count and the head after the ring's check; issued before it, or before the
 * launch check as pair_ar_load does, they made the pair kernel no faster, and the second slower); only when
 * the head last read shows no room (once in DEV_LL_SLOTS launches at most) does thread 0 read the consumer's
 * head across the link while the block waits. False when that wait failed (in every thread). Every thread
 * reads the count and the head last read, so both are stored back only after a block barrier: the head here,
 * the count by pair_send_close. */
__device__ bool pair_send_open(const dev_pair_t &p, uint32_t c, uint32_t t, bool loads, pair_out &o) {
  const dev_xfer_t &x = p.send;
  const dev_comm_t *comm = &p.comm;
  o.lines = NULL;
  if (c >= x.nch) return true;
  const dev_span_t part = dev_part(x.bytes, x.nch, 0, c);
  if (part.len == 0) return true;
  const int idx = x.send_peer * DEV_LL_CHANNELS + (int)c;
  const dev_ring_t ring = comm->ll_send[idx];
  o.home = &comm->ll_sent[idx];
  o.count = __ldcg(o.home);
  uint64_t head = __ldcg(&comm->ll_heads[idx]);
  o.src = x.src + part.off;
  o.len = (uint32_t)part.len;
  o.proto = x.proto;
  o.first =
      loads && x.proto == DEV_PROTO_LL && t < (o.len + 7) / 8 ? load8(o.src, t, o.len) : make_uint2(0, 0);
  return pair_send_ready(p, c, idx, ring, head, o);
}

/* A sending thread t of `stride`: stores its lines of the part (line t from o.first), each with one 16-byte
 * store carrying the flag; an LL128 send, by whole warps (ll128_lines: `stride` is the block from its
 * thread stride's warps on, as the receiving half of fused 2 is never LL128). */
__device__ void pair_send_lines(const pair_out &o, uint32_t t, uint32_t stride) {
  if (o.lines == NULL) return;
  const uint32_t flag = (uint32_t)(o.count + 1);
  TRACE_AT(TRACE_EARLY);
  if (o.proto == DEV_PROTO_LL128) {
    const ll_io io = {o.src, NULL, NULL, NULL, o.lines, 0, flag, o.len, blockDim.x - stride};
    ll128_lines<line_copy, false>(line_copy{false}, io, NULL, wait_what{});
    TRACE_AT(TRACE_SENT);
    return;
  }
  for (uint32_t i = t; i < (o.len + 7) / 8; i += stride) {
    const uint2 v = i == t ? o.first : load8(o.src, i, o.len);
    store_line(o.lines + i, make_uint4(v.x, flag, v.y, flag));
  }
  TRACE_AT(TRACE_SENT);
}

/* Thread 0, after a block barrier that follows every thread's pair_send_open: moves the send ring's count
 * on, for the next launch. */
__device__ __forceinline__ void pair_send_close(const pair_out &o) {
  if (threadIdx.x == 0 && o.lines != NULL) __stcg(o.home, o.count + 1);
}

/* Thread t of `stride`: its lines of channel c's part of p.copy, from src to dst. */
__device__ void pair_copy(const dev_pair_t &p, uint32_t c, uint32_t t, uint32_t stride) {
  const dev_xfer_t &x = p.copy;
  if (c >= x.nch) return;
  const dev_span_t part = dev_part(x.bytes, x.nch, 0, c);
  const uint32_t len = (uint32_t)part.len;
  for (uint32_t i = t; i < (len + 7) / 8; i += stride)
    store8(x.dst + part.off, i, len, load8(x.src + part.off, i, len));
}

/* Channel c's part of p.recv as the block holds it: the ring's control block and count (NULL: nothing to
 * receive on this channel). */
struct pair_in {
  dev_ctrl_t *ctrl;
  uint64_t *home;
  uint64_t count;
};

/* Channel c's receive ring of p.recv, and in *home where its count lives. */
__device__ __forceinline__ dev_ring_t pair_recv_ring(const dev_pair_t &p, uint32_t c, uint64_t **home) {
  const int idx = p.recv.recv_peer * DEV_LL_CHANNELS + (int)c;
  *home = &p.comm.ll_recvd[idx];
  return p.comm.ll_recv[idx];
}

/* The threads from `skip` on: receive their lines of channel c's part of p.recv from LL ring c of its peer
 * (ll_piece: this rank's operand read before the wait, then combined or copied into dst). With `o` (LL128
 * fused 1: an in-place all-reduce, or a send and a receive on the same bytes), each warp first sends its
 * units of the send's source on o's lines, then awaits the arriving ones and overwrites its units. False when
 * a wait failed or the ring is missing. */
__device__ bool pair_recv_lines(const dev_pair_t &p, uint32_t c, uint32_t skip, pair_in &in,
                                const pair_out *o) {
  const dev_xfer_t &x = p.recv;
  const dev_comm_t *comm = &p.comm;
  in.ctrl = NULL;
  if (c >= x.nch) return true;
  const dev_span_t part = dev_part(x.bytes, x.nch, 0, c);
  if (part.len == 0) return true;
  const dev_ring_t ring = pair_recv_ring(p, c, &in.home);
  in.count = __ldcg(in.home);
  const wait_what what = {x.recv_peer, (int)c, 0, p.seq + x.task};
  if (ring.data == NULL || ring.ctrl == NULL) {
    if (threadIdx.x == skip) error_record(comm, DEV_ERR_INVALID, x.recv_peer, (int)c, 0, what.seq, 0);
    return false;
  }
  in.ctrl = ring.ctrl;
  ll_io io = {x.src != NULL ? x.src + part.off : NULL,
              (const uint4 *)(ring.data + dev_ll_slot_at(in.count, x.proto)),
              NULL,
              x.dst + part.off,
              NULL,
              (uint32_t)(in.count + 1),
              0,
              (uint32_t)part.len,
              skip};
  if (o != NULL && o->lines != NULL) {
    /* what goes out is the send's source (the same bytes as this part: fused sides are alike); a plain
     * receive in place (a send/receive into the buffer it sends) has no operand of its own to combine, and
     * line_copy takes only the arriving lines */
    io.local = o->src;
    io.out = o->lines;
    io.out_flag = (uint32_t)(o->count + 1);
    io.send_local = 1;
  }
  return ll_piece(x, io, comm, what);
}

/* The first receiving thread (`lead`), after the block's barrier that follows every thread's reads of the
 * slot: stores the receive ring's count and frees the slot for the sender (head). */
__device__ __forceinline__ void pair_recv_close(const pair_in &in, uint32_t lead) {
  if (threadIdx.x != lead || in.ctrl == NULL) return;
  __stcg(in.home, in.count + 1);
  in.ctrl->head = in.count + 1;
}

/* The launch has the shape this entry point runs (the host chose it for that). The same answer in every
 * thread: parameters only, no memory trip. */
__device__ __forceinline__ bool pair_valid(const dev_pair_t &p) {
  const uint32_t nch = p.nch;
  const bool sends = p.send.nch > 0, recvs = p.recv.nch > 0, copies = p.copy.nch > 0;
  return (nch >= 1) & (nch <= DEV_LL_CHANNELS) & (nch <= (uint32_t)p.comm.nch_max) & (p.send.nch <= nch) &
         (p.recv.nch <= nch) & (p.copy.nch <= nch) & (sends | recvs) &
         (p.send_blocks == ((sends | copies) && !p.fused ? nch : 0)) & (p.recv_blocks == (recvs ? nch : 0)) &
         (p.fused <= 2) & (!p.fused | (sends & recvs)) &
         (gridDim.x == (uint32_t)p.send_blocks + p.recv_blocks) &
         (blockDim.x % (p.fused == 2 ? 64 : 32) == 0) & (blockDim.x <= DEV_THREADS) &
         (!sends | (p.send.send_peer >= 0)) & (!recvs | (p.recv.recv_peer >= 0)) &
         (!sends | dev_xf_one_piece(&p.send)) & (!recvs | dev_xf_one_piece(&p.recv)) &
         (p.send.proto <= DEV_PROTO_LL128) & (p.recv.proto <= DEV_PROTO_LL128) &
         ((p.fused != 2) | ((p.send.proto | p.recv.proto) == DEV_PROTO_LL)) &
         ((p.fused != 2) |
          ((dev_part(p.send.bytes, p.send.nch > 0 ? p.send.nch : 1, 0, 0).len + 7) / 8 <= blockDim.x / 2));
}

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

/* ---- The all-reduce's pair entry points (dev.h, DEV_KERNEL_PAIR_AR*_NAME) ---- */

/* The launch is what braid_kernel_pair_ar (LL128: braid_kernel_pair_ar128) runs: the pair kernel's shape, an
 * all-reduce run fused, in place or out (dev_pair_ar), in that protocol. Parameters only. */
template <bool LL128> __device__ __forceinline__ bool pair_ar_valid(const dev_pair_t &p) {
  return pair_valid(p) & (dev_pair_ar(&p) != 0) & (p.recv.proto == (LL128 ? DEV_PROTO_LL128 : DEV_PROTO_LL));
}

/* What a block of the all-reduce's pair entries loads first: both rings' table entries, their counts, the
 * send's head last read and, in LL, the thread's first line of the operand where it is 8 whole aligned
 * bytes. Their addresses follow from the parameters alone, so they are issued before the launch is checked
 * and travel while the check runs: one memory trip before the first line goes out. The indices are held
 * within the tables and the line within the part, so a launch that fails the check reads nothing it could
 * not. */
struct pair_ar_early {
  dev_ring_t recv, send;
  uint64_t recv_count, send_count, head;
  uint64_t first; /* LL: line t of the part, where `first_ok` */
  bool first_ok;
};

template <bool LL128>
__device__ __forceinline__ pair_ar_early pair_ar_load(const dev_pair_t &p, uint32_t c, dev_span_t part) {
  const dev_comm_t &comm = p.comm;
  const uint32_t nranks = comm.nranks > 0 ? (uint32_t)comm.nranks : 1;
  const uint32_t ch = c < DEV_LL_CHANNELS ? c : DEV_LL_CHANNELS - 1;
  const uint32_t rp = (uint32_t)p.recv.recv_peer < nranks ? (uint32_t)p.recv.recv_peer : 0;
  const uint32_t sp = (uint32_t)p.send.send_peer < nranks ? (uint32_t)p.send.send_peer : 0;
  const uint32_t ri = rp * DEV_LL_CHANNELS + ch, si = sp * DEV_LL_CHANNELS + ch;
  pair_ar_early e;
  e.recv.data = (char *)ld8_if(&comm.ll_recv[ri].data, comm.ll_recv != NULL);
  e.recv.ctrl = (dev_ctrl_t *)ld8_if(&comm.ll_recv[ri].ctrl, comm.ll_recv != NULL);
  e.recv.marks = NULL;
  e.recv_count = ld8_if(&comm.ll_recvd[ri], comm.ll_recvd != NULL);
  e.send.data = (char *)ld8_if(&comm.ll_send[si].data, comm.ll_send != NULL);
  e.send.ctrl = (dev_ctrl_t *)ld8_if(&comm.ll_send[si].ctrl, comm.ll_send != NULL);
  e.send.marks = NULL;
  e.send_count = ld8_if(&comm.ll_sent[si], comm.ll_sent != NULL);
  e.head = ld8_if(&comm.ll_heads[si], comm.ll_heads != NULL);
  const char *src = p.send.src + part.off;
  e.first_ok = !LL128 && p.send.src != NULL && c < p.send.nch && ((uintptr_t)src & 7) == 0 &&
               8 * threadIdx.x + 8 <= part.len;
  e.first = ld8_if((const uint2 *)src + threadIdx.x, e.first_ok);
  return e;
}

/* Both entry points: every thread issues the loads of pair_ar_early, then checks the launch. In LL each
 * thread sends its lines, then combines each arriving line with the one it holds; in LL128 each warp sends
 * its units of the operand, then awaits the peer's and stores their combination in the output
 * (ll128_lines, as the pair kernel's fused 1). LL128's routine needs nearly every register a thread has,
 * and a kernel that calls it spills: the LL kernel does not call it, so its loads stay in registers. */
template <bool LL128> __device__ __forceinline__ void pair_ar_run(const dev_pair_t &p) {
  TRACE_BEGIN();
  const uint32_t c = blockIdx.x;
  const dev_xfer_t &x = p.recv;
  /* the part as the checked launch has it (the send's and the receive's are the same, dev_pair_ar) */
  const dev_span_t part = dev_part(p.send.bytes, p.send.nch > 0 ? p.send.nch : 1, 0, c);
  const pair_ar_early e = pair_ar_load<LL128>(p, c, part);
  if (!pair_ar_valid<LL128>(p)) {
    if (threadIdx.x == 0) error_record(&p.comm, DEV_ERR_INVALID, -1, (int)c, 0, p.seq, 0);
    return;
  }
  TRACE_AT(TRACE_VALID);
  pair_in in = {NULL, NULL, 0};
  const dev_ring_t ring = e.recv;
  pair_out o;
  o.lines = NULL;
  if (c < x.nch && part.len > 0) {
    in.home = &p.comm.ll_recvd[x.recv_peer * DEV_LL_CHANNELS + (int)c];
    in.count = e.recv_count;
    const int idx = p.send.send_peer * DEV_LL_CHANNELS + (int)c;
    o.home = &p.comm.ll_sent[idx];
    o.count = e.send_count;
    o.src = p.send.src + part.off;
    o.len = (uint32_t)part.len;
    o.proto = p.send.proto;
    o.first = make_uint2(0, 0);
    if (!LL128 && e.first_ok) /* LL: the thread's first line, loaded early where it is 8 aligned bytes */
      o.first = make_uint2((uint32_t)e.first, (uint32_t)(e.first >> 32));
    else if (!LL128 && threadIdx.x < (o.len + 7) / 8)
      o.first = load8(o.src, threadIdx.x, o.len);
    if (!pair_send_ready(p, c, idx, e.send, e.head, o)) return;
  }
  TRACE_AT(TRACE_SIDES);
  bool ok = true;
  if (in.home != NULL && (ring.data == NULL || ring.ctrl == NULL)) {
    if (threadIdx.x == 0) error_record(&p.comm, DEV_ERR_INVALID, x.recv_peer, (int)c, 0, p.seq + x.task, 0);
    ok = false;
  } else if (in.home != NULL) {
    in.ctrl = ring.ctrl;
    const uint32_t len = (uint32_t)part.len, flag = (uint32_t)(in.count + 1);
    const uint4 *slot = (const uint4 *)(ring.data + dev_ll_slot_at(in.count, x.proto));
    const wait_what what = {x.recv_peer, (int)c, 0, p.seq + x.task};
    if constexpr (LL128) {
      const ll_io io = {
          x.src + part.off, slot, NULL, x.dst + part.off, o.lines, flag, (uint32_t)(o.count + 1), len, 0, 1};
      ok = ll_piece<true>(x, io, &p.comm, what);
    } else {
      pair_send_lines(o, threadIdx.x, blockDim.x);
      for (uint32_t i = threadIdx.x; i < (len + 7) / 8; i += blockDim.x) {
        /* this rank's operand: the line sent first is still in hand */
        const uint2 l = i == threadIdx.x ? o.first : load8(x.src + part.off, i, len);
        uint2 v;
        if (!ll_wait_line(&p.comm, slot + i, flag, what, &v)) {
          ok = false;
          break;
        }
        if (i == threadIdx.x) TRACE_AT(TRACE_ARRIVED);
        with_binary_op(x, [&](auto op, auto n) {
          v = line_op<typename decltype(n)::type, decltype(op)::value>(x)(l, v);
        });
        store8(x.dst + part.off, i, len, v);
      }
    }
  }
  TRACE_AT(TRACE_RUN);
  if (__syncthreads_or(!ok) == 0) {
    pair_recv_close(in, 0);
    pair_send_close(o);
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
