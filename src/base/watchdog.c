/*
 * The watchdog (see watchdog.h).
 *
 * The published wait is a seqlock: the waiting thread (one writer at a time, `writing`) makes `gen` odd,
 * stores the record word by word, and makes `gen` even again with a release store; a reader loads `gen` with
 * acquire, copies the words, and tries again if `gen` was odd or changed meanwhile. Words are moved with
 * relaxed atomic accesses, so a torn copy is discarded rather than being a data race.
 */
#include "watchdog.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "param.h"
#include "timeutil.h"

#define WAIT_WORDS (sizeof(wd_wait_t) / sizeof(uint64_t))
_Static_assert(sizeof(wd_wait_t) % sizeof(uint64_t) == 0, "the published wait moves in whole words");

struct wd {
  struct wd *next; /* the registry's list (wd_foreach) */
  char name[64];   /* the communicator's name */
  int rank, nranks;
  ncclResult_t timeout_res;           /* ncclRemoteError, or WD_RES_TIMEOUT for callers that know it */
  _Atomic uint32_t gen;               /* seqlock generation: odd while the record is being written */
  atomic_flag writing;                /* held by the one thread writing the record */
  _Atomic uint64_t words[WAIT_WORDS]; /* the published wd_wait_t */
  wd_exchange_t ex;        /* how stalled waits ask the other ranks (ex.announce NULL: they do not) */
  pthread_mutex_t ask;     /* one thread at a time uses the scratch below */
  wd_report_t *reports;    /* [nranks] the latest report of each rank */
  int *have;               /* [nranks] whether that rank is stalled now, by its latest report */
  _Atomic int err;         /* the first asynchronous error (ncclSuccess: none) */
  _Atomic(char *) err_msg; /* its message */
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static wd_t *registry;

/* ---- The published wait ---- */

static void publish(wd_t *wd, const wd_wait_t *w) {
  if (wd == NULL) return;
  uint64_t src[WAIT_WORDS];
  memcpy(src, w, sizeof src);
  while (atomic_flag_test_and_set_explicit(&wd->writing, memory_order_acquire)) sched_yield();
  uint32_t g = atomic_load_explicit(&wd->gen, memory_order_relaxed);
  atomic_store_explicit(&wd->gen, g + 1, memory_order_relaxed);
  /* release stores: a reader that sees a new word then sees the odd generation (no fence, which
   * ThreadSanitizer cannot follow; the same instructions on x86) */
  for (size_t i = 0; i < WAIT_WORDS; i++) atomic_store_explicit(&wd->words[i], src[i], memory_order_release);
  atomic_store_explicit(&wd->gen, g + 2, memory_order_release);
  atomic_flag_clear_explicit(&wd->writing, memory_order_release);
}

void wd_read(const wd_t *wd, wd_wait_t *out) {
  wd_t *w = (wd_t *)wd; /* loads only: atomics take non-const pointers */
  uint64_t copy[WAIT_WORDS];
  for (;;) {
    uint32_t g = atomic_load_explicit(&w->gen, memory_order_acquire);
    if (g & 1) {
      sched_yield();
      continue;
    }
    for (size_t i = 0; i < WAIT_WORDS; i++)
      copy[i] = atomic_load_explicit(&w->words[i], memory_order_acquire); /* before the generation again */
    if (atomic_load_explicit(&w->gen, memory_order_relaxed) == g) break;
  }
  memcpy(out, copy, sizeof copy);
}

/* ---- Life ---- */

ncclResult_t wd_create(const char *name, int rank, int nranks, unsigned version, wd_t **wd_p) {
  wd_t *wd = calloc(1, sizeof *wd);
  if (wd != NULL) {
    wd->reports = calloc((size_t)nranks, sizeof *wd->reports);
    wd->have = calloc((size_t)nranks, sizeof *wd->have);
  }
  if (wd == NULL || wd->reports == NULL || wd->have == NULL) {
    if (wd != NULL) free(wd->reports);
    free(wd);
    return log_err(ncclSystemError, "%s: out of host memory for the watchdog of %d ranks", name, nranks);
  }
  snprintf(wd->name, sizeof wd->name, "%s", name);
  wd->rank = rank;
  wd->nranks = nranks;
  wd->timeout_res = version >= WD_TIMEOUT_VERSION ? WD_RES_TIMEOUT : ncclRemoteError;
  atomic_flag_clear(&wd->writing);
  pthread_mutex_init(&wd->ask, NULL);
  publish(wd, &(wd_wait_t){.kind = WD_IDLE, .peer = -1, .channel = -1, .behind = -1});
  pthread_mutex_lock(&registry_lock);
  wd->next = registry;
  registry = wd;
  pthread_mutex_unlock(&registry_lock);
  *wd_p = wd;
  return ncclSuccess;
}

void wd_set_name(wd_t *wd, const char *name) {
  pthread_mutex_lock(&registry_lock);
  snprintf(wd->name, sizeof wd->name, "%s", name);
  pthread_mutex_unlock(&registry_lock);
}

void wd_set_exchange(wd_t *wd, const wd_exchange_t *ex) {
  pthread_mutex_lock(&wd->ask);
  wd->ex = ex != NULL ? *ex : (wd_exchange_t){0};
  pthread_mutex_unlock(&wd->ask);
}

void wd_destroy(wd_t *wd) {
  if (wd == NULL) return;
  pthread_mutex_lock(&registry_lock);
  for (wd_t **link = &registry; *link != NULL; link = &(*link)->next)
    if (*link == wd) {
      *link = wd->next;
      break;
    }
  pthread_mutex_unlock(&registry_lock);
  pthread_mutex_destroy(&wd->ask);
  free(atomic_load(&wd->err_msg));
  free(wd->reports);
  free(wd->have);
  free(wd);
}

void wd_foreach(void (*fn)(void *arg, const char *name, int rank, const wd_t *wd), void *arg) {
  pthread_mutex_lock(&registry_lock);
  for (wd_t *wd = registry; wd != NULL; wd = wd->next) fn(arg, wd->name, wd->rank, wd);
  pthread_mutex_unlock(&registry_lock);
}

/* ---- Asynchronous errors ---- */

ncclResult_t wd_timeout_result(const wd_t *wd) {
  return wd != NULL ? wd->timeout_res : ncclRemoteError;
}

ncclResult_t wd_error(const wd_t *wd, const char **msg_p) {
  wd_t *w = (wd_t *)wd;
  ncclResult_t res = (ncclResult_t)atomic_load_explicit(&w->err, memory_order_acquire);
  if (msg_p != NULL)
    *msg_p = res != ncclSuccess ? atomic_load_explicit(&w->err_msg, memory_order_acquire) : NULL;
  return res;
}

int wd_set_error(wd_t *wd, ncclResult_t res, const char *msg) {
  int none = ncclSuccess;
  /* the message is stored before the error, which readers load with acquire */
  char *copy = strdup(msg != NULL ? msg : ""), *old = NULL;
  if (!atomic_compare_exchange_strong(&wd->err_msg, &old, copy)) {
    free(copy);
    return 0;
  }
  return atomic_compare_exchange_strong(&wd->err, &none, (int)res);
}

/* ---- Deadlines ---- */

double wd_deadline(int64_t seconds) {
  return seconds > 0 ? time_now() + (double)seconds : 0;
}

int wd_passed(double deadline, double now) {
  return deadline > 0 && now > deadline;
}

/* ---- Who is behind ---- */

/* The rank of the oldest call among the cycle that starts at `from` (reports of stalled ranks only). */
static int oldest_in_cycle(int from, const wd_report_t *reports) {
  int best = from;
  for (int r = reports[from].peer; r != from; r = reports[r].peer)
    if (reports[r].seq < reports[best].seq) best = r;
  return best;
}

int wd_find_behind(int me, int nranks, int peer, const wd_report_t *reports, const int *have, char *why,
                   size_t len) {
  if (peer < 0 || peer >= nranks) return -1;
  char seen[4096] = {0}; /* ranks past 32768 are followed without cycle marks: the walk is bounded anyway */
  int cur = peer;
  for (int hops = 0; hops <= nranks; hops++) {
    if (cur == me) {
      int r = have[me] ? oldest_in_cycle(me, reports) : me;
      snprintf(why, len, "the ranks wait for each other in a cycle; rank %d is in the oldest call (#%llu)", r,
               (unsigned long long)reports[r].seq);
      return r;
    }
    if (!have[cur]) {
      snprintf(why, len, "rank %d has not reported waiting for anyone: it is stopped, or not in this call",
               cur);
      return cur;
    }
    if (cur < (int)(8 * sizeof seen) && (seen[cur / 8] >> (cur % 8) & 1)) {
      int r = oldest_in_cycle(cur, reports);
      snprintf(why, len, "ranks wait for each other in a cycle; rank %d is in the oldest call (#%llu)", r,
               (unsigned long long)reports[r].seq);
      return r;
    }
    if (cur < (int)(8 * sizeof seen)) seen[cur / 8] |= (char)(1 << (cur % 8));
    int next = reports[cur].peer;
    if (next < 0 || next >= nranks) {
      snprintf(why, len, "rank %d waits in %s (call #%llu) for no rank in particular", cur, reports[cur].op,
               (unsigned long long)reports[cur].seq);
      return cur;
    }
    cur = next;
  }
  return -1;
}

/* ---- Waits ---- */

void wd_begin(wd_timer_t *t, wd_t *wd, const wd_wait_t *what, wd_describe_fn_t describe, void *arg) {
  double now = time_now();
  *t = (wd_timer_t){.wd = wd,
                    .w = *what,
                    .describe = describe,
                    .arg = arg,
                    .warn_s = param_int(P_BRAID_STALL_WARN_S),
                    .timeout_s = param_int(P_BRAID_TIMEOUT_S),
                    .ask = 1,
                    .last = now};
  t->w.since = now;
  t->w.behind = -1;
  publish(wd, &t->w);
}

/* Tells the other ranks whether this wait is stalled (best effort). */
static void announce(wd_timer_t *t, int stalled) {
  wd_t *wd = t->wd;
  if (wd == NULL || !t->ask || wd->ex.announce == NULL) return;
  wd_report_t mine = {.rank = wd->rank,
                      .stalled = stalled,
                      .kind = t->w.kind,
                      .peer = t->w.peer,
                      .seq = t->w.seq,
                      .step = t->w.step};
  snprintf(mine.op, sizeof mine.op, "%s", t->w.op);
  pthread_mutex_lock(&wd->ask);
  wd->ex.announce(wd->ex.arg, &mine);
  pthread_mutex_unlock(&wd->ask);
  t->announced = stalled;
}

void wd_progress(wd_timer_t *t, double now, const wd_wait_t *w) {
  t->last = now;
  t->reported = 0;
  if (t->announced) announce(t, 0);
  if (w == NULL ||
      (w->seq == t->w.seq && w->step == t->w.step && w->peer == t->w.peer && w->kind == t->w.kind))
    return;
  t->w = *w;
  t->w.since = now;
  t->w.behind = -1;
  publish(t->wd, &t->w);
}

int wd_due(const wd_timer_t *t, double now) {
  double idle = now - t->last;
  int64_t ask_at = t->warn_s > 0 ? t->warn_s : t->timeout_s;
  return (!t->announced && ask_at > 0 && idle >= 0.5 * (double)ask_at) ||
         (!t->reported && t->warn_s > 0 && idle >= (double)t->warn_s) ||
         (t->timeout_s > 0 && idle >= (double)t->timeout_s + t->margin_s);
}

void wd_relocate(wd_timer_t *t, const wd_wait_t *w) {
  if (w->seq == t->w.seq && w->step == t->w.step && w->peer == t->w.peer && w->kind == t->w.kind) return;
  double since = t->w.since;
  int behind = t->w.behind;
  t->w = *w;
  t->w.since = since;
  t->w.behind = behind;
  publish(t->wd, &t->w);
}

void wd_end(wd_timer_t *t) {
  /* no word to the others: a wait that ends by moving said so in wd_progress; one that failed stays, for
   * them, stalled where it was, so that their search for the rank behind passes through it */
  publish(t->wd, &(wd_wait_t){.kind = WD_IDLE, .peer = -1, .channel = -1, .behind = -1});
}

/* Reads the other ranks' reports and names the rank behind (-1 when nothing says). */
static int behind(wd_timer_t *t, char *why, size_t len) {
  wd_t *wd = t->wd;
  why[0] = '\0';
  if (!t->ask && t->w.peer >= 0) { /* a wait for one message: its sender is the one behind */
    snprintf(why, len, "it has not sent what this rank waits for");
    return t->w.peer;
  }
  if (wd == NULL || !t->ask || wd->ex.collect == NULL) return -1;
  pthread_mutex_lock(&wd->ask);
  int *fresh = calloc((size_t)wd->nranks, sizeof *fresh);
  wd_report_t *in = calloc((size_t)wd->nranks, sizeof *in);
  int r = -1;
  if (fresh != NULL && in != NULL) {
    wd->ex.collect(wd->ex.arg, in, fresh);
    for (int k = 0; k < wd->nranks; k++) {
      if (!fresh[k]) continue;
      wd->reports[k] = in[k];
      wd->have[k] = in[k].stalled;
    }
    wd->reports[wd->rank] = (wd_report_t){.rank = wd->rank, .stalled = 1, .peer = t->w.peer, .seq = t->w.seq};
    wd->have[wd->rank] = 1;
    r = wd_find_behind(wd->rank, wd->nranks, t->w.peer, wd->reports, wd->have, why, len);
  }
  free(fresh);
  free(in);
  pthread_mutex_unlock(&wd->ask);
  return r;
}

ncclResult_t wd_check(wd_timer_t *t, double now) {
  if (!wd_due(t, now)) return ncclSuccess;
  double idle = now - t->last;
  int64_t ask_at = t->warn_s > 0 ? t->warn_s : t->timeout_s;
  if (!t->announced && ask_at > 0 && idle >= 0.5 * (double)ask_at) announce(t, 1);
  int report = !t->reported && t->warn_s > 0 && idle >= (double)t->warn_s;
  int fail = t->timeout_s > 0 && idle >= (double)t->timeout_s + t->margin_s;
  if (!report && !fail) return ncclSuccess;
  char what[400] = "", why[256], blame[300] = "";
  if (t->describe != NULL) t->describe(t->arg, what, sizeof what);
  int r = behind(t, why, sizeof why);
  if (r >= 0) snprintf(blame, sizeof blame, "; rank %d is behind: %s", r, why);
  if (r != t->w.behind) {
    t->w.behind = r;
    publish(t->wd, &t->w);
  }
  char who[96] = ""; /* a wait without a watchdog names its communicator in its description */
  if (t->wd != NULL) snprintf(who, sizeof who, "%s rank %d: ", t->wd->name, t->wd->rank);
  if (fail)
    return log_err(wd_timeout_result(t->wd),
                   "%sno progress for %.0f s: %s%s; giving up (BRAID_TIMEOUT_S=%lld)", who, idle, what, blame,
                   (long long)t->timeout_s);
  t->reported = 1;
  char limits[96] = "";
  if (t->timeout_s > 0)
    snprintf(limits, sizeof limits, " (it fails after BRAID_TIMEOUT_S=%lld)", (long long)t->timeout_s);
  log_report("%sno progress for %.0f s: %s%s%s", who, idle, what, blame, limits);
  return ncclSuccess;
}
