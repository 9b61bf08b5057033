/*
 * The general kernel (braid_kernel and braid_kernel_small in kernels.cu): kernel_run and its machinery.
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
 * cycles per dependent read, which is where a small call's time went. Launches that are latency alone take
 * the LL entry point (ll_entry.cuh) instead, and one-slice Simple launches over p2p the bulk one (bulk.cuh).
 *
 * Every spin loop looks at the clock every WAIT_CHECK_SPINS spins, and at the abort flag and the error word
 * (another block failed) every WAIT_HOST_SPINS (wait.cuh). The first block that fails records the error;
 * every block then leaves through the end of the kernel, where the last one out resets the grid barrier for
 * the next launch.
 */
#ifndef BRAID_DEVICE_GENERAL_CUH
#define BRAID_DEVICE_GENERAL_CUH

#include <stddef.h>
#include <stdint.h>

#include "device/dev.h"
#include "device/ll.cuh"
#include "device/reduce.cuh"
#include "device/trace.cuh"
#include "device/wait.cuh"
#include "device/xfer.cuh"

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
 * side has no LL ring.
 *
 * Thread 0 waits and says so at a barrier, unless nothing is to be waited for and every thread sees that
 * alike (`quick`): both sides LL (a receive waits on its lines) and the head last read leaves the send room,
 * read by every thread from the lane's rings while thread 0 has not moved them since a barrier. Thread 0's
 * wait moves the head last read, so where `synced` let the rings decide, the block meets first: else a warp
 * that read them after the wait would skip the barrier the others meet, and from there on every barrier of
 * the launch would pair the warp with the wrong one of the others'. An LL receive's local operand is combined
 * right after the lines arrive: it is read while they travel, into the outgoing staging when nothing is sent
 * through it (an LL send needs it), else into L2. */
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
      if (pc.local != NULL && (x.flags & DEV_XF_REDUCE) && (rs == NULL || !rs->ll)) {
        ll_stage_local(sm.out, pc.local, len);
        pc.local = (const char *)sm.out;
      } else if (pc.local != NULL && threadIdx.x * 32 < len) {
        prefetch_l2(pc.local + threadIdx.x * 32);
      }
      const wait_what what = {x.recv_peer, (int)st.channel, 0, w.seq + x.task};
      if (__syncthreads_or(!ll_read(&w.comm, ll_slot(*rr), ll_flag(*rr), len, sm.in, what))) return false;
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

#endif
