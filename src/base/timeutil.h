/*
 * Monotonic time and the small waits every spin loop uses.
 */
#ifndef BRAID_BASE_TIMEUTIL_H
#define BRAID_BASE_TIMEUTIL_H

#include <stdint.h>

/* Seconds on the monotonic clock. */
double time_now(void);
/* Sleeps about `us` microseconds. */
void time_sleep_us(int64_t us);
/* One pause of a polling loop: spins for the first `spins` rounds, then yields, then sleeps briefly, so that
 * many ranks polling on few cores still let the one with work run. `round` counts the caller's idle rounds.
 */
void time_backoff(uint64_t round);

#endif
