/*
 * The bench's statistics: the median of a sample set, and how many iterations one timed sample holds.
 */
#ifndef BRAID_TOOLS_STATS_H
#define BRAID_TOOLS_STATS_H

#include <stddef.h>

/* The longest a sample's batch may be, and the shortest a sample should last (microseconds). */
#define STATS_BATCH_MAX     100
#define STATS_SAMPLE_MIN_US 200.0

/* The median of n values (the mean of the middle two when n is even; NaN when n is 0). Reorders v. */
double stats_median(double *v, int n);
/* Iterations per sample for a size in bytes, when --batch does not say: enough that a sample lasts at least
 * STATS_SAMPLE_MIN_US at the fastest a call of that size could run (on GPUs or on the host backend), at most
 * STATS_BATCH_MAX. A function of the size alone, so every rank and library agrees without talking. */
int stats_batch(size_t bytes, int gpu);

#endif
