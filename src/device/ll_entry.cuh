/*
 * The LL entry point, braid_kernel_ll (kernels.cu, dev.h).
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
 * counts and heads in a second; nothing after the barrier reads the parameters again.
 */
#ifndef BRAID_DEVICE_LL_ENTRY_CUH
#define BRAID_DEVICE_LL_ENTRY_CUH

#include <stddef.h>
#include <stdint.h>

#include "device/dev.h"
#include "device/ll.cuh"
#include "device/reduce.cuh"
#include "device/trace.cuh"
#include "device/wait.cuh"
#include "device/xfer.cuh"

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

#endif
