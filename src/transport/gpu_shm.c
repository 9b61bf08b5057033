/*
 * The gpu_shm transport: a connection's rings live in a POSIX shared-memory segment that both ranks map and
 * register with their GPU, for two GPUs of one host that cannot (or may not) map each other's memory.
 *
 * The receiver creates the segment (shm_seg.h: zeroed, named after the communicator's nonce, the ranks and a
 * counter) and registers it; the sender maps it, removes the name and registers it too. Each side's kernel
 * reaches the rings through the device address its own registration gave, and the bytes cross PCIe through
 * host memory. The kernels move all data (device/dev.h states the ordering contract), so the ops table has
 * no data-path functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "gpu/gpu.h"
#include "transport/shm_seg.h"
#include "transport/transport.h"

/* What the receiver sends the sender. */
typedef struct {
  char name[SHM_NAME_BYTES]; /* shm_open name of the segment */
  uint64_t size;             /* bytes of the segment (the rings, rounded up to whole pages) */
  int32_t receiver_pid;      /* the receiver's process */
  int32_t receiver_rank;     /* checked by the sender against the peer it connects to */
  int32_t nch;               /* rings; checked against the sender's own */
  int32_t reserved;          /* zero */
} gpu_shm_blob_t;

_Static_assert(sizeof(gpu_shm_blob_t) <= TP_BLOB_BYTES, "the gpu_shm blob fits in a transport blob");

/* One end of a gpu_shm connection. */
typedef struct {
  tp_conn_t base; /* the generic part; first, so that a tp_conn_t * converts to this */
  int dev;        /* this rank's device */
  tp_seg_t seg;   /* the mapped segment */
  int registered; /* 1 once the segment is registered with the device */
  char what[48];  /* "gpu_shm connection from rank N", for messages */
} gpu_shm_conn_t;

/* Bytes of the segment for `nch` rings: page-aligned, as host registration maps whole pages. */
static size_t segment_bytes(int nch) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t bytes = (size_t)nch * DEV_RING_BYTES;
  return (bytes + page - 1) / page * page;
}

static ncclResult_t new_conn(tp_ctx_t *ctx, int peer, int is_send, gpu_shm_conn_t **conn_p) {
  tp_conn_t base;
  CHECK(tp_check_gpu_config(ctx, "gpu_shm", peer));
  CHECK(tp_conn_init(ctx, &tp_gpu_shm_ops, peer, is_send, &base));
  gpu_shm_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL) return log_err(ncclSystemError, "gpu_shm connection with rank %d: out of memory", peer);
  c->base = base;
  c->dev = tp_ctx_dev(ctx);
  snprintf(c->what, sizeof c->what, "gpu_shm connection %s rank %d", is_send ? "to" : "from", peer);
  *conn_p = c;
  return ncclSuccess;
}

/* Registers the mapped segment with this rank's device and points the rings at the device address. */
static ncclResult_t register_segment(gpu_shm_conn_t *c, int nch) {
  void *dev_ptr = NULL;
  gpu_scope_t scope;
  CHECK(gpu_enter(c->dev, &scope));
  mem_doing("gpu_shm rings (page-locking)");
  ncclResult_t res = gpu_host_register(c->seg.base, c->seg.bytes, &dev_ptr);
  mem_doing(NULL);
  gpu_leave(&scope);
  CHECK(res);
  c->registered = 1;
  return tp_conn_set_rings(&c->base, nch, dev_ptr);
}

static void free_conn(gpu_shm_conn_t *c) {
  if (c->registered) {
    gpu_scope_t scope;
    int entered = gpu_enter(c->dev, &scope) == ncclSuccess;
    gpu_host_unregister(c->seg.base);
    if (entered) gpu_leave(&scope);
  }
  tp_seg_close(&c->seg, c->what);
  tp_conn_free_rings(&c->base);
  tp_uncharge(&c->base);
  free(c);
}

static ncclResult_t gpu_shm_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  const tp_config_t *cfg = tp_ctx_config(ctx);
  gpu_shm_conn_t *c;
  CHECK(new_conn(ctx, peer, 0, &c));
  CHECK_GOTO(tp_seg_create(cfg, peer, segment_bytes(cfg->nch), c->what, &c->seg), res, err_free_conn);
  tp_charge(&c->base, c->seg.bytes, "gpu_shm rings"); /* the receiver owns the segment; the sender maps it */
  CHECK_GOTO(register_segment(c, cfg->nch), res, err_free_conn);
  gpu_shm_blob_t b;
  memset(&b, 0, sizeof b);
  memcpy(b.name, c->seg.name, sizeof b.name);
  b.size = c->seg.bytes;
  b.receiver_pid = (int32_t)getpid();
  b.receiver_rank = cfg->rank;
  b.nch = cfg->nch;
  memset(blob, 0, TP_BLOB_BYTES);
  memcpy(blob, &b, sizeof b);
  INFO(LOG_SHM, "%s: segment %s, %d rings of %llu bytes", c->what, c->seg.name, cfg->nch,
       (unsigned long long)DEV_RING_BYTES);
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free_conn(c);
  return res;
}

static ncclResult_t gpu_shm_connect(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p) {
  ncclResult_t res;
  const tp_config_t *cfg = tp_ctx_config(ctx);
  gpu_shm_blob_t b;
  memcpy(&b, blob, sizeof b);
  b.name[sizeof b.name - 1] = '\0';
  if (b.receiver_rank != peer || b.nch != cfg->nch || b.size != segment_bytes(cfg->nch))
    return log_err(ncclInternalError,
                   "gpu_shm connection to rank %d: the blob comes from rank %d with %d rings in %llu bytes "
                   "(this rank uses %d rings)",
                   peer, (int)b.receiver_rank, (int)b.nch, (unsigned long long)b.size, cfg->nch);
  gpu_shm_conn_t *c;
  CHECK(new_conn(ctx, peer, 1, &c));
  CHECK_GOTO(tp_seg_attach(b.name, b.size, c->what, &c->seg), res, err_free_conn);
  CHECK_GOTO(register_segment(c, cfg->nch), res, err_free_conn);
  tp_log_route(ctx, &c->base, LOG_SHM, "SHM");
  *conn_p = &c->base;
  return ncclSuccess;

err_free_conn:
  free_conn(c);
  return res;
}

/* The rings work as soon as the segment exists; the sender maps it on its own. */
static ncclResult_t gpu_shm_accept(tp_ctx_t *ctx, tp_conn_t *conn) {
  return ncclSuccess;
}

/* Nothing to tell: the rings carry no failure flag. The peer's kernel ends its wait through its own abort
 * flag or timeout. */
static void gpu_shm_fail(tp_conn_t *conn) {}

static void gpu_shm_close(tp_conn_t *conn) {
  if (conn != NULL) free_conn((gpu_shm_conn_t *)conn);
}

const tp_ops_t tp_gpu_shm_ops = {
    .name = "gpu_shm",
    .listen = gpu_shm_listen,
    .connect = gpu_shm_connect,
    .accept = gpu_shm_accept,
    .fail = gpu_shm_fail,
    .close = gpu_shm_close,
};
