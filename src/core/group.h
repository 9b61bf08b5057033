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

/* A piece of work deferred to the end of the group (init, split). */
typedef ncclResult_t (*group_job_fn_t)(void *arg);

ncclResult_t group_start(void);
ncclResult_t group_end(void);
/* Ends the group without running it, writing its estimated time into simInfo. */
ncclResult_t group_simulate_end(ncclSimInfo_t *sim);
/* Adds a call to the communicator's part of the current group (runs it now outside a group). */
ncclResult_t group_enqueue(ncclComm_t comm, const task_t *task);
/* Runs fn(arg) now outside a group, or at the group's end inside one (then arg must stay valid and fn is
 * responsible for freeing it). Returns fn's result, or ncclSuccess when deferred. A deferred job holds `comm`
 * (or NULL), the communicator it works on, until it is done: fn must check comm_dead first, since another
 * call may destroy the communicator before the group ends. `abort_flag` (or NULL) is
 * raised when another job of the same group fails: an init waiting for a rank whose init failed ends then,
 * instead of waiting for it until BRAID_TIMEOUT_S (NCCL aborts a group's other inits alike). */
ncclResult_t group_job(group_job_fn_t fn, void *arg, ncclComm_t comm, volatile int *abort_flag);
/* Records an error of a call made inside a group, so that ncclGroupEnd returns it. Returns res. */
ncclResult_t group_error(ncclResult_t res);
/* Depth of the calling thread's group nesting. */
int group_depth(void);

#endif
