/*
 * What every kernel entry point checks of a transfer before it moves a byte (general.cuh, bulk.cuh,
 * ll_entry.cuh, pair.cuh): the host builds the work, so a transfer that fails here is a bug, reported as
 * DEV_ERR_INVALID rather than a wild access.
 */
#ifndef BRAID_DEVICE_XFER_CUH
#define BRAID_DEVICE_XFER_CUH

#include "device/dev.h"
#include "nccl.h"

/* A transfer is well formed: channels (within the launch's blocks per lane, so every part has a block),
 * type, operation and peers in range, and something to move; a local reduction has both operands; a dealt
 * one (dev.h) Simple with one peer, a send or a receive. W is the work (dev_work_t or dev_work_small_t). */
template <class W> __device__ bool xfer_valid(const dev_xfer_t &x, const W &w) {
  /* every field read at once, the conditions combined without short cuts (as work_valid does, general.cuh) */
  const int nranks = w.comm.nranks, recv_peer = x.recv_peer, send_peer = x.send_peer;
  const bool local_reduce = recv_peer < 0 && (x.flags & DEV_XF_REDUCE) != 0;
  const bool bad = (x.nch < 1) | (x.nch > w.nch) | (x.type >= ncclNumTypes) | (x.red > DEV_RED_SUM_POSTDIV) |
                   (recv_peer < -1) | (recv_peer >= nranks) | (send_peer < -1) | (send_peer >= nranks) |
                   (local_reduce & (x.dst == NULL)) | ((recv_peer < 0) & (x.src == NULL)) |
                   (((x.flags & DEV_XF_LL) != 0) & (x.nch > DEV_LL_CHANNELS)) | (x.proto > DEV_PROTO_LL128) |
                   ((x.proto == DEV_PROTO_LL128) & (((x.flags & DEV_XF_LL) == 0) | !dev_ll128_fits(&x))) |
                   (x.dealt > 1) |
                   ((x.dealt != 0) & (((recv_peer >= 0) == (send_peer >= 0)) | ((x.flags & DEV_XF_LL) != 0)));
  return !bad;
}

/* What a lane of the first warp of a one-step entry point (braid_kernel_ll, braid_kernel_bulk) holds: side
 * l % 2 (0: send) of transfer l / 2 of the parameters, and that transfer's part on the block's channel c. */
struct side_xfer {
  dev_xfer_t x;    /* every field read in one trip; peers -1 in a lane past the last transfer */
  dev_span_t part; /* the block's part of x (dev_part, slice 0) */
  int peer;        /* the side's peer, or -1 */
  bool send;       /* the send side */
  bool have;       /* the lane has a transfer */
  bool mine;       /* the transfer has bytes on the block: its lane, a channel for c and a part */
};

__device__ __forceinline__ side_xfer side_xfer_read(const dev_work_small_t &w, uint32_t lane, uint32_t c) {
  const uint32_t l = threadIdx.x, k = l / 2;
  const bool send = (l & 1) == 0, have = k < w.nxfers;
  dev_xfer_t x = {};
  if (have) x = w.xfers[k]; /* nothing after this reads the parameters' list again */
  x.recv_peer = have ? x.recv_peer : -1;
  x.send_peer = have ? x.send_peer : -1;
  const int peer = send ? x.send_peer : x.recv_peer;
  const dev_span_t part = dev_part(x.bytes, x.nch > 0 ? x.nch : 1, 0, c);
  const bool mine = have & (x.lane == lane) & (c < x.nch) & (part.len != 0);
  return side_xfer{x, part, peer, send, have, mine};
}

/* Every lane of that warp: the send lanes below this one whose transfer has a part on the block (the parts
 * the block moves before this lane's). */
__device__ __forceinline__ uint32_t side_xfer_movers(const side_xfer &s) {
  return __ballot_sync(0xffffffffu, s.send && s.mine) & ((1u << threadIdx.x) - 1);
}

/* Every lane of that warp: whether the block needs a barrier before it moves transfer l / 2's part, which
 * it does when the previous part it moves differs in size or channels (a thread's bytes of one are then not
 * its bytes of the other, and a later transfer may read what an earlier one stored). */
__device__ __forceinline__ bool side_xfer_sync(const side_xfer &s, uint32_t movers) {
  const uint32_t all = 0xffffffffu;
  const int prev = movers != 0 ? 31 - __clz(movers) : (int)threadIdx.x;
  const uint64_t prev_bytes = __shfl_sync(all, s.x.bytes, prev);
  const uint32_t prev_nch = __shfl_sync(all, (uint32_t)s.x.nch, prev);
  return movers != 0 && (prev_bytes != s.x.bytes || prev_nch != s.x.nch);
}

#endif
