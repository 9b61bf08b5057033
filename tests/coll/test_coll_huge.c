/*
 * Counts past 2^31 elements: an int8 all-reduce and a uint8 broadcast of 2^31 + 13 elements between two
 * processes, checked element by element (a cheap pattern, so that filling and checking stay fast).
 */
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"
#include "nccl.h"

static ncclUniqueId id;
static const size_t count = (1ull << 31) + 13;

/* Input element i of `rank`: small values whose sum over two ranks stays in int8. */
static int8_t value(int rank, size_t i) {
  return (int8_t)((i * 7 + (size_t)rank * 3 + (i >> 31) * 5) % 11) - 5;
}

static void rank_main(int rank, int n, void *arg) {
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  int8_t *in = malloc(count), *out = malloc(count);
  EXPECT(in != NULL && out != NULL, "cannot allocate 2 x %zu bytes", count);
  for (size_t i = 0; i < count; i++) in[i] = value(rank, i), out[i] = 0x7b;
  EXPECT_OK(ncclAllReduce(in, out, count, ncclInt8, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int8_t want = (int8_t)(value(0, i) + value(1, i));
    if (out[i] != want) EXPECT(out[i] == want, "all-reduce element %zu is %d, expected %d", i, out[i], want);
  }
  EXPECT_OK(ncclBroadcast(rank == 1 ? (void *)in : NULL, out, count, ncclUint8, 1, comm, NULL));
  for (size_t i = 0; i < count; i++)
    if (out[i] != value(1, i)) EXPECT(out[i] == value(1, i), "broadcast element %zu is %d", i, out[i]);
  EXPECT_OK(ncclCommDestroy(comm));
}

static void past_2_31(void) {
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT(run_ranks(2, 280, rank_main, NULL) == 0, "a rank failed");
}

int main(void) {
  TEST(past_2_31, 300);
  return test_summary();
}
