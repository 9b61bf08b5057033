/*
 * Tests of base/fdpass: a served memfd reaches other processes as the same file (they read its content and
 * their writes show in the owner's copy); a wrong or released token, a process without a server, a server
 * that never answers and an abort all fail within a bound; two processes fetch from each other at once, and
 * eight in a storm of fetches lose none; a server's name is its own even where two copies of the library
 * share a process.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/fdpass.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "harness.h"

#define FILE_BYTES 8192
#define NCHILDREN  6

/* A memfd of FILE_BYTES random bytes; the content is also written to `content`. */
static int make_file(unsigned char *content) {
  int fd = memfd_create("fdpass-test", MFD_CLOEXEC);
  EXPECT(fd >= 0, "memfd_create failed");
  EXPECT(getrandom(content, FILE_BYTES, 0) == FILE_BYTES);
  EXPECT(pwrite(fd, content, FILE_BYTES, 0) == FILE_BYTES);
  return fd;
}

/* What the children of one case share. */
typedef struct {
  pid_t owner;
  uint64_t token;
  unsigned char content[FILE_BYTES];
} served_t;

static void fetch_and_check(int rank, int nranks, void *arg) {
  served_t *s = arg;
  int fd = -1;
  EXPECT_OK(fd_fetch(s->owner, s->token, NULL, &fd));
  unsigned char got[FILE_BYTES];
  EXPECT(pread(fd, got, FILE_BYTES, 0) == FILE_BYTES);
  EXPECT(memcmp(got, s->content, FILE_BYTES) == 0, "rank %d read other bytes than were served", rank);
  /* The same file, not a copy: the owner sees this byte. */
  unsigned char mark = (unsigned char)(0xA0 + rank);
  EXPECT(pwrite(fd, &mark, 1, FILE_BYTES + rank) == 1);
  close(fd);
}

static void test_serve_fetch(void) {
  served_t s = {.owner = getpid()};
  int fd = make_file(s.content);
  EXPECT_OK(fd_serve(fd, &s.token));
  EXPECT(s.token != 0);
  EXPECT(run_ranks(NCHILDREN, 30, fetch_and_check, &s) == 0);
  for (int r = 0; r < NCHILDREN; r++) {
    unsigned char mark = 0;
    EXPECT(pread(fd, &mark, 1, FILE_BYTES + r) == 1);
    EXPECT(mark == 0xA0 + r, "child %d's write is missing from the owner's file", r);
  }
  /* The owner may close its own descriptor: the served duplicate stays valid. */
  close(fd);
  EXPECT(run_ranks(2, 30, fetch_and_check, &s) == 0);
  fd_unserve(s.token);
}

static void test_unknown_token(void) {
  unsigned char content[FILE_BYTES];
  int fd = make_file(content);
  uint64_t token;
  EXPECT_OK(fd_serve(fd, &token));
  int got = -1;
  double t0 = time_now();
  EXPECT_RES(fd_fetch(getpid(), token ^ 1, NULL, &got), ncclSystemError);
  EXPECT(strstr(log_last_error(), "no descriptor under token") != NULL, "message: %s", log_last_error());
  fd_unserve(token);
  EXPECT_RES(fd_fetch(getpid(), token, NULL, &got), ncclSystemError);
  EXPECT(got == -1);
  EXPECT(time_now() - t0 < 2, "refusals took %.1f s", time_now() - t0);
  close(fd);
}

/* A live process that serves nothing. */
static pid_t idle_child(void) {
  pid_t pid = fork();
  EXPECT(pid >= 0);
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

static void reap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static void test_no_server(void) {
  pid_t pid = idle_child();
  int got = -1;
  double t0 = time_now();
  EXPECT_RES(fd_fetch(pid, 1234, NULL, &got), ncclSystemError);
  char want[64];
  snprintf(want, sizeof want, "process %d serves no descriptors", (int)pid);
  EXPECT(strstr(log_last_error(), want) != NULL, "message: %s", log_last_error());
  EXPECT(time_now() - t0 < 1);
  reap(pid);
}

/* Binds the abstract name of the server of `pid` whose tokens carry `token`'s upper half; returns the socket,
 * or -1 with errno when the name is taken. */
static int bind_server_name(pid_t pid, uint64_t token) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  int n = snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "braid-fd-%d-%08x", (int)pid,
                   (unsigned)(token >> 32));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  EXPECT(fd >= 0);
  if (bind(fd, (struct sockaddr *)&addr, offsetof(struct sockaddr_un, sun_path) + 1 + n) == 0) return fd;
  int err = errno;
  close(fd);
  errno = err;
  return -1;
}

/* Binds the name a server of `pid` would use for `token`, and never accepts: fetches from `pid` then wait. */
static int silent_server(pid_t pid, uint64_t token) {
  int fd = bind_server_name(pid, token);
  EXPECT(fd >= 0);
  EXPECT(listen(fd, 4) == 0);
  return fd;
}

/* A server's name carries its number, the upper half of its every token: a second copy of the library in the
 * same process (a second number) gets a name of its own, where one named after the pid alone would clash. */
static void test_server_name(void) {
  unsigned char content[FILE_BYTES];
  int fd = make_file(content);
  uint64_t t1 = 0, t2 = 0;
  EXPECT_OK(fd_serve(fd, &t1));
  EXPECT_OK(fd_serve(fd, &t2));
  EXPECT(t1 != t2 && t1 >> 32 == t2 >> 32 && t1 >> 32 != 0, "tokens %016llx and %016llx",
         (unsigned long long)t1, (unsigned long long)t2);
  EXPECT(bind_server_name(getpid(), t1) < 0 && errno == EADDRINUSE, "the server is not at the token's name");
  int other = bind_server_name(getpid(), t1 ^ ((uint64_t)1 << 32));
  EXPECT(other >= 0, "another server number in this process could not take its name");
  close(other);
  fd_unserve(t1);
  fd_unserve(t2);
  close(fd);
}

static void test_silent_server_times_out(void) {
  pid_t pid = idle_child();
  int lfd = silent_server(pid, 1);
  setenv("BRAID_BOOTSTRAP_TIMEOUT_S", "1", 1);
  param_reload();
  int got = -1;
  double t0 = time_now();
  EXPECT_RES(fd_fetch(pid, 1, NULL, &got), ncclSystemError);
  double took = time_now() - t0;
  EXPECT(took >= 0.9 && took < 3, "took %.2f s for a 1 s bound", took);
  EXPECT(strstr(log_last_error(), "timed out") != NULL, "message: %s", log_last_error());
  close(lfd);
  reap(pid);
}

static void *raise_after(void *arg) {
  time_sleep_us(200000);
  __atomic_store_n((int *)arg, 1, __ATOMIC_RELAXED);
  return NULL;
}

static void test_abort(void) {
  pid_t pid = idle_child();
  int lfd = silent_server(pid, 1);
  int flag = 0;
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, raise_after, &flag) == 0);
  int got = -1;
  double t0 = time_now();
  EXPECT_RES(fd_fetch(pid, 1, &flag, &got), ncclInternalError);
  EXPECT(time_now() - t0 < 2, "abort took %.2f s", time_now() - t0);
  EXPECT(strstr(log_last_error(), "aborted") != NULL, "message: %s", log_last_error());
  pthread_join(t, NULL);
  close(lfd);
  reap(pid);
}

/* Two ranks that serve a file each and fetch the other's at the same time. */
typedef struct {
  _Atomic int published, done;
  pid_t pid[2];
  uint64_t token[2];
  unsigned char content[2][FILE_BYTES];
} cross_t;

static void wait_count(_Atomic int *counter, int want) {
  double deadline = time_now() + 20;
  while (atomic_load(counter) < want) {
    EXPECT(time_now() < deadline, "the other rank did not arrive");
    time_sleep_us(1000);
  }
}

static void cross_rank(int rank, int nranks, void *arg) {
  cross_t *x = arg;
  int fd = make_file(x->content[rank]);
  x->pid[rank] = getpid();
  EXPECT_OK(fd_serve(fd, &x->token[rank]));
  atomic_fetch_add(&x->published, 1); /* seq_cst: the pid and token above are visible to the other rank */
  wait_count(&x->published, 2);
  int other = 1 - rank, got = -1;
  /* a failure names the library's message: one seen once in CI printed the code alone */
  const ncclResult_t res = fd_fetch(x->pid[other], x->token[other], NULL, &got);
  EXPECT(res == ncclSuccess, "rank %d: fetching rank %d's descriptor returned %d: %s", rank, other, (int)res,
         log_last_error());
  unsigned char buf[FILE_BYTES];
  EXPECT(pread(got, buf, FILE_BYTES, 0) == FILE_BYTES);
  EXPECT(memcmp(buf, x->content[other], FILE_BYTES) == 0);
  close(got);
  atomic_fetch_add(&x->done, 1);
  wait_count(&x->done, 2); /* keep serving until the other rank has its copy */
  fd_unserve(x->token[rank]);
  close(fd);
}

static void test_cross_fetch(void) {
  cross_t *x = mmap(NULL, sizeof *x, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(x != MAP_FAILED);
  for (int round = 0; round < 20; round++) {
    memset(x, 0, sizeof *x);
    EXPECT(run_ranks(2, 30, cross_rank, x) == 0, "round %d", round);
  }
  munmap(x, sizeof *x);
}

/* Many processes fetching from each other at once: a server's reply is followed at once by its close, and a
 * non-blocking read racing both can report the close although the reply is queued (a few times in 400,000
 * fetches here, seen on Linux 6.18); every fetch must still get its descriptor. */
#define STORM_RANKS   8
#define STORM_FETCHES 50000

typedef struct {
  _Atomic int published, done;
  pid_t pid[STORM_RANKS];
  uint64_t token[STORM_RANKS];
} storm_t;

static void storm_rank(int rank, int nranks, void *arg) {
  storm_t *x = arg;
  unsigned char content[FILE_BYTES];
  int fd = make_file(content);
  x->pid[rank] = getpid();
  EXPECT_OK(fd_serve(fd, &x->token[rank]));
  atomic_fetch_add(&x->published, 1);
  wait_count(&x->published, nranks);
  int failed = 0;
  char first[256] = "";
  for (int i = 0; i < STORM_FETCHES; i++) {
    const int other = (rank + 1 + i % (nranks - 1)) % nranks;
    int got = -1;
    if (fd_fetch(x->pid[other], x->token[other], NULL, &got) != ncclSuccess) {
      if (failed++ == 0)
        snprintf(first, sizeof first, "fetch %d from rank %d: %s", i, other, log_last_error());
      continue;
    }
    close(got);
  }
  atomic_fetch_add(&x->done, 1);
  wait_count(&x->done, nranks); /* keep serving until every rank is through */
  fd_unserve(x->token[rank]);
  close(fd);
  EXPECT(failed == 0, "rank %d: %d of %d fetches failed, the first: %s", rank, failed, STORM_FETCHES, first);
}

static void test_fetch_storm(void) {
  storm_t *x = mmap(NULL, sizeof *x, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(x != MAP_FAILED);
  memset(x, 0, sizeof *x);
  EXPECT(run_ranks(STORM_RANKS, 120, storm_rank, x) == 0);
  munmap(x, sizeof *x);
}

int main(void) {
  TEST(test_serve_fetch, 60);
  TEST(test_unknown_token, 30);
  TEST(test_server_name, 30);
  TEST(test_no_server, 30);
  TEST(test_silent_server_times_out, 30);
  TEST(test_abort, 30);
  TEST(test_cross_fetch, 120);
  TEST(test_fetch_storm, 180);
  return test_summary();
}
