/*
 * The GPU executor (see launch.h).
 *
 * A plan's steps become the steps of a dev_work_t. Within a step, transfers that share a connection (the same
 * send peer or the same receive peer) must keep their list order, so they form one lane; local copies form
 * one lane of their own. Lanes run concurrently, each on nch blocks. A transfer is split over ceil(bytes /
 * DEV_CHANNEL_BYTES) channels, at most nch: a function of its size only, so both ends of a connection split
 * it the same way (DESIGN.md, principle 2).
 *
 * Launches of one communicator are ordered even when the calls come on different streams: each launch waits
 * for the event recorded after the previous one. Inside CUDA graph capture the ordering is the graph's.
 */
#include "launch.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "device/dev.h"
#include "gpu/gpu.h"

/* Host-mapped words the kernels and the host share. */
typedef struct {
  volatile int32_t abort; /* host writes 1 on abort; kernels poll it */
  int32_t pad;
  dev_error_t error; /* kernels write the first error; the host reads it */
} flags_t;

struct gx {
  int dev, rank, nranks, nch;
  const char *name;
  alloc_acct_t *acct;
  gpu_func_t *func;
  gpu_mem_t *mem;            /* dev_comm_t, ring tables, counters, barrier */
  dev_comm_t *dcomm;         /* its device address */
  flags_t *flags;            /* host address of the host-mapped flags */
  gpu_event_t *done;         /* recorded after each eager launch */
  gpu_event_t *capture_join; /* joins a captured group's streams */
  int launched;              /* done was recorded at least once */
  cudaStream_t last;         /* stream of the last eager launch */
  gpu_event_t **joins;       /* one per extra stream of a group */
  int njoins;
  gpu_mem_t *scratch; /* in-place all-to-all staging */
  int reported;       /* the kernel error was logged */
  dev_work_t work;    /* the launch being built */
};

/* Ranks of one GPU communicator at most (lane assignment works on the stack). */
enum { GX_MAX_RANKS = 1024 };

int gx_channels(int nranks) {
  int64_t want = param_int(P_BRAID_CHANNELS);
  if (want >= 1) return want > DEV_MAX_CHANNELS ? DEV_MAX_CHANNELS : (int)want;
  int lanes = nranks > 1 ? 2 * nranks - 1 : 1; /* the most lanes a step can have */
  int nch = 120 / lanes;                       /* keep every launch well under one block per SM */
  return nch < 1 ? 1 : nch > DEV_MAX_CHANNELS ? DEV_MAX_CHANNELS : nch;
}

/* Byte offsets of the parts of the device allocation. */
typedef struct {
  size_t send, recv, sent, recvd, barrier, total;
} layout_t;

static layout_t layout(int nranks, int nch) {
  layout_t l;
  size_t rings = (size_t)nranks * nch;
  l.send = (sizeof(dev_comm_t) + 255) / 256 * 256;
  l.recv = l.send + rings * sizeof(dev_ring_t);
  l.sent = l.recv + rings * sizeof(dev_ring_t);
  l.recvd = l.sent + rings * sizeof(uint64_t);
  l.barrier = l.recvd + rings * sizeof(uint64_t);
  l.total = l.barrier + 2 * sizeof(uint32_t);
  return l;
}

/* The kernels' view of the communicator, written once to device memory. */
static ncclResult_t upload(gx_t *gx, links_t *links) {
  layout_t l = layout(gx->nranks, gx->nch);
  char *base = gpu_mem_ptr(gx->mem);
  char *img = calloc(1, l.total);
  if (img == NULL) return log_err(ncclSystemError, "%s: out of host memory (%zu bytes)", gx->name, l.total);
  dev_ring_t *send = (dev_ring_t *)(img + l.send), *recv = (dev_ring_t *)(img + l.recv);
  for (int p = 0; p < gx->nranks; p++) {
    tp_conn_t *s = links->send[p], *r = links->recv[p];
    for (int c = 0; c < gx->nch; c++) {
      if (s != NULL && c < s->nrings) send[p * gx->nch + c] = s->rings[c];
      if (r != NULL && c < r->nrings) recv[p * gx->nch + c] = r->rings[c];
    }
  }
  void *flags_dev = NULL;
  ncclResult_t res = gpu_host_alloc(sizeof(flags_t), (void **)&gx->flags, &flags_dev);
  if (res == ncclSuccess) {
    flags_t *fd = flags_dev;
    *(dev_comm_t *)img = (dev_comm_t){.rank = gx->rank,
                                      .nranks = gx->nranks,
                                      .nch_max = gx->nch,
                                      .send = (dev_ring_t *)(base + l.send),
                                      .recv = (dev_ring_t *)(base + l.recv),
                                      .sent = (uint64_t *)(base + l.sent),
                                      .recvd = (uint64_t *)(base + l.recvd),
                                      .barrier = (uint32_t *)(base + l.barrier),
                                      .abort_flag = &fd->abort,
                                      .error = &fd->error,
                                      .timeout_ns = (uint64_t)param_int(P_BRAID_TIMEOUT_S) * 1000000000ull};
    res = gpu_copy_to_device(base, img, l.total);
  }
  free(img);
  gx->dcomm = (dev_comm_t *)base;
  return res;
}

ncclResult_t gx_init(int dev, int rank, int nranks, int nch, links_t *links, alloc_acct_t *acct,
                     const char *name, gx_t **gx_p) {
  ncclResult_t res;
  gx_t *gx;
  if (nranks > GX_MAX_RANKS)
    return log_err(ncclInvalidUsage, "%s: %d ranks; the GPU executor takes at most %d", name, nranks,
                   GX_MAX_RANKS);
  CHECK(MEM_CALLOC(acct, gx, 1, "GPU executor"));
  *gx = (gx_t){.dev = dev, .rank = rank, .nranks = nranks, .nch = nch, .name = name, .acct = acct};
  CHECK_GOTO(gpu_func_load(dev, dev_fatbin, DEV_KERNEL_NAME, &gx->func), res, fail);
  CHECK_GOTO(gpu_dev_alloc(dev, layout(nranks, nch).total, &gx->mem), res, fail);
  mem_charge(acct, gpu_mem_size(gx->mem), 1, "kernel view of the communicator");
  CHECK_GOTO(upload(gx, links), res, fail);
  CHECK_GOTO(gpu_event_create(&gx->done), res, fail);
  INFO(LOG_INIT, "%s rank %d: GPU executor on device %d, %d channels", name, rank, dev, nch);
  *gx_p = gx;
  return ncclSuccess;
fail:
  gx_destroy(gx);
  return res;
}

/* Waits until the communicator's last eager launch has finished. */
static ncclResult_t wait_last(gx_t *gx) {
  int done = !gx->launched;
  while (!done) {
    CHECK(gpu_event_query(gx->done, &done));
    if (!done) time_sleep_us(50);
  }
  return ncclSuccess;
}

ncclResult_t gx_scratch(gx_t *gx, plan_t *plan, int nranks) {
  size_t need = 0;
  for (int i = 0; i < plan->ntasks; i++) {
    const task_t *t = &plan->tasks[i];
    if (t->kind == OP_ALLTOALL && t->sendbuff == t->recvbuff && nranks > 1)
      need += (size_t)nranks * t->count * dtype_size(t->type);
  }
  if (need == 0 || (gx->scratch != NULL && gpu_mem_size(gx->scratch) >= need)) goto out;
  if (gx->scratch != NULL) {
    /* A launch still in flight may stage in the old buffer: wait for the last one (bounded: kernels give up
     * after BRAID_TIMEOUT_S). This happens only when an in-place all-to-all grows. */
    CHECK(wait_last(gx));
    mem_release(gx->acct, gpu_mem_size(gx->scratch), 1);
    gpu_mem_release(gx->scratch);
    gx->scratch = NULL;
  }
  gpu_scope_t scope;
  CHECK(gpu_enter(gx->dev, &scope));
  ncclResult_t res = gpu_dev_alloc(gx->dev, need, &gx->scratch);
  gpu_leave(&scope);
  CHECK(res);
  mem_charge(gx->acct, gpu_mem_size(gx->scratch), 1, "in-place all-to-all staging");
out:
  /* plan_build stages in-place all-to-alls here instead of in host memory */
  plan->ext_scratch = gx->scratch != NULL ? gpu_mem_ptr(gx->scratch) : NULL;
  plan->ext_scratch_bytes = gx->scratch != NULL ? gpu_mem_size(gx->scratch) : 0;
  return ncclSuccess;
}

/* ---- Building a launch ---- */

/* Connection keys of a transfer: send peer p -> p, receive peer p -> nranks + p; local copies -> 2 nranks. */
static int find(int *parent, int k) {
  while (parent[k] != k) k = parent[k] = parent[parent[k]];
  return k;
}

/* Assigns lanes to the transfers [first, first + n) of the work: transfers that share a connection share a
 * lane; lanes are numbered in order of first appearance. Sorts them by lane, keeping list order. */
static int assign_lanes(dev_xfer_t *x, int n, int nranks, int *parent, int *lane_of) {
  int keys = 2 * nranks + 1;
  for (int k = 0; k < keys; k++) parent[k] = k, lane_of[k] = -1;
  for (int i = 0; i < n; i++) {
    int a = x[i].send_peer >= 0 ? x[i].send_peer : -1;
    int b = x[i].recv_peer >= 0 ? nranks + x[i].recv_peer : -1;
    if (a < 0 && b < 0) a = 2 * nranks;
    if (a >= 0 && b >= 0) parent[find(parent, a)] = find(parent, b);
  }
  int lanes = 0;
  for (int i = 0; i < n; i++) {
    int k = x[i].send_peer >= 0 ? x[i].send_peer : x[i].recv_peer >= 0 ? nranks + x[i].recv_peer : 2 * nranks;
    int root = find(parent, k);
    if (lane_of[root] < 0) lane_of[root] = lanes++;
    x[i].lane = (uint16_t)lane_of[root];
  }
  /* stable insertion sort by lane (steps are short) */
  for (int i = 1; i < n; i++) {
    dev_xfer_t v = x[i];
    int j = i - 1;
    while (j >= 0 && x[j].lane > v.lane) x[j + 1] = x[j], j--;
    x[j + 1] = v;
  }
  return lanes;
}

static void fill_xfer(const gx_t *gx, const xfer_t *in, uint16_t task, dev_xfer_t *out) {
  const red_t *red = in->red;
  uint64_t nch = (in->bytes + DEV_CHANNEL_BYTES - 1) / DEV_CHANNEL_BYTES;
  *out = (dev_xfer_t){.src = in->src,
                      .dst = in->dst,
                      .bytes = in->bytes,
                      .recv_peer = (int16_t)in->recv_peer,
                      .send_peer = (int16_t)in->send_peer,
                      .flags = (uint8_t)in->flags,
                      .type = (uint8_t)red->type,
                      .red = (uint8_t)red->kind,
                      .nch = (uint8_t)(nch < 1                   ? 1
                                       : nch > (uint64_t)gx->nch ? (uint64_t)gx->nch
                                                                 : nch),
                      .task = task,
                      .scalar_ptr = red->scalar_dev};
  if (red->kind == RED_SUM_POSTDIV)
    out->scalar.i = red->divisor;
  else if (dtype_is_float(red->type))
    out->scalar.f = red->fscale;
  else
    out->scalar.i = red->iscale;
}

/* Whether task i is the first of the plan on its stream: the group's streams other than the launch's. */
static int first_on_stream(const plan_t *plan, int i) {
  for (int k = 0; k < i; k++)
    if (plan->tasks[k].stream == plan->tasks[i].stream) return 0;
  return 1;
}

/* Orders the launch on `s` after the group's other streams and after the previous eager launch. */
static ncclResult_t before(gx_t *gx, const plan_t *plan, cudaStream_t s, int capturing) {
  if (!capturing && gx->launched && gx->last != s) CHECK(gpu_stream_wait(s, gx->done));
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

/* After the launch: the group's other streams wait for it, and so will the next eager launch. Inside a
 * capture, `done` keeps its last eager record (an eager wait on an event recorded in a graph is not
 * allowed), and a separate event joins the streams. */
static ncclResult_t after(gx_t *gx, const plan_t *plan, cudaStream_t s, int capturing) {
  gpu_event_t *ev = gx->done;
  if (capturing) {
    if (gx->capture_join == NULL) CHECK(gpu_event_create(&gx->capture_join));
    ev = gx->capture_join;
  }
  CHECK(gpu_event_record(ev, s));
  if (!capturing) {
    gx->launched = 1;
    gx->last = s;
  }
  for (int i = 1; i < plan->ntasks; i++)
    if (first_on_stream(plan, i)) CHECK(gpu_stream_wait(plan->tasks[i].stream, ev));
  return ncclSuccess;
}

/* Launches the work built so far (if any) and starts a new one. */
static ncclResult_t flush(gx_t *gx, cudaStream_t s, uint64_t seq) {
  dev_work_t *w = &gx->work;
  if (w->nsteps > 0 && w->nxfers > 0) {
    int widest = 1;
    for (int i = 0; i < w->nsteps; i++)
      if (w->step_lanes[i] > widest) widest = w->step_lanes[i];
    w->comm = gx->dcomm;
    CHECK(gpu_launch(gx->func, (unsigned)(widest * gx->nch), DEV_THREADS, w, sizeof *w, s));
  }
  w->nsteps = w->nxfers = 0;
  w->seq = seq;
  return ncclSuccess;
}

/* Appends step `s` of the plan to the launch being built, launching first when it would not fit. */
static ncclResult_t add_step(gx_t *gx, const plan_t *plan, int s, cudaStream_t stream) {
  const step_t *st = &plan->steps[s];
  dev_work_t *w = &gx->work;
  if (st->count > DEV_MAX_XFERS)
    return log_err(ncclInvalidUsage,
                   "%s: a group step of %d transfers on one GPU exceeds the %d a launch carries (call %lu)",
                   gx->name, st->count, DEV_MAX_XFERS, (unsigned long)st->task->seq);
  if (w->nsteps == DEV_MAX_STEPS || w->nxfers + st->count > DEV_MAX_XFERS)
    CHECK(flush(gx, stream, st->task->seq));
  dev_xfer_t *x = &w->xfers[w->nxfers];
  for (int i = 0; i < st->count; i++)
    fill_xfer(gx, &plan->xfers[st->first + i], (uint16_t)(st->task - plan->tasks), &x[i]);
  int parent[2 * GX_MAX_RANKS + 1], lane_of[2 * GX_MAX_RANKS + 1];
  w->step_lanes[w->nsteps] = (uint16_t)assign_lanes(x, st->count, gx->nranks, parent, lane_of);
  w->nxfers = (uint16_t)(w->nxfers + st->count);
  w->step_end[w->nsteps++] = w->nxfers;
  return ncclSuccess;
}

ncclResult_t gx_launch(gx_t *gx, const plan_t *plan) {
  if (plan->ntasks == 0) return ncclSuccess;
  cudaStream_t s = plan->tasks[0].stream;
  gpu_scope_t scope;
  CHECK(gpu_enter(gx->dev, &scope));
  ncclResult_t res;
  int capturing = 0;
  CHECK_GOTO(gpu_stream_capturing(s, &capturing), res, out);
  CHECK_GOTO(before(gx, plan, s, capturing), res, out);
  gx->work.nsteps = gx->work.nxfers = 0;
  gx->work.seq = plan->tasks[0].seq;
  for (int i = 0; i < plan->nsteps; i++) CHECK_GOTO(add_step(gx, plan, i, s), res, out);
  CHECK_GOTO(flush(gx, s, 0), res, out);
  res = after(gx, plan, s, capturing);
out:
  gpu_leave(&scope);
  return res;
}

void gx_abort(gx_t *gx) {
  if (gx != NULL && gx->flags != NULL) __atomic_store_n(&gx->flags->abort, 1, __ATOMIC_RELEASE);
}

ncclResult_t gx_error(gx_t *gx) {
  if (gx == NULL || gx->flags == NULL) return ncclSuccess;
  const dev_error_t *e = &gx->flags->error;
  int32_t code = __atomic_load_n(&e->code, __ATOMIC_ACQUIRE);
  if (code == DEV_OK) return ncclSuccess;
  ncclResult_t res = code == DEV_ERR_ABORTED   ? ncclInvalidUsage
                     : code == DEV_ERR_TIMEOUT ? ncclRemoteError
                                               : ncclInternalError;
  if (gx->reported) return res;
  gx->reported = 1;
  if (code == DEV_ERR_ABORTED)
    return log_err(res, "%s rank %d: the communicator was aborted while a kernel waited", gx->name, gx->rank);
  return log_err(res,
                 "%s rank %d: a kernel waited %.1f s %s rank %d on channel %d (call %lu) and gave up "
                 "(BRAID_TIMEOUT_S); the peer is gone or stuck",
                 gx->name, gx->rank, e->waited_ns / 1e9, e->is_send ? "for room to send to" : "for data from",
                 e->peer, e->channel, (unsigned long)e->seq);
}

void gx_destroy(gx_t *gx) {
  if (gx == NULL) return;
  gpu_scope_t scope;
  int entered = gpu_enter(gx->dev, &scope) == ncclSuccess;
  wait_last(gx); /* kernels may still use the rings */
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
  if (entered) gpu_leave(&scope);
  mem_free(gx->acct, gx, sizeof *gx);
}
