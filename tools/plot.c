/*
 * Line charts on a palette canvas (see plot.h). Everything is drawn through set_px, which clips, so lines and
 * markers may run past a chart's frame without writing outside it. Text is drawn at twice the font's size in
 * charts: 12 pixels a character, 14 high.
 */
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "font.h"

const uint8_t plot_palette[PLOT_NCOLORS][3] = {
    [PLOT_BG] = {255, 255, 255},       [PLOT_INK] = {0, 0, 0},
    [PLOT_GRID] = {222, 222, 222},     [PLOT_MUTED] = {96, 96, 96},
    [PLOT_SERIES + 0] = {31, 99, 180}, [PLOT_SERIES + 1] = {230, 120, 20},
    [PLOT_SERIES + 2] = {40, 150, 60}, [PLOT_SERIES + 3] = {200, 40, 40},
};

/* Chart layout, in pixels. */
#define TEXT_SCALE 2
#define MARGIN_L   100 /* y tick labels and the y axis label */
#define MARGIN_R   24
#define MARGIN_T   36 /* the title */
#define MARGIN_B   64 /* x tick labels and the x axis label */
#define MARKER     5

int plot_canvas_init(plot_canvas_t *c, int width, int height) {
  *c = (plot_canvas_t){.width = width, .height = height};
  c->pixels = malloc((size_t)width * (size_t)height);
  if (c->pixels == NULL) return -1;
  memset(c->pixels, PLOT_BG, (size_t)width * (size_t)height);
  plot_unclip(c);
  return 0;
}

void plot_canvas_free(plot_canvas_t *c) {
  free(c->pixels);
  c->pixels = NULL;
}

void plot_clip(plot_canvas_t *c, int x0, int y0, int x1, int y1) {
  c->clip_x0 = x0 < 0 ? 0 : x0;
  c->clip_y0 = y0 < 0 ? 0 : y0;
  c->clip_x1 = x1 > c->width ? c->width : x1;
  c->clip_y1 = y1 > c->height ? c->height : y1;
}

void plot_unclip(plot_canvas_t *c) {
  plot_clip(c, 0, 0, c->width, c->height);
}

static void set_px(plot_canvas_t *c, int x, int y, uint8_t color) {
  if (x >= c->clip_x0 && x < c->clip_x1 && y >= c->clip_y0 && y < c->clip_y1)
    c->pixels[(size_t)y * (size_t)c->width + (size_t)x] = color;
}

void plot_fill(plot_canvas_t *c, int x, int y, int w, int h, uint8_t color) {
  for (int j = y; j < y + h; j++)
    for (int i = x; i < x + w; i++) set_px(c, i, j, color);
}

void plot_line(plot_canvas_t *c, int x0, int y0, int x1, int y1, uint8_t color, int thick) {
  /* Bresenham's walk over the longer axis; each step stamps a thick x thick square. */
  int dx = abs(x1 - x0), dy = -abs(y1 - y0);
  int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy, off = (thick - 1) / 2;
  for (;;) {
    plot_fill(c, x0 - off, y0 - off, thick, thick, color);
    if (x0 == x1 && y0 == y1) break;
    int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

int plot_text_width(const char *s, int scale) {
  int n = (int)strlen(s);
  return n > 0 ? (n * FONT_ADVANCE - (FONT_ADVANCE - FONT_W)) * scale : 0;
}

void plot_text(plot_canvas_t *c, int x, int y, const char *s, int scale, uint8_t color) {
  for (; *s != '\0'; s++, x += FONT_ADVANCE * scale) {
    const uint8_t *g = font_glyph(*s);
    int top = y + font_drop(*s) * scale;
    for (int row = 0; row < FONT_H; row++)
      for (int col = 0; col < FONT_W; col++)
        if (g[row] >> (FONT_W - 1 - col) & 1)
          plot_fill(c, x + col * scale, top + row * scale, scale, scale, color);
  }
}

void plot_text_up(plot_canvas_t *c, int x, int y, const char *s, int scale, uint8_t color) {
  /* Turned counter-clockwise: a glyph's column becomes a distance up from y, its row a distance right of x.
   */
  for (; *s != '\0'; s++, y -= FONT_ADVANCE * scale) {
    const uint8_t *g = font_glyph(*s);
    int left = x + font_drop(*s) * scale;
    for (int row = 0; row < FONT_H; row++)
      for (int col = 0; col < FONT_W; col++)
        if (g[row] >> (FONT_W - 1 - col) & 1)
          plot_fill(c, left + row * scale, y - (col + 1) * scale, scale, scale, color);
  }
}

void plot_size_label(double bytes, char *buf, int len) {
  static const char units[] = " KMGTPE";
  int u = 0;
  while (bytes >= 1024 && units[u + 1] != '\0') {
    bytes /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, (size_t)len, "%.0f", bytes);
  else
    snprintf(buf, (size_t)len, "%g%c", bytes, units[u]);
}

/* Where a panel's axes map values to pixels. */
typedef struct {
  int x0, y0, w, h; /* the plot area inside the frame */
  double xlo, xhi;  /* log2 of the x range */
  double ylo, yhi;  /* the y range; log10 of it on a log axis */
  int ylog;
} axes_t;

static int map_x(const axes_t *a, double bytes) {
  return a->x0 + (int)lround((log2(bytes) - a->xlo) / (a->xhi - a->xlo) * (a->w - 1));
}

static int map_y(const axes_t *a, double v) {
  double t = a->ylog ? log10(v) : v;
  return a->y0 + a->h - 1 - (int)lround((t - a->ylo) / (a->yhi - a->ylo) * (a->h - 1));
}

static int usable(const axes_t *a, double y) {
  return !isnan(y) && !isinf(y) && (!a->ylog || y > 0);
}

/* The data's extent: x in log2, y as the axis will show it. Empty or degenerate ranges get a default. */
static void fit_axes(const plot_panel_t *p, axes_t *a) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (int s = 0; s < p->nseries; s++)
    for (int i = 0; i < p->series[s].n; i++) {
      double x = p->series[s].x[i], y = p->series[s].y[i];
      if (x <= 0 || !usable(a, y)) continue;
      xmin = fmin(xmin, log2(x));
      xmax = fmax(xmax, log2(x));
      ymin = fmin(ymin, a->ylog ? log10(y) : y);
      ymax = fmax(ymax, a->ylog ? log10(y) : y);
    }
  if (xmin > xmax) { /* no point at all: 8 bytes to 1 MiB */
    xmin = 3;
    xmax = 20;
  }
  if (xmin == xmax) {
    xmin -= 1;
    xmax += 1;
  }
  a->xlo = xmin;
  a->xhi = xmax;
  if (a->ylog) {
    a->ylo = ymin <= ymax ? floor(ymin) : 0;
    a->yhi = ymin <= ymax ? ceil(ymax) : 1;
    if (a->yhi <= a->ylo) a->yhi = a->ylo + 1;
  } else {
    a->ylo = 0;
    a->yhi = ymax > 0 ? ymax : 1;
  }
}

/* A linear axis' tick step: 1, 2 or 5 times a power of ten, about five ticks; the top becomes a multiple. */
static double linear_step(axes_t *a) {
  double raw = a->yhi / 5, mag = pow(10, floor(log10(raw))), norm = raw / mag;
  double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  a->yhi = ceil(a->yhi / step - 1e-9) * step;
  return step;
}

static void decade_label(int k, char *buf, size_t len) {
  if (k >= -3 && k <= 4)
    snprintf(buf, len, "%g", pow(10, k));
  else
    snprintf(buf, len, "1e%d", k);
}

/* One horizontal grid line at axis position t (log10 on a log axis) and its label on the left. */
static void y_tick(plot_canvas_t *c, const axes_t *a, double t, const char *label) {
  int y = a->y0 + a->h - 1 - (int)lround((t - a->ylo) / (a->yhi - a->ylo) * (a->h - 1));
  plot_line(c, a->x0, y, a->x0 + a->w - 1, y, PLOT_GRID, 1);
  plot_text(c, a->x0 - 8 - plot_text_width(label, TEXT_SCALE), y - FONT_H * TEXT_SCALE / 2, label, TEXT_SCALE,
            PLOT_INK);
}

/* A log axis: a line per decade (every other one past 8 decades); over at most two decades, also 2x and 5x.
 */
static void log_ticks(plot_canvas_t *c, const axes_t *a) {
  int span = (int)lround(a->yhi - a->ylo), every = span > 8 ? 2 : 1;
  for (int k = (int)lround(a->ylo); k <= (int)lround(a->yhi); k += every) {
    char label[32];
    decade_label(k, label, sizeof(label));
    y_tick(c, a, k, label);
    for (int m = 2; span <= 2 && k < (int)lround(a->yhi) && m <= 5; m += 3) {
      snprintf(label, sizeof(label), "%g", m * pow(10, k));
      y_tick(c, a, k + log10(m), label);
    }
  }
}

/* Horizontal grid lines and their labels on the left. */
static void draw_y_ticks(plot_canvas_t *c, axes_t *a) {
  if (a->ylog) {
    log_ticks(c, a);
    return;
  }
  double step = linear_step(a);
  int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
  for (double t = 0; t <= a->yhi + step * 1e-6; t += step) {
    char label[32];
    snprintf(label, sizeof(label), "%.*f", decimals, t);
    y_tick(c, a, t, label);
  }
}

/* Vertical grid lines at powers of two, as many as their labels leave room for. */
static void draw_x_ticks(plot_canvas_t *c, const axes_t *a) {
  double per_unit = (a->w - 1) / (a->xhi - a->xlo);
  int widest = plot_text_width("512K", TEXT_SCALE) + 12, every = 1;
  while (every * per_unit < widest) every++;
  for (int k = (int)ceil(a->xlo); k <= (int)floor(a->xhi); k++) {
    if (k % every != 0) continue;
    int x = map_x(a, ldexp(1, k));
    char label[16];
    plot_size_label(ldexp(1, k), label, sizeof(label));
    plot_line(c, x, a->y0, x, a->y0 + a->h - 1, PLOT_GRID, 1);
    plot_text(c, x - plot_text_width(label, TEXT_SCALE) / 2, a->y0 + a->h + 8, label, TEXT_SCALE, PLOT_INK);
  }
}

static void draw_series(plot_canvas_t *c, const axes_t *a, const plot_series_t *s, uint8_t color,
                        int hollow) {
  int have = 0, px = 0, py = 0;
  for (int i = 0; i < s->n; i++) {
    if (s->x[i] <= 0 || !usable(a, s->y[i])) {
      have = 0; /* a gap in the line where a point is missing */
      continue;
    }
    int x = map_x(a, s->x[i]), y = map_y(a, s->y[i]);
    if (have) plot_line(c, px, py, x, y, color, 2);
    plot_fill(c, x - MARKER / 2, y - MARKER / 2, MARKER, MARKER, color);
    if (hollow) plot_fill(c, x - MARKER / 2 + 1, y - MARKER / 2 + 1, MARKER - 2, MARKER - 2, PLOT_BG);
    have = 1;
    px = x;
    py = y;
  }
}

/* The legend in the plot area's top-left corner, on a framed white box. */
static void draw_legend(plot_canvas_t *c, const axes_t *a, const plot_panel_t *p) {
  int line_h = (FONT_H + FONT_DROP) * TEXT_SCALE + 6, widest = 0;
  for (int s = 0; s < p->nseries; s++) {
    int w = plot_text_width(p->series[s].label, TEXT_SCALE);
    widest = w > widest ? w : widest;
  }
  int x = a->x0 + 10, y = a->y0 + 10, w = widest + 50, h = p->nseries * line_h + 8;
  plot_fill(c, x, y, w, h, PLOT_BG);
  plot_line(c, x, y, x + w - 1, y, PLOT_INK, 1);
  plot_line(c, x, y + h - 1, x + w - 1, y + h - 1, PLOT_INK, 1);
  plot_line(c, x, y, x, y + h - 1, PLOT_INK, 1);
  plot_line(c, x + w - 1, y, x + w - 1, y + h - 1, PLOT_INK, 1);
  for (int s = 0; s < p->nseries; s++) {
    int ly = y + 6 + s * line_h, mid = ly + FONT_H * TEXT_SCALE / 2;
    uint8_t color = (uint8_t)(PLOT_SERIES + s % PLOT_NSERIES);
    plot_line(c, x + 8, mid, x + 34, mid, color, 2);
    plot_fill(c, x + 21 - MARKER / 2, mid - MARKER / 2, MARKER, MARKER, color);
    if (s % 2) plot_fill(c, x + 22 - MARKER / 2, mid - MARKER / 2 + 1, MARKER - 2, MARKER - 2, PLOT_BG);
    plot_text(c, x + 42, ly, p->series[s].label, TEXT_SCALE, PLOT_INK);
  }
}

void plot_panel(plot_canvas_t *c, const plot_panel_t *p) {
  axes_t a = {.x0 = p->x + MARGIN_L,
              .y0 = p->y + MARGIN_T,
              .w = p->width - MARGIN_L - MARGIN_R,
              .h = p->height - MARGIN_T - MARGIN_B,
              .ylog = p->ylog};
  if (a.w < 16 || a.h < 16) return;
  fit_axes(p, &a);
  plot_clip(c, p->x, p->y, p->x + p->width, p->y + p->height);
  plot_text(c, a.x0, p->y + 10, p->title, TEXT_SCALE, PLOT_INK);
  draw_y_ticks(c, &a);
  draw_x_ticks(c, &a);
  int label_w = plot_text_width(p->xlabel, TEXT_SCALE);
  plot_text(c, a.x0 + (a.w - label_w) / 2, a.y0 + a.h + 36, p->xlabel, TEXT_SCALE, PLOT_MUTED);
  label_w = plot_text_width(p->ylabel, TEXT_SCALE);
  plot_text_up(c, p->x + 6, a.y0 + (a.h + label_w) / 2, p->ylabel, TEXT_SCALE, PLOT_MUTED);
  /* The frame, then the series clipped to the plot area, then the legend over them. */
  plot_line(c, a.x0 - 1, a.y0 - 1, a.x0 + a.w, a.y0 - 1, PLOT_INK, 1);
  plot_line(c, a.x0 - 1, a.y0 + a.h, a.x0 + a.w, a.y0 + a.h, PLOT_INK, 1);
  plot_line(c, a.x0 - 1, a.y0 - 1, a.x0 - 1, a.y0 + a.h, PLOT_INK, 1);
  plot_line(c, a.x0 + a.w, a.y0 - 1, a.x0 + a.w, a.y0 + a.h, PLOT_INK, 1);
  plot_clip(c, a.x0, a.y0, a.x0 + a.w, a.y0 + a.h);
  for (int s = 0; s < p->nseries; s++)
    draw_series(c, &a, &p->series[s], (uint8_t)(PLOT_SERIES + s % PLOT_NSERIES), s % 2);
  if (p->nseries > 0) draw_legend(c, &a, p);
  plot_unclip(c);
}
