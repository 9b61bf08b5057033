/*
 * The shm transport: a single-producer, single-consumer byte ring in a POSIX shared-memory segment owned by
 * the receiver, for two ranks of one machine.
 *
 * The receiver creates the segment (listen) and sends its name in the blob; the sender maps it and unlinks
 * the name (connect), so that nothing is left in /dev/shm once both sides have mapped it, even if they crash
 * later. Data moves with no system call: the sender writes into the ring and advances `tail`, the receiver
 * reads and advances `head` (see shm.h for the ordering contract). A peek that finds nothing to do checks, at
 * most every 100 ms, whether the peer flagged a failure or its process is gone, so a dead peer ends the wait
 * with an error.
 */
#include "transport/shm.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "base/timeutil.h"

/* Seconds between two liveness checks of an idle connection. */
#define LIVENESS_PERIOD_S 0.1

/* One end of an shm connection. */
typedef struct {
  tp_conn_t base;      /* the generic part; first, so that a tp_conn_t * converts to this */
  tp_seg_t seg;        /* the mapped segment */
  tp_shm_ctrl_t *ctrl; /* its control block, at its start */
  unsigned char *ring; /* the ring, right after the control block */
  uint64_t ring_bytes; /* bytes of the ring */
  uint64_t pos;        /* sender: bytes committed (its tail); receiver: bytes released (its head) */
  size_t peeked;       /* bytes offered by the last peek and not yet committed or released */
  int rank;            /* this rank, for messages */
  int32_t config_pid;  /* the peer's pid from the peer table, used until the segment names it */
  double next_check;   /* time_now() after which an idle peek checks the peer again */
  ncclResult_t broken; /* the error already reported on this connection, returned again without logging */
  char what[48];       /* "shm connection from rank N", for messages */
} shm_conn_t;

static const char *direction(const shm_conn_t *c) {
  return c->base.is_send ? "to" : "from";
}

/* The peer's pid: from the control block once the peer wrote it there (acquire: pairs with its release). */
static int32_t peer_pid(const shm_conn_t *c) {
  int32_t pid = atomic_load_explicit(c->base.is_send ? &c->ctrl->receiver_pid : &c->ctrl->sender_pid,
                                     memory_order_acquire);
  return pid != 0 ? pid : c->config_pid;
}

/* Whether process `pid` still runs. A zombie has exited although kill() still finds it. */
static int process_alive(int32_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char path[64], stat[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return errno != ENOENT;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = '\0';
  const char *paren = strrchr(stat, ')');
  return paren == NULL || paren[1] == '\0' || paren[2] != 'Z';
}

/* Checks that the peer neither flagged a failure nor exited; reports the first problem found, once. */
static ncclResult_t check_peer(shm_conn_t *c) {
  if (c->broken != ncclSuccess) return c->broken;
  int theirs = c->base.is_send ? SHM_FAILED_RECEIVER : SHM_FAILED_SENDER;
  int32_t pid = peer_pid(c);
  /* acquire: pairs with the release fetch-or in shm_fail. */
  if (atomic_load_explicit(&c->ctrl->failed, memory_order_acquire) & theirs) {
    c->broken =
        log_err(ncclRemoteError, "shm connection %s rank %d (pid %d) on rank %d: rank %d reported a failure",
                direction(c), c->base.peer, (int)pid, c->rank, c->base.peer);
  } else if (pid > 0 && !process_alive(pid)) {
    c->broken = log_err(ncclRemoteError, "shm connection %s rank %d (pid %d) on rank %d: peer process exited",
                        direction(c), c->base.peer, (int)pid, c->rank);
  }
  return c->broken;
}

/* Called when a peek found nothing to do: checks the peer at most every LIVENESS_PERIOD_S. */
static ncclResult_t idle_check(shm_conn_t *c) {
  if (c->broken != ncclSuccess) return c->broken;
  double now = time_now();
  if (now < c->next_check) return ncclSuccess;
  c->next_check = now + LIVENESS_PERIOD_S;
  return check_peer(c);
}

static ncclResult_t new_conn(tp_ctx_t *ctx, int peer, int is_send, shm_conn_t **conn_p) {
  const tp_config_t *cfg = tp_ctx_config(ctx);
  tp_conn_t base;
  CHECK(tp_conn_init(ctx, &tp_shm_ops, peer, is_send, &base));
  shm_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL) return log_err(ncclSystemError, "shm connection to rank %d: out of memory", peer);
  c->base = base;
  c->rank = cfg->rank;
  c->config_pid = cfg->peers[peer].pid;
  snprintf(c->what, sizeof c->what, "shm connection %s rank %d", direction(c), peer);
  *conn_p = c;
  return ncclSuccess;
}

/* Points ctrl and ring into the mapped segment. */
static void use_segment(shm_conn_t *c) {
  c->ctrl = c->seg.base;
  c->ring = (unsigned char *)c->seg.base + sizeof(tp_shm_ctrl_t);
}

static ncclResult_t shm_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  const tp_config_t *cfg = tp_ctx_config(ctx);
  shm_conn_t *c;
  CHECK(new_conn(ctx, peer, 0, &c));
  c->ring_bytes = (cfg->ring_bytes + 63) / 64 * 64;
  CHECK_GOTO(tp_seg_create(cfg, peer, sizeof(tp_shm_ctrl_t) + c->ring_bytes, c->what, &c->seg), res,
             err_free_conn);
  use_segment(c);
  tp_charge(&c->base, c->seg.bytes, "shm ring"); /* the receiver owns the segment; the sender maps it too */
  c->ctrl->ring_bytes = c->ring_bytes;
  /* release: the pid and ring size are complete before the sender, which maps after it gets the blob,
   * reads them. The blob travels through the bootstrap's system calls, which order this store anyway. */
  atomic_store_explicit(&c->ctrl->receiver_pid, (int32_t)getpid(), memory_order_release);
  tp_shm_blob_t b;
  memset(&b, 0, sizeof b);
  memcpy(b.name, c->seg.name, sizeof b.name);
  b.size = c->seg.bytes;
  b.receiver_pid = (int32_t)getpid();
  b.receiver_rank = cfg->rank;
  memset(blob, 0, TP_BLOB_BYTES);
  memcpy(blob, &b, sizeof b);
  INFO(LOG_SHM, "shm connection from rank %d: segment %s, ring of %llu bytes", peer, c->seg.name,
       (unsigned long long)c->ring_bytes);
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free(c);
  return res;
}

static ncclResult_t shm_connect(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  tp_shm_blob_t b;
  memcpy(&b, blob, sizeof b);
  b.name[sizeof b.name - 1] = '\0';
  if (b.receiver_rank != peer)
    return log_err(ncclInternalError, "shm connection to rank %d: the blob comes from rank %d", peer,
                   (int)b.receiver_rank);
  if (b.size <= sizeof(tp_shm_ctrl_t) || (b.size - sizeof(tp_shm_ctrl_t)) % 64 != 0)
    return log_err(ncclInternalError, "shm connection to rank %d: segment size %llu in the blob is not valid",
                   peer, (unsigned long long)b.size);
  shm_conn_t *c;
  CHECK(new_conn(ctx, peer, 1, &c));
  c->config_pid = b.receiver_pid;
  c->ring_bytes = b.size - sizeof(tp_shm_ctrl_t);
  CHECK_GOTO(tp_seg_attach(b.name, b.size, c->what, &c->seg), res, err_free_conn);
  use_segment(c);
  /* release: pairs with the receiver's acquire in peer_pid; only the liveness check reads it. */
  atomic_store_explicit(&c->ctrl->sender_pid, (int32_t)getpid(), memory_order_release);
  INFO(LOG_SHM, "shm connection to rank %d: attached %s", peer, b.name);
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free(c);
  return res;
}

/* The ring works before the sender attaches, and liveness falls back to the peer table's pid, so there is
 * nothing to wait for. */
static ncclResult_t shm_accept(tp_ctx_t *ctx, tp_conn_t *conn) {
  return ncclSuccess;
}

static ncclResult_t shm_send_peek(tp_conn_t *conn, void **ptr_p, size_t *bytes_p) {
  shm_conn_t *c = (shm_conn_t *)conn;
  /* acquire: pairs with the receiver's release of head, so its reads of the freed bytes are done. */
  uint64_t head = atomic_load_explicit(&c->ctrl->head, memory_order_acquire);
  uint64_t room = c->ring_bytes - (c->pos - head);
  uint64_t off = c->pos % c->ring_bytes;
  uint64_t contig = room < c->ring_bytes - off ? room : c->ring_bytes - off;
  if (contig == 0) CHECK(idle_check(c));
  c->peeked = (size_t)contig;
  *ptr_p = c->ring + off;
  *bytes_p = (size_t)contig;
  return ncclSuccess;
}

static ncclResult_t shm_send_commit(tp_conn_t *conn, size_t bytes) {
  shm_conn_t *c = (shm_conn_t *)conn;
  if (bytes > c->peeked)
    return log_err(ncclInternalError, "shm connection to rank %d: commit of %zu bytes, only %zu were peeked",
                   c->base.peer, bytes, c->peeked);
  c->peeked -= bytes;
  c->pos += bytes;
  /* release: the bytes written into the ring are visible before the receiver's acquire of tail sees them. */
  atomic_store_explicit(&c->ctrl->tail, c->pos, memory_order_release);
  return ncclSuccess;
}

/* Committed bytes are already in the receiver's memory, so there is nothing to push. The peer is not checked:
 * a receiver that took everything may well have exited already. */
static ncclResult_t shm_flush(tp_conn_t *conn, int *done_p) {
  (void)conn;
  *done_p = 1;
  return ncclSuccess;
}

static ncclResult_t shm_recv_peek(tp_conn_t *conn, void **ptr_p, size_t *bytes_p) {
  shm_conn_t *c = (shm_conn_t *)conn;
  /* acquire: pairs with the sender's release of tail, so the bytes below it are visible. */
  uint64_t tail = atomic_load_explicit(&c->ctrl->tail, memory_order_acquire);
  uint64_t avail = tail - c->pos;
  uint64_t off = c->pos % c->ring_bytes;
  uint64_t contig = avail < c->ring_bytes - off ? avail : c->ring_bytes - off;
  if (contig == 0) CHECK(idle_check(c));
  c->peeked = (size_t)contig;
  *ptr_p = c->ring + off;
  *bytes_p = (size_t)contig;
  return ncclSuccess;
}

static ncclResult_t shm_recv_release(tp_conn_t *conn, size_t bytes) {
  shm_conn_t *c = (shm_conn_t *)conn;
  if (bytes > c->peeked)
    return log_err(ncclInternalError,
                   "shm connection from rank %d: release of %zu bytes, only %zu were peeked", c->base.peer,
                   bytes, c->peeked);
  c->peeked -= bytes;
  c->pos += bytes;
  /* release: our reads of these bytes are done before the sender's acquire of head lets it overwrite them. */
  atomic_store_explicit(&c->ctrl->head, c->pos, memory_order_release);
  return ncclSuccess;
}

static void shm_fail(tp_conn_t *conn) {
  shm_conn_t *c = (shm_conn_t *)conn;
  int mine = c->base.is_send ? SHM_FAILED_SENDER : SHM_FAILED_RECEIVER;
  /* release: pairs with the peer's acquire load in check_peer. */
  atomic_fetch_or_explicit(&c->ctrl->failed, mine, memory_order_release);
}

static void shm_close(tp_conn_t *conn) {
  shm_conn_t *c = (shm_conn_t *)conn;
  if (c == NULL) return;
  tp_seg_close(&c->seg, c->what);
  tp_uncharge(&c->base);
  free(c);
}

const tp_ops_t tp_shm_ops = {
    .name = "shm",
    .listen = shm_listen,
    .connect = shm_connect,
    .accept = shm_accept,
    .send_peek = shm_send_peek,
    .send_commit = shm_send_commit,
    .flush = shm_flush,
    .recv_peek = shm_recv_peek,
    .recv_release = shm_recv_release,
    .fail = shm_fail,
    .close = shm_close,
};
