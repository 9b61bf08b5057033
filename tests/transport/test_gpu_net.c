/*
 * Tests of the gpu_net transport's ring pumps and proxy thread, without a GPU: the test plays the kernels.
 * Its "kernel" writes slots of random sizes into malloc'd rings (device/dev.h's layout) and publishes tail;
 * on the other rank (a forked process) its "kernel" consumes slowly, so the receiving rings fill up and the
 * pumps must wait, and checks that every slot arrives whole and in order on every ring. The pumps run either
 * on the test's own thread or on the proxy thread, over the built-in network or the stand-in plugins of
 * tests/net (a v6 one, with its smaller request limit; a misbehaving one; one that takes "GPU memory", whose
 * receives must be flushed). Faults: a sender killed mid-stream, a receiver that fails,
 * an abort, a kernel that publishes a slot too large. Also the choice of GPU transport.
 */
#include "harness.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "transport/gpu_net.h"
#include "transport/net.h"
#include "transport/transport.h"

#define MAX_RINGS 4

/* Where the rings' slots are, as the pumps are told (NCCL_PTR_CUDA: "GPU memory", host memory here). */
static int ring_data_type = NCCL_PTR_HOST;

/* What both ranks of a case share, made before the fork. */
typedef struct {
  int fd[2];         /* fd[r]: rank r's end of a socketpair */
  uint64_t nonce;    /* the fake communicator's nonce */
  int nrings;        /* rings each way */
  uint64_t nslots;   /* slots per ring */
  int use_proxy;     /* 1: the proxy thread pumps; 0: the test's thread does */
  int rounds;        /* stream cases: connections made, used and closed this many times in a row */
  int expect_full;   /* stream cases: the slow consumer must have found a ring full (long streams only) */
  int victim;        /* fault cases: the rank that dies (1) or fails (0); -1: none */
  uint64_t fault_at; /* slots per ring after which the victim stops */
} world_t;

/* One ring as the test's "kernel" sees it, and the pump that serves it. */
typedef struct {
  dev_ctrl_t *ctrl;       /* control block (host memory) */
  char *data;             /* DEV_SLOTS slots */
  uint64_t seed;          /* selects the slots' sizes and contents */
  uint64_t count;         /* slots produced (sending) or checked and consumed (receiving) */
  uint64_t full_seen;     /* receiving: times the kernel found the ring full */
  tp_gpu_net_ring_t pump; /* the pump */
} ring_t;

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Bytes of slot i: often full, often tiny, otherwise anything from 1 to DEV_SLOT_BYTES. */
static uint64_t slot_size(uint64_t seed, uint64_t i) {
  uint64_t z = mix(seed * 31 + i);
  switch (z & 3) {
  case 0:
    return DEV_SLOT_BYTES;
  case 1:
    return 1 + (z >> 8) % 64;
  default:
    return 1 + (z >> 8) % DEV_SLOT_BYTES;
  }
}

static void slot_fill(uint64_t seed, uint64_t i, char *dst, uint64_t bytes) {
  for (uint64_t w = 0; w * 8 < bytes; w++) {
    uint64_t v = mix(seed ^ (i << 20) ^ w);
    memcpy(dst + w * 8, &v, bytes - w * 8 < 8 ? bytes - w * 8 : 8);
  }
}

static uint64_t load_acquire(const volatile uint64_t *p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void store_release(volatile uint64_t *p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
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

static void make_world(world_t *w, int nrings, uint64_t nslots, int use_proxy) {
  memset(w, 0, sizeof *w);
  w->nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ ((uint64_t)(time_now() * 1e6) << 16);
  w->nrings = nrings;
  w->nslots = nslots;
  w->use_proxy = use_proxy;
  w->rounds = 1;
  w->victim = -1;
  EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, w->fd) == 0);
}

/* This rank's transport context (two ranks, both on "host 42", host backend: only net is used). */
static tp_ctx_t *rank_ctx(const world_t *w, int rank, const volatile int *abort_flag) {
  tp_peer_t peers[2];
  for (int r = 0; r < 2; r++) peers[r] = (tp_peer_t){.host_hash = 42, .pid = (int32_t)getpid(), .dev = -1};
  tp_config_t cfg = {.rank = rank,
                     .nranks = 2,
                     .nonce = w->nonce,
                     .peers = peers,
                     .abort_flag = abort_flag,
                     .ring_bytes = 64 * 1024};
  tp_ctx_t *ctx = NULL;
  EXPECT_OK(tp_init(&cfg, &ctx));
  return ctx;
}

/* Opens w->nrings net connections each way with the other rank. */
static void open_nets(const world_t *w, tp_ctx_t *ctx, int rank, tp_conn_t **sends, tp_conn_t **recvs) {
  char blobs[MAX_RINGS][TP_BLOB_BYTES] = {{0}}, theirs[MAX_RINGS][TP_BLOB_BYTES];
  int peer = 1 - rank, n = w->nrings;
  for (int i = 0; i < n; i++) EXPECT_OK(tp_net_msg_listen(ctx, peer, blobs[i], &recvs[i]));
  xwrite(w->fd[rank], blobs, sizeof blobs[0] * (size_t)n);
  xread(w->fd[rank], theirs, sizeof theirs[0] * (size_t)n);
  for (int i = 0; i < n; i++) EXPECT_OK(tp_net_msg_connect(ctx, peer, theirs[i], &sends[i]));
  for (int i = 0; i < n; i++) EXPECT_OK(tp_net_ops.accept(ctx, recvs[i]));
}

static void ring_make(ring_t *r, tp_conn_t *net, int index, int rank, uint64_t seed,
                      const volatile int *abort_flag) {
  void *mem = NULL;
  EXPECT(posix_memalign(&mem, 128, DEV_RING_BYTES) == 0);
  memset(mem, 0, DEV_RING_BYTES);
  *r = (ring_t){.ctrl = mem, .data = (char *)mem + sizeof(dev_ctrl_t), .seed = seed};
  tp_gpu_net_ring_init(&r->pump, r->ctrl, r->data, ring_data_type, net, index, rank, abort_flag);
}

/* The sending kernel: produces the next slot when the ring has room. */
static int produce(ring_t *r, uint64_t limit) {
  uint64_t head = load_acquire(&r->ctrl->head);
  EXPECT(head <= r->count, "head %llu passed tail %llu", (unsigned long long)head,
         (unsigned long long)r->count);
  if (r->count == limit || r->count - head == DEV_SLOTS) return 0;
  uint64_t bytes = slot_size(r->seed, r->count);
  slot_fill(r->seed, r->count, r->data + (r->count % DEV_SLOTS) * DEV_SLOT_BYTES, bytes);
  r->ctrl->sizes[r->count % DEV_SLOTS] = bytes;
  store_release(&r->ctrl->tail, ++r->count);
  return 1;
}

/* The receiving kernel: checks and consumes the next slot, if one arrived. */
static int consume(ring_t *r, char *scratch) {
  uint64_t tail = load_acquire(&r->ctrl->tail);
  EXPECT(tail - r->count <= DEV_SLOTS, "tail %llu is more than a ring ahead of head %llu",
         (unsigned long long)tail, (unsigned long long)r->count);
  r->full_seen += tail - r->count == DEV_SLOTS;
  if (tail == r->count) return 0;
  uint64_t bytes = slot_size(r->seed, r->count), got = r->ctrl->sizes[r->count % DEV_SLOTS];
  EXPECT(got == bytes, "slot %llu has %llu bytes, expected %llu", (unsigned long long)r->count,
         (unsigned long long)got, (unsigned long long)bytes);
  slot_fill(r->seed, r->count, scratch, bytes);
  EXPECT(memcmp(scratch, r->data + (r->count % DEV_SLOTS) * DEV_SLOT_BYTES, bytes) == 0,
         "slot %llu of ring seed %llx differs", (unsigned long long)r->count, (unsigned long long)r->seed);
  store_release(&r->ctrl->head, ++r->count);
  return 1;
}

static uint64_t ring_seed(int from, int index) {
  return 0x5eed0000ull + (uint64_t)from * 100 + (uint64_t)index;
}

/* Pumps every ring once on this thread (when the proxy does not). */
static ncclResult_t pump_all(ring_t *rings, int n, int *progress_p) {
  for (int i = 0; i < n; i++) {
    ncclResult_t res = tp_gpu_net_pump(&rings[i].pump, progress_p);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

/* Runs both kernels until `limit` slots went each way on every ring, or a pump fails (returned). The
 * consumer is slow: it takes a slot on one round in four and pauses now and then. */
static ncclResult_t run_kernels(const world_t *w, ring_t *send, ring_t *recv, uint64_t limit, char *scratch) {
  uint64_t rng = 0x12345ull + (uint64_t)getpid(), idle = 0;
  double last = time_now();
  for (;;) {
    int progress = 0, busy = 0;
    for (int i = 0; i < w->nrings; i++) {
      progress |= produce(&send[i], limit);
      busy |= load_acquire(&send[i].ctrl->head) < limit;
      rng = mix(rng);
      if ((rng & 3) == 0) progress |= consume(&recv[i], scratch);
      busy |= recv[i].count < w->nslots;
    }
    if (!w->use_proxy) {
      ncclResult_t res = pump_all(send, w->nrings, &progress);
      if (res == ncclSuccess) res = pump_all(recv, w->nrings, &progress);
      if (res != ncclSuccess) return res;
    }
    if (!busy) return ncclSuccess;
    if ((rng & 0xff00) == 0) time_sleep_us(200);
    if (progress) {
      last = time_now();
      idle = 0;
    }
    EXPECT(time_now() - last < 20, "no progress for 20 s");
    time_backoff(idle++);
  }
}

/* Test-thread pumping after the kernels are done: sending rings say goodbye, receiving rings hear it. */
static void close_direct(const world_t *w, ring_t *send, ring_t *recv) {
  for (int i = 0; i < w->nrings; i++) send[i].pump.closing = 1;
  double start = time_now();
  for (;;) {
    int progress = 0, done = 1;
    EXPECT_OK(pump_all(send, w->nrings, &progress));
    EXPECT_OK(pump_all(recv, w->nrings, &progress));
    for (int i = 0; i < w->nrings; i++) done &= tp_gpu_net_drained(&send[i].pump) && recv[i].pump.closed;
    if (done) return;
    EXPECT(time_now() - start < 10, "goodbyes not through after 10 s");
    time_sleep_us(100);
  }
}

/* One round of a stream case: connects, streams w->nslots slots each way on every ring, closes. */
static void stream_round(const world_t *w, int rank) {
  tp_ctx_t *ctx = rank_ctx(w, rank, NULL);
  tp_conn_t *sn[MAX_RINGS], *rn[MAX_RINGS];
  ring_t send[MAX_RINGS], recv[MAX_RINGS];
  open_nets(w, ctx, rank, sn, rn);
  for (int i = 0; i < w->nrings; i++) {
    ring_make(&send[i], sn[i], i, rank, ring_seed(rank, i), NULL);
    ring_make(&recv[i], rn[i], i, rank, ring_seed(1 - rank, i), NULL);
  }
  char *scratch = malloc(DEV_SLOT_BYTES);
  EXPECT(scratch != NULL);
  if (w->use_proxy) {
    for (int i = 0; i < w->nrings; i++) {
      EXPECT_OK(tp_gpu_net_proxy_add(&send[i].pump, 1));
      EXPECT_OK(tp_gpu_net_proxy_add(&recv[i].pump, 1));
    }
  }
  EXPECT_OK(run_kernels(w, send, recv, w->nslots, scratch));
  if (w->use_proxy) {
    /* No barrier with the peer first: the sending rings must drain and say goodbye on their own, and
     * whichever side closes first, neither may report an error. */
    for (int i = 0; i < w->nrings; i++) tp_gpu_net_proxy_remove(&send[i].pump, 1, 10);
    for (int i = 0; i < w->nrings; i++) tp_gpu_net_proxy_remove(&recv[i].pump, 1, 10);
  } else {
    close_direct(w, send, recv);
  }
  uint64_t full = 0;
  for (int i = 0; i < w->nrings; i++) {
    EXPECT(send[i].pump.broken == ncclSuccess && recv[i].pump.broken == ncclSuccess, "ring %d broke", i);
    EXPECT(recv[i].count == w->nslots, "ring %d: %llu slots", i, (unsigned long long)recv[i].count);
    full += recv[i].full_seen;
  }
  EXPECT(full > 0 || !w->expect_full, "the slow consumer never found a ring full");
  EXPECT(log_last_error()[0] == '\0', "an error was reported: %s", log_last_error());
  for (int i = 0; i < w->nrings; i++) {
    sn[i]->ops->close(sn[i]);
    rn[i]->ops->close(rn[i]);
    free(send[i].ctrl);
    free(recv[i].ctrl);
  }
  free(scratch);
  tp_destroy(ctx);
}

static void stream_rank(int rank, int nranks, void *arg) {
  const world_t *w = arg;
  for (int i = 0; i < w->rounds; i++) stream_round(w, rank);
}

static void test_stream_direct(void) {
  world_t w;
  make_world(&w, 3, 1000, 0);
  w.expect_full = 1;
  EXPECT(run_ranks(2, 60, stream_rank, &w) == 0);
}

static void test_stream_proxy(void) {
  world_t w;
  make_world(&w, 4, 1000, 1);
  w.expect_full = 1;
  EXPECT(run_ranks(2, 60, stream_rank, &w) == 0);
}

/* Over a stand-in plugin (tests/net/plugins) and with its faults (BRAID_FAKE_NET). */
static void stream_over(const char *plugin, const char *net, const char *faults) {
  setenv("NCCL_NET_PLUGIN", plugin, 1);
  setenv("NCCL_NET", net, 1);
  setenv("BRAID_FAKE_NET", faults, 1);
  param_reload();
  world_t w;
  make_world(&w, 2, 300, 1);
  EXPECT(run_ranks(2, 60, stream_rank, &w) == 0);
}

/* v6: 8 requests per connection, so 4 slots under way per ring. */
static void test_stream_v6(void) {
  stream_over(BRAID_NET_PLUGIN_DIR "/libnccl-net-v6.so", "StandinV6", "");
}

static void test_stream_misbehaving(void) {
  stream_over(BRAID_NET_PLUGIN_DIR "/libnccl-net-fake.so", "Fake", "partial,sizes_unset,slow_accept");
}

/* Slots in "GPU memory": registered as such, and every received slot flushed before it is published. */
static void flush_rank(int rank, int nranks, void *arg) {
  stream_rank(rank, nranks, arg);
  void *dl = dlopen(BRAID_NET_PLUGIN_DIR "/libnccl-net-fake.so", RTLD_NOW | RTLD_NOLOAD);
  EXPECT(dl != NULL, "the plugin is not loaded");
  _Atomic int *flushes = dlsym(dl, "fake_net_flushes");
  EXPECT(flushes != NULL && *flushes >= 2 * 300, "%d flushes for 600 slots received",
         flushes ? *flushes : -1);
}

static void test_stream_gpu_memory(void) {
  setenv("NCCL_NET_PLUGIN", BRAID_NET_PLUGIN_DIR "/libnccl-net-fake.so", 1);
  setenv("NCCL_NET", "Fake", 1);
  setenv("BRAID_FAKE_NET", "cuda", 1);
  param_reload();
  ring_data_type = NCCL_PTR_CUDA;
  world_t w;
  make_world(&w, 2, 300, 1);
  EXPECT(run_ranks(2, 60, flush_rank, &w) == 0);
}

/* One ring each way, several short rounds: the proxy thread ends with the last ring and starts again. */
static void test_proxy_restarts(void) {
  world_t w;
  make_world(&w, 1, 40, 1);
  w.rounds = 5;
  EXPECT(run_ranks(2, 60, stream_rank, &w) == 0);
}

/* Rank 1 sends to rank 0 and stops after w->fault_at slots: killed (victim 1) or rank 0 fails its
 * connections (victim 0). The survivor's pump must report the broken ring within 3 seconds. */
static void fault_rank(int rank, int nranks, void *arg) {
  const world_t *w = arg;
  tp_ctx_t *ctx = rank_ctx(w, rank, NULL);
  tp_conn_t *sn[MAX_RINGS], *rn[MAX_RINGS];
  ring_t send[MAX_RINGS], recv[MAX_RINGS];
  open_nets(w, ctx, rank, sn, rn);
  for (int i = 0; i < w->nrings; i++) {
    ring_make(&send[i], sn[i], i, rank, ring_seed(rank, i), NULL);
    ring_make(&recv[i], rn[i], i, rank, ring_seed(1 - rank, i), NULL);
  }
  char *scratch = malloc(DEV_SLOT_BYTES);
  EXPECT(scratch != NULL);
  /* Both ranks move fault_at slots each way first. */
  world_t part = *w;
  part.nslots = w->fault_at;
  EXPECT_OK(run_kernels(&part, send, recv, w->fault_at, scratch));
  char byte = 0;
  xwrite(w->fd[rank], &byte, 1);
  xread(w->fd[rank], &byte, 1);
  if (rank == w->victim) {
    if (rank == 1) raise(SIGKILL);
    for (int i = 0; i < w->nrings; i++) rn[i]->ops->fail(rn[i]);
    xread(w->fd[rank], &byte, 1);
    _exit(0);
  }
  /* The survivor: rank 0 only waits for more slots from a dead sender, rank 1 only sends to a failed
   * receiver (rank 0 produces no more). */
  double start = time_now();
  ncclResult_t res = run_kernels(w, send, recv, rank == 0 ? w->fault_at : w->nslots, scratch);
  EXPECT_RES(res, ncclRemoteError);
  EXPECT(time_now() - start < 3, "the error came after %.1f s", time_now() - start);
  const char *want = rank == 0 ? "to rank 0: the stream ended without a goodbye" : "from rank 1 to rank 0";
  EXPECT(strstr(log_last_error(), want) != NULL, "message '%s'", log_last_error());
  if (rank == 1) xwrite(w->fd[rank], &byte, 1);
  _exit(0);
}

static void test_sender_killed(void) {
  world_t w;
  make_world(&w, 2, 1000, 0);
  w.victim = 1;
  w.fault_at = 40;
  EXPECT(run_ranks_mask(2, 30, fault_rank, &w) == 2u);
}

static void test_receiver_fails(void) {
  world_t w;
  make_world(&w, 2, 1000, 0);
  w.victim = 0;
  w.fault_at = 40;
  EXPECT(run_ranks(2, 30, fault_rank, &w) == 0);
}

/* Two contexts of this process stand for ranks 0 and 1; one net connection from 0 to 1. */
typedef struct {
  tp_ctx_t *ctx[2];
  tp_conn_t *send, *recv;
  volatile int abort_flag;
} loop_t;

static void loop_open(loop_t *l) {
  world_t w;
  make_world(&w, 1, 0, 0);
  memset(l, 0, sizeof *l);
  for (int r = 0; r < 2; r++) l->ctx[r] = rank_ctx(&w, r, &l->abort_flag);
  char blob[TP_BLOB_BYTES];
  EXPECT_OK(tp_net_msg_listen(l->ctx[1], 0, blob, &l->recv));
  EXPECT_OK(tp_net_msg_connect(l->ctx[0], 1, blob, &l->send));
  EXPECT_OK(tp_net_ops.accept(l->ctx[1], l->recv));
}

static void loop_close(loop_t *l) {
  l->send->ops->close(l->send);
  l->recv->ops->close(l->recv);
  tp_destroy(l->ctx[0]);
  tp_destroy(l->ctx[1]);
}

/* A kernel that publishes a slot larger than a slot stops its ring with an error naming it. */
static void test_bad_slot_size(void) {
  loop_t l;
  loop_open(&l);
  ring_t s;
  ring_make(&s, l.send, 2, 0, 1, NULL);
  s.ctrl->sizes[0] = DEV_SLOT_BYTES + 1;
  store_release(&s.ctrl->tail, 1);
  int progress = 0;
  ncclResult_t res;
  double start = time_now(); /* the connection comes up in the background first */
  while ((res = tp_gpu_net_pump(&s.pump, &progress)) == ncclSuccess && time_now() - start < 5)
    time_sleep_us(1000);
  EXPECT_RES(res, ncclInternalError);
  EXPECT(strstr(log_last_error(), "ring 2 from rank 0 to rank 1") != NULL, "message '%s'", log_last_error());
  EXPECT_RES(tp_gpu_net_pump(&s.pump, &progress), ncclInternalError);
  EXPECT(s.ctrl->head == 0, "the bad slot was released");
  free(s.ctrl);
  loop_close(&l);
}

/* The proxy leaves the rings of an aborting communicator alone, and moves them again once the flag clears
 * (a test-only way to see that it polls the flag). */
static void test_proxy_abort(void) {
  loop_t l;
  loop_open(&l);
  ring_t s, r;
  ring_make(&s, l.send, 0, 0, 7, &l.abort_flag);
  ring_make(&r, l.recv, 0, 1, 7, &l.abort_flag);
  l.abort_flag = 1;
  EXPECT_OK(tp_gpu_net_proxy_add(&s.pump, 1));
  EXPECT_OK(tp_gpu_net_proxy_add(&r.pump, 1));
  EXPECT(produce(&s, 1) == 1);
  time_sleep_us(100000);
  EXPECT(load_acquire(&s.ctrl->head) == 0 && load_acquire(&r.ctrl->tail) == 0, "an aborted ring moved");
  l.abort_flag = 0;
  double start = time_now();
  while (load_acquire(&r.ctrl->tail) == 0) EXPECT(time_now() - start < 5, "the ring did not move again");
  char *scratch = malloc(DEV_SLOT_BYTES);
  EXPECT(scratch != NULL && consume(&r, scratch) == 1);
  tp_gpu_net_proxy_remove(&s.pump, 1, 5);
  tp_gpu_net_proxy_remove(&r.pump, 1, 5);
  EXPECT(s.pump.closed, "the sending ring did not say goodbye");
  free(scratch);
  free(s.ctrl);
  free(r.ctrl);
  loop_close(&l);
}

/* The GPU transport towards a peer follows the host and the knobs; p2p also needs the devices to map each
 * other's memory, which this machine may or may not allow. */
static void test_select_gpu(void) {
  tp_peer_t peers[2] = {{.host_hash = 42, .pid = 1, .dev = 0}, {.host_hash = 42, .pid = 2, .dev = 1}};
  tp_config_t cfg = {.rank = 0, .nranks = 2, .nonce = 1, .peers = peers, .nch = 2};
  tp_ctx_t *ctx;
  EXPECT_OK(tp_init(&cfg, &ctx));
  const tp_ops_t *ops = tp_select(ctx, 1);
  EXPECT(ops == &tp_p2p_ops || ops == &tp_gpu_shm_ops, "same host: %s", ops->name);
  setenv("NCCL_P2P_DISABLE", "1", 1);
  param_reload();
  EXPECT(tp_select(ctx, 1) == &tp_gpu_shm_ops, "NCCL_P2P_DISABLE=1: %s", tp_select(ctx, 1)->name);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  param_reload();
  EXPECT(tp_select(ctx, 1) == &tp_gpu_net_ops, "both disabled: %s", tp_select(ctx, 1)->name);
  tp_destroy(ctx);
  unsetenv("NCCL_P2P_DISABLE");
  unsetenv("NCCL_SHM_DISABLE");
  param_reload();
  peers[1].host_hash = 43;
  EXPECT_OK(tp_init(&cfg, &ctx));
  EXPECT(tp_select(ctx, 1) == &tp_gpu_net_ops, "another host: %s", tp_select(ctx, 1)->name);
  tp_destroy(ctx);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  test_filter(argc - 1, argv + 1);
  TEST(test_select_gpu, 10);
  TEST(test_bad_slot_size, 10);
  TEST(test_proxy_abort, 20);
  TEST(test_stream_direct, 90);
  TEST(test_stream_proxy, 90);
  TEST(test_stream_v6, 90);
  TEST(test_stream_misbehaving, 90);
  TEST(test_stream_gpu_memory, 90);
  TEST(test_proxy_restarts, 90);
  TEST(test_sender_killed, 60);
  TEST(test_receiver_fails, 60);
  return test_summary();
}
