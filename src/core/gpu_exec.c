/*
 * The GPU executor (see gpu_exec.h): its state on the device, its launches' order and storage, and the same
 * calls launched again. The work a launch carries is built in gpu_work.c, graphs' storage and retired
 * executors are gpu_graphs.c's.
 *
 * Launches of one communicator are ordered even when the calls come on different streams: each launch waits
 * for the event recorded after the previous one. Inside CUDA graph capture the ordering is the graph's.
 *
 * Work storage. Eager launches whose list spills take an entry of the communicator's work queue (workq.h): a
 * header in host-mapped memory the kernel writes when done, and the spill, staged in page-locked memory and
 * copied in stream order to the queue's device copy. Captured launches take nothing from the queue
 * (gpu_graphs.c).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "base/watchdog.h"
#include "core/gpu_exec_int.h"

/* Byte offsets of the parts of the device allocation (dev_comm_t's tables). */
typedef struct {
  size_t send, recv, sent, recvd, heads, ll_send, ll_recv, ll_sent, ll_recvd, ll_heads, barrier, guards,
      total;
} layout_t;

static layout_t layout(int nranks, int nch) {
  layout_t l;
  size_t rings = (size_t)nranks * nch, ll_rings = (size_t)nranks * DEV_LL_CHANNELS;
  l.send = 0;
  l.recv = l.send + rings * sizeof(dev_ring_t);
  l.sent = l.recv + rings * sizeof(dev_ring_t);
  l.recvd = l.sent + rings * sizeof(uint64_t);
  l.heads = l.recvd + rings * sizeof(uint64_t);
  l.ll_send = l.heads + rings * sizeof(uint64_t);
  l.ll_recv = l.ll_send + ll_rings * sizeof(dev_ring_t);
  l.ll_sent = l.ll_recv + ll_rings * sizeof(dev_ring_t);
  l.ll_recvd = l.ll_sent + ll_rings * sizeof(uint64_t);
  l.ll_heads = l.ll_recvd + ll_rings * sizeof(uint64_t);
  l.barrier = l.ll_heads + ll_rings * sizeof(uint64_t);
  l.guards = l.barrier + (2 + DEV_DEALT_COUNTERS) * sizeof(uint32_t);
  l.total = l.guards + (nranks == 2 ? rings * DEV_MARKS_BYTES : 0); /* split lanes take two ranks (flush) */
  return l;
}

/* The kernels' view of the communicator: its tables written once to device memory, the dev_comm_t that
 * points at them kept for the launches. */
static ncclResult_t upload(gx_t *gx, links_t *links) {
  layout_t l = layout(gx->nranks, gx->rings);
  char *base = gpu_mem_ptr(gx->mem);
  char *img = calloc(1, l.total);
  if (img == NULL) return log_err(ncclSystemError, "%s: out of host memory (%zu bytes)", gx->name, l.total);
  dev_ring_t *send = (dev_ring_t *)(img + l.send), *recv = (dev_ring_t *)(img + l.recv);
  dev_ring_t *ll_send = (dev_ring_t *)(img + l.ll_send), *ll_recv = (dev_ring_t *)(img + l.ll_recv);
  for (int p = 0; p < gx->nranks; p++) {
    tp_conn_t *s = links->send[p], *r = links->recv[p];
    for (int c = 0; c < DEV_LL_CHANNELS; c++) {
      if (s != NULL) ll_send[p * DEV_LL_CHANNELS + c] = s->ll[c];
      if (r != NULL) ll_recv[p * DEV_LL_CHANNELS + c] = r->ll[c];
    }
    for (int c = 0; c < gx->rings; c++) {
      if (s != NULL && c < s->nrings) send[p * gx->rings + c] = s->rings[c];
      if (r != NULL && c < r->nrings) recv[p * gx->rings + c] = r->rings[c];
    }
    gx->peer_caps[p] = (uint8_t)((ll_send[p * DEV_LL_CHANNELS].data != NULL ? PEER_LL_TO : 0) |
                                 (ll_recv[p * DEV_LL_CHANNELS].data != NULL ? PEER_LL_FROM : 0) |
                                 (send[p * gx->rings].marks != NULL ? PEER_MARKS_TO : 0) |
                                 (recv[p * gx->rings].marks != NULL ? PEER_MARKS_FROM : 0));
  }
  void *flags_dev = NULL;
  mem_doing("the executor's flags");
  ncclResult_t res = gpu_host_alloc(sizeof(flags_t), (void **)&gx->flags, &flags_dev);
  mem_doing(NULL);
  if (res == ncclSuccess) {
    flags_t *fd = flags_dev;
    gx->dcomm = (dev_comm_t){.rank = gx->rank,
                             .nranks = gx->nranks,
                             .nch_max = gx->rings,
                             .send = (dev_ring_t *)(base + l.send),
                             .recv = (dev_ring_t *)(base + l.recv),
                             .sent = (uint64_t *)(base + l.sent),
                             .recvd = (uint64_t *)(base + l.recvd),
                             .heads = (uint64_t *)(base + l.heads),
                             .ll_send = (dev_ring_t *)(base + l.ll_send),
                             .ll_recv = (dev_ring_t *)(base + l.ll_recv),
                             .ll_sent = (uint64_t *)(base + l.ll_sent),
                             .ll_recvd = (uint64_t *)(base + l.ll_recvd),
                             .ll_heads = (uint64_t *)(base + l.ll_heads),
                             .barrier = (uint32_t *)(base + l.barrier),
                             .guards = l.total > l.guards ? (uint64_t *)(base + l.guards) : NULL,
                             .abort_flag = &fd->abort,
                             .error = &fd->error,
                             .timeout_ns = (uint64_t)param_int(P_BRAID_TIMEOUT_S) * 1000000000ull};
    res = gpu_copy_to_device(base, img, l.total);
  }
  free(img);
  return res;
}

/* The work queue: its accounting, its entries in host-mapped memory, and their device copy for spills. */
static ncclResult_t queue_init(gx_t *gx) {
  uint64_t cap = wq_size(param_int(P_NCCL_WORK_FIFO_BYTES), param_is_set(P_NCCL_WORK_FIFO_BYTES),
                         param_int(P_NCCL_WORK_FIFO_DEPTH), param_is_set(P_NCCL_WORK_FIFO_DEPTH));
  CHECK(wq_init(&gx->wq, cap));
  mem_doing("the work queue");
  ncclResult_t res = gpu_host_alloc(cap, (void **)&gx->q_host, (void **)&gx->q_host_dev);
  if (res == ncclSuccess) mem_charge(gx->acct, cap, 0, "work queue (page-locked)");
  if (res == ncclSuccess) res = gpu_dev_alloc(gx->dev, cap, &gx->q_dev);
  mem_doing(NULL);
  CHECK(res);
  mem_charge(gx->acct, gpu_mem_size(gx->q_dev), 1, "work queue (device copy)");
  return ncclSuccess;
}

/* The slowest link to a peer: what the tuner's rows are keyed by. */
static tp_link_t slowest_link(const links_t *links, int rank, int nranks) {
  tp_link_t link = TP_LINK_P2P;
  for (int p = 0; p < nranks; p++) {
    const tp_link_t l = p == rank ? TP_LINK_P2P : tp_link(links->tp, p);
    if (l > link) link = l;
  }
  return link;
}

ncclResult_t gx_init(int dev, int rank, int nranks, int nch, int sms, links_t *links, alloc_acct_t *acct,
                     const char *name, gx_t **gx_p) {
  ncclResult_t res;
  gx_t *gx;
  if (nranks > GX_MAX_RANKS)
    return log_err(ncclInvalidUsage, "%s: %d ranks; the GPU executor takes at most %d", name, nranks,
                   GX_MAX_RANKS);
  gx_sweep();
  CHECK(MEM_CALLOC(acct, gx, 1, "GPU executor"));
  *gx = (gx_t){.dev = dev,
               .rank = rank,
               .nranks = nranks,
               .nch = nch,
               .rings = tune_rings(nranks, nch),
               .grid_max = (unsigned)(tune_lanes_max(nranks) * nch),
               .name = name,
               .acct = acct};
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_NAME, &gx->func), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_SMALL_NAME, &gx->func_small), res,
             fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_LL_NAME, &gx->func_ll), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_BULK_NAME, &gx->func_bulk), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_PAIR_NAME, &gx->func_pair), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_PAIR_AR_NAME, &gx->func_pair_ar), res,
             fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_PAIR_AR128_NAME, &gx->func_pair_ar128),
             res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_WAIT_NAME, &gx->func_wait), res, fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_COMBINE_NAME, &gx->func_combine), res,
             fail);
  CHECK_GOTO(gpu_func_load(dev, dev_fatbins, dev_nfatbins, DEV_KERNEL_PUSH_NAME, &gx->func_push), res, fail);
  int can_eager = 0, can_captured = 0;
  CHECK_GOTO(gpu_overlap_support(dev, &can_eager, &can_captured), res, fail);
  const int64_t overlap = param_int(P_BRAID_LAUNCH_PDL);
  gx->overlap = !can_eager || overlap < 0 ? 0 : overlap > 2 ? 2 : (int)overlap;
  if (gx->overlap == 2 && !can_captured) gx->overlap = 1;
  gx->push_blocks = sms < 1 ? 1 : sms > 1024 ? 1024 : (unsigned)sms;
  tune_direct_t direct;
  tune_direct(nranks, &direct);
  gx->combine_blocks = direct.combine_blocks > gx->push_blocks ? gx->push_blocks : direct.combine_blocks;
  gx->pull_blocks =
      direct.pull_blocks > 0 && direct.pull_blocks < gx->push_blocks ? direct.pull_blocks : gx->push_blocks;
  gx->pull_tile = direct.pull_tile;
  gx->spread = tune_spread(nranks);
  gx->link = slowest_link(links, rank, nranks);
  CHECK_GOTO(MEM_CALLOC(acct, gx->peer_caps, (size_t)nranks, "GPU executor: rings per peer"), res, fail);
  mem_doing("the kernel view of the communicator");
  res = gpu_dev_alloc(dev, layout(nranks, gx->rings).total, &gx->mem);
  mem_doing(NULL);
  if (res != ncclSuccess) goto fail;
  mem_charge(acct, gpu_mem_size(gx->mem), 1, "kernel view of the communicator");
  CHECK_GOTO(upload(gx, links), res, fail);
  CHECK_GOTO(gpu_event_create(&gx->done), res, fail);
  CHECK_GOTO(queue_init(gx), res, fail);
  const char *overlap_what = gx->overlap == 2 ? "eager and captured"
                             : gx->overlap == 1 && overlap >= 2
                                 ? "eager (a graph's launches need a CUDA 12.3 driver for it)"
                             : gx->overlap == 1 ? "eager"
                             : !can_eager       ? "none (the device has no programmatic dependent launch)"
                                                : "none";
  INFO(LOG_INIT | LOG_TUNING,
       "%s rank %d: GPU executor on device %d, %d channels, %d rings a connection, work queue of %llu bytes; "
       "launches that overlap the stream's previous kernel: %s (BRAID_LAUNCH_PDL)",
       name, rank, dev, nch, gx->rings, (unsigned long long)gx->wq.cap, overlap_what);
  *gx_p = gx;
  return ncclSuccess;
fail:
  gx_destroy(gx);
  return res;
}

/* Says what wait_last waits for (wd_describe_fn_t). */
static void last_describe(void *arg, char *buf, size_t len) {
  const gx_t *gx = arg;
  snprintf(buf, len,
           "%s rank %d: the communicator's last launch has not finished (the GPU makes no progress)",
           gx->name, gx->rank);
}

/* Waits until the communicator's last eager launch has finished. */
static ncclResult_t wait_last(gx_t *gx) {
  int done = !gx->launched;
  wd_timer_t t;
  if (!done) {
    wd_begin(&t, NULL, &(wd_wait_t){.kind = WD_QUEUE, .peer = -1, .channel = -1, .op = "last launch"},
             last_describe, gx);
    /* a kernel gives up waiting for a peer after BRAID_TIMEOUT_S (or at once after an abort); the margin
     * covers the work it still does after its last wait */
    t.margin_s = GX_STUCK_MARGIN_S;
    t.warn_s = 0;
  }
  while (!done) {
    CHECK(gpu_event_query(gx->done, &done));
    if (done) break;
    CHECK(wd_check(&t, time_now()));
    time_sleep_us(50);
  }
  return ncclSuccess;
}

/* ---- In-place all-to-all scratch ---- */

/* Eager launches share one staging buffer, grown when needed. */
static ncclResult_t scratch_eager(gx_t *gx, size_t need, gpu_mem_t **mem_p) {
  if (gx->scratch != NULL && gpu_mem_size(gx->scratch) >= need) goto out;
  if (gx->scratch != NULL) {
    /* A launch still in flight may stage in the old buffer: wait for the last one (bounded: kernels give up
     * after BRAID_TIMEOUT_S). This happens only when an in-place all-to-all grows. */
    CHECK(wait_last(gx));
    mem_release(gx->acct, gpu_mem_size(gx->scratch), 1);
    gpu_mem_release(gx->scratch);
    gx->scratch = NULL;
  }
  mem_doing("in-place all-to-all staging");
  ncclResult_t res = gpu_dev_alloc(gx->dev, need, &gx->scratch);
  mem_doing(NULL);
  CHECK(res);
  mem_charge(gx->acct, gpu_mem_size(gx->scratch), 1, "in-place all-to-all staging");
out:
  *mem_p = gx->scratch;
  return ncclSuccess;
}

ncclResult_t gx_scratch(gx_t *gx, plan_t *plan, int nranks) {
  size_t need = plan_scratch_need(plan, gx->rank, nranks, 1);
  plan->ext_scratch = NULL;
  plan->ext_scratch_bytes = 0;
  if (need == 0) return ncclSuccess;
  gpu_scope_t scope;
  CHECK(gpu_enter(gx->dev, &scope));
  int capturing = 0;
  void *graph = NULL;
  uint64_t id = 0;
  gpu_mem_t *mem = NULL;
  ncclResult_t res = gpu_stream_capture(plan->tasks[0].stream, &capturing, &graph, &id);
  if (res == ncclSuccess && !capturing) res = scratch_eager(gx, need, &mem);
  if (res == ncclSuccess && capturing) {
    /* a replay may run beside eager launches: the graph gets staging of its own */
    token_t *t;
    tbuf_t *b;
    res = gx_token_for(gx, graph, id, &t);
    if (res == ncclSuccess) res = gx_token_alloc(gx, t, need, 0, &b);
    if (res == ncclSuccess) mem = b->mem;
  }
  gpu_leave(&scope);
  CHECK(res);
  /* plan_build stages in-place all-to-alls here instead of in host memory */
  plan->ext_scratch = gpu_mem_ptr(mem);
  plan->ext_scratch_bytes = gpu_mem_size(mem);
  return ncclSuccess;
}

/* Whether task i is the first of the plan on its stream: the group's streams other than the launch's. */
static int first_on_stream(const plan_t *plan, int i) {
  for (int k = 0; k < i; k++)
    if (plan->tasks[k].stream == plan->tasks[i].stream) return 0;
  return 1;
}

static int one_stream(const plan_t *plan) {
  for (int i = 1; i < plan->ntasks; i++)
    if (first_on_stream(plan, i)) return 0;
  return 1;
}

ncclResult_t gx_order_before(gx_t *gx, cudaStream_t s) {
  if (!gx->launched || gx->last == s) return ncclSuccess;
  CHECK(gpu_stream_wait(s, gx->done));
  gx->last = s; /* s now follows the eager work: a second call before gx_order_after need not wait again */
  return ncclSuccess;
}

ncclResult_t gx_order_after(gx_t *gx, cudaStream_t s) {
  CHECK(gpu_event_record(gx->done, s));
  gx->launched = 1;
  gx->last = s;
  return ncclSuccess;
}

ncclResult_t gx_join_before(gx_t *gx, const plan_t *plan, cudaStream_t s) {
  int j = 0;
  for (int i = 1; i < plan->ntasks; i++) {
    if (!first_on_stream(plan, i)) continue;
    cudaStream_t o = plan->tasks[i].stream;
    if (j == gx->njoins) {
      gpu_event_t **g = realloc(gx->joins, (j + 1) * sizeof *g);
      if (g == NULL) return log_err(ncclSystemError, "%s: out of host memory for stream events", gx->name);
      gx->joins = g;
      CHECK(gpu_event_create(&gx->joins[j]));
      gx->njoins++;
    }
    CHECK(gpu_event_record(gx->joins[j], o));
    CHECK(gpu_stream_wait(s, gx->joins[j]));
    j++;
  }
  return ncclSuccess;
}

/* The group's streams other than its first wait for `ev`. */
static ncclResult_t others_wait(const plan_t *plan, gpu_event_t *ev) {
  for (int i = 1; i < plan->ntasks; i++)
    if (first_on_stream(plan, i)) CHECK(gpu_stream_wait(plan->tasks[i].stream, ev));
  return ncclSuccess;
}

ncclResult_t gx_join_after(gx_t *gx, const plan_t *plan) {
  return others_wait(plan, gx->done);
}

/* Orders the launch on `s` after the group's other streams and after the previous eager launch. */
static ncclResult_t before(gx_t *gx, const plan_t *plan, cudaStream_t s, int capturing) {
  if (!capturing) CHECK(gx_order_before(gx, s));
  return gx_join_before(gx, plan, s);
}

/* After the launch: the group's other streams wait for it, and so will the next eager launch. Inside a
 * capture, `done` keeps its last eager record (an eager wait on an event recorded in a graph is not
 * allowed), and a separate event joins the streams. `done` is recorded after every eager launch, not lazily
 * on the old stream when a later launch comes on another: by then the caller may have destroyed that stream
 * (its handle is no longer valid) or begun capturing it (the record would land in the graph). */
static ncclResult_t after(gx_t *gx, const plan_t *plan, cudaStream_t s, int capturing) {
  gpu_event_t *ev = gx->done;
  if (capturing) {
    if (gx->capture_join == NULL) CHECK(gpu_event_create(&gx->capture_join));
    ev = gx->capture_join;
    CHECK(gpu_event_record(ev, s));
  } else {
    CHECK(gx_order_after(gx, s));
  }
  return others_wait(plan, ev);
}

/* ---- The work queue ---- */

typedef struct {
  gx_t *gx;
  int all_before_group; /* the ordering event says every launch before this group has finished */
} done_ctx_t;

/* Whether an entry's kernel is done: it wrote the entry's tag into the header (acquire: what it read of the
 * entry was read before). */
static int entry_done(void *arg, const wq_entry_t *e) {
  const done_ctx_t *c = arg;
  if (__atomic_load_n((const uint64_t *)(c->gx->q_host + e->off), __ATOMIC_ACQUIRE) == e->tag) return 1;
  return c->all_before_group && e->tag < c->gx->group_first_tag;
}

/* A full queue's wait, for queue_describe. */
typedef struct {
  gx_t *gx;
  double start;
} queue_wait_t;

/* Says what a queue that stays full waits for (wd_describe_fn_t; the watchdog reports it once). */
static void queue_describe(void *arg, char *buf, size_t len) {
  const queue_wait_t *q = arg;
  gx_t *gx = q->gx;
  const wq_entry_t *e = wq_oldest(&gx->wq);
  if (e == NULL) {
    snprintf(buf, len, "%s rank %d: the work queue has been full for %.1f s", gx->name, gx->rank,
             time_now() - q->start);
    return;
  }
  snprintf(
      buf, len,
      "%s rank %d: the work queue has been full for %.1f s: %llu of %llu bytes (NCCL_WORK_FIFO_BYTES) are "
      "held by %u eager launches; "
      "waiting for the GPU to finish the oldest, %s (call %llu), enqueued %.1f s ago%s",
      gx->name, gx->rank, time_now() - q->start, (unsigned long long)wq_outstanding(&gx->wq),
      (unsigned long long)gx->wq.cap, gx->wq.count, e->op, (unsigned long long)e->seq, time_now() - e->t_enq,
      e->tag >= gx->group_first_tag ? "; it belongs to this same group, so if one thread drives several GPUs "
                                      "they wait for each other: raise NCCL_WORK_FIFO_BYTES"
                                    : "");
}

/* An entry of `bytes` for an eager launch, waiting while the queue is full: space comes back as kernels
 * finish. The wait ends with an error when the communicator is aborted or a kernel failed (a kernel gives
 * up on its own after BRAID_TIMEOUT_S); the watchdog reports it after BRAID_QUEUE_WARN_S. */
static ncclResult_t queue_reserve(gx_t *gx, uint64_t bytes, uint64_t seq, const char *op, wq_slot_t *slot) {
  done_ctx_t c = {gx, 0};
  wd_timer_t t;
  queue_wait_t q = {gx, 0};
  for (uint64_t round = 0;; round++) {
    wq_reclaim(&gx->wq, entry_done, &c);
    if (wq_reserve(&gx->wq, 0, bytes, seq, op, time_now(), slot)) return ncclSuccess;
    if (round == 0) {
      wd_wait_t w = {.kind = WD_QUEUE, .peer = -1, .seq = seq, .channel = -1};
      snprintf(w.op, sizeof w.op, "%s", op);
      q.start = time_now();
      wd_begin(&t, NULL, &w, queue_describe, &q);
      t.warn_s = param_int(P_BRAID_QUEUE_WARN_S);
      t.timeout_s = 0;
    }
    if (gx->launched && !c.all_before_group) CHECK(gpu_event_query(gx->done, &c.all_before_group));
    if (__atomic_load_n(&gx->flags->abort, __ATOMIC_ACQUIRE))
      return log_err(ncclInternalError, "%s rank %d: aborted while waiting for room in the work queue",
                     gx->name, gx->rank);
    CHECK(gx_error(gx));
    CHECK(wd_check(&t, time_now()));
    time_backoff(round);
  }
}

/* Where an eager launch's spilled list goes: a queue entry (its header cleared, the spill staged and copied
 * to the device copy in stream order). */
ncclResult_t gx_queue_place(gx_t *gx, const launch_ctx_t *lc, uint64_t spill, wq_slot_t *slot) {
  dev_work_t *w = &gx->work;
  CHECK(queue_reserve(gx, wq_entry_bytes(spill), w->seq, lc->op, slot));
  /* the launch is made after this store, so the kernel's write of the tag comes after it */
  __atomic_store_n((uint64_t *)(gx->q_host + slot->off), 0, __ATOMIC_RELAXED);
  w->done = (volatile uint64_t *)(gx->q_host_dev + slot->off);
  w->tag = slot->tag;
  char *stage = gx->q_host + slot->off + WQ_ALIGN,
       *dst = (char *)gpu_mem_ptr(gx->q_dev) + slot->off + WQ_ALIGN;
  memcpy(stage, gx->xf, spill);
  w->ext = (const dev_xfer_t *)dst;
  return gpu_copy_async(dst, stage, spill, lc->s);
}

/* ---- The same calls again ---- */

/* A group's calls, enqueued again with the same arguments, build the same plan: plan_build depends on nothing
 * else that changes while the executor lives (rank, ranks and the knobs are fixed, and the in-place
 * all-to-all's staging is reached only through gx_scratch, which runs on the full path). When the last eager
 * gx_launch of the executor was one step that the memo launched or kept, and the copy engines had no
 * candidate in it (a candidate step is offered to the peer, which expects the offer whatever came before),
 * the same calls again (every argument but the call's number; the stream may change, as the memo's
 * parameters do not depend on it) are launched from the memo by gx_relaunch, before plan_build: the plan,
 * the copy engines' offer and the transfers are skipped as well as the lanes: much of a small eager call's
 * host work. Any other gx_launch forgets the calls first, and so does a
 * gx_relaunch that finds other calls, or a capture, as the full path follows it. */
static int same_call(const task_t *a, const task_t *b) {
  return a->kind == b->kind && a->sendbuff == b->sendbuff && a->recvbuff == b->recvbuff &&
         a->count == b->count && a->type == b->type && a->op == b->op && a->root == b->root &&
         a->red.kind == b->red.kind && a->red.type == b->red.type && a->red.fscale == b->red.fscale &&
         a->red.iscale == b->red.iscale && a->red.divisor == b->red.divisor &&
         a->red.scalar_dev == b->red.scalar_dev;
}

static int recall_matches(const recall_t *r, const plan_t *plan) {
  if (plan->ntasks != r->ntasks) return 0;
  for (int i = 0; i < r->ntasks; i++)
    if (!same_call(&r->tasks[i], &plan->tasks[i])) return 0;
  return 1;
}

/* After a gx_launch: its calls become the recall's when its one step came from the memo or filled it. */
static void recall_keep(gx_t *gx, const plan_t *plan, int capturing) {
  if (capturing || !gx->memo_used || plan->nsteps != 1 || plan->ntasks > GX_RECALL_TASKS ||
      ce_offered(gx->ce))
    return;
  gx->recall.ntasks = plan->ntasks;
  memcpy(gx->recall.tasks, plan->tasks, (size_t)plan->ntasks * sizeof *plan->tasks);
  gx->recall.valid = 1;
}

/* What every launch, built or relaunched, does first: the executor's device current, retired executors and
 * released graph tokens freed, and whether `s` is capturing (into `graph`, capture `id`). On success the
 * caller leaves `scope`; on failure it is left here. */
static ncclResult_t launch_open(gx_t *gx, cudaStream_t s, gpu_scope_t *scope, int *capturing, void **graph,
                                uint64_t *id) {
  CHECK(gpu_enter(gx->dev, scope));
  gx_sweep();
  gx_tokens_sweep(gx);
  ncclResult_t res = gpu_stream_capture(s, capturing, graph, id);
  if (res != ncclSuccess) gpu_leave(scope);
  return res;
}

ncclResult_t gx_tune(gx_t *gx, plan_t *plan) {
  if (plan->ntasks > gx->cap_shapes) {
    int cap = gx->cap_shapes < 8 ? 8 : gx->cap_shapes;
    while (cap < plan->ntasks) cap *= 2;
    tune_shape_t *sh = realloc(gx->shapes, (size_t)cap * sizeof *sh);
    if (sh == NULL)
      return log_err(ncclSystemError, "%s: out of host memory for %d calls' shapes", gx->name, cap);
    gx->shapes = sh;
    gx->cap_shapes = cap;
  }
  const tune_knobs_t *k = tune_knobs();
  for (int i = 0; i < plan->ntasks; i++) {
    task_t *t = &plan->tasks[i];
    const tune_call_t call = {.kind = t->kind,
                              .type = t->type,
                              .red = t->red.kind,
                              .bytes = plan_call_bytes(t, gx->nranks),
                              .nranks = gx->nranks,
                              .nch = gx->nch,
                              .link = gx->link,
                              .in_place = t->sendbuff == t->recvbuff};
    tune_call(&call, k, &gx->shapes[i]);
    tune_log(&call, t, &gx->shapes[i]);
    t->algo = (uint8_t)gx->shapes[i].algo;
    t->split = gx->shapes[i].split;
  }
  return ncclSuccess;
}

ncclResult_t gx_launch(gx_t *gx, const plan_t *plan) {
  if (plan->ntasks == 0) return ncclSuccess;
  launch_ctx_t lc = {.s = plan->tasks[0].stream, .op = plan_op_name(plan->tasks[0].kind)};
  gpu_scope_t scope;
  void *graph = NULL;
  uint64_t capture_id = 0;
  CHECK(launch_open(gx, lc.s, &scope, &lc.capturing, &graph, &capture_id));
  ncclResult_t res;
  /* from here on the graph holds the communicator (gx_graphs) */
  if (lc.capturing) CHECK_GOTO(gx_token_for(gx, graph, capture_id, &lc.token), res, out);
  CHECK_GOTO(before(gx, plan, lc.s, lc.capturing), res, out);
  gx->group_first_tag = gx->wq.next_tag;
  gx->work.nsteps = gx->work.nxfers = gx->work.nch = 0;
  gx->work.seq = plan->tasks[0].seq;
  gx->one_way = 1;
  gx->memo_staged = gx->memo_used = 0;
  gx->recall.valid = 0;
  gx->copies_only = 1;
  for (int i = 0; i < plan->nsteps; i++) CHECK_GOTO(gx_add_step(gx, plan, i, &lc), res, out);
  CHECK_GOTO(gx_flush(gx, &lc, 0), res, out);
  /* copies alone on one stream touch no ring: the next launch need not wait for them, nor another stream */
  res = gx->copies_only && one_stream(plan) ? ncclSuccess : after(gx, plan, lc.s, lc.capturing);
  if (res == ncclSuccess) recall_keep(gx, plan, lc.capturing);
  gx->last_captured = lc.capturing;
out:
  gpu_leave(&scope);
  return res;
}

ncclResult_t gx_relaunch(gx_t *gx, const plan_t *plan, int *took) {
  *took = 0;
  if (!gx->recall.valid || !recall_matches(&gx->recall, plan) || log_enabled(LOG_TRACE, LOG_TUNING)) {
    gx->recall.valid = 0; /* the full path follows, which may change what the memo's launch depends on */
    return ncclSuccess;
  }
  const cudaStream_t s = plan->tasks[0].stream;
  gpu_scope_t scope;
  int capturing = 0;
  void *graph = NULL;
  uint64_t capture_id = 0;
  ncclResult_t res = launch_open(gx, s, &scope, &capturing, &graph, &capture_id);
  if (res != ncclSuccess || capturing) { /* a graph gets storage of its own: the full path */
    gx->recall.valid = 0;
    if (res == ncclSuccess) gpu_leave(&scope);
    return res;
  }
  *took = 1;
  res = before(gx, plan, s, 0);
  if (res == ncclSuccess) {
    gx->group_first_tag = gx->wq.next_tag;
    res = gx_memo_fire(gx, plan->tasks[0].seq, s);
  }
  if (res == ncclSuccess) res = after(gx, plan, s, 0);
  if (res == ncclSuccess)
    gx->relaunches++;
  else
    gx->recall.valid = 0;
  gpu_leave(&scope);
  return res;
}

int gx_captured(const gx_t *gx) {
  return gx != NULL && gx->last_captured;
}

uint64_t gx_relaunches(const gx_t *gx) {
  return gx == NULL ? 0 : gx->relaunches;
}

void gx_set_ce(gx_t *gx, ce_t *ce) {
  if (gx != NULL) gx->ce = ce;
}

int gx_graphs(gx_t *gx) {
  return gx == NULL ? 0 : atomic_load_explicit(&gx->graphs, memory_order_acquire);
}

void gx_quiesce(gx_t *gx) {
  gpu_scope_t scope;
  if (gx == NULL || gpu_enter(gx->dev, &scope) != ncclSuccess) return;
  (void)wait_last(gx); /* a GPU that makes no progress was reported; the replays are stopped all the same */
  gpu_leave(&scope);
}

void gx_abort(gx_t *gx) {
  if (gx != NULL && gx->flags != NULL) __atomic_store_n(&gx->flags->abort, 1, __ATOMIC_RELEASE);
}

ncclResult_t gx_error(gx_t *gx) {
  if (gx == NULL || gx->flags == NULL) return ncclSuccess;
  const dev_error_t *e = &gx->flags->error;
  int32_t code = __atomic_load_n(&e->code, __ATOMIC_ACQUIRE);
  if (code == DEV_OK) return ncclSuccess;
  ncclResult_t res = code == DEV_ERR_ABORTED   ? ncclInternalError
                     : code == DEV_ERR_TIMEOUT ? ncclRemoteError
                                               : ncclInternalError;
  if (gx->reported) return res;
  gx->reported = 1;
  if (code == DEV_ERR_ABORTED)
    return log_err(res, "%s rank %d: the communicator was aborted while a kernel waited", gx->name, gx->rank);
  if (e->channel < 0) /* a copy-engine step's wait (dev_wait_t) */
    return log_err(res,
                   "%s rank %d: a copy-engine step waited %.1f s for rank %d %s (call %lu) and gave up "
                   "(BRAID_TIMEOUT_S); the peer is gone or stuck",
                   gx->name, gx->rank, e->waited_ns / 1e9, e->peer,
                   e->is_send ? "to free its output" : "to finish its copy", (unsigned long)e->seq);
  return log_err(res,
                 "%s rank %d: a kernel waited %.1f s %s rank %d on channel %d (call %lu) and gave up "
                 "(BRAID_TIMEOUT_S); the peer is gone or stuck",
                 gx->name, gx->rank, e->waited_ns / 1e9, e->is_send ? "for room to send to" : "for data from",
                 e->peer, e->channel, (unsigned long)e->seq);
}

ncclResult_t gx_destroy(gx_t *gx) {
  if (gx == NULL) return ncclSuccess;
  gpu_scope_t scope;
  int entered = gpu_enter(gx->dev, &scope) == ncclSuccess;
  if (wait_last(gx) != ncclSuccess) {
    /* a kernel may still run: its memory stays allocated rather than freed under it */
    WARN(
        "%s rank %d: its device memory is left allocated rather than freed under a kernel that may still run",
        gx->name, gx->rank);
    if (entered) gpu_leave(&scope);
    return ncclSystemError;
  }
  for (int i = 0; i < gx->njoins; i++) gpu_event_destroy(gx->joins[i]);
  free(gx->joins);
  if (gx->done != NULL) gpu_event_destroy(gx->done);
  if (gx->capture_join != NULL) gpu_event_destroy(gx->capture_join);
  if (gx->scratch != NULL) {
    mem_release(gx->acct, gpu_mem_size(gx->scratch), 1);
    gpu_mem_release(gx->scratch);
  }
  if (gx->mem != NULL) {
    mem_release(gx->acct, gpu_mem_size(gx->mem), 1);
    gpu_mem_release(gx->mem);
  }
  if (gx->flags != NULL) gpu_host_free(gx->flags);
  gx_tokens_sweep(gx); /* every graph is gone (the callers make sure): every token is released */
  if (gx->q_dev != NULL) {
    mem_release(gx->acct, gpu_mem_size(gx->q_dev), 1);
    gpu_mem_release(gx->q_dev);
  }
  if (gx->q_host != NULL) {
    mem_release(gx->acct, gx->wq.cap, 0);
    gpu_host_free(gx->q_host);
  }
  wq_free(&gx->wq);
  free(gx->xf);
  free(gx->shapes);
  mem_free(gx->acct, gx->peer_caps, (size_t)gx->nranks);
  ce_destroy(gx->ce);
  if (entered) gpu_leave(&scope);
  mem_free(gx->acct, gx, sizeof *gx);
  return ncclSuccess;
}
