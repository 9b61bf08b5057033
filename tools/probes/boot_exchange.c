/*
 * Probe: what the per-call message exchange of a copy-engine or pushed step costs the host (src/core/ce.c,
 * ce_offer then ce_settle). Two processes join one bootstrap and, again and again, each sends the other a
 * message the size of a step's (step_msg_t) and then waits for the other's, as two ranks' eager calls do.
 * Prints the median and the 10th and 90th percentiles of the time per exchange over 20 runs of 2,000.
 * Not part of the build; from the repository root, after a build in build-dev:
 *
 *   cc -O2 -D_GNU_SOURCE -Iinclude -Isrc -o boot_exchange tools/probes/boot_exchange.c \
 *      build-dev/lib/libbraid_static.a -lpthread -lm -ldl && ./boot_exchange
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"

enum { RUNS = 20, ITERS = 2000, MSG_BYTES = 800, TAG = 0x50524f42u };

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int rank_main(const ncclUniqueId *id, int rank) {
  boot_t *b;
  if (boot_init(id, 1, rank, 2, NULL, &b) != ncclSuccess) {
    printf("rank %d: boot_init failed\n", rank);
    return 1;
  }
  char out[MSG_BYTES], in[MSG_BYTES];
  memset(out, rank + 1, sizeof out);
  double per[RUNS];
  for (int r = 0; r < RUNS + 1; r++) { /* the first run warms up */
    if (boot_barrier(b) != ncclSuccess) return 1;
    const double t0 = now_us();
    for (int i = 0; i < ITERS; i++)
      if (boot_send(b, 1 - rank, TAG, out, sizeof out) != ncclSuccess ||
          boot_recv(b, 1 - rank, TAG, in, sizeof in) != ncclSuccess || in[0] != 2 - rank)
        return 1;
    if (r > 0) per[r - 1] = (now_us() - t0) / ITERS;
  }
  qsort(per, RUNS, sizeof per[0], cmp);
  if (rank == 0)
    printf("one exchange of %d-byte messages between two processes: median %.2f us (10%% %.2f, 90%% %.2f)\n",
           MSG_BYTES, per[RUNS / 2], per[RUNS / 10], per[RUNS * 9 / 10]);
  boot_close(b);
  return 0;
}

int main(void) {
  ncclUniqueId id;
  if (boot_get_unique_id(&id) != ncclSuccess) return 1;
  const pid_t child = fork();
  if (child == 0) _exit(rank_main(&id, 1));
  const int res = rank_main(&id, 0);
  int st = 0;
  waitpid(child, &st, 0);
  return res || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}
