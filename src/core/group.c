/*
 * Groups (see group.h).
 */
#include "group.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "core/comm.h"
#include "core/engine.h"

/* A deferred init or split. */
typedef struct job {
  group_job_fn_t fn;
  void *arg;
  volatile int *abort_flag; /* raised when another job of the group fails (group_job) */
  _Atomic int stopped;      /* it was: its own error is then only a consequence */
  _Atomic int done;         /* fn returned (a finished job is left alone) */
  ncclResult_t res;
  pthread_t thread;
  struct job *group; /* the first job of its group */
  struct job *next;
} job_t;

/* The calling thread's group. */
static _Thread_local struct {
  int depth;
  ncclComm_t comms;   /* communicators with calls, linked through group_next */
  job_t *jobs;        /* deferred jobs, most recent first */
  ncclResult_t error; /* first error of a call inside the group */
  exec_t *execs;      /* engine state, reused across groups */
  int cap_execs;
} grp;

int group_depth(void) {
  return grp.depth;
}

ncclResult_t group_error(ncclResult_t res) {
  if (grp.depth > 0 && grp.error == ncclSuccess && res != ncclSuccess && res != ncclInProgress)
    grp.error = res;
  return res;
}

ncclResult_t group_start(void) {
  grp.depth++;
  return ncclSuccess;
}

/* Runs one job; when it fails, raises the abort flags of the group's other jobs (they may be waiting for it).
 */
static void *job_main(void *arg) {
  job_t *job = arg;
  job->res = job->fn(job->arg);
  atomic_store(&job->done, 1);
  if (job->res == ncclSuccess || job->res == ncclInProgress) return NULL;
  for (job_t *o = job->group; o != NULL; o = o->next) {
    if (o == job || o->abort_flag == NULL || atomic_load(&o->done) || atomic_exchange(&o->stopped, 1))
      continue;
    __atomic_store_n(o->abort_flag, 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

/* Runs the deferred jobs, concurrently when there are several; returns the first error of a job that failed
 * on its own (else the first error). */
static ncclResult_t run_jobs(void) {
  ncclResult_t first = ncclSuccess, cause = ncclSuccess;
  job_t *jobs = grp.jobs;
  grp.jobs = NULL;
  int several = jobs != NULL && jobs->next != NULL;
  for (job_t *j = jobs; j != NULL; j = j->next) j->group = jobs;
  for (job_t *j = jobs; j != NULL; j = j->next) {
    if (several && pthread_create(&j->thread, NULL, job_main, j) == 0) continue;
    j->thread = 0;
    job_main(j);
  }
  /* every job is joined before any is freed: a job that fails walks the whole list (job_main) */
  for (job_t *j = jobs; j != NULL; j = j->next)
    if (j->thread != 0) pthread_join(j->thread, NULL);
  int stopped = 0;
  while (jobs != NULL) {
    job_t *j = jobs;
    jobs = j->next;
    if (first == ncclSuccess) first = j->res;
    if (cause == ncclSuccess && !atomic_load(&j->stopped)) cause = j->res;
    stopped += atomic_load(&j->stopped) && j->res != ncclSuccess;
    free(j);
  }
  if (stopped > 0)
    INFO(LOG_INIT, "ncclGroupEnd: %d of the group's inits stopped waiting for one that failed (%s)", stopped,
         log_result_name(cause != ncclSuccess ? cause : first));
  return cause != ncclSuccess ? cause : first;
}

ncclResult_t group_job(group_job_fn_t fn, void *arg, volatile int *abort_flag) {
  if (grp.depth == 0) return fn(arg);
  job_t *j = calloc(1, sizeof *j);
  if (j == NULL)
    return group_error(log_err(ncclSystemError, "out of host memory deferring an init to ncclGroupEnd"));
  j->fn = fn;
  j->arg = arg;
  j->abort_flag = abort_flag;
  j->next = grp.jobs;
  grp.jobs = j;
  return ncclSuccess;
}

/* Takes the communicators off the group and forgets their calls. */
static void drop_calls(void) {
  while (grp.comms != NULL) {
    ncclComm_t c = grp.comms;
    grp.comms = c->group_next;
    c->group_next = NULL;
    c->in_group = 0;
    plan_reset(&c->plan);
  }
}

ncclResult_t group_enqueue(ncclComm_t comm, const task_t *task) {
  int implicit = grp.depth == 0;
  if (implicit) grp.depth = 1;
  /* The reduction is resolved now: a PreMulSum op may be destroyed before the group ends (NCCL allows it). */
  task_t t = *task;
  redop_resolve(&comm->redops, t.op, t.type, comm->nranks, comm->gx != NULL, &t.red);
  ncclResult_t res = plan_add_task(&comm->plan, &t);
  if (res == ncclSuccess && !comm->in_group) {
    comm->in_group = 1;
    comm->group_next = grp.comms;
    grp.comms = comm;
  }
  if (!implicit) return group_error(res);
  return group_end();
}

static ncclResult_t reserve_execs(int n) {
  if (n <= grp.cap_execs) return ncclSuccess;
  exec_t *e = realloc(grp.execs, n * sizeof *e);
  if (e == NULL) return log_err(ncclSystemError, "out of host memory for %d group members", n);
  grp.execs = e;
  grp.cap_execs = n;
  return ncclSuccess;
}

/* Phase `p` of connection setup for every communicator still healthy (see links.h). */
static void connect_phase(int p, exec_t *execs, int n) {
  for (int i = 0; i < n; i++) {
    exec_t *ex = &execs[i];
    if (ex->result != ncclSuccess || ex->step < 0) continue; /* failed, or launched on the GPU */
    ncclResult_t res = p == 0   ? links_listen(ex->links, ex->plan)
                       : p == 1 ? links_connect(ex->links, ex->plan)
                                : links_accept(ex->links);
    if (res != ncclSuccess) ex->result = res;
  }
}

/* GPU communicators: plan with whole blocks (the kernels slice) and offer the copy engines their steps (every
 * communicator of the group offers before any settles: core/ce.h); then settle and launch. Nothing waits
 * for the GPU. */
static ncclResult_t plan_calls(ncclComm_t c) {
  CHECK(gx_scratch(c->gx, &c->plan, c->nranks));
  CHECK(plan_build(&c->plan, c->rank, c->nranks, (size_t)1 << 62, plan_tuning()));
  return ce_offer(c->ce, &c->plan);
}

static ncclResult_t launch_calls(ncclComm_t c) {
  CHECK(ce_settle(c->ce, &c->plan));
  return gx_launch(c->gx, &c->plan);
}

/* Plans, connects and runs the calls of every communicator of the group: GPU communicators launch, host ones
 * run together on the host executor. */
static ncclResult_t run_calls(void) {
  int n = 0;
  for (ncclComm_t c = grp.comms; c != NULL; c = c->group_next) n++;
  CHECK(reserve_execs(n));
  int i = 0;
  for (ncclComm_t c = grp.comms; c != NULL; c = c->group_next, i++) {
    atomic_fetch_add(&c->busy, 1);
    engine_start(&grp.execs[i], &c->plan, c->links, &c->abort_flag, c->name);
    if (c->gx != NULL) {
      grp.execs[i].result = plan_calls(c);
      grp.execs[i].step = -1; /* launched: nothing left for the host executor */
    } else {
      grp.execs[i].result = plan_build(&c->plan, c->rank, c->nranks, c->ring_bytes / 2, NULL);
    }
  }
  i = 0;
  for (ncclComm_t c = grp.comms; c != NULL; c = c->group_next, i++)
    if (c->gx != NULL && grp.execs[i].result == ncclSuccess) grp.execs[i].result = launch_calls(c);
  for (int p = 0; p < 3; p++) connect_phase(p, grp.execs, n);
  ncclResult_t res = engine_run(grp.execs, n);
  i = 0;
  for (ncclComm_t c = grp.comms; c != NULL; c = c->group_next, i++) {
    ncclResult_t r = grp.execs[i].result;
    /* A call the planner refused moved no data: the communicator stays usable. */
    if (r != ncclSuccess && r != ncclInvalidUsage && r != ncclInvalidArgument) comm_set_error(c, r);
    if (res == ncclSuccess) res = r;
    atomic_fetch_sub(&c->busy, 1);
  }
  return res;
}

ncclResult_t group_end(void) {
  if (grp.depth == 0)
    return log_err(ncclInvalidUsage, "ncclGroupEnd: no group was started (ncclGroupStart missing)");
  if (--grp.depth > 0) return ncclSuccess;
  ncclResult_t res = run_jobs();
  if (res == ncclSuccess) res = grp.error;
  if (res == ncclSuccess && grp.comms != NULL) res = run_calls();
  grp.error = ncclSuccess;
  drop_calls();
  return res;
}

ncclResult_t group_simulate_end(ncclSimInfo_t *sim) {
  if (grp.depth == 0) return log_err(ncclInvalidUsage, "ncclGroupSimulateEnd: no group was started");
  if (--grp.depth > 0) return ncclSuccess;
  ncclResult_t res = run_jobs();
  if (res == ncclSuccess) res = grp.error;
  double us = 0;
  for (ncclComm_t c = grp.comms; c != NULL && res == ncclSuccess; c = c->group_next) {
    res = plan_build(&c->plan, c->rank, c->nranks, c->ring_bytes / 2, NULL);
    double t = plan_estimate_us(&c->plan, c->nranks);
    if (t > us) us = t;
  }
  grp.error = ncclSuccess;
  drop_calls();
  if (res == ncclSuccess) sim->estimatedTime = (float)us;
  return res;
}
