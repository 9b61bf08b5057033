/*
 * One rank of `braid bench`, in its own process: initialises the communicator, then for each collective,
 * type, operation and size measures the out-of-place and in-place forms and (on rank 0) prints the row.
 *
 * Timing follows nccl-tests: `iters` back-to-back calls after `warmup` untimed ones, the mean per call, and
 * the slowest rank's mean, gathered with an all-reduce (max) through the measured library itself. On the
 * host backend a call completes before it returns, so wall time around the calls is the collective's time.
 */
#include "bench.h"

#include <stdlib.h>
#include <time.h>

#include "base/check.h"
#include "base/dtype.h"
#include "elem.h"

/* This rank's state. */
typedef struct {
  const nccl_lib_t *lib;
  const bench_opts_t *o;
  ncclComm_t comm;
  int rank;
  char *sbuf, *rbuf; /* send and receive buffers, max_bytes each */
  double *stat;      /* two doubles: the input and output of the statistics all-reduces */
  unsigned rows;     /* rows run so far: seeds the data */
  size_t last_bytes; /* the previous row's size, to skip sizes that round to the same counts */
  double busbw_sum;  /* this table's bus bandwidths, for its average */
  int busbw_n;
  double wrong_total; /* wrong elements over every row and rank */
} rank_t;

/* One measured form (out-of-place or in-place) of one row. */
typedef struct {
  int skipped;    /* the collective has no such form */
  double time_us; /* mean time per call, slowest rank */
  double wrong;   /* wrong elements, summed over ranks */
} result_t;

/* Reports a failed library call once, where it failed; passes the result on. */
static ncclResult_t called(const rank_t *r, const char *what, ncclResult_t res) {
  if (res != ncclSuccess) {
    char who[64];
    snprintf(who, sizeof(who), "braid bench: rank %d", r->rank);
    lib_report(r->lib, r->comm, who, what, res);
  }
  return res;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reduces one double over all ranks (max or sum) with the measured library. */
static ncclResult_t reduce_stat(rank_t *r, double *v, ncclRedOp_t op) {
  r->stat[0] = *v;
  CHECK(called(r, "ncclAllReduce (statistics)",
               r->lib->AllReduce(&r->stat[0], &r->stat[1], 1, ncclFloat64, op, r->comm, NULL)));
  *v = r->stat[1];
  return ncclSuccess;
}

/* Runs the call `n` times. */
static ncclResult_t repeat(const rank_t *r, const coll_t *coll, const coll_call_t *call, int n) {
  for (int i = 0; i < n; i++) CHECK(called(r, coll->api, coll->run(call)));
  return ncclSuccess;
}

/* One checked call on fresh data: poisons the receive side, fills the send side, runs, counts mismatches. */
static ncclResult_t check_once(const rank_t *r, const coll_t *coll, const coll_call_t *call,
                               double *wrong_p) {
  data_poison(call);
  data_fill(call); /* after the poison: in place, the send data may lie inside the receive buffer */
  CHECK(called(r, coll->api, coll->run(call)));
  *wrong_p = (double)data_check(coll, call);
  return ncclSuccess;
}

/* Measures one form of a row: the check, the warm-up, then the timed calls; statistics over all ranks. */
static ncclResult_t measure(rank_t *r, const coll_t *coll, coll_call_t *call, int in_place, result_t *res_p) {
  result_t res = {.skipped = in_place && !coll->in_place};
  if (res.skipped) {
    *res_p = res;
    return ncclSuccess;
  }
  call->seed = 2 * r->rows + (unsigned)in_place;
  call->send = r->sbuf;
  call->recv = r->rbuf;
  if (in_place) coll->place(call, r->rbuf, &call->send, &call->recv);
  if (r->o->check) CHECK(check_once(r, coll, call, &res.wrong));
  CHECK(repeat(r, coll, call, r->o->warmup));
  double barrier = 0;
  CHECK(reduce_stat(r, &barrier, ncclSum)); /* all ranks start the timed calls together */
  double start = now_s();
  CHECK(repeat(r, coll, call, r->o->iters));
  res.time_us = (now_s() - start) * 1e6 / r->o->iters;
  CHECK(reduce_stat(r, &res.time_us, ncclMax));
  CHECK(reduce_stat(r, &res.wrong, ncclSum));
  *res_p = res;
  return ncclSuccess;
}

static void print_table_header(const coll_t *coll) {
  printf("#\n# %s\n#\n", coll->name);
  printf("#%77s%33s\n", "out-of-place", "in-place");
  printf("#%11s%14s%10s%10s%6s%10s%8s%8s%7s%10s%8s%8s%7s\n", "size", "count", "type", "redop", "root", "time",
         "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("#%11s%14s%10s%10s%6s%10s%8s%8s%7s%10s%8s%8s%7s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

/* The algorithm and bus bandwidths of one form, in GB/s. */
static void bandwidths(const rank_t *r, const coll_t *coll, size_t bytes, const result_t *res,
                       double bw_p[2]) {
  bw_p[0] = res->time_us > 0 ? (double)bytes / res->time_us / 1e3 : 0;
  bw_p[1] = bw_p[0] * coll->busbw_factor(r->o->nranks);
}

/* Prints one form's four columns. */
static void print_result(const rank_t *r, const coll_t *coll, size_t bytes, const result_t *res) {
  if (res->skipped) {
    printf("%10s%8s%8s%7s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  double bw[2];
  bandwidths(r, coll, bytes, res, bw);
  printf("%10.2f%8.2f%8.2f", res->time_us, bw[0], bw[1]);
  if (r->o->check)
    printf("%7.0f", res->wrong);
  else
    printf("%7s", "N/A");
}

static void print_row(const rank_t *r, const coll_t *coll, const coll_call_t *call, const result_t res[2]) {
  size_t esize = dtype_size(call->type);
  printf("%12zu%14zu%10s%10s%6d", call->shape.bytes, call->shape.bytes / esize, dtype_name(call->type),
         bench_op_name(call->op_kind), coll->rooted ? call->root : -1);
  print_result(r, coll, call->shape.bytes, &res[0]);
  print_result(r, coll, call->shape.bytes, &res[1]);
  printf("\n");
  fflush(stdout);
}

/* Adds a row's results to the table's average and the run's count of wrong values. */
static void tally(rank_t *r, const coll_t *coll, size_t bytes, const result_t res[2]) {
  for (int f = 0; f < 2; f++) {
    if (res[f].skipped) continue;
    double bw[2];
    bandwidths(r, coll, bytes, &res[f], bw);
    r->busbw_sum += bw[1];
    r->busbw_n++;
    r->wrong_total += res[f].wrong;
  }
}

/* Makes the row's reduction: a built-in one, or a premulsum whose scalar is given in the row's type. */
static ncclResult_t make_op(const rank_t *r, coll_call_t *call) {
  if (call->op_kind != BENCH_OP_PREMULSUM) {
    call->op = call->op_kind == BENCH_OP_NONE ? ncclSum : (ncclRedOp_t)call->op_kind;
    return ncclSuccess;
  }
  double scalar[1]; /* eight bytes: room for one element of any type */
  elem_set(call->type, scalar, 0, BENCH_PREMUL_SCALAR);
  return called(
      r, "ncclRedOpCreatePreMulSum",
      r->lib->RedOpCreatePreMulSum(&call->op, scalar, call->type, ncclScalarHostImmediate, r->comm));
}

/* Runs and prints one row: one size of one collective, type and operation. */
static ncclResult_t run_row(rank_t *r, const coll_t *coll, ncclDataType_t type, int op_kind, size_t bytes) {
  coll_call_t call = {.lib = r->lib,
                      .comm = r->comm,
                      .rank = r->rank,
                      .nranks = r->o->nranks,
                      .root = r->o->root,
                      .type = type,
                      .op_kind = op_kind};
  coll->shape(bytes, dtype_size(type), call.nranks, call.rank, call.root, &call.shape);
  if (call.shape.bytes == r->last_bytes) return ncclSuccess;
  r->last_bytes = call.shape.bytes;
  CHECK(make_op(r, &call));
  result_t res[2];
  ncclResult_t ret = measure(r, coll, &call, 0, &res[0]);
  if (ret == ncclSuccess) ret = measure(r, coll, &call, 1, &res[1]);
  if (op_kind == BENCH_OP_PREMULSUM) {
    ncclResult_t destroyed = called(r, "ncclRedOpDestroy", r->lib->RedOpDestroy(call.op, r->comm));
    if (ret == ncclSuccess) ret = destroyed;
  }
  CHECK(ret);
  r->rows++;
  tally(r, coll, call.shape.bytes, res);
  if (r->rank == 0) print_row(r, coll, &call, res);
  return ncclSuccess;
}

/* Sweeps the sizes from -b to -e for one collective, type and operation. */
static ncclResult_t sweep(rank_t *r, const coll_t *coll, ncclDataType_t type, int op_kind) {
  const bench_opts_t *o = r->o;
  r->last_bytes = (size_t)-1;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;) {
    CHECK(run_row(r, coll, type, op_kind, bytes));
    if (bytes == 0)
      bytes = 1;
    else if (bytes > o->max_bytes / o->step_factor)
      break;
    else
      bytes *= o->step_factor;
  }
  return ncclSuccess;
}

/* Runs one collective's table: every type, every operation (if it reduces), every size. */
static ncclResult_t run_table(rank_t *r, const coll_t *coll) {
  static const int no_op[] = {BENCH_OP_NONE};
  const int *ops = coll->reduces ? r->o->ops : no_op;
  int nops = coll->reduces ? r->o->nops : 1;
  if (r->rank == 0) print_table_header(coll);
  r->busbw_sum = 0;
  r->busbw_n = 0;
  for (int t = 0; t < r->o->ntypes; t++)
    for (int op = 0; op < nops; op++) CHECK(sweep(r, coll, r->o->types[t], ops[op]));
  if (r->rank == 0) printf("# Avg bus bandwidth    : %g\n", r->busbw_n ? r->busbw_sum / r->busbw_n : 0.0);
  return ncclSuccess;
}

/* Allocates the buffers: as large as the largest size, and filled so that unchecked runs see numbers. */
static int alloc_buffers(rank_t *r) {
  size_t bytes = r->o->max_bytes > 0 ? r->o->max_bytes : 1;
  r->sbuf = calloc(1, bytes);
  r->rbuf = calloc(1, bytes);
  r->stat = calloc(2, sizeof(double));
  if (r->sbuf == NULL || r->rbuf == NULL || r->stat == NULL) {
    fprintf(stderr, "braid bench: rank %d: out of memory for two buffers of %zu bytes\n", r->rank, bytes);
    return -1;
  }
  return 0;
}

int bench_rank_main(const nccl_lib_t *lib, const bench_opts_t *opts, const ncclUniqueId *id, int rank) {
  rank_t r = {.lib = lib, .o = opts, .rank = rank};
  int status = 1;
  ncclResult_t res = ncclSuccess;
  if (alloc_buffers(&r) != 0) goto err_free;
  if (called(&r, "ncclCommInitRank", lib->CommInitRank(&r.comm, opts->nranks, *id, rank)) != ncclSuccess)
    goto err_free;
  for (int c = 0; c < opts->ncolls && res == ncclSuccess; c++)
    res = run_table(&r, &bench_colls[opts->colls[c]]);
  if (res == ncclSuccess) {
    if (rank == 0)
      printf("# Out of bounds values : %.0f %s\n", r.wrong_total, r.wrong_total ? "FAILED" : "OK");
    status = r.wrong_total ? BENCH_EXIT_WRONG : 0;
    res = called(&r, "ncclCommDestroy", lib->CommDestroy(r.comm));
    if (res != ncclSuccess) status = 1;
  }
err_free:
  free(r.stat);
  free(r.rbuf);
  free(r.sbuf);
  fflush(stdout);
  return status;
}
