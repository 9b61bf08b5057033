/*
 * The tests' small framework (see harness.h).
 */
#include "harness.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int passed, failed;
static int n_selected; /* 0: every case runs */
static char **selected;
static unsigned char *selected_seen;

void test_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL %s:%d [pid %d]: ", file, line, (int)getpid());
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  _exit(1);
}

void test_fail_expect(const char *file, int line, const char *cond, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  test_fail(file, line, "expected %s:%s", cond, msg);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits for the children in pids; kills all that remain at the deadline. Returns a mask of failed ranks. */
static unsigned wait_children(pid_t *pids, int n, int timeout_s) {
  unsigned bad = 0;
  int left = n;
  double deadline = now() + timeout_s;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int i = 0; i < n; i++) {
        if (pids[i] != pid) continue;
        pids[i] = 0;
        left--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          bad |= 1u << i;
          if (WIFSIGNALED(status))
            fprintf(stderr, "rank %d killed by signal %d\n", i, WTERMSIG(status));
          else
            fprintf(stderr, "rank %d exited with status %d\n", i, WEXITSTATUS(status));
        }
      }
      continue;
    }
    if (now() > deadline) {
      for (int i = 0; i < n; i++) {
        if (pids[i] == 0) continue;
        fprintf(stderr, "rank %d still running after %d s: killed\n", i, timeout_s);
        kill(-pids[i], SIGKILL); /* its process group, when it leads one */
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
        bad |= 1u << i;
      }
      break;
    }
    usleep(2000);
  }
  return bad;
}

/* Every rank starts once all are forked: no rank talks to a thread of the parent (a bootstrap root) while the
 * parent still forks, which a sanitizer's allocator would not survive (its locks are not reset in a child).
 */
unsigned run_ranks_mask(int nranks, int timeout_s, void (*fn)(int rank, int nranks, void *arg), void *arg) {
  pid_t pids[64];
  int go[2];
  if (pipe(go) != 0) test_fail(__FILE__, __LINE__, "pipe failed");
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char c;
      close(go[1]);
      while (read(go[0], &c, 1) < 0) continue; /* EOF: the parent forked every rank */
      close(go[0]);
      fn(r, nranks, arg);
      fflush(stdout);
      _exit(0);
    }
  }
  close(go[0]);
  close(go[1]);
  return wait_children(pids, nranks, timeout_s);
}

int run_ranks(int nranks, int timeout_s, void (*fn)(int rank, int nranks, void *arg), void *arg) {
  return run_ranks_mask(nranks, timeout_s, fn, arg) != 0;
}

void test_filter(int count, char **names) {
  n_selected = count;
  selected = names;
  free(selected_seen);
  selected_seen = count > 0 ? calloc((size_t)count, 1) : NULL;
}

/* Whether the case was asked for; marks its name as seen. */
static int wanted(const char *name) {
  int yes = n_selected == 0;
  for (int i = 0; i < n_selected; i++)
    if (strcmp(selected[i], name) == 0) yes = 1, selected_seen[i] = 1;
  return yes;
}

void test_case(const char *name, void (*fn)(void), int timeout_s) {
  if (!wanted(name)) return;
  fflush(stdout);
  double t0 = now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0); /* the case and its rank processes form one group, killed together on timeout */
    fn();
    fflush(stdout);
    _exit(0);
  }
  setpgid(pid, pid);
  pid_t pids[1] = {pid};
  unsigned bad = wait_children(pids, 1, timeout_s);
  if (bad) {
    failed++;
    printf("[FAIL] %s (%.2f s)\n", name, now() - t0);
  } else {
    passed++;
    printf("[ ok ] %s (%.2f s)\n", name, now() - t0);
  }
  fflush(stdout);
}

int test_summary(void) {
  for (int i = 0; i < n_selected; i++)
    if (!selected_seen[i]) {
      printf("[FAIL] %s: no such case\n", selected[i]);
      failed++;
    }
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

void test_reexec_with_library_dir(char **argv, const char *dir) {
  if (getenv("BRAID_TEST_REEXEC") != NULL) return;
  const char *old = getenv("LD_LIBRARY_PATH");
  char path[4096];
  snprintf(path, sizeof path, "%s%s%s", dir, old != NULL ? ":" : "", old != NULL ? old : "");
  setenv("LD_LIBRARY_PATH", path, 1);
  setenv("BRAID_TEST_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  test_fail(__FILE__, __LINE__, "running again with %s first on LD_LIBRARY_PATH failed", dir);
}

int test_file_lines(const char *path, const char *part) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof line, f) != NULL) n += strstr(line, part) != NULL;
  fclose(f);
  return n;
}
