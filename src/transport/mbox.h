/*
 * Mailboxes: a one-way ring of fixed-size messages from one rank to another, in memory both map (a shared
 * memory segment, shm_seg, between processes; this process's memory for a rank of the same process). A send
 * never waits: the caller bounds how far it runs ahead of the receiver (tp_mbox_send refuses a full ring). A
 * receive spins a few microseconds, then also yields and sleeps, and gives up on the abort flag, after
 * BRAID_TIMEOUT_S, or when a peer in another process of this pid namespace has exited. The sender's mapping
 * removes the segment's name, so nothing is left in /dev/shm once both hold it (shm_seg).
 *
 * Ordering: the sender writes a slot, then raises `tail` with a release store; the receiver reads `tail`
 * with an acquire load, copies the slot, then raises `head` with a release store, which the sender reads
 * (acquire) before it reuses a slot. Each counter has one writer.
 */
#ifndef BRAID_TRANSPORT_MBOX_H
#define BRAID_TRANSPORT_MBOX_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/transport.h"

typedef struct tp_mbox tp_mbox_t;

/* Where the receiver's ring is, for the sender to map: a segment's name, or an address in this process. */
typedef struct {
  char name[96];
  uint64_t at;
} tp_mbox_addr_t;

/* Who a receive waits for, and how it gives up. */
typedef struct {
  const char *comm; /* the communicator's name, for messages */
  int rank, peer;
  int peer_pid;                   /* a process of this pid namespace to check while waiting (0: none) */
  const volatile int *abort_flag; /* ends the wait (may be NULL) */
  const char *what;               /* what the messages are ("step message") */
} tp_mbox_wait_t;

/* The receiving side: a ring of `slots` messages of `bytes` from `peer` (in this process when `local`), and
 * where the sender finds it. */
ncclResult_t tp_mbox_create(const tp_ctx_t *ctx, int peer, int local, size_t bytes, int slots,
                            tp_mbox_t **inbox_p, tp_mbox_addr_t *addr_p);
/* The sending side: the peer's ring at `addr`. */
ncclResult_t tp_mbox_attach(const tp_mbox_addr_t *addr, int local, size_t bytes, int slots,
                            tp_mbox_t **outbox_p);
ncclResult_t tp_mbox_send(tp_mbox_t *outbox, const void *msg, const tp_mbox_wait_t *who);
ncclResult_t tp_mbox_recv(tp_mbox_t *inbox, void *msg, const tp_mbox_wait_t *who);
void tp_mbox_close(tp_mbox_t *m);

/* This process's pid namespace (its inode; 0: unknown): a peer's pid means something here only when the two
 * namespaces are one. */
uint64_t tp_pid_namespace(void);

#endif
