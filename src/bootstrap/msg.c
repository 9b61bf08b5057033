/*
 * Tagged messages and the progress engine of one rank's bootstrap (see bootstrap.h, bootstrap_int.h).
 *
 * One outgoing connection per peer, opened on first use; incoming connections pass the listener's gate and
 * are then read by the progress engine, which queues every complete message in memory until boot_recv asks
 * for it, so a send never waits for the receiver to call recv. The engine also watches the ring successor's
 * connection, on which nothing travels towards us but a notice that the bootstrap failed (wire.h): it is
 * recorded, passed on to our predecessor, and ends every wait with the reason.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "bootstrap_int.h"

/* Seconds after a peer closed during which its last messages may still be accepted and read. */
#define CLOSE_GRACE_S 0.2
/* Seconds a rank that saw a neighbour leave waits for a notice naming another rank as the cause. */
#define BLAME_GRACE_S 0.5

void fair_lock(fair_lock_t *l) {
  pthread_mutex_lock(&l->mu);
  uint64_t ticket = l->next++;
  while (l->serving != ticket) pthread_cond_wait(&l->turn, &l->mu);
  pthread_mutex_unlock(&l->mu);
}

void fair_unlock(fair_lock_t *l) {
  pthread_mutex_lock(&l->mu);
  l->serving++;
  pthread_cond_broadcast(&l->turn);
  pthread_mutex_unlock(&l->mu);
}

static int aborted(const volatile int *abort_flag) {
  /* Relaxed: the flag publishes no data; the poll slice bounds how late it is seen. */
  return abort_flag != NULL && __atomic_load_n(abort_flag, __ATOMIC_RELAXED) != 0;
}

ncclResult_t boot_slice(boot_t *b, double deadline, const char *doing, int *slice_p) {
  if (aborted(b->abort_flag))
    return log_err(ncclInternalError, "bootstrap: rank %d %s: aborted", b->rank, doing ? doing : "failing");
  if (doing == NULL)
    doing = "passing on why it failed"; /* a failed init's last rounds (notify_failure) */
  else if (b->failed[0] != '\0')
    return log_err(ncclRemoteError, "bootstrap: rank %d %s: %s", b->rank, doing, b->failed);
  int slice = b->poll_now ? 0 : SLICE_MS;
  if (deadline > 0) {
    double left = deadline - time_now();
    if (left <= 0)
      return log_err(ncclSystemError,
                     "bootstrap: rank %d timed out %s (BRAID_TIMEOUT_S=%lld, during init "
                     "BRAID_BOOTSTRAP_TIMEOUT_S=%lld)",
                     b->rank, doing, (long long)param_int(P_BRAID_TIMEOUT_S),
                     (long long)param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S));
    if (left * 1000 < slice) slice = (int)(left * 1000) + 1;
  }
  *slice_p = slice;
  return ncclSuccess;
}

/* ---- Notices against the ring ---- */

/* Sends the pending notice to the ring predecessor once it is connected. */
static void flush_notice(boot_t *b) {
  if (b->notice_out != 1 || b->ring_recv_fd < 0) return;
  b->notice_out = 2;
  char keep[LOG_ERROR_MAX]; /* the notice is not this thread's error */
  snprintf(keep, sizeof keep, "%s", log_last_error());
  if (sock_send_all(b->ring_recv_fd, &b->pending, sizeof b->pending, NULL, time_now() + 1,
                    "bootstrap: notice to the ring predecessor") != ncclSuccess)
    INFO(LOG_BOOTSTRAP, "bootstrap: rank %d could not pass a notice on: %s", b->rank, log_last_error());
  log_set_last_error("%s", keep);
}

/* Sends a notice against the ring (at most one per rank: it also stops a notice that went round). */
static int post_locked(boot_t *b, int peer, uint32_t tag, const void *data, size_t size, double deadline);

/* Sends a notice against the ring (at most one per rank: it also stops a notice that went round). The rank
 * that saw the departure also tells every rank directly once it knows their addresses (for at most 2 s): a
 * neighbour that leaves because of it then cannot be blamed instead, however slowly the ring passes it on. */
static void send_notice(boot_t *b, int culprit, int reporter, const char *why) {
  if (b->notice_out != 0 || b->nranks == 1) return;
  b->pending = (notice_t){
      .magic = BOOT_MAGIC, .nonce = b->nonce, .type = MSG_NOTICE, .culprit = culprit, .reporter = reporter};
  snprintf(b->pending.why, sizeof b->pending.why, "%s", why);
  b->notice_out = 1;
  flush_notice(b);
  if (reporter != b->rank || !b->addrs_known) return;
  char keep[LOG_ERROR_MAX];
  snprintf(keep, sizeof keep, "%s", log_last_error());
  double deadline = time_now() + 2;
  for (int r = 0; r < b->nranks && time_now() < deadline; r++)
    if (r != b->rank && r != culprit)
      (void)post_locked(b, r, BOOT_TAG_NOTICE, &b->pending, sizeof b->pending, deadline);
  log_set_last_error("%s", keep);
}

/* Records that rank `culprit` is gone or failed, as `reporter` saw it, and passes the notice on against the
 * ring unless it came back to the culprit. */
static void note_failure(boot_t *b, int culprit, int reporter, const char *why) {
  if (b->failed[0] == '\0') {
    b->culprit = culprit;
    if (reporter == b->rank)
      snprintf(b->failed, sizeof b->failed, "%s", why);
    else
      snprintf(b->failed, sizeof b->failed, "%s (reported by rank %d)", why, reporter);
  }
  if (culprit != b->rank) send_notice(b, culprit, reporter, why);
}

void boot_notify_failure(boot_t *b, const char *why) {
  send_notice(b, b->rank, b->rank, why);
}

ncclResult_t boot_gone(boot_t *b, int culprit, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  note_failure(b, culprit, b->rank, why);
  return log_err(ncclRemoteError, "bootstrap: rank %d: %s", b->rank, why);
}

ncclResult_t boot_blame(boot_t *b, int suspect, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  /* a neighbour that left because another rank is gone sent the ring a notice first: wait for it a little */
  double until = time_now() + BLAME_GRACE_S;
  while (b->failed[0] == '\0' && time_now() < until)
    if (boot_progress(b, NULL, 0, until, "waiting for a notice") != ncclSuccess) break;
  if (b->failed[0] != '\0') return log_err(ncclRemoteError, "bootstrap: rank %d: %s", b->rank, b->failed);
  return boot_gone(b, suspect, "%s", why);
}

/* Reads what the successor sent against the ring: a notice, or nothing but its closing. */
static void read_successor(boot_t *b) {
  for (;;) {
    size_t want = sizeof b->notice - b->notice_got;
    ssize_t n = recv(b->ring_send_fd, (char *)&b->notice + b->notice_got, want, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      if (b->succ_closed == 0) b->succ_closed = time_now();
      return;
    }
    b->notice_got += (size_t)n;
    if (b->notice_got < sizeof b->notice) continue;
    b->notice_got = 0;
    notice_t *m = &b->notice;
    if (m->magic != BOOT_MAGIC || m->nonce != b->nonce || m->type != MSG_NOTICE || m->culprit < 0 ||
        m->culprit >= b->nranks || m->reporter < 0 || m->reporter >= b->nranks) {
      b->succ_closed = time_now(); /* the stream is not ours any more: treat it as closed */
      return;
    }
    m->why[sizeof m->why - 1] = '\0';
    note_failure(b, m->culprit, m->reporter, m->why);
  }
}

/* ---- Incoming connections ---- */

/* A connection whose hello is complete: the ring predecessor's, or a peer's tagged connection. Connections
 * that do not belong to this communicator are dropped with a warning. */
static void file_connection(void *arg, int fd, const void *hello) {
  boot_t *b = arg;
  conn_hello_t h;
  memcpy(&h, hello, sizeof h);
  int pred = (b->rank + b->nranks - 1) % b->nranks;
  if (h.magic != BOOT_MAGIC || h.nonce != b->nonce || h.rank < 0 || h.rank >= b->nranks ||
      (h.type == MSG_RING && (h.rank != pred || b->ring_recv_fd >= 0)) ||
      (h.type != MSG_RING && h.type != MSG_P2P)) {
    if (b->gate.dropped++ == 0)
      WARN("bootstrap: rank %d dropped a connection with a wrong magic, nonce, rank or type (another job?)",
           b->rank);
    sock_close(fd);
    return;
  }
  if (h.type == MSG_RING) {
    b->ring_recv_fd = fd;
    flush_notice(b);
    return;
  }
  /* A peer opens one tagged connection; a second one replaces the first, and any partial message with it. */
  sock_close(b->recv_fds[h.rank]);
  free(b->rx[h.rank].msg);
  b->rx[h.rank] = (rx_t){0};
  b->recv_fds[h.rank] = fd;
}

/* ---- Reading messages ---- */

static msg_t *dequeue(boot_t *b, int peer, uint32_t tag);

static void enqueue(boot_t *b, msg_t *m) {
  if (m->tag == BOOT_TAG_STATUS) free(dequeue(b, m->peer, m->tag)); /* only the latest status is kept */
  m->next = NULL;
  *b->queue_tail = m;
  b->queue_tail = &m->next;
}

/* Unlinks and returns the oldest queued message from `peer` with `tag`, or NULL. */
static msg_t *dequeue(boot_t *b, int peer, uint32_t tag) {
  for (msg_t **link = &b->queue; *link != NULL; link = &(*link)->next) {
    msg_t *m = *link;
    if (m->peer != peer || m->tag != tag) continue;
    *link = m->next;
    if (b->queue_tail == &m->next) b->queue_tail = link;
    return m;
  }
  return NULL;
}

static void mark_closed(boot_t *b, int peer) {
  if (b->closed_at[peer] == 0) b->closed_at[peer] = time_now();
}

/* Drops `peer`'s incoming connection after it closed. Between messages that is orderly (the peer finished or
 * died; the caller decides whether that is an error); inside a message the message is lost. */
static ncclResult_t rx_closed(boot_t *b, int peer, int err) {
  rx_t *rx = &b->rx[peer];
  int partial = rx->hdr_got > 0;
  sock_close(b->recv_fds[peer]);
  b->recv_fds[peer] = -1;
  mark_closed(b, peer);
  free(rx->msg);
  *rx = (rx_t){0};
  if (!partial) return ncclSuccess;
  return boot_blame(b, peer, "connection from rank %d closed in the middle of a message%s%s", peer,
                    err ? ": " : "", err ? strerror(err) : "");
}

/* Starts the message whose header just arrived. */
static ncclResult_t rx_start(boot_t *b, int peer) {
  rx_t *rx = &b->rx[peer];
  if (rx->hdr.size > MAX_MSG_BYTES)
    return log_err(ncclInternalError,
                   "bootstrap: rank %d sent a message of %llu bytes (tag %u) to rank %d; the limit is %llu",
                   peer, (unsigned long long)rx->hdr.size, rx->hdr.tag, b->rank,
                   (unsigned long long)MAX_MSG_BYTES);
  rx->msg = malloc(sizeof *rx->msg + rx->hdr.size);
  if (rx->msg == NULL)
    return log_err(ncclSystemError, "bootstrap: out of memory for a %llu-byte message from rank %d",
                   (unsigned long long)rx->hdr.size, peer);
  rx->msg->peer = peer;
  rx->msg->tag = rx->hdr.tag;
  rx->msg->size = rx->hdr.size;
  rx->got = 0;
  return ncclSuccess;
}

/* A notice that came as a tagged message (send_notice): recorded, then freed. */
static void take_notice(boot_t *b, msg_t *m) {
  notice_t n;
  if (m->size == sizeof n) memcpy(&n, m->data, sizeof n);
  if (m->size == sizeof n && n.magic == BOOT_MAGIC && n.nonce == b->nonce && n.type == MSG_NOTICE &&
      n.culprit >= 0 && n.culprit < b->nranks && n.reporter >= 0 && n.reporter < b->nranks) {
    n.why[sizeof n.why - 1] = '\0';
    note_failure(b, n.culprit, n.reporter, n.why);
  }
  free(m);
}

/* Reads what `peer`'s connection holds now, without waiting, and queues each message once complete. Never
 * blocking here matters: two ranks that send large messages to each other both read while they send. */
static ncclResult_t read_messages(boot_t *b, int peer) {
  rx_t *rx = &b->rx[peer];
  for (;;) {
    int in_header = rx->hdr_got < sizeof rx->hdr;
    char *dst = in_header ? (char *)&rx->hdr + rx->hdr_got : rx->msg->data + rx->got;
    size_t want = in_header ? sizeof rx->hdr - rx->hdr_got : rx->msg->size - rx->got;
    ssize_t n = want == 0 ? 0 : recv(b->recv_fds[peer], dst, want, MSG_DONTWAIT);
    if (want > 0 && n == 0) return rx_closed(b, peer, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
    if (n < 0) return rx_closed(b, peer, errno);
    if (in_header) {
      rx->hdr_got += (size_t)n;
      if (rx->hdr_got == sizeof rx->hdr) CHECK(rx_start(b, peer));
      continue;
    }
    rx->got += (size_t)n;
    if (rx->got < rx->msg->size) continue;
    TRACE(LOG_BOOTSTRAP, "bootstrap: rank %d queued %zu bytes from rank %d, tag %u", b->rank, rx->msg->size,
          peer, rx->msg->tag);
    msg_t *m = rx->msg;
    *rx = (rx_t){0};
    if (m->tag == BOOT_TAG_NOTICE) { /* a notice sent directly, not a message for boot_recv */
      take_notice(b, m);
      continue;
    }
    enqueue(b, m);
  }
}

/* ---- The progress engine ---- */

/* Fills the poll entries after the caller's: listener, gate, successor, incoming and outgoing connections. */
static int fill_pfds(boot_t *b, struct pollfd *pfds, int *ngate_p) {
  int n = b->nranks, k = 0;
  pfds[k++] = (struct pollfd){.fd = b->listen_fd, .events = POLLIN};
  pfds[k++] = (struct pollfd){.fd = b->succ_closed == 0 ? b->ring_send_fd : -1, .events = POLLIN};
  for (int p = 0; p < n; p++) {
    pfds[k + p] = (struct pollfd){.fd = b->recv_fds[p], .events = POLLIN};
    int watch = b->send_fds[p] >= 0 && b->closed_at[p] == 0;
    pfds[k + n + p] = (struct pollfd){.fd = watch ? b->send_fds[p] : -1, .events = POLLIN};
  }
  *ngate_p = gate_poll_fds(&b->gate, pfds + k + 2 * n);
  return k + 2 * n + *ngate_p;
}

ncclResult_t boot_progress(boot_t *b, struct pollfd *extra, int nextra, double deadline, const char *doing) {
  int slice = SLICE_MS, n = b->nranks;
  CHECK(boot_slice(b, deadline, doing, &slice));
  int need = nextra + 2 + 2 * n + b->gate.n;
  if (need > b->pfds_cap) {
    struct pollfd *p = realloc(b->pfds, (size_t)need * sizeof *p);
    if (p == NULL) return log_err(ncclSystemError, "bootstrap: out of memory for %d poll entries", need);
    b->pfds = p;
    b->pfds_cap = need;
  }
  struct pollfd *pfds = b->pfds;
  for (int i = 0; i < nextra; i++) pfds[i] = extra[i];
  int ngate;
  int total = nextra + fill_pfds(b, pfds + nextra, &ngate);
  int ready = poll(pfds, (nfds_t)total, slice);
  if (ready < 0 && errno != EINTR)
    return log_err(ncclSystemError, "bootstrap: rank %d: poll %s failed: %s", b->rank, doing,
                   strerror(errno));
  for (int i = 0; i < nextra; i++) extra[i].revents = pfds[i].revents;
  if (ready <= 0) return ncclSuccess;
  struct pollfd *own = pfds + nextra;
  if (own[1].revents != 0) read_successor(b);
  for (int p = 0; p < n; p++) {
    if (own[2 + n + p].revents != 0) mark_closed(b, p);
    if (own[2 + p].revents != 0) CHECK(read_messages(b, p));
  }
  gate_serve(&b->gate, own + 2 + 2 * n, ngate, time_now(), file_connection, b);
  if (own[0].revents != 0) CHECK(gate_accept(&b->gate, b->listen_fd));
  return ncclSuccess;
}

/* ---- Sending ---- */

ncclResult_t boot_connect_peer(boot_t *b, int peer, uint32_t type, const sock_addr_t *addr, double deadline,
                               int *fd_p) {
  conn_hello_t h = {.magic = BOOT_MAGIC, .nonce = b->nonce, .type = type, .rank = b->rank};
  char what[96];
  int fd;
  snprintf(what, sizeof what, "bootstrap: hello from rank %d to rank %d", b->rank, peer);
  /* the peer listened before anyone learnt its address: a refused connection means it is gone */
  ncclResult_t res = sock_connect_once(addr, b->abort_flag, deadline, &fd);
  if (res == ncclRemoteError)
    return boot_gone(b, peer, "rank %d is gone: nothing listens at its address any more", peer);
  CHECK(res);
  res = sock_send_all(fd, &h, sizeof h, b->abort_flag, deadline, what);
  if (res != ncclSuccess) {
    sock_close(fd);
    if (res == ncclInternalError) return res; /* aborted */
    char why[LOG_ERROR_MAX];
    snprintf(why, sizeof why, "%s", log_last_error());
    return boot_gone(b, peer, "rank %d is gone: its listener dropped the connection (%s)", peer, why);
  }
  *fd_p = fd;
  return ncclSuccess;
}

/* Opens the tagged connection to `peer` if there is none yet. */
static ncclResult_t ensure_send_conn(boot_t *b, int peer, double deadline) {
  if (b->send_fds[peer] >= 0) return ncclSuccess;
  if (b->closed_at[peer] != 0)
    return boot_blame(b, peer, "cannot reach rank %d: its connection closed (it exited or failed)", peer);
  return boot_connect_peer(b, peer, MSG_P2P, &b->addrs[peer], deadline, &b->send_fds[peer]);
}

/* Sends n bytes to `peer`, serving incoming traffic whenever the socket is full. */
static ncclResult_t send_bytes(boot_t *b, int peer, const char *buf, size_t n, double deadline,
                               const char *what) {
  size_t done = 0;
  while (done < n) {
    if (b->closed_at[peer] != 0)
      return boot_blame(b, peer, "%s: rank %d closed its connection after %zu of %zu bytes", what, peer, done,
                        n);
    size_t moved;
    CHECK(sock_send_some(b->send_fds[peer], buf + done, n - done, &moved, what));
    done += moved;
    if (moved > 0) continue;
    struct pollfd out = {.fd = b->send_fds[peer], .events = POLLOUT};
    CHECK(boot_progress(b, &out, 1, deadline, what));
  }
  return ncclSuccess;
}

static ncclResult_t send_locked(boot_t *b, int peer, uint32_t tag, const void *data, size_t size) {
  if (peer == b->rank) {
    msg_t *m = malloc(sizeof *m + size);
    if (m == NULL) return log_err(ncclSystemError, "bootstrap: out of memory for a %zu-byte self-send", size);
    m->peer = peer;
    m->tag = tag;
    m->size = size;
    if (size > 0) memcpy(m->data, data, size);
    enqueue(b, m);
    return ncclSuccess;
  }
  double deadline = wd_deadline(param_int(P_BRAID_TIMEOUT_S));
  char what[96];
  snprintf(what, sizeof what, "bootstrap: rank %d sending %zu bytes to rank %d (tag %u)", b->rank, size, peer,
           tag);
  CHECK(ensure_send_conn(b, peer, deadline));
  msg_header_t h = {.tag = tag, .size = size};
  CHECK(send_bytes(b, peer, (const char *)&h, sizeof h, deadline, what));
  return send_bytes(b, peer, data, size, deadline, what);
}

ncclResult_t boot_send(boot_t *boot, int peer, uint32_t tag, const void *data, size_t size) {
  if (peer < 0 || peer >= boot->nranks)
    return log_err(ncclInvalidArgument, "bootstrap: send to rank %d of %d", peer, boot->nranks);
  TRACE(LOG_BOOTSTRAP, "bootstrap: rank %d sends %zu bytes to rank %d, tag %u", boot->rank, size, peer, tag);
  fair_lock(&boot->lock);
  ncclResult_t res = send_locked(boot, peer, tag, data, size);
  fair_unlock(&boot->lock);
  return res;
}

/* ---- Receiving ---- */

/* Hands a queued message to the caller if it is there: *done_p says whether it was. */
static ncclResult_t take_message(boot_t *b, int peer, uint32_t tag, void *data, size_t size, int *done_p) {
  msg_t *m = dequeue(b, peer, tag);
  *done_p = m != NULL;
  if (m == NULL) return ncclSuccess;
  ncclResult_t res = ncclSuccess;
  if (m->size != size)
    res = log_err(ncclInternalError,
                  "bootstrap: rank %d expected %zu bytes from rank %d with tag %u but %zu came", b->rank,
                  size, peer, tag, m->size);
  else if (size > 0)
    memcpy(data, m->data, size);
  free(m);
  return res;
}

/* Says what a bootstrap wait is for (wd_describe_fn_t). */
static void describe(void *arg, char *buf, size_t len) {
  snprintf(buf, len, "the bootstrap %s", (const char *)arg);
}

ncclResult_t boot_recv(boot_t *boot, int peer, uint32_t tag, void *data, size_t size) {
  if (peer < 0 || peer >= boot->nranks)
    return log_err(ncclInvalidArgument, "bootstrap: receive from rank %d of %d", peer, boot->nranks);
  double deadline = wd_deadline(param_int(P_BRAID_TIMEOUT_S));
  char what[96];
  snprintf(what, sizeof what, "waiting for %zu bytes from rank %d (tag %u)", size, peer, tag);
  ncclResult_t res = ncclSuccess;
  wd_timer_t t;
  wd_begin(&t, boot->wd, &(wd_wait_t){.kind = WD_BOOT, .peer = peer, .channel = -1, .op = "bootstrap"},
           describe, what);
  t.ask = 0; /* the other ranks are asked through this very bootstrap */
  fair_lock(&boot->lock);
  /* An outgoing connection to the peer lets us see it close (exit or crash) while we wait. */
  if (peer != boot->rank) CHECK_GOTO(ensure_send_conn(boot, peer, deadline), res, out_unlock);
  for (;;) {
    int done;
    CHECK_GOTO(take_message(boot, peer, tag, data, size, &done), res, out_unlock);
    if (done) break;
    double closed = boot->closed_at[peer];
    if (closed != 0 && boot->recv_fds[peer] < 0 && time_now() - closed > CLOSE_GRACE_S) {
      res = boot_blame(boot, peer, "%s: connection from rank %d closed (it exited or failed)", what, peer);
      goto out_unlock;
    }
    /* the watchdog times the wait out (naming the peer as the one behind) */
    CHECK_GOTO(boot_progress(boot, NULL, 0, 0, what), res, out_unlock);
    CHECK_GOTO(wd_check(&t, time_now()), res, out_unlock);
    /* Let other threads of this communicator send between slices of a long wait: any thread already
     * waiting for the lock gets it before this one does again. */
    fair_unlock(&boot->lock);
    fair_lock(&boot->lock);
  }
  TRACE(LOG_BOOTSTRAP, "bootstrap: rank %d received %zu bytes from rank %d, tag %u", boot->rank, size, peer,
        tag);
out_unlock:
  fair_unlock(&boot->lock);
  wd_end(&t);
  return res;
}

/* ---- Status reports ---- */

/* The tagged connection to `peer` for a post: made with a short deadline, and never to a peer that closed. */
static int post_conn(boot_t *b, int peer, double deadline) {
  if (b->send_fds[peer] >= 0) return 1;
  if (b->closed_at[peer] != 0) return 0;
  conn_hello_t h = {.magic = BOOT_MAGIC, .nonce = b->nonce, .type = MSG_P2P, .rank = b->rank};
  int fd;
  if (sock_connect_once(&b->addrs[peer], b->abort_flag, deadline, &fd) != ncclSuccess) return 0;
  if (sock_send_all(fd, &h, sizeof h, b->abort_flag, deadline, "bootstrap: a status hello") != ncclSuccess) {
    sock_close(fd);
    return 0;
  }
  b->send_fds[peer] = fd;
  return 1;
}

/* A post with the lock held: returns whether the message went. */
static int post_locked(boot_t *b, int peer, uint32_t tag, const void *data, size_t size, double deadline) {
  if (!post_conn(b, peer, deadline)) return 0;
  msg_header_t h = {.tag = tag, .size = size};
  return send_bytes(b, peer, (const char *)&h, sizeof h, deadline, "bootstrap: a status report") ==
             ncclSuccess &&
         send_bytes(b, peer, data, size, deadline, "bootstrap: a status report") == ncclSuccess;
}

ncclResult_t boot_post(boot_t *boot, int peer, uint32_t tag, const void *data, size_t size) {
  if (peer < 0 || peer >= boot->nranks || peer == boot->rank)
    return log_err(ncclInvalidArgument, "bootstrap: post to rank %d of %d", peer, boot->nranks);
  char keep[LOG_ERROR_MAX]; /* a report that cannot go is no error of the caller's */
  snprintf(keep, sizeof keep, "%s", log_last_error());
  fair_lock(&boot->lock);
  (void)post_locked(boot, peer, tag, data, size, time_now() + 1);
  fair_unlock(&boot->lock);
  log_set_last_error("%s", keep);
  return ncclSuccess;
}

ncclResult_t boot_poll_all(boot_t *boot, uint32_t tag, void *data, size_t size, int *have) {
  fair_lock(&boot->lock);
  boot->poll_now = 1;
  ncclResult_t res = ncclSuccess;
  /* a report on a new connection takes three rounds: accept, hello, message */
  for (int round = 0; round < 4 && res == ncclSuccess; round++)
    res = boot_progress(boot, NULL, 0, 0, "taking status reports");
  boot->poll_now = 0;
  for (int r = 0; r < boot->nranks; r++) {
    msg_t *m = dequeue(boot, r, tag);
    have[r] = m != NULL && m->size == size;
    if (have[r]) memcpy((char *)data + (size_t)r * size, m->data, size);
    free(m);
  }
  fair_unlock(&boot->lock);
  return res;
}

void boot_set_watchdog(boot_t *boot, wd_t *wd) {
  boot->wd = wd;
}

void boot_free_queue(boot_t *b) {
  while (b->queue != NULL) {
    msg_t *m = b->queue;
    b->queue = m->next;
    free(m);
  }
}
