/*
 * The pair entry points (kernels.cu, dev.h, dev_pair_t): braid_kernel_pair, and the all-reduce's
 * braid_kernel_pair_ar (LL) and braid_kernel_pair_ar128 (LL128).
 */
#ifndef BRAID_DEVICE_PAIR_CUH
#define BRAID_DEVICE_PAIR_CUH

#include <stddef.h>
#include <stdint.h>

#include "device/dev.h"
#include "device/ll.cuh"
#include "device/reduce.cuh"
#include "device/trace.cuh"
#include "device/wait.cuh"
#include "device/xfer.cuh"

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

#endif
