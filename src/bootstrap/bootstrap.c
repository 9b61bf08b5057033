/*
 * The out-of-band bootstrap (see bootstrap.h). Three parts:
 *
 *  - the unique id and its root: a detached, one-shot thread that collects one hello per rank of its block
 *    (ranks r with r * nid / nranks == its id's index), learns from the next id's root the first address of
 *    the next block, answers each rank with its ring successor's address, and exits. A rank that never
 *    arrives turns into an error reply naming it, sent to every rank that did;
 *  - the ring: each rank connects to its successor and accepts its predecessor, then all listening
 *    addresses go round it (boot_allgather);
 *  - tagged messages: one outgoing connection per peer, opened on first use; incoming connections are
 *    accepted and read by a small progress engine that queues every complete message in memory until
 *    boot_recv asks for it, so a send never waits for the receiver to call recv.
 *
 * Wire structs are sent in host byte order: every rank of a job runs on the same architecture.
 */
#include "bootstrap.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/check.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"

/* First word of the id and of every message ("BRAIDBOT" in memory on little-endian hosts). */
#define BOOT_MAGIC 0x544f424449415242ull
#define ID_VERSION 1u
/* Flag of an id made from NCCL_COMM_ID: no root runs yet; the first rank of the id's block starts it. */
#define ID_ROOT_BY_RANK0 1u
/* Longest wait of one poll() before the abort flag and the deadline are checked again. */
#define SLICE_MS 100
/* Seconds a rank waits for the root beyond BRAID_BOOTSTRAP_TIMEOUT_S, so the root's report arrives first. */
#define ROOT_REPLY_MARGIN_S 10
/* Seconds to read the hello of a fresh connection (sent right after connect). */
#define HELLO_TIMEOUT_S 10
/* Seconds after a peer closed during which its last messages may still be accepted and read. */
#define CLOSE_GRACE_S 0.2
/* Largest tagged message accepted from the wire. */
#define MAX_MSG_BYTES (1ull << 30)

/* The contents of an ncclUniqueId. */
typedef struct {
  uint64_t checksum; /* hash_bytes of all 128 id bytes with this field zero */
  uint64_t magic;    /* BOOT_MAGIC */
  uint32_t version;  /* ID_VERSION */
  uint32_t flags;    /* ID_ROOT_BY_RANK0 or 0 */
  uint64_t nonce;    /* random (or hashed from NCCL_COMM_ID); never 0 */
  sock_addr_t root;  /* where the root listens */
} id_body_t;
_Static_assert(sizeof(id_body_t) <= NCCL_UNIQUE_ID_BYTES, "the id body must fit in ncclUniqueId");

/* Message types. */
enum { MSG_HELLO = 1, MSG_LINK = 2, MSG_REPLY = 3, MSG_RING = 4, MSG_P2P = 5 };

/* A rank's hello to its root (MSG_HELLO), or a root's message to the previous id's root (MSG_LINK). */
typedef struct {
  uint64_t magic;        /* BOOT_MAGIC */
  uint64_t nonce;        /* nonce of the receiving root's id */
  uint32_t type;         /* MSG_HELLO or MSG_LINK */
  int32_t rank;          /* hello: the sender's rank; link: the first rank of the sender's block */
  int32_t nranks;        /* ranks in the communicator */
  int32_t nid;           /* ids in the communicator */
  int32_t index;         /* hello: index of the id the rank joins; link: index of the sending root's id */
  uint32_t pad;          /* zero */
  uint64_t prev_nonce;   /* hello: nonce of the id before (index - 1 mod nid) */
  sock_addr_t addr;      /* hello: the rank's listening address; link: the sender's first rank's address */
  sock_addr_t prev_root; /* hello: root address of the id before */
} root_msg_t;

/* A root's answer to one rank. */
typedef struct {
  uint64_t magic;   /* BOOT_MAGIC */
  uint64_t nonce;   /* the root's id nonce */
  uint32_t type;    /* MSG_REPLY */
  int32_t status;   /* 0: ok; otherwise `error` says why init fails */
  sock_addr_t succ; /* listening address of the rank's ring successor */
  char error[320];  /* NUL-terminated reason when status != 0 */
} reply_t;

/* First message on every rank-to-rank connection. */
typedef struct {
  uint64_t magic; /* BOOT_MAGIC */
  uint64_t nonce; /* the communicator's nonce */
  uint32_t type;  /* MSG_RING or MSG_P2P */
  int32_t rank;   /* the connecting rank */
} conn_hello_t;

/* Header of one tagged message. */
typedef struct {
  uint32_t tag;  /* the sender's tag */
  uint32_t pad;  /* zero */
  uint64_t size; /* payload bytes that follow */
} msg_header_t;

/* A lock handed over in arrival order. boot_recv drops and retakes the lock between poll slices; with a plain
 * mutex the thread that drops it usually takes it back before a woken waiter runs, so another thread's
 * boot_send (perhaps the very message the receiver's peer waits for) could wait forever. */
typedef struct {
  pthread_mutex_t mu;  /* guards the two counters */
  pthread_cond_t turn; /* signalled whenever `serving` moves on */
  uint64_t next;       /* ticket of the next thread to ask */
  uint64_t serving;    /* ticket of the thread that holds the lock */
} fair_lock_t;

static void fair_init(fair_lock_t *l) {
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->turn, NULL);
  l->next = l->serving = 0;
}

static void fair_lock(fair_lock_t *l) {
  pthread_mutex_lock(&l->mu);
  uint64_t ticket = l->next++;
  while (l->serving != ticket) pthread_cond_wait(&l->turn, &l->mu);
  pthread_mutex_unlock(&l->mu);
}

static void fair_unlock(fair_lock_t *l) {
  pthread_mutex_lock(&l->mu);
  l->serving++;
  pthread_cond_broadcast(&l->turn);
  pthread_mutex_unlock(&l->mu);
}

static void fair_destroy(fair_lock_t *l) {
  pthread_cond_destroy(&l->turn);
  pthread_mutex_destroy(&l->mu);
}

/* A received tagged message waiting for boot_recv. */
typedef struct msg {
  struct msg *next; /* next queued message, in arrival order */
  int peer;         /* sender */
  uint32_t tag;     /* its tag */
  size_t size;      /* payload bytes */
  char data[];      /* payload */
} msg_t;

/* A message being read from one peer. */
typedef struct {
  msg_header_t hdr; /* its header */
  size_t hdr_got;   /* header bytes read so far */
  msg_t *msg;       /* the message, once the header is complete */
  size_t got;       /* payload bytes read so far */
} rx_t;

struct boot {
  int rank;                       /* this rank */
  int nranks;                     /* ranks in the communicator */
  uint64_t nonce;                 /* communicator nonce (id 0's), checked on every connection */
  const volatile int *abort_flag; /* raised by another thread to stop every wait (may be NULL) */
  int listen_fd;                  /* where peers connect */
  sock_addr_t *addrs;             /* nranks listening addresses */
  int ring_send_fd;               /* connection to the ring successor (-1 with one rank) */
  int ring_recv_fd;               /* connection from the ring predecessor (-1 with one rank) */
  /* Everything below is read and written only with `lock` held: it orders one thread's use of the sockets
   * and the queue before the next thread's, in the order the threads asked. */
  fair_lock_t lock;
  int *send_fds;       /* nranks outgoing tagged connections, -1 until first use */
  int *recv_fds;       /* nranks incoming tagged connections, -1 until the peer connects or after EOF */
  rx_t *rx;            /* nranks messages being read */
  double *closed_at;   /* nranks times when the peer was seen closing (0: not closed) */
  struct pollfd *pfds; /* 2 + 1 + 2 * nranks poll entries, reused by progress */
  msg_t *queue;        /* received messages not yet asked for, oldest first */
  msg_t **queue_tail;  /* where the next message is linked */
};

/* ---- Helpers ---- */

static int block_of(int rank, int nid, int nranks) {
  return (int)((int64_t)rank * nid / nranks);
}

/* First rank of block k (nranks for k == nid): the smallest r with r * nid >= k * nranks. */
static int block_first(int k, int nid, int nranks) {
  return (int)(((int64_t)k * nranks + nid - 1) / nid);
}

static double deadline_after(int64_t seconds) {
  return seconds > 0 ? time_now() + (double)seconds : 0;
}

static int aborted(const volatile int *abort_flag) {
  /* Relaxed: the flag publishes no data; the poll slice bounds how late it is seen. */
  return abort_flag != NULL && __atomic_load_n(abort_flag, __ATOMIC_RELAXED) != 0;
}

/* Checks the abort flag and the deadline before a wait; returns the poll timeout for this slice. */
static ncclResult_t slice_or_fail(const boot_t *b, double deadline, const char *doing, int *slice_p) {
  if (aborted(b->abort_flag))
    return log_err(ncclInternalError, "bootstrap: rank %d %s: aborted", b->rank, doing);
  int slice = SLICE_MS;
  if (deadline > 0) {
    double left = deadline - time_now();
    if (left <= 0)
      return log_err(ncclSystemError,
                     "bootstrap: rank %d timed out %s (BRAID_TIMEOUT_S=%lld, during init "
                     "BRAID_BOOTSTRAP_TIMEOUT_S=%lld)",
                     b->rank, doing, (long long)param_int(P_BRAID_TIMEOUT_S),
                     (long long)param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S));
    if (left * 1000 < slice) slice = (int)(left * 1000) + 1;
  }
  *slice_p = slice;
  return ncclSuccess;
}

/* ---- The unique id ---- */

static void encode_id(const id_body_t *body, ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  memcpy(id->internal, body, sizeof *body);
  uint64_t sum = hash_bytes(id->internal, sizeof id->internal);
  memcpy(id->internal, &sum, sizeof sum);
}

static void decode_id(const ncclUniqueId *id, id_body_t *body) {
  memcpy(body, id->internal, sizeof *body);
}

ncclResult_t boot_check_id(const ncclUniqueId *id) {
  id_body_t body;
  decode_id(id, &body);
  if (body.magic != BOOT_MAGIC)
    return log_err(ncclInvalidArgument,
                   "ncclUniqueId was not made by this library (magic %#llx, expected %#llx)",
                   (unsigned long long)body.magic, (unsigned long long)BOOT_MAGIC);
  if (body.version != ID_VERSION)
    return log_err(ncclInvalidArgument, "ncclUniqueId has version %u, this library reads version %u",
                   body.version, ID_VERSION);
  ncclUniqueId copy = *id;
  memset(copy.internal, 0, sizeof body.checksum);
  uint64_t sum = hash_bytes(copy.internal, sizeof copy.internal);
  if (sum != body.checksum)
    return log_err(ncclInvalidArgument, "ncclUniqueId is corrupt (checksum %#llx, contents hash to %#llx)",
                   (unsigned long long)body.checksum, (unsigned long long)sum);
  if (body.root.sa.sa_family != AF_INET && body.root.sa.sa_family != AF_INET6)
    return log_err(ncclInvalidArgument, "ncclUniqueId names a root of address family %d",
                   body.root.sa.sa_family);
  return ncclSuccess;
}

uint64_t boot_id_nonce(const ncclUniqueId *id) {
  id_body_t body;
  decode_id(id, &body);
  return body.nonce;
}

static ncclResult_t random_nonce(uint64_t *nonce_p) {
  uint64_t nonce = 0;
  while (nonce == 0) {
    ssize_t n = getrandom(&nonce, sizeof nonce, 0);
    if (n != (ssize_t)sizeof nonce) {
      if (n < 0 && errno == EINTR) continue;
      return log_err(ncclSystemError, "getrandom for the unique id's nonce failed: %s",
                     n < 0 ? strerror(errno) : "short read");
    }
  }
  *nonce_p = nonce;
  return ncclSuccess;
}

/* ---- The root ---- */

/* One root thread's state; owned by the thread. */
typedef struct {
  int listen_fd;         /* where ranks and the next id's root connect */
  sock_addr_t addr;      /* its address, for messages */
  uint64_t nonce;        /* its id's nonce */
  int nranks, nid;       /* from the first hello; 0 before it */
  int index;             /* this id's index, from the first hello */
  int first, count;      /* the block: ranks first .. first + count - 1 */
  int arrived;           /* hellos received */
  int *fds;              /* count connections to the block's ranks (-1 until each arrives) */
  sock_addr_t *addrs;    /* count listening addresses of the block's ranks */
  sock_addr_t prev_root; /* root of the id before, from the hellos */
  uint64_t prev_nonce;   /* its nonce */
  int link_sent;         /* whether our first rank's address went to the previous root */
  int have_link;         /* whether the next root's first address arrived */
  int link_index;        /* index the link message claimed */
  sock_addr_t link_addr; /* first rank address of the next block */
  double deadline;       /* BRAID_BOOTSTRAP_TIMEOUT_S after the first hello; 0 before it */
  char error[320];       /* why serving failed */
} root_t;

static ncclResult_t root_fail(root_t *root, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records why the root gives up (sent to every rank) and logs it at WARN; the root thread never sets the
 * library's last error, which belongs to the ranks' threads. */
static ncclResult_t root_fail(root_t *root, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(root->error, sizeof root->error, fmt, ap);
  va_end(ap);
  WARN("bootstrap root: %s", root->error);
  return ncclSystemError;
}

/* Sizes the block from the first hello. */
static ncclResult_t root_setup(root_t *root, const root_msg_t *m) {
  char name[SOCK_ADDR_STRLEN];
  if (m->nranks < 1 || m->nid < 1 || m->nid > m->nranks || m->index < 0 || m->index >= m->nid)
    return root_fail(root, "rank %d sent nranks=%d nid=%d index=%d to the bootstrap root at %s", m->rank,
                     m->nranks, m->nid, m->index, sock_addr_str(&root->addr, name));
  root->nranks = m->nranks;
  root->nid = m->nid;
  root->index = m->index;
  root->first = block_first(m->index, m->nid, m->nranks);
  root->count = block_first(m->index + 1, m->nid, m->nranks) - root->first;
  root->prev_root = m->prev_root;
  root->prev_nonce = m->prev_nonce;
  root->fds = malloc(root->count * sizeof *root->fds);
  root->addrs = calloc(root->count, sizeof *root->addrs);
  if (root->fds == NULL || root->addrs == NULL)
    return root_fail(root, "out of memory for %d ranks at the bootstrap root", root->count);
  for (int i = 0; i < root->count; i++) root->fds[i] = -1;
  root->deadline = deadline_after(param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S));
  return ncclSuccess;
}

/* Files one rank's hello; the connection is kept for the reply. */
static ncclResult_t root_add_rank(root_t *root, const root_msg_t *m, int fd) {
  if (root->nranks == 0) CHECK(root_setup(root, m));
  if (m->nranks != root->nranks || m->nid != root->nid || m->index != root->index)
    return root_fail(
        root, "rank %d joined with nranks=%d nid=%d id %d, but earlier ranks said nranks=%d nid=%d id %d",
        m->rank, m->nranks, m->nid, m->index, root->nranks, root->nid, root->index);
  int i = m->rank - root->first;
  if (i < 0 || i >= root->count)
    return root_fail(root, "rank %d of %d joined id %d, whose ranks are %d to %d", m->rank, m->nranks,
                     m->index, root->first, root->first + root->count - 1);
  if (root->fds[i] >= 0) return root_fail(root, "rank %d of %d joined twice", m->rank, m->nranks);
  root->fds[i] = fd;
  root->addrs[i] = m->addr;
  root->arrived++;
  return ncclSuccess;
}

/* Tells the previous id's root where our block starts (nid > 1), once all of the block has arrived. */
static ncclResult_t root_send_link(root_t *root) {
  root_msg_t m = {.magic = BOOT_MAGIC,
                  .nonce = root->prev_nonce,
                  .type = MSG_LINK,
                  .rank = root->first,
                  .nranks = root->nranks,
                  .nid = root->nid,
                  .index = root->index,
                  .addr = root->addrs[0]};
  int fd;
  CHECK(sock_connect(&root->prev_root, NULL, root->deadline, &fd));
  ncclResult_t res =
      sock_send_all(fd, &m, sizeof m, NULL, root->deadline, "bootstrap link to the previous root");
  sock_close(fd);
  root->link_sent = 1;
  return res;
}

/* Sends one rank the root's answer: its successor's address, or root->error. */
static void send_reply(int fd, const root_t *root, ncclResult_t res, const sock_addr_t *succ) {
  reply_t r = {.magic = BOOT_MAGIC, .nonce = root->nonce, .type = MSG_REPLY, .status = res};
  if (res == ncclSuccess)
    r.succ = *succ;
  else
    snprintf(r.error, sizeof r.error, "%s", root->error);
  sock_send_all(fd, &r, sizeof r, NULL, time_now() + HELLO_TIMEOUT_S, "bootstrap root reply");
}

/* Reads the first message of a fresh connection and files it; strangers are dropped with a warning. */
static ncclResult_t root_take_connection(root_t *root, int fd) {
  root_msg_t m;
  char name[SOCK_ADDR_STRLEN];
  if (sock_recv_all(fd, &m, sizeof m, NULL, time_now() + HELLO_TIMEOUT_S, "bootstrap hello at the root") !=
      ncclSuccess)
    goto drop;
  if (m.magic != BOOT_MAGIC || m.nonce != root->nonce || (m.type != MSG_HELLO && m.type != MSG_LINK)) {
    WARN("bootstrap root at %s: dropped a connection with a wrong magic, nonce or type (another job?)",
         sock_addr_str(&root->addr, name));
    goto drop;
  }
  if (m.type == MSG_HELLO) {
    ncclResult_t res = root_add_rank(root, &m, fd);
    if (res != ncclSuccess) {
      send_reply(fd, root, res, NULL);
      sock_close(fd);
    }
    return res;
  }
  root->have_link = 1;
  root->link_index = m.index;
  root->link_addr = m.addr;
drop:
  sock_close(fd);
  return ncclSuccess;
}

/* Names the ranks of the block that never arrived (or the missing link) in root->error. */
static ncclResult_t root_timeout(root_t *root) {
  char name[SOCK_ADDR_STRLEN], list[200] = "";
  int missing = 0;
  size_t n = 0;
  for (int i = 0; i < root->count; i++) {
    if (root->fds[i] >= 0) continue;
    if (n < sizeof list - 16)
      n += snprintf(list + n, sizeof list - n, "%s%d", missing ? ", " : "", root->first + i);
    missing++;
  }
  int64_t timeout = param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S);
  sock_addr_str(&root->addr, name);
  if (missing > 0)
    return root_fail(root, "%s %s of %d never reached the bootstrap root at %s within %lld s",
                     missing > 1 ? "ranks" : "rank", list, root->nranks, name, (long long)timeout);
  return root_fail(root,
                   "the bootstrap root of id %d never sent the address of its first rank to the root at %s "
                   "within %lld s (its ranks may not have arrived)",
                   (root->index + 1) % root->nid, name, (long long)timeout);
}

static int root_done(const root_t *root) {
  return root->nranks > 0 && root->arrived == root->count && (root->nid == 1 || root->have_link);
}

/* Accepts connections until the block is complete (and the link is in), or the deadline passes. */
static ncclResult_t root_collect(root_t *root) {
  while (!root_done(root)) {
    if (root->nranks > 0 && root->arrived == root->count && root->nid > 1 && !root->link_sent)
      CHECK(root_send_link(root));
    if (root->deadline > 0 && time_now() > root->deadline) return root_timeout(root);
    struct pollfd pfd = {.fd = root->listen_fd, .events = POLLIN};
    int n = poll(&pfd, 1, SLICE_MS);
    if (n < 0 && errno != EINTR)
      return root_fail(root, "poll on the root's socket failed: %s", strerror(errno));
    if (n <= 0) continue;
    int fd;
    CHECK(sock_accept(root->listen_fd, NULL, time_now() + HELLO_TIMEOUT_S, &fd));
    CHECK(root_take_connection(root, fd));
  }
  if (root->nid > 1 && !root->link_sent) CHECK(root_send_link(root));
  if (root->nid > 1 && root->link_index != (root->index + 1) % root->nid)
    return root_fail(root, "root of id %d got the link of id %d, expected id %d", root->index,
                     root->link_index, (root->index + 1) % root->nid);
  return ncclSuccess;
}

/* Answers every connected rank: its successor's address, or the error. */
static void root_reply(root_t *root, ncclResult_t res) {
  for (int i = 0; i < root->count; i++) {
    if (root->fds[i] < 0) continue;
    int j = (root->first + i + 1) % root->nranks - root->first;
    send_reply(root->fds[i], root, res, j >= 0 && j < root->count ? &root->addrs[j] : &root->link_addr);
  }
}

static void *root_main(void *arg) {
  root_t *root = arg;
  char name[SOCK_ADDR_STRLEN];
  ncclResult_t res = root_collect(root);
  if (res != ncclSuccess && root->error[0] == '\0')
    snprintf(root->error, sizeof root->error, "the bootstrap root at %s failed: %s",
             sock_addr_str(&root->addr, name), log_last_error());
  root_reply(root, res);
  INFO(LOG_BOOTSTRAP, "bootstrap root at %s: served %d of %d ranks (id %d of %d)%s",
       sock_addr_str(&root->addr, name), root->arrived, root->count, root->index, root->nid,
       res == ncclSuccess ? "" : ", with an error");
  for (int i = 0; i < root->count; i++) sock_close(root->fds[i]);
  sock_close(root->listen_fd);
  free(root->fds);
  free(root->addrs);
  free(root);
  return NULL;
}

/* Starts the detached root thread, which takes over listen_fd (closed here on failure). */
static ncclResult_t root_spawn(int listen_fd, const sock_addr_t *addr, uint64_t nonce) {
  root_t *root = calloc(1, sizeof *root);
  if (root == NULL) {
    sock_close(listen_fd);
    return log_err(ncclSystemError, "out of memory for the bootstrap root");
  }
  root->listen_fd = listen_fd;
  root->addr = *addr;
  root->nonce = nonce;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  /* pthread_create orders the writes to *root above before everything the thread does. */
  int err = pthread_create(&thread, &attr, root_main, root);
  pthread_attr_destroy(&attr);
  if (err != 0) {
    sock_close(listen_fd);
    free(root);
    return log_err(ncclSystemError, "starting the bootstrap root thread failed: %s", strerror(err));
  }
  return ncclSuccess;
}

ncclResult_t boot_start_root(const sock_addr_t *addr, uint64_t nonce) {
  sock_addr_t bound = *addr;
  int fd;
  char name[SOCK_ADDR_STRLEN];
  CHECK(sock_listen(&bound, &fd));
  INFO(LOG_BOOTSTRAP, "bootstrap root listening at %s", sock_addr_str(&bound, name));
  return root_spawn(fd, &bound, nonce);
}

ncclResult_t boot_new_unique_id(ncclUniqueId *id_p) {
  id_body_t body;
  memset(&body, 0, sizeof body);
  body.magic = BOOT_MAGIC;
  body.version = ID_VERSION;
  char ifname[64], name[SOCK_ADDR_STRLEN];
  int fd;
  CHECK(sock_find_interface(&body.root, ifname, sizeof ifname));
  CHECK(random_nonce(&body.nonce));
  CHECK(sock_listen(&body.root, &fd));
  CHECK(root_spawn(fd, &body.root, body.nonce));
  INFO(LOG_BOOTSTRAP, "bootstrap root listening at %s (%s)", sock_addr_str(&body.root, name), ifname);
  encode_id(&body, id_p);
  return ncclSuccess;
}

ncclResult_t boot_get_unique_id(ncclUniqueId *id_p) {
  const char *comm_id = param_str(P_NCCL_COMM_ID);
  if (*comm_id == '\0') return boot_new_unique_id(id_p);
  /* Every rank computes the same id from the same variable, so no id needs to travel: the body is zeroed
   * whole, padding included, so that every rank produces the same bytes. */
  id_body_t body;
  memset(&body, 0, sizeof body);
  body.magic = BOOT_MAGIC;
  body.version = ID_VERSION;
  body.flags = ID_ROOT_BY_RANK0;
  CHECK(sock_parse_addr(comm_id, &body.root));
  body.nonce = hash_bytes(comm_id, strlen(comm_id)) | 1;
  encode_id(&body, id_p);
  return ncclSuccess;
}

/* ---- Connections between ranks ---- */

/* Opens a connection to `peer` and introduces ourselves. */
static ncclResult_t connect_peer(boot_t *b, int peer, uint32_t type, const sock_addr_t *addr, double deadline,
                                 int *fd_p) {
  conn_hello_t h = {.magic = BOOT_MAGIC, .nonce = b->nonce, .type = type, .rank = b->rank};
  char what[96];
  int fd;
  snprintf(what, sizeof what, "bootstrap: hello from rank %d to rank %d", b->rank, peer);
  CHECK(sock_connect(addr, b->abort_flag, deadline, &fd));
  ncclResult_t res = sock_send_all(fd, &h, sizeof h, b->abort_flag, deadline, what);
  if (res != ncclSuccess) {
    sock_close(fd);
    return res;
  }
  *fd_p = fd;
  return ncclSuccess;
}

/* Accepts one connection and files it by its hello (ring predecessor or tagged peer). Connections that do not
 * belong to this communicator are dropped with a warning. */
static ncclResult_t accept_peer(boot_t *b, double deadline) {
  conn_hello_t h;
  int fd;
  CHECK(sock_accept(b->listen_fd, b->abort_flag, deadline, &fd));
  double hello_deadline = time_now() + HELLO_TIMEOUT_S;
  if (deadline > 0 && deadline < hello_deadline) hello_deadline = deadline;
  ncclResult_t res =
      sock_recv_all(fd, &h, sizeof h, b->abort_flag, hello_deadline, "bootstrap: hello of a peer");
  if (res != ncclSuccess) {
    sock_close(fd);
    return aborted(b->abort_flag) ? res : ncclSuccess;
  }
  int pred = (b->rank + b->nranks - 1) % b->nranks;
  if (h.magic != BOOT_MAGIC || h.nonce != b->nonce || h.rank < 0 || h.rank >= b->nranks ||
      (h.type == MSG_RING && (h.rank != pred || b->ring_recv_fd >= 0)) ||
      (h.type != MSG_RING && h.type != MSG_P2P)) {
    WARN("bootstrap: rank %d dropped a connection with a wrong magic, nonce, rank or type (another job?)",
         b->rank);
    sock_close(fd);
    return ncclSuccess;
  }
  if (h.type == MSG_RING) {
    b->ring_recv_fd = fd;
  } else {
    /* A peer opens one tagged connection; a second one replaces the first, and any partial message with it.
     */
    sock_close(b->recv_fds[h.rank]);
    free(b->rx[h.rank].msg);
    b->rx[h.rank] = (rx_t){0};
    b->recv_fds[h.rank] = fd;
  }
  return ncclSuccess;
}

/* ---- Init ---- */

static ncclResult_t boot_alloc(int rank, int nranks, const volatile int *abort_flag, boot_t **boot_p) {
  boot_t *b = calloc(1, sizeof *b);
  if (b == NULL) return log_err(ncclSystemError, "out of memory for the bootstrap state");
  b->rank = rank;
  b->nranks = nranks;
  b->abort_flag = abort_flag;
  b->listen_fd = b->ring_send_fd = b->ring_recv_fd = -1;
  b->queue_tail = &b->queue;
  fair_init(&b->lock);
  b->addrs = calloc(nranks, sizeof *b->addrs);
  b->send_fds = malloc(nranks * sizeof *b->send_fds);
  b->recv_fds = malloc(nranks * sizeof *b->recv_fds);
  b->closed_at = calloc(nranks, sizeof *b->closed_at);
  b->rx = calloc(nranks, sizeof *b->rx);
  b->pfds = calloc(3 + 2 * (size_t)nranks, sizeof *b->pfds);
  *boot_p = b; /* boot_close frees whatever was allocated */
  if (b->addrs == NULL || b->send_fds == NULL || b->recv_fds == NULL || b->closed_at == NULL ||
      b->pfds == NULL)
    return log_err(ncclSystemError, "out of memory for the bootstrap state of %d ranks", nranks);
  for (int i = 0; i < nranks; i++) b->send_fds[i] = b->recv_fds[i] = -1;
  return ncclSuccess;
}

/* Listens on the interface the id's root is reachable from (NCCL_COMM_ID) or on the selected interface. */
static ncclResult_t listen_self(boot_t *b, const id_body_t *root_id) {
  sock_addr_t *addr = &b->addrs[b->rank];
  if (root_id->flags & ID_ROOT_BY_RANK0)
    CHECK(sock_find_interface_for(&root_id->root, addr));
  else
    CHECK(sock_find_interface(addr, NULL, 0));
  return sock_listen(addr, &b->listen_fd);
}

/* Says hello to this rank's root and learns the ring successor's address; an error reply becomes ours. */
static ncclResult_t join_root(boot_t *b, const ncclUniqueId *ids, int nid, sock_addr_t *succ_p) {
  int k = block_of(b->rank, nid, b->nranks), prev = (k + nid - 1) % nid;
  id_body_t mine, before;
  decode_id(&ids[k], &mine);
  decode_id(&ids[prev], &before);
  root_msg_t m = {.magic = BOOT_MAGIC,
                  .nonce = mine.nonce,
                  .type = MSG_HELLO,
                  .rank = b->rank,
                  .nranks = b->nranks,
                  .nid = nid,
                  .index = k,
                  .prev_nonce = before.nonce,
                  .addr = b->addrs[b->rank],
                  .prev_root = before.root};
  double deadline = deadline_after(param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S) + ROOT_REPLY_MARGIN_S);
  char name[SOCK_ADDR_STRLEN], what[128];
  snprintf(what, sizeof what, "bootstrap: rank %d with the root at %s", b->rank,
           sock_addr_str(&mine.root, name));
  int fd;
  reply_t r;
  CHECK(sock_connect(&mine.root, b->abort_flag, deadline, &fd));
  ncclResult_t res = sock_send_all(fd, &m, sizeof m, b->abort_flag, deadline, what);
  if (res == ncclSuccess) res = sock_recv_all(fd, &r, sizeof r, b->abort_flag, deadline, what);
  sock_close(fd);
  if (res != ncclSuccess) return res;
  if (r.magic != BOOT_MAGIC || r.nonce != mine.nonce || r.type != MSG_REPLY)
    return log_err(ncclSystemError, "%s: the reply has a wrong magic, nonce or type", what);
  r.error[sizeof r.error - 1] = '\0';
  if (r.status != 0)
    return log_err(ncclSystemError, "bootstrap: rank %d of %d: %s", b->rank, b->nranks, r.error);
  *succ_p = r.succ;
  return ncclSuccess;
}

/* Connects to the ring successor and accepts the ring predecessor. */
static ncclResult_t connect_ring(boot_t *b, const sock_addr_t *succ, double deadline) {
  if (b->nranks == 1) return ncclSuccess;
  int next = (b->rank + 1) % b->nranks;
  CHECK(connect_peer(b, next, MSG_RING, succ, deadline, &b->ring_send_fd));
  while (b->ring_recv_fd < 0) CHECK(accept_peer(b, deadline));
  return ncclSuccess;
}

static ncclResult_t ring_allgather(boot_t *b, void *data, size_t size, double deadline);
static ncclResult_t progress(boot_t *b, struct pollfd *extra, int nextra, double deadline, const char *doing);

ncclResult_t boot_init(const ncclUniqueId *ids, int nid, int rank, int nranks, const volatile int *abort_flag,
                       boot_t **boot_p) {
  if (nranks < 1 || rank < 0 || rank >= nranks || nid < 1 || nid > nranks)
    return log_err(ncclInvalidArgument,
                   "bootstrap: rank %d, nranks %d, nid %d: need 0 <= rank < nranks and "
                   "1 <= nid <= nranks",
                   rank, nranks, nid);
  for (int i = 0; i < nid; i++) CHECK(boot_check_id(&ids[i]));
  int k = block_of(rank, nid, nranks);
  id_body_t root_id;
  decode_id(&ids[k], &root_id);
  boot_t *b = NULL;
  ncclResult_t res;
  CHECK_GOTO(boot_alloc(rank, nranks, abort_flag, &b), res, err_close_boot);
  b->nonce = boot_id_nonce(&ids[0]);
  CHECK_GOTO(listen_self(b, &root_id), res, err_close_boot);
  if ((root_id.flags & ID_ROOT_BY_RANK0) && rank == block_first(k, nid, nranks))
    CHECK_GOTO(boot_start_root(&root_id.root, root_id.nonce), res, err_close_boot);
  sock_addr_t succ;
  CHECK_GOTO(join_root(b, ids, nid, &succ), res, err_close_boot);
  double deadline = deadline_after(param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S));
  CHECK_GOTO(connect_ring(b, &succ, deadline), res, err_close_boot);
  CHECK_GOTO(ring_allgather(b, b->addrs, sizeof *b->addrs, deadline), res, err_close_boot);
  char root_name[SOCK_ADDR_STRLEN], self_name[SOCK_ADDR_STRLEN];
  INFO(LOG_BOOTSTRAP, "bootstrap: rank %d of %d joined through the root at %s (id %d of %d), listening at %s",
       rank, nranks, sock_addr_str(&root_id.root, root_name), k, nid,
       sock_addr_str(&b->addrs[rank], self_name));
  *boot_p = b;
  return ncclSuccess;
err_close_boot:
  boot_close(b);
  return res;
}

/* ---- Ring allgather ---- */

/* Sends n bytes to the successor while receiving n bytes from the predecessor, so neither side can fill its
 * socket buffers and wait for the other. */
static ncclResult_t ring_exchange(boot_t *b, const char *out, char *in, size_t n, double deadline) {
  char what_out[64], what_in[64];
  snprintf(what_out, sizeof what_out, "bootstrap: ring connection to rank %d", (b->rank + 1) % b->nranks);
  snprintf(what_in, sizeof what_in, "bootstrap: ring connection from rank %d",
           (b->rank + b->nranks - 1) % b->nranks);
  size_t sent = 0, got = 0;
  while (sent < n || got < n) {
    size_t moved_out = 0, moved_in = 0;
    if (sent < n) CHECK(sock_send_some(b->ring_send_fd, out + sent, n - sent, &moved_out, what_out));
    if (got < n) CHECK(sock_recv_some(b->ring_recv_fd, in + got, n - got, &moved_in, what_in));
    sent += moved_out;
    got += moved_in;
    if (moved_out > 0 || moved_in > 0) continue;
    /* Serve tagged traffic meanwhile, so a large send to us from a rank not yet here cannot stall it. */
    struct pollfd pfds[2] = {{.fd = sent < n ? b->ring_send_fd : -1, .events = POLLOUT},
                             {.fd = got < n ? b->ring_recv_fd : -1, .events = POLLIN}};
    CHECK(progress(b, pfds, 2, deadline, "in a ring allgather"));
  }
  return ncclSuccess;
}

/* Step s passes block (rank - s) on and takes block (rank - s - 1) in. */
static ncclResult_t ring_allgather(boot_t *b, void *data, size_t size, double deadline) {
  char *blocks = data;
  for (int step = 0; step < b->nranks - 1; step++) {
    size_t out = (size_t)((b->rank - step + b->nranks) % b->nranks);
    size_t in = (size_t)((b->rank - step - 1 + 2 * b->nranks) % b->nranks);
    CHECK(ring_exchange(b, blocks + out * size, blocks + in * size, size, deadline));
  }
  return ncclSuccess;
}

ncclResult_t boot_allgather(boot_t *boot, void *data, size_t size) {
  fair_lock(&boot->lock);
  ncclResult_t res = ring_allgather(boot, data, size, deadline_after(param_int(P_BRAID_TIMEOUT_S)));
  fair_unlock(&boot->lock);
  return res;
}

ncclResult_t boot_barrier(boot_t *boot) {
  char stack_bytes[256];
  char *bytes = boot->nranks <= (int)sizeof stack_bytes ? stack_bytes : malloc(boot->nranks);
  if (bytes == NULL) return log_err(ncclSystemError, "out of memory for a barrier of %d ranks", boot->nranks);
  memset(bytes, 0, boot->nranks);
  ncclResult_t res = boot_allgather(boot, bytes, 1);
  if (bytes != stack_bytes) free(bytes);
  return res;
}

/* ---- Tagged messages ---- */

static void enqueue(boot_t *b, msg_t *m) {
  m->next = NULL;
  *b->queue_tail = m;
  b->queue_tail = &m->next;
}

/* Unlinks and returns the oldest queued message from `peer` with `tag`, or NULL. */
static msg_t *dequeue(boot_t *b, int peer, uint32_t tag) {
  for (msg_t **link = &b->queue; *link != NULL; link = &(*link)->next) {
    msg_t *m = *link;
    if (m->peer != peer || m->tag != tag) continue;
    *link = m->next;
    if (b->queue_tail == &m->next) b->queue_tail = link;
    return m;
  }
  return NULL;
}

static void mark_closed(boot_t *b, int peer) {
  if (b->closed_at[peer] == 0) b->closed_at[peer] = time_now();
}

/* Drops `peer`'s incoming connection after it closed. Between messages that is orderly (the peer finished or
 * died; the caller decides whether that is an error); inside a message the message is lost. */
static ncclResult_t rx_closed(boot_t *b, int peer, int err) {
  rx_t *rx = &b->rx[peer];
  int partial = rx->hdr_got > 0;
  sock_close(b->recv_fds[peer]);
  b->recv_fds[peer] = -1;
  mark_closed(b, peer);
  free(rx->msg);
  *rx = (rx_t){0};
  if (!partial) return ncclSuccess;
  return log_err(ncclRemoteError,
                 "bootstrap: connection from rank %d to rank %d closed in the middle of a message%s%s", peer,
                 b->rank, err ? ": " : "", err ? strerror(err) : "");
}

/* Starts the message whose header just arrived. */
static ncclResult_t rx_start(boot_t *b, int peer) {
  rx_t *rx = &b->rx[peer];
  if (rx->hdr.size > MAX_MSG_BYTES)
    return log_err(ncclInternalError,
                   "bootstrap: rank %d sent a message of %llu bytes (tag %u) to rank %d; the "
                   "limit is %llu",
                   peer, (unsigned long long)rx->hdr.size, rx->hdr.tag, b->rank,
                   (unsigned long long)MAX_MSG_BYTES);
  rx->msg = malloc(sizeof *rx->msg + rx->hdr.size);
  if (rx->msg == NULL)
    return log_err(ncclSystemError, "bootstrap: out of memory for a %llu-byte message from rank %d",
                   (unsigned long long)rx->hdr.size, peer);
  rx->msg->peer = peer;
  rx->msg->tag = rx->hdr.tag;
  rx->msg->size = rx->hdr.size;
  rx->got = 0;
  return ncclSuccess;
}

/* Reads what `peer`'s connection holds now, without waiting, and queues each message once complete. Never
 * blocking here matters: two ranks that send large messages to each other both read while they send. */
static ncclResult_t read_messages(boot_t *b, int peer) {
  rx_t *rx = &b->rx[peer];
  for (;;) {
    int in_header = rx->hdr_got < sizeof rx->hdr;
    char *dst = in_header ? (char *)&rx->hdr + rx->hdr_got : rx->msg->data + rx->got;
    size_t want = in_header ? sizeof rx->hdr - rx->hdr_got : rx->msg->size - rx->got;
    ssize_t n = want == 0 ? 0 : recv(b->recv_fds[peer], dst, want, MSG_DONTWAIT);
    if (want > 0 && n == 0) return rx_closed(b, peer, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
    if (n < 0) return rx_closed(b, peer, errno);
    if (in_header) {
      rx->hdr_got += (size_t)n;
      if (rx->hdr_got == sizeof rx->hdr) CHECK(rx_start(b, peer));
      continue;
    }
    rx->got += (size_t)n;
    if (rx->got < rx->msg->size) continue;
    TRACE(LOG_BOOTSTRAP, "bootstrap: rank %d queued %zu bytes from rank %d, tag %u", b->rank, rx->msg->size,
          peer, rx->msg->tag);
    enqueue(b, rx->msg);
    *rx = (rx_t){0};
  }
}

/* One round of the progress engine: waits up to one slice for `extra` (the caller's own fds, whose revents
 * it reads afterwards), new connections, incoming messages, and peers closing our outgoing connections (a
 * peer never writes on those, so readable means closed). */
static ncclResult_t progress(boot_t *b, struct pollfd *extra, int nextra, double deadline,
                             const char *doing) {
  int slice = SLICE_MS, n = b->nranks;
  CHECK(slice_or_fail(b, deadline, doing, &slice));
  struct pollfd *pfds = b->pfds;
  for (int i = 0; i < nextra; i++) pfds[i] = extra[i];
  pfds[nextra] = (struct pollfd){.fd = b->listen_fd, .events = POLLIN};
  for (int p = 0; p < n; p++) {
    pfds[nextra + 1 + p] = (struct pollfd){.fd = b->recv_fds[p], .events = POLLIN};
    int watch = b->send_fds[p] >= 0 && b->closed_at[p] == 0;
    pfds[nextra + 1 + n + p] = (struct pollfd){.fd = watch ? b->send_fds[p] : -1, .events = POLLIN};
  }
  int ready = poll(pfds, nextra + 1 + 2 * n, slice);
  if (ready < 0 && errno != EINTR)
    return log_err(ncclSystemError, "bootstrap: rank %d: poll %s failed: %s", b->rank, doing,
                   strerror(errno));
  for (int i = 0; i < nextra; i++) extra[i].revents = pfds[i].revents;
  if (ready <= 0) return ncclSuccess;
  for (int p = 0; p < n; p++) {
    if (pfds[nextra + 1 + n + p].revents != 0) mark_closed(b, p);
    if (pfds[nextra + 1 + p].revents != 0) CHECK(read_messages(b, p));
  }
  if (pfds[nextra].revents != 0) CHECK(accept_peer(b, deadline));
  return ncclSuccess;
}

/* Opens the tagged connection to `peer` if there is none yet. */
static ncclResult_t ensure_send_conn(boot_t *b, int peer, double deadline) {
  if (b->send_fds[peer] >= 0) return ncclSuccess;
  if (b->closed_at[peer] != 0)
    return log_err(ncclRemoteError,
                   "bootstrap: rank %d cannot reach rank %d: its connection closed (it exited or "
                   "failed)",
                   b->rank, peer);
  return connect_peer(b, peer, MSG_P2P, &b->addrs[peer], deadline, &b->send_fds[peer]);
}

/* Sends n bytes to `peer`, serving incoming traffic whenever the socket is full. */
static ncclResult_t send_bytes(boot_t *b, int peer, const char *buf, size_t n, double deadline,
                               const char *what) {
  size_t done = 0;
  while (done < n) {
    if (b->closed_at[peer] != 0)
      return log_err(ncclRemoteError, "%s: rank %d closed its connection after %zu of %zu bytes", what, peer,
                     done, n);
    size_t moved;
    CHECK(sock_send_some(b->send_fds[peer], buf + done, n - done, &moved, what));
    done += moved;
    if (moved > 0) continue;
    struct pollfd out = {.fd = b->send_fds[peer], .events = POLLOUT};
    CHECK(progress(b, &out, 1, deadline, what));
  }
  return ncclSuccess;
}

static ncclResult_t send_locked(boot_t *b, int peer, uint32_t tag, const void *data, size_t size) {
  if (peer == b->rank) {
    msg_t *m = malloc(sizeof *m + size);
    if (m == NULL) return log_err(ncclSystemError, "bootstrap: out of memory for a %zu-byte self-send", size);
    m->peer = peer;
    m->tag = tag;
    m->size = size;
    if (size > 0) memcpy(m->data, data, size);
    enqueue(b, m);
    return ncclSuccess;
  }
  double deadline = deadline_after(param_int(P_BRAID_TIMEOUT_S));
  char what[96];
  snprintf(what, sizeof what, "bootstrap: rank %d sending %zu bytes to rank %d (tag %u)", b->rank, size, peer,
           tag);
  CHECK(ensure_send_conn(b, peer, deadline));
  msg_header_t h = {.tag = tag, .size = size};
  CHECK(send_bytes(b, peer, (const char *)&h, sizeof h, deadline, what));
  return send_bytes(b, peer, data, size, deadline, what);
}

ncclResult_t boot_send(boot_t *boot, int peer, uint32_t tag, const void *data, size_t size) {
  if (peer < 0 || peer >= boot->nranks)
    return log_err(ncclInvalidArgument, "bootstrap: send to rank %d of %d", peer, boot->nranks);
  TRACE(LOG_BOOTSTRAP, "bootstrap: rank %d sends %zu bytes to rank %d, tag %u", boot->rank, size, peer, tag);
  fair_lock(&boot->lock);
  ncclResult_t res = send_locked(boot, peer, tag, data, size);
  fair_unlock(&boot->lock);
  return res;
}

/* Hands a queued message to the caller if it is there: *done_p says whether it was. */
static ncclResult_t take_message(boot_t *b, int peer, uint32_t tag, void *data, size_t size, int *done_p) {
  msg_t *m = dequeue(b, peer, tag);
  *done_p = m != NULL;
  if (m == NULL) return ncclSuccess;
  ncclResult_t res = ncclSuccess;
  if (m->size != size)
    res = log_err(ncclInternalError,
                  "bootstrap: rank %d expected %zu bytes from rank %d with tag %u but %zu came", b->rank,
                  size, peer, tag, m->size);
  else if (size > 0)
    memcpy(data, m->data, size);
  free(m);
  return res;
}

ncclResult_t boot_recv(boot_t *boot, int peer, uint32_t tag, void *data, size_t size) {
  if (peer < 0 || peer >= boot->nranks)
    return log_err(ncclInvalidArgument, "bootstrap: receive from rank %d of %d", peer, boot->nranks);
  double deadline = deadline_after(param_int(P_BRAID_TIMEOUT_S));
  char what[96];
  snprintf(what, sizeof what, "waiting for %zu bytes from rank %d (tag %u)", size, peer, tag);
  ncclResult_t res = ncclSuccess;
  fair_lock(&boot->lock);
  /* An outgoing connection to the peer lets us see it close (exit or crash) while we wait. */
  if (peer != boot->rank) CHECK_GOTO(ensure_send_conn(boot, peer, deadline), res, out_unlock);
  for (;;) {
    int done;
    CHECK_GOTO(take_message(boot, peer, tag, data, size, &done), res, out_unlock);
    if (done) break;
    double closed = boot->closed_at[peer];
    if (closed != 0 && boot->recv_fds[peer] < 0 && time_now() - closed > CLOSE_GRACE_S) {
      res = log_err(ncclRemoteError,
                    "bootstrap: rank %d %s: connection from rank %d closed (it exited or failed)", boot->rank,
                    what, peer);
      goto out_unlock;
    }
    CHECK_GOTO(progress(boot, NULL, 0, deadline, what), res, out_unlock);
    /* Let other threads of this communicator send between slices of a long wait: any thread already
     * waiting for the lock gets it before this one does again. */
    fair_unlock(&boot->lock);
    fair_lock(&boot->lock);
  }
  TRACE(LOG_BOOTSTRAP, "bootstrap: rank %d received %zu bytes from rank %d, tag %u", boot->rank, size, peer,
        tag);
out_unlock:
  fair_unlock(&boot->lock);
  return res;
}

const sock_addr_t *boot_addr(const boot_t *boot, int rank) {
  return &boot->addrs[rank];
}

void boot_close(boot_t *boot) {
  if (boot == NULL) return;
  for (int p = 0; p < boot->nranks; p++) {
    if (boot->send_fds != NULL) sock_close(boot->send_fds[p]);
    if (boot->recv_fds != NULL) sock_close(boot->recv_fds[p]);
  }
  sock_close(boot->ring_send_fd);
  sock_close(boot->ring_recv_fd);
  sock_close(boot->listen_fd);
  while (boot->queue != NULL) {
    msg_t *m = boot->queue;
    boot->queue = m->next;
    free(m);
  }
  fair_destroy(&boot->lock);
  free(boot->addrs);
  free(boot->send_fds);
  free(boot->recv_fds);
  free(boot->closed_at);
  for (int p = 0; boot->rx != NULL && p < boot->nranks; p++) free(boot->rx[p].msg);
  free(boot->rx);
  free(boot->pfds);
  free(boot);
}
