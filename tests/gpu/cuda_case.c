/*
 * What the GPU tests share (see cuda_case.h).
 */
#include "cuda_case.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "data.h"
#include "harness.h"

int cuda_host;
int cuda_nranks = 2;
int cuda_ndevs;
size_t cuda_count_arg;
const char *cuda_match;
static int n_threads = 1;

/* Poisoned bytes after every buffer, checked after each call. */
#define GUARD 256
/* Poison of output buffers, different on each rank so that bytes a peer wrote past its own end are told
 * apart; no expected value of any type is made of these bytes (inputs are small integers). Bytes around an
 * input buffer get yet another pattern. */
#define OUTPUT_POISON(rank) (0x70 + (rank))
#define INPUT_PAD           0xa5
/* Seconds the other ranks get to report their own view once one rank failed. */
#define GRACE_S 5

void cuda_ok(cudaError_t err, const char *call, const char *file, int line) {
  if (err != cudaSuccess)
    test_fail(file, line, "%s: %s (%s)", call, cudaGetErrorName(err), cudaGetErrorString(err));
}

void cuda_nccl_ok(ncclResult_t res, const char *call, const char *what, ncclComm_t comm, const char *file,
                  int line) {
  if (res != ncclSuccess)
    test_fail(file, line, "%s: %s returned %s (%s)", what, call, ncclGetErrorString(res),
              ncclGetLastError(comm));
}

/* ---- Options and the skip ---- */

/* The number of usable devices, asked in a child process so that this one never creates a CUDA context. */
static int probe_devices(void) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      printf("cudaGetDeviceCount: %s (%s)\n", cudaGetErrorName(err), cudaGetErrorString(err));
      count = 0;
    }
    fflush(stdout);
    _exit(count > 100 ? 100 : count);
  }
  int status;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
    fprintf(stderr, "FAIL: the CUDA device probe did not exit normally\n");
    exit(1);
  }
  return WEXITSTATUS(status);
}

static void usage(const char *prog) {
  fprintf(stderr, "usage: %s [--host] [--gpus N] [--devices D] [--count N] [--match TEXT] [case...]\n", prog);
  exit(2);
}

void cuda_init(int argc, char **argv) {
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--host") == 0)
      cuda_host = 1;
    else if (strcmp(argv[i], "--gpus") == 0 && i + 1 < argc)
      cuda_nranks = atoi(argv[++i]);
    else if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc)
      cuda_ndevs = atoi(argv[++i]);
    else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
      cuda_count_arg = strtoull(argv[++i], NULL, 0);
    else if (strcmp(argv[i], "--match") == 0 && i + 1 < argc)
      cuda_match = argv[++i];
    else
      usage(argv[0]);
  }
  if (cuda_ndevs == 0) cuda_ndevs = cuda_nranks;
  if (cuda_nranks < 1 || cuda_nranks > 8 || cuda_ndevs < 1 || cuda_ndevs > cuda_nranks) usage(argv[0]);
  test_filter(argc - i, argv + i);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (cuda_host) {
    setenv("BRAID_DEVICE", "host", 1);
  } else {
    int count = probe_devices();
    if (count < cuda_ndevs) {
      printf("SKIP: %d usable CUDA device(s); this test needs %d\n", count, cuda_ndevs);
      exit(CUDA_SKIP);
    }
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  n_threads = (int)(cpus / cuda_nranks);
  if (n_threads < 1) n_threads = 1;
  if (n_threads > CUDA_MAX_THREADS) n_threads = CUDA_MAX_THREADS;
}

/* ---- Pools and copies ---- */

int cuda_dev_of(int rank) {
  return rank % cuda_ndevs;
}

ncclResult_t cuda_comm_init_all(ncclComm_t *comms, int n) {
  if (cuda_ndevs >= n) {
    int devs[8];
    for (int i = 0; i < n; i++) devs[i] = i;
    return ncclCommInitAll(comms, n, devs);
  }
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) return res;
  ncclGroupStart();
  for (int i = 0; i < n && res == ncclSuccess; i++) {
    if (!cuda_host) CUDA_OK(cudaSetDevice(cuda_dev_of(i)));
    res = ncclCommInitRank(&comms[i], n, id, i);
  }
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

void cuda_rank_open(cuda_rank_t *r, int rank, size_t dcap, size_t hcap, void *dbase) {
  memset(r, 0, sizeof *r);
  const int dev = cuda_dev_of(rank);
  r->dev = dev;
  r->dcap = dcap;
  r->hcap = hcap;
  r->dbase = dbase;
  r->dbase_owned = dbase == NULL;
  if (cuda_host) {
    if (r->dbase == NULL) r->dbase = malloc(dcap);
    r->hbase = malloc(hcap);
    EXPECT(r->dbase != NULL && r->hbase != NULL, "out of host memory for pools of %zu and %zu bytes", dcap,
           hcap);
    return;
  }
  CUDA_OK(cudaSetDevice(dev));
  /* Non-blocking: the legacy default stream must not order anything here; every copy below names the
   * rank's stream, so the stream's own order is the only one the tests rely on. */
  CUDA_OK(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
  if (r->dbase == NULL) CUDA_OK(cudaMalloc((void **)&r->dbase, dcap));
  CUDA_OK(cudaMallocHost((void **)&r->hbase, hcap));
}

void cuda_rank_close(cuda_rank_t *r) {
  if (cuda_host) {
    if (r->dbase_owned) free(r->dbase);
    free(r->hbase);
    return;
  }
  CUDA_OK(cudaSetDevice(r->dev));
  CUDA_OK(cudaStreamSynchronize(r->stream));
  CUDA_OK(cudaStreamDestroy(r->stream));
  if (r->dbase_owned) CUDA_OK(cudaFree(r->dbase));
  CUDA_OK(cudaFreeHost(r->hbase));
}

static void *pool_take(char *base, size_t cap, size_t *used, size_t bytes, const char *which) {
  size_t at = (*used + 255) & ~(size_t)255;
  if (at + bytes > cap)
    test_fail(__FILE__, __LINE__, "the %s pool of %zu bytes is too small for %zu more bytes (%zu in use)",
              which, cap, bytes, at);
  *used = at + bytes;
  return base + at;
}

void *cuda_dalloc(cuda_rank_t *r, size_t bytes) {
  return pool_take(r->dbase, r->dcap, &r->dused, bytes, "device");
}

void *cuda_halloc(cuda_rank_t *r, size_t bytes) {
  return pool_take(r->hbase, r->hcap, &r->hused, bytes, "host");
}

void cuda_rank_reset(cuda_rank_t *r) {
  r->dused = r->hused = 0;
}

void cuda_upload(cuda_rank_t *r, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  if (cuda_host) {
    memcpy(dst, src, bytes);
    return;
  }
  CUDA_OK(cudaSetDevice(r->dev)); /* one thread may drive several devices */
  CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, r->stream));
  CUDA_OK(cudaStreamSynchronize(r->stream));
}

void cuda_download(cuda_rank_t *r, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  if (cuda_host) {
    memcpy(dst, src, bytes);
    return;
  }
  CUDA_OK(cudaSetDevice(r->dev));
  CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, r->stream));
  CUDA_OK(cudaStreamSynchronize(r->stream));
}

void cuda_fill(cuda_rank_t *r, void *dst, int byte, size_t bytes) {
  if (bytes == 0) return;
  if (cuda_host) {
    memset(dst, byte, bytes);
    return;
  }
  CUDA_OK(cudaSetDevice(r->dev));
  CUDA_OK(cudaMemsetAsync(dst, byte, bytes, r->stream));
  CUDA_OK(cudaStreamSynchronize(r->stream));
}

void cuda_sync(cudaStream_t stream, const char *what) {
  if (cuda_host) return;
  cudaError_t err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess)
    test_fail(__FILE__, __LINE__, "%s: cudaStreamSynchronize: %s (%s)", what, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

int cuda_stream_done(cudaStream_t stream) {
  if (cuda_host) return 1;
  cudaError_t err = cudaStreamQuery(stream);
  if (err == cudaErrorNotReady) return 0;
  CUDA_OK(err);
  return 1;
}

/* ---- Rank processes ---- */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void read_full(int fd, void *buf, size_t bytes) {
  size_t got = 0;
  while (got < bytes) {
    ssize_t k = read(fd, (char *)buf + got, bytes - got);
    EXPECT(k > 0, "reading the unique id from rank 0: it exited before sending it");
    got += (size_t)k;
  }
}

static void rank_child(int rank, int n, int fds[2],
                       void (*fn)(int rank, int nranks, const ncclUniqueId *id, void *arg), void *arg) {
  ncclUniqueId id;
  if (rank == 0) {
    close(fds[0]);
    EXPECT_OK(ncclGetUniqueId(&id));
    /* One whole id per reader: writes of fewer than PIPE_BUF bytes are never split. */
    for (int i = 1; i < n; i++) EXPECT(write(fds[1], &id, sizeof id) == (ssize_t)sizeof id, "pipe write");
    close(fds[1]);
  } else {
    close(fds[1]);
    read_full(fds[0], &id, sizeof id);
    close(fds[0]);
  }
  if (!cuda_host) CUDA_OK(cudaSetDevice(cuda_dev_of(rank)));
  fn(rank, n, &id, arg);
  fflush(stdout);
  fflush(stderr);
  _exit(0);
}

/* Reaps the ranks; kills the rest GRACE_S after the first failure, or all at the deadline. */
static int wait_ranks(pid_t *pids, int n, int timeout_s) {
  double deadline = now() + timeout_s;
  int left = n, bad = 0;
  while (left > 0) {
    for (int i = 0; i < n; i++) {
      int status;
      if (pids[i] == 0 || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      pids[i] = 0;
      left--;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      if (WIFSIGNALED(status))
        fprintf(stderr, "rank %d killed by signal %d\n", i, WTERMSIG(status));
      else
        fprintf(stderr, "rank %d exited with status %d\n", i, WEXITSTATUS(status));
      if (!bad && now() + GRACE_S < deadline) deadline = now() + GRACE_S;
      bad = 1;
    }
    if (left > 0 && now() > deadline) {
      for (int i = 0; i < n; i++) {
        if (pids[i] == 0) continue;
        fprintf(stderr, "rank %d still running %s: killed\n", i,
                bad ? "after another rank failed" : "at the test's deadline");
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
        pids[i] = 0;
      }
      return 1;
    }
    usleep(2000);
  }
  return bad;
}

int cuda_run_ranks(int nranks, int timeout_s,
                   void (*fn)(int rank, int nranks, const ncclUniqueId *id, void *arg), void *arg) {
  int fds[2];
  pid_t pids[8];
  EXPECT(nranks <= 8, "at most 8 ranks");
  EXPECT(pipe(fds) == 0, "pipe");
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    EXPECT(pids[r] >= 0, "fork");
    if (pids[r] == 0) rank_child(r, nranks, fds, fn, arg);
  }
  close(fds[0]);
  close(fds[1]);
  return wait_ranks(pids, nranks, timeout_s);
}

/* ---- Watchdog ---- */

static char watch_msg[512];
static volatile sig_atomic_t watch_len;

/* Runs in whatever thread the signal lands on: only write and _exit, both async-signal-safe. */
static void on_alarm(int sig) {
  (void)sig;
  ssize_t k = write(2, watch_msg, (size_t)watch_len);
  (void)k;
  _exit(1);
}

void cuda_watch(const char *what, int seconds) {
  static int installed;
  alarm(0); /* the message is rewritten below: no alarm may be pending while it is */
  if (!installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    installed = 1;
  }
  int len = snprintf(watch_msg, sizeof watch_msg, "FAIL [pid %d]: timed out after %d s: %s\n", (int)getpid(),
                     seconds, what);
  watch_len = len < (int)sizeof watch_msg ? len : (int)sizeof watch_msg - 1;
  alarm((unsigned)seconds);
}

void cuda_unwatch(void) {
  alarm(0);
}

/* ---- Threads for large buffers ---- */

typedef struct {
  size_t lo, hi;
  void (*fn)(size_t lo, size_t hi, void *arg, int slot);
  void *arg;
  int slot;
} slice_t;

static void *slice_main(void *p) {
  slice_t *s = p;
  s->fn(s->lo, s->hi, s->arg, s->slot);
  return NULL;
}

void cuda_par_for(size_t n, void (*fn)(size_t lo, size_t hi, void *arg, int slot), void *arg) {
  int t = n < ((size_t)1 << 17) ? 1 : n_threads;
  if (t <= 1) {
    fn(0, n, arg, 0);
    return;
  }
  pthread_t th[CUDA_MAX_THREADS];
  slice_t sl[CUDA_MAX_THREADS];
  for (int i = 0; i < t; i++) {
    sl[i] = (slice_t){n * i / t, n * (i + 1) / t, fn, arg, i};
    if (i > 0) EXPECT(pthread_create(&th[i], NULL, slice_main, &sl[i]) == 0, "pthread_create");
  }
  slice_main(&sl[0]);
  for (int i = 1; i < t; i++) pthread_join(th[i], NULL);
}

/* ---- One collective case ---- */

typedef struct {
  const coll_case_t *c;
  int rank;
  char *dst;
} fill_t;

static void fill_slice(size_t lo, size_t hi, void *arg, int slot) {
  fill_t *f = arg;
  for (size_t j = lo; j < hi; j++) data_set(f->dst, j, f->c->type, coll_input(f->c, f->rank, j));
}

static void describe(char *buf, size_t len, const coll_case_t *c, int n, int rank, const char *mode) {
  char what[256];
  coll_describe(c, n, rank, what, sizeof what);
  snprintf(buf, len, "[%s] %s", mode, what);
}

void cuda_case_prepare(cuda_case_t *k, ncclComm_t comm, cuda_rank_t *r, const coll_case_t *c,
                       const char *mode) {
  memset(k, 0, sizeof *k);
  k->c = *c;
  k->mode = mode;
  k->comm = comm;
  k->r = r;
  EXPECT_OK(ncclCommCount(comm, &k->nranks));
  EXPECT_OK(ncclCommUserRank(comm, &k->rank));
  describe(k->what, sizeof k->what, c, k->nranks, k->rank, mode);
  k->lay = coll_layout(c, k->nranks, k->rank);
  k->es = data_esize(c->type);
  int inplace = coll_inplace(c);
  size_t elems[2] = {k->lay.send_elems, k->lay.recv_elems};
  k->nregions = inplace ? 1 : 2;
  if (inplace) elems[0] = k->lay.recv_inside_send ? k->lay.send_elems : k->lay.recv_elems;
  for (int i = 0; i < k->nregions; i++) {
    k->region_bytes[i] = (size_t)c->offset + elems[i] * k->es + GUARD;
    k->dregion[i] = cuda_dalloc(r, k->region_bytes[i]);
    k->himage[i] = cuda_halloc(r, k->region_bytes[i]);
    /* The input's surroundings get another pattern than the output's, so that a call that reads past its
     * input and writes what it read past its output is caught too. */
    memset(k->himage[i], i == 0 && !inplace ? INPUT_PAD : OUTPUT_POISON(k->rank), k->region_bytes[i]);
  }
  size_t off = (size_t)c->offset, at = k->lay.at * k->es;
  size_t send_at = off; /* where the input starts in region 0 */
  if (!inplace) {
    k->send = k->dregion[0] + off;
    k->recv = k->dregion[1] + off;
  } else if (k->lay.recv_inside_send) {
    k->send = k->dregion[0] + off;
    k->recv = (char *)k->send + at;
  } else {
    k->recv = k->dregion[0] + off;
    k->send = (char *)k->recv + at;
    send_at = off + at;
  }
  fill_t f = {c, k->rank, k->himage[0] + send_at};
  cuda_par_for(k->lay.send_elems, fill_slice, &f);
  for (int i = 0; i < k->nregions; i++) cuda_upload(r, k->dregion[i], k->himage[i], k->region_bytes[i]);
  int device_scalar = coll_reduces(c->kind) && c->op == ncclNumOps + 1;
  k->scalar = k->host_scalar;
  if (device_scalar) {
    unsigned char value[8];
    data_set(value, 0, c->type, COLL_PREMUL_SCALAR);
    k->scalar = cuda_dalloc(r, sizeof value);
    cuda_upload(r, k->scalar, value, k->es);
  }
  /* Made before the call rather than inside a caller's group: it is the same either way for the library,
   * and the check below destroys it once the call has completed. */
  k->op = coll_make_op(comm, c, k->scalar, device_scalar, &k->op_created);
}

void cuda_case_launch(cuda_case_t *k) {
  ncclResult_t res = coll_call(k->comm, &k->c, k->send, k->recv, k->op, k->r->stream);
  if (res != ncclSuccess)
    test_fail(__FILE__, __LINE__, "%s: the call returned %s (%s)", k->what, ncclGetErrorString(res),
              ncclGetLastError(k->comm));
}

/* Bytes [lo, hi) of region i must be as uploaded; `base` is where the named buffer starts in the region. */
static void expect_unchanged(const cuda_case_t *k, const char *got, int i, size_t lo, size_t hi, size_t base,
                             const char *buffer) {
  if (hi <= lo || memcmp(got + lo, k->himage[i] + lo, hi - lo) == 0) return;
  size_t b = lo;
  while (got[b] == k->himage[i][b]) b++;
  test_fail(__FILE__, __LINE__,
            "%s: byte %lld relative to the start of the %s buffer was written (0x%02x, uploaded 0x%02x); "
            "the call must leave it alone",
            k->what, (long long)b - (long long)base, buffer, (unsigned char)got[b],
            (unsigned char)k->himage[i][b]);
}

typedef struct {
  const cuda_case_t *k;
  const char *got, *img; /* the output buffer as downloaded and as uploaded */
  size_t nbad[CUDA_MAX_THREADS], first[CUDA_MAX_THREADS];
  double got_v[CUDA_MAX_THREADS], want_v[CUDA_MAX_THREADS];
  int unwritten[CUDA_MAX_THREADS]; /* the first wrong element should not have been written */
} verify_t;

static void verify_slice(size_t lo, size_t hi, void *arg, int slot) {
  verify_t *v = arg;
  const cuda_case_t *k = v->k;
  ncclRedOp_t op = coll_ref_op(&k->c);
  size_t es = k->es;
  v->nbad[slot] = 0;
  for (size_t i = lo; i < hi; i++) {
    double want = coll_expected(&k->c, k->nranks, k->rank, i), got = data_get(v->got, i, k->c.type);
    int unwritten = want != want, ok;
    if (unwritten) {
      ok = memcmp(v->got + i * es, v->img + i * es, es) == 0;
      want = data_get(v->img, i, k->c.type);
    } else {
      ok = data_match(got, want, k->c.type, op, k->nranks);
    }
    if (ok || v->nbad[slot]++ > 0) continue;
    v->first[slot] = i;
    v->got_v[slot] = got;
    v->want_v[slot] = want;
    v->unwritten[slot] = unwritten;
  }
}

void cuda_case_check(cuda_case_t *k) {
  cuda_rank_t *r = k->r;
  cuda_sync(r->stream, k->what);
  char *got[2];
  for (int i = 0; i < k->nregions; i++) {
    got[i] = cuda_halloc(r, k->region_bytes[i]);
    cuda_download(r, got[i], k->dregion[i], k->region_bytes[i]);
  }
  int out = k->nregions - 1;
  size_t roff = (size_t)((char *)k->recv - k->dregion[out]), rbytes = k->lay.recv_elems * k->es;
  expect_unchanged(k, got[out], out, 0, roff, roff, "output");
  expect_unchanged(k, got[out], out, roff + rbytes, k->region_bytes[out], roff, "output");
  if (k->nregions == 2) expect_unchanged(k, got[0], 0, 0, k->region_bytes[0], (size_t)k->c.offset, "input");
  verify_t v = {.k = k, .got = got[out] + roff, .img = k->himage[out] + roff};
  cuda_par_for(k->lay.recv_elems, verify_slice, &v);
  size_t total = 0;
  int first = -1;
  for (int s = 0; s < CUDA_MAX_THREADS; s++) {
    total += v.nbad[s];
    if (v.nbad[s] && (first < 0 || v.first[s] < v.first[first])) first = s;
  }
  if (total > 0)
    test_fail(__FILE__, __LINE__, "%s: %zu of %zu output elements wrong; the first is element %zu: %g, %s %g",
              k->what, total, k->lay.recv_elems, v.first[first], v.got_v[first],
              v.unwritten[first] ? "but it must not be written and held" : "expected", v.want_v[first]);
  if (k->op_created) EXPECT_OK(ncclRedOpDestroy(k->op, k->comm));
}

void cuda_case_run(ncclComm_t comm, cuda_rank_t *r, const coll_case_t *c, const char *mode, int timeout_s) {
  if (cuda_match != NULL) { /* every rank sees the same key, so every rank skips the same cases */
    char key[160];
    coll_key(c, key, sizeof key);
    if (strstr(key, cuda_match) == NULL) return;
  }
  int n, rank;
  EXPECT_OK(ncclCommCount(comm, &n));
  EXPECT_OK(ncclCommUserRank(comm, &rank));
  char what[320];
  describe(what, sizeof what, c, n, rank, mode);
  if (cuda_match != NULL && rank == 0) printf("matched: %s\n", what); /* a --match that names no case shows */
  cuda_watch(what, timeout_s);
  cuda_case_t k;
  cuda_case_prepare(&k, comm, r, c, mode);
  cuda_case_launch(&k);
  cuda_case_check(&k);
  cuda_unwatch();
  cuda_rank_reset(r);
}

void cuda_dealt_env(int on) {
  static const char *const names[] = {"NCCL_ALGO",
                                      "NCCL_PROTO",
                                      "BRAID_DEALT_MIN_BYTES",
                                      "BRAID_AR_SPLIT_BYTES",
                                      "BRAID_CE_MIN_BYTES",
                                      "BRAID_CE_PUSH_MIN_BYTES",
                                      "BRAID_CE_PUSH_EXCHANGE_MIN_BYTES"};
  static const char *const values[] = {"Ring", "Simple", "1", "1", "0", "0", "0"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (on)
      setenv(names[i], values[i], 1);
    else
      unsetenv(names[i]);
}
