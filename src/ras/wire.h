/*
 * What the monitor knows and carries between processes: a process's identity, a snapshot of each of its
 * communicators, and the messages of the peer mesh, with their encoding.
 *
 * Every message is a 12-byte frame header (magic, version, type, payload length) and a payload of
 * little-endian fields. The decoder trusts nothing: every count, index, length and enum is checked against
 * the bytes present and the limits below, strings are cut to their field and made printable, and a message
 * that does not decode is refused whole (the caller drops the connection). It is fuzzed
 * (tests/ras/fuzz_wire.c).
 */
#ifndef BRAID_RAS_WIRE_H
#define BRAID_RAS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "base/socket.h"

#define WIRE_MAGIC       0x53415242u /* "BRAS" */
#define WIRE_VERSION     1
#define WIRE_HEADER      12
#define WIRE_MAX_PAYLOAD (4u << 20) /* a larger frame is refused */
#define RAS_HOST_MAX     64         /* host names, NUL included */
#define RAS_NAME_MAX     64         /* communicator names, NUL included */
#define RAS_MAX_RANKS    (1 << 24)
#define RAS_MAX_RECS     65536 /* communicators one process reports */

/* Call kinds, in the order of the core's op_kind_t (the core checks that they match). */
enum {
  RAS_OP_ALLREDUCE,
  RAS_OP_BROADCAST,
  RAS_OP_REDUCE,
  RAS_OP_ALLGATHER,
  RAS_OP_REDUCESCATTER,
  RAS_OP_ALLTOALL,
  RAS_OP_GATHER,
  RAS_OP_SCATTER,
  RAS_OP_SEND,
  RAS_OP_RECV,
  RAS_OPS
};
/* "AllReduce", ...; "?" for a kind out of range. */
const char *ras_op_name(int kind);

/* A communicator's life as the monitor shows it. */
typedef enum { RAS_ST_INIT, RAS_ST_RUNNING, RAS_ST_FINALIZED, RAS_ST_FAILED, RAS_ST_ABORTED } ras_state_t;

/* One process of the job: where its monitor listens (the key), and what it runs on. */
typedef struct {
  sock_addr_t addr;        /* the monitor's mesh address */
  int32_t pid;             /* process id */
  uint64_t devs;           /* CUDA devices its communicators use (bit d for device d) */
  uint64_t host_hash;      /* equal on processes of one host */
  char host[RAS_HOST_MAX]; /* host name */
} ras_peer_t;

/* What a rank waits for now (kind -1: idle). */
typedef struct {
  int32_t kind;       /* RAS_OP_* of the call, -1 when idle */
  int32_t peer;       /* rank waited for, -1 when unknown */
  int32_t channel;    /* ring, -1 when not known (host backend) */
  int32_t step;       /* step of the call, from 0 */
  int32_t is_send;    /* 1: waits for room to send; 0: for data to receive */
  uint64_t seq;       /* the call's sequence number */
  uint64_t bytes;     /* the call's size (its count times its type's size) */
  uint64_t done;      /* bytes of the transfer waited on that moved */
  uint64_t waited_ms; /* how long it has waited (since the call began, or since its last progress) */
} ras_wait_t;

/* One rank of one communicator as its process reports it. */
typedef struct {
  uint64_t nonce;                  /* the communicator (the same on all its ranks) */
  uint64_t root_host;              /* rank 0's host hash (0 until init completes) */
  int32_t root_pid;                /* rank 0's pid (0 until init completes) */
  int32_t rank, nranks, dev;       /* dev -1: the host backend */
  int32_t state;                   /* ras_state_t */
  int32_t init_state, async_error; /* ncclResult_t */
  uint64_t counts[RAS_OPS][2];     /* calls launched: [kind][0] eager, [kind][1] captured in CUDA graphs */
  uint64_t launched; /* calls launched on the communicator (the last one's sequence number + 1) */
  uint64_t colls;    /* collectives launched (every kind but send and receive: the same count
                      * on every rank of a communicator that keeps up) */
  ras_wait_t now;    /* what the rank waits for */
  uint64_t host_bytes, dev_bytes; /* memory charged to the communicator now */
  uint64_t peak_bytes;            /* highest total seen */
  char name[RAS_NAME_MAX];        /* the communicator's name in messages */
} ras_rec_t;

/* A process and its communicators. */
typedef struct {
  ras_peer_t id;
  uint32_t nrecs;
  ras_rec_t *recs;
} ras_proc_t;

/* Message types of the peer mesh. */
typedef enum {
  WIRE_HELLO = 1,     /* first on a connection: the job proof and the sender's identity */
  WIRE_KEEPALIVE = 2, /* every interval: the sender's brief snapshot */
  WIRE_REQUEST = 3,   /* asks for a full snapshot (a status query) */
  WIRE_REPLY = 4,     /* the full snapshot, answering a request */
  WIRE_BYE = 5,       /* the sender exits: it left, it did not die */
} wire_type_t;

/* A decoded message. Snapshots own `proc.recs` (free with wire_msg_free). */
typedef struct {
  wire_type_t type;
  uint64_t job;    /* HELLO: a communicator nonce both ends know (the proof of belonging to the job) */
  uint64_t id;     /* REQUEST, REPLY: the query's id */
  ras_proc_t proc; /* HELLO: id only; KEEPALIVE, REPLY: the snapshot */
} wire_msg_t;

/* A growable byte buffer. */
typedef struct {
  char *data;
  size_t len, cap;
  int failed; /* an allocation failed: the content is incomplete */
} wire_buf_t;

void wire_buf_free(wire_buf_t *b);

/* Appends one whole message (frame header and payload) to `b`. `brief` snapshots leave out counts, memory
 * and names (keep-alives). */
void wire_put_hello(wire_buf_t *b, uint64_t job, const ras_peer_t *self);
void wire_put_snapshot(wire_buf_t *b, wire_type_t type, uint64_t id, const ras_proc_t *proc, int brief);
void wire_put_request(wire_buf_t *b, uint64_t id);
void wire_put_bye(wire_buf_t *b);

/* Reads a frame header: 1 and the payload length when `hdr` (WIRE_HEADER bytes) is valid, 0 otherwise. */
int wire_frame(const void *hdr, uint32_t *len_p);
/* Decodes one payload of a frame whose header was `hdr`. Returns 0 and fills *msg, or -1 when the message is
 * malformed (nothing to free then). */
int wire_decode(const void *hdr, const void *payload, size_t len, wire_msg_t *msg);
void wire_msg_free(wire_msg_t *msg);

/* Whether two mesh addresses are the same. */
int wire_addr_eq(const sock_addr_t *a, const sock_addr_t *b);

#endif
