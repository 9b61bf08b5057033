/*
 * `braid bench`: nccl-tests-style measurements of every collective through a dlopen'ed NCCL library, on GPUs
 * or on the host backend, and side by side with a second library (--vs).
 *
 * The parent process parses the options (bench_opts.c), finds the GPUs in a throw-away child (it never
 * touches CUDA itself, so that its forked children can), loads the libraries and forks the rank processes
 * (bench.c): one per rank, or one for every rank (--single). Each initialises its communicators and runs the
 * sweep (bench_rank.c) over the collectives described in bench_coll.c; bench_measure.c times one library on
 * one row, bench_dev.c holds a rank's buffers, stream and timers, bench_data.c makes and checks the data, and
 * the rank holding rank 0 prints the tables (bench_table.c) and writes the JSON and PNG files.
 */
#ifndef BRAID_TOOLS_BENCH_H
#define BRAID_TOOLS_BENCH_H

#include <limits.h>
#include <stddef.h>
#include <stdio.h>

#include "bench_dev.h"
#include "board.h"
#include "lib.h"
#include "report.h"

/* The bench's reductions: NCCL's five built-in operations, then premulsum (made per row); NONE for the
 * collectives that reduce nothing. */
enum { BENCH_OP_NONE = -1, BENCH_OP_PREMULSUM = ncclNumOps, BENCH_NUM_OPS };
/* The scalar premulsum multiplies by: a power of two, so that every expected result stays exact. */
#define BENCH_PREMUL_SCALAR 2.0

/* The collectives, in the order the bench runs them. */
typedef enum {
  COLL_ALL_REDUCE,
  COLL_ALL_GATHER,
  COLL_REDUCE_SCATTER,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_ALLTOALL,
  COLL_SENDRECV,
  COLL_GATHER,
  COLL_SCATTER,
  COLL_COUNT
} coll_id_t;

/* Libraries one run measures: --lib and --vs. */
#define BENCH_MAX_LIBS REPORT_MAX_LIBS
/* What measure_lib takes in place of a library's index to time the floor kernel (--floor). */
#define BENCH_FLOOR BENCH_MAX_LIBS

/* Where the buffers live, as --device asks. */
typedef enum { BENCH_DEVICE_AUTO, BENCH_DEVICE_HOST, BENCH_DEVICE_CUDA } bench_device_t;

/* How -a (nccl-tests' --average) reduces the ranks' times of a row to one: rank 0's, their mean, the
 * fastest or the slowest (the bench's default). */
typedef enum { BENCH_AVG_RANK0, BENCH_AVG_MEAN, BENCH_AVG_MIN, BENCH_AVG_MAX } bench_avg_t;

/* What the command line asked for. */
typedef struct {
  size_t min_bytes, max_bytes;
  size_t step_factor; /* 1: sizes grow by step_bytes instead (nccl-tests' -f 1 -i N) */
  size_t step_bytes;
  int samples, batch, warmup, root, nranks; /* batch 0: chosen per size (stats_batch) */
  int check;                                /* -c: checked iterations per size (0: none) */
  int agg;                                  /* -m: calls per iteration, in one group */
  int cycles;                               /* -N: times the whole run is repeated (0: until the timeout) */
  int blocking;        /* -z: 0 none; 1, 2 the host waits for every iteration; 3 for every sample */
  bench_avg_t average; /* -a */
  int nranks_set;      /* -g or -t was given */
  int gpus; /* --gpus: the ranks share the first `gpus` GPUs, rank r on GPU r % gpus; 0: one GPU each */
  bench_device_t device;
  int single;    /* one process drives every rank */
  int graph;     /* -G N: each sample replays a CUDA graph of its iterations N times (0: eager calls) */
  int resources; /* --resources: memory, init and per-call host time instead of the sweep (bench_res.c) */
  int floor;     /* --floor: time the floor kernel in every row too (bench_floor.h) */
  int timeout_s; /* wall-clock limit for the whole run; 0: none */
  int ntypes, nops, ncolls;
  ncclDataType_t types[ncclNumTypes];
  int ops[BENCH_NUM_OPS]; /* ncclRedOp_t values, or BENCH_OP_PREMULSUM */
  coll_id_t colls[COLL_COUNT];
  char lib_path[PATH_MAX];
  char vs_path[PATH_MAX];   /* "" without --vs */
  char json_path[PATH_MAX]; /* "" without --json */
  char png_path[PATH_MAX];  /* "" without --png */
} bench_opts_t;

/* The GPU of `rank`: its own, or with --gpus one of the first o->gpus. */
static inline int bench_gpu_of(const bench_opts_t *o, int rank) {
  return o->gpus > 0 ? rank % o->gpus : rank;
}

/* How many GPUs `nranks` ranks land on (bench_gpu_of): the driver must have at least that many. */
static inline int bench_gpus_used(const bench_opts_t *o, int nranks) {
  return o->gpus > 0 && o->gpus < nranks ? o->gpus : nranks;
}

/* What the parent decided and loaded before forking; the rank processes inherit it. */
typedef struct {
  int gpu;   /* 1: buffers in CUDA device memory, rank r on device bench_gpu_of(r); 0: host memory */
  int nlibs; /* 1, or 2 with --vs */
  nccl_lib_t libs[BENCH_MAX_LIBS];
  int versions[BENCH_MAX_LIBS];
  int ngpus;         /* CUDA devices found (0 on the host) */
  char gpu_name[96]; /* device 0's name, or "none" */
  char date[32];     /* when the run started, UTC */
  board_t *board;    /* shared by the rank processes */
} bench_run_t;

/* The sizes of one call, derived from a sweep size in bytes as nccl-tests derives them. */
typedef struct {
  size_t count;      /* the count argument of the call */
  size_t send_elems; /* elements of this rank's send buffer */
  size_t recv_elems; /* elements of this rank's receive buffer (0 where nothing is received) */
  size_t bytes;      /* the reported size: the larger of the per-rank buffers, in bytes */
} coll_shape_t;

/* Everything one call needs. */
typedef struct {
  const nccl_lib_t *lib;
  ncclComm_t comm;
  cudaStream_t stream; /* the rank's stream (NULL on the host) */
  int rank, nranks, root;
  ncclDataType_t type;
  ncclRedOp_t op;
  int op_kind; /* the bench op (ncclRedOp_t or BENCH_OP_PREMULSUM) the data is chosen for */
  unsigned seed;
  void *send; /* the bench owns both buffers, so it may fill the send side; device memory on a GPU, so */
  void *recv; /* data_* work on a copy of the call that points at the buffers' host images */
  coll_shape_t shape;
} coll_call_t;

/* One collective: its names, how it is measured and how its result is predicted. */
typedef struct {
  const char *name; /* the bench's name, e.g. "all_reduce" */
  const char *api;  /* the call that runs it, for error messages */
  int reduces;      /* takes a reduction operation */
  int rooted;       /* takes a root */
  int in_place;     /* has an in-place form the bench measures */
  void (*shape)(size_t bytes, size_t esize, int nranks, int rank, int root, coll_shape_t *shape_p);
  double (*busbw_factor)(int nranks);
  /* Where an in-place call's send and receive buffers lie in the one buffer `base`. */
  void (*place)(const coll_call_t *call, char *base, void **send_p, void **recv_p);
  ncclResult_t (*run)(const coll_call_t *call);
  /* The expected value of element i of the receive buffer. */
  double (*expect)(const coll_call_t *call, size_t i);
} coll_t;

/* The collectives' table (bench_coll.c). */
extern const coll_t bench_colls[COLL_COUNT];

/* One form (out-of-place or in-place) of a row, over every rank and library. */
typedef struct {
  int skipped;                    /* the collective has no such form */
  double time_us[BENCH_MAX_LIBS]; /* median time per iteration of the slowest rank */
  double wrong[BENCH_MAX_LIBS];   /* wrong elements, summed over ranks */
} bench_form_t;

/* One row of a table: one size of one collective, type and operation. */
typedef struct {
  const coll_t *coll;
  ncclDataType_t type;
  int op_kind;
  int root; /* -1 for collectives without one */
  size_t bytes;
  int batch; /* iterations per sample */
  bench_form_t form[2];
  double floor_us; /* the floor kernel's time per iteration, slowest rank (--floor; else NaN) */
} bench_row_t;

/* Averages over one table's rows, for its closing lines. */
typedef struct {
  double busbw_sum[BENCH_MAX_LIBS];
  int n;
  double log_ratio_sum; /* sum of log(busbw A / busbw B) */
  int nratios;
} table_avg_t;

struct floor_rank;

/* This process's part of the run: its ranks (one, or every rank with --single). */
typedef struct {
  const bench_opts_t *o;
  const bench_run_t *run;
  int first_rank, nlocal;
  dev_rank_t *ranks;         /* [nlocal] */
  struct floor_rank *floors; /* [nlocal] with --floor, else NULL (bench_floor.h) */
  coll_call_t *calls;        /* [nlibs][nlocal]: the current row's calls */
  double *figs;              /* [2 * nlocal]: one library's times, then wrong counts, per local rank */
  long row;                  /* rows run so far: the board's slots, the data's seeds */
  size_t last_bytes;         /* the previous row's size, to skip sizes that round to the same counts */
  double wrong_total;        /* wrong elements over every row, rank and library */
  report_t *report;          /* the rows kept for --json and --png; NULL except where rank 0 runs */
  table_avg_t avg;           /* the current table's averages (where rank 0 runs) */
} bench_proc_t;

/* The current row's call of library `lib` on local rank `i`. */
static inline coll_call_t *bench_call(const bench_proc_t *p, int lib, int i) {
  return &p->calls[lib * p->nlocal + i];
}

/* Runs one form of the current row with library `lib` (bench_measure.c): a checked call when -c 1, the
 * warm-up, then the samples of `batch` iterations (eager, or replayed from a graph with -G). Writes each
 * local rank's median time per iteration and its count of wrong values (NaN unchecked). With BENCH_FLOOR
 * for `lib` it times the floor kernel the same way (nothing to check). */
ncclResult_t measure_lib(bench_proc_t *p, const coll_t *coll, int lib, int batch, double *time_us_p,
                         double *wrong_p);
/* Reports a failed library call once, naming the rank; passes the result on. */
ncclResult_t bench_called(const bench_proc_t *p, int lib, int rank, ncclComm_t comm, const char *what,
                          ncclResult_t res);

/* The algorithm and bus bandwidths of a time for a row's size, in GB/s (0 when the time is not positive). */
double bench_algbw(size_t bytes, double time_us);
double bench_busbw(const coll_t *coll, int nranks, size_t bytes, double time_us);

/* The text tables (bench_table.c), printed by the process holding rank 0; the run header by the parent. */
void table_run_header(const bench_opts_t *o, const bench_run_t *run);
void table_header(const bench_opts_t *o, const bench_run_t *run, const coll_t *coll);
void table_row(const bench_opts_t *o, const bench_run_t *run, const bench_row_t *row, table_avg_t *avg);
void table_footer(const bench_run_t *run, const table_avg_t *avg);

/* `braid bench`: returns the exit status. */
int bench_main(int argc, char **argv);

/* Parses `braid bench` arguments (argv[0] is "bench"). Returns 0, 1 for "exit successfully now" (help,
 * list) or -1 for a usage error (reported on stderr). */
int bench_parse(int argc, char **argv, bench_opts_t *opts_p);
/* Prints the bench's usage. */
void bench_usage(FILE *out);
/* The bench's name for an op (ncclRedOp_t or BENCH_OP_PREMULSUM). */
const char *bench_op_name(int op);

/* A rank's exit status when results were wrong: the table says so already, the parent need not. */
#define BENCH_EXIT_WRONG 3

/* Runs ranks first_rank to first_rank + nlocal - 1 in this (child) process. Returns the process exit status:
 * 0, BENCH_EXIT_WRONG, or 1 after a failure it has reported. */
int bench_proc_main(const bench_opts_t *o, const bench_run_t *run, int first_rank, int nlocal);

/* Fills and checks use up to n threads per process (default 1). */
void data_set_threads(int n);

/* Element i of rank `rank`'s send buffer (bench_data.c). */
double data_value(const coll_call_t *call, int rank, size_t i);
/* The reduction over all ranks of element i of their send buffers, as the library must compute it. */
double data_reduced(const coll_call_t *call, size_t i);
/* Fills the send buffer of this rank with its data. */
void data_fill(const coll_call_t *call);
/* Writes a value no correct result can hold into every receive element. */
void data_poison(const coll_call_t *call);
/* Counts the receive elements that differ from the collective's expectation. */
size_t data_check(const coll_t *coll, const coll_call_t *call);

#endif
