/*
 * Tests of the bench's PNG files (tools/png.c) and chart (tools/chart.c): images written and read back
 * through zlib (each chunk's CRC, the inflated rows), a damaged file caught by its CRC, a folder that does
 * not exist refused, and the chart draws the floor's line exactly when the run measured it.
 * tests/tools/png_check.py checks the files the bench writes in the script tests.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "chart.h"
#include "harness.h"
#include "plot.h"
#include "png.h"

/* An image as read back: IHDR's fields, the palette's size, and the inflated rows (filter byte, pixels). */
typedef struct {
  int width, height, depth, colour, ncolours;
  uint8_t *raw;
  size_t raw_len;
} image_t;

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads the chunks of `data`: checks each CRC, takes IHDR and PLTE, and inflates the IDAT chunks joined.
 * Returns 0, or -1 for anything not as png.c writes it. */
static int parse_png(const uint8_t *data, size_t len, image_t *im) {
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static uint8_t idat[1 << 20];
  size_t nidat = 0;
  *im = (image_t){0};
  if (len < 8 || memcmp(data, sig, 8) != 0) return -1;
  for (size_t pos = 8; pos + 12 <= len;) {
    size_t n = be32(data + pos);
    const uint8_t *kind = data + pos + 4, *body = data + pos + 8;
    if (pos + 12 + n > len || crc32(0, kind, (uInt)(4 + n)) != be32(body + n)) return -1;
    if (memcmp(kind, "IHDR", 4) == 0 && n == 13)
      *im = (image_t){
          .width = (int)be32(body), .height = (int)be32(body + 4), .depth = body[8], .colour = body[9]};
    if (memcmp(kind, "PLTE", 4) == 0) im->ncolours = (int)n / 3;
    if (memcmp(kind, "IDAT", 4) == 0 && nidat + n <= sizeof idat) memcpy(idat + nidat, body, n);
    if (memcmp(kind, "IDAT", 4) == 0) nidat += n;
    pos += 12 + n;
  }
  uLongf raw_len = (uLongf)(im->width + 1) * (uLongf)im->height;
  im->raw = malloc(raw_len + 1);
  if (im->raw == NULL || nidat > sizeof idat || uncompress(im->raw, &raw_len, idat, nidat) != Z_OK) return -1;
  im->raw_len = raw_len;
  return raw_len == (uLongf)(im->width + 1) * (uLongf)im->height ? 0 : -1;
}

static int read_png(const char *path, image_t *im) {
  static uint8_t data[1 << 20];
  FILE *f = fopen(path, "rb");
  if (f == NULL) return -1;
  size_t len = fread(data, 1, sizeof data, f);
  fclose(f);
  return parse_png(data, len, im);
}

static const uint8_t palette[4][3] = {{0, 0, 0}, {255, 255, 255}, {255, 0, 0}, {0, 0, 255}};

/* An image of random pixels written, read back pixel for pixel, then damaged by one bit. */
static void test_round_trip(void) {
  char path[] = "/tmp/braid_test_png_XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0);
  close(fd);
  int w = 301, h = 97;
  uint8_t *px = malloc((size_t)w * h);
  EXPECT(px != NULL);
  srand(7);
  for (int i = 0; i < w * h; i++) px[i] = (uint8_t)(i % 5 == 0 ? rand() % 4 : i / w % 4);
  png_image_t img = {.width = w, .height = h, .pixels = px, .palette = palette, .ncolors = 4};
  EXPECT(png_write(&img, path) == 0);
  image_t im;
  EXPECT(read_png(path, &im) == 0, "%s does not read back", path);
  EXPECT(im.width == w && im.height == h && im.depth == 8 && im.colour == 3 && im.ncolours == 4);
  for (int y = 0; y < h; y++) {
    const uint8_t *row = im.raw + (size_t)y * (w + 1);
    EXPECT(row[0] == 0 && memcmp(row + 1, px + (size_t)y * w, (size_t)w) == 0, "row %d", y);
  }
  free(im.raw);
  /* One flipped bit in the compressed data breaks the IDAT chunk's CRC. */
  static uint8_t data[1 << 20];
  FILE *f = fopen(path, "rb");
  EXPECT(f != NULL);
  size_t len = fread(data, 1, sizeof data, f);
  fclose(f);
  unlink(path);
  EXPECT(len > 100 && len < (size_t)w * h / 2, "%zu bytes: not compressed", len);
  data[len - 20] ^= 1;
  EXPECT(parse_png(data, len, &im) != 0, "a damaged file read back");
  free(im.raw);
  free(px);
}

static void test_write_errors(void) {
  uint8_t px[6] = {0, 1, 2, 3, 2, 1};
  png_image_t img = {.width = 3, .height = 2, .pixels = px, .palette = palette, .ncolors = 4};
  EXPECT(png_write(&img, "/nonexistent-folder/x.png") != 0, "writing into a missing folder");
}

/* Pixels of colour index `color` in the chart drawn from three rows of two libraries, with or without the
 * floor's figures. */
static long chart_pixels(int floor, uint8_t color) {
  char path[] = "/tmp/braid_test_chart_XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0);
  close(fd);
  report_t r = {.info = {.date = "2026-11-23T00:00:00Z",
                         .gpu = "test",
                         .device = "cuda",
                         .layout = "process",
                         .nranks = 2,
                         .samples = 20,
                         .nlibs = 2,
                         .floor = floor}};
  r.info.libs[0] = (report_lib_t){.path = "/a/lib/libnccl.so.2", .version = 22809};
  r.info.libs[1] = (report_lib_t){.path = "/b/lib/libnccl.so.2", .version = 22809};
  for (int i = 0; i < 3; i++) {
    double t = 5.0 + i;
    report_row_t row = {.coll = "all_reduce",
                        .type = "float",
                        .op = "sum",
                        .root = -1,
                        .bytes = 8u << (4 * i),
                        .count = 2u << (4 * i),
                        .batch = 1,
                        .time_us = {t, 2 * t},
                        .algbw = {1, 0.5},
                        .busbw = {1, 0.5},
                        .wrong = {0, 0},
                        .floor_us = floor ? 1.5 : NAN};
    EXPECT(report_add(&r, &row) == 0);
  }
  EXPECT(chart_write(&r, path) == 0);
  report_free(&r);
  image_t im;
  EXPECT(read_png(path, &im) == 0, "%s is not the PNG expected", path);
  unlink(path);
  long n = 0;
  for (int y = 0; y < im.height; y++)
    for (int x = 0; x < im.width; x++) n += im.raw[(size_t)y * (im.width + 1) + 1 + x] == color;
  free(im.raw);
  return n;
}

static void test_chart_floor(void) {
  const uint8_t floor_color = PLOT_SERIES + 2; /* the series after the two libraries' */
  EXPECT(chart_pixels(0, PLOT_SERIES) > 0 && chart_pixels(0, PLOT_SERIES + 1) > 0, "the libraries' lines");
  EXPECT(chart_pixels(0, floor_color) == 0, "a floor line in a run without --floor");
  EXPECT(chart_pixels(1, floor_color) > 100, "no floor line in a run with --floor");
}

int main(void) {
  TEST(test_round_trip, 10);
  TEST(test_write_errors, 10);
  TEST(test_chart_floor, 30);
  return test_summary();
}
