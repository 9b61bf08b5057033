/*
 * The bulk entry point, braid_kernel_bulk (dev.h): launches of one step whose transfers are all Simple, each
 * in one slice, over connections whose rings have chunk marks (p2p). That is most of a mid-sized call (a
 * one-shot all-reduce from 512 KiB to 16 MiB on two GPUs, a send/receive, an all-gather up to 20 MiB): the
 * slots hold the whole part of each channel, so nothing in the launch waits for a slot to be freed, and the
 * general kernel's machinery (work copy, lane scan, ring tables, a batch of pieces between two block
 * barriers, one thread fencing each slot before the receiver may touch any of it) is what such a call would
 * pay for.
 *
 * A block serves one lane on one channel, as in the general kernel. Its first warp opens it (bulk_open): a
 * lane per side of a transfer, it reads its transfer from the parameters, finds the side's ring, count and
 * marks, gives sides that share a ring consecutive pieces and waits for room where the last reading of the
 * head does not show it (room only ever waits for earlier launches: the host keeps a ring's pieces of one
 * launch within DEV_SLOTS). Then every warp moves chunks of DEV_CHUNK_BYTES on its own (bulk_run): chunk q of
 * a part goes to warp q % warps, which waits for the chunk's mark when it receives, combines the chunk
 * (piece_combine over the warp's 32 threads) and, when it sends, fences and stores the chunk's mark, so a
 * receiver starts on the first chunks while the last are on the link, and a fence holds up one warp, not the
 * block. After one block barrier the first warp stores the counts, frees the received slots (head) and
 * publishes the sent ones as the Simple protocol does (sizes, a fence, tail), so that a general kernel on the
 * other side reads them alike.
 *
 * A split lane (dev.h; dev_comm_t.split) runs on two halves of the grid: the first nch blocks move the
 * lane's sends, the next nch its receive, each half opening and closing only its own sides, and guards order
 * the receive's stores after the send's reads of the same chunk.
 */
#ifndef BRAID_DEVICE_BULK_CUH
#define BRAID_DEVICE_BULK_CUH

#include <stdint.h>

#include "device/dev.h"
#include "device/reduce.cuh"
#include "device/trace.cuh"
#include "device/wait.cuh"
#include "device/xfer.cuh"

/* One side of a transfer on the block's channel, as a lane of the first warp holds it from bulk_open to
 * bulk_close. */
struct bulk_side {
  dev_ctrl_t *ctrl;    /* its ring's control block */
  uint64_t *home;      /* the ring's count in dev_comm_t.sent / recvd */
  uint64_t *head_home; /* send sides: the head's last reading in dev_comm_t.heads; else NULL */
  uint64_t count;      /* the index on the ring of the side's first piece */
  uint64_t head_seen;  /* send sides: the consumer's head as last read */
  uint32_t len;        /* bytes of the side's part */
  uint32_t last;       /* the ring's last side of the launch: this lane stores the counts at the end */
};

/* One side's ring as a task reads it: the slots, their marks, and the index of the side's first piece. */
struct bulk_ring {
  char *data;
  uint64_t *marks;
  uint64_t count;
};

/* What a task of a split lane does with its chunks' guards (dev.h, "A split lane"). */
enum { BULK_GUARD_NONE = 0, BULK_GUARD_STORE = 1, BULK_GUARD_WAIT = 2 };

/* One transfer of the launch as the first warp prepared it for the block (shared memory). */
struct bulk_task {
  dev_xfer_t x; /* the transfer, read from the parameters once */
  uint64_t off; /* the block's part of it: [off, off + len) */
  uint32_t len;
  bulk_ring in;    /* the receive side's ring (data NULL: none) */
  bulk_ring out;   /* the send side's ring (data NULL: none) */
  bulk_ring guard; /* a split lane's guards (marks: the words, count: the receive ring's), else unused */
  uint8_t run;     /* the block has a part of it */
  uint8_t sync;    /* a block barrier first: its part differs in size or place from the previous one moved */
  uint8_t guarded; /* BULK_GUARD_* */
};

/* The launch has the shape this entry point runs (the host chose it for that; anything else is a bug,
 * reported as DEV_ERR_INVALID). */
__device__ bool bulk_work_valid(const dev_work_small_t &w) {
  const dev_comm_t *comm = &w.comm;
  const bool split = comm->split != 0;
  return (comm->nch_max >= 1) & (w.nch >= 1) & (w.nch <= (uint32_t)comm->nch_max) & (blockDim.x % 32 == 0) &
         (blockDim.x <= DEV_THREADS) & (w.ext == NULL) & (w.nsteps == 1) & (w.nxfers <= DEV_SMALL_XFERS) &
         (w.step_end[0] == w.nxfers) & (gridDim.x == (split ? 2u : (uint32_t)w.step_lanes[0]) * w.nch) &
         (!split | ((w.step_lanes[0] == 1) & (w.nxfers == 2) & (comm->guards != NULL)));
}

/* Where chunk q of a part lies on its ring: piece q / DEV_MARKS of the side, chunk q % DEV_MARKS of the
 * piece's slot. */
__device__ __forceinline__ char *bulk_chunk(const bulk_ring &r, uint32_t q) {
  const uint64_t slot = (r.count + q / DEV_MARKS) % DEV_SLOTS;
  return r.data + (size_t)slot * DEV_SLOT_BYTES + (size_t)(q % DEV_MARKS) * DEV_CHUNK_BYTES;
}

__device__ __forceinline__ volatile uint64_t *bulk_mark(const bulk_ring &r, uint32_t q) {
  const uint64_t slot = (r.count + q / DEV_MARKS) % DEV_SLOTS;
  return r.marks + (size_t)slot * DEV_MARKS + q % DEV_MARKS;
}

/* The value of chunk q's mark once it has landed: its piece's index on the ring, plus one. */
__device__ __forceinline__ uint64_t bulk_mark_value(const bulk_ring &r, uint32_t q) {
  return r.count + q / DEV_MARKS + 1;
}

/* A load of 8 bytes, cached in L2 only (as __ldcg), where the code puts it. */
__device__ __forceinline__ uint64_t bulk_load(const void *p) {
  uint64_t v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

/* The first warp: lane l takes side l % 2 (0: send) of transfer l / 2 on the block's channel. Sides that
 * share a ring (match) take consecutive pieces in list order, and the last of them waits for room for all:
 * the head must have passed every piece up to DEV_SLOTS before the launch's last. Lane 2k then writes task k.
 * In a split lane (half 0: the sending blocks, 1: the receiving ones; -1: not split) a block takes only its
 * half's sides and tasks: the transfers that receive on the receiving half, the others on the sending half.
 * Returns the same in every lane: false when a transfer is malformed or the wait failed (nothing moved).
 *
 * The side's ring, count and (a send's) head are loaded first, at an index kept in range whatever the
 * transfer says, so that their trip to memory overlaps the checks; a side that fails those uses none of it.
 * The loads are volatile, so that the compiler does not move them after the checks. In task k, written by
 * its send lane, the receive side's ring comes from the next lane, and the barrier rule compares the part
 * with the previous one the block moves. */
__device__ bool bulk_open(const dev_work_small_t &w, uint32_t lane, int half, uint32_t c, bulk_side &sd,
                          bulk_task *tasks) {
  const uint32_t all = 0xffffffffu;
  const dev_comm_t *comm = &w.comm;
  const uint32_t l = threadIdx.x, k = l / 2;
  const side_xfer s = side_xfer_read(w, lane, c); /* the parameters' list is read here only */
  const dev_xfer_t &x = s.x;
  const int peer = s.peer;
  const bool send = s.send, have = s.have;
  const bool here = half < 0 || (half == 1) == (x.recv_peer >= 0); /* the transfer runs on this half */
  const bool mine = s.mine && here;
  const int idx = (peer >= 0 && peer < comm->nranks ? peer : 0) * comm->nch_max + (int)c;
  const dev_ring_t *rp = &(send ? comm->send : comm->recv)[idx];
  uint64_t *home = &(send ? comm->sent : comm->recvd)[idx];
  const dev_ring_t first_ring = {(char *)bulk_load(&rp->data), (dev_ctrl_t *)bulk_load(&rp->ctrl),
                                 (uint64_t *)bulk_load(&rp->marks)};
  uint64_t *head_home = &comm->heads[idx];
  const uint64_t first_count = bulk_load(home), first_head = send ? bulk_load(head_home) : 0;
  bool bad = have && (!xfer_valid(x, w) | ((x.flags & DEV_XF_LL) != 0) | (x.dealt != 0) |
                      (dev_nslices(x.bytes, x.nch > 0 ? x.nch : 1) > 1));
  const bool used = mine && peer >= 0 && !bad;
  dev_ring_t ring = {NULL, NULL, NULL};
  sd = bulk_side{};
  if (used) {
    ring = first_ring;
    sd.home = home;
    sd.count = first_count;
    if (send) {
      sd.head_home = head_home;
      sd.head_seen = first_head;
    }
    bad = ring.data == NULL || ring.ctrl == NULL || ring.marks == NULL;
  }
  TRACE_AT(TRACE_SIDES);
  const bool live = used && !bad;
  const uint32_t pieces = live ? dev_npieces(s.part.len) : 0;
  const uint32_t same = __match_any_sync(all, live ? (unsigned long long)sd.home : 0ull);
  uint32_t before = 0, total = 0; /* pieces of the ring's sides before this one, and of all of them */
  for (uint32_t j = 0; j < 2 * w.nxfers; j++) {
    const uint32_t pj = __shfl_sync(all, pieces, j);
    if (live && ((same >> j) & 1)) {
      total += pj;
      before += j < l ? pj : 0;
    }
  }
  sd.count += before;
  sd.len = live ? (uint32_t)s.part.len : 0;
  sd.last = live && (same >> l) == 1;
  sd.ctrl = live ? ring.ctrl : NULL;
  TRACE_AT(TRACE_EARLY);
  if (live && total > DEV_SLOTS) bad = true; /* room would wait for this launch itself */
  bool ok = !bad;
  const uint64_t end = sd.count + pieces; /* for the last side: the ring's count after the launch */
  if (live && !bad && send && sd.last && sd.head_seen + DEV_SLOTS < end) {
    const wait_what what = {peer, (int)c, 1, w.seq + x.task};
    ok = wait_at_least(comm, &ring.ctrl->head, end - DEV_SLOTS, what, &sd.head_seen);
  }
  if (bad) error_record(comm, DEV_ERR_INVALID, peer, (int)c, send, w.seq, 0);
  if (!__all_sync(all, ok)) return false;
  TRACE_AT(TRACE_SENT);
  const bulk_ring mine_ring = {live ? ring.data : NULL, live ? ring.marks : NULL, sd.count};
  const bulk_ring in = {(char *)__shfl_down_sync(all, (unsigned long long)mine_ring.data, 1),
                        (uint64_t *)__shfl_down_sync(all, (unsigned long long)mine_ring.marks, 1),
                        __shfl_down_sync(all, mine_ring.count, 1)};
  const bool sync = side_xfer_sync(s, side_xfer_movers(s));
  if (send && have) {
    bulk_task &t = tasks[k];
    t.x = x;
    t.off = s.part.off;
    t.len = (uint32_t)s.part.len;
    t.in = in;
    t.out = mine_ring;
    t.run = mine;
    t.sync = sync;
    t.guarded = BULK_GUARD_NONE;
    if (half >= 0 && mine) { /* the guards of the receive ring from the pair's peer on this channel */
      const int g = (half == 0 ? x.send_peer : x.recv_peer) * comm->nch_max + (int)c;
      t.guard = bulk_ring{NULL, comm->guards + (size_t)g * DEV_SLOTS * DEV_MARKS, __ldcg(&comm->recvd[g])};
      t.guarded = half == 0 ? BULK_GUARD_STORE : BULK_GUARD_WAIT;
    }
  }
  return true;
}

/* Chunk q of task t's part: its source and destination in the user's buffers, the slot it is sent in (none
 * where the task does not send), its size, and as the second operand the running result in the destination
 * for a local reduction (an earlier transfer stored it); the caller sets a received chunk's slot instead. */
__device__ __forceinline__ piece_t bulk_piece(const bulk_task &t, uint32_t q) {
  const uint32_t at = q * DEV_CHUNK_BYTES;
  piece_t pc;
  pc.local = t.x.src != NULL ? t.x.src + t.off + at : NULL;
  pc.dst = t.x.dst != NULL ? t.x.dst + t.off + at : NULL;
  pc.in = t.x.flags & DEV_XF_REDUCE ? pc.dst : NULL;
  pc.out = t.out.data != NULL ? bulk_chunk(t.out, q) : NULL;
  pc.bytes = t.len - at < DEV_CHUNK_BYTES ? t.len - at : DEV_CHUNK_BYTES;
  return pc;
}

/* Every thread: a part that only sends (no receive side), in waves of a chunk per warp, where the launch asks
 * for it (dev_comm_t.wave_fence) and the part is more than two waves. Each warp stores its chunk of the wave;
 * after a block barrier thread 0 fences at system scope once for the block's chunks and stores their marks
 * (and a split lane's guards), while the other warps go on to the next wave. Against a fence and a mark per
 * warp, one fence per wave spares the warps most of their waits for acknowledgements. Every thread meets
 * every barrier: a warp whose earlier wait failed (ok false) moves nothing but still takes part. */
__device__ void bulk_send_waves(const bulk_task &t, uint32_t chunks, bool ok) {
  const uint32_t wid = threadIdx.x / 32, nw = blockDim.x / 32, l = threadIdx.x % 32;
  for (uint32_t wave = 0; wave * nw < chunks; wave++) {
    const uint32_t q = wave * nw + wid;
    if (ok && q < chunks) {
      piece_combine<32>(t.x, bulk_piece(t, q), l);
      TRACE_AT(TRACE_TASK);
    }
    /* every warp's loads and stores of the wave before thread 0's fence; a wave with a warp that moved
     * nothing (a failed wait) is not published */
    const bool moved = __syncthreads_and(ok) != 0;
    if (threadIdx.x == 0 && moved) {
      __threadfence_system();
      TRACE_AT(TRACE_PIECE);
      const uint32_t last = chunks - wave * nw < nw ? chunks : (wave + 1) * nw;
      for (uint32_t j = wave * nw; j < last; j++) {
        if (t.out.data != NULL) *bulk_mark(t.out, j) = bulk_mark_value(t.out, j);
        if (t.guarded == BULK_GUARD_STORE) *bulk_mark(t.guard, j) = bulk_mark_value(t.guard, j);
      }
    }
  }
}

/* Every thread: the block's tasks in list order, each part in chunks, chunk q by warp q % warps. Parts of one
 * size and channels give each warp the same chunks, in order, so consecutive ones need only a warp barrier
 * (a later transfer may read what an earlier one stored: a one-shot reduction's running result, or the data
 * an in-place all-reduce sends and then overwrites); a part that differs needs a block barrier first. A
 * received chunk is read once its mark shows it (lane 0 waits with acquire order, then a warp barrier); a
 * sent chunk's mark follows its bytes (a warp barrier, then lane 0 fences at system scope and stores it).
 * False when a wait failed; the warp then skips its remaining chunks but still meets every block barrier. */
__device__ bool bulk_run(const dev_work_small_t &w, uint32_t c, const bulk_task *tasks) {
  const uint32_t all = 0xffffffffu, wid = threadIdx.x / 32, nw = blockDim.x / 32, l = threadIdx.x % 32;
  bool ok = true;
  for (uint32_t k = 0; k < w.nxfers; k++) {
    const bulk_task &t = tasks[k];
    if (!t.run) continue;
    if (t.sync) __syncthreads();
    __syncwarp();
    const wait_what what = {t.x.recv_peer, (int)c, 0, w.seq + t.x.task};
    const uint32_t chunks = (t.len + DEV_CHUNK_BYTES - 1) / DEV_CHUNK_BYTES;
    /* waves only where the part is more than two of them: shorter parts were slower with them */
    if (w.comm.wave_fence && chunks > 2 * nw && t.in.data == NULL &&
        (t.out.data != NULL || t.guarded == BULK_GUARD_STORE)) {
      bulk_send_waves(t, chunks, ok);
      continue;
    }
    for (uint32_t q = wid; ok && q < chunks; q += nw) {
      piece_t pc = bulk_piece(t, q);
      if (t.in.data != NULL) {
        uint64_t v;
        if (l == 0) {
          ok = wait_at_least(&w.comm, bulk_mark(t.in, q), bulk_mark_value(t.in, q), what, &v);
          /* a split lane: the sending half has read what this chunk overwrites */
          if (ok && t.guarded == BULK_GUARD_WAIT)
            ok = wait_at_least(&w.comm, bulk_mark(t.guard, q), bulk_mark_value(t.guard, q), what, &v);
        }
        ok = __shfl_sync(all, ok, 0);
        __syncwarp(); /* lane 0's acquire orders every lane's reads (and stores) of the chunk */
        if (!ok) break;
        pc.in = bulk_chunk(t.in, q);
      }
      if (t.in.data != NULL) TRACE_AT(TRACE_LINES);
      piece_combine<32>(t.x, pc, l);
      TRACE_AT(t.in.data != NULL ? TRACE_ARRIVED : TRACE_TASK);
      if (pc.out != NULL || t.guarded == BULK_GUARD_STORE) {
        __syncwarp(); /* every lane's loads and stores of the chunk before lane 0's fence */
        if (l == 0) {
          __threadfence_system();
          TRACE_AT(TRACE_PIECE);
          if (pc.out != NULL) *bulk_mark(t.out, q) = bulk_mark_value(t.out, q);
          /* after the fence, not as a release of its own: a release at GPU scope before it slowed the split
           * lane */
          if (t.guarded == BULK_GUARD_STORE) *bulk_mark(t.guard, q) = bulk_mark_value(t.guard, q);
        }
      }
    }
  }
  return ok;
}

/* The first warp, after every warp's last chunk: stores the counts of the rings whose last side of the launch
 * its lane holds. A receive frees its slots (head; the barrier before this ordered every warp's reads
 * first). A send stores its pieces' sizes, and the last side of the ring, after a system fence, the tail:
 * what a general kernel receiving on the ring waits for. */
__device__ void bulk_close(const bulk_side &sd) {
  if (sd.ctrl != NULL && sd.head_home != NULL) {
    for (uint32_t i = 0, at = 0; at < sd.len; i++, at += DEV_SLOT_BYTES)
      sd.ctrl->sizes[(sd.count + i) % DEV_SLOTS] =
          sd.len - at < DEV_SLOT_BYTES ? sd.len - at : DEV_SLOT_BYTES;
  }
  __syncwarp(); /* every side's sizes before the fence of the ring's last side */
  if (!sd.last) return;
  const uint64_t end = sd.count + dev_npieces(sd.len);
  __stcg(sd.home, end);
  if (sd.head_home != NULL) {
    __stcg(sd.head_home, sd.head_seen);
    __threadfence_system();
    sd.ctrl->tail = end;
  } else {
    sd.ctrl->head = end;
  }
}

extern "C" __global__ void __launch_bounds__(DEV_THREADS, 1)
    braid_kernel_bulk(const __grid_constant__ dev_work_small_t work) {
  after_previous_kernel();
  __shared__ bulk_task tasks[DEV_SMALL_XFERS];
  const uint32_t nch = work.nch > 0 ? work.nch : 1, c = blockIdx.x % nch;
  const bool split = work.comm.split != 0;
  const uint32_t lane = split ? 0 : blockIdx.x / nch; /* a split lane's halves serve lane 0 */
  const int half = split ? (int)(blockIdx.x / nch) : -1;
  bulk_side sd = {};
  int failed = 0;
  TRACE_BEGIN();
  if (threadIdx.x < 32) {
    const bool valid = __all_sync(0xffffffffu, bulk_work_valid(work));
    if (!valid && threadIdx.x == 0) error_record(&work.comm, DEV_ERR_INVALID, -1, (int)c, 0, work.seq, 0);
    TRACE_AT(TRACE_VALID);
    failed = !valid || !bulk_open(work, lane, half, c, sd, tasks);
    TRACE_AT(TRACE_OPENED);
  }
  if (__syncthreads_or(failed)) return;
  TRACE_AT(TRACE_BARRIER);
  const bool ok = bulk_run(work, c, tasks);
  TRACE_AT(TRACE_RUN);
  if (__syncthreads_or(!ok) == 0 && threadIdx.x < 32) bulk_close(sd);
  TRACE_AT(TRACE_CLOSED);
  TRACE_END(work.comm.rank, work.seq);
}

#endif
