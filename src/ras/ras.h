/*
 * Monitoring (RAS): what the core tells the monitor, and the job-wide stall verdict it gets back.
 *
 * Every process runs one monitor thread, started with its first communicator (unless NCCL_RAS_ENABLE=0). The
 * monitors of a job form a mesh over TCP (addresses exchanged in each communicator's init allgather), send
 * keep-alives that carry a brief snapshot of their communicators, declare dead a process whose connections
 * close (or that stays silent past the timeout), and answer NCCL's RAS clients on NCCL_RAS_ADDR (mesh.h).
 *
 * The core never waits for the monitor and the monitor never reads a communicator's structures. Each
 * communicator owns a record here (ras_comm_t), made when its init starts, in which the core stores what the
 * monitor may show:
 *   - at init, before the allgather: ras_comm_join (the record appears in state INIT, with only what is known
 *     then); after it, ras_comm_peers with every rank's identity (the table is published with a release store
 *     and read with an acquire load, so a reader sees either no table or a complete one); ras_comm_ready once
 *     init is complete (state RUNNING);
 *   - on the hot path, with relaxed atomics (one writer: the thread running the communicator's calls):
 *     ras_comm_launch per call, ras_comm_wait / ras_comm_idle as the executor starts or leaves a wait;
 *   - its explicit states: ras_comm_error, ras_comm_finalized, ras_comm_aborting, and ras_comm_retire on
 *     destroy, after which the record is gone (the registry lock orders retire against every reader, so
 *     nothing reads a retired record).
 * Every function accepts a NULL record (monitoring off) and does nothing then.
 */
#ifndef BRAID_RAS_RAS_H
#define BRAID_RAS_RAS_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "base/alloc.h"
#include "ras/wire.h"

/* One communicator's record (opaque; owned by the monitor). */
typedef struct ras_comm ras_comm_t;

/* What is known of a communicator when its init starts. */
typedef struct {
  uint64_t nonce;           /* the unique id's nonce */
  int rank, nranks, dev;    /* dev -1: host backend */
  const char *name;         /* copied */
  const alloc_acct_t *acct; /* its memory account; read by the monitor until ras_comm_retire returns */
} ras_comm_info_t;

/* Makes the record of a communicator whose init starts (state INIT) and writes this process's identity
 * (what the init allgather carries to the others) into *self_p. Starts the monitor on first use. Never fails
 * the init: without monitoring (NCCL_RAS_ENABLE=0, or it could not start, which is logged) *rc_p is NULL and
 * *self_p is zeroed. */
void ras_comm_join(const ras_comm_info_t *info, ras_comm_t **rc_p, ras_peer_t *self_p);
/* Every rank's identity (peers[nranks], from the init allgather; copied): the monitor connects to them. */
void ras_comm_peers(ras_comm_t *rc, const ras_peer_t *peers);
/* Init is complete: state RUNNING. */
void ras_comm_ready(ras_comm_t *rc);
/* A call was launched: its kind (RAS_OP_*), sequence number and whether it was captured in a CUDA graph. */
void ras_comm_launch(ras_comm_t *rc, int kind, uint64_t seq, int captured);
/* The rank waits now: `w` says for what (w->waited_ms is ignored); `since` is when the wait began
 * (time_now()). Lock-free; the monitor reads it with a sequence lock. */
void ras_comm_wait(ras_comm_t *rc, const ras_wait_t *w, double since);
/* The rank left its wait (the call is done or failed). */
void ras_comm_idle(ras_comm_t *rc);
/* Lifecycle: an error (init or asynchronous: state FAILED), ncclCommFinalize, ncclCommAbort. */
void ras_comm_error(ras_comm_t *rc, ncclResult_t res, int during_init);
void ras_comm_finalized(ras_comm_t *rc);
void ras_comm_aborting(ras_comm_t *rc);
/* The communicator is destroyed: its record leaves monitoring and is freed. */
void ras_comm_retire(ras_comm_t *rc);

/* Writes the job-wide verdict in one line into buf (from this process's records and the latest snapshots
 * its peers sent): for every communicator whose ranks disagree, which ranks wait in which call for which
 * rank, and what that rank does. Returns the length written; 0 when no communicator has ranks that wait. */
size_t ras_verdict(char *buf, size_t size);
/* The stall report's hook: logs ras_verdict at WARN, naming the communicator that stalled. */
void ras_stall_report(ras_comm_t *rc);

/* This process's records as a snapshot (proc->recs allocated; free it). `brief` leaves out what keep-alives
 * do not carry. Returns 0, or -1 when out of memory. Used by the monitor thread. */
int ras_local_snapshot(ras_proc_t *proc, int brief);
/* The identities of the ranks of the communicators this process is in, for the monitor thread: calls fn for
 * every distinct peer process seen in their peer tables, with the nonce that proves the job to it. */
void ras_local_peers(void (*fn)(const ras_peer_t *peer, uint64_t job, void *arg), void *arg);
/* Whether `job` is the nonce of a communicator this process has been part of (a connection's proof). */
int ras_known_job(uint64_t job);
/* Where rank `rank` of communicator `nonce` runs, when this process is in that communicator: 1 and *peer_p.
 */
int ras_local_rank_peer(uint64_t nonce, int rank, ras_peer_t *peer_p);

#endif
