/*
 * `braid bench`, the parent process: settles where to run, loads the libraries, prints the run's header and
 * forks the rank processes (one per rank, or one for all with --single), then waits for them. With
 * --resources it hands over to bench_res.c once the device is settled and the libraries loaded.
 *
 * The parent never touches CUDA: a process that initialised the driver cannot hand a usable driver to a
 * forked child. It finds the GPUs through a short-lived child of its own instead. It does not make unique ids
 * either (a library may initialise CUDA to make one): rank 0 makes them and passes them on through the board.
 *
 * A rank that fails makes the others wait in a collective that can no longer complete, so after a failure
 * the rest get a short grace period and are then killed; so is every process still running when the
 * --timeout expires. Each is reported by rank.
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
#include "bench_floor.h"
#include "bench_res.h"

/* Seconds the other ranks get to finish after one has failed. */
#define GRACE_S 10
/* Ranks on the host backend when -g is not given: 4 exercise every algorithm's general case. */
#define HOST_RANKS 4

/* One child process: a rank, or every rank with --single. */
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

/* Where to run ---------------------------------------------------------------------------------------------
 */

/* What the probe child found; written through a pipe in one piece (smaller than PIPE_BUF). */
typedef struct {
  int ndev;
  char name[96];
  char why[160];
} probe_t;
_Static_assert(sizeof(probe_t) <= 512, "the probe's answer is one atomic pipe write");

/* Counts the GPUs and names the first, in a child process, so that this one stays free of CUDA. */
static void probe_gpus(probe_t *pr) {
  *pr = (probe_t){.ndev = 0, .name = "none", .why = "the CUDA probe process failed"};
  int fds[2];
  if (pipe(fds) != 0) return;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    probe_t r = {.name = "none"};
    drv_open(&r.ndev, r.why, sizeof(r.why));
    if (r.ndev > 0 && drv_device_name(0, r.name, sizeof(r.name)) != ncclSuccess) strcpy(r.name, "?");
    _exit(write(fds[1], &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : 1);
  }
  close(fds[1]);
  probe_t got;
  ssize_t n = pid > 0 ? read(fds[0], &got, sizeof(got)) : -1;
  close(fds[0]);
  if (pid > 0) waitpid(pid, NULL, 0);
  if (n == (ssize_t)sizeof(got)) *pr = got;
}

/* A library asked for the host backend: take the host too unless --device cuda says otherwise. */
static int braid_wants_host(void) {
  return param_is_set(P_BRAID_DEVICE) && strcmp(param_str(P_BRAID_DEVICE), "host") == 0;
}

/* Settles the device and the rank count. Returns 0, or -1 after saying why the run cannot go ahead. */
static int decide_device(bench_opts_t *o, bench_run_t *run) {
  probe_t pr = {.name = "none"};
  int host = o->device == BENCH_DEVICE_HOST ||
             (o->device == BENCH_DEVICE_AUTO && o->gpus == 0 && braid_wants_host());
  if (!host) probe_gpus(&pr);
  int want = o->nranks_set ? o->nranks : pr.ndev, gpus = bench_gpus_used(o, want);
  if (!host && (o->device == BENCH_DEVICE_CUDA || o->gpus > 0 || (pr.ndev > 0 && pr.ndev >= gpus))) {
    if (pr.ndev == 0 || pr.ndev < gpus) {
      fprintf(stderr, "braid bench: --device cuda with %d ranks on %d GPUs: %s\n", want, gpus,
              pr.ndev == 0 ? pr.why : "the driver has fewer GPUs");
      return -1;
    }
    run->gpu = 1;
    o->nranks = want;
  } else {
    if (pr.ndev > 0) printf("# %d GPU(s) for %d ranks: running on the host backend\n", pr.ndev, want);
    if (!o->nranks_set) o->nranks = HOST_RANKS;
  }
  if (o->graph && !run->gpu) {
    fprintf(stderr, "braid bench: -G (CUDA graphs) needs GPUs (%s)\n",
            host ? "host device asked for" : pr.why);
    return -1;
  }
  char why[128];
  if (o->floor && !run->gpu) {
    fprintf(stderr, "braid bench: --floor needs GPUs (%s)\n", host ? "host device asked for" : pr.why);
    return -1;
  }
  if (o->floor && !floor_available(why, sizeof(why))) {
    fprintf(stderr, "braid bench: --floor: %s\n", why);
    return -1;
  }
  if (o->floor && o->nranks > FLOOR_MAX_RANKS) {
    fprintf(stderr, "braid bench: --floor takes at most %d ranks, not %d\n", FLOOR_MAX_RANKS, o->nranks);
    return -1;
  }
  if (o->root >= o->nranks) {
    fprintf(stderr, "braid bench: root %d is not a rank of %d\n", o->root, o->nranks);
    return -1;
  }
  run->ngpus = pr.ndev;
  snprintf(run->gpu_name, sizeof(run->gpu_name), "%s", run->gpu ? pr.name : "none");
  return 0;
}

/* Sets the libraries' environment before anything initialises them: no NVLink multicast (NVLS) in either,
 * and Braid's host backend when the buffers are host memory. */
static void set_environment(const bench_run_t *run) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (!run->gpu) {
    if (!param_is_set(P_BRAID_DEVICE))
      setenv("BRAID_DEVICE", "host", 1);
    else if (strcmp(param_str(P_BRAID_DEVICE), "host") != 0)
      fprintf(stderr, "braid bench: warning: BRAID_DEVICE=%s, but the bench passes host memory\n",
              param_str(P_BRAID_DEVICE));
  } else if (braid_wants_host()) {
    fprintf(stderr, "braid bench: warning: BRAID_DEVICE=host, but the bench passes device memory\n");
  }
}

/* A library's path with its folder made canonical (no "..", no links), the file name kept as given, so that
 * the header names libnccl.so.2 rather than the file the link points to. Unchanged when that fails. */
static void canonical_folder(const char *path, char *out, size_t len) {
  char folder[PATH_MAX], real[PATH_MAX];
  const char *slash = strrchr(path, '/');
  snprintf(out, len, "%s", path);
  if (slash == NULL || (size_t)(slash - path) >= sizeof(folder)) return;
  memcpy(folder, path, (size_t)(slash - path));
  folder[slash - path] = '\0';
  if (realpath(slash == path ? "/" : folder, real) == NULL) return;
  if ((size_t)snprintf(out, len, "%s%s", strcmp(real, "/") == 0 ? "" : real, slash) >= len)
    snprintf(out, len, "%s", path);
}

/* Loads library A (--lib) and B (--vs). */
static int load_libs(const bench_opts_t *o, bench_run_t *run) {
  const char *paths[BENCH_MAX_LIBS] = {o->lib_path, o->vs_path};
  run->nlibs = o->vs_path[0] != '\0' ? 2 : 1;
  for (int l = 0; l < run->nlibs; l++) {
    char path[PATH_MAX];
    canonical_folder(paths[l], path, sizeof(path));
    if (lib_open(path, &run->libs[l]) != 0) return -1;
    run->libs[l].GetVersion(&run->versions[l]);
  }
  if (run->nlibs > 1 && run->libs[0].handle == run->libs[1].handle)
    fprintf(stderr, "braid bench: warning: --lib and --vs load the same library instance (copy one of them "
                    "to another path to compare two)\n");
  return 0;
}

static void stamp_date(bench_run_t *run) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(run->date, sizeof(run->date), "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* The rank processes ------------------------------------------------------------------------------------- */

static int nprocs(const bench_opts_t *o) {
  return o->single ? 1 : o->nranks;
}

static const char *proc_name(const bench_opts_t *o, int i, char *buf, size_t len) {
  if (o->single)
    snprintf(buf, len, "the process of all %d ranks", o->nranks);
  else
    snprintf(buf, len, "rank %d", i);
  return buf;
}

/* Forks the rank processes. A child never returns from here. Returns 0, or -1 when a fork fails (the
 * children already started are killed by the caller). */
static int spawn(const bench_opts_t *o, const bench_run_t *run, child_t *kids) {
  fflush(stdout);
  fflush(stderr);
  for (int i = 0; i < nprocs(o); i++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "braid bench: fork for process %d: %s\n", i, strerror(errno));
      return -1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the parent that would reap and report us */
      int status = o->single ? bench_proc_main(o, run, 0, o->nranks) : bench_proc_main(o, run, i, 1);
      fflush(stdout);
      fflush(stderr);
      _exit(status); /* skip the parent's exit handlers: its library state is not ours to tear down */
    }
    kids[i] = (child_t){.pid = pid, .running = 1};
  }
  return 0;
}

/* Kills every process still running, saying why. */
static void kill_rest(const bench_opts_t *o, child_t *kids, const char *why) {
  for (int i = 0; i < nprocs(o); i++) {
    if (!kids[i].running || kids[i].killed) continue;
    char name[64];
    fprintf(stderr, "braid bench: %s (pid %d) %s: killed\n", proc_name(o, i, name, sizeof(name)),
            (int)kids[i].pid, why);
    kill(kids[i].pid, SIGKILL);
    kids[i].killed = 1;
  }
}

/* Records a process's exit; returns 1 when it failed (and says how, unless we killed it). */
static int reaped(const bench_opts_t *o, child_t *kid, int i, int status) {
  kid->running = 0;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  if (kid->killed || (WIFEXITED(status) && WEXITSTATUS(status) == BENCH_EXIT_WRONG)) return 1;
  char name[64];
  proc_name(o, i, name, sizeof(name));
  if (WIFEXITED(status))
    fprintf(stderr, "braid bench: %s exited with status %d\n", name, WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    fprintf(stderr, "braid bench: %s died of signal %d (%s)\n", name, WTERMSIG(status),
            strsignal(WTERMSIG(status)));
  return 1;
}

/* Waits for every process; kills the rest after a failure's grace period or the timeout. Returns the number
 * of processes that failed. */
static int wait_procs(const bench_opts_t *o, const bench_run_t *run, child_t *kids) {
  double start = now_s(), grace_end = 0;
  int left = nprocs(o), failed = 0;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno != EINTR) break; /* ECHILD: nothing left to wait for */
    for (int i = 0; pid > 0 && i < nprocs(o); i++) {
      if (kids[i].pid != pid || !kids[i].running) continue;
      left--;
      if (reaped(o, &kids[i], i, status)) {
        failed++;
        board_fail(run->board); /* the others stop waiting at their next barrier */
        if (grace_end == 0) grace_end = now_s() + GRACE_S;
      }
    }
    if (pid > 0) continue;
    double t = now_s();
    if (grace_end != 0 && t > grace_end) kill_rest(o, kids, "still running after another rank failed");
    if (o->timeout_s > 0 && t - start > o->timeout_s) kill_rest(o, kids, "still running at the timeout");
    nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
  }
  return failed;
}

int bench_main(int argc, char **argv) {
  bench_opts_t o;
  int parsed = bench_parse(argc, argv, &o);
  if (parsed != 0) return parsed > 0 ? 0 : 2;
  bench_run_t run = {0};
  if (decide_device(&o, &run) != 0) return 2;
  set_environment(&run);
  if (load_libs(&o, &run) != 0) return 1;
  stamp_date(&run);
  if (o.resources) return bench_resources(&o, &run);
  run.board = board_create(o.nranks, nprocs(&o));
  child_t *kids = calloc((size_t)nprocs(&o), sizeof(*kids));
  if (run.board == NULL || kids == NULL) {
    fprintf(stderr, "braid bench: out of memory\n");
    free(kids);
    return 1;
  }
  table_run_header(&o, &run);
  int spawned = spawn(&o, &run, kids);
  if (spawned != 0) kill_rest(&o, kids, "started before a fork failed");
  int failed = wait_procs(&o, &run, kids);
  free(kids);
  board_destroy(run.board);
  /* The libraries stay loaded: this process never initialised them, and unloading gains nothing. */
  return spawned != 0 || failed != 0 ? 1 : 0;
}
