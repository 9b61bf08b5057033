/*
 * The gpu_net transport: GPU connections over the net transport, between hosts or when neither p2p nor
 * gpu_shm may be used. Each end owns `nch` rings in page-locked host memory that its kernel reaches through
 * their device addresses, and one net connection per ring; the process's proxy thread pumps slots between
 * the rings and the net connections (gpu_net.h).
 *
 * Setup follows the net transport's three phases, once per ring: the receiver's listen makes `nch` net
 * listens and packs them into one blob (they differ only in the network's handle), the sender connects each
 * ring, the receiver accepts each ring. Each end then hands its rings to the proxy; a sending ring whose
 * network connection is still being made simply has no room until it is up.
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
#include "base/param.h"
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

/* Index of the goodbye's header and requests. */
#define BYE DEV_SLOTS

void tp_gpu_net_ring_init(tp_gpu_net_ring_t *r, dev_ctrl_t *ctrl, char *data, int data_type, tp_conn_t *net,
                          int index, int rank, const volatile int *abort_flag) {
  int window = tp_net_msg_props(net)->max_requests / 2; /* two requests per slot */
  if (window > DEV_SLOTS) window = DEV_SLOTS;
  if (window < 1) window = 1;
  *r = (tp_gpu_net_ring_t){.ctrl = ctrl,
                           .data = data,
                           .data_type = data_type,
                           .net = net,
                           .is_send = net->is_send,
                           .index = index,
                           .rank = rank,
                           .peer = net->peer,
                           .abort_flag = abort_flag,
                           .window = window,
                           .done = net->is_send ? ctrl->head : ctrl->tail};
  r->posted = r->done;
  for (int k = 0; k < DEV_SLOTS; k++) r->got[k] = -1;
  tp_net_quiet_close(net);
}

static char *slot_of(const tp_gpu_net_ring_t *r, uint64_t n) {
  return r->data + (n % DEV_SLOTS) * DEV_SLOT_BYTES;
}

/* Registers the ring's headers and slots once its network connection is up (r->ready). */
static ncclResult_t ring_ready(tp_gpu_net_ring_t *r) {
  int up;
  CHECK(tp_net_msg_ready(r->net, &up));
  if (!up) return ncclSuccess;
  CHECK(tp_net_msg_reg(r->net, r->hdrs, sizeof r->hdrs, NCCL_PTR_HOST, &r->mh_hdrs));
  CHECK(tp_net_msg_reg(r->net, r->data, (size_t)DEV_SLOTS * DEV_SLOT_BYTES, r->data_type, &r->mh_data));
  r->ready = 1;
  return ncclSuccess;
}

/* Posts the two messages of pair k (a slot's, or BYE's): the header, then `bytes` at `at` (receiving: room
 * for a whole slot). *posted_p = 1 once both are; a network that takes no more now leaves the rest for later.
 */
static ncclResult_t post_pair(tp_gpu_net_ring_t *r, int k, char *at, size_t bytes, int *posted_p) {
  void *req;
  *posted_p = 0;
  if (!r->half[k]) {
    if (r->is_send)
      CHECK(tp_net_msg_send(r->net, &r->hdrs[k], sizeof r->hdrs[k], 0, r->mh_hdrs, &req));
    else
      CHECK(tp_net_msg_recv(r->net, &r->hdrs[k], sizeof r->hdrs[k], 0, r->mh_hdrs, &req));
    if (req == NULL) return ncclSuccess;
    r->reqs[k][0] = req;
    r->half[k] = 1;
  }
  if (r->is_send)
    CHECK(tp_net_msg_send(r->net, at, bytes, 1, r->mh_data, &req));
  else
    CHECK(tp_net_msg_recv(r->net, at, DEV_SLOT_BYTES, 1, r->mh_data, &req));
  if (req == NULL) return ncclSuccess;
  r->reqs[k][1] = req;
  r->half[k] = 0;
  *posted_p = 1;
  return ncclSuccess;
}

/* Tests pair k's requests in order; *done_p = 1 once both finished. *got_p (if not NULL) receives the size
 * the network reported for the second (-1: none). */
static ncclResult_t test_pair(tp_gpu_net_ring_t *r, int k, int *done_p, int *got_p) {
  *done_p = 0;
  for (int m = 0; m < 2; m++) {
    if (r->reqs[k][m] == NULL) continue;
    int done, size;
    CHECK(tp_net_msg_test(r->net, r->reqs[k][m], &done, &size));
    if (!done) return ncclSuccess;
    r->reqs[k][m] = NULL;
    if (m == 1 && got_p != NULL) *got_p = size;
  }
  *done_p = 1;
  return ncclSuccess;
}

/* Sending: posts the slots the kernel produced (within the window), releases those the network finished. */
static ncclResult_t send_slots(tp_gpu_net_ring_t *r, uint64_t tail, int *progress_p, char *why,
                               size_t why_bytes) {
  while (r->posted < tail && r->posted - r->done < (uint64_t)r->window) {
    int k = (int)(r->posted % DEV_SLOTS), ok;
    if (!r->half[k]) {
      uint64_t bytes = r->ctrl->sizes[k];
      if (tail - r->done > DEV_SLOTS || bytes > DEV_SLOT_BYTES) {
        snprintf(why, why_bytes, "the kernel published tail %llu with slot %llu of %llu bytes",
                 (unsigned long long)tail, (unsigned long long)r->posted, (unsigned long long)bytes);
        return ncclInternalError;
      }
      r->hdrs[k] = (tp_gpu_net_hdr_t){.magic = GPU_NET_HDR_MAGIC, .bytes = (uint32_t)bytes, .seq = r->posted};
    }
    CHECK(post_pair(r, k, slot_of(r, r->posted), r->hdrs[k].bytes, &ok));
    if (!ok) break;
    r->posted++;
    *progress_p = 1;
  }
  while (r->done < r->posted) {
    int fin;
    CHECK(test_pair(r, (int)(r->done % DEV_SLOTS), &fin, NULL));
    if (!fin) break;
    r->done++;
    /* release: the network is done with the slot before the kernel's acquire of head lets it write there. */
    store_release(&r->ctrl->head, r->done);
    *progress_p = 1;
  }
  return ncclSuccess;
}

static ncclResult_t pump_send(tp_gpu_net_ring_t *r, int *progress_p, char *why, size_t why_bytes) {
  /* acquire: pairs with the kernel's system-scope release of tail: the slot and sizes[] are complete. */
  uint64_t tail = load_acquire(&r->ctrl->tail);
  CHECK(send_slots(r, tail, progress_p, why, why_bytes));
  if (!r->closing || r->closed || r->posted != tail) return ncclSuccess;
  if (!r->bye_posted) {
    if (!r->half[BYE]) r->hdrs[BYE] = (tp_gpu_net_hdr_t){.magic = GPU_NET_BYE_MAGIC, .seq = r->posted};
    CHECK(post_pair(r, BYE, r->data, 0, &r->bye_posted));
  }
  int fin = 0;
  if (r->bye_posted) CHECK(test_pair(r, BYE, &fin, NULL));
  r->closed = fin && r->done == r->posted;
  return ncclSuccess;
}

/* Receiving: checks the header of the slot that just arrived, and the size the network reported. */
static ncclResult_t check_header(const tp_gpu_net_ring_t *r, int k, char *why, size_t why_bytes) {
  const tp_gpu_net_hdr_t *h = &r->hdrs[k];
  int magic_ok = h->magic == GPU_NET_HDR_MAGIC || (h->magic == GPU_NET_BYE_MAGIC && h->bytes == 0);
  if (magic_ok && h->bytes <= DEV_SLOT_BYTES && h->seq == r->done &&
      (r->got[k] < 0 || (uint32_t)r->got[k] == h->bytes))
    return ncclSuccess;
  snprintf(why, why_bytes,
           "slot header with magic %08x, %u bytes, number %llu (expected %llu; the network "
           "reported %d bytes)",
           (unsigned)h->magic, (unsigned)h->bytes, (unsigned long long)h->seq, (unsigned long long)r->done,
           r->got[k]);
  return ncclInternalError;
}

/* Receiving into GPU memory: makes slot k's bytes visible to the GPU; *done_p = 1 once they are. */
static ncclResult_t flush_slot(tp_gpu_net_ring_t *r, int k, int *done_p) {
  *done_p = 1;
  if (r->data_type != NCCL_PTR_CUDA || r->hdrs[k].bytes == 0 || r->flushed) return ncclSuccess;
  if (r->flush_req == NULL)
    CHECK(tp_net_msg_flush(r->net, slot_of(r, r->done), r->hdrs[k].bytes, r->mh_data, &r->flush_req));
  if (r->flush_req != NULL) {
    CHECK(tp_net_msg_test(r->net, r->flush_req, done_p, &(int){0}));
    if (!*done_p) return ncclSuccess;
    r->flush_req = NULL;
  }
  r->flushed = 1;
  return ncclSuccess;
}

/* Receiving: takes the slots that arrived, in order, and publishes them. */
static ncclResult_t take_slots(tp_gpu_net_ring_t *r, int *progress_p, char *why, size_t why_bytes) {
  while (!r->closed && r->done < r->posted) {
    int k = (int)(r->done % DEV_SLOTS), fin;
    CHECK(test_pair(r, k, &fin, &r->got[k]));
    if (!fin) break;
    CHECK(check_header(r, k, why, why_bytes));
    if (r->hdrs[k].magic == GPU_NET_BYE_MAGIC) {
      r->closed = 1; /* the stream is over: its net connection is not read again, so its close is not seen */
      break;
    }
    CHECK(flush_slot(r, k, &fin));
    if (!fin) break;
    r->ctrl->sizes[k] = r->hdrs[k].bytes;
    r->got[k] = -1;
    r->flushed = 0;
    r->done++;
    /* release: the slot's bytes and its size are visible before the kernel's acquire of tail finds them. */
    store_release(&r->ctrl->tail, r->done);
    *progress_p = 1;
  }
  return ncclSuccess;
}

static ncclResult_t pump_recv(tp_gpu_net_ring_t *r, int *progress_p, char *why, size_t why_bytes) {
  /* acquire: pairs with the kernel's release of head: its reads of a freed slot are done. */
  uint64_t head = load_acquire(&r->ctrl->head);
  if (head > r->done) {
    snprintf(why, why_bytes, "the kernel consumed %llu slots of %llu received", (unsigned long long)head,
             (unsigned long long)r->done);
    return ncclInternalError;
  }
  CHECK(take_slots(r, progress_p, why, why_bytes));
  ncclResult_t posting = ncclSuccess;
  while (!r->closed && r->posted - head < DEV_SLOTS && r->posted - r->done < (uint64_t)r->window) {
    int ok;
    posting = post_pair(r, (int)(r->posted % DEV_SLOTS), slot_of(r, r->posted), DEV_SLOT_BYTES, &ok);
    if (posting != ncclSuccess || !ok) break;
    r->posted++;
  }
  /* A receive posted past the goodbye finds the closed stream. What was posted before may still complete
   * (the goodbye among it, which makes the close normal): the error counts once nothing posted is left. */
  CHECK(take_slots(r, progress_p, why, why_bytes));
  return r->closed || r->done < r->posted ? ncclSuccess : posting;
}

/* The stream's net connection was closed by the other end: fine for a closing sender (the receiver finished
 * first and needs no goodbye); otherwise the stream ended early. */
static int closed_early(tp_gpu_net_ring_t *r, char *why, size_t why_bytes) {
  if (r->is_send && r->closing) {
    r->closed = 1;
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
  char why[200] = "";
  ncclResult_t res = r->ready ? ncclSuccess : ring_ready(r);
  if (res == ncclSuccess && r->ready)
    res = r->is_send ? pump_send(r, progress_p, why, sizeof why) : pump_recv(r, progress_p, why, sizeof why);
  if (res == ncclSuccess) return ncclSuccess;
  if (tp_net_peer_closed(r->net) && !closed_early(r, why, sizeof why)) return ncclSuccess;
  int from = r->is_send ? r->rank : r->peer, to = r->is_send ? r->peer : r->rank;
  r->broken = log_err(res,
                      "gpu_net ring %d from rank %d to rank %d: %s after %llu slots; the proxy stops moving "
                      "this ring, and the kernel waiting on it will time out or be aborted",
                      r->index, from, to, why[0] != '\0' ? why : "the network connection failed",
                      (unsigned long long)r->done);
  r->net->ops->fail(r->net); /* so that the peer's proxy stops too, instead of waiting for more */
  return r->broken;
}

int tp_gpu_net_drained(const tp_gpu_net_ring_t *r) {
  if (!r->is_send || r->stopped || r->broken != ncclSuccess || aborted(r)) return 1;
  return r->closed;
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

/* What the receiver sends the sender: ring 0's net blob and the other rings' network handles. */
typedef struct {
  tp_net_blob_t net; /* ring 0's net listen; the other rings' differ only in their handle */
  int32_t nch;       /* rings; checked against the sender's own */
  int32_t reserved;  /* zero */
  _Alignas(
      8) char handles[DEV_MAX_CHANNELS - 1][NCCL_NET_HANDLE_MAXSIZE]; /* ring r's handle is handles[r - 1] */
} gpu_net_blob_t;

_Static_assert(sizeof(gpu_net_blob_t) <= TP_BLOB_BYTES, "the gpu_net blob fits in a transport blob");

/* Bytes of a ring's control block in GPU-memory mode, where control blocks sit apart from the slots. */
#define CTRL_STRIDE ((sizeof(dev_ctrl_t) + 127) / 128 * 128)
/* Bytes of a ring's slots. */
#define SLOTS_BYTES ((size_t)DEV_SLOTS * DEV_SLOT_BYTES)

/* One end of a gpu_net connection. */
typedef struct {
  tp_conn_t base;                   /* the generic part; first, so that a tp_conn_t * converts to this */
  int dev;                          /* this rank's device */
  int nch;                          /* rings */
  int data_type;                    /* NCCL_PTR_HOST: whole rings in host memory; NCCL_PTR_CUDA: slots in GPU
                                       memory, control blocks in host memory */
  char *host;                       /* page-locked host memory: the rings, or their control blocks */
  char *gpu;                        /* GPU memory: the slots (NCCL_PTR_CUDA) */
  int registered;                   /* 1 while the rings are with the proxy */
  tp_conn_t *net[DEV_MAX_CHANNELS]; /* each ring's net message connection */
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

/* GPU memory for the slots when every ring's network device takes it (and BRAID_NET_GPU_DIRECT allows);
 * checks that a slot fits the network's messages. */
static ncclResult_t choose_memory(gpu_net_conn_t *c) {
  int gpu = param_int(P_BRAID_NET_GPU_DIRECT) != 0;
  for (int r = 0; r < c->nch; r++) {
    const np_props_t *p = tp_net_msg_props(c->net[r]);
    if (p->max_bytes < DEV_SLOT_BYTES)
      return log_err(ncclInvalidUsage,
                     "%s: network device %s takes messages of %zu bytes, less than a slot (%d)", c->what,
                     p->name, p->max_bytes, DEV_SLOT_BYTES);
    gpu &= (p->ptr_support & NCCL_PTR_CUDA) != 0;
  }
  c->data_type = gpu ? NCCL_PTR_CUDA : NCCL_PTR_HOST;
  return ncclSuccess;
}

/* Allocates the rings: whole in page-locked host memory mapped for the device, or with the slots in GPU
 * memory (control blocks stay in host memory, where the proxy polls them). The kernel gets device addresses.
 */
static ncclResult_t alloc_rings(gpu_net_conn_t *c) {
  CHECK(choose_memory(c));
  int on_gpu = c->data_type == NCCL_PTR_CUDA;
  size_t host_bytes = (size_t)c->nch * (on_gpu ? CTRL_STRIDE : DEV_RING_BYTES);
  void *host = NULL, *dev_ptr = NULL, *gpu = NULL;
  gpu_scope_t scope;
  CHECK(gpu_enter(c->dev, &scope));
  ncclResult_t res = gpu_host_alloc(host_bytes, &host, &dev_ptr);
  if (res == ncclSuccess && on_gpu) res = gpu_mem_alloc((size_t)c->nch * SLOTS_BYTES, &gpu);
  gpu_leave(&scope);
  c->host = host;
  c->gpu = gpu;
  CHECK(res);
  tp_charge(&c->base, host_bytes, on_gpu ? "gpu_net control blocks" : "gpu_net rings");
  if (!on_gpu) return tp_conn_set_rings(&c->base, c->nch, dev_ptr);
  tp_charge_dev(&c->base, (size_t)c->nch * SLOTS_BYTES, "gpu_net slots");
  INFO(LOG_NET, "%s: slots in GPU memory (the network takes it)", c->what);
  return tp_conn_set_rings_apart(&c->base, c->nch, dev_ptr, CTRL_STRIDE, gpu, SLOTS_BYTES);
}

static void free_conn(gpu_net_conn_t *c) {
  if (c->registered) tp_gpu_net_proxy_remove(c->ring, c->nch, CLOSE_DRAIN_S);
  for (int r = 0; r < c->nch; r++)
    if (c->net[r] != NULL) c->net[r]->ops->close(c->net[r]);
  if (c->host != NULL || c->gpu != NULL) {
    gpu_scope_t scope;
    int entered = gpu_enter(c->dev, &scope) == ncclSuccess;
    if (c->host != NULL) gpu_host_free(c->host);
    if (c->gpu != NULL) gpu_mem_free(c->gpu);
    if (entered) gpu_leave(&scope);
  }
  tp_conn_free_rings(&c->base);
  tp_uncharge(&c->base);
  free(c);
}

/* Hands the rings to the proxy; a ring whose network connection is not up yet waits for it there. */
static ncclResult_t start_rings(gpu_net_conn_t *c, const tp_config_t *cfg) {
  for (int r = 0; r < c->nch; r++) {
    dev_ctrl_t *ctrl;
    char *slots;
    if (c->data_type == NCCL_PTR_CUDA) {
      ctrl = (dev_ctrl_t *)(c->host + (size_t)r * CTRL_STRIDE);
      slots = c->gpu + (size_t)r * SLOTS_BYTES;
    } else {
      ctrl = (dev_ctrl_t *)(c->host + (size_t)r * DEV_RING_BYTES);
      slots = (char *)ctrl + sizeof(dev_ctrl_t);
    }
    tp_gpu_net_ring_init(&c->ring[r], ctrl, slots, c->data_type, c->net[r], r, cfg->rank, cfg->abort_flag);
  }
  CHECK(tp_gpu_net_proxy_add(c->ring, c->nch));
  c->registered = 1;
  return ncclSuccess;
}

/* Adds ring r's net blob to the packed blob; the listens of one connection differ only in their handles. */
static ncclResult_t pack_net_blob(gpu_net_blob_t *b, int r, const char *net_blob, const char *what) {
  tp_net_blob_t nb;
  memcpy(&nb, net_blob, sizeof nb);
  if (r == 0) {
    b->net = nb;
    return ncclSuccess;
  }
  memcpy(b->handles[r - 1], nb.handle, sizeof nb.handle);
  memcpy(nb.handle, b->net.handle, sizeof nb.handle);
  /* Rings on different devices may take different message sizes: the sender keeps to the smallest. */
  if (nb.slot_bytes < b->net.slot_bytes) b->net.slot_bytes = nb.slot_bytes;
  nb.slot_bytes = b->net.slot_bytes;
  if (memcmp(&nb, &b->net, sizeof nb) == 0) return ncclSuccess;
  return log_err(ncclInternalError,
                 "%s: the net listen of ring %d differs from ring 0's in more than its handle", what, r);
}

static ncclResult_t gpu_net_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  gpu_net_conn_t *c;
  CHECK(new_conn(ctx, peer, 0, &c));
  gpu_net_blob_t b;
  memset(&b, 0, sizeof b);
  b.nch = c->nch;
  for (int r = 0; r < c->nch; r++) {
    char net_blob[TP_BLOB_BYTES];
    CHECK_GOTO(tp_net_msg_listen(ctx, peer, net_blob, &c->net[r]), res, err_free_conn);
    CHECK_GOTO(pack_net_blob(&b, r, net_blob, c->what), res, err_free_conn);
  }
  CHECK_GOTO(alloc_rings(c), res, err_free_conn);
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
  for (int r = 0; r < c->nch; r++) {
    char net_blob[TP_BLOB_BYTES] = {0};
    tp_net_blob_t nb = b.net;
    if (r > 0) memcpy(nb.handle, b.handles[r - 1], sizeof nb.handle);
    memcpy(net_blob, &nb, sizeof nb);
    CHECK_GOTO(tp_net_msg_connect(ctx, peer, net_blob, &c->net[r]), res, err_free_conn);
  }
  CHECK_GOTO(alloc_rings(c), res, err_free_conn);
  CHECK_GOTO(start_rings(c, cfg), res, err_free_conn);
  char via[80];
  snprintf(via, sizeof via, "NET/%s", np_name(tp_net_network(tp_ctx_net(ctx))));
  tp_log_route(ctx, &c->base, LOG_NET, via);
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
