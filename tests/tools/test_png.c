/*
 * Tests of the bench's PNG encoder (tools/png.c): CRC-32 and Adler-32 against their published check values
 * and against plain implementations, zlib streams of stored blocks at and around the 65535-byte block limit,
 * and whole images read back by the tests' own reader (png_reader.c), which must also reject a damaged file;
 * and the bench's chart (tools/chart.c) draws the floor's line exactly when the run measured it.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chart.h"
#include "harness.h"
#include "plot.h"
#include "png.h"
#include "png_reader.h"

static void test_crc32(void) {
  EXPECT(png_crc32(0, "123456789", 9) == 0xCBF43926u, "got %08x", png_crc32(0, "123456789", 9));
  EXPECT(png_crc32(0, "", 0) == 0);
  EXPECT(png_crc32(png_crc32(0, "1234", 4), "56789", 5) == 0xCBF43926u, "continued CRC");
  /* PNG's IEND chunk: the CRC of its type alone is the well-known AE 42 60 82. */
  EXPECT(png_crc32(0, "IEND", 4) == 0xAE426082u);
  uint8_t buf[1000];
  for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (uint8_t)(i * 7 + 3);
  EXPECT(png_crc32(0, buf, sizeof(buf)) == png_reader_crc32(buf, sizeof(buf), 0),
         "table and bitwise CRCs differ");
}

static void test_adler32(void) {
  EXPECT(png_adler32(1, "Wikipedia", 9) == 0x11E60398u, "got %08x", png_adler32(1, "Wikipedia", 9));
  EXPECT(png_adler32(1, "", 0) == 1);
  /* All-0xff data is the worst case for the deferred modulo; cover several of its runs. */
  size_t n = 100000;
  uint8_t *buf = malloc(n);
  EXPECT(buf != NULL);
  memset(buf, 0xff, n);
  EXPECT(png_adler32(1, buf, n) == png_reader_adler32(buf, n), "long run of 0xff");
  EXPECT(png_adler32(png_adler32(1, buf, 7000), buf + 7000, n - 7000) == png_reader_adler32(buf, n),
         "continued");
  free(buf);
}

/* Encodes n bytes as a zlib stream of stored blocks and takes it apart again, checking each block. */
static void check_stored(size_t n) {
  uint8_t *data = malloc(n + 1);
  EXPECT(data != NULL);
  for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i ^ (i >> 8));
  png_buf_t z = {0};
  png_zlib_stored(&z, data, n);
  EXPECT(!z.failed);
  size_t blocks = n == 0 ? 1 : (n + PNG_STORED_MAX - 1) / PNG_STORED_MAX;
  EXPECT(z.len == 2 + 5 * blocks + n + 4, "%zu bytes: stream of %zu bytes, %zu blocks", n, z.len, blocks);
  EXPECT(z.data[0] == 0x78 && (z.data[0] * 256 + z.data[1]) % 31 == 0, "zlib header");
  size_t pos = 2, done = 0;
  for (size_t b = 0; b < blocks; b++) {
    const uint8_t *h = z.data + pos;
    unsigned len = h[1] | (unsigned)h[2] << 8, nlen = h[3] | (unsigned)h[4] << 8;
    EXPECT((h[0] & 1) == (b == blocks - 1), "%zu bytes: BFINAL of block %zu", n, b);
    EXPECT((h[0] >> 1 & 3) == 0, "stored type");
    EXPECT(len <= PNG_STORED_MAX && (len ^ 0xffffu) == nlen, "LEN %u NLEN %u", len, nlen);
    EXPECT(memcmp(h + 5, data + done, len) == 0, "block %zu content", b);
    pos += 5 + len;
    done += len;
  }
  EXPECT(done == n);
  uint32_t adler = (uint32_t)z.data[pos] << 24 | (uint32_t)z.data[pos + 1] << 16 |
                   (uint32_t)z.data[pos + 2] << 8 | z.data[pos + 3];
  EXPECT(adler == png_reader_adler32(data, n), "trailer");
  png_buf_free(&z);
  free(data);
}

static void test_stored_blocks(void) {
  size_t sizes[] = {0, 1, PNG_STORED_MAX - 1, PNG_STORED_MAX, PNG_STORED_MAX + 1, 3 * PNG_STORED_MAX, 200000};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) check_stored(sizes[i]);
}

static const uint8_t palette[4][3] = {{0, 0, 0}, {255, 255, 255}, {255, 0, 0}, {0, 0, 255}};

/* An image whose data (250 rows of 301 bytes) needs two stored blocks, encoded and read back. */
static void test_image_round_trip(void) {
  int w = 300, h = 250;
  uint8_t *px = malloc((size_t)w * h);
  EXPECT(px != NULL);
  for (int i = 0; i < w * h; i++) px[i] = (uint8_t)((i / 7 + i / w) % 4);
  png_image_t img = {.width = w, .height = h, .pixels = px, .palette = palette, .ncolors = 4};
  png_buf_t out = {0};
  EXPECT(png_encode(&img, &out) == 0);
  png_info_t info;
  EXPECT(png_read_buffer(out.data, out.len, &info) == 0, "%s", info.err);
  EXPECT(info.width == w && info.height == h && info.color_type == 3 && info.bit_depth == 8);
  EXPECT(info.ncolors == 4 && info.nidat == 1 && info.nblocks == 2, "%d colours, %d blocks", info.ncolors,
         info.nblocks);
  for (int y = 0; y < h; y++) {
    const uint8_t *row = info.raw + (size_t)y * (w + 1);
    EXPECT(row[0] == 0 && memcmp(row + 1, px + (size_t)y * w, (size_t)w) == 0, "row %d", y);
  }
  png_info_free(&info);
  /* One flipped bit in the pixel data must break the IDAT CRC. */
  out.data[out.len - 40] ^= 1;
  EXPECT(png_read_buffer(out.data, out.len, &info) != 0 && strstr(info.err, "CRC") != NULL, "%s", info.err);
  png_info_free(&info);
  png_buf_free(&out);
  free(px);
}

static void test_write_file(void) {
  char path[] = "/tmp/braid_test_png_XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0);
  close(fd);
  uint8_t px[6] = {0, 1, 2, 3, 2, 1};
  png_image_t img = {.width = 3, .height = 2, .pixels = px, .palette = palette, .ncolors = 4};
  EXPECT(png_write(&img, path) == 0);
  png_info_t info;
  int res = png_read_file(path, &info);
  unlink(path);
  EXPECT(res == 0, "%s", info.err);
  EXPECT(info.width == 3 && info.height == 2 && info.raw_len == 8 && info.raw[5] == 3);
  png_info_free(&info);
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
  png_info_t info;
  int res = png_read_file(path, &info);
  unlink(path);
  EXPECT(res == 0, "%s", info.err);
  long n = 0;
  for (int y = 0; y < info.height; y++)
    for (int x = 0; x < info.width; x++) n += info.raw[(size_t)y * (info.width + 1) + 1 + x] == color;
  png_info_free(&info);
  return n;
}

static void test_chart_floor(void) {
  const uint8_t floor_color = PLOT_SERIES + 2; /* the series after the two libraries' */
  EXPECT(chart_pixels(0, PLOT_SERIES) > 0 && chart_pixels(0, PLOT_SERIES + 1) > 0, "the libraries' lines");
  EXPECT(chart_pixels(0, floor_color) == 0, "a floor line in a run without --floor");
  EXPECT(chart_pixels(1, floor_color) > 100, "no floor line in a run with --floor");
}

int main(void) {
  TEST(test_crc32, 10);
  TEST(test_adler32, 10);
  TEST(test_stored_blocks, 10);
  TEST(test_image_round_trip, 10);
  TEST(test_write_file, 10);
  TEST(test_chart_floor, 30);
  return test_summary();
}
