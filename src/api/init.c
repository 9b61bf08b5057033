/*
 * Entry points that make, query and end communicators, plus version and error reporting. Arguments are
 * checked here; the work is in core/comm.c.
 */
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "bootstrap/bootstrap.h"
#include "core/comm.h"
#include "core/group.h"
#include "gpu/gpu.h"

NCCL_API(ncclResult_t, ncclGetVersion, int *version) {
  if (version == NULL) return log_err(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId) {
  if (uniqueId == NULL) return log_err(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  gpu_backend_t backend;
  CHECK(gpu_backend(&backend));
  return boot_get_unique_id(uniqueId);
}

/* A deferred init: runs at the end of the group that made it. */
typedef struct {
  ncclComm_t comm;
  int nid;
  ncclUniqueId ids[];
} init_args_t;

static ncclResult_t deferred_init(void *arg) {
  init_args_t *a = arg;
  ncclResult_t res = comm_dead(a->comm) ? log_err(ncclInvalidUsage,
                                                  "ncclGroupEnd: the communicator of rank %d was destroyed "
                                                  "before the group's end ran its init",
                                                  a->comm->rank)
                                        : comm_init(a->comm, a->ids, a->nid);
  free(a);
  return res;
}

static ncclResult_t check_init_args(const char *func, ncclComm_t *comm_p, int nranks, int rank, int nid,
                                    const ncclUniqueId *ids) {
  if (comm_p == NULL) return log_err(ncclInvalidArgument, "%s: comm is NULL", func);
  if (nranks < 1)
    return log_err(ncclInvalidArgument, "%s: nranks is %d; it must be at least 1", func, nranks);
  if (rank < 0 || rank >= nranks)
    return log_err(ncclInvalidArgument, "%s: rank %d is outside 0..%d", func, rank, nranks - 1);
  if (ids == NULL) return log_err(ncclInvalidArgument, "%s: commIds is NULL", func);
  if (nid < 1 || nid > nranks)
    return log_err(ncclInvalidArgument, "%s: nId is %d; it must be between 1 and nranks (%d)", func, nid,
                   nranks);
  for (int i = 0; i < nid; i++) {
    ncclResult_t res = boot_check_id(&ids[i]);
    if (res != ncclSuccess) return res;
  }
  gpu_backend_t backend;
  return gpu_backend(&backend);
}

/* Every init entry point comes here: checks, allocates, and runs init now, in the background (non-blocking
 * communicators) or at the end of the enclosing group. */
static ncclResult_t init_rank(const char *func, ncclComm_t *comm_p, int nranks, int rank, int nid,
                              const ncclUniqueId *ids, const ncclConfig_t *config, int dev) {
  CHECK(group_error(check_init_args(func, comm_p, nranks, rank, nid, ids)));
  gpu_backend_t backend;
  CHECK(group_error(gpu_backend(&backend)));
  if (backend == GPU_BACKEND_CUDA && dev < 0) CHECK(group_error(gpu_current_device(&dev)));
  ncclComm_t comm;
  CHECK(group_error(comm_alloc(nranks, rank, config, &comm)));
  comm->dev = backend == GPU_BACKEND_CUDA ? dev : -1;
  *comm_p = comm;
  if (!comm->blocking) return comm_init_async(comm, ids, nid);
  if (group_depth() > 0) {
    init_args_t *a = malloc(sizeof *a + nid * sizeof *ids);
    if (a == NULL) return group_error(log_err(ncclSystemError, "%s: out of host memory", func));
    a->comm = comm;
    a->nid = nid;
    memcpy(a->ids, ids, nid * sizeof *ids);
    return group_job(deferred_init, a, comm, &comm->abort_flag);
  }
  ncclResult_t res = comm_init(comm, ids, nid);
  if (res != ncclSuccess) {
    comm_destroy(comm);
    *comm_p = NULL;
  }
  return res;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank("ncclCommInitRank", comm, nranks, rank, 1, &commId, NULL, -1);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t *config) {
  return init_rank("ncclCommInitRankConfig", comm, nranks, rank, 1, &commId, config, -1);
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank, int nId,
         ncclUniqueId *commIds, ncclConfig_t *config) {
  return init_rank("ncclCommInitRankScalable", newcomm, nranks, myrank, nId, commIds, config, -1);
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comms, int ndev, const int *devlist) {
  if (comms == NULL) return log_err(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  if (ndev < 1)
    return log_err(ncclInvalidArgument, "ncclCommInitAll: ndev is %d; it must be at least 1", ndev);
  for (int i = 0; devlist != NULL && i < ndev; i++) {
    if (devlist[i] < 0)
      return log_err(ncclInvalidArgument, "ncclCommInitAll: devlist[%d] is %d", i, devlist[i]);
    for (int j = 0; j < i; j++)
      if (devlist[j] == devlist[i])
        return log_err(ncclInvalidUsage, "ncclCommInitAll: device %d appears twice in devlist", devlist[i]);
  }
  ncclUniqueId id;
  CHECK(boot_new_unique_id(&id));
  memset(comms, 0, ndev * sizeof *comms);
  group_start();
  for (int i = 0; i < ndev; i++)
    init_rank("ncclCommInitAll", &comms[i], ndev, i, 1, &id, NULL, devlist != NULL ? devlist[i] : i);
  ncclResult_t res = group_end();
  for (int i = 0; i < ndev && res != ncclSuccess; i++) {
    if (comms[i] != NULL) comm_destroy(comms[i]);
    comms[i] = NULL;
  }
  return res;
}

/* A deferred split. */
typedef struct {
  ncclComm_t parent;
  int color, key;
  ncclComm_t *newcomm;
  ncclConfig_t config;
  int has_config;
} split_args_t;

static ncclResult_t run_split(void *arg) {
  split_args_t *a = arg;
  ncclResult_t res =
      comm_dead(a->parent)
          ? log_err(ncclInvalidUsage, "ncclCommSplit: the communicator was destroyed before the group's end")
          : comm_split(a->parent, a->color, a->key, a->has_config ? &a->config : NULL, a->newcomm);
  free(a);
  return res;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config) {
  CHECK(group_error(comm_check_ready(comm, "ncclCommSplit")));
  if (newcomm == NULL) return group_error(log_err(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL"));
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return group_error(log_err(
        ncclInvalidArgument, "ncclCommSplit: color %d is negative (only NCCL_SPLIT_NOCOLOR may be)", color));
  split_args_t *a = calloc(1, sizeof *a);
  if (a == NULL) return group_error(log_err(ncclSystemError, "ncclCommSplit: out of host memory"));
  *a = (split_args_t){
      .parent = comm, .color = color, .key = key, .newcomm = newcomm, .has_config = config != NULL};
  if (config != NULL) {
    ncclResult_t res = comm_config_check(config, &a->config);
    if (res != ncclSuccess) {
      free(a);
      return group_error(res);
    }
  }
  *newcomm = NULL;
  return group_job(run_split, a, comm, NULL);
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
         ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
  CHECK(comm_check(comm, "ncclCommShrink"));
  return log_err(ncclInvalidUsage, "ncclCommShrink is not supported by this version of Braid");
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags) {
  CHECK(comm_check(comm, "ncclCommRevoke"));
  return log_err(ncclInvalidUsage, "ncclCommRevoke is not supported by this version of Braid");
}

static ncclResult_t deferred_finalize(void *arg) {
  if (comm_dead(arg))
    return log_err(ncclInvalidUsage,
                   "ncclCommFinalize: the communicator was destroyed before the group's end");
  return comm_finalize(arg);
}

/* Inside a group, finalize waits for the other ranks at ncclGroupEnd, concurrently with the group's other
 * finalizes: one thread may finalize every rank of a communicator it drives. */
NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm) {
  CHECK(group_error(comm_check_ready(comm, "ncclCommFinalize")));
  if (group_depth() > 0) return group_job(deferred_finalize, comm, comm, NULL);
  return comm_finalize(comm);
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  CHECK(comm_check(comm, "ncclCommDestroy"));
  CHECK(comm_graphs_check(comm, "ncclCommDestroy"));
  comm_destroy(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  CHECK(comm_check(comm, "ncclCommAbort"));
  comm_abort(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError) {
  CHECK(comm_check(comm, "ncclCommGetAsyncError"));
  if (asyncError == NULL) return log_err(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  *asyncError = comm_async_error(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count) {
  CHECK(comm_check(comm, "ncclCommCount"));
  if (count == NULL) return log_err(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = comm->nranks;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device) {
  CHECK(comm_check(comm, "ncclCommCuDevice"));
  if (device == NULL) return log_err(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = comm->dev;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank) {
  CHECK(comm_check(comm, "ncclCommUserRank"));
  if (rank == NULL) return log_err(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

NCCL_API(const char *, ncclGetErrorString, ncclResult_t result) {
  return log_result_name(result);
}

/* The communicator's failure where it has one (whichever thread it happened on), else the calling thread's
 * last error. */
NCCL_API(const char *, ncclGetLastError, ncclComm_t comm) {
  const char *msg = comm != NULL ? comm_error_msg(comm) : NULL;
  return msg != NULL ? msg : log_last_error();
}

NCCL_API(void, ncclResetDebugInit, void) {
  param_reload();
  log_init();
}
