/*
 * Collectives on the kinds of memory a program can hand over, one process per GPU, each phase a set of calls
 * (several collectives, two types, small and large counts, in and out of place, unaligned offsets) checked as
 * in the matrix (cuda_case.h):
 *   memalloc_buffers   ncclMemAlloc memory, not registered, then freed with ncclMemFree;
 *   registered_buffers ncclCommRegister'ed memory from ncclMemAlloc and from cudaMalloc, then the same memory
 *                      after ncclCommDeregister;
 *   window_buffers     ncclCommWindowRegister'ed ncclMemAlloc memory (symmetric, then default flags), calls
 *                      on a cudaMalloc buffer outside any window while a window exists, then the memory after
 *                      ncclCommWindowDeregister.
 * Every rank takes its buffers from its pool in the same order, so a buffer sits at the same offset of every
 * rank's window, as symmetric windows expect.
 */
#include "coll_check.h"
#include "cuda_case.h"
#include "data.h"
#include "harness.h"

#define TIMEOUT_S 60
#define POOL      ((size_t)64 << 20)

/* A phase's calls on the pool r hands out; r's pools are reset after each. */
static void phase(ncclComm_t comm, cuda_rank_t *r, const char *mode, uint64_t seed) {
  static const kind_t kinds[] = {K_ALLREDUCE, K_ALLGATHER, K_REDUCESCATTER, K_ALLTOALL,
                                 K_BROADCAST, K_SENDRECV,  K_REDUCE};
  static const ncclDataType_t types[] = {ncclFloat32, ncclBfloat16};
  static const size_t counts[] = {1031, 1000003};
  int n;
  EXPECT_OK(ncclCommCount(comm, &n));
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
      for (size_t s = 0; s < sizeof counts / sizeof counts[0]; s++)
        for (int inplace = 0; inplace < 2; inplace++) {
          coll_case_t c = {.kind = kinds[k],
                           .type = types[t],
                           .op = ncclSum,
                           .count = counts[s],
                           .inplace = inplace,
                           .root = (int)(seed % n),
                           .offset = (int)((seed % 3) * data_esize(types[t])),
                           .seed = seed};
          seed++;
          cuda_case_run(comm, r, &c, mode, TIMEOUT_S);
        }
}

static ncclComm_t init(int rank, int n, const ncclUniqueId *id) {
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank", TIMEOUT_S);
  EXPECT_OK(ncclCommInitRank(&comm, n, *id, rank));
  cuda_unwatch();
  return comm;
}

static void destroy(ncclComm_t comm) {
  cuda_watch("ncclCommDestroy", TIMEOUT_S);
  EXPECT_OK(ncclCommDestroy(comm));
  cuda_unwatch();
}

static void memalloc_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  ncclComm_t comm = init(rank, n, id);
  void *mem;
  NCCL_OK(ncclMemAlloc(&mem, POOL), "ncclMemAlloc of the pool", comm);
  cuda_rank_t r;
  cuda_rank_open(&r, rank, POOL, 2 * POOL, mem);
  phase(comm, &r, "procs, ncclMemAlloc memory", 100);
  cuda_rank_close(&r);
  destroy(comm);
  EXPECT_OK(ncclMemFree(mem));
}

static void registered_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  ncclComm_t comm = init(rank, n, id);
  void *mem, *handle;
  NCCL_OK(ncclMemAlloc(&mem, POOL), "ncclMemAlloc of the pool", comm);
  cuda_rank_t r, plain;
  cuda_rank_open(&r, rank, POOL, 2 * POOL, mem);
  NCCL_OK(ncclCommRegister(comm, mem, POOL, &handle), "ncclCommRegister of ncclMemAlloc memory", comm);
  phase(comm, &r, "procs, registered ncclMemAlloc memory", 200);
  NCCL_OK(ncclCommDeregister(comm, handle), "ncclCommDeregister of ncclMemAlloc memory", comm);
  phase(comm, &r, "procs, ncclMemAlloc memory after ncclCommDeregister", 300);
  cuda_rank_open(&plain, rank, POOL, 2 * POOL, NULL);
  NCCL_OK(ncclCommRegister(comm, plain.dbase, POOL, &handle), "ncclCommRegister of cudaMalloc memory", comm);
  phase(comm, &plain, "procs, registered cudaMalloc memory", 400);
  NCCL_OK(ncclCommDeregister(comm, handle), "ncclCommDeregister of cudaMalloc memory", comm);
  phase(comm, &plain, "procs, cudaMalloc memory after ncclCommDeregister", 500);
  cuda_rank_close(&plain);
  cuda_rank_close(&r);
  destroy(comm);
  EXPECT_OK(ncclMemFree(mem));
}

static void window_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  ncclComm_t comm = init(rank, n, id);
  void *mem;
  ncclWindow_t win;
  NCCL_OK(ncclMemAlloc(&mem, POOL), "ncclMemAlloc of the pool", comm);
  cuda_rank_t r, plain;
  cuda_rank_open(&r, rank, POOL, 2 * POOL, mem);
  cuda_rank_open(&plain, rank, POOL, 2 * POOL, NULL);
  static const int flags[] = {NCCL_WIN_COLL_SYMMETRIC, NCCL_WIN_DEFAULT};
  static const char *modes[] = {"procs, symmetric window", "procs, window with default flags"};
  for (int f = 0; f < 2; f++) {
    cuda_watch("ncclCommWindowRegister (every rank takes part)", TIMEOUT_S);
    NCCL_OK(ncclCommWindowRegister(comm, mem, POOL, &win, flags[f]), modes[f], comm);
    phase(comm, &r, modes[f], 600 + 100 * (uint64_t)f);
    phase(comm, &plain, "procs, cudaMalloc memory outside a window", 800 + 100 * (uint64_t)f);
    cuda_watch("ncclCommWindowDeregister (every rank takes part)", TIMEOUT_S);
    NCCL_OK(ncclCommWindowDeregister(comm, win), modes[f], comm);
    cuda_unwatch();
  }
  phase(comm, &r, "procs, ncclMemAlloc memory after ncclCommWindowDeregister", 1000);
  cuda_rank_close(&plain);
  cuda_rank_close(&r);
  destroy(comm);
  EXPECT_OK(ncclMemFree(mem));
}

static void memalloc_buffers(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 4 * TIMEOUT_S, memalloc_rank, NULL) == 0, "a rank failed");
}

static void registered_buffers(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 4 * TIMEOUT_S, registered_rank, NULL) == 0, "a rank failed");
}

static void window_buffers(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 4 * TIMEOUT_S, window_rank, NULL) == 0, "a rank failed");
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(memalloc_buffers, 5 * TIMEOUT_S);
  TEST(registered_buffers, 5 * TIMEOUT_S);
  TEST(window_buffers, 5 * TIMEOUT_S);
  return test_summary();
}
