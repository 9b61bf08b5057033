/*
 * A rank process of `braid bench`: sets up its ranks (buffers, streams, one communicator per library and
 * rank), then for each collective, type, operation and size runs a row and reports it.
 *
 * A row measures each form (out-of-place, in-place) with every library in turn, the same warm-up and sample
 * counts for each; the order alternates with the size (A then B at even sizes in the sweep, B then A at odd
 * ones), so that drift over a run (clocks, temperature) does not favour one library. Each rank posts its
 * figures on the board; after the row's barrier every process reads every rank's: the reported time is the
 * slowest rank's median (or as -a asks), the wrong count the sum over ranks. The process holding rank 0
 * prints the row and keeps it for the JSON and PNG files it writes at the end.
 *
 * Communicators: one process per rank makes them with ncclCommInitRank, rank 0 making one unique id per
 * library and passing them through the board; one process for every rank (--single) calls ncclCommInitAll
 * once per library.
 */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/check.h"
#include "base/dtype.h"
#include "bench_floor.h"
#include "chart.h"
#include "elem.h"
#include "stats.h"

/* Where a rank's figures sit on the board: times, then wrong counts, per library and form. */
static int fig_time(int lib, int form) {
  return lib * 2 + form;
}

static int fig_wrong(int lib, int form) {
  return 2 * BENCH_MAX_LIBS + lib * 2 + form;
}

static int fig_floor(void) {
  return 4 * BENCH_MAX_LIBS;
}
_Static_assert(4 * BENCH_MAX_LIBS + 1 <= BOARD_FIGS, "the board holds every figure of a row");

/* Communicators ----------------------------------------------------------------------------------------- */

/* One process per rank: rank 0 makes the unique ids, everyone joins each library's communicator. */
static ncclResult_t init_ranks(bench_proc_t *p) {
  const bench_run_t *run = p->run;
  dev_rank_t *d = &p->ranks[0];
  ncclUniqueId *ids = board_ids(run->board);
  CHECK(dev_enter(d));
  for (int l = 0; d->rank == 0 && l < run->nlibs; l++)
    CHECK(bench_called(p, l, 0, NULL, "ncclGetUniqueId", run->libs[l].GetUniqueId(&ids[l])));
  CHECK(board_barrier(run->board)); /* rank 0's ids are on the board */
  for (int l = 0; l < run->nlibs; l++)
    CHECK(bench_called(p, l, d->rank, NULL, "ncclCommInitRank",
                       run->libs[l].CommInitRank(&d->comms[l], p->o->nranks, ids[l], d->rank)));
  return ncclSuccess;
}

/* One process for every rank on GPUs that ranks share (--gpus): ncclCommInitAll takes each GPU once, so one
 * group of ncclCommInitRank calls, each with its rank's GPU current. */
static ncclResult_t init_shared(bench_proc_t *p) {
  for (int l = 0; l < p->run->nlibs; l++) {
    const nccl_lib_t *lib = &p->run->libs[l];
    ncclUniqueId id;
    CHECK(bench_called(p, l, 0, NULL, "ncclGetUniqueId", lib->GetUniqueId(&id)));
    CHECK(bench_called(p, l, 0, NULL, "ncclGroupStart", lib->GroupStart()));
    ncclResult_t res = ncclSuccess;
    for (int i = 0; res == ncclSuccess && i < p->nlocal; i++) {
      res = dev_enter(&p->ranks[i]);
      if (res == ncclSuccess)
        res = bench_called(p, l, i, NULL, "ncclCommInitRank",
                           lib->CommInitRank(&p->ranks[i].comms[l], p->o->nranks, id, i));
    }
    ncclResult_t end = bench_called(p, l, 0, NULL, "ncclGroupEnd", lib->GroupEnd());
    CHECK(res != ncclSuccess ? res : end);
  }
  return ncclSuccess;
}

/* One process for every rank: ncclCommInitAll over devices 0 to n-1 (ranks' indices on the host). */
static ncclResult_t init_all(bench_proc_t *p) {
  if (p->o->gpus > 0) return init_shared(p);
  int n = p->nlocal;
  ncclComm_t *comms = calloc((size_t)n, sizeof(*comms));
  int *devs = calloc((size_t)n, sizeof(*devs));
  ncclResult_t res = ncclSuccess;
  if (comms == NULL || devs == NULL) {
    fprintf(stderr, "braid bench: out of memory for %d communicators\n", n);
    res = ncclSystemError;
  }
  for (int i = 0; res == ncclSuccess && i < n; i++) devs[i] = i;
  for (int l = 0; res == ncclSuccess && l < p->run->nlibs; l++) {
    res = bench_called(p, l, 0, NULL, "ncclCommInitAll", p->run->libs[l].CommInitAll(comms, n, devs));
    for (int i = 0; res == ncclSuccess && i < n; i++) p->ranks[i].comms[l] = comms[i];
  }
  free(devs);
  free(comms);
  return res;
}

static ncclResult_t destroy_comms(bench_proc_t *p) {
  ncclResult_t res = ncclSuccess;
  for (int l = 0; l < p->run->nlibs; l++)
    for (int i = 0; i < p->nlocal; i++) {
      dev_rank_t *d = &p->ranks[i];
      if (d->comms[l] == NULL) continue;
      ncclResult_t r = bench_called(p, l, d->rank, d->comms[l], "ncclCommDestroy",
                                    p->run->libs[l].CommDestroy(d->comms[l]));
      d->comms[l] = NULL;
      if (res == ncclSuccess) res = r;
    }
  return res;
}

/* A row's calls ------------------------------------------------------------------------------------------ */

/* Makes a call's reduction: a built-in one, or a premulsum whose scalar is given in the row's type. */
static ncclResult_t make_op(const bench_proc_t *p, int lib, coll_call_t *c) {
  if (c->op_kind != BENCH_OP_PREMULSUM) {
    c->op = c->op_kind == BENCH_OP_NONE ? ncclSum : (ncclRedOp_t)c->op_kind;
    return ncclSuccess;
  }
  double scalar[1]; /* eight bytes: room for one element of any type */
  elem_set(c->type, scalar, 0, BENCH_PREMUL_SCALAR);
  return bench_called(
      p, lib, c->rank, c->comm, "ncclRedOpCreatePreMulSum",
      c->lib->RedOpCreatePreMulSum(&c->op, scalar, c->type, ncclScalarHostImmediate, c->comm));
}

/* Sets up every library's call on every local rank for one row. */
static ncclResult_t prepare_calls(bench_proc_t *p, const coll_t *coll, ncclDataType_t type, int op_kind,
                                  size_t bytes) {
  for (int l = 0; l < p->run->nlibs; l++)
    for (int i = 0; i < p->nlocal; i++) {
      const dev_rank_t *d = &p->ranks[i];
      coll_call_t *c = bench_call(p, l, i);
      *c = (coll_call_t){.lib = &p->run->libs[l],
                         .comm = d->comms[l],
                         .stream = d->stream,
                         .rank = d->rank,
                         .nranks = p->o->nranks,
                         .root = p->o->root,
                         .type = type,
                         .op_kind = op_kind};
      coll->shape(bytes, dtype_size(type), c->nranks, c->rank, c->root, &c->shape);
      CHECK(make_op(p, l, c));
    }
  return ncclSuccess;
}

static ncclResult_t destroy_ops(const bench_proc_t *p) {
  ncclResult_t res = ncclSuccess;
  for (int l = 0; l < p->run->nlibs; l++)
    for (int i = 0; i < p->nlocal; i++) {
      coll_call_t *c = bench_call(p, l, i);
      if (c->op_kind != BENCH_OP_PREMULSUM) continue;
      ncclResult_t r =
          bench_called(p, l, c->rank, c->comm, "ncclRedOpDestroy", c->lib->RedOpDestroy(c->op, c->comm));
      if (res == ncclSuccess) res = r;
    }
  return res;
}

/* Points the calls at the buffers for one form; the data's seed depends on the row and form only, so both
 * libraries are checked on the same data. */
static void place_form(bench_proc_t *p, const coll_t *coll, int in_place) {
  for (int l = 0; l < p->run->nlibs; l++)
    for (int i = 0; i < p->nlocal; i++) {
      dev_rank_t *d = &p->ranks[i];
      coll_call_t *c = bench_call(p, l, i);
      c->seed = (unsigned)(2 * p->row + in_place);
      c->send = d->sbuf;
      c->recv = d->rbuf;
      if (in_place) coll->place(c, d->rbuf, &c->send, &c->recv);
    }
}

/* A row ------------------------------------------------------------------------------------------------- */

/* Measures both forms with every library, in the size's order, and posts each local rank's figures. With
 * --floor the floor kernel takes a turn in the out-of-place form's order too: after the libraries at even
 * sizes, before them at odd ones. */
static ncclResult_t measure_row(bench_proc_t *p, const coll_t *coll, int batch, int size_index) {
  int nlibs = p->run->nlibs;
  for (int form = 0; form < 2; form++) {
    if (form == 1 && !coll->in_place) continue;
    place_form(p, coll, form);
    int n = nlibs + (form == 0 && p->o->floor);
    for (int j = 0; j < n; j++) {
      int k = size_index % 2 ? n - 1 - j : j;
      int lib = k < nlibs ? k : BENCH_FLOOR;
      double *time_us = p->figs, *wrong = p->figs + p->nlocal;
      CHECK(measure_lib(p, coll, lib, batch, time_us, wrong));
      for (int i = 0; i < p->nlocal; i++) {
        double *figs = board_figs(p->run->board, p->row, p->ranks[i].rank);
        if (lib == BENCH_FLOOR) {
          figs[fig_floor()] = time_us[i];
          continue;
        }
        figs[fig_time(lib, form)] = time_us[i];
        figs[fig_wrong(lib, form)] = wrong[i];
      }
    }
  }
  return ncclSuccess;
}

/* The row's time from the ranks' times as -a asks: rank 0's, their mean, the fastest or the slowest. */
static double rank_time(const bench_proc_t *p, int fig) {
  double t = p->o->average == BENCH_AVG_MIN ? INFINITY : p->o->average == BENCH_AVG_MAX ? -INFINITY : 0;
  for (int r = 0; r < p->o->nranks; r++) {
    double v = board_figs(p->run->board, p->row, r)[fig];
    if (p->o->average == BENCH_AVG_RANK0) return v;
    t = p->o->average == BENCH_AVG_MIN ? fmin(t, v) : p->o->average == BENCH_AVG_MAX ? fmax(t, v) : t + v;
  }
  return p->o->average == BENCH_AVG_MEAN ? t / p->o->nranks : t;
}

/* Reads every rank's figures of the current row (after its barrier): the time (-a), the summed wrongs. */
static void gather_row(bench_proc_t *p, bench_row_t *row) {
  for (int form = 0; form < 2; form++) {
    bench_form_t *f = &row->form[form];
    f->skipped = form == 1 && !row->coll->in_place;
    for (int l = 0; l < BENCH_MAX_LIBS; l++) {
      f->time_us[l] = f->wrong[l] = NAN;
      if (f->skipped || l >= p->run->nlibs) continue;
      double w = 0;
      for (int r = 0; r < p->o->nranks; r++) w += board_figs(p->run->board, p->row, r)[fig_wrong(l, form)];
      f->time_us[l] = rank_time(p, fig_time(l, form));
      if (p->o->check) f->wrong[l] = w;
      if (p->o->check) p->wrong_total += w;
    }
  }
  double floor_us = -INFINITY;
  for (int r = 0; r < p->o->nranks; r++)
    floor_us = fmax(floor_us, board_figs(p->run->board, p->row, r)[fig_floor()]);
  row->floor_us = p->o->floor ? floor_us : NAN;
}

/* Keeps a row's measured forms for the JSON and PNG files. */
static ncclResult_t keep_row(bench_proc_t *p, const bench_row_t *row) {
  for (int form = 0; form < 2; form++) {
    const bench_form_t *f = &row->form[form];
    if (f->skipped) continue;
    report_row_t r = {.coll = row->coll->name,
                      .type = dtype_name(row->type),
                      .op = bench_op_name(row->op_kind),
                      .root = row->root,
                      .in_place = form,
                      .bytes = row->bytes,
                      .count = row->bytes / dtype_size(row->type),
                      .batch = row->batch,
                      .floor_us = row->floor_us};
    for (int l = 0; l < BENCH_MAX_LIBS; l++) {
      r.time_us[l] = f->time_us[l];
      r.algbw[l] = bench_algbw(row->bytes, f->time_us[l]);
      r.busbw[l] = bench_busbw(row->coll, p->o->nranks, row->bytes, f->time_us[l]);
      r.wrong[l] = f->wrong[l];
    }
    if (report_add(p->report, &r) != 0) return ncclSystemError;
  }
  return ncclSuccess;
}

/* Runs, gathers and reports one row: one size of one collective, type and operation. */
static ncclResult_t run_row(bench_proc_t *p, const coll_t *coll, ncclDataType_t type, int op_kind,
                            size_t bytes, int size_index) {
  coll_shape_t shape;
  coll->shape(bytes, dtype_size(type), p->o->nranks, 0, p->o->root, &shape);
  if (shape.bytes == p->last_bytes) return ncclSuccess;
  p->last_bytes = shape.bytes;
  bench_row_t row = {.coll = coll,
                     .type = type,
                     .op_kind = op_kind,
                     .root = coll->rooted ? p->o->root : -1,
                     .bytes = shape.bytes,
                     .batch = p->o->batch > 0 ? p->o->batch : stats_batch(shape.bytes, p->run->gpu)};
  CHECK(prepare_calls(p, coll, type, op_kind, bytes));
  ncclResult_t res = measure_row(p, coll, row.batch, size_index);
  ncclResult_t destroyed = destroy_ops(p);
  CHECK(res);
  CHECK(destroyed);
  CHECK(board_barrier(p->run->board)); /* every rank's figures of this row are on the board */
  gather_row(p, &row);
  p->row++;
  if (p->report == NULL) return ncclSuccess;
  table_row(p->o, p->run, &row, &p->avg);
  return keep_row(p, &row);
}

/* Sweeps the sizes from -b to -e for one collective, type and operation. */
static ncclResult_t sweep(bench_proc_t *p, const coll_t *coll, ncclDataType_t type, int op_kind) {
  const bench_opts_t *o = p->o;
  p->last_bytes = (size_t)-1;
  int index = 0;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; index++) {
    CHECK(run_row(p, coll, type, op_kind, bytes, index));
    if (o->step_factor == 1 && bytes > o->max_bytes - o->step_bytes)
      break;
    else if (o->step_factor == 1)
      bytes += o->step_bytes; /* -f 1: nccl-tests adds -i */
    else if (bytes == 0)
      bytes = 1;
    else if (bytes > o->max_bytes / o->step_factor)
      break;
    else
      bytes *= o->step_factor;
  }
  return ncclSuccess;
}

/* Runs one collective's table: every type, every operation (if it reduces), every size. */
static ncclResult_t run_table(bench_proc_t *p, const coll_t *coll) {
  static const int no_op[] = {BENCH_OP_NONE};
  const int *ops = coll->reduces ? p->o->ops : no_op;
  int nops = coll->reduces ? p->o->nops : 1;
  p->avg = (table_avg_t){0};
  if (p->report != NULL) table_header(p->o, p->run, coll);
  for (int t = 0; t < p->o->ntypes; t++)
    for (int op = 0; op < nops; op++) CHECK(sweep(p, coll, p->o->types[t], ops[op]));
  if (p->report != NULL) table_footer(p->run, &p->avg);
  return ncclSuccess;
}

/* The process -------------------------------------------------------------------------------------------- */

static void describe_run(const bench_proc_t *p, report_info_t *in) {
  const bench_opts_t *o = p->o;
  const bench_run_t *run = p->run;
  *in = (report_info_t){.date = run->date,
                        .gpu = run->gpu_name,
                        .device = run->gpu ? "cuda" : "host",
                        .layout = o->single ? "single" : "process",
                        .graphs = o->graph,
                        .nranks = o->nranks,
                        .samples = o->samples,
                        .warmup = o->warmup,
                        .batch = o->batch,
                        .check = o->check,
                        .floor = o->floor,
                        .gpus = run->gpu ? o->gpus : 0,
                        .nlibs = run->nlibs};
  for (int l = 0; l < run->nlibs; l++)
    in->libs[l] = (report_lib_t){.path = run->libs[l].path, .version = run->versions[l]};
}

/* Allocates the process's ranks and calls and sets up every rank's buffers, stream and marks. */
static ncclResult_t setup(bench_proc_t *p) {
  p->ranks = calloc((size_t)p->nlocal, sizeof(*p->ranks));
  p->calls = calloc((size_t)(p->run->nlibs * p->nlocal), sizeof(*p->calls));
  p->figs = calloc(2 * (size_t)p->nlocal, sizeof(*p->figs));
  if (p->ranks == NULL || p->calls == NULL || p->figs == NULL) {
    fprintf(stderr, "braid bench: out of memory for %d ranks\n", p->nlocal);
    return ncclSystemError;
  }
  for (int i = 0; i < p->nlocal; i++) p->ranks[i] = (dev_rank_t){.dev = -1};
  int ndev = 0;
  char why[160];
  const int need = bench_gpus_used(p->o, p->o->nranks);
  if (p->run->gpu && (drv_open(&ndev, why, sizeof(why)) != ncclSuccess || ndev < need)) {
    fprintf(stderr, "braid bench: rank %d: the CUDA driver has %d GPUs, %d wanted%s%s\n", p->first_rank, ndev,
            need, ndev == 0 ? ": " : "", ndev == 0 ? why : "");
    return ncclSystemError;
  }
  for (int i = 0; i < p->nlocal; i++) {
    int rank = p->first_rank + i;
    const int dev = p->run->gpu ? bench_gpu_of(p->o, rank) : -1;
    CHECK(dev_setup(&p->ranks[i], rank, dev, p->o->max_bytes, p->o->samples + 1));
  }
  return ncclSuccess;
}

static void teardown(bench_proc_t *p) {
  floor_teardown(p);
  for (int i = 0; p->ranks != NULL && i < p->nlocal; i++) dev_teardown(&p->ranks[i]);
  free(p->ranks);
  free(p->calls);
  free(p->figs);
}

/* Where rank 0 runs: the closing line and the files. Returns 0, or -1 when a file cannot be written. */
static int finish_report(const bench_proc_t *p, int complete) {
  if (complete)
    printf("# Out of bounds values : %.0f %s\n", p->wrong_total, p->wrong_total ? "FAILED" : "OK");
  fflush(stdout);
  int res = 0;
  if (p->o->json_path[0] != '\0' && report_write_json(p->report, p->o->json_path) != 0) res = -1;
  if (p->o->png_path[0] != '\0' && chart_write(p->report, p->o->png_path) != 0) res = -1;
  return res;
}

/* Every table, between the communicators' creation and destruction. After a failure nothing is destroyed:
 * a communicator may have work queued that waits for a peer that has gone, and the process is ending. */
static ncclResult_t run_all(bench_proc_t *p) {
  CHECK(p->o->single ? init_all(p) : init_ranks(p));
  if (p->o->floor) CHECK(floor_setup(p));
  /* -N: the whole run again, as nccl-tests' cycles; 0 repeats until the timeout ends it. */
  for (int cycle = 0; p->o->cycles == 0 || cycle < p->o->cycles; cycle++)
    for (int c = 0; c < p->o->ncolls; c++) CHECK(run_table(p, &bench_colls[p->o->colls[c]]));
  return destroy_comms(p);
}

int bench_proc_main(const bench_opts_t *o, const bench_run_t *run, int first_rank, int nlocal) {
  bench_proc_t p = {.o = o, .run = run, .first_rank = first_rank, .nlocal = nlocal};
  report_t report = {0};
  if (first_rank == 0) {
    p.report = &report;
    describe_run(&p, &report.info);
  }
  /* Fills and checks share the machine's cores with the other rank processes. */
  long ncpus = sysconf(_SC_NPROCESSORS_ONLN);
  data_set_threads((int)(ncpus > 0 ? ncpus : 1) / (o->single ? 1 : o->nranks));
  ncclResult_t res = setup(&p);
  if (res == ncclSuccess) res = run_all(&p);
  /* After a failure the buffers stay: freeing device memory may wait for kernels that wait for a lost peer.
   */
  if (res == ncclSuccess) teardown(&p);
  int status = res != ncclSuccess ? 1 : p.wrong_total ? BENCH_EXIT_WRONG : 0;
  if (status == 1) board_fail(run->board); /* the others stop waiting for this process at their barrier */
  if (p.report != NULL && finish_report(&p, res == ncclSuccess) != 0 && status == 0) status = 1;
  report_free(&report);
  fflush(stdout);
  return status;
}
