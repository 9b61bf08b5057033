/*
 * Tests of base/watchdog: finding the rank behind from the other ranks' reports (chains, a silent rank,
 * cycles, a rank waiting for no one), the published wait read by another thread while it changes (every copy
 * whole), the stall report (once, on stderr, naming the rank behind) and the timeout's result for old and new
 * callers, and asynchronous errors (the first one kept, with its message).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/param.h"
#include "base/timeutil.h"
#include "base/watchdog.h"
#include "harness.h"

static void stalled(wd_report_t *reports, int *have, int r, int peer, uint64_t seq) {
  reports[r] = (wd_report_t){.rank = r, .stalled = 1, .peer = peer, .seq = seq};
  have[r] = 1;
}

static void find_behind(void) {
  wd_report_t rep[8] = {0};
  int have[8] = {0};
  char why[256];
  /* a ring 0 -> 1 -> 2 -> 3: rank 0 waits for 3, 3 for 2, 2 said nothing */
  stalled(rep, have, 0, 3, 5);
  stalled(rep, have, 3, 2, 5);
  stalled(rep, have, 1, 0, 5);
  EXPECT(wd_find_behind(0, 4, 3, rep, have, why, sizeof why) == 2, "%s", why);
  EXPECT(strstr(why, "rank 2") != NULL, "%s", why);
  EXPECT(wd_find_behind(1, 4, 0, rep, have, why, sizeof why) == 2, "%s", why);
  /* everyone waits for everyone: the oldest call is behind */
  stalled(rep, have, 2, 1, 4);
  EXPECT(wd_find_behind(0, 4, 3, rep, have, why, sizeof why) == 2, "cycle: %s", why);
  EXPECT(strstr(why, "cycle") != NULL, "%s", why);
  /* a cycle that does not include the asking rank */
  memset(have, 0, sizeof have);
  stalled(rep, have, 0, 1, 9);
  stalled(rep, have, 1, 2, 9);
  stalled(rep, have, 2, 3, 7);
  stalled(rep, have, 3, 1, 8);
  EXPECT(wd_find_behind(0, 4, 1, rep, have, why, sizeof why) == 2, "cycle of 1, 2, 3: %s", why);
  /* a stalled rank that waits for no one in particular */
  memset(have, 0, sizeof have);
  stalled(rep, have, 0, 1, 1);
  stalled(rep, have, 1, -1, 1);
  EXPECT(wd_find_behind(0, 4, 1, rep, have, why, sizeof why) == 1, "%s", why);
  /* nothing to follow */
  EXPECT(wd_find_behind(0, 4, -1, rep, have, why, sizeof why) == -1);
}

/* A writer moves through steps; every copy a reader takes must be one the writer published. */
static _Atomic int reading;

static void *reader(void *arg) {
  const wd_t *wd = arg;
  while (reading) {
    wd_wait_t w;
    wd_read(wd, &w);
    if (w.kind == WD_IDLE) continue;
    EXPECT(w.seq == (uint64_t)w.step * 1000 && w.peer == w.step % 7 && strcmp(w.op, "AllReduce") == 0,
           "a torn copy: seq %llu step %d peer %d op %s", (unsigned long long)w.seq, w.step, w.peer, w.op);
  }
  return NULL;
}

static void published_wait(void) {
  wd_t *wd;
  EXPECT_OK(wd_create("comm t", 0, 8, 0, &wd));
  pthread_t t[2];
  reading = 1;
  for (int i = 0; i < 2; i++) EXPECT(pthread_create(&t[i], NULL, reader, wd) == 0);
  wd_timer_t timer;
  wd_wait_t w = {.kind = WD_COLL, .peer = 1, .seq = 1000, .step = 1, .channel = -1, .op = "AllReduce"};
  wd_begin(&timer, wd, &w, NULL, NULL);
  for (int step = 2; step < 200000; step++) {
    w.step = step;
    w.seq = (uint64_t)step * 1000;
    w.peer = step % 7;
    wd_progress(&timer, time_now(), &w);
  }
  wd_wait_t seen;
  wd_read(wd, &seen);
  EXPECT(seen.kind == WD_COLL && seen.step == 199999, "last published step %d", seen.step);
  wd_end(&timer);
  wd_read(wd, &seen);
  EXPECT(seen.kind == WD_IDLE, "kind %d after the end", seen.kind);
  reading = 0;
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  wd_destroy(wd);
}

/* A fake exchange: rank 1 reports waiting for rank 3, who says nothing. */
static int announced;

static void fake_announce(void *arg, const wd_report_t *mine) {
  (void)arg;
  announced += mine->stalled ? 1 : 100;
}

static void fake_collect(void *arg, wd_report_t *reports, int *have) {
  (void)arg;
  reports[1] = (wd_report_t){.rank = 1, .stalled = 1, .peer = 3, .seq = 4, .op = "AllReduce"};
  have[1] = 1;
}

static void describe(void *arg, char *buf, size_t len) {
  snprintf(buf, len, "%s", (const char *)arg);
}

static void stall_then_timeout(unsigned version, int want) {
  unsetenv("NCCL_DEBUG");
  setenv("BRAID_STALL_WARN_S", "10", 1);
  setenv("BRAID_TIMEOUT_S", "20", 1);
  param_reload();
  char path[] = "/tmp/braid_wd_XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0 && freopen(path, "w", stderr) != NULL);
  wd_t *wd;
  EXPECT_OK(wd_create("comm t", 0, 4, version, &wd));
  wd_set_exchange(wd, &(wd_exchange_t){.announce = fake_announce, .collect = fake_collect});
  wd_timer_t t;
  wd_wait_t w = {.kind = WD_COLL, .peer = 1, .seq = 4, .step = 2, .channel = -1, .op = "AllReduce"};
  wd_begin(&t, wd, &w, describe, "AllReduce waits for rank 1");
  /* the clock is given, not read: no sleeping; never on a limit, where (t0 + 5) - t0 may round below 5 */
  double t0 = t.last;
  EXPECT_OK(wd_check(&t, t0 + 4.5));
  EXPECT(announced == 0, "announced before half the stall time");
  EXPECT_OK(wd_check(&t, t0 + 5.5));
  EXPECT(announced == 1, "announced %d times at half the stall time", announced);
  EXPECT_OK(wd_check(&t, t0 + 10.5));
  EXPECT_OK(wd_check(&t, t0 + 15));
  wd_wait_t seen;
  wd_read(wd, &seen);
  EXPECT(seen.behind == 3, "published behind %d", seen.behind);
  fflush(stderr);
  EXPECT(test_file_lines(path, "NCCL WARN") == 1, "stall reports: %d", test_file_lines(path, "NCCL WARN"));
  EXPECT(test_file_lines(path, "rank 3 is behind") == 1, "the report does not name rank 3");
  EXPECT_RES(wd_check(&t, t0 + 21), want);
  wd_end(&t);
  EXPECT(announced == 1, "a failed wait told the others it moved");
  wd_destroy(wd);
  unlink(path);
}

static void stall_report_old_caller(void) {
  stall_then_timeout(0, ncclRemoteError);
}

static void stall_report_2_30_caller(void) {
  stall_then_timeout(23000, 8);
}

static void async_errors(void) {
  wd_t *wd;
  const char *msg;
  EXPECT_OK(wd_create("comm t", 0, 2, 0, &wd));
  EXPECT(wd_error(wd, &msg) == ncclSuccess && msg == NULL);
  EXPECT(wd_set_error(wd, ncclRemoteError, "rank 1 is gone"));
  EXPECT(!wd_set_error(wd, ncclSystemError, "later"));
  EXPECT(wd_error(wd, &msg) == ncclRemoteError && strcmp(msg, "rank 1 is gone") == 0, "kept: %s", msg);
  wd_destroy(wd);
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(find_behind, 10);
  TEST(published_wait, 60);
  TEST(stall_report_old_caller, 10);
  TEST(stall_report_2_30_caller, 10);
  TEST(async_errors, 10);
  return test_summary();
}
