/*
 * Entry points about a communicator's resources: suspend and resume (NCCL 2.29), its memory statistics
 * (2.29) and its properties (ncclCommQueryProperties, declared by NCCL's nccl_device.h). Arguments are
 * checked here; the work is in core/recover.c.
 */
#include <stdbool.h>
#include <stddef.h>

#include "api.h"
#include "base/check.h"
#include "base/log.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/recover.h"

static ncclResult_t run_suspend(void *arg) {
  return comm_suspend(arg);
}

static ncclResult_t run_resume(void *arg) {
  return comm_resume(arg);
}

/* Both are collective (every rank gives back its ends of the connections); inside a group they run at its
 * end, concurrently, so that one thread may suspend every rank it drives. */
NCCL_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags) {
  CHECK(group_error(comm_check_ready(comm, "ncclCommSuspend")));
  if (flags & ~NCCL_SUSPEND_MEM)
    return group_error(log_err(ncclInvalidArgument,
                               "ncclCommSuspend: flags 0x%x has unknown bits (NCCL_SUSPEND_MEM is 0x%x)",
                               flags, NCCL_SUSPEND_MEM));
  if (!(flags & NCCL_SUSPEND_MEM)) return ncclSuccess; /* nothing to give back */
  return group_job(&(group_job_t){.what = "ncclCommSuspend", .fn = run_suspend, .arg = comm, .comm = comm});
}

NCCL_API(ncclResult_t, ncclCommResume, ncclComm_t comm) {
  CHECK(group_error(comm_check(comm, "ncclCommResume")));
  int state = atomic_load(&comm->state);
  if (state == COMM_READY) return ncclSuccess; /* not suspended: nothing to restore */
  if (state != COMM_SUSPENDED) return group_error(comm_check_ready(comm, "ncclCommResume"));
  return group_job(&(group_job_t){.what = "ncclCommResume", .fn = run_resume, .arg = comm, .comm = comm});
}

NCCL_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  CHECK(comm_check(comm, "ncclCommMemStats"));
  if (value == NULL) return log_err(ncclInvalidArgument, "ncclCommMemStats: value is NULL");
  if ((int)stat < ncclStatGpuMemSuspend || (int)stat > ncclStatGpuMemTotal)
    return log_err(ncclInvalidArgument, "ncclCommMemStats: stat is %d; it must be one of 0..%d", (int)stat,
                   ncclStatGpuMemTotal);
  *value = comm_mem_stat(comm, stat);
  return ncclSuccess;
}

/* NCCL's ncclCommProperties_t (nccl_device.h), field for field; the layout of 2.29.2 ends at ginType. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;
  bool deviceApiSupport;
  bool multimemSupport;
  int ginType; /* ncclGinType_t: 0, none */
  int nLsaTeams;
  bool hostRmaSupport;
  int railedGinType;
} props_t;

NCCL_API(ncclResult_t, ncclCommQueryProperties, ncclComm_t comm, props_t *props) {
  CHECK(comm_check_ready(comm, "ncclCommQueryProperties"));
  if (props == NULL) return log_err(ncclInvalidArgument, "ncclCommQueryProperties: props is NULL");
  if (props->magic != NCCL_API_MAGIC)
    return log_err(ncclInvalidUsage,
                   "ncclCommQueryProperties: props->magic is 0x%x; initialise it with "
                   "NCCL_COMM_PROPERTIES_INITIALIZER",
                   props->magic);
  size_t least = offsetof(props_t, ginType) + sizeof(int);
  if (props->size < least)
    return log_err(ncclInvalidArgument,
                   "ncclCommQueryProperties: props->size is %zu; it must be at least %zu", props->size,
                   least);
  props->rank = comm->rank;
  props->nRanks = comm->nranks;
  props->cudaDev = comm->dev;
  props->nvmlDev = -1; /* Braid does not use NVML; its index may differ from the CUDA ordinal */
  props->deviceApiSupport = false;
  props->multimemSupport = false;
  props->ginType = 0;
  if (props->size >= sizeof(props_t)) {
    props->nLsaTeams = 1;
    props->hostRmaSupport = false;
    props->railedGinType = 0;
  }
  return ncclSuccess;
}
