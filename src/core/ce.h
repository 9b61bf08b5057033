/*
 * The direct path: steps of a GPU communicator that bypass the staging rings, with any peer reached by p2p
 * (peer GPU memory) on the same host, where the tuning table has a direct row (core/tune.h: two ranks so
 * far). The ranks may be separate processes (the receiver's output and words are exported and mapped in the
 * sender, transport/peer_mem.h) or one process (addresses are used as they are, with peer access).
 *
 * Four algorithms, each for a step whose transfers with a peer all go to one peer:
 * - copy (STEP_CE_COPY): the copy engines write the receiver's own output (cuMemcpy), for a step that only
 *   copies and whose transfers all reach BRAID_CE_MIN_BYTES: the engines reach the link's limit with no SM;
 * - chunked reduce (STEP_CE_COPY with a combine): a reduction's send lands in chunks (BRAID_CE_CHUNK_BYTES)
 *   from BRAID_CE_REDUCE_MIN_BYTES, out of place and not PreMulSum, and the receiver's combine kernel
 *   (dev_combine_t) combines each chunk in the kernels' operand order while the next ones cross the link;
 * - pull (STEP_CE_PULL): a reduce from BRAID_CE_PULL_MIN_BYTES in place, or below the copy engines'
 *   threshold: the root's combine kernel reads the sender's input where it lies, in tiles dealt to its
 *   blocks; pulling both ways at once is slower than the rings, so only one transfer one way is pulled;
 * - push (STEP_CE_PUSH): a step that only copies from BRAID_CE_PUSH_MIN_BYTES
 * (BRAID_CE_PUSH_EXCHANGE_MIN_BYTES both ways) below the copy engines' threshold: one kernel per rank
 * (dev_push_t) stores straight into the peer's outputs, its handshake on the SMs, so the stream does not turn
 * between kernels and copies.
 *
 * Which steps qualify is a pure function of the calls (candidate), so both ranks find the same ones; whether
 * one is taken is agreed per step: each rank sends one message (whether it can: every output exportable or
 * writable by the peer's device and not overlapping an input; whether it captures; the sizes; the handles or
 * addresses) before it waits for the peer's, and both apply the same symmetric test. A step one rank captures
 * and the other runs eagerly stays on the kernels. The messages go through a mailbox per direction
 * (transport/mbox.h), else over the bootstrap where a rank cannot make one.
 *
 * On the GPU, per step, with no host counter (DESIGN.md, principle 3), so that a graph replays it any number
 * of times between eager calls: the receiver's stream raises the sender's `ready` word once it reaches the
 * step (its outputs are free); the sender's stream waits for it, clears it, copies and raises the receiver's
 * `done`, which the receiver waits for and clears (a pull's words go the other way). Every word is 0 again
 * after each step. The waits are one-thread kernels (dev_wait_t) that give up after BRAID_TIMEOUT_S or on an
 * abort and report through ncclCommGetAsyncError. A rank that sends and receives raises each word in the
 * wait kernel that follows it, so its stream does not turn from a write to a kernel; a rank that only sends
 * or only receives raises with a stream write, which needs no SM. Local copies and combines run on a stream
 * of this module's own, forked after the wait for the peer, so they never hold the SMs that wait needs.
 *
 * The exchange waits on the host for the peer to reach the same call (BRAID_TIMEOUT_S at most; the abort flag
 * and the peer's exit end it): like NCCL, large calls on several communicators must be issued in the same
 * order on every rank; within one group the order does not matter (every message of the group is sent before
 * any is awaited).
 */
#ifndef BRAID_CORE_CE_H
#define BRAID_CORE_CE_H

#include <stdint.h>

#include "nccl.h"
#include "base/alloc.h"
#include "bootstrap/bootstrap.h"
#include "core/links.h"
#include "core/plan.h"
#include "device/dev.h"
#include "gpu/gpu.h"
#include "transport/transport.h"

typedef struct ce ce_t;

/* Transfers each way a step may have and still take the copy engines. */
#define CE_MAX_XFERS 4

/* The direct path of a communicator, or *ce_p = NULL where it has none: not a GPU communicator, no direct row
 * for its rank count, no peer on the host over p2p, or BRAID_CE_MIN_BYTES 0 on a rank. Both ends of each
 * path decide alike; they exchange their flag words over the bootstrap. */
ncclResult_t ce_init(int dev, int rank, int nranks, const tp_peer_t *peers, links_t *links, boot_t *boot,
                     const volatile int *abort_flag, alloc_acct_t *acct, const char *name, ce_t **ce_p);
/* Agreeing with the peer on which steps of the built plan the copy engines move, in two halves so that one
 * thread can settle several communicators of a group in any order (a send never waits for the receiver):
 * ce_offer sends this rank's message for each candidate step; ce_settle receives the peer's, marks the
 * agreed steps (step_t.ce) and points each of their sends at the peer's output (xfer_t.ce_dst). Every
 * ce_offer must be followed by ce_settle on the same plan. */
ncclResult_t ce_offer(ce_t *ce, plan_t *plan);
ncclResult_t ce_settle(ce_t *ce, plan_t *plan);
/* Whether the last ce_offer had a candidate step (or failed): both ranks offer such a step whenever it comes,
 * so its calls are never launched again unplanned (gx_relaunch). */
int ce_offered(const ce_t *ce);
/* What the executor does for a step (core/gpu_work.c): enqueues on `stream` the wait for this rank's `word`
 * (raised by the peer about call `seq`; is_send: the word says the peer's output is free), first raising the
 * peer's word `raise` (NULL: none) in the same kernel, and a reduction's combine, and, for a captured step,
 * takes a mapping the graph must keep until it is destroyed (on failure, not taken). */
typedef struct {
  ncclResult_t (*wait)(void *arg, cudaStream_t stream, uint32_t *raise, uint32_t *word, int peer, int is_send,
                       uint64_t seq);
  /* enqueues the combine of receive `x` (dev_combine_t: chunk c of it landed once `word` reached c + 1, in
   * x->dst, or where `from` points: a pull's peer input) */
  ncclResult_t (*combine)(void *arg, cudaStream_t stream, const xfer_t *x, const char *from, uint32_t *word,
                          int peer, uint64_t seq, uint32_t nchunks, const uint64_t *ends);
  /* enqueues a push kernel (dev_push_t, filled but for its communicator) */
  ncclResult_t (*push)(void *arg, cudaStream_t stream, dev_push_t *w);
  ncclResult_t (*keep)(void *arg, gpu_mem_t *mapping);
  void *arg;
} ce_exec_t;
/* Enqueues step `s` (agreed by ce_settle) on `stream`, which the caller has ordered after earlier work;
 * `capturing`: the stream is being captured (as it was at ce_offer). */
ncclResult_t ce_step(ce_t *ce, const plan_t *plan, int s, cudaStream_t stream, int capturing,
                     const ce_exec_t *ex);
/* Frees it; the caller has made sure no step is still running and no graph holds one (gx_destroy, which
 * owns it once gx_set_ce gave it). */
void ce_destroy(ce_t *ce);

#endif
