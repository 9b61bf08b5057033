/*
 * NCCL 2.29's one-sided calls on memory windows: ncclPutSignal, ncclSignal and ncclWaitSignal. A put lands
 * in a peer's window without the peer taking part, which needs either the window mapped by every peer or a
 * progress engine on the target; Braid has neither yet, so each call checks its handle and refuses with a
 * message that names it (which is why ncclGetVersion stays at 22809).
 */
#include "api.h"
#include "base/check.h"
#include "base/log.h"
#include "core/comm.h"

static ncclResult_t refuse(ncclComm_t comm, const char *func) {
  CHECK(comm_check_ready(comm, func));
  return log_err(ncclInvalidUsage,
                 "%s: one-sided operations on windows are not supported by this version of Braid; use "
                 "ncclSend/ncclRecv",
                 func);
}

NCCL_API(ncclResult_t, ncclPutSignal, const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
         cudaStream_t stream) {
  return refuse(comm, "ncclPutSignal");
}

NCCL_API(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
         cudaStream_t stream) {
  return refuse(comm, "ncclSignal");
}

NCCL_API(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
         cudaStream_t stream) {
  return refuse(comm, "ncclWaitSignal");
}
