/*
 * The root service (see root.h). Everything below the lock is owned by the service thread and by
 * root_serve; the thread lets go of the lock only while it polls, and root_serve wakes it through a pipe
 * when it adds an id or a listener.
 */
#include "root.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "gate.h"
#include "wire.h"

/* Listening sockets: one for the ids of ncclGetUniqueId, one per NCCL_COMM_ID address. */
#define MAX_LISTENERS 16
/* Seconds a failed id keeps answering ranks that come late with its error. */
#define FAILED_KEEP_S 30
/* Missing ranks a timeout names (the others are counted). */
#define MISSING_NAMED 16

/* A rank of the block that said hello; its connection is kept for the reply. */
typedef struct {
  int rank;
  int fd;
  sock_addr_t addr; /* its listening address */
} arrival_t;

/* One id being served. */
typedef struct served {
  struct served *next;
  uint64_t nonce;
  sock_addr_t at;            /* where it is served (for messages) */
  int nranks, nid, index;    /* from the first hello; nranks is 0 before it */
  int first, count;          /* the block: ranks first .. first + count - 1 */
  arrival_t *arr;            /* the ranks that arrived, in arrival order */
  int narr, cap;             /* how many, and room */
  int *slot;                 /* hash of arrived ranks: index into arr, -1 empty; 2 * cap entries */
  sock_addr_t prev_root;     /* root of the id before, from the hellos */
  uint64_t prev_nonce;       /* its nonce */
  int link_sent;             /* our first rank's address went to the previous root */
  int have_link, link_index; /* the next root's first address arrived, and from which id */
  sock_addr_t link_addr;     /* first rank address of the next block */
  double deadline;           /* BRAID_BOOTSTRAP_TIMEOUT_S after the first hello; 0 before */
  double forget_at;          /* once failed: when late ranks stop getting the error */
  char error[sizeof(((reply_t *)0)->error)]; /* why serving failed ("" while it has not) */
} served_t;

typedef struct {
  int fd;
  sock_addr_t addr;
  int shared; /* the listener of ncclGetUniqueId's ids */
} listener_t;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t started_cv; /* signalled when the thread has started */
  int started;               /* the thread runs its loop */
  pid_t pid;                 /* the process the state belongs to */
  int thread_live;           /* the thread runs (or ended but is not joined yet: thread_done) */
  int thread_done;           /* it ended */
  int stop;                  /* the process exits */
  pthread_t thread;
  int wake[2]; /* root_serve writes a byte to interrupt the thread's poll */
  listener_t lst[MAX_LISTENERS];
  int nlst;
  served_t *ids;
  int nids;
  gate_t gate;        /* connections owing their first message */
  uint64_t strangers; /* connections dropped for a wrong magic, nonce or type */
} svc = {.lock = PTHREAD_MUTEX_INITIALIZER, .started_cv = PTHREAD_COND_INITIALIZER, .wake = {-1, -1}};

/* ---- One id ---- */

static served_t *find(uint64_t nonce) {
  for (served_t *s = svc.ids; s != NULL; s = s->next)
    if (s->nonce == nonce) return s;
  return NULL;
}

static void send_reply(int fd, const served_t *s, const sock_addr_t *succ) {
  reply_t r = {.magic = BOOT_MAGIC, .nonce = s->nonce, .type = MSG_REPLY, .status = s->error[0] != '\0'};
  if (r.status == 0)
    r.succ = *succ;
  else
    snprintf(r.error, sizeof r.error, "%s", s->error);
  /* a fresh connection has room for the reply: this never waits for long */
  if (sock_send_all(fd, &r, sizeof r, NULL, time_now() + 2, "bootstrap root reply") != ncclSuccess)
    INFO(LOG_BOOTSTRAP, "bootstrap root: a reply was lost: %s", log_last_error());
}

/* Gives up on the id: every rank that arrived gets the error; later ones get it until forget_at. */
static void fail(served_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(served_t *s, const char *fmt, ...) {
  if (s->error[0] != '\0') return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->error, sizeof s->error, fmt, ap);
  va_end(ap);
  if (s->error[0] == '\0') snprintf(s->error, sizeof s->error, "the bootstrap root failed");
  WARN("bootstrap root: %s", s->error);
  for (int i = 0; i < s->narr; i++) {
    send_reply(s->arr[i].fd, s, NULL);
    sock_close(s->arr[i].fd);
    s->arr[i].fd = -1;
  }
  s->forget_at = time_now() + FAILED_KEEP_S;
}

static void served_free(served_t *s) {
  for (int i = 0; i < s->narr; i++) sock_close(s->arr[i].fd);
  free(s->arr);
  free(s->slot);
  free(s);
}

/* Index in arr of `rank`, or -1. */
static int arrived(const served_t *s, int rank) {
  if (s->slot == NULL) return -1;
  unsigned mask = 2u * (unsigned)s->cap - 1;
  for (unsigned h = (unsigned)rank * 2654435761u & mask;; h = (h + 1) & mask) {
    if (s->slot[h] < 0) return -1;
    if (s->arr[s->slot[h]].rank == rank) return s->slot[h];
  }
}

/* Makes room for one more arrival: the table and its hash grow by doubling. */
static int grow(served_t *s) {
  if (s->narr < s->cap) return 1;
  int cap = s->cap > 0 ? 2 * s->cap : 8;
  arrival_t *arr = realloc(s->arr, (size_t)cap * sizeof *arr);
  int *slot = malloc(2 * (size_t)cap * sizeof *slot);
  if (arr != NULL) s->arr = arr;
  if (arr == NULL || slot == NULL) {
    free(slot);
    return 0;
  }
  free(s->slot);
  s->slot = slot;
  s->cap = cap;
  for (int i = 0; i < 2 * cap; i++) slot[i] = -1;
  unsigned mask = 2u * (unsigned)cap - 1;
  for (int i = 0; i < s->narr; i++) {
    unsigned h = (unsigned)s->arr[i].rank * 2654435761u & mask;
    while (slot[h] >= 0) h = (h + 1) & mask;
    slot[h] = i;
  }
  return 1;
}

/* Sizes the block from the first hello: nothing is allocated in proportion to what it claims. */
static int setup(served_t *s, const root_msg_t *m) {
  char name[SOCK_ADDR_STRLEN];
  if (m->nranks < 1 || m->nid < 1 || m->nid > m->nranks || m->index < 0 || m->index >= m->nid) {
    fail(s, "rank %d sent nranks=%d nid=%d index=%d to the bootstrap root at %s", m->rank, m->nranks, m->nid,
         m->index, sock_addr_str(&s->at, name));
    return 0;
  }
  s->nranks = m->nranks;
  s->nid = m->nid;
  s->index = m->index;
  s->first = (int)(((int64_t)m->index * m->nranks + m->nid - 1) / m->nid);
  s->count = (int)(((int64_t)(m->index + 1) * m->nranks + m->nid - 1) / m->nid) - s->first;
  s->prev_root = m->prev_root;
  s->prev_nonce = m->prev_nonce;
  int64_t t = param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S);
  s->deadline = t > 0 ? time_now() + (double)t : 0;
  return 1;
}

/* Files one rank's hello; its connection is kept for the reply. Returns 0 when the id failed. */
static int add_rank(served_t *s, const root_msg_t *m, int fd) {
  if (s->nranks == 0 && !setup(s, m)) return 0;
  if (m->nranks != s->nranks || m->nid != s->nid || m->index != s->index) {
    fail(s, "rank %d joined with nranks=%d nid=%d id %d, but earlier ranks said nranks=%d nid=%d id %d",
         m->rank, m->nranks, m->nid, m->index, s->nranks, s->nid, s->index);
    return 0;
  }
  if (m->rank < s->first || m->rank - s->first >= s->count) {
    fail(s, "rank %d of %d joined id %d, whose ranks are %d to %d", m->rank, m->nranks, m->index, s->first,
         s->first + s->count - 1);
    return 0;
  }
  if (arrived(s, m->rank) >= 0) {
    fail(s, "rank %d of %d joined twice", m->rank, m->nranks);
    return 0;
  }
  if (!grow(s)) {
    fail(s, "out of memory at the bootstrap root after %d hellos", s->narr);
    return 0;
  }
  s->arr[s->narr] = (arrival_t){.rank = m->rank, .fd = fd, .addr = m->addr};
  unsigned mask = 2u * (unsigned)s->cap - 1, h = (unsigned)m->rank * 2654435761u & mask;
  while (s->slot[h] >= 0) h = (h + 1) & mask;
  s->slot[h] = s->narr++;
  return 1;
}

/* What a link helper thread sends. */
typedef struct {
  sock_addr_t to;
  root_msg_t msg;
  double deadline;
} link_job_t;

static void *link_main(void *arg) {
  link_job_t *job = arg;
  int fd;
  ncclResult_t res = sock_connect(&job->to, NULL, job->deadline, &fd);
  if (res == ncclSuccess) {
    res = sock_send_all(fd, &job->msg, sizeof job->msg, NULL, job->deadline,
                        "bootstrap link to the previous root");
    sock_close(fd);
  }
  if (res != ncclSuccess)
    WARN("bootstrap root: the link to the previous id's root failed: %s", log_last_error());
  free(job);
  return NULL;
}

/* Tells the previous id's root where our block starts (nid > 1), from a short-lived thread of its own so
 * that a slow remote root never holds up this service. */
static void send_link(served_t *s) {
  s->link_sent = 1;
  int first = arrived(s, s->first);
  link_job_t *job = malloc(sizeof *job);
  if (job == NULL || first < 0) {
    free(job);
    fail(s, "out of memory for the bootstrap link of id %d", s->index);
    return;
  }
  *job = (link_job_t){.to = s->prev_root, .deadline = s->deadline > 0 ? s->deadline : time_now() + 60};
  job->msg = (root_msg_t){.magic = BOOT_MAGIC,
                          .nonce = s->prev_nonce,
                          .type = MSG_LINK,
                          .rank = s->first,
                          .nranks = s->nranks,
                          .nid = s->nid,
                          .index = s->index,
                          .addr = s->arr[first].addr};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int err = pthread_create(&t, &attr, link_main, job);
  pthread_attr_destroy(&attr);
  if (err != 0) {
    free(job);
    fail(s, "starting the bootstrap link thread failed: %s", strerror(err));
  }
}

/* Names (some of) the ranks of the block that never arrived, or the missing link, in the error. */
static void timeout(served_t *s) {
  char name[SOCK_ADDR_STRLEN], list[200] = "";
  int named = 0;
  size_t n = 0;
  for (int i = 0; i < s->count && named < MISSING_NAMED; i++) {
    if (arrived(s, s->first + i) >= 0) continue;
    n += snprintf(list + n, sizeof list - n, "%s%d", named ? ", " : "", s->first + i);
    if (n >= sizeof list) n = sizeof list - 1;
    named++;
  }
  int missing = s->count - s->narr;
  long long t = (long long)param_int(P_BRAID_BOOTSTRAP_TIMEOUT_S);
  sock_addr_str(&s->at, name);
  if (missing > named)
    fail(s, "ranks %s and %d more of %d never reached the bootstrap root at %s within %lld s", list,
         missing - named, s->nranks, name, t);
  else if (missing > 0)
    fail(s, "%s %s of %d never reached the bootstrap root at %s within %lld s",
         missing > 1 ? "ranks" : "rank", list, s->nranks, name, t);
  else
    fail(s,
         "the bootstrap root of id %d never sent the address of its first rank to the root at %s within %lld "
         "s (its ranks may not have arrived)",
         (s->index + 1) % s->nid, name, t);
}

/* Answers every rank of a complete block with its successor's address. */
static void reply_all(served_t *s) {
  char name[SOCK_ADDR_STRLEN];
  for (int i = 0; i < s->narr; i++) {
    int j = arrived(s, (s->arr[i].rank + 1) % s->nranks);
    send_reply(s->arr[i].fd, s, j >= 0 ? &s->arr[j].addr : &s->link_addr);
  }
  INFO(LOG_BOOTSTRAP, "bootstrap root at %s: served %d ranks (id %d of %d)", sock_addr_str(&s->at, name),
       s->narr, s->index, s->nid);
}

/* Moves one id on; returns 1 when it is finished (the caller frees it). */
static int step(served_t *s, double now) {
  if (s->error[0] != '\0') return now > s->forget_at;
  if (s->nranks == 0) return 0;
  int complete = s->narr == s->count;
  if (complete && s->nid > 1 && !s->link_sent) send_link(s);
  if (s->error[0] == '\0' && complete && (s->nid == 1 || s->have_link)) {
    if (s->nid > 1 && s->link_index != (s->index + 1) % s->nid) {
      fail(s, "root of id %d got the link of id %d, expected id %d", s->index, s->link_index,
           (s->index + 1) % s->nid);
      return 0;
    }
    reply_all(s);
    return 1;
  }
  if (s->error[0] == '\0' && s->deadline > 0 && now > s->deadline) timeout(s);
  return 0;
}

/* ---- The thread ---- */

/* A complete first message on a gate connection. */
static void on_hello(void *arg, int fd, const void *hello) {
  (void)arg;
  root_msg_t m;
  memcpy(&m, hello, sizeof m);
  served_t *s = m.magic == BOOT_MAGIC ? find(m.nonce) : NULL;
  if (s == NULL || (m.type != MSG_HELLO && m.type != MSG_LINK)) {
    if (svc.strangers++ == 0)
      WARN("bootstrap root: dropped a connection with a wrong magic, nonce or type (another job?)");
    sock_close(fd);
    return;
  }
  if (s->error[0] != '\0') { /* a late rank of a failed id learns why */
    if (m.type == MSG_HELLO) send_reply(fd, s, NULL);
    sock_close(fd);
    return;
  }
  if (m.type == MSG_LINK) {
    s->have_link = 1;
    s->link_index = m.index;
    s->link_addr = m.addr;
    sock_close(fd);
    return;
  }
  if (!add_rank(s, &m, fd)) {
    send_reply(fd, s, NULL);
    sock_close(fd);
  }
}

/* One round: waits up to a slice for connections and hellos, then moves every id on. */
static void serve_round(struct pollfd **pfds_p, int *cap_p) {
  int need = 1 + svc.nlst + svc.gate.n;
  if (need > *cap_p) {
    struct pollfd *p = realloc(*pfds_p, (size_t)need * sizeof *p);
    if (p == NULL) return;
    *pfds_p = p;
    *cap_p = need;
  }
  struct pollfd *pfds = *pfds_p;
  pfds[0] = (struct pollfd){.fd = svc.wake[0], .events = POLLIN};
  for (int i = 0; i < svc.nlst; i++) pfds[1 + i] = (struct pollfd){.fd = svc.lst[i].fd, .events = POLLIN};
  int ng = gate_poll_fds(&svc.gate, pfds + 1 + svc.nlst), nlst = svc.nlst;
  pthread_mutex_unlock(&svc.lock);
  int ready = poll(pfds, (nfds_t)(1 + nlst + ng), SLICE_MS);
  pthread_mutex_lock(&svc.lock);
  char drain[64];
  if (ready > 0 && pfds[0].revents != 0)
    while (read(svc.wake[0], drain, sizeof drain) > 0) continue;
  for (int i = 0; ready > 0 && i < nlst; i++)
    if (pfds[1 + i].revents != 0 && gate_accept(&svc.gate, svc.lst[i].fd) != ncclSuccess)
      WARN("bootstrap root: %s", log_last_error());
  if (ready > 0) gate_serve(&svc.gate, pfds + 1 + nlst, ng, time_now(), on_hello, NULL);
  double now = time_now();
  for (served_t **link = &svc.ids; *link != NULL;) {
    served_t *s = *link;
    if (!step(s, now)) {
      link = &s->next;
      continue;
    }
    *link = s->next;
    svc.nids--;
    served_free(s);
  }
}

static void *service_main(void *arg) {
  (void)arg;
  struct pollfd *pfds = NULL;
  int cap = 0;
  pthread_mutex_lock(&svc.lock);
  svc.started = 1;
  pthread_cond_broadcast(&svc.started_cv);
  while (!svc.stop && svc.ids != NULL) serve_round(&pfds, &cap);
  /* nothing left to serve: the listeners close, and the next id starts afresh */
  for (int i = 0; i < svc.nlst; i++) sock_close(svc.lst[i].fd);
  svc.nlst = 0;
  gate_close(&svc.gate);
  svc.thread_done = 1;
  pthread_mutex_unlock(&svc.lock);
  free(pfds);
  return NULL;
}

/* ---- Process life ---- */

/* Stops the thread at exit, so that no root outlives the library. */
__attribute__((destructor)) static void service_stop(void) {
  pthread_mutex_lock(&svc.lock);
  int join = svc.thread_live && svc.pid == getpid();
  svc.stop = 1;
  if (join && svc.wake[1] >= 0) (void)!write(svc.wake[1], "x", 1);
  pthread_mutex_unlock(&svc.lock);
  if (join) pthread_join(svc.thread, NULL);
}

static void fork_prepare(void) {
  pthread_mutex_lock(&svc.lock);
}

static void fork_parent(void) {
  pthread_mutex_unlock(&svc.lock);
}

/* The child has no service thread: it drops its copies of the parent's sockets and ids. */
static void fork_child(void) {
  for (int i = 0; i < svc.nlst; i++) sock_close(svc.lst[i].fd);
  svc.nlst = 0;
  gate_close(&svc.gate);
  while (svc.ids != NULL) {
    served_t *s = svc.ids;
    svc.ids = s->next;
    served_free(s);
  }
  svc.nids = 0;
  svc.thread_live = svc.thread_done = svc.started = 0;
  pthread_cond_init(&svc.started_cv, NULL);
  sock_close(svc.wake[0]);
  sock_close(svc.wake[1]);
  svc.wake[0] = svc.wake[1] = -1;
  svc.pid = getpid();
  pthread_mutex_unlock(&svc.lock);
}

static void register_fork(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* ---- Serving an id ---- */

/* The listener for `bind` (NULL: the shared one), made if there is none yet. */
static ncclResult_t listener_for(const sock_addr_t *bind, listener_t **lst_p) {
  char name[SOCK_ADDR_STRLEN], ifname[64] = "";
  for (int i = 0; i < svc.nlst; i++) {
    listener_t *l = &svc.lst[i];
    if (bind == NULL ? l->shared : !l->shared && memcmp(&l->addr, bind, sizeof *bind) == 0) {
      *lst_p = l;
      return ncclSuccess;
    }
  }
  if (svc.nlst == MAX_LISTENERS)
    return log_err(ncclInvalidUsage, "bootstrap: %d root addresses in use in this process already", svc.nlst);
  listener_t l = {.shared = bind == NULL};
  if (bind != NULL)
    l.addr = *bind;
  else
    CHECK(sock_find_interface(&l.addr, ifname, sizeof ifname));
  CHECK(sock_listen(&l.addr, &l.fd));
  INFO(LOG_BOOTSTRAP, "bootstrap root listening at %s%s%s%s", sock_addr_str(&l.addr, name),
       ifname[0] ? " (" : "", ifname, ifname[0] ? ")" : "");
  svc.lst[svc.nlst] = l;
  *lst_p = &svc.lst[svc.nlst++];
  return ncclSuccess;
}

/* Starts the thread (after joining one that ended) and the pipe that wakes it. */
static ncclResult_t ensure_thread(void) {
  if (svc.thread_live && !svc.thread_done) return ncclSuccess;
  if (svc.thread_live) pthread_join(svc.thread, NULL); /* it ended and holds nothing */
  svc.thread_live = svc.thread_done = 0;
  if (svc.wake[0] < 0 && pipe2(svc.wake, O_CLOEXEC | O_NONBLOCK) != 0)
    return log_err(ncclSystemError, "bootstrap root: pipe failed: %s", strerror(errno));
  /* pthread_create orders everything written under the lock before what the thread does */
  svc.started = 0;
  int err = pthread_create(&svc.thread, NULL, service_main, NULL);
  if (err != 0)
    return log_err(ncclSystemError, "starting the bootstrap root thread failed: %s", strerror(err));
  svc.thread_live = 1;
  /* the id is handed out once its thread has started: a process that forks right after (a launcher, the
   * tests) must not fork in the middle of the thread's start, whose allocations a child cannot finish */
  while (!svc.started) pthread_cond_wait(&svc.started_cv, &svc.lock);
  return ncclSuccess;
}

static ncclResult_t serve_locked(const sock_addr_t *bind, uint64_t nonce, sock_addr_t *addr_p) {
  ncclResult_t res;
  if (find(nonce) != NULL)
    return log_err(
        ncclInvalidUsage,
        "bootstrap: the id of nonce %016llx is served already (two inits of one NCCL_COMM_ID at once?)",
        (unsigned long long)nonce);
  if (svc.nids >= ROOT_MAX_IDS)
    return log_err(
        ncclInvalidUsage,
        "bootstrap: %d unique ids of this process wait for their ranks already; ids that are never "
        "used cost a record each until the process ends",
        svc.nids);
  listener_t *l = NULL;
  CHECK(listener_for(bind, &l));
  served_t *s = calloc(1, sizeof *s);
  if (s == NULL) return log_err(ncclSystemError, "bootstrap: out of memory for a unique id's root");
  s->nonce = nonce;
  s->at = l->addr;
  s->next = svc.ids; /* before the thread starts: a thread that finds no id ends at once */
  svc.ids = s;
  svc.nids++;
  CHECK_GOTO(ensure_thread(), res, fail_unlink);
  *addr_p = l->addr;
  (void)!write(svc.wake[1], "x", 1);
  return ncclSuccess;
fail_unlink:
  svc.ids = s->next;
  svc.nids--;
  free(s);
  return res;
}

ncclResult_t root_serve(const sock_addr_t *bind, uint64_t nonce, sock_addr_t *addr_p) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_fork);
  pthread_mutex_lock(&svc.lock);
  if (svc.pid == 0) svc.pid = getpid();
  if (svc.gate.name == NULL) gate_init(&svc.gate, sizeof(root_msg_t), "bootstrap root");
  ncclResult_t res = svc.stop ? log_err(ncclInvalidUsage, "bootstrap: the process is exiting")
                              : serve_locked(bind, nonce, addr_p);
  pthread_mutex_unlock(&svc.lock);
  return res;
}

int root_ids_served(void) {
  pthread_mutex_lock(&svc.lock);
  int n = svc.nids;
  pthread_mutex_unlock(&svc.lock);
  return n;
}
