/*
 * Ranks of separate processes on one GPU: the leader's local work over every rank's buffers, and each
 * stream's waits (see shared_gpu.h).
 */
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"
#include "core/shared_gpu_int.h"

int sg_has_in(int kind, int rank, int root) {
  return (kind != OP_BROADCAST && kind != OP_SCATTER && kind != OP_RECV) || rank == root;
}

int sg_has_out(int kind, int rank, int root) {
  return (kind != OP_REDUCE && kind != OP_GATHER && kind != OP_SEND) || rank == root;
}

static const sg_msg_t *msg_of(const sg_t *sg, int r) {
  return r == 0 ? &sg->mine : &sg->peers[r].msg;
}

static sg_view_t *view_of(sg_t *sg, int r, int i) {
  return &sg->views[r * SG_CALLS + i];
}

/* ---- The leader's plan: the group's calls as transfers with no peer ---- */

/* Appends dst = src (flags 0), dst = prepare(src) (XF_PREPARE) or dst = prepare(src) (+) dst (XF_REDUCE);
 * nothing for an empty transfer or a plain copy onto itself. */
static ncclResult_t add(sg_t *sg, const char *src, char *dst, uint64_t bytes, uint32_t flags,
                        const red_t *red) {
  if (bytes == 0 || ((flags & ~(uint32_t)XF_SEQ) == 0 && src == dst)) return ncclSuccess;
  const xfer_t x = {.recv_peer = -1,
                    .send_peer = -1,
                    .src = src,
                    .dst = dst,
                    .bytes = bytes,
                    .esize = (uint32_t)dtype_size(red->type),
                    .flags = flags,
                    .red = red};
  return plan_add_xfer(&sg->local, &x);
}

/* acc = the reduction of every rank's operand at byte `off` of its input, taking rank `first`'s first: in
 * list order (XF_SEQ), each transfer reading what the one before it stored at the same bytes. */
static ncclResult_t reduce_into(sg_t *sg, const int *idx, int first, uint64_t off, char *acc,
                                uint64_t bytes) {
  const sg_view_t *f = view_of(sg, first, idx[first]);
  CHECK(add(sg, f->in + off, acc, bytes, XF_PREPARE | XF_SEQ, &f->red));
  for (int k = 0, n = 0; k < sg->nranks; k++) {
    if (k == first) continue;
    const sg_view_t *v = view_of(sg, k, idx[k]);
    const uint32_t last = ++n == sg->nranks - 1 ? XF_LAST : 0;
    CHECK(add(sg, v->in + off, acc, bytes, XF_REDUCE | XF_PREPARE | XF_SEQ | last, &v->red));
  }
  return ncclSuccess;
}

/* One collective: idx[r] is its index among rank r's calls. */
static ncclResult_t add_collective(sg_t *sg, const sg_call_t *c, const int *idx) {
  const int n = sg->nranks, root = c->root;
  const uint64_t b = c->count * dtype_size((ncclDataType_t)c->type);
#define V(r) view_of(sg, (r), idx[r])
  switch (c->kind) {
  case OP_ALLREDUCE:
    CHECK(reduce_into(sg, idx, 0, 0, V(0)->out, b));
    for (int r = 1; r < n; r++) CHECK(add(sg, V(0)->out, V(r)->out, b, XF_SEQ, &V(r)->red)); /* after it */
    return ncclSuccess;
  case OP_REDUCE:
    return reduce_into(sg, idx, root, 0, V(root)->out, b);
  case OP_REDUCESCATTER:
    for (int r = 0; r < n; r++) CHECK(reduce_into(sg, idx, r, (uint64_t)r * b, V(r)->out, b));
    return ncclSuccess;
  case OP_BROADCAST:
    for (int r = 0; r < n; r++) CHECK(add(sg, V(root)->in, V(r)->out, b, 0, &V(r)->red));
    return ncclSuccess;
  case OP_ALLGATHER:
  case OP_ALLTOALL:
    for (int r = 0; r < n; r++)
      for (int k = 0; k < n; k++) {
        const char *src = V(k)->in + (c->kind == OP_ALLTOALL ? (uint64_t)r * b : 0);
        CHECK(add(sg, src, V(r)->out + (uint64_t)k * b, b, 0, &V(r)->red));
      }
    return ncclSuccess;
  case OP_GATHER:
    for (int k = 0; k < n; k++) CHECK(add(sg, V(k)->in, V(root)->out + (uint64_t)k * b, b, 0, &V(k)->red));
    return ncclSuccess;
  case OP_SCATTER:
    for (int r = 0; r < n; r++) CHECK(add(sg, V(root)->in + (uint64_t)r * b, V(r)->out, b, 0, &V(r)->red));
    return ncclSuccess;
  default:
    return log_err(ncclInternalError, "%s: call kind %d on the shared-GPU path", sg->name, c->kind);
  }
#undef V
}

/* Every send of the group into its receive (the leader checked that each has one, of as many bytes). */
static ncclResult_t add_p2p(sg_t *sg) {
  for (int a = 0; a < sg->nranks; a++) {
    const sg_msg_t *m = msg_of(sg, a);
    for (int i = 0; i < m->ncalls; i++) {
      const sg_call_t *c = &m->calls[i];
      if (c->kind != OP_SEND) continue;
      int n = 0;
      for (int j = 0; j < i; j++) n += m->calls[j].kind == OP_SEND && m->calls[j].root == c->root;
      const sg_msg_t *o = msg_of(sg, c->root);
      for (int j = 0; j < o->ncalls; j++)
        if (o->calls[j].kind == OP_RECV && o->calls[j].root == a && n-- == 0) {
          const uint64_t b = c->count * dtype_size((ncclDataType_t)c->type);
          CHECK(add(sg, view_of(sg, a, i)->in, view_of(sg, c->root, j)->out, b, 0, &view_of(sg, a, i)->red));
          break;
        }
    }
  }
  return ncclSuccess;
}

/* The index of rank r's k-th collective (point-to-point calls aside). */
static int nth_collective(const sg_msg_t *m, int k) {
  for (int i = 0; i < m->ncalls; i++)
    if (m->calls[i].kind != OP_SEND && m->calls[i].kind != OP_RECV && k-- == 0) return i;
  return -1;
}

ncclResult_t sg_build_local(sg_t *sg, const plan_t *plan) {
  plan_t *pl = &sg->local;
  plan_reset(pl);
  for (int i = 0; i < plan->ntasks; i++) CHECK(plan_add_task(pl, &plan->tasks[i]));
  int *idx = sg->idx;
  const task_t *p2p_task = NULL;
  for (int k = 0;; k++) {
    const int i = nth_collective(&sg->mine, k);
    if (i < 0) break;
    for (int r = 0; r < sg->nranks; r++) idx[r] = nth_collective(msg_of(sg, r), k);
    CHECK(plan_open_step(pl, &pl->tasks[i]));
    CHECK(add_collective(sg, &sg->mine.calls[i], idx));
    plan_close_step(pl);
  }
  for (int i = 0; i < plan->ntasks && p2p_task == NULL; i++)
    if (plan->tasks[i].kind == OP_SEND || plan->tasks[i].kind == OP_RECV) p2p_task = &pl->tasks[i];
  CHECK(plan_open_step(pl, p2p_task != NULL ? p2p_task : &pl->tasks[0]));
  CHECK(add_p2p(sg));
  plan_close_step(pl);
  return ncclSuccess;
}

/* ---- The streams ---- */

/* A token for the call's waits, which the watch can name. */
static uint32_t next_token(sg_t *sg, const plan_t *plan) {
  if (++sg->token == 0) sg->token = 1;
  sg->recent[sg->token % SG_RECENT].token = sg->token;
  sg->recent[sg->token % SG_RECENT].seq = plan->tasks[0].seq;
  sg->recent[sg->token % SG_RECENT].kind = (int)plan->tasks[0].kind;
  return sg->token;
}

/* The leader's work on stream s: its waits for every rank's word, then the group's transfers. */
static ncclResult_t leader_work(sg_t *sg, gx_t *gx, const plan_t *plan, cudaStream_t s) {
  CHECK(sg_build_local(sg, plan));
  CHECK(gpu_stream_write32(s, sg->reached_dev, next_token(sg, plan)));
  for (int r = 1; r < sg->nranks; r++) CHECK(gpu_stream_wait32(s, (void *)&sg->peers[r].words_dev->ready, 1));
  for (int r = 1; r < sg->nranks; r++)
    CHECK(gpu_stream_write32(s, (void *)&sg->peers[r].words_dev->ready, 0));
  CHECK(gpu_stream_write32(s, sg->reached_dev, 0));
  if (sg->local.nsteps == 0) return ncclSuccess;
  CHECK(gx_tune(gx, &sg->local));
  CHECK(gx_launch(gx, &sg->local));
  for (int i = 0; i < sg->local.nxfers; i++) /* the cached mappings stay until the work is done */
    for (int r = 1; r < sg->nranks; r++) {
      CHECK(tp_peer_mem_used(sg->peers[r].mem, sg->local.xfers[i].src, s));
      CHECK(tp_peer_mem_used(sg->peers[r].mem, sg->local.xfers[i].dst, s));
    }
  return ncclSuccess;
}

ncclResult_t sg_enqueue_leader(sg_t *sg, gx_t *gx, const plan_t *plan) {
  const cudaStream_t s = plan->tasks[0].stream;
  gpu_scope_t scope;
  CHECK(gpu_enter(sg->dev, &scope));
  ncclResult_t res = gx_order_before(gx, s);
  if (res == ncclSuccess) res = leader_work(sg, gx, plan, s);
  /* the other ranks' streams wait for these, whatever became of the work: a failed call releases them too */
  ncclResult_t raised = ncclSuccess;
  for (int r = 1; r < sg->nranks && raised == ncclSuccess; r++)
    raised = gpu_stream_write32(s, (void *)&sg->peers[r].words_dev->done, 1);
  if (raised == ncclSuccess) raised = gx_order_after(gx, s);
  if (raised == ncclSuccess) raised = gpu_event_record(sg->last, s);
  if (raised == ncclSuccess) sg->launched = 1;
  gpu_leave(&scope);
  if (res == ncclSuccess && raised == ncclSuccess) return ncclSuccess;
  sg_fail(sg, res != ncclSuccess ? res : raised, 1,
          "a call on the shared-GPU path could not be enqueued; the communicator fails");
  for (int r = 1; r < sg->nranks && raised != ncclSuccess; r++) /* nothing will raise them on the stream */
    __atomic_store_n(&sg->peers[r].words->done, 1, __ATOMIC_SEQ_CST);
  return res != ncclSuccess ? res : raised;
}

ncclResult_t sg_enqueue_rank(sg_t *sg, gx_t *gx, const plan_t *plan) {
  const cudaStream_t s = plan->tasks[0].stream;
  sg_words_t *w = sg->peers[0].words_dev;
  gpu_scope_t scope;
  CHECK(gpu_enter(sg->dev, &scope));
  /* one word per rank: a call on another stream must not raise it while the last call's is still up */
  ncclResult_t res = gx_order_before(gx, s);
  if (res == ncclSuccess) res = gx_join_before(gx, plan, s);
  if (res == ncclSuccess) res = gpu_stream_write32(s, (void *)&w->ready, 1);
  if (res == ncclSuccess) res = gpu_stream_write32(s, sg->reached_dev, next_token(sg, plan));
  if (res == ncclSuccess) res = gpu_stream_wait32(s, (void *)&w->done, 1);
  if (res == ncclSuccess) res = gpu_stream_write32(s, (void *)&w->done, 0);
  if (res == ncclSuccess) res = gpu_stream_write32(s, sg->reached_dev, 0);
  if (res == ncclSuccess) res = gx_order_after(gx, s);
  if (res == ncclSuccess) res = gx_join_after(gx, plan);
  if (res == ncclSuccess) res = gpu_event_record(sg->last, s);
  if (res == ncclSuccess) sg->launched = 1;
  gpu_leave(&scope);
  return res;
}
