/*
 * Braid's TCP network behind the network plugin interface (see net_tcp.h).
 *
 * Connection setup never blocks. listen opens a listening socket of its own and writes its address and a
 * random cookie into the handle. connect keeps its progress in a stage that it hangs on the handle (the
 * caller passes the same handle until a comm comes back): a non-blocking connect, retried after a refusal
 * (BRAID_CONNECT_RETRIES, 100 ms apart), then a hello carrying the cookie. accept takes connections off its
 * listening socket and keeps the first whose hello carries its cookie; anything else is dropped.
 *
 * Data: each comm keeps its requests in a ring of NCCL_NET_MAX_REQUESTS. Requests finish in the order they
 * were made; test moves the bytes of the oldest unfinished ones as far as the socket allows and frees a
 * request once it reports it done. A sender whose socket is full checks whether the receiver closed it (a
 * receiver never writes), so a failed receiver is noticed even while nothing can be sent.
 */
#include "transport/net_tcp.h"

#include <errno.h>
#include <limits.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/timeutil.h"

/* First field of a handle and of a hello: an arbitrary constant of this network. */
#define TCP_MAGIC 0x31504354444e5242ull
/* First field of a message header. */
#define TCP_MSG_MAGIC 0x4753454du
/* Seconds between two connection attempts after a refusal. */
#define RETRY_S 0.1
/* Seconds an accepted connection may take to deliver its hello before it is dropped. */
#define HELLO_TIMEOUT_S 10.0
/* Bytes a receiving comm reads beyond the part of a message it needs, so that a burst of small messages
 * costs one system call rather than two per message; larger parts go straight into place. */
#define READ_AHEAD 4096
/* Largest message: test reports sizes as int. */
#define TCP_MAX_BYTES NCCL_NET_DEFAULT_MAX_BYTES

/* Where a connect stands. */
enum { ST_START, ST_CONNECTING, ST_HELLO, ST_DONE };

/* What the connecting side sends first. */
typedef struct {
  uint64_t magic;  /* TCP_MAGIC */
  uint64_t cookie; /* the listen's, from the handle */
} tcp_hello_t;

/* A connect in progress, hung on the handle between calls. */
typedef struct {
  int state;       /* ST_* */
  int fd;          /* the socket (-1 before the attempt) */
  int attempts;    /* refused attempts so far */
  double next_try; /* time_now() before which no new attempt starts */
  size_t sent;     /* hello bytes sent */
} tcp_stage_t;

/* The handle listen writes and connect reads. */
typedef struct {
  uint64_t magic;     /* TCP_MAGIC */
  uint64_t cookie;    /* names the listen */
  sock_addr_t addr;   /* where it listens */
  tcp_stage_t *stage; /* connect's progress (NULL as listen writes it) */
} tcp_handle_t;

_Static_assert(sizeof(tcp_handle_t) <= NCCL_NET_HANDLE_MAXSIZE, "the handle fits NCCL's handle size");

/* What precedes every message's bytes on the wire. */
typedef struct {
  uint64_t bytes; /* the message's size */
  int32_t tag;    /* the sender's tag */
  uint32_t magic; /* TCP_MSG_MAGIC */
} tcp_msg_t;

_Static_assert(sizeof(tcp_msg_t) == 16, "the message header is 16 bytes on the wire");

typedef struct {
  int fd;                       /* listening socket */
  uint64_t cookie;              /* what a hello must carry */
  int pending;                  /* accepted connection whose hello is under way (-1: none) */
  double pending_since;         /* when it was accepted */
  tcp_hello_t hello;            /* its hello so far */
  size_t got;                   /* hello bytes received */
  char where[SOCK_ADDR_STRLEN]; /* the listening address, for messages */
} tcp_listen_t;

struct tcp_comm;

/* One isend or irecv. */
typedef struct {
  struct tcp_comm *comm; /* its connection */
  int used;              /* 1 from isend/irecv until test reported it done */
  int done;              /* all its bytes moved */
  char *data;            /* its buffer */
  size_t size;           /* send: the message's size; receive: the buffer's */
  size_t moved;          /* bytes moved so far, header included */
  tcp_msg_t hdr;         /* send: the header to write; receive: the header read */
} tcp_req_t;

typedef struct tcp_comm {
  int fd;                                /* the connection */
  int is_send;                           /* 1: a send comm */
  ncclResult_t broken;                   /* the error that ended it (returned again by every call) */
  uint64_t posted;                       /* requests made */
  uint64_t finished;                     /* requests whose bytes all moved (in order) */
  tcp_req_t reqs[NCCL_NET_MAX_REQUESTS]; /* request n is reqs[n % NCCL_NET_MAX_REQUESTS] */
  char peer[SOCK_ADDR_STRLEN];           /* the other end's address */
  char why[192];                         /* why it broke */
  size_t ahead_off, ahead_len;           /* receiving: ahead[ahead_off, ahead_len) read but not yet taken */
  char ahead[READ_AHEAD];                /* receiving: bytes read ahead of the messages that take them */
} tcp_comm_t;

/* The process's network state. */
static struct {
  pthread_mutex_t lock;     /* guards the fields below during init */
  int ready;                /* 1 once the interface is chosen */
  sock_addr_t addr;         /* the interface's address (port 0) */
  char ifname[64];          /* its name */
  ncclDebugLogger_t logger; /* where to log (NULL: nowhere) */
  int warn_errors;          /* 1: errors at WARN, 0: at INFO */
} tcp = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Why the calling thread's last setup call failed (connect/accept/listen have no comm to keep it on). */
static _Thread_local char setup_why[192];

#define TCP_LOG(level, ...)                                                                                  \
  do {                                                                                                       \
    if (tcp.logger != NULL) tcp.logger(level, LOG_NET, __FILE__, __LINE__, __VA_ARGS__);                     \
  } while (0)

/* Records why `res` happened (on the comm, or the thread for setup calls) and logs it. */
static ncclResult_t fail(tcp_comm_t *c, ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclResult_t fail(tcp_comm_t *c, ncclResult_t res, const char *fmt, ...) {
  char *why = c != NULL ? c->why : setup_why;
  size_t len = c != NULL ? sizeof c->why : sizeof setup_why;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, len, fmt, ap);
  va_end(ap);
  if (c != NULL) c->broken = res;
  TCP_LOG(tcp.warn_errors ? NCCL_NET_LOG_WARN : NCCL_NET_LOG_INFO, "NET/Braid: %s", why);
  return res;
}

const char *tp_tcp_why(const void *comm) {
  return comm != NULL ? ((const tcp_comm_t *)comm)->why : setup_why;
}

int tp_tcp_comm_fd(const void *comm) {
  return ((const tcp_comm_t *)comm)->fd;
}

void tp_tcp_set_warn_errors(int on) {
  tcp.warn_errors = on;
}

/* ---- Init and properties ---- */

ncclResult_t tp_tcp_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_t *config, ncclDebugLogger_t logger,
                         ncclProfilerCallback_t profiler) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&tcp.lock);
  if (logger != NULL) tcp.logger = logger;
  if (!tcp.ready) {
    res = sock_find_interface(&tcp.addr, tcp.ifname, sizeof tcp.ifname);
    tcp.ready = res == ncclSuccess;
  }
  pthread_mutex_unlock(&tcp.lock);
  if (res != ncclSuccess) return fail(NULL, res, "no network interface to use (NCCL_SOCKET_IFNAME)");
  if (ctx != NULL) *ctx = &tcp; /* one state for every communicator */
  return ncclSuccess;
}

ncclResult_t tp_tcp_finalize(void *ctx) {
  return ncclSuccess;
}

ncclResult_t tp_tcp_devices(int *ndev) {
  *ndev = tcp.ready ? 1 : 0;
  return ncclSuccess;
}

/* The interface's speed in Mbps from sysfs, or 10000 when it does not say (virtual interfaces). */
static int if_speed(const char *ifname) {
  char path[128];
  int speed = -1;
  snprintf(path, sizeof path, "/sys/class/net/%s/speed", ifname);
  FILE *f = fopen(path, "r");
  if (f != NULL) {
    if (fscanf(f, "%d", &speed) != 1) speed = -1;
    fclose(f);
  }
  return speed > 0 ? speed : 10000;
}

ncclResult_t tp_tcp_get_properties(int dev, ncclNetProperties_v11_t *props) {
  static char pci[PATH_MAX];
  if (dev != 0 || !tcp.ready) return fail(NULL, ncclInvalidArgument, "no device %d (the network has 1)", dev);
  char path[128];
  snprintf(path, sizeof path, "/sys/class/net/%s/device", tcp.ifname);
  memset(props, 0, sizeof *props);
  props->name = tcp.ifname;
  props->pciPath = realpath(path, pci) != NULL ? pci : NULL; /* none on virtual interfaces */
  props->ptrSupport = NCCL_PTR_HOST;
  props->speed = if_speed(tcp.ifname);
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->vProps.ndevs = 1;
  props->maxP2pBytes = TCP_MAX_BYTES;
  props->maxCollBytes = TCP_MAX_BYTES;
  props->maxMultiRequestSize = 1;
  return ncclSuccess;
}

/* ---- Setup ---- */

static uint64_t random_cookie(void) {
  uint64_t c = 0;
  FILE *f = fopen("/dev/urandom", "r");
  if (f == NULL || fread(&c, sizeof c, 1, f) != 1) c = (uint64_t)(time_now() * 1e9) ^ (uint64_t)getpid();
  if (f != NULL) fclose(f);
  return c;
}

ncclResult_t tp_tcp_listen(void *ctx, int dev, void *handle, void **listen_comm) {
  if (dev != 0 || !tcp.ready)
    return fail(NULL, ncclInvalidArgument, "listen on device %d (the network has 1)", dev);
  tcp_listen_t *l = calloc(1, sizeof *l);
  if (l == NULL) return fail(NULL, ncclSystemError, "listen: out of memory");
  tcp_handle_t h = {.magic = TCP_MAGIC, .cookie = random_cookie(), .addr = tcp.addr};
  ncclResult_t res = sock_listen(&h.addr, &l->fd);
  if (res != ncclSuccess) {
    free(l);
    return fail(NULL, res, "listening on %s failed", tcp.ifname);
  }
  l->cookie = h.cookie;
  l->pending = -1;
  sock_addr_str(&h.addr, l->where);
  memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  memcpy(handle, &h, sizeof h);
  *listen_comm = l;
  return ncclSuccess;
}

static tcp_comm_t *new_comm(int fd, int is_send) {
  tcp_comm_t *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->fd = fd;
  c->is_send = is_send;
  sock_addr_t peer;
  socklen_t len = sizeof peer;
  memset(&peer, 0, sizeof peer);
  getpeername(fd, &peer.sa, &len);
  sock_addr_str(&peer, c->peer);
  return c;
}

static int retryable(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
         err == ECONNRESET;
}

/* A refused attempt: closes it and schedules the next, or gives up after BRAID_CONNECT_RETRIES. */
static ncclResult_t retry(tcp_stage_t *s, int err, const char *where) {
  close(s->fd);
  s->fd = -1;
  s->state = ST_START;
  if (!retryable(err)) return fail(NULL, ncclSystemError, "connect to %s failed: %s", where, strerror(err));
  if (++s->attempts > param_int(P_BRAID_CONNECT_RETRIES))
    return fail(NULL, ncclRemoteError, "connect to %s failed after %d attempts: %s", where, s->attempts,
                strerror(err));
  s->next_try = time_now() + RETRY_S;
  return ncclSuccess;
}

/* Starts a connection attempt once the retry pause is over. */
static ncclResult_t start_attempt(tcp_stage_t *s, const tcp_handle_t *h, const char *where) {
  if (time_now() < s->next_try) return ncclSuccess;
  s->fd = socket(h->addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->fd < 0)
    return fail(NULL, ncclSystemError, "socket() to connect to %s failed: %s", where, strerror(errno));
  socklen_t len = h->addr.sa.sa_family == AF_INET ? sizeof h->addr.sin : sizeof h->addr.sin6;
  if (connect(s->fd, &h->addr.sa, len) == 0) {
    s->state = ST_HELLO;
  } else if (errno == EINPROGRESS) {
    s->state = ST_CONNECTING;
  } else {
    return retry(s, errno, where);
  }
  return ncclSuccess;
}

/* Moves a connect on as far as it goes without waiting. */
static ncclResult_t advance_connect(tcp_stage_t *s, const tcp_handle_t *h) {
  char where[SOCK_ADDR_STRLEN];
  sock_addr_str(&h->addr, where);
  if (s->state == ST_START) CHECK(start_attempt(s, h, where));
  if (s->state == ST_CONNECTING) {
    struct pollfd p = {.fd = s->fd, .events = POLLOUT};
    if (poll(&p, 1, 0) <= 0) return ncclSuccess;
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return retry(s, err, where);
    s->state = ST_HELLO;
  }
  if (s->state == ST_HELLO) {
    tcp_hello_t hello = {.magic = TCP_MAGIC, .cookie = h->cookie};
    ssize_t n = send(s->fd, (char *)&hello + s->sent, sizeof hello - s->sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return fail(NULL, ncclRemoteError, "sending the hello to %s failed: %s", where, strerror(errno));
    if (n > 0) s->sent += (size_t)n;
    if (s->sent == sizeof hello) s->state = ST_DONE;
  }
  return ncclSuccess;
}

ncclResult_t tp_tcp_connect(void *ctx, int dev, void *handle, void **send_comm,
                            ncclNetDeviceHandle_t **send_dev) {
  /* the caller's buffer is bytes, aligned or not: work on a copy, and keep the progress in the buffer */
  tcp_handle_t hc, *h = &hc;
  memcpy(&hc, handle, sizeof hc);
  *send_comm = NULL;
  if (h->magic != TCP_MAGIC)
    return fail(NULL, ncclInternalError, "connect: the handle is not this network's (magic %llx)",
                (unsigned long long)h->magic);
  if (h->stage == NULL) {
    h->stage = calloc(1, sizeof *h->stage);
    if (h->stage == NULL) return fail(NULL, ncclSystemError, "connect: out of memory");
    h->stage->fd = -1;
  }
  tcp_stage_t *s = h->stage;
  ncclResult_t res = advance_connect(s, h);
  if (res == ncclSuccess && s->state != ST_DONE) {
    memcpy(handle, &hc, sizeof hc);
    return ncclSuccess;
  }
  tcp_comm_t *c = res == ncclSuccess ? new_comm(s->fd, 1) : NULL;
  if (res == ncclSuccess && c == NULL) res = fail(NULL, ncclSystemError, "connect: out of memory");
  if (c == NULL && s->fd >= 0) close(s->fd);
  free(s);
  h->stage = NULL;
  memcpy(handle, &hc, sizeof hc);
  *send_comm = c;
  return res;
}

/* Drops the connection whose hello is under way. */
static void drop_pending(tcp_listen_t *l, const char *why) {
  TCP_LOG(NCCL_NET_LOG_INFO, "NET/Braid: listener %s dropped a connection: %s", l->where, why);
  close(l->pending);
  l->pending = -1;
}

/* Reads what has come of the pending connection's hello; *ok_p = 1 once it is whole and valid. */
static void read_hello(tcp_listen_t *l, int *ok_p) {
  *ok_p = 0;
  ssize_t n = recv(l->pending, (char *)&l->hello + l->got, sizeof l->hello - l->got, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    drop_pending(l, n == 0 ? "closed before its hello" : strerror(errno));
    return;
  }
  if (n > 0) l->got += (size_t)n;
  if (l->got < sizeof l->hello) {
    if (time_now() - l->pending_since > HELLO_TIMEOUT_S) drop_pending(l, "no hello in time");
    return;
  }
  if (l->hello.magic != TCP_MAGIC || l->hello.cookie != l->cookie) {
    drop_pending(l, "its hello names another listener");
    return;
  }
  *ok_p = 1;
}

ncclResult_t tp_tcp_accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **recv_dev) {
  tcp_listen_t *l = listen_comm;
  *recv_comm = NULL;
  for (int round = 0; round < 16; round++) {
    if (l->pending < 0) {
      int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
          return ncclSuccess;
        return fail(NULL, ncclSystemError, "accept on %s failed: %s", l->where, strerror(errno));
      }
      l->pending = fd;
      l->pending_since = time_now();
      l->got = 0;
    }
    int ok;
    read_hello(l, &ok);
    if (l->pending >= 0 && !ok) return ncclSuccess; /* hello still under way */
    if (!ok) continue;                              /* dropped: look at the next connection */
    tcp_comm_t *c = new_comm(l->pending, 0);
    if (c == NULL) return fail(NULL, ncclSystemError, "accept: out of memory");
    l->pending = -1;
    *recv_comm = c;
    return ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t tp_tcp_close_listen(void *listen_comm) {
  tcp_listen_t *l = listen_comm;
  if (l == NULL) return ncclSuccess;
  if (l->pending >= 0) close(l->pending);
  close(l->fd);
  free(l);
  return ncclSuccess;
}

ncclResult_t tp_tcp_close(void *comm) {
  tcp_comm_t *c = comm;
  if (c == NULL) return ncclSuccess;
  close(c->fd);
  free(c);
  return ncclSuccess;
}

/* ---- Memory ---- */

ncclResult_t tp_tcp_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
  if (type != NCCL_PTR_HOST)
    return fail(NULL, ncclInternalError, "regMr of memory type %d: only host memory (%d) is supported", type,
                NCCL_PTR_HOST);
  *mhandle = comm; /* nothing to register; any non-NULL handle */
  return ncclSuccess;
}

ncclResult_t tp_tcp_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                  void **mhandle) {
  return fail(NULL, ncclInternalError, "regMrDmaBuf: this network takes host memory only");
}

ncclResult_t tp_tcp_dereg_mr(void *comm, void *mhandle) {
  return ncclSuccess;
}

/* ---- Data ---- */

/* Sender whose socket took nothing: whether the receiver closed its end (it never writes, so any byte is an
 * error too). Writes alone would not tell: after the receiver's shutdown the kernel may go on taking bytes.
 */
static ncclResult_t check_receiver(tcp_comm_t *c) {
  char byte;
  ssize_t n = recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return fail(c, ncclRemoteError, "the receiver at %s closed the connection", c->peer);
  if (n > 0) return fail(c, ncclRemoteError, "the receiver at %s sent data (it never should)", c->peer);
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    return fail(c, ncclRemoteError, "connection to %s failed: %s", c->peer, strerror(errno));
  return ncclSuccess;
}

static ncclResult_t send_some(tcp_comm_t *c, tcp_req_t *r) {
  size_t total = sizeof r->hdr + r->size;
  while (r->moved < total) {
    struct iovec iov[2];
    int n = 0;
    if (r->moved < sizeof r->hdr)
      iov[n++] = (struct iovec){(char *)&r->hdr + r->moved, sizeof r->hdr - r->moved};
    size_t off = r->moved > sizeof r->hdr ? r->moved - sizeof r->hdr : 0;
    if (r->size > off) iov[n++] = (struct iovec){r->data + off, r->size - off};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t sent = sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return check_receiver(c);
      return fail(c, ncclRemoteError, "sending to %s failed after %zu of %zu bytes: %s", c->peer, r->moved,
                  total, strerror(errno));
    }
    r->moved += (size_t)sent;
  }
  r->done = 1;
  return ncclSuccess;
}

/* Reads up to n bytes; *got_p = 0 when none are there yet. */
static ncclResult_t read_some(tcp_comm_t *c, char *dst, size_t n, size_t *got_p, const tcp_req_t *r) {
  ssize_t got;
  do got = recv(c->fd, dst, n, MSG_DONTWAIT);
  while (got < 0 && errno == EINTR);
  *got_p = got > 0 ? (size_t)got : 0;
  if (got == 0)
    return fail(c, ncclRemoteError, "the sender at %s closed the connection (%zu bytes into a message)",
                c->peer, r->moved);
  if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
    return fail(c, ncclRemoteError, "receiving from %s failed: %s", c->peer, strerror(errno));
  return ncclSuccess;
}

/* Takes up to `want` bytes of the stream: from what was read ahead, straight from the socket for a large
 * part, else by reading ahead. *got_p = 0 when nothing is there yet. */
static ncclResult_t take(tcp_comm_t *c, char *dst, size_t want, size_t *got_p, const tcp_req_t *r) {
  if (c->ahead_off == c->ahead_len) {
    if (want >= READ_AHEAD) return read_some(c, dst, want, got_p, r);
    size_t got;
    CHECK(read_some(c, c->ahead, READ_AHEAD, &got, r));
    c->ahead_off = 0;
    c->ahead_len = got;
  }
  size_t n = c->ahead_len - c->ahead_off < want ? c->ahead_len - c->ahead_off : want;
  memcpy(dst, c->ahead + c->ahead_off, n);
  c->ahead_off += n;
  *got_p = n;
  return ncclSuccess;
}

static ncclResult_t recv_some(tcp_comm_t *c, tcp_req_t *r) {
  for (;;) {
    int in_hdr = r->moved < sizeof r->hdr;
    size_t want = in_hdr ? sizeof r->hdr - r->moved : (size_t)r->hdr.bytes - (r->moved - sizeof r->hdr);
    if (want == 0) break;
    char *dst = in_hdr ? (char *)&r->hdr + r->moved : r->data + (r->moved - sizeof r->hdr);
    size_t got;
    CHECK(take(c, dst, want, &got, r));
    if (got == 0) return ncclSuccess;
    r->moved += got;
    if (in_hdr && r->moved == sizeof r->hdr) {
      if (r->hdr.magic != TCP_MSG_MAGIC)
        return fail(c, ncclRemoteError, "a message from %s has a bad header (magic %08x)", c->peer,
                    (unsigned)r->hdr.magic);
      if (r->hdr.bytes > r->size)
        return fail(c, ncclInternalError,
                    "a message of %llu bytes from %s is larger than the receive (%zu bytes)",
                    (unsigned long long)r->hdr.bytes, c->peer, r->size);
    }
  }
  r->done = 1;
  return ncclSuccess;
}

/* Moves the oldest unfinished requests' bytes, in order, as far as the socket allows. */
static ncclResult_t progress(tcp_comm_t *c) {
  if (c->broken != ncclSuccess) return c->broken;
  while (c->finished < c->posted) {
    tcp_req_t *r = &c->reqs[c->finished % NCCL_NET_MAX_REQUESTS];
    CHECK(c->is_send ? send_some(c, r) : recv_some(c, r));
    if (!r->done) break;
    c->finished++;
  }
  return ncclSuccess;
}

/* The next request slot, or NULL when all NCCL_NET_MAX_REQUESTS are in use. */
static tcp_req_t *new_req(tcp_comm_t *c, void *data, size_t size) {
  tcp_req_t *r = &c->reqs[c->posted % NCCL_NET_MAX_REQUESTS];
  if (r->used) return NULL;
  *r = (tcp_req_t){.comm = c, .used = 1, .data = data, .size = size};
  c->posted++;
  return r;
}

ncclResult_t tp_tcp_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                          void **request) {
  tcp_comm_t *c = send_comm;
  *request = NULL;
  if (c->broken != ncclSuccess) return c->broken;
  if (size > TCP_MAX_BYTES)
    return fail(c, ncclInternalError, "isend of %zu bytes: at most %ld per message", size, TCP_MAX_BYTES);
  tcp_req_t *r = new_req(c, data, size);
  if (r == NULL) return ncclSuccess;
  r->hdr = (tcp_msg_t){.bytes = size, .tag = tag, .magic = TCP_MSG_MAGIC};
  *request = r;
  return progress(c);
}

ncclResult_t tp_tcp_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                          void **phandles, void **request) {
  tcp_comm_t *c = recv_comm;
  *request = NULL;
  if (c->broken != ncclSuccess) return c->broken;
  if (n != 1)
    return fail(c, ncclInternalError, "irecv of %d buffers: this network receives one at a time", n);
  tcp_req_t *r = new_req(c, data[0], sizes[0]);
  if (r != NULL) *request = r; /* read by test: posting costs no system call */
  return ncclSuccess;
}

ncclResult_t tp_tcp_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request) {
  *request = NULL; /* host memory: nothing to flush */
  return ncclSuccess;
}

ncclResult_t tp_tcp_test(void *request, int *done, int *size) {
  tcp_req_t *r = request;
  tcp_comm_t *c = r->comm;
  *done = 0;
  /* Moving the queue may complete this request and then fail on a later one: this one is still done. */
  ncclResult_t res = r->done ? ncclSuccess : progress(c);
  if (!r->done) return res;
  *done = 1;
  if (size != NULL) *size = (int)r->hdr.bytes;
  r->used = 0;
  return ncclSuccess;
}

static ncclResult_t tcp_close_send(void *comm) {
  return tp_tcp_close(comm);
}

static ncclResult_t tcp_close_recv(void *comm) {
  return tp_tcp_close(comm);
}

const ncclNet_v11_t tp_tcp_net = {
    .name = "Socket",
    .init = tp_tcp_init,
    .devices = tp_tcp_devices,
    .getProperties = tp_tcp_get_properties,
    .listen = tp_tcp_listen,
    .connect = tp_tcp_connect,
    .accept = tp_tcp_accept,
    .regMr = tp_tcp_reg_mr,
    .regMrDmaBuf = tp_tcp_reg_mr_dmabuf,
    .deregMr = tp_tcp_dereg_mr,
    .isend = tp_tcp_isend,
    .irecv = tp_tcp_irecv,
    .iflush = tp_tcp_iflush,
    .test = tp_tcp_test,
    .closeSend = tcp_close_send,
    .closeRecv = tcp_close_recv,
    .closeListen = tp_tcp_close_listen,
    .finalize = tp_tcp_finalize,
};
