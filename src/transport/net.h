/*
 * The net transport's context state and wire formats (private to src/transport/).
 *
 * A transport context uses one network (net_plugin.h): Braid's built-in TCP or a plugin. The receiver's
 * listen hands out the network's handle in the blob; the sender connects with it.
 */
#ifndef BRAID_TRANSPORT_NET_H
#define BRAID_TRANSPORT_NET_H

#include <stdint.h>

#include "transport/net_abi.h"
#include "transport/net_plugin.h"
#include "transport/transport.h"

/* "BRDNETv2": first field of every net blob. */
#define NET_BLOB_MAGIC 0x32764e54454e4452ull

/* The net state of a transport context: the network it uses. */
typedef struct tp_net_ctx tp_net_ctx_t;

/* What the receiver sends the sender. */
typedef struct {
  uint64_t magic;        /* NET_BLOB_MAGIC */
  uint64_t nonce;        /* the communicator's nonce */
  int32_t receiver_rank; /* the receiver */
  uint32_t slot_bytes;   /* the largest message the receiver takes (header included) */
  _Alignas(8) char handle[NCCL_NET_HANDLE_MAXSIZE]; /* the network's handle of the receiver's listen */
} tp_net_blob_t;

_Static_assert(sizeof(tp_net_blob_t) <= TP_BLOB_BYTES, "the net blob fits in a transport blob");

/* Chooses the context's network (NCCL_NET_PLUGIN, NCCL_NET or the config's net_name). `config` must outlive
 * the net state (it is the context's own copy). */
ncclResult_t tp_net_ctx_create(const tp_config_t *config, tp_net_ctx_t **net_p);
/* Ends the context's use of its network. */
void tp_net_ctx_destroy(tp_net_ctx_t *net);
/* The network the context uses. */
const np_net_t *tp_net_network(const tp_net_ctx_t *net);
/* Makes a failure of the network on net connection `conn` quiet: peeks and flushes still fail (with
 * ncclRemoteError), but without logging it, and tp_net_peer_closed then says so. Errors Braid finds itself
 * (a malformed message) are reported as usual. For the gpu_net proxy, which tells a normal end of a stream
 * from an early one itself. */
void tp_net_quiet_close(tp_conn_t *conn);
/* Whether the network reported net connection `conn` broken (its peer closed, failed or died). */
int tp_net_peer_closed(const tp_conn_t *conn);
/* Message connections, for gpu_net: a net connection without staging slots whose owner sends and receives
 * whole messages from its own registered memory (the network's calls, with a net connection's setup,
 * failure handling and quiet close). Setup: tp_net_msg_listen / tp_net_msg_connect, then tp_net_ops.accept;
 * close and fail as any net connection. A sender's connection comes up in the background: tp_net_msg_ready
 * says when. Registrations are undone when the connection fails or closes. Sizes of tp_net_msg_test: -1 when
 * the network left them unset. A request NULL after send/recv means the network takes no more now. */
ncclResult_t tp_net_msg_listen(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p);
ncclResult_t tp_net_msg_connect(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p);
/* The properties of the network device the connection uses. */
const np_props_t *tp_net_msg_props(const tp_conn_t *conn);
ncclResult_t tp_net_msg_ready(tp_conn_t *conn, int *ready_p);
/* Registers memory of NCCL_PTR_HOST or NCCL_PTR_CUDA `type` (at most 4 registrations per connection). */
ncclResult_t tp_net_msg_reg(tp_conn_t *conn, void *base, size_t bytes, int type, void **mhandle_p);
ncclResult_t tp_net_msg_send(tp_conn_t *conn, void *data, size_t size, int tag, void *mhandle, void **req_p);
ncclResult_t tp_net_msg_recv(tp_conn_t *conn, void *data, size_t size, int tag, void *mhandle, void **req_p);
/* Makes a receive into GPU memory visible to the GPU; *req_p NULL: nothing to wait for. */
ncclResult_t tp_net_msg_flush(tp_conn_t *conn, void *data, size_t size, void *mhandle, void **req_p);
ncclResult_t tp_net_msg_test(tp_conn_t *conn, void *req, int *done_p, int *size_p);

#endif
