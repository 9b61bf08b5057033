/*
 * The p2p transport: a connection's rings live in the receiving GPU's memory and the sending GPU writes into
 * them directly (NVLink or PCIe), for two GPUs of one host that can map each other's memory.
 *
 * The receiver's listen allocates all `nch` rings of the connection, its LL rings and the rings' chunk marks
 * (device/dev.h: the LL protocol and the marks need a sender that stores into the receiver's memory, which
 * p2p has) in one zeroed device allocation and
 * describes it in the blob: its address when the sender is a rank of the same process (the sender then
 * enables peer access and uses the pointer as it is), else an export handle the sender imports onto its own
 * device. Nothing moves through the host afterwards: the kernels read and write the rings and their counters
 * (device/dev.h states the ordering contract), so the ops table has no data-path functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "gpu/gpu.h"
#include "transport/transport.h"

/* What the receiver sends the sender. */
typedef struct {
  uint64_t addr;         /* the rings' device address in the receiver's process */
  uint64_t bytes;        /* bytes of the rings (p2p_bytes) */
  int32_t receiver_pid;  /* the receiver's process */
  int32_t receiver_rank; /* checked by the sender against the peer it connects to */
  int32_t nch;           /* rings; checked against the sender's own */
  int32_t exported;      /* 1: `handle` describes the allocation, for a sender in another process */
  gpu_export_t handle;   /* set when exported */
} p2p_blob_t;

_Static_assert(sizeof(p2p_blob_t) <= TP_BLOB_BYTES, "the p2p blob fits in a transport blob");

/* One end of a p2p connection. */
typedef struct {
  tp_conn_t base; /* the generic part; first, so that a tp_conn_t * converts to this */
  int dev;        /* this rank's device */
  gpu_mem_t *mem; /* receiver: the rings' allocation; sender: their imported mapping (NULL: a pointer) */
  char what[48];  /* "p2p connection from rank N", for messages */
} p2p_conn_t;

/* A connection's allocation: nch rings, then (from p2p_ll_at, DEV_LL_ALIGN-aligned) the LL rings, then (from
 * p2p_marks_at) the nch rings' chunk marks. */
static uint64_t p2p_ll_at(int nch) {
  return ((uint64_t)nch * DEV_RING_BYTES + DEV_LL_ALIGN - 1) / DEV_LL_ALIGN * DEV_LL_ALIGN;
}

static uint64_t p2p_marks_at(int nch) {
  return p2p_ll_at(nch) + (uint64_t)DEV_LL_CHANNELS * DEV_LL_RING_BYTES;
}

static uint64_t p2p_bytes(int nch) {
  return p2p_marks_at(nch) + (uint64_t)nch * DEV_MARKS_BYTES;
}

static ncclResult_t new_conn(tp_ctx_t *ctx, int peer, int is_send, p2p_conn_t **conn_p) {
  tp_conn_t base;
  CHECK(tp_check_gpu_config(ctx, "p2p", peer));
  CHECK(tp_conn_init(ctx, &tp_p2p_ops, peer, is_send, &base));
  p2p_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL) return log_err(ncclSystemError, "p2p connection with rank %d: out of memory", peer);
  c->base = base;
  c->dev = tp_ctx_dev(ctx);
  snprintf(c->what, sizeof c->what, "p2p connection %s rank %d", is_send ? "to" : "from", peer);
  *conn_p = c;
  return ncclSuccess;
}

/* Frees everything a connection holds; the device calls run in its device's context. */
static void free_conn(p2p_conn_t *c) {
  if (c->mem != NULL) {
    gpu_scope_t scope;
    int entered = gpu_enter(c->dev, &scope) == ncclSuccess;
    gpu_mem_release(c->mem);
    if (entered) gpu_leave(&scope);
  }
  tp_conn_free_rings(&c->base);
  tp_uncharge(&c->base);
  free(c);
}

/* Receiver, inside its device's context: allocates the rings and describes them in *b. A sender of this
 * process gets the address; one of another process an export handle (the pid in the peer table decides, and
 * the sender checks the blob's pid against its own). */
static ncclResult_t make_rings(p2p_conn_t *c, const tp_config_t *cfg, p2p_blob_t *b) {
  size_t bytes = p2p_bytes(cfg->nch);
  mem_doing("p2p rings");
  ncclResult_t res = gpu_dev_alloc(c->dev, bytes, &c->mem);
  mem_doing(NULL);
  CHECK(res);
  tp_charge_dev(&c->base, gpu_mem_size(c->mem), "p2p rings");
  CHECK(tp_conn_set_rings(&c->base, cfg->nch, gpu_mem_ptr(c->mem)));
  tp_conn_set_ll(&c->base, (char *)gpu_mem_ptr(c->mem) + p2p_ll_at(cfg->nch));
  tp_conn_set_marks(&c->base, (char *)gpu_mem_ptr(c->mem) + p2p_marks_at(cfg->nch));
  b->addr = (uint64_t)(uintptr_t)gpu_mem_ptr(c->mem);
  b->bytes = bytes;
  if (cfg->peers[c->base.peer].pid != (int32_t)getpid()) {
    CHECK(gpu_mem_export(c->mem, &b->handle));
    b->exported = 1;
  }
  return ncclSuccess;
}

static ncclResult_t p2p_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  const tp_config_t *cfg = tp_ctx_config(ctx);
  p2p_conn_t *c;
  CHECK(new_conn(ctx, peer, 0, &c));
  p2p_blob_t b;
  memset(&b, 0, sizeof b);
  b.receiver_pid = (int32_t)getpid();
  b.receiver_rank = cfg->rank;
  b.nch = cfg->nch;
  gpu_scope_t scope;
  CHECK_GOTO(gpu_enter(c->dev, &scope), res, err_free_conn);
  res = make_rings(c, cfg, &b);
  gpu_leave(&scope);
  if (res != ncclSuccess) goto err_free_conn;
  memset(blob, 0, TP_BLOB_BYTES);
  memcpy(blob, &b, sizeof b);
  INFO(LOG_P2P, "%s: %d rings of %llu bytes and %d LL rings of %llu on device %d%s", c->what, cfg->nch,
       (unsigned long long)DEV_RING_BYTES, DEV_LL_CHANNELS, (unsigned long long)DEV_LL_RING_BYTES, c->dev,
       b.exported ? ", exported" : "");
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free_conn(c);
  return res;
}

/* Sender, inside its device's context: maps the receiver's rings. In one process the pointer is valid as it
 * is once this device may access the peer's; otherwise the export is imported onto this device. */
static ncclResult_t map_rings(p2p_conn_t *c, const tp_config_t *cfg, const p2p_blob_t *b) {
  char *base;
  if (b->receiver_pid == (int32_t)getpid()) {
    int peer_dev = cfg->peers[c->base.peer].dev;
    if (peer_dev != c->dev) CHECK(gpu_enable_peer_access(c->dev, peer_dev));
    base = (char *)(uintptr_t)b->addr;
  } else {
    if (!b->exported)
      return log_err(ncclInternalError, "%s: the receiver (pid %d) is another process but sent no export",
                     c->what, (int)b->receiver_pid);
    CHECK(gpu_mem_import(c->dev, &b->handle, &c->mem));
    if (gpu_mem_size(c->mem) < b->bytes)
      return log_err(ncclInternalError, "%s: the imported rings have %zu bytes, expected %llu", c->what,
                     gpu_mem_size(c->mem), (unsigned long long)b->bytes);
    base = gpu_mem_ptr(c->mem);
  }
  CHECK(tp_conn_set_rings(&c->base, b->nch, base));
  tp_conn_set_ll(&c->base, base + p2p_ll_at(b->nch));
  tp_conn_set_marks(&c->base, base + p2p_marks_at(b->nch));
  return ncclSuccess;
}

static ncclResult_t p2p_connect(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  const tp_config_t *cfg = tp_ctx_config(ctx);
  p2p_blob_t b;
  memcpy(&b, blob, sizeof b);
  if (b.receiver_rank != peer || b.nch != cfg->nch || b.bytes != p2p_bytes(b.nch))
    return log_err(ncclInternalError,
                   "p2p connection to rank %d: the blob comes from rank %d with %d rings of %llu bytes "
                   "(this rank uses %d)",
                   peer, (int)b.receiver_rank, (int)b.nch, (unsigned long long)b.bytes, cfg->nch);
  p2p_conn_t *c;
  CHECK(new_conn(ctx, peer, 1, &c));
  gpu_scope_t scope;
  CHECK_GOTO(gpu_enter(c->dev, &scope), res, err_free_conn);
  res = map_rings(c, cfg, &b);
  gpu_leave(&scope);
  if (res != ncclSuccess) goto err_free_conn;
  tp_log_route(ctx, &c->base, LOG_P2P, c->mem != NULL ? "P2P/IPC" : "P2P/direct pointer");
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free_conn(c);
  return res;
}

/* The rings work as soon as they exist; the sender maps them on its own. */
static ncclResult_t p2p_accept(tp_ctx_t *ctx, tp_conn_t *conn) {
  return ncclSuccess;
}

/* Nothing to tell: the rings carry no failure flag. The peer's kernel ends its wait through its own abort
 * flag or timeout, and its host learns of the failure from the bootstrap or its own transports. */
static void p2p_fail(tp_conn_t *conn) {}

/* The receiver frees the rings; a sender of another process only unmaps them (the driver keeps the memory
 * until both sides let go). */
static void p2p_close(tp_conn_t *conn) {
  if (conn != NULL) free_conn((p2p_conn_t *)conn);
}

const tp_ops_t tp_p2p_ops = {
    .name = "p2p",
    .listen = p2p_listen,
    .connect = p2p_connect,
    .accept = p2p_accept,
    .fail = p2p_fail,
    .close = p2p_close,
};
