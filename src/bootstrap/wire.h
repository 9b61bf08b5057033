/*
 * The bootstrap's wire formats and the constants its parts share (private to src/bootstrap; the tests read
 * it to play a stranger or a broken rank).
 *
 * Structs are sent in host byte order: every rank of a job runs on the same architecture. Every message
 * starts with BOOT_MAGIC and the nonce of the id it belongs to; a connection whose first message does not
 * match is dropped.
 */
#ifndef BRAID_BOOTSTRAP_WIRE_H
#define BRAID_BOOTSTRAP_WIRE_H

#include <stdint.h>

#include "nccl.h"
#include "base/socket.h"

/* First word of the id and of every message ("BRAIDBOT" in memory on little-endian hosts). */
#define BOOT_MAGIC 0x544f424449415242ull
#define ID_VERSION 1u
/* Flag of an id made from NCCL_COMM_ID: no root runs yet; the first rank of the id's block starts it. */
#define ID_ROOT_BY_RANK0 1u
/* Longest wait of one poll() before the abort flag and the deadline are checked again. */
#define SLICE_MS 100
/* Seconds a fresh connection has to deliver its first message (sent right after connect). */
#define HELLO_TIMEOUT_S 5
/* Connections still owing their first message that one listener keeps: from one host, and in all. Beyond
 * the first, a host's new connections are closed at once; beyond the second, new ones wait in the backlog. */
#define GATE_PER_HOST 64
#define GATE_TOTAL    512
/* Largest tagged message accepted from the wire. */
#define MAX_MSG_BYTES (1ull << 30)

/* The contents of an ncclUniqueId. */
typedef struct {
  uint64_t checksum; /* hash_bytes of all 128 id bytes with this field zero */
  uint64_t magic;    /* BOOT_MAGIC */
  uint32_t version;  /* ID_VERSION */
  uint32_t flags;    /* ID_ROOT_BY_RANK0 or 0 */
  uint64_t nonce;    /* random, or derived from NCCL_COMM_ID and BRAID_COMM_SECRET; never 0 */
  sock_addr_t root;  /* where the root listens */
} id_body_t;
_Static_assert(sizeof(id_body_t) <= NCCL_UNIQUE_ID_BYTES, "the id body must fit in ncclUniqueId");

/* Message types. */
enum { MSG_HELLO = 1, MSG_LINK = 2, MSG_REPLY = 3, MSG_RING = 4, MSG_P2P = 5, MSG_NOTICE = 6 };

/* A rank's hello to its root (MSG_HELLO), or a root's message to the previous id's root (MSG_LINK). */
typedef struct {
  uint64_t magic;        /* BOOT_MAGIC */
  uint64_t nonce;        /* nonce of the receiving root's id */
  uint32_t type;         /* MSG_HELLO or MSG_LINK */
  int32_t rank;          /* hello: the sender's rank; link: the first rank of the sender's block */
  int32_t nranks;        /* ranks in the communicator */
  int32_t nid;           /* ids in the communicator */
  int32_t index;         /* hello: index of the id the rank joins; link: index of the sending root's id */
  uint32_t pad;          /* zero */
  uint64_t prev_nonce;   /* hello: nonce of the id before (index - 1 mod nid) */
  sock_addr_t addr;      /* hello: the rank's listening address; link: the sender's first rank's address */
  sock_addr_t prev_root; /* hello: root address of the id before */
} root_msg_t;

/* A root's answer to one rank. */
typedef struct {
  uint64_t magic;   /* BOOT_MAGIC */
  uint64_t nonce;   /* the root's id nonce */
  uint32_t type;    /* MSG_REPLY */
  int32_t status;   /* 0: ok; otherwise `error` says why init fails */
  sock_addr_t succ; /* listening address of the rank's ring successor */
  char error[320];  /* NUL-terminated reason when status != 0 */
} reply_t;

/* First message on every rank-to-rank connection. */
typedef struct {
  uint64_t magic; /* BOOT_MAGIC */
  uint64_t nonce; /* the communicator's nonce */
  uint32_t type;  /* MSG_RING or MSG_P2P */
  int32_t rank;   /* the connecting rank */
} conn_hello_t;

/* Header of one tagged message. */
typedef struct {
  uint32_t tag;  /* the sender's tag */
  uint32_t pad;  /* zero */
  uint64_t size; /* payload bytes that follow */
} msg_header_t;

/* Why a rank's bootstrap fails, sent against the ring's direction (a ring connection's receiver writes it to
 * the sender; nothing else travels that way) so that it reaches every rank in turn. */
typedef struct {
  uint64_t magic;   /* BOOT_MAGIC */
  uint64_t nonce;   /* the communicator's nonce */
  uint32_t type;    /* MSG_NOTICE */
  int32_t culprit;  /* the rank that is gone or failed */
  int32_t reporter; /* the rank that saw it */
  int32_t pad;      /* zero */
  char why[256];    /* NUL-terminated: what the reporter saw */
} notice_t;

/* Decodes an id's bytes (no checks: boot_check_id makes them). */
void id_decode(const ncclUniqueId *id, id_body_t *body);
/* The nonce of the id every rank makes from NCCL_COMM_ID=comm_id (and BRAID_COMM_SECRET). */
uint64_t boot_comm_id_nonce(const char *comm_id);

#endif
