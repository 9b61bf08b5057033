/*
 * `braid bench --floor`: the floor of a small collective, measured in the same run as the libraries. Each row
 * also times the floor kernel (tools/floor.cu) in the row's mode, eagerly or replayed from a graph, one
 * process per GPU or one for all, with the same warm-up, batches and samples as a library's call: one launch
 * per rank that stores a line into every other rank's memory and waits for theirs. It moves no data, so it
 * is the floor of the small sizes only; at large sizes the link's bandwidth is the limit
 * (docs/performance.md).
 *
 * Each rank's page is device memory that the other ranks' kernels write to: reached through peer access when
 * one process drives every rank, through an IPC handle passed on the board otherwise.
 */
#ifndef BRAID_TOOLS_BENCH_FLOOR_H
#define BRAID_TOOLS_BENCH_FLOOR_H

#include "bench.h"
#include "floor_args.h"

/* The floor kernel's fatbin (tools/floor.cu, embedded by the build); the size is 0 in a build without nvcc.
 */
extern const unsigned char bench_floor_fatbin[];
extern const unsigned long long bench_floor_fatbin_size;

/* How long a floor launch waits for another rank's line before it gives up (and the bench fails). */
#define FLOOR_TIMEOUT_NS 10000000000ull

/* One local rank's floor kernel and page. */
struct floor_rank {
  drv_module_t module;
  drv_function_t kernel;
  void *page;
  void *opened[FLOOR_MAX_RANKS]; /* other processes' pages mapped here, to be closed */
  floor_args_t args;
  int overlap; /* launches overlap the stream's previous kernel, as Braid's do (drv_can_overlap) */
};

/* Whether this build has the floor kernel; when not, writes why into `why`. */
int floor_available(char *why, size_t len);
/* Loads the kernel and makes the pages of this process's ranks, then joins every rank's page: every process
 * of the run calls it at the same point (it meets the others on the board). */
ncclResult_t floor_setup(bench_proc_t *p);
/* Launches local rank i's floor kernel on its stream (captured when the stream is). */
ncclResult_t floor_launch(const bench_proc_t *p, int i);
/* After the launches have run: fails, naming the rank waited for, when one of them gave up waiting. */
ncclResult_t floor_check(const bench_proc_t *p);
/* Frees what floor_setup made. */
void floor_teardown(bench_proc_t *p);

#endif
