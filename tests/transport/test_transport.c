/*
 * Tests of the shm and net transports: byte-exact streams through small rings with random peek sizes,
 * several connections at once, a peer killed or failing mid-stream, accept order, abort and timeouts, and no
 * shared-memory segment left behind.
 *
 * Each case forks its ranks; they trade blobs and peer tables over socketpairs made before the fork, since
 * the bootstrap is not part of this layer.
 */
#include "harness.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/timeutil.h"
#include "transport/transport.h"

#define MAX_RANKS 3
#define MAX_CONNS 4
#define MIB       (1024 * 1024)

/* What every rank of a case shares, made before the fork. */
typedef struct {
  const tp_ops_t *ops;          /* the transport under test */
  int nranks;                   /* ranks in the case */
  int fd[MAX_RANKS][MAX_RANKS]; /* fd[i][j]: rank i's end of its socketpair with rank j */
  uint64_t nonce;               /* the fake communicator's nonce */
  size_t ring_bytes;            /* staging ring per connection */
  int nconns;                   /* connections per direction and pair */
  uint64_t bytes;               /* bytes per connection */
  int victim;                   /* rank that dies or fails */
  int victim_sends;             /* 1: the victim is the sender of the connection */
} world_t;

/* One byte stream through one connection, generated from a seed and checked on arrival. */
typedef struct {
  tp_conn_t *conn; /* the connection */
  uint64_t seed;   /* selects the stream's contents */
  uint64_t pos;    /* bytes committed (sender) or checked and released (receiver) */
  uint64_t total;  /* bytes to move */
  int partial;     /* receiver: the sender sends more than `total`, so more may be readable */
} stream_t;

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static uint8_t byte_at(uint64_t seed, uint64_t x) {
  uint64_t z = ((x >> 3) + seed) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  return (uint8_t)(z >> ((x & 7) * 8));
}

static void xwrite(int fd, const void *buf, size_t n) {
  EXPECT(write(fd, buf, n) == (ssize_t)n, "socketpair write of %zu bytes", n);
}

static void xread(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    EXPECT(r > 0, "socketpair read of %zu bytes (got %zu)", n, got);
    got += (size_t)r;
  }
}

static void make_world(world_t *w, int nranks, const tp_ops_t *ops) {
  memset(w, 0, sizeof *w);
  w->ops = ops;
  w->nranks = nranks;
  w->nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ ((uint64_t)(time_now() * 1e6) << 16);
  w->ring_bytes = 64 * 1024;
  w->nconns = 1;
  w->bytes = 4 * MIB;
  for (int i = 0; i < nranks; i++)
    for (int j = i + 1; j < nranks; j++) {
      int sv[2];
      EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
      w->fd[i][j] = sv[0];
      w->fd[j][i] = sv[1];
    }
}

/* Trades peer-table entries with every other rank and makes this rank's transport context. */
static tp_ctx_t *rank_ctx(const world_t *w, int rank, const volatile int *abort_flag) {
  tp_peer_t peers[MAX_RANKS];
  tp_peer_t me = {.host_hash = 42, .pid = (int32_t)getpid(), .dev = -1};
  for (int p = 0; p < w->nranks; p++)
    if (p != rank) xwrite(w->fd[rank][p], &me, sizeof me);
  for (int p = 0; p < w->nranks; p++) {
    if (p == rank)
      peers[p] = me;
    else
      xread(w->fd[rank][p], &peers[p], sizeof peers[p]);
  }
  tp_config_t cfg = {.rank = rank,
                     .nranks = w->nranks,
                     .nonce = w->nonce,
                     .peers = peers,
                     .abort_flag = abort_flag,
                     .ring_bytes = w->ring_bytes};
  tp_ctx_t *ctx = NULL;
  EXPECT_OK(tp_init(&cfg, &ctx));
  return ctx;
}

/* Opens w->nconns connections in each direction with `peer`: listens, trades blobs, connects (in reverse
 * order when asked), accepts. */
static void open_conns(const world_t *w, tp_ctx_t *ctx, int rank, int peer, int reverse, tp_conn_t **sends,
                       tp_conn_t **recvs) {
  char blobs[MAX_CONNS][TP_BLOB_BYTES] = {{0}}, theirs[MAX_CONNS][TP_BLOB_BYTES];
  int n = w->nconns;
  for (int i = 0; i < n; i++) EXPECT_OK(w->ops->listen(ctx, peer, blobs[i], &recvs[i]));
  xwrite(w->fd[rank][peer], blobs, sizeof blobs[0] * (size_t)n);
  xread(w->fd[rank][peer], theirs, sizeof theirs[0] * (size_t)n);
  for (int k = 0; k < n; k++) {
    int i = reverse ? n - 1 - k : k;
    EXPECT_OK(w->ops->connect(ctx, peer, theirs[i], &sends[i]));
  }
  for (int i = 0; i < n; i++) EXPECT_OK(w->ops->accept(ctx, recvs[i]));
}

/* One step of a sender: peeks, fills a random part of the room (often all, sometimes none), commits. */
static ncclResult_t send_step(stream_t *s, uint64_t *rng, int *progress_p) {
  void *ptr;
  size_t room;
  ncclResult_t res = s->conn->ops->send_peek(s->conn, &ptr, &room);
  if (res != ncclSuccess) return res;
  uint64_t want = s->total - s->pos < room ? s->total - s->pos : room;
  uint64_t r = rng_next(rng);
  uint64_t n = (r & 7) == 0 ? 0 : (r & 7) < 4 ? want : (r >> 8) % (want + 1);
  for (uint64_t i = 0; i < n; i++) ((uint8_t *)ptr)[i] = byte_at(s->seed, s->pos + i);
  res = s->conn->ops->send_commit(s->conn, (size_t)n);
  s->pos += n;
  *progress_p |= n > 0;
  return res;
}

/* One step of a receiver: peeks, checks a random part of what arrived, releases it. */
static ncclResult_t recv_step(stream_t *s, uint64_t *rng, int *progress_p) {
  void *ptr;
  size_t avail;
  ncclResult_t res = s->conn->ops->recv_peek(s->conn, &ptr, &avail);
  if (res != ncclSuccess) return res;
  EXPECT(s->partial || s->pos + avail <= s->total, "%zu bytes readable at %llu of %llu", avail,
         (unsigned long long)s->pos, (unsigned long long)s->total);
  if (avail > s->total - s->pos) avail = (size_t)(s->total - s->pos);
  uint64_t r = rng_next(rng);
  uint64_t n = (r & 7) == 0 ? 0 : (r & 7) < 4 ? avail : (r >> 8) % (avail + 1);
  for (uint64_t i = 0; i < n; i++) {
    uint8_t want = byte_at(s->seed, s->pos + i);
    EXPECT(((uint8_t *)ptr)[i] == want, "byte %llu is %u, expected %u", (unsigned long long)(s->pos + i),
           ((uint8_t *)ptr)[i], want);
  }
  res = s->conn->ops->recv_release(s->conn, (size_t)n);
  s->pos += n;
  *progress_p |= n > 0;
  return res;
}

/* Moves every stream to its end (senders flushed), or returns the first error. Fails the test after
 * `timeout_s` seconds without progress. */
static ncclResult_t run_streams(stream_t *sends, int nsend, stream_t *recvs, int nrecv, double timeout_s) {
  uint64_t rng = 0x1234567ull ^ (uint64_t)getpid() << 20, idle = 0;
  double last = time_now();
  for (;;) {
    int progress = 0, busy = 0;
    for (int i = 0; i < nsend; i++) {
      stream_t *s = &sends[i];
      int done = 0;
      ncclResult_t res =
          s->pos < s->total ? send_step(s, &rng, &progress) : s->conn->ops->flush(s->conn, &done);
      if (res != ncclSuccess) return res;
      busy |= !done;
    }
    for (int i = 0; i < nrecv; i++) {
      if (recvs[i].pos == recvs[i].total) continue;
      busy = 1;
      ncclResult_t res = recv_step(&recvs[i], &rng, &progress);
      if (res != ncclSuccess) return res;
    }
    if (!busy) return ncclSuccess;
    if (progress) {
      last = time_now();
      idle = 0;
    }
    EXPECT(time_now() - last < timeout_s, "no progress for %.0f s", timeout_s);
    time_backoff(idle++);
  }
}

/* Streams seeds are chosen so that both ends of connection i from rank a to rank b agree. */
static uint64_t stream_seed(int from, int to, int i) {
  return (uint64_t)(from * 131 + to * 17 + i) * 0x100000001B3ull + 7;
}

static void close_all(tp_conn_t **conns, int n) {
  for (int i = 0; i < n; i++) conns[i]->ops->close(conns[i]);
}

/* Counts the shared-memory segments of this nonce still in /dev/shm. */
static int leftover_segments(uint64_t nonce) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "braid-%016llx", (unsigned long long)nonce);
  DIR *d = opendir("/dev/shm");
  if (d == NULL) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

/* Rank body of the stream cases: nconns connections each way with the other rank, all streams at once. */
static void stream_rank(int rank, int nranks, void *arg) {
  const world_t *w = arg;
  int peer = 1 - rank;
  tp_ctx_t *ctx = rank_ctx(w, rank, NULL);
  tp_conn_t *sc[MAX_CONNS], *rc[MAX_CONNS];
  open_conns(w, ctx, rank, peer, 0, sc, rc);
  stream_t sends[MAX_CONNS], recvs[MAX_CONNS];
  for (int i = 0; i < w->nconns; i++) {
    sends[i] = (stream_t){.conn = sc[i], .seed = stream_seed(rank, peer, i), .total = w->bytes};
    recvs[i] = (stream_t){.conn = rc[i], .seed = stream_seed(peer, rank, i), .total = w->bytes};
  }
  /* Rank 0 only sends and rank 1 only receives when there is a single connection: a one-way stream. */
  int one_way = w->nconns == 1;
  EXPECT_OK(run_streams(sends, one_way && rank == 1 ? 0 : w->nconns, recvs,
                        one_way && rank == 0 ? 0 : w->nconns, 20));
  char byte = 0;
  xwrite(w->fd[rank][peer], &byte, 1); /* both sides are done before either closes */
  xread(w->fd[rank][peer], &byte, 1);
  close_all(sc, w->nconns);
  close_all(rc, w->nconns);
  tp_destroy(ctx);
}

static void stream_case(const tp_ops_t *ops, int nconns, size_t ring_bytes, uint64_t bytes) {
  world_t w;
  make_world(&w, 2, ops);
  w.nconns = nconns;
  w.ring_bytes = ring_bytes;
  w.bytes = bytes;
  EXPECT(run_ranks(2, 60, stream_rank, &w) == 0);
  EXPECT(leftover_segments(w.nonce) == 0, "%d segments left in /dev/shm", leftover_segments(w.nonce));
}

static void test_shm_stream_64mib(void) {
  stream_case(&tp_shm_ops, 1, 64 * 1024, 64 * MIB);
}

static void test_net_stream_64mib(void) {
  stream_case(&tp_net_ops, 1, 64 * 1024, 64 * MIB);
}

/* Several connections each way at once, with a ring size that is not a multiple of 64 (shm rounds it up). */
static void test_shm_many_connections(void) {
  stream_case(&tp_shm_ops, 3, 64 * 1024 + 13, 8 * MIB);
}

static void test_net_many_connections(void) {
  stream_case(&tp_net_ops, 3, 64 * 1024 + 13, 8 * MIB);
}

/* Tiny rings: every peek wraps or finds the ring full or empty. */
static void test_shm_tiny_ring(void) {
  stream_case(&tp_shm_ops, 1, 64, 1 * MIB);
}

static void test_net_tiny_ring(void) {
  stream_case(&tp_net_ops, 1, 7, 256 * 1024);
}

/* Rank body of the fault cases: a stream from one rank to the other; the victim stops after 1 MiB (killed,
 * or calling fail) and the survivor's peek must return ncclRemoteError within a few seconds. */
static void fault_rank(int rank, int nranks, void *arg) {
  const world_t *w = arg;
  int peer = 1 - rank, sender = w->victim_sends ? w->victim : 1 - w->victim;
  tp_ctx_t *ctx = rank_ctx(w, rank, NULL);
  tp_conn_t *sc[1], *rc[1];
  open_conns(w, ctx, rank, peer, 0, sc, rc);
  stream_t s = {
      .conn = rank == sender ? sc[0] : rc[0], .seed = stream_seed(sender, 1 - sender, 0), .total = 64 * MIB};
  int sending = rank == sender;
  if (rank == w->victim) {
    s.total = 1 * MIB;
    s.partial = 1;
    EXPECT_OK(run_streams(&s, sending, &s, !sending, 20));
    double t = time_now();
    xwrite(w->fd[rank][peer], &t, sizeof t);
    if (w->bytes == 0) raise(SIGKILL); /* bytes == 0 marks the kill cases */
    s.conn->ops->fail(s.conn);
    char ack;
    xread(w->fd[rank][peer], &ack, 1);
  } else {
    ncclResult_t res = run_streams(&s, sending, &s, !sending, 20);
    double t_err = time_now(), t_victim;
    EXPECT_RES(res, ncclRemoteError);
    EXPECT(strstr(log_last_error(), "rank") != NULL, "message '%s'", log_last_error());
    xread(w->fd[rank][peer], &t_victim, sizeof t_victim);
    EXPECT(t_err - t_victim < 3.0, "error %.2f s after the peer stopped", t_err - t_victim);
    xwrite(w->fd[rank][peer], "k", 1);
  }
  close_all(sc, 1);
  close_all(rc, 1);
  tp_destroy(ctx);
}

static void fault_case(const tp_ops_t *ops, int victim_sends, int kill_it) {
  world_t w;
  make_world(&w, 2, ops);
  w.victim = 1;
  w.victim_sends = victim_sends;
  w.bytes = kill_it ? 0 : 1;
  unsigned bad = run_ranks_mask(2, 30, fault_rank, &w);
  EXPECT(bad == (kill_it ? 2u : 0u), "failed ranks mask %u", bad);
  /* A killed receiver cannot unlink its segment; the sender did it at connect. */
  EXPECT(leftover_segments(w.nonce) == 0, "%d segments left in /dev/shm", leftover_segments(w.nonce));
}

static void test_shm_sender_killed(void) {
  fault_case(&tp_shm_ops, 1, 1);
}
static void test_shm_receiver_killed(void) {
  fault_case(&tp_shm_ops, 0, 1);
}
static void test_shm_sender_fails(void) {
  fault_case(&tp_shm_ops, 1, 0);
}
static void test_shm_receiver_fails(void) {
  fault_case(&tp_shm_ops, 0, 0);
}
static void test_net_sender_killed(void) {
  fault_case(&tp_net_ops, 1, 1);
}
static void test_net_receiver_killed(void) {
  fault_case(&tp_net_ops, 0, 1);
}
static void test_net_sender_fails(void) {
  fault_case(&tp_net_ops, 1, 0);
}
static void test_net_receiver_fails(void) {
  fault_case(&tp_net_ops, 0, 0);
}

/* The sender dies before it ever attaches: the receiver finds it dead through the peer table's pid. */
static void early_death_rank(int rank, int nranks, void *arg) {
  const world_t *w = arg;
  tp_ctx_t *ctx = rank_ctx(w, rank, NULL);
  char blob[TP_BLOB_BYTES];
  if (rank == 0) {
    xread(w->fd[0][1], blob, sizeof blob);
    raise(SIGKILL);
  }
  tp_conn_t *conn;
  EXPECT_OK(w->ops->listen(ctx, 0, blob, &conn));
  xwrite(w->fd[1][0], blob, sizeof blob);
  EXPECT_OK(w->ops->accept(ctx, conn));
  void *ptr;
  size_t n;
  ncclResult_t res;
  double start = time_now();
  while ((res = conn->ops->recv_peek(conn, &ptr, &n)) == ncclSuccess) {
    EXPECT(n == 0 && time_now() - start < 5, "%zu bytes from a dead sender after %.1f s", n,
           time_now() - start);
    time_sleep_us(1000);
  }
  EXPECT_RES(res, ncclRemoteError);
  EXPECT(strstr(log_last_error(), "exited") != NULL, "message '%s'", log_last_error());
  conn->ops->close(conn);
  tp_destroy(ctx);
}

static void test_shm_sender_dies_before_connect(void) {
  world_t w;
  make_world(&w, 2, &tp_shm_ops);
  EXPECT(run_ranks_mask(2, 15, early_death_rank, &w) == 1u);
  EXPECT(leftover_segments(w.nonce) == 0, "the receiver's close removes a segment nobody attached to");
}

/* Three ranks: 1 and 2 each open two connections to 0. Rank 2 connects at once, rank 1 late and in reverse
 * order, so rank 0's first accept (rank 1's first listen) must stash every other hello. */
static void accept_order_rank(int rank, int nranks, void *arg) {
  const world_t *w = arg;
  tp_ctx_t *ctx = rank_ctx(w, rank, NULL);
  tp_conn_t *conns[2 * MAX_CONNS];
  char blobs[2][TP_BLOB_BYTES];
  stream_t streams[4];
  if (rank == 0) {
    for (int p = 1; p <= 2; p++) {
      for (int i = 0; i < 2; i++) EXPECT_OK(w->ops->listen(ctx, p, blobs[i], &conns[2 * (p - 1) + i]));
      xwrite(w->fd[0][p], blobs, sizeof blobs);
    }
    for (int k = 0; k < 4; k++) {
      EXPECT_OK(w->ops->accept(ctx, conns[k]));
      streams[k] = (stream_t){.conn = conns[k], .seed = stream_seed(1 + k / 2, 0, k % 2), .total = MIB};
    }
    EXPECT_OK(run_streams(NULL, 0, streams, 4, 20));
    close_all(conns, 4);
  } else {
    xread(w->fd[rank][0], blobs, sizeof blobs);
    if (rank == 1) time_sleep_us(300000);
    for (int k = 0; k < 2; k++) {
      int i = rank == 1 ? 1 - k : k;
      EXPECT_OK(w->ops->connect(ctx, 0, blobs[i], &conns[i]));
    }
    for (int i = 0; i < 2; i++)
      streams[i] = (stream_t){.conn = conns[i], .seed = stream_seed(rank, 0, i), .total = MIB};
    EXPECT_OK(run_streams(streams, 2, NULL, 0, 20));
    close_all(conns, 2);
  }
  tp_destroy(ctx);
}

static void test_net_accept_order(void) {
  world_t w;
  make_world(&w, 3, &tp_net_ops);
  EXPECT(run_ranks(3, 30, accept_order_rank, &w) == 0);
}

/* Two contexts of one process standing for ranks 0 and 1 of a communicator, for single-process cases. */
typedef struct {
  tp_ctx_t *ctx[2];        /* ctx[r]: rank r */
  volatile int abort_flag; /* shared by both */
  tp_peer_t peers[2];      /* the peer table */
} loop_t;

static void loop_init(loop_t *l, size_t ring_bytes, uint64_t host1) {
  memset(l, 0, sizeof *l);
  l->peers[0] = (tp_peer_t){.host_hash = 42, .pid = (int32_t)getpid(), .dev = -1};
  l->peers[1] = (tp_peer_t){.host_hash = host1, .pid = (int32_t)getpid(), .dev = -1};
  for (int r = 0; r < 2; r++) {
    tp_config_t cfg = {.rank = r,
                       .nranks = 2,
                       .nonce = 0xfeed0000ull + (uint64_t)getpid(),
                       .peers = l->peers,
                       .abort_flag = &l->abort_flag,
                       .ring_bytes = ring_bytes};
    EXPECT_OK(tp_init(&cfg, &l->ctx[r]));
  }
}

/* Connects rank 0 (sender) to rank 1 (receiver) with `ops`. */
static void loop_connect(loop_t *l, const tp_ops_t *ops, tp_conn_t **send_p, tp_conn_t **recv_p) {
  char blob[TP_BLOB_BYTES];
  EXPECT_OK(ops->listen(l->ctx[1], 0, blob, recv_p));
  EXPECT_OK(ops->connect(l->ctx[0], 1, blob, send_p));
  EXPECT_OK(ops->accept(l->ctx[1], *recv_p));
}

static void loop_destroy(loop_t *l) {
  tp_destroy(l->ctx[0]);
  tp_destroy(l->ctx[1]);
}

static void test_select(void) {
  loop_t l;
  loop_init(&l, 4096, 43);
  EXPECT(tp_select(l.ctx[0], 1) == &tp_net_ops, "another host is reached over net");
  loop_destroy(&l);
  loop_init(&l, 4096, 42);
  EXPECT(tp_select(l.ctx[0], 1) == &tp_shm_ops, "the same host is reached over shm");
  EXPECT(strcmp(tp_select(l.ctx[1], 0)->name, "shm") == 0);
  loop_destroy(&l);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  param_reload();
  loop_init(&l, 4096, 42);
  EXPECT(tp_select(l.ctx[0], 1) == &tp_net_ops, "NCCL_SHM_DISABLE=1 forces net");
  loop_destroy(&l);
}

/* Zero-length peeks, commits and releases; a full ring offers no room; over-committing is refused. An empty
 * shm ring offers all of itself; an empty net connection one staging slot (an eighth of the ring, in whole
 * 16-byte pieces). */
static void zero_length_case(const tp_ops_t *ops) {
  loop_t l;
  loop_init(&l, 1000, 42);
  tp_conn_t *s, *r;
  loop_connect(&l, ops, &s, &r);
  void *p;
  size_t n;
  EXPECT_OK(r->ops->recv_peek(r, &p, &n));
  EXPECT(n == 0, "an empty connection offers %zu bytes", n);
  EXPECT_OK(r->ops->recv_release(r, 0));
  /* A net connection comes up in the background: no room until it has. */
  for (double start = time_now();; time_sleep_us(1000)) {
    EXPECT_OK(s->ops->send_peek(s, &p, &n));
    if (n > 0 || time_now() - start > 5) break;
  }
  size_t want = ops == &tp_net_ops ? 1000 / 8 / 16 * 16 : 1000, sent = n;
  EXPECT(n >= want, "an empty ring offers %zu bytes", n);
  EXPECT_OK(s->ops->send_commit(s, 0));
  EXPECT_RES(s->ops->send_commit(s, n + 1), ncclInternalError);
  memset(p, 0x5a, n);
  EXPECT_OK(s->ops->send_commit(s, n));
  if (ops == &tp_shm_ops) {
    EXPECT_OK(s->ops->send_peek(s, &p, &n));
    EXPECT(n == 0, "a full ring offers %zu bytes", n);
  }
  size_t got = 0;
  for (double start = time_now(); got < sent && time_now() - start < 5;) {
    EXPECT_OK(r->ops->recv_peek(r, &p, &n));
    EXPECT(n == 0 || ((unsigned char *)p)[0] == 0x5a);
    EXPECT_RES(r->ops->recv_release(r, n + 1), ncclInternalError);
    EXPECT_OK(r->ops->recv_release(r, n));
    got += n;
  }
  EXPECT(got == sent, "received %zu of %zu bytes", got, sent);
  int done = 0;
  EXPECT_OK(s->ops->flush(s, &done));
  EXPECT(done == 1);
  s->ops->close(s);
  r->ops->close(r);
  loop_destroy(&l);
}

static void test_shm_zero_length(void) {
  zero_length_case(&tp_shm_ops);
}

static void test_net_zero_length(void) {
  zero_length_case(&tp_net_ops);
}

static void *raise_abort(void *arg) {
  time_sleep_us(300000);
  *(volatile int *)arg = 1;
  return NULL;
}

/* The abort flag ends net's bounded waits: an accept nobody connects to, a connect nobody listens for (the
 * connect runs in the background: its failure shows when the connection is first used). */
static void test_net_abort(void) {
  loop_t l;
  loop_init(&l, 4096, 43);
  tp_conn_t *r, *s;
  char blob[TP_BLOB_BYTES];
  EXPECT_OK(tp_net_ops.listen(l.ctx[1], 0, blob, &r));
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, raise_abort, (void *)&l.abort_flag) == 0);
  double start = time_now();
  EXPECT(tp_net_ops.accept(l.ctx[1], r) != ncclSuccess);
  EXPECT(time_now() - start < 2.0, "accept took %.1f s to see the abort", time_now() - start);
  pthread_join(t, NULL);
  r->ops->close(r);
  tp_destroy(l.ctx[1]); /* nobody listens at the blob's address any more */
  l.abort_flag = 0;
  EXPECT(pthread_create(&t, NULL, raise_abort, (void *)&l.abort_flag) == 0);
  start = time_now();
  EXPECT_OK(tp_net_ops.connect(l.ctx[0], 1, blob, &s));
  ncclResult_t res;
  int done = 0;
  while ((res = s->ops->flush(s, &done)) == ncclSuccess && time_now() - start < 5) time_sleep_us(1000);
  EXPECT(res != ncclSuccess && !done, "flush of a connection that never came up: %d", (int)res);
  EXPECT(time_now() - start < 2.0, "connect took %.1f s to see the abort", time_now() - start);
  pthread_join(t, NULL);
  s->ops->close(s);
  tp_destroy(l.ctx[0]);
}

/* With BRAID_TIMEOUT_S=1 an accept nobody connects to fails after about a second, naming the peer. */
static void test_net_accept_timeout(void) {
  setenv("BRAID_TIMEOUT_S", "1", 1);
  param_reload();
  loop_t l;
  loop_init(&l, 4096, 43);
  tp_conn_t *r;
  char blob[TP_BLOB_BYTES];
  EXPECT_OK(tp_net_ops.listen(l.ctx[1], 0, blob, &r));
  double start = time_now();
  EXPECT_RES(tp_net_ops.accept(l.ctx[1], r), ncclRemoteError);
  EXPECT(time_now() - start < 3.0, "accept took %.1f s", time_now() - start);
  EXPECT(strstr(log_last_error(), "rank 0") != NULL, "message '%s'", log_last_error());
  r->ops->close(r);
  loop_destroy(&l);
}

/* A blob from the wrong communicator or rank is refused before anything is opened. */
static void test_connect_checks_blob(void) {
  loop_t l;
  loop_init(&l, 4096, 42);
  const tp_ops_t *ops[2] = {&tp_shm_ops, &tp_net_ops};
  for (int i = 0; i < 2; i++) {
    tp_conn_t *r, *s;
    char blob[TP_BLOB_BYTES];
    EXPECT_OK(ops[i]->listen(l.ctx[1], 0, blob, &r));
    EXPECT_RES(ops[i]->connect(l.ctx[1], 0, blob, &s), ncclInternalError); /* the blob is rank 1's, not 0's */
    r->ops->close(r);
  }
  loop_destroy(&l);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  TEST(test_select, 10);
  TEST(test_shm_zero_length, 10);
  TEST(test_net_zero_length, 10);
  TEST(test_connect_checks_blob, 10);
  TEST(test_shm_stream_64mib, 120);
  TEST(test_net_stream_64mib, 120);
  TEST(test_shm_many_connections, 120);
  TEST(test_net_many_connections, 120);
  TEST(test_shm_tiny_ring, 60);
  TEST(test_net_tiny_ring, 60);
  TEST(test_shm_sender_killed, 60);
  TEST(test_shm_receiver_killed, 60);
  TEST(test_shm_sender_fails, 60);
  TEST(test_shm_receiver_fails, 60);
  TEST(test_shm_sender_dies_before_connect, 30);
  TEST(test_net_sender_killed, 60);
  TEST(test_net_receiver_killed, 60);
  TEST(test_net_sender_fails, 60);
  TEST(test_net_receiver_fails, 60);
  TEST(test_net_accept_order, 60);
  TEST(test_net_abort, 20);
  TEST(test_net_accept_timeout, 20);
  return test_summary();
}
