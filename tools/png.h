/*
 * The bench's plots as PNG files: an 8-bit palette image, each row prefixed with filter type 0 (none),
 * compressed by zlib. A build without zlib's headers has no PNG output (png_available).
 */
#ifndef BRAID_TOOLS_PNG_H
#define BRAID_TOOLS_PNG_H

#include <stdint.h>

/* An 8-bit palette image: pixel (x, y) is pixels[y * width + x], an index into `palette` (rgb triples). */
typedef struct {
  int width, height;
  const uint8_t *pixels;
  const uint8_t (*palette)[3];
  int ncolors; /* 1 to 256 */
} png_image_t;

/* Whether this build writes PNG files (it was built with zlib). */
int png_available(void);
/* Encodes the image and writes it to `path`. Returns 0, or -1 with the reason on stderr. */
int png_write(const png_image_t *img, const char *path);

#endif
