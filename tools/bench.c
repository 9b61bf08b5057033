/*
 * `braid bench`: loads the library, makes the unique id in this (parent) process, where the bootstrap root
 * it starts keeps running, forks one child per rank and waits for them. A rank that fails makes the others
 * wait in a collective that can no longer complete, so after a failure the rest get a short grace period and
 * are then killed; so is every rank still running when the --timeout expires. Each is reported by rank.
 */
#include "bench.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/param.h"

/* Seconds the other ranks get to finish after one has failed. */
#define GRACE_S 10

/* One child process: a rank. */
typedef struct {
  pid_t pid;
  int running;
  int killed; /* killed by us; already reported */
} child_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The bench hands the library host memory, so the library must use its host backend. */
static void choose_backend(void) {
  if (!param_is_set(P_BRAID_DEVICE))
    setenv("BRAID_DEVICE", "host", 1);
  else if (strcmp(param_str(P_BRAID_DEVICE), "host") != 0)
    fprintf(stderr, "braid bench: warning: BRAID_DEVICE=%s, but the bench passes host memory\n",
            param_str(P_BRAID_DEVICE));
}

static void print_header(const nccl_lib_t *lib, const bench_opts_t *o) {
  int version = 0;
  lib->GetVersion(&version);
  printf("# Braid bench: %d ranks, backend host, library %s\n", o->nranks, lib->path);
  printf("# NCCL version %d; sizes %zu to %zu bytes, step factor %zu; %d warm-up and %d timed iterations; "
         "check %d\n",
         version, o->min_bytes, o->max_bytes, o->step_factor, o->warmup, o->iters, o->check);
  fflush(stdout);
}

/* Forks the ranks. A child never returns from here. Returns 0, or -1 when a fork fails (the children
 * already started are killed by the caller). */
static int spawn(const nccl_lib_t *lib, const bench_opts_t *o, const ncclUniqueId *id, child_t *kids) {
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < o->nranks; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "braid bench: fork for rank %d: %s\n", r, strerror(errno));
      return -1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the parent that would reap and report us */
      int status = bench_rank_main(lib, o, id, r);
      fflush(stdout);
      fflush(stderr);
      _exit(status); /* skip the parent's exit handlers: its library state is not ours to tear down */
    }
    kids[r] = (child_t){.pid = pid, .running = 1};
  }
  return 0;
}

/* Kills every rank still running, saying why. */
static void kill_rest(child_t *kids, int n, const char *why) {
  for (int r = 0; r < n; r++) {
    if (!kids[r].running || kids[r].killed) continue;
    fprintf(stderr, "braid bench: rank %d (pid %d) %s: killed\n", r, (int)kids[r].pid, why);
    kill(kids[r].pid, SIGKILL);
    kids[r].killed = 1;
  }
}

/* Records a rank's exit; returns 1 when it failed (and says how, unless we killed it). */
static int reaped(child_t *kid, int rank, int status) {
  kid->running = 0;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  if (kid->killed || (WIFEXITED(status) && WEXITSTATUS(status) == BENCH_EXIT_WRONG)) return 1;
  if (WIFEXITED(status))
    fprintf(stderr, "braid bench: rank %d exited with status %d\n", rank, WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    fprintf(stderr, "braid bench: rank %d died of signal %d (%s)\n", rank, WTERMSIG(status),
            strsignal(WTERMSIG(status)));
  return 1;
}

/* Waits for every rank; kills the rest after a failure's grace period or the timeout. Returns the number
 * of ranks that failed. */
static int wait_ranks(const bench_opts_t *o, child_t *kids) {
  double start = now_s(), grace_end = 0;
  int left = o->nranks, failed = 0;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno != EINTR) break; /* ECHILD: nothing left to wait for */
    for (int r = 0; pid > 0 && r < o->nranks; r++) {
      if (kids[r].pid != pid || !kids[r].running) continue;
      left--;
      if (reaped(&kids[r], r, status)) {
        failed++;
        if (grace_end == 0) grace_end = now_s() + GRACE_S;
      }
    }
    if (pid > 0) continue;
    double t = now_s();
    if (grace_end != 0 && t > grace_end)
      kill_rest(kids, o->nranks, "still running after another rank failed");
    if (o->timeout_s > 0 && t - start > o->timeout_s)
      kill_rest(kids, o->nranks, "still running at the timeout");
    nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
  }
  return failed;
}

int bench_main(int argc, char **argv) {
  bench_opts_t o;
  int parsed = bench_parse(argc, argv, &o);
  if (parsed != 0) return parsed > 0 ? 0 : 2;
  choose_backend();
  nccl_lib_t lib;
  if (lib_open(o.lib_path, &lib) != 0) return 1;
  print_header(&lib, &o);
  ncclUniqueId id;
  ncclResult_t res = lib.GetUniqueId(&id);
  if (res != ncclSuccess) {
    lib_report(&lib, NULL, "braid bench", "ncclGetUniqueId", res);
    return 1;
  }
  child_t *kids = calloc((size_t)o.nranks, sizeof(*kids));
  if (kids == NULL) {
    fprintf(stderr, "braid bench: out of memory\n");
    return 1;
  }
  int spawned = spawn(&lib, &o, &id, kids);
  if (spawned != 0) kill_rest(kids, o.nranks, "started before a fork failed");
  int failed = wait_ranks(&o, kids);
  free(kids);
  /* The library is left loaded: its bootstrap root thread may still be running in this process. */
  return spawned != 0 || failed != 0 ? 1 : 0;
}
