/*
 * The root service (private to src/bootstrap): one thread per process serves the roots of every unique id
 * the process made, on as few listening sockets as their addresses need (one for all ids made by
 * ncclGetUniqueId; one per NCCL_COMM_ID address). A hello names its id by the id's nonce.
 *
 * For each id it collects one hello per rank of the id's block (ranks r with r * nid / nranks == the id's
 * index), learns from the next id's root the first address of the next block, answers each rank with its
 * ring successor's address, and forgets the id. A rank that never arrives turns into an error reply naming
 * it, sent to every rank that did. Memory and work grow with the hellos that arrive, never with the rank
 * count a hello claims.
 *
 * The thread starts with the first id and ends when no id is left (or at exit); an id never used costs a
 * small record, at most ROOT_MAX_IDS of them. A child process after fork serves nothing of its parent's.
 */
#ifndef BRAID_BOOTSTRAP_ROOT_H
#define BRAID_BOOTSTRAP_ROOT_H

#include <stdint.h>

#include "nccl.h"
#include "base/socket.h"

/* Ids a process may have waiting for their ranks at once. */
#define ROOT_MAX_IDS 4096

/* Serves the id of `nonce` at `bind` (NULL: the address all ids of this process share, on the interface
 * NCCL_SOCKET_IFNAME selects); writes where its ranks must connect. */
ncclResult_t root_serve(const sock_addr_t *bind, uint64_t nonce, sock_addr_t *addr_p);
/* Ids being served now (for tests and diagnostics). */
int root_ids_served(void);

#endif
