/*
 * The bootstrap against strangers and broken ranks, on the loopback address only: connections that never
 * send their hello (half-open) or send part of it and hold, a flood of connections, a stranger who knows
 * NCCL_COMM_ID but not the job's secret, a hello that claims 2^31 - 1 ranks, init with nranks = INT_MAX, a
 * thousand unique ids never used, and ranks that die during init. The job must come through unharmed, or
 * fail at once with a message naming the rank that is gone; nothing may stall it or touch the process's
 * other descriptors.
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/log.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/timeutil.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/wire.h"
#include "harness.h"

static ncclUniqueId id;

static void set_param(const char *name, const char *value) {
  setenv(name, value, 1);
  param_reload();
}

static sock_addr_t root_of(const ncclUniqueId *u) {
  id_body_t body;
  memcpy(&body, u->internal, sizeof body);
  return body.root;
}

/* A connection to the root that sends the first `bytes` bytes of a hello (0: none) and stays open. */
static int stranger(const sock_addr_t *to, size_t bytes) {
  int fd;
  EXPECT_OK(sock_connect(to, NULL, time_now() + 10, &fd));
  root_msg_t m = {.magic = BOOT_MAGIC, .nonce = 12345, .type = MSG_HELLO};
  if (bytes > 0) EXPECT_OK(sock_send_all(fd, &m, bytes, NULL, time_now() + 10, "a stranger's hello"));
  return fd;
}

/* A rank of a four-rank job: init, an allgather whose every block must come back, close. */
static void rank_job(int rank, int nranks, void *arg) {
  (void)arg;
  boot_t *b;
  EXPECT_OK(boot_init(&id, 1, rank, nranks, NULL, &b));
  int all[8] = {0};
  all[rank] = 100 + rank;
  EXPECT_OK(boot_allgather(b, all, sizeof all[0]));
  for (int r = 0; r < nranks; r++) EXPECT(all[r] == 100 + r, "rank %d: block %d is %d", rank, r, all[r]);
  boot_close(b);
}

static void job_with_strangers(size_t bytes) {
  set_param("NCCL_SOCKET_IFNAME", "lo");
  EXPECT_OK(boot_get_unique_id(&id));
  sock_addr_t root = root_of(&id);
  int fds[40];
  for (int i = 0; i < 40; i++) fds[i] = stranger(&root, bytes);
  /* at 10 s per stranger, one after the other, the ranks would wait 400 s (this case's timeout is 60 s) */
  EXPECT(run_ranks(4, 50, rank_job, NULL) == 0, "the job failed beside %s strangers",
         bytes ? "held" : "half-open");
  for (int i = 0; i < 40; i++) sock_close(fds[i]);
}

static void half_open(void) {
  job_with_strangers(0);
}

static void held(void) {
  job_with_strangers(sizeof(root_msg_t) / 2);
}

/* Connections opened and closed as fast as a thread can, with and without garbage, during init. */
static _Atomic int flooding;

static void *flood(void *arg) {
  const sock_addr_t *root = arg;
  char junk[sizeof(root_msg_t)];
  memset(junk, 0x5a, sizeof junk);
  for (int i = 0; flooding; i++) {
    int fd;
    if (sock_connect(root, NULL, time_now() + 5, &fd) != ncclSuccess) continue;
    if (i % 2) (void)!send(fd, junk, sizeof junk, MSG_NOSIGNAL | MSG_DONTWAIT);
    sock_close(fd);
  }
  return NULL;
}

static void flooded(void) {
  set_param("NCCL_SOCKET_IFNAME", "lo");
  EXPECT_OK(boot_get_unique_id(&id));
  sock_addr_t root = root_of(&id);
  pthread_t t;
  flooding = 1;
  EXPECT(pthread_create(&t, NULL, flood, &root) == 0);
  EXPECT(run_ranks(4, 50, rank_job, NULL) == 0, "the job failed during a flood");
  flooding = 0;
  pthread_join(t, NULL);
  /* one host's idle connections beyond GATE_PER_HOST are closed at once */
  int fds[GATE_PER_HOST + 1];
  EXPECT_OK(boot_get_unique_id(&id));
  root = root_of(&id);
  for (int i = 0; i <= GATE_PER_HOST; i++) fds[i] = stranger(&root, 0);
  char c;
  struct timeval tv = {.tv_sec = 3};
  setsockopt(fds[GATE_PER_HOST], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  EXPECT(recv(fds[GATE_PER_HOST], &c, 1, 0) == 0, "connection %d of one host was not closed",
         GATE_PER_HOST + 1);
  for (int i = 0; i <= GATE_PER_HOST; i++) sock_close(fds[i]);
}

/* NCCL_COMM_ID's address is no secret: a stranger who computes a nonce from it and claims rank 1 before
 * rank 1 comes must not take its place when the job set BRAID_COMM_SECRET. */
static void comm_id_stranger(void) {
  set_param("NCCL_SOCKET_IFNAME", "lo");
  sock_addr_t at;
  int fd;
  EXPECT_OK(sock_parse_addr("127.0.0.1:0", &at));
  EXPECT_OK(sock_listen(&at, &fd)); /* a free port */
  sock_close(fd);
  char comm_id[64];
  snprintf(comm_id, sizeof comm_id, "127.0.0.1:%d", ntohs(at.sin.sin_port));
  set_param("NCCL_COMM_ID", comm_id);
  set_param("BRAID_COMM_SECRET", "correct horse battery staple");
  EXPECT_OK(boot_get_unique_id(&id));
  uint64_t guess = hash_bytes(comm_id, strlen(comm_id)) | 1;
  EXPECT(boot_id_nonce(&id) != guess, "the nonce is computable from NCCL_COMM_ID alone");
  /* the root runs here (as rank 0's process would run it); the ranks get the same id without the flag */
  EXPECT_OK(boot_start_root(&at, boot_id_nonce(&id)));
  id_body_t body;
  memcpy(&body, id.internal, sizeof body);
  body.flags = 0;
  body.checksum = 0;
  memset(id.internal, 0, sizeof id.internal);
  memcpy(id.internal, &body, sizeof body);
  uint64_t sum = hash_bytes(id.internal, sizeof id.internal);
  memcpy(id.internal, &sum, sizeof sum);
  int s = stranger(&at, 0);
  root_msg_t m = {.magic = BOOT_MAGIC,
                  .nonce = guess,
                  .type = MSG_HELLO,
                  .rank = 1,
                  .nranks = 4,
                  .nid = 1,
                  .addr = at,
                  .prev_root = at,
                  .prev_nonce = guess};
  EXPECT_OK(sock_send_all(s, &m, sizeof m, NULL, time_now() + 5, "the stranger's hello"));
  EXPECT(run_ranks(4, 50, rank_job, NULL) == 0, "the stranger took a rank's place");
  sock_close(s);
}

/* Whether descriptor 0 is open (the tests point it at a pipe first). */
static int stdin_open(void) {
  return fcntl(0, F_GETFD) != -1;
}

static void pipe_on_stdin(void) {
  int p[2];
  EXPECT(pipe(p) == 0);
  EXPECT(dup2(p[0], 0) == 0);
}

/* A hello with the id's nonce that claims 2^31 - 1 ranks: the root answers the timeout promptly, naming a
 * few of the missing ranks, and closes nothing of the process's. */
static void huge_nranks_hello(void) {
  set_param("NCCL_SOCKET_IFNAME", "lo");
  set_param("BRAID_BOOTSTRAP_TIMEOUT_S", "2");
  pipe_on_stdin();
  EXPECT_OK(boot_get_unique_id(&id));
  sock_addr_t root = root_of(&id);
  int fd = stranger(&root, 0);
  root_msg_t m = {.magic = BOOT_MAGIC,
                  .nonce = boot_id_nonce(&id),
                  .type = MSG_HELLO,
                  .rank = 0,
                  .nranks = INT_MAX,
                  .nid = 1,
                  .addr = root,
                  .prev_root = root,
                  .prev_nonce = boot_id_nonce(&id)};
  EXPECT_OK(sock_send_all(fd, &m, sizeof m, NULL, time_now() + 5, "a huge hello"));
  reply_t r;
  EXPECT_OK(sock_recv_all(fd, &r, sizeof r, NULL, time_now() + 20, "the root's reply"));
  r.error[sizeof r.error - 1] = '\0';
  EXPECT(r.status != 0 && strstr(r.error, "never reached") != NULL, "reply: %d %s", r.status, r.error);
  sock_close(fd);
  for (int i = 0; i < 20; i++, time_sleep_us(50 * 1000)) EXPECT(stdin_open(), "descriptor 0 was closed");
}

/* Init with nranks = INT_MAX fails at once for want of memory, and closes none of the process's descriptors.
 */
static void init_int_max(void) {
  set_param("NCCL_SOCKET_IFNAME", "lo");
  pipe_on_stdin();
  EXPECT_OK(boot_get_unique_id(&id));
  boot_t *b;
  EXPECT_RES(boot_init(&id, 1, 0, INT_MAX, NULL, &b), ncclSystemError);
  EXPECT(strstr(log_last_error(), "out of memory") != NULL, "message: %s", log_last_error());
  EXPECT(stdin_open(), "descriptor 0 was closed");
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  if (d != NULL) closedir(d);
  return n;
}

/* A thousand ids never used cost neither a thousand threads nor a thousand descriptors. */
static void unused_ids(void) {
  set_param("NCCL_SOCKET_IFNAME", "lo");
  EXPECT_OK(boot_get_unique_id(&id));
  int threads = count_entries("/proc/self/task"), fds = count_entries("/proc/self/fd");
  for (int i = 0; i < 1000; i++) EXPECT_OK(boot_get_unique_id(&id));
  int more_threads = count_entries("/proc/self/task") - threads,
      more_fds = count_entries("/proc/self/fd") - fds;
  EXPECT(more_threads <= 1 && more_fds <= 2, "1000 ids took %d threads and %d descriptors", more_threads,
         more_fds);
}

/* Rank 2 says hello and leaves before the ring is made: it listened, and nothing listens there any more. */
static void fake_rank_leaves(void) {
  int lfd;
  sock_addr_t self = root_of(&id), root = root_of(&id);
  self.sin.sin_port = 0;
  EXPECT_OK(sock_listen(&self, &lfd));
  int fd = stranger(&root, 0);
  root_msg_t m = {.magic = BOOT_MAGIC,
                  .nonce = boot_id_nonce(&id),
                  .type = MSG_HELLO,
                  .rank = 2,
                  .nranks = 4,
                  .nid = 1,
                  .addr = self,
                  .prev_root = root,
                  .prev_nonce = boot_id_nonce(&id)};
  EXPECT_OK(sock_send_all(fd, &m, sizeof m, NULL, time_now() + 5, "rank 2's hello"));
  reply_t r;
  EXPECT_OK(sock_recv_all(fd, &r, sizeof r, NULL, time_now() + 20, "rank 2's reply"));
  _exit(0);
}

static void rank_dies_before_ring(int rank, int nranks, void *arg) {
  (void)arg;
  if (rank == 2) fake_rank_leaves();
  boot_t *b;
  EXPECT_RES(boot_init(&id, 1, rank, nranks, NULL, &b), ncclRemoteError);
  EXPECT(strstr(log_last_error(), "rank 2 is gone") != NULL ||
             strstr(log_last_error(), "rank 2 closed") != NULL,
         "rank %d: message: %s", rank, log_last_error());
}

/* Each rank's error names rank 2 within the case's 60 s; by timeout it would come after 120 s. */
static void dies_before_ring(void) {
  set_param("NCCL_SOCKET_IFNAME", "lo");
  EXPECT_OK(boot_get_unique_id(&id));
  EXPECT(run_ranks(4, 50, rank_dies_before_ring, NULL) == 0, "a rank failed");
}

static void rank_dies_after_init(int rank, int nranks, void *arg) {
  (void)arg;
  boot_t *b;
  EXPECT_OK(boot_init(&id, 1, rank, nranks, NULL, &b));
  if (rank == 2) _exit(0);
  int all[4] = {0};
  EXPECT_RES(boot_allgather(b, all, sizeof all[0]), ncclRemoteError);
  EXPECT(strstr(log_last_error(), "rank 2 ") != NULL || strstr(log_last_error(), "rank 2:") != NULL,
         "rank %d blames another rank: %s", rank, log_last_error());
  boot_close(b);
}

/* Rank 2 exits right after init: every other rank's allgather fails naming rank 2, not its own neighbour. */
static void dies_after_init(void) {
  set_param("NCCL_SOCKET_IFNAME", "lo");
  EXPECT_OK(boot_get_unique_id(&id));
  EXPECT(run_ranks(4, 50, rank_dies_after_init, NULL) == 0, "a rank failed");
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(half_open, 60);
  TEST(held, 60);
  TEST(flooded, 60);
  TEST(comm_id_stranger, 60);
  TEST(huge_nranks_hello, 30);
  TEST(init_int_max, 30);
  TEST(unused_ids, 60);
  TEST(dies_before_ring, 60);
  TEST(dies_after_init, 60);
  return test_summary();
}
