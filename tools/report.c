/*
 * The run's rows and their JSON form (see report.h). The file is one object: "tool", "date", "gpu", "mode"
 * (how it measured), "libraries" (path and version of each, "A" then "B") and "results" (one object per
 * row, with per-library arrays in the libraries' order). NaN and infinities, which JSON lacks, are null.
 */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int report_add(report_t *r, const report_row_t *row) {
  if (r->nrows == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 256;
    report_row_t *grown = realloc(r->rows, cap * sizeof(*grown));
    if (grown == NULL) {
      fprintf(stderr, "braid bench: out of memory keeping %zu result rows\n", cap);
      return -1;
    }
    r->rows = grown;
    r->cap = cap;
  }
  r->rows[r->nrows++] = *row;
  return 0;
}

void report_free(report_t *r) {
  free(r->rows);
  r->rows = NULL;
  r->nrows = r->cap = 0;
}

double report_time_ratio(const report_row_t *row) {
  return row->time_us[1] / row->time_us[0];
}

double report_busbw_ratio(const report_row_t *row) {
  return row->busbw[0] / row->busbw[1];
}

void report_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s != '\0'; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

void report_json_number(FILE *f, double v) {
  if (isnan(v) || isinf(v))
    fputs("null", f);
  else
    fprintf(f, "%.6g", v);
}

/* "key": [v0, v1] over the run's libraries. */
static void put_per_lib(FILE *f, const char *key, const double *v, int nlibs) {
  fprintf(f, ", \"%s\": [", key);
  for (int l = 0; l < nlibs; l++) {
    if (l > 0) fputs(", ", f);
    report_json_number(f, v[l]);
  }
  fputc(']', f);
}

static void put_info(FILE *f, const report_info_t *in) {
  fputs("{\n  \"tool\": \"braid bench\",\n  \"date\": ", f);
  report_json_string(f, in->date);
  fputs(",\n  \"gpu\": ", f);
  report_json_string(f, in->gpu);
  fprintf(f, ",\n  \"mode\": {\"device\": \"%s\", \"layout\": \"%s\", \"graphs\": %s, \"nranks\": %d, ",
          in->device, in->layout, in->graphs ? "true" : "false", in->nranks);
  fprintf(f, "\"samples\": %d, \"warmup\": %d, \"batch\": ", in->samples, in->warmup);
  if (in->batch > 0)
    fprintf(f, "%d", in->batch);
  else
    fputs("\"auto\"", f);
  fprintf(f, ", \"check\": %s, \"floor\": %s, \"gpus\": %d},\n  \"libraries\": [",
          in->check ? "true" : "false", in->floor ? "true" : "false", in->gpus);
  for (int l = 0; l < in->nlibs; l++) {
    fprintf(f, "%s\n    {\"name\": \"%c\", \"path\": ", l ? "," : "", 'A' + l);
    report_json_string(f, in->libs[l].path);
    fprintf(f, ", \"version\": %d}", in->libs[l].version);
  }
  fputs("\n  ],\n", f);
}

static void put_row(FILE *f, const report_row_t *row, int nlibs) {
  fputs("    {\"collective\": ", f);
  report_json_string(f, row->coll);
  fputs(", \"type\": ", f);
  report_json_string(f, row->type);
  fputs(", \"op\": ", f);
  report_json_string(f, row->op);
  fprintf(f, ", \"root\": %d, \"place\": \"%s\", \"bytes\": %zu, \"count\": %zu, \"batch\": %d", row->root,
          row->in_place ? "in" : "out", row->bytes, row->count, row->batch);
  put_per_lib(f, "time_us", row->time_us, nlibs);
  put_per_lib(f, "algbw", row->algbw, nlibs);
  put_per_lib(f, "busbw", row->busbw, nlibs);
  put_per_lib(f, "wrong", row->wrong, nlibs);
  fputs(", \"time_ratio\": ", f);
  report_json_number(f, nlibs > 1 ? report_time_ratio(row) : NAN);
  fputs(", \"busbw_ratio\": ", f);
  report_json_number(f, nlibs > 1 ? report_busbw_ratio(row) : NAN);
  fputs(", \"floor_us\": ", f);
  report_json_number(f, row->floor_us);
  fputc('}', f);
}

int report_write_json(const report_t *r, const char *path) {
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "braid bench: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  put_info(f, &r->info);
  fputs("  \"results\": [", f);
  for (size_t i = 0; i < r->nrows; i++) {
    fputs(i ? ",\n" : "\n", f);
    put_row(f, &r->rows[i], r->info.nlibs);
  }
  fputs("\n  ]\n}\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    fprintf(stderr, "braid bench: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}
