/*
 * The bench's text output, in nccl-tests' layout: `#` comment lines, one table per collective, a row per
 * size. With one library a row has nccl-tests' columns (out-of-place, then in-place: time, algbw, busbw,
 * #wrong). With two (--vs) a row is one form of one size (the `place` column) and shows each library's time
 * and bus bandwidth, the two ratios and each library's count of wrong values. With --floor every row ends
 * with the floor kernel's time and library A's time over it. Every column starts with a space, so that a
 * figure wider than its column never runs into its neighbour.
 */
#include "bench.h"

#include <math.h>

#include "base/dtype.h"
#include "stats.h"

double bench_algbw(size_t bytes, double time_us) {
  return time_us > 0 ? (double)bytes / time_us / 1e3 : 0;
}

double bench_busbw(const coll_t *coll, int nranks, size_t bytes, double time_us) {
  return bench_algbw(bytes, time_us) * coll->busbw_factor(nranks);
}

static const char *layout_name(const bench_opts_t *o, const bench_run_t *run) {
  if (!run->gpu) return "host backend, host memory";
  return o->single ? "cuda, one process drives every GPU" : "cuda, one process per GPU";
}

void table_run_header(const bench_opts_t *o, const bench_run_t *run) {
  printf("# Braid bench: %d ranks, %s, %s; GPU: %s; %s\n", o->nranks, layout_name(o, run),
         o->graph ? "CUDA graphs" : "eager", run->gpu_name, run->date);
  if (run->gpu && o->gpus > 0)
    printf("# --gpus %d: rank r on GPU r %% %d; ranks that share a GPU do not cross a link\n", o->gpus,
           o->gpus);
  for (int l = 0; l < run->nlibs; l++)
    printf("# %c: %s, NCCL version %d\n", 'A' + l, run->libs[l].path, run->versions[l]);
  char batch[64];
  if (o->batch > 0)
    snprintf(batch, sizeof(batch), "%d", o->batch);
  else
    snprintf(batch, sizeof(batch), "k (k per size: >= %.0f us, <= %d)", STATS_SAMPLE_MIN_US, STATS_BATCH_MAX);
  char step[64];
  if (o->step_factor == 1)
    snprintf(step, sizeof(step), "step %zu bytes", o->step_bytes);
  else
    snprintf(step, sizeof(step), "step factor %zu", o->step_factor);
  printf("# sizes %zu to %zu bytes, %s; %d warm-up iterations, then %d samples of %s iterations",
         o->min_bytes, o->max_bytes, step, o->warmup, o->samples, batch);
  if (o->agg > 1) printf(" of %d calls in a group", o->agg);
  if (o->graph > 0) printf(", captured in a CUDA graph replayed %d times per sample", o->graph);
  if (o->blocking > 0) printf("; the host waits for each %s", o->blocking == 3 ? "sample" : "iteration");
  printf("; %d checked iterations%s\n", o->check, o->cycles != 1 ? "; -N: the run repeats" : "");
  static const char *avg[] = {"rank 0's", "mean over the ranks", "fastest rank", "slowest rank"};
  printf("# time: median over the samples of the time per call, %s%s; NCCL_NVLS_ENABLE=0\n", avg[o->average],
         run->nlibs > 1 ? "; B/A time and A/B busbw > 1: A is faster" : "");
  if (o->floor)
    printf("# F: the floor kernel, timed the same way: one launch per rank that stores a 16-byte line into "
           "every other rank's memory and waits for theirs; A/F: A's out-of-place time over it\n");
  fflush(stdout);
}

/* The floor's two columns at the end of a header line (--floor). */
static void header_floor(const bench_opts_t *o, const char *time, const char *ratio) {
  if (o->floor) printf("%11s%*s", time, ratio[0] != '\0' ? 9 : 0, ratio);
  printf("\n");
}

void table_header(const bench_opts_t *o, const bench_run_t *run, const coll_t *coll) {
  printf("#\n# %s\n#\n", coll->name);
  if (run->nlibs > 1) {
    printf("#%11s%14s%10s%10s%6s%6s%11s%9s%11s%9s%9s%9s%8s%8s", "size", "count", "type", "redop", "root",
           "place", "A:time", "A:busbw", "B:time", "B:busbw", "B/A", "A/B", "#wrong", "#wrong");
    header_floor(o, "F:time", "A/F");
    printf("#%11s%14s%10s%10s%6s%6s%11s%9s%11s%9s%9s%9s%8s%8s", "(B)", "(elements)", "", "", "", "", "(us)",
           "(GB/s)", "(us)", "(GB/s)", "time", "busbw", "A", "B");
    header_floor(o, "(us)", "time");
    return;
  }
  printf("#%77s%33s", "out-of-place", "in-place");
  header_floor(o, "floor", "");
  printf("#%11s%14s%10s%10s%6s%10s%8s%8s%7s%10s%8s%8s%7s", "size", "count", "type", "redop", "root", "time",
         "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  header_floor(o, "F:time", "A/F");
  printf("#%11s%14s%10s%10s%6s%10s%8s%8s%7s%10s%8s%8s%7s", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
         "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  header_floor(o, "(us)", "time");
}

/* The floor's two columns at the end of a row (--floor): its time, and time_us (A's) over it. */
static void print_floor(const bench_opts_t *o, const bench_row_t *row, double time_us) {
  if (o->floor) printf(" %10.2f %8.3f", row->floor_us, time_us / row->floor_us);
  printf("\n");
}

static void print_prefix(const bench_row_t *row) {
  printf(" %11zu %13zu %9s %9s %5d", row->bytes, row->bytes / dtype_size(row->type), dtype_name(row->type),
         bench_op_name(row->op_kind), row->root);
}

static void print_wrong(int check, double wrong, int width) {
  if (check && !isnan(wrong))
    printf(" %*.0f", width - 1, wrong);
  else
    printf(" %*s", width - 1, "N/A");
}

/* One form's four columns in the one-library table. */
static void print_single(const bench_opts_t *o, const bench_row_t *row, const bench_form_t *f) {
  if (f->skipped) {
    printf(" %9s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  double t = f->time_us[0];
  printf(" %9.2f %7.2f %7.2f", t, bench_algbw(row->bytes, t),
         bench_busbw(row->coll, o->nranks, row->bytes, t));
  print_wrong(o->check, f->wrong[0], 7);
}

/* One form's row in the two-library table. */
static void print_pair(const bench_opts_t *o, const bench_row_t *row, int in_place) {
  const bench_form_t *f = &row->form[in_place];
  double bw[BENCH_MAX_LIBS];
  print_prefix(row);
  printf(" %5s", in_place ? "in" : "out");
  for (int l = 0; l < BENCH_MAX_LIBS; l++) {
    bw[l] = bench_busbw(row->coll, o->nranks, row->bytes, f->time_us[l]);
    printf(" %10.2f %8.2f", f->time_us[l], bw[l]);
  }
  printf(" %8.3f %8.3f", f->time_us[1] / f->time_us[0], bw[0] / bw[1]);
  for (int l = 0; l < BENCH_MAX_LIBS; l++) print_wrong(o->check, f->wrong[l], 8);
  print_floor(o, row, f->time_us[0]);
}

/* Adds a measured form to the table's averages. */
static void tally(const bench_opts_t *o, const bench_run_t *run, const bench_row_t *row,
                  const bench_form_t *f, table_avg_t *avg) {
  double bw[BENCH_MAX_LIBS] = {0};
  for (int l = 0; l < run->nlibs; l++) {
    bw[l] = bench_busbw(row->coll, o->nranks, row->bytes, f->time_us[l]);
    avg->busbw_sum[l] += bw[l];
  }
  avg->n++;
  if (run->nlibs > 1 && bw[0] > 0 && bw[1] > 0) {
    avg->log_ratio_sum += log(bw[0] / bw[1]);
    avg->nratios++;
  }
}

void table_row(const bench_opts_t *o, const bench_run_t *run, const bench_row_t *row, table_avg_t *avg) {
  for (int f = 0; f < 2; f++)
    if (!row->form[f].skipped) tally(o, run, row, &row->form[f], avg);
  if (run->nlibs > 1) {
    for (int f = 0; f < 2; f++)
      if (!row->form[f].skipped) print_pair(o, row, f);
  } else {
    print_prefix(row);
    print_single(o, row, &row->form[0]);
    print_single(o, row, &row->form[1]);
    print_floor(o, row, row->form[0].time_us[0]);
  }
  fflush(stdout);
}

void table_footer(const bench_run_t *run, const table_avg_t *avg) {
  if (run->nlibs == 1) {
    printf("# Avg bus bandwidth    : %g\n", avg->n ? avg->busbw_sum[0] / avg->n : 0.0);
    return;
  }
  printf("# Avg bus bandwidth    : A %g, B %g\n", avg->n ? avg->busbw_sum[0] / avg->n : 0.0,
         avg->n ? avg->busbw_sum[1] / avg->n : 0.0);
  printf("# Geometric mean of busbw A/B over %d rows: %.3f\n", avg->nratios,
         avg->nratios ? exp(avg->log_ratio_sum / avg->nratios) : NAN);
}
