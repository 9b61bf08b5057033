/*
 * Stream order around a collective whose launch may overlap the stream's previous kernel (BRAID_LAUNCH_PDL),
 * one process per GPU. Each round, on the rank's stream: a kernel of the test writes the round's input
 * (order_fill: it lets the next launch start early, as a kernel written for programmatic dependent launch
 * does, then busy-waits before it writes), the all-reduce, a kernel that counts the output elements that are
 * not the round's sum, and one that counts the round up (tests/gpu/order.cu). A collective that read its
 * input before the fill's stores were visible would sum the round before's input. Rounds run back to back
 * with no synchronisation between them, eagerly and replayed from a CUDA graph, for an all-reduce out of
 * place and in place at sizes of each protocol. The count of wrong elements must be 0.
 *
 * The control runs the same rounds with the test's own copy in the collective's place, launched to overlap
 * the fill: without waiting for it (it prints how many stale elements it copied: what this test would see of
 * a collective that did not wait), and waiting for it (which must copy none).
 */
#include <stdint.h>
#include <string.h>

#include "cuda_case.h"
#include "harness.h"

extern const unsigned char order_fatbin[];
extern const unsigned long long order_fatbin_size;

#define ROUNDS    40
#define SPIN_NS   20000 /* the fill's busy wait before it writes */
#define GRID      64
#define BLOCK     256
#define TIMEOUT_S 120

typedef struct {
  cudaLibrary_t lib;
  cudaKernel_t fill, check, next, copy, check_copy;
} order_kernels_t;

static void kernels_load(order_kernels_t *k) {
  CUDA_OK(cudaLibraryLoadData(&k->lib, order_fatbin, NULL, NULL, 0, NULL, NULL, 0));
  CUDA_OK(cudaLibraryGetKernel(&k->fill, k->lib, "order_fill"));
  CUDA_OK(cudaLibraryGetKernel(&k->check, k->lib, "order_check"));
  CUDA_OK(cudaLibraryGetKernel(&k->next, k->lib, "order_next"));
  CUDA_OK(cudaLibraryGetKernel(&k->copy, k->lib, "order_copy"));
  CUDA_OK(cudaLibraryGetKernel(&k->check_copy, k->lib, "order_check_copy"));
}

/* A launch on `s`; with `overlap`, one that may overlap the stream's previous kernel. */
static void launch(cudaKernel_t f, unsigned grid, void **args, cudaStream_t s, int overlap) {
  cudaLaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = (dim3){grid, 1, 1};
  cfg.blockDim = (dim3){BLOCK, 1, 1};
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = overlap ? 1 : 0;
  CUDA_OK(cudaLaunchKernelExC(&cfg, (const void *)f, args));
}

typedef struct {
  const order_kernels_t *k;
  cudaStream_t s;
  float *in, *out; /* out == in: in place */
  uint64_t n;
  uint32_t *round, *bad;
  int rank;
  ncclComm_t comm;
} round_t;

/* One round on the stream: fill, the all-reduce, the check, the next round's number. */
static void one_round(round_t *r, const char *what) {
  uint64_t spin = SPIN_NS;
  void *fill[] = {&r->in, &r->n, &r->round, &r->rank, &spin};
  launch(r->k->fill, GRID, fill, r->s, 0);
  NCCL_OK(ncclAllReduce(r->in, r->out, r->n, ncclFloat, ncclSum, r->comm, r->s), what, r->comm);
  void *check[] = {&r->out, &r->n, &r->round, &r->bad};
  launch(r->k->check, GRID, check, r->s, 0);
  void *next[] = {&r->round};
  launch(r->k->next, 1, next, r->s, 0);
}

/* The count of wrong elements at `bad`, through the host word `h`. */
static uint32_t download_bad(cuda_rank_t *cr, uint32_t *h, const uint32_t *bad) {
  cuda_download(cr, h, bad, sizeof *h);
  return *h;
}

static void order_rank(int rank, int nranks, const ncclUniqueId *id, void *arg) {
  static const uint64_t counts[] = {1001, 65539, (1u << 20) + 5}; /* LL, LL128, Simple all-reduces */
  const uint64_t most = (1u << 20) + 5;
  cuda_rank_t cr;
  cuda_rank_open(&cr, rank, 2 * most * sizeof(float) + 4096, 4096, NULL);
  order_kernels_t k;
  kernels_load(&k);
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank", TIMEOUT_S);
  EXPECT_OK(ncclCommInitRank(&comm, nranks, *id, rank));
  float *in = cuda_dalloc(&cr, most * sizeof(float)), *out = cuda_dalloc(&cr, most * sizeof(float));
  uint32_t *words = cuda_dalloc(&cr, 2 * sizeof(uint32_t)), *h = cuda_halloc(&cr, sizeof *h);
  char what[160];
  for (int graph = 0; graph < 2; graph++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
      for (int inplace = 0; inplace < 2; inplace++) {
        snprintf(what, sizeof what, "%s all-reduce of %llu floats %s, rank %d: %d rounds after a fill",
                 graph ? "captured" : "eager", (unsigned long long)counts[c],
                 inplace ? "in place" : "out of place", rank, ROUNDS);
        cuda_watch(what, TIMEOUT_S);
        cuda_fill(&cr, words, 0, 2 * sizeof(uint32_t));
        cuda_fill(&cr, out, 0x7f, most * sizeof(float)); /* 3.4e38: never a sum */
        round_t r = {.k = &k,
                     .s = cr.stream,
                     .in = inplace ? out : in,
                     .out = out,
                     .n = counts[c],
                     .round = words,
                     .bad = words + 1,
                     .rank = rank,
                     .comm = comm};
        if (!graph) {
          for (int i = 0; i < ROUNDS; i++) one_round(&r, what);
        } else {
          cudaGraph_t g;
          cudaGraphExec_t ge;
          CUDA_OK(cudaStreamBeginCapture(cr.stream, cudaStreamCaptureModeThreadLocal));
          one_round(&r, what);
          CUDA_OK(cudaStreamEndCapture(cr.stream, &g));
          CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
          for (int i = 0; i < ROUNDS; i++) CUDA_OK(cudaGraphLaunch(ge, cr.stream));
          cuda_sync(cr.stream, what);
          CUDA_OK(cudaGraphExecDestroy(ge));
          CUDA_OK(cudaGraphDestroy(g));
        }
        cuda_sync(cr.stream, what);
        const uint32_t bad = download_bad(&cr, h, words + 1);
        EXPECT(bad == 0, "%s: %u wrong elements", what, bad);
      }
  cuda_watch("ncclCommDestroy", TIMEOUT_S);
  EXPECT_OK(ncclCommDestroy(comm));
  CUDA_OK(cudaLibraryUnload(k.lib));
  cuda_unwatch();
  cuda_rank_close(&cr);
}

/* The collective's rounds. */
static void procs_order(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 2 * TIMEOUT_S, order_rank, NULL) == 0, "a rank failed");
}

/* The control on one GPU: the fill, the test's copy of its input overlapping it, the copy's check. */
static void control_rank(int rank, int nranks, const ncclUniqueId *id, void *arg) {
  if (rank != 0) return;
  const uint64_t n = 1u << 20;
  cuda_rank_t cr;
  cuda_rank_open(&cr, rank, 2 * n * sizeof(float) + 4096, 4096, NULL);
  order_kernels_t k;
  kernels_load(&k);
  float *in = cuda_dalloc(&cr, n * sizeof(float)), *copy = cuda_dalloc(&cr, n * sizeof(float));
  uint32_t *words = cuda_dalloc(&cr, 2 * sizeof(uint32_t));
  uint32_t *round = words, *bad = words + 1, *h = cuda_halloc(&cr, sizeof *h);
  for (int wait = 0; wait < 2; wait++) {
    cuda_watch("the control's rounds", TIMEOUT_S);
    cuda_fill(&cr, words, 0, 2 * sizeof(uint32_t));
    uint64_t spin = SPIN_NS, nn = n;
    for (int i = 0; i < ROUNDS; i++) {
      void *fill[] = {&in, &nn, &round, &rank, &spin};
      launch(k.fill, GRID, fill, cr.stream, 0);
      void *cp[] = {&in, &copy, &nn, &wait};
      launch(k.copy, GRID, cp, cr.stream, 1);
      void *check[] = {&copy, &nn, &round, &rank, &bad};
      launch(k.check_copy, GRID, check, cr.stream, 0);
      void *next[] = {&round};
      launch(k.next, 1, next, cr.stream, 0);
    }
    cuda_sync(cr.stream, "the control's rounds");
    const uint32_t stale = download_bad(&cr, h, bad);
    if (wait)
      EXPECT(stale == 0, "a copy that waits for the fill copied %u stale elements", stale);
    else
      printf("control: a copy that overlaps the fill without waiting for it copied %u stale elements in %d "
             "rounds of %llu\n",
             stale, ROUNDS, (unsigned long long)n);
  }
  CUDA_OK(cudaLibraryUnload(k.lib));
  cuda_unwatch();
  cuda_rank_close(&cr);
}

static void control(void) {
  EXPECT(cuda_run_ranks(1, TIMEOUT_S, control_rank, NULL) == 0, "the control failed");
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  if (cuda_host) {
    printf("the order of a user's kernels and a collective's is a GPU matter: nothing to run on the host\n");
    return CUDA_SKIP;
  }
  TEST(control, TIMEOUT_S + 30);
  TEST(procs_order, 2 * TIMEOUT_S + 30);
  return test_summary();
}
