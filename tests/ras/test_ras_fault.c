/*
 * Monitoring when a rank fails. Rank 0 serves the clients (the others answer on ports of their own), so the
 * failing rank is never the one the client talks to.
 *   - killed_rank: rank 3 of 4 is killed (SIGKILL) after some all-reduces. A MONITOR client sees PEER_DEAD
 *     for its process within 10 s; the status then shows rank 3 missing and considered dead, in JSON and
 * text.
 *   - stopped_rank: rank 3 of 4 is stopped (SIGSTOP) while all four run all-reduces. The status's verdict
 *     names rank 3 as the one the others wait for, with the call and its sequence number, and it is
 *     unresponsive, not dead; the stall WARN of every other rank (BRAID_STALL_WARN_S) prints the same
 *     job-wide verdict. After SIGCONT the job finishes normally.
 * A driver process (rank 4 of run_ranks) plays the client.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "harness.h"
#include "json.h"
#include "nccl.h"
#include "ras_util.h"

#define NRANKS 4

typedef struct {
  atomic_int done, watching, pids[NRANKS], calls[NRANKS], id_ready;
  char id[NCCL_UNIQUE_ID_BYTES];
  _Atomic double killed_at;
} shared_t;

static shared_t *sh;
static int port;
static char logdir[256];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Ranks other than 0 answer clients on a port of their own; each rank logs to its own file. */
static void rank_setup(int rank) {
  atomic_store(&sh->pids[rank], (int)getpid());
  char path[300];
  snprintf(path, sizeof path, "%s/rank%d.log", logdir, rank);
  setenv("NCCL_DEBUG_FILE", path, 1);
  setenv("NCCL_DEBUG", getenv("RAS_TEST_DEBUG") ? "INFO" : "WARN", 1);
  setenv("NCCL_DEBUG_SUBSYS", "RAS,INIT", 1);
  rt_use_port(rank == 0 ? port : 0);
  log_init();
}

static js_t *status_json(char **text_p) {
  char err[160];
  char *s = rt_status(port, 1, 0, 30, err, sizeof err);
  EXPECT(s != NULL, "status: %s", err);
  js_t *doc = js_parse(s, strlen(s), err, sizeof err);
  EXPECT(doc != NULL, "invalid JSON (%s):\n%s", err, s);
  *text_p = s;
  return doc;
}

/* The communicator of `size` ranks in a status (the test's only one). */
static const js_t *the_comm(const js_t *doc) {
  const js_t *comms = js_get_type(doc, "communicators", JS_ARR);
  EXPECT(comms != NULL && comms->n == 1, "one communicator expected");
  return &comms->items[0];
}

/* Rank 0 makes the id and hands it to the others: its bootstrap root runs there, so that the test process
 * has no thread when it forks. */
static void get_id(int rank, ncclUniqueId *id) {
  if (rank == 0) {
    EXPECT_OK(ncclGetUniqueId((ncclUniqueId *)sh->id));
    atomic_store(&sh->id_ready, 1);
  }
  while (!atomic_load(&sh->id_ready)) usleep(1000);
  memcpy(id, sh->id, sizeof *id);
}

/* ---- A rank killed ---- */

static void killed_job(int rank) {
  ncclComm_t c;
  ncclUniqueId id;
  get_id(rank, &id);
  EXPECT_OK(ncclCommInitRank(&c, NRANKS, id, rank));
  float buf[256] = {0};
  for (int i = 0; i < 20; i++) EXPECT_OK(ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, c, NULL));
  if (rank == 3) {
    while (!atomic_load(&sh->watching)) usleep(10000); /* the MONITOR client listens */
    atomic_store(&sh->killed_at, now());
    raise(SIGKILL);
  }
  /* the survivors' next collective fails; they stay until the driver has seen what it wanted */
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 100000 && res == ncclSuccess; i++)
    res = ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, c, NULL);
  EXPECT(res != ncclSuccess, "rank %d: collectives went on without rank 3", rank);
  for (int i = 0; i < 1200 && !atomic_load(&sh->done); i++) usleep(50000);
  EXPECT_OK(ncclCommAbort(c));
  exit(0);
}

static void killed_driver(void) {
  int fd = rt_connect(port, 60);
  EXPECT(fd >= 0);
  const char *cmd = "CLIENT PROTOCOL 2\nMONITOR lifecycle\n";
  EXPECT(send(fd, cmd, strlen(cmd), MSG_NOSIGNAL) == (ssize_t)strlen(cmd));
  char line[4096], want[64];
  EXPECT(rt_line(fd, line, sizeof line, 30) > 0 && rt_line(fd, line, sizeof line, 30) > 0 &&
         strcmp(line, "OK\n") == 0);
  atomic_store(&sh->watching, 1);
  while (atomic_load(&sh->pids[3]) == 0) usleep(10000);
  snprintf(want, sizeof want, "PEER_DEAD: Process %d on node ", atomic_load(&sh->pids[3]));
  int found = 0;
  while (!found && rt_line(fd, line, sizeof line, 60) > 0) found = strstr(line, want) != NULL;
  double took = now() - atomic_load(&sh->killed_at);
  EXPECT(found, "no \"%s\" event", want);
  EXPECT(took < 10, "PEER_DEAD came %.1f s after the kill", took);
  printf("PEER_DEAD %.2f s after the kill\n", took);
  close(fd);
  char *text;
  js_t *doc = status_json(&text);
  const js_t *c = the_comm(doc), *miss = js_get_type(c, "missing_ranks", JS_ARR);
  EXPECT(miss != NULL && miss->n == 1 && js_get_type(c, "ranks_count", JS_NUM)->num == 3, "%s", text);
  const js_t *st = js_get_type(&miss->items[0], "status", JS_OBJ);
  EXPECT(js_get_type(&miss->items[0], "rank", JS_NUM)->num == 3 &&
             js_get_type(&miss->items[0], "pid", JS_NUM)->num == atomic_load(&sh->pids[3]),
         "%s", text);
  EXPECT(js_get_type(st, "considered_dead", JS_BOOL)->num == 1, "rank 3 is not considered dead:\n%s", text);
  js_free(doc);
  free(text);
  char err[160];
  text = rt_status(port, 0, 0, 30, err, sizeof err);
  EXPECT(text != NULL, "%s", err);
  EXPECT(strstr(text, "1 job process is considered dead") &&
             strstr(text, "Missing communicator data from 1 rank\n") && strstr(text, "  Rank 3 -- Process "),
         "text:\n%s", text);
  free(text);
  atomic_store(&sh->done, 1);
  fflush(stdout);
  _exit(0);
}

static void killed_main(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  if (rank == NRANKS) {
    rt_use_port(port);
    killed_driver();
  }
  rank_setup(rank);
  killed_job(rank);
}

static void killed_rank(void) {
  unsigned bad = run_ranks_mask(NRANKS + 1, 120, killed_main, NULL);
  EXPECT(bad == 1u << 3, "failed ranks 0x%x, expected only rank 3 (killed)", bad);
}

/* ---- A rank stopped ---- */

static void stopped_job(int rank) {
  ncclComm_t c;
  ncclUniqueId id;
  get_id(rank, &id);
  EXPECT_OK(ncclCommInitRank(&c, NRANKS, id, rank));
  int32_t buf[4096];
  for (int i = 0;; i++) {
    int32_t stop = atomic_load(&sh->done); /* every rank stops after the same call */
    EXPECT_OK(ncclAllReduce(&stop, &stop, 1, ncclInt32, ncclMax, c, NULL));
    if (stop) break;
    for (int k = 0; k < 4096; k++) buf[k] = rank + k;
    EXPECT_OK(ncclAllReduce(buf, buf, 4096, ncclInt32, ncclSum, c, NULL));
    for (int k = 0; k < 4096; k++)
      EXPECT(buf[k] == 6 + 4 * k, "rank %d call %d [%d] = %d", rank, i, k, buf[k]);
    atomic_fetch_add(&sh->calls[rank], 1);
  }
  EXPECT_OK(ncclCommDestroy(c));
  exit(0);
}

/* The first line of `path` holding every one of `parts` (NULL-terminated); 0 if none yet. */
static int log_has(const char *path, const char *const *parts, char *out, size_t size) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f) != NULL) {
    found = 1;
    for (int i = 0; parts[i] != NULL && found; i++) found = strstr(line, parts[i]) != NULL;
  }
  fclose(f);
  if (found) snprintf(out, size, "%s", line);
  return found;
}

static void stopped_driver(void) {
  for (int r = 0; r < NRANKS; r++)
    while (atomic_load(&sh->calls[r]) < 20) usleep(10000);
  usleep(1500000); /* long enough for a keep-alive that reports calls */
  int pid3 = atomic_load(&sh->pids[3]);
  EXPECT(kill(pid3, SIGSTOP) == 0);
  double t0 = now();
  /* the status names rank 3, with the call, once it stopped answering */
  char *text = NULL, who[64];
  snprintf(who, sizeof who, "for rank 3 (process %d on ", pid3);
  const char *verdict = NULL;
  js_t *doc = NULL;
  while (now() - t0 < 60) {
    doc = status_json(&text);
    const js_t *v = js_get_type(the_comm(doc), "verdict", JS_STR);
    if (v != NULL && strstr(v->str, "does not answer") != NULL && strstr(v->str, "ranks 0-2 ") != NULL) {
      verdict = v->str;
      break;
    }
    js_free(doc);
    free(text);
    doc = NULL;
    usleep(500000);
  }
  char dump[300];
  snprintf(dump, sizeof dump, "%s/status.json", logdir);
  FILE *f = fopen(dump, "w");
  if (f != NULL) fputs(text != NULL ? text : "", f), fclose(f);
  EXPECT(verdict != NULL, "no verdict on the stopped rank within 60 s");
  EXPECT(strstr(verdict, "ranks 0-2 wait in AllReduce #") && strstr(verdict, who), "verdict: %s\n%s", verdict,
         text);
  printf("status verdict: %s\n", verdict);
  const js_t *miss = js_get_type(the_comm(doc), "missing_ranks", JS_ARR);
  EXPECT(miss != NULL && miss->n == 1, "%s", text);
  const js_t *st = js_get_type(&miss->items[0], "status", JS_OBJ);
  EXPECT(js_get_type(st, "unresponsive", JS_BOOL)->num == 1 &&
             js_get_type(st, "considered_dead", JS_BOOL)->num == 0,
         "a stopped process is unresponsive, not dead:\n%s", text);
  js_free(doc);
  free(text);
  /* every other rank's stall warning says the same */
  for (int r = 0; r < 3; r++) {
    char path[300], line[4096];
    snprintf(path, sizeof path, "%s/rank%d.log", logdir, r);
    const char *parts[] = {"job-wide:", "wait in AllReduce #", who, "does not answer", NULL};
    int found = 0;
    while (!found && now() - t0 < 90) {
      found = log_has(path, parts, line, sizeof line);
      if (!found) usleep(200000);
    }
    EXPECT(found, "rank %d logged no job-wide verdict naming rank 3 (%s)", r, path);
    if (r == 0) printf("rank 0 stall line: %s", line);
  }
  EXPECT(kill(pid3, SIGCONT) == 0);
  atomic_store(&sh->done, 1);
  fflush(stdout);
  _exit(0);
}

static void stopped_main(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  if (rank == NRANKS) {
    rt_use_port(port);
    stopped_driver();
  }
  rank_setup(rank);
  stopped_job(rank);
}

static void stopped_rank(void) {
  setenv("BRAID_STALL_WARN_S", "8", 1);
  EXPECT(run_ranks(NRANKS + 1, 150, stopped_main, NULL) == 0, "the job did not finish after SIGCONT");
}

int main(int argc, char **argv) {
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(sh != MAP_FAILED);
  snprintf(logdir, sizeof logdir, "/tmp/braid_ras_fault.%d", (int)getpid());
  EXPECT(mkdir(logdir, 0700) == 0 || errno == EEXIST);
  port = rt_free_port();
  rt_use_port(port);
  test_filter(argc - 1, argv + 1);
  memset(sh, 0, sizeof *sh);
  TEST(killed_rank, 180);
  memset(sh, 0, sizeof *sh);
  port = rt_free_port();
  rt_use_port(port);
  TEST(stopped_rank, 240);
  return test_summary();
}
