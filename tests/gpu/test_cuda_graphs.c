/*
 * CUDA graphs mixed with eager calls on one communicator: the sequence that made NCCL's work FIFO look full
 * forever (a captured all-reduce advanced a host-side counter; eager all-reduces then stalled).
 *
 * One process per GPU: two eager all-reduces of 100,000 bf16 elements, one all-reduce captured into a graph,
 * then 100,000 eager all-reduces of 49,000 bf16 elements with a stream synchronisation after each, and the
 * graph replayed every 1,000 iterations. A second case captures two graphs (an all-reduce, and a group of an
 * all-gather with a send/recv exchange) and interleaves their replays with eager calls on a second stream.
 * Results are checked throughout (outputs poisoned before each checked call); a watchdog fails the test if
 * anything stalls. Element values are small integers, so bf16 sums are exact.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_case.h"
#include "harness.h"

enum { BIG = 100000, SMALL = 49000, ITERS = 100000, REPLAY_EVERY = 1000, CHECK_EVERY = 5000 };

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16); /* exact for the small integers used here */
}

/* Input element i of `rank` for a buffer tagged `tag`: 1..16. */
static float value(int tag, int rank, size_t i) {
  return (float)((i * 7 + (size_t)tag * 3 + (size_t)rank) % 8 + 1);
}

static float sum_of(int tag, int nranks, size_t i) {
  float s = 0;
  for (int r = 0; r < nranks; r++) s += value(tag, r, i);
  return s;
}

/* A device buffer of n bf16 elements filled with value(tag, rank, .). */
static uint16_t *make_input(int tag, int rank, size_t n, cudaStream_t s) {
  uint16_t *h = malloc(n * sizeof *h), *d = NULL;
  for (size_t i = 0; i < n; i++) h[i] = to_bf16(value(tag, rank, i));
  CUDA_OK(cudaMalloc((void **)&d, n * sizeof *d));
  CUDA_OK(cudaMemcpyAsync(d, h, n * sizeof *h, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaStreamSynchronize(s));
  free(h);
  return d;
}

static uint16_t *make_output(size_t n) {
  uint16_t *d = NULL;
  CUDA_OK(cudaMalloc((void **)&d, n * sizeof *d));
  CUDA_OK(cudaMemset(d, 0xff, n * sizeof *d));
  return d;
}

/* Checks that out holds the all-reduce of the `tag` inputs over nranks ranks. */
static void check_sum(const uint16_t *out, size_t n, int tag, int nranks, cudaStream_t s, const char *what) {
  uint16_t *h = malloc(n * sizeof *h);
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(h, out, n * sizeof *h, cudaMemcpyDeviceToHost));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (h[i] != to_bf16(sum_of(tag, nranks, i)) && bad++ == 0) first = i;
  EXPECT(bad == 0, "%s: %zu of %zu elements wrong; element %zu is 0x%04x, expected 0x%04x", what, bad, n,
         first, h[first], to_bf16(sum_of(tag, nranks, first)));
  free(h);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The NCCL work-FIFO reproduction. */
static void fifo_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  ncclComm_t comm;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda_watch("ncclCommInitRank", 60);
  NCCL_OK(ncclCommInitRank(&comm, n, *id, rank), "init", NULL);
  cuda_unwatch();
  uint16_t *big_in = make_input(1, rank, BIG, s), *big_out = make_output(BIG);
  uint16_t *small_in = make_input(2, rank, SMALL, s), *small_out = make_output(SMALL);
  uint16_t *graph_in = make_input(3, rank, BIG, s), *graph_out = make_output(BIG);
  cuda_watch("two eager all-reduces", 30);
  for (int k = 0; k < 2; k++) {
    NCCL_OK(ncclAllReduce(big_in, big_out, BIG, ncclBfloat16, ncclSum, comm, s), "eager", comm);
    check_sum(big_out, BIG, 1, n, s, "eager all-reduce of 100,000 bf16");
  }
  cuda_unwatch();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  NCCL_OK(ncclAllReduce(graph_in, graph_out, BIG, ncclBfloat16, ncclSum, comm, s), "captured", comm);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  double t0 = now_s();
  int replays = 0;
  cuda_watch("100,000 eager all-reduces with graph replays", 300);
  for (int it = 0; it < ITERS; it++) {
    int checked = it % CHECK_EVERY == 0;
    if (checked) CUDA_OK(cudaMemsetAsync(small_out, 0xff, SMALL * sizeof *small_out, s));
    NCCL_OK(ncclAllReduce(small_in, small_out, SMALL, ncclBfloat16, ncclSum, comm, s), "eager", comm);
    CUDA_OK(cudaStreamSynchronize(s));
    if (checked) check_sum(small_out, SMALL, 2, n, s, "eager all-reduce of 49,000 bf16");
    if (it % REPLAY_EVERY == REPLAY_EVERY - 1) {
      CUDA_OK(cudaMemsetAsync(graph_out, 0xff, BIG * sizeof *graph_out, s));
      CUDA_OK(cudaGraphLaunch(exec, s));
      replays++;
      if (replays % 10 == 0) check_sum(graph_out, BIG, 3, n, s, "replayed all-reduce");
    }
  }
  CUDA_OK(cudaStreamSynchronize(s));
  cuda_unwatch();
  double t = now_s() - t0;
  check_sum(graph_out, BIG, 3, n, s, "replayed all-reduce, last");
  if (rank == 0)
    printf("rank 0: %d eager all-reduces and %d graph replays in %.2f s (%.1f us per iteration)\n", ITERS,
           replays, t, t * 1e6 / ITERS);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  NCCL_OK(ncclCommDestroy(comm), "destroy", NULL);
  uint16_t *bufs[] = {big_in, big_out, small_in, small_out, graph_in, graph_out};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) CUDA_OK(cudaFree(bufs[i]));
  CUDA_OK(cudaStreamDestroy(s));
}

static void fifo_repro(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 400, fifo_rank, NULL) == 0, "a rank failed");
}

/* Two graphs (an all-reduce; a group of an all-gather and a ring send/recv) replayed in turn between eager
 * all-reduces issued on another stream. */
static void two_graphs_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  enum { CNT = 4099, ROUNDS = 300 };
  ncclComm_t comm;
  cudaStream_t s, e;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&e, cudaStreamNonBlocking));
  cuda_watch("ncclCommInitRank", 60);
  NCCL_OK(ncclCommInitRank(&comm, n, *id, rank), "init", NULL);
  cuda_unwatch();
  uint16_t *a_in = make_input(4, rank, CNT, s), *a_out = make_output(CNT);
  uint16_t *e_in = make_input(5, rank, CNT, s), *e_out = make_output(CNT);
  uint16_t *g_out = make_output((size_t)CNT * n), *x_out = make_output(CNT);
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  cudaGraph_t g[2];
  cudaGraphExec_t x[2];
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  NCCL_OK(ncclAllReduce(a_in, a_out, CNT, ncclBfloat16, ncclSum, comm, s), "captured all-reduce", comm);
  CUDA_OK(cudaStreamEndCapture(s, &g[0]));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  NCCL_OK(ncclGroupStart(), "group", comm);
  NCCL_OK(ncclAllGather(a_in, g_out, CNT, ncclBfloat16, comm, s), "captured all-gather", comm);
  NCCL_OK(ncclSend(e_in, CNT, ncclBfloat16, next, comm, s), "captured send", comm);
  NCCL_OK(ncclRecv(x_out, CNT, ncclBfloat16, prev, comm, s), "captured recv", comm);
  NCCL_OK(ncclGroupEnd(), "group end", comm);
  CUDA_OK(cudaStreamEndCapture(s, &g[1]));
  for (int i = 0; i < 2; i++) CUDA_OK(cudaGraphInstantiate(&x[i], g[i], 0));
  cuda_watch("graph replays between eager calls", 120);
  for (int round = 0; round < ROUNDS; round++) {
    CUDA_OK(cudaGraphLaunch(x[round % 2], s));
    CUDA_OK(cudaStreamSynchronize(s));
    NCCL_OK(ncclAllReduce(e_in, e_out, CNT, ncclBfloat16, ncclSum, comm, e), "eager", comm);
    CUDA_OK(cudaStreamSynchronize(e));
  }
  cuda_unwatch();
  check_sum(a_out, CNT, 4, n, s, "replayed all-reduce");
  check_sum(e_out, CNT, 5, n, e, "eager all-reduce between replays");
  uint16_t *h = malloc((size_t)CNT * n * sizeof *h);
  CUDA_OK(cudaMemcpy(h, g_out, (size_t)CNT * n * sizeof *h, cudaMemcpyDeviceToHost));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < CNT; i++)
      EXPECT(h[(size_t)r * CNT + i] == to_bf16(value(4, r, i)), "rank %d: all-gather block %d element %zu",
             rank, r, i);
  CUDA_OK(cudaMemcpy(h, x_out, CNT * sizeof *h, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < CNT; i++)
    EXPECT(h[i] == to_bf16(value(5, prev, i)), "rank %d: received element %zu from rank %d", rank, i, prev);
  free(h);
  for (int i = 0; i < 2; i++) {
    CUDA_OK(cudaGraphExecDestroy(x[i]));
    CUDA_OK(cudaGraphDestroy(g[i]));
  }
  NCCL_OK(ncclCommDestroy(comm), "destroy", NULL);
  uint16_t *bufs[] = {a_in, a_out, e_in, e_out, g_out, x_out};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) CUDA_OK(cudaFree(bufs[i]));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaStreamDestroy(e));
}

static void two_graphs(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 200, two_graphs_rank, NULL) == 0, "a rank failed");
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(fifo_repro, 420);
  TEST(two_graphs, 220);
  return test_summary();
}
