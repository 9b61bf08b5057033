/*
 * The bench's PNG (see chart.h): a header line saying what ran, then a row of two plot panels per
 * collective. With --floor the time panel has one more line, the floor kernel's time, after the libraries'.
 */
#include "chart.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"
#include "png.h"

#define WIDTH    1400
#define HEADER_H 64
#define ROW_H    460

/* The rows that one collective's charts show, and the points drawn from them. */
typedef struct {
  const report_row_t *first; /* the collective's first row: its type and operation are the ones shown */
  int n;
  double *x, *y[2][REPORT_MAX_LIBS]; /* [n]: bytes; busbw (0) and time (1) per library */
  double *floor_us;                  /* [n]: the floor kernel's time (--floor), else NULL */
} coll_points_t;

static int same_series(const report_row_t *a, const report_row_t *b) {
  return strcmp(a->coll, b->coll) == 0 && strcmp(a->type, b->type) == 0 && strcmp(a->op, b->op) == 0 &&
         a->in_place == 0 && b->in_place == 0;
}

/* Gathers the points of the collective whose first row is `first`. Returns 0, or -1 out of memory. */
static int gather(const report_t *r, const report_row_t *first, coll_points_t *p) {
  *p = (coll_points_t){.first = first};
  size_t max = r->nrows;
  p->x = calloc(max, sizeof(double));
  int ok = p->x != NULL;
  for (int k = 0; k < 2; k++)
    for (int l = 0; l < r->info.nlibs; l++) ok = ok && (p->y[k][l] = calloc(max, sizeof(double))) != NULL;
  if (r->info.floor) ok = ok && (p->floor_us = calloc(max, sizeof(double))) != NULL;
  if (!ok) return -1;
  for (size_t i = 0; i < r->nrows; i++) {
    const report_row_t *row = &r->rows[i];
    if (!same_series(first, row)) continue;
    p->x[p->n] = (double)row->bytes;
    for (int l = 0; l < r->info.nlibs; l++) {
      p->y[0][l][p->n] = row->busbw[l];
      p->y[1][l][p->n] = row->time_us[l];
    }
    if (p->floor_us != NULL) p->floor_us[p->n] = row->floor_us;
    p->n++;
  }
  return 0;
}

static void release(coll_points_t *p) {
  free(p->x);
  for (int k = 0; k < 2; k++)
    for (int l = 0; l < REPORT_MAX_LIBS; l++) free(p->y[k][l]);
  free(p->floor_us);
}

/* A library's legend label: its letter, version and the last two folders of its path
 * ("/opt/nccl/lib/libnccl.so.2" gives "nccl/lib"), at most 32 characters of them. */
static void lib_label(const report_lib_t *lib, int index, char *buf, size_t len) {
  const char *path = lib->path, *end = strrchr(path, '/'), *start = end;
  for (int slashes = 0; start != NULL && start > path; start--)
    if (start[-1] == '/' && ++slashes == 2) break;
  int tail = end != NULL ? (int)(end - start) : 0;
  if (tail > 32) {
    start += tail - 32;
    tail = 32;
  }
  int v = lib->version;
  snprintf(buf, len, "%c %d.%d.%d %.*s", 'A' + index, v / 10000, v % 10000 / 100, v % 100, tail,
           tail > 0 ? start : "");
}

static void draw_coll(plot_canvas_t *c, const report_t *r, const coll_points_t *p, int y, char labels[][64]) {
  plot_series_t series[2][REPORT_MAX_LIBS + 1];
  for (int k = 0; k < 2; k++)
    for (int l = 0; l < r->info.nlibs; l++)
      series[k][l] = (plot_series_t){.label = labels[l], .n = p->n, .x = p->x, .y = p->y[k][l]};
  int ntime = r->info.nlibs;
  if (p->floor_us != NULL)
    series[1][ntime++] = (plot_series_t){.label = "F floor kernel", .n = p->n, .x = p->x, .y = p->floor_us};
  char title[2][96];
  snprintf(title[0], sizeof(title[0]), "%s %s %s: bus bandwidth", p->first->coll, p->first->type,
           p->first->op);
  snprintf(title[1], sizeof(title[1]), "%s %s %s: time", p->first->coll, p->first->type, p->first->op);
  plot_panel_t bw = {.x = 0,
                     .y = y,
                     .width = WIDTH / 2,
                     .height = ROW_H,
                     .title = title[0],
                     .xlabel = "size (bytes)",
                     .ylabel = "busbw (GB/s)",
                     .nseries = r->info.nlibs,
                     .series = series[0]};
  plot_panel_t time = bw;
  time.x = WIDTH / 2;
  time.title = title[1];
  time.ylabel = "time (us)";
  time.ylog = 1;
  time.nseries = ntime;
  time.series = series[1];
  plot_panel(c, &bw);
  plot_panel(c, &time);
}

static void draw_header(plot_canvas_t *c, const report_info_t *in) {
  char line[256];
  snprintf(line, sizeof(line), "braid bench: %d ranks, %s, %s, %s; %s; %s", in->nranks, in->device,
           in->layout, in->graphs ? "CUDA graphs" : "eager", in->gpu, in->date);
  plot_text(c, 16, 12, line, 2, PLOT_INK);
  snprintf(line, sizeof(line), "median of %d samples per point, slowest rank; out-of-place", in->samples);
  plot_text(c, 16, 36, line, 2, PLOT_MUTED);
}

/* The collectives in the order of their first rows. Returns how many (at most max). */
static int first_rows(const report_t *r, const report_row_t **firsts, int max) {
  int n = 0;
  for (size_t i = 0; i < r->nrows && n < max; i++) {
    int seen = 0;
    for (int j = 0; j < n && !seen; j++) seen = strcmp(firsts[j]->coll, r->rows[i].coll) == 0;
    if (!seen) firsts[n++] = &r->rows[i];
  }
  return n;
}

int chart_write(const report_t *r, const char *path) {
  enum { MAX_COLLS = 16 };
  const report_row_t *firsts[MAX_COLLS];
  int ncolls = first_rows(r, firsts, MAX_COLLS);
  char labels[REPORT_MAX_LIBS][64];
  for (int l = 0; l < r->info.nlibs; l++) lib_label(&r->info.libs[l], l, labels[l], sizeof(labels[l]));
  plot_canvas_t c;
  if (plot_canvas_init(&c, WIDTH, HEADER_H + (ncolls > 0 ? ncolls : 1) * ROW_H) != 0) {
    fprintf(stderr, "braid bench: out of memory drawing %s\n", path);
    return -1;
  }
  draw_header(&c, &r->info);
  int res = 0;
  for (int i = 0; i < ncolls && res == 0; i++) {
    coll_points_t p;
    res = gather(r, firsts[i], &p);
    if (res == 0) draw_coll(&c, r, &p, HEADER_H + i * ROW_H, labels);
    release(&p);
  }
  if (res != 0) fprintf(stderr, "braid bench: out of memory drawing %s\n", path);
  png_image_t img = {.width = c.width,
                     .height = c.height,
                     .pixels = c.pixels,
                     .palette = plot_palette,
                     .ncolors = PLOT_NCOLORS};
  if (res == 0) res = png_write(&img, path);
  plot_canvas_free(&c);
  return res;
}
