/*
 * The direct path of a GPU communicator (see ce.h): steps that bypass the rings, to any peer reached by p2p.
 */
#include "ce.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "core/tune.h"
#include "device/dev.h"
#include "gpu/gpu.h"
#include "transport/mbox.h"
#include "transport/peer_mem.h"

#define TAG_CE_INIT  0x43454930u /* "0IEC": flag words and the threshold, at init */
#define TAG_CE_READY 0x43455230u /* "0REC": both ranks mapped the other's words (and mailbox) */
#define TAG_CE_STEP  0x43455330u /* "0SEC": a step message, where the ranks have no mailbox */
#define CE_MAGIC     0x42434531u

/* A reduction's chunks start at multiples of this many bytes of its transfer: whole elements of any type,
 * and 16-byte parts for the combine's blocks. */
#define CE_CHUNK_ALIGN (64u * 1024)

/* A rank's flag words (in its own memory), raised by the peer: [W_READY] the peer's outputs are free (this
 * rank may send), [W_DONE] the peer's copy into this rank's outputs has finished (a reduction's: how many of
 * its chunks have landed, reduce_step); and one of its own, [W_BLOCKS], the push kernel's count of its blocks
 * done (dev_push_t). */
enum { W_READY = 0, W_DONE = 1, W_BLOCKS = 2, W_COUNT = 3 };

/* Step messages a mailbox holds. ce_offer sends at most CE_OFFERS_MAX for one plan (the first candidate
 * steps; the kernels move the rest), and a rank can be at most two plans ahead of its peer's reads: it
 * settles each plan, which needs the peer's messages of it, which the peer sends only after it read this
 * rank's messages of the plan before. So a send never finds the mailbox full, and never waits. */
#define CE_MBOX_SLOTS 64
#define CE_OFFERS_MAX (CE_MBOX_SLOTS / 2)

/* The direct path to one peer. */
typedef struct {
  int rank;  /* the peer's */
  int local; /* a rank of this process: addresses travel as they are, nothing is mapped */
  int pid;   /* a process of this pid namespace: checked while waiting for its messages (else 0) */
  /* thresholds, the larger of the two ranks' (tune_direct) */
  uint64_t min_bytes;      /* the copy engines, for steps that only copy */
  uint64_t reduce_min;     /* the copy engines, for reductions (UINT64_MAX: never) */
  uint64_t chunk_min;      /* a reduction's chunks, at least (a multiple of CE_CHUNK_ALIGN) */
  uint64_t pull_min;       /* a reduce pulled (UINT64_MAX: never) */
  uint64_t push_min;       /* a step that only copies, pushed one way (UINT64_MAX: never) */
  uint64_t push_xmin;      /* the same where each rank sends and receives */
  tp_mbox_t *inbox;        /* the peer's step messages to this rank (NULL: over the bootstrap) */
  tp_mbox_t *outbox;       /* this rank's to the peer: the peer's inbox, mapped here */
  gpu_mem_t *words;        /* this rank's words for this peer */
  gpu_mem_t *peer_words;   /* the peer's, mapped (another process) */
  uint32_t *mine, *theirs; /* their device addresses */
  tp_peer_mem_t *mem;      /* the peer's buffers mapped here for eager steps */
} ce_peer_t;

struct ce {
  int dev, rank, nranks;
  const char *name;
  alloc_acct_t *acct;
  boot_t *boot;
  const volatile int *abort_flag; /* the communicator's: ends a wait for a peer's message */
  ce_peer_t **peers;              /* [nranks]: the path to each peer (NULL: none) */
  cudaStream_t side;              /* local copies, beside the link's copy; a reduction's combine */
  gpu_event_t *fork, *join;       /* order the side stream after the call's stream, and back */
  struct offer *offers;           /* ce_offer's messages, one per candidate step of the plan, for ce_settle */
  int noffers, cap_offers;
  int offered;       /* the last plan had candidate steps (ce_offered) */
  struct held *held; /* captured steps' mappings made by ce_settle, until ce_step hands them to the graph */
  int nheld, cap_held;
  _Atomic uint64_t logged[OP_COUNT]; /* size classes whose first step was logged (TUNING) */
};

/* What each rank sends a peer at init. */
typedef struct {
  uint32_t magic;
  int32_t dev; /* the sender's device (a peer in this process enables access to it) */
  uint64_t min_bytes;
  uint64_t reduce_min;
  uint64_t chunk_min;
  uint64_t pull_min;
  uint64_t push_min;
  uint64_t push_xmin;
  gpu_export_t words;   /* another process: the words' export */
  uint64_t words_at;    /* this process: their address */
  tp_mbox_addr_t inbox; /* the step-message inbox (an empty name and no address: none) */
  uint64_t pidns;       /* this process's pid namespace (its inode; 0: unknown) */
} init_msg_t;

/* What each rank sends the other for a candidate step. */
typedef struct step_msg {
  uint32_t magic;
  int32_t kind;    /* the step's call (point-to-point steps as OP_SEND) */
  int32_t willing; /* this rank can take the copy engines for the step */
  int32_t nsend, nrecv;
  int32_t captured; /* the call is being captured into a graph (both ranks must be, or neither) */
  int32_t combine;  /* a reduction: the receiver combines what lands (both ranks must say so) */
  int32_t pull;     /* a reduction's only transfer, received (pulls): read the sender's input */
  int32_t pullable; /* a reduction's only transfer, sent: its input may be read where it lies (in, in_at) */
  uint64_t send_bytes[CE_MAX_XFERS], recv_bytes[CE_MAX_XFERS];
  gpu_ptr_export_t out[CE_MAX_XFERS]; /* this rank's output of each receive, in list order */
  uint64_t out_at[CE_MAX_XFERS];      /* the peer in this process: their addresses instead */
  gpu_ptr_export_t in;                /* pullable: this rank's input */
  uint64_t in_at;
} step_msg_t;

/* A message sent by ce_offer, the step it describes and its peer. */
typedef struct offer {
  int step;
  ce_peer_t *p;
  step_msg_t msg;
} offer_t;

/* A mapping of the peer's output made for a captured step. */
typedef struct held {
  int step;
  gpu_mem_t *mem;
} held_t;

/* Unmaps what no graph took (a launch that failed between ce_settle and ce_step). */
static void drop_held(ce_t *ce) {
  for (int i = 0; i < ce->nheld; i++) gpu_mem_release(ce->held[i].mem);
  ce->nheld = 0;
}

/* ---- Step messages ---- */

static tp_mbox_wait_t waiting_for(const ce_t *ce, const ce_peer_t *p) {
  return (tp_mbox_wait_t){.comm = ce->name,
                          .rank = ce->rank,
                          .peer = p->rank,
                          .peer_pid = p->pid,
                          .abort_flag = ce->abort_flag,
                          .what = "step message"};
}

/* A step message to the peer and from it: through the mailboxes where both ranks have them, else over the
 * bootstrap. */
static ncclResult_t step_send(ce_t *ce, ce_peer_t *p, const step_msg_t *m) {
  const tp_mbox_wait_t who = waiting_for(ce, p);
  return p->outbox != NULL ? tp_mbox_send(p->outbox, m, &who)
                           : boot_send(ce->boot, p->rank, TAG_CE_STEP, m, sizeof *m);
}
static ncclResult_t step_recv(ce_t *ce, ce_peer_t *p, step_msg_t *m) {
  const tp_mbox_wait_t who = waiting_for(ce, p);
  return p->outbox != NULL ? tp_mbox_recv(p->inbox, m, &who)
                           : boot_recv(ce->boot, p->rank, TAG_CE_STEP, m, sizeof *m);
}

/* ---- Setting the path up ---- */

static void release_peer(ce_t *ce, ce_peer_t *p) {
  if (p == NULL) return;
  tp_peer_mem_free(p->mem);
  tp_mbox_close(p->inbox);
  tp_mbox_close(p->outbox);
  if (p->peer_words != NULL) gpu_mem_release(p->peer_words);
  if (p->words != NULL) {
    mem_release(ce->acct, gpu_mem_size(p->words), 1);
    gpu_mem_release(p->words);
  }
  free(p);
}

static void release(ce_t *ce) {
  for (int q = 0; ce->peers != NULL && q < ce->nranks; q++) release_peer(ce, ce->peers[q]);
  free(ce->peers);
  free(ce->offers);
  drop_held(ce);
  free(ce->held);
  if (ce->fork != NULL) gpu_event_destroy(ce->fork);
  if (ce->join != NULL) gpu_event_destroy(ce->join);
  gpu_stream_destroy(ce->side);
  mem_free(ce->acct, ce, sizeof *ce);
}

/* Each bit of *bits kept only where the peer's is set too: both ranks get the same answer, and neither has it
 * before both sent (after whatever each did before). */
static ncclResult_t both_have(ce_t *ce, int peer, uint32_t tag, uint32_t *bits) {
  uint32_t theirs = 0;
  CHECK(boot_send(ce->boot, peer, tag, bits, sizeof *bits));
  CHECK(boot_recv(ce->boot, peer, tag, &theirs, sizeof theirs));
  *bits &= theirs;
  return ncclSuccess;
}

/* The larger of two thresholds. */
static uint64_t larger(uint64_t a, uint64_t b) {
  return a > b ? a : b;
}

/* This rank's half of the path to peer q: its words (exported for a peer in another process) and its inbox,
 * described in *mine. A rank that cannot make its words says so (min_bytes 0) and both go without the path;
 * one that cannot make its inbox, and both send step messages over the bootstrap. */
static ncclResult_t peer_open(ce_t *ce, const tp_peer_t *peers, links_t *links, int q, const tune_direct_t *d,
                              ce_peer_t **p_p, init_msg_t *mine) {
  ce_peer_t *p = calloc(1, sizeof *p);
  if (p == NULL) return log_err(ncclSystemError, "%s: out of host memory for the direct path", ce->name);
  p->rank = q;
  p->local = peers[q].pid == peers[ce->rank].pid;
  p->pid = peers[q].pid;
  *mine = (init_msg_t){.magic = CE_MAGIC,
                       .dev = ce->dev,
                       .min_bytes = d->copy_min,
                       .reduce_min = d->reduce_min,
                       .pull_min = d->pull_min,
                       .push_min = d->push_min,
                       .push_xmin = d->push_xmin,
                       /* chunks end at multiples of CE_CHUNK_ALIGN, whatever was asked */
                       .chunk_min = d->chunk_min > CE_CHUNK_ALIGN ? (d->chunk_min + CE_CHUNK_ALIGN - 1) /
                                                                        CE_CHUNK_ALIGN * CE_CHUNK_ALIGN
                                                                  : CE_CHUNK_ALIGN,
                       .pidns = tp_pid_namespace()};
  mem_doing("copy-engine flag words (optional: without them the copy engines stay off)");
  if (gpu_dev_alloc(ce->dev, W_COUNT * sizeof(uint32_t), &p->words) != ncclSuccess ||
      (!p->local && gpu_mem_export(p->words, &mine->words) != ncclSuccess))
    mine->min_bytes = 0;
  mem_doing(NULL);
  if (p->words != NULL) {
    mine->words_at = (uint64_t)(uintptr_t)gpu_mem_ptr(p->words);
    mem_charge(ce->acct, gpu_mem_size(p->words), 1, "copy-engine flag words");
  }
  if (mine->min_bytes > 0 && tp_mbox_create(links->tp, q, p->local, sizeof(step_msg_t), CE_MBOX_SLOTS,
                                            &p->inbox, &mine->inbox) != ncclSuccess)
    p->inbox = NULL; /* logged; step messages go over the bootstrap */
  *p_p = p;
  return ncclSuccess;
}

/* The other half, from the peer's message: the agreed thresholds, the peer's words and inbox mapped here.
 * Whether both ranks have the path (and the mailboxes) is settled with the peer; returns with *ok. */
static ncclResult_t peer_agree(ce_t *ce, ce_peer_t *p, const init_msg_t *mine, const init_msg_t *theirs,
                               int *ok_p) {
  if (theirs->magic != CE_MAGIC)
    return log_err(ncclInternalError, "%s: rank %d sent a malformed copy-engine setup", ce->name, p->rank);
  /* either rank's 0 turns the path off on both; otherwise both take the larger threshold */
  int ok = mine->min_bytes > 0 && theirs->min_bytes > 0 && ce->side != NULL;
  if (ok) {
    p->min_bytes = larger(mine->min_bytes, theirs->min_bytes);
    p->reduce_min = larger(mine->reduce_min, theirs->reduce_min);
    p->chunk_min = larger(mine->chunk_min, theirs->chunk_min);
    p->pull_min = larger(mine->pull_min, theirs->pull_min);
    p->push_min = larger(mine->push_min, theirs->push_min);
    p->push_xmin = larger(mine->push_xmin, theirs->push_xmin);
    ok = (!p->local                ? gpu_mem_import(ce->dev, &theirs->words, &p->peer_words)
          : theirs->dev != ce->dev ? gpu_enable_peer_access(ce->dev, theirs->dev)
                                   : ncclSuccess) == ncclSuccess &&
         tp_peer_mem_init(ce->dev, ce->name, ce->rank, p->rank, &p->mem) == ncclSuccess;
  }
  /* bit 0 the path, bit 1 the mailboxes; also keeps each rank's words (and their export) and its inbox
   * until the other has mapped them */
  const int mapped = theirs->inbox.name[0] != 0 || theirs->inbox.at != 0;
  uint32_t bits = (uint32_t)ok | (uint32_t)(ok && p->inbox != NULL && mapped &&
                                            tp_mbox_attach(&theirs->inbox, p->local, sizeof(step_msg_t),
                                                           CE_MBOX_SLOTS, &p->outbox) == ncclSuccess)
                                     << 1;
  CHECK(both_have(ce, p->rank, TAG_CE_READY, &bits));
  *ok_p = bits & 1;
  if (!(bits & 2)) {
    tp_mbox_close(p->outbox);
    tp_mbox_close(p->inbox);
    p->outbox = p->inbox = NULL;
    if (*ok_p)
      INFO(LOG_INIT | LOG_TUNING, "%s rank %d: step messages go over the bootstrap", ce->name, ce->rank);
  }
  /* a pid from another namespace names some other process here, or none */
  if (p->local || mine->pidns == 0 || theirs->pidns != mine->pidns) p->pid = 0;
  if (*ok_p) {
    p->mine = gpu_mem_ptr(p->words);
    p->theirs = p->local ? (uint32_t *)(uintptr_t)theirs->words_at : gpu_mem_ptr(p->peer_words);
  }
  return ncclSuccess;
}

static void log_path(const ce_t *ce, const ce_peer_t *p) {
  INFO(
      LOG_INIT | LOG_TUNING,
      "%s rank %d: copy engines move steps whose every transfer to or from rank %d moves at least %llu bytes "
      "(BRAID_CE_MIN_BYTES); out-of-place reductions from %llu bytes (BRAID_CE_REDUCE_MIN_BYTES, 0: never), "
      "landing in chunks of at least %llu bytes (BRAID_CE_CHUNK_BYTES); a reduce's root reads the other "
      "rank's input where it lies from %llu bytes (BRAID_CE_PULL_MIN_BYTES, 0: never); steps that only copy "
      "are pushed by one kernel from %llu bytes a transfer (BRAID_CE_PUSH_MIN_BYTES, 0: never), from %llu "
      "where each rank sends and receives (BRAID_CE_PUSH_EXCHANGE_MIN_BYTES)",
      ce->name, ce->rank, p->rank, (unsigned long long)p->min_bytes,
      (unsigned long long)(p->reduce_min == UINT64_MAX ? 0 : p->reduce_min), (unsigned long long)p->chunk_min,
      (unsigned long long)(p->pull_min == UINT64_MAX ? 0 : p->pull_min),
      (unsigned long long)(p->push_min >= p->min_bytes ? 0 : p->push_min),
      (unsigned long long)(p->push_xmin >= p->min_bytes ? 0 : p->push_xmin));
}

/* The peers the path may reach: on this host, over p2p. The same answer on both ends: both see the same peer
 * table and pick the same transport. */
static int reachable(int rank, int q, const tp_peer_t *peers, links_t *links) {
  return q != rank && peers[q].host_hash == peers[rank].host_hash && tp_link(links->tp, q) == TP_LINK_P2P;
}

/* Sets up the path to every reachable peer: each rank describes its half to each (all sent before any is
 * received), then both agree. */
static ncclResult_t open_peers(ce_t *ce, const tp_peer_t *peers, links_t *links, const tune_direct_t *d) {
  init_msg_t *mine = calloc((size_t)ce->nranks, sizeof *mine);
  if (mine == NULL) return log_err(ncclSystemError, "%s: out of host memory for the direct path", ce->name);
  ncclResult_t res = ncclSuccess;
  for (int q = 0; q < ce->nranks && res == ncclSuccess; q++)
    if (reachable(ce->rank, q, peers, links)) {
      res = peer_open(ce, peers, links, q, d, &ce->peers[q], &mine[q]);
      if (res == ncclSuccess) res = boot_send(ce->boot, q, TAG_CE_INIT, &mine[q], sizeof mine[q]);
    }
  for (int q = 0; q < ce->nranks && res == ncclSuccess; q++) {
    if (ce->peers[q] == NULL) continue;
    init_msg_t theirs;
    int ok = 0;
    res = boot_recv(ce->boot, q, TAG_CE_INIT, &theirs, sizeof theirs);
    if (res == ncclSuccess) res = peer_agree(ce, ce->peers[q], &mine[q], &theirs, &ok);
    if (res == ncclSuccess && ok) {
      log_path(ce, ce->peers[q]);
    } else if (res == ncclSuccess) {
      INFO(LOG_INIT | LOG_TUNING,
           "%s rank %d: no copy-engine path to rank %d (BRAID_CE_MIN_BYTES is 0 on a rank, or a rank could "
           "not "
           "set it up)",
           ce->name, ce->rank, q);
      release_peer(ce, ce->peers[q]);
      ce->peers[q] = NULL;
    }
  }
  free(mine);
  return res;
}

ncclResult_t ce_init(int dev, int rank, int nranks, const tp_peer_t *peers, links_t *links, boot_t *boot,
                     const volatile int *abort_flag, alloc_acct_t *acct, const char *name, ce_t **ce_p) {
  *ce_p = NULL;
  tune_direct_t d;
  if (dev < 0 || !tune_direct(nranks, &d)) return ncclSuccess; /* no row of the table has a direct path */
  int any = 0;
  for (int q = 0; q < nranks; q++) any |= reachable(rank, q, peers, links);
  if (!any) return ncclSuccess;
  ce_t *ce;
  CHECK(MEM_CALLOC(acct, ce, 1, "copy-engine path"));
  *ce = (ce_t){.dev = dev,
               .rank = rank,
               .nranks = nranks,
               .abort_flag = abort_flag,
               .name = name,
               .acct = acct,
               .boot = boot};
  ncclResult_t res = ncclSuccess;
  ce->peers = calloc((size_t)nranks, sizeof *ce->peers);
  if (ce->peers == NULL) {
    release(ce);
    return log_err(ncclSystemError, "%s: out of host memory for the direct path", name);
  }
  gpu_scope_t scope;
  CHECK_GOTO(gpu_enter(dev, &scope), res, fail);
  /* The path is an optimisation: a rank that cannot set it up (logged) says so, and both go without it;
   * only a failed exchange with a peer fails init. */
  if (gpu_stream_create(&ce->side) != ncclSuccess || gpu_event_create(&ce->fork) != ncclSuccess ||
      gpu_event_create(&ce->join) != ncclSuccess)
    ce->side = NULL;
  res = open_peers(ce, peers, links, &d);
  gpu_leave(&scope);
  if (res != ncclSuccess) goto fail;
  any = 0;
  for (int q = 0; q < nranks; q++) any |= ce->peers[q] != NULL;
  if (!any) {
    release(ce);
    return ncclSuccess;
  }
  *ce_p = ce;
  return ncclSuccess;
fail:
  release(ce);
  return res;
}

/* Whether a peer transfer (not a local copy) of the step. */
static int is_peer(const xfer_t *x) {
  return x->recv_peer >= 0 || x->send_peer >= 0;
}

/* Whether a peer transfer belongs to a reduction the copy engines can carry: a send of this rank's input
 * (prepared, which is a copy for every operation but PreMulSum), or a receive combined with this rank's
 * operand into its output. PreMulSum would need the peer's bytes scaled on the way. */
static int combining(const xfer_t *x) {
  return (x->flags & (XF_REDUCE | XF_PREPARE)) != 0;
}
static int combinable(const xfer_t *x) {
  if (x->red == NULL || x->red->kind == RED_PREMULSUM) return 0;
  return x->send_peer >= 0 ? (x->flags & XF_REDUCE) == 0 : (x->flags & XF_REDUCE) != 0;
}

/* The smallest transfer a step that only copies may have and still bypass the rings: pushed by a kernel
 * from push_min (push_xmin where the rank both sends to and receives from the peer), by the copy engines
 * from min_bytes; an eager pushed step costs the host an exchange of step messages per call, which smaller
 * transfers do not win back. Both ranks answer alike: one's sends are the other's receives. */
static uint64_t copy_min(const ce_peer_t *p, int exchange) {
  const uint64_t push = exchange ? p->push_xmin : p->push_min;
  return push < p->min_bytes ? push : p->min_bytes;
}

/* Whether the step may take the copy engines, from its transfers between the ranks alone: what one rank
 * sends the other receives, and a reduction's send faces a combining receive, so both ranks answer alike.
 * A reduction's step has at most one transfer each way and no local copy. */
static int candidate(const ce_peer_t *p, const plan_t *plan, const step_t *st) {
  int nsend = 0, nrecv = 0, combines = 0, locals = 0, pulled = 0;
  uint64_t copy_least = UINT64_MAX; /* the smallest plain copy between the ranks (copy_min, after the loop) */
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    if (!is_peer(x)) {
      locals++;
      continue;
    }
    const uint64_t min = !combining(x) ? 0 : p->reduce_min < p->pull_min ? p->reduce_min : p->pull_min;
    if ((x->recv_peer >= 0 && x->send_peer >= 0) || x->bytes < min || (x->flags & (XF_SEQ | XF_PREPARED)) ||
        (combining(x) && !combinable(x)))
      return 0;
    if (!combining(x) && x->bytes < copy_least) copy_least = x->bytes;
    combines += combining(x);
    pulled |= combining(x) && x->bytes < p->reduce_min;
    if (x->send_peer >= 0)
      nsend++;
    else
      nrecv++;
  }
  /* plain copies from copy_min: lower for an exchange, where the rank both sends to and receives from the
   * peer */
  if (copy_least < copy_min(p, nsend > 0 && nrecv > 0)) return 0;
  /* one-shot, the root of a reduce combines in its lane of XF_SEQ transfers (refused above) while the other
   * rank's send looks like the ring's: the step's algorithm settles it for both */
  if (combines > 0 && (st->oneshot || nsend > 1 || nrecv > 1 || locals > 0)) return 0;
  /* below the copy engines' threshold a reduction can only be pulled: one transfer, one way (a reduce) */
  if (pulled && nsend + nrecv != 1) return 0;
  return nsend + nrecv > 0 && nsend <= CE_MAX_XFERS && nrecv <= CE_MAX_XFERS;
}

/* The peer of a step whose transfers with a peer all go to one, reached by the path; else NULL. */
static ce_peer_t *step_peer(const ce_t *ce, const plan_t *plan, const step_t *st) {
  int q = -1;
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    const int a = x->send_peer, b = x->recv_peer;
    if ((a >= 0 && b >= 0 && a != b) || (q >= 0 && ((a >= 0 && a != q) || (b >= 0 && b != q)))) return NULL;
    if (a >= 0 || b >= 0) q = a >= 0 ? a : b;
  }
  return q >= 0 ? ce->peers[q] : NULL;
}

/* Offers made for peer p so far in this plan. */
static int offers_to(const ce_t *ce, const ce_peer_t *p) {
  int n = 0;
  for (int k = 0; k < ce->noffers; k++) n += ce->offers[k].p == p;
  return n;
}

/* Where the chunks of a reduction's transfer of `bytes` end (ends[], returned: how many): each three fifths
 * of what is left, at least chunk_min, at multiples of CE_CHUNK_ALIGN: the last ones, whose combine nothing
 * hides, are small, and the chunks few, since each costs the link a pause (a copy's end, the flag, the next
 * copy's start). A function of the size and the agreed minimum: both ranks cut alike. */
static uint32_t chunk_ends(const ce_peer_t *p, uint64_t bytes, uint64_t *ends) {
  uint32_t n = 0;
  for (uint64_t at = 0; at < bytes;) {
    uint64_t left = bytes - at, c = left / 5 * 3 / CE_CHUNK_ALIGN * CE_CHUNK_ALIGN;
    if (c < p->chunk_min) c = p->chunk_min;
    if (c > left || n == DEV_COMBINE_CHUNKS - 1) c = left;
    at += c;
    ends[n++] = at;
  }
  return n;
}

/* This rank's message for a candidate step. */
static void describe(const ce_t *ce, const ce_peer_t *p, const plan_t *plan, const step_t *st, int capturing,
                     step_msg_t *m) {
  memset(m, 0, sizeof *m);
  m->magic = CE_MAGIC;
  m->kind = st->task->kind == OP_RECV ? OP_SEND : (int32_t)st->task->kind;
  m->willing = 1;
  m->captured = capturing != 0;
  int shared = 0; /* an output shares an input's bytes */
  const xfer_t *send = NULL;
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    if (is_peer(x) && combining(x)) m->combine = 1;
    if (!is_peer(x)) {
      if (x->flags != 0) m->willing = 0; /* local copies here are plain copies only */
      continue;
    }
    if (x->send_peer >= 0) {
      send = x;
      m->send_bytes[m->nsend++] = x->bytes;
      continue;
    }
    /* the peer writes this output as soon as this rank's stream reaches the step: no input may share it
     * (in place, a reduction's output is its operand: only a pull, below, takes that) */
    int overlap = 0;
    for (int j = 0; j < st->count; j++) {
      const xfer_t *y = &plan->xfers[st->first + j];
      if (plan_overlap(x->dst, x->bytes, y->src, y->bytes)) overlap = 1;
    }
    shared |= overlap;
    /* a driver failure here (logged) is a refusal, not an error: the peer still gets its answer; a peer in
     * this process needs no export, only memory its device can write. A reduction below the copy engines'
     * threshold is pulled: nothing writes its output but this rank. */
    const int written = !overlap && !(combining(x) && x->bytes < p->reduce_min);
    int ok = 0;
    if (written && m->willing &&
        gpu_ptr_export(ce->dev, x->dst, p->local ? NULL : &m->out[m->nrecv], &ok) != ncclSuccess)
      ok = 0;
    if (!ok && written) m->willing = 0;
    m->out_at[m->nrecv] = (uint64_t)(uintptr_t)x->dst;
    m->recv_bytes[m->nrecv++] = x->bytes;
  }
  /* A reduction of one transfer, one way, from BRAID_CE_PULL_MIN_BYTES: the receiver asks for a pull in
   * place, or below the copy engines' threshold; the sender offers its input, readable where it lies, which
   * a peer in this process reads through peer access as it would write an output. */
  const uint64_t bytes = m->nrecv == 1 ? m->recv_bytes[0] : m->send_bytes[0];
  if (m->combine && m->nsend + m->nrecv == 1 && bytes >= p->pull_min) {
    int ok = 0;
    if (m->nrecv == 1)
      m->pull = shared || bytes < p->reduce_min;
    else if (gpu_ptr_export(ce->dev, send->src, p->local ? NULL : &m->in, &ok) == ncclSuccess)
      m->pullable = ok;
    m->in_at = send != NULL ? (uint64_t)(uintptr_t)send->src : 0;
  }
  if (shared && !m->pull) m->willing = 0;
}

/* Whether the two messages (agreed) make the step a pull. */
static int pulls(const step_msg_t *a, const step_msg_t *b) {
  return a->pull || b->pull;
}

/* Whether an agreed step that only copies goes by the push kernel: some transfer between the ranks below
 * the copy engines' threshold. Agreed messages hold the same sizes (one's sends are the other's receives),
 * so both ranks answer alike. */
static int pushes(const ce_peer_t *p, const step_msg_t *m) {
  if (m->combine) return 0;
  for (int i = 0; i < m->nsend; i++)
    if (m->send_bytes[i] < p->min_bytes) return 1;
  for (int i = 0; i < m->nrecv; i++)
    if (m->recv_bytes[i] < p->min_bytes) return 1;
  return 0;
}

/* The decision, the same on both ranks: a symmetric test of the two messages. */
static int agree(const step_msg_t *a, const step_msg_t *b) {
  if (a->magic != CE_MAGIC || b->magic != CE_MAGIC || a->kind != b->kind || a->nsend != b->nrecv ||
      a->nrecv != b->nsend || a->captured != b->captured || a->combine != b->combine)
    return 0;
  for (int i = 0; i < a->nsend; i++)
    if (a->send_bytes[i] != b->recv_bytes[i]) return 0;
  for (int i = 0; i < a->nrecv; i++)
    if (a->recv_bytes[i] != b->send_bytes[i]) return 0;
  /* a pull asked for: one transfer, and the sender's input readable */
  if (pulls(a, b) && (a->nsend + a->nrecv != 1 || !(a->nsend == 1 ? a : b)->pullable)) return 0;
  return a->willing && b->willing;
}

/* The peer's allocation described by x, mapped afresh for captured step s (held until ce_step). */
static ncclResult_t map_held(ce_t *ce, ce_peer_t *p, int s, const gpu_ptr_export_t *x, char **base_p) {
  if (ce->nheld == ce->cap_held) {
    int cap = ce->cap_held < 4 ? 4 : 2 * ce->cap_held;
    held_t *h = realloc(ce->held, (size_t)cap * sizeof *h);
    if (h == NULL)
      return log_err(ncclSystemError, "%s: out of host memory for %d graph mappings", ce->name, cap);
    ce->held = h;
    ce->cap_held = cap;
  }
  gpu_mem_t *mem;
  CHECK(tp_peer_mem_map_fresh(p->mem, x, &mem));
  ce->held[ce->nheld++] = (held_t){s, mem};
  *base_p = gpu_mem_ptr(mem);
  return ncclSuccess;
}

/* The peer's buffer described by x (or, the peer in this process, at `at`), for step s: mapped here. */
static ncclResult_t peer_addr(ce_t *ce, ce_peer_t *p, int s, int captured, const gpu_ptr_export_t *x,
                              uint64_t at, char **ptr) {
  if (p->local) {
    *ptr = (char *)(uintptr_t)at;
    return ncclSuccess;
  }
  char *base = NULL;
  CHECK(captured ? map_held(ce, p, s, x, &base) : tp_peer_mem_map(p->mem, x, &base));
  *ptr = base + x->offset;
  return ncclSuccess;
}

/* Points each send of the agreed step s at the peer's output, or a pull's receive at the peer's input. */
static ncclResult_t point_step(ce_t *ce, ce_peer_t *p, plan_t *plan, int s, const step_msg_t *peer,
                               int pull) {
  const step_t *st = &plan->steps[s];
  int k = 0;
  for (int i = 0; i < st->count; i++) {
    xfer_t *x = &plan->xfers[st->first + i];
    if (pull && x->recv_peer >= 0) {
      char *at;
      CHECK(peer_addr(ce, p, s, peer->captured, &peer->in, peer->in_at, &at));
      x->ce_src = at;
    }
    if (pull || x->send_peer < 0) continue;
    CHECK(peer_addr(ce, p, s, peer->captured, &peer->out[k], peer->out_at[k], &x->ce_dst));
    k++;
  }
  return ncclSuccess;
}

static void log_step(ce_t *ce, const ce_peer_t *p, const step_t *st, const step_msg_t *m) {
  uint64_t bytes = 0;
  for (int i = 0; i < m->nsend; i++) bytes += m->send_bytes[i];
  for (int i = 0; i < m->nrecv; i++) bytes += m->recv_bytes[i];
  int lvl = log_first_of_class(&ce->logged[st->task->kind], bytes) ? LOG_INFO : LOG_TRACE;
  if (st->ce == STEP_CE_PULL) {
    const int reader = m->nrecv == 1 ? ce->rank : p->rank, owner = m->nrecv == 1 ? p->rank : ce->rank;
    LOG_AT(lvl, LOG_TUNING,
           "%s rank %d: %s (call %llu) pulled: rank %d's combine reads rank %d's %llu bytes of input where "
           "they lie (BRAID_CE_PULL_MIN_BYTES)",
           ce->name, ce->rank, plan_op_name(st->task->kind), (unsigned long long)st->task->seq, reader, owner,
           (unsigned long long)bytes);
    return;
  }
  if (st->ce == STEP_CE_PUSH) {
    LOG_AT(
        lvl, LOG_TUNING,
        "%s rank %d: %s (call %llu) pushed by one kernel: %d send%s and %d receive%s, %llu bytes with rank "
        "%d (BRAID_CE_PUSH_MIN_BYTES)",
        ce->name, ce->rank, plan_op_name(st->task->kind), (unsigned long long)st->task->seq, m->nsend,
        m->nsend == 1 ? "" : "s", m->nrecv, m->nrecv == 1 ? "" : "s", (unsigned long long)bytes, p->rank);
    return;
  }
  uint64_t ends[DEV_COMBINE_CHUNKS];
  LOG_AT(lvl, LOG_TUNING,
         "%s rank %d: %s (call %llu) by the copy engines: %d send%s and %d receive%s, %llu bytes with rank "
         "%d%s%u%s",
         ce->name, ce->rank, plan_op_name(st->task->kind), (unsigned long long)st->task->seq, m->nsend,
         m->nsend == 1 ? "" : "s", m->nrecv, m->nrecv == 1 ? "" : "s", (unsigned long long)bytes, p->rank,
         m->combine ? ", combined as it lands in " : "",
         m->combine ? chunk_ends(p, m->nsend ? m->send_bytes[0] : m->recv_bytes[0], ends) : 0,
         m->combine ? " chunks" : "");
}

ncclResult_t ce_offer(ce_t *ce, plan_t *plan) {
  if (ce == NULL) return ncclSuccess; /* plan_build left every step_t.ce 0 */
  ce->noffers = 0;
  int entered = 0, capturing = -1, saved = 0, relaxed = 0;
  gpu_scope_t scope;
  ncclResult_t res = ncclSuccess;
  if (ce->nheld > 0) { /* mappings of a launch that failed */
    CHECK(gpu_enter(ce->dev, &scope));
    entered = 1;
    drop_held(ce);
  }
  for (int s = 0; s < plan->nsteps; s++) {
    step_t *st = &plan->steps[s];
    ce_peer_t *p = step_peer(ce, plan, st);
    if (p == NULL || !candidate(p, plan, st)) continue;
    if (offers_to(ce, p) == CE_OFFERS_MAX) { /* both ranks stop at the same candidate step */
      TRACE(LOG_TUNING,
            "%s rank %d: the kernels move the steps with rank %d after the first %d that could bypass the "
            "rings",
            ce->name, ce->rank, p->rank, CE_OFFERS_MAX);
      continue;
    }
    if (!entered) {
      CHECK(gpu_enter(ce->dev, &scope));
      entered = 1;
    }
    if (capturing < 0) { /* an invalidated capture is refused by the launch; here it only says no */
      void *graph;
      uint64_t id;
      if (gpu_stream_capture(plan->tasks[0].stream, &capturing, &graph, &id) != ncclSuccess) capturing = 1;
      /* describing an output is among the calls a capture forbids in its strict modes */
      if (capturing && gpu_capture_relax(&saved) == ncclSuccess) relaxed = 1;
    }
    if (ce->noffers == ce->cap_offers) {
      int cap = ce->cap_offers < 4 ? 4 : 2 * ce->cap_offers;
      offer_t *o = realloc(ce->offers, (size_t)cap * sizeof *o);
      if (o == NULL) {
        res = log_err(ncclSystemError, "%s: out of host memory for %d copy-engine offers", ce->name, cap);
        goto out;
      }
      ce->offers = o;
      ce->cap_offers = cap;
    }
    offer_t *o = &ce->offers[ce->noffers++];
    o->step = s;
    o->p = p;
    describe(ce, p, plan, st, capturing, &o->msg);
    CHECK_GOTO(step_send(ce, p, &o->msg), res, out);
  }
out:
  ce->offered = ce->noffers > 0 || res != ncclSuccess;
  if (relaxed) gpu_capture_restore(saved);
  if (entered) gpu_leave(&scope);
  return res;
}

int ce_offered(const ce_t *ce) {
  return ce != NULL && ce->offered;
}

ncclResult_t ce_settle(ce_t *ce, plan_t *plan) {
  if (ce == NULL || ce->noffers == 0) return ncclSuccess;
  gpu_scope_t scope;
  CHECK(gpu_enter(ce->dev, &scope));
  ncclResult_t res = ncclSuccess;
  for (int k = 0; k < ce->noffers; k++) {
    step_t *st = &plan->steps[ce->offers[k].step];
    const step_msg_t *mine = &ce->offers[k].msg;
    step_msg_t theirs;
    ce_peer_t *p = ce->offers[k].p;
    CHECK_GOTO(step_recv(ce, p, &theirs), res, out);
    if (!agree(mine, &theirs)) {
      if (mine->willing && theirs.willing && mine->captured == theirs.captured && !pulls(mine, &theirs))
        WARN("%s rank %d: %s (call %llu): rank %d describes a different step (%d sends and %d receives); "
             "the kernels move it",
             ce->name, ce->rank, plan_op_name(st->task->kind), (unsigned long long)st->task->seq, p->rank,
             theirs.nsend, theirs.nrecv);
      continue;
    }
    const int pull = pulls(mine, &theirs);
    CHECK_GOTO(point_step(ce, p, plan, ce->offers[k].step, &theirs, pull), res, out);
    st->ce = pull ? STEP_CE_PULL : pushes(p, mine) ? STEP_CE_PUSH : STEP_CE_COPY;
    log_step(ce, p, st, mine);
  }
out:
  ce->noffers = 0;
  gpu_leave(&scope);
  return res;
}

/* The transfers of a reduction's step (candidate: at most one each way, no local copy): the send goes in
 * chunks (chunk_ends), each raising the receiver's W_DONE to its number; the receive is combined chunk by
 * chunk as it lands, by a kernel on the side stream when this rank also sends (forked after the wait for the
 * peer: its copies must not wait for it), after which the stream clears W_DONE. Sends are enqueued first:
 * where the driver runs what it is given at once, the combine waits for the peer's chunks, and the peer's
 * combine for these. */
static ncclResult_t reduce_step(ce_t *ce, const ce_peer_t *p, const xfer_t *send, const xfer_t *recv,
                                cudaStream_t stream, uint64_t seq, const ce_exec_t *ex) {
  uint64_t ends[DEV_COMBINE_CHUNKS];
  const int both = send != NULL && recv != NULL;
  if (both) CHECK(gpu_event_record(ce->fork, stream));
  if (send != NULL) {
    const uint32_t n = chunk_ends(p, send->bytes, ends);
    uint64_t at = 0;
    for (uint32_t c = 0; c < n; c++) {
      CHECK(gpu_copy_dd_async(send->ce_dst + at, send->src + at, ends[c] - at, stream));
      CHECK(gpu_stream_write32(stream, &p->theirs[W_DONE], c + 1));
      at = ends[c];
    }
  }
  if (recv == NULL) return ncclSuccess;
  cudaStream_t on = both ? ce->side : stream;
  if (both) CHECK(gpu_stream_wait(on, ce->fork));
  const uint32_t n = chunk_ends(p, recv->bytes, ends);
  CHECK(ex->combine(ex->arg, on, recv, NULL, &p->mine[W_DONE], p->rank, seq, n, ends));
  CHECK(gpu_stream_write32(on, &p->mine[W_DONE], 0));
  if (both) {
    CHECK(gpu_event_record(ce->join, on));
    CHECK(gpu_stream_wait(stream, ce->join));
  }
  return ncclSuccess;
}

/* A pull (STEP_CE_PULL): the sender's stream raises the receiver's `ready` word once it reaches the step
 * (its input is final there) and waits for `done`; the receiver's combine kernel waits for `ready`, reads
 * the input where it lies (ce_src) and combines it with its operand into its output, then the receiver's
 * stream clears `ready` and raises the sender's `done`: the input is the sender's again. The sender raises
 * `ready` with a stream write before its wait, not in it (raise_wait): the root's combine, all of the step's
 * work, must not wait for the sender's wait kernel to find an SM. */
static ncclResult_t pull_step(const ce_peer_t *p, const xfer_t *send, const xfer_t *recv, cudaStream_t stream,
                              uint64_t seq, const ce_exec_t *ex) {
  if (send != NULL) {
    CHECK(gpu_stream_write32(stream, &p->theirs[W_READY], 1));
    return ex->wait(ex->arg, stream, NULL, &p->mine[W_DONE], p->rank, 1, seq);
  }
  const uint64_t end = recv->bytes;
  CHECK(ex->combine(ex->arg, stream, recv, recv->ce_src, &p->mine[W_READY], p->rank, seq, 1, &end));
  CHECK(gpu_stream_write32(stream, &p->mine[W_READY], 0));
  return gpu_stream_write32(stream, &p->theirs[W_DONE], 1);
}

/* Raises the peer's word `raise` (if not NULL) and waits for this rank's `word` (if not NULL): both in one
 * wait kernel where the rank has both to do, which spares the stream a turn from a write to a kernel; a raise
 * alone with a stream write, which needs no SM, so that the peer's transfer never waits for a kernel of a
 * rank that has no wait of its own behind it (ce.h). */
static ncclResult_t raise_wait(const ce_peer_t *p, cudaStream_t stream, uint32_t *raise, uint32_t *word,
                               int is_send, uint64_t seq, const ce_exec_t *ex) {
  if (word != NULL) return ex->wait(ex->arg, stream, raise, word, p->rank, is_send, seq);
  return raise != NULL ? gpu_stream_write32(stream, raise, 1) : ncclSuccess;
}

/* The transfers of a step that only copies: the sends into the peer's outputs, the local copies beside them
 * on the side stream; then `done` raised where the rank sends, and awaited where it receives. */
static ncclResult_t copy_step(ce_t *ce, const ce_peer_t *p, const xfer_t *x, int count, int sends, int recvs,
                              int locals, cudaStream_t stream, uint64_t seq, const ce_exec_t *ex) {
  if (locals > 0) {
    CHECK(gpu_event_record(ce->fork, stream));
    CHECK(gpu_stream_wait(ce->side, ce->fork));
    for (int i = 0; i < count; i++)
      if (!is_peer(&x[i])) CHECK(gpu_copy_dd_async(x[i].dst, x[i].src, x[i].bytes, ce->side));
    CHECK(gpu_event_record(ce->join, ce->side));
  }
  for (int i = 0; i < count; i++)
    if (x[i].send_peer >= 0) CHECK(gpu_copy_dd_async(x[i].ce_dst, x[i].src, x[i].bytes, stream));
  CHECK(raise_wait(p, stream, sends > 0 ? &p->theirs[W_DONE] : NULL, recvs > 0 ? &p->mine[W_DONE] : NULL, 0,
                   seq, ex));
  if (locals > 0) CHECK(gpu_stream_wait(stream, ce->join));
  return ncclSuccess;
}

/* The transfers of a pushed step (STEP_CE_PUSH) where the rank sends or copies locally: one push kernel
 * (dev_push_t) with the handshake inside it, its sends into the peer's outputs and its local copies; local
 * copies beyond what the kernel takes follow it on the stream. A rank that only receives, with nothing to
 * copy, raises `ready` with a stream write and waits for `done` as for the copy engines (ce_step). */
static ncclResult_t push_step(const ce_peer_t *p, const xfer_t *x, int count, int sends, int recvs,
                              cudaStream_t stream, uint64_t seq, const ce_exec_t *ex) {
  dev_push_t w = {.ready = sends > 0 ? &p->mine[W_READY] : NULL,
                  .done = recvs > 0 ? &p->mine[W_DONE] : NULL,
                  .raise_ready = recvs > 0 ? &p->theirs[W_READY] : NULL,
                  .raise_done = sends > 0 ? &p->theirs[W_DONE] : NULL,
                  .blocks = &p->mine[W_BLOCKS],
                  .seq = seq,
                  .peer = p->rank};
  for (int i = 0; i < count; i++) /* the sends first: at most CE_MAX_XFERS */
    if (x[i].send_peer >= 0) w.copies[w.ncopies++] = (dev_copy_t){x[i].src, x[i].ce_dst, x[i].bytes};
  int i = 0; /* the local copies the kernel takes, then (from i on) those that follow it */
  for (; i < count && w.ncopies < DEV_PUSH_COPIES; i++)
    if (!is_peer(&x[i]) && x[i].bytes > 0)
      w.copies[w.ncopies++] = (dev_copy_t){x[i].src, x[i].dst, x[i].bytes};
  CHECK(ex->push(ex->arg, stream, &w));
  for (; i < count; i++)
    if (!is_peer(&x[i]) && x[i].bytes > 0) CHECK(gpu_copy_dd_async(x[i].dst, x[i].src, x[i].bytes, stream));
  return ncclSuccess;
}

ncclResult_t ce_step(ce_t *ce, const plan_t *plan, int s, cudaStream_t stream, int capturing,
                     const ce_exec_t *ex) {
  const step_t *st = &plan->steps[s];
  const xfer_t *x = &plan->xfers[st->first];
  const uint64_t seq = st->task->seq;
  ce_peer_t *p = step_peer(ce, plan, st);
  if (p == NULL)
    return log_err(ncclInternalError, "%s: a direct step (call %llu) with no peer on the path", ce->name,
                   (unsigned long long)seq);
  int sends = 0, recvs = 0, locals = 0, combines = 0;
  const xfer_t *send = NULL, *recv = NULL;
  for (int i = 0; i < st->count; i++) {
    if (x[i].send_peer >= 0) sends++, send = &x[i];
    if (x[i].recv_peer >= 0) recvs++, recv = &x[i];
    if (!is_peer(&x[i])) locals++;
    if (is_peer(&x[i]) && combining(&x[i])) combines++;
  }
  if (capturing) /* the graph owns the step's mappings from now on */
    for (int i = 0; i < ce->nheld;) {
      if (ce->held[i].step != s) {
        i++;
        continue;
      }
      CHECK(ex->keep(ex->arg, ce->held[i].mem));
      ce->held[i] = ce->held[--ce->nheld];
    }
  if (st->ce == STEP_CE_PULL) {
    CHECK(pull_step(p, send, recv, stream, seq, ex));
  } else if (st->ce == STEP_CE_PUSH && (sends > 0 || locals > 0)) {
    CHECK(push_step(p, x, st->count, sends, recvs, stream, seq, ex));
  } else {
    /* `ready` raised where the rank receives, and awaited where it sends */
    CHECK(raise_wait(p, stream, recvs > 0 ? &p->theirs[W_READY] : NULL, sends > 0 ? &p->mine[W_READY] : NULL,
                     1, seq, ex));
    /* The local copies fork only now: the driver may run a copy within the device as a kernel, whose
     * blocks would hold the SMs the wait kernel above needs, and the link's copy would start only once they
     * ended; so does a reduction's combine,
     * whose blocks would otherwise hold the SMs while its chunks wait for the peer's, and the peer's for
     * this rank's copies */
    if (combines > 0)
      CHECK(reduce_step(ce, p, send, recv, stream, seq, ex));
    else
      CHECK(copy_step(ce, p, x, st->count, sends, recvs, locals, stream, seq, ex));
  }
  if (capturing) return ncclSuccess;
  for (int i = 0; i < st->count; i++) { /* ce_dst is set on copies' sends only, ce_src on pulls' receives */
    CHECK(tp_peer_mem_used(p->mem, x[i].ce_dst, stream));
    CHECK(tp_peer_mem_used(p->mem, x[i].ce_src, stream));
  }
  return ncclSuccess;
}

void ce_destroy(ce_t *ce) {
  gpu_scope_t scope;
  if (ce == NULL) return;
  int entered = gpu_enter(ce->dev, &scope) == ncclSuccess;
  release(ce);
  if (entered) gpu_leave(&scope);
}
