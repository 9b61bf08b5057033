/*
 * The collective matrix on GPUs: every collective (and send/recv) x every data type x every operation (sum,
 * prod, max, min, avg, PreMulSum with the scalar on the host and on the device) x in place and out of place x
 * counts 0, 1, 7, 1031 x buffers 0, 1 and 2 elements past an aligned address, then larger counts (12 Ki - 1,
 * 64 Ki + 3, about a million, and 16 Mi + 5 elements, or --count), each checked element by element against
 * references computed on the host, with poisoned outputs and guard bytes (cuda_case.h).
 *
 * Modes, one case each:
 *   procs_*   one process per GPU (ncclCommInitRank); procs_ce with BRAID_CE_MIN_BYTES=4096, so that on two
 *             GPUs the copy engines move every transfer of 4 KiB and more that they can (reductions out of
 *             place too: BRAID_CE_REDUCE_MIN_BYTES=4096, in chunks of 64 KiB and more: BRAID_CE_CHUNK_BYTES,
 *             and the all-reduce's ring as two steps: BRAID_AR_SPLIT_BYTES=4096; a reduce in place pulled:
 *             BRAID_CE_PULL_MIN_BYTES=4096), then the quick tier again with reductions' copy engines from
 *             1 GiB only, so that a reduce out of place is pulled too, and rank 1's buffers one element
 *             further from alignment than rank 0's;
 *   single_*  one process and thread driving every GPU (ncclCommInitAll, one group per case); single_ce with
 *             BRAID_CE_MIN_BYTES=4096, as procs_ce;
 *   *_push    procs_push and single_push: steps that only copy pushed by one kernel from 4 KiB a transfer
 *             (BRAID_CE_PUSH_MIN_BYTES and BRAID_CE_PUSH_EXCHANGE_MIN_BYTES 4096), below the copy engines'
 *             default threshold; procs_push also with the ranks' buffers aligned differently;
 *   *_dealt   procs_dealt and single_dealt: every Simple ring transfer with a peer dealt, from 1 byte
 *             (dealt_env); procs_dealt also with the ranks' buffers aligned differently;
 *   shm_*     one process per GPU with NCCL_P2P_DISABLE=1: host shared memory between the GPUs;
 *   tcp_*     one process per GPU with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: TCP sockets.
 * The transport modes run a quick sweep (every collective, four types, three operations); with --full they
 * run the whole small matrix instead.
 */
#include <stdlib.h>
#include <string.h>

#include "coll_check.h"
#include "cuda_case.h"
#include "data.h"
#include "harness.h"

/* Seconds any one case may take (the 16 Mi cases move and check a few hundred MB on the host). */
#define CASE_TIMEOUT_S 60

static int full_transport_matrix;

/* ---- Sweeps: sets of cases ---- */

#define ALL_KINDS ((1u << K_COUNT) - 1)
#define ALL_TYPES ((1u << ncclNumTypes) - 1)
#define T(x)      (1u << (x))
/* Operation bits: the five built-ins, then PreMulSum with a host scalar (bit 5) and a device scalar (bit 6).
 */
#define N_OPS   (ncclNumOps + 2)
#define ALL_OPS ((1u << N_OPS) - 1)
#define OP_SUM  (1u << ncclSum)

typedef struct {
  size_t counts[4];
  int ncounts;
  unsigned kinds, types, ops; /* bit masks */
  int all_offsets;            /* 1: offsets of 0, 1 and 2 elements each; 0: one of them, by seed */
  int per_buffer; /* 1: counts are per buffer, divided by nranks where a buffer has a block per rank */
} sweep_t;

typedef void (*case_fn_t)(const coll_case_t *c, void *arg);

static int block_per_rank(kind_t k) {
  return k == K_REDUCESCATTER || k == K_ALLGATHER || k == K_ALLTOALL || k == K_GATHER || k == K_SCATTER;
}

static size_t large_count(void) {
  return cuda_count_arg ? cuda_count_arg : ((size_t)16 << 20) + 5;
}

/* Whether the connections have LL rings (GPU peer access; not host memory or sockets): see sweep_one. */
static int ll_rings = 1;

static void sweep_one(const sweep_t *s, const coll_case_t *base, int n, uint64_t *seed, case_fn_t fn,
                      void *arg) {
  int offsets = s->all_offsets ? 3 : 1;
  /* A send/receive in place (into the buffer it sends, as nccl-tests' sendrecv runs it, which does not check
   * the result) is outside NCCL's contract, and Braid's Simple kernels may overwrite bytes before they are
   * sent. Up to LL128's largest transfer by default (BRAID_LL128_MAX_BYTES, one LL128 piece per channel
   * of 40) the pair kernel runs the two fused, every line or unit sent before it is overwritten: those sizes
   * are checked, where the connections have the LL rings the pair kernel needs. Over host memory or sockets
   * every transfer is Simple, and 1 MB in place over TCP came out wrong in about one run of four. */
  const int sr_inplace = ll_rings && base->count * data_esize(base->type) <= 1572864;
  for (int inplace = 0; inplace < (base->kind == K_SENDRECV && !sr_inplace ? 1 : 2); inplace++)
    for (int o = 0; o < offsets; o++) {
      coll_case_t c = *base;
      c.inplace = inplace && base->kind == K_SENDRECV ? 2 : inplace; /* cuda_case: a send/receive in place */
      c.root = (int)(*seed % n);
      c.offset = (int)((s->all_offsets ? (uint64_t)o : *seed % 3) * data_esize(c.type));
      c.seed = (*seed)++;
      fn(&c, arg);
    }
}

static void sweep(const sweep_t *s, int n, uint64_t *seed, case_fn_t fn, void *arg) {
  for (int k = 0; k < K_COUNT; k++) {
    if (!(s->kinds & 1u << k)) continue;
    for (int t = 0; t < ncclNumTypes; t++) {
      if (!(s->types & 1u << t)) continue;
      for (int op = 0; op < N_OPS; op++) {
        if (!(s->ops & 1u << op) || (op != ncclSum && !coll_reduces(k))) continue;
        for (int i = 0; i < s->ncounts; i++) {
          size_t count = s->counts[i];
          if (s->per_buffer && block_per_rank(k)) count = (count / n) | 1;
          coll_case_t c = {.kind = k, .type = t, .op = op, .count = count};
          sweep_one(s, &c, n, seed, fn, arg);
        }
      }
    }
  }
}

/* The sweeps of each tier. */
typedef enum { TIER_SMALL, TIER_LARGE, TIER_LARGE_SINGLE, TIER_QUICK } tier_t;

static int tier_sweeps(tier_t tier, sweep_t *s) {
  size_t big = large_count();
  unsigned wide = T(ncclInt8) | T(ncclFloat16) | T(ncclFloat32) | T(ncclFloat64);
  switch (tier) {
  case TIER_SMALL:
    s[0] = (sweep_t){{0, 1, 7, 1031}, 4, ALL_KINDS, ALL_TYPES, ALL_OPS, 1, 0};
    return 1;
  case TIER_LARGE:
    /* 12287 elements: an LL transfer over many channels (float: 12 parts of 4 KiB); 65539: past LL's
     * 256 KiB for 4- and 8-byte types (Simple), LL over 16 channels for 1- and 2-byte ones */
    s[0] = (sweep_t){{12287, 65539}, 2, ALL_KINDS, ALL_TYPES, ALL_OPS, 0, 0};
    s[1] = (sweep_t){{1000003}, 1, ALL_KINDS, ALL_TYPES, OP_SUM, 0, 1};
    s[2] = (sweep_t){{big}, 1, ALL_KINDS, wide, OP_SUM, 0, 1};
    s[3] = (sweep_t){{big}, 1, 1u << K_ALLREDUCE, T(ncclBfloat16) | T(ncclFloat32), ALL_OPS & ~OP_SUM, 0, 1};
    /* about a million: a one-shot all-reduce whose in-place form runs split on the bulk kernel (its sends
     * and its reduction on separate blocks), with every operation */
    s[4] =
        (sweep_t){{1000003}, 1, 1u << K_ALLREDUCE, T(ncclBfloat16) | T(ncclFloat32), ALL_OPS & ~OP_SUM, 0, 1};
    /* 300007 elements: LL128 on two ranks over p2p for 2- and 4-byte types (600 KB, 1.2 MB a buffer; 1-byte
     * ones take it at about a million), every operation on the all-reduce (PreMulSum's scaled send through
     * the general kernel) */
    s[5] = (sweep_t){{300007}, 1, ALL_KINDS, ALL_TYPES, OP_SUM, 0, 1};
    s[6] =
        (sweep_t){{300007}, 1, 1u << K_ALLREDUCE, T(ncclBfloat16) | T(ncclFloat32), ALL_OPS & ~OP_SUM, 0, 1};
    return 7;
  case TIER_LARGE_SINGLE:
    s[0] = (sweep_t){{1000003}, 1, ALL_KINDS, T(ncclInt8) | T(ncclBfloat16) | T(ncclFloat32), OP_SUM, 0, 1};
    s[1] = (sweep_t){{big}, 1, ALL_KINDS, T(ncclFloat32), OP_SUM, 0, 1};
    return 2;
  case TIER_QUICK:
    s[0] = (sweep_t){{1, 1031, 1000003},
                     3,
                     ALL_KINDS,
                     T(ncclInt8) | T(ncclBfloat16) | T(ncclFloat32) | T(ncclUint64),
                     OP_SUM | 1u << ncclMax | 1u << (ncclNumOps + 1),
                     0,
                     1};
    return 1;
  }
  return 0;
}

static void for_tier(tier_t tier, int n, case_fn_t fn, void *arg) {
  sweep_t s[7];
  int count = tier_sweeps(tier, s);
  uint64_t seed = 7000 + 100000 * (uint64_t)tier;
  for (int i = 0; i < count; i++) sweep(&s[i], n, &seed, fn, arg);
}

/* Device pool for a tier: the largest case's send and receive buffers (8-byte elements, a few spare for
 * counts rounded per rank), plus room for guards, offsets and the scalar. */
static size_t tier_pool_bytes(tier_t tier, int n) {
  size_t elems = 1031 * (size_t)n;
  if (tier == TIER_QUICK) elems = 1000003;
  if (tier == TIER_LARGE || tier == TIER_LARGE_SINGLE)
    elems = large_count() > 1000003 ? large_count() : 1000003;
  return 2 * (elems + 8 * (size_t)n) * 8 + ((size_t)1 << 20);
}

/* ---- One process per GPU ---- */

typedef struct {
  tier_t tier;
  const char *mode;
  int skew; /* odd ranks' buffers one element past the case's offset: the ranks' alignments differ */
  int rank;
  ncclComm_t comm;
  cuda_rank_t *r;
} job_t;

static void run_case(const coll_case_t *c, void *arg) {
  job_t *j = arg;
  coll_case_t k = *c;
  if (j->skew && j->rank % 2 == 1) k.offset += (int)data_esize(k.type);
  cuda_case_run(j->comm, j->r, &k, j->mode, CASE_TIMEOUT_S);
}

static void procs_rank(int rank, int n, const ncclUniqueId *id, void *arg) {
  job_t j = *(job_t *)arg;
  j.rank = rank;
  cuda_rank_t r;
  size_t pool = tier_pool_bytes(j.tier, n);
  cuda_rank_open(&r, rank, pool, 2 * pool, NULL);
  cuda_watch("ncclCommInitRank", CASE_TIMEOUT_S);
  EXPECT_OK(ncclCommInitRank(&j.comm, n, *id, rank));
  cuda_unwatch();
  j.r = &r;
  for_tier(j.tier, n, run_case, &j);
  cuda_watch("ncclCommFinalize and ncclCommDestroy", CASE_TIMEOUT_S);
  EXPECT_OK(ncclCommFinalize(j.comm));
  EXPECT_OK(ncclCommDestroy(j.comm));
  cuda_unwatch();
  cuda_rank_close(&r);
}

static void run_procs_skewed(tier_t tier, const char *mode, int skew, int timeout_s) {
  job_t j = {.tier = tier, .mode = mode, .skew = skew};
  EXPECT(cuda_run_ranks(cuda_nranks, timeout_s, procs_rank, &j) == 0, "%s: a rank failed", mode);
}

static void run_procs(tier_t tier, const char *mode, int timeout_s) {
  run_procs_skewed(tier, mode, 0, timeout_s);
}

static void procs_small(void) {
  run_procs(TIER_SMALL, "procs", 300);
}

static void procs_large(void) {
  run_procs(TIER_LARGE, "procs", 300);
}

/* The copy engines from 4 KiB (procs_ce, single_ce), or back to the defaults. */
static void ce_env(int on) {
  const char *names[] = {"BRAID_CE_MIN_BYTES", "BRAID_CE_REDUCE_MIN_BYTES", "BRAID_CE_CHUNK_BYTES",
                         "BRAID_AR_SPLIT_BYTES", "BRAID_CE_PULL_MIN_BYTES"};
  const char *values[] = {"4096", "4096", "65536", "4096", "4096"};
  for (int i = 0; i < 5; i++)
    if (on)
      setenv(names[i], values[i], 1);
    else
      unsetenv(names[i]);
}

static void procs_ce(void) {
  ce_env(1);
  run_procs(TIER_QUICK, "procs/ce", 300);
  run_procs(TIER_LARGE_SINGLE, "procs/ce", 300);
  /* every reduce pulled, out of place too, from a peer whose buffers are aligned unlike this rank's */
  setenv("BRAID_CE_REDUCE_MIN_BYTES", "1073741824", 1);
  run_procs_skewed(TIER_QUICK, "procs/ce-pull-skewed", 1, 300);
  ce_env(0);
}

/* Steps that only copy pushed by one kernel from 4 KiB (procs_push, single_push): below the copy engines'
 * threshold, whose default stays. */
static void push_env(int on) {
  if (on) {
    setenv("BRAID_CE_PUSH_MIN_BYTES", "4096", 1);
    setenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES", "4096", 1);
  } else {
    unsetenv("BRAID_CE_PUSH_MIN_BYTES");
    unsetenv("BRAID_CE_PUSH_EXCHANGE_MIN_BYTES");
  }
}

static void procs_push(void) {
  push_env(1);
  run_procs(TIER_QUICK, "procs/push", 300);
  run_procs(TIER_LARGE_SINGLE, "procs/push", 300);
  /* from a peer whose buffers are aligned unlike this rank's */
  run_procs_skewed(TIER_QUICK, "procs/push-skewed", 1, 300);
  push_env(0);
}

/* Dealt transfers (device/dev.h) at every size the kernels move (procs_dealt, single_dealt: cuda_dealt_env).
 * With no LL transfer the pair kernel never runs a send/receive, so one in place is not checked
 * (sweep_one). */
static void dealt_env(int on) {
  ll_rings = !on;
  cuda_dealt_env(on);
}

static void procs_dealt(void) {
  dealt_env(1);
  run_procs(TIER_QUICK, "procs/dealt", 300);
  run_procs(TIER_LARGE_SINGLE, "procs/dealt", 300);
  /* from a peer whose buffers are aligned unlike this rank's */
  run_procs_skewed(TIER_QUICK, "procs/dealt-skewed", 1, 300);
  dealt_env(0);
}

/* ---- One process and thread for every GPU ---- */

typedef struct {
  ncclComm_t comms[8];
  cuda_rank_t r[8];
  int n;
} single_t;

static void single_case(const coll_case_t *c, void *arg) {
  single_t *s = arg;
  cuda_case_t k[8];
  char what[320];
  coll_describe(c, s->n, 0, what, sizeof what);
  char watch[360];
  snprintf(watch, sizeof watch, "[single] %s (all ranks in one group)", what);
  cuda_watch(watch, CASE_TIMEOUT_S);
  for (int i = 0; i < s->n; i++) cuda_case_prepare(&k[i], s->comms[i], &s->r[i], c, "single");
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < s->n; i++) cuda_case_launch(&k[i]);
  ncclResult_t res = ncclGroupEnd();
  if (res != ncclSuccess)
    test_fail(__FILE__, __LINE__, "%s: ncclGroupEnd returned %s (%s)", watch, ncclGetErrorString(res),
              ncclGetLastError(s->comms[0]));
  for (int i = 0; i < s->n; i++) cuda_case_check(&k[i]);
  for (int i = 0; i < s->n; i++) cuda_rank_reset(&s->r[i]);
  cuda_unwatch();
}

static void run_single(tier_t tier) {
  static single_t s;
  s.n = cuda_nranks;
  size_t pool = tier_pool_bytes(tier, s.n);
  for (int i = 0; i < s.n; i++) cuda_rank_open(&s.r[i], i, pool, 2 * pool, NULL);
  cuda_watch("ncclCommInitAll", CASE_TIMEOUT_S);
  EXPECT_OK(cuda_comm_init_all(s.comms, s.n));
  cuda_unwatch();
  for_tier(tier, s.n, single_case, &s);
  /* Destroy without finalize: one thread cannot finalize several ranks one after the other (each waits for
   * the others), and this test is about the collectives. */
  cuda_watch("ncclCommDestroy", CASE_TIMEOUT_S);
  for (int i = 0; i < s.n; i++) EXPECT_OK(ncclCommDestroy(s.comms[i]));
  cuda_unwatch();
  for (int i = 0; i < s.n; i++) cuda_rank_close(&s.r[i]);
}

static void single_small(void) {
  run_single(TIER_SMALL);
}

static void single_large(void) {
  run_single(TIER_LARGE_SINGLE);
}

static void single_ce(void) {
  ce_env(1);
  run_single(TIER_QUICK);
  run_single(TIER_LARGE_SINGLE);
  ce_env(0);
}

static void single_dealt(void) {
  dealt_env(1);
  run_single(TIER_QUICK);
  run_single(TIER_LARGE_SINGLE);
  dealt_env(0);
}

static void single_push(void) {
  push_env(1);
  run_single(TIER_QUICK);
  run_single(TIER_LARGE_SINGLE);
  push_env(0);
}

/* ---- Transports ---- */

static void shm_quick(void) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  ll_rings = 0;
  run_procs(full_transport_matrix ? TIER_SMALL : TIER_QUICK, "procs/shm", 300);
}

static void tcp_quick(void) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  ll_rings = 0;
  run_procs(full_transport_matrix ? TIER_SMALL : TIER_QUICK, "procs/tcp", 300);
}

int main(int argc, char **argv) {
  /* --full is this program's own option; the rest are cuda_init's. */
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--full") == 0) {
      full_transport_matrix = 1;
      memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
      argc--;
      break;
    }
  cuda_init(argc, argv);
  TEST(procs_small, 320);
  TEST(procs_large, 320);
  TEST(procs_ce, 620);
  TEST(single_small, 320);
  TEST(single_large, 320);
  TEST(single_ce, 620);
  TEST(procs_push, 620);
  TEST(single_push, 620);
  TEST(procs_dealt, 620);
  TEST(single_dealt, 620);
  TEST(shm_quick, 320);
  TEST(tcp_quick, 320);
  return test_summary();
}
