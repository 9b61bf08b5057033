/*
 * Surviving a lost rank, and changing a communicator's membership or footprint: revoke, shrink, grow,
 * suspend and resume, and the memory statistics.
 *
 * Revoke stops every pending and later operation: the abort flag ends this rank's waits, a failure signal on
 * every connection ends the waits of the peers (and, through them, of their peers), and the state refuses
 * new calls. The flag is lowered again once no thread works on the communicator, so that its bootstrap
 * still serves split and shrink.
 *
 * Shrink never talks to an excluded rank. The survivors agree through a fresh bootstrap among themselves: the
 * first survivor (the leader) makes a new unique id and sends it, with the parent's nonce, the shrink's
 * epoch and a digest of the exclusion list, to each survivor over the parent's direct bootstrap
 * connections; every survivor checks the digest against its own list and joins the new id's ring. A dead
 * survivor fails the connection at once; one that never comes fails the new ring's init after
 * BRAID_BOOTSTRAP_TIMEOUT_S on every survivor, naming it; an excluded rank, dead, hung or alive, is never
 * waited for.
 *
 * Grow: the existing ranks allgather, over the parent's bootstrap, which token the coordinator holds (from
 * ncclCommGetUniqueId) and the new size; new ranks join that token's ring with their own ranks.
 */
#ifndef BRAID_CORE_RECOVER_H
#define BRAID_CORE_RECOVER_H

#include <stdint.h>

#include "nccl.h"
#include "core/comm.h"

/* ncclCommRevoke (flags checked by the caller). */
ncclResult_t comm_revoke(ncclComm_t comm);
/* ncclCommShrink: the arguments were checked (excl holds n valid ranks, not this one). */
ncclResult_t comm_shrink(ncclComm_t parent, const int *excl, int n, const ncclConfig_t *config, int flags,
                         ncclComm_t *child_p);
/* ncclCommGetUniqueId. */
ncclResult_t comm_grow_id(ncclComm_t comm, ncclUniqueId *id_p);
/* ncclCommGrow on an existing rank; `id` is NULL except on the coordinator. */
ncclResult_t comm_grow(ncclComm_t parent, int nranks, const ncclUniqueId *id, const ncclConfig_t *config,
                       ncclComm_t *child_p);
/* ncclCommSuspend with NCCL_SUSPEND_MEM, and ncclCommResume. */
ncclResult_t comm_suspend(ncclComm_t comm);
ncclResult_t comm_resume(ncclComm_t comm);
/* ncclCommMemStats (stat checked by the caller). */
uint64_t comm_mem_stat(ncclComm_t comm, ncclCommMemStat_t stat);

#endif
