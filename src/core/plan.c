/*
 * The planner (see plan.h). Host algorithms: rings for all-reduce, reduce-scatter and all-gather; chains
 * along the ring for broadcast and reduce; direct exchanges for all-to-all, gather, scatter and
 * point-to-point. Each collective is one step of pipelined transfers.
 */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"

/* Grows an array of `*cap` elements of `size` bytes to hold at least `need`. */
static ncclResult_t grow(void **array, int *cap, int need, size_t size, const char *what) {
  if (need <= *cap) return ncclSuccess;
  int cap2 = *cap > 0 ? *cap : 16;
  while (cap2 < need) cap2 *= 2;
  void *p = realloc(*array, (size_t)cap2 * size);
  if (p == NULL) return log_err(ncclSystemError, "out of host memory growing the plan's %s to %d", what, cap2);
  *array = p;
  *cap = cap2;
  return ncclSuccess;
}

ncclResult_t plan_add_task(plan_t *plan, const task_t *task) {
  if (grow((void **)&plan->tasks, &plan->cap_tasks, plan->ntasks + 1, sizeof(task_t), "tasks") != ncclSuccess)
    return ncclSystemError;
  plan->tasks[plan->ntasks++] = *task;
  return ncclSuccess;
}

void plan_reset(plan_t *plan) {
  plan->ntasks = plan->nxfers = plan->nsteps = 0;
}

void plan_free(plan_t *plan) {
  free(plan->tasks);
  free(plan->xfers);
  free(plan->steps);
  free(plan->scratch);
  memset(plan, 0, sizeof *plan);
}

const char *plan_op_name(op_kind_t kind) {
  static const char *names[OP_COUNT] = {"AllReduce", "Broadcast", "Reduce",  "AllGather", "ReduceScatter",
                                        "AlltoAll",  "Gather",    "Scatter", "Send",      "Recv"};
  return (unsigned)kind < OP_COUNT ? names[kind] : "?";
}

static int mod(int a, int n) {
  return ((a % n) + n) % n;
}

/* Elements of block k when `count` elements are cut into n nearly equal blocks, and where block k starts. */
static size_t block_count(size_t count, int n, int k) {
  return count / n + ((size_t)k < count % n);
}
static size_t block_offset(size_t count, int n, int k) {
  size_t rem = count % n;
  return (size_t)k * (count / n) + ((size_t)k < rem ? (size_t)k : rem);
}

/* The builder's cursor: the plan, the task, and this rank's place. */
typedef struct {
  plan_t *plan;
  const task_t *task;
  int rank, nranks;
  size_t esize;
} ctx_t;

static ncclResult_t add(ctx_t *c, int recv_peer, int send_peer, const void *src, void *dst, size_t elems,
                        uint32_t flags) {
  plan_t *p = c->plan;
  if (elems == 0) return ncclSuccess;
  if (grow((void **)&p->xfers, &p->cap_xfers, p->nxfers + 1, sizeof(xfer_t), "transfers") != ncclSuccess)
    return ncclSystemError;
  p->xfers[p->nxfers++] = (xfer_t){.recv_peer = recv_peer,
                                   .send_peer = send_peer,
                                   .src = src,
                                   .dst = dst,
                                   .bytes = elems * c->esize,
                                   .esize = (uint32_t)c->esize,
                                   .flags = flags,
                                   .red = &c->task->red};
  return ncclSuccess;
}

/* Pointer to element `index` of a buffer. */
static char *at(const void *buf, size_t index, size_t esize) {
  return (char *)buf + index * esize;
}

/* Elements of ring block k of the call, and a pointer to where it starts in buf. */
static size_t blk(const ctx_t *c, int k) {
  return block_count(c->task->count, c->nranks, mod(k, c->nranks));
}
static char *blk_at(const ctx_t *c, const void *buf, int k) {
  return at(buf, block_offset(c->task->count, c->nranks, mod(k, c->nranks)), c->esize);
}

/* Ring all-reduce: a reduce-scatter whose last combine also forwards, then the all-gather, as one chain of
 * transfers through the connection to the next rank. */
static ncclResult_t build_allreduce(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks, next = mod(r + 1, n), prev = mod(r - 1, n);
  const char *in = t->sendbuff;
  char *out = t->recvbuff;
  if (n == 1) return add(c, -1, -1, in, out, t->count, XF_PREPARE | XF_LAST);
  CHECK(add(c, -1, next, blk_at(c, in, r - 1), NULL, blk(c, r - 1), XF_PREPARE));
  for (int s = 1; s <= n - 2; s++) CHECK(add(c, prev, next, blk_at(c, in, r - 1 - s), NULL, blk(c, r - 1 - s), XF_REDUCE));
  CHECK(add(c, prev, next, blk_at(c, in, r), blk_at(c, out, r), blk(c, r), XF_REDUCE | XF_LAST));
  for (int s = 1; s <= n - 2; s++) CHECK(add(c, prev, next, NULL, blk_at(c, out, r - s), blk(c, r - s), 0));
  return add(c, prev, -1, NULL, blk_at(c, out, r + 1), blk(c, r + 1), 0);
}

/* Ring reduce-scatter: block k of the result lands on rank k. */
static ncclResult_t build_reducescatter(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks, next = mod(r + 1, n), prev = mod(r - 1, n);
  size_t cnt = t->count, es = c->esize;
  const char *in = t->sendbuff;
  if (n == 1) return add(c, -1, -1, in, t->recvbuff, cnt, XF_PREPARE | XF_LAST);
  CHECK(add(c, -1, next, at(in, (size_t)mod(r - 1, n) * cnt, es), NULL, cnt, XF_PREPARE));
  for (int s = 1; s <= n - 2; s++)
    CHECK(add(c, prev, next, at(in, (size_t)mod(r - 1 - s, n) * cnt, es), NULL, cnt, XF_REDUCE));
  return add(c, prev, -1, at(in, (size_t)r * cnt, es), t->recvbuff, cnt, XF_REDUCE | XF_LAST);
}

/* Ring all-gather: each rank's block travels n-1 hops. */
static ncclResult_t build_allgather(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks, next = mod(r + 1, n), prev = mod(r - 1, n);
  size_t cnt = t->count, es = c->esize;
  char *out = t->recvbuff;
  if (t->sendbuff != at(out, (size_t)r * cnt, es)) CHECK(add(c, -1, -1, t->sendbuff, at(out, (size_t)r * cnt, es), cnt, 0));
  if (n == 1) return ncclSuccess;
  CHECK(add(c, -1, next, t->sendbuff, NULL, cnt, 0));
  for (int s = 1; s <= n - 2; s++) CHECK(add(c, prev, next, NULL, at(out, (size_t)mod(r - s, n) * cnt, es), cnt, 0));
  return add(c, prev, -1, NULL, at(out, (size_t)mod(r + 1, n) * cnt, es), cnt, 0);
}

/* Chain broadcast along the ring, starting at the root. */
static ncclResult_t build_broadcast(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks, next = mod(r + 1, n), prev = mod(r - 1, n);
  int pos = mod(r - t->root, n);
  if (pos == 0) {
    if (t->sendbuff != t->recvbuff) CHECK(add(c, -1, -1, t->sendbuff, t->recvbuff, t->count, 0));
    return n > 1 ? add(c, -1, next, t->sendbuff, NULL, t->count, 0) : ncclSuccess;
  }
  return add(c, prev, pos < n - 1 ? next : -1, NULL, t->recvbuff, t->count, 0);
}

/* Chain reduce along the ring, ending at the root. */
static ncclResult_t build_reduce(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks, next = mod(r + 1, n), prev = mod(r - 1, n);
  int pos = mod(r - t->root - 1, n); /* 0: first link of the chain; n-1: the root */
  if (n == 1) return add(c, -1, -1, t->sendbuff, t->recvbuff, t->count, XF_PREPARE | XF_LAST);
  if (pos == 0) return add(c, -1, next, t->sendbuff, NULL, t->count, XF_PREPARE);
  if (pos < n - 1) return add(c, prev, next, t->sendbuff, NULL, t->count, XF_REDUCE);
  return add(c, prev, -1, t->sendbuff, t->recvbuff, t->count, XF_REDUCE | XF_LAST);
}

/* Makes sure the plan's scratch holds `bytes`. */
static ncclResult_t scratch(plan_t *p, size_t bytes) {
  if (bytes <= p->scratch_bytes) return ncclSuccess;
  char *s = realloc(p->scratch, bytes);
  if (s == NULL) return log_err(ncclSystemError, "out of host memory: %zu bytes of in-place all-to-all staging", bytes);
  p->scratch = s;
  p->scratch_bytes = bytes;
  return ncclSuccess;
}

/* All-to-all: block p goes to rank p directly. In place, the input is first staged so that arriving blocks
 * cannot overwrite blocks not yet sent. */
static ncclResult_t build_alltoall(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks;
  size_t cnt = t->count, es = c->esize;
  const char *in = t->sendbuff;
  if (in == t->recvbuff && n > 1) {
    CHECK(scratch(c->plan, (size_t)n * cnt * es));
    memcpy(c->plan->scratch, in, (size_t)n * cnt * es);
    in = c->plan->scratch;
  }
  if (in != t->recvbuff) CHECK(add(c, -1, -1, at(in, (size_t)r * cnt, es), at(t->recvbuff, (size_t)r * cnt, es), cnt, 0));
  for (int s = 1; s < n; s++) {
    int to = mod(r + s, n), from = mod(r - s, n);
    CHECK(add(c, -1, to, at(in, (size_t)to * cnt, es), NULL, cnt, 0));
    CHECK(add(c, from, -1, NULL, at(t->recvbuff, (size_t)from * cnt, es), cnt, 0));
  }
  return ncclSuccess;
}

/* Gather: every rank sends its block straight to the root. */
static ncclResult_t build_gather(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks;
  size_t cnt = t->count, es = c->esize;
  if (r != t->root) return add(c, -1, t->root, t->sendbuff, NULL, cnt, 0);
  if (t->sendbuff != at(t->recvbuff, (size_t)r * cnt, es))
    CHECK(add(c, -1, -1, t->sendbuff, at(t->recvbuff, (size_t)r * cnt, es), cnt, 0));
  for (int s = 1; s < n; s++) CHECK(add(c, mod(r + s, n), -1, NULL, at(t->recvbuff, (size_t)mod(r + s, n) * cnt, es), cnt, 0));
  return ncclSuccess;
}

/* Scatter: the root sends block p straight to rank p. */
static ncclResult_t build_scatter(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks;
  size_t cnt = t->count, es = c->esize;
  if (r != t->root) return add(c, t->root, -1, NULL, t->recvbuff, cnt, 0);
  if (at(t->sendbuff, (size_t)r * cnt, es) != t->recvbuff)
    CHECK(add(c, -1, -1, at(t->sendbuff, (size_t)r * cnt, es), t->recvbuff, cnt, 0));
  for (int s = 1; s < n; s++) CHECK(add(c, -1, mod(r + s, n), at(t->sendbuff, (size_t)mod(r + s, n) * cnt, es), NULL, cnt, 0));
  return ncclSuccess;
}

/* The k-th send of this rank to itself is matched with its k-th receive from itself. */
static ncclResult_t match_self(ctx_t *c, const task_t *recv) {
  int k = 0;
  for (const task_t *t = c->plan->tasks; t < recv; t++) k += t->kind == OP_RECV && t->root == c->rank;
  for (const task_t *t = c->plan->tasks; t < c->plan->tasks + c->plan->ntasks; t++) {
    if (t->kind != OP_SEND || t->root != c->rank || k-- > 0) continue;
    if (t->count * dtype_size(t->type) != recv->count * dtype_size(recv->type))
      return log_err(ncclInvalidUsage, "rank %d sends %zu bytes to itself but receives %zu bytes from itself (call %lu)",
                     c->rank, t->count * dtype_size(t->type), recv->count * dtype_size(recv->type), (unsigned long)recv->seq);
    return add(c, -1, -1, t->sendbuff, recv->recvbuff, recv->count, 0);
  }
  return log_err(ncclInvalidUsage, "rank %d receives from itself (call %lu) without a matching send to itself in the group",
                 c->rank, (unsigned long)recv->seq);
}

/* Point-to-point calls: a send or a receive each; sends to self are matched with receives from self. */
static ncclResult_t build_p2p(ctx_t *c) {
  const task_t *t = c->task;
  if (t->root != c->rank)
    return t->kind == OP_SEND ? add(c, -1, t->root, t->sendbuff, NULL, t->count, 0)
                              : add(c, t->root, -1, NULL, t->recvbuff, t->count, 0);
  return t->kind == OP_RECV ? match_self(c, t) : ncclSuccess;
}

typedef ncclResult_t (*build_fn_t)(ctx_t *c);
static const build_fn_t builders[OP_COUNT] = {
    [OP_ALLREDUCE] = build_allreduce, [OP_BROADCAST] = build_broadcast,         [OP_REDUCE] = build_reduce,
    [OP_ALLGATHER] = build_allgather, [OP_REDUCESCATTER] = build_reducescatter, [OP_ALLTOALL] = build_alltoall,
    [OP_GATHER] = build_gather,       [OP_SCATTER] = build_scatter,             [OP_SEND] = build_p2p,
    [OP_RECV] = build_p2p,
};

static ncclResult_t open_step(plan_t *p, const task_t *task) {
  if (grow((void **)&p->steps, &p->cap_steps, p->nsteps + 1, sizeof(step_t), "steps") != ncclSuccess)
    return ncclSystemError;
  p->steps[p->nsteps++] = (step_t){.first = p->nxfers, .count = 0, .task = task};
  return ncclSuccess;
}

static void close_step(plan_t *p) {
  step_t *s = &p->steps[p->nsteps - 1];
  s->count = p->nxfers - s->first;
  if (s->count == 0) p->nsteps--;
}

/* Collectives in call order, one step each; then all point-to-point calls together in one last step. */
ncclResult_t plan_build(plan_t *plan, int rank, int nranks) {
  plan->nxfers = plan->nsteps = 0;
  ctx_t c = {.plan = plan, .rank = rank, .nranks = nranks};
  for (int pass = 0; pass < 2; pass++) {
    int p2p_open = 0;
    for (int i = 0; i < plan->ntasks; i++) {
      const task_t *t = &plan->tasks[i];
      int is_p2p = t->kind == OP_SEND || t->kind == OP_RECV;
      if (is_p2p != pass) continue;
      if (!is_p2p || !p2p_open) CHECK(open_step(plan, t));
      p2p_open = is_p2p;
      c.task = t;
      c.esize = dtype_size(t->type);
      CHECK(builders[t->kind](&c));
      if (!is_p2p) close_step(plan);
    }
    if (p2p_open) close_step(plan);
  }
  return ncclSuccess;
}

double plan_estimate_us(const plan_t *plan, int nranks) {
  const double latency_us = 5.0, bytes_per_us = 2000.0; /* host shared memory: ~5 us a hop, ~2 GB/s */
  double us = 0;
  for (int s = 0; s < plan->nsteps; s++) {
    const step_t *st = &plan->steps[s];
    size_t bytes = 0;
    for (int i = 0; i < st->count; i++) bytes += plan->xfers[st->first + i].bytes;
    us += latency_us * (nranks > 1 ? nranks - 1 : 1) + bytes / bytes_per_us;
  }
  return us;
}
