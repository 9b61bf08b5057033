/*
 * Groups (see group.h).
 */
#include "group.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "core/comm.h"
#include "core/engine.h"

/* A deferred job (group_job_t); its communicator is held until it is done. */
typedef struct job {
  group_job_t d;
  char msg[LOG_ERROR_MAX]; /* the job's error message, handed to the caller's thread */
  _Atomic int stopped;     /* its abort flag was raised: its own error is then only a consequence */
  _Atomic int done;        /* fn returned (a finished job is left alone) */
  ncclResult_t res;
  pthread_t thread;
  struct job *group; /* the first job of its group */
  struct job *next;
} job_t;

/* The calling thread's group. A function that reads it more than once takes its address once, from me(): in a
 * shared library each access to a thread-local variable costs a call to the loader's lookup, and a compiler
 * that sees the address as a constant computes it again after every call (18 lookups per ncclGroupEnd). */
typedef struct {
  int depth;
  ncclComm_t comms;   /* communicators with calls, linked through group_next */
  job_t *jobs;        /* deferred jobs, most recent first */
  ncclResult_t error; /* first error of a call inside the group */
  exec_t *execs;      /* engine state, reused across groups */
  int cap_execs;
} group_t;
static _Thread_local group_t grp;

/* Out of line, so that its result is a value the caller keeps, not an expression it computes again. */
__attribute__((noinline)) static group_t *me(void) {
  return &grp;
}

int group_depth(void) {
  return grp.depth;
}

ncclResult_t group_error(ncclResult_t res) {
  group_t *g = me();
  if (g->depth > 0 && g->error == ncclSuccess && res != ncclSuccess && res != ncclInProgress) g->error = res;
  return res;
}

ncclResult_t group_start(void) {
  grp.depth++;
  return ncclSuccess;
}

/* Runs a job's work, unless its communicator was destroyed meanwhile. */
static ncclResult_t job_call(const group_job_t *d) {
  if (d->comm != NULL && comm_dead(d->comm)) {
    if (d->release != NULL) d->release(d->arg);
    return log_err(ncclInvalidUsage, "%s: the communicator was destroyed before the group's end", d->what);
  }
  return d->fn(d->arg);
}

/* Runs one job; when it fails, raises the abort flags of the group's other jobs (they may be waiting for it).
 */
static void *job_main(void *arg) {
  job_t *job = arg;
  job->res = job_call(&job->d);
  atomic_store(&job->done, 1);
  if (job->res == ncclSuccess || job->res == ncclInProgress) return NULL;
  snprintf(job->msg, sizeof job->msg, "%s", log_last_error());
  for (job_t *o = job->group; o != NULL; o = o->next) {
    if (o == job || o->d.abort_flag == NULL || atomic_load(&o->done) || atomic_exchange(&o->stopped, 1))
      continue;
    __atomic_store_n(o->d.abort_flag, 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

/* Runs the deferred jobs, concurrently when there are several; returns the first error of a job that failed
 * on its own (else the first error). */
static ncclResult_t run_jobs(void) {
  group_t *g = me();
  ncclResult_t first = ncclSuccess, cause = ncclSuccess;
  job_t *jobs = g->jobs;
  g->jobs = NULL;
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
  const char *first_msg = "", *cause_msg = "";
  for (job_t *j = jobs; j != NULL; j = j->next) {
    if (first == ncclSuccess && j->res != ncclSuccess) first_msg = j->msg;
    if (first == ncclSuccess) first = j->res;
    if (cause == ncclSuccess && !atomic_load(&j->stopped) && j->res != ncclSuccess) cause_msg = j->msg;
    if (cause == ncclSuccess && !atomic_load(&j->stopped)) cause = j->res;
    stopped += atomic_load(&j->stopped) && j->res != ncclSuccess;
  }
  /* jobs that ran on threads of their own reported there: the caller reads the message on its thread */
  if (first != ncclSuccess && first != ncclInProgress)
    log_set_last_error("%s", cause != ncclSuccess ? cause_msg : first_msg);
  while (jobs != NULL) {
    job_t *j = jobs;
    jobs = j->next;
    if (j->d.comm != NULL) comm_unhold(j->d.comm);
    free(j);
  }
  if (stopped > 0)
    INFO(LOG_INIT, "ncclGroupEnd: %d of the group's inits stopped waiting for one that failed (%s)", stopped,
         log_result_name(cause != ncclSuccess ? cause : first));
  return cause != ncclSuccess ? cause : first;
}

ncclResult_t group_job(const group_job_t *job) {
  group_t *g = me();
  if (g->depth == 0) return job_call(job);
  job_t *j = calloc(1, sizeof *j);
  ncclResult_t res =
      j == NULL ? log_err(ncclSystemError, "%s: out of host memory deferring it to ncclGroupEnd", job->what)
      : job->comm != NULL ? comm_hold(job->comm, "ncclGroupStart")
                          : ncclSuccess;
  if (res != ncclSuccess) {
    if (job->release != NULL) job->release(job->arg);
    free(j);
    return group_error(res);
  }
  j->d = *job;
  j->next = g->jobs;
  g->jobs = j;
  return ncclSuccess;
}

/* Takes the communicators off the group, forgets their calls and drops the group's holds (a communicator
 * destroyed meanwhile is released then). */
static void drop_calls(void) {
  group_t *g = me();
  while (g->comms != NULL) {
    ncclComm_t c = g->comms;
    g->comms = c->group_next;
    c->group_next = NULL;
    c->in_group = 0;
    plan_reset(&c->plan);
    comm_unhold(c);
  }
}

/* Files a call; the first call of a communicator in the group takes the group's hold on it. */
static ncclResult_t enqueue_held(group_t *g, ncclComm_t comm, const task_t *task) {
  if (comm_dead(comm)) return log_err(ncclInvalidUsage, "%s was destroyed", comm->name);
  if (!comm->in_group) CHECK(comm_hold(comm, "ncclGroupStart"));
  /* The reduction is resolved now: a PreMulSum op may be destroyed before the group ends (NCCL allows it). */
  task_t t = *task;
  redop_resolve(&comm->redops, t.op, t.type, comm->nranks, comm->gx != NULL, &t.red);
  ncclResult_t res = plan_add_task(&comm->plan, &t);
  if (!comm->in_group) {
    comm->in_group = 1;
    comm->group_next = g->comms;
    g->comms = comm;
  }
  return res;
}

ncclResult_t group_enqueue(ncclComm_t comm, const task_t *task) {
  if (plan_call_is_noop(task, comm->nranks)) { /* nothing to run, but monitoring counts the call */
    if (comm->ras != NULL) ras_comm_launch(comm->ras, (int)task->kind, task->seq, 0);
    return ncclSuccess;
  }
  group_t *g = me();
  int implicit = g->depth == 0;
  if (implicit) g->depth = 1;
  /* busy: an abort on another thread waits until the call is filed (and then finds it held) */
  atomic_fetch_add(&comm->busy, 1);
  ncclResult_t res = enqueue_held(g, comm, task);
  atomic_fetch_sub(&comm->busy, 1);
  if (!implicit) return group_error(res);
  if (res != ncclSuccess) g->error = res;
  return group_end();
}

static ncclResult_t reserve_execs(int n) {
  group_t *g = me();
  if (n <= g->cap_execs) return ncclSuccess;
  exec_t *e = realloc(g->execs, n * sizeof *e);
  if (e == NULL) return log_err(ncclSystemError, "out of host memory for %d group members", n);
  g->execs = e;
  g->cap_execs = n;
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

/* exec_t.step of a GPU communicator's calls, which the host executor skips (a step below 0): planned, to be
 * launched by launch_calls; or launched already by gx_relaunch. */
enum { STEP_PLANNED = -1, STEP_RELAUNCHED = -2, STEP_DEAD = -3, STEP_SHARED = -4, STEP_SHARED_TAKEN = -5 };

/* GPU communicators: plan with whole blocks (the kernels slice) and offer the copy engines their steps (every
 * communicator of the group offers before any settles: core/ce.h); then settle and launch. Nothing waits
 * for the GPU. */
static ncclResult_t plan_calls(ncclComm_t c) {
  CHECK(gx_tune(c->gx, &c->plan));
  CHECK(gx_scratch(c->gx, &c->plan, c->nranks));
  CHECK(plan_build(&c->plan, c->rank, c->nranks, (size_t)1 << 62, 1));
  return ce_offer(c->ce, &c->plan);
}

static ncclResult_t launch_calls(ncclComm_t c) {
  CHECK(ce_settle(c->ce, &c->plan));
  return gx_launch(c->gx, &c->plan);
}

/* The shared-GPU path (core/shared_gpu.h), for the communicators of the group whose calls it was offered
 * (STEP_SHARED): the leaders settle first (`leaders`), then the other ranks, each thread's in one pass so
 * that no rank waits for a leader that this thread has yet to settle; a group the path does not take is
 * planned as any other, before any is launched (launch_calls). */
static void settle_shared(exec_t *execs, int leaders) {
  int i = 0;
  for (ncclComm_t c = me()->comms; c != NULL; c = c->group_next, i++) {
    exec_t *ex = &execs[i];
    if (ex->step != STEP_SHARED || ex->result != ncclSuccess || sg_leads(c->sg) != leaders) continue;
    int take = 0;
    ex->result = sg_settle(c->sg, &c->plan, &take);
    if (ex->result == ncclSuccess && !take) ex->result = plan_calls(c);
    ex->step = take ? STEP_SHARED_TAKEN : STEP_PLANNED;
  }
}

/* Tells monitoring of the calls a plan launched (counts by kind, the last sequence number). */
static void ras_launched(ncclComm_t c, int captured) {
  _Static_assert((int)OP_COUNT == (int)RAS_OPS && (int)OP_SEND == (int)RAS_OP_SEND,
                 "monitoring counts calls by op_kind_t");
  for (int t = 0; c->ras != NULL && t < c->plan.ntasks; t++)
    ras_comm_launch(c->ras, (int)c->plan.tasks[t].kind, c->plan.tasks[t].seq, captured);
}

/* Plans, connects and runs the calls of every communicator of the group: GPU communicators launch, host ones
 * run together on the host executor. */
static ncclResult_t run_calls(void) {
  group_t *g = me();
  int n = 0;
  for (ncclComm_t c = g->comms; c != NULL; c = c->group_next) n++;
  CHECK(reserve_execs(n));
  int i = 0;
  for (ncclComm_t c = g->comms; c != NULL; c = c->group_next, i++) {
    atomic_fetch_add(&c->busy, 1);
    engine_start(&g->execs[i], &c->plan, c->links, &c->abort_flag, c->name, c->wd);
    if (comm_dead(c)) { /* aborted or destroyed (by any thread) since its calls were filed */
      g->execs[i].result = log_err(ncclInvalidUsage,
                                   "ncclGroupEnd: %s rank %d was aborted or destroyed while the group was "
                                   "open; its %d call%s dropped",
                                   c->name, c->rank, c->plan.ntasks, c->plan.ntasks == 1 ? " was" : "s were");
      g->execs[i].step = STEP_DEAD;
      continue;
    }
    /* a revoke or suspend that came after the call's checks waits for `busy`: seen here, or it sees us */
    if ((g->execs[i].result = comm_accepts_work(c)) != ncclSuccess) continue;
    g->execs[i].ras = c->ras;
    if (c->gx != NULL && c->sg != NULL && sg_wants(c->sg, &c->plan)) {
      g->execs[i].result = sg_offer(c->sg, &c->plan);
      g->execs[i].step = STEP_SHARED;
    } else if (c->gx != NULL) {
      /* the same calls as the last launch go again as they went, unplanned (gx_relaunch) */
      int took = 0;
      g->execs[i].result = gx_relaunch(c->gx, &c->plan, &took);
      if (!took && g->execs[i].result == ncclSuccess) g->execs[i].result = plan_calls(c);
      g->execs[i].step = took ? STEP_RELAUNCHED : STEP_PLANNED; /* nothing left for the host executor */
      if (took && g->execs[i].result == ncclSuccess) ras_launched(c, 0);
    } else {
      g->execs[i].result = plan_build(&c->plan, c->rank, c->nranks, c->ring_bytes / 2, 0);
      if (g->execs[i].result == ncclSuccess) ras_launched(c, 0);
    }
  }
  settle_shared(g->execs, 1);
  settle_shared(g->execs, 0);
  i = 0;
  for (ncclComm_t c = g->comms; c != NULL; c = c->group_next, i++) {
    exec_t *ex = &g->execs[i];
    if (c->gx == NULL || ex->result != ncclSuccess) continue;
    if (ex->step == STEP_PLANNED) {
      ex->result = launch_calls(c);
      if (ex->result == ncclSuccess) ras_launched(c, gx_captured(c->gx));
    } else if (ex->step == STEP_SHARED_TAKEN) {
      ex->result = sg_launch(c->sg, c->gx, &c->plan);
      if (ex->result == ncclSuccess) ras_launched(c, 0);
    }
  }
  for (int p = 0; p < 3; p++) connect_phase(p, g->execs, n);
  ncclResult_t res = engine_run(g->execs, n);
  i = 0;
  for (ncclComm_t c = g->comms; c != NULL; c = c->group_next, i++) {
    ncclResult_t r = g->execs[i].result;
    /* A call the planner refused moved no data: the communicator stays usable. */
    if (r != ncclSuccess && r != ncclInvalidUsage && r != ncclInvalidArgument &&
        g->execs[i].step != STEP_DEAD)
      comm_set_error(c, r);
    if (res == ncclSuccess) res = r;
    atomic_fetch_sub(&c->busy, 1);
  }
  return res;
}

ncclResult_t group_end(void) {
  group_t *g = me();
  if (g->depth == 0)
    return log_err(ncclInvalidUsage, "ncclGroupEnd: no group was started (ncclGroupStart missing)");
  if (--g->depth > 0) return ncclSuccess;
  ncclResult_t res = run_jobs();
  if (res == ncclSuccess) res = g->error;
  if (res == ncclSuccess && g->comms != NULL) res = run_calls();
  g->error = ncclSuccess;
  drop_calls();
  return res;
}

ncclResult_t group_simulate_end(ncclSimInfo_t *sim) {
  group_t *g = me();
  if (g->depth == 0) return log_err(ncclInvalidUsage, "ncclGroupSimulateEnd: no group was started");
  if (--g->depth > 0) return ncclSuccess;
  ncclResult_t res = run_jobs();
  if (res == ncclSuccess) res = g->error;
  double us = 0;
  for (ncclComm_t c = g->comms; c != NULL && res == ncclSuccess; c = c->group_next) {
    res = plan_build(&c->plan, c->rank, c->nranks, c->ring_bytes / 2, 0);
    double t = plan_estimate_us(&c->plan, c->nranks);
    if (t > us) us = t;
  }
  g->error = ncclSuccess;
  drop_calls();
  if (res == ncclSuccess) sim->estimatedTime = (float)us;
  return res;
}
