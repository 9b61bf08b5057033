/*
 * Out of device memory is an error, never a hang, one process per rank: each rank fills its GPU with
 * cudaMalloc until less than a megabyte is left, then makes a communicator (whose connections and executor
 * need tens of megabytes). Every rank's init must come back within a bound; at least one must fail with a
 * message that says it ran out of device memory, naming what it allocated and how many bytes; and since init
 * is collective, no rank may succeed while another failed. Once the filler is freed, the failed ranks' state
 * is gone: a second communicator on the same GPUs runs an all-reduce correctly. Needs real GPUs (skipped with
 * --host, where nothing fills).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "coll_check.h"
#include "cuda_case.h"
#include "harness.h"

#define BOUND_S   60
#define MAX_FILLS 4096

typedef struct {
  int opened; /* ranks whose buffers are allocated: none fills a GPU before ranks sharing it have theirs */
  int failed[8];
  char message[8][400];
} oom_t;

static oom_t *oom;

/* Allocates device memory in ever smaller pieces until less than 1 MiB is left; returns how many pieces. */
static int fill(void **pieces) {
  int n = 0;
  for (size_t chunk = (size_t)1 << 30; chunk >= ((size_t)1 << 20) && n < MAX_FILLS;) {
    if (cudaMalloc(&pieces[n], chunk) == cudaSuccess)
      n++;
    else
      chunk /= 2;
  }
  (void)cudaGetLastError(); /* the failed cudaMalloc's error is expected */
  return n;
}

static void oom_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  cuda_rank_t r;
  cuda_rank_open(&r, rank, 16 << 20, 16 << 20, NULL);
  cuda_watch("the other ranks' buffers before filling the GPU", BOUND_S);
  __atomic_add_fetch(&oom->opened, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&oom->opened, __ATOMIC_SEQ_CST) < n) usleep(1000);
  cuda_unwatch();
  static void *pieces[MAX_FILLS];
  int npieces = fill(pieces);
  ncclComm_t comm = NULL;
  cuda_watch("ncclCommInitRank on a full GPU", BOUND_S);
  ncclResult_t res = ncclCommInitRank(&comm, n, *id, rank);
  cuda_unwatch();
  oom->failed[rank] = res != ncclSuccess;
  snprintf(oom->message[rank], sizeof oom->message[rank], "%s",
           res != ncclSuccess ? ncclGetLastError(NULL) : "");
  printf("rank %d: %d pieces fill the GPU; init: %s %s\n", rank, npieces, ncclGetErrorString(res),
         oom->message[rank]);
  cuda_watch("ncclCommAbort after init on a full GPU", BOUND_S);
  if (comm != NULL) EXPECT_OK(ncclCommAbort(comm));
  cuda_unwatch();
  for (int i = 0; i < npieces; i++) CUDA_OK(cudaFree(pieces[i]));
  cuda_rank_close(&r);
}

/* After the filler is gone, the same GPUs run a communicator again. */
static void again_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  cuda_rank_t r;
  cuda_rank_open(&r, rank, 64 << 20, 64 << 20, NULL);
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank after the GPU was freed", BOUND_S);
  EXPECT_OK(ncclCommInitRank(&comm, n, *id, rank));
  coll_case_t c = {.kind = K_ALLREDUCE, .type = ncclFloat32, .op = ncclSum, .count = 1000003, .seed = 3};
  cuda_case_run(comm, &r, &c, "procs, after running out of memory", BOUND_S);
  EXPECT_OK(ncclCommDestroy(comm));
  cuda_unwatch();
  cuda_rank_close(&r);
}

static void full_gpu(void) {
  if (cuda_host) {
    printf("--host: nothing to fill\n");
    return;
  }
  oom = mmap(NULL, sizeof *oom, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(oom != MAP_FAILED, "mmap");
  memset(oom, 0, sizeof *oom);
  EXPECT(cuda_run_ranks(cuda_nranks, 4 * BOUND_S, oom_rank, NULL) == 0, "a rank failed");
  int failed = 0, named = 0;
  for (int r = 0; r < cuda_nranks; r++) {
    failed += oom->failed[r];
    named += strstr(oom->message[r], "out of device memory allocating") != NULL &&
             strstr(oom->message[r], "bytes") != NULL;
  }
  EXPECT(named >= 1, "no rank said it ran out of device memory and what it allocated");
  EXPECT(failed == cuda_nranks, "%d of %d ranks failed init; a collective init must fail on all or none",
         failed, cuda_nranks);
  EXPECT(cuda_run_ranks(cuda_nranks, 4 * BOUND_S, again_rank, NULL) == 0,
         "a rank failed after the GPU was freed");
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(full_gpu, 10 * BOUND_S);
  return test_summary();
}
