/*
 * What the CUDA graph tests share (see graph_case.h).
 */
#include "graph_case.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "harness.h"

void graph_capture(graph_t *g, int n, cuda_rank_t **r, enum cudaStreamCaptureMode mode,
                   graph_issue_fn_t issue, void *arg) {
  static int told;
  EXPECT(n >= 1 && n <= GRAPH_MAX_STREAMS, "%d streams to capture; 1 to %d are supported", n,
         GRAPH_MAX_STREAMS);
  memset(g, 0, sizeof *g);
  g->issue = issue;
  g->arg = arg;
  g->n = n;
  for (int i = 0; i < n; i++) g->r[i] = r[i];
  if (cuda_host) {
    /* Once per process, and only from the first rank's process, so that the log says it once per case. */
    if (!told && r[0]->dev == 0)
      printf("--host: nothing is captured on the host backend; each replay issues the graph's calls again\n");
    told = 1;
    return;
  }
  for (int i = 0; i < n; i++) {
    CUDA_OK(cudaSetDevice(r[i]->dev));
    CUDA_OK(cudaStreamBeginCapture(r[i]->stream, mode));
  }
  issue(arg);
  /* every capture ends before any graph is instantiated: instantiation is refused while a stream of the
   * thread still captures in global mode */
  for (int i = 0; i < n; i++) {
    CUDA_OK(cudaSetDevice(r[i]->dev));
    CUDA_OK(cudaStreamEndCapture(r[i]->stream, &g->graph[i]));
  }
  for (int i = 0; i < n; i++) {
    CUDA_OK(cudaSetDevice(r[i]->dev));
    CUDA_OK(cudaGraphInstantiate(&g->exec[i], g->graph[i], 0));
  }
}

void graph_replay(graph_t *g) {
  if (cuda_host) {
    g->issue(g->arg);
    return;
  }
  for (int i = 0; i < g->n; i++) {
    EXPECT(g->exec[i] != NULL, "replay of graph %d of %d after it was destroyed", i, g->n);
    CUDA_OK(cudaSetDevice(g->r[i]->dev));
    CUDA_OK(cudaGraphLaunch(g->exec[i], g->r[i]->stream));
  }
}

void graph_destroy(graph_t *g) {
  if (cuda_host) return;
  for (int i = 0; i < g->n; i++) {
    CUDA_OK(cudaSetDevice(g->r[i]->dev));
    if (g->exec[i] != NULL) CUDA_OK(cudaGraphExecDestroy(g->exec[i]));
    if (g->graph[i] != NULL) CUDA_OK(cudaGraphDestroy(g->graph[i]));
    g->exec[i] = NULL;
    g->graph[i] = NULL;
  }
}

int graph_host_skip(const char *name) {
  if (cuda_host)
    printf("SKIP %s: --host runs on the host backend, where nothing can be captured into a CUDA graph\n",
           name);
  return cuda_host;
}

int graph_scaled(int n) {
  const int d = cuda_host ? GRAPH_HOST_DIVISOR : cuda_ndevs < cuda_nranks ? GRAPH_SHARED_DIVISOR : 1;
  return n / d > 0 ? n / d : 1;
}

void graph_rearm(cuda_case_t *k) {
  for (int i = 0; i < k->nregions; i++) cuda_upload(k->r, k->dregion[i], k->himage[i], k->region_bytes[i]);
}

void graph_check(cuda_case_t *k) {
  EXPECT(!k->op_created, "%s: a case checked repeatedly must use a built-in operation", k->what);
  /* cuda_case_check downloads into the host pool; what it took is free again once it returns. */
  size_t mark = k->r->hused;
  cuda_case_check(k);
  k->r->hused = mark;
}

void graph_calls_issue(void *arg) {
  const graph_calls_t *c = arg;
  if (c->grouped) NCCL_OK(ncclGroupStart(), "ncclGroupStart", c->k[0].comm);
  for (int i = 0; i < c->n; i++) cuda_case_launch(&c->k[i]);
  if (c->grouped) NCCL_OK(ncclGroupEnd(), c->k[0].what, c->k[0].comm);
}

void graph_calls_rearm(const graph_calls_t *c) {
  for (int i = 0; i < c->n; i++) graph_rearm(&c->k[i]);
}

void graph_calls_check(const graph_calls_t *c) {
  for (int i = 0; i < c->n; i++) graph_check(&c->k[i]);
}

void graph_calls_run(const graph_calls_t *c, int times, const char *what, int timeout_s) {
  cuda_watch(what, timeout_s);
  for (int t = 0; t < times; t++) {
    graph_calls_rearm(c);
    graph_calls_issue((void *)c);
    graph_calls_check(c);
  }
  cuda_unwatch();
}

coll_case_t graph_coll(kind_t kind, ncclDataType_t type, size_t count, uint64_t seed) {
  return (coll_case_t){.kind = kind, .type = type, .op = ncclSum, .count = count, .seed = seed};
}

ncclComm_t graph_init_rank(int rank, int nranks, const ncclUniqueId *id) {
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank", GRAPH_INIT_S);
  NCCL_OK(ncclCommInitRank(&comm, nranks, *id, rank), "init", NULL);
  cuda_unwatch();
  return comm;
}

void graph_destroy_comm(ncclComm_t comm) {
  cuda_watch("ncclCommDestroy", GRAPH_INIT_S);
  NCCL_OK(ncclCommDestroy(comm), "destroy", NULL);
  cuda_unwatch();
}

void graph_order(cuda_rank_t *waiter, cuda_rank_t *before, cudaEvent_t ev) {
  if (cuda_host) return;
  CUDA_OK(cudaEventRecord(ev, before->stream));
  CUDA_OK(cudaStreamWaitEvent(waiter->stream, ev, 0));
}

cudaEvent_t graph_event(void) {
  cudaEvent_t ev = NULL;
  if (!cuda_host) CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  return ev;
}

void graph_event_destroy(cudaEvent_t ev) {
  if (ev != NULL) CUDA_OK(cudaEventDestroy(ev));
}

double graph_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
