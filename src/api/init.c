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
#include "core/recover.h"
#include "gpu/gpu.h"

NCCL_API(ncclResult_t, ncclGetVersion, int *version) {
  if (version == NULL) return log_err(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = LOG_API_CODE;
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
  ncclResult_t res = comm_init(a->comm, a->ids, a->nid);
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
    return group_job(&(group_job_t){.what = func,
                                    .fn = deferred_init,
                                    .arg = a,
                                    .release = free,
                                    .comm = comm,
                                    .abort_flag = &comm->abort_flag});
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
  ncclResult_t res = comm_split(a->parent, a->color, a->key, a->has_config ? &a->config : NULL, a->newcomm);
  free(a);
  return res;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config) {
  CHECK(group_error(comm_check_parent(comm, "ncclCommSplit")));
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
  return group_job(
      &(group_job_t){.what = "ncclCommSplit", .fn = run_split, .arg = a, .release = free, .comm = comm});
}

/* A deferred shrink or grow: the parent, the child's place, and a copy of what the caller passed. */
typedef struct {
  ncclComm_t parent;
  ncclComm_t *newcomm;
  int flags, nranks, has_id, has_config, n;
  ncclUniqueId id;
  ncclConfig_t config;
  int excl[];
} resize_args_t;

static ncclResult_t run_shrink(void *arg) {
  resize_args_t *a = arg;
  ncclResult_t res =
      comm_shrink(a->parent, a->excl, a->n, a->has_config ? &a->config : NULL, a->flags, a->newcomm);
  free(a);
  return res;
}

static ncclResult_t run_grow(void *arg) {
  resize_args_t *a = arg;
  ncclResult_t res = comm_grow(a->parent, a->nranks, a->has_id ? &a->id : NULL,
                               a->has_config ? &a->config : NULL, a->newcomm);
  free(a);
  return res;
}

/* The arguments of a shrink or grow, copied for the group's end (n excluded ranks). */
static ncclResult_t resize_args(const char *func, ncclComm_t comm, ncclComm_t *newcomm,
                                const ncclConfig_t *config, int n, resize_args_t **a_p) {
  resize_args_t *a = calloc(1, sizeof *a + (size_t)n * sizeof(int));
  if (a == NULL) return log_err(ncclSystemError, "%s: out of host memory", func);
  *a = (resize_args_t){.parent = comm, .newcomm = newcomm, .has_config = config != NULL, .n = n};
  ncclResult_t res = config != NULL ? comm_config_check(config, &a->config) : ncclSuccess;
  if (res != ncclSuccess) {
    free(a);
    return res;
  }
  *a_p = a;
  return ncclSuccess;
}

static ncclResult_t check_exclusion(ncclComm_t comm, const int *excl, int n, int flags) {
  if (n < 1)
    return log_err(ncclInvalidArgument,
                   "ncclCommShrink: excludeRanksCount is %d; it must be at least 1 (ncclCommSplit copies a "
                   "communicator)",
                   n);
  if (excl == NULL) return log_err(ncclInvalidArgument, "ncclCommShrink: excludeRanksList is NULL");
  if (flags & ~NCCL_SHRINK_ABORT)
    return log_err(
        ncclInvalidArgument,
        "ncclCommShrink: shrinkFlags 0x%x has unknown bits (NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT)",
        flags);
  for (int i = 0; i < n; i++) {
    if (excl[i] < 0 || excl[i] >= comm->nranks)
      return log_err(ncclInvalidArgument, "ncclCommShrink: excludeRanksList[%d] is %d, outside 0..%d", i,
                     excl[i], comm->nranks - 1);
    if (excl[i] == comm->rank)
      return log_err(ncclInvalidArgument,
                     "ncclCommShrink: rank %d is in excludeRanksList; an excluded rank must not call it",
                     comm->rank);
  }
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
         ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
  CHECK(group_error(comm_check_parent(comm, "ncclCommShrink")));
  if (newcomm == NULL) return group_error(log_err(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL"));
  CHECK(group_error(check_exclusion(comm, excludeRanksList, excludeRanksCount, shrinkFlags)));
  resize_args_t *a;
  CHECK(group_error(resize_args("ncclCommShrink", comm, newcomm, config, excludeRanksCount, &a)));
  a->flags = shrinkFlags;
  memcpy(a->excl, excludeRanksList, (size_t)excludeRanksCount * sizeof(int));
  *newcomm = NULL;
  return group_job(
      &(group_job_t){.what = "ncclCommShrink", .fn = run_shrink, .arg = a, .release = free, .comm = comm});
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags) {
  if (comm == NULL) return ncclSuccess; /* as NCCL */
  CHECK(comm_check(comm, "ncclCommRevoke"));
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return log_err(ncclInvalidArgument, "ncclCommRevoke: revokeFlags is 0x%x; it must be NCCL_REVOKE_DEFAULT",
                   revokeFlags);
  return comm_revoke(comm);
}

NCCL_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId *uniqueId) {
  CHECK(comm_check_ready(comm, "ncclCommGetUniqueId"));
  if (uniqueId == NULL) return log_err(ncclInvalidArgument, "ncclCommGetUniqueId: uniqueId is NULL");
  return comm_grow_id(comm, uniqueId);
}

/* A new rank of a grow: an init of its own on the coordinator's token. */
static ncclResult_t grow_new_rank(int nranks, const ncclUniqueId *id, int rank, ncclComm_t *newcomm,
                                  const ncclConfig_t *config) {
  if (id == NULL)
    return log_err(
        ncclInvalidArgument,
        "ncclCommGrow: a new rank (comm NULL) passes the token the coordinator's ncclCommGetUniqueId "
        "made; uniqueId is NULL");
  if (rank < 0)
    return log_err(ncclInvalidArgument, "ncclCommGrow: a new rank (comm NULL) passes its rank; rank is %d",
                   rank);
  return init_rank("ncclCommGrow", newcomm, nranks, rank, 1, id, config, -1);
}

NCCL_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
         ncclComm_t *newcomm, ncclConfig_t *config) {
  if (newcomm == NULL) return group_error(log_err(ncclInvalidArgument, "ncclCommGrow: newcomm is NULL"));
  if (comm == NULL) return grow_new_rank(nRanks, uniqueId, rank, newcomm, config);
  CHECK(group_error(comm_check_ready(comm, "ncclCommGrow")));
  if (rank != -1)
    return group_error(log_err(ncclInvalidArgument,
                               "ncclCommGrow: rank is %d; an existing rank passes -1 (it keeps its rank, %d)",
                               rank, comm->rank));
  if (nRanks <= comm->nranks)
    return group_error(log_err(ncclInvalidArgument,
                               "ncclCommGrow: nRanks is %d; it must exceed %s's %d ranks", nRanks, comm->name,
                               comm->nranks));
  if (uniqueId != NULL) CHECK(group_error(boot_check_id(uniqueId)));
  resize_args_t *a;
  CHECK(group_error(resize_args("ncclCommGrow", comm, newcomm, config, 0, &a)));
  a->nranks = nRanks;
  a->has_id = uniqueId != NULL;
  if (uniqueId != NULL) a->id = *uniqueId;
  *newcomm = NULL;
  return group_job(
      &(group_job_t){.what = "ncclCommGrow", .fn = run_grow, .arg = a, .release = free, .comm = comm});
}

static ncclResult_t deferred_finalize(void *arg) {
  return comm_finalize(arg);
}

/* Inside a group, finalize waits for the other ranks at ncclGroupEnd, concurrently with the group's other
 * finalizes: one thread may finalize every rank of a communicator it drives. */
NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm) {
  CHECK(group_error(comm_check_ready(comm, "ncclCommFinalize")));
  if (group_depth() > 0)
    return group_job(
        &(group_job_t){.what = "ncclCommFinalize", .fn = deferred_finalize, .arg = comm, .comm = comm});
  return comm_finalize(comm);
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  CHECK(comm_check(comm, "ncclCommDestroy"));
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
