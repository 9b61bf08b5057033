/*
 * The host executor (see engine.h).
 *
 * A transfer moves one piece at a time: as many whole elements as the receiving connection has arrived, the
 * sending connection has room for, and the transfer has left. Each transfer's bytes on a connection are
 * padded to XF_ALIGN so that every transfer starts aligned in the stream; both ends pad identically because
 * both run the same transfers on it.
 */
#include "engine.h"

#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"

void engine_start(exec_t *ex, plan_t *plan, links_t *links, const volatile int *abort_flag,
                  const char *comm_name, wd_t *wd) {
  *ex = (exec_t){.plan = plan,
                 .links = links,
                 .abort_flag = abort_flag,
                 .comm_name = comm_name,
                 .wd = wd,
                 .result = ncclSuccess,
                 .ras_step = -1};
}

/* Bytes a transfer moves through its connections: its data padded to XF_ALIGN (local copies are not padded).
 */
static size_t wire_bytes(const xfer_t *x) {
  if (x->recv_peer < 0 && x->send_peer < 0) return x->bytes;
  return (x->bytes + XF_ALIGN - 1) / XF_ALIGN * XF_ALIGN;
}

/* Moves up to n bytes of data (n a multiple of the element size) from the transfer's source to its
 * destination and/or the sending connection's region `out`; `in` is what arrived (NULL when sending from
 * local data). */
static void move_piece(const xfer_t *x, const char *in, char *out, size_t n) {
  const char *src = x->src != NULL ? x->src + x->done : NULL;
  char *dst = x->dst != NULL ? x->dst + x->done : NULL;
  char *target = dst != NULL ? dst : out;
  size_t elems = n / x->esize;
  if (in != NULL && (x->flags & XF_REDUCE)) {
    red_combine(x->red, target, src, in, elems, (x->flags & XF_LAST) != 0);
  } else if (x->flags & XF_PREPARE) {
    red_prepare(x->red, target, in != NULL ? in : src, elems);
  } else {
    const char *from = in != NULL ? in : src;
    if (target != from) memmove(target, from, n);
  }
  if (dst != NULL && out != NULL) memcpy(out, dst, n);
}

/* Moves the transfer's alignment padding once its data is done. */
static ncclResult_t move_padding(tp_conn_t *rc, tp_conn_t *sc, size_t pad, size_t *moved_p) {
  void *in = NULL, *out = NULL;
  size_t avail = pad, room = pad;
  if (rc != NULL) CHECK(rc->ops->recv_peek(rc, &in, &avail));
  if (sc != NULL) CHECK(sc->ops->send_peek(sc, &out, &room));
  *moved_p = 0;
  if (avail < pad || room < pad) return ncclSuccess;
  if (rc != NULL) CHECK(rc->ops->recv_release(rc, pad));
  if (sc != NULL) {
    memset(out, 0, pad);
    CHECK(sc->ops->send_commit(sc, pad));
  }
  *moved_p = pad;
  return ncclSuccess;
}

/* Moves one piece of a transfer; *moved_p says how many wire bytes moved. */
static ncclResult_t progress_xfer(exec_t *ex, xfer_t *x, size_t *moved_p) {
  tp_conn_t *rc = x->recv_peer >= 0 ? ex->links->recv[x->recv_peer] : NULL;
  tp_conn_t *sc = x->send_peer >= 0 ? ex->links->send[x->send_peer] : NULL;
  if (x->done >= x->bytes) {
    CHECK(move_padding(rc, sc, wire_bytes(x) - x->done, moved_p));
    x->done += *moved_p;
    return ncclSuccess;
  }
  size_t n = x->bytes - x->done;
  void *in = NULL, *out = NULL;
  if (rc != NULL) {
    size_t avail;
    CHECK(rc->ops->recv_peek(rc, &in, &avail));
    if (avail < n) n = avail;
  }
  if (sc != NULL) {
    size_t room;
    CHECK(sc->ops->send_peek(sc, &out, &room));
    if (room < n) n = room;
  }
  if (rc == NULL && sc == NULL && n > (1u << 20)) n = 1u << 20; /* local copies yield to the others */
  n -= n % x->esize;
  *moved_p = n;
  if (n == 0) return ncclSuccess;
  move_piece(x, in, out, n);
  if (rc != NULL) CHECK(rc->ops->recv_release(rc, n));
  if (sc != NULL) CHECK(sc->ops->send_commit(sc, n));
  x->done += n;
  return ncclSuccess;
}

/* Whether a connection is free for the transfer at this point of the round; claims it either way, so that
 * later transfers on it wait for this one (transfers sharing a connection run in list order). */
static int claim(uint32_t *marks, int peer, uint32_t round) {
  if (peer < 0) return 1;
  int free_now = marks[peer] != round;
  marks[peer] = round;
  return free_now;
}

/* Runs one round over the current step: every transfer whose connections are free moves a piece. */
static ncclResult_t progress_step(exec_t *ex, int *progressed_p, int *step_done_p) {
  const step_t *st = &ex->plan->steps[ex->step];
  links_t *l = ex->links;
  uint32_t round = ++ex->round;
  int all_done = 1;
  for (int i = 0; i < st->count; i++) {
    xfer_t *x = &ex->plan->xfers[st->first + i];
    size_t wire = wire_bytes(x);
    if (x->done >= wire) continue;
    int send_free = claim(l->mark_send, x->send_peer, round);
    int recv_free = claim(l->mark_recv, x->recv_peer, round);
    if (send_free && recv_free) {
      size_t moved;
      CHECK(progress_xfer(ex, x, &moved));
      if (moved > 0) *progressed_p = 1;
    }
    if (x->done < wire) all_done = 0;
  }
  *step_done_p = all_done;
  return ncclSuccess;
}

/* The first unfinished transfer of the current step (the last step's once all are done); NULL without any. */
static const xfer_t *first_pending(const exec_t *ex) {
  int step = ex->step < ex->plan->nsteps ? ex->step : ex->plan->nsteps - 1;
  if (step < 0 || ex->plan->steps[step].count == 0) return NULL;
  const step_t *st = &ex->plan->steps[step];
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &ex->plan->xfers[st->first + i];
    if (x->done < wire_bytes(x)) return x;
  }
  return &ex->plan->xfers[st->first];
}

/* Tells monitoring what the exec waits for: its step's first unfinished transfer, since `since`. */
static void ras_publish(exec_t *ex, double since) {
  const step_t *st = &ex->plan->steps[ex->step];
  const xfer_t *x = first_pending(ex);
  if (x == NULL) return; /* a step without transfers waits for nobody */
  ras_wait_t w = {.kind = (int)st->task->kind,
                  .peer = x->recv_peer >= 0 ? x->recv_peer : x->send_peer,
                  .channel = -1,
                  .step = ex->step,
                  .is_send = x->recv_peer < 0,
                  .seq = st->task->seq,
                  .bytes = st->task->count * dtype_size(st->task->type),
                  .done = x->done};
  ras_comm_wait(ex->ras, &w, since);
  ex->ras_step = ex->step;
}

/* The peer a transfer waits for: the sender while nothing has arrived, else the receiver (no room). */
static int waits_for(const exec_t *ex, const xfer_t *x) {
  if (x == NULL) return -1;
  if (x->recv_peer >= 0) {
    tp_conn_t *rc = ex->links->recv[x->recv_peer];
    void *in;
    size_t avail = 0;
    if (x->send_peer < 0 || rc == NULL || rc->ops->recv_peek(rc, &in, &avail) != ncclSuccess || avail == 0)
      return x->recv_peer;
  }
  return x->send_peer;
}

/* Where the exec waits, for the watchdog. */
static wd_wait_t where(const exec_t *ex) {
  int step = ex->step < ex->plan->nsteps ? ex->step : ex->plan->nsteps - 1;
  wd_wait_t w = {
      .kind = WD_COLL, .peer = waits_for(ex, first_pending(ex)), .nsteps = ex->plan->nsteps, .channel = -1};
  if (step < 0) return w;
  const step_t *st = &ex->plan->steps[step];
  w.seq = st->task->seq;
  w.step = step + 1;
  snprintf(w.op, sizeof w.op, "%s", plan_op_name(st->task->kind));
  return w;
}

/* Says what a stalled exec waits for (wd_describe_fn_t). */
static void describe(void *arg, char *buf, size_t len) {
  const exec_t *ex = arg;
  const xfer_t *x = first_pending(ex);
  int peer = waits_for(ex, x);
  if (x == NULL || ex->step >= ex->plan->nsteps) {
    snprintf(buf, len, "%s (call #%llu) waits for rank %d to take its last data", ex->timer.w.op,
             (unsigned long long)ex->timer.w.seq, peer);
    return;
  }
  snprintf(buf, len, "%s (call #%llu), step %d of %d, waits to %s rank %d (%zu of %zu bytes moved)",
           ex->timer.w.op, (unsigned long long)ex->timer.w.seq, ex->step + 1, ex->plan->nsteps,
           peer == x->recv_peer ? "receive from" : "send to", peer, x->done, x->bytes);
}

/* The exec moved (or starts): the watchdog's clock starts again, and learns where it is now. */
static void moved(exec_t *ex, double now) {
  if (!ex->timing) {
    wd_wait_t w = where(ex);
    wd_begin(&ex->timer, ex->wd, &w, describe, ex);
    ex->timing = 1;
    return;
  }
  int step = ex->step < ex->plan->nsteps ? ex->step : ex->plan->nsteps - 1;
  if (step < 0 || (step + 1 == ex->timer.w.step && ex->plan->steps[step].task->seq == ex->timer.w.seq)) {
    wd_progress(&ex->timer, now, NULL);
    return;
  }
  wd_wait_t w = where(ex);
  wd_progress(&ex->timer, now, &w);
}

/* The exec did not move: the watchdog reports a stall once and fails it after the timeout. */
static ncclResult_t check_stall(exec_t *ex, double now) {
  if (!ex->timing) moved(ex, now);
  if (!wd_due(&ex->timer, now)) return ncclSuccess;
  wd_wait_t w = where(ex); /* which side of the step blocks may have changed since it began */
  wd_relocate(&ex->timer, &w);
  int reported = ex->timer.reported;
  ncclResult_t res = wd_check(&ex->timer, now);
  if (!reported && ex->timer.reported) ras_stall_report(ex->ras); /* the job-wide verdict, one more line */
  return res;
}

/* The error of an exec whose communicator was revoked or aborted (its abort flag is up). */
static ncclResult_t stopped(const exec_t *ex) {
  if (__atomic_load_n(ex->abort_flag, __ATOMIC_ACQUIRE) != ENGINE_STOP_REVOKE)
    return log_err(ncclInternalError, "%s rank %d: aborted by ncclCommAbort", ex->comm_name, ex->links->rank);
  int step = ex->step < ex->plan->nsteps ? ex->step : ex->plan->nsteps - 1;
  const task_t *t = step >= 0 ? ex->plan->steps[step].task : NULL;
  return log_err(ncclInvalidUsage,
                 "%s rank %d: %s (call #%lu) stopped: the communicator was revoked (ncclCommRevoke, or "
                 "ncclCommShrink with NCCL_SHRINK_ABORT)",
                 ex->comm_name, ex->links->rank, t != NULL ? plan_op_name(t->kind) : "a call",
                 t != NULL ? (unsigned long)t->seq : 0ul);
}

/* One round of one exec. */
static ncclResult_t progress_exec(exec_t *ex, double now, int *progressed_p) {
  if (*ex->abort_flag) return stopped(ex);
  int progressed = 0, step_done = 0;
  if (ex->ras != NULL && ex->ras_step != ex->step) ras_publish(ex, now);
  CHECK(progress_step(ex, &progressed, &step_done));
  if (step_done) ex->step++;
  if (progressed || step_done) {
    moved(ex, now);
    ex->ras_stalled = 0;
    *progressed_p = 1;
    return ncclSuccess;
  }
  /* a wait of a quarter second is worth telling monitoring exactly (once per stall, off the fast path) */
  if (ex->ras != NULL && ex->timing && !ex->ras_stalled && now - ex->timer.last > 0.25) {
    ras_publish(ex, ex->timer.last);
    ex->ras_stalled = 1;
  }
  return check_stall(ex, now);
}

/* Flushes what the sending connections still hold locally (bounded by BRAID_TIMEOUT_S like every wait). */
static ncclResult_t flush_all(exec_t *ex, double now, int *done_p) {
  links_t *l = ex->links;
  if (ex->step >= ex->plan->nsteps) CHECK(check_stall(ex, now));
  *done_p = 1;
  for (int peer = 0; peer < l->nranks; peer++) {
    if (l->send[peer] == NULL) continue;
    int done;
    CHECK(l->send[peer]->ops->flush(l->send[peer], &done));
    if (!done) *done_p = 0;
  }
  return ncclSuccess;
}

ncclResult_t engine_run(exec_t *execs, int n) {
  ncclResult_t first = ncclSuccess;
  int left = n;
  uint64_t idle_rounds = 0;
  while (left > 0) {
    int progressed = 0;
    double now = time_now();
    left = 0;
    for (int i = 0; i < n; i++) {
      exec_t *ex = &execs[i];
      if (ex->result != ncclSuccess || ex->step < 0) continue;
      int flushed = 0;
      ncclResult_t res = ex->step < ex->plan->nsteps ? progress_exec(ex, now, &progressed) : ncclSuccess;
      /* Bytes a transport holds locally must keep moving even while this rank waits on something else:
       * its peer may be waiting for them. Pushed once done, and whenever a round moved nothing. */
      if (res == ncclSuccess && (ex->step >= ex->plan->nsteps || !progressed))
        res = flush_all(ex, now, &flushed);
      /* an abort or revoke fails the connections too: the call failed because of it, and says so */
      if (res != ncclSuccess && res != ncclInternalError && res != ncclInvalidUsage &&
          __atomic_load_n(ex->abort_flag, __ATOMIC_ACQUIRE))
        res = stopped(ex);
      if (res != ncclSuccess && ex->timing && ex->timer.w.behind >= 0 &&
          !strstr(log_last_error(), "is behind")) {
        /* a peer that gave up first failed this rank too: the stall report had found whom they waited for */
        char cause[LOG_ERROR_MAX];
        snprintf(cause, sizeof cause, "%s", log_last_error());
        if (res == ncclRemoteError) res = wd_timeout_result(ex->wd); /* the stall is the cause */
        res = log_err(res, "%s; rank %d is behind (this rank's stall report)", cause, ex->timer.w.behind);
      }
      if (res != ncclSuccess) {
        ex->result = res;
        if (first == ncclSuccess) first = res;
        if (ex->timing) wd_end(&ex->timer);
        ex->timing = 0;
        links_fail(ex->links);
        ras_comm_idle(ex->ras);
        continue;
      }
      if (ex->step >= ex->plan->nsteps && flushed) {
        if (ex->timing) wd_end(&ex->timer);
        ex->timing = 0;
        ex->step = -1;
        ras_comm_idle(ex->ras);
      } else {
        left++;
      }
    }
    idle_rounds = progressed ? 0 : idle_rounds + 1;
    time_backoff(idle_rounds);
  }
  return first;
}
