/*
 * Tests of the bench's statistics (tools/stats.c): the median of odd, even, unsorted and degenerate sample
 * sets, and the per-size batch (bounded, never growing with the size, the same for the same size).
 */
#include <math.h>
#include <stdlib.h>

#include "harness.h"
#include "stats.h"

static void test_median(void) {
  double odd[] = {3, 1, 2};
  EXPECT(stats_median(odd, 3) == 2);
  double even[] = {4, 1, 3, 2};
  EXPECT(stats_median(even, 4) == 2.5);
  double one[] = {5};
  EXPECT(stats_median(one, 1) == 5);
  double ties[] = {2, 9, 2, 2};
  EXPECT(stats_median(ties, 4) == 2);
  double negative[] = {-1, -7, 4, 0, -3};
  EXPECT(stats_median(negative, 5) == -1);
  EXPECT(isnan(stats_median(NULL, 0)));
  /* An outlier moves a mean, not a median. */
  double outlier[] = {10, 11, 10, 12, 1e9, 11, 10};
  EXPECT(stats_median(outlier, 7) == 11);
}

/* Many samples in descending order: the median is the middle one. */
static void test_median_large(void) {
  int n = 10001;
  double *v = malloc((size_t)n * sizeof(double));
  EXPECT(v != NULL);
  for (int i = 0; i < n; i++) v[i] = n - i;
  EXPECT(stats_median(v, n) == (n + 1) / 2);
  free(v);
}

static void test_batch(void) {
  for (int gpu = 0; gpu <= 1; gpu++) {
    int prev = STATS_BATCH_MAX;
    for (int shift = 0; shift <= 34; shift++) {
      size_t bytes = (size_t)1 << shift;
      int k = stats_batch(bytes, gpu);
      EXPECT(k >= 1 && k <= STATS_BATCH_MAX, "%zu bytes: batch %d", bytes, k);
      EXPECT(k <= prev, "%zu bytes: batch %d after %d", bytes, k, prev);
      EXPECT(k == stats_batch(bytes, gpu), "not a function of the size");
      prev = k;
    }
    EXPECT(stats_batch(0, gpu) >= 1);
    EXPECT(stats_batch((size_t)1 << 32, gpu) == 1, "4 GiB takes long enough alone");
  }
  EXPECT(stats_batch(8, 1) == STATS_BATCH_MAX, "small GPU calls take the most iterations");
  EXPECT(stats_batch(8, 0) > 1 && stats_batch(8, 0) < STATS_BATCH_MAX, "host: a few tens");
}

int main(void) {
  TEST(test_median, 10);
  TEST(test_median_large, 10);
  TEST(test_batch, 10);
  return test_summary();
}
