/*
 * Ranks of separate processes that share one GPU (core/shared_gpu.c): one rank moves the data of all.
 *
 * Kernels of different processes on one GPU are time-sliced: a collective whose kernels wait for each other
 * costs a time slice per hand-over (milliseconds). Stream memory operations need no time slice while they
 * wait, and a context that runs no kernel costs the other no context switch. So on a communicator whose ranks
 * are all on one GPU, one rank per process, the lowest rank (the leader) runs each group's calls of every
 * rank as local work over the others' buffers, which it maps (CUDA IPC), and the other ranks' streams only
 * raise a word and wait for one:
 *
 *   rank r's stream:   raise ready[r]                          wait done[r] >= 1, clear it
 *   leader's stream:   wait ready[r] >= 1 for every r, clear   the calls' work   raise done[r] for every r
 *
 * Every word is 0 again after a call, and a call's operations wait for the communicator's previous call or
 * launch when that came on another stream (as launches do), so no rank's word is raised twice at once. On
 * the host, per group, each other rank first sends the leader its calls (kinds, sizes, operations, its
 * buffers exported) through a mailbox, and the leader answers each: the path takes the group (sg_launch), or
 * the group goes the ordinary way on every rank (a call captured into a CUDA graph, a buffer that cannot be
 * exported, a device-resident PreMulSum factor, an in-place all-to-all, more than SG_CALLS calls), or the
 * calls do not match (every rank then fails the group with ncclInvalidUsage, saying how they differ).
 * Captured work never takes the path, so no graph holds any of it.
 *
 * The waits are bounded by a thread per rank (sg_watch): on the leader, a wait for a rank's stream that
 * lasts BRAID_TIMEOUT_S, a rank's process that exits, an abort on any rank, or this communicator's abort
 * fails the communicator and releases the leader's waits, so its stream runs the call (whatever the missing
 * rank's buffers hold) and releases every other rank. A rank other than the leader releases its own wait only
 * once the leader's process has exited, or after twice BRAID_TIMEOUT_S (the leader's stream never came), or
 * when it is destroyed or aborted and the leader has not released it within a few seconds: after an error,
 * the outputs of the call that failed are undefined.
 */
#ifndef BRAID_CORE_SHARED_GPU_H
#define BRAID_CORE_SHARED_GPU_H

#include <stdint.h>

#include "nccl.h"
#include "base/alloc.h"
#include "bootstrap/bootstrap.h"
#include "core/gpu_exec.h"
#include "core/links.h"
#include "core/plan.h"
#include "transport/transport.h"

typedef struct sg sg_t;

/* Calls of one group the path takes at most (a larger group goes the ordinary way). */
#define SG_CALLS 32

typedef struct {
  int dev, rank, nranks;
  const tp_peer_t *peers;
  links_t *links; /* its transport context makes the mailboxes and word segments */
  boot_t *boot;
  const volatile int *abort_flag;
  alloc_acct_t *acct;
  const char *name;
} sg_setup_t;

/* Sets the path up where every rank of the communicator is on this GPU, each in a process of its own, and
 * BRAID_SHARED_GPU_LEADER is 1 on every rank; *sg_p = NULL otherwise (and where any rank could not set it
 * up: logged, and no rank takes it). Every rank of a GPU communicator calls it. */
ncclResult_t sg_init(const sg_setup_t *setup, sg_t **sg_p);
/* A group on the path, in three parts so that one thread may run several communicators' groups: sg_offer
 * (another rank: sends its calls to the leader; never waits); sg_settle (the leader: receives every rank's
 * calls and answers each; another rank: receives the answer), which all leaders of a thread's group must run
 * before the other ranks; then, where *take, sg_launch instead of the ordinary planning and launch. */
/* Whether the group's calls go to the path's exchange: a group with a collective, in which every rank takes
 * part (a group of point-to-point calls alone may leave the leader out: it goes the ordinary way). */
int sg_wants(const sg_t *sg, const plan_t *plan);
ncclResult_t sg_offer(sg_t *sg, const plan_t *plan);
ncclResult_t sg_settle(sg_t *sg, const plan_t *plan, int *take);
ncclResult_t sg_launch(sg_t *sg, gx_t *gx, const plan_t *plan);
/* Whether this rank is the leader (settles first). */
int sg_leads(const sg_t *sg);
/* ncclSuccess, or the failure the watch found (logged once, naming the rank and the call). */
ncclResult_t sg_error(const sg_t *sg);
/* Waits (bounded, see above) until this rank's last call on the path has finished, then frees it. With
 * `aborting`, the other ranks learn of it at once. */
void sg_destroy(sg_t *sg, int aborting);

#endif
