/*
 * The gpu_net transport: GPU connections over the net transport, between hosts or when neither p2p nor
 * gpu_shm may be used. Each end owns `nch` rings in page-locked host memory that its kernel reaches through
 * their device addresses, and one net connection per ring; the process's proxy thread pumps slots between
 * the rings and the net connections (gpu_net.h).
 *
 * Setup follows the net transport's three phases, once per ring: the receiver's listen makes `nch` net
 * listens and packs them into one blob (they share the context's address, so only their tags differ), the
 * sender connects each ring, the receiver accepts each ring. Each end hands its rings to the proxy once its
 * net connections are up.
 */
#include "transport/gpu_net.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "gpu/gpu.h"
#include "transport/net.h"

/* Seconds a closing sending ring waits for the proxy to get out what its kernel produced. */
#define CLOSE_DRAIN_S 10.0

/* ---- Pumps ---- */

/* The control block's counters are plain volatile fields, since CUDA code reads them too; the host accesses
 * them through the compiler's atomic builtins, which give such a field C11 acquire / release semantics. */
static uint64_t load_acquire(const volatile uint64_t *p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void store_release(volatile uint64_t *p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static int aborted(const tp_gpu_net_ring_t *r) {
  return r->abort_flag != NULL && *r->abort_flag != 0;
}

void tp_gpu_net_ring_init(tp_gpu_net_ring_t *r, dev_ctrl_t *ctrl, char *data, tp_conn_t *net, int index,
                          int rank, const volatile int *abort_flag) {
  *r = (tp_gpu_net_ring_t){.ctrl = ctrl,
                           .data = data,
                           .net = net,
                           .is_send = net->is_send,
                           .index = index,
                           .rank = rank,
                           .peer = net->peer,
                           .abort_flag = abort_flag,
                           .done = net->is_send ? ctrl->head : ctrl->tail};
  tp_net_quiet_close(net);
}

static char *slot_of(const tp_gpu_net_ring_t *r) {
  return r->data + (r->done % DEV_SLOTS) * DEV_SLOT_BYTES;
}

/* Sending: starts the next slot the kernel produced, or the goodbye once the ring closes and all produced
 * slots are out; *started_p = 0 when there is nothing to start. */
static ncclResult_t send_start(tp_gpu_net_ring_t *r, int *started_p, char *why, size_t why_bytes) {
  /* acquire: pairs with the kernel's system-scope release of tail: the slot and sizes[] are complete. */
  uint64_t tail = load_acquire(&r->ctrl->tail);
  uint64_t bytes = 0;
  uint32_t magic = GPU_NET_HDR_MAGIC;
  *started_p = 0;
  if (tail == r->done) {
    if (!r->closing) return ncclSuccess;
    magic = GPU_NET_BYE_MAGIC;
  } else {
    bytes = r->ctrl->sizes[r->done % DEV_SLOTS];
    if (tail - r->done > DEV_SLOTS || bytes > DEV_SLOT_BYTES) {
      snprintf(why, why_bytes, "the kernel published tail %llu with slot %llu of %llu bytes",
               (unsigned long long)tail, (unsigned long long)r->done, (unsigned long long)bytes);
      return ncclInternalError;
    }
  }
  r->hdr = (tp_gpu_net_hdr_t){.magic = magic, .bytes = (uint32_t)bytes, .seq = r->done};
  r->off = 0;
  r->active = 1;
  *started_p = 1;
  return ncclSuccess;
}

/* Sending: copies the next part of the slot under way (header, then its bytes) into `room` bytes at dst. */
static size_t copy_out(tp_gpu_net_ring_t *r, char *dst, size_t room) {
  uint64_t total = sizeof r->hdr + r->hdr.bytes;
  size_t moved = 0;
  while (moved < room && r->off < total) {
    int in_hdr = r->off < sizeof r->hdr;
    const char *src = in_hdr ? (const char *)&r->hdr + r->off : slot_of(r) + (r->off - sizeof r->hdr);
    uint64_t left = (in_hdr ? sizeof r->hdr : total) - r->off;
    size_t n = left < room - moved ? (size_t)left : room - moved;
    memcpy(dst + moved, src, n);
    moved += n;
    r->off += n;
  }
  return moved;
}

/* Sending: puts as much of the slot under way into the net connection as it takes; *finished_p = 1 once it
 * has all of it. */
static ncclResult_t send_slot(tp_gpu_net_ring_t *r, int *finished_p, int *progress_p) {
  tp_conn_t *net = r->net;
  *finished_p = 0;
  while (r->off < sizeof r->hdr + r->hdr.bytes) {
    void *ptr;
    size_t room;
    CHECK(net->ops->send_peek(net, &ptr, &room));
    if (room == 0) return ncclSuccess;
    CHECK(net->ops->send_commit(net, copy_out(r, ptr, room)));
    r->unflushed = 1;
    *progress_p = 1;
  }
  *finished_p = 1;
  return ncclSuccess;
}

static ncclResult_t pump_send(tp_gpu_net_ring_t *r, int *progress_p, char *why, size_t why_bytes) {
  while (!r->closed) {
    int ok;
    if (!r->active) {
      CHECK(send_start(r, &ok, why, why_bytes));
      if (!ok) break;
    }
    CHECK(send_slot(r, &ok, progress_p));
    if (!ok) break;
    r->active = 0;
    if (r->hdr.magic == GPU_NET_BYE_MAGIC) {
      r->closed = 1;
      break;
    }
    r->done++;
    /* release: our reads of the slot are done before the kernel's acquire of head lets it write there. */
    store_release(&r->ctrl->head, r->done);
    *progress_p = 1;
  }
  if (r->unflushed) {
    int flushed = 0;
    CHECK(r->net->ops->flush(r->net, &flushed));
    r->unflushed = !flushed;
  }
  return ncclSuccess;
}

/* Receiving: checks the header that just arrived. */
static ncclResult_t check_header(const tp_gpu_net_ring_t *r, char *why, size_t why_bytes) {
  const tp_gpu_net_hdr_t *h = &r->hdr;
  int magic_ok = h->magic == GPU_NET_HDR_MAGIC || (h->magic == GPU_NET_BYE_MAGIC && h->bytes == 0);
  if (magic_ok && h->bytes <= DEV_SLOT_BYTES && h->seq == r->done) return ncclSuccess;
  snprintf(why, why_bytes, "slot header with magic %08x, %u bytes, number %llu (expected %llu)",
           (unsigned)h->magic, (unsigned)h->bytes, (unsigned long long)h->seq, (unsigned long long)r->done);
  return ncclInternalError;
}

/* Receiving: takes what the net connection has of the slot under way (header, then its bytes); *finished_p
 * = 1 once the slot is complete. */
static ncclResult_t recv_slot(tp_gpu_net_ring_t *r, int *finished_p, int *progress_p, char *why,
                              size_t why_bytes) {
  tp_conn_t *net = r->net;
  for (;;) {
    uint64_t total = r->off < sizeof r->hdr ? sizeof r->hdr : sizeof r->hdr + r->hdr.bytes;
    *finished_p = r->off == total;
    if (*finished_p) return ncclSuccess;
    void *ptr;
    size_t avail;
    CHECK(net->ops->recv_peek(net, &ptr, &avail));
    if (avail == 0) return ncclSuccess;
    size_t n = avail < total - r->off ? avail : (size_t)(total - r->off);
    char *dst = r->off < sizeof r->hdr ? (char *)&r->hdr + r->off : slot_of(r) + (r->off - sizeof r->hdr);
    memcpy(dst, ptr, n);
    CHECK(net->ops->recv_release(net, n));
    r->off += n;
    *progress_p = 1;
    if (r->off == sizeof r->hdr) CHECK(check_header(r, why, why_bytes));
  }
}

static ncclResult_t pump_recv(tp_gpu_net_ring_t *r, int *progress_p, char *why, size_t why_bytes) {
  while (!r->closed) {
    if (!r->active) {
      /* acquire: pairs with the kernel's release of head: its reads of a freed slot are done. */
      uint64_t head = load_acquire(&r->ctrl->head);
      if (head > r->done) {
        snprintf(why, why_bytes, "the kernel consumed %llu slots of %llu received", (unsigned long long)head,
                 (unsigned long long)r->done);
        return ncclInternalError;
      }
      if (r->done - head >= DEV_SLOTS) break; /* full: the kernel has not caught up */
      r->active = 1;
      r->off = 0;
    }
    int finished;
    CHECK(recv_slot(r, &finished, progress_p, why, why_bytes));
    if (!finished) break;
    r->active = 0;
    if (r->hdr.magic == GPU_NET_BYE_MAGIC) {
      r->closed = 1; /* the stream is over: its net connection is not read again, so its close is not seen */
      break;
    }
    r->ctrl->sizes[r->done % DEV_SLOTS] = r->hdr.bytes;
    r->done++;
    /* release: the slot's bytes and its size are visible before the kernel's acquire of tail finds them. */
    store_release(&r->ctrl->tail, r->done);
  }
  return ncclSuccess;
}

/* The stream's net connection was closed by the other end: fine for a closing sender (the receiver finished
 * first and needs no goodbye); otherwise the stream ended early. */
static int closed_early(tp_gpu_net_ring_t *r, char *why, size_t why_bytes) {
  if (r->is_send && r->closing) {
    r->closed = 1;
    r->unflushed = 0;
    return 0;
  }
  snprintf(why, why_bytes, "%s",
           r->is_send ? "the receiving rank closed its end"
                      : "the stream ended without a goodbye (the sending rank failed or exited)");
  return 1;
}

ncclResult_t tp_gpu_net_pump(tp_gpu_net_ring_t *r, int *progress_p) {
  if (r->broken != ncclSuccess) return r->broken;
  if (r->stopped) return ncclSuccess;
  char why[160] = "";
  ncclResult_t res =
      r->is_send ? pump_send(r, progress_p, why, sizeof why) : pump_recv(r, progress_p, why, sizeof why);
  if (res == ncclSuccess) return ncclSuccess;
  if (tp_net_peer_closed(r->net) && !closed_early(r, why, sizeof why)) return ncclSuccess;
  int from = r->is_send ? r->rank : r->peer, to = r->is_send ? r->peer : r->rank;
  r->broken = log_err(res,
                      "gpu_net ring %d from rank %d to rank %d: %s after %llu slots; the proxy stops moving "
                      "this ring, and the kernel waiting on it will time out or be aborted",
                      r->index, from, to, why[0] != '\0' ? why : "the net connection failed",
                      (unsigned long long)r->done);
  r->net->ops->fail(r->net); /* so that the peer's proxy stops too, instead of waiting for more */
  return r->broken;
}

int tp_gpu_net_drained(const tp_gpu_net_ring_t *r) {
  if (!r->is_send || r->stopped || r->broken != ncclSuccess || aborted(r)) return 1;
  return r->closed && !r->unflushed;
}

/* ---- The proxy thread ---- */

/* The process's proxy: the registered rings and the thread that pumps them. */
static struct {
  pthread_mutex_t lock;      /* guards the fields below and the state of every registered ring */
  tp_gpu_net_ring_t **rings; /* registered rings */
  int n, cap;                /* entries used and allocated in rings */
  int running;               /* 1 while a thread serves generation `gen` */
  uint64_t gen;              /* bumped to end the running thread (when the last ring leaves) */
  pthread_t thread;          /* the running thread */
  _Atomic int waiters; /* threads about to take the lock; the proxy lets them in before its next round */
} proxy = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Takes the lock, telling the proxy thread to let go of it soon. */
static void lock_proxy(void) {
  atomic_fetch_add_explicit(&proxy.waiters, 1, memory_order_relaxed);
  pthread_mutex_lock(&proxy.lock);
  atomic_fetch_sub_explicit(&proxy.waiters, 1, memory_order_relaxed);
}

/* Pumps every registered ring once, the lock held: the rings' state is the proxy's alone meanwhile. A ring
 * that broke or whose communicator aborts is left alone. */
static void pump_round(int *progress_p) {
  for (int i = 0; i < proxy.n; i++) {
    tp_gpu_net_ring_t *r = proxy.rings[i];
    if (r->broken == ncclSuccess && !r->stopped && !aborted(r)) (void)tp_gpu_net_pump(r, progress_p);
  }
}

static void *proxy_main(void *arg) {
  uint64_t gen = (uint64_t)(uintptr_t)arg, idle = 0;
  pthread_setname_np(pthread_self(), "braid-proxy"); /* for top -H and debuggers */
  pthread_mutex_lock(&proxy.lock);
  while (proxy.gen == gen) {
    int progress = 0;
    pump_round(&progress);
    pthread_mutex_unlock(&proxy.lock);
    idle = progress ? 0 : idle + 1;
    /* Waiters (a connection being added or closed) take the lock before the next round, or a busy proxy
     * could keep it from them. */
    while (atomic_load_explicit(&proxy.waiters, memory_order_relaxed) > 0) sched_yield();
    time_backoff(idle);
    pthread_mutex_lock(&proxy.lock);
  }
  pthread_mutex_unlock(&proxy.lock);
  return NULL;
}

ncclResult_t tp_gpu_net_proxy_add(tp_gpu_net_ring_t *rings, int n) {
  ncclResult_t res = ncclSuccess;
  lock_proxy();
  if (proxy.n + n > proxy.cap) {
    int cap = proxy.n + n > 2 * proxy.cap ? proxy.n + n : 2 * proxy.cap;
    tp_gpu_net_ring_t **p = realloc(proxy.rings, sizeof *p * (size_t)cap);
    if (p == NULL) {
      res = log_err(ncclSystemError, "gpu_net proxy: out of memory for %d rings", cap);
      goto unlock;
    }
    proxy.rings = p;
    proxy.cap = cap;
  }
  if (!proxy.running) {
    int err = pthread_create(&proxy.thread, NULL, proxy_main, (void *)(uintptr_t)proxy.gen);
    if (err != 0) {
      res = log_err(ncclSystemError, "gpu_net proxy: starting its thread failed: %s", strerror(err));
      goto unlock;
    }
    proxy.running = 1;
    INFO(LOG_NET | LOG_PROXY, "gpu_net proxy thread started");
  }
  for (int i = 0; i < n; i++) proxy.rings[proxy.n++] = &rings[i];
unlock:
  pthread_mutex_unlock(&proxy.lock);
  return res;
}

static int all_drained(const tp_gpu_net_ring_t *rings, int n) {
  for (int i = 0; i < n; i++)
    if (!tp_gpu_net_drained(&rings[i])) return 0;
  return 1;
}

void tp_gpu_net_proxy_remove(tp_gpu_net_ring_t *rings, int n, double drain_s) {
  double deadline = time_now() + drain_s;
  lock_proxy();
  for (int i = 0; i < n; i++) rings[i].closing = 1;
  while (!all_drained(rings, n) && time_now() < deadline) {
    pthread_mutex_unlock(&proxy.lock);
    time_sleep_us(1000);
    lock_proxy();
  }
  for (int i = 0; i < n; i++) {
    tp_gpu_net_ring_t *r = &rings[i];
    if (!tp_gpu_net_drained(r))
      WARN(
          "gpu_net ring %d from rank %d to rank %d: closed before its last slots went out (%llu sent, waited "
          "%.0f s)",
          r->index, r->rank, r->peer, (unsigned long long)r->done, drain_s);
    for (int k = 0; k < proxy.n; k++) {
      if (proxy.rings[k] != r) continue;
      proxy.rings[k] = proxy.rings[--proxy.n];
      break;
    }
  }
  int join = proxy.n == 0 && proxy.running;
  pthread_t thread = proxy.thread;
  if (join) {
    proxy.gen++; /* the thread sees it when it next takes the lock, and ends */
    proxy.running = 0;
  }
  pthread_mutex_unlock(&proxy.lock);
  if (join) pthread_join(thread, NULL);
}

void tp_gpu_net_proxy_stop(tp_gpu_net_ring_t *rings, int n) {
  lock_proxy();
  for (int i = 0; i < n; i++) rings[i].stopped = 1;
  pthread_mutex_unlock(&proxy.lock);
}

/* ---- Connections ---- */

/* What the receiver sends the sender: ring 0's net blob and every ring's tag. */
typedef struct {
  tp_net_blob_t net;               /* ring 0's net listen; the other rings' differ only in their tag */
  int32_t nch;                     /* rings; checked against the sender's own */
  int32_t reserved;                /* zero */
  uint32_t tags[DEV_MAX_CHANNELS]; /* the net listen of each ring */
} gpu_net_blob_t;

_Static_assert(sizeof(gpu_net_blob_t) <= TP_BLOB_BYTES, "the gpu_net blob fits in a transport blob");

/* One end of a gpu_net connection. */
typedef struct {
  tp_conn_t base;                   /* the generic part; first, so that a tp_conn_t * converts to this */
  int dev;                          /* this rank's device */
  int nch;                          /* rings */
  char *host;                       /* the rings' page-locked host memory (NULL until allocated) */
  int registered;                   /* 1 while the rings are with the proxy */
  tp_conn_t *net[DEV_MAX_CHANNELS]; /* each ring's net connection */
  tp_gpu_net_ring_t ring[DEV_MAX_CHANNELS]; /* each ring's pump */
  char what[48];                            /* "gpu_net connection from rank N", for messages */
} gpu_net_conn_t;

static ncclResult_t new_conn(tp_ctx_t *ctx, int peer, int is_send, gpu_net_conn_t **conn_p) {
  tp_conn_t base;
  CHECK(tp_check_gpu_config(ctx, "gpu_net", peer));
  CHECK(tp_conn_init(ctx, &tp_gpu_net_ops, peer, is_send, &base));
  gpu_net_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL) return log_err(ncclSystemError, "gpu_net connection with rank %d: out of memory", peer);
  c->base = base;
  c->dev = tp_ctx_dev(ctx);
  c->nch = tp_ctx_config(ctx)->nch;
  snprintf(c->what, sizeof c->what, "gpu_net connection %s rank %d", is_send ? "to" : "from", peer);
  *conn_p = c;
  return ncclSuccess;
}

/* Allocates the rings in page-locked host memory mapped for the device; the kernel gets device addresses. */
static ncclResult_t alloc_rings(gpu_net_conn_t *c) {
  size_t bytes = (size_t)c->nch * DEV_RING_BYTES;
  void *host = NULL, *dev_ptr = NULL;
  gpu_scope_t scope;
  CHECK(gpu_enter(c->dev, &scope));
  ncclResult_t res = gpu_host_alloc(bytes, &host, &dev_ptr);
  gpu_leave(&scope);
  CHECK(res);
  c->host = host;
  tp_charge(&c->base, bytes, "gpu_net rings");
  return tp_conn_set_rings(&c->base, c->nch, dev_ptr);
}

static void free_conn(gpu_net_conn_t *c) {
  if (c->registered) tp_gpu_net_proxy_remove(c->ring, c->nch, CLOSE_DRAIN_S);
  for (int r = 0; r < c->nch; r++)
    if (c->net[r] != NULL) c->net[r]->ops->close(c->net[r]);
  if (c->host != NULL) {
    gpu_scope_t scope;
    int entered = gpu_enter(c->dev, &scope) == ncclSuccess;
    gpu_host_free(c->host);
    if (entered) gpu_leave(&scope);
  }
  tp_conn_free_rings(&c->base);
  tp_uncharge(&c->base);
  free(c);
}

/* Hands the rings to the proxy once every net connection is up. */
static ncclResult_t start_rings(gpu_net_conn_t *c, const tp_config_t *cfg) {
  for (int r = 0; r < c->nch; r++) {
    char *ring = c->host + (uint64_t)r * DEV_RING_BYTES;
    tp_gpu_net_ring_init(&c->ring[r], (dev_ctrl_t *)ring, ring + sizeof(dev_ctrl_t), c->net[r], r, cfg->rank,
                         cfg->abort_flag);
  }
  CHECK(tp_gpu_net_proxy_add(c->ring, c->nch));
  c->registered = 1;
  return ncclSuccess;
}

/* Adds ring r's net blob to the packed blob; all listens of one context differ only in their tag. */
static ncclResult_t pack_net_blob(gpu_net_blob_t *b, int r, const char *net_blob, const char *what) {
  tp_net_blob_t nb;
  memcpy(&nb, net_blob, sizeof nb);
  b->tags[r] = nb.tag;
  if (r == 0) {
    b->net = nb;
    return ncclSuccess;
  }
  nb.tag = b->net.tag;
  if (memcmp(&nb, &b->net, sizeof nb) == 0) return ncclSuccess;
  return log_err(ncclInternalError,
                 "%s: the net listen of ring %d differs from ring 0's in more than its tag", what, r);
}

static ncclResult_t gpu_net_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  gpu_net_conn_t *c;
  CHECK(new_conn(ctx, peer, 0, &c));
  CHECK_GOTO(alloc_rings(c), res, err_free_conn);
  gpu_net_blob_t b;
  memset(&b, 0, sizeof b);
  b.nch = c->nch;
  for (int r = 0; r < c->nch; r++) {
    char net_blob[TP_BLOB_BYTES];
    CHECK_GOTO(tp_net_ops.listen(ctx, peer, net_blob, &c->net[r]), res, err_free_conn);
    CHECK_GOTO(pack_net_blob(&b, r, net_blob, c->what), res, err_free_conn);
  }
  memset(blob, 0, TP_BLOB_BYTES);
  memcpy(blob, &b, sizeof b);
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free_conn(c);
  return res;
}

static ncclResult_t gpu_net_connect(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  const tp_config_t *cfg = tp_ctx_config(ctx);
  gpu_net_blob_t b;
  memcpy(&b, blob, sizeof b);
  if (b.net.receiver_rank != peer || b.nch != cfg->nch)
    return log_err(
        ncclInternalError,
        "gpu_net connection to rank %d: the blob comes from rank %d with %d rings (this rank uses %d)", peer,
        (int)b.net.receiver_rank, (int)b.nch, cfg->nch);
  gpu_net_conn_t *c;
  CHECK(new_conn(ctx, peer, 1, &c));
  CHECK_GOTO(alloc_rings(c), res, err_free_conn);
  for (int r = 0; r < c->nch; r++) {
    char net_blob[TP_BLOB_BYTES] = {0};
    tp_net_blob_t nb = b.net;
    nb.tag = b.tags[r];
    memcpy(net_blob, &nb, sizeof nb);
    CHECK_GOTO(tp_net_ops.connect(ctx, peer, net_blob, &c->net[r]), res, err_free_conn);
  }
  CHECK_GOTO(start_rings(c, cfg), res, err_free_conn);
  tp_log_route(ctx, &c->base, LOG_NET, "NET/Socket");
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free_conn(c);
  return res;
}

static ncclResult_t gpu_net_accept(tp_ctx_t *ctx, tp_conn_t *conn) {
  gpu_net_conn_t *c = (gpu_net_conn_t *)conn;
  for (int r = 0; r < c->nch; r++) CHECK(tp_net_ops.accept(ctx, c->net[r]));
  return start_rings(c, tp_ctx_config(ctx));
}

/* Stops this side's rings quietly (the failure was reported where it started) and shuts every ring's net
 * connection down: the peer's proxy finds its streams ended without a goodbye and reports it. */
static void gpu_net_fail(tp_conn_t *conn) {
  gpu_net_conn_t *c = (gpu_net_conn_t *)conn;
  if (c->registered) tp_gpu_net_proxy_stop(c->ring, c->nch);
  for (int r = 0; r < c->nch; r++)
    if (c->net[r] != NULL) c->net[r]->ops->fail(c->net[r]);
}

static void gpu_net_close(tp_conn_t *conn) {
  if (conn != NULL) free_conn((gpu_net_conn_t *)conn);
}

const tp_ops_t tp_gpu_net_ops = {
    .name = "gpu_net",
    .listen = gpu_net_listen,
    .connect = gpu_net_connect,
    .accept = gpu_net_accept,
    .fail = gpu_net_fail,
    .close = gpu_net_close,
};
