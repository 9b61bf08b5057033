/*
 * The planner (see plan.h). Rings for all-reduce, reduce-scatter and all-gather; chains along the ring for
 * broadcast and reduce; direct exchanges for all-to-all, gather, scatter and point-to-point. On the GPU
 * executor, small calls of the first five run one-shot (direct) instead. Each collective is one step of
 * pipelined transfers (an in-place all-to-all takes two).
 */
#include "plan.h"

#include <stdio.h>
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
  if (p == NULL)
    return log_err(ncclSystemError, "out of host memory growing the plan's %s to %d", what, cap2);
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
  size_t slice;        /* elements per ring slice */
  size_t scratch_used; /* bytes of staging handed out so far (stage_take) */
  const char **staged; /* [ntasks] where a staged send reads (stage_sends); NULL when none is */
  int whole_blocks;    /* ring blocks are the call's count each (reduce-scatter, all-gather), not count / n */
} ctx_t;

ncclResult_t plan_add_xfer(plan_t *p, const xfer_t *x) {
  if (grow((void **)&p->xfers, &p->cap_xfers, p->nxfers + 1, sizeof(xfer_t), "transfers") != ncclSuccess)
    return ncclSystemError;
  p->xfers[p->nxfers++] = *x;
  return ncclSuccess;
}

static ncclResult_t add(ctx_t *c, int recv_peer, int send_peer, const void *src, void *dst, size_t elems,
                        uint32_t flags) {
  if (elems == 0) return ncclSuccess;
  const xfer_t x = {.recv_peer = recv_peer,
                    .send_peer = send_peer,
                    .src = src,
                    .dst = dst,
                    .bytes = elems * c->esize,
                    .esize = (uint32_t)c->esize,
                    .flags = flags,
                    .red = &c->task->red};
  return plan_add_xfer(c->plan, &x);
}

/* Pointer to element `index` of a buffer. */
static char *at(const void *buf, size_t index, size_t esize) {
  return buf == NULL ? NULL : (char *)buf + index * esize;
}

/* Ring block k of the call: its element count and first element. */
static size_t blk_count(const ctx_t *c, int k) {
  return c->whole_blocks ? c->task->count : block_count(c->task->count, c->nranks, mod(k, c->nranks));
}
static size_t blk_first(const ctx_t *c, int k) {
  return c->whole_blocks ? (size_t)mod(k, c->nranks) * c->task->count
                         : block_offset(c->task->count, c->nranks, mod(k, c->nranks));
}

/* Slice j of ring block k: its element count (0 past the block's end) and a pointer to it in buf. */
static size_t sl(const ctx_t *c, int k, size_t j) {
  size_t n = blk_count(c, k), first = j * c->slice;
  return first >= n ? 0 : (n - first < c->slice ? n - first : c->slice);
}
static char *sl_at(const ctx_t *c, const void *buf, int k, size_t j) {
  return at(buf, blk_first(c, k) + j * c->slice, c->esize);
}

/* Slices needed for the largest ring block. */
static size_t nslices(const ctx_t *c) {
  size_t most = blk_count(c, 0);
  return (most + c->slice - 1) / c->slice;
}

/* Ring all-reduce, slice by slice: a reduce-scatter whose last combine also forwards, then the all-gather, as
 * one chain of transfers through the connection to the next rank. */
static ncclResult_t build_allreduce(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks, next = mod(r + 1, n), prev = mod(r - 1, n);
  const char *in = t->sendbuff;
  char *out = t->recvbuff;
  if (n == 1) return add(c, -1, -1, in, out, t->count, XF_PREPARE | XF_LAST);
  for (size_t j = 0; j < nslices(c); j++) {
    CHECK(add(c, -1, next, sl_at(c, in, r - 1, j), NULL, sl(c, r - 1, j), XF_PREPARE));
    for (int s = 1; s <= n - 2; s++)
      CHECK(add(c, prev, next, sl_at(c, in, r - 1 - s, j), NULL, sl(c, r - 1 - s, j), XF_REDUCE));
    CHECK(add(c, prev, next, sl_at(c, in, r, j), sl_at(c, out, r, j), sl(c, r, j), XF_REDUCE | XF_LAST));
    for (int s = 1; s <= n - 2; s++)
      CHECK(add(c, prev, next, NULL, sl_at(c, out, r - s, j), sl(c, r - s, j), 0));
    CHECK(add(c, prev, -1, NULL, sl_at(c, out, r + 1, j), sl(c, r + 1, j), 0));
  }
  return ncclSuccess;
}

/* Ring reduce-scatter, slice by slice: block k of the result lands on rank k. */
static ncclResult_t build_reducescatter(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks, next = mod(r + 1, n), prev = mod(r - 1, n);
  const char *in = t->sendbuff;
  if (n == 1) return add(c, -1, -1, in, t->recvbuff, t->count, XF_PREPARE | XF_LAST);
  for (size_t j = 0; j < nslices(c); j++) {
    CHECK(add(c, -1, next, sl_at(c, in, r - 1, j), NULL, sl(c, r - 1, j), XF_PREPARE));
    for (int s = 1; s <= n - 2; s++)
      CHECK(add(c, prev, next, sl_at(c, in, r - 1 - s, j), NULL, sl(c, r - 1 - s, j), XF_REDUCE));
    CHECK(add(c, prev, -1, sl_at(c, in, r, j), at(t->recvbuff, j * c->slice, c->esize), sl(c, r, j),
              XF_REDUCE | XF_LAST));
  }
  return ncclSuccess;
}

/* Ring all-gather, slice by slice: each rank's block travels n-1 hops. */
static ncclResult_t build_allgather(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks, next = mod(r + 1, n), prev = mod(r - 1, n);
  char *out = t->recvbuff;
  if (t->sendbuff != sl_at(c, out, r, 0))
    CHECK(add(c, -1, -1, t->sendbuff, sl_at(c, out, r, 0), t->count, 0));
  if (n == 1) return ncclSuccess;
  for (size_t j = 0; j < nslices(c); j++) {
    CHECK(add(c, -1, next, at(t->sendbuff, j * c->slice, c->esize), NULL, sl(c, r, j), 0));
    for (int s = 1; s <= n - 2; s++)
      CHECK(add(c, prev, next, NULL, sl_at(c, out, r - s, j), sl(c, r - s, j), 0));
    CHECK(add(c, prev, -1, NULL, sl_at(c, out, r + 1, j), sl(c, r + 1, j), 0));
  }
  return ncclSuccess;
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

/* Staging is handed out in 16-byte multiples, so every staged buffer starts aligned for the kernels' wide
 * accesses. */
static size_t stage_round(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

/* `bytes` of the staging reserved for this build (reserve_scratch counted them: plan_scratch_need). */
static char *stage_take(ctx_t *c, size_t bytes) {
  char *base = c->plan->ext_scratch != NULL ? c->plan->ext_scratch : c->plan->scratch;
  char *p = base + c->scratch_used;
  c->scratch_used += stage_round(bytes);
  return p;
}

/* Makes sure the plan's scratch holds `bytes`. Called once per build, before any transfer points into it. */
static ncclResult_t scratch(plan_t *p, size_t bytes) {
  if (bytes <= p->scratch_bytes) return ncclSuccess;
  char *s = realloc(p->scratch, bytes);
  if (s == NULL)
    return log_err(ncclSystemError, "out of host memory: %zu bytes of in-place all-to-all staging", bytes);
  p->scratch = s;
  p->scratch_bytes = bytes;
  return ncclSuccess;
}

/* Ends the current step of the call being built and starts another: what follows runs after it. */
static ncclResult_t next_step(ctx_t *c) {
  plan_close_step(c->plan);
  return plan_open_step(c->plan, c->task);
}

/* All-reduce on two ranks as two steps (task_t.split): each rank reduces its half (the peer sends
 * its contribution), then each sends its reduced half to the other, a step of plain copies that the copy
 * engines can move straight into the peer's output (core/ce.h). In place, the second step overwrites the
 * half the first one sent, which is done by then. */
static ncclResult_t split_allreduce(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, p = 1 - r;
  for (size_t j = 0; j < nslices(c); j++) {
    CHECK(add(c, -1, p, sl_at(c, t->sendbuff, p, j), NULL, sl(c, p, j), XF_PREPARE));
    CHECK(add(c, p, -1, sl_at(c, t->sendbuff, r, j), sl_at(c, t->recvbuff, r, j), sl(c, r, j),
              XF_REDUCE | XF_LAST));
  }
  CHECK(next_step(c));
  for (size_t j = 0; j < nslices(c); j++) {
    CHECK(add(c, -1, p, sl_at(c, t->recvbuff, r, j), NULL, sl(c, r, j), 0));
    CHECK(add(c, p, -1, NULL, sl_at(c, t->recvbuff, p, j), sl(c, p, j), 0));
  }
  return ncclSuccess;
}

/* All-to-all: block p goes to rank p directly. In place, the input is first staged so that arriving blocks
 * cannot overwrite blocks not yet sent. */
static ncclResult_t build_alltoall(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks;
  size_t cnt = t->count, es = c->esize;
  const char *in = t->sendbuff;
  if (in == t->recvbuff && n > 1 && cnt > 0) {
    char *stage = stage_take(c, (size_t)n * cnt * es);
    CHECK(add(c, -1, -1, in, stage, (size_t)n * cnt, 0));
    CHECK(next_step(c));
    in = stage;
  }
  if (in != t->recvbuff)
    CHECK(add(c, -1, -1, at(in, (size_t)r * cnt, es), at(t->recvbuff, (size_t)r * cnt, es), cnt, 0));
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
  for (int s = 1; s < n; s++)
    CHECK(add(c, mod(r + s, n), -1, NULL, at(t->recvbuff, (size_t)mod(r + s, n) * cnt, es), cnt, 0));
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
  for (int s = 1; s < n; s++)
    CHECK(add(c, -1, mod(r + s, n), at(t->sendbuff, (size_t)mod(r + s, n) * cnt, es), NULL, cnt, 0));
  return ncclSuccess;
}

/* The k-th send of this rank to itself is matched with its k-th receive from itself. */
static ncclResult_t match_self(ctx_t *c, const task_t *recv) {
  int k = 0;
  for (const task_t *t = c->plan->tasks; t < recv; t++) k += t->kind == OP_RECV && t->root == c->rank;
  for (const task_t *t = c->plan->tasks; t < c->plan->tasks + c->plan->ntasks; t++) {
    if (t->kind != OP_SEND || t->root != c->rank || k-- > 0) continue;
    if (t->count * dtype_size(t->type) != recv->count * dtype_size(recv->type))
      return log_err(ncclInvalidUsage,
                     "rank %d sends %zu bytes to itself but receives %zu bytes from itself (call %lu)",
                     c->rank, t->count * dtype_size(t->type), recv->count * dtype_size(recv->type),
                     (unsigned long)recv->seq);
    return add(c, -1, -1, t->sendbuff, recv->recvbuff, recv->count, 0);
  }
  return log_err(ncclInvalidUsage,
                 "rank %d receives from itself (call %lu) without a matching send to itself in the group",
                 c->rank, (unsigned long)recv->seq);
}

/* A send to self moves with its receive (match_self); one without a receive would drop its data. */
static ncclResult_t check_self_send(ctx_t *c, const task_t *send) {
  int k = 0, recvs = 0;
  for (const task_t *t = c->plan->tasks; t < send; t++) k += t->kind == OP_SEND && t->root == c->rank;
  for (const task_t *t = c->plan->tasks; t < c->plan->tasks + c->plan->ntasks; t++)
    recvs += t->kind == OP_RECV && t->root == c->rank;
  if (k < recvs) return ncclSuccess;
  return log_err(ncclInvalidUsage,
                 "rank %d sends %zu bytes to itself (call %lu) without a matching receive from itself in the "
                 "group",
                 c->rank, send->count * dtype_size(send->type), (unsigned long)send->seq);
}

/* Whether send `t` to another rank reads bytes that a receive of its group overwrites (an in-place exchange):
 * the two run in different lanes at once, and the peer's data may land before the send has read them, so the
 * send reads a copy staged in a step before. */
/* The bytes [lo, hi) that span every receive of the plan (lo == hi: none), so that a send outside them is
 * passed in one test. */
typedef struct {
  uintptr_t lo, hi;
} span_t;

static span_t recv_span(const plan_t *plan) {
  span_t sp = {UINTPTR_MAX, 0};
  for (int i = 0; i < plan->ntasks; i++) {
    const task_t *u = &plan->tasks[i];
    const uintptr_t a = (uintptr_t)u->recvbuff, n = u->count * dtype_size(u->type);
    if (u->kind != OP_RECV || n == 0) continue;
    if (a < sp.lo) sp.lo = a;
    if (a + n > sp.hi) sp.hi = a + n;
  }
  return sp.lo < sp.hi ? sp : (span_t){0, 0};
}

static int send_staged(const plan_t *plan, span_t sp, const task_t *t, int rank) {
  if (t->kind != OP_SEND || t->root == rank || t->count == 0) return 0;
  const size_t bytes = t->count * dtype_size(t->type);
  if (!plan_overlap((const void *)sp.lo, sp.hi - sp.lo, t->sendbuff, bytes)) return 0;
  for (int i = 0; i < plan->ntasks; i++) {
    const task_t *u = &plan->tasks[i];
    if (u->kind == OP_RECV && plan_overlap(t->sendbuff, bytes, u->recvbuff, u->count * dtype_size(u->type)))
      return 1;
  }
  return 0;
}

/* The copies of the staged sends (send_staged), in one step before the point-to-point step. */
static ncclResult_t stage_sends(ctx_t *c) {
  plan_t *plan = c->plan;
  const span_t sp = recv_span(plan);
  int opened = 0;
  for (int i = 0; i < plan->ntasks; i++) {
    const task_t *t = &plan->tasks[i];
    if (!send_staged(plan, sp, t, c->rank)) continue;
    if (c->staged == NULL && (c->staged = calloc((size_t)plan->ntasks, sizeof *c->staged)) == NULL)
      return log_err(ncclSystemError, "out of host memory for the staged sends of %d calls", plan->ntasks);
    if (!opened) CHECK(plan_open_step(plan, t));
    opened = 1;
    c->task = t;
    c->esize = dtype_size(t->type);
    char *stage = stage_take(c, t->count * c->esize);
    c->staged[i] = stage;
    CHECK(add(c, -1, -1, t->sendbuff, stage, t->count, 0));
  }
  if (opened) plan_close_step(plan);
  return ncclSuccess;
}

/* Point-to-point calls: a send or a receive each; sends to self are matched with receives from self. */
static ncclResult_t build_p2p(ctx_t *c) {
  const task_t *t = c->task;
  const char *staged = c->staged != NULL ? c->staged[t - c->plan->tasks] : NULL;
  if (t->root != c->rank)
    return t->kind == OP_SEND ? add(c, -1, t->root, staged != NULL ? staged : t->sendbuff, NULL, t->count, 0)
                              : add(c, t->root, -1, NULL, t->recvbuff, t->count, 0);
  return t->kind == OP_RECV ? match_self(c, t) : check_self_send(c, t);
}

/* ---- One-shot algorithms (GPU executor) ----
 *
 * Every rank sends its data straight to the ranks that need it, in one hop. A reduced block is computed by
 * each rank that needs it from all n contributions, always in rank order, ((x0 (+) x1) (+) x2) (+) ...,
 * each contribution prepared by its owner (PreMulSum scales) and each combine commutative for the
 * operations that come here (the tuner, core/tune.c), so every rank that computes a block computes the same
 * bits. The combines form one lane (XF_SEQ): each reads the running result the one before stored in `out`.
 * Sends run in lanes of their own unless they read what that lane overwrites (an in-place all-reduce). */

/* Stores into `out` the reduction of `count` elements of every rank in rank order: this rank's `own` (raw),
 * the others' arriving prepared. Ranks 0 and 1 start with the combine of their own data and the other's;
 * a rank from 2 on starts from rank 0's data and combines its own at its turn. When `own` is `out` (in
 * place) such a rank first copies it to staging, since by its turn `out` holds the running result. */
static ncclResult_t reduce_direct(ctx_t *c, const char *own, char *out, size_t count) {
  int r = c->rank, n = c->nranks;
  if (r <= 1) {
    CHECK(add(c, 1 - r, -1, own, out, count, XF_REDUCE | XF_SEQ | (n == 2 ? XF_LAST : 0)));
  } else {
    if (own == out) {
      char *stage = stage_take(c, count * c->esize);
      CHECK(add(c, -1, -1, own, stage, count, XF_SEQ));
      own = stage;
    }
    CHECK(add(c, 0, -1, NULL, out, count, XF_SEQ));
    CHECK(add(c, 1, -1, out, out, count, XF_REDUCE | XF_PREPARED | XF_SEQ));
  }
  for (int k = 2; k < n; k++) {
    uint32_t last = k == n - 1 ? XF_LAST : 0;
    if (k == r)
      CHECK(add(c, -1, -1, own, out, count, XF_REDUCE | XF_SEQ | last));
    else
      CHECK(add(c, k, -1, out, out, count, XF_REDUCE | XF_PREPARED | XF_SEQ | last));
  }
  return ncclSuccess;
}

/* One-shot all-reduce: the whole input to every peer, then the reduction of all of them. In place, the sends
 * read what the reduction overwrites: they go first, in its lane. */
static ncclResult_t oneshot_allreduce(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks;
  uint32_t seq = t->sendbuff == t->recvbuff ? XF_SEQ : 0;
  for (int s = 1; s < n; s++) CHECK(add(c, -1, (r + s) % n, t->sendbuff, NULL, t->count, XF_PREPARE | seq));
  return reduce_direct(c, t->sendbuff, t->recvbuff, t->count);
}

/* One-shot reduce-scatter: block q of the input to rank q, then the reduction of block `rank` of everyone.
 * In place the output is this rank's own block, which no send reads. */
static ncclResult_t oneshot_reducescatter(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks;
  for (int s = 1; s < n; s++) {
    int q = (r + s) % n;
    CHECK(add(c, -1, q, at(t->sendbuff, (size_t)q * t->count, c->esize), NULL, t->count, XF_PREPARE));
  }
  return reduce_direct(c, at(t->sendbuff, (size_t)r * t->count, c->esize), t->recvbuff, t->count);
}

/* One-shot reduce: every other rank sends its input to the root, which reduces them all. */
static ncclResult_t oneshot_reduce(ctx_t *c) {
  const task_t *t = c->task;
  if (c->rank != t->root) return add(c, -1, t->root, t->sendbuff, NULL, t->count, XF_PREPARE);
  return reduce_direct(c, t->sendbuff, t->recvbuff, t->count);
}

/* One-shot all-gather: this rank's block to every peer, and every peer's block from it. */
static ncclResult_t oneshot_allgather(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks;
  size_t cnt = t->count, es = c->esize;
  char *out = t->recvbuff;
  if (t->sendbuff != at(out, (size_t)r * cnt, es))
    CHECK(add(c, -1, -1, t->sendbuff, at(out, (size_t)r * cnt, es), cnt, 0));
  for (int s = 1; s < n; s++) {
    int to = (r + s) % n, from = mod(r - s, n);
    CHECK(add(c, -1, to, t->sendbuff, NULL, cnt, 0));
    CHECK(add(c, from, -1, NULL, at(out, (size_t)from * cnt, es), cnt, 0));
  }
  return ncclSuccess;
}

/* One-shot broadcast: the root sends to every rank directly. */
static ncclResult_t oneshot_broadcast(ctx_t *c) {
  const task_t *t = c->task;
  int r = c->rank, n = c->nranks;
  if (r != t->root) return add(c, t->root, -1, NULL, t->recvbuff, t->count, 0);
  if (t->sendbuff != t->recvbuff) CHECK(add(c, -1, -1, t->sendbuff, t->recvbuff, t->count, 0));
  for (int s = 1; s < n; s++) CHECK(add(c, -1, (r + s) % n, t->sendbuff, NULL, t->count, 0));
  return ncclSuccess;
}

typedef ncclResult_t (*build_fn_t)(ctx_t *c);
static const build_fn_t oneshot_builders[OP_COUNT] = {
    [OP_ALLREDUCE] = oneshot_allreduce,
    [OP_BROADCAST] = oneshot_broadcast,
    [OP_REDUCE] = oneshot_reduce,
    [OP_ALLGATHER] = oneshot_allgather,
    [OP_REDUCESCATTER] = oneshot_reducescatter,
};
static const build_fn_t builders[OP_COUNT] = {
    [OP_ALLREDUCE] = build_allreduce,
    [OP_BROADCAST] = build_broadcast,
    [OP_REDUCE] = build_reduce,
    [OP_ALLGATHER] = build_allgather,
    [OP_REDUCESCATTER] = build_reducescatter,
    [OP_ALLTOALL] = build_alltoall,
    [OP_GATHER] = build_gather,
    [OP_SCATTER] = build_scatter,
    [OP_SEND] = build_p2p,
    [OP_RECV] = build_p2p,
};

ncclResult_t plan_open_step(plan_t *p, const task_t *task) {
  if (grow((void **)&p->steps, &p->cap_steps, p->nsteps + 1, sizeof(step_t), "steps") != ncclSuccess)
    return ncclSystemError;
  p->steps[p->nsteps++] = (step_t){.first = p->nxfers, .count = 0, .task = task};
  return ncclSuccess;
}

void plan_close_step(plan_t *p) {
  step_t *s = &p->steps[p->nsteps - 1];
  s->count = p->nxfers - s->first;
  if (s->count == 0) p->nsteps--;
}

/* ---- Algorithm selection ---- */

const char *plan_algo_name(plan_algo_t algo) {
  static const char *names[ALGO_COUNT] = {"Ring", "OneShot"};
  return (unsigned)algo < ALGO_COUNT ? names[algo] : "?";
}

int plan_call_is_noop(const task_t *t, int nranks) {
  return nranks == 1 && t->sendbuff == t->recvbuff && t->kind != OP_SEND && t->kind != OP_RECV &&
         (int)t->op >= 0 && (int)t->op <= (int)ncclAvg;
}

uint64_t plan_call_bytes(const task_t *t, int nranks) {
  uint64_t bytes = (uint64_t)t->count * dtype_size(t->type);
  return t->kind == OP_ALLGATHER || t->kind == OP_REDUCESCATTER ? bytes * (uint64_t)nranks : bytes;
}

/* ---- Building ---- */

/* Staging task `t` of `plan` takes on `rank`: an in-place all-to-all's input; the own contribution of an
 * in-place one-shot reduction on ranks from 2 on (reduce_direct); a send an in-place exchange overwrites
 * (send_staged). */
static size_t task_stage(const plan_t *plan, span_t sp, const task_t *t, int rank, int nranks, int tuned) {
  size_t bytes = t->count * dtype_size(t->type);
  if (nranks <= 1 || t->count == 0) return 0;
  if (t->kind == OP_SEND) return send_staged(plan, sp, t, rank) ? stage_round(bytes) : 0;
  if (t->kind == OP_ALLTOALL) return t->sendbuff == t->recvbuff ? stage_round((size_t)nranks * bytes) : 0;
  if (rank < 2 || !tuned || oneshot_builders[t->kind] == NULL || t->algo != ALGO_ONESHOT) return 0;
  const char *own = t->kind == OP_REDUCESCATTER
                        ? at(t->sendbuff, (size_t)rank * t->count, dtype_size(t->type))
                        : t->sendbuff;
  int reduced_here =
      t->kind == OP_ALLREDUCE || t->kind == OP_REDUCESCATTER || (t->kind == OP_REDUCE && t->root == rank);
  return reduced_here && own == (const char *)t->recvbuff ? stage_round(bytes) : 0;
}

size_t plan_scratch_need(const plan_t *plan, int rank, int nranks, int tuned) {
  size_t need = 0;
  const span_t sp = recv_span(plan);
  for (int i = 0; i < plan->ntasks; i++) need += task_stage(plan, sp, &plan->tasks[i], rank, nranks, tuned);
  return need;
}

/* Staging the plan's calls need, reserved before any transfer points into it. */
static ncclResult_t reserve_scratch(plan_t *plan, int rank, int nranks, int tuned) {
  size_t need = plan_scratch_need(plan, rank, nranks, tuned);
  if (plan->ext_scratch != NULL)
    return need <= plan->ext_scratch_bytes
               ? ncclSuccess
               : log_err(ncclInternalError,
                         "in-place all-to-all and one-shot reductions need %zu bytes of staging; %zu were "
                         "provided",
                         need, plan->ext_scratch_bytes);
  return scratch(plan, need);
}

/* The builder of call `t`: a ring (or chain, or the only algorithm there is), or as the tuner chose. */
static build_fn_t builder_of(const task_t *t, int nranks, int tuned) {
  if (!tuned) return builders[t->kind];
  if (t->algo == ALGO_ONESHOT && oneshot_builders[t->kind] != NULL) return oneshot_builders[t->kind];
  if (t->split && t->kind == OP_ALLREDUCE && nranks == 2) return split_allreduce;
  return builders[t->kind];
}

/* Collectives in call order, one step each (an in-place all-to-all takes two); then all point-to-point calls
 * together in one last step (after one of staged sends, stage_sends). */
static ncclResult_t build_steps(ctx_t *c, size_t slice_bytes, int tuned) {
  plan_t *plan = c->plan;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) CHECK(stage_sends(c));
    int p2p_open = 0;
    for (int i = 0; i < plan->ntasks; i++) {
      const task_t *t = &plan->tasks[i];
      int is_p2p = t->kind == OP_SEND || t->kind == OP_RECV;
      if (is_p2p != pass) continue;
      if (!is_p2p || !p2p_open) CHECK(plan_open_step(plan, t));
      p2p_open = is_p2p;
      c->task = t;
      c->esize = dtype_size(t->type);
      c->slice = slice_bytes / c->esize > 0 ? slice_bytes / c->esize : 1;
      c->whole_blocks = t->kind == OP_REDUCESCATTER || t->kind == OP_ALLGATHER;
      const build_fn_t build = builder_of(t, c->nranks, tuned);
      plan->steps[plan->nsteps - 1].oneshot = build == oneshot_builders[t->kind];
      CHECK(build(c));
      if (!is_p2p) plan_close_step(plan);
    }
    if (p2p_open) plan_close_step(plan);
  }
  return ncclSuccess;
}

ncclResult_t plan_build(plan_t *plan, int rank, int nranks, size_t slice_bytes, int tuned) {
  plan->nxfers = plan->nsteps = 0;
  ctx_t c = {.plan = plan, .rank = rank, .nranks = nranks};
  CHECK(reserve_scratch(plan, rank, nranks, tuned));
  ncclResult_t res = build_steps(&c, slice_bytes, tuned);
  free(c.staged);
  return res;
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
