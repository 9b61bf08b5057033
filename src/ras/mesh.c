/*
 * The monitor thread and its peer mesh (see mesh.h).
 *
 * Threads: everything here runs on the monitor thread, except mesh_start (under the registry lock of ras.c),
 * mesh_wake and mesh_view. The peer table and what mesh_view copies of each entry (identity, state, last
 * heard, keep-alive snapshot) change only under `m.lock`; the monitor thread reads its own table without it.
 * Lock order: the registry lock of ras.c, then `m.lock`; nothing here calls into ras.c while holding
 * `m.lock`.
 */
#include "mesh.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "ras/client.h"

#define KA_S           1.0 /* keep-alive interval; these times are multiplied by NCCL_RAS_TIMEOUT_FACTOR */
#define UNRESPONSIVE_S 5.0
#define DEAD_S         60.0
#define RETRY_S        1.0
#define HELLO_S        5.0        /* an incoming connection must say HELLO within this */
#define OUT_MAX        (8u << 20) /* bytes queued to a peer that reads nothing before its connection drops */
#define MAX_PENDING    64         /* incoming connections waiting for their HELLO */
#define REFUSED_MAX    3          /* refused first connections before a peer never heard from is dead */

/* One direction of a connection: an outgoing one queues what we send, an incoming one collects what the peer
 * sends until a whole frame has arrived. */
typedef struct {
  int fd;         /* -1: none */
  int connecting; /* outgoing: connect() in progress */
  char *in;       /* received bytes not decoded yet */
  size_t in_len, in_cap;
  wire_buf_t out;  /* queued bytes ... */
  size_t out_off;  /* ... sent up to here */
  double deadline; /* pending incoming: HELLO expected by then */
} conn_t;

typedef struct {
  ras_peer_t id;
  uint64_t job; /* a nonce that proves the job to it (HELLO) */
  int state;    /* peer_state_t */
  conn_t out, in;
  double last_heard;   /* last message from it */
  double next_connect; /* when to try the outgoing connection again (0: not planned) */
  int probing;         /* its connection closed without BYE: a refused connection now means it died */
  int refused;         /* first connections refused so far */
  ras_proc_t digest;   /* its latest keep-alive snapshot */
  ras_proc_t reply;    /* its answer to the current query */
  uint64_t asked, answered;
} peer_t;

static struct {
  pthread_mutex_t lock; /* see the top of the file */
  pthread_t thread;
  int running;
  pid_t pid;
  int wake[2];
  int listen_fd;
  ras_peer_t self; /* id.addr is the mesh address */
  peer_t **peers;
  int npeers, cap_peers;
  conn_t pending[MAX_PENDING];
  int npending, polled_pending; /* polled_pending: those in the poll set, at its front */
  _Atomic int stop, refresh;
  double factor, last_loop, next_ka;
  uint64_t query_id;
  int query_active;
  ras_proc_t query_self; /* this process's records when the query began */
  double query_start, query_deadline;
  struct pollfd *pfd;
  int cap_pfd;
  const mesh_source_t *src; /* this process's records (ras.c) */
} m = {.lock = PTHREAD_MUTEX_INITIALIZER, .listen_fd = -1, .wake = {-1, -1}};

static const char *addr_text(const sock_addr_t *a, char *buf) {
  return sock_addr_str(a, buf);
}

/* ---- Connections ---- */

static void conn_reset(conn_t *c) {
  if (c->fd >= 0) close(c->fd);
  free(c->in);
  wire_buf_free(&c->out);
  *c = (conn_t){.fd = -1};
}

/* Sends what is queued; returns -1 when the connection failed. */
static int conn_flush(conn_t *c) {
  while (c->out_off < c->out.len) {
    ssize_t n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    c->out_off += (size_t)n;
  }
  c->out.len = c->out_off = 0;
  return 0;
}

/* Queues bytes (a whole message) on a connection; -1 when the peer left too much unread. */
static int conn_queue(conn_t *c, const wire_buf_t *msg) {
  if (c->out.len - c->out_off + msg->len > OUT_MAX) return -1;
  if (c->out_off > 0 && c->out_off == c->out.len) c->out.len = c->out_off = 0;
  size_t at = c->out.len;
  c->out.len += msg->len;
  if (c->out.len > c->out.cap) {
    size_t cap = c->out.cap ? c->out.cap : 4096;
    while (cap < c->out.len) cap *= 2;
    char *d = realloc(c->out.data, cap);
    if (d == NULL) {
      c->out.len = at;
      return -1;
    }
    c->out.data = d;
    c->out.cap = cap;
  }
  memcpy(c->out.data + at, msg->data, msg->len);
  return 0;
}

/* Reads what arrived; returns -1 at end of stream or on an error, else 0. */
static int conn_read(conn_t *c) {
  for (int i = 0; i < 16; i++) {
    if (c->in_cap - c->in_len < 4096) {
      size_t cap = c->in_cap ? c->in_cap * 2 : 16384;
      if (cap > WIRE_HEADER + WIRE_MAX_PAYLOAD + 65536) cap = WIRE_HEADER + WIRE_MAX_PAYLOAD + 65536;
      if (cap <= c->in_len) return 0; /* a whole frame is there: decode first */
      char *d = realloc(c->in, cap);
      if (d == NULL) return -1;
      c->in = d;
      c->in_cap = cap;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (n == 0) return -1;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    c->in_len += (size_t)n;
  }
  return 0;
}

/* Takes the next whole message off a connection: 1 and *msg, 0 when none is complete, -1 when the bytes are
 * not a valid message. */
static int conn_next(conn_t *c, wire_msg_t *msg) {
  uint32_t len;
  if (c->in_len < WIRE_HEADER) return 0;
  if (!wire_frame(c->in, &len)) return -1;
  if (c->in_len < WIRE_HEADER + len) return 0;
  int res = wire_decode(c->in, c->in + WIRE_HEADER, len, msg);
  memmove(c->in, c->in + WIRE_HEADER + len, c->in_len - WIRE_HEADER - len);
  c->in_len -= WIRE_HEADER + len;
  return res == 0 ? 1 : -1;
}

static int set_socket_opts(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* ---- Peers ---- */

static void event(int group, const char *name, const peer_t *p, const char *details) {
  client_event(group, name, p != NULL ? &p->id : NULL, details);
}

static void set_state(peer_t *p, int state) {
  pthread_mutex_lock(&m.lock);
  p->state = state;
  pthread_mutex_unlock(&m.lock);
}

static void connect_out(peer_t *p, double now);

/* The peer's connections broke without a goodbye: try it at once; a refused connection then means it died.
 */
static void lost(peer_t *p, double now, const char *why) {
  char a[SOCK_ADDR_STRLEN];
  INFO(LOG_RAS, "RAS connection with process %d at %s lost (%s); checking whether it is alive", p->id.pid,
       addr_text(&p->id.addr, a), why);
  event(CLIENT_EV_TRACE, "PEER_DISCONNECTED", p, why);
  conn_reset(&p->out);
  conn_reset(&p->in);
  if (p->state == PEER_DEAD || p->state == PEER_LEFT) return;
  p->probing = 1;
  connect_out(p, now);
}

static void declare_dead(peer_t *p, const char *why) {
  char a[SOCK_ADDR_STRLEN];
  INFO(LOG_RAS, "RAS: process %d on %s (%s) is dead: %s", p->id.pid, p->id.host, addr_text(&p->id.addr, a),
       why);
  conn_reset(&p->out);
  conn_reset(&p->in);
  p->next_connect = 0;
  set_state(p, PEER_DEAD);
  event(CLIENT_EV_LIFECYCLE, "PEER_DEAD", p, why);
}

/* Starts the outgoing connection; its first message is the HELLO. */
static void connect_out(peer_t *p, double now) {
  conn_reset(&p->out);
  p->next_connect = 0;
  int fd = socket(p->id.addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || set_socket_opts(fd) != 0) {
    if (fd >= 0) close(fd);
    p->next_connect = now + RETRY_S * m.factor;
    return;
  }
  socklen_t len = p->id.addr.sa.sa_family == AF_INET ? sizeof p->id.addr.sin : sizeof p->id.addr.sin6;
  int rc = connect(fd, &p->id.addr.sa, len);
  int err = rc == 0 ? 0 : errno;
  p->out.fd = fd;
  p->out.connecting = err == EINPROGRESS;
  wire_put_hello(&p->out.out, p->job, &m.self);
  /* a keep-alive at once: a process that stops right after it connected is still known by its state */
  ras_proc_t proc;
  if (m.src->snapshot(&proc, 1) == 0) {
    wire_put_snapshot(&p->out.out, WIRE_KEEPALIVE, 0, &proc, 1);
    free(proc.recs);
  }
  if (err != 0 && err != EINPROGRESS) {
    close(fd);
    p->out.fd = -1;
    if (err == ECONNREFUSED && (p->probing || ++p->refused >= REFUSED_MAX)) {
      declare_dead(p, "its connection closed and it refuses new ones");
      return;
    }
    p->next_connect = now + RETRY_S * m.factor;
  }
}

/* A connect() that was in progress finished (poll said writable). */
static void connect_done(peer_t *p, double now) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(p->out.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err == 0) {
    p->out.connecting = 0;
    p->refused = 0;
    return;
  }
  conn_reset(&p->out);
  if (err == ECONNREFUSED && (p->probing || ++p->refused >= REFUSED_MAX)) {
    declare_dead(p, "its connection closed and it refuses new ones");
    return;
  }
  event(CLIENT_EV_TRACE, "PEER_RETRY", p, strerror(err));
  p->next_connect = now + RETRY_S * m.factor;
}

static peer_t *find_peer(const sock_addr_t *addr) {
  for (int i = 0; i < m.npeers; i++)
    if (wire_addr_eq(&m.peers[i]->id.addr, addr)) return m.peers[i];
  return NULL;
}

/* Adds a peer (under the lock: mesh_view reads the table). */
static peer_t *add_peer(const ras_peer_t *id, uint64_t job, double now) {
  peer_t *p = calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  p->id = *id;
  p->job = job;
  p->state = PEER_CONNECTING;
  p->out.fd = p->in.fd = -1;
  p->last_heard = now;
  pthread_mutex_lock(&m.lock);
  if (m.npeers == m.cap_peers) {
    int cap = m.cap_peers ? 2 * m.cap_peers : 16;
    peer_t **a = realloc(m.peers, (size_t)cap * sizeof *a);
    if (a == NULL) {
      pthread_mutex_unlock(&m.lock);
      free(p);
      return NULL;
    }
    m.peers = a;
    m.cap_peers = cap;
  }
  m.peers[m.npeers++] = p;
  pthread_mutex_unlock(&m.lock);
  return p;
}

/* Peers learnt from the communicators' peer tables. */
typedef struct {
  ras_peer_t *ids;
  uint64_t *jobs;
  int n, cap;
} learnt_t;

static void learn(const ras_peer_t *peer, uint64_t job, void *arg) {
  learnt_t *l = arg;
  if (peer->addr.sa.sa_family == 0 || wire_addr_eq(&peer->addr, &m.self.addr)) return;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    ras_peer_t *ids = realloc(l->ids, (size_t)cap * sizeof *ids);
    if (ids == NULL) return;
    l->ids = ids;
    uint64_t *jobs = realloc(l->jobs, (size_t)cap * sizeof *jobs);
    if (jobs == NULL) return;
    l->jobs = jobs;
    l->cap = cap;
  }
  l->ids[l->n] = *peer;
  l->jobs[l->n++] = job;
}

/* Connects to the peers of ready communicators that it does not know yet. */
static void refresh_peers(double now) {
  learnt_t l = {0};
  m.src->peers(learn, &l);
  for (int i = 0; i < l.n; i++) {
    if (find_peer(&l.ids[i].addr) != NULL) continue;
    peer_t *p = add_peer(&l.ids[i], l.jobs[i], now);
    if (p != NULL) connect_out(p, now);
  }
  free(l.ids);
  free(l.jobs);
}

/* ---- Messages ---- */

static void heard(peer_t *p, double now) {
  pthread_mutex_lock(&m.lock);
  p->last_heard = now;
  pthread_mutex_unlock(&m.lock);
  if (p->state == PEER_ALIVE) return;
  int was = p->state;
  set_state(p, PEER_ALIVE);
  p->probing = 0;
  if (was == PEER_UNRESPONSIVE)
    event(CLIENT_EV_TRACE, "PEER_RESPONSIVE", p, "heard from again");
  else
    event(CLIENT_EV_LIFECYCLE, "PEER_NEW", p, was == PEER_CONNECTING ? "" : "back after it was given up");
  if (p->out.fd < 0) connect_out(p, now);
}

/* Answers a query from `p` with this process's full snapshot. */
static void answer(peer_t *p, uint64_t id, double now) {
  ras_proc_t proc;
  if (m.src->snapshot(&proc, 0) != 0) return;
  wire_buf_t b = {0};
  wire_put_snapshot(&b, WIRE_REPLY, id, &proc, 0);
  free(proc.recs);
  if (p->out.fd < 0) connect_out(p, now);
  if (!b.failed && p->out.fd >= 0 && conn_queue(&p->out, &b) != 0) lost(p, now, "it reads nothing");
  wire_buf_free(&b);
}

static void query_check(double now);

static void on_message(peer_t *p, wire_msg_t *msg, double now) {
  heard(p, now);
  switch (msg->type) {
  case WIRE_KEEPALIVE:
    pthread_mutex_lock(&m.lock);
    free(p->digest.recs);
    p->digest = msg->proc;
    p->digest.id = p->id; /* the identity is the one its HELLO gave */
    pthread_mutex_unlock(&m.lock);
    msg->proc.recs = NULL;
    break;
  case WIRE_REQUEST:
    answer(p, msg->id, now);
    break;
  case WIRE_REPLY:
    if (m.query_active && msg->id == m.query_id && p->asked == msg->id) {
      free(p->reply.recs);
      p->reply = msg->proc;
      p->reply.id = p->id;
      msg->proc.recs = NULL;
      p->answered = msg->id;
      query_check(now);
    }
    break;
  case WIRE_BYE:
    INFO(LOG_RAS, "RAS: process %d on %s left the job", p->id.pid, p->id.host);
    conn_reset(&p->out);
    conn_reset(&p->in);
    set_state(p, PEER_LEFT);
    event(CLIENT_EV_LIFECYCLE, "PEER_LEFT", p, "it exited normally");
    break;
  case WIRE_HELLO:
    break;
  }
  wire_msg_free(msg);
}

/* Reads and handles what a peer sent on its connection. */
static void peer_input(peer_t *p, double now) {
  int eof = conn_read(&p->in) != 0;
  wire_msg_t msg;
  int r;
  while (p->in.fd >= 0 && (r = conn_next(&p->in, &msg)) != 0) {
    if (r < 0) {
      INFO(LOG_RAS, "RAS: malformed message from process %d on %s; dropping its connection", p->id.pid,
           p->id.host);
      conn_reset(&p->in);
      return;
    }
    on_message(p, &msg, now);
  }
  if (eof && p->in.fd >= 0 && p->state != PEER_LEFT) lost(p, now, "its connection closed");
}

/* An incoming connection's first message must be a HELLO with a job proof this process knows. */
static void pending_input(int i, double now) {
  conn_t *c = &m.pending[i];
  int eof = conn_read(c) != 0;
  wire_msg_t msg;
  int r = conn_next(c, &msg);
  if (r == 0 && !eof) return;
  char a[SOCK_ADDR_STRLEN];
  const char *why = NULL;
  if (r <= 0)
    why = r < 0 ? "not a Braid monitor" : "closed before saying who it is";
  else if (msg.type != WIRE_HELLO)
    why = "it did not start with HELLO";
  else if (!m.src->known_job(msg.job))
    why = "it proves no communicator of this process";
  if (why != NULL) {
    INFO(LOG_RAS, "RAS: refused a mesh connection%s%s: %s", r > 0 ? " from " : "",
         r > 0 ? addr_text(&msg.proc.id.addr, a) : "", why);
    if (r > 0) wire_msg_free(&msg);
    conn_reset(c);
    m.pending[i] = m.pending[--m.npending];
    return;
  }
  peer_t *p = find_peer(&msg.proc.id.addr);
  if (p == NULL) p = add_peer(&msg.proc.id, msg.job, now);
  if (p == NULL) {
    conn_reset(c);
  } else {
    conn_reset(&p->in);
    p->in = *c;
    p->in.deadline = 0;
    pthread_mutex_lock(&m.lock);
    p->id = msg.proc.id;
    pthread_mutex_unlock(&m.lock);
    heard(p, now);
    /* messages that came right behind the HELLO */
    peer_input(p, now);
  }
  m.pending[i] = m.pending[--m.npending];
  wire_msg_free(&msg);
}

static void accept_new(double now) {
  for (;;) {
    int fd = accept4(m.listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (m.npending == MAX_PENDING) {
      close(fd); /* a flood of connections that say nothing: the oldest get their HELLO deadline */
      continue;
    }
    set_socket_opts(fd);
    m.pending[m.npending++] = (conn_t){.fd = fd, .deadline = now + HELLO_S * m.factor};
  }
}

/* ---- Keep-alives and silence ---- */

static void send_keepalives(double now) {
  ras_proc_t proc;
  if (m.src->snapshot(&proc, 1) != 0) return;
  wire_buf_t b = {0};
  wire_put_snapshot(&b, WIRE_KEEPALIVE, 0, &proc, 1);
  free(proc.recs);
  for (int i = 0; i < m.npeers && !b.failed; i++) {
    peer_t *p = m.peers[i];
    if (p->out.fd < 0) continue;
    if (conn_queue(&p->out, &b) != 0) lost(p, now, "it has read nothing for a long time");
  }
  wire_buf_free(&b);
}

/* Marks silent peers unresponsive, then dead; retries connections whose time has come. */
static void check_peers(double now) {
  for (int i = 0; i < m.npeers; i++) {
    peer_t *p = m.peers[i];
    if (p->state == PEER_DEAD || p->state == PEER_LEFT) continue;
    double silent = now - p->last_heard;
    if (silent > DEAD_S * m.factor) {
      char why[96];
      snprintf(why, sizeof why, "silent for %.0f s", silent);
      declare_dead(p, why);
      continue;
    }
    if (p->state == PEER_ALIVE && silent > UNRESPONSIVE_S * m.factor) {
      set_state(p, PEER_UNRESPONSIVE);
      event(CLIENT_EV_TRACE, "PEER_UNRESPONSIVE", p, "no keep-alive within the timeout");
    }
    if (p->out.fd < 0 && p->next_connect > 0 && now >= p->next_connect) connect_out(p, now);
  }
  for (int i = m.npending - 1; i >= 0; i--)
    if (now > m.pending[i].deadline) {
      conn_reset(&m.pending[i]);
      m.pending[i] = m.pending[--m.npending];
    }
}

/* After the loop itself was held up (a loaded machine, a stopped process), the peers get that time back:
 * their silence then was ours. */
static void give_time_back(double now) {
  double gap = now - m.last_loop;
  m.last_loop = now;
  if (gap <= 2 * KA_S * m.factor) return;
  pthread_mutex_lock(&m.lock);
  for (int i = 0; i < m.npeers; i++) m.peers[i]->last_heard += gap - KA_S * m.factor;
  pthread_mutex_unlock(&m.lock);
}

/* ---- Queries ---- */

static void proc_copy(ras_proc_t *dst, const ras_proc_t *src) {
  *dst = *src;
  dst->recs = NULL;
  if (src->nrecs == 0) return;
  dst->recs = malloc(src->nrecs * sizeof *dst->recs);
  if (dst->recs == NULL) {
    dst->nrecs = 0;
    return;
  }
  memcpy(dst->recs, src->recs, src->nrecs * sizeof *dst->recs);
}

static void query_finish(double now) {
  ras_view_t v = {.where = m.src->rank_peer, .collect_s = now - m.query_start};
  v.procs = calloc((size_t)m.npeers + 1, sizeof *v.procs);
  if (v.procs != NULL) {
    v.procs[0].state = PEER_SELF;
    v.procs[0].fresh = 1;
    v.procs[0].proc = m.query_self;
    m.query_self = (ras_proc_t){0};
    v.nprocs = 1;
    for (int i = 0; i < m.npeers; i++) {
      peer_t *p = m.peers[i];
      view_proc_t *vp = &v.procs[v.nprocs++];
      vp->state = p->state;
      vp->silent_s = now - p->last_heard;
      if (p->answered == m.query_id && p->asked == m.query_id) {
        vp->proc = p->reply;
        vp->fresh = 1;
        p->reply = (ras_proc_t){0};
      } else {
        proc_copy(&vp->proc, &p->digest);
        vp->proc.id = p->id;
        if (p->asked == m.query_id) v.timeouts++;
      }
    }
  }
  m.query_active = 0;
  client_query_done(&v);
  view_free(&v);
}

/* Ends the query when every peer asked has answered, or at its deadline. */
static void query_check(double now) {
  if (!m.query_active) return;
  int waiting = 0;
  for (int i = 0; i < m.npeers; i++) {
    peer_t *p = m.peers[i];
    if (p->asked == m.query_id && p->answered != m.query_id && p->out.fd >= 0 && p->state != PEER_DEAD &&
        p->state != PEER_LEFT)
      waiting++;
  }
  if (waiting == 0 || now >= m.query_deadline) query_finish(now);
}

static void mesh_query(double timeout_s) {
  if (m.query_active) return;
  double now = time_now();
  if (timeout_s <= 0) timeout_s = DEAD_S * m.factor; /* "no timeout" still ends: every wait is bounded */
  m.query_id++;
  m.query_active = 1;
  /* this process's records as of now, when the others are asked for theirs */
  free(m.query_self.recs);
  if (m.src->snapshot(&m.query_self, 0) != 0) m.query_self = (ras_proc_t){.id = m.self};
  m.query_start = now;
  m.query_deadline = now + timeout_s;
  wire_buf_t b = {0};
  wire_put_request(&b, m.query_id);
  for (int i = 0; i < m.npeers && !b.failed; i++) {
    peer_t *p = m.peers[i];
    /* an unresponsive peer is not waited for: its last keep-alive stands in for it */
    if (p->out.fd < 0 || p->state == PEER_DEAD || p->state == PEER_LEFT || p->state == PEER_UNRESPONSIVE)
      continue;
    if (conn_queue(&p->out, &b) == 0)
      p->asked = m.query_id;
    else
      lost(p, now, "it has read nothing for a long time");
  }
  wire_buf_free(&b);
  query_check(now);
}

/* ---- The loop ---- */

/* What a poll entry is for. */
typedef struct {
  peer_t *peer; /* NULL: not a peer's */
  int out;      /* the peer's outgoing connection (else its incoming one) */
} tag_t;

static tag_t *tags;

static int reserve_pfd(int n) {
  if (n <= m.cap_pfd) return 0;
  int cap = n + 64;
  struct pollfd *p = realloc(m.pfd, (size_t)cap * sizeof *p);
  if (p == NULL) return -1;
  m.pfd = p;
  tag_t *t = realloc(tags, (size_t)cap * sizeof *t);
  if (t == NULL) return -1;
  tags = t;
  m.cap_pfd = cap;
  return 0;
}

/* Fills the poll set: wake pipe, listener, pending connections, peers, then clients. Returns its size. */
static int build_pfds(void) {
  int need = 2 + m.npending + 2 * m.npeers + 256;
  if (reserve_pfd(need) != 0) return 0;
  int n = 0;
  m.pfd[n++] = (struct pollfd){.fd = m.wake[0], .events = POLLIN};
  m.pfd[n++] = (struct pollfd){.fd = m.listen_fd, .events = POLLIN};
  tags[0] = tags[1] = (tag_t){0};
  for (int i = 0; i < m.npending; i++) {
    tags[n] = (tag_t){0};
    m.pfd[n++] = (struct pollfd){.fd = m.pending[i].fd, .events = POLLIN};
  }
  m.polled_pending = m.npending;
  for (int i = 0; i < m.npeers; i++) {
    peer_t *p = m.peers[i];
    if (p->out.fd >= 0) {
      short ev = POLLIN | (p->out.connecting || p->out.out_off < p->out.out.len ? POLLOUT : 0);
      tags[n] = (tag_t){.peer = p, .out = 1};
      m.pfd[n++] = (struct pollfd){.fd = p->out.fd, .events = ev};
    }
    if (p->in.fd >= 0) {
      tags[n] = (tag_t){.peer = p, .out = 0};
      m.pfd[n++] = (struct pollfd){.fd = p->in.fd, .events = POLLIN};
    }
  }
  return n;
}

static void handle_out(peer_t *p, short rev, double now) {
  if (p->out.connecting) {
    if (rev & (POLLOUT | POLLERR | POLLHUP)) connect_done(p, now);
    if (p->out.fd < 0 || p->out.connecting) return;
  }
  /* nothing ever arrives on an outgoing connection: readable means closed (or a peer breaking the rules) */
  if (rev & (POLLIN | POLLERR | POLLHUP)) {
    char probe;
    ssize_t r = recv(p->out.fd, &probe, 1, MSG_DONTWAIT | MSG_PEEK);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      lost(p, now, "its connection closed");
      return;
    }
  }
  if (conn_flush(&p->out) != 0) lost(p, now, "sending to it failed");
}

static void handle_pfds(int n, double now) {
  if (m.pfd[0].revents & POLLIN) {
    char buf[64];
    while (read(m.wake[0], buf, sizeof buf) > 0) {
    }
  }
  if (atomic_exchange(&m.refresh, 0)) refresh_peers(now);
  int npend = m.polled_pending;
  for (int i = npend - 1; i >= 0; i--)
    if (m.pfd[2 + i].revents) pending_input(i, now);
  if (m.pfd[1].revents & POLLIN) accept_new(now);
  for (int i = 2 + npend; i < n; i++) {
    peer_t *p = tags[i].peer;
    short rev = m.pfd[i].revents;
    if (p == NULL || rev == 0) continue;
    if (tags[i].out && p->out.fd == m.pfd[i].fd)
      handle_out(p, rev, now);
    else if (!tags[i].out && p->in.fd == m.pfd[i].fd)
      peer_input(p, now);
  }
}

/* Says goodbye to every peer, giving the sends a moment. */
static void say_bye(void) {
  wire_buf_t b = {0};
  wire_put_bye(&b);
  double until = time_now() + 0.3;
  for (int i = 0; i < m.npeers; i++) {
    peer_t *p = m.peers[i];
    if (p->out.fd < 0 || p->out.connecting || b.failed) continue;
    if (conn_queue(&p->out, &b) != 0) continue;
    while (p->out.out_off < p->out.out.len && time_now() < until) {
      if (conn_flush(&p->out) != 0) break;
      struct pollfd pf = {.fd = p->out.fd, .events = POLLOUT};
      if (p->out.out_off < p->out.out.len) poll(&pf, 1, 10);
    }
  }
  wire_buf_free(&b);
}

static void *mesh_main(void *arg) {
  (void)arg;
  client_start(mesh_query, m.factor);
  m.last_loop = time_now();
  m.next_ka = m.last_loop;
  while (!atomic_load(&m.stop)) {
    int n = build_pfds();
    int nc = client_pollfds(m.pfd + n, m.cap_pfd - n);
    for (int i = n; i < n + nc; i++) tags[i] = (tag_t){0};
    double now = time_now();
    double next = m.next_ka;
    double ct = client_timers(now);
    if (ct < next) next = ct;
    if (m.query_active && m.query_deadline < next) next = m.query_deadline;
    int ms = next <= now ? 0 : (int)((next - now) * 1e3) + 1;
    if (ms > 250) ms = 250;
    int rc = poll(m.pfd, (nfds_t)(n + nc), ms);
    now = time_now();
    give_time_back(now);
    if (rc > 0) {
      handle_pfds(n, now);
      client_handle(m.pfd + n, nc, now);
    } else if (atomic_exchange(&m.refresh, 0)) {
      refresh_peers(now);
    }
    if (now >= m.next_ka) {
      send_keepalives(now);
      m.next_ka = now + KA_S * m.factor;
    }
    check_peers(now);
    query_check(now);
  }
  say_bye();
  client_stop();
  return NULL;
}

/* ---- Life ---- */

ncclResult_t mesh_start(const mesh_source_t *src, sock_addr_t *addr_p) {
  m.src = src;
  int64_t factor = param_int(P_NCCL_RAS_TIMEOUT_FACTOR);
  m.factor = factor < 1 ? 1.0 : (double)factor;
  sock_addr_t addr;
  ncclResult_t res = sock_find_interface(&addr, NULL, 0);
  if (res == ncclSuccess) res = sock_listen(&addr, &m.listen_fd);
  if (res != ncclSuccess) return res;
  if (pipe2(m.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    res = log_err(ncclSystemError, "RAS: cannot make the monitor's wake-up pipe: %s", strerror(errno));
    goto err_close_listen;
  }
  m.self.addr = addr;
  atomic_store(&m.stop, 0);
  char a[SOCK_ADDR_STRLEN];
  /* logged before the thread exists: the first log line reads the logging knobs, which the thread reads too
   */
  INFO(LOG_RAS | LOG_INIT, "RAS: monitor starting, mesh address %s", addr_text(&addr, a));
  int err = pthread_create(&m.thread, NULL, mesh_main, NULL);
  if (err != 0) {
    res = log_err(ncclSystemError, "RAS: cannot start the monitor thread: %s", strerror(err));
    goto err_close_pipe;
  }
  m.running = 1;
  m.pid = getpid();
  *addr_p = addr;
  return ncclSuccess;
err_close_pipe:
  close(m.wake[0]);
  close(m.wake[1]);
  m.wake[0] = m.wake[1] = -1;
err_close_listen:
  close(m.listen_fd);
  m.listen_fd = -1;
  return res;
}

void mesh_set_self(const ras_peer_t *self) {
  pthread_mutex_lock(&m.lock);
  m.self = *self;
  pthread_mutex_unlock(&m.lock);
}

void mesh_wake(void) {
  atomic_store(&m.refresh, 1);
  if (m.wake[1] >= 0) {
    char c = 1;
    ssize_t r = write(m.wake[1], &c, 1);
    (void)r; /* a full pipe already wakes the thread */
  }
}

/* Stops the thread at exit (or when the library is unloaded), after it said goodbye to its peers. */
__attribute__((destructor)) static void mesh_stop(void) {
  if (!m.running || m.pid != getpid()) return;
  atomic_store(&m.stop, 1);
  mesh_wake();
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 2;
  if (pthread_timedjoin_np(m.thread, NULL, &until) == 0) m.running = 0;
}

int mesh_view(ras_view_t *v) {
  *v = (ras_view_t){.where = m.src->rank_peer};
  ras_proc_t self;
  if (m.src->snapshot(&self, 0) != 0) return -1;
  double now = time_now();
  pthread_mutex_lock(&m.lock);
  v->procs = calloc((size_t)m.npeers + 1, sizeof *v->procs);
  if (v->procs == NULL) {
    pthread_mutex_unlock(&m.lock);
    free(self.recs);
    return -1;
  }
  v->procs[0] = (view_proc_t){.proc = self, .state = PEER_SELF, .fresh = 1};
  v->nprocs = 1;
  for (int i = 0; i < m.npeers; i++) {
    const peer_t *p = m.peers[i];
    view_proc_t *vp = &v->procs[v->nprocs++];
    vp->state = p->state;
    vp->silent_s = now - p->last_heard;
    vp->fresh = p->state == PEER_ALIVE; /* a keep-alive at most an interval old */
    proc_copy(&vp->proc, &p->digest);
    vp->proc.id = p->id;
  }
  pthread_mutex_unlock(&m.lock);
  return 0;
}

void mesh_atfork_child(void) {
  pthread_mutex_unlock(&m.lock);
  for (int i = 0; i < m.npending; i++) conn_reset(&m.pending[i]);
  for (int i = 0; i < m.npeers; i++) {
    conn_reset(&m.peers[i]->out);
    conn_reset(&m.peers[i]->in);
    free(m.peers[i]->digest.recs);
    free(m.peers[i]->reply.recs);
    free(m.peers[i]);
  }
  free(m.peers);
  if (m.listen_fd >= 0) close(m.listen_fd);
  if (m.wake[0] >= 0) close(m.wake[0]);
  if (m.wake[1] >= 0) close(m.wake[1]);
  client_forget();
  free(m.pfd);
  free(tags);
  tags = NULL;
  m.peers = NULL;
  m.npeers = m.cap_peers = m.npending = m.polled_pending = m.running = m.query_active = 0;
  m.pfd = NULL;
  m.cap_pfd = 0;
  m.listen_fd = m.wake[0] = m.wake[1] = -1;
}

/* Fork safety: the monitor's locks are taken around fork, so that a child never inherits one held. */
void mesh_atfork_prepare(void) {
  pthread_mutex_lock(&m.lock);
}
void mesh_atfork_parent(void) {
  pthread_mutex_unlock(&m.lock);
}
