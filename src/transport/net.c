/*
 * The net transport: one TCP connection per (peer, direction), with a local staging ring on each side.
 *
 * Setup: the receiver's listen writes its context's listening address and a fresh tag into the blob; the
 * sender connects there and sends a hello (magic, nonce, ranks, tag); the receiver's accept takes connections
 * off the listening socket until the one carrying its tag arrives, and keeps the others for their own accept.
 *
 * Data: the sender's ring holds committed bytes until the socket takes them (send_commit pushes at once,
 * flush and a full send_peek push again). The receiver pulls from the socket into its ring only when the ring
 * is empty, so its readable region is always contiguous and a connection the sender closed is reported only
 * when the caller actually waits for more bytes. Sockets are non-blocking once set up; nothing here blocks
 * after accept. Only the rank's one executing thread touches a connection, so the rings need no atomics.
 */
#include "transport/net.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"

/* Seconds connect and accept wait when BRAID_TIMEOUT_S is 0 (never): connection setup is always bounded. */
#define SETUP_TIMEOUT_DEFAULT_S 120
/* Seconds an accepted connection may take to deliver its hello. */
#define HELLO_TIMEOUT_S 10
/* Seconds between two checks, on a sender, that the receiver did not close or fail. */
/* A received remainder shorter than this moves to the ring's start, and only then is the socket read
 * (see net_recv_peek). It is the executor's stream alignment, which no element exceeds. */
#define COMPACT_BYTES     16
#define LIVENESS_PERIOD_S 0.1

/* An accepted connection whose hello names a listen that has not been accepted yet. */
typedef struct {
  int fd;         /* the connection */
  uint32_t tag;   /* the tag its hello carries */
  int32_t sender; /* the rank that sent the hello */
} pending_t;

struct tp_net_ctx {
  const tp_config_t *config; /* the transport context's configuration */
  int listen_fd;             /* listening socket, for the whole life of the context */
  sock_addr_t addr;          /* its address, sent in every blob */
  uint32_t next_tag;         /* tag of the next listen */
  pending_t *pending;        /* connections waiting for their accept */
  int npending;              /* entries used in pending */
  int cap;                   /* entries allocated in pending */
};

/* One end of a net connection. */
typedef struct {
  tp_conn_t base;      /* the generic part; first, so that a tp_conn_t * converts to this */
  tp_net_ctx_t *net;   /* the context's net state */
  int fd;              /* the connection's socket (-1 until connected or accepted) */
  uint32_t tag;        /* receiver: the tag of its listen */
  unsigned char *ring; /* staging ring */
  size_t ring_bytes;   /* its size */
  uint64_t head;       /* sender: bytes the socket took; receiver: bytes released by the caller */
  uint64_t tail;       /* sender: bytes committed by the caller; receiver: bytes read from the socket */
  size_t peeked;       /* bytes offered by the last peek and not yet committed or released */
  double next_check;   /* sender: time_now() after which a peek or flush checks the socket for EOF */
  ncclResult_t broken; /* the error already reported on this connection, returned again without logging */
  int quiet_close;     /* 1: a close by the peer is not logged (tp_net_quiet_close) */
  int peer_closed;     /* 1: the peer closed the connection (seen by a read) */
  char what[64];       /* "net connection from rank A to rank B", for messages */
} net_conn_t;

static double setup_deadline(void) {
  int64_t t = param_int(P_BRAID_TIMEOUT_S);
  return time_now() + (double)(t > 0 ? t : SETUP_TIMEOUT_DEFAULT_S);
}

ncclResult_t tp_net_ctx_create(const tp_config_t *config, tp_net_ctx_t **net_p) {
  ncclResult_t res;
  char ifname[64], addr[SOCK_ADDR_STRLEN];
  tp_net_ctx_t *n = calloc(1, sizeof *n);
  if (n == NULL) return log_err(ncclSystemError, "net transport on rank %d: out of memory", config->rank);
  n->config = config;
  n->listen_fd = -1;
  CHECK_GOTO(sock_find_interface(&n->addr, ifname, sizeof ifname), res, err_free_net);
  CHECK_GOTO(sock_listen(&n->addr, &n->listen_fd), res, err_free_net);
  INFO(LOG_NET | LOG_INIT, "net transport on rank %d listens on %s (%s)", config->rank,
       sock_addr_str(&n->addr, addr), ifname);
  *net_p = n;
  return ncclSuccess;

err_free_net:
  free(n);
  return res;
}

void tp_net_ctx_destroy(tp_net_ctx_t *n) {
  if (n == NULL) return;
  for (int i = 0; i < n->npending; i++) {
    WARN("net transport on rank %d: rank %d connected (tag %u) but was never accepted", n->config->rank,
         (int)n->pending[i].sender, (unsigned)n->pending[i].tag);
    sock_close(n->pending[i].fd);
  }
  free(n->pending);
  sock_close(n->listen_fd);
  free(n);
}

static ncclResult_t new_conn(tp_ctx_t *ctx, int peer, int is_send, net_conn_t **conn_p) {
  const tp_config_t *cfg = tp_ctx_config(ctx);
  tp_conn_t base;
  CHECK(tp_conn_init(ctx, &tp_net_ops, peer, is_send, &base));
  char what[64];
  snprintf(what, sizeof what, "the TCP staging ring with rank %d", peer);
  CHECK(mem_fault(what, cfg->ring_bytes, 0));
  net_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL) return log_err(ncclSystemError, "net connection with rank %d: out of memory", peer);
  c->ring_bytes = cfg->ring_bytes;
  c->ring = malloc(c->ring_bytes);
  if (c->ring == NULL) {
    free(c);
    return log_err(ncclSystemError, "net connection with rank %d: out of memory for a ring of %zu bytes",
                   peer, cfg->ring_bytes);
  }
  c->base = base;
  tp_charge(&c->base, c->ring_bytes, "net staging ring");
  c->net = tp_ctx_net(ctx);
  c->fd = -1;
  snprintf(c->what, sizeof c->what, "net connection from rank %d to rank %d", is_send ? cfg->rank : peer,
           is_send ? peer : cfg->rank);
  *conn_p = c;
  return ncclSuccess;
}

static void free_conn(net_conn_t *c) {
  tp_uncharge(&c->base);
  sock_close(c->fd);
  free(c->ring);
  free(c);
}

/* Makes a set-up connection non-blocking and latency-friendly. */
static ncclResult_t tune_socket(net_conn_t *c) {
  int one = 1;
  int flags = fcntl(c->fd, F_GETFL);
  if (flags < 0 || fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return log_err(ncclSystemError, "%s: setting O_NONBLOCK failed: %s", c->what, strerror(errno));
  if (setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    return log_err(ncclSystemError, "%s: setting TCP_NODELAY failed: %s", c->what, strerror(errno));
  return ncclSuccess;
}

static ncclResult_t net_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p) {
  net_conn_t *c;
  CHECK(new_conn(ctx, peer, 0, &c));
  c->tag = c->net->next_tag++;
  tp_net_blob_t b;
  memset(&b, 0, sizeof b);
  b.addr = c->net->addr;
  b.nonce = c->net->config->nonce;
  b.receiver_rank = c->net->config->rank;
  b.tag = c->tag;
  memset(blob, 0, TP_BLOB_BYTES);
  memcpy(blob, &b, sizeof b);
  *conn_p = &c->base;
  return ncclSuccess;
}

static ncclResult_t net_connect(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  char addr[SOCK_ADDR_STRLEN];
  tp_net_blob_t b;
  memcpy(&b, blob, sizeof b);
  const tp_config_t *cfg = tp_ctx_config(ctx);
  if (b.receiver_rank != peer || b.nonce != cfg->nonce)
    return log_err(ncclInternalError,
                   "net connection to rank %d: the blob comes from rank %d, nonce %llx (ours %llx)", peer,
                   (int)b.receiver_rank, (unsigned long long)b.nonce, (unsigned long long)cfg->nonce);
  net_conn_t *c;
  CHECK(new_conn(ctx, peer, 1, &c));
  double deadline = setup_deadline();
  CHECK_GOTO(sock_connect(&b.addr, cfg->abort_flag, deadline, &c->fd), res, err_free_conn);
  tp_net_hello_t h = {.magic = NET_HELLO_MAGIC,
                      .nonce = cfg->nonce,
                      .sender_rank = cfg->rank,
                      .receiver_rank = peer,
                      .tag = b.tag};
  CHECK_GOTO(sock_send_all(c->fd, &h, sizeof h, cfg->abort_flag, deadline, c->what), res, err_free_conn);
  CHECK_GOTO(tune_socket(c), res, err_free_conn);
  INFO(LOG_NET, "%s: connected to %s (tag %u)", c->what, sock_addr_str(&b.addr, addr), (unsigned)b.tag);
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free_conn(c);
  return res;
}

/* Keeps an accepted connection for the accept of the listen its hello names. */
static ncclResult_t stash(tp_net_ctx_t *n, int fd, const tp_net_hello_t *h) {
  if (n->npending == n->cap) {
    int cap = n->cap > 0 ? 2 * n->cap : 8;
    pending_t *p = realloc(n->pending, sizeof *p * (size_t)cap);
    if (p == NULL) {
      sock_close(fd);
      return log_err(ncclSystemError, "net transport on rank %d: out of memory for %d pending connections",
                     n->config->rank, cap);
    }
    n->pending = p;
    n->cap = cap;
  }
  n->pending[n->npending++] = (pending_t){.fd = fd, .tag = h->tag, .sender = h->sender_rank};
  return ncclSuccess;
}

/* Removes and returns the pending connection carrying `tag` (and its sender), or -1 when there is none. */
static int take_pending(tp_net_ctx_t *n, uint32_t tag, int32_t *sender_p) {
  for (int i = 0; i < n->npending; i++) {
    if (n->pending[i].tag != tag) continue;
    int fd = n->pending[i].fd;
    *sender_p = n->pending[i].sender;
    n->pending[i] = n->pending[--n->npending];
    return fd;
  }
  return -1;
}

/* Whether a hello belongs to a listen of this context; says why not at WARN. */
static int hello_valid(const tp_net_ctx_t *n, const tp_net_hello_t *h) {
  const tp_config_t *cfg = n->config;
  if (h->magic == NET_HELLO_MAGIC && h->nonce == cfg->nonce && h->receiver_rank == cfg->rank &&
      h->sender_rank >= 0 && h->sender_rank < cfg->nranks && h->tag < n->next_tag)
    return 1;
  WARN("net transport on rank %d: dropped a connection with a foreign hello (magic %llx, nonce %llx, ours "
       "%llx, "
       "from rank %d to rank %d, tag %u)",
       cfg->rank, (unsigned long long)h->magic, (unsigned long long)h->nonce, (unsigned long long)cfg->nonce,
       (int)h->sender_rank, (int)h->receiver_rank, (unsigned)h->tag);
  return 0;
}

/* Takes at most one connection off the listening socket (waiting up to 100 ms for one) and stashes it when
 * its hello is valid. A connection that breaks or lies during the hello is dropped, not fatal. */
static ncclResult_t accept_one(tp_net_ctx_t *n, double deadline) {
  const volatile int *abort_flag = n->config->abort_flag;
  struct pollfd p = {.fd = n->listen_fd, .events = POLLIN};
  int r;
  SYS_RETRY(r, poll(&p, 1, 100));
  if (r < 0)
    return log_err(ncclSystemError, "net transport on rank %d: poll on the listening socket failed: %s",
                   n->config->rank, strerror(errno));
  if (r == 0) return ncclSuccess;
  int fd;
  CHECK(sock_accept(n->listen_fd, abort_flag, deadline, &fd));
  tp_net_hello_t h;
  double hello_deadline = time_now() + HELLO_TIMEOUT_S;
  if (hello_deadline > deadline) hello_deadline = deadline;
  ncclResult_t res = sock_recv_all(fd, &h, sizeof h, abort_flag, hello_deadline, "net transport hello");
  if (res != ncclSuccess || !hello_valid(n, &h)) {
    sock_close(fd);
    return abort_flag != NULL && *abort_flag ? res : ncclSuccess;
  }
  return stash(n, fd, &h);
}

static ncclResult_t net_accept(tp_ctx_t *ctx, tp_conn_t *conn) {
  net_conn_t *c = (net_conn_t *)conn;
  tp_net_ctx_t *n = c->net;
  const volatile int *abort_flag = n->config->abort_flag;
  double start = time_now(), deadline = setup_deadline();
  int32_t sender = -1;
  while ((c->fd = take_pending(n, c->tag, &sender)) < 0) {
    if (abort_flag != NULL && *abort_flag)
      return log_err(ncclSystemError, "%s: accept aborted after %.1f s", c->what, time_now() - start);
    if (time_now() > deadline)
      return log_err(ncclRemoteError, "%s: rank %d did not connect within %.0f s", c->what, conn->peer,
                     deadline - start);
    CHECK(accept_one(n, deadline));
  }
  if (sender != conn->peer) {
    sock_close(c->fd);
    c->fd = -1;
    return log_err(ncclInternalError, "%s: the connection for tag %u came from rank %d", c->what,
                   (unsigned)c->tag, (int)sender);
  }
  CHECK(tune_socket(c));
  INFO(LOG_NET, "%s: accepted (tag %u)", c->what, (unsigned)c->tag);
  return ncclSuccess;
}

/* Sender: hands the socket as many committed bytes as it takes. */
static ncclResult_t push(net_conn_t *c) {
  while (c->head != c->tail) {
    size_t off = (size_t)(c->head % c->ring_bytes);
    size_t n = (size_t)(c->tail - c->head);
    if (n > c->ring_bytes - off) n = c->ring_bytes - off;
    size_t moved = 0;
    ncclResult_t res = sock_send_some(c->fd, c->ring + off, n, &moved, c->what);
    if (res != ncclSuccess) return c->broken = res;
    c->head += moved;
    if (moved < n) break;
  }
  return ncclSuccess;
}

/* Reads up to n bytes without waiting. A close by the peer is ncclRemoteError; it is logged unless the
 * connection is in quiet-close mode, whose owner judges it (tp_net_peer_closed). */
static ncclResult_t read_some(net_conn_t *c, void *buf, size_t n, size_t *moved_p) {
  if (!c->quiet_close) return sock_recv_some(c->fd, buf, n, moved_p, c->what);
  ssize_t r;
  SYS_RETRY(r, recv(c->fd, buf, n, MSG_DONTWAIT));
  if (r == 0 && n > 0) {
    c->peer_closed = 1;
    return ncclRemoteError;
  }
  if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
    return log_err(errno == ECONNRESET ? ncclRemoteError : ncclSystemError, "%s: receive failed: %s", c->what,
                   strerror(errno));
  *moved_p = r > 0 ? (size_t)r : 0;
  return ncclSuccess;
}

void tp_net_quiet_close(tp_conn_t *conn) {
  ((net_conn_t *)conn)->quiet_close = 1;
}

int tp_net_peer_closed(const tp_conn_t *conn) {
  return ((const net_conn_t *)conn)->peer_closed;
}

/* Sender: at most every LIVENESS_PERIOD_S, reads the socket to see whether the receiver closed or failed it
 * (a receiver never sends, so any byte is an error too). Writes alone would not tell: after the receiver's
 * shutdown the kernel may go on taking bytes. */
static ncclResult_t check_receiver(net_conn_t *c) {
  double now = time_now();
  if (now < c->next_check) return ncclSuccess;
  c->next_check = now + LIVENESS_PERIOD_S;
  unsigned char byte;
  size_t moved = 0;
  ncclResult_t res = read_some(c, &byte, 1, &moved);
  if (res != ncclSuccess) return c->broken = res;
  if (moved != 0) return c->broken = log_err(ncclRemoteError, "%s: the receiver sent data", c->what);
  return ncclSuccess;
}

static ncclResult_t net_send_peek(tp_conn_t *conn, void **ptr_p, size_t *bytes_p) {
  net_conn_t *c = (net_conn_t *)conn;
  if (c->broken != ncclSuccess) return c->broken;
  if (c->head == c->tail) c->head = c->tail = 0; /* empty: start over at the ring's start, all contiguous */
  if (c->tail != c->head) CHECK(push(c));        /* keep the socket busy */
  CHECK(check_receiver(c));
  size_t off = (size_t)(c->tail % c->ring_bytes);
  size_t room = c->ring_bytes - (size_t)(c->tail - c->head);
  if (room > c->ring_bytes - off) room = c->ring_bytes - off;
  c->peeked = room;
  *ptr_p = c->ring + off;
  *bytes_p = room;
  return ncclSuccess;
}

static ncclResult_t net_send_commit(tp_conn_t *conn, size_t bytes) {
  net_conn_t *c = (net_conn_t *)conn;
  if (c->broken != ncclSuccess) return c->broken;
  if (bytes > c->peeked)
    return log_err(ncclInternalError, "%s: commit of %zu bytes, only %zu were peeked", c->what, bytes,
                   c->peeked);
  c->peeked -= bytes;
  c->tail += bytes;
  return push(c);
}

static ncclResult_t net_flush(tp_conn_t *conn, int *done_p) {
  net_conn_t *c = (net_conn_t *)conn;
  if (c->broken != ncclSuccess) return c->broken;
  CHECK(push(c));
  *done_p = c->head == c->tail;
  /* Only while bytes wait to go out: a receiver that took everything may already have closed. */
  if (!*done_p) CHECK(check_receiver(c));
  return ncclSuccess;
}

/* Receiver: the ring is a linear buffer, [head, tail) read but not yet released. A short remainder (a part
 * of an element the caller cannot use yet) moves to the start so that the socket can append after it: a
 * caller that waits for whole elements always gets more. A closed socket is an error only once the bytes
 * that arrived before it are used up. */
static ncclResult_t net_recv_peek(tp_conn_t *conn, void **ptr_p, size_t *bytes_p) {
  net_conn_t *c = (net_conn_t *)conn;
  size_t have = (size_t)(c->tail - c->head);
  if (c->head > 0 && (have < COMPACT_BYTES || c->tail == c->ring_bytes)) {
    memmove(c->ring, c->ring + c->head, have);
    c->head = 0;
    c->tail = have;
  }
  /* Read only when what is left is not enough for a caller that consumes all it can: so a peer that closed
   * after sending everything this rank needs is never noticed, let alone reported. */
  if (have < COMPACT_BYTES && c->tail < c->ring_bytes && c->broken == ncclSuccess) {
    size_t moved = 0;
    ncclResult_t res = read_some(c, c->ring + c->tail, c->ring_bytes - (size_t)c->tail, &moved);
    if (res != ncclSuccess) c->broken = res;
    c->tail += moved;
  }
  if (c->tail == c->head && c->broken != ncclSuccess) return c->broken;
  c->peeked = (size_t)(c->tail - c->head);
  *ptr_p = c->ring + c->head;
  *bytes_p = c->peeked;
  return ncclSuccess;
}

static ncclResult_t net_recv_release(tp_conn_t *conn, size_t bytes) {
  net_conn_t *c = (net_conn_t *)conn;
  if (bytes > c->peeked)
    return log_err(ncclInternalError, "%s: release of %zu bytes, only %zu were peeked", c->what, bytes,
                   c->peeked);
  c->peeked -= bytes;
  c->head += bytes;
  return ncclSuccess;
}

/* Shuts both directions down: the peer's next read sees end-of-file, its next write an error. */
static void net_fail(tp_conn_t *conn) {
  net_conn_t *c = (net_conn_t *)conn;
  if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
}

static void net_close(tp_conn_t *conn) {
  if (conn != NULL) free_conn((net_conn_t *)conn);
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
};
