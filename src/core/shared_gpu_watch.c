/*
 * Ranks of separate processes on one GPU: the thread that bounds the streams' waits (see shared_gpu.h). A
 * stream memory operation never gives up by itself; this thread looks every few milliseconds at what this
 * rank's stream waits for, and at the other ranks, and releases the wait by storing its word.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "core/shared_gpu_int.h"

#define SG_WATCH_US 5000 /* between two looks */

/* Tells the other side that this rank failed or was aborted (its watch fails that rank's communicator). */
void sg_gave_up(sg_t *sg) {
  for (int i = 0; i < sg->npeers; i++)
    if (sg->peers[i].words != NULL) sg->peers[i].words->gave_up[sg->rank == 0 ? 0 : 1] = 1;
}

void sg_fail(sg_t *sg, ncclResult_t res, int loud, const char *msg) {
  int expected = ncclSuccess;
  if (atomic_compare_exchange_strong(&sg->failed, &expected, (int)res))
    LOG_AT(loud ? LOG_WARN : LOG_INFO, LOG_ALL, "%s rank %d: %s", sg->name, sg->rank, msg);
  sg->quit = 1;
  sg_gave_up(sg);
}

void sg_release(sg_t *sg) {
  if (sg->rank != 0) {
    __atomic_store_n(&sg->peers[0].words->done, 1, __ATOMIC_SEQ_CST);
    return;
  }
  for (int r = 1; r < sg->nranks; r++) __atomic_store_n(&sg->peers[r].words->ready, 1, __ATOMIC_SEQ_CST);
}

/* Whether rank p's process has exited (known only in this pid namespace) before its communicator was
 * destroyed (`side`: the peer's index in the words' flags). */
static int gone(const sg_peer_t *p, int side) {
  return !p->words->left[side] && p->pid > 0 && kill(p->pid, 0) != 0 && errno == ESRCH;
}

/* The call whose waits carry `token`, in words. */
static void say_call(const sg_t *sg, uint32_t token, char *buf, size_t len) {
  const int k = (int)(token % SG_RECENT);
  if (sg->recent[k].token != token) {
    snprintf(buf, len, "a call");
    return;
  }
  snprintf(buf, len, "%s (call %llu)", plan_op_name((op_kind_t)sg->recent[k].kind),
           (unsigned long long)sg->recent[k].seq);
}

/* The state of one rank's look: how long its stream has waited in the same call. */
typedef struct {
  uint32_t token;
  double since;
} stuck_t;

/* The leader: its stream waits for the ranks whose `ready` is still 0. */
static void leader_look(sg_t *sg, double waited, const char *call, int64_t limit) {
  char msg[512];
  for (int r = 1; r < sg->nranks; r++) {
    const sg_peer_t *p = &sg->peers[r];
    if (gone(p, 1)) {
      snprintf(msg, sizeof msg, "rank %d's process (pid %d) has exited; the communicator fails", r, p->pid);
      sg_fail(sg, ncclRemoteError, waited > 0, msg);
    } else if (p->words->gave_up[1]) {
      snprintf(msg, sizeof msg, "rank %d was aborted or failed; the communicator fails", r);
      sg_fail(sg, ncclRemoteError, waited > 0, msg);
    }
  }
  if (limit <= 0 || waited < (double)limit) return;
  int len = snprintf(msg, sizeof msg, "%s waited %.0f s (BRAID_TIMEOUT_S) for rank", call, waited);
  for (int r = 1; r < sg->nranks && len < (int)sizeof msg - 16; r++)
    if (__atomic_load_n(&sg->peers[r].words->ready, __ATOMIC_ACQUIRE) == 0)
      len += snprintf(msg + len, sizeof msg - (size_t)len, " %d", r);
  snprintf(msg + len, sizeof msg - (size_t)(len < (int)sizeof msg ? len : 0),
           " (whose stream never reached it); the communicator fails");
  sg_fail(sg, ncclRemoteError, 1, msg);
}

/* Another rank: its stream waits for the leader's. Releases its own wait only when nobody else can. */
static void rank_look(sg_t *sg, double waited, const char *call, int64_t limit) {
  char msg[512];
  const sg_peer_t *p = &sg->peers[0];
  if (gone(p, 0)) {
    snprintf(msg, sizeof msg,
             "rank 0's process (pid %d), which moves this GPU's data, has exited; the "
             "communicator fails",
             p->pid);
    sg_fail(sg, ncclRemoteError, waited > 0, msg);
    atomic_store(&sg->releasing, 1);
  } else if (p->words->gave_up[0]) {
    sg_fail(sg, ncclRemoteError, waited > 0,
            "rank 0, which moves this GPU's data, was aborted or failed; the "
            "communicator fails");
  }
  if (limit <= 0 || waited < (double)limit) return;
  snprintf(msg, sizeof msg,
           "%s waited %.0f s (BRAID_TIMEOUT_S) for rank 0, which moves this GPU's data, to "
           "finish it; the communicator fails",
           call, waited);
  sg_fail(sg, ncclRemoteError, 1, msg);
  if (waited >= 2.0 * (double)limit) atomic_store(&sg->releasing, 1); /* rank 0's stream never came */
}

/* One look. */
static void look(sg_t *sg, stuck_t *st) {
  const double now = time_now();
  const uint32_t token = __atomic_load_n(sg->reached, __ATOMIC_ACQUIRE);
  if (token == 0 || token != st->token) st->since = now;
  st->token = token;
  char call[96] = "";
  if (token != 0) say_call(sg, token, call, sizeof call);
  const int64_t limit = param_int(P_BRAID_TIMEOUT_S);
  const double waited = token != 0 ? now - st->since : 0;
  if (sg->rank == 0)
    leader_look(sg, waited, call, limit);
  else
    rank_look(sg, waited, call, limit);
  if (*sg->abort_flag) sg->quit = 1;
  const int failed = atomic_load(&sg->failed) != ncclSuccess;
  if (failed || atomic_load(&sg->aborting) || *sg->abort_flag) {
    sg_gave_up(sg);
    if (sg->rank == 0) atomic_store(&sg->releasing, 1);
  }
  if (atomic_load(&sg->releasing)) sg_release(sg);
}

static void *watch(void *arg) {
  sg_t *sg = arg;
  stuck_t st = {0, time_now()};
  pthread_mutex_lock(&sg->lock);
  while (!sg->stop) {
    pthread_mutex_unlock(&sg->lock);
    look(sg, &st);
    pthread_mutex_lock(&sg->lock);
    if (!sg->stop) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += SG_WATCH_US * 1000L;
      if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&sg->wake, &sg->lock, &ts);
    }
  }
  pthread_mutex_unlock(&sg->lock);
  return NULL;
}

ncclResult_t sg_watch_start(sg_t *sg) {
  if (pthread_create(&sg->thread, NULL, watch, sg) != 0)
    return log_err(ncclSystemError, "%s: cannot start the shared-GPU watch thread", sg->name);
  sg->thread_live = 1;
  return ncclSuccess;
}

void sg_watch_stop(sg_t *sg) {
  if (!sg->thread_live) return;
  pthread_mutex_lock(&sg->lock);
  sg->stop = 1;
  pthread_cond_signal(&sg->wake);
  pthread_mutex_unlock(&sg->lock);
  pthread_join(sg->thread, NULL);
  sg->thread_live = 0;
}
