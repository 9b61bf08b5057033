/*
 * Line charts on a palette canvas, for `braid bench --png`: a canvas of colour indices, text in the bitmap
 * font (font.h), lines, and chart panels whose x axis is a size in bytes on a log2 scale and whose y axis is
 * linear from 0 or log10. The canvas is written out with png.h.
 */
#ifndef BRAID_TOOLS_PLOT_H
#define BRAID_TOOLS_PLOT_H

#include <stdint.h>

/* The palette: the colour indices the canvas holds. */
enum {
  PLOT_BG,     /* white background */
  PLOT_INK,    /* black: frames, text */
  PLOT_GRID,   /* light grey grid lines */
  PLOT_MUTED,  /* dark grey: secondary text */
  PLOT_SERIES, /* first series colour; series i uses PLOT_SERIES + i % PLOT_NSERIES */
  PLOT_NSERIES = 4,
  PLOT_NCOLORS = PLOT_SERIES + PLOT_NSERIES
};
extern const uint8_t plot_palette[PLOT_NCOLORS][3];

/* Colour indices, row by row, and the rectangle drawing is clipped to. */
typedef struct {
  int width, height;
  uint8_t *pixels;
  int clip_x0, clip_y0, clip_x1, clip_y1; /* drawable: x0 <= x < x1, y0 <= y < y1 */
} plot_canvas_t;

/* Allocates a canvas filled with PLOT_BG. Returns 0, or -1 when memory runs out. */
int plot_canvas_init(plot_canvas_t *c, int width, int height);
void plot_canvas_free(plot_canvas_t *c);
/* Sets the clip rectangle; plot_unclip makes it the whole canvas. */
void plot_clip(plot_canvas_t *c, int x0, int y0, int x1, int y1);
void plot_unclip(plot_canvas_t *c);

void plot_fill(plot_canvas_t *c, int x, int y, int w, int h, uint8_t color);
/* A line from (x0, y0) to (x1, y1), `thick` pixels wide. */
void plot_line(plot_canvas_t *c, int x0, int y0, int x1, int y1, uint8_t color, int thick);
/* Text with its top-left corner at (x, y), each font pixel drawn as scale x scale pixels. */
void plot_text(plot_canvas_t *c, int x, int y, const char *s, int scale, uint8_t color);
/* Text turned a quarter turn counter-clockwise, reading bottom to top, its bottom-left corner at (x, y). */
void plot_text_up(plot_canvas_t *c, int x, int y, const char *s, int scale, uint8_t color);
/* The width of text in pixels. */
int plot_text_width(const char *s, int scale);

/* A sequence of points drawn as a line with markers; points with y <= 0 (or NaN) on a log axis, or NaN on a
 * linear one, are left out. */
typedef struct {
  const char *label;
  int n;
  const double *x; /* sizes in bytes, > 0 */
  const double *y;
} plot_series_t;

/* One chart: a frame with its axes, grid, labels and a legend of its series. */
typedef struct {
  int x, y, width, height; /* where on the canvas, labels included */
  const char *title, *xlabel, *ylabel;
  int ylog; /* 1: log10 y axis; 0: linear from 0 */
  int nseries;
  const plot_series_t *series;
} plot_panel_t;

void plot_panel(plot_canvas_t *c, const plot_panel_t *p);
/* A size in bytes as an axis label: 8, 512, 1K, 64M, 4G. */
void plot_size_label(double bytes, char *buf, int len);

#endif
