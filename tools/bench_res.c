/*
 * `braid bench --resources`, the parent's side (see bench_res.h): one child process per library, one after
 * the other, then the report: `#` lines in nccl-tests' manner with each library's figure and the ratio B/A
 * (above 1: A costs less), and with --json the same figures as one object.
 *
 * The figures travel in an anonymous shared mapping made before the first fork. A child writes its own
 * library's slot with plain stores and then exits; the parent reads a slot only after waitpid has reported
 * that child's end, and the kernel's exit and wait order the child's stores before the parent's loads. A
 * child that outlives the --timeout is killed; its slot then holds the figures of the steps it completed.
 */
#include "bench_res.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const res_desc_t res_descs[RES_COUNT] = {
    [RES_MEM_BEFORE_INIT] = {"mem_before_init_mib", "device memory before init, MiB per GPU", 1, 1, 0},
    [RES_INIT_MS] = {"init_ms", "ncclCommInitAll, ms", 2, 0, 1},
    [RES_MEM_AFTER_INIT] = {"mem_after_init_mib", "device memory after init, MiB per GPU", 1, 1, 1},
    [RES_MEM_BENCH] = {"mem_bench_mib", "bench's buffers and streams, MiB (taken off below)", 1, 1, 0},
    [RES_FIRST_MS] = {"first_all_reduce_ms", "first all_reduce (1 MiB), ms", 3, 0, 1},
    [RES_MEM_AFTER_ALL] = {"mem_after_all_mib", "device memory after every collective, MiB per GPU", 1, 1, 1},
    [RES_MEM_INCREASE] = {"mem_increase_mib", "  increase over before init, MiB per GPU", 1, 1, 1},
    [RES_ENQUEUE_US] = {"enqueue_us", "host us per call (enqueue)", 3, 0, 1},
    [RES_ITER_US] = {"iteration_us", "us per iteration (8 B all_reduce, synchronised)", 3, 0, 1},
    [RES_FLOOR_US] = {"floor_launch_us", "  floor: host us per empty kernel launch", 3, 0, 0},
    [RES_MEM_END] = {"mem_end_mib", "device memory after the eager loop, MiB per GPU", 1, 1, 1},
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The children --------------------------------------------------------------------------------------------
 */

/* Says how a child that did not exit with 0 ended. */
static void report_end(int lib, int status) {
  if (WIFEXITED(status))
    fprintf(stderr, "braid bench --resources: library %c's process exited with status %d\n", 'A' + lib,
            WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    fprintf(stderr, "braid bench --resources: library %c's process died of signal %d (%s)\n", 'A' + lib,
            WTERMSIG(status), strsignal(WTERMSIG(status)));
}

/* Waits for the child `pid` of library `lib`, killing it at `deadline` (0: none). Returns 0 when it exited
 * with status 0, 1 otherwise (reported). */
static int wait_child(pid_t pid, int lib, double deadline) {
  for (;;) {
    int status;
    pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
      report_end(lib, status);
      return 1;
    }
    if (got < 0 && errno != EINTR) {
      fprintf(stderr, "braid bench --resources: waiting for library %c's process: %s\n", 'A' + lib,
              strerror(errno));
      return 1;
    }
    if (deadline > 0 && now_s() > deadline) {
      fprintf(stderr,
              "braid bench --resources: library %c's process (pid %d) still running at the timeout: "
              "killed\n",
              'A' + lib, (int)pid);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return 1;
    }
    nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
  }
}

/* Measures library `lib` in a child process of its own. Returns 0, or 1 after a failure (reported). */
static int run_child(const bench_opts_t *o, const bench_run_t *run, int lib, res_figs_t *figs,
                     double deadline) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "braid bench --resources: fork for library %c: %s\n", 'A' + lib, strerror(errno));
    return 1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the parent that would reap and report us */
    int status = res_measure(o, run, lib, figs);
    fflush(stdout);
    fflush(stderr);
    _exit(status); /* skip the parent's exit handlers: its library state is not ours to tear down */
  }
  return wait_child(pid, lib, deadline);
}

/* The report -----------------------------------------------------------------------------------------------
 */

/* B over A for figure f, NaN when it means nothing (one library, a figure that is not the library's own, a
 * figure missing or A's not positive). */
static double ratio(const bench_run_t *run, const res_figs_t *figs, int f) {
  if (run->nlibs < 2 || !res_descs[f].ratio || !(figs[0].v[f] > 0) || isnan(figs[1].v[f])) return NAN;
  return figs[1].v[f] / figs[0].v[f];
}

/* "2.28.9" from ncclGetVersion's code (major * 10000 + minor * 100 + patch since 2.9, major * 1000 + minor *
 * 100 + patch before). */
static void version_name(int code, char *buf, size_t len) {
  if (code >= 10000)
    snprintf(buf, len, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
  else
    snprintf(buf, len, "%d.%d.%d", code / 1000, code / 100 % 10, code % 100);
}

static void print_header(const bench_opts_t *o, const bench_run_t *run) {
  printf("# resources: %d ranks, one process, %s, %s\n", o->nranks, run->gpu ? run->gpu_name : "host backend",
         run->date);
  for (int l = 0; l < run->nlibs; l++)
    printf("# %c: %s, NCCL version %d\n", 'A' + l, run->libs[l].path, run->versions[l]);
  printf("# each library in a fresh process of its own; %zu MiB buffers, float sum; %d warm-up, then %d "
         "rounds of "
         "%d timed %d-byte all_reduces, the floor's loop after each (medians); NCCL_NVLS_ENABLE=0\n",
         RES_BYTES >> 20, RES_WARMUP, RES_ROUNDS, RES_LOOP, RES_SMALL_BYTES);
  printf("# memory: total - free from cuMemGetInfo, device-wide, the largest over GPUs%s\n",
         run->gpu ? "" : " (n/a on the host backend)");
  fflush(stdout);
}

/* A figure's column: its value, or n/a. */
static void print_value(double v, int digits) {
  if (isnan(v) || isinf(v))
    printf(" %14s", "n/a");
  else
    printf(" %14.*f", digits, v);
}

static void print_table(const bench_run_t *run, const res_figs_t *figs) {
  char name[32], head[48];
  printf("#\n#  %-50s", "what");
  for (int l = 0; l < run->nlibs; l++) {
    version_name(run->versions[l], name, sizeof(name));
    snprintf(head, sizeof(head), "%c: %s", 'A' + l, name);
    printf(" %14s", head);
  }
  printf(run->nlibs > 1 ? " %8s\n" : "\n", "B/A");
  for (int f = 0; f < RES_COUNT; f++) {
    printf("#  %-50s", res_descs[f].text);
    for (int l = 0; l < run->nlibs; l++) print_value(figs[l].v[f], res_descs[f].digits);
    double r = ratio(run, figs, f);
    if (run->nlibs > 1 && res_descs[f].ratio && isnan(r))
      printf(" %8s", "n/a");
    else if (run->nlibs > 1 && res_descs[f].ratio)
      printf(" %8.2f", r);
    printf("\n");
  }
  if (run->nlibs > 1) printf("# B/A above 1: A costs less\n");
  fflush(stdout);
}

/* Writes the figures as JSON. Returns 0, or -1 with the reason on stderr. */
static int write_json(const bench_opts_t *o, const bench_run_t *run, const res_figs_t *figs) {
  FILE *f = fopen(o->json_path, "w");
  if (f == NULL) {
    fprintf(stderr, "braid bench: cannot write %s: %s\n", o->json_path, strerror(errno));
    return -1;
  }
  fputs("{\n  \"tool\": \"braid bench\",\n  \"kind\": \"resources\",\n  \"date\": ", f);
  report_json_string(f, run->date);
  fputs(",\n  \"gpu\": ", f);
  report_json_string(f, run->gpu_name);
  fprintf(f,
          ",\n  \"device\": \"%s\",\n  \"nranks\": %d,\n  \"buffer_bytes\": %zu,\n  \"warmup\": %d,\n"
          "  \"iterations\": %d,\n  \"rounds\": %d,\n  \"libraries\": [",
          run->gpu ? "cuda" : "host", o->nranks, RES_BYTES, RES_WARMUP, RES_LOOP, RES_ROUNDS);
  for (int l = 0; l < run->nlibs; l++) {
    fprintf(f, "%s\n    {\"name\": \"%c\", \"path\": ", l ? "," : "", 'A' + l);
    report_json_string(f, run->libs[l].path);
    fprintf(f, ", \"version\": %d, \"complete\": %s}", run->versions[l], figs[l].complete ? "true" : "false");
  }
  fputs("\n  ],\n  \"figures\": [", f);
  for (int k = 0; k < RES_COUNT; k++) {
    fprintf(f, "%s\n    {\"what\": \"%s\", \"values\": [", k ? "," : "", res_descs[k].key);
    for (int l = 0; l < run->nlibs; l++) {
      if (l > 0) fputs(", ", f);
      report_json_number(f, figs[l].v[k]);
    }
    fputs("], \"ratio\": ", f);
    report_json_number(f, ratio(run, figs, k));
    fputc('}', f);
  }
  fputs("\n  ]\n}\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    fprintf(stderr, "braid bench: cannot write %s: %s\n", o->json_path, strerror(errno));
    return -1;
  }
  return 0;
}

int bench_resources(const bench_opts_t *o, const bench_run_t *run) {
  size_t bytes = sizeof(res_figs_t) * BENCH_MAX_LIBS;
  res_figs_t *figs = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (figs == MAP_FAILED) {
    fprintf(stderr, "braid bench: cannot map %zu bytes of shared memory: %s\n", bytes, strerror(errno));
    return 1;
  }
  for (int l = 0; l < BENCH_MAX_LIBS; l++) {
    figs[l].complete = 0;
    for (int f = 0; f < RES_COUNT; f++) figs[l].v[f] = NAN;
  }
  print_header(o, run);
  double deadline = o->timeout_s > 0 ? now_s() + o->timeout_s : 0;
  int failed = 0;
  /* One after the other: B's process starts once A's has exited and its memory is back with the driver. */
  for (int l = 0; l < run->nlibs; l++) failed += run_child(o, run, l, &figs[l], deadline);
  print_table(run, figs);
  if (o->json_path[0] != '\0' && write_json(o, run, figs) != 0) failed++;
  munmap(figs, bytes);
  return failed ? 1 : 0;
}
