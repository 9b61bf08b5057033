/*
 * The net transport's context state and wire formats (private to src/transport/).
 *
 * Each transport context listens on one TCP socket. A receiver's listen hands out that address with a tag
 * unique within the context; the sender connects and sends a hello carrying the tag, so that the receiver's
 * accept can tell connections apart whatever order they arrive in.
 */
#ifndef BRAID_TRANSPORT_NET_H
#define BRAID_TRANSPORT_NET_H

#include <stdint.h>

#include "base/socket.h"
#include "transport/transport.h"

/* "BRDNETv1": first field of every hello. */
#define NET_HELLO_MAGIC 0x31764e54454e4452ull

/* The net state of a transport context: its listening socket and the hellos not yet claimed. */
typedef struct tp_net_ctx tp_net_ctx_t;

/* What the receiver sends the sender. */
typedef struct {
  sock_addr_t addr;      /* where the receiver's context listens */
  uint64_t nonce;        /* the communicator's nonce */
  int32_t receiver_rank; /* the receiver */
  uint32_t tag;          /* the receiver's listen, echoed in the hello */
} tp_net_blob_t;

_Static_assert(sizeof(tp_net_blob_t) <= TP_BLOB_BYTES, "the net blob fits in a transport blob");

/* The first bytes a sender writes on a new connection. */
typedef struct {
  uint64_t magic;        /* NET_HELLO_MAGIC */
  uint64_t nonce;        /* the communicator's nonce */
  int32_t sender_rank;   /* who connects */
  int32_t receiver_rank; /* whom the sender means to reach */
  uint32_t tag;          /* from the blob */
  uint32_t reserved;     /* zero */
} tp_net_hello_t;

_Static_assert(sizeof(tp_net_hello_t) == 32, "the hello is 32 bytes on the wire");

/* Opens the context's listening socket on the interface NCCL_SOCKET_IFNAME selects. `config` must outlive the
 * net state (it is the context's own copy). */
ncclResult_t tp_net_ctx_create(const tp_config_t *config, tp_net_ctx_t **net_p);
/* Closes the listening socket and any connection whose hello nobody claimed. */
void tp_net_ctx_destroy(tp_net_ctx_t *net);
/* Makes a close by the peer quiet on net connection `conn`: peeks and flushes still fail with
 * ncclRemoteError, but without logging it, and tp_net_peer_closed then says so. Other errors are reported
 * as usual. For the gpu_net proxy, which tells a normal end of a stream from an early one itself. */
void tp_net_quiet_close(tp_conn_t *conn);
/* Whether a read found that the peer closed net connection `conn`. */
int tp_net_peer_closed(const tp_conn_t *conn);
#endif
