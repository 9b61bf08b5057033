/*
 * A communicator's connections to its peers: one per (peer, direction), made lazily when a plan first needs
 * them and kept for the communicator's life.
 *
 * Connections are made in three phases (listen, connect, accept: see transport.h) and a group runs each
 * phase for all of its communicators before the next, so one thread can connect several communicators that
 * are ranks of one another without deadlock. Which connections a plan needs follows from the plan alone,
 * so both ends of every connection decide to make it at the same call (DESIGN.md, principle 2).
 */
#ifndef BRAID_CORE_LINKS_H
#define BRAID_CORE_LINKS_H

#include <stdint.h>

#include "nccl.h"
#include "base/alloc.h"
#include "bootstrap/bootstrap.h"
#include "core/plan.h"
#include "transport/transport.h"

/* State of one direction of one peer's connection. */
enum { LINK_NONE = 0, LINK_LISTENING = 1, LINK_READY = 2 };

typedef struct {
  int rank, nranks;
  boot_t *boot;        /* the communicator's bootstrap (not owned) */
  tp_ctx_t *tp;        /* transport context (owned) */
  tp_conn_t **send;    /* [nranks] sending ends, NULL until made */
  tp_conn_t **recv;    /* [nranks] receiving ends, NULL until made */
  uint8_t *recv_state; /* [nranks] LINK_* of the receiving ends */
  uint32_t *mark_send; /* [nranks] engine scratch: round in which a sending end was last claimed */
  uint32_t *mark_recv; /* [nranks] likewise for receiving ends */
  alloc_acct_t *acct;  /* where allocations are charged */
} links_t;

/* Makes the links of a communicator (no connection yet). */
ncclResult_t links_init(boot_t *boot, const tp_config_t *config, alloc_acct_t *acct, links_t **links_p);
/* Phase 1: makes the receiving ends the plan needs and sends their blobs to the senders. */
ncclResult_t links_listen(links_t *links, const plan_t *plan);
/* Phase 2: makes the sending ends the plan needs, with the blobs their receivers sent. */
ncclResult_t links_connect(links_t *links, const plan_t *plan);
/* Phase 3: completes the receiving ends made in phase 1. */
ncclResult_t links_accept(links_t *links);
/* All three phases for every peer, in both directions (GPU communicators connect everything at init). The
 * calling thread must not also drive the peers' ranks (each rank of a process runs its init on its own
 * thread). */
ncclResult_t links_connect_all(links_t *links);
/* Tells every connected peer that this rank failed (their waits end with an error). */
void links_fail(links_t *links);
/* Closes every connection and frees the links. */
void links_destroy(links_t *links);

#endif
