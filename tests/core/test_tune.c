/*
 * The tuning table (core/tune.h): its values against the knobs' registered defaults, and hand-checked shapes
 * of the rows. Every decision over the whole grid of calls is checked by test_decisions; the algorithm
 * choice and NCCL_ALGO / NCCL_PROTO parsing by test_plan.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/param.h"
#include "core/tune.h"
#include "device/dev.h"
#include "harness.h"

/* A knob left unset means the table's value; the registry's default (what `braid info --params` shows)
 * must say the same. */
static void table_matches_registry(void) {
  uint64_t v[TUNE_AGREED_COUNT];
  tune_agreed(v);
  static const struct {
    int agreed;
    param_id_t knob;
  } pairs[] = {{1, P_BRAID_ONESHOT_MAX_BYTES},
               {3, P_BRAID_LL_MAX_BYTES},
               {4, P_BRAID_LL128_MAX_BYTES},
               {5, P_BRAID_LL128_MIN_BYTES},
               {6, P_BRAID_LL128_ONE_WAY_MIN_BYTES},
               {7, P_BRAID_LL_CHANNEL_BYTES},
               {8, P_BRAID_CHANNEL_BYTES},
               {9, P_BRAID_AR_SPLIT_BYTES},
               {10, P_BRAID_WIDE_STEPS},
               {11, P_BRAID_DEALT_MIN_BYTES}};

  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    EXPECT(!param_is_set(pairs[i].knob), "%s is set in the test's environment", param_name(pairs[i].knob));
    EXPECT((int64_t)v[pairs[i].agreed] == param_int(pairs[i].knob),
           "%s: the table says %llu, the registry %lld", tune_agreed_name(pairs[i].agreed),
           (unsigned long long)v[pairs[i].agreed], (long long)param_int(pairs[i].knob));
  }
}

static tune_shape_t shape(op_kind_t kind, uint64_t bytes, int nranks, tp_link_t link) {
  const tune_call_t c = {.kind = kind,
                         .type = ncclFloat32,
                         .red = RED_SUM,
                         .bytes = bytes,
                         .nranks = nranks,
                         .nch = 40,
                         .link = link};
  tune_shape_t s;
  tune_call(&c, tune_knobs(), &s);
  return s;
}

/* The rows, by hand: two ranks over p2p have LL128 and wide steps, other links and rank counts do not. */
static void rows(void) {
  tune_shape_t s = shape(OP_ALLREDUCE, 8, 2, TP_LINK_P2P);
  EXPECT(s.algo == ALGO_ONESHOT && s.ll_max == 128 << 10 && s.ll128_max == 1536 << 10,
         "two ranks' all-reduce: LL to 128 KiB, LL128 to 1.5 MiB (%llu, %llu)", (unsigned long long)s.ll_max,
         (unsigned long long)s.ll128_max);
  EXPECT(s.wide == TUNE_WIDE_BIG && s.wide_min == 8 << 20 && s.dealt_min == 0, "one-shot: nothing dealt");
  s = shape(OP_BROADCAST, 64 << 20, 2, TP_LINK_P2P);
  EXPECT(s.algo == ALGO_RING && s.ll_max == 256 << 10 && s.wide == TUNE_WIDE_STEP &&
             s.dealt_min == 64 << 20 && s.oneway_batch == 2,
         "two ranks' broadcast: LL to 256 KiB, wide, dealt from 64 MiB, batches");
  s = shape(OP_BROADCAST, 64 << 20, 2, TP_LINK_SHM);
  EXPECT(s.ll128_max == 0 && s.ll_max == 512 << 10, "no LL128 without p2p links");
  s = shape(OP_ALLREDUCE, 32 << 20, 2, TP_LINK_P2P);
  EXPECT(s.algo == ALGO_RING && s.split, "two ranks' all-reduce from 32 MiB: two steps");
  s = shape(OP_ALLREDUCE, 8, 4, TP_LINK_P2P);
  EXPECT(s.algo == ALGO_ONESHOT && s.ll128_max == 0 && s.wide == TUNE_WIDE_NONE && s.oneway_batch == 0,
         "four ranks: no LL128, no wide steps");
  s = shape(OP_ALLREDUCE, 128 << 10, 4, TP_LINK_P2P);
  EXPECT(s.algo == ALGO_RING, "four ranks: one-shot to 64 KiB only");
  s = shape(OP_ALLGATHER, 8, 1, TP_LINK_P2P);
  EXPECT(s.local_ce_min == 1, "one rank: every copy to the copy engines (from %llu bytes)",
         (unsigned long long)s.local_ce_min);
  EXPECT(!param_is_set(P_BRAID_LOCAL_CE_MIN_BYTES) &&
             s.local_ce_min == (uint64_t)param_int(P_BRAID_LOCAL_CE_MIN_BYTES),
         "BRAID_LOCAL_CE_MIN_BYTES: the table and the registry differ");
  s = shape(OP_ALLGATHER, 8 << 20, 2, TP_LINK_P2P);
  EXPECT(s.local_ce_min == 0, "two ranks: local copies stay in the kernels");
  s = shape(OP_ALLTOALL, 8, 2, TP_LINK_P2P);
  EXPECT(s.algo == ALGO_RING && s.wide == TUNE_WIDE_EACH,
         "all-to-all: direct, each transfer wide by its size");
  tune_call_t c = {
      .kind = OP_ALLREDUCE, .type = ncclFloat32, .red = RED_MAX, .bytes = 8, .nranks = 2, .nch = 40};
  tune_call(&c, tune_knobs(), &s);
  EXPECT(s.algo == ALGO_RING, "float max: never one-shot");
  c.nch = 8;
  tune_call(&c, tune_knobs(), &s);
  const uint64_t cap = 8ull * DEV_LL128_PART_MAX;
  EXPECT(s.ll_nch == 8 && s.ll128_nch == 8 && s.ll128_max == (cap < (1536 << 10) ? cap : 1536 << 10),
         "the bands held to the channels' rings");
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(table_matches_registry, 10);
  TEST(rows, 10);
  return test_summary();
}
