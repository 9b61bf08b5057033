/*
 * What the CUDA graph tests share: graphs made by capturing the calls of a function on one or more streams,
 * replayed and destroyed; collective cases (cuda_case.h) checked again and again, their buffers poisoned
 * again before each checked call; ordering between streams; iteration counts that shrink in --host mode.
 *
 * In --host mode (the host backend, no GPU) nothing can be captured: a "graph" there only remembers its
 * function, and every replay calls it again, eagerly. The cases that mix graphs with eager calls then still
 * run their eager calls, their "replays" and every check, which keeps the tests themselves honest on a
 * machine without a GPU; what only a GPU can show (capture, replay of the captured work) is left to it.
 */
#ifndef BRAID_TESTS_GRAPH_CASE_H
#define BRAID_TESTS_GRAPH_CASE_H

#include <cuda_runtime_api.h>

#include "coll_check.h"
#include "cuda_case.h"

/* Issues the calls that a graph holds, on the streams given to graph_capture. */
typedef void (*graph_issue_fn_t)(void *arg);

/* Streams (ranks' streams) captured together, each into its own graph. */
#define GRAPH_MAX_STREAMS 8

typedef struct {
  graph_issue_fn_t issue; /* what was captured; called again at each replay in --host mode */
  void *arg;
  int n;                                /* streams */
  cuda_rank_t *r[GRAPH_MAX_STREAMS];    /* each stream with its device */
  cudaGraph_t graph[GRAPH_MAX_STREAMS]; /* NULL in --host mode, and once destroyed */
  cudaGraphExec_t exec[GRAPH_MAX_STREAMS];
} graph_t;

/* Begins a capture in `mode` on the streams of r[0..n), calls issue(arg), ends every capture and instantiates
 * each graph. In --host mode it only remembers issue and arg. */
void graph_capture(graph_t *g, int n, cuda_rank_t **r, enum cudaStreamCaptureMode mode,
                   graph_issue_fn_t issue, void *arg);
/* Launches every graph on its stream and returns (nothing waits); in --host mode calls issue(arg). */
void graph_replay(graph_t *g);
/* Destroys what is left of every graph and its executable graph (after the caller waited for the streams). */
void graph_destroy(graph_t *g);

/* Prints, once per process, that --host mode has nothing to capture; returns 1 when the caller, a case that
 * is about capture itself, must skip. */
int graph_host_skip(const char *name);

/* n on GPUs; n / GRAPH_HOST_DIVISOR (at least 1) in --host mode, where every call runs on the CPU, and
 * n / GRAPH_SHARED_DIVISOR where ranks' processes share a GPU (--devices below --gpus), which time-slices
 * their kernels: every call between them waits for a slice. */
#define GRAPH_HOST_DIVISOR   10
#define GRAPH_SHARED_DIVISOR 20
int graph_scaled(int n);

/* Uploads the case's buffers again as cuda_case_prepare made them: inputs restored, outputs poisoned. The
 * case's stream must have nothing in flight that uses them. */
void graph_rearm(cuda_case_t *k);
/* cuda_case_check, then hands back the host memory it took, so that a case can be checked any number of
 * times (k must not own an operation: built-in operations only). */
void graph_check(cuda_case_t *k);

/* Cases issued together: one after another, or inside one ncclGroupStart/End (which may hold several
 * communicators' calls). */
typedef struct {
  cuda_case_t *k;
  int n;
  int grouped;
} graph_calls_t;

/* Issues the calls (a graph_issue_fn_t: arg is a graph_calls_t). */
void graph_calls_issue(void *arg);
/* graph_rearm or graph_check of each case. */
void graph_calls_rearm(const graph_calls_t *c);
void graph_calls_check(const graph_calls_t *c);
/* Rearms, issues and checks the calls `times` times in a row, under a watchdog of timeout_s. */
void graph_calls_run(const graph_calls_t *c, int times, const char *what, int timeout_s);

/* A collective case with the sum (for the kinds that reduce), at offset 0, out of place, root 0. */
coll_case_t graph_coll(kind_t kind, ncclDataType_t type, size_t count, uint64_t seed);

/* Seconds that making or destroying a communicator may take. */
#define GRAPH_INIT_S 60
/* ncclCommInitRank and ncclCommDestroy under the watchdog; a failure fails the process. */
ncclComm_t graph_init_rank(int rank, int nranks, const ncclUniqueId *id);
void graph_destroy_comm(ncclComm_t comm);

/* Makes `waiter`'s stream wait for the work queued so far on `before`'s (same device), through `ev`; nothing
 * in --host mode, where calls complete before they return. */
void graph_order(cuda_rank_t *waiter, cuda_rank_t *before, cudaEvent_t ev);
/* An event for graph_order (NULL in --host mode). */
cudaEvent_t graph_event(void);
void graph_event_destroy(cudaEvent_t ev);

/* A monotonic clock, in seconds. */
double graph_now(void);

#endif
