/*
 * The GPU executor: turns a communicator's plan into one kernel launch per group (src/device/dev.h) on the
 * calls' stream, and owns what those kernels need on the device: the communicator's kernel view (rings of
 * every connection, slot counters, grid barrier), host-mapped abort and error words, and the events that
 * order launches of one communicator made on different streams.
 *
 * Nothing here waits for the GPU on a collective call: a launch returns once enqueued. Kernels report
 * failures (abort, a peer that never came) in the host-mapped error word, which gx_error turns into a
 * result for ncclCommGetAsyncError. Captured launches (CUDA graphs) touch no host-side counter: the kernels
 * keep their slot counters in device memory (DESIGN.md, principle 3).
 *
 * Three files: gpu_exec.c (state, order, storage, relaunch), gpu_work.c (transfers, lanes and entry points of
 * a launch) and gpu_graphs.c (what CUDA graphs hold, and executors retired while they do).
 */
#ifndef BRAID_CORE_GPU_EXEC_H
#define BRAID_CORE_GPU_EXEC_H

#include <stdint.h>

#include "nccl.h"
#include "base/alloc.h"
#include "core/ce.h"
#include "core/links.h"
#include "core/plan.h"

typedef struct gx gx_t;

/* Makes the GPU state of a communicator whose connections to every peer are made (links); its launches take
 * at most `sms` blocks (its share of the GPU's multiprocessors). */
ncclResult_t gx_init(int dev, int rank, int nranks, int nch, int sms, links_t *links, alloc_acct_t *acct,
                     const char *name, gx_t **gx_p);
/* Device scratch for the plan's in-place all-to-alls (grown before plan_build; never during capture). */
ncclResult_t gx_scratch(gx_t *gx, plan_t *plan, int nranks);
/* Steps the plan marks for the copy engines (step_t.ce) are enqueued through `ce` (NULL: none are), which
 * the executor owns from then on: gx_destroy frees it, once no graph holds a step of it. */
void gx_set_ce(gx_t *gx, ce_t *ce);
/* Asks the tuner (core/tune.h) how each of the plan's calls runs, before plan_build: the planner gets the
 * algorithm (task_t.algo, .split), the executor keeps the rest for gx_launch. */
ncclResult_t gx_tune(gx_t *gx, plan_t *plan);
/* Launches a built plan (the calls' streams are in its tasks), tuned by gx_tune. */
ncclResult_t gx_launch(gx_t *gx, const plan_t *plan);
/* Before plan_build: when the plan's calls (enqueued, not built) are those of the executor's last eager
 * launch and that was one step on the LL or pair entry point, launches them again as gx_launch would and sets
 * *took; otherwise (or when the stream is capturing) sets *took to 0, and the caller takes the full path. */
ncclResult_t gx_relaunch(gx_t *gx, const plan_t *plan, int *took);
/* Work the communicator enqueues on stream `s` outside a launch (the shared-GPU path's stream memory
 * operations) is ordered as launches are: gx_order_before makes `s` wait for the last eager launch when that
 * came on another stream, gx_order_after makes the next launch wait for the work. Eager work only. */
ncclResult_t gx_order_before(gx_t *gx, cudaStream_t s);
ncclResult_t gx_order_after(gx_t *gx, cudaStream_t s);
/* A group's streams other than its first, `s`, for work outside a launch: gx_join_before makes `s` wait for
 * their work so far, gx_join_after (after gx_order_after) makes them wait for the work on `s`. */
ncclResult_t gx_join_before(gx_t *gx, const plan_t *plan, cudaStream_t s);
ncclResult_t gx_join_after(gx_t *gx, const plan_t *plan);
/* Whether the last gx_launch was captured into a CUDA graph (monitoring counts such calls apart). */
int gx_captured(const gx_t *gx);
/* How many launches gx_relaunch made (for tests). */
uint64_t gx_relaunches(const gx_t *gx);
/* Stops every kernel of the communicator that waits (they record DEV_ERR_ABORTED and leave). */
void gx_abort(gx_t *gx);
/* ncclSuccess, or the error a kernel reported (logged once, with what it waited for). */
ncclResult_t gx_error(gx_t *gx);
/* How many CUDA graphs hold captured work of the communicator (they keep it from being destroyed). A graph
 * stops counting once it, every executable graph made from it and their launches are gone; the driver says
 * so from its own thread shortly after the last of them. */
int gx_graphs(gx_t *gx);
/* Waits for the communicator's last launch, then frees everything. No graph may hold it (gx_graphs() == 0).
 * The wait is bounded: kernels give up after BRAID_TIMEOUT_S (at once after gx_abort); when the last launch
 * has still not finished 5 s after that, the GPU is stuck, and rather than free memory a kernel may still
 * use, gx_destroy says so at WARN, leaves the executor allocated and returns ncclSystemError (the caller must
 * then keep the connections too). */
ncclResult_t gx_destroy(gx_t *gx);
/* Waits, bounded as gx_destroy does, until the communicator's last eager launch has finished (for a
 * communicator destroyed while graphs hold it: its eager work ends before replays are stopped). */
void gx_quiesce(gx_t *gx);
/* For a communicator destroyed or aborted while graphs still hold it: keeps the executor, and `arg` (the
 * connections, which a replay's kernel could still touch), until the last graph is gone; then gx_sweep frees
 * the executor and calls release(arg). The communicator's struct outlives it (destroyed communicators stay as
 * tombstones), so the executor keeps using its name and account. */
void gx_retire(gx_t *gx, void (*release)(void *), void *arg);
/* Frees retired executors that no graph holds any more. Called by gx_init and gx_launch; cheap when there
 * is none. */
void gx_sweep(void);

#endif
