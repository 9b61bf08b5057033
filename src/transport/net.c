/*
 * The net transport: a byte stream per (peer, direction) over a network (net_plugin.h): Braid's built-in
 * TCP or any plugin, driven through the plugin calls only.
 *
 * Setup: the receiver's listen asks the network for a handle and sends it in the blob; the sender's connect
 * hands the handle to a thread of its own, which calls the network's connect until it gives a connection
 * (a plugin's connect may wait for the peer's accept, and the peer may be this very thread); the receiver's
 * accept calls the network's accept until it gives one. Every setup wait is bounded and sees the abort flag.
 *
 * Data: each end has `nslots` staging slots of `slot_bytes`, registered with the network. A slot is one
 * message: a 16-byte header (magic, payload size, sequence number) and the payload, so a plugin that does
 * not report received sizes, or reports them wrongly, is caught. The sender fills a slot (send_peek /
 * send_commit) and hands it to isend when it is full or at flush; the receiver keeps an irecv posted in every
 * free slot and offers a slot's payload once its receive completed. Requests are tested oldest first, and
 * never more are outstanding than the network allows. Only the rank's one executing thread (or the gpu_net
 * proxy) touches a connection's data path.
 */
#include "transport/net.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"

/* Seconds connect and accept wait when BRAID_TIMEOUT_S is 0 (never): connection setup is always bounded. */
#define SETUP_TIMEOUT_DEFAULT_S 120
/* Seconds a closing connection waits for its connect thread to leave the network's connect. */
#define CONNECT_JOIN_S 5
/* Messages a connection has under way at most (and no more than the network's request limit). */
#define NET_SLOTS 8
/* Largest slot payload: a message is delivered whole, so smaller ones let a receiver start on a transfer
 * (and forward it) while the rest is still on the wire. */
#define SLOT_MAX_PAYLOAD (32 * 1024)
/* Slot payloads are multiples of the executor's stream alignment, which no element exceeds. */
#define ALIGN 16
/* Registrations a message connection (tp_net_msg_*) may hold. */
#define NET_MSG_REGS 4
/* "NESM": first field of a message header. */
#define MSG_MAGIC 0x4d53454eu

/* What starts every message. */
typedef struct {
  uint32_t magic; /* MSG_MAGIC */
  uint32_t bytes; /* payload bytes that follow */
  uint64_t seq;   /* the message's number on its connection */
} msg_hdr_t;

_Static_assert(sizeof(msg_hdr_t) == ALIGN, "the message header keeps payloads aligned");

struct tp_net_ctx {
  const tp_config_t *config; /* the transport context's configuration */
  np_ctx_t np;               /* the network and its context for this communicator */
  unsigned next_dev;         /* device of the next connection (round robin) */
};

/* Where a connect thread stands. */
enum { CN_CONNECTING, CN_CONNECTED, CN_FAILED };

/* A sender's connect, run by a thread of its own. Shared by the connection and the thread; the last of
 * the two to let go frees it. The thread writes comm, res and why, then state with a release store; the
 * connection reads state with an acquire load before them. */
typedef struct {
  np_ctx_t np; /* the network */
  int dev;     /* the device to connect from */
  _Alignas(
      8) char handle[NCCL_NET_HANDLE_MAXSIZE]; /* the receiver's handle (the network may keep state in it) */
  const volatile int *abort_flag;              /* the communicator's */
  double deadline;                             /* time_now() at which it gives up */
  int peer;                                    /* the receiving rank, for messages */
  pthread_t thread;                            /* the thread */
  int threaded;                                /* 0: no thread could be made; connect ran on the caller's */
  _Atomic int state;                           /* CN_* */
  _Atomic int refs;                            /* holders: the connection and the thread */
  _Atomic int abandoned;                       /* the connection closed: stop and close what connect gives */
  void *comm;       /* the send comm (CN_CONNECTED) until the connection takes it */
  ncclResult_t res; /* why it failed (CN_FAILED) */
  char why[256];    /* in words */
} connector_t;

/* One staging slot: a message under way. */
typedef struct {
  void *req;      /* its outstanding request (NULL: none) */
  uint32_t bytes; /* receiver: payload bytes it holds */
  uint32_t used;  /* receiver: payload bytes the caller released */
} slot_t;

/* One end of a net connection. */
typedef struct {
  tp_conn_t base;          /* the generic part; first, so that a tp_conn_t * converts to this */
  tp_net_ctx_t *net;       /* the context's net state */
  const np_net_t *nw;      /* its network */
  int dev;                 /* the network device this end uses */
  void *listen;            /* receiver: the network's listen until accepted */
  connector_t *cn;         /* sender: its connect until it is taken */
  void *comm;              /* the network's send or receive comm (NULL until set up, and after fail) */
  void *mh;                /* the registration of buf */
  void *mhs[NET_MSG_REGS]; /* message connections: the owner's registrations, undone before the comm closes */
  int nmhs;                /* entries used in mhs */
  char *buf;               /* nslots slots of slot_bytes */
  size_t slot_bytes;       /* header included */
  int nslots;              /* slots */
  slot_t slots[NET_SLOTS];
  uint64_t done;       /* sender: messages the network finished; receiver: messages the caller released */
  uint64_t moving;     /* sender: messages handed to isend; receiver: messages arrived */
  uint64_t queued;     /* sender: messages sealed; receiver: receives posted */
  size_t fill;         /* sender: payload bytes in the slot being filled (message `queued`) */
  size_t peeked;       /* bytes offered by the last peek and not yet committed or released */
  ncclResult_t broken; /* the error already reported on this connection, returned again without logging */
  int quiet_close;     /* 1: network failures are not logged (tp_net_quiet_close) */
  int peer_closed;     /* 1: the network reported the connection broken */
  char err[256];       /* what the network reported, logged once a caller needs the bytes it stopped */
  char what[64];       /* "net connection from rank A to rank B", for messages */
} net_conn_t;

static double setup_deadline(void) {
  int64_t t = param_int(P_BRAID_TIMEOUT_S);
  return time_now() + (double)(t > 0 ? t : SETUP_TIMEOUT_DEFAULT_S);
}

static int aborted(const volatile int *abort_flag) {
  return abort_flag != NULL && __atomic_load_n(abort_flag, __ATOMIC_RELAXED) != 0;
}

/* ---- Context ---- */

ncclResult_t tp_net_ctx_create(const tp_config_t *config, tp_net_ctx_t **net_p) {
  tp_net_ctx_t *n = calloc(1, sizeof *n);
  if (n == NULL) return log_err(ncclSystemError, "net transport on rank %d: out of memory", config->rank);
  n->config = config;
  const char *want = config->net_name != NULL ? config->net_name : param_str(P_NCCL_NET);
  ncclResult_t res = np_open(want, config->nonce, &n->np);
  if (res != ncclSuccess) {
    free(n);
    return res;
  }
  n->next_dev = (unsigned)config->rank;
  *net_p = n;
  return ncclSuccess;
}

void tp_net_ctx_destroy(tp_net_ctx_t *n) {
  if (n == NULL) return;
  np_close(&n->np);
  free(n);
}

const np_net_t *tp_net_network(const tp_net_ctx_t *n) {
  return n->np.net;
}

/* ---- Connections ---- */

static slot_t *slot(net_conn_t *c, uint64_t msg) {
  return &c->slots[msg % (uint64_t)c->nslots];
}

static char *slot_buf(net_conn_t *c, uint64_t msg) {
  return c->buf + (msg % (uint64_t)c->nslots) * c->slot_bytes;
}

/* Slot size from the ring size the communicator agreed on and what the device takes; `limit` (the
 * receiver's slot size, 0: none) bounds a sender's. */
static size_t choose_slot_bytes(const tp_config_t *cfg, const np_props_t *p, int nslots, size_t limit) {
  size_t payload = cfg->ring_bytes / (size_t)nslots;
  if (payload > SLOT_MAX_PAYLOAD) payload = SLOT_MAX_PAYLOAD;
  size_t cap = p->max_bytes - sizeof(msg_hdr_t);
  if (limit > 0 && limit - sizeof(msg_hdr_t) < cap) cap = limit - sizeof(msg_hdr_t);
  if (payload > cap) payload = cap;
  payload -= payload % ALIGN;
  if (payload < ALIGN) payload = ALIGN;
  return sizeof(msg_hdr_t) + payload;
}

/* A connection; `staged` 0 makes a message connection (tp_net_msg_*), without staging slots. */
static ncclResult_t new_conn(tp_ctx_t *ctx, int peer, int is_send, int staged, size_t limit,
                             net_conn_t **conn_p) {
  const tp_config_t *cfg = tp_ctx_config(ctx);
  tp_conn_t base;
  CHECK(tp_conn_init(ctx, &tp_net_ops, peer, is_send, &base));
  char what[64];
  snprintf(what, sizeof what, "the TCP staging ring with rank %d", peer);
  CHECK(mem_fault(what, cfg->ring_bytes, 0));
  net_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL) return log_err(ncclSystemError, "net connection with rank %d: out of memory", peer);
  c->base = base;
  c->net = tp_ctx_net(ctx);
  c->nw = tp_net_network(c->net);
  c->dev = (int)(c->net->next_dev++ % (unsigned)np_ndevs(c->nw));
  const np_props_t *p = np_props(c->nw, c->dev);
  c->nslots = p->max_requests < NET_SLOTS ? p->max_requests : NET_SLOTS;
  c->slot_bytes = choose_slot_bytes(cfg, p, c->nslots, limit);
  snprintf(c->what, sizeof c->what, "net connection from rank %d to rank %d", is_send ? cfg->rank : peer,
           is_send ? peer : cfg->rank);
  if (limit > 0 && limit < sizeof(msg_hdr_t) + ALIGN) {
    free(c);
    return log_err(ncclInternalError, "%s: the receiver takes messages of %zu bytes only", c->what, limit);
  }
  if (!staged) {
    *conn_p = c;
    return ncclSuccess;
  }
  size_t total = c->slot_bytes * (size_t)c->nslots;
  c->buf = malloc(total);
  if (c->buf == NULL) {
    free(c);
    return log_err(ncclSystemError, "net connection with rank %d: out of memory for %zu bytes of staging",
                   peer, total);
  }
  tp_charge(&c->base, total, "net staging");
  *conn_p = c;
  return ncclSuccess;
}

/* Remembers a failed network call; later calls return the error again. It is logged (surface) only once a
 * caller needs what the connection can no longer give: a receiver that already has everything it wanted
 * never hears of a peer that closed after sending it. */
static ncclResult_t net_failed(net_conn_t *c, ncclResult_t res, const char *call) {
  if (c->broken != ncclSuccess) return c->broken;
  c->peer_closed = 1;
  const char *why = np_why(c->nw, c->comm);
  snprintf(c->err, sizeof c->err, "%s on network %s failed (%s)%s%s", call, np_name(c->nw),
           log_result_name(res), why[0] != '\0' ? ": " : "", why);
  return c->broken = c->quiet_close ? ncclRemoteError : res;
}

/* Returns the connection's error to a caller, logging a network failure the first time (unless quiet). */
static ncclResult_t surface(net_conn_t *c) {
  if (c->err[0] != '\0' && !c->quiet_close) log_err(c->broken, "%s: %s", c->what, c->err);
  c->err[0] = '\0';
  return c->broken;
}

/* Registers the staging slots once the network's comm exists. */
static ncclResult_t register_slots(net_conn_t *c) {
  const np_props_t *p = np_props(c->nw, c->dev);
  if (c->buf == NULL) return ncclSuccess; /* a message connection: its owner registers its own memory */
  if (!(p->ptr_support & NCCL_PTR_HOST))
    return c->broken =
               log_err(ncclInvalidUsage,
                       "%s: network %s device %d takes no host memory (ptrSupport %#x), which the net "
                       "transport stages through",
                       c->what, np_name(c->nw), c->dev, (unsigned)p->ptr_support);
  ncclResult_t res = np_reg(c->nw, c->comm, c->buf, c->slot_bytes * (size_t)c->nslots, NCCL_PTR_HOST, &c->mh);
  if (res != ncclSuccess) {
    net_failed(c, res, "regMr of the staging slots");
    return surface(c);
  }
  INFO(LOG_NET, "%s: up on network %s device %d (%s), %d slots of %zu bytes", c->what, np_name(c->nw), c->dev,
       np_props(c->nw, c->dev)->name, c->nslots, c->slot_bytes);
  return ncclSuccess;
}

static void free_conn(net_conn_t *c);

/* ---- Connect thread ---- */

static void connector_release(connector_t *cn) {
  if (atomic_fetch_sub_explicit(&cn->refs, 1, memory_order_acq_rel) != 1) return;
  if (cn->comm != NULL) np_close_send(cn->np.net, cn->comm); /* abandoned: nobody took it */
  free(cn);
}

/* One attempt, or the reason to give up; *comm_p set once connected. */
static ncclResult_t connect_step(connector_t *cn, void **comm_p) {
  if (atomic_load_explicit(&cn->abandoned, memory_order_relaxed)) {
    snprintf(cn->why, sizeof cn->why, "closed while connecting");
    return ncclSystemError;
  }
  if (aborted(cn->abort_flag)) {
    snprintf(cn->why, sizeof cn->why, "connect aborted");
    return ncclSystemError;
  }
  if (time_now() > cn->deadline) {
    snprintf(cn->why, sizeof cn->why, "rank %d did not accept in time (BRAID_TIMEOUT_S)", cn->peer);
    return ncclRemoteError;
  }
  ncclResult_t res = np_connect(&cn->np, cn->dev, cn->handle, comm_p);
  if (res != ncclSuccess) {
    const char *why = np_why(cn->np.net, NULL);
    snprintf(cn->why, sizeof cn->why, "connect on network %s failed (%s)%s%s", np_name(cn->np.net),
             log_result_name(res), why[0] != '\0' ? ": " : "", why);
  }
  return res;
}

static void *connector_main(void *arg) {
  connector_t *cn = arg;
  ncclResult_t res;
  void *comm = NULL;
  for (uint64_t round = 0; (res = connect_step(cn, &comm)) == ncclSuccess && comm == NULL; round++)
    time_backoff(round);
  cn->comm = comm;
  cn->res = res;
  atomic_store_explicit(&cn->state, res == ncclSuccess ? CN_CONNECTED : CN_FAILED, memory_order_release);
  connector_release(cn);
  return NULL;
}

static ncclResult_t start_connector(net_conn_t *c, const tp_net_blob_t *b) {
  connector_t *cn = calloc(1, sizeof *cn);
  if (cn == NULL) return log_err(ncclSystemError, "%s: out of memory", c->what);
  cn->np = c->net->np;
  cn->dev = c->dev;
  memcpy(cn->handle, b->handle, sizeof cn->handle);
  cn->abort_flag = c->net->config->abort_flag;
  cn->deadline = setup_deadline();
  cn->peer = c->base.peer;
  atomic_init(&cn->refs, 2);
  c->cn = cn;
  int err = pthread_create(&cn->thread, NULL, connector_main, cn);
  cn->threaded = err == 0;
  if (err != 0) {
    INFO(LOG_NET, "%s: no thread to connect with (%s); connecting on this one", c->what, strerror(err));
    connector_main(cn);
  }
  return ncclSuccess;
}

/* Sender: takes the connection once the connect thread has it; *ready_p = 0 while it is under way. */
static ncclResult_t send_ready(net_conn_t *c, int *ready_p) {
  *ready_p = c->comm != NULL;
  if (*ready_p || c->broken != ncclSuccess) return c->broken;
  connector_t *cn = c->cn;
  int state = atomic_load_explicit(&cn->state, memory_order_acquire);
  if (state == CN_CONNECTING) return ncclSuccess;
  if (cn->threaded) pthread_join(cn->thread, NULL);
  c->cn = NULL;
  if (state == CN_FAILED) {
    snprintf(c->err, sizeof c->err, "%s", cn->why);
    c->broken = cn->res;
    connector_release(cn);
    return c->broken;
  }
  c->comm = cn->comm;
  cn->comm = NULL;
  connector_release(cn);
  CHECK(register_slots(c));
  *ready_p = 1;
  return ncclSuccess;
}

/* Lets go of a connect thread that may still run: asks it to stop and waits a while for it. A thread stuck
 * inside the network's connect is left to finish on its own (it frees what it holds). */
static void stop_connector(net_conn_t *c) {
  connector_t *cn = c->cn;
  c->cn = NULL;
  atomic_store_explicit(&cn->abandoned, 1, memory_order_relaxed);
  if (cn->threaded) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += CONNECT_JOIN_S;
    if (pthread_timedjoin_np(cn->thread, NULL, &until) != 0) {
      WARN("%s: the connect thread is still inside network %s's connect after %d s; left to finish alone",
           c->what, np_name(c->nw), CONNECT_JOIN_S);
      pthread_detach(cn->thread);
    }
  }
  connector_release(cn);
}

/* ---- Setup ---- */

static ncclResult_t listen_as(tp_ctx_t *ctx, int peer, int staged, void *blob, tp_conn_t **conn_p) {
  net_conn_t *c;
  CHECK(new_conn(ctx, peer, 0, staged, 0, &c));
  const tp_config_t *cfg = tp_ctx_config(ctx);
  tp_net_blob_t b = {.magic = NET_BLOB_MAGIC,
                     .nonce = cfg->nonce,
                     .receiver_rank = cfg->rank,
                     .slot_bytes = (uint32_t)c->slot_bytes};
  ncclResult_t res = np_listen(&c->net->np, c->dev, b.handle, &c->listen);
  if (res != ncclSuccess) {
    const char *why = np_why(c->nw, NULL);
    log_err(res, "%s: listen on network %s device %d failed (%s)%s%s", c->what, np_name(c->nw), c->dev,
            log_result_name(res), why[0] != '\0' ? ": " : "", why);
    free_conn(c);
    return res;
  }
  memset(blob, 0, TP_BLOB_BYTES);
  memcpy(blob, &b, sizeof b);
  *conn_p = &c->base;
  return ncclSuccess;
}

static ncclResult_t connect_as(tp_ctx_t *ctx, int peer, int staged, const void *blob, tp_conn_t **conn_p) {
  tp_net_blob_t b;
  memcpy(&b, blob, sizeof b);
  const tp_config_t *cfg = tp_ctx_config(ctx);
  if (b.magic != NET_BLOB_MAGIC || b.receiver_rank != peer || b.nonce != cfg->nonce)
    return log_err(
        ncclInternalError,
        "net connection to rank %d: the blob comes from rank %d, nonce %llx (ours %llx, magic %llx)", peer,
        (int)b.receiver_rank, (unsigned long long)b.nonce, (unsigned long long)cfg->nonce,
        (unsigned long long)b.magic);
  net_conn_t *c;
  CHECK(new_conn(ctx, peer, 1, staged, staged ? b.slot_bytes : 0, &c));
  ncclResult_t res = start_connector(c, &b);
  if (res != ncclSuccess) {
    free_conn(c);
    return res;
  }
  *conn_p = &c->base;
  return ncclSuccess;
}

static ncclResult_t net_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p) {
  return listen_as(ctx, peer, 1, blob, conn_p);
}

static ncclResult_t net_connect(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p) {
  return connect_as(ctx, peer, 1, blob, conn_p);
}

static ncclResult_t recv_progress(net_conn_t *c);

static ncclResult_t net_accept(tp_ctx_t *ctx, tp_conn_t *conn) {
  net_conn_t *c = (net_conn_t *)conn;
  const volatile int *abort_flag = c->net->config->abort_flag;
  double start = time_now(), deadline = setup_deadline();
  for (uint64_t round = 0; c->comm == NULL; round++) {
    if (aborted(abort_flag))
      return log_err(ncclSystemError, "%s: accept aborted after %.1f s", c->what, time_now() - start);
    if (time_now() > deadline)
      return log_err(ncclRemoteError, "%s: rank %d did not connect within %.0f s", c->what, conn->peer,
                     deadline - start);
    ncclResult_t res = np_accept(c->nw, c->listen, &c->comm);
    if (res != ncclSuccess) {
      c->comm = NULL;
      const char *why = np_why(c->nw, NULL);
      return log_err(res, "%s: accept on network %s failed (%s)%s%s", c->what, np_name(c->nw),
                     log_result_name(res), why[0] != '\0' ? ": " : "", why);
    }
    if (c->comm == NULL) time_backoff(round);
  }
  np_close_listen(c->nw, c->listen);
  c->listen = NULL;
  CHECK(register_slots(c));
  if (c->buf == NULL) return ncclSuccess;
  return recv_progress(c) == ncclSuccess ? ncclSuccess : surface(c);
}

/* ---- Sending ---- */

/* Seals the slot being filled: writes its header; it goes out at the next send_progress. */
static void seal(net_conn_t *c) {
  msg_hdr_t h = {.magic = MSG_MAGIC, .bytes = (uint32_t)c->fill, .seq = c->queued};
  memcpy(slot_buf(c, c->queued), &h, sizeof h);
  c->queued++;
  c->fill = 0;
}

/* Tests the messages under way (oldest first) and hands sealed ones to isend while the network takes them. */
static ncclResult_t send_progress(net_conn_t *c) {
  while (c->done < c->moving) {
    int done, size;
    ncclResult_t res = np_test(c->nw, slot(c, c->done)->req, &done, &size);
    if (res != ncclSuccess) return net_failed(c, res, "test of a send");
    if (!done) break;
    slot(c, c->done)->req = NULL;
    c->done++;
  }
  while (c->moving < c->queued) {
    void *req = NULL;
    msg_hdr_t h;
    memcpy(&h, slot_buf(c, c->moving), sizeof h);
    ncclResult_t res = np_isend(c->nw, c->comm, slot_buf(c, c->moving), sizeof h + h.bytes, 0, c->mh, &req);
    if (res != ncclSuccess) return net_failed(c, res, "isend");
    if (req == NULL) break; /* the network takes no more now */
    slot(c, c->moving)->req = req;
    c->moving++;
  }
  return ncclSuccess;
}

static ncclResult_t net_send_peek(tp_conn_t *conn, void **ptr_p, size_t *bytes_p) {
  net_conn_t *c = (net_conn_t *)conn;
  int ready;
  *bytes_p = 0;
  c->peeked = 0;
  if (send_ready(c, &ready) != ncclSuccess || (ready && send_progress(c) != ncclSuccess)) return surface(c);
  if (!ready) return ncclSuccess;
  if (c->queued - c->done >= (uint64_t)c->nslots) return ncclSuccess; /* every slot is under way */
  size_t payload = c->slot_bytes - sizeof(msg_hdr_t);
  c->peeked = payload - c->fill;
  *ptr_p = slot_buf(c, c->queued) + sizeof(msg_hdr_t) + c->fill;
  *bytes_p = c->peeked;
  return ncclSuccess;
}

/* A send-side step whose failure is returned to the caller (logged once). */
#define CHECK_SEND(call)                                                                                     \
  do {                                                                                                       \
    if ((call) != ncclSuccess) return surface(c);                                                            \
  } while (0)

static ncclResult_t net_send_commit(tp_conn_t *conn, size_t bytes) {
  net_conn_t *c = (net_conn_t *)conn;
  if (c->broken != ncclSuccess) return surface(c);
  if (bytes > c->peeked)
    return log_err(ncclInternalError, "%s: commit of %zu bytes, only %zu were peeked", c->what, bytes,
                   c->peeked);
  c->peeked -= bytes;
  c->fill += bytes;
  if (bytes == 0) return ncclSuccess;
  /* A slot goes at once while nothing is under way (latency), else once it has less room than one aligned
   * piece (the executor could not fill it) or at flush: what is committed meanwhile rides along. */
  CHECK_SEND(send_progress(c));
  if (c->done == c->queued || c->slot_bytes - sizeof(msg_hdr_t) - c->fill < ALIGN) {
    seal(c);
    c->peeked = 0;
  }
  CHECK_SEND(send_progress(c));
  return ncclSuccess;
}

#undef CHECK_SEND

static ncclResult_t net_flush(tp_conn_t *conn, int *done_p) {
  net_conn_t *c = (net_conn_t *)conn;
  int ready;
  *done_p = 0;
  if (send_ready(c, &ready) != ncclSuccess) return surface(c);
  if (!ready) return ncclSuccess;
  if (c->fill > 0) {
    seal(c);
    c->peeked = 0;
  }
  if (send_progress(c) != ncclSuccess) return surface(c);
  *done_p = c->done == c->queued;
  return ncclSuccess;
}

/* ---- Receiving ---- */

/* Checks a message that arrived in the slot of message `msg`; `size` is what test reported (-1: nothing). */
static ncclResult_t check_message(net_conn_t *c, uint64_t msg, int size) {
  msg_hdr_t h;
  memcpy(&h, slot_buf(c, msg), sizeof h);
  int ok = h.magic == MSG_MAGIC && h.seq == msg && h.bytes <= c->slot_bytes - sizeof h &&
           (size < 0 || (size_t)size == sizeof h + h.bytes);
  if (ok) {
    slot(c, msg)->bytes = h.bytes;
    slot(c, msg)->used = 0;
    return ncclSuccess;
  }
  return c->broken = log_err(ncclRemoteError,
                             "%s: message %llu arrived malformed (magic %08x, %u bytes, number %llu; the "
                             "network reported %d bytes, slots hold %zu)",
                             c->what, (unsigned long long)msg, (unsigned)h.magic, (unsigned)h.bytes,
                             (unsigned long long)h.seq, size, c->slot_bytes);
}

/* Takes the messages that arrived (oldest first). Requests the network finished before the connection
 * broke still count, so that what arrived before an error is delivered first. */
static ncclResult_t recv_arrivals(net_conn_t *c) {
  while (c->comm != NULL && c->moving < c->queued) {
    int done, size;
    ncclResult_t res = np_test(c->nw, slot(c, c->moving)->req, &done, &size);
    if (res != ncclSuccess) return net_failed(c, res, "test of a receive");
    if (!done) break;
    slot(c, c->moving)->req = NULL;
    CHECK(check_message(c, c->moving, size));
    c->moving++;
  }
  /* After an error, receives posted before it may still complete: it counts once none is left. */
  return c->comm != NULL && c->moving < c->queued ? ncclSuccess : c->broken;
}

/* Keeps a receive posted in every free slot, then takes what arrived. */
static ncclResult_t recv_progress(net_conn_t *c) {
  while (c->broken == ncclSuccess && c->queued < c->done + (uint64_t)c->nslots) {
    void *req = NULL, *data = slot_buf(c, c->queued);
    size_t size = c->slot_bytes;
    int tag = 0;
    ncclResult_t res = np_irecv(c->nw, c->comm, 1, &data, &size, &tag, &c->mh, &req);
    if (res != ncclSuccess) net_failed(c, res, "irecv"); /* what was posted before may still arrive */
    if (req == NULL) break;
    slot(c, c->queued)->req = req;
    c->queued++;
  }
  return recv_arrivals(c);
}

/* The bytes that arrived are offered even after the connection broke: an error is returned only once they
 * are used up. */
static ncclResult_t net_recv_peek(tp_conn_t *conn, void **ptr_p, size_t *bytes_p) {
  net_conn_t *c = (net_conn_t *)conn;
  *bytes_p = 0;
  c->peeked = 0;
  /* The network is asked only when no message is in hand: a poll costs it a system call. */
  ncclResult_t res = c->done == c->moving ? recv_progress(c) : ncclSuccess;
  while (c->done < c->moving && slot(c, c->done)->bytes == 0) c->done++; /* empty messages carry nothing */
  if (c->done == c->moving) return res == ncclSuccess ? ncclSuccess : surface(c);
  slot_t *s = slot(c, c->done);
  c->peeked = s->bytes - s->used;
  *ptr_p = slot_buf(c, c->done) + sizeof(msg_hdr_t) + s->used;
  *bytes_p = c->peeked;
  return ncclSuccess;
}

static ncclResult_t net_recv_release(tp_conn_t *conn, size_t bytes) {
  net_conn_t *c = (net_conn_t *)conn;
  if (bytes > c->peeked)
    return log_err(ncclInternalError, "%s: release of %zu bytes, only %zu were peeked", c->what, bytes,
                   c->peeked);
  if (bytes == 0) return ncclSuccess;
  slot_t *s = slot(c, c->done);
  c->peeked -= bytes;
  s->used += (uint32_t)bytes;
  if (s->used < s->bytes) return ncclSuccess;
  c->done++;
  c->peeked = 0;
  return ncclSuccess; /* the slot gets its next receive when a peek finds nothing in hand */
}

/* ---- Ending ---- */

void tp_net_quiet_close(tp_conn_t *conn) {
  ((net_conn_t *)conn)->quiet_close = 1;
}

int tp_net_peer_closed(const tp_conn_t *conn) {
  return ((const net_conn_t *)conn)->peer_closed;
}

/* Closes the network's comm at once, so that the peer's next test fails instead of waiting. */
static void net_fail(tp_conn_t *conn) {
  net_conn_t *c = (net_conn_t *)conn;
  if (c->cn != NULL) stop_connector(c);
  if (c->comm != NULL) {
    if (c->mh != NULL) np_dereg(c->nw, c->comm, c->mh);
    c->mh = NULL;
    for (int i = 0; i < c->nmhs; i++) np_dereg(c->nw, c->comm, c->mhs[i]);
    c->nmhs = 0;
    if (c->base.is_send)
      np_close_send(c->nw, c->comm);
    else
      np_close_recv(c->nw, c->comm);
    c->comm = NULL;
  }
  np_close_listen(c->nw, c->listen);
  c->listen = NULL;
  if (c->broken == ncclSuccess) c->broken = ncclSystemError; /* reported where the failure started */
}

static void free_conn(net_conn_t *c) {
  net_fail(&c->base);
  tp_uncharge(&c->base);
  free(c->buf);
  free(c);
}

static void net_close(tp_conn_t *conn) {
  if (conn != NULL) free_conn((net_conn_t *)conn);
}

/* ---- Messages (gpu_net) ---- */

ncclResult_t tp_net_msg_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p) {
  return listen_as(ctx, peer, 0, blob, conn_p);
}

ncclResult_t tp_net_msg_connect(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p) {
  return connect_as(ctx, peer, 0, blob, conn_p);
}

const np_props_t *tp_net_msg_props(const tp_conn_t *conn) {
  const net_conn_t *c = (const net_conn_t *)conn;
  return np_props(c->nw, c->dev);
}

ncclResult_t tp_net_msg_ready(tp_conn_t *conn, int *ready_p) {
  net_conn_t *c = (net_conn_t *)conn;
  if (c->base.is_send) return send_ready(c, ready_p) == ncclSuccess ? ncclSuccess : surface(c);
  *ready_p = c->comm != NULL;
  return c->broken == ncclSuccess ? ncclSuccess : surface(c);
}

ncclResult_t tp_net_msg_reg(tp_conn_t *conn, void *base, size_t bytes, int type, void **mhandle_p) {
  net_conn_t *c = (net_conn_t *)conn;
  if (c->comm == NULL || c->nmhs == NET_MSG_REGS)
    return log_err(ncclInternalError, "%s: registration %d of memory before the connection is up", c->what,
                   c->nmhs);
  ncclResult_t res = np_reg(c->nw, c->comm, base, bytes, type, mhandle_p);
  if (res != ncclSuccess) {
    net_failed(c, res, type == NCCL_PTR_CUDA ? "regMr of GPU memory" : "regMr of host memory");
    return surface(c);
  }
  c->mhs[c->nmhs++] = *mhandle_p;
  return ncclSuccess;
}

ncclResult_t tp_net_msg_send(tp_conn_t *conn, void *data, size_t size, int tag, void *mhandle, void **req_p) {
  net_conn_t *c = (net_conn_t *)conn;
  *req_p = NULL;
  if (c->broken != ncclSuccess) return surface(c);
  ncclResult_t res = np_isend(c->nw, c->comm, data, size, tag, mhandle, req_p);
  return res == ncclSuccess ? ncclSuccess : (net_failed(c, res, "isend"), surface(c));
}

ncclResult_t tp_net_msg_recv(tp_conn_t *conn, void *data, size_t size, int tag, void *mhandle, void **req_p) {
  net_conn_t *c = (net_conn_t *)conn;
  *req_p = NULL;
  if (c->broken != ncclSuccess) return surface(c);
  ncclResult_t res = np_irecv(c->nw, c->comm, 1, &data, &size, &tag, &mhandle, req_p);
  return res == ncclSuccess ? ncclSuccess : (net_failed(c, res, "irecv"), surface(c));
}

ncclResult_t tp_net_msg_flush(tp_conn_t *conn, void *data, size_t size, void *mhandle, void **req_p) {
  net_conn_t *c = (net_conn_t *)conn;
  *req_p = NULL;
  /* Allowed after an error: what arrived before it is still delivered (and flushed). */
  if (c->comm == NULL) return c->broken != ncclSuccess ? surface(c) : ncclInternalError;
  ncclResult_t res = np_iflush(c->nw, c->comm, 1, &data, &size, &mhandle, req_p);
  return res == ncclSuccess ? ncclSuccess : (net_failed(c, res, "iflush"), surface(c));
}

ncclResult_t tp_net_msg_test(tp_conn_t *conn, void *req, int *done_p, int *size_p) {
  net_conn_t *c = (net_conn_t *)conn;
  *done_p = 0;
  if (c->comm == NULL) return c->broken != ncclSuccess ? surface(c) : ncclInternalError;
  ncclResult_t res = np_test(c->nw, req, done_p, size_p);
  return res == ncclSuccess ? ncclSuccess : (net_failed(c, res, "test"), surface(c));
}

/* The context's net state, through the ops table (the transport context names no transport's header). */
static ncclResult_t net_ctx_init(const tp_ctx_t *ctx, void **state_p) {
  tp_net_ctx_t *n;
  CHECK(tp_net_ctx_create(tp_ctx_config(ctx), &n));
  *state_p = n;
  return ncclSuccess;
}

static void net_ctx_free(void *state) {
  tp_net_ctx_destroy(state);
}

const tp_ops_t tp_net_ops = {
    .name = "net",
    .listen = net_listen,
    .connect = net_connect,
    .accept = net_accept,
    .send_peek = net_send_peek,
    .send_commit = net_send_commit,
    .flush = net_flush,
    .recv_peek = net_recv_peek,
    .recv_release = net_recv_release,
    .fail = net_fail,
    .close = net_close,
    .ctx_init = net_ctx_init,
    .ctx_free = net_ctx_free,
};
