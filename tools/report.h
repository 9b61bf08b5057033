/*
 * What a bench run measured, kept for the files written at its end: `--json FILE` (every figure) and, through
 * chart.h, `--png FILE`. The rows are those of the printed tables: one per collective, type, operation, size
 * and form (out-of-place or in-place), with each library's time, bandwidths and wrong-value count.
 */
#ifndef BRAID_TOOLS_REPORT_H
#define BRAID_TOOLS_REPORT_H

#include <stddef.h>
#include <stdio.h>

/* Libraries a run compares. */
#define REPORT_MAX_LIBS 2

/* One measured library. */
typedef struct {
  const char *path;
  int version; /* ncclGetVersion's code */
} report_lib_t;

/* How the run measured. */
typedef struct {
  const char *date;   /* UTC, ISO 8601 */
  const char *gpu;    /* the first GPU's name, or "none" */
  const char *device; /* "cuda" or "host" */
  const char *layout; /* "process" (one per rank) or "single" (one process drives every rank) */
  int graphs;         /* timed iterations replayed from CUDA graphs */
  int nranks, samples, warmup, batch, check; /* batch 0: chosen per size */
  int floor;                                 /* rows carry the floor kernel's time */
  int gpus;                                  /* --gpus: ranks share this many GPUs; 0: one GPU per rank */
  int nlibs;
  report_lib_t libs[REPORT_MAX_LIBS];
} report_info_t;

/* One row. Names are static strings. Figures that do not exist are NaN (written as null). */
typedef struct {
  const char *coll, *type, *op;
  int root;     /* -1 for collectives without one */
  int in_place; /* 0: out-of-place, 1: in-place */
  size_t bytes, count;
  int batch; /* iterations per sample */
  double time_us[REPORT_MAX_LIBS], algbw[REPORT_MAX_LIBS], busbw[REPORT_MAX_LIBS];
  double wrong[REPORT_MAX_LIBS]; /* NaN when not checked */
  double floor_us;               /* the floor kernel's time (the same for both forms); NaN without */
} report_row_t;

typedef struct {
  report_info_t info;
  report_row_t *rows;
  size_t nrows, cap;
} report_t;

/* Appends a row. Returns 0, or -1 when memory runs out (reported). */
int report_add(report_t *r, const report_row_t *row);
void report_free(report_t *r);
/* The comparison ratios of a row: other library's time over the first's, first's busbw over the other's
 * (> 1: the first library is faster). NaN without a second library or a figure. */
double report_time_ratio(const report_row_t *row);
double report_busbw_ratio(const report_row_t *row);
/* JSON values: a string in quotes, with backslash, quote and control characters escaped; a number, or null
 * for NaN and infinities (which JSON lacks). */
void report_json_string(FILE *f, const char *s);
void report_json_number(FILE *f, double v);
/* Writes the run as JSON. Returns 0, or -1 with the reason on stderr. */
int report_write_json(const report_t *r, const char *path);

#endif
