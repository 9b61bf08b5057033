/*
 * The host-side calls of NCCL's device API (nccl_device.h): device communicators, teams and the resource
 * requirements of device-side barriers, all-to-all and GIN buffers, and device pointers into windows. Teams
 * are answered; the device communicator, its resources and peers' window memory are not available yet and
 * say so.
 */
#include "api.h"
#include "base/check.h"
#include "base/log.h"
#include "core/comm.h"

/* NCCL's ncclTeam_t, returned by value: a set of ranks as (count, this rank's index, stride). */
typedef struct {
  int nRanks, rank, stride;
} team_t;

static ncclResult_t not_yet(const char *func) {
  return log_err(ncclInvalidUsage, "%s: the device API is not supported by this version of Braid", func);
}

NCCL_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, const void *reqs, void *outDevComm) {
  CHECK(comm_check(comm, "ncclDevCommCreate"));
  return not_yet("ncclDevCommCreate");
}

NCCL_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, const void *devComm) {
  CHECK(comm_check(comm, "ncclDevCommDestroy"));
  return not_yet("ncclDevCommDestroy");
}

NCCL_API(ncclResult_t, ncclLsaBarrierCreateRequirement, team_t team, int nBarriers, void *outHandle,
         void *outReq) {
  return not_yet("ncclLsaBarrierCreateRequirement");
}

NCCL_API(ncclResult_t, ncclGinBarrierCreateRequirement, ncclComm_t comm, team_t team, int nBarriers,
         void *outHandle, void *outReq) {
  return not_yet("ncclGinBarrierCreateRequirement");
}

NCCL_API(ncclResult_t, ncclLLA2ACreateRequirement, int nBlocks, int nSlots, void *outHandle, void *outReq) {
  return not_yet("ncclLLA2ACreateRequirement");
}

NCCL_API(int, ncclLLA2ACalcSlots, int maxElts, int maxEltSize) {
  not_yet("ncclLLA2ACalcSlots");
  return 0;
}

/* All ranks of the communicator. */
NCCL_API(team_t, ncclTeamWorld, ncclComm_t comm) {
  team_t t = {0, 0, 1};
  if (comm_check(comm, "ncclTeamWorld") == ncclSuccess) t = (team_t){comm->nranks, comm->rank, 1};
  return t;
}

/* The ranks that share memory with this one: on one machine, all of them. */
NCCL_API(team_t, ncclTeamLsa, ncclComm_t comm) {
  team_t t = {0, 0, 1};
  if (comm_check(comm, "ncclTeamLsa") == ncclSuccess) t = (team_t){comm->nranks, comm->rank, 1};
  return t;
}

/* The ranks at this rank's position on every machine: on one machine, this rank alone. */
NCCL_API(team_t, ncclTeamRail, ncclComm_t comm) {
  team_t t = {0, 0, 1};
  if (comm_check(comm, "ncclTeamRail") == ncclSuccess) t = (team_t){1, 0, comm->nranks};
  return t;
}

NCCL_API(int, ncclTeamRankToWorld, ncclComm_t comm, team_t team, int rank) {
  if (comm_check(comm, "ncclTeamRankToWorld") != ncclSuccess) return -1;
  return comm->rank + (rank - team.rank) * team.stride;
}

NCCL_API(int, ncclTeamRankToLsa, ncclComm_t comm, team_t team, int rank) {
  if (comm_check(comm, "ncclTeamRankToLsa") != ncclSuccess) return -1;
  return comm->rank + (rank - team.rank) * team.stride;
}

NCCL_API(ncclResult_t, ncclGinOutboxCreateRequirement, int nBlocks, int sizeLog2, void *outHandle,
         void *outReq) {
  return not_yet("ncclGinOutboxCreateRequirement");
}

NCCL_API(ncclResult_t, ncclGinInboxA2ACreateRequirement, team_t peers, int nBlocks, int sizeLog2,
         void *outHandle, void *outReq) {
  return not_yet("ncclGinInboxA2ACreateRequirement");
}

/* Device pointers into windows: a window is not mapped by its peers here, so only this rank's own memory
 * has one (ncclGetPeerDevicePointer for this rank: the buffer itself). */
static ncclResult_t no_mapping(const char *func, void **out) {
  if (out == NULL) return log_err(ncclInvalidArgument, "%s: outPtr is NULL", func);
  return log_err(ncclInvalidUsage,
                 "%s: windows are not mapped by their peers in this version of Braid (no device API, no "
                 "multicast)",
                 func);
}

NCCL_API(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t window, size_t offset, int peer,
         void **outPtr) {
  void *mine = NULL;
  ncclComm_t comm = NULL;
  if (window != NULL && outPtr != NULL && mem_window_owner(window, &comm, &mine) == ncclSuccess &&
      peer == comm->rank) {
    *outPtr = (char *)mine + offset;
    return ncclSuccess;
  }
  return no_mapping("ncclGetPeerDevicePointer", outPtr);
}

NCCL_API(ncclResult_t, ncclGetLsaDevicePointer, ncclWindow_t window, size_t offset, int lsaRank,
         void **outPtr) {
  return no_mapping("ncclGetLsaDevicePointer", outPtr);
}

NCCL_API(ncclResult_t, ncclGetLsaMultimemDevicePointer, ncclWindow_t window, size_t offset, void **outPtr) {
  return no_mapping("ncclGetLsaMultimemDevicePointer", outPtr);
}

/* multimem is NCCL's ncclMultimemHandle_t: one pointer, passed by value as a pointer is. */
NCCL_API(ncclResult_t, ncclGetMultimemDevicePointer, ncclWindow_t window, size_t offset, void *multimem,
         void **outPtr) {
  return no_mapping("ncclGetMultimemDevicePointer", outPtr);
}

/* NCCL also exports this internal name, without a "p" twin; it re-reads the logging variables as
 * ncclResetDebugInit does. */
__attribute__((visibility("default"))) void ncclResetDebugInitInternal(void);
void ncclResetDebugInitInternal(void) {
  ncclResetDebugInit();
}
