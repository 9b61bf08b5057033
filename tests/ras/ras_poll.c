/*
 * ras_poll PORT HZ SECONDS [json|text]: a RAS client that asks 127.0.0.1:PORT for the status HZ times a
 * second (a whole exchange each time, as NCCL's client makes it) for SECONDS, then prints how many answers
 * came, how many failed and their mean and worst latency (also when stopped early by SIGINT or SIGTERM). For
 * the monitoring benchmark.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ras_util.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: ras_poll PORT HZ SECONDS [json|text]\n");
    return 2;
  }
  int port = atoi(argv[1]), json = argc > 4 && strcmp(argv[4], "json") == 0;
  double hz = atof(argv[2]), secs = atof(argv[3]), t0 = now(), next = t0, total = 0, worst = 0;
  double first = 0, last = 0;
  long ok = 0, failed = 0;
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  while (!stop && now() - t0 < secs) {
    double t = now();
    char err[160];
    char *s = rt_status(port, json, 0, ok > 0 ? 30 : 0.2, err, sizeof err);
    double took = now() - t;
    if (s != NULL) {
      if (ok++ == 0) first = t;
      last = now();
      total += took;
      if (took > worst) worst = took;
      free(s);
    } else if (ok > 0 && !stop) {
      failed++; /* before the first answer the job was not up yet */
    }
    next += 1.0 / hz;
    double wait = next - now();
    if (wait > 0)
      usleep((useconds_t)(wait * 1e6));
    else
      next = now(); /* behind: no burst to catch up */
  }
  double span = last > first ? last - first : 1;
  printf("ras_poll: %ld answers in %.1f s (%.0f/s, asked %.0f/s), %ld failed, latency mean %.2f ms, worst "
         "%.2f ms\n",
         ok, span, ok / span, hz, failed, ok ? total / ok * 1e3 : 0, worst * 1e3);
  return failed > 0;
}
