/*
 * Connections between two ranks of a communicator, one per (peer, direction), each behind an ops table.
 *
 * Host backend transports: shm (a byte ring in POSIX shared memory, for ranks of one machine) and net (a
 * connection of a network per connection, between machines or when shm is disabled: Braid's built-in TCP or a
 * network plugin, see net_plugin.h).
 *
 * GPU transports give each end of a connection `nch` rings (device/dev.h) that the kernels read and write
 * themselves; their ops tables have no data-path functions. p2p puts the receiver's rings in its GPU memory
 * (mapped by the sender: a plain pointer within a process, an exported cuMem allocation or legacy CUDA IPC
 * between processes); gpu_shm puts them in POSIX shared memory mapped into both GPUs; gpu_net gives each end
 * host rings and a proxy thread moves slots between them over one TCP connection per ring.
 *
 * A connection is made in three phases so that one thread can connect several communicators at once without
 * deadlock: the receiver `listen`s (making the endpoint and a blob of connect information), the blob travels
 * to the sender over the bootstrap, the sender `connect`s with it, and the receiver `accept`s.
 *
 * The data path is a byte stream and never blocks: the sender asks for writable room (send_peek), fills it
 * and commits; the receiver asks for readable bytes (recv_peek), consumes them and releases. A peek may
 * return 0 bytes; the caller polls. A dead or failed peer makes a peek return ncclRemoteError, with a message
 * naming the peer. Only the rank's one executing thread touches a connection's data path.
 */
#ifndef BRAID_TRANSPORT_TRANSPORT_H
#define BRAID_TRANSPORT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl.h"
#include "base/alloc.h"
#include "device/dev.h"

/* Bytes of connect information a transport may put in its blob: enough for gpu_net's, which carries a
 * network handle (128 bytes at most) for each of up to DEV_MAX_CHANNELS rings. */
#define TP_BLOB_BYTES (256 + DEV_MAX_CHANNELS * 128)

/* What the transports know about each rank: gathered over the bootstrap at init. */
typedef struct {
  uint64_t host_hash; /* equal on ranks of one machine */
  int32_t pid;
  int32_t dev;         /* device index, -1 on the host backend */
  uint64_t ring_bytes; /* the staging ring size this rank uses; must be the same on all ranks */
  int32_t nch;         /* GPU rings per connection this rank's device can run (0 on the host backend) */
  int32_t sms;         /* its device's multiprocessors (0 on the host backend) */
} tp_peer_t;

/* A communicator's transport context (opaque); holds the net transport's listening socket. */
typedef struct tp_ctx tp_ctx_t;

/* One end of a connection; each transport extends it privately. */
typedef struct tp_conn {
  const struct tp_ops *ops;
  int peer;           /* the rank at the other end */
  int is_send;        /* 1: this end sends */
  alloc_acct_t *acct; /* where its memory is charged (the communicator's account) */
  size_t charged;     /* host bytes charged for it, released at close */
  size_t charged_dev; /* device bytes charged for it, released at close */
  dev_ring_t *rings;  /* GPU transports: `nrings` rings as this rank's kernel uses them (host array) */
  int nrings;         /* 0 on host transports */
  dev_ring_t ll[DEV_LL_CHANNELS]; /* GPU transports: its LL rings (device/dev.h); data NULL: none */
} tp_conn_t;

/* Checks that `peer` is another rank of the context and fills the generic part of a new connection. */
ncclResult_t tp_conn_init(const tp_ctx_t *ctx, const struct tp_ops *ops, int peer, int is_send,
                          tp_conn_t *conn);
/* Charges a connection's staging memory to its account (and logs it under ALLOC). */
void tp_charge(tp_conn_t *conn, size_t bytes, const char *what);
/* Charges a connection's device memory to its account. */
void tp_charge_dev(tp_conn_t *conn, size_t bytes, const char *what);
/* Releases what tp_charge and tp_charge_dev charged. */
void tp_uncharge(tp_conn_t *conn);
/* GPU transports: checks that the context is a GPU one with 1 to DEV_MAX_CHANNELS rings per connection. */
ncclResult_t tp_check_gpu_config(const tp_ctx_t *ctx, const char *transport, int peer);
/* GPU transports: points conn->rings at `nch` rings laid out back to back from `base` (ring c at
 * base + c * DEV_RING_BYTES: its dev_ctrl_t, then its slots), in a host array charged to the connection. */
ncclResult_t tp_conn_set_rings(tp_conn_t *conn, int nch, char *base);
/* Like tp_conn_set_rings, with control blocks and slots apart: ring c's dev_ctrl_t at ctrl + c * ctrl_stride,
 * its slots at data + c * data_stride (device addresses both). */
ncclResult_t tp_conn_set_rings_apart(tp_conn_t *conn, int nch, char *ctrl, size_t ctrl_stride, char *data,
                                     size_t data_stride);
/* GPU transports whose sender maps the receiver's memory: points conn->ll at the DEV_LL_CHANNELS LL rings
 * laid out back to back from `base` (ring c at base + c * DEV_LL_RING_BYTES: its dev_ctrl_t, then
 * DEV_LL_SLOTS slots; zeroed by the receiver). */
void tp_conn_set_ll(tp_conn_t *conn, char *base);
/* GPU transports whose sender maps the receiver's memory: gives the rings of tp_conn_set_rings their chunk
 * marks (device/dev.h), DEV_MARKS_BYTES each, laid out back to back from `base` (zeroed by the receiver). */
void tp_conn_set_marks(tp_conn_t *conn, char *base);
/* Frees the array of tp_conn_set_rings. */
void tp_conn_free_rings(tp_conn_t *conn);
/* GPU transports, sending end: logs once per connection which transport carries it, in NCCL's style
 * ("Channel 00-03 : 0[0] -> 1[1] via P2P/IPC"). */
void tp_log_route(const tp_ctx_t *ctx, const tp_conn_t *conn, uint64_t subsys, const char *via);

typedef struct tp_ops {
  const char *name;
  /* Receiver: makes the endpoint and writes the blob the sender needs. */
  ncclResult_t (*listen)(tp_ctx_t *ctx, int peer, void *blob, tp_conn_t **conn_p);
  /* Sender: attaches to the receiver's endpoint described by blob. */
  ncclResult_t (*connect)(tp_ctx_t *ctx, int peer, const void *blob, tp_conn_t **conn_p);
  /* Receiver: completes the connection once the sender has connected (waits, bounded). */
  ncclResult_t (*accept)(tp_ctx_t *ctx, tp_conn_t *conn);
  /* The data path: host transports only (NULL in GPU transports, whose kernels move the data). */
  /* Sender: a writable contiguous region (*bytes_p may be 0 when the ring is full). */
  ncclResult_t (*send_peek)(tp_conn_t *conn, void **ptr_p, size_t *bytes_p);
  /* Sender: publishes the first `bytes` of the region from the last send_peek. */
  ncclResult_t (*send_commit)(tp_conn_t *conn, size_t bytes);
  /* Sender: pushes out committed bytes still held locally; *done_p = 1 once none are left. */
  ncclResult_t (*flush)(tp_conn_t *conn, int *done_p);
  /* Receiver: a readable contiguous region (*bytes_p may be 0 when nothing arrived). */
  ncclResult_t (*recv_peek)(tp_conn_t *conn, void **ptr_p, size_t *bytes_p);
  /* Receiver: frees the first `bytes` of the region from the last recv_peek. */
  ncclResult_t (*recv_release)(tp_conn_t *conn, size_t bytes);
  /* Tells the peer that this side failed, so that its waits end with an error instead of a timeout. */
  void (*fail)(tp_conn_t *conn);
  /* Frees the connection. */
  void (*close)(tp_conn_t *conn);
  /* optional: the transport's state for the whole context, made by tp_init and freed by tp_destroy */
  ncclResult_t (*ctx_init)(const tp_ctx_t *ctx, void **state_p);
  void (*ctx_free)(void *state);
} tp_ops_t;

/* What a communicator gives its transport context. This rank's CUDA device is its peer-table entry's
 * (peers[rank].dev, -1 on the host backend: host byte-ring connections). */
typedef struct {
  int rank, nranks;
  uint64_t nonce;         /* the communicator's id, carried in every handshake */
  const tp_peer_t *peers; /* nranks entries; copied */
  const volatile int *abort_flag;
  size_t ring_bytes;    /* staging ring size per connection (BRAID_HOST_BUFFSIZE) */
  int nch;              /* GPU connections: rings per connection (the same on all ranks) */
  alloc_acct_t *acct;   /* the communicator's memory account (may be NULL) */
  const char *net_name; /* network to use (the config's netName); NULL: NCCL_NET decides */
} tp_config_t;

/* Makes a transport context (chooses its network: net_plugin.h). */
ncclResult_t tp_init(const tp_config_t *config, tp_ctx_t **ctx_p);
/* The transport to use towards `peer`. Host backend: shm on the same host unless NCCL_SHM_DISABLE=1, else
 * net. GPU: p2p on the same host when the devices can map each other's memory and NCCL_P2P_DISABLE is 0,
 * else gpu_shm on the same host unless NCCL_SHM_DISABLE=1, else gpu_net. Both ends choose the same. */
const tp_ops_t *tp_select(const tp_ctx_t *ctx, int peer);
/* The kind of link tp_select picks towards `peer`, slowest last: peer memory (p2p), host shared memory, the
 * network. What the layers above ask instead of naming a transport's ops table. */
typedef enum { TP_LINK_P2P, TP_LINK_SHM, TP_LINK_NET } tp_link_t;
tp_link_t tp_link(const tp_ctx_t *ctx, int peer);
/* Frees the context (connections must be closed first). */
void tp_destroy(tp_ctx_t *ctx);
/* This rank's CUDA device (its peer-table entry's), -1 on the host backend. */
int tp_ctx_dev(const tp_ctx_t *ctx);
/* The context's copy of its configuration (ring_bytes already defaulted); for the transports. */
const tp_config_t *tp_ctx_config(const tp_ctx_t *ctx);
/* The net transport's state in the context (its tp_ops_t.ctx_init made it). */
struct tp_net_ctx;
struct tp_net_ctx *tp_ctx_net(tp_ctx_t *ctx);

extern const tp_ops_t tp_shm_ops;
extern const tp_ops_t tp_net_ops;
extern const tp_ops_t tp_p2p_ops;
extern const tp_ops_t tp_gpu_shm_ops;
extern const tp_ops_t tp_gpu_net_ops;

#endif
