/*
 * What every kernel entry point checks of a transfer before it moves a byte (kernels.cu): the host
 * builds the work, so a transfer that fails here is a bug, reported as DEV_ERR_INVALID rather than a wild
 * access.
 */
#ifndef BRAID_DEVICE_XFER_CUH
#define BRAID_DEVICE_XFER_CUH

#include "device/dev.h"
#include "nccl.h"

/* A transfer is well formed: channels (within the launch's blocks per lane, so every part has a block),
 * type, operation and peers in range, and something to move; a local reduction has both operands. W is the
 * work (dev_work_t or dev_work_small_t). */
template <class W> __device__ bool xfer_valid(const dev_xfer_t &x, const W &w) {
  /* every field read at once, the conditions combined without short cuts (as work_valid does, kernels.cu) */
  const int nranks = w.comm.nranks, recv_peer = x.recv_peer, send_peer = x.send_peer;
  const bool local_reduce = recv_peer < 0 && (x.flags & DEV_XF_REDUCE) != 0;
  const bool bad = (x.nch < 1) | (x.nch > w.nch) | (x.type >= ncclNumTypes) | (x.red > DEV_RED_SUM_POSTDIV) |
                   (recv_peer < -1) | (recv_peer >= nranks) | (send_peer < -1) | (send_peer >= nranks) |
                   (local_reduce & (x.dst == NULL)) | ((recv_peer < 0) & (x.src == NULL));
  return !bad;
}

#endif
