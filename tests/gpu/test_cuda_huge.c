/*
 * Counts past 2^31 elements, one process per GPU: an int8 all-reduce of 2^31 + 13 elements (out of place) and
 * an int8 broadcast of as many (in place, from the last rank), or --count elements.
 *
 * Inputs repeat with a prime period, so the host builds and checks the 2 GiB buffers a whole number of
 * periods at a time (memcpy and memcmp instead of element by element). An element that lands in the wrong
 * place, a 32-bit index wrapping at 2^31 for one, almost always lands on a different value of the period.
 * Outputs are poisoned before the call, and the bytes right after them must still be poisoned afterwards.
 */
#include <string.h>

#include "cuda_case.h"
#include "data.h"
#include "harness.h"

#define PERIOD 1000003                /* elements; prime */
#define CHUNK  ((size_t)PERIOD * 256) /* bytes per copy: whole periods, about 256 MB */
#define GUARD  4096
/* Output poison, different on every rank so that bytes a peer writes past its end are told apart. */
#define POISON(rank) (0x70 + (rank))
#define TIMEOUT_S    120

static size_t huge_count(void) {
  return cuda_count_arg ? cuda_count_arg : ((size_t)1 << 31) + 13;
}

/* A chunk of whole periods of value(i) for i < PERIOD. */
static void fill_chunk(char *chunk, uint64_t seed, int nranks, int rank, int reduce) {
  for (size_t i = 0; i < PERIOD; i++) {
    double v = reduce ? data_expect(seed, nranks, i, ncclInt8, ncclSum, 0)
                      : data_value(seed, rank, i, ncclInt8, ncclSum);
    data_set(chunk, i, ncclInt8, v);
  }
  for (size_t at = PERIOD; at < CHUNK; at += PERIOD) memcpy(chunk + at, chunk, PERIOD);
}

static void upload_periodic(cuda_rank_t *r, char *dst, const char *chunk, size_t bytes) {
  for (size_t at = 0; at < bytes; at += CHUNK)
    cuda_upload(r, dst + at, chunk, bytes - at < CHUNK ? bytes - at : CHUNK);
}

/* Compares `bytes` of device memory with the periodic `want`, then the guard after them. */
static void expect_periodic(cuda_rank_t *r, int rank, const char *what, const char *dev, const char *want,
                            size_t bytes, char *scratch) {
  for (size_t at = 0; at < bytes; at += CHUNK) {
    size_t len = bytes - at < CHUNK ? bytes - at : CHUNK;
    cuda_download(r, scratch, dev + at, len);
    if (memcmp(scratch, want, len) == 0) continue;
    size_t i = 0, wrong = 0;
    while (scratch[i] == want[i]) i++;
    for (size_t j = i; j < len; j++) wrong += scratch[j] != want[j];
    test_fail(__FILE__, __LINE__,
              "%s: element %zu is %d, expected %d (%zu wrong in the %zu elements from %zu)", what, at + i,
              (int8_t)scratch[i], (int8_t)want[i], wrong, len, at);
  }
  cuda_download(r, scratch, dev + bytes, GUARD);
  for (size_t i = 0; i < GUARD; i++)
    EXPECT((unsigned char)scratch[i] == POISON(rank), "%s: byte %zu after the output was written (0x%02x)",
           what, i, (unsigned char)scratch[i]);
}

static void huge_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  size_t count = huge_count();
  char what[160];
  cuda_rank_t r;
  cuda_rank_open(&r, rank, 2 * (count + GUARD) + 1024, 2 * CHUNK + 1024, NULL);
  ncclComm_t comm;
  cuda_watch("ncclCommInitRank", TIMEOUT_S);
  EXPECT_OK(ncclCommInitRank(&comm, n, *id, rank));
  char *send = cuda_dalloc(&r, count + GUARD), *recv = cuda_dalloc(&r, count + GUARD);
  char *chunk = cuda_halloc(&r, CHUNK), *scratch = cuda_halloc(&r, CHUNK);

  /* All-reduce, out of place. */
  const uint64_t seed = 31;
  snprintf(what, sizeof what, "[procs] AllReduce int8 sum count %zu out-of-place, rank %d of %d", count, rank,
           n);
  cuda_watch(what, TIMEOUT_S);
  fill_chunk(chunk, seed, n, rank, 0);
  upload_periodic(&r, send, chunk, count);
  cuda_fill(&r, recv, POISON(rank), count + GUARD);
  NCCL_OK(ncclAllReduce(send, recv, count, ncclInt8, ncclSum, comm, r.stream), what, comm);
  cuda_sync(r.stream, what);
  fill_chunk(chunk, seed, n, rank, 1);
  expect_periodic(&r, rank, what, recv, chunk, count, scratch);

  /* Broadcast, in place, from the last rank. */
  int root = n - 1;
  snprintf(what, sizeof what, "[procs] Broadcast int8 count %zu in-place root %d, rank %d of %d", count, root,
           rank, n);
  cuda_watch(what, TIMEOUT_S);
  fill_chunk(chunk, seed + 1, n, root, 0);
  cuda_fill(&r, recv, POISON(rank), count + GUARD);
  if (rank == root) upload_periodic(&r, recv, chunk, count);
  NCCL_OK(ncclBroadcast(recv, recv, count, ncclInt8, root, comm, r.stream), what, comm);
  cuda_sync(r.stream, what);
  expect_periodic(&r, rank, what, recv, chunk, count, scratch);

  cuda_watch("ncclCommDestroy", TIMEOUT_S);
  EXPECT_OK(ncclCommDestroy(comm));
  cuda_unwatch();
  cuda_rank_close(&r);
}

static void procs_huge(void) {
  EXPECT(cuda_run_ranks(cuda_nranks, 2 * TIMEOUT_S + 60, huge_rank, NULL) == 0, "a rank failed");
}

int main(int argc, char **argv) {
  cuda_init(argc, argv);
  TEST(procs_huge, 2 * TIMEOUT_S + 90);
  return test_summary();
}
