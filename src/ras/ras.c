/*
 * Monitoring: the communicators' records and the process's registry of them (see ras.h).
 *
 * Memory-ordering contract of a record:
 *   - fields set by ras_comm_join (nonce, rank, nranks, dev, name, acct) never change;
 *   - `peers` is NULL until ras_comm_peers stores the complete table with a release store; readers load it
 *     with acquire and read the table only when it is not NULL;
 *   - counters and states are atomics written by the core (relaxed: each is a value on its own);
 *   - the wait is nine words under a sequence lock: the writer (one thread: the one running the
 *     communicator's calls) makes `wait_ver` odd, fences (release), stores the words, then makes it even with
 *     a release store; a reader loads `wait_ver` (acquire), the words, fences (acquire) and loads `wait_ver`
 *     again, and keeps the copy only when both loads gave the same even value.
 * The registry lock orders ras_comm_join and ras_comm_retire against every reader (snapshots, peer lists), so
 * a record is never read after its retire returned; the hot path (launch, wait, idle) takes no lock.
 */
#include "ras.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "ras/mesh.h"
#include "ras/report.h"

/* What the mesh reads of this process's records (mesh.h). */
static const mesh_source_t mesh_source = {.snapshot = ras_local_snapshot,
                                          .peers = ras_local_peers,
                                          .known_job = ras_known_job,
                                          .rank_peer = ras_local_rank_peer};

/* The words of a wait, in the order of ras_wait_t's fields, then when it began (ns). */
enum { W_KIND, W_PEER, W_CHANNEL, W_STEP, W_SEND, W_SEQ, W_BYTES, W_DONE, W_SINCE, W_COUNT };

struct ras_comm {
  struct ras_comm *next;
  uint64_t nonce;
  int rank, nranks, dev;
  char name[RAS_NAME_MAX];
  const alloc_acct_t *acct;
  _Atomic(ras_peer_t *) peers; /* [nranks], NULL until ready */
  _Atomic int state, init_state, async_error;
  _Atomic uint64_t counts[RAS_OPS][2];
  _Atomic uint64_t launched;
  _Atomic uint64_t wait_ver;
  _Atomic int64_t wait[W_COUNT];
};

static struct {
  pthread_mutex_t lock;
  pid_t pid;         /* the process the registry belongs to (a forked child starts again) */
  int tried, on;     /* the monitor was started (on) or could not be (tried only) */
  ras_peer_t self;   /* this process's identity */
  ras_comm_t *comms; /* live records */
  uint64_t *jobs;    /* nonces of every communicator this process joined */
  int njobs, cap_jobs;
} reg = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- Setup ---- */

static void atfork_prepare(void) {
  pthread_mutex_lock(&reg.lock);
  mesh_atfork_prepare();
}
static void atfork_parent(void) {
  mesh_atfork_parent();
  pthread_mutex_unlock(&reg.lock);
}
static void atfork_child(void) {
  mesh_atfork_child();
  pthread_mutex_unlock(&reg.lock);
}

/* Equal on processes of one host: NCCL_HOSTID if set, else the host name and this boot's id. */
static uint64_t host_hash(const char *host) {
  const char *id = param_str(P_NCCL_HOSTID);
  if (*id != '\0') return hash_bytes(id, strlen(id));
  char buf[512];
  snprintf(buf, sizeof buf, "%s", host);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f != NULL) {
    size_t len = strlen(buf);
    if (fgets(buf + len, (int)(sizeof buf - len), f) == NULL) buf[len] = '\0';
    fclose(f);
  }
  return hash_bytes(buf, strlen(buf));
}

/* Starts the monitor once per process (under the lock). A forked child forgets its parent's. */
static int monitor_on(void) {
  if (reg.pid != getpid()) {
    reg.pid = getpid();
    reg.tried = reg.on = 0;
    reg.comms = NULL; /* a parent's communicators are not this process's */
  }
  if (reg.tried) return reg.on;
  reg.tried = 1;
  if (param_int(P_NCCL_RAS_ENABLE) == 0) {
    INFO(LOG_RAS | LOG_INIT, "RAS: monitoring is off (NCCL_RAS_ENABLE=0)");
    return 0;
  }
  static int atfork_set = 0;
  if (!atfork_set) {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    atfork_set = 1;
  }
  memset(&reg.self, 0, sizeof reg.self);
  gethostname(reg.self.host, sizeof reg.self.host - 1);
  reg.self.pid = (int32_t)getpid();
  reg.self.host_hash = host_hash(reg.self.host);
  if (mesh_start(&mesh_source, &reg.self.addr) != ncclSuccess) {
    WARN("RAS: the monitor could not start (above); this process runs without monitoring");
    return 0;
  }
  mesh_set_self(&reg.self);
  reg.on = 1;
  return 1;
}

static void add_job(uint64_t nonce) {
  for (int i = 0; i < reg.njobs; i++)
    if (reg.jobs[i] == nonce) return;
  if (reg.njobs == reg.cap_jobs) {
    int cap = reg.cap_jobs ? 2 * reg.cap_jobs : 16;
    uint64_t *j = realloc(reg.jobs, (size_t)cap * sizeof *j);
    if (j == NULL) return;
    reg.jobs = j;
    reg.cap_jobs = cap;
  }
  reg.jobs[reg.njobs++] = nonce;
}

void ras_comm_join(const ras_comm_info_t *info, ras_comm_t **rc_p, ras_peer_t *self_p) {
  *rc_p = NULL;
  memset(self_p, 0, sizeof *self_p);
  ras_comm_t *rc = calloc(1, sizeof *rc);
  if (rc == NULL) return; /* monitoring is not worth failing an init for */
  rc->nonce = info->nonce;
  rc->rank = info->rank;
  rc->nranks = info->nranks;
  rc->dev = info->dev;
  rc->acct = info->acct;
  snprintf(rc->name, sizeof rc->name, "%s", info->name != NULL ? info->name : "");
  atomic_init(&rc->state, RAS_ST_INIT);
  atomic_init(&rc->init_state, ncclInProgress);
  atomic_init(&rc->async_error, ncclInProgress);
  atomic_init(&rc->wait[W_KIND], -1);
  pthread_mutex_lock(&reg.lock);
  if (!monitor_on()) {
    pthread_mutex_unlock(&reg.lock);
    free(rc);
    return;
  }
  if (info->dev >= 0 && info->dev < 64 && !(reg.self.devs & (1ull << info->dev))) {
    reg.self.devs |= 1ull << info->dev;
    mesh_set_self(&reg.self);
  }
  add_job(info->nonce);
  rc->next = reg.comms;
  reg.comms = rc;
  *self_p = reg.self;
  pthread_mutex_unlock(&reg.lock);
  *rc_p = rc;
}

void ras_comm_peers(ras_comm_t *rc, const ras_peer_t *peers) {
  if (rc == NULL) return;
  ras_peer_t *copy = malloc((size_t)rc->nranks * sizeof *copy);
  if (copy == NULL) return;
  memcpy(copy, peers, (size_t)rc->nranks * sizeof *copy);
  ras_peer_t *old = NULL;
  if (atomic_compare_exchange_strong_explicit(&rc->peers, &old, copy, memory_order_release,
                                              memory_order_relaxed))
    mesh_wake();
  else
    free(copy); /* set once */
}

void ras_comm_ready(ras_comm_t *rc) {
  if (rc == NULL) return;
  atomic_store_explicit(&rc->init_state, ncclSuccess, memory_order_relaxed);
  atomic_store_explicit(&rc->async_error, ncclSuccess, memory_order_relaxed);
  atomic_store_explicit(&rc->state, RAS_ST_RUNNING, memory_order_release);
}

/* Adds one to a counter that only this thread writes (no locked instruction on the hot path). */
static inline void bump(_Atomic uint64_t *c) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

void ras_comm_launch(ras_comm_t *rc, int kind, uint64_t seq, int captured) {
  if (rc == NULL || kind < 0 || kind >= RAS_OPS) return;
  bump(&rc->counts[kind][captured != 0]);
  if (seq + 1 > atomic_load_explicit(&rc->launched, memory_order_relaxed))
    atomic_store_explicit(&rc->launched, seq + 1, memory_order_relaxed);
}

static void wait_store(ras_comm_t *rc, const int64_t w[W_COUNT]) {
  uint64_t v = atomic_load_explicit(&rc->wait_ver, memory_order_relaxed);
  atomic_store_explicit(&rc->wait_ver, v + 1, memory_order_relaxed);
  /* release stores, acquire loads instead of fences: the same on x86, and ThreadSanitizer follows them */
  for (int i = 0; i < W_COUNT; i++) atomic_store_explicit(&rc->wait[i], w[i], memory_order_release);
  atomic_store_explicit(&rc->wait_ver, v + 2, memory_order_release);
}

void ras_comm_wait(ras_comm_t *rc, const ras_wait_t *w, double since) {
  if (rc == NULL) return;
  int64_t words[W_COUNT] = {
      [W_KIND] = w->kind,
      [W_PEER] = w->peer,
      [W_CHANNEL] = w->channel,
      [W_STEP] = w->step,
      [W_SEND] = w->is_send,
      [W_SEQ] = (int64_t)w->seq,
      [W_BYTES] = (int64_t)w->bytes,
      [W_DONE] = (int64_t)w->done,
      [W_SINCE] = (int64_t)(since * 1e9),
  };
  wait_store(rc, words);
}

void ras_comm_idle(ras_comm_t *rc) {
  if (rc == NULL) return;
  int64_t words[W_COUNT] = {
      [W_KIND] = -1, [W_PEER] = -1, [W_CHANNEL] = -1, [W_STEP] = -1, [W_SINCE] = (int64_t)(time_now() * 1e9)};
  wait_store(rc, words);
}

/* Reads the wait (see the contract at the top); 0 when a writer kept changing it (then unknown). */
static int wait_load(const ras_comm_t *rc, int64_t w[W_COUNT]) {
  for (int tries = 0; tries < 64; tries++) {
    uint64_t v1 = atomic_load_explicit(&rc->wait_ver, memory_order_acquire);
    if (v1 & 1) continue;
    for (int i = 0; i < W_COUNT; i++) w[i] = atomic_load_explicit(&rc->wait[i], memory_order_acquire);
    if (atomic_load_explicit(&rc->wait_ver, memory_order_relaxed) == v1) return 1;
  }
  return 0;
}

void ras_comm_error(ras_comm_t *rc, ncclResult_t res, int during_init) {
  if (rc == NULL) return;
  if (during_init) atomic_store_explicit(&rc->init_state, res, memory_order_relaxed);
  atomic_store_explicit(&rc->async_error, res, memory_order_relaxed);
  if (atomic_load_explicit(&rc->state, memory_order_relaxed) != RAS_ST_ABORTED)
    atomic_store_explicit(&rc->state, RAS_ST_FAILED, memory_order_release);
}

void ras_comm_finalized(ras_comm_t *rc) {
  if (rc != NULL) atomic_store_explicit(&rc->state, RAS_ST_FINALIZED, memory_order_release);
}

void ras_comm_aborting(ras_comm_t *rc) {
  if (rc != NULL) atomic_store_explicit(&rc->state, RAS_ST_ABORTED, memory_order_release);
}

void ras_comm_retire(ras_comm_t *rc) {
  if (rc == NULL) return;
  pthread_mutex_lock(&reg.lock);
  for (ras_comm_t **pp = &reg.comms; *pp != NULL; pp = &(*pp)->next)
    if (*pp == rc) {
      *pp = rc->next;
      break;
    }
  pthread_mutex_unlock(&reg.lock);
  free(atomic_load_explicit(&rc->peers, memory_order_acquire));
  free(rc);
  mesh_wake(); /* the next keep-alive says so */
}

/* ---- Readers ---- */

static void fill_rec(const ras_comm_t *rc, ras_rec_t *r, int brief, double now) {
  memset(r, 0, sizeof *r);
  r->nonce = rc->nonce;
  r->rank = rc->rank;
  r->nranks = rc->nranks;
  r->dev = rc->dev;
  r->state = atomic_load_explicit(&rc->state, memory_order_acquire);
  r->init_state = atomic_load_explicit(&rc->init_state, memory_order_relaxed);
  r->async_error = atomic_load_explicit(&rc->async_error, memory_order_relaxed);
  r->launched = atomic_load_explicit(&rc->launched, memory_order_relaxed);
  const ras_peer_t *peers = atomic_load_explicit(&rc->peers, memory_order_acquire);
  if (peers != NULL) {
    r->root_host = peers[0].host_hash;
    r->root_pid = peers[0].pid;
  }
  int64_t w[W_COUNT];
  r->now = (ras_wait_t){.kind = -1, .peer = -1, .channel = -1, .step = -1};
  if (wait_load(rc, w)) {
    if (w[W_KIND] >= 0 && w[W_KIND] < RAS_OPS)
      r->now = (ras_wait_t){.kind = (int32_t)w[W_KIND],
                            .peer = w[W_PEER] >= -1 && w[W_PEER] < rc->nranks ? (int32_t)w[W_PEER] : -1,
                            .channel = (int32_t)w[W_CHANNEL],
                            .step = (int32_t)w[W_STEP],
                            .is_send = w[W_SEND] != 0,
                            .seq = (uint64_t)w[W_SEQ],
                            .bytes = (uint64_t)w[W_BYTES],
                            .done = (uint64_t)w[W_DONE]};
    double since = (double)w[W_SINCE] * 1e-9; /* idle: since the last call ended */
    r->now.waited_ms = since > 0 && now > since ? (uint64_t)((now - since) * 1e3) : 0;
  }
  for (int k = 0; k < RAS_OPS; k++)
    for (int c = 0; c < 2; c++)
      r->counts[k][c] = atomic_load_explicit(&rc->counts[k][c], memory_order_relaxed);
  for (int k = 0; k < RAS_OP_SEND; k++) r->colls += r->counts[k][0] + r->counts[k][1];
  if (brief) {
    memset(r->counts, 0, sizeof r->counts);
    return;
  }
  if (rc->acct != NULL) {
    r->host_bytes = atomic_load_explicit(&rc->acct->host_bytes, memory_order_relaxed);
    r->dev_bytes = atomic_load_explicit(&rc->acct->dev_bytes, memory_order_relaxed);
    r->peak_bytes = atomic_load_explicit(&rc->acct->peak_bytes, memory_order_relaxed);
  }
  snprintf(r->name, sizeof r->name, "%s", rc->name);
}

int ras_local_snapshot(ras_proc_t *proc, int brief) {
  double now = time_now();
  pthread_mutex_lock(&reg.lock);
  proc->id = reg.self;
  proc->nrecs = 0;
  for (const ras_comm_t *rc = reg.comms; rc != NULL; rc = rc->next) proc->nrecs++;
  proc->recs = proc->nrecs > 0 ? malloc(proc->nrecs * sizeof *proc->recs) : NULL;
  if (proc->nrecs > 0 && proc->recs == NULL) {
    pthread_mutex_unlock(&reg.lock);
    proc->nrecs = 0;
    return -1;
  }
  uint32_t i = 0;
  for (const ras_comm_t *rc = reg.comms; rc != NULL; rc = rc->next)
    fill_rec(rc, &proc->recs[i++], brief, now);
  pthread_mutex_unlock(&reg.lock);
  return 0;
}

void ras_local_peers(void (*fn)(const ras_peer_t *peer, uint64_t job, void *arg), void *arg) {
  pthread_mutex_lock(&reg.lock);
  for (const ras_comm_t *rc = reg.comms; rc != NULL; rc = rc->next) {
    const ras_peer_t *peers = atomic_load_explicit(&rc->peers, memory_order_acquire);
    for (int r = 0; peers != NULL && r < rc->nranks; r++) fn(&peers[r], rc->nonce, arg);
  }
  pthread_mutex_unlock(&reg.lock);
}

int ras_known_job(uint64_t job) {
  int known = 0;
  pthread_mutex_lock(&reg.lock);
  for (int i = 0; i < reg.njobs && !known; i++) known = reg.jobs[i] == job;
  pthread_mutex_unlock(&reg.lock);
  return known;
}

int ras_local_rank_peer(uint64_t nonce, int rank, ras_peer_t *peer_p) {
  int found = 0;
  pthread_mutex_lock(&reg.lock);
  for (const ras_comm_t *rc = reg.comms; rc != NULL && !found; rc = rc->next) {
    const ras_peer_t *peers = atomic_load_explicit(&rc->peers, memory_order_acquire);
    if (rc->nonce == nonce && peers != NULL && rank >= 0 && rank < rc->nranks) {
      *peer_p = peers[rank];
      found = 1;
    }
  }
  pthread_mutex_unlock(&reg.lock);
  return found;
}

/* ---- The verdict ---- */

size_t ras_verdict(char *buf, size_t size) {
  if (size == 0) return 0;
  buf[0] = '\0';
  pthread_mutex_lock(&reg.lock);
  int on = reg.on && reg.pid == getpid();
  pthread_mutex_unlock(&reg.lock);
  ras_view_t v;
  if (!on || mesh_view(&v) != 0) return 0;
  rpt_t out = {0};
  report_verdict(&v, &out);
  view_free(&v);
  size_t n = 0;
  if (out.data != NULL) {
    n = out.len < size ? out.len : size - 1;
    memcpy(buf, out.data, n);
    buf[n] = '\0';
  }
  rpt_free(&out);
  return n;
}

void ras_stall_report(ras_comm_t *rc) {
  if (rc == NULL) return;
  char line[2048];
  if (ras_verdict(line, sizeof line) > 0) WARN("%s rank %d: job-wide: %s", rc->name, rc->rank, line);
}
