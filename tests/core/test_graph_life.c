/*
 * Communicators destroyed while CUDA graphs hold their captured work, against the tests' stand-in driver
 * (tests/gpu/mock_cuda.c), on a machine without a GPU. PyTorch finalizes and destroys its communicators at
 * shutdown while programs still hold graphs that captured collectives; as with NCCL, both calls must succeed.
 * What a later replay could reach (the executor's device memory and mappings, the connections) must stay
 * allocated until the last graph is gone, and be freed by the library's next call after that.
 *
 * Without CUDA's headers there is no stand-in driver and nothing to test.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nccl.h"

#ifdef BRAID_MOCK_CUDA_DIR

#include "../gpu/mock_cuda.h"
#include "core/gpu_exec.h"

enum { COUNT = 1000 };

static mock_cuda_stats_t *stats(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW); /* the library loads it the same way, later */
  mock_cuda_stats_t *s = lib != NULL ? dlsym(lib, "mock_cuda_stats") : NULL;
  EXPECT(s != NULL, "the loaded libcuda.so.1 is not the stand-in driver");
  return s;
}

/* Device memory, mappings and page-locked memory the stand-in driver has handed out and not taken back. */
static int live(void) {
  const mock_cuda_stats_t *s = stats();
  return s->live_handles + s->live_maps + s->live_legacy + s->live_host;
}

static int graph_destroy(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *sym = lib != NULL ? dlsym(lib, MOCK_CUDA_GRAPH_DESTROY) : NULL;
  EXPECT(sym != NULL, "the stand-in driver exports no %s", MOCK_CUDA_GRAPH_DESTROY);
  mock_cuda_graph_destroy_fn fn;
  memcpy(&fn, &sym, sizeof sym);
  return fn();
}

/* Two ranks of one process each capture an all-reduce, then are finalized and destroyed with the graph alive.
 */
static void destroy_with_graph_alive(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  int before = live();
  ncclComm_t comms[2];
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL));
  void *buf[2];
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclMemAlloc(&buf[i], COUNT * sizeof(float)));
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++)
    EXPECT_OK(ncclAllReduce(buf[i], buf[i], COUNT, ncclFloat, ncclSum, comms[i],
                            (cudaStream_t)MOCK_CUDA_CAPTURING));
  EXPECT_OK(ncclGroupEnd());
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclMemFree(buf[i]));
  int with_comms = live();
  EXPECT(with_comms > before, "the communicators hold no device memory (%d, %d before)", with_comms, before);

  EXPECT_OK(ncclGroupStart()); /* one thread finalizes both ranks: together, at the group's end */
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclCommFinalize(comms[i]));
  EXPECT_OK(ncclGroupEnd());
  for (int i = 0; i < 2; i++) {
    ncclResult_t res = ncclCommDestroy(comms[i]);
    EXPECT(res == ncclSuccess, "ncclCommDestroy of rank %d with a live graph returned %d: %s", i, (int)res,
           ncclGetLastError(NULL));
  }
  gx_sweep();
  EXPECT(live() > before, "the memory a replay could reach was freed while the graph lives (%d, %d before)",
         live(), before);
  EXPECT(graph_destroy() == 2, "the graph did not hold one token per communicator");
  gx_sweep(); /* what the library's next call does first */
  EXPECT(live() == before, "%d allocations outlived the graph (%d before the communicators)", live(), before);
}

/* A communicator destroyed once its graph is gone frees everything at once, as before. */
static void destroy_after_graph(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  int before = live();
  ncclComm_t comms[2];
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL));
  void *buf[2];
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclMemAlloc(&buf[i], COUNT * sizeof(float)));
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++)
    EXPECT_OK(ncclAllReduce(buf[i], buf[i], COUNT, ncclFloat, ncclSum, comms[i],
                            (cudaStream_t)MOCK_CUDA_CAPTURING));
  EXPECT_OK(ncclGroupEnd());
  EXPECT(graph_destroy() == 2, "the graph did not hold one token per communicator");
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclMemFree(buf[i]));
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclCommDestroy(comms[i]));
  EXPECT(live() == before, "%d allocations outlived the communicators (%d before)", live(), before);
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  test_filter(argc - 1, argv + 1);
  TEST(destroy_with_graph_alive, 60);
  TEST(destroy_after_graph, 60);
  return test_summary();
}

#else

int main(void) {
  printf("no stand-in CUDA driver in this build (CUDA's headers were not found): nothing to test\n");
  return 0;
}

#endif
