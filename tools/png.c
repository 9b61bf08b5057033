/*
 * PNG files through zlib (see png.h): the chunks are written here, zlib compresses the rows and computes the
 * chunks' CRC-32.
 */
#include "png.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef BRAID_HAVE_ZLIB
#include <zlib.h>

int png_available(void) {
  return 1;
}

static void be32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}

/* Writes one chunk: length, type, data, CRC of type and data. Returns 0, or -1 when writing failed. */
static int put_chunk(FILE *f, const char type[4], const uint8_t *data, size_t n) {
  uint8_t len[4], crc[4];
  be32(len, (uint32_t)n);
  uLong c = crc32(0, (const Bytef *)type, 4);
  if (n > 0) c = crc32(c, data, (uInt)n); /* not with NULL: crc32(c, NULL, 0) is the initial value */
  be32(crc, (uint32_t)c);
  int ok = fwrite(len, 1, 4, f) == 4 && fwrite(type, 1, 4, f) == 4 &&
           (n == 0 || fwrite(data, 1, n, f) == n) && fwrite(crc, 1, 4, f) == 4;
  return ok ? 0 : -1;
}

/* The rows, each prefixed with its filter type (0: none), compressed; NULL when memory ran out. */
static uint8_t *compressed_rows(const png_image_t *img, uLongf *len_p) {
  size_t row = (size_t)img->width + 1, raw_len = row * (size_t)img->height;
  uint8_t *raw = malloc(raw_len);
  uLongf len = compressBound((uLong)raw_len);
  uint8_t *z = malloc(len);
  if (raw != NULL && z != NULL) {
    for (int y = 0; y < img->height; y++) {
      raw[(size_t)y * row] = 0;
      memcpy(raw + (size_t)y * row + 1, img->pixels + (size_t)y * (size_t)img->width, (size_t)img->width);
    }
    if (compress2(z, &len, raw, (uLong)raw_len, Z_BEST_COMPRESSION) != Z_OK) {
      free(z);
      z = NULL;
    }
  } else {
    free(z);
    z = NULL;
  }
  free(raw);
  *len_p = len;
  return z;
}

int png_write(const png_image_t *img, const char *path) {
  static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  uLongf zlen = 0;
  uint8_t *z = compressed_rows(img, &zlen);
  if (z == NULL) {
    fprintf(stderr, "braid: out of memory compressing a %dx%d PNG\n", img->width, img->height);
    return -1;
  }
  /* IHDR: width, height, bit depth 8, colour type 3 (palette), compression 0, filter 0, no interlace. */
  uint8_t ihdr[13] = {0};
  be32(ihdr, (uint32_t)img->width);
  be32(ihdr + 4, (uint32_t)img->height);
  ihdr[8] = 8;
  ihdr[9] = 3;
  FILE *f = fopen(path, "wb");
  int res = f != NULL && fwrite(signature, 1, 8, f) == 8 ? 0 : -1;
  if (res == 0) res = put_chunk(f, "IHDR", ihdr, sizeof(ihdr));
  if (res == 0) res = put_chunk(f, "PLTE", &img->palette[0][0], 3 * (size_t)img->ncolors);
  if (res == 0) res = put_chunk(f, "IDAT", z, zlen);
  if (res == 0) res = put_chunk(f, "IEND", NULL, 0);
  if (f != NULL && fclose(f) != 0) res = -1;
  if (res != 0) fprintf(stderr, "braid: cannot write %s: %s\n", path, strerror(errno));
  free(z);
  return res;
}

#else

int png_available(void) {
  return 0;
}

int png_write(const png_image_t *img, const char *path) {
  fprintf(stderr,
          "braid: cannot write %s: this braid was built without zlib (zlib1g-dev), so it writes no PNG\n",
          path);
  return -1;
}

#endif
