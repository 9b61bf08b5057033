/*
 * Monotonic time and polling back-off (see timeutil.h).
 */
#include "timeutil.h"

#include <sched.h>
#include <time.h>

double time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void time_sleep_us(int64_t us) {
  struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

void time_backoff(uint64_t round) {
  if (round < 64) return;
  if (round < 1024) {
    sched_yield();
    return;
  }
  time_sleep_us(round < 8192 ? 20 : 200);
}
