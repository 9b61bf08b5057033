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
#include "transport/net.h"

/* A communicator's transport context. */
struct tp_ctx {
  tp_config_t config; /* the communicator's configuration; config.peers points to peers below */
  tp_peer_t *peers;   /* owned copy of the peer table, config.nranks entries */
  tp_net_ctx_t *net;  /* the net transport's listening socket and stashed handshakes */
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
  CHECK_GOTO(tp_net_ctx_create(&ctx->config, &ctx->net), res, err_free_peers);
  *ctx_p = ctx;
  return ncclSuccess;

err_free_peers:
  free(ctx->peers);
err_free_ctx:
  free(ctx);
  return res;
}

const tp_ops_t *tp_select(const tp_ctx_t *ctx, int peer) {
  const tp_config_t *c = &ctx->config;
  if (param_int(P_NCCL_SHM_DISABLE) == 0 && c->peers[peer].host_hash == c->peers[c->rank].host_hash)
    return &tp_shm_ops;
  return &tp_net_ops;
}

void tp_destroy(tp_ctx_t *ctx) {
  if (ctx == NULL) return;
  tp_net_ctx_destroy(ctx->net);
  free(ctx->peers);
  free(ctx);
}

const tp_config_t *tp_ctx_config(const tp_ctx_t *ctx) {
  return &ctx->config;
}

tp_net_ctx_t *tp_ctx_net(tp_ctx_t *ctx) {
  return ctx->net;
}

void tp_charge(tp_conn_t *conn, size_t bytes, const char *what) {
  char label[96];
  snprintf(label, sizeof label, "%s %s rank %d", what, conn->is_send ? "to" : "from", conn->peer);
  mem_charge(conn->acct, bytes, 0, label);
  conn->charged += bytes;
}

void tp_uncharge(tp_conn_t *conn) {
  mem_release(conn->acct, conn->charged, 0);
  conn->charged = 0;
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
