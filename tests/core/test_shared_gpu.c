/*
 * Ranks of one process that share a GPU launch into one CUDA context, where the GPU does not time-slice
 * kernels: a launch whose blocks wait for a peer's blocks deadlocks unless both launches are resident at
 * once. So the blocks of every rank of a process on one device must fit the device's multiprocessors
 * together. Checked against the stand-in driver in its recording mode (nothing runs, every launch is told):
 * for each layout of ranks over devices, the widest launch of any collective times the process's ranks on a
 * device is at most the device's SM count. Ranks on devices of their own serve as the control: their launches
 * are wider than half the device, so the same collectives on a shared device would not fit without the limit.
 *
 * Without CUDA's headers there is no stand-in driver and nothing to test.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nccl.h"

#include "gpu/gpu.h"

#ifdef BRAID_MOCK_CUDA_DIR

#include "../gpu/mock_cuda.h"

enum { MAX_RANKS = 4, MAX_DEVS = 4 };

static unsigned widest[MAX_DEVS]; /* the widest launch seen on each device */

static void on_op(const mock_cuda_op_t *op) {
  if (op->kind != MOCK_OP_LAUNCH || op->dev < 0 || op->dev >= MAX_DEVS) return;
  if (op->grid > widest[op->dev]) widest[op->dev] = op->grid;
}

static void *mock_sym(const char *name) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW); /* the library loads the same one */
  void *sym = lib != NULL ? dlsym(lib, name) : NULL;
  EXPECT(sym != NULL, "the loaded libcuda.so.1 is not the stand-in driver (no %s)", name);
  return sym;
}

/* Every collective at a few sizes on ranks placed on `devs`; returns the widest launch on any device and
 * checks that each device's ranks fit it together. */
static unsigned run_layout(int n, const int *devs) {
  ncclComm_t comms[MAX_RANKS];
  void *buf[MAX_RANKS][2];
  const size_t bytes = (size_t)64 << 20;
  memset(widest, 0, sizeof widest);
  ncclUniqueId id;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclGroupStart()); /* ncclCommInitAll refuses a device listed twice, as NCCL's does */
  for (int r = 0; r < n; r++) {
    gpu_scope_t scope;
    EXPECT_OK(gpu_enter(devs[r], &scope));
    EXPECT_OK(ncclCommInitRank(&comms[r], n, id, r));
    gpu_leave(&scope);
  }
  EXPECT_OK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    gpu_scope_t scope;
    EXPECT_OK(gpu_enter(devs[r], &scope));
    EXPECT_OK(ncclMemAlloc(&buf[r][0], bytes));
    EXPECT_OK(ncclMemAlloc(&buf[r][1], bytes));
    gpu_leave(&scope);
  }
  const size_t counts[] = {1, 500001, bytes / (size_t)n};
  for (size_t s = 0; s < sizeof counts / sizeof *counts; s++) {
    const size_t c = counts[s], part = c / (size_t)n > 0 ? c / (size_t)n : 1;
    for (int coll = 0; coll < 5; coll++) {
      EXPECT_OK(ncclGroupStart());
      for (int r = 0; r < n; r++) {
        void *a = buf[r][0], *b = buf[r][1];
        switch (coll) {
        case 0:
          EXPECT_OK(ncclAllReduce(a, b, c, ncclFloat, ncclSum, comms[r], NULL));
          break;
        case 1:
          EXPECT_OK(ncclAllGather(a, b, part, ncclInt8, comms[r], NULL));
          break;
        case 2:
          EXPECT_OK(ncclReduceScatter(a, b, part, ncclFloat, ncclSum, comms[r], NULL));
          break;
        case 3:
          EXPECT_OK(ncclBroadcast(a, b, c, ncclInt8, 0, comms[r], NULL));
          break;
        default: /* all-to-all */
          for (int q = 0; q < n; q++) {
            EXPECT_OK(ncclSend((char *)a + (size_t)q * part, part, ncclInt8, q, comms[r], NULL));
            EXPECT_OK(ncclRecv((char *)b + (size_t)q * part, part, ncclInt8, q, comms[r], NULL));
          }
        }
      }
      EXPECT_OK(ncclGroupEnd());
    }
  }
  unsigned most = 0;
  for (int d = 0; d < MAX_DEVS; d++) {
    int sharers = 0;
    for (int r = 0; r < n; r++) sharers += devs[r] == d;
    EXPECT(
        widest[d] * (unsigned)sharers <= MOCK_CUDA_SMS,
        "%d ranks on device %d launch up to %u blocks each: %u blocks cannot be resident on %d SMs at once",
        sharers, d, widest[d], widest[d] * (unsigned)sharers, MOCK_CUDA_SMS);
    if (widest[d] > most) most = widest[d];
  }
  for (int r = 0; r < n; r++) {
    ncclResult_t async = ncclSuccess;
    EXPECT_OK(ncclCommGetAsyncError(comms[r], &async));
    EXPECT(async == ncclSuccess, "rank %d: %s", r, ncclGetErrorString(async));
    EXPECT_OK(ncclCommDestroy(comms[r]));
    EXPECT_OK(ncclMemFree(buf[r][0]));
    EXPECT_OK(ncclMemFree(buf[r][1]));
  }
  return most;
}

static void layouts(void) {
  mock_cuda_op_fn *hook = mock_sym(MOCK_CUDA_ON_OP);
  *hook = on_op;
  /* the control: a GPU each, launches wider than half a GPU (else this test shows nothing) */
  unsigned own2 = run_layout(2, (int[]){0, 1}), own4 = run_layout(4, (int[]){0, 1, 2, 3});
  EXPECT(own2 * 2 > MOCK_CUDA_SMS, "two ranks on GPUs of their own launch at most %u blocks", own2);
  EXPECT(own4 * 2 > MOCK_CUDA_SMS, "four ranks on GPUs of their own launch at most %u blocks", own4);
  run_layout(2, (int[]){0, 0});
  run_layout(4, (int[]){0, 0, 0, 0});
  run_layout(4, (int[]){0, 0, 1, 1});
  run_layout(3, (int[]){2, 0, 2});
  *hook = NULL;
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  setenv("MOCK_CUDA_RECORD", "1", 1);
  setenv("MOCK_CUDA_DEVICES", "4", 1);
  setenv("BRAID_DEVICE", "cuda", 1);
  TEST(layouts, 120);
  return test_summary();
}

#else

int main(void) {
  printf("built without CUDA's headers: no stand-in driver, nothing to test\n");
  return 0;
}

#endif
