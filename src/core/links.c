/*
 * A communicator's connections (see links.h).
 */
#include "links.h"

#include <stdlib.h>

#include "base/check.h"
#include "base/log.h"

/* Bootstrap tag of connection blobs. */
#define TAG_LINK_BLOB 0x4c494e4bu

ncclResult_t links_init(boot_t *boot, const tp_config_t *config, alloc_acct_t *acct, links_t **links_p) {
  ncclResult_t res;
  links_t *l;
  int n = config->nranks;
  CHECK(MEM_CALLOC(acct, l, 1, "links"));
  l->rank = config->rank;
  l->nranks = n;
  l->boot = boot;
  l->acct = acct;
  CHECK_GOTO(MEM_CALLOC(acct, l->send, n, "send connections"), res, err_free);
  CHECK_GOTO(MEM_CALLOC(acct, l->recv, n, "receive connections"), res, err_free);
  CHECK_GOTO(MEM_CALLOC(acct, l->recv_state, n, "connection states"), res, err_free);
  CHECK_GOTO(MEM_CALLOC(acct, l->mark_send, n, "engine marks"), res, err_free);
  CHECK_GOTO(MEM_CALLOC(acct, l->mark_recv, n, "engine marks"), res, err_free);
  CHECK_GOTO(tp_init(config, &l->tp), res, err_free);
  *links_p = l;
  return ncclSuccess;
err_free:
  links_destroy(l);
  return res;
}

/* Makes the receiving end from `peer` and sends its blob. */
static ncclResult_t listen_peer(links_t *l, int peer) {
  char blob[TP_BLOB_BYTES] = {0};
  const tp_ops_t *ops = tp_select(l->tp, peer);
  CHECK(ops->listen(l->tp, peer, blob, &l->recv[peer]));
  l->recv_state[peer] = LINK_LISTENING;
  CHECK(boot_send(l->boot, peer, TAG_LINK_BLOB, blob, sizeof blob));
  INFO(LOG_INIT | LOG_SHM | LOG_NET | LOG_P2P, "rank %d: receiving from rank %d via %s", l->rank, peer,
       ops->name);
  return ncclSuccess;
}

/* Makes the sending end to `peer` with the blob it sent. */
static ncclResult_t connect_peer(links_t *l, int peer) {
  char blob[TP_BLOB_BYTES];
  CHECK(boot_recv(l->boot, peer, TAG_LINK_BLOB, blob, sizeof blob));
  const tp_ops_t *ops = tp_select(l->tp, peer);
  CHECK(ops->connect(l->tp, peer, blob, &l->send[peer]));
  INFO(LOG_INIT | LOG_SHM | LOG_NET | LOG_P2P, "rank %d: sending to rank %d via %s", l->rank, peer,
       ops->name);
  return ncclSuccess;
}

ncclResult_t links_listen(links_t *l, const plan_t *plan) {
  for (int i = 0; i < plan->nxfers; i++) {
    int peer = plan->xfers[i].recv_peer;
    if (peer >= 0 && l->recv_state[peer] == LINK_NONE) CHECK(listen_peer(l, peer));
  }
  return ncclSuccess;
}

ncclResult_t links_connect(links_t *l, const plan_t *plan) {
  for (int i = 0; i < plan->nxfers; i++) {
    int peer = plan->xfers[i].send_peer;
    if (peer >= 0 && l->send[peer] == NULL) CHECK(connect_peer(l, peer));
  }
  return ncclSuccess;
}

ncclResult_t links_connect_all(links_t *l) {
  for (int i = 1; i < l->nranks; i++) {
    int peer = (l->rank + i) % l->nranks;
    if (l->recv_state[peer] == LINK_NONE) CHECK(listen_peer(l, peer));
  }
  for (int i = 1; i < l->nranks; i++) {
    int peer = (l->rank - i + l->nranks) % l->nranks;
    if (l->send[peer] == NULL) CHECK(connect_peer(l, peer));
  }
  return links_accept(l);
}

ncclResult_t links_accept(links_t *l) {
  for (int peer = 0; peer < l->nranks; peer++) {
    if (l->recv_state[peer] != LINK_LISTENING) continue;
    CHECK(l->recv[peer]->ops->accept(l->tp, l->recv[peer]));
    l->recv_state[peer] = LINK_READY;
  }
  return ncclSuccess;
}

void links_fail(links_t *l) {
  for (int peer = 0; peer < l->nranks; peer++) {
    if (l->send[peer] != NULL) l->send[peer]->ops->fail(l->send[peer]);
    if (l->recv[peer] != NULL) l->recv[peer]->ops->fail(l->recv[peer]);
  }
}

void links_destroy(links_t *l) {
  if (l == NULL) return;
  size_t n = l->nranks;
  for (size_t peer = 0; peer < n; peer++) {
    if (l->send != NULL && l->send[peer] != NULL) l->send[peer]->ops->close(l->send[peer]);
    if (l->recv != NULL && l->recv[peer] != NULL) l->recv[peer]->ops->close(l->recv[peer]);
  }
  if (l->tp != NULL) tp_destroy(l->tp);
  mem_free(l->acct, l->send, n * sizeof *l->send);
  mem_free(l->acct, l->recv, n * sizeof *l->recv);
  mem_free(l->acct, l->recv_state, n);
  mem_free(l->acct, l->mark_send, n * sizeof *l->mark_send);
  mem_free(l->acct, l->mark_recv, n * sizeof *l->mark_recv);
  mem_free(l->acct, l, sizeof *l);
}
