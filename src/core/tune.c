/*
 * The tuning table and the function that reads it (see tune.h).
 */
#include "tune.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/param.h"
#include "core/redop.h"
#include "device/dev.h"

#define KIB(n) ((uint64_t)(n) << 10)
#define MIB(n) ((uint64_t)(n) << 20)
#define BIT(k) (1u << (k))

/* Collectives by family. */
#define CHOICE                                                                                               \
  (BIT(OP_ALLREDUCE) | BIT(OP_BROADCAST) | BIT(OP_REDUCE) | BIT(OP_ALLGATHER) | BIT(OP_REDUCESCATTER))
#define ONE_WAY (BIT(OP_BROADCAST) | BIT(OP_REDUCE) | BIT(OP_GATHER) | BIT(OP_SCATTER))
#define ALL     (BIT(OP_COUNT) - 1)

/* ---- The table ---- */

/* An algorithm row: calls of `colls` on ranks_lo..ranks_hi ranks of min..max bytes run `algo` (`split`: as
 * two steps). `knob`: the knob that replaces max (K_ONESHOT) or min (K_SPLIT, where 0 turns the row off). */
enum { K_NONE, K_ONESHOT, K_SPLIT };
typedef struct {
  unsigned colls;
  int ranks_lo, ranks_hi;
  uint64_t min, max;
  uint8_t knob;
  plan_algo_t algo;
  uint8_t split;
  const char *why;
} algo_row_t;

/* One-shot where a call moves little (one hop instead of up to 2 (n - 1)); on two ranks an all-reduce's
 * one-shot moves no more per link than the ring and saves its second hop, up to 16 MiB; from 32 MiB a
 * two-rank ring all-reduce runs as a reduce-scatter and an all-gather of the reduced halves, a step that
 * only copies, which bypasses the rings (core/ce.h). Everything else: Ring. */
static const algo_row_t algo_rows[] = {
    {CHOICE, 2, PLAN_ONESHOT_MAX_RANKS, 0, KIB(64), K_ONESHOT, ALGO_ONESHOT, 0,
     "at most BRAID_ONESHOT_MAX_BYTES"},
    {BIT(OP_ALLREDUCE), 2, 2, 0, MIB(16), K_ONESHOT, ALGO_ONESHOT, 0,
     "all-reduce on two ranks, up to 16 MiB"},
    {BIT(OP_ALLREDUCE), 2, 2, MIB(32), UINT64_MAX, K_SPLIT, ALGO_RING, 1,
     "all-reduce on two ranks from BRAID_AR_SPLIT_BYTES: two steps"},
};

/* A transfer row: the bands of the transfers of `colls` on ranks_lo..ranks_hi ranks. LL up to ll_max; LL128
 * above ll128_min up to ll128_max where the link carries it (LL rings both ways: p2p); `one_way`: ll128_min
 * is BRAID_LL128_ONE_WAY_MIN_BYTES's. Wider steps (tune_wide_t) where BRAID_WIDE_STEPS is at least
 * wide_level. Every field but the bands' knobs is the table's alone. */
typedef struct {
  unsigned colls;
  int ranks_lo, ranks_hi;
  uint64_t ll_max, ll128_min, ll128_max;
  uint8_t one_way;
  uint64_t ll_part, ch_bytes;
  uint8_t wide, wide_level;
  uint64_t wide_min;
  uint64_t dealt_min, dealt_max;
  uint8_t duplex_batch;
  uint64_t duplex_max;
  uint8_t oneway_batch, oneway_lo, oneway_hi;
  uint64_t local_ce_min;
} xfer_row_t;

/* What every row has unless it says otherwise. A Simple batch of 2 pieces (the receiver works while the
 * sender moves the next) where data moves both ways, up to 128 MiB transfers or dealt ones. */
#define XFER_COMMON                                                                                          \
  .ll_max = KIB(512), .ll_part = KIB(1), .ch_bytes = KIB(32), .duplex_batch = 2, .duplex_max = MIB(128),     \
  .oneway_lo = 3, .oneway_hi = 16
/* Two ranks: LL128 up to 1.5 MiB; wider steps (the rings' half as many channels again) where a step has
 * two lanes; pieces dealt from 64 MiB in ring collectives whose two ranks' steps hold the same transfers. */
#define TWO_RANKS XFER_COMMON, .ll128_max = KIB(1536), .wide_min = MIB(8)

static const xfer_row_t xfer_rows[] = {
    /* one-way collectives: LL128 from 256 KiB; every step wide; batches of 2 at 3-16 slots a channel */
    {BIT(OP_BROADCAST) | BIT(OP_REDUCE), 2, 2, TWO_RANKS, .ll128_min = KIB(256), .one_way = 1,
     .wide = TUNE_WIDE_STEP, .wide_level = 1, .dealt_min = MIB(64), .oneway_batch = 2},
    {BIT(OP_GATHER) | BIT(OP_SCATTER), 2, 2, TWO_RANKS, .ll128_min = KIB(256), .one_way = 1,
     .wide = TUNE_WIDE_STEP, .wide_level = 1, .oneway_batch = 2},
    /* both ways: LL128 from 128 KiB */
    {BIT(OP_ALLREDUCE) | BIT(OP_REDUCESCATTER), 2, 2, TWO_RANKS, .ll128_min = KIB(128), .wide = TUNE_WIDE_BIG,
     .wide_level = 2, .dealt_min = MIB(64)},
    {BIT(OP_ALLGATHER), 2, 2, TWO_RANKS, .ll128_min = KIB(128), .wide = TUNE_WIDE_EACH, .wide_level = 3,
     .dealt_min = MIB(64)},
    {BIT(OP_ALLTOALL) | BIT(OP_SEND) | BIT(OP_RECV), 2, 2, TWO_RANKS, .ll128_min = KIB(128),
     .wide = TUNE_WIDE_EACH, .wide_level = 3},
    /* one rank: every copy goes to the copy engines, NCCL's own way: a kernel's copy was faster or slower
     * than it from one H100 to another (docs/performance.md) */
    {ALL, 1, 1, XFER_COMMON, .local_ce_min = 1},
    {ALL, 1, INT32_MAX, XFER_COMMON},
};

/* ---- Mechanism limits the bands are held to ---- */

/* LL transfers take at most this many of the DEV_LL_CHANNELS LL rings (more moved them no faster). */
enum { LL_NCH = 32 };
/* An LL transfer runs in one slice: each channel's part within half of its LL ring, and of a Simple ring for
 * a side without LL. */
enum { LL_PART_MAX = DEV_LL_SLOTS / 2 * DEV_LL_PIECE };
_Static_assert(LL_NCH <= DEV_LL_CHANNELS, "LL transfers have an LL ring per channel");
_Static_assert(PLAN_LL_MAX <= (uint64_t)LL_NCH * LL_PART_MAX && LL_PART_MAX <= DEV_SLOTS / 2 * DEV_SLOT_BYTES,
               "an LL transfer's part fits half a ring");
/* Channels per connection unless BRAID_CHANNELS says otherwise (fewer when many ranks share the SMs). */
enum { CHANNELS_DEFAULT = 40 };

/* ---- Knobs ---- */

/* A knob's value where set, else the row's; a set value of 0 or less is `nonpos`. */
static uint64_t knob_or(int64_t knob, uint64_t row, uint64_t nonpos) {
  return knob == TUNE_UNSET ? row : knob > 0 ? (uint64_t)knob : nonpos;
}

static int64_t knob(param_id_t id) {
  return param_is_set(id) ? param_int(id) : TUNE_UNSET;
}

void tune_knobs_read(tune_knobs_t *k) {
  tune_parse_algo(param_str(P_NCCL_ALGO), k->algos);
  k->ll = (uint8_t)tune_parse_proto(param_str(P_NCCL_PROTO), "LL");
  k->ll128 = (uint8_t)tune_parse_proto(param_str(P_NCCL_PROTO), "LL128");
  k->oneshot_max = knob(P_BRAID_ONESHOT_MAX_BYTES);
  k->ar_split = knob(P_BRAID_AR_SPLIT_BYTES);
  k->ll_max = knob(P_BRAID_LL_MAX_BYTES);
  k->ll128_min = knob(P_BRAID_LL128_MIN_BYTES);
  k->ll128_oneway = knob(P_BRAID_LL128_ONE_WAY_MIN_BYTES);
  k->ll128_max = knob(P_BRAID_LL128_MAX_BYTES);
  k->ll_part = knob(P_BRAID_LL_CHANNEL_BYTES);
  k->ch_bytes = knob(P_BRAID_CHANNEL_BYTES);
  k->wide = knob(P_BRAID_WIDE_STEPS);
  k->dealt_min = knob(P_BRAID_DEALT_MIN_BYTES);
  k->batch = knob(P_BRAID_BATCH_PIECES);
  k->local_ce_min = knob(P_BRAID_LOCAL_CE_MIN_BYTES);
}

static pthread_once_t knobs_once = PTHREAD_ONCE_INIT;
static tune_knobs_t knobs;

static void knobs_load(void) {
  tune_knobs_read(&knobs);
}

const tune_knobs_t *tune_knobs(void) {
  pthread_once(&knobs_once, knobs_load);
  return &knobs;
}

/* ---- The function ---- */

static int row_has(unsigned colls, int lo, int hi, const tune_call_t *c) {
  return (colls & BIT(c->kind)) && c->nranks >= lo && c->nranks <= hi;
}

/* The algorithm row's bounds, with its knob. */
static int algo_row_holds(const algo_row_t *r, const tune_call_t *c, const tune_knobs_t *k) {
  uint64_t min = r->min, max = r->max;
  if (r->knob == K_ONESHOT && k->oneshot_max != TUNE_UNSET) max = knob_or(k->oneshot_max, 0, 0);
  if (r->knob == K_SPLIT) {
    min = knob_or(k->ar_split, min, 0);
    if (min == 0) return 0;
  }
  return row_has(r->colls, r->ranks_lo, r->ranks_hi, c) && c->bytes >= min && c->bytes <= max;
}

/* The first row of `algo` that holds the call, or NULL. */
static const algo_row_t *algo_row(const tune_call_t *c, const tune_knobs_t *k, plan_algo_t algo, int split) {
  for (size_t i = 0; i < sizeof algo_rows / sizeof *algo_rows; i++) {
    const algo_row_t *r = &algo_rows[i];
    if (r->algo == algo && r->split == split && algo_row_holds(r, c, k)) return r;
  }
  return NULL;
}

/* The algorithm: NCCL_ALGO's exclusions and what one-shot can run first, then the rows. */
static void pick_algo(const tune_call_t *c, const tune_knobs_t *k, tune_shape_t *s) {
  const int choice = (CHOICE & BIT(c->kind)) != 0;
  const unsigned allowed = choice ? k->algos[c->kind] : BIT(ALGO_RING);
  s->algo = ALGO_RING;
  s->split = 0;
  if (!choice) {
    s->why = "no other algorithm";
  } else if (c->nranks == 1) {
    s->why = "one rank";
  } else if (allowed == BIT(ALGO_RING)) {
    s->why = "NCCL_ALGO allows only Ring";
  } else if (c->nranks > PLAN_ONESHOT_MAX_RANKS) {
    s->why = "one-shot takes at most 32 ranks";
  } else if (c->kind == OP_ALLREDUCE && (c->red == RED_MAX || c->red == RED_MIN) && dtype_is_float(c->type)) {
    /* max(a, b) and max(b, a) can differ in the bits (NaN, signed zeros): ranks computing the same result
     * on their own could disagree */
    s->why = "floating-point max/min is not bitwise commutative";
  } else if (allowed == BIT(ALGO_ONESHOT)) {
    s->algo = ALGO_ONESHOT;
    s->why = "NCCL_ALGO allows only OneShot";
  } else {
    const algo_row_t *r = algo_row(c, k, ALGO_ONESHOT, 0);
    s->algo = r != NULL ? ALGO_ONESHOT : ALGO_RING;
    s->why = r != NULL ? r->why : "more than BRAID_ONESHOT_MAX_BYTES";
  }
  const algo_row_t *r = s->algo == ALGO_RING ? algo_row(c, k, ALGO_RING, 1) : NULL;
  if (r != NULL) {
    s->split = 1;
    s->why = r->why;
  }
}

static const xfer_row_t *xfer_row(const tune_call_t *c) {
  for (size_t i = 0; i < sizeof xfer_rows / sizeof *xfer_rows; i++)
    if (row_has(xfer_rows[i].colls, xfer_rows[i].ranks_lo, xfer_rows[i].ranks_hi, c)) return &xfer_rows[i];
  return &xfer_rows[sizeof xfer_rows / sizeof *xfer_rows - 1];
}

static uint64_t min_u64(uint64_t a, uint64_t b) {
  return a < b ? a : b;
}

/* The protocol bands: the row's, with the knobs, held to what the rings carry. LL128 takes the transfers
 * above ll128_min from LL where it runs. */
static void pick_protocols(const tune_call_t *c, const tune_knobs_t *k, const xfer_row_t *r,
                           tune_shape_t *s) {
  s->ll_nch = (uint8_t)(c->nch < LL_NCH ? c->nch : LL_NCH);
  s->ll128_nch = (uint8_t)(c->nch < DEV_LL_CHANNELS ? c->nch : DEV_LL_CHANNELS);
  uint64_t ll = k->ll ? min_u64(knob_or(k->ll_max, r->ll_max, 0), PLAN_LL_MAX) : 0;
  ll = min_u64(ll, (uint64_t)s->ll_nch * LL_PART_MAX);
  s->ll128_max =
      k->ll128 && r->ll128_max > 0 && c->link == TP_LINK_P2P
          ? min_u64(knob_or(k->ll128_max, r->ll128_max, 0), (uint64_t)s->ll128_nch * DEV_LL128_PART_MAX)
          : 0;
  const uint64_t from = knob_or(r->one_way ? k->ll128_oneway : k->ll128_min, r->ll128_min, 0);
  s->ll_max = s->ll128_max > from && from < ll ? from : ll;
  s->ll_part = min_u64(knob_or(k->ll_part, r->ll_part, 1), LL_PART_MAX);
  s->ch_bytes = knob_or(k->ch_bytes, r->ch_bytes, 1);
}

void tune_call(const tune_call_t *c, const tune_knobs_t *k, tune_shape_t *s) {
  memset(s, 0, sizeof *s);
  pick_algo(c, k, s);
  const xfer_row_t *r = xfer_row(c);
  pick_protocols(c, k, r, s);
  const int64_t level = k->wide != TUNE_UNSET ? k->wide : 3;
  s->wide = (uint8_t)(r->wide != TUNE_WIDE_NONE && level >= r->wide_level ? r->wide : TUNE_WIDE_NONE);
  s->wide_min = r->wide_min;
  if (s->algo != ALGO_ONESHOT && r->dealt_min > 0) {
    s->dealt_min = knob_or(k->dealt_min, r->dealt_min, 0);
    s->dealt_max = r->dealt_max;
  }
  s->batch = (int16_t)(k->batch == TUNE_UNSET ? -1 : k->batch <= 0 || k->batch >= DEV_SLOTS ? 0 : k->batch);
  s->duplex_batch = r->duplex_batch;
  s->duplex_max = r->duplex_max;
  s->oneway_batch = r->oneway_batch;
  s->oneway_lo = r->oneway_lo;
  s->oneway_hi = r->oneway_hi;
  s->local_ce_min = knob_or(k->local_ce_min, r->local_ce_min, 0);
}

/* One bit per power-of-two size class, per collective: the choices logged at INFO so far. */
static _Atomic uint64_t logged_classes[OP_COUNT];

void tune_log(const tune_call_t *c, const task_t *t, const tune_shape_t *s) {
  if (!log_enabled(LOG_INFO, LOG_TUNING)) return;
  if (!log_enabled(LOG_TRACE, LOG_TUNING) && !log_first_of_class(&logged_classes[c->kind], c->bytes)) return;
  const int reduces = c->kind == OP_ALLREDUCE || c->kind == OP_REDUCE || c->kind == OP_REDUCESCATTER;
  log_write(log_level >= LOG_TRACE ? LOG_TRACE : LOG_INFO, LOG_TUNING, __FILE__, __LINE__,
            "%s of %llu bytes (%s%s%s, %d ranks, call %lu): %s%s, %s; LL to %llu bytes, LL128 to %llu",
            plan_op_name(c->kind), (unsigned long long)c->bytes, dtype_name(c->type), reduces ? " " : "",
            reduces ? redop_name(t->op) : "", c->nranks, (unsigned long)t->seq, plan_algo_name(s->algo),
            s->split ? " in two steps" : "", s->why, (unsigned long long)s->ll_max,
            (unsigned long long)s->ll128_max);
}

/* ---- A communicator's channels, rings and spread ---- */

int tune_lanes_max(int nranks) {
  return nranks > 1 ? 2 * nranks - 1 : 1;
}

int tune_channels_fit(int nranks, int sms) {
  /* a launch's blocks wait for each other, so they must all run at once, one per SM (the kernel takes a
   * whole SM's registers): the widest launch stays within ten elevenths of the SMs */
  int fit = sms * 10 / 11 / tune_lanes_max(nranks);
  if (fit < 1) fit = 1;
  return fit > DEV_MAX_CHANNELS ? DEV_MAX_CHANNELS : fit;
}

int tune_channels(int nranks, int sms) {
  int fit = tune_channels_fit(nranks, sms);
  int64_t want = param_int(P_BRAID_CHANNELS);
  if (want < 1) return fit < CHANNELS_DEFAULT ? fit : CHANNELS_DEFAULT;
  if (want > fit)
    INFO(LOG_INIT | LOG_TUNING, "BRAID_CHANNELS=%lld: %d ranks on %d SMs take at most %d channels",
         (long long)want, nranks, sms, fit);
  return want > fit ? fit : (int)want;
}

/* On two ranks a one-way collective's step (a transfer and at most a local copy) has two lanes, not the
 * three of the widest step, so its transfers take half as many channels again in the same grid. */
int tune_rings(int nranks, int nch) {
  if (nranks != 2) return nch;
  int rings = nch * 3 / 2;
  return rings > DEV_MAX_CHANNELS ? DEV_MAX_CHANNELS : rings;
}

/* The most lanes a step can have (tune_channels sized the channels so that this many lanes of them fit the
 * GPU), at most BRAID_SPREAD when that is 2 or more; 0 when BRAID_SPREAD is 0 or a step has one lane. */
int tune_spread(int nranks) {
  int lanes = tune_lanes_max(nranks);
  int64_t want = param_int(P_BRAID_SPREAD);
  if (want <= 0) return 0;
  if (want >= 2 && want < lanes) lanes = (int)want;
  return lanes >= 2 ? lanes : 0;
}

/* ---- Steps that bypass the rings ---- */

int tune_direct(int nranks, tune_direct_t *d) {
  const int64_t min = param_int(P_BRAID_CE_MIN_BYTES), reduce = param_int(P_BRAID_CE_REDUCE_MIN_BYTES),
                pull = param_int(P_BRAID_CE_PULL_MIN_BYTES), push = param_int(P_BRAID_CE_PUSH_MIN_BYTES),
                push_x = param_int(P_BRAID_CE_PUSH_EXCHANGE_MIN_BYTES),
                chunk = param_int(P_BRAID_CE_CHUNK_BYTES), combine = param_int(P_BRAID_CE_COMBINE_BLOCKS),
                pull_blocks = param_int(P_BRAID_CE_PULL_BLOCKS), tile = param_int(P_BRAID_CE_PULL_TILE);
  d->copy_min = min > 0 ? (uint64_t)min : 0;
  d->reduce_min = reduce > 0 ? (uint64_t)reduce : UINT64_MAX;
  d->pull_min = pull > 0 ? (uint64_t)pull : UINT64_MAX;
  d->push_min = push > 0 ? (uint64_t)push : UINT64_MAX;
  d->push_xmin = push_x > 0 ? (uint64_t)push_x : UINT64_MAX;
  d->chunk_min = chunk > 0 ? (uint64_t)chunk : 0;
  d->combine_blocks = combine < 1 ? 1 : combine > 1024 ? 1024 : (unsigned)combine;
  d->pull_blocks = pull_blocks < 1 ? 0 : pull_blocks > 1024 ? 1024 : (unsigned)pull_blocks;
  d->pull_tile = tile < 16 ? 0 : tile > (1 << 30) ? 1u << 30 : (uint32_t)(tile / 16 * 16);
  return nranks == 2;
}

/* ---- What ranks must agree on ---- */

enum {
  A_ALGO,
  A_ONESHOT,
  A_ONESHOT_PAIR,
  A_LL_MAX,
  A_LL128_MAX,
  A_LL128_MIN,
  A_LL128_ONEWAY,
  A_LL_PART,
  A_CH_BYTES,
  A_AR_SPLIT,
  A_WIDE,
  A_DEALT,
  A_COUNT
};
_Static_assert((int)A_COUNT == (int)TUNE_AGREED_COUNT, "tune.h counts the agreed values");

static const char *const agreed_names[A_COUNT] = {
    [A_ALGO] = "NCCL_ALGO",
    [A_ONESHOT] = "BRAID_ONESHOT_MAX_BYTES",
    [A_ONESHOT_PAIR] = "BRAID_ONESHOT_MAX_BYTES (two ranks' all-reduce)",
    [A_LL_MAX] = "NCCL_PROTO or BRAID_LL_MAX_BYTES (LL)",
    [A_LL128_MAX] = "NCCL_PROTO or BRAID_LL128_MAX_BYTES (LL128)",
    [A_LL128_MIN] = "BRAID_LL128_MIN_BYTES",
    [A_LL128_ONEWAY] = "BRAID_LL128_ONE_WAY_MIN_BYTES",
    [A_LL_PART] = "BRAID_LL_CHANNEL_BYTES",
    [A_CH_BYTES] = "BRAID_CHANNEL_BYTES",
    [A_AR_SPLIT] = "BRAID_AR_SPLIT_BYTES",
    [A_WIDE] = "BRAID_WIDE_STEPS",
    [A_DEALT] = "BRAID_DEALT_MIN_BYTES",
};

const char *tune_agreed_name(int k) {
  return k >= 0 && k < A_COUNT ? agreed_names[k] : "?";
}

/* Each knob as the table's rows see it: the value where set, else the general rows' (two ranks' for the
 * LL128 bands). */
void tune_agreed(uint64_t v[TUNE_AGREED_COUNT]) {
  const tune_knobs_t *k = tune_knobs();
  const xfer_row_t *general = &xfer_rows[sizeof xfer_rows / sizeof *xfer_rows - 1], *two = &xfer_rows[2];
  uint64_t algos = 0; /* a byte per collective; send and receive, the last kinds, have no algorithm */
  _Static_assert(OP_SEND == 8, "the collectives' algorithms fill one 64-bit value");
  for (int c = 0; c < OP_SEND; c++) algos |= (uint64_t)k->algos[c] << (8 * c);
  v[A_ALGO] = algos;
  v[A_ONESHOT] = knob_or(k->oneshot_max, algo_rows[0].max, 0);
  v[A_ONESHOT_PAIR] = knob_or(k->oneshot_max, algo_rows[1].max, 0);
  v[A_LL_MAX] = k->ll ? min_u64(knob_or(k->ll_max, general->ll_max, 0), PLAN_LL_MAX) : 0;
  v[A_LL128_MAX] = k->ll128 ? knob_or(k->ll128_max, two->ll128_max, 0) : 0;
  v[A_LL128_MIN] = knob_or(k->ll128_min, two->ll128_min, 0);
  v[A_LL128_ONEWAY] = knob_or(k->ll128_oneway, xfer_rows[0].ll128_min, 0);
  v[A_LL_PART] = knob_or(k->ll_part, general->ll_part, 1);
  v[A_CH_BYTES] = knob_or(k->ch_bytes, general->ch_bytes, 1);
  v[A_AR_SPLIT] = knob_or(k->ar_split, algo_rows[2].min, 0);
  v[A_WIDE] = (uint64_t)(k->wide != TUNE_UNSET ? k->wide : 3);
  v[A_DEALT] = knob_or(k->dealt_min, two->dealt_min, 0);
}

/* ---- NCCL_ALGO and NCCL_PROTO ---- */

/* The collectives that have a choice of algorithm, by their NCCL_ALGO names. */
static const char *const coll_names[OP_COUNT] = {
    [OP_ALLREDUCE] = "allreduce", [OP_BROADCAST] = "broadcast",         [OP_REDUCE] = "reduce",
    [OP_ALLGATHER] = "allgather", [OP_REDUCESCATTER] = "reducescatter",
};

/* `s` without its leading and trailing spaces (the trailing ones are cut off in place). */
static char *trim(char *s) {
  while (*s == ' ') s++;
  for (char *e = s + strlen(s); e > s && e[-1] == ' ';) *--e = '\0';
  return s;
}

/* The algorithm bits an NCCL_ALGO list names ("Ring,OneShot", "^Ring"), or -1 when it leaves the default. */
static int parse_algo_list(char *list, const char *spec) {
  while (*list == ' ') list++;
  int exclude = *list == '^';
  unsigned named = 0;
  char *save = NULL;
  for (char *name = strtok_r(list + exclude, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
    name = trim(name);
    int found = -1;
    for (int a = 0; a < ALGO_COUNT; a++)
      if (strcasecmp(name, plan_algo_name((plan_algo_t)a)) == 0) found = a;
    if (found >= 0)
      named |= 1u << found;
    else if (name[0] != '\0')
      INFO(LOG_ENV | LOG_TUNING,
           "NCCL_ALGO=%s: %s is not an algorithm of this library (Ring, OneShot); ignored", spec, name);
  }
  if (!exclude) return named != 0 ? (int)named : -1;
  unsigned left = ALGO_MASK_ALL & ~named;
  if (left != 0) return (int)left;
  INFO(LOG_ENV | LOG_TUNING, "NCCL_ALGO=%s excludes every algorithm; Ring is kept", spec);
  return 1 << ALGO_RING;
}

/* One ';'-separated part of NCCL_ALGO: "list" for every collective, or "collective:list". */
static void parse_algo_part(char *part, const char *spec, uint8_t algos[OP_COUNT]) {
  char *colon = strchr(part, ':');
  int only = -1;
  if (colon != NULL) {
    *colon = '\0';
    part = trim(part);
    for (int k = 0; k < OP_COUNT; k++)
      if (coll_names[k] != NULL && strcasecmp(part, coll_names[k]) == 0) only = k;
    if (only < 0) {
      INFO(LOG_ENV | LOG_TUNING, "NCCL_ALGO=%s: %s is not a collective with a choice of algorithm; ignored",
           spec, part);
      return;
    }
    part = colon + 1;
  }
  int mask = parse_algo_list(part, spec);
  if (mask < 0) return;
  for (int k = 0; k < OP_COUNT; k++)
    if (coll_names[k] != NULL && (only < 0 || only == k)) algos[k] = (uint8_t)mask;
}

void tune_parse_algo(const char *spec, uint8_t algos[OP_COUNT]) {
  for (int k = 0; k < OP_COUNT; k++) algos[k] = ALGO_MASK_ALL;
  char buf[512];
  if (spec == NULL || spec[0] == '\0') return;
  if (strlen(spec) >= sizeof buf)
    INFO(LOG_ENV | LOG_TUNING, "NCCL_ALGO is longer than %zu characters; the rest is ignored",
         sizeof buf - 1);
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL;
  for (char *part = strtok_r(buf, ";", &save); part != NULL; part = strtok_r(NULL, ";", &save))
    parse_algo_part(part, spec, algos);
}

int tune_parse_proto(const char *spec, const char *which) {
  if (spec == NULL || spec[0] == '\0') return 1;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", spec);
  char *list = buf;
  while (*list == ' ') list++;
  int exclude = *list == '^', named = 0, known = 0;
  char *save = NULL;
  for (char *name = strtok_r(list + exclude, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
    name = trim(name);
    if (strcasecmp(name, "LL") == 0 || strcasecmp(name, "LL128") == 0 || strcasecmp(name, "Simple") == 0) {
      known = 1;
      named |= strcasecmp(name, which) == 0;
    } else if (name[0] != '\0' && strcmp(which, "LL") == 0) { /* said once, by the LL parse */
      INFO(LOG_ENV | LOG_TUNING,
           "NCCL_PROTO=%s: %s is not a protocol of this library (LL, LL128, Simple); ignored", spec, name);
    }
  }
  return !known || named != exclude;
}
