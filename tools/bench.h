/*
 * `braid bench`: nccl-tests-style measurements of every collective through a dlopen'ed NCCL library.
 *
 * The parent process parses the options (bench_opts.c), makes the unique id and forks one child per rank
 * (bench.c); each child initialises its communicator and runs the sweep (bench_rank.c) over the collectives
 * described in bench_coll.c, checking results against values computed on the host (bench_data.c).
 */
#ifndef BRAID_TOOLS_BENCH_H
#define BRAID_TOOLS_BENCH_H

#include <limits.h>
#include <stddef.h>
#include <stdio.h>

#include "lib.h"

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

/* What the command line asked for. */
typedef struct {
  size_t min_bytes, max_bytes;
  size_t step_factor;
  int iters, warmup, check, root, nranks;
  int timeout_s; /* wall-clock limit for the whole run; 0: none */
  int ntypes, nops, ncolls;
  ncclDataType_t types[ncclNumTypes];
  int ops[BENCH_NUM_OPS]; /* ncclRedOp_t values, or BENCH_OP_PREMULSUM */
  coll_id_t colls[COLL_COUNT];
  char lib_path[PATH_MAX];
} bench_opts_t;

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
  int rank, nranks, root;
  ncclDataType_t type;
  ncclRedOp_t op;
  int op_kind; /* the bench op (ncclRedOp_t or BENCH_OP_PREMULSUM) the data is chosen for */
  unsigned seed;
  void *send; /* the bench owns both buffers, so it may fill the send side */
  void *recv;
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

/* Runs rank `rank`'s part of the bench in this (child) process. Returns the process exit status: 0,
 * BENCH_EXIT_WRONG, or 1 after a failure it has reported. */
int bench_rank_main(const nccl_lib_t *lib, const bench_opts_t *opts, const ncclUniqueId *id, int rank);

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
