/*
 * Ranks of separate processes on one GPU: setup, the leader's answer to each group, teardown (see
 * shared_gpu.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "core/shared_gpu_int.h"

#define TAG_SG_HELLO 0x53474830u /* "0HGS": another rank's mailbox and whether it can take the path */
#define TAG_SG_SETUP 0x53475330u /* "0SGS": the leader's words segment and mailbox for the rank */
#define TAG_SG_READY 0x53475230u /* "0RGS": the rank mapped them */
#define TAG_SG_GO    0x53474730u /* "0GGS": every rank could: the path is on */
#define SG_MAGIC     0x53475031u
#define SG_SLOTS     2 /* a rank sends its next calls only after the answer to its last */

typedef struct {
  uint32_t magic;
  int32_t on;
  uint64_t pidns;
  tp_mbox_addr_t box; /* the sender's inbox: a rank's for answers, the leader's for the rank's calls */
  char seg[SHM_NAME_BYTES];
} sg_hello_t;

int sg_leads(const sg_t *sg) {
  return sg != NULL && sg->rank == 0;
}

int sg_wants(const sg_t *sg, const plan_t *plan) {
  for (int i = 0; sg != NULL && i < plan->ntasks; i++)
    if (plan->tasks[i].kind != OP_SEND && plan->tasks[i].kind != OP_RECV) return 1;
  return 0;
}

ncclResult_t sg_error(const sg_t *sg) {
  return sg == NULL ? ncclSuccess : (ncclResult_t)atomic_load(&sg->failed);
}

/* Whether the path applies: every rank on this GPU (host and device index, as transport selection assumes),
 * each in a process of its own. The same answer on every rank: all see the same peer table. */
static int applies(const sg_setup_t *s) {
  if (s->dev < 0 || s->nranks < 2) return 0;
  for (int r = 0; r < s->nranks; r++) {
    if (s->peers[r].host_hash != s->peers[0].host_hash || s->peers[r].dev != s->peers[0].dev) return 0;
    for (int q = 0; q < r; q++)
      if (s->peers[q].pid == s->peers[r].pid) return 0;
  }
  return 1;
}

/* ---- Setup ---- */

static void peer_close(sg_t *sg, sg_peer_t *p) {
  tp_peer_mem_free(p->mem);
  tp_mbox_close(p->inbox);
  tp_mbox_close(p->outbox);
  if (p->words != NULL) gpu_host_unregister(p->seg.base);
  tp_seg_close(&p->seg, "shared-GPU words");
  memset(p, 0, sizeof *p);
}

static void release(sg_t *sg) {
  for (int i = 0; sg->peers != NULL && i < sg->npeers; i++) peer_close(sg, &sg->peers[i]);
  free(sg->peers);
  plan_free(&sg->local);
  free(sg->views);
  free(sg->msgs);
  free(sg->idx);
  if (sg->last != NULL) gpu_event_destroy(sg->last);
  if (sg->reached != NULL) gpu_host_free((void *)sg->reached);
  pthread_mutex_destroy(&sg->lock);
  pthread_cond_destroy(&sg->wake);
  mem_free(sg->acct, sg, sizeof *sg);
}

/* The words page mapped and registered with the device (the leader made it: p->seg already holds it). */
static ncclResult_t words_map(sg_t *sg, sg_peer_t *p, const char *name) {
  if (name != NULL) CHECK(tp_seg_attach(name, SG_WORDS_BYTES, "shared-GPU words", &p->seg));
  void *dev = NULL;
  CHECK(gpu_host_register(p->seg.base, SG_WORDS_BYTES, &dev));
  p->words = p->seg.base;
  p->words_dev = dev;
  return ncclSuccess;
}

/* The leader's half for rank r: its words page and the inbox for its calls, and the rank's answer inbox
 * mapped; says in *out what the rank needs. A failure is logged and answered with on = 0. */
static void leader_open(sg_t *sg, const sg_setup_t *s, sg_peer_t *p, const sg_hello_t *theirs,
                        sg_hello_t *out) {
  *out = (sg_hello_t){.magic = SG_MAGIC, .pidns = tp_pid_namespace()};
  if (!theirs->on) return;
  const tp_config_t *cfg = tp_ctx_config(s->links->tp);
  out->on = tp_seg_create(cfg, p->rank, SG_WORDS_BYTES, "shared-GPU words", &p->seg) == ncclSuccess &&
            words_map(sg, p, NULL) == ncclSuccess &&
            tp_mbox_create(s->links->tp, p->rank, 0, sizeof(sg_msg_t), SG_SLOTS, &p->inbox, &out->box) ==
                ncclSuccess &&
            tp_mbox_attach(&theirs->box, 0, sizeof(sg_answer_t), SG_SLOTS, &p->outbox) == ncclSuccess &&
            tp_peer_mem_init(sg->dev, sg->name, sg->rank, p->rank, &p->mem) == ncclSuccess;
  if (out->on) memcpy(out->seg, p->seg.name, sizeof out->seg);
}

/* The leader: hears every rank, sets up its half for each, and tells all whether every half is there. */
static ncclResult_t leader_setup(sg_t *sg, const sg_setup_t *s, int on, int *go) {
  sg_hello_t *hello = calloc((size_t)s->nranks, sizeof *hello);
  if (hello == NULL)
    return log_err(ncclSystemError, "%s: out of host memory for the shared-GPU setup", s->name);
  ncclResult_t res = ncclSuccess;
  int all = on;
  for (int r = 1; r < s->nranks && res == ncclSuccess; r++) {
    sg_hello_t theirs;
    res = boot_recv(s->boot, r, TAG_SG_HELLO, &theirs, sizeof theirs);
    if (res != ncclSuccess) break;
    sg->peers[r].rank = r;
    if (!all || theirs.magic != SG_MAGIC) theirs.on = 0;
    leader_open(sg, s, &sg->peers[r], &theirs, &hello[r]);
    all &= hello[r].on;
    if (theirs.pidns != 0 && theirs.pidns == hello[r].pidns) sg->peers[r].pid = s->peers[r].pid;
    res = boot_send(s->boot, r, TAG_SG_SETUP, &hello[r], sizeof hello[r]);
  }
  for (int r = 1; r < s->nranks && res == ncclSuccess; r++) {
    int32_t ok = 0;
    res = boot_recv(s->boot, r, TAG_SG_READY, &ok, sizeof ok);
    all &= ok;
  }
  int32_t final = all;
  for (int r = 1; r < s->nranks && res == ncclSuccess; r++)
    res = boot_send(s->boot, r, TAG_SG_GO, &final, sizeof final);
  free(hello);
  *go = final;
  return res;
}

/* Another rank: its answer inbox, then the leader's words page and calls inbox, then the verdict. */
static ncclResult_t rank_setup(sg_t *sg, const sg_setup_t *s, int on, int *go) {
  sg_peer_t *p = &sg->peers[0];
  p->rank = 0;
  sg_hello_t mine = {.magic = SG_MAGIC, .on = on, .pidns = tp_pid_namespace()}, theirs;
  if (on &&
      tp_mbox_create(s->links->tp, 0, 0, sizeof(sg_answer_t), SG_SLOTS, &p->inbox, &mine.box) != ncclSuccess)
    mine.on = 0;
  CHECK(boot_send(s->boot, 0, TAG_SG_HELLO, &mine, sizeof mine));
  CHECK(boot_recv(s->boot, 0, TAG_SG_SETUP, &theirs, sizeof theirs));
  int32_t ok = mine.on && theirs.magic == SG_MAGIC && theirs.on &&
               words_map(sg, p, theirs.seg) == ncclSuccess &&
               tp_mbox_attach(&theirs.box, 0, sizeof(sg_msg_t), SG_SLOTS, &p->outbox) == ncclSuccess;
  if (theirs.pidns != 0 && theirs.pidns == mine.pidns) p->pid = s->peers[0].pid;
  CHECK(boot_send(s->boot, 0, TAG_SG_READY, &ok, sizeof ok));
  int32_t final = 0;
  CHECK(boot_recv(s->boot, 0, TAG_SG_GO, &final, sizeof final));
  *go = final;
  return ncclSuccess;
}

/* This rank's own parts: the word its stream marks its waits in, and the event after its last call. */
static int own_parts(sg_t *sg) {
  void *host = NULL;
  if (gpu_host_alloc(64, &host, &sg->reached_dev) != ncclSuccess) return 0;
  sg->reached = host;
  *sg->reached = 0;
  return gpu_event_create(&sg->last) == ncclSuccess;
}

ncclResult_t sg_init(const sg_setup_t *s, sg_t **sg_p) {
  *sg_p = NULL;
  if (!applies(s)) return ncclSuccess;
  sg_t *sg;
  CHECK(MEM_CALLOC(s->acct, sg, 1, "shared-GPU path"));
  *sg = (sg_t){.dev = s->dev,
               .rank = s->rank,
               .nranks = s->nranks,
               .name = s->name,
               .acct = s->acct,
               .abort_flag = s->abort_flag,
               .npeers = s->rank == 0 ? s->nranks : 1};
  pthread_mutex_init(&sg->lock, NULL);
  pthread_cond_init(&sg->wake, NULL);
  sg->peers = calloc((size_t)sg->npeers, sizeof *sg->peers);
  sg->msgs = calloc((size_t)s->nranks, sizeof *sg->msgs);
  sg->idx = calloc((size_t)s->nranks, sizeof *sg->idx);
  if (sg->peers == NULL || sg->msgs == NULL || sg->idx == NULL) {
    release(sg);
    return log_err(ncclSystemError, "%s: out of host memory for the shared-GPU path", s->name);
  }
  gpu_scope_t scope;
  ncclResult_t res = gpu_enter(s->dev, &scope);
  if (res != ncclSuccess) {
    release(sg);
    return res;
  }
  /* an optimisation: a rank that cannot set it up (logged) says so, and no rank takes it */
  const int on = param_int(P_BRAID_SHARED_GPU_LEADER) != 0 && own_parts(sg);
  int go = 0;
  res = s->rank == 0 ? leader_setup(sg, s, on, &go) : rank_setup(sg, s, on, &go);
  gpu_leave(&scope);
  if (res == ncclSuccess && go) res = sg_watch_start(sg);
  if (res != ncclSuccess || !go) {
    if (res == ncclSuccess)
      INFO(LOG_INIT | LOG_TUNING,
           "%s rank %d: ranks share this GPU but not the shared-GPU path "
           "(BRAID_SHARED_GPU_LEADER is 0 on a rank, or a rank could not set it up)",
           s->name, s->rank);
    release(sg);
    return res;
  }
  INFO(LOG_INIT | LOG_TUNING,
       "%s rank %d: all %d ranks share GPU %d from separate processes: rank 0 moves the data of every rank's "
       "collectives, the others' streams only wait for it (BRAID_SHARED_GPU_LEADER)",
       s->name, s->rank, s->nranks, s->dev);
  *sg_p = sg;
  return ncclSuccess;
}

/* ---- Each group ---- */

static tp_mbox_wait_t waiting_for(const sg_t *sg, const sg_peer_t *p, const char *what) {
  return (tp_mbox_wait_t){.comm = sg->name,
                          .rank = sg->rank,
                          .peer = p->rank,
                          .peer_pid = p->pid,
                          .abort_flag = &sg->quit,
                          .what = what};
}

/* Exports the buffer at ptr into *x; clears *ok where it cannot be. */
static void export_buf(const sg_t *sg, const void *ptr, int32_t *has, gpu_ptr_export_t *x, uint32_t *refuse) {
  int ok = 0;
  *has = 1;
  if (gpu_ptr_export(sg->dev, ptr, x, &ok) != ncclSuccess || !ok) *refuse |= SG_NO_EXPORT;
}

/* This rank's calls of the group, as the leader needs them (and why it cannot take them, if so). */
static void describe(sg_t *sg, const plan_t *plan, sg_msg_t *m) {
  m->magic = SG_MAGIC;
  m->rank = sg->rank;
  m->ncalls = plan->ntasks;
  m->refuse = plan->ntasks > SG_CALLS ? SG_TOO_MANY : 0;
  for (int i = 0; i < plan->ntasks; i++) { /* first: a capture may forbid the calls an export makes */
    int capturing = 0;
    void *graph;
    uint64_t id;
    if (gpu_stream_capture(plan->tasks[i].stream, &capturing, &graph, &id) != ncclSuccess || capturing)
      m->refuse |= SG_CAPTURED;
  }
  for (int i = 0; i < plan->ntasks && i < SG_CALLS; i++) {
    const task_t *t = &plan->tasks[i];
    sg_call_t *c = &m->calls[i];
    *c = (sg_call_t){.kind = (int32_t)t->kind,
                     .type = (int32_t)t->type,
                     .root = t->root,
                     .red_kind = (int32_t)t->red.kind,
                     .count = t->count,
                     .fscale = t->red.fscale,
                     .iscale = t->red.iscale,
                     .divisor = t->red.divisor};
    if (t->red.scalar_dev != NULL) m->refuse |= SG_DEV_SCALAR;
    /* the leader's own buffers need no export, nor do those of a group that goes the ordinary way */
    if (t->count == 0 || sg->rank == 0 || (m->refuse & SG_CAPTURED)) continue;
    if (sg_has_in(t->kind, sg->rank, t->root)) export_buf(sg, t->sendbuff, &c->has_in, &c->in, &m->refuse);
    if (!sg_has_out(t->kind, sg->rank, t->root)) continue;
    if (c->has_in && t->recvbuff == t->sendbuff) { /* in place: one export serves both */
      c->has_out = 1;
      c->out = c->in;
    } else {
      export_buf(sg, t->recvbuff, &c->has_out, &c->out, &m->refuse);
    }
  }
}

ncclResult_t sg_offer(sg_t *sg, const plan_t *plan) {
  if (sg == NULL || sg->rank == 0) return ncclSuccess;
  gpu_scope_t scope;
  CHECK(gpu_enter(sg->dev, &scope));
  describe(sg, plan, &sg->mine);
  gpu_leave(&scope);
  const tp_mbox_wait_t who = waiting_for(sg, &sg->peers[0], "shared-GPU calls");
  return tp_mbox_send(sg->peers[0].outbox, &sg->mine, &who);
}

/* ---- The leader's answer ---- */

static int p2p(int kind) {
  return kind == OP_SEND || kind == OP_RECV;
}

static uint64_t call_bytes(const sg_call_t *c) {
  return c->count * dtype_size((ncclDataType_t)c->type);
}

static void say_call(const sg_call_t *c, char *buf, size_t len) {
  snprintf(buf, len, "%s of %llu x %s", plan_op_name((op_kind_t)c->kind), (unsigned long long)c->count,
           dtype_name((ncclDataType_t)c->type));
}

/* Whether the collectives (point-to-point calls aside) of two ranks' groups are the same calls in the same
 * order; if not, says how in `why`. */
static int collectives_match(const sg_msg_t *a, const sg_msg_t *b, char *why, size_t len) {
  int i = 0, j = 0, k = 0;
  for (;; k++) {
    while (i < a->ncalls && p2p(a->calls[i].kind)) i++;
    while (j < b->ncalls && p2p(b->calls[j].kind)) j++;
    if (i == a->ncalls || j == b->ncalls) break;
    const sg_call_t *x = &a->calls[i++], *y = &b->calls[j++];
    const int reduces = x->kind == OP_ALLREDUCE || x->kind == OP_REDUCE || x->kind == OP_REDUCESCATTER;
    const int rooted =
        x->kind == OP_BROADCAST || x->kind == OP_REDUCE || x->kind == OP_GATHER || x->kind == OP_SCATTER;
    if (x->kind == y->kind && x->count == y->count && x->type == y->type && (!rooted || x->root == y->root) &&
        (!reduces || x->red_kind == y->red_kind))
      continue;
    static const char *const ops[] = {"sum", "prod", "max", "min", "premulsum", "avg"};
    char sx[64], sy[64];
    say_call(x, sx, sizeof sx);
    say_call(y, sy, sizeof sy);
    snprintf(
        why, len,
        "collective %d of the group is %.64s (root %d, %s) on rank %d but %.64s (root %d, %s) on rank %d",
        k + 1, sx, x->root, ops[(unsigned)x->red_kind % 6], a->rank, sy, y->root,
        ops[(unsigned)y->red_kind % 6], b->rank);
    return 0;
  }
  if (i == a->ncalls && j == b->ncalls) return 1;
  snprintf(why, len, "rank %d's group has more collectives than rank %d's (%d calls in all against %d)",
           i < a->ncalls ? a->rank : b->rank, i < a->ncalls ? b->rank : a->rank,
           i < a->ncalls ? a->ncalls : b->ncalls, i < a->ncalls ? b->ncalls : a->ncalls);
  return 0;
}

/* The n-th call of `kind` to or from `peer` in a rank's group, or NULL. */
static const sg_call_t *nth_p2p(const sg_msg_t *m, int kind, int peer, int n) {
  for (int i = 0; i < m->ncalls; i++)
    if (m->calls[i].kind == kind && m->calls[i].root == peer && n-- == 0) return &m->calls[i];
  return NULL;
}

/* Whether every send has its receive, of as many bytes, and the other way round. */
static int p2p_match(sg_msg_t *const *msgs, int nranks, char *why, size_t len) {
  for (int a = 0; a < nranks; a++)
    for (int i = 0; i < msgs[a]->ncalls; i++) {
      const sg_call_t *c = &msgs[a]->calls[i];
      if (!p2p(c->kind)) continue;
      int n = 0; /* its place among a's calls of its kind with that peer */
      for (int j = 0; j < i; j++) n += msgs[a]->calls[j].kind == c->kind && msgs[a]->calls[j].root == c->root;
      const int other = c->root;
      const sg_call_t *d = other >= 0 && other < nranks
                               ? nth_p2p(msgs[other], c->kind == OP_SEND ? OP_RECV : OP_SEND, a, n)
                               : NULL;
      if (d != NULL && call_bytes(c) == call_bytes(d)) continue;
      char s[64];
      say_call(c, s, sizeof s);
      snprintf(why, len, "rank %d's %s %s rank %d (its call %d of that kind with it) has %s on rank %d", a, s,
               c->kind == OP_SEND ? "to" : "from", other, n + 1,
               d == NULL ? "no counterpart" : "a different size", other);
      return 0;
    }
  return 1;
}

/* Whether rank r's all-to-all (call c) reads where it writes (in place, which the path does not take). */
static int alltoall_overlaps(const sg_t *sg, const plan_t *plan, int r, int i, const sg_call_t *c) {
  const uint64_t span = call_bytes(c) * (uint64_t)sg->nranks;
  if (c->kind != OP_ALLTOALL || c->count == 0) return 0;
  if (r == 0) return plan_overlap(plan->tasks[i].sendbuff, span, plan->tasks[i].recvbuff, span);
  return c->in.buffer_id == c->out.buffer_id && c->in.offset < c->out.offset + span &&
         c->out.offset < c->in.offset + span;
}

/* One rank's buffer of a call, where this process reaches it. */
static ncclResult_t view_buf(sg_t *sg, int r, const gpu_ptr_export_t *x, char **ptr) {
  char *base = NULL;
  CHECK(tp_peer_mem_map(sg->peers[r].mem, x, &base));
  *ptr = base + x->offset;
  return ncclSuccess;
}

/* Every rank's buffers of each of its calls, mapped here: sg->views[r * SG_CALLS + i] for rank r's call i. */
static ncclResult_t map_views(sg_t *sg, const plan_t *plan, sg_msg_t *const *msgs) {
  const int n = sg->nranks * SG_CALLS;
  if (n > sg->cap_views) {
    sg_view_t *v = realloc(sg->views, (size_t)n * sizeof *v);
    if (v == NULL) return log_err(ncclSystemError, "%s: out of host memory for %d buffer views", sg->name, n);
    sg->views = v;
    sg->cap_views = n;
  }
  for (int r = 0; r < sg->nranks; r++)
    for (int i = 0; i < msgs[r]->ncalls; i++) {
      const sg_call_t *c = &msgs[r]->calls[i];
      sg_view_t *v = &sg->views[r * SG_CALLS + i];
      *v = (sg_view_t){.red = {.kind = (red_kind_t)c->red_kind,
                               .type = (ncclDataType_t)c->type,
                               .fscale = c->fscale,
                               .iscale = c->iscale,
                               .divisor = c->divisor}};
      if (r == 0) {
        v->in = plan->tasks[i].sendbuff;
        v->out = plan->tasks[i].recvbuff;
        continue;
      }
      char *at = NULL;
      if (c->has_in) CHECK(view_buf(sg, r, &c->in, &at));
      v->in = at;
      at = NULL;
      if (c->has_out) CHECK(view_buf(sg, r, &c->out, &at));
      v->out = at;
    }
  return ncclSuccess;
}

/* Why the group goes the ordinary way, in words (the first reason of the rank that gave one). */
static int refusal(const sg_t *sg, const plan_t *plan, sg_msg_t *const *msgs, char *why, size_t len) {
  static const char *const reasons[] = {
      "a buffer is not memory another process can map (only cudaMalloc's and ncclMemAlloc's are)",
      "a call is captured into a CUDA graph", "a PreMulSum factor is in device memory",
      "the group has more than 32 calls"};
  for (int r = 0; r < sg->nranks; r++) {
    for (int b = 0; b < 4; b++)
      if (msgs[r]->refuse & (1u << b)) {
        snprintf(why, len, "on rank %d, %s", r, reasons[b]);
        return (int)(1u << b);
      }
    for (int i = 0; i < msgs[r]->ncalls; i++)
      if (alltoall_overlaps(sg, plan, r, i, &msgs[r]->calls[i])) {
        snprintf(why, len, "on rank %d, an all-to-all is in place", r);
        return 16;
      }
  }
  return 0;
}

/* The leader: every rank's calls, and the verdict in *a. */
static ncclResult_t judge(sg_t *sg, const plan_t *plan, sg_msg_t **msgs, sg_answer_t *a) {
  *a = (sg_answer_t){.magic = SG_MAGIC, .verdict = SG_ORDINARY};
  describe(sg, plan, &sg->mine);
  msgs[0] = &sg->mine;
  for (int r = 1; r < sg->nranks; r++) {
    sg_peer_t *p = &sg->peers[r];
    const tp_mbox_wait_t who = waiting_for(sg, p, "shared-GPU calls");
    CHECK(tp_mbox_recv(p->inbox, &p->msg, &who));
    if (p->msg.magic != SG_MAGIC || p->msg.rank != r)
      return log_err(ncclInternalError, "%s: a malformed shared-GPU message from rank %d", sg->name, r);
    msgs[r] = &p->msg;
  }
  int too_many = 0;
  for (int r = 0; r < sg->nranks; r++) too_many |= (msgs[r]->refuse & SG_TOO_MANY) != 0;
  if (too_many) {
    refusal(sg, plan, msgs, a->why, sizeof a->why);
    return ncclSuccess;
  }
  for (int r = 1; r < sg->nranks; r++)
    if (!collectives_match(msgs[0], msgs[r], a->why, sizeof a->why)) {
      a->verdict = SG_MISMATCH;
      return ncclSuccess;
    }
  if (!p2p_match(msgs, sg->nranks, a->why, sizeof a->why)) {
    a->verdict = SG_MISMATCH;
    return ncclSuccess;
  }
  if (refusal(sg, plan, msgs, a->why, sizeof a->why)) return ncclSuccess;
  if (map_views(sg, plan, msgs) != ncclSuccess) { /* logged */
    snprintf(a->why, sizeof a->why, "rank 0 could not map another rank's buffer");
    return ncclSuccess;
  }
  a->verdict = SG_TAKE;
  return ncclSuccess;
}

static void log_ordinary(const sg_t *sg, const plan_t *plan, const char *why) {
  static _Atomic int said;
  const int lvl = atomic_exchange(&said, 1) ? LOG_TRACE : LOG_INFO;
  LOG_AT(lvl, LOG_TUNING, "%s rank %d: %s (call %llu) goes the ordinary way, not through rank 0: %s",
         sg->name, sg->rank, plan_op_name(plan->tasks[0].kind), (unsigned long long)plan->tasks[0].seq, why);
}

ncclResult_t sg_settle(sg_t *sg, const plan_t *plan, int *take) {
  *take = 0;
  if (sg == NULL) return ncclSuccess;
  sg_answer_t a;
  if (sg->rank == 0) {
    gpu_scope_t scope;
    CHECK(gpu_enter(sg->dev, &scope));
    ncclResult_t res = judge(sg, plan, sg->msgs, &a);
    gpu_leave(&scope);
    CHECK(res);
    for (int r = 1; r < sg->nranks; r++) {
      const tp_mbox_wait_t who = waiting_for(sg, &sg->peers[r], "shared-GPU answer");
      CHECK(tp_mbox_send(sg->peers[r].outbox, &a, &who));
    }
  } else {
    const tp_mbox_wait_t who = waiting_for(sg, &sg->peers[0], "shared-GPU answer");
    CHECK(tp_mbox_recv(sg->peers[0].inbox, &a, &who));
    if (a.magic != SG_MAGIC)
      return log_err(ncclInternalError, "%s: a malformed shared-GPU answer from rank 0", sg->name);
  }
  sg->verdict = a.verdict;
  if (a.verdict == SG_MISMATCH)
    return log_err(ncclInvalidUsage, "%s rank %d: the ranks' calls of this group differ: %s; nothing ran",
                   sg->name, sg->rank, a.why);
  if (a.verdict == SG_ORDINARY) log_ordinary(sg, plan, a.why);
  *take = a.verdict == SG_TAKE;
  return ncclSuccess;
}

ncclResult_t sg_launch(sg_t *sg, gx_t *gx, const plan_t *plan) {
  return sg->rank == 0 ? sg_enqueue_leader(sg, gx, plan) : sg_enqueue_rank(sg, gx, plan);
}

/* ---- Teardown ---- */

/* Waits until this rank's last call on the path has finished: while the watch releases what it may, up to
 * `limit_s`. Returns whether it did. */
static int quiesce(sg_t *sg, double limit_s) {
  const double until = time_now() + limit_s;
  for (uint64_t round = 0; sg->launched; round++) {
    int done = 0;
    if (gpu_event_query(sg->last, &done) != ncclSuccess || done) return 1;
    if (time_now() > until) return 0;
    time_backoff(round);
  }
  return 1;
}

void sg_destroy(sg_t *sg, int aborting) {
  if (sg == NULL) return;
  if (aborting) {
    atomic_store(&sg->aborting, 1);
    sg_gave_up(sg); /* now: the watch may not look again before it stops */
  }
  gpu_scope_t scope;
  const int entered = gpu_enter(sg->dev, &scope) == ncclSuccess;
  int64_t t = param_int(P_BRAID_TIMEOUT_S);
  /* an abort waits a little for the leader's release; then this rank releases its own wait */
  int done = quiesce(sg, aborting ? 5.0 : t > 0 ? 2.0 * (double)t + 1 : 1e9);
  if (!done) {
    atomic_store(&sg->releasing, 1);
    done = quiesce(sg, 1.0);
  }
  if (entered) gpu_leave(&scope);
  sg_watch_stop(sg);
  for (int i = 0; i < sg->npeers; i++) /* the other side's watch stops expecting this rank */
    if (sg->peers[i].words != NULL) sg->peers[i].words->left[sg->rank == 0 ? 0 : 1] = 1;
  if (!done) { /* a stream still waits on words in this memory: it stays */
    WARN("%s rank %d: the last call on the shared-GPU path has not finished; its words stay mapped", sg->name,
         sg->rank);
    return;
  }
  release(sg);
}
