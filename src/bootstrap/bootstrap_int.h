/*
 * One rank's bootstrap state and the functions its two halves share (private to src/bootstrap):
 * bootstrap.c joins the ranks and runs the ring; msg.c carries tagged messages and runs the progress
 * engine that every wait goes through.
 */
#ifndef BRAID_BOOTSTRAP_BOOTSTRAP_INT_H
#define BRAID_BOOTSTRAP_BOOTSTRAP_INT_H

#include <poll.h>
#include <pthread.h>
#include <stdint.h>

#include "bootstrap.h"
#include "gate.h"
#include "wire.h"

/* A lock handed over in arrival order. boot_recv drops and retakes the lock between poll slices; with a plain
 * mutex the thread that drops it usually takes it back before a woken waiter runs, so another thread's
 * boot_send (perhaps the very message the receiver's peer waits for) could wait forever. */
typedef struct {
  pthread_mutex_t mu;  /* guards the two counters */
  pthread_cond_t turn; /* signalled whenever `serving` moves on */
  uint64_t next;       /* ticket of the next thread to ask */
  uint64_t serving;    /* ticket of the thread that holds the lock */
} fair_lock_t;

void fair_lock(fair_lock_t *l);
void fair_unlock(fair_lock_t *l);

/* A received tagged message waiting for boot_recv. */
typedef struct msg {
  struct msg *next; /* next queued message, in arrival order */
  int peer;         /* sender */
  uint32_t tag;     /* its tag */
  size_t size;      /* payload bytes */
  char data[];      /* payload */
} msg_t;

/* A message being read from one peer. */
typedef struct {
  msg_header_t hdr; /* its header */
  size_t hdr_got;   /* header bytes read so far */
  msg_t *msg;       /* the message, once the header is complete */
  size_t got;       /* payload bytes read so far */
} rx_t;

struct boot {
  int rank;                       /* this rank */
  int nranks;                     /* ranks in the communicator */
  uint64_t nonce;                 /* communicator nonce (id 0's), checked on every connection */
  const volatile int *abort_flag; /* raised by another thread to stop every wait (may be NULL) */
  int listen_fd;                  /* where peers connect */
  sock_addr_t *addrs;             /* nranks listening addresses */
  int ring_send_fd;               /* connection to the ring successor (-1 with one rank) */
  int ring_recv_fd;               /* connection from the ring predecessor (-1 with one rank) */
  int fds_ready;                  /* send_fds and recv_fds hold descriptors or -1 (all arrays allocated) */
  /* Everything below is read and written only with `lock` held: it orders one thread's use of the sockets
   * and the queue before the next thread's, in the order the threads asked. */
  fair_lock_t lock;
  int *send_fds;       /* nranks outgoing tagged connections, -1 until first use */
  int *recv_fds;       /* nranks incoming tagged connections, -1 until the peer connects or after EOF */
  rx_t *rx;            /* nranks messages being read */
  double *closed_at;   /* nranks times when the peer was seen closing (0: not closed) */
  double succ_closed;  /* when the ring successor was seen closing (0: not) */
  gate_t gate;         /* incoming connections owing their hello */
  struct pollfd *pfds; /* poll entries, reused by progress */
  int pfds_cap;        /* their room */
  msg_t *queue;        /* received messages not yet asked for, oldest first */
  msg_t **queue_tail;  /* where the next message is linked */
  notice_t notice;     /* the notice being read from the successor (against the ring) */
  size_t notice_got;   /* its bytes read so far */
  char failed[320];    /* why this bootstrap failed because of another rank ("" while it has not) */
  int culprit;         /* that rank (when `failed` is set) */
  int notice_out;      /* 1: a notice waits for the ring predecessor to connect; 2: sent */
  int poll_now;        /* the next progress round does not wait (boot_poll_all) */
  int addrs_known;     /* the address table is complete (init's allgather is done) */
  wd_t *wd;            /* the communicator's watchdog, or NULL */
  notice_t pending;    /* that notice */
};

/* Checks the abort flag, a failure others reported and the deadline before a wait; returns the slice. */
ncclResult_t boot_slice(boot_t *b, double deadline, const char *doing, int *slice_p);
/* One round of the progress engine: waits up to one slice for `extra` (the caller's own fds, whose revents
 * it reads afterwards), new connections, hellos, incoming messages, notices from the ring successor, and
 * peers closing our outgoing connections. `doing` names the wait; NULL: the last rounds of a failed init,
 * which a recorded failure does not end. */
ncclResult_t boot_progress(boot_t *b, struct pollfd *extra, int nextra, double deadline, const char *doing);
/* Fails a wait because rank `culprit` is gone (or failed): tells the ring, then returns the error. */
ncclResult_t boot_gone(boot_t *b, int culprit, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Like boot_gone for a neighbour seen leaving, which may have left because another rank is gone: waits a
 * moment for a notice naming that rank, and fails with it if one comes. */
ncclResult_t boot_blame(boot_t *b, int suspect, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Tag of the notices a rank that saw another leave sends every rank directly once addresses are known. */
#define BOOT_TAG_NOTICE 0xffff4e54u
/* Tells the ring that this rank's bootstrap failed for a reason of its own (`why`). */
void boot_notify_failure(boot_t *b, const char *why);
/* Frees the queue of received messages. */
void boot_free_queue(boot_t *b);
/* Opens a connection to `peer` and introduces ourselves (MSG_RING or MSG_P2P). */
ncclResult_t boot_connect_peer(boot_t *b, int peer, uint32_t type, const sock_addr_t *addr, double deadline,
                               int *fd_p);

#endif
