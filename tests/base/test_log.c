/*
 * Tests of base/log: the NCCL_DEBUG_FILE name (%h, %p), the line format "host:pid:tid [dev] NCCL INFO msg",
 * level and NCCL_DEBUG_SUBSYS filtering, TRACE's file and line, and the last-error message across threads.
 * Each case runs in its own process and logs into a file of its own temporary folder.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "harness.h"

/* Where a case logs: its temporary folder and the file NCCL_DEBUG_FILE=<dir>/log.%h.%p names. */
typedef struct {
  char dir[256];
  char path[512];
} log_dest_t;

static void set_or_unset(const char *name, const char *value) {
  if (value != NULL)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

/* This machine's host name without its domain, as %h expands. */
static void short_host(char *buf, size_t len) {
  EXPECT(gethostname(buf, len - 1) == 0);
  buf[len - 1] = '\0';
  char *dot = strchr(buf, '.');
  if (dot != NULL) *dot = '\0';
}

/* Sets the logging knobs (NULL: unset), reloads them and starts logging into a fresh folder. */
static void start_log(log_dest_t *d, const char *level, const char *subsys) {
  char host[64], pattern[512];
  snprintf(d->dir, sizeof d->dir, "/tmp/braid_test_log_XXXXXX");
  EXPECT(mkdtemp(d->dir) != NULL, "mkdtemp failed");
  snprintf(pattern, sizeof pattern, "%s/log.%%h.%%p", d->dir);
  short_host(host, sizeof host);
  snprintf(d->path, sizeof d->path, "%s/log.%s.%d", d->dir, host, (int)getpid());
  unsetenv("NCCL_CONF_FILE");
  setenv("HOME", d->dir, 1);
  set_or_unset("NCCL_DEBUG", level);
  set_or_unset("NCCL_DEBUG_SUBSYS", subsys);
  setenv("NCCL_DEBUG_FILE", pattern, 1);
  param_reload();
  log_init();
}

/* The log file's text ("" when it does not exist), in buf. */
static void read_log(const log_dest_t *d, char *buf, size_t len) {
  buf[0] = '\0';
  FILE *f = fopen(d->path, "r");
  if (f == NULL) return;
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = '\0';
  fclose(f);
}

static void end_log(const log_dest_t *d) {
  unlink(d->path);
  rmdir(d->dir);
}

/* Copies the log's line that contains `needle` into line (newline dropped); 0 when there is none. */
static int find_line(const log_dest_t *d, const char *needle, char *line, size_t len) {
  char text[8192];
  read_log(d, text, sizeof text);
  for (char *s = text; *s != '\0';) {
    char *nl = strchr(s, '\n');
    size_t n = nl != NULL ? (size_t)(nl - s) : strlen(s);
    if (memmem(s, n, needle, strlen(needle)) != NULL) {
      snprintf(line, len, "%.*s", (int)n, s);
      return 1;
    }
    s += n + (nl != NULL);
  }
  return 0;
}

static int logged(const log_dest_t *d, const char *needle) {
  char line[1024];
  return find_line(d, needle, line, sizeof line);
}

/* Checks "host:pid:tid [dev] NCCL INFO msg" field by field. */
static void expect_info_line(const char *line, int dev, const char *msg) {
  char host[64], want_host[64];
  int pid = 0, got_dev = 0, end = -1;
  long tid = 0;
  int n = sscanf(line, "%63[^:]:%d:%ld [%d] NCCL INFO %n", host, &pid, &tid, &got_dev, &end);
  EXPECT(n == 4 && end > 0, "not in NCCL's format: \"%s\"", line);
  short_host(want_host, sizeof want_host);
  EXPECT(strcmp(host, want_host) == 0, "host %s, expected %s", host, want_host);
  EXPECT(pid == (int)getpid(), "pid %d, expected %d", pid, (int)getpid());
  EXPECT(tid == syscall(SYS_gettid), "tid %ld, expected %ld", tid, (long)syscall(SYS_gettid));
  EXPECT(got_dev == dev, "dev %d, expected %d", got_dev, dev);
  EXPECT(strcmp(line + end, msg) == 0, "message \"%s\", expected \"%s\"", line + end, msg);
}

static void test_info_line(void) {
  log_dest_t d;
  char line[1024];
  start_log(&d, "INFO", NULL);
  INFO(LOG_INIT, "hello %d", 42);
  EXPECT(find_line(&d, "hello", line, sizeof line), "nothing logged in %s", d.path);
  expect_info_line(line, -1, "hello 42");
  log_set_dev(3);
  INFO(LOG_INIT, "again %s", "on dev 3");
  EXPECT(find_line(&d, "again", line, sizeof line), "nothing logged in %s", d.path);
  expect_info_line(line, 3, "again on dev 3");
  end_log(&d);
}

static void test_subsys_list(void) {
  log_dest_t d;
  start_log(&d, "INFO", "COLL");
  EXPECT(log_enabled(LOG_INFO, LOG_COLL) && !log_enabled(LOG_INFO, LOG_INIT));
  INFO(LOG_COLL, "coll line");
  INFO(LOG_INIT, "init line");
  EXPECT(logged(&d, "coll line"));
  EXPECT(!logged(&d, "init line"));
  end_log(&d);
}

static void test_subsys_exclude(void) {
  log_dest_t d;
  start_log(&d, "INFO", "^INIT");
  INFO(LOG_INIT, "init line");
  INFO(LOG_COLL, "coll line");
  INFO(LOG_NET, "net line");
  INFO(LOG_RAS, "ras line");
  EXPECT(!logged(&d, "init line"));
  EXPECT(logged(&d, "coll line") && logged(&d, "net line") && logged(&d, "ras line"));
  end_log(&d);
}

static void test_warn_always(void) {
  log_dest_t d;
  start_log(&d, "INFO", "^ALL");
  INFO(LOG_INIT, "info line");
  WARN("warn line %d", 1);
  EXPECT(!logged(&d, "info line"));
  EXPECT(logged(&d, "NCCL WARN warn line 1"));
  end_log(&d);
  /* At level WARN, warnings are written and INFO is not, whatever the subsystems. */
  start_log(&d, "WARN", "ALL");
  INFO(LOG_INIT, "info line");
  WARN("warn line %d", 2);
  EXPECT(!logged(&d, "info line"));
  EXPECT(logged(&d, "NCCL WARN warn line 2"));
  end_log(&d);
}

static void test_debug_unset(void) {
  log_dest_t d;
  start_log(&d, NULL, "ALL");
  INFO(LOG_INIT, "info line");
  WARN("warn line");
  EXPECT(!log_enabled(LOG_INFO, LOG_INIT));
  EXPECT(!logged(&d, "info line") && !logged(&d, "warn line"));
  end_log(&d);
}

static void test_trace(void) {
  log_dest_t d;
  char line[1024], where[64];
  start_log(&d, "TRACE", "ALL");
  int at = __LINE__ + 1;
  TRACE(LOG_COLL, "trace line %d", 7);
  EXPECT(find_line(&d, "trace line 7", line, sizeof line), "nothing logged in %s", d.path);
  snprintf(where, sizeof where, "test_log.c:%d ", at);
  EXPECT(strstr(line, where) != NULL, "no \"%s\" in \"%s\"", where, line);
  EXPECT(strstr(line, "NCCL TRACE trace line 7") != NULL, "got \"%s\"", line);
  end_log(&d);
}

static void test_log_err(void) {
  log_dest_t d;
  start_log(&d, "WARN", NULL);
  EXPECT(strcmp(log_last_error(), "") == 0, "a last error before any: \"%s\"", log_last_error());
  EXPECT(log_err(ncclSystemError, "socket %d: %s", 5, "refused") == ncclSystemError);
  EXPECT(strcmp(log_last_error(), "socket 5: refused") == 0, "got \"%s\"", log_last_error());
  EXPECT(logged(&d, "NCCL WARN socket 5: refused"), "log_err did not log at WARN");
  EXPECT(log_err(ncclInvalidArgument, "second") == ncclInvalidArgument);
  EXPECT(strcmp(log_last_error(), "second") == 0, "got \"%s\"", log_last_error());
  end_log(&d);
}

static void *fail_in_thread(void *arg) {
  (void)arg;
  return (void *)(intptr_t)log_err(ncclRemoteError, "peer %d went away", 9);
}

static void *read_in_thread(void *arg) {
  snprintf(arg, 256, "%s", log_last_error());
  return NULL;
}

/* The last error is the calling thread's: another thread's failure neither shows in nor overwrites it. */
static void test_last_error_threads(void) {
  pthread_t t;
  void *res;
  char seen[256] = "x";
  unsetenv("NCCL_DEBUG");
  param_reload();
  log_init();
  EXPECT(log_err(ncclInvalidArgument, "mine: count %d", -1) == ncclInvalidArgument);
  EXPECT(pthread_create(&t, NULL, fail_in_thread, NULL) == 0);
  EXPECT(pthread_join(t, &res) == 0);
  EXPECT((intptr_t)res == ncclRemoteError);
  EXPECT(strcmp(log_last_error(), "mine: count -1") == 0, "main thread read \"%s\"", log_last_error());
  EXPECT(pthread_create(&t, NULL, read_in_thread, seen) == 0);
  EXPECT(pthread_join(t, NULL) == 0);
  EXPECT(strcmp(seen, "") == 0, "a thread without errors read \"%s\"", seen);
  log_set_last_error("handed over: %s", "peer 9 went away");
  EXPECT(strcmp(log_last_error(), "handed over: peer 9 went away") == 0, "got \"%s\"", log_last_error());
}

static void test_result_names(void) {
  for (int r = 0; r <= 8; r++) {
    const char *name = log_result_name((ncclResult_t)r);
    EXPECT(name != NULL && name[0] != '\0', "result %d has no name", r);
    EXPECT(strcmp(name, "unknown result code") != 0, "result %d is unknown", r);
    for (int q = 0; q < r; q++)
      EXPECT(strcmp(name, log_result_name((ncclResult_t)q)) != 0, "results %d and %d share a name", q, r);
  }
  EXPECT(strstr(log_result_name((ncclResult_t)8), "timeout") != NULL);
  EXPECT(strcmp(log_result_name((ncclResult_t)9), "unknown result code") == 0);
  EXPECT(strcmp(log_result_name((ncclResult_t)1000), "unknown result code") == 0);
}

int main(void) {
  TEST(test_info_line, 10);
  TEST(test_subsys_list, 10);
  TEST(test_subsys_exclude, 10);
  TEST(test_warn_always, 10);
  TEST(test_debug_unset, 10);
  TEST(test_trace, 10);
  TEST(test_log_err, 10);
  TEST(test_last_error_threads, 10);
  TEST(test_result_names, 10);
  return test_summary();
}
