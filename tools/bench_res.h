/*
 * `braid bench --resources`: what a library costs besides bandwidth, for library A and (--vs) B in one
 * command: device memory per GPU before init, after init and after every collective ran once, the time of
 * ncclCommInitAll, the time of the first collective after it (lazy connection), and the host time per eager
 * call.
 *
 * The parent (bench_res.c) runs each library in a fresh child process of its own, one after the other, so
 * that each starts from GPUs holding nothing of the other's; the parent itself never touches CUDA. A child
 * (bench_res_run.c) drives every rank (rank r on device r, as --single) and writes its figures into memory
 * the parent shares with it; the parent prints them side by side with their ratio, and writes the JSON.
 */
#ifndef BRAID_TOOLS_BENCH_RES_H
#define BRAID_TOOLS_BENCH_RES_H

#include "bench.h"

/* The buffers' size and the first call's: big enough that a library sets up the connections (and the
 * protocols) its bandwidth path uses, small enough to fit anywhere. */
#define RES_BYTES ((size_t)1 << 20)
/* The all_reduce of the per-call loop: one float pair, as small as a call gets. */
#define RES_SMALL_BYTES 8
/* Iterations before the per-call loop, and in it. The loop is not synchronised, so it must stay below the
 * depth of every queue that would make a call wait for the GPU: Braid's work queue holds 16384 such launches
 * (1 MiB of 64-byte entries), NCCL's work FIFO 1 MiB too, and the driver takes about a thousand launches per
 * stream before it blocks. */
#define RES_WARMUP 100
#define RES_LOOP   500
/* The per-call loop and the floor's loop run in turn this many times, and each figure is the median of its
 * rounds: on the lab's machine the host's speed moved by a third between single runs, and in turn the two
 * loops see the same drift. */
#define RES_ROUNDS 7

/* The figures, in the order they are printed. */
typedef enum {
  RES_MEM_BEFORE_INIT, /* used device memory with the primary contexts alone */
  RES_INIT_MS,         /* ncclCommInitAll, wall clock */
  RES_MEM_AFTER_INIT,  /* used device memory after init */
  RES_MEM_BENCH,       /* what the bench's buffers and streams took (subtracted from the later figures) */
  RES_FIRST_MS,        /* the first all_reduce: group start to the end of every stream's synchronisation */
  RES_MEM_AFTER_ALL,   /* used device memory after every collective ran once, less the bench's */
  RES_MEM_INCREASE,    /* the same, less the memory before init */
  RES_ENQUEUE_US,      /* host time per eager call, enqueue only */
  RES_ITER_US,         /* time per iteration of the loop, synchronisation included */
  RES_FLOOR_US,        /* host time per rank of a context switch and an empty kernel's launch: the floor */
  RES_MEM_END,         /* used device memory after the loop, less the bench's */
  RES_COUNT
} res_fig_t;

/* How a figure is named, printed and compared. */
typedef struct {
  const char *key;  /* its name in the JSON file */
  const char *text; /* its line in the text report */
  int digits;       /* decimals printed */
  int memory;       /* a device-memory figure (max over GPUs): n/a on the host */
  int ratio;        /* the library's own cost, so B/A compares the libraries */
} res_desc_t;

extern const res_desc_t res_descs[RES_COUNT];

/* One library's figures. The child fills them in as its steps complete, so that a failed step leaves the
 * figures before it; NaN is a figure not measured (memory on the host, a step not reached). */
typedef struct {
  int complete;        /* every step ran */
  double v[RES_COUNT]; /* memory in MiB, times as their names say */
} res_figs_t;

/* In a child process: measures library `lib` with every rank in this process, writing into *figs. Returns
 * the process's exit status: 0, or 1 after a failure it has reported. */
int res_measure(const bench_opts_t *o, const bench_run_t *run, int lib, res_figs_t *figs);

/* `braid bench --resources` once the parent has settled the device and loaded the libraries: runs each
 * library's child, prints the report and writes the JSON. Returns the exit status. */
int bench_resources(const bench_opts_t *o, const bench_run_t *run);

#endif
