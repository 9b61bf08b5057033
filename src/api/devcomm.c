/*
 * The host-side calls of NCCL's device API (nccl_device.h): device communicators, teams and the resource
 * requirements of device-side barriers and all-to-all. Teams are answered; the device communicator and its
 * resources are not available yet and say so.
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

/* NCCL also exports this internal name; it re-reads the logging variables as ncclResetDebugInit does. */
NCCL_API(void, ncclResetDebugInitInternal, void) {
  ncclResetDebugInit();
}
