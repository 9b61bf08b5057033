/*
 * The gpu_net transport's ring pumps and proxy thread (private to src/transport/; the tests reach them too).
 *
 * Each end of a gpu_net connection has `nch` rings (device/dev.h's layout) and one net message connection
 * (net.h) per ring, so that a ring waiting for its peer never holds the others up. A ring's slots live in
 * page-locked host memory, or in GPU memory when the network takes it (NCCL_PTR_CUDA); its control block is
 * always in host memory. Each slot travels as two messages straight from and into the ring: a header
 * (tp_gpu_net_hdr_t, from host memory, tag 0) and the slot's bytes (tag 1). A pump never blocks:
 *   - sending: each slot the kernel produced (ctrl->tail) goes out as its two messages; once the network has
 *     finished both, ctrl->head moves on so the kernel may reuse the slot;
 *   - receiving: while the ring has a free slot (tail - head < DEV_SLOTS), receives for its two messages are
 *     posted; once both arrived (and, in GPU memory, a flush made the bytes visible), ctrl->sizes[slot] and
 *     ctrl->tail are published.
 * At most `window` slots are under way per ring, so that their two requests each stay within the network's
 * request limit. The pumps see the control blocks through their host addresses and the slots only through
 * the network, so they run (and are tested) without a GPU. One proxy thread per process runs the pumps of
 * every registered ring.
 */
#ifndef BRAID_TRANSPORT_GPU_NET_H
#define BRAID_TRANSPORT_GPU_NET_H

#include <stdint.h>

#include "nccl.h"
#include "device/dev.h"
#include "transport/transport.h"

/* "BGNS": first field of every slot header. */
#define GPU_NET_HDR_MAGIC 0x534e4742u
/* "BGNE": first field of the goodbye, a header (and an empty slot message) that ends a ring's stream when its
 * sending end closes. A stream that ends without it is an error: its sender failed or died. */
#define GPU_NET_BYE_MAGIC 0x454e4742u

/* The first message of each slot. */
typedef struct {
  uint32_t magic; /* GPU_NET_HDR_MAGIC, or GPU_NET_BYE_MAGIC */
  uint32_t bytes; /* the slot's bytes, in the message that follows (at most DEV_SLOT_BYTES) */
  uint64_t seq;   /* the slot's number on its ring since the connection was made */
} tp_gpu_net_hdr_t;

_Static_assert(sizeof(tp_gpu_net_hdr_t) == 16, "the slot header is 16 bytes on the wire");

/* One ring and its pump's state. Only the pump (the proxy thread, once the ring is registered) writes it. */
typedef struct {
  dev_ctrl_t *ctrl;               /* the ring's control block (host address) */
  char *data;                     /* its DEV_SLOTS slots (the address the network is given) */
  int data_type;                  /* NCCL_PTR_HOST or NCCL_PTR_CUDA: where the slots are */
  tp_conn_t *net;                 /* its net message connection: a sending end on a sending ring */
  int is_send;                    /* 1: the kernel produces, the pump sends */
  int index;                      /* the ring's number within its connection, for messages */
  int rank, peer;                 /* this rank and the other end, for messages */
  const volatile int *abort_flag; /* the communicator's; nonzero: the proxy stops moving this ring */
  int window;                     /* slots under way at most */
  int ready;                      /* 1 once the connection is up and the ring's memory registered */
  void *mh_hdrs, *mh_data;        /* the registrations of hdrs and of the slots */
  uint64_t done;   /* slots finished: sent and released (head), or received and published (tail) */
  uint64_t posted; /* slots whose two messages are posted */
  void *reqs[DEV_SLOTS + 1][2]; /* each slot's header and bytes requests (NULL: not posted, or finished);
                                   the last pair is the goodbye's */
  int half[DEV_SLOTS + 1];      /* 1: the header of the slot is posted, its bytes not yet */
  int got[DEV_SLOTS];           /* receiving: the bytes the network reported for each slot (-1: none) */
  void *flush_req;              /* receiving, GPU memory: the flush of slot `done` under way */
  int flushed;                  /* receiving: slot `done` needs no more flushing */
  tp_gpu_net_hdr_t hdrs[DEV_SLOTS + 1]; /* the slots' headers; the last is the goodbye's */
  int closing;         /* sending: its connection closes; once all produced slots are out, say goodbye */
  int bye_posted;      /* sending: the goodbye's messages are posted */
  int closed;          /* the stream ended normally: goodbye sent (sending) or received (receiving) */
  int stopped;         /* its connection failed on this side: left alone, nothing more reported */
  ncclResult_t broken; /* the error that stopped the ring (reported once); ncclSuccess while it works */
} tp_gpu_net_ring_t;

/* Prepares a ring's pump; the ring's counters must be where the pump starts (0 for a new connection). `net`
 * is a net message connection (net.h); `data_type` says where the slots are. Puts the net connection in
 * quiet-close mode: the pump judges a closed stream itself (goodbye or not). */
void tp_gpu_net_ring_init(tp_gpu_net_ring_t *ring, dev_ctrl_t *ctrl, char *data, int data_type,
                          tp_conn_t *net, int index, int rank, const volatile int *abort_flag);
/* Moves what can move now without waiting; *progress_p is set to 1 when anything moved. An error is
 * reported once (naming the peer and the ring), fails the ring's net connection so that the peer hears of
 * it, and is returned again by every later call. */
ncclResult_t tp_gpu_net_pump(tp_gpu_net_ring_t *ring, int *progress_p);

/* Whether a ring needs its pump no more before it is closed: a sending ring once the network finished its
 * goodbye (after everything the kernel produced) or it broke or stopped or its communicator aborts; a
 * receiving ring always. */
int tp_gpu_net_drained(const tp_gpu_net_ring_t *ring);

/* Hands `n` rings to the process's proxy thread, starting it when it is not running. */
ncclResult_t tp_gpu_net_proxy_add(tp_gpu_net_ring_t *rings, int n);
/* Takes `n` rings back. Sending rings are closed first (`closing`), and the proxy goes on until they are
 * drained, for at most `drain_s` seconds. Returns once the proxy no longer touches them; the proxy thread
 * ends with the last ring. */
void tp_gpu_net_proxy_remove(tp_gpu_net_ring_t *rings, int n, double drain_s);
/* Stops the proxy moving `n` rings, whose connection failed on this side; nothing more is reported on them.
 */
void tp_gpu_net_proxy_stop(tp_gpu_net_ring_t *rings, int n);

#endif
