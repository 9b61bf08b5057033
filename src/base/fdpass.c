/*
 * Descriptor passing between processes of one machine (see fdpass.h).
 *
 * Each fetch is one SOCK_SEQPACKET connection to the owner's abstract socket "\0braid-fd-<pid>-<server>"
 * (message boundaries are kept, so every message arrives whole or not at all). <server> is a random number
 * the server draws when it starts, and the upper half of every token it hands out, so an importer finds the
 * server from the exporter's pid and token alone. It keeps two copies of the library loaded in one process
 * (a program comparing two builds, `braid bench --vs`) from claiming the same name:
 *   importer -> server: fd_req_t {magic, token}
 *   server -> importer: fd_rep_t {magic, status, err}, with the descriptor attached (SCM_RIGHTS) when the
 *                       status is FD_OK.
 * The server thread answers one connection at a time, each bounded by SERVER_IO_TIMEOUT_S, so a client that
 * stalls delays the others by at most that. An abstract socket needs no file and disappears with its last
 * descriptor, so a crash leaves nothing behind.
 */
#include "fdpass.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "log.h"
#include "param.h"
#include "timeutil.h"

#define FD_MAGIC            0x6272616964666470ull /* "braidfdp" */
#define SERVER_IO_TIMEOUT_S 2                     /* the server's bound on one client's request and reply */
#define POLL_SLICE_MS       100                   /* a fetch checks abort and deadline this often */
#define BACKLOG             128

enum { FD_OK = 0, FD_UNKNOWN = 1, FD_DENIED = 2, FD_FAILED = 3 };

typedef struct {
  uint64_t magic;
  uint64_t token;
} fd_req_t;

typedef struct {
  uint64_t magic;
  int32_t status; /* FD_* */
  int32_t err;    /* errno of the server's failure (FD_FAILED) */
} fd_rep_t;

_Static_assert(sizeof(fd_req_t) == 16 && sizeof(fd_rep_t) == 16, "fdpass wire messages are 16 bytes");

/* One served descriptor. */
typedef struct {
  uint64_t token;
  int fd; /* our duplicate, closed at fd_unserve */
} entry_t;

/* The registry and the server, all under `lock`. The server thread reads entries under the lock too, and
 * duplicates the descriptor before releasing it, so fd_unserve may close an entry at any time. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t *entries;
static int nentries, capacity;
static pid_t server_pid;   /* the process whose server thread runs (0: none; differs after fork) */
static int listen_fd = -1; /* the server's socket */
static uint32_t server_id; /* the server's number: its address, and the upper half of its tokens */

/* The abstract address of the server numbered `id` in process `pid`; writes its length. */
static void server_addr(pid_t pid, uint32_t id, struct sockaddr_un *addr, socklen_t *len_p) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "braid-fd-%d-%08x", (int)pid, id);
  *len_p = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static ncclResult_t random_token(uint64_t *token_p) {
  uint64_t t = 0;
  while (t == 0) { /* 0 is never a token, so that a zeroed blob matches nothing */
    ssize_t n;
    SYS_RETRY(n, getrandom(&t, sizeof t, 0));
    if (n != (ssize_t)sizeof t) {
      int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        return log_err(ncclSystemError, "fd_serve: no random source for a token: %s", strerror(errno));
      SYS_RETRY(n, read(fd, &t, sizeof t));
      close(fd);
      if (n != (ssize_t)sizeof t)
        return log_err(ncclSystemError, "fd_serve: reading /dev/urandom for a token failed: %s",
                       n < 0 ? strerror(errno) : "short read");
    }
  }
  *token_p = t;
  return ncclSuccess;
}

/* ---- The server ---- */

/* Sends the reply, with `fd` attached when it is not negative. */
static int send_reply(int conn, int status, int err, int fd) {
  fd_rep_t rep = {.magic = FD_MAGIC, .status = status, .err = err};
  struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    memset(&ctl, 0, sizeof ctl);
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  ssize_t n;
  SYS_RETRY(n, sendmsg(conn, &msg, MSG_NOSIGNAL));
  return n == (ssize_t)sizeof rep ? 0 : -1;
}

/* A duplicate of the descriptor served under `token`, -1 when there is none (errno says why). */
static int dup_entry(uint64_t token) {
  int fd = -1;
  errno = ENOENT;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nentries; i++)
    if (entries[i].token == token) {
      fd = fcntl(entries[i].fd, F_DUPFD_CLOEXEC, 0);
      break;
    }
  pthread_mutex_unlock(&lock);
  return fd;
}

/* Answers one connection. Failures are logged at WARN: they belong to the importer, which sees them too. */
static void serve_one(int conn) {
  struct timeval tv = {.tv_sec = SERVER_IO_TIMEOUT_S};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    WARN("descriptor server: reading a client's credentials failed: %s", strerror(errno));
    return;
  }
  if (cred.uid != geteuid()) {
    WARN("descriptor server: refusing process %d of user %d (this process runs as user %d)", (int)cred.pid,
         (int)cred.uid, (int)geteuid());
    send_reply(conn, FD_DENIED, 0, -1);
    return;
  }
  fd_req_t req;
  ssize_t n;
  SYS_RETRY(n, recv(conn, &req, sizeof req, 0));
  if (n != (ssize_t)sizeof req || req.magic != FD_MAGIC) {
    WARN("descriptor server: bad request from process %d (%zd bytes%s)", (int)cred.pid, n,
         n < 0 ? ", receive failed or timed out" : "");
    return;
  }
  int fd = dup_entry(req.token);
  if (fd < 0) {
    send_reply(conn, errno == ENOENT ? FD_UNKNOWN : FD_FAILED, errno, -1);
    return;
  }
  if (send_reply(conn, FD_OK, 0, fd) != 0)
    WARN("descriptor server: sending token %016llx to process %d failed: %s", (unsigned long long)req.token,
         (int)cred.pid, strerror(errno));
  close(fd);
}

static void *server_main(void *arg) {
  int lfd = (int)(intptr_t)arg;
  for (;;) {
    int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (conn >= 0) {
      serve_one(conn);
      close(conn);
    } else if (errno != EINTR && errno != ECONNABORTED) {
      /* Out of descriptors or memory: keep serving once the pressure passes. */
      WARN("descriptor server: accept failed: %s", strerror(errno));
      time_sleep_us(100000);
    }
  }
  return NULL;
}

/* Starts this process's server unless it runs already. Called with `lock` held. After a fork the child
 * inherits the parent's registry and socket but not its thread: it drops both and starts its own. */
static ncclResult_t start_server(void) {
  pid_t self = getpid();
  if (server_pid == self) return ncclSuccess;
  if (listen_fd >= 0) close(listen_fd);
  listen_fd = -1;
  for (int i = 0; i < nentries; i++) close(entries[i].fd);
  nentries = 0;

  uint64_t id = 0;
  CHECK(random_token(&id));
  server_id = (uint32_t)id | 1u; /* never 0, so that no token is 0 */
  struct sockaddr_un addr;
  socklen_t len;
  server_addr(self, server_id, &addr, &len);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return log_err(ncclSystemError, "descriptor server: socket() failed: %s", strerror(errno));
  ncclResult_t res = ncclSystemError;
  if (bind(fd, (struct sockaddr *)&addr, len) != 0) {
    log_err(res, "descriptor server of process %d: bind to @%s failed: %s", (int)self, addr.sun_path + 1,
            strerror(errno));
    goto err_close;
  }
  if (listen(fd, BACKLOG) != 0) {
    log_err(res, "descriptor server of process %d: listen failed: %s", (int)self, strerror(errno));
    goto err_close;
  }
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int err = pthread_create(&thread, &attr, server_main, (void *)(intptr_t)fd);
  pthread_attr_destroy(&attr);
  if (err != 0) {
    log_err(res, "descriptor server of process %d: starting its thread failed: %s", (int)self, strerror(err));
    goto err_close;
  }
  listen_fd = fd;
  server_pid = self;
  INFO(LOG_INIT, "descriptor server of process %d listening on @%s", (int)self, addr.sun_path + 1);
  return ncclSuccess;
err_close:
  close(fd);
  return res;
}

ncclResult_t fd_serve(int fd, uint64_t *token_p) {
  ncclResult_t res = ncclSuccess;
  uint64_t token = 0;
  CHECK(random_token(&token));
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0)
    return log_err(ncclSystemError, "fd_serve: duplicating descriptor %d failed: %s", fd, strerror(errno));
  pthread_mutex_lock(&lock);
  CHECK_GOTO(start_server(), res, err_unlock);
  token = (uint64_t)server_id << 32 | (token & 0xffffffffu); /* the server's number, then a random half */
  if (nentries == capacity) {
    int cap = capacity ? 2 * capacity : 16;
    entry_t *grown = realloc(entries, (size_t)cap * sizeof *grown);
    if (grown == NULL) {
      res = log_err(ncclSystemError, "fd_serve: out of host memory for %d served descriptors", cap);
      goto err_unlock;
    }
    entries = grown;
    capacity = cap;
  }
  entries[nentries++] = (entry_t){.token = token, .fd = dup_fd};
  pthread_mutex_unlock(&lock);
  *token_p = token;
  return ncclSuccess;
err_unlock:
  pthread_mutex_unlock(&lock);
  close(dup_fd);
  return res;
}

void fd_unserve(uint64_t token) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nentries; i++) {
    if (entries[i].token != token) continue;
    close(entries[i].fd);
    entries[i] = entries[--nentries];
    break;
  }
  pthread_mutex_unlock(&lock);
}

/* ---- The importer ---- */

/* Whether the abort flag is raised. Relaxed: the flag publishes no data; the poll slice bounds how late it
 * is seen. */
static int aborted(const volatile int *abort_flag) {
  return abort_flag != NULL && __atomic_load_n(abort_flag, __ATOMIC_RELAXED) != 0;
}

/* Waits up to one poll slice for `events` on fd; fails on abort or once the deadline (0: none) passed. */
static ncclResult_t wait_slice(int fd, short events, const volatile int *abort_flag, double deadline,
                               const char *doing, pid_t pid, uint64_t token) {
  if (aborted(abort_flag))
    return log_err(ncclInternalError, "fd_fetch of token %016llx from process %d: aborted while %s",
                   (unsigned long long)token, (int)pid, doing);
  int slice = POLL_SLICE_MS;
  if (deadline > 0) {
    double left = deadline - time_now();
    if (left <= 0)
      return log_err(
          ncclSystemError,
          "fd_fetch of token %016llx from process %d: timed out while %s (BRAID_BOOTSTRAP_TIMEOUT_S=%lld)",
          (unsigned long long)token, (int)pid, doing, (long long)param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S));
    if (left * 1000 < slice) slice = (int)(left * 1000) + 1;
  }
  struct pollfd pfd = {.fd = fd, .events = events};
  if (poll(&pfd, 1, slice) < 0 && errno != EINTR)
    return log_err(ncclSystemError, "fd_fetch of token %016llx from process %d: poll failed while %s: %s",
                   (unsigned long long)token, (int)pid, doing, strerror(errno));
  return ncclSuccess;
}

/* Connects to process pid's server; a full backlog is retried until the deadline. */
static ncclResult_t fetch_connect(int sock, pid_t pid, uint64_t token, const volatile int *abort_flag,
                                  double deadline) {
  struct sockaddr_un addr;
  socklen_t len;
  server_addr(pid, (uint32_t)(token >> 32), &addr, &len);
  for (;;) {
    if (connect(sock, (struct sockaddr *)&addr, len) == 0) return ncclSuccess;
    if (errno == ECONNREFUSED)
      return log_err(ncclSystemError,
                     "fd_fetch of token %016llx: process %d serves no descriptors (connecting to @%s: %s)",
                     (unsigned long long)token, (int)pid, addr.sun_path + 1, strerror(errno));
    if (errno != EAGAIN && errno != EINTR)
      return log_err(ncclSystemError, "fd_fetch of token %016llx: connecting to process %d (@%s) failed: %s",
                     (unsigned long long)token, (int)pid, addr.sun_path + 1, strerror(errno));
    CHECK(wait_slice(sock, 0, abort_flag, deadline, "connecting (its backlog is full)", pid, token));
  }
}

/* Receives the reply; writes the attached descriptor (-1 if none). */
static ncclResult_t fetch_reply(int sock, pid_t pid, uint64_t token, const volatile int *abort_flag,
                                double deadline, fd_rep_t *rep, int *fd_p) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct iovec iov = {.iov_base = rep, .iov_len = sizeof *rep};
  for (int eofs = 0;;) {
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    /* Linux can report the server's close ahead of the reply queued before it: a second read is final. */
    if (n == 0 && eofs++ == 0) continue;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      CHECK(wait_slice(sock, POLLIN, abort_flag, deadline, "waiting for its reply", pid, token));
      continue;
    }
    if (n < 0)
      return log_err(ncclSystemError, "fd_fetch of token %016llx from process %d: receive failed: %s",
                     (unsigned long long)token, (int)pid, strerror(errno));
    *fd_p = -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c != NULL && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int)))
      memcpy(fd_p, CMSG_DATA(c), sizeof(int));
    if (n != (ssize_t)sizeof *rep || rep->magic != FD_MAGIC || (msg.msg_flags & MSG_CTRUNC)) {
      if (*fd_p >= 0) close(*fd_p);
      return log_err(ncclSystemError, "fd_fetch of token %016llx from process %d: %s",
                     (unsigned long long)token, (int)pid,
                     n == 0 ? "it closed the connection without a reply" : "malformed reply");
    }
    return ncclSuccess;
  }
}

ncclResult_t fd_fetch(pid_t pid, uint64_t token, const volatile int *abort_flag, int *fd_p) {
  int64_t timeout = param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S);
  double deadline = timeout > 0 ? time_now() + (double)timeout : 0;
  int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0) return log_err(ncclSystemError, "fd_fetch: socket() failed: %s", strerror(errno));
  ncclResult_t res;
  CHECK_GOTO(fetch_connect(sock, pid, token, abort_flag, deadline), res, cleanup);
  fd_req_t req = {.magic = FD_MAGIC, .token = token};
  ssize_t n;
  /* The request fits in an empty connection's buffer, so a non-blocking send does not come back short. */
  SYS_RETRY(n, send(sock, &req, sizeof req, MSG_NOSIGNAL));
  if (n != (ssize_t)sizeof req) {
    res =
        log_err(ncclSystemError, "fd_fetch of token %016llx from process %d: sending the request failed: %s",
                (unsigned long long)token, (int)pid, n < 0 ? strerror(errno) : "short send");
    goto cleanup;
  }
  fd_rep_t rep;
  int fd = -1;
  CHECK_GOTO(fetch_reply(sock, pid, token, abort_flag, deadline, &rep, &fd), res, cleanup);
  if (rep.status == FD_OK && fd >= 0) {
    *fd_p = fd;
    goto cleanup;
  }
  if (fd >= 0) close(fd);
  if (rep.status == FD_UNKNOWN)
    res = log_err(
        ncclSystemError,
        "fd_fetch: process %d serves no descriptor under token %016llx (released already, or a wrong token)",
        (int)pid, (unsigned long long)token);
  else if (rep.status == FD_DENIED)
    res =
        log_err(ncclSystemError, "fd_fetch of token %016llx: process %d refused us: it runs as another user",
                (unsigned long long)token, (int)pid);
  else
    res = log_err(ncclSystemError, "fd_fetch of token %016llx: process %d could not send it: %s",
                  (unsigned long long)token, (int)pid,
                  rep.status == FD_FAILED ? strerror(rep.err) : "no descriptor attached");
cleanup:
  close(sock);
  return res;
}
