/*
 * One-rank communicators on the GPU executor, against the tests' stand-in driver (tests/gpu/mock_cuda.c): a
 * call that leaves its buffer as it is (in place, an operation that keeps a lone operand) enqueues nothing;
 * an out-of-place call whose copy is at least BRAID_LOCAL_CE_MIN_BYTES (by default every one) goes to the
 * copy engines (one cuMemcpyDtoDAsync, which the stand-in carries out) instead of a kernel; smaller copies,
 * and calls that scale (PreMulSum), launch a kernel as before.
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

#include "base/param.h"

#ifdef BRAID_MOCK_CUDA_DIR

#include "../gpu/mock_cuda.h"

enum { BIG = 1 << 19, SMALL = 1 << 12 }; /* floats: 2 MiB and 16 KiB */

static mock_cuda_stats_t *stats(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW); /* the library loads it the same way, later */
  mock_cuda_stats_t *s = lib != NULL ? dlsym(lib, "mock_cuda_stats") : NULL;
  EXPECT(s != NULL, "the loaded libcuda.so.1 is not the stand-in driver");
  return s;
}

typedef struct {
  ncclComm_t comm;
  float *a, *b;  /* device buffers of BIG floats (host memory under the stand-in) */
  uint64_t k, c; /* kernel launches and device copies before the call */
} one_t;

static void open_one(one_t *o) {
  setenv("BRAID_DEVICE", "cuda", 1);
  EXPECT_OK(ncclCommInitAll(&o->comm, 1, NULL));
  EXPECT_OK(ncclMemAlloc((void **)&o->a, BIG * sizeof(float)));
  EXPECT_OK(ncclMemAlloc((void **)&o->b, BIG * sizeof(float)));
  srand(7);
  for (int i = 0; i < BIG; i++) o->a[i] = (float)rand() / RAND_MAX - 0.5f;
  for (int i = 0; i < BIG; i++) o->b[i] = -1e30f; /* poison */
}

static void mark(one_t *o) {
  o->k = stats()->plain_launches + stats()->overlap_launches;
  o->c = stats()->dd_copies;
}

/* What the call did since mark(): kernel launches and device copies. */
static void expect_did(const one_t *o, uint64_t kernels, uint64_t copies, const char *what) {
  uint64_t k = stats()->plain_launches + stats()->overlap_launches - o->k, c = stats()->dd_copies - o->c;
  EXPECT(k == kernels && c == copies, "%s: %llu kernel launches and %llu copies, expected %llu and %llu",
         what, (unsigned long long)k, (unsigned long long)c, (unsigned long long)kernels,
         (unsigned long long)copies);
}

static void close_one(one_t *o) {
  EXPECT_OK(ncclMemFree(o->a));
  EXPECT_OK(ncclMemFree(o->b));
  EXPECT_OK(ncclCommDestroy(o->comm));
}

/* In place with every built-in operation, and every collective in place: nothing is enqueued. */
static void in_place_enqueues_nothing(void) {
  one_t o;
  open_one(&o);
  float first = o.a[0];
  static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  mark(&o);
  for (int i = 0; i < 5; i++) EXPECT_OK(ncclAllReduce(o.a, o.a, BIG, ncclFloat, ops[i], o.comm, NULL));
  EXPECT_OK(ncclAllReduce(o.a, o.a, BIG, ncclInt32, ncclAvg, o.comm, NULL));
  EXPECT_OK(ncclBroadcast(o.a, o.a, BIG, ncclFloat, 0, o.comm, NULL));
  EXPECT_OK(ncclReduce(o.a, o.a, BIG, ncclFloat, ncclMax, 0, o.comm, NULL));
  EXPECT_OK(ncclAllGather(o.a, o.a, BIG, ncclFloat, o.comm, NULL));
  EXPECT_OK(ncclReduceScatter(o.a, o.a, BIG, ncclFloat, ncclSum, o.comm, NULL));
  EXPECT_OK(ncclAlltoAll(o.a, o.a, BIG, ncclFloat, o.comm, NULL));
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(o.a, o.a, SMALL, ncclFloat, ncclSum, o.comm, NULL));
  EXPECT_OK(ncclGroupEnd());
  expect_did(&o, 0, 0, "in-place calls on one rank");
  EXPECT(o.a[0] == first, "an in-place call changed the buffer");
  close_one(&o);
}

/* Out of place from BRAID_LOCAL_CE_MIN_BYTES: one copy, the output equal to the input. */
static void large_copies_go_to_the_copy_engines(void) {
  one_t o;
  open_one(&o);
  mark(&o);
  EXPECT_OK(ncclAllReduce(o.a, o.b, BIG, ncclFloat, ncclSum, o.comm, NULL));
  expect_did(&o, 0, 1, "an out-of-place all-reduce of 2 MiB");
  EXPECT(memcmp(o.a, o.b, BIG * sizeof(float)) == 0, "the copy differs from the input");
  for (int i = 0; i < BIG; i++) o.b[i] = -1e30f;
  mark(&o);
  EXPECT_OK(ncclAllReduce(o.a, o.b, BIG, ncclFloat, ncclAvg, o.comm, NULL)); /* a factor of 1: a copy */
  EXPECT_OK(ncclAllGather(o.a, o.b, BIG, ncclFloat, o.comm, NULL));
  EXPECT_OK(ncclBroadcast(o.a, o.b, BIG, ncclFloat, 0, o.comm, NULL));
  expect_did(&o, 0, 3, "an average, an all-gather and a broadcast of 2 MiB out of place");
  EXPECT(memcmp(o.a, o.b, BIG * sizeof(float)) == 0, "the copies differ from the input");
  close_one(&o);
}

/* Below the threshold (set here: by default every copy takes the copy engines), and where the copy would
 * scale, a kernel as before. */
static void small_or_scaled_calls_launch_a_kernel(void) {
  one_t o;
  setenv("BRAID_LOCAL_CE_MIN_BYTES", "524288", 1);
  param_reload();
  open_one(&o);
  mark(&o);
  EXPECT_OK(ncclAllReduce(o.a, o.b, SMALL, ncclFloat, ncclSum, o.comm, NULL));
  expect_did(&o, 1, 0, "an out-of-place all-reduce of 16 KiB");
  float two = 2.0f;
  ncclRedOp_t op;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat, ncclScalarHostImmediate, o.comm));
  mark(&o);
  EXPECT_OK(ncclAllReduce(o.a, o.b, BIG, ncclFloat, op, o.comm, NULL));
  EXPECT_OK(ncclAllReduce(o.a, o.a, BIG, ncclFloat, op, o.comm, NULL));
  expect_did(&o, 2, 0, "a PreMulSum by 2 out of place and in place");
  EXPECT_OK(ncclRedOpDestroy(op, o.comm));
  close_one(&o);
  unsetenv("BRAID_LOCAL_CE_MIN_BYTES");
  param_reload();
}

/* By default even the smallest copy takes the copy engines. */
static void small_copies_go_to_the_copy_engines(void) {
  one_t o;
  open_one(&o);
  mark(&o);
  EXPECT_OK(ncclAllReduce(o.a, o.b, 1, ncclFloat, ncclSum, o.comm, NULL));
  EXPECT_OK(ncclAllGather(o.a, o.b, SMALL, ncclFloat, o.comm, NULL));
  expect_did(&o, 0, 2, "an out-of-place all-reduce of 4 B and an all-gather of 16 KiB");
  EXPECT(o.b[0] == o.a[0] && memcmp(o.a, o.b, SMALL * sizeof(float)) == 0,
         "the copies differ from the input");
  EXPECT(o.b[SMALL] == -1e30f, "a copy wrote past its output");
  close_one(&o);
}

static void host_backend_in_place(void) {
  setenv("BRAID_DEVICE", "host", 1);
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitAll(&comm, 1, NULL));
  float x[7] = {1, 2, 3, 4, 5, 6, 7}, y[7];
  EXPECT_OK(ncclAllReduce(x, x, 7, ncclFloat, ncclProd, comm, NULL));
  EXPECT_OK(ncclAllReduce(x, y, 7, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 7; i++) EXPECT(x[i] == i + 1 && y[i] == i + 1, "element %d: %g, %g", i, x[i], y[i]);
  EXPECT_OK(ncclCommDestroy(comm));
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  test_filter(argc - 1, argv + 1);
  TEST(in_place_enqueues_nothing, 60);
  TEST(large_copies_go_to_the_copy_engines, 60);
  TEST(small_or_scaled_calls_launch_a_kernel, 60);
  TEST(small_copies_go_to_the_copy_engines, 60);
  TEST(host_backend_in_place, 60);
  return test_summary();
}

#else

int main(void) {
  printf("no stand-in CUDA driver in this build (CUDA's headers were not found): nothing to test\n");
  return 0;
}

#endif
