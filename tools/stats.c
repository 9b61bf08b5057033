/*
 * The bench's statistics (see stats.h).
 */
#include "stats.h"

#include <math.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double stats_median(double *v, int n) {
  if (n <= 0) return NAN;
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int stats_batch(size_t bytes, int gpu) {
  /* The fastest a call could be: a fixed cost plus the bytes at a bandwidth no link beats (NVLink's
   * ~450 GB/s one way on GPUs; memory copies on the host). Underestimating a call's time only makes samples
   * longer than needed. */
  double floor_us = gpu ? 2.0 : 10.0, bytes_per_us = gpu ? 450e3 : 20e3;
  double call_us = floor_us + (double)bytes / bytes_per_us;
  double k = ceil(STATS_SAMPLE_MIN_US / call_us);
  return k >= STATS_BATCH_MAX ? STATS_BATCH_MAX : k < 1 ? 1 : (int)k;
}
