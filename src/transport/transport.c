/*
 * The transport context of a communicator and the choice of transport per peer.
 *
 * The context keeps a copy of the communicator's configuration (with its own copy of the peer table) and the
 * net transport's listening state, which exists for the whole life of the context so that any peer may
 * connect over TCP at any time. The transports reach the context only through tp_ctx_config and tp_ctx_net.
 */
#include "transport/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "gpu/gpu.h"

/* A communicator's transport context. */
struct tp_ctx {
  tp_config_t config; /* the communicator's configuration; config.peers points to peers below */
  tp_peer_t *peers;   /* owned copy of the peer table, config.nranks entries */
  void *net;          /* the net transport's listening socket and stashed handshakes (tp_ctx_net) */
};

ncclResult_t tp_init(const tp_config_t *config, tp_ctx_t **ctx_p) {
  ncclResult_t res;
  if (config->nranks <= 0 || config->rank < 0 || config->rank >= config->nranks || config->peers == NULL)
    return log_err(ncclInvalidArgument, "transport init: rank %d of %d ranks (peers %p) is not valid",
                   config->rank, config->nranks, (const void *)config->peers);
  tp_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) return log_err(ncclSystemError, "transport init: out of memory for the context");
  ctx->peers = malloc(sizeof *ctx->peers * (size_t)config->nranks);
  if (ctx->peers == NULL) {
    res = log_err(ncclSystemError, "transport init: out of memory for %d peers", config->nranks);
    goto err_free_ctx;
  }
  memcpy(ctx->peers, config->peers, sizeof *ctx->peers * (size_t)config->nranks);
  ctx->config = *config;
  ctx->config.peers = ctx->peers;
  if (ctx->config.ring_bytes == 0) ctx->config.ring_bytes = (size_t)param_int(P_BRAID_HOST_BUFFSIZE);
  CHECK_GOTO(tp_net_ops.ctx_init(ctx, &ctx->net), res, err_free_peers);
  *ctx_p = ctx;
  return ncclSuccess;

err_free_peers:
  free(ctx->peers);
err_free_ctx:
  free(ctx);
  return res;
}

/* Whether this rank's GPU and rank `peer`'s can map each other's memory. Both ends of a connection must
 * choose the same transport, since the receiver's listen and the sender's connect each go by their own
 * choice. So this asks in both directions, and only about values both ranks see alike: the two device
 * indices of the peer table, put to the same driver on the same host. That holds when the processes of one
 * host number their devices alike (the same CUDA_VISIBLE_DEVICES); a query that fails counts as "no". */
static int gpus_map_each_other(const tp_config_t *c, int peer) {
  int mine = c->peers[c->rank].dev, theirs = c->peers[peer].dev, there = 0, back = 0;
  if (theirs < 0) return 0;
  if (gpu_can_access_peer(mine, theirs, &there) != ncclSuccess) return 0;
  if (gpu_can_access_peer(theirs, mine, &back) != ncclSuccess) return 0;
  return there && back;
}

/* Every input is the same on both ends (the peer table, the knobs, which every rank of a job is expected
 * to set alike, and gpus_map_each_other), so both ends choose the same transport. Which backend a rank runs
 * is read from its own peer-table entry (tp_ctx_dev: device -1 on the host backend). */
const tp_ops_t *tp_select(const tp_ctx_t *ctx, int peer) {
  const tp_config_t *c = &ctx->config;
  int same_host = c->peers[peer].host_hash == c->peers[c->rank].host_hash;
  int shm = same_host && param_int(P_NCCL_SHM_DISABLE) == 0;
  if (tp_ctx_dev(ctx) < 0) return shm ? &tp_shm_ops : &tp_net_ops;
  if (same_host && param_int(P_NCCL_P2P_DISABLE) == 0 && gpus_map_each_other(c, peer)) return &tp_p2p_ops;
  return shm ? &tp_gpu_shm_ops : &tp_gpu_net_ops;
}

tp_link_t tp_link(const tp_ctx_t *ctx, int peer) {
  const tp_ops_t *ops = tp_select(ctx, peer);
  return ops == &tp_p2p_ops                             ? TP_LINK_P2P
         : ops == &tp_shm_ops || ops == &tp_gpu_shm_ops ? TP_LINK_SHM
                                                        : TP_LINK_NET;
}

void tp_destroy(tp_ctx_t *ctx) {
  if (ctx == NULL) return;
  tp_net_ops.ctx_free(ctx->net);
  free(ctx->peers);
  free(ctx);
}

int tp_ctx_dev(const tp_ctx_t *ctx) {
  return ctx->peers[ctx->config.rank].dev;
}

const tp_config_t *tp_ctx_config(const tp_ctx_t *ctx) {
  return &ctx->config;
}

struct tp_net_ctx *tp_ctx_net(tp_ctx_t *ctx) {
  return ctx->net;
}

void tp_charge(tp_conn_t *conn, size_t bytes, const char *what) {
  char label[96];
  snprintf(label, sizeof label, "%s %s rank %d", what, conn->is_send ? "to" : "from", conn->peer);
  mem_charge(conn->acct, bytes, 0, label);
  conn->charged += bytes;
}

void tp_charge_dev(tp_conn_t *conn, size_t bytes, const char *what) {
  char label[96];
  snprintf(label, sizeof label, "%s %s rank %d", what, conn->is_send ? "to" : "from", conn->peer);
  mem_charge(conn->acct, bytes, 1, label);
  conn->charged_dev += bytes;
}

void tp_uncharge(tp_conn_t *conn) {
  mem_release(conn->acct, conn->charged, 0);
  mem_release(conn->acct, conn->charged_dev, 1);
  conn->charged = 0;
  conn->charged_dev = 0;
}

ncclResult_t tp_check_gpu_config(const tp_ctx_t *ctx, const char *transport, int peer) {
  const tp_config_t *c = &ctx->config;
  if (tp_ctx_dev(ctx) >= 0 && c->nch >= 1 && c->nch <= DEV_MAX_CHANNELS) return ncclSuccess;
  return log_err(ncclInternalError,
                 "%s connection with rank %d: device %d and %d rings per connection (1 to %d)", transport,
                 peer, tp_ctx_dev(ctx), c->nch, DEV_MAX_CHANNELS);
}

ncclResult_t tp_conn_set_rings(tp_conn_t *conn, int nch, char *base) {
  dev_ring_t *rings;
  CHECK(MEM_CALLOC(conn->acct, rings, (size_t)nch, "ring table"));
  for (int c = 0; c < nch; c++) {
    char *ring = base + (uint64_t)c * DEV_RING_BYTES;
    rings[c] = (dev_ring_t){.data = ring + sizeof(dev_ctrl_t), .ctrl = (dev_ctrl_t *)ring};
  }
  conn->rings = rings;
  conn->nrings = nch;
  return ncclSuccess;
}

ncclResult_t tp_conn_set_rings_apart(tp_conn_t *conn, int nch, char *ctrl, size_t ctrl_stride, char *data,
                                     size_t data_stride) {
  dev_ring_t *rings;
  CHECK(MEM_CALLOC(conn->acct, rings, (size_t)nch, "ring table"));
  for (int c = 0; c < nch; c++)
    rings[c] = (dev_ring_t){.data = data + (size_t)c * data_stride,
                            .ctrl = (dev_ctrl_t *)(ctrl + (size_t)c * ctrl_stride)};
  conn->rings = rings;
  conn->nrings = nch;
  return ncclSuccess;
}

void tp_conn_set_ll(tp_conn_t *conn, char *base) {
  for (int c = 0; c < DEV_LL_CHANNELS; c++) {
    char *ring = base + (uint64_t)c * DEV_LL_RING_BYTES;
    conn->ll[c] = (dev_ring_t){.data = ring + sizeof(dev_ctrl_t), .ctrl = (dev_ctrl_t *)ring};
  }
}

void tp_conn_set_marks(tp_conn_t *conn, char *base) {
  for (int c = 0; c < conn->nrings; c++)
    conn->rings[c].marks = (uint64_t *)(base + (uint64_t)c * DEV_MARKS_BYTES);
}

void tp_conn_free_rings(tp_conn_t *conn) {
  mem_free(conn->acct, conn->rings, sizeof *conn->rings * (size_t)conn->nrings);
  conn->rings = NULL;
  conn->nrings = 0;
}

void tp_log_route(const tp_ctx_t *ctx, const tp_conn_t *conn, uint64_t subsys, const char *via) {
  const tp_config_t *c = &ctx->config;
  int from = conn->is_send ? c->rank : conn->peer, to = conn->is_send ? conn->peer : c->rank;
  INFO(LOG_INIT | subsys, "Channel 00-%02d : %d[%d] -> %d[%d] via %s", conn->nrings - 1, from,
       (int)c->peers[from].dev, to, (int)c->peers[to].dev, via);
}

ncclResult_t tp_conn_init(const tp_ctx_t *ctx, const struct tp_ops *ops, int peer, int is_send,
                          tp_conn_t *conn) {
  const tp_config_t *cfg = tp_ctx_config(ctx);
  if (peer < 0 || peer >= cfg->nranks || peer == cfg->rank)
    return log_err(ncclInvalidArgument, "%s connection on rank %d: peer %d is not another rank of %d",
                   ops->name, cfg->rank, peer, cfg->nranks);
  *conn = (tp_conn_t){.ops = ops, .peer = peer, .is_send = is_send, .acct = cfg->acct};
  return ncclSuccess;
}
