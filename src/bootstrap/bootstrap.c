/*
 * The out-of-band bootstrap (see bootstrap.h): how one rank joins (boot_init) and the ring that joins them.
 *
 * A rank listens, says hello to the root of its id (root.c), learns its ring successor's address, connects
 * to it and takes its predecessor's connection; then all listening addresses go round the ring
 * (boot_allgather). Tagged messages and the progress engine every wait goes through are in msg.c.
 *
 * When a rank is gone or fails, the rank that sees it (its ring predecessor sees its connection close, or
 * finds nothing listening where it was) sends a notice against the ring, which every rank passes on: each
 * rank's wait then fails at once with the name of the rank that is gone, instead of timing out or blaming its
 * neighbour.
 */
#include "bootstrap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "bootstrap_int.h"

/* Seconds a rank waits for the root beyond BRAID_BOOTSTRAP_TIMEOUT_S, so the root's report arrives first. */
#define ROOT_REPLY_MARGIN_S 10
/* Seconds a failed init waits for its ring predecessor to connect, to hand it the notice of the failure. */
#define NOTICE_LINGER_S 5

static int block_of(int rank, int nid, int nranks) {
  return (int)((int64_t)rank * nid / nranks);
}

/* First rank of block k (nranks for k == nid): the smallest r with r * nid >= k * nranks. */
static int block_first(int k, int nid, int nranks) {
  return (int)(((int64_t)k * nranks + nid - 1) / nid);
}

/* ---- State ---- */

static ncclResult_t boot_alloc(int rank, int nranks, const volatile int *abort_flag, boot_t **boot_p) {
  boot_t *b = calloc(1, sizeof *b);
  if (b == NULL) return log_err(ncclSystemError, "out of memory for the bootstrap state");
  b->rank = rank;
  b->nranks = nranks;
  b->abort_flag = abort_flag;
  b->listen_fd = b->ring_send_fd = b->ring_recv_fd = -1;
  b->queue_tail = &b->queue;
  pthread_mutex_init(&b->lock.mu, NULL);
  pthread_cond_init(&b->lock.turn, NULL);
  gate_init(&b->gate, sizeof(conn_hello_t), "bootstrap");
  *boot_p = b; /* boot_close frees whatever was allocated, and closes descriptors only once fds_ready */
  size_t n = (size_t)nranks;
  b->addrs = calloc(n, sizeof *b->addrs);
  b->send_fds = calloc(n, sizeof *b->send_fds);
  b->recv_fds = calloc(n, sizeof *b->recv_fds);
  b->closed_at = calloc(n, sizeof *b->closed_at);
  b->rx = calloc(n, sizeof *b->rx);
  if (b->addrs == NULL || b->send_fds == NULL || b->recv_fds == NULL || b->closed_at == NULL || b->rx == NULL)
    return log_err(ncclSystemError, "out of memory for the bootstrap state of %d ranks (%zu bytes)", nranks,
                   n * (sizeof *b->addrs + 2 * sizeof(int) + sizeof(double) + sizeof(rx_t)));
  for (size_t i = 0; i < n; i++) b->send_fds[i] = b->recv_fds[i] = -1;
  b->fds_ready = 1;
  return ncclSuccess;
}

/* Listens on the interface the id's root is reachable from (NCCL_COMM_ID) or on the selected interface. */
static ncclResult_t listen_self(boot_t *b, const id_body_t *root_id) {
  sock_addr_t *addr = &b->addrs[b->rank];
  if (root_id->flags & ID_ROOT_BY_RANK0)
    CHECK(sock_find_interface_for(&root_id->root, addr));
  else
    CHECK(sock_find_interface(addr, NULL, 0));
  return sock_listen(addr, &b->listen_fd);
}

/* ---- Joining ---- */

/* One attempt to say hello to the root and read its reply. */
static ncclResult_t hello_root(boot_t *b, const sock_addr_t *root, const root_msg_t *m, double deadline,
                               const char *what, reply_t *r) {
  int fd;
  CHECK(sock_connect(root, b->abort_flag, deadline, &fd));
  ncclResult_t res = sock_send_all(fd, m, sizeof *m, b->abort_flag, deadline, what);
  if (res == ncclSuccess) res = sock_recv_all(fd, r, sizeof *r, b->abort_flag, deadline, what);
  sock_close(fd);
  return res;
}

/* Says hello to this rank's root and learns the ring successor's address; an error reply becomes ours. A
 * connection the root closed before answering (a busy gate, an id it does not serve yet) is tried again. */
static ncclResult_t join_root(boot_t *b, const ncclUniqueId *ids, int nid, sock_addr_t *succ_p) {
  int k = block_of(b->rank, nid, b->nranks), prev = (k + nid - 1) % nid;
  id_body_t mine, before;
  id_decode(&ids[k], &mine);
  id_decode(&ids[prev], &before);
  root_msg_t m = {.magic = BOOT_MAGIC,
                  .nonce = mine.nonce,
                  .type = MSG_HELLO,
                  .rank = b->rank,
                  .nranks = b->nranks,
                  .nid = nid,
                  .index = k,
                  .prev_nonce = before.nonce,
                  .addr = b->addrs[b->rank],
                  .prev_root = before.root};
  double deadline = wd_deadline(param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S) + ROOT_REPLY_MARGIN_S);
  char name[SOCK_ADDR_STRLEN], what[128];
  snprintf(what, sizeof what, "bootstrap: rank %d with the root at %s", b->rank,
           sock_addr_str(&mine.root, name));
  reply_t r;
  for (;;) {
    ncclResult_t res = hello_root(b, &mine.root, &m, deadline, what, &r);
    if (res == ncclSuccess) break;
    if (res != ncclRemoteError || (deadline > 0 && time_now() + 0.1 > deadline)) return res;
    time_sleep_us(100 * 1000);
  }
  if (r.magic != BOOT_MAGIC || r.nonce != mine.nonce || r.type != MSG_REPLY)
    return log_err(ncclSystemError, "%s: the reply has a wrong magic, nonce or type", what);
  r.error[sizeof r.error - 1] = '\0';
  if (r.status != 0)
    return log_err(ncclSystemError, "bootstrap: rank %d of %d: %s", b->rank, b->nranks, r.error);
  *succ_p = r.succ;
  return ncclSuccess;
}

/* Connects to the ring successor and takes the ring predecessor's connection. */
static ncclResult_t connect_ring(boot_t *b, const sock_addr_t *succ, double deadline) {
  if (b->nranks == 1) return ncclSuccess;
  int next = (b->rank + 1) % b->nranks, pred = (b->rank + b->nranks - 1) % b->nranks;
  char doing[64];
  snprintf(doing, sizeof doing, "waiting for rank %d's ring connection", pred);
  CHECK(boot_connect_peer(b, next, MSG_RING, succ, deadline, &b->ring_send_fd));
  while (b->ring_recv_fd < 0) {
    if (b->succ_closed != 0)
      return boot_blame(b, next, "rank %d closed its ring connection (it exited or failed)", next);
    CHECK(boot_progress(b, NULL, 0, deadline, doing));
  }
  return ncclSuccess;
}

static ncclResult_t ring_allgather(boot_t *b, void *data, size_t size, double deadline);

/* A failed init tells the ring why, waiting a little for its predecessor to connect if it has not yet. */
static void notify_failure(boot_t *b) {
  if (b == NULL || !b->fds_ready || b->nranks == 1) return;
  boot_notify_failure(b, log_last_error());
  if (b->failed[0] != '\0' && b->culprit == (b->rank + b->nranks - 1) % b->nranks) return; /* it is gone */
  double until = time_now() + NOTICE_LINGER_S;
  char keep[LOG_ERROR_MAX];
  snprintf(keep, sizeof keep, "%s", log_last_error());
  while (b->notice_out == 1 && b->listen_fd >= 0 && time_now() < until)
    if (boot_progress(b, NULL, 0, until, NULL) != ncclSuccess) break;
  log_set_last_error("%s", keep);
}

ncclResult_t boot_init(const ncclUniqueId *ids, int nid, int rank, int nranks, const volatile int *abort_flag,
                       boot_t **boot_p) {
  if (nranks < 1 || rank < 0 || rank >= nranks || nid < 1 || nid > nranks)
    return log_err(ncclInvalidArgument,
                   "bootstrap: rank %d, nranks %d, nid %d: need 0 <= rank < nranks and 1 <= nid <= nranks",
                   rank, nranks, nid);
  for (int i = 0; i < nid; i++) CHECK(boot_check_id(&ids[i]));
  int k = block_of(rank, nid, nranks);
  id_body_t root_id;
  id_decode(&ids[k], &root_id);
  boot_t *b = NULL;
  ncclResult_t res;
  CHECK_GOTO(boot_alloc(rank, nranks, abort_flag, &b), res, err_close_boot);
  b->nonce = boot_id_nonce(&ids[0]);
  CHECK_GOTO(listen_self(b, &root_id), res, err_close_boot);
  if ((root_id.flags & ID_ROOT_BY_RANK0) && rank == block_first(k, nid, nranks))
    CHECK_GOTO(boot_start_root(&root_id.root, root_id.nonce), res, err_close_boot);
  sock_addr_t succ;
  CHECK_GOTO(join_root(b, ids, nid, &succ), res, err_close_boot);
  double deadline = wd_deadline(param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S));
  CHECK_GOTO(connect_ring(b, &succ, deadline), res, err_notify);
  CHECK_GOTO(ring_allgather(b, b->addrs, sizeof *b->addrs, deadline), res, err_notify);
  b->addrs_known = 1;
  char root_name[SOCK_ADDR_STRLEN], self_name[SOCK_ADDR_STRLEN];
  INFO(LOG_BOOTSTRAP, "bootstrap: rank %d of %d joined through the root at %s (id %d of %d), listening at %s",
       rank, nranks, sock_addr_str(&root_id.root, root_name), k, nid,
       sock_addr_str(&b->addrs[rank], self_name));
  *boot_p = b;
  return ncclSuccess;
err_notify:
  notify_failure(b);
err_close_boot:
  boot_close(b);
  return res;
}

/* ---- Ring allgather ---- */

/* Sends n bytes to the successor while receiving n bytes from the predecessor, so neither side can fill its
 * socket buffers and wait for the other. `last`: the allgather's last step, after which the successor may
 * leave as soon as it has our bytes. */
static ncclResult_t ring_exchange(boot_t *b, const char *out, char *in, size_t n, int last, double deadline) {
  int next = (b->rank + 1) % b->nranks, pred = (b->rank + b->nranks - 1) % b->nranks;
  char what_out[64], what_in[64];
  snprintf(what_out, sizeof what_out, "bootstrap: ring connection to rank %d", next);
  snprintf(what_in, sizeof what_in, "bootstrap: ring connection from rank %d", pred);
  size_t sent = 0, got = 0;
  while (sent < n || got < n) {
    size_t moved_out = 0, moved_in = 0;
    if (b->succ_closed != 0 && (sent < n || !last))
      return boot_blame(b, next, "rank %d closed its ring connection (it exited or failed)", next);
    if (sent < n &&
        sock_send_some(b->ring_send_fd, out + sent, n - sent, &moved_out, what_out) != ncclSuccess)
      return boot_blame(b, next, "rank %d closed its ring connection (%s)", next, log_last_error());
    if (got < n && sock_recv_some(b->ring_recv_fd, in + got, n - got, &moved_in, what_in) != ncclSuccess)
      return boot_blame(b, pred, "rank %d closed its ring connection (%s)", pred, log_last_error());
    sent += moved_out;
    got += moved_in;
    if (moved_out > 0 || moved_in > 0) continue;
    /* Serve tagged traffic meanwhile, so a large send to us from a rank not yet here cannot stall it. */
    struct pollfd pfds[2] = {{.fd = sent < n ? b->ring_send_fd : -1, .events = POLLOUT},
                             {.fd = got < n ? b->ring_recv_fd : -1, .events = POLLIN}};
    CHECK(boot_progress(b, pfds, 2, deadline, "in a ring allgather"));
  }
  return ncclSuccess;
}

/* Step s passes block (rank - s) on and takes block (rank - s - 1) in. */
static ncclResult_t ring_allgather(boot_t *b, void *data, size_t size, double deadline) {
  char *blocks = data;
  for (int step = 0; step < b->nranks - 1; step++) {
    size_t out = (size_t)((b->rank - step + b->nranks) % b->nranks);
    size_t in = (size_t)((b->rank - step - 1 + 2 * b->nranks) % b->nranks);
    CHECK(ring_exchange(b, blocks + out * size, blocks + in * size, size, step == b->nranks - 2, deadline));
  }
  return ncclSuccess;
}

ncclResult_t boot_allgather(boot_t *boot, void *data, size_t size) {
  wd_timer_t t; /* published for monitoring; the ring's deadline bounds it */
  wd_begin(&t, boot->wd,
           &(wd_wait_t){.kind = WD_BOOT, .peer = -1, .channel = -1, .op = "bootstrap allgather"}, NULL, NULL);
  fair_lock(&boot->lock);
  ncclResult_t res = ring_allgather(boot, data, size, wd_deadline(param_int(P_BRAID_TIMEOUT_S)));
  fair_unlock(&boot->lock);
  wd_end(&t);
  return res;
}

ncclResult_t boot_barrier(boot_t *boot) {
  char stack_bytes[256];
  char *bytes = boot->nranks <= (int)sizeof stack_bytes ? stack_bytes : malloc(boot->nranks);
  if (bytes == NULL) return log_err(ncclSystemError, "out of memory for a barrier of %d ranks", boot->nranks);
  memset(bytes, 0, boot->nranks);
  ncclResult_t res = boot_allgather(boot, bytes, 1);
  if (bytes != stack_bytes) free(bytes);
  return res;
}

const sock_addr_t *boot_addr(const boot_t *boot, int rank) {
  return &boot->addrs[rank];
}

void boot_close(boot_t *boot) {
  if (boot == NULL) return;
  for (int p = 0; boot->fds_ready && p < boot->nranks; p++) {
    sock_close(boot->send_fds[p]);
    sock_close(boot->recv_fds[p]);
  }
  sock_close(boot->ring_send_fd);
  sock_close(boot->ring_recv_fd);
  sock_close(boot->listen_fd);
  gate_close(&boot->gate);
  boot_free_queue(boot);
  pthread_cond_destroy(&boot->lock.turn);
  pthread_mutex_destroy(&boot->lock.mu);
  free(boot->addrs);
  free(boot->send_fds);
  free(boot->recv_fds);
  free(boot->closed_at);
  for (int p = 0; boot->fds_ready && p < boot->nranks; p++) free(boot->rx[p].msg);
  free(boot->rx);
  free(boot->pfds);
  free(boot);
}
