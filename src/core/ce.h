/*
 * Copy engines straight into the peer's buffer: the large one-way transfers of a two-rank GPU communicator
 * whose ranks are separate processes, moved by cuMemcpy into the receiver's own output instead of by the
 * kernels through a staging ring. The copy engines reach the link's limit with no SM (docs/perf-notes.md).
 *
 * Which steps: a step of the plan whose every transfer between the ranks moves at least BRAID_CE_MIN_BYTES
 * and none combines, prepares or forwards (broadcast, gather, scatter, all-gather, all-to-all out of place,
 * send/receive; never a reduction), with at most CE_MAX_XFERS transfers each way: a pure function of the
 * calls, so both ranks find the same steps. For each such step, in order, the ranks then exchange one
 * message over the bootstrap: whether this rank can take the copy engines now (not capturing a graph, each
 * output exportable (ncclMemAlloc or cudaMalloc memory), no output overlapping an input of the step), the
 * sizes it sends and receives, and the handles. Both decide from the two messages with the same symmetric
 * test, so they agree; a step either refuses stays on the kernels.
 *
 * On the GPU, per step, with no host counter (DESIGN.md, principle 3): the receiver's stream raises the
 * sender's `ready` word once it reaches the step (its outputs are free); the sender's stream waits for
 * `ready`, clears it, copies into the peer's mapped outputs and raises the receiver's `done` word; the
 * receiver waits for `done` and clears it. Every word is 0 again after each step. The step's local copies run
 * on a stream of this module's own, forked from and joined to the call's stream, beside the link's copy.
 *
 * The exchange waits on the host for the peer to reach the same call (at most BRAID_TIMEOUT_S, and the abort
 * flag ends it): like NCCL, large calls on several communicators must be issued in the same order on every
 * rank; within one group the order does not matter (every message of the group is sent before any is
 * awaited).
 */
#ifndef BRAID_CORE_CE_H
#define BRAID_CORE_CE_H

#include <stdint.h>

#include "nccl.h"
#include "base/alloc.h"
#include "bootstrap/bootstrap.h"
#include "core/links.h"
#include "core/plan.h"
#include "transport/transport.h"

typedef struct ce ce_t;

/* Transfers each way a step may have and still take the copy engines. */
#define CE_MAX_XFERS 4

/* The copy-engine path of a communicator, or *ce_p = NULL where it has none: not two ranks, the peer in
 * this process or reached by a transport other than p2p, not a GPU communicator, BRAID_CE_MIN_BYTES 0. Both
 * ranks decide alike; those that make one exchange their flag words over the bootstrap. */
ncclResult_t ce_init(int dev, int rank, int nranks, const tp_peer_t *peers, links_t *links, boot_t *boot,
                     alloc_acct_t *acct, const char *name, ce_t **ce_p);
/* Agreeing with the peer on which steps of the built plan the copy engines move, in two halves so that one
 * thread can settle several communicators of a group in any order (a send never waits for the receiver):
 * ce_offer sends this rank's message for each candidate step; ce_settle receives the peer's, marks the
 * agreed steps (step_t.ce) and points each of their sends at the peer's output (xfer_t.ce_dst). Every
 * ce_offer must be followed by ce_settle on the same plan. */
ncclResult_t ce_offer(ce_t *ce, plan_t *plan);
ncclResult_t ce_settle(ce_t *ce, plan_t *plan);
/* Enqueues step `s` (agreed by ce_settle) on `stream`, which the caller has ordered after earlier work. */
ncclResult_t ce_step(ce_t *ce, const plan_t *plan, int s, cudaStream_t stream);
/* ncclSuccess, or ncclRemoteError once a step has waited for the peer more than BRAID_TIMEOUT_S (logged
 * once, naming the call and what it waits for). */
ncclResult_t ce_error(ce_t *ce);
/* Raises this rank's words so that a stream waiting for the peer goes on (abort). */
void ce_abort(ce_t *ce);
/* Frees it; the caller has made sure no step is still running (gx_destroy). */
void ce_destroy(ce_t *ce);

#endif
