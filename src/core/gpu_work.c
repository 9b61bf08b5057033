/*
 * The GPU executor's work (see gpu_exec.h): a plan's steps become the steps of a dev_work_t, launched on the
 * entry point their transfers ask for.
 *
 * Within a step, transfers that share a connection (the same send peer or the same receive peer) must keep
 * their list order, so they form one lane; local copies form one lane of their own, and transfers the
 * planner marks XF_SEQ (a one-shot reduction, whose combines read what the one before stored) all join one
 * lane. Each transfer's protocol and channels come from its bytes in the bands of its call's shape
 * (core/tune.h), the same on every rank, so both ends of a connection split it alike (DESIGN.md, principle
 * 2). Lanes run concurrently, each on as many blocks as the launch's widest transfer has channels
 * (dev_work_t.nch): an 8-byte all-reduce runs on a block or two, not on nch per lane.
 *
 * The entry point follows from the launch's transfers alone (flush): the pair kernel for at most one LL send,
 * receive and copy, the LL kernel for other small LL launches, the bulk kernel for one-slice Simple launches
 * that move data both ways, the small or the general kernel for the rest. A launch's transfers travel in the
 * kernel parameters when they fit (DEV_MAX_XFERS); a larger launch spills its list to device memory (the work
 * queue eagerly, a graph token when captured).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"
#include "core/gpu_exec_int.h"

/* The planner's transfer flags travel unchanged in dev_xfer_t.flags. */
_Static_assert((int)XF_REDUCE == (int)DEV_XF_REDUCE && (int)XF_PREPARE == (int)DEV_XF_PREPARE &&
                   (int)XF_LAST == (int)DEV_XF_LAST && (int)XF_SEQ == (int)DEV_XF_SEQ &&
                   (int)XF_PREPARED == (int)DEV_XF_PREPARED,
               "transfer flags differ between the planner and the kernel");

/* The executor's LL mark travels with them. */
_Static_assert((int)DEV_XF_LL > (int)XF_PREPARED, "the LL mark takes a bit the planner does not use");

/* braid_kernel_small reads the head of the same dev_work_t. */
_Static_assert(offsetof(dev_work_t, xfers) == offsetof(dev_work_small_t, xfers),
               "the small entry point's work is a prefix of the full one");

/* The kernels run an LL transfer, LL128 included, in one slice (lane_run). */
_Static_assert(DEV_LL128_PART_MAX <= DEV_SLICE_BYTES, "an LL128 transfer's part fits a slice");

/* A one-shot reduction's lane receives from every peer and, in place, sends to every peer. */
_Static_assert(2 * (PLAN_ONESHOT_MAX_RANKS - 1) <= DEV_LANE_RINGS,
               "one-shot lanes exceed the kernel's rings");

/* Connection keys of a transfer: send peer p -> p, receive peer p -> nranks + p; local copies -> 2 nranks. */
static int find(int *parent, int k) {
  while (parent[k] != k) k = parent[k] = parent[parent[k]];
  return k;
}

/* Assigns lanes to the transfers [first, first + n) of the work: transfers that share a connection share a
 * lane, and so do all transfers marked XF_SEQ (with everything that shares a connection with them); lanes
 * are numbered in order of first appearance. With `local_joins`, local copies join the lane of the first
 * receive (or, with none, of the first send) and go first in it, so that the step has no lane of its own for
 * them (wide_p2p). Sorts them by lane, keeping list order otherwise. */
static int assign_lanes(dev_xfer_t *x, int n, int nranks, int local_joins, int *parent, int *lane_of) {
  int keys = 2 * nranks + 1, seq = -1, first_recv = -1, first_send = -1;
  for (int k = 0; k < keys; k++) parent[k] = k, lane_of[k] = -1;
  for (int i = 0; i < n; i++) {
    int a = x[i].send_peer >= 0 ? x[i].send_peer : -1;
    int b = x[i].recv_peer >= 0 ? nranks + x[i].recv_peer : -1;
    if (a < 0 && b < 0) a = 2 * nranks;
    if (a >= 0 && b >= 0) parent[find(parent, a)] = find(parent, b);
    if (x[i].flags & XF_SEQ) {
      int k = a >= 0 ? a : b;
      if (seq < 0) seq = k;
      parent[find(parent, k)] = find(parent, seq);
    }
    if (first_recv < 0) first_recv = b;
    if (first_send < 0 && x[i].send_peer >= 0) first_send = x[i].send_peer;
  }
  const int join = first_recv >= 0 ? first_recv : first_send;
  if (local_joins && join >= 0) parent[find(parent, 2 * nranks)] = find(parent, join);
  int lanes = 0;
  for (int i = 0; i < n; i++) {
    int k = x[i].send_peer >= 0 ? x[i].send_peer : x[i].recv_peer >= 0 ? nranks + x[i].recv_peer : 2 * nranks;
    int root = find(parent, k);
    if (lane_of[root] < 0) lane_of[root] = lanes++;
    x[i].lane = (uint16_t)lane_of[root];
  }
  /* stable insertion sort by lane, and with local_joins local copies first within it (steps are short) */
  for (int i = 1; i < n; i++) {
    dev_xfer_t v = x[i];
    const int v_local = local_joins && v.send_peer < 0 && v.recv_peer < 0;
    int j = i - 1;
    while (j >= 0 && (x[j].lane > v.lane ||
                      (x[j].lane == v.lane && v_local && (x[j].send_peer >= 0 || x[j].recv_peer >= 0))))
      x[j + 1] = x[j], j--;
    x[j + 1] = v;
  }
  return lanes;
}

/* Whether a collective moves data one way between any two ranks: a broadcast, a reduce, a gather or a
 * scatter, whose blocks only send, only receive, or do one after the other. */
static int one_way_kind(op_kind_t k) {
  return k == OP_BROADCAST || k == OP_REDUCE || k == OP_GATHER || k == OP_SCATTER;
}

/* The kernel's form of a planned transfer. A running result (XF_PREPARED) is combined as a plain sum where
 * PreMulSum would scale it again; the kernel never sees that flag's meaning. The protocol and channels come
 * from the transfer's bytes in the bands of its call's shape (tune.h): LL up to ll_max, on a channel per
 * ll_part bytes up to ll_nch; LL128 above it with a peer up to ll128_max, on ll128_nch channels (at most
 * `cap`) as long as each keeps within half its LL128 slots; Simple beyond, a channel per ch_bytes up to
 * `cap` (wide_step). A plain local copy of at most one LL128 piece per channel beside LL128 transfers is
 * marked LL (with the LL protocol, in pieces) on as many, so that such a launch (an all-gather's own block
 * out of place, a broadcast's root) stays one of LL transfers alone. Every rank derives the same shape from
 * the same call, so both ends of each connection agree. Each side of an LL transfer is also marked with its
 * protocol: LL when its connection has an LL ring, which both ends of the connection know alike (an LL128
 * transfer's sides always have one: its rows need p2p links). */
static void fill_xfer(const gx_t *gx, const xfer_t *in, const tune_shape_t *sh, uint16_t task, int cap,
                      dev_xfer_t *out) {
  const red_t *red = in->red;
  const int ll = in->bytes <= sh->ll_max;
  const uint64_t ll128_nch = (uint64_t)(sh->ll128_nch < cap ? sh->ll128_nch : cap);
  const int peers = in->send_peer >= 0 || in->recv_peer >= 0;
  const int ll128 = !ll && peers && in->bytes <= sh->ll128_max && in->bytes <= ll128_nch * DEV_LL128_PART_MAX;
  /* an XF_SEQ copy keeps the channels of the combines beside it: each block covers the same bytes of each */
  const int ll_copy = !ll && !peers && !(in->flags & (XF_REDUCE | XF_PREPARE | XF_SEQ)) &&
                      in->bytes <= sh->ll128_max && in->bytes <= ll128_nch * DEV_LL128_PIECE;
  int flags = (int)in->flags;
  if (ll || ll128 || ll_copy) {
    flags |= DEV_XF_LL;
    if (in->send_peer >= 0 && (gx->peer_caps[in->send_peer] & PEER_LL_TO)) flags |= DEV_XF_LL_SEND;
    if (in->recv_peer >= 0 && (gx->peer_caps[in->recv_peer] & PEER_LL_FROM)) flags |= DEV_XF_LL_RECV;
  }
  uint64_t nch = ll128 || ll_copy ? ll128_nch
                 : ll             ? (in->bytes + sh->ll_part - 1) / sh->ll_part
                                  : (in->bytes + sh->ch_bytes - 1) / sh->ch_bytes;
  if (ll && nch > (uint64_t)sh->ll_nch) nch = (uint64_t)sh->ll_nch;
  red_kind_t kind = (in->flags & XF_PREPARED) && red->kind == RED_PREMULSUM ? RED_SUM : red->kind;
  *out = (dev_xfer_t){.src = in->src,
                      .dst = in->dst,
                      .bytes = in->bytes,
                      .recv_peer = (int16_t)in->recv_peer,
                      .send_peer = (int16_t)in->send_peer,
                      .flags = (uint8_t)flags,
                      .type = (uint8_t)red->type,
                      .red = (uint8_t)kind,
                      .nch = (uint8_t)(nch < 1               ? 1
                                       : nch > (uint64_t)cap ? (uint64_t)cap
                                                             : nch),
                      .task = task,
                      .proto = (uint8_t)(ll128 ? DEV_PROTO_LL128 : DEV_PROTO_LL),
                      .scalar_ptr = red->scalar_dev};
  if (red->kind == RED_SUM_POSTDIV)
    out->scalar.i = red->divisor;
  else if (dtype_is_float(red->type))
    out->scalar.f = red->fscale;
  else
    out->scalar.i = red->iscale;
}

/* Whether the work (one step, its list in the parameters) can take braid_kernel_ll (dev.h): every transfer
 * LL on each side that has a peer, one piece per channel, and few enough transfers for the small work.
 * 2: so, but with an LL128 transfer, which braid_kernel_pair can take and braid_kernel_ll cannot. */
static int ll_only(const dev_work_t *w) {
  if (w->nsteps != 1 || w->nxfers > DEV_SMALL_XFERS) return 0;
  int ll128 = 0, long_copy = 0;
  for (int i = 0; i < w->nxfers; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    if (!(x->flags & DEV_XF_LL) || (x->send_peer >= 0 && !(x->flags & DEV_XF_LL_SEND)) ||
        (x->recv_peer >= 0 && !(x->flags & DEV_XF_LL_RECV)))
      return 0;
    if (!dev_xf_one_piece(x)) {
      if (x->send_peer >= 0 || x->recv_peer >= 0) return 0;
      long_copy = 1;
    }
    ll128 |= x->proto == DEV_PROTO_LL128;
  }
  /* a local copy of more than a piece per channel (fill_xfer's LL copies) rides only with LL128 transfers,
   * on the pair or the general entry point, whose copies take any length */
  if (long_copy && !ll128) return 0;
  return ll128 ? 2 : 1;
}

/* Threads per block of a braid_kernel_ll launch: a line per thread of the largest part, in whole warps, at
 * most DEV_THREADS (an 8-byte all-reduce runs one warp per block, so its barriers are a warp's). */
static unsigned ll_threads(const dev_work_t *w) {
  uint64_t lines = 1;
  for (int i = 0; i < w->nxfers; i++) {
    uint64_t part = dev_part(w->xfers[i].bytes, w->xfers[i].nch, 0, 0).len; /* channel 0's is the largest */
    if ((part + 7) / 8 > lines) lines = (part + 7) / 8;
  }
  uint64_t threads = (lines + 31) / 32 * 32;
  return threads < DEV_THREADS ? (unsigned)threads : DEV_THREADS;
}

/* Whether an LL launch (ll_only) can take braid_kernel_pair (dev.h, dev_pair_t), and its parameters in *p:
 * at most one plain send, one receive and one local copy, and no transfer writing what another one reads,
 * since the blocks of the three run at once and in no order. The one exception is an in-place all-reduce,
 * whose receive overwrites exactly the bytes its send reads: the two run fused, each thread sending the
 * lines it then overwrites; so does an out-of-place all-reduce (joined: each block sends its channel's part,
 * then receives it). */
static int pair_shape(const dev_work_t *w, dev_pair_t *p) {
  if (w->nxfers > 3) return 0;
  const dev_xfer_t *send = NULL, *recv = NULL, *copy = NULL;
  for (int i = 0; i < w->nxfers; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    if (x->nch < 1 || x->bytes == 0) return 0;
    if (send == NULL && dev_xf_plain_send(x))
      send = x;
    else if (recv == NULL && x->recv_peer >= 0 && x->send_peer < 0 && x->dst != NULL)
      recv = x;
    else if (copy == NULL && x->send_peer < 0 && x->recv_peer < 0 && x->dst != NULL && x->src != NULL &&
             !(x->flags & DEV_XF_REDUCE) && !dev_xf_scales(x))
      copy = x;
    else
      return 0;
  }
  if (send == NULL && recv == NULL) return 0;
  const dev_xfer_t none = {.send_peer = -1, .recv_peer = -1};
  const dev_xfer_t *s = send != NULL ? send : &none, *r = recv != NULL ? recv : &none,
                   *k = copy != NULL ? copy : &none;
  const int fused = plan_overlap(s->src, s->bytes, r->dst, r->bytes);
  if (fused && (s->src != r->dst || s->bytes != r->bytes || s->nch != r->nch)) return 0;
  if (plan_overlap(k->dst, k->bytes, s->src, s->bytes) || plan_overlap(k->dst, k->bytes, r->src, r->bytes) ||
      plan_overlap(k->dst, k->bytes, r->dst, r->bytes) || plan_overlap(k->src, k->bytes, r->dst, r->bytes))
    return 0;
  /* an absent transfer is `none`, of nch 0 */
  *p = (dev_pair_t){.comm = w->comm, .seq = w->seq, .send = *s, .recv = *r, .copy = *k, .nch = w->nch};
  /* an out-of-place all-reduce runs joined, as in place does, and so takes the in-place all-reduce's entry
   * point (dev_pair_ar), whose threads load both rings in one trip */
  int joined = 0;
  if (!fused && send != NULL && recv != NULL) {
    p->fused = 1;
    joined = dev_pair_ar(p);
  }
  /* a copy beside a receive alone still gets blocks of its own, so that the receive waits for nothing else */
  p->send_blocks = (uint8_t)((send != NULL || copy != NULL) && !fused && !joined ? w->nch : 0);
  p->recv_blocks = (uint8_t)(recv != NULL ? w->nch : 0);
  /* one pass per thread, each sending the lines it then overwrites (the kernels' two halves, fused 2, are
   * never asked for: their barrier cost more than the one pass) */
  p->fused = (uint8_t)(joined || fused ? 1 : 0);
  return 1;
}

/* The entry point of the pair launch in *p (pair_shape): for an all-reduce run in one pass per thread, in
 * place or joined (dev_pair_ar), braid_kernel_pair_ar, or braid_kernel_pair_ar128 in LL128; else
 * braid_kernel_pair. */
static gpu_func_t *pair_func(const gx_t *gx, const dev_pair_t *p) {
  if (!dev_pair_ar(p)) return gx->func_pair;
  return p->recv.proto == DEV_PROTO_LL128 ? gx->func_pair_ar128 : gx->func_pair_ar;
}

/* Pieces (slots) the launch moves on the ring of transfer i's send (or receive) side on channel 0, whose part
 * is the largest. */
static uint64_t ring_pieces(const dev_work_t *w, int i, int send) {
  const int peer = send ? w->xfers[i].send_peer : w->xfers[i].recv_peer;
  uint64_t pieces = 0;
  for (int k = 0; k < w->nxfers; k++) {
    const dev_xfer_t *x = &w->xfers[k];
    if ((send ? x->send_peer : x->recv_peer) == peer)
      pieces += dev_npieces(dev_part(x->bytes, x->nch, 0, 0).len);
  }
  return pieces;
}

/* Whether a launch moves data both ways at once: one step, at least two lanes, and both a send and a receive
 * (an all-reduce out of place, a reduce-scatter, an all-gather, an all-to-all, a send/receive); not a
 * broadcast, a reduce, a gather, a scatter nor an all-reduce in place, whose blocks only send, only
 * receive, or do one after the other: the bulk kernel and short batches speed up the first kind and slow
 * down the second. */
static int duplex(const gx_t *gx, const dev_work_t *w) {
  if (w->nsteps != 1 || w->step_lanes[0] < 2) return 0;
  int sends = 0, recvs = 0;
  for (int i = 0; i < w->nxfers; i++) {
    sends |= gx->xf[i].send_peer >= 0;
    recvs |= gx->xf[i].recv_peer >= 0;
  }
  return sends && recvs;
}

/* The cap on Simple batches (pieces between two signals to the peer, dev_comm_t.batch_pieces), from the
 * shape of the launch's first call (tune.h): a duplex launch whose transfers are at most duplex_max bytes
 * or dealt signals every duplex_batch pieces, so the peer's receiving blocks work while it sends; a launch of
 * one-way steps whose largest part per channel is more than oneway_lo and at most oneway_hi slots, every
 * oneway_batch. */
static int32_t launch_batch(const gx_t *gx, const dev_work_t *w, int dup) {
  const tune_shape_t *sh = gx->first;
  if (sh->batch >= 0) return sh->batch;
  if (!dup) {
    if (!gx->one_way || sh->oneway_batch == 0) return 0;
    uint64_t most = 0;
    for (int i = 0; i < w->nxfers; i++) {
      uint64_t per_ch = gx->xf[i].bytes / gx->xf[i].nch; /* fill_xfer gives every transfer a channel */
      if (per_ch > most) most = per_ch;
    }
    return most > sh->oneway_lo * (uint64_t)DEV_SLOT_BYTES && most <= sh->oneway_hi * (uint64_t)DEV_SLOT_BYTES
               ? sh->oneway_batch
               : 0;
  }
  for (int i = 0; i < w->nxfers; i++)
    if (gx->xf[i].bytes > sh->duplex_max && !gx->xf[i].dealt) return 0;
  return sh->duplex_batch;
}

/* Whether the launch is one lane of a send to a peer and then a receive from it that overwrites what the
 * send reads, over the same bytes and channels: an in-place one-shot all-reduce on two ranks, which
 * braid_kernel_bulk can run split (dev.h, "A split lane"), its sends on blocks of their own as out of place.
 * In one lane (the general kernel) a block would send each piece before it combines it, serialising the two.
 */
static int split_pair(const gx_t *gx, const dev_work_t *w) {
  if (gx->dcomm.guards == NULL || w->nsteps != 1 || w->step_lanes[0] != 1 || w->nxfers != 2) return 0;
  const dev_xfer_t *s = &gx->xf[0], *r = &gx->xf[1];
  return s->send_peer >= 0 && s->recv_peer < 0 && r->recv_peer == s->send_peer && r->send_peer < 0 &&
         s->src != NULL && r->dst == s->src && s->bytes == r->bytes && s->nch == r->nch;
}

/* Whether a launch on braid_kernel_bulk fences the parts it only sends once per block and wave of chunks
 * (dev_comm_t.wave_fence) rather than once per warp and chunk: where it reduces nothing it receives (a
 * receiver that combines each chunk as it comes is held up by waves). */
static int wave_fence(const dev_work_t *w) {
  for (int i = 0; i < w->nxfers; i++)
    if (w->xfers[i].recv_peer >= 0 && (w->xfers[i].flags & DEV_XF_REDUCE)) return 0;
  return 1;
}

/* Whether the work (one step, its list in the parameters) can take braid_kernel_bulk (dev.h): every transfer
 * Simple, not dealt and in one slice, each side that has a peer on a connection whose rings have chunk marks,
 * and no ring carrying more than DEV_SLOTS of the launch's pieces, so that room to send only waits for
 * earlier launches; and a duplex launch (duplex) or a split lane (split_pair). */
static int bulk_only(const gx_t *gx, const dev_work_t *w, int dup) {
  if (!dup || w->nxfers > DEV_SMALL_XFERS) return 0;
  for (int i = 0; i < w->nxfers; i++) {
    const dev_xfer_t *x = &w->xfers[i];
    if ((x->flags & DEV_XF_LL) || x->dealt || dev_nslices(x->bytes, x->nch) > 1) return 0;
    if (x->send_peer >= 0 &&
        (!(gx->peer_caps[x->send_peer] & PEER_MARKS_TO) || ring_pieces(w, i, 1) > DEV_SLOTS))
      return 0;
    if (x->recv_peer >= 0 &&
        (!(gx->peer_caps[x->recv_peer] & PEER_MARKS_FROM) || ring_pieces(w, i, 0) > DEV_SLOTS))
      return 0;
  }
  return 1;
}

/* Threads per block of a braid_kernel_bulk launch: a warp per chunk of the largest part, at most
 * DEV_THREADS. */
static unsigned bulk_threads(const dev_work_t *w) {
  uint64_t chunks = 1;
  for (int i = 0; i < w->nxfers; i++) {
    uint64_t part = dev_part(w->xfers[i].bytes, w->xfers[i].nch, 0, 0).len;
    uint64_t n = (part + DEV_CHUNK_BYTES - 1) / DEV_CHUNK_BYTES;
    if (n > chunks) chunks = n;
  }
  return chunks * 32 < DEV_THREADS ? (unsigned)chunks * 32 : DEV_THREADS;
}

/* Whether the launch's blocks spread over the widest step's grid rather than two lanes' (flush): where a
 * transfer (gx->xf) moves more than a ring's DEV_SLOTS pieces per channel, so that its senders wait for
 * their receivers to free slots, and none receives and forwards (a ring all-reduce). */
static int spread_widest(const gx_t *gx) {
  int cycles = 0;
  for (int i = 0; i < gx->work.nxfers; i++) {
    const dev_xfer_t *x = &gx->xf[i];
    if (x->send_peer >= 0 && x->recv_peer >= 0) return 0;
    if (x->bytes > (uint64_t)x->nch * DEV_SLOTS * DEV_SLOT_BYTES) cycles = 1;
  }
  return cycles;
}

/* The most lanes a step of the work built so far has, at least `lanes`. */
static int widest_step(const dev_work_t *w, int lanes) {
  for (int i = 0; i < w->nsteps; i++)
    if (w->step_lanes[i] > lanes) lanes = w->step_lanes[i];
  return lanes;
}

/* One bit per power-of-two size class of a launch's largest transfer, per entry point (general, small, LL,
 * bulk, pair, fused all-reduce in LL and in LL128): the launch shapes logged at INFO so far. */
static _Atomic uint64_t logged_launches[7];

/* Logs a launch's shape at INFO (TUNING) once per entry point and size class of its largest transfer, or
 * every launch at TRACE: the entry point, the grid, its lanes and spread, and the cap on Simple batches.
 * Costs one test of the log level when TUNING is off. */
static void log_launch(const gx_t *gx, const dev_work_t *w, const gpu_func_t *f, int lanes, unsigned grid,
                       unsigned threads) {
  if (!log_enabled(LOG_INFO, LOG_TUNING)) return;
  uint64_t most = 0;
  for (int i = 0; i < w->nxfers; i++)
    if (gx->xf[i].bytes > most) most = gx->xf[i].bytes;
  const int entry = f == gx->func_small        ? 1
                    : f == gx->func_ll         ? 2
                    : f == gx->func_bulk       ? 3
                    : f == gx->func_pair       ? 4
                    : f == gx->func_pair_ar    ? 5
                    : f == gx->func_pair_ar128 ? 6
                                               : 0;
  static const char *const names[7] = {
      "general", "small", "LL", "bulk", "pair", "fused all-reduce", "fused LL128 all-reduce"};
  if (!log_enabled(LOG_TRACE, LOG_TUNING) && !log_first_of_class(&logged_launches[entry], most)) return;
  char batch[32] = "no cap";
  if (w->comm.batch_pieces > 0) snprintf(batch, sizeof batch, "%d pieces", (int)w->comm.batch_pieces);
  log_write(
      log_level >= LOG_TRACE ? LOG_TRACE : LOG_INFO, LOG_TUNING, __FILE__, __LINE__,
      "%s: a launch of %u transfers in %u step%s, the largest %llu bytes over %u channels: %s entry point, "
      "%u blocks of %u threads (%d lanes, interleave %d%s), Simple batches: %s",
      gx->name, (unsigned)w->nxfers, (unsigned)w->nsteps, w->nsteps == 1 ? "" : "s", (unsigned long long)most,
      (unsigned)w->nch, names[entry], grid, threads, lanes, (int)w->comm.interleave,
      w->comm.split ? ", split" : "", batch);
}

/* ---- The last LL launch, remembered ---- */

/* Launches the memo's parameters again as call `seq`, on `s`. */
ncclResult_t gx_memo_fire(gx_t *gx, uint64_t seq, cudaStream_t s) {
  memo_t *m = &gx->memo;
  if (m->pair) {
    m->pair_params.seq = seq;
    CHECK(
        gpu_launch(m->f, m->grid, m->threads, &m->pair_params, sizeof m->pair_params, s, gx_overlaps(gx, 0)));
  } else {
    m->work.seq = seq;
    CHECK(gpu_launch(m->f, m->grid, m->threads, &m->work, sizeof m->work, s, gx_overlaps(gx, 0)));
  }
  gx->memo_used = 1;
  return ncclSuccess;
}

/* An eager launch of one step whose transfers come out of fill_xfer as the memo's did launches again with the
 * memo's parameters, only the call's number changed (a training loop's all-reduce of the same buffers, call
 * after call). What add_step and flush build from those transfers for the LL and pair entry points depends on
 * nothing else that changes while the executor lives (its settings are read at init, the kernels find their
 * rings' positions in device memory), so it is what they would build again; the lanes, their checks and the
 * choice of entry point are skipped. Otherwise the step is staged in the memo, which flush keeps if the
 * launch takes the LL or pair entry point (memo_keep). At TRACE (TUNING) every launch is built, so that each
 * is logged. */
static ncclResult_t memo_launch(gx_t *gx, const launch_ctx_t *lc, int count, int p2p, const dev_xfer_t *x,
                                int *launched) {
  memo_t *m = &gx->memo;
  *launched = 0;
  if (count > DEV_SMALL_XFERS || log_enabled(LOG_TRACE, LOG_TUNING)) return ncclSuccess;
  const size_t bytes = (size_t)count * sizeof *x; /* dev_xfer_t has no implicit padding (dev.h) */
  if (m->valid && m->count == count && m->p2p == p2p && memcmp(m->xf, x, bytes) == 0) {
    CHECK(gx_memo_fire(gx, gx->work.seq, lc->s));
    *launched = 1;
    return ncclSuccess;
  }
  m->valid = 0;
  m->count = count;
  m->p2p = p2p;
  memcpy(m->xf, x, bytes);
  gx->memo_staged = 1;
  return ncclSuccess;
}

/* After flush launched the staged step on the LL or pair entry point: its parameters become the memo's. */
static void memo_keep(gx_t *gx, gpu_func_t *f, unsigned grid, unsigned threads, int pair) {
  memo_t *m = &gx->memo;
  m->f = f;
  m->grid = grid;
  m->threads = threads;
  m->pair = pair;
  if (pair)
    m->pair_params = gx->pair;
  else
    memcpy(&m->work, &gx->work, sizeof m->work);
  m->valid = 1;
  gx->memo_used = 1;
}

/* Launches the work built so far (if any) and starts a new one. */
ncclResult_t gx_flush(gx_t *gx, const launch_ctx_t *lc, uint64_t seq) {
  dev_work_t *w = &gx->work;
  if (w->nsteps > 0 && w->nxfers > 0) {
    int widest = widest_step(w, 1);
    uint64_t spill = w->nxfers > DEV_MAX_XFERS ? (uint64_t)w->nxfers * sizeof(dev_xfer_t) : 0;
    w->comm = gx->dcomm;
    w->ext = NULL;
    w->done = NULL;
    w->tag = 0;
    if (spill == 0) memcpy(w->xfers, gx->xf, (size_t)w->nxfers * sizeof(dev_xfer_t));
    /* A launch whose list fits the parameters needs nothing after the driver copied them: no queue entry,
     * and no tag for its kernel to write at the end, a store to host memory that the kernel's completion
     * (and so the next launch on the stream) waits for. */
    wq_slot_t slot = {0};
    if (spill != 0 && !lc->capturing)
      CHECK(gx_queue_place(gx, lc, spill, &slot));
    else if (spill != 0)
      CHECK(gx_capture_place(gx, lc, spill));
    /* a grid only as wide as the channels the launch's transfers use (w->nch, at least 1 per transfer); a
     * launch of a few transfers passes only the head of the work (dev_work_small_t), to braid_kernel_ll when
     * it is LL alone, to braid_kernel_bulk when it is Simple in one slice over p2p */
    int small = spill == 0 && w->nxfers <= DEV_SMALL_XFERS;
    const int lls = small ? ll_only(w) : 0;
    const unsigned ll_thr = lls ? ll_threads(w) : 0;
    const int pair = lls && pair_shape(w, &gx->pair);
    /* the LL or the pair entry point; LL128 transfers that do not take the pair entry take the general one */
    const int ll = pair || lls == 1;
    /* an LL launch (every small call) moves no Simple batch and takes no bulk kernel: it skips both scans */
    const int dup = !ll && duplex(gx, w), split = small && !ll && !dup && split_pair(gx, w);
    if (!ll) w->comm.batch_pieces = (int16_t)launch_batch(gx, w, dup);
    gpu_func_t *f = !small                          ? gx->func
                    : pair                          ? pair_func(gx, &gx->pair)
                    : ll                            ? gx->func_ll
                    : bulk_only(gx, w, dup | split) ? gx->func_bulk
                                                    : gx->func_small;
    if (split && f == gx->func_bulk) { /* sends on blocks [0, nch), the receive on [nch, 2 nch) */
      w->comm.split = 1;
      widest = 2;
    }
    w->comm.wave_fence = f == gx->func_bulk && wave_fence(w);
    unsigned threads = ll ? ll_thr : f == gx->func_bulk ? bulk_threads(w) : DEV_THREADS;
    /* a launch of fewer lanes than the widest step can have spreads its blocks over a wider grid (dev.h,
     * block_place), blocks sharing an SM's neighbourhood less: two lanes' grid, the widest one's for
     * transfers that cycle their rings (spread_widest) */
    if (gx->spread > widest && !ll && f != gx->func_bulk) {
      int k = gx->spread > 2 && !spread_widest(gx) ? 2 : gx->spread;
      while (k > widest && (unsigned)k * w->nch > gx->grid_max) k--; /* a wide step's channels */
      if (k > widest) {
        widest = k;
        w->comm.interleave = (int16_t)k;
      }
    }
    if ((unsigned)widest * w->nch > gx->grid_max) { /* add_step keeps launches within it */
      wq_cancel(&gx->wq, &slot);
      return log_err(ncclInternalError,
                     "%s: a launch of %d lanes of %u channels exceeds the %u blocks it may take", gx->name,
                     widest, (unsigned)w->nch, gx->grid_max);
    }
    const unsigned grid =
        pair ? (unsigned)gx->pair.send_blocks + gx->pair.recv_blocks : (unsigned)widest * w->nch;
    log_launch(gx, w, f, widest, grid, threads);
    const int overlap = gx_overlaps(gx, lc->capturing);
    ncclResult_t res =
        pair ? gpu_launch(f, grid, threads, &gx->pair, sizeof gx->pair, lc->s, overlap)
             : gpu_launch(f, grid, threads, w, small ? sizeof(dev_work_small_t) : sizeof *w, lc->s, overlap);
    if (res != ncclSuccess) {
      wq_cancel(&gx->wq, &slot); /* it never reached the GPU */
      return res;
    }
    if (gx->memo_staged && w->nsteps == 1 && (pair || f == gx->func_ll))
      memo_keep(gx, f, grid, threads, pair);
  }
  w->nsteps = w->nxfers = w->nch = 0;
  w->seq = seq;
  gx->one_way = 1;
  return ncclSuccess;
}

/* Where lanes_check marks a ring: (direction, LL or Simple, peer); a lane may use both rings of a
 * connection when it has transfers on either side of the LL threshold. */
static int ring_mark(const gx_t *gx, const dev_xfer_t *x, int send) {
  int ll = (x->flags & (send ? DEV_XF_LL_SEND : DEV_XF_LL_RECV)) != 0;
  return ((send * 2 + ll) * gx->nranks) + (send ? x->send_peer : x->recv_peer);
}

/* Lanes of one step within the kernel's limits: transfers per lane, and rings (peer, direction, protocol)
 * per lane. `mark` has 4 * nranks entries. */
static ncclResult_t lanes_check(const gx_t *gx, const dev_xfer_t *x, int n, int *mark, uint64_t seq) {
  for (int k = 0; k < 4 * gx->nranks; k++) mark[k] = 0;
  for (int i = 0; i < n;) {
    int j = i, rings = 0;
    for (; j < n && x[j].lane == x[i].lane; j++) {
      if (x[j].send_peer >= 0 && !mark[ring_mark(gx, &x[j], 1)]++) rings++;
      if (x[j].recv_peer >= 0 && !mark[ring_mark(gx, &x[j], 0)]++) rings++;
    }
    for (int k = i; k < j; k++) { /* clear what this lane set, for the next */
      if (x[k].send_peer >= 0) mark[ring_mark(gx, &x[k], 1)] = 0;
      if (x[k].recv_peer >= 0) mark[ring_mark(gx, &x[k], 0)] = 0;
    }
    if (j - i > DEV_LANE_XFERS || rings > DEV_LANE_RINGS)
      return log_err(ncclInvalidUsage,
                     "%s: a group step (call %llu) puts %d transfers over %d connections in one lane; a lane "
                     "takes at most %d transfers and %d connections: split the group",
                     gx->name, (unsigned long long)seq, j - i, rings, DEV_LANE_XFERS, DEV_LANE_RINGS);
    i = j;
  }
  return ncclSuccess;
}

/* Room for n transfers in the list being built. */
static ncclResult_t xf_reserve(gx_t *gx, uint32_t n) {
  if (n <= gx->xf_cap) return ncclSuccess;
  uint32_t cap = gx->xf_cap < 64 ? 64 : gx->xf_cap;
  while (cap < n) cap *= 2;
  dev_xfer_t *xf = realloc(gx->xf, (size_t)cap * sizeof *xf);
  if (xf == NULL) return log_err(ncclSystemError, "%s: out of host memory for %u transfers", gx->name, cap);
  gx->xf = xf;
  gx->xf_cap = cap;
  return ncclSuccess;
}

/* Whether the step has a transfer of at least `min` bytes (with `peers`: between ranks, not a local copy). */
static int step_has_wide(const plan_t *plan, const step_t *st, int peers, uint64_t min) {
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    if ((!peers || x->send_peer >= 0 || x->recv_peer >= 0) && x->bytes >= min) return 1;
  }
  return 0;
}

/* Marks the step's dealt transfers (dev.h, "Dealt transfers"): each Simple transfer in its call's dealt band
 * (tune.h: two ranks, ring collectives whose two ranks' steps hold the same transfers) that only sends or
 * only receives, over a connection whose rings have chunk marks (p2p), and has no other transfer with a
 * peer in its lane (x, sorted by lane). Both ends of a connection agree: a ring's step on two ranks holds
 * one send and one receive of the same size on each rank, however either rank's buffers lie (a local copy,
 * which one rank may have and the other not, has no peer and changes nothing here), each alone in its lane
 * unless a transfer both receives and sends (the fused all-reduce: none is dealt then, on either rank). Two
 * ranks have one connection each way, so a step has at most one dealt send, which the step's counters
 * serve. */
static void dealt_mark(const gx_t *gx, const tune_shape_t *sh, dev_xfer_t *x, int n) {
  if (sh->dealt_min == 0 || gx->nranks != 2) return;
  for (int i = 0; i < n; i++) {
    const int send = x[i].send_peer >= 0, peer = send ? x[i].send_peer : x[i].recv_peer;
    if (send == (x[i].recv_peer >= 0) || (x[i].flags & DEV_XF_LL) || x[i].bytes < sh->dealt_min ||
        (sh->dealt_max != 0 && x[i].bytes > sh->dealt_max) ||
        !(gx->peer_caps[peer] & (send ? PEER_MARKS_TO : PEER_MARKS_FROM)))
      continue;
    int alone = 1;
    for (int j = 0; j < n; j++)
      alone &= j == i || x[j].lane != x[i].lane || (x[j].send_peer < 0 && x[j].recv_peer < 0);
    x[i].dealt = (uint8_t)alone;
  }
}

/* Whether the step's transfers take up to gx->rings channels instead of gx->nch (tune_rings), as its call's
 * shape says (TUNE_WIDE_STEP, or TUNE_WIDE_BIG with a transfer of at least wide_min). The rows that say so
 * are those of steps with two lanes at most however their buffers lie (two ranks: a one-way collective, an
 * all-reduce or a reduce-scatter, which have no local copy), and every rank's step of a collective serves
 * the same call, so both ends of its connections agree. */
static int wide_step(const gx_t *gx, const plan_t *plan, const step_t *st, const tune_shape_t *sh) {
  if (gx->rings <= gx->nch) return 0;
  return sh->wide == TUNE_WIDE_STEP ||
         (sh->wide == TUNE_WIDE_BIG && step_has_wide(plan, st, 0, sh->wide_min));
}

/* Whether a step takes the rings' channels for its transfers between the ranks of at least wide_min bytes
 * (TUNE_WIDE_EACH: send/receive, all-to-all, all-gather on two ranks), each by its own size, which both ends
 * know alike, since the two ranks' steps may hold different transfers: one may copy its own block (out of
 * place) where the other does not (in place), or send to itself, or group its point-to-point calls
 * otherwise. Returns 1 when some such transfer is that large; the step's local copies then join a peer's lane
 * (assign_lanes), so that it has two lanes at most, as the grid asks of lanes of the rings' channels. */
static int wide_p2p(const gx_t *gx, const plan_t *plan, const step_t *st, const tune_shape_t *sh) {
  if (gx->rings <= gx->nch || sh->wide != TUNE_WIDE_EACH) return 0;
  return step_has_wide(plan, st, 1, sh->wide_min);
}

/* ---- What the copy-engine path asks of the executor (ce_exec_t) ---- */

typedef struct {
  gx_t *gx;
  const launch_ctx_t *lc;
  const tune_shape_t *shape; /* the step's call's */
} exec_ctx_t;

static ncclResult_t exec_wait(void *arg, cudaStream_t stream, uint32_t *raise, uint32_t *word, int peer,
                              int is_send, uint64_t seq) {
  const exec_ctx_t *c = arg;
  dev_wait_t w = {
      .comm = c->gx->dcomm, .word = word, .raise = raise, .seq = seq, .peer = peer, .is_send = is_send};
  return gpu_launch(c->gx->func_wait, 1, 32, &w, sizeof w, stream, gx_overlaps(c->gx, c->lc->capturing));
}

static ncclResult_t exec_combine(void *arg, cudaStream_t stream, const xfer_t *x, const char *from,
                                 uint32_t *word, int peer, uint64_t seq, uint32_t nchunks,
                                 const uint64_t *ends) {
  const exec_ctx_t *c = arg;
  dev_combine_t w = {.comm = c->gx->dcomm,
                     .word = word,
                     .from = from,
                     .seq = seq,
                     .peer = peer,
                     .nchunks = nchunks,
                     .tile = from != NULL ? c->gx->pull_tile : 0};
  fill_xfer(c->gx, x, c->shape, 0, 1, &w.x);
  memcpy(w.ends, ends, nchunks * sizeof *ends);
  return gpu_launch(c->gx->func_combine, from != NULL ? c->gx->pull_blocks : c->gx->combine_blocks,
                    DEV_THREADS, &w, sizeof w, stream, gx_overlaps(c->gx, c->lc->capturing));
}

static ncclResult_t exec_keep(void *arg, gpu_mem_t *mapping) {
  const exec_ctx_t *c = arg;
  return gx_token_keep(c->gx, c->lc->token, mapping);
}

static ncclResult_t exec_push(void *arg, cudaStream_t stream, dev_push_t *w) {
  const exec_ctx_t *c = arg;
  w->comm = c->gx->dcomm;
  return gpu_launch(c->gx->func_push, c->gx->push_blocks, DEV_THREADS, w, sizeof *w, stream,
                    gx_overlaps(c->gx, c->lc->capturing));
}

/* Appends step `s` of the plan to the launch being built, launching first when it would not fit: in the
 * parameters or the work queue, or in the grid (a launch's blocks wait for each other, so they must all run
 * at once: at most grid_max of them, the widest step's lanes of nch channels, which a wide step's two lanes
 * of more channels also fit but not beside a wider step). */
/* A step of plain local copies (no peer, nothing combined, scaled or divided) of at least the shape's
 * local_ce_min bytes: the copy engines move it, in stream order after the steps before it. */
static int local_copies(const plan_t *plan, const step_t *st, const tune_shape_t *sh) {
  uint64_t bytes = 0;
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    if (x->recv_peer >= 0 || x->send_peer >= 0 || (x->flags & XF_REDUCE) || x->src == NULL || x->dst == NULL)
      return 0;
    if ((x->flags & (XF_PREPARE | XF_LAST)) && !red_is_identity(x->red)) return 0;
    bytes += x->bytes;
  }
  return sh->local_ce_min > 0 && bytes >= sh->local_ce_min;
}

static ncclResult_t copy_step(gx_t *gx, const plan_t *plan, const step_t *st, const launch_ctx_t *lc) {
  CHECK(gx_flush(gx, lc, st->task->seq));
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    if (x->dst != x->src) CHECK(gpu_copy_dd_async(x->dst, x->src, x->bytes, lc->s));
  }
  return ncclSuccess;
}

ncclResult_t gx_add_step(gx_t *gx, const plan_t *plan, int s, const launch_ctx_t *lc) {
  const step_t *st = &plan->steps[s];
  const tune_shape_t *sh = &gx->shapes[st->task - plan->tasks];
  dev_work_t *w = &gx->work;
  if (st->ce) { /* after the steps before it, on the same stream */
    gx->copies_only = 0;
    if (gx->ce == NULL)
      return log_err(ncclInternalError, "%s: a copy-engine step (call %llu) on an executor without them",
                     gx->name, (unsigned long long)st->task->seq);
    CHECK(gx_flush(gx, lc, st->task->seq));
    exec_ctx_t c = {gx, lc, sh};
    const ce_exec_t ex = {
        .wait = exec_wait, .combine = exec_combine, .push = exec_push, .keep = exec_keep, .arg = &c};
    return ce_step(gx->ce, plan, s, lc->s, lc->capturing, &ex);
  }
  if (local_copies(plan, st, sh)) return copy_step(gx, plan, st, lc);
  gx->copies_only = 0;
  /* an eager launch's list must fit the queue (an entry is a header and the list) */
  uint64_t max = DEV_MAX_SPILL, fits = (gx->wq.cap - WQ_ALIGN) / sizeof(dev_xfer_t);
  if (!lc->capturing && fits < max) max = fits;
  if ((uint64_t)st->count > max)
    return log_err(ncclInvalidUsage,
                   "%s: a group step of %d transfers on one GPU exceeds the %llu a launch takes%s", gx->name,
                   st->count, (unsigned long long)max,
                   lc->capturing ? "" : " (with this NCCL_WORK_FIFO_BYTES)");
  if (w->nsteps == DEV_MAX_STEPS || w->nxfers + (uint64_t)st->count > max)
    CHECK(gx_flush(gx, lc, st->task->seq));
  CHECK(xf_reserve(gx, w->nxfers + st->count));
  dev_xfer_t *x = &gx->xf[w->nxfers];
  const int p2p = wide_p2p(gx, plan, st, sh);
  const int cap = p2p || wide_step(gx, plan, st, sh) ? gx->rings : gx->nch;
  unsigned nch = 0;
  for (int i = 0; i < st->count; i++) {
    const xfer_t *in = &plan->xfers[st->first + i];
    /* wide_p2p: a transfer between the ranks by its own size, a local copy wide */
    const int own = p2p && (in->send_peer >= 0 || in->recv_peer >= 0) && in->bytes < sh->wide_min;
    fill_xfer(gx, in, sh, (uint16_t)(st->task - plan->tasks), own ? gx->nch : cap, &x[i]);
    if (x[i].nch > nch) nch = x[i].nch;
  }
  if (w->nsteps == 0 && plan->nsteps == 1 && !lc->capturing) {
    int launched;
    CHECK(memo_launch(gx, lc, st->count, p2p, x, &launched));
    if (launched) return ncclSuccess;
  }
  int parent[2 * GX_MAX_RANKS + 1], lane_of[2 * GX_MAX_RANKS + 1], mark[4 * GX_MAX_RANKS];
  const int lanes = assign_lanes(x, st->count, gx->nranks, p2p, parent, lane_of);
  dealt_mark(gx, sh, x, st->count);
  CHECK(lanes_check(gx, x, st->count, mark, st->task->seq));
  const unsigned widest = (unsigned)widest_step(w, lanes);
  if (w->nsteps > 0 && widest * (nch > w->nch ? nch : w->nch) > gx->grid_max) {
    const uint16_t before = w->nxfers; /* the earlier steps go alone; this one opens the next launch */
    CHECK(gx_flush(gx, lc, st->task->seq));
    memmove(gx->xf, gx->xf + before, (size_t)st->count * sizeof *x);
  }
  if (w->nsteps == 0) gx->first = sh;
  if (!one_way_kind(st->task->kind)) gx->one_way = 0;
  if (nch > w->nch) w->nch = nch;
  w->step_lanes[w->nsteps] = (uint16_t)lanes;
  w->nxfers = (uint16_t)(w->nxfers + st->count);
  w->step_end[w->nsteps++] = w->nxfers;
  return ncclSuccess;
}
