/*
 * The PNG encoder (see png.h). A PNG file is the 8-byte signature and a list of chunks, each: length (4
 * bytes, big-endian), type (4 letters), data, and the CRC-32 of type and data. This writes IHDR (size and
 * format), PLTE (the palette), one IDAT (the zlib stream of the filtered rows) and IEND.
 */
#include "png.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void png_buf_put(png_buf_t *b, const void *data, size_t n) {
  if (b->failed || n == 0) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    uint8_t *grown = realloc(b->data, cap);
    if (grown == NULL) {
      png_buf_free(b);
      b->failed = 1;
      return;
    }
    b->data = grown;
    b->cap = cap;
  }
  memcpy(b->data + b->len, data, n);
  b->len += n;
}

void png_buf_free(png_buf_t *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

static void put_be32(png_buf_t *b, uint32_t v) {
  uint8_t bytes[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
  png_buf_put(b, bytes, 4);
}

uint32_t png_crc32(uint32_t crc, const void *data, size_t n) {
  /* The reflected polynomial 0xEDB88320, a byte at a time from a table built on first use. */
  static uint32_t table[256];
  static int built;
  if (!built) {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    built = 1;
  }
  const uint8_t *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t png_adler32(uint32_t adler, const void *data, size_t n) {
  /* Two sums modulo 65521; 5552 bytes is the most that can be added before the second sum could overflow
   * 32 bits, so the modulo is taken once per run of that many. */
  enum { MOD = 65521, RUN = 5552 };
  const uint8_t *p = data;
  uint32_t a = adler & 0xffff, b = adler >> 16;
  while (n > 0) {
    size_t run = n < RUN ? n : RUN;
    n -= run;
    while (run-- > 0) {
      a += *p++;
      b += a;
    }
    a %= MOD;
    b %= MOD;
  }
  return (b << 16) | a;
}

void png_zlib_stored(png_buf_t *out, const uint8_t *data, size_t n) {
  /* CMF 0x78: deflate with a 32 KiB window; FLG 0x01: no dictionary, and CMF * 256 + FLG divisible by 31. */
  static const uint8_t header[2] = {0x78, 0x01};
  png_buf_put(out, header, 2);
  size_t done = 0;
  do {
    size_t len = n - done < PNG_STORED_MAX ? n - done : PNG_STORED_MAX;
    int final = done + len == n;
    /* Block header: BFINAL in bit 0, BTYPE 00 (stored); then LEN and its complement NLEN, little-endian. */
    uint8_t head[5] = {(uint8_t) final, (uint8_t)len, (uint8_t)(len >> 8), (uint8_t)~len,
                       (uint8_t)(~len >> 8)};
    png_buf_put(out, head, 5);
    png_buf_put(out, data + done, len);
    done += len;
  } while (done < n);
  put_be32(out, png_adler32(1, data, n));
}

/* Appends one chunk: length, type, data, CRC of type and data. */
static void put_chunk(png_buf_t *out, const char type[4], const uint8_t *data, size_t n) {
  put_be32(out, (uint32_t)n);
  png_buf_put(out, type, 4);
  png_buf_put(out, data, n);
  put_be32(out, png_crc32(png_crc32(0, type, 4), data, n));
}

/* The rows, each prefixed with its filter type (0: none). */
static int filtered_rows(const png_image_t *img, png_buf_t *raw) {
  static const uint8_t none = 0;
  for (int y = 0; y < img->height; y++) {
    png_buf_put(raw, &none, 1);
    png_buf_put(raw, img->pixels + (size_t)y * (size_t)img->width, (size_t)img->width);
  }
  return raw->failed ? -1 : 0;
}

int png_encode(const png_image_t *img, png_buf_t *out) {
  static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  png_buf_put(out, signature, 8);
  /* IHDR: width, height, bit depth 8, colour type 3 (palette), compression 0, filter 0, no interlace. */
  uint8_t ihdr[13] = {0};
  for (int i = 0; i < 4; i++) {
    ihdr[i] = (uint8_t)((uint32_t)img->width >> (24 - 8 * i));
    ihdr[4 + i] = (uint8_t)((uint32_t)img->height >> (24 - 8 * i));
  }
  ihdr[8] = 8;
  ihdr[9] = 3;
  put_chunk(out, "IHDR", ihdr, sizeof(ihdr));
  put_chunk(out, "PLTE", &img->palette[0][0], 3 * (size_t)img->ncolors);
  png_buf_t raw = {0}, z = {0};
  int res = filtered_rows(img, &raw);
  if (res == 0) png_zlib_stored(&z, raw.data, raw.len);
  if (res == 0 && !z.failed) put_chunk(out, "IDAT", z.data, z.len);
  put_chunk(out, "IEND", NULL, 0);
  res = res != 0 || z.failed || out->failed ? -1 : 0;
  png_buf_free(&raw);
  png_buf_free(&z);
  return res;
}

int png_write(const png_image_t *img, const char *path) {
  png_buf_t out = {0};
  if (png_encode(img, &out) != 0) {
    fprintf(stderr, "braid: out of memory encoding a %dx%d PNG\n", img->width, img->height);
    return -1;
  }
  FILE *f = fopen(path, "wb");
  int res = f != NULL && fwrite(out.data, 1, out.len, f) == out.len ? 0 : -1;
  if (f != NULL && fclose(f) != 0) res = -1;
  if (res != 0) fprintf(stderr, "braid: cannot write %s: %s\n", path, strerror(errno));
  png_buf_free(&out);
  return res;
}
