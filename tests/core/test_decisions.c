/*
 * Decision equivalence: every launch shape the GPU executor chooses, over a grid of calls, against a table
 * kept in the repository (tests/core/decisions.txt). The calls go through the whole library (API, group,
 * planner, copy-engine agreement, executor) on ranks of one process, one device each, against the stand-in
 * driver in its recording mode (tests/gpu/mock_cuda.h, MOCK_CUDA_RECORD): nothing runs, every launch, copy
 * and stream write is told, so buffers of 4 GiB cost address space only.
 *
 * What a row holds, per rank (ranks with the same record share it): every kernel launch of the call in order
 * with its entry point, grid, threads, steps, lanes, spread, batch cap, split and wave marks, and each
 * transfer's peers (relative to the rank), protocol, channels, lane, dealt mark and planner flags; pair
 * launches with their three transfers and block roles; the copy-engine path's waits, combines (chunks,
 * tile, grid), pushes and copies. Bytes and addresses are left out: they are the planner's, not choices.
 * Records are long and repeat, so a row names each by a hash, and the table ends with every record once.
 *
 * The grid (grid_of): every collective (reductions on uint8 sums, and float max and average where the type
 * or operation changes the choice) at sizes 0 and 2^0 .. 2^32 bytes and odd sizes beside the thresholds, in
 * and out of place, eagerly and captured, on 1-8 ranks linked by p2p, 2-8 by shared memory and 2 by the
 * network; and each knob that shapes a launch at its documented values, one at a time, on 2 ranks (and 4
 * where it matters) over p2p, on the same collectives and sizes. Knobs are read once per process, so each
 * configuration runs in a child process of its own, two at a time.
 *
 * `test_decisions --write FILE` writes the table (after a change that is meant to change decisions); without
 * it the test compares and prints the rows that differ.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"

#ifdef BRAID_MOCK_CUDA_DIR

#include "base/param.h"
#include "device/dev.h"
#include "gpu/gpu.h"
#include "../gpu/mock_cuda.h"

enum { MAX_RANKS = 8, MAX_CONFIGS = 80, RANK_TEXT = 1 << 16 };
#define BIG_BYTES (4ull << 30)

/* One configuration: the environment its child process runs with and the ranks it covers. */
typedef struct {
  const char *name;   /* the knobs, as the rows name them ("-": the defaults) */
  const char *env[4]; /* NAME=VALUE settings */
  const char *link;   /* p2p, shm or net */
  unsigned ranks;     /* bit n: n ranks */
  int sizes_coarse;   /* 1: powers of four and the odd sizes only */
} config_t;

/* The calls of the grid. */
typedef enum {
  C_ALLREDUCE,
  C_BROADCAST,
  C_REDUCE,
  C_ALLGATHER,
  C_REDUCESCATTER,
  C_ALLTOALL,
  C_GATHER,
  C_SCATTER,
  C_SENDRECV, /* every rank sends to the next and receives from the one before */
  C_SEND,     /* even ranks send to the next, odd ones receive: one way */
  C_ALLREDUCE_MAX,
  C_ALLREDUCE_AVG,
  C_REDUCE_AVG,
  C_REDUCESCATTER_AVG,
  C_ALLREDUCE_AGAIN, /* the same all-reduce twice, the second recorded: launched again from memory */
  C_SENDRECV_AGAIN,
  C_COUNT
} coll_t;

static const char *const coll_names[C_COUNT] = {"allreduce",        "broadcast",
                                                "reduce",           "allgather",
                                                "reducescatter",    "alltoall",
                                                "gather",           "scatter",
                                                "sendrecv",         "send",
                                                "allreduce/f32max", "allreduce/f32avg",
                                                "reduce/f32avg",    "reducescatter/f32avg",
                                                "allreduce/again",  "sendrecv/again"};

/* Odd sizes, beside the thresholds the knobs' defaults draw. */
static const uint64_t odd_sizes[] = {3,        1000,     4097,     65537,     100000,   131073,
                                     262145,   524289,   1000000,  1572865,   2097153,  8388609,
                                     16777217, 33554433, 67108865, 268435457, 999999999};

/* ---- Recording ---- */

typedef struct {
  char *text;
  size_t len;
} rank_rec_t;

static rank_rec_t recs[MAX_RANKS];
static int rec_on, rec_nranks;

static void put(int rank, const char *fmt, ...) {
  rank_rec_t *r = &recs[rank];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(r->text + r->len, RANK_TEXT - r->len, fmt, ap);
  va_end(ap);
  if (n > 0) r->len = r->len + (size_t)n < RANK_TEXT ? r->len + (size_t)n : RANK_TEXT - 1;
}

/* A peer relative to the rank: 1 is the next. */
static int rel(int peer, int rank) {
  return (peer - rank + rec_nranks) % rec_nranks;
}

static void put_xfer(int rank, const dev_xfer_t *x) {
  put(rank, " [");
  if (x->send_peer >= 0) put(rank, "s%d", rel(x->send_peer, rank));
  if (x->recv_peer >= 0) put(rank, "r%d", rel(x->recv_peer, rank));
  if (x->send_peer < 0 && x->recv_peer < 0) put(rank, "l");
  const char *proto = !(x->flags & DEV_XF_LL) ? "S" : x->proto == DEV_PROTO_LL128 ? "LL128" : "LL";
  put(rank, " %s%s%s c%u L%u f%x%s]", proto, x->flags & DEV_XF_LL_SEND ? "s" : "",
      x->flags & DEV_XF_LL_RECV ? "r" : "", (unsigned)x->nch, (unsigned)x->lane,
      (unsigned)(x->flags & ~(DEV_XF_LL | DEV_XF_LL_SEND | DEV_XF_LL_RECV)), x->dealt ? " dealt" : "");
}

static void put_work(int rank, const mock_cuda_op_t *op, const char *entry, int small) {
  const dev_work_t *w = op->params;
  const dev_xfer_t *x = w->ext != NULL ? w->ext : w->xfers;
  put(rank, "%s g%u t%u c%u b%d i%d%s%s", entry, op->grid, op->block, (unsigned)w->nch,
      (int)w->comm.batch_pieces, (int)w->comm.interleave, w->comm.split ? " split" : "",
      w->comm.wave_fence ? " wave" : "");
  if (small && w->nxfers > DEV_SMALL_XFERS) put(rank, " OVERFLOW");
  for (int s = 0, i = 0; s < w->nsteps; s++) {
    put(rank, " | l%u:", (unsigned)w->step_lanes[s]);
    for (; i < w->step_end[s]; i++) put_xfer(rank, &x[i]);
  }
}

static void put_pair(int rank, const mock_cuda_op_t *op, const char *entry) {
  const dev_pair_t *p = op->params;
  put(rank, "%s g%u t%u c%u sb%u rb%u fused%u", entry, op->grid, op->block, (unsigned)p->nch,
      (unsigned)p->send_blocks, (unsigned)p->recv_blocks, (unsigned)p->fused);
  if (p->send.nch > 0) put_xfer(rank, &p->send);
  if (p->recv.nch > 0) put_xfer(rank, &p->recv);
  if (p->copy.nch > 0) put_xfer(rank, &p->copy);
}

static void put_launch(int rank, const mock_cuda_op_t *op) {
  const char *k = op->kernel;
  if (strcmp(k, MOCK_CUDA_KERNEL_WAIT) == 0) {
    const dev_wait_t *w = op->params;
    put(rank, "wait%s%s", w->is_send ? " send" : " recv", w->raise != NULL ? " raise" : "");
  } else if (strcmp(k, MOCK_CUDA_KERNEL_COMBINE) == 0) {
    const dev_combine_t *w = op->params;
    put(rank, "combine g%u chunks%u tile%u%s", op->grid, w->nchunks, w->tile, w->from != NULL ? " pull" : "");
  } else if (strcmp(k, MOCK_CUDA_KERNEL_PUSH) == 0) {
    const dev_push_t *w = op->params;
    put(rank, "push g%u copies%u%s%s", op->grid, w->ncopies, w->ready != NULL ? " ready" : "",
        w->done != NULL ? " done" : "");
  } else if (strcmp(k, MOCK_CUDA_KERNEL_PAIR) == 0) {
    put_pair(rank, op, "pair");
  } else if (strcmp(k, MOCK_CUDA_KERNEL_PAIR_AR) == 0) {
    put_pair(rank, op, "pair_ar");
  } else if (strcmp(k, MOCK_CUDA_KERNEL_PAIR_AR128) == 0) {
    put_pair(rank, op, "pair_ar128");
  } else if (strcmp(k, MOCK_CUDA_KERNEL_SMALL) == 0) {
    put_work(rank, op, "small", 1);
  } else if (strcmp(k, MOCK_CUDA_KERNEL_LL) == 0) {
    put_work(rank, op, "ll", 1);
  } else if (strcmp(k, MOCK_CUDA_KERNEL_BULK) == 0) {
    put_work(rank, op, "bulk", 1);
  } else {
    put_work(rank, op, "general", 0);
  }
  if (op->overlap) put(rank, " pdl");
}

static void on_op(const mock_cuda_op_t *op) {
  if (!rec_on || op->dev < 0 || op->dev >= rec_nranks) return;
  if (op->kind == MOCK_OP_EVENT_RECORD || op->kind == MOCK_OP_EVENT_WAIT) return; /* not in the table */
  const int rank = op->dev; /* rank r runs on device r */
  if (recs[rank].len > 0) put(rank, " ; ");
  if (op->kind == MOCK_OP_LAUNCH)
    put_launch(rank, op);
  else if (op->kind == MOCK_OP_COPY)
    put(rank, "copy");
  else
    put(rank, "write%llu", (unsigned long long)op->bytes);
}

/* A symbol of the stand-in driver: the library loads the same one (test_reexec_with_library_dir). */
static void *mock_sym(const char *name) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  void *sym = lib != NULL ? dlsym(lib, name) : NULL;
  EXPECT(sym != NULL, "the loaded libcuda.so.1 is not the stand-in driver (no %s)", name);
  return sym;
}

/* ---- Calls ---- */

typedef struct {
  ncclComm_t comms[MAX_RANKS];
  char *s[MAX_RANKS], *r[MAX_RANKS]; /* BIG_BYTES each, on the rank's device */
  int n;
} world_t;

/* Enqueues rank r's part of call c of `bytes` (as nccl-tests counts them: the whole buffer, all-gather's
 * output, reduce-scatter's input). */
static ncclResult_t call(const world_t *w, coll_t c, uint64_t bytes, int in_place, int r, cudaStream_t st) {
  const int n = w->n;
  ncclComm_t comm = w->comms[r];
  char *s = w->s[r], *d = in_place ? w->s[r] : w->r[r];
  const int f32 = c >= C_ALLREDUCE_MAX && c <= C_REDUCESCATTER_AVG;
  ncclDataType_t t = f32 ? ncclFloat : ncclUint8;
  ncclRedOp_t op = c == C_ALLREDUCE_MAX ? ncclMax : f32 ? ncclAvg : ncclSum;
  const size_t es = f32 ? 4 : 1, count = bytes / es, part = bytes / (uint64_t)n / es;
  switch (c) {
  case C_ALLREDUCE:
  case C_ALLREDUCE_AGAIN:
  case C_ALLREDUCE_MAX:
  case C_ALLREDUCE_AVG:
    return ncclAllReduce(s, d, count, t, op, comm, st);
  case C_BROADCAST:
    return ncclBroadcast(s, d, count, t, 0, comm, st);
  case C_REDUCE:
  case C_REDUCE_AVG:
    return ncclReduce(s, d, count, t, op, 0, comm, st);
  case C_ALLGATHER:
    return ncclAllGather(in_place ? w->r[r] + (size_t)r * part * es : s, w->r[r], part, t, comm, st);
  case C_REDUCESCATTER:
  case C_REDUCESCATTER_AVG:
    return ncclReduceScatter(s, in_place ? s + (size_t)r * part * es : w->r[r], part, t, op, comm, st);
  case C_ALLTOALL:
    return ncclAlltoAll(s, d, part, t, comm, st);
  case C_GATHER:
    return ncclGather(in_place ? w->r[r] + (size_t)r * part * es : s, w->r[r], part, t, 0, comm, st);
  case C_SCATTER:
    return ncclScatter(s, in_place ? s + (size_t)r * part * es : w->r[r], part, t, 0, comm, st);
  case C_SENDRECV:
  case C_SENDRECV_AGAIN: {
    ncclResult_t res = ncclSend(s, count, t, (r + 1) % n, comm, st);
    return res != ncclSuccess ? res : ncclRecv(d, count, t, (r + n - 1) % n, comm, st);
  }
  case C_SEND:
    if (r % 2 == 0 && r + 1 < n) return ncclSend(s, count, t, r + 1, comm, st);
    if (r % 2 == 1) return ncclRecv(d, count, t, r - 1, comm, st);
    return ncclSuccess;
  default:
    return ncclInvalidArgument;
  }
}

/* ---- Rows ---- */

/* FNV-1a, 40 bits, as ten hex digits: a record's name in the rows. */
static void record_id(const char *text, size_t len, char id[11]) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
  snprintf(id, 11, "%010llx", (unsigned long long)(h >> 24));
}

/* Appends ranks [a, b] to a list ("0-3", "0,2"). */
static void put_ranks(char *out, size_t size, int a, int b, int first) {
  size_t len = strlen(out);
  if (a == b)
    snprintf(out + len, size - len, "%s%d", first ? "" : ",", a);
  else
    snprintf(out + len, size - len, "%s%d-%d", first ? "" : ",", a, b);
}

/* The ranks of each distinct record of the call just made, with the record's id ("0-7:1a2b3c4d5e"), into
 * `map`; each record, once per call, to `records` (sorted and deduplicated when the files are joined). */
static void rank_map(FILE *records, int n, char *map, size_t size) {
  int done[MAX_RANKS] = {0};
  map[0] = 0;
  for (int a = 0; a < n; a++) {
    if (done[a]) continue;
    char id[11];
    record_id(recs[a].text, recs[a].len, id);
    int first = 1, run = -1;
    for (int b = a; b <= n; b++) {
      const int same = b < n && !done[b] && recs[b].len == recs[a].len &&
                       memcmp(recs[a].text, recs[b].text, recs[a].len) == 0;
      if (same) {
        done[b] = 1;
        if (run < 0) run = b;
      } else if (run >= 0) {
        put_ranks(map, size, run, b - 1, first);
        first = 0;
        run = -1;
      }
    }
    size_t len = strlen(map);
    snprintf(map + len, size - len, ":%s ", id);
    fprintf(records, "@%s\t%.*s\n", id, (int)recs[a].len, recs[a].text);
  }
  size_t len = strlen(map);
  if (len > 0) map[len - 1] = 0;
}

static void open_world(world_t *w, int n) {
  int devs[MAX_RANKS];
  for (int i = 0; i < n; i++) devs[i] = i;
  w->n = n;
  EXPECT_OK(ncclCommInitAll(w->comms, n, devs));
  for (int i = 0; i < n; i++) {
    gpu_scope_t scope;
    EXPECT_OK(gpu_enter(i, &scope));
    EXPECT_OK(ncclMemAlloc((void **)&w->s[i], BIG_BYTES));
    EXPECT_OK(ncclMemAlloc((void **)&w->r[i], BIG_BYTES));
    gpu_leave(&scope);
  }
}

static void close_world(world_t *w) {
  for (int i = 0; i < w->n; i++) {
    EXPECT_OK(ncclCommDestroy(w->comms[i]));
    EXPECT_OK(ncclMemFree(w->s[i]));
    EXPECT_OK(ncclMemFree(w->r[i]));
  }
}

/* The sizes of a configuration, ascending: 0, powers of two (of four when coarse) and the odd sizes. */
static int sizes_of(const config_t *cfg, uint64_t *out) {
  int k = 0;
  out[k++] = 0;
  for (int e = 0; e <= 32; e += cfg->sizes_coarse ? 2 : 1) out[k++] = 1ull << e;
  for (size_t i = 0; i < sizeof odd_sizes / sizeof *odd_sizes; i++) out[k++] = odd_sizes[i];
  for (int i = 1; i < k; i++) /* ascending, so that a row's range holds the sizes between its ends */
    for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
      uint64_t t = out[j];
      out[j] = out[j - 1];
      out[j - 1] = t;
    }
  return k;
}

/* One group of call c on every rank, recorded. */
static void run_call(const world_t *w, coll_t c, uint64_t bytes, int in_place, int graph,
                     int (*graph_destroy)(void)) {
  cudaStream_t st = graph ? (cudaStream_t)MOCK_CUDA_CAPTURING : NULL;
  const int times = c == C_ALLREDUCE_AGAIN || c == C_SENDRECV_AGAIN ? 2 : 1;
  rec_nranks = w->n;
  for (int k = 0; k < times; k++) {
    for (int r = 0; r < w->n; r++) recs[r].len = 0;
    rec_on = 1;
    EXPECT_OK(ncclGroupStart());
    for (int r = 0; r < w->n; r++) EXPECT_OK(call(w, c, bytes, in_place, r, st));
    EXPECT_OK(ncclGroupEnd());
    rec_on = 0;
    if (graph) graph_destroy();
  }
  for (int r = 0; r < w->n; r++) {
    ncclResult_t async = ncclSuccess;
    EXPECT_OK(ncclCommGetAsyncError(w->comms[r], &async));
    EXPECT(async == ncclSuccess, "rank %d: %s", r, ncclGetErrorString(async));
  }
}

/* Runs one configuration in this (child) process: a line per call to `calls` (its ranks' records by id),
 * and each record to `records`. */
static void run_config(const config_t *cfg, FILE *calls, FILE *records) {
  for (int i = 0; i < 4 && cfg->env[i] != NULL; i++) putenv((char *)cfg->env[i]);
  if (strcmp(cfg->link, "p2p") != 0) setenv("NCCL_P2P_DISABLE", "1", 1);
  if (strcmp(cfg->link, "net") == 0) setenv("NCCL_SHM_DISABLE", "1", 1);
  param_reload();
  mock_cuda_op_fn *hook = mock_sym(MOCK_CUDA_ON_OP);
  *hook = on_op;
  int (*graph_destroy)(void);
  void *sym = mock_sym(MOCK_CUDA_GRAPH_DESTROY);
  memcpy(&graph_destroy, &sym, sizeof sym);
  for (int r = 0; r < MAX_RANKS; r++) recs[r].text = malloc(RANK_TEXT);
  uint64_t sizes[64];
  const int nsizes = sizes_of(cfg, sizes);
  for (int n = 1; n <= MAX_RANKS; n++) {
    if (!(cfg->ranks & (1u << n))) continue;
    world_t w;
    open_world(&w, n);
    for (int graph = 0; graph < 2; graph++)
      for (int ip = 0; ip < 2; ip++) {
        for (int c = 0; c < C_COUNT; c++) {
          if (c == C_SEND && ip) continue; /* one way: nothing is in place */
          for (int k = 0; k < nsizes; k++) {
            run_call(&w, (coll_t)c, sizes[k], ip, graph, graph_destroy);
            char map[512];
            rank_map(records, n, map, sizeof map);
            fprintf(calls, "n%d %s %s\t%s\t%llu\t%s\n", n, graph ? "graph" : "eager",
                    ip ? "in-place" : "out-of-place", coll_names[c], (unsigned long long)sizes[k], map);
          }
        }
      }
    close_world(&w);
  }
  *hook = NULL;
}

/* ---- The grid ---- */

#define RANKS(...) (ranks_mask((int[]){__VA_ARGS__, 0}))
static unsigned ranks_mask(const int *n) {
  unsigned m = 0;
  for (; *n != 0; n++) m |= 1u << *n;
  return m;
}

/* A knob's value on 2 ranks (and 4 with `four`) over p2p. */
#define KNOB(setting, four)                                                                                  \
  (config_t) {                                                                                               \
    setting, {setting}, "p2p", four ? RANKS(2, 4) : RANKS(2), 0                                              \
  }
#define KNOBS2(a, b, four)                                                                                   \
  (config_t) {                                                                                               \
    a " " b, {a, b}, "p2p", four ? RANKS(2, 4) : RANKS(2), 0                                                 \
  }

static int grid_of(config_t *c) {
  int k = 0;
  const unsigned all = RANKS(1, 2, 3, 4, 5, 6, 7, 8);
  c[k++] = (config_t){"-", {NULL}, "p2p", all, 0};
  c[k++] = (config_t){"-", {NULL}, "shm", all & ~2u, 0};
  c[k++] = (config_t){"-", {NULL}, "net", RANKS(2), 1};
  /* algorithms, protocols, channels */
  c[k++] = KNOB("NCCL_ALGO=Ring", 1);
  c[k++] = KNOB("NCCL_ALGO=OneShot", 1);
  c[k++] = KNOB("NCCL_ALGO=allreduce:^OneShot", 0);
  c[k++] = KNOB("BRAID_ONESHOT_MAX_BYTES=0", 1);
  c[k++] = KNOB("BRAID_ONESHOT_MAX_BYTES=1048576", 1);
  c[k++] = KNOB("NCCL_PROTO=Simple", 1);
  c[k++] = KNOB("NCCL_PROTO=LL", 0);
  c[k++] = KNOB("NCCL_PROTO=^LL", 0);
  c[k++] = KNOB("NCCL_PROTO=^LL128", 0);
  c[k++] = KNOB("BRAID_LL_MAX_BYTES=0", 0);
  c[k++] = KNOB("BRAID_LL_MAX_BYTES=1048576", 1);
  c[k++] = KNOB("BRAID_LL_CHANNEL_BYTES=4096", 1);
  c[k++] = KNOB("BRAID_LL128_MIN_BYTES=0", 0);
  c[k++] = KNOB("BRAID_LL128_ONE_WAY_MIN_BYTES=0", 0);
  c[k++] = KNOB("BRAID_LL128_MAX_BYTES=0", 0);
  c[k++] = KNOB("BRAID_CHANNELS=8", 1);
  c[k++] = KNOB("BRAID_CHANNELS=24", 1);
  c[k++] = KNOB("BRAID_CHANNEL_BYTES=131072", 1);
  c[k++] = KNOB("BRAID_WIDE_STEPS=0", 0);
  c[k++] = KNOB("BRAID_WIDE_STEPS=1", 0);
  c[k++] = KNOB("BRAID_WIDE_STEPS=2", 0);
  c[k++] = KNOB("BRAID_SPREAD=0", 1);
  c[k++] = KNOB("BRAID_SPREAD=2", 1);
  c[k++] = KNOB("BRAID_SPREAD=3", 1);
  c[k++] = KNOB("BRAID_BATCH_PIECES=0", 0);
  c[k++] = KNOB("BRAID_BATCH_PIECES=2", 0);
  c[k++] = KNOB("BRAID_LAUNCH_PDL=0", 0);
  c[k++] = KNOB("BRAID_LAUNCH_PDL=1", 0);
  c[k++] = KNOB("BRAID_AR_SPLIT_BYTES=0", 0);
  c[k++] = KNOB("BRAID_DEALT_MIN_BYTES=0", 0);
  c[k++] = KNOB("BRAID_DEALT_MIN_BYTES=8388608", 0);
  /* the copy-engine path */
  c[k++] = KNOB("BRAID_CE_MIN_BYTES=0", 0);
  c[k++] = KNOB("BRAID_CE_MIN_BYTES=16777216", 0);
  c[k++] = KNOB("BRAID_CE_PUSH_MIN_BYTES=0", 0);
  c[k++] = KNOB("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES=0", 0);
  c[k++] = KNOB("BRAID_CE_REDUCE_MIN_BYTES=0", 0);
  c[k++] = KNOB("BRAID_CE_REDUCE_MIN_BYTES=67108864", 0);
  c[k++] = KNOB("BRAID_CE_CHUNK_BYTES=33554432", 0);
  c[k++] = KNOB("BRAID_CE_PULL_MIN_BYTES=0", 0);
  c[k++] = KNOB("BRAID_CE_PULL_MIN_BYTES=1048576", 0);
  c[k++] = KNOBS2("BRAID_CE_COMBINE_BLOCKS=32", "BRAID_CE_PULL_BLOCKS=16", 0);
  c[k++] = KNOB("BRAID_CE_PULL_TILE=16384", 0);
  EXPECT(k <= MAX_CONFIGS, "%d configurations", k);
  return k;
}

/* ---- The table ---- */

/* The defaults' calls over p2p, by "section\tcollective\tsize", for the knobs' sections to compare with. */
enum { BASE_SLOTS = 1 << 16 };
typedef struct {
  char *key, *map;
} base_t;
static base_t base[BASE_SLOTS];

static base_t *base_slot(const char *key) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = key; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  for (size_t i = h % BASE_SLOTS;; i = (i + 1) % BASE_SLOTS)
    if (base[i].key == NULL || strcmp(base[i].key, key) == 0) return &base[i];
}

/* Rows of one configuration: consecutive sizes of a collective whose calls made the same records share a row
 * ("lo..hi"); a section's header comes before its first row. */
typedef struct {
  FILE *out;
  const char *cfg;
  char section[1100], coll[32];
  uint64_t lo, hi;
  char map[512];
  int open, rows;
} rows_t;

static void row_flush(rows_t *r) {
  if (!r->open) return;
  if (r->lo == r->hi)
    fprintf(r->out, "%s\t%llu\t%s\n", r->coll, (unsigned long long)r->lo, r->map);
  else
    fprintf(r->out, "%s\t%llu..%llu\t%s\n", r->coll, (unsigned long long)r->lo, (unsigned long long)r->hi,
            r->map);
  r->open = 0;
}

static void row_add(rows_t *r, const char *section, const char *coll, uint64_t bytes, const char *map) {
  if (r->open && strcmp(r->coll, coll) == 0 && strcmp(r->map, map) == 0) {
    r->hi = bytes;
    return;
  }
  row_flush(r);
  if (strcmp(r->section, section) != 0) {
    snprintf(r->section, sizeof r->section, "%s", section);
    fprintf(r->out, "== %s %s\n", r->cfg, section);
  }
  snprintf(r->coll, sizeof r->coll, "%s", coll);
  snprintf(r->map, sizeof r->map, "%s", map);
  r->lo = r->hi = bytes;
  r->open = 1;
  r->rows++;
}

/* Appends configuration i's calls to the table: every call of the defaults' configurations, and of a knob's
 * only those whose records differ from the defaults' on the same link, ranks and call. */
static void join_config(const config_t *cfg, const char *dir, int i, FILE *out) {
  char path[256], line[1024];
  snprintf(path, sizeof path, "%s/%03d.calls", dir, i);
  FILE *in = fopen(path, "r");
  EXPECT(in != NULL, "no calls of configuration %s %s", cfg->name, cfg->link);
  if (in == NULL) return;
  const int defaults = strcmp(cfg->name, "-") == 0, keep = defaults && strcmp(cfg->link, "p2p") == 0;
  rows_t r = {.out = out, .cfg = cfg->name};
  char section_link[1100];
  while (fgets(line, sizeof line, in) != NULL) {
    line[strcspn(line, "\n")] = 0;
    char *coll = strchr(line, '\t'), *size = coll != NULL ? strchr(coll + 1, '\t') : NULL;
    char *map = size != NULL ? strchr(size + 1, '\t') : NULL;
    if (map == NULL) continue;
    *map++ = 0;
    if (keep) {
      base_t *b = base_slot(line);
      b->key = strdup(line);
      b->map = strdup(map);
    }
    *size++ = 0;
    *coll++ = 0;
    if (!defaults) {
      size[-1] = coll[-1] = '\t';
      const base_t *b = base_slot(line);
      const int same = b->key != NULL && strcmp(b->map, map) == 0;
      size[-1] = coll[-1] = 0;
      if (same) {
        row_flush(&r);
        continue;
      }
    }
    snprintf(section_link, sizeof section_link, "%s %s", cfg->link, line);
    row_add(&r, section_link, coll, strtoull(size, NULL, 10), map);
  }
  row_flush(&r);
  if (r.rows == 0) fprintf(out, "== %s %s: as the defaults\n", cfg->name, cfg->link);
  fclose(in);
}

/* ---- Driver ---- */

/* Runs every configuration, two child processes at a time, each writing its own files under dir; returns
 * how many failed. */
static int run_all(const config_t *cfg, int ncfg, const char *dir) {
  int failed = 0, running = 0;
  for (int i = 0; i <= ncfg; i++) {
    if (running == 2 || (i == ncfg && running > 0)) {
      int status;
      if (wait(&status) > 0) {
        running--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
      }
      if (i == ncfg && running > 0) {
        i--;
        continue;
      }
    }
    if (i == ncfg) break;
    pid_t pid = fork();
    if (pid == 0) {
      char path[256];
      snprintf(path, sizeof path, "%s/%03d.calls", dir, i);
      FILE *calls = fopen(path, "w");
      snprintf(path, sizeof path, "%s/%03d.records", dir, i);
      FILE *records = fopen(path, "w");
      if (calls == NULL || records == NULL) _exit(2);
      run_config(&cfg[i], calls, records);
      fclose(calls);
      fclose(records);
      _exit(test_summary() == 0 ? 0 : 1);
    }
    running++;
  }
  return failed;
}

/* What the table says of itself, at its top. */
static const char header[] =
    "# The GPU executor's decisions over a grid of calls (tests/core/test_decisions.c makes and checks it;\n"
    "# after a change meant to change decisions: test_decisions --write tests/core/decisions.txt).\n"
    "# '== KNOBS LINK nN MODE PLACE' opens a section; each row: collective, bytes (lo..hi: every size of "
    "the\n"
    "# grid between), then the ranks of each record and its id. A knob's sections list only the calls whose\n"
    "# records differ from the defaults' (none: 'as the defaults'). '@ID' lines are the records: each "
    "launch,\n"
    "# copy and stream write of a rank's call in order; in a launch g grid, t threads, c channels per lane,\n"
    "# b batch cap, i spread (lanes of the grid), | l<lanes>: a step, [s<peer>r<peer>|l protocol\n"
    "# (s/r: that side has an LL ring) c<channels> L<lane> f<planner flags> dealt] a transfer, peers\n"
    "# counted from the rank (1: the next); pdl: may overlap the previous kernel.\n";

static const char *tmp_dir;
static const char *write_to;

static void decisions(void) {
  config_t cfg[MAX_CONFIGS];
  const int ncfg = grid_of(cfg);
  EXPECT(run_all(cfg, ncfg, tmp_dir) == 0, "a configuration failed");
  char path[128];
  snprintf(path, sizeof path, "%s/table", tmp_dir);
  FILE *out = fopen(path, "w");
  EXPECT(out != NULL, "cannot write %s", path);
  if (out == NULL) return;
  fputs(header, out);
  for (int i = 0; i < ncfg; i++) join_config(&cfg[i], tmp_dir, i, out);
  fclose(out);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "sort -u %s/*.records >> %s", tmp_dir, path);
  EXPECT(system(cmd) == 0, "could not join the records");
  if (write_to != NULL) {
    snprintf(cmd, sizeof cmd, "cp %s %s", path, write_to);
    EXPECT(system(cmd) == 0, "could not write %s", write_to);
    return;
  }
  /* the first differences: the table's lines ('-'), what the library does now ('+'), under their section */
  snprintf(cmd, sizeof cmd, "diff -U0 -F '^==' %s %s > %s/diff", BRAID_DECISIONS_FILE, path, tmp_dir);
  const int same = system(cmd) == 0;
  if (!same) {
    snprintf(cmd, sizeof cmd, "head -n 80 %s/diff", tmp_dir);
    EXPECT(system(cmd) == 0, "no diff");
  }
  EXPECT(same, "the executor's decisions differ from %s (above: the first differences)",
         BRAID_DECISIONS_FILE);
}

/* The knobs of the environment the test was started in would shape every configuration's calls. */
static void clear_knobs(void) {
  extern char **environ;
  for (int again = 1; again;) {
    again = 0;
    for (char **e = environ; *e != NULL; e++)
      if (strncmp(*e, "BRAID_", 6) == 0 || strncmp(*e, "NCCL_", 5) == 0) {
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
        unsetenv(name);
        again = 1;
        break;
      }
  }
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  clear_knobs();
  setenv("MOCK_CUDA_RECORD", "1", 1);
  setenv("MOCK_CUDA_DEVICES", "8", 1);
  write_to = argc == 3 && strcmp(argv[1], "--write") == 0 ? argv[2] : NULL;
  static char dir[64] = "/tmp/braid-decisions-XXXXXX";
  EXPECT(mkdtemp(dir) != NULL, "no temporary folder");
  tmp_dir = dir;
  TEST(decisions, 300);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return test_summary();
}

#else

int main(void) {
  printf("built without CUDA's headers: no stand-in driver, nothing to test\n");
  return 0;
}

#endif
