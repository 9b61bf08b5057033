/*
 * Tests of the bootstrap: unique ids (round trip, corruption), init with 1 to 8 ranks in child processes,
 * allgather, tagged messages between all pairs out of order, barriers, scalable init with several ids,
 * NCCL_COMM_ID, threads that send while another waits to receive, and the failures that must end in an error
 * rather than a hang: a rank that never arrives, a peer that dies, and an abort.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/timeutil.h"
#include "bootstrap/bootstrap.h"
#include "harness.h"

/* What the parent hands its ranks. */
typedef struct {
  ncclUniqueId ids[4]; /* the ids (nid of them) */
  int nid;             /* how many */
  unsigned seed;       /* base of the random data */
} job_t;

static void set_param(const char *name, const char *value) {
  if (value != NULL)
    setenv(name, value, 1);
  else
    unsetenv(name);
  param_reload();
}

/* The byte that rank r contributes at offset i for a given seed (every rank can recompute it). */
static unsigned char data_byte(unsigned seed, int r, size_t i) {
  uint64_t x = (seed + 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1)) ^ (i * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 31;
  return (unsigned char)(x * 0x94d049bb133111ebull >> 56);
}

static void check_allgather(boot_t *b, int rank, int nranks, unsigned seed, size_t size) {
  unsigned char *buf = calloc(nranks, size);
  for (size_t i = 0; i < size; i++) buf[rank * size + i] = data_byte(seed, rank, i);
  EXPECT_OK(boot_allgather(b, buf, size));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < size; i++)
      EXPECT(buf[r * size + i] == data_byte(seed, r, i), "rank %d: block %d byte %zu of %zu", rank, r, i,
             size);
  free(buf);
}

/* A tagged message's size and contents, from its sender, receiver and tag. */
static size_t msg_size(int from, int to, uint32_t tag) {
  return 1 + (size_t)(from * 7 + to * 3 + tag * 101) % 3000;
}

static void fill_msg(unsigned char *buf, int from, int to, uint32_t tag) {
  for (size_t i = 0; i < msg_size(from, to, tag); i++)
    buf[i] = (unsigned char)(from * 31 + to * 17 + tag + i);
}

/* Every rank sends tags 1..3 to every rank (itself included), then receives them in another order. */
static void check_tagged(boot_t *b, int rank, int nranks) {
  unsigned char out[4096], in[4096], want[4096];
  for (int peer = 0; peer < nranks; peer++)
    for (uint32_t tag = 1; tag <= 3; tag++) {
      fill_msg(out, rank, peer, tag);
      EXPECT_OK(boot_send(b, peer, tag, out, msg_size(rank, peer, tag)));
    }
  static const uint32_t order[3] = {3, 1, 2};
  for (int k = 0; k < nranks; k++) {
    int peer = (rank + nranks - k) % nranks;
    for (int t = 0; t < 3; t++) {
      size_t n = msg_size(peer, rank, order[t]);
      EXPECT_OK(boot_recv(b, peer, order[t], in, n));
      fill_msg(want, peer, rank, order[t]);
      EXPECT(memcmp(in, want, n) == 0, "rank %d: message from %d tag %u", rank, peer, order[t]);
    }
  }
}

static void rank_full(int rank, int nranks, void *arg) {
  job_t *job = arg;
  boot_t *b;
  EXPECT_OK(boot_init(job->ids, job->nid, rank, nranks, NULL, &b));
  for (int r = 0; r < nranks; r++)
    EXPECT(boot_addr(b, r)->sin.sin_port != 0, "rank %d: no address of %d", rank, r);
  static const size_t sizes[] = {1, 13, 4096, 300000};
  for (int i = 0; i < 4; i++) check_allgather(b, rank, nranks, job->seed + i, sizes[i]);
  check_tagged(b, rank, nranks);
  EXPECT_OK(boot_barrier(b));
  check_tagged(b, rank, nranks);
  EXPECT_OK(boot_barrier(b));
  boot_close(b);
}

static void run_job(int nranks, int nid) {
  job_t job = {.nid = nid, .seed = (unsigned)time(NULL) ^ (unsigned)getpid()};
  for (int i = 0; i < nid; i++) EXPECT_OK(boot_get_unique_id(&job.ids[i]));
  EXPECT(run_ranks(nranks, 60, rank_full, &job) == 0, "%d ranks, %d ids", nranks, nid);
}

static void test_id_roundtrip(void) {
  ncclUniqueId a, b;
  EXPECT_OK(boot_get_unique_id(&a));
  EXPECT_OK(boot_get_unique_id(&b));
  EXPECT_OK(boot_check_id(&a));
  EXPECT(boot_id_nonce(&a) != 0 && boot_id_nonce(&a) != boot_id_nonce(&b));
  ncclUniqueId copy = a;
  EXPECT(boot_id_nonce(&copy) == boot_id_nonce(&a));
  for (size_t i = 0; i < sizeof a.internal; i++) {
    ncclUniqueId bad = a;
    bad.internal[i] ^= 0x10;
    EXPECT_RES(boot_check_id(&bad), ncclInvalidArgument);
  }
  memset(&copy, 0, sizeof copy);
  EXPECT_RES(boot_check_id(&copy), ncclInvalidArgument);
  EXPECT(strstr(log_last_error(), "ncclUniqueId") != NULL, "message: %s", log_last_error());
}

static void test_ranks_1(void) {
  run_job(1, 1);
}
static void test_ranks_2(void) {
  run_job(2, 1);
}
static void test_ranks_3(void) {
  run_job(3, 1);
}
static void test_ranks_5(void) {
  run_job(5, 1);
}
static void test_ranks_8(void) {
  run_job(8, 1);
}
static void test_scalable_8_ranks_3_ids(void) {
  run_job(8, 3);
}
static void test_scalable_4_ranks_4_ids(void) {
  run_job(4, 4);
}

/* A loopback port that is free right now. */
static int free_port(void) {
  sock_addr_t addr;
  int fd;
  EXPECT_OK(sock_parse_addr("127.0.0.1:0", &addr));
  EXPECT_OK(sock_listen(&addr, &fd));
  sock_close(fd);
  return ntohs(addr.sin.sin_port);
}

static void rank_comm_id(int rank, int nranks, void *arg) {
  job_t job = {.nid = 1, .seed = 7};
  /* Each rank makes the id itself, as with NCCL_COMM_ID nothing needs to travel. */
  EXPECT_OK(boot_get_unique_id(&job.ids[0]));
  EXPECT(memcmp(&job.ids[0], arg, sizeof job.ids[0]) == 0, "rank %d computed another id", rank);
  rank_full(rank, nranks, &job);
}

static void test_comm_id(void) {
  char text[64];
  snprintf(text, sizeof text, "127.0.0.1:%d", free_port());
  set_param("NCCL_COMM_ID", text);
  ncclUniqueId id, again;
  EXPECT_OK(boot_get_unique_id(&id));
  EXPECT_OK(boot_get_unique_id(&again));
  EXPECT(memcmp(&id, &again, sizeof id) == 0);
  EXPECT_OK(boot_check_id(&id));
  EXPECT(run_ranks(3, 60, rank_comm_id, &id) == 0);
}

static void rank_missing(int rank, int nranks, void *arg) {
  job_t *job = arg;
  boot_t *b;
  double t0 = time_now();
  EXPECT_RES(boot_init(job->ids, 1, rank, 3, NULL, &b), ncclSystemError);
  double took = time_now() - t0;
  EXPECT(took < 6, "rank %d failed after %.1f s", rank, took);
  EXPECT(strstr(log_last_error(), "rank 2 of 3 never reached") != NULL, "message: %s", log_last_error());
}

static void test_rank_never_arrives(void) {
  set_param("BRAID_BOOTSTRAP_TIMEOUT_S", "2");
  job_t job = {.nid = 1};
  EXPECT_OK(boot_get_unique_id(&job.ids[0]));
  EXPECT(run_ranks(2, 30, rank_missing, &job) == 0);
}

static void rank_peer_dies(int rank, int nranks, void *arg) {
  job_t *job = arg;
  boot_t *b;
  int x = 42;
  EXPECT_OK(boot_init(job->ids, 1, rank, nranks, NULL, &b));
  if (rank == 1) {
    EXPECT_OK(boot_recv(b, 0, 5, &x, sizeof x));
    _exit(0); /* dies without closing anything */
  }
  if (rank == 0) {
    EXPECT_OK(boot_send(b, 1, 5, &x, sizeof x));
    double t0 = time_now();
    EXPECT_RES(boot_recv(b, 1, 6, &x, sizeof x), ncclRemoteError);
    EXPECT(time_now() - t0 < 3, "noticed after %.1f s", time_now() - t0);
    EXPECT(strstr(log_last_error(), "rank 1") != NULL, "message: %s", log_last_error());
    EXPECT_RES(boot_send(b, 1, 6, &x, sizeof x), ncclRemoteError);
  }
  boot_close(b);
}

static void test_peer_dies(void) {
  job_t job = {.nid = 1};
  EXPECT_OK(boot_get_unique_id(&job.ids[0]));
  EXPECT(run_ranks(3, 30, rank_peer_dies, &job) == 0);
}

static volatile int abort_flag;

static void *raise_abort(void *arg) {
  time_sleep_us(300000);
  __atomic_store_n(&abort_flag, 1, __ATOMIC_RELAXED);
  return arg;
}

static void rank_abort(int rank, int nranks, void *arg) {
  job_t *job = arg;
  boot_t *b;
  EXPECT_OK(boot_init(job->ids, 1, rank, nranks, &abort_flag, &b));
  if (rank == 0) {
    pthread_t thread;
    int x;
    pthread_create(&thread, NULL, raise_abort, NULL);
    double t0 = time_now();
    EXPECT_RES(boot_recv(b, 1, 9, &x, sizeof x), ncclInternalError);
    EXPECT(time_now() - t0 < 1.5, "stopped after %.1f s", time_now() - t0);
    EXPECT(strstr(log_last_error(), "aborted") != NULL, "message: %s", log_last_error());
    pthread_join(thread, NULL);
  } else {
    time_sleep_us(1500000);
  }
  boot_close(b);
}

static void test_abort(void) {
  job_t job = {.nid = 1};
  EXPECT_OK(boot_get_unique_id(&job.ids[0]));
  EXPECT(run_ranks(2, 30, rank_abort, &job) == 0);
}

static void test_self_and_size_mismatch(void) {
  ncclUniqueId id;
  boot_t *b;
  EXPECT_OK(boot_get_unique_id(&id));
  EXPECT_OK(boot_init(&id, 1, 0, 1, NULL, &b));
  uint64_t v = 0x1122334455667788ull, w = 0;
  EXPECT_OK(boot_send(b, 0, 1, &v, sizeof v));
  EXPECT_OK(boot_send(b, 0, 2, &v, sizeof v));
  EXPECT_OK(boot_recv(b, 0, 2, &w, sizeof w));
  EXPECT(w == v);
  EXPECT_RES(boot_recv(b, 0, 1, &w, 4), ncclInternalError);
  EXPECT(strstr(log_last_error(), "expected 4 bytes") != NULL, "message: %s", log_last_error());
  EXPECT_RES(boot_send(b, 1, 1, &v, sizeof v), ncclInvalidArgument);
  EXPECT_OK(boot_barrier(b));
  boot_close(b);
}

/* Both ranks send 8 MiB to each other before either receives: sends must serve incoming traffic. */
static void rank_big_crossing(int rank, int nranks, void *arg) {
  job_t *job = arg;
  boot_t *b;
  size_t n = 8 << 20;
  unsigned char *out = malloc(n), *in = malloc(n);
  EXPECT_OK(boot_init(job->ids, 1, rank, nranks, NULL, &b));
  for (size_t i = 0; i < n; i++) out[i] = data_byte(job->seed, rank, i);
  EXPECT_OK(boot_send(b, 1 - rank, 3, out, n));
  EXPECT_OK(boot_recv(b, 1 - rank, 3, in, n));
  for (size_t i = 0; i < n; i++) EXPECT(in[i] == data_byte(job->seed, 1 - rank, i), "byte %zu", i);
  EXPECT_OK(boot_barrier(b));
  boot_close(b);
  free(out);
  free(in);
}

static void test_big_crossing_sends(void) {
  job_t job = {.nid = 1, .seed = 99};
  EXPECT_OK(boot_get_unique_id(&job.ids[0]));
  EXPECT(run_ranks(2, 60, rank_big_crossing, &job) == 0);
}

/* Rank 0 receives from ranks 1 and 2 on two threads at once, while also sending from a third. */
typedef struct {
  boot_t *b;
  int peer;
} recv_arg_t;

static void *recv_thread(void *arg) {
  recv_arg_t *a = arg;
  int x = -1;
  EXPECT_OK(boot_recv(a->b, a->peer, 11, &x, sizeof x));
  EXPECT(x == a->peer * 100, "from %d got %d", a->peer, x);
  return NULL;
}

static void rank_threads(int rank, int nranks, void *arg) {
  job_t *job = arg;
  boot_t *b;
  EXPECT_OK(boot_init(job->ids, 1, rank, nranks, NULL, &b));
  if (rank == 0) {
    pthread_t threads[2];
    recv_arg_t args[2] = {{b, 1}, {b, 2}};
    for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, recv_thread, &args[i]);
    time_sleep_us(200000);
    int go = 1;
    EXPECT_OK(boot_send(b, 2, 12, &go, sizeof go)); /* rank 2 sends only after this */
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  } else {
    int x = rank * 100, go;
    if (rank == 2)
      EXPECT_OK(boot_recv(b, 0, 12, &go, sizeof go));
    else
      time_sleep_us(400000);
    EXPECT_OK(boot_send(b, 0, 11, &x, sizeof x));
  }
  EXPECT_OK(boot_barrier(b));
  boot_close(b);
}

static void test_threads(void) {
  job_t job = {.nid = 1};
  EXPECT_OK(boot_get_unique_id(&job.ids[0]));
  EXPECT(run_ranks(3, 30, rank_threads, &job) == 0);
}

/* Rank 0's main thread sends while its other thread waits in boot_recv for the answer to that very send, ten
 * times over: every send must get the bootstrap's lock from the waiting thread, which drops it only briefly
 * between poll slices. */
#define SEND_WHILE_RECV_ROUNDS 10

static void *answer_thread(void *arg) {
  boot_t *b = arg;
  for (int i = 0; i < SEND_WHILE_RECV_ROUNDS; i++) {
    int x = -1;
    EXPECT_OK(boot_recv(b, 1, 200 + i, &x, sizeof x));
    EXPECT(x == 1000 + i, "round %d: got %d", i, x);
  }
  return NULL;
}

static void rank_send_while_recv(int rank, int nranks, void *arg) {
  job_t *job = arg;
  boot_t *b;
  EXPECT_OK(boot_init(job->ids, 1, rank, nranks, NULL, &b));
  if (rank == 0) {
    pthread_t thread;
    pthread_create(&thread, NULL, answer_thread, b);
    for (int i = 0; i < SEND_WHILE_RECV_ROUNDS; i++) {
      time_sleep_us(20000); /* the other thread is inside boot_recv by now */
      EXPECT_OK(boot_send(b, 1, 100 + i, &i, sizeof i));
    }
    pthread_join(thread, NULL);
  } else {
    for (int i = 0; i < SEND_WHILE_RECV_ROUNDS; i++) {
      int go = -1, x = 1000 + i;
      EXPECT_OK(boot_recv(b, 0, 100 + i, &go, sizeof go));
      EXPECT(go == i, "round %d: got %d", i, go);
      EXPECT_OK(boot_send(b, 0, 200 + i, &x, sizeof x));
    }
  }
  EXPECT_OK(boot_barrier(b));
  boot_close(b);
}

static void test_send_while_receiving(void) {
  job_t job = {.nid = 1};
  EXPECT_OK(boot_get_unique_id(&job.ids[0]));
  EXPECT(run_ranks(2, 30, rank_send_while_recv, &job) == 0);
}

static void test_bad_args(void) {
  ncclUniqueId id;
  boot_t *b;
  EXPECT_OK(boot_get_unique_id(&id));
  EXPECT_RES(boot_init(&id, 1, 2, 2, NULL, &b), ncclInvalidArgument);
  EXPECT_RES(boot_init(&id, 3, 0, 2, NULL, &b), ncclInvalidArgument);
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(test_id_roundtrip, 10);
  TEST(test_self_and_size_mismatch, 10);
  TEST(test_bad_args, 10);
  TEST(test_ranks_1, 60);
  TEST(test_ranks_2, 60);
  TEST(test_ranks_3, 60);
  TEST(test_ranks_5, 60);
  TEST(test_ranks_8, 60);
  TEST(test_scalable_8_ranks_3_ids, 60);
  TEST(test_scalable_4_ranks_4_ids, 60);
  TEST(test_comm_id, 60);
  TEST(test_big_crossing_sends, 60);
  TEST(test_threads, 30);
  TEST(test_send_while_receiving, 30);
  TEST(test_rank_never_arrives, 30);
  TEST(test_peer_dies, 30);
  TEST(test_abort, 30);
  return test_summary();
}
