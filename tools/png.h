/*
 * A minimal PNG encoder for the bench's plots, with no library behind it: an 8-bit palette image, each row
 * prefixed with filter type 0 (none), wrapped in a zlib stream of "stored" (uncompressed) deflate blocks.
 * The checksums PNG and zlib need, CRC-32 (chunks) and Adler-32 (the zlib stream), are computed here. The
 * files are larger than a compressed PNG would be, and every PNG reader opens them.
 */
#ifndef BRAID_TOOLS_PNG_H
#define BRAID_TOOLS_PNG_H

#include <stddef.h>
#include <stdint.h>

/* The largest payload of one stored deflate block. */
#define PNG_STORED_MAX 65535

/* A growing byte buffer. `failed` is set (and the contents dropped) when memory runs out. */
typedef struct {
  uint8_t *data;
  size_t len, cap;
  int failed;
} png_buf_t;

/* Appends n bytes. */
void png_buf_put(png_buf_t *b, const void *data, size_t n);
void png_buf_free(png_buf_t *b);

/* CRC-32 (ISO-HDLC, as PNG and zlib define it) of n bytes, continuing from `crc` (0 to start). */
uint32_t png_crc32(uint32_t crc, const void *data, size_t n);
/* Adler-32 of n bytes, continuing from `adler` (1 to start). */
uint32_t png_adler32(uint32_t adler, const void *data, size_t n);
/* Appends a zlib stream holding `data` in stored deflate blocks of at most PNG_STORED_MAX bytes (one empty
 * final block when n is 0), then the Adler-32 of the data. */
void png_zlib_stored(png_buf_t *out, const uint8_t *data, size_t n);

/* An 8-bit palette image: pixel (x, y) is pixels[y * width + x], an index into `palette` (rgb triples). */
typedef struct {
  int width, height;
  const uint8_t *pixels;
  const uint8_t (*palette)[3];
  int ncolors; /* 1 to 256 */
} png_image_t;

/* Encodes the image as a complete PNG file into `out`. Returns 0, or -1 when memory ran out. */
int png_encode(const png_image_t *img, png_buf_t *out);
/* Encodes the image and writes it to `path`. Returns 0, or -1 with the reason on stderr. */
int png_write(const png_image_t *img, const char *path);

#endif
