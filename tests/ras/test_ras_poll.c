/*
 * Monitoring under polling: 8 ranks (processes) with three communicators (the world and two splits, one of
 * them made by a non-blocking split) run collectives and send/receive, and go through init, split, finalize,
 * destroy and abort again and again, while 4 clients ask for the status as fast as they can (2 in JSON, 2
 * in text), for a fixed number of queries each, and a fifth watches MONITOR events.
 *
 * Passes when: every collective's result is right; every client gets every answer; every JSON answer parses
 * strictly and is consistent (sizes 8 or 4, ranks and missing ranks add up to the size, no rank twice,
 * operation counts of a rank never decrease from one answer to the next, the world communicator never loses
 * a rank while the job runs); every text answer has NCCL's sections; and no live process is ever reported
 * dead or gone (in the answers or as a PEER_DEAD event). The sanitizer builds run it (label ras_stress).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "json.h"
#include "nccl.h"
#include "ras_util.h"

#define NRANKS     8
#define QUERIES    1000 /* per status client */
#define MAX_ROUNDS 400  /* rounds of the job at most; then it idles until the clients are done */

/* Shared between the job's ranks and the clients' process. */
typedef struct {
  atomic_int clients_done;
  atomic_int rounds[NRANKS];
  atomic_int events_seen, dead_events;
  atomic_int id_ready;
  char id[NCCL_UNIQUE_ID_BYTES];
} shared_t;

static shared_t *sh;
static int port;

/* ---- The job ---- */

static void check_allreduce(ncclComm_t c, int rank, int n, size_t count) {
  int32_t *buf = calloc(count, sizeof *buf);
  EXPECT(buf != NULL);
  for (size_t i = 0; i < count; i++) buf[i] = (int32_t)(rank * 1000 + i);
  EXPECT_OK(ncclAllReduce(buf, buf, count, ncclInt32, ncclSum, c, NULL));
  for (size_t i = 0; i < count; i++) {
    int32_t want = (int32_t)(1000 * n * (n - 1) / 2 + n * i);
    EXPECT(buf[i] == want, "rank %d all-reduce [%zu] = %d, expected %d", rank, i, buf[i], want);
  }
  free(buf);
}

static void check_allgather(ncclComm_t c, int size, int me, int round) {
  int32_t mine = me * 7 + round, *all = malloc((size_t)size * sizeof *all);
  memset(all, 0xff, (size_t)size * sizeof *all);
  EXPECT_OK(ncclAllGather(&mine, all, 1, ncclInt32, c, NULL));
  for (int r = 0; r < size; r++) EXPECT(all[r] == r * 7 + round, "all-gather [%d] = %d", r, all[r]);
  free(all);
}

/* A ring shift inside a communicator of `size` ranks. */
static void check_ring(ncclComm_t c, int size, int me, int round) {
  double out[33], in[33];
  for (int i = 0; i < 33; i++) out[i] = me * 100 + i + round, in[i] = -1;
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(out, 33, ncclFloat64, (me + 1) % size, c, NULL));
  EXPECT_OK(ncclRecv(in, 33, ncclFloat64, (me + size - 1) % size, c, NULL));
  EXPECT_OK(ncclGroupEnd());
  int from = (me + size - 1) % size;
  for (int i = 0; i < 33; i++) EXPECT(in[i] == from * 100 + i + round, "ring [%d] = %g", i, in[i]);
}

static void check_broadcast(ncclComm_t c, int rank, int root, int round) {
  int64_t v[5];
  for (int i = 0; i < 5; i++) v[i] = rank == root ? round * 10 + i : -1;
  EXPECT_OK(ncclBroadcast(v, v, 5, ncclInt64, root, c, NULL));
  for (int i = 0; i < 5; i++) EXPECT(v[i] == round * 10 + i, "broadcast [%d] = %lld", i, (long long)v[i]);
}

/* A split whose init runs in the background (config.blocking = 0). */
static ncclComm_t split_nonblocking(ncclComm_t w, int color, int key) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c;
  ncclResult_t res = ncclCommSplit(w, color, key, &c, &cfg);
  EXPECT(res == ncclSuccess || res == ncclInProgress, "non-blocking split returned %d", res);
  ncclResult_t state = ncclInProgress;
  for (int i = 0; i < 120000 && state == ncclInProgress; i++) {
    EXPECT_OK(ncclCommGetAsyncError(c, &state));
    if (state == ncclInProgress) usleep(1000);
  }
  EXPECT(state == ncclSuccess, "non-blocking split ended with %d", state);
  return c;
}

static void round_of(ncclComm_t w, int rank, int round) {
  ncclComm_t a, b;
  EXPECT_OK(ncclCommSplit(w, rank % 2, rank, &a, NULL));
  b = split_nonblocking(w, rank / 4, rank);
  check_allreduce(w, rank, NRANKS, 1024 + (size_t)round);
  check_allgather(a, NRANKS / 2, rank / 2, round);
  check_ring(b, NRANKS / 2, rank % 4, round);
  check_broadcast(w, rank, round % NRANKS, round);
  check_allreduce(w, rank, NRANKS, 1); /* every rank is past its calls on a and b: they may go */
  if (round % 2 == 0) {
    EXPECT_OK(ncclCommFinalize(a));
    EXPECT_OK(ncclCommDestroy(a));
  } else {
    EXPECT_OK(ncclCommAbort(a));
  }
  if (round % 3 == 0)
    EXPECT_OK(ncclCommAbort(b));
  else
    EXPECT_OK(ncclCommDestroy(b));
}

static void job(int rank) {
  ncclComm_t w;
  /* rank 0 makes the id (its bootstrap root runs there, so that the test process has no thread when it
   * forks) and hands it to the others */
  if (rank == 0) {
    EXPECT_OK(ncclGetUniqueId((ncclUniqueId *)sh->id));
    atomic_store(&sh->id_ready, 1);
  }
  while (!atomic_load(&sh->id_ready)) usleep(1000);
  ncclUniqueId world_id;
  memcpy(&world_id, sh->id, sizeof world_id);
  EXPECT_OK(ncclCommInitRank(&w, NRANKS, world_id, rank));
  /* Only the agreed stop ends the rounds: a rank that read clients_done on its own would skip that
   * all-reduce while the others run it, and the calls after would pair up wrongly. */
  for (int round = 0;; round++) {
    if (round >= MAX_ROUNDS) { /* every rank is here, out of collectives: each may stop on its own */
      if (atomic_load(&sh->clients_done)) break;
      usleep(10000);
      continue;
    }
    int32_t stop = atomic_load(&sh->clients_done); /* all ranks stop after the same round */
    EXPECT_OK(ncclAllReduce(&stop, &stop, 1, ncclInt32, ncclMax, w, NULL));
    if (stop) break;
    round_of(w, rank, round);
    atomic_fetch_add(&sh->rounds[rank], 1);
  }
  check_allreduce(w, rank, NRANKS, 7);
  EXPECT_OK(ncclCommDestroy(w));
  exit(0); /* not _exit: the monitor says goodbye to its peers at exit */
}

/* ---- The clients ---- */

/* What a client remembers of each rank between answers: its operation counts must not go down. */
typedef struct {
  char hash[32];
  int rank;
  double total, launched;
} seen_t;

typedef struct {
  int json, queries;
  seen_t seen[512];
  int nseen;
  int world_seen; /* answers that listed the world communicator */
} client_t;

static seen_t *remember(client_t *c, const char *hash, int rank) {
  for (int i = 0; i < c->nseen; i++)
    if (c->seen[i].rank == rank && strcmp(c->seen[i].hash, hash) == 0) return &c->seen[i];
  if (c->nseen == 512) c->nseen = 0; /* old communicators: forget them */
  seen_t *s = &c->seen[c->nseen++];
  *s = (seen_t){.rank = rank};
  snprintf(s->hash, sizeof s->hash, "%s", hash);
  return s;
}

static void check_rank_json(client_t *c, const char *hash, const js_t *r) {
  const js_t *rank = js_get_type(r, "rank", JS_NUM), *counts = js_get_type(r, "operation_counts", JS_OBJ);
  const js_t *launched = js_get_type(r, "launched", JS_NUM), *pid = js_get_type(r, "pid", JS_NUM);
  EXPECT(rank && counts && launched && pid && pid->num > 0 && js_get_type(r, "collective_counts", JS_OBJ));
  EXPECT(js_get_type(r, "now", JS_OBJ) && js_get_type(r, "memory", JS_OBJ));
  double total = 0;
  for (int k = 0; k < counts->n; k++)
    total += js_get_type(&counts->items[k], "eager", JS_NUM)->num +
             js_get_type(&counts->items[k], "graph", JS_NUM)->num;
  seen_t *s = remember(c, hash, (int)rank->num);
  EXPECT(total >= s->total && launched->num >= s->launched,
         "communicator %s rank %d: counts went from %.0f to %.0f, launched from %.0f to %.0f", hash,
         (int)rank->num, s->total, total, s->launched, launched->num);
  s->total = total;
  s->launched = launched->num;
}

static void check_json(client_t *c, const char *text) {
  char err[160];
  js_t *doc = js_parse(text, strlen(text), err, sizeof err);
  EXPECT(doc != NULL, "invalid JSON (%s):\n%s", err, text);
  const js_t *comms = js_get_type(doc, "communicators", JS_ARR);
  const js_t *count = js_get_type(doc, "communicators_count", JS_NUM);
  EXPECT(comms != NULL && count != NULL && count->num == comms->n && comms->n <= 5 * NRANKS);
  for (int i = 0; i < comms->n; i++) {
    const js_t *cm = &comms->items[i];
    const js_t *size = js_get_type(cm, "size", JS_NUM), *ranks = js_get_type(cm, "ranks", JS_ARR);
    const js_t *miss = js_get_type(cm, "missing_ranks", JS_ARR), *hash = js_get_type(cm, "hash", JS_STR);
    EXPECT(size && ranks && miss && hash && (size->num == NRANKS || size->num == NRANKS / 2), "size");
    EXPECT(ranks->n + miss->n == size->num && js_get_type(cm, "ranks_count", JS_NUM)->num == ranks->n,
           "%d ranks and %d missing in a communicator of %.0f", ranks->n, miss->n, size->num);
    unsigned seen = 0;
    for (int j = 0; j < ranks->n + miss->n; j++) {
      const js_t *e = j < ranks->n ? &ranks->items[j] : &miss->items[j - ranks->n];
      int r = (int)js_get_type(e, "rank", JS_NUM)->num;
      EXPECT(r >= 0 && r < size->num && !(seen & (1u << r)), "rank %d listed twice or out of range", r);
      seen |= 1u << r;
      if (j < ranks->n) check_rank_json(c, hash->str, e);
    }
    if (size->num == NRANKS && ranks->n == NRANKS) c->world_seen++;
  }
  const js_t *procs = js_get_type(js_get_type(doc, "braid", JS_OBJ), "processes", JS_ARR);
  EXPECT(procs != NULL && procs->n <= NRANKS, "processes");
  for (int i = 0; i < procs->n; i++) {
    const char *st = js_get_type(&procs->items[i], "state", JS_STR)->str;
    EXPECT(strcmp(st, "dead") != 0 && strcmp(st, "exited") != 0, "a live process is reported %s", st);
  }
  js_free(doc);
}

static void check_text(const char *text) {
  EXPECT(strstr(text, "Job summary\n===========") && strstr(text, "Communicators...") &&
             !strstr(text, "(null)"),
         "text report:\n%s", text);
  EXPECT(strstr(text, "DEAD\n") == NULL, "a live process is reported dead:\n%s", text);
}

static void *status_client(void *arg) {
  client_t *c = arg;
  for (int q = 0; q < c->queries; q++) {
    char err[160];
    char *s = rt_status(port, c->json, q % 5 == 4, 60, err, sizeof err);
    EXPECT(s != NULL, "query %d: %s", q, err);
    if (c->json)
      check_json(c, s);
    else
      check_text(s);
    free(s);
  }
  return NULL;
}

/* Watches lifecycle and trace events until the job ends; counts PEER_DEAD. */
static void *monitor_client(void *arg) {
  (void)arg;
  int fd = rt_connect(port, 60);
  EXPECT(fd >= 0);
  const char *cmd = "CLIENT PROTOCOL 2\nMONITOR all\n";
  EXPECT(send(fd, cmd, strlen(cmd), MSG_NOSIGNAL) == (ssize_t)strlen(cmd));
  char line[4096];
  while (rt_line(fd, line, sizeof line, 600) > 0) {
    atomic_fetch_add(&sh->events_seen, 1);
    if (strstr(line, "PEER_DEAD") != NULL && !atomic_load(&sh->clients_done)) {
      fprintf(stderr, "event while the job ran: %s", line);
      atomic_fetch_add(&sh->dead_events, 1);
    }
  }
  close(fd);
  return NULL;
}

static void clients(void) {
  static client_t c[4];
  pthread_t t[4], mon;
  pthread_create(&mon, NULL, monitor_client, NULL);
  for (int i = 0; i < 4; i++) {
    c[i] = (client_t){.json = i < 2, .queries = QUERIES};
    pthread_create(&t[i], NULL, status_client, &c[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  EXPECT(c[0].world_seen + c[1].world_seen > 0, "no answer listed the whole world communicator");
  atomic_store(&sh->clients_done, 1);
  pthread_join(mon, NULL);
  EXPECT(atomic_load(&sh->dead_events) == 0, "%d PEER_DEAD events while every process lived",
         atomic_load(&sh->dead_events));
  _exit(0);
}

static void rank_main(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  if (rank == NRANKS)
    clients();
  else
    job(rank);
}

static void polled_job(void) {
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  port = rt_free_port();
  /* every query reaches every process (no answer from the last query's view, no rate limit) */
  setenv("BRAID_RAS_MIN_QUERY_MS", "0", 1);
  setenv("BRAID_RAS_MAX_STATUS_PER_S", "0", 1);
  rt_use_port(port);
  /* the ranks and the clients' process, all children (no thread exists here when they fork) */
  EXPECT(run_ranks(NRANKS + 1, 900, rank_main, NULL) == 0, "a rank or the clients failed");
  int rounds = atomic_load(&sh->rounds[0]);
  for (int r = 1; r < NRANKS; r++)
    EXPECT(atomic_load(&sh->rounds[r]) == rounds, "ranks did different rounds");
  printf("%d rounds of init/split/collectives/destroy/abort under %d status queries; %d events\n", rounds,
         4 * QUERIES, atomic_load(&sh->events_seen));
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(polled_job, 900);
  return test_summary();
}
