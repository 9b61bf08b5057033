/*
 * The out-of-band bootstrap over TCP: how ranks that share a unique id find each other, then exchange small
 * messages before and beside the data path.
 *
 * A unique id (128 bytes) names a root (an address where a thread of the id's creator listens) and a random
 * nonce that every message of the communicator carries. Each rank listens on its own socket, tells the root
 * where, and learns its ring neighbour; the full address table then goes round the ring. After that any two
 * ranks exchange tagged messages directly. Every connection starts with a magic number, a message type and
 * the nonce, and is dropped when they do not match. Every wait is bounded and abort-aware.
 */
#ifndef BRAID_BOOTSTRAP_BOOTSTRAP_H
#define BRAID_BOOTSTRAP_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "base/socket.h"
#include "base/watchdog.h"

/* One rank's bootstrap state (opaque). */
typedef struct boot boot_t;

/* Makes a unique id and starts its root thread on this process. With NCCL_COMM_ID set, the id names that
 * address instead and no root is started here (rank 0 starts it in boot_init). */
ncclResult_t boot_get_unique_id(ncclUniqueId *id_p);
/* Makes a unique id with a root thread on this process, whatever NCCL_COMM_ID says (ncclCommSplit). */
ncclResult_t boot_new_unique_id(ncclUniqueId *id_p);
/* Starts a root thread listening at `addr` for an id (used for NCCL_COMM_ID by rank 0). */
ncclResult_t boot_start_root(const sock_addr_t *addr, uint64_t nonce);
/* Checks an id's magic and contents; a corrupt id is ncclInvalidArgument with the reason. */
ncclResult_t boot_check_id(const ncclUniqueId *id);
/* The id's nonce (a hash of the communicator, the same on all ranks). */
uint64_t boot_id_nonce(const ncclUniqueId *id);

/* Joins the bootstrap as `rank` of `nranks`, with nid ids (ncclCommInitRankScalable; rank r uses the root
 * of id r * nid / nranks). Waits for every rank to arrive, up to BRAID_BOOTSTRAP_TIMEOUT_S; a rank that never
 * arrives fails init on every rank with a message naming it. `abort_flag` (may be NULL) stops the wait. */
ncclResult_t boot_init(const ncclUniqueId *ids, int nid, int rank, int nranks, const volatile int *abort_flag,
                       boot_t **boot_p);
/* Ring allgather: `data` holds nranks blocks of `size` bytes; block `rank` is this rank's contribution. */
ncclResult_t boot_allgather(boot_t *boot, void *data, size_t size);
/* Tagged messages between any two ranks; a send never waits for the receiver to call recv. Messages of one
 * (peer, tag) arrive in order. The receive size must equal the send size. */
ncclResult_t boot_send(boot_t *boot, int peer, uint32_t tag, const void *data, size_t size);
ncclResult_t boot_recv(boot_t *boot, int peer, uint32_t tag, void *data, size_t size);
/* A tag whose messages replace the same sender's earlier ones still queued (status reports: at most one per
 * sender is kept however many come). */
#define BOOT_TAG_STATUS 0xffff5354u
/* A tagged message sent at once or never: it waits at most a second (to connect, or for room), and sends
 * nothing to a peer whose connection closed. For reports made while something else waits. */
ncclResult_t boot_post(boot_t *boot, int peer, uint32_t tag, const void *data, size_t size);
/* Takes, without waiting, the queued message with `tag` of each peer that sent one: data holds nranks blocks
 * of `size` bytes, have[r] says whether block r was filled. */
ncclResult_t boot_poll_all(boot_t *boot, uint32_t tag, void *data, size_t size, int *have);
/* The watchdog that the bootstrap's waits publish themselves to and report stalls through (may be NULL). */
void boot_set_watchdog(boot_t *boot, wd_t *wd);
/* Returns once every rank has called it. */
ncclResult_t boot_barrier(boot_t *boot);
/* This rank's listening address (for diagnostics). */
const sock_addr_t *boot_addr(const boot_t *boot, int rank);
/* Closes all sockets and frees the state. */
void boot_close(boot_t *boot);

#endif
