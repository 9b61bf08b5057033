/*
 * The host executor: runs plans by streaming each transfer's bytes through its connections, on the calling
 * thread, never blocking. One thread can progress the plans of several communicators at once (a group that
 * spans ranks of one process), so no rank waits on another that the same thread has yet to run.
 *
 * Every wait is bounded and says what it waits for, through the watchdog (base/watchdog.h): after
 * BRAID_STALL_WARN_S without progress one report names the communicator, the call (by sequence number), the
 * step, the peer and the rank that is behind; after BRAID_TIMEOUT_S the run fails. The abort flag is checked
 * every round; a peer's death ends the run with an error.
 */
#ifndef BRAID_CORE_ENGINE_H
#define BRAID_CORE_ENGINE_H

#include <stdint.h>

#include "nccl.h"
#include "base/watchdog.h"
#include "core/links.h"
#include "core/plan.h"
#include "ras/ras.h"

/* The abort flag's value when the communicator was revoked rather than aborted (only the message differs). */
#define ENGINE_STOP_REVOKE 2

/* One plan being run. */
typedef struct {
  plan_t *plan;                   /* the plan (built) */
  links_t *links;                 /* its communicator's connections */
  const volatile int *abort_flag; /* its communicator's abort flag */
  const char *comm_name;          /* for messages */
  int step;                       /* current step; plan->nsteps when done */
  uint32_t round;                 /* rounds run, for connection marks */
  wd_t *wd;                       /* its communicator's watchdog (may be NULL) */
  wd_timer_t timer;               /* the wait of the current step (once the run began) */
  int timing;                     /* timer runs */
  ncclResult_t result;            /* first error, or ncclSuccess */
  ras_comm_t *ras; /* monitoring: what the rank waits for (NULL: none; set after engine_start) */
  int ras_step;    /* the step monitoring was last told of (-1: none) */
  int ras_stalled; /* monitoring was told which transfer this stall waits for */
} exec_t;

/* Prepares an exec for a built plan whose connections are ready. */
void engine_start(exec_t *ex, plan_t *plan, links_t *links, const volatile int *abort_flag,
                  const char *comm_name, wd_t *wd);
/* Runs all execs to completion or error. Returns the first error; each exec's result says its own. */
ncclResult_t engine_run(exec_t *execs, int n);

#endif
