/*
 * Groups: the calls a thread makes between ncclGroupStart and ncclGroupEnd are issued together at the
 * outermost ncclGroupEnd. A call outside any group is a group of one. Inits and splits made inside a group
 * run concurrently at its end (so one thread can create several ranks of one communicator); then every
 * communicator's calls are planned, connected and run together by the engine.
 *
 * The group is per thread; the first error inside a group is returned again by its ncclGroupEnd, and the
 * group's calls are then dropped.
 */
#ifndef BRAID_CORE_GROUP_H
#define BRAID_CORE_GROUP_H

#include "nccl.h"
#include "core/plan.h"

/* A piece of work deferred to the end of the group (init, split, shrink, grow, finalize, suspend, resume). */
typedef ncclResult_t (*group_job_fn_t)(void *arg);
typedef struct {
  const char *what;           /* the call that made it, for the error when its communicator is gone */
  group_job_fn_t fn;          /* the work; frees arg where release would */
  void *arg;                  /* stays valid until fn (or release) runs */
  void (*release)(void *arg); /* frees arg when fn does not run (NULL: nothing to free) */
  ncclComm_t comm;            /* the communicator it works on (or NULL) */
  volatile int *abort_flag;   /* raised when another job of the same group fails (or NULL) */
} group_job_t;

ncclResult_t group_start(void);
ncclResult_t group_end(void);
/* Ends the group without running it, writing its estimated time into simInfo. */
ncclResult_t group_simulate_end(ncclSimInfo_t *sim);
/* Adds a call to the communicator's part of the current group (runs it now outside a group). */
ncclResult_t group_enqueue(ncclComm_t comm, const task_t *task);
/* Runs job->fn(job->arg) now outside a group, or at the group's end inside one. Returns fn's result, or
 * ncclSuccess when deferred. A deferred job holds job->comm until it is done; where another call destroyed
 * that communicator before the group's end, fn does not run (release frees arg) and the job fails with
 * ncclInvalidUsage. The abort flag is raised when another job of the same group fails: an init waiting for a
 * rank whose init failed ends then, instead of waiting for it until BRAID_TIMEOUT_S (NCCL aborts a group's
 * other inits alike). */
ncclResult_t group_job(const group_job_t *job);
/* Records an error of a call made inside a group, so that ncclGroupEnd returns it. Returns res. */
ncclResult_t group_error(ncclResult_t res);
/* Depth of the calling thread's group nesting. */
int group_depth(void);

#endif
