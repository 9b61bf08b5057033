/*
 * Copy engines straight into the peer's buffer: the large one-way transfers of a two-rank GPU communicator
 * over p2p, moved by cuMemcpy into the receiver's own output instead of by the kernels through a staging
 * ring. The copy engines reach the link's limit with no SM (docs/perf-notes.md). The ranks may be separate
 * processes (the receiver's output and words are exported and mapped in the sender) or one process (their
 * addresses are used as they are, with peer access between the devices).
 *
 * Which steps: a step of the plan whose every transfer between the ranks moves at least BRAID_CE_MIN_BYTES
 * and none forwards, with at most CE_MAX_XFERS transfers each way: broadcast, gather, scatter, all-gather,
 * all-to-all, send/receive; and, from BRAID_CE_REDUCE_MIN_BYTES, the reductions of two ranks (reduce,
 * reduce-scatter, an all-reduce's reduce-scatter step: one transfer each way at most, no local copy), whose
 * receiver combines what lands with its own operand, except PreMulSum (and so float averages), whose peer
 * bytes would need scaling. A pure
 * function of the calls, so both ranks find the same steps. For each such step, in order (the first
 * CE_OFFERS_MAX of a launch; the kernels move any after them), the ranks then exchange one message: whether
 * this rank can take the copy engines for it (each output exportable (ncclMemAlloc or cudaMalloc memory), no
 * output overlapping an input of the step), whether the call is being captured into a CUDA graph, the sizes
 * it sends and receives, and the handles (or addresses). Both decide from the two messages with the same
 * symmetric test, so they agree; a step either refuses, or that one rank captures and the other runs eagerly,
 * stays on the kernels. The messages go through a mailbox per direction, a ring of slots in memory both ranks
 * map (POSIX shared memory between processes, plain memory in one), in which a send never waits and a receive
 * spins for a few microseconds, then also yields and sleeps; over the bootstrap's sockets, each exchange cost
 * the host some 16 us more. Where a rank cannot make or map one, both send their messages over the bootstrap.
 *
 * On the GPU, per step, with no host counter (DESIGN.md, principle 3), so that a graph replays it any number
 * of times between eager calls: the receiver's stream raises the sender's `ready` word once it reaches the
 * step (its outputs are free); the sender's stream waits for `ready`, clears it, copies into the peer's
 * outputs and raises the receiver's `done` word; the receiver waits for `done` and clears it. A reduction's
 * send goes in chunks (BRAID_CE_CHUNK_BYTES), each raising `done` to its number, and the receiver's combine
 * kernel (dev_combine_t) combines each chunk once `done` says it landed, while the next ones cross the link;
 * its stream clears `done` after it. Every word is 0 again after each step. The waits are one-thread kernels
 * (dev_wait_t): like the kernels' own waits they give up after BRAID_TIMEOUT_S or on an abort and report it
 * through ncclCommGetAsyncError. A rank that sends and receives raises each word in the wait kernel that
 * follows it (`ready`, then the wait for its own; `done`, then the wait for its own), so that its stream does
 * not turn from a write to a kernel in between; its own copy waits for that kernel anyway. A rank that only
 * sends or only receives raises its words with stream writes, which need no SM: the peer's transfer never
 * waits for a kernel of a rank that has none of its own in the way. The step's local copies run on a stream
 * of this module's own, forked from and joined to the call's stream, beside the link's copy.
 *
 * A pull (step_t.ce STEP_CE_PULL): a reduce from BRAID_CE_PULL_MIN_BYTES whose root runs in place (the
 * copy engines cannot land in its output, which is its operand), or that is below BRAID_CE_REDUCE_MIN_BYTES
 * (there the copy engines' pauses between chunks cost more than they gain). The sender offers its input
 * (exported as an output is) and the root's combine kernel reads it where it lies, over the link, in tiles
 * dealt to its blocks round robin, combining it with its operand into its output in one pass: no staging,
 * no chunks, no ring. The words go the other way: the sender's stream raises the root's `ready` (its input
 * is final) and waits for `done`, which the root's stream raises once the combine has run (the input is the
 * sender's again). Kernels pulling one way read the link a little faster than they push through the rings
 * (docs/perf-notes.md, 56 and 87); both ways at once they are slower, so only a reduction of one transfer
 * one way is pulled.
 *
 * A push (STEP_CE_PUSH): a step that only copies, whose transfers between the ranks move at least
 * BRAID_CE_PUSH_MIN_BYTES (BRAID_CE_PUSH_EXCHANGE_MIN_BYTES where each rank sends and receives) but not all
 * BRAID_CE_MIN_BYTES. The copy engines' handshake costs each step about 20 us of the stream turning between
 * kernels and copies (docs/perf-notes.md, 94), more than the engines' pace gains below some tens of MiB; the
 * rings cost a copy out of the slots on the receiver. Such a step is agreed and mapped as the copy engines'
 * steps are, and then each rank that sends, or copies locally, runs one kernel (dev_push_t) of a block per
 * SM: it raises the peer's `ready` where it receives, waits for its own where it sends, stores its sends
 * straight into the peer's outputs and its local copies into its own, and its last block raises the peer's
 * `done` and waits for its own: the whole handshake on the SMs, the stream turning once. A rank that only
 * receives and copies nothing raises `ready` with a stream write and waits for `done` in a wait kernel, as
 * for the copy engines. The words are the copy engines' own: both kinds of step leave them 0.
 *
 * The exchange waits on the host for the peer to reach the same call (at most BRAID_TIMEOUT_S; the abort
 * flag ends it, and so does the peer's exit, seen where both processes share a pid namespace): like NCCL,
 * large calls on several communicators must be issued in the same order on every rank; within one group the
 * order does not matter (every message of the group is sent before any is awaited).
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

/* The copy-engine path of a communicator, or *ce_p = NULL where it has none: not two ranks, the peer reached
 * by a transport other than p2p, not a GPU communicator, BRAID_CE_MIN_BYTES 0. Both ranks decide alike;
 * those that make one exchange their flag words over the bootstrap. */
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
