/*
 * A strict reader of the PNG files `braid bench --png` writes, for the tests: it checks the signature, every
 * chunk's CRC, IHDR, the chunk order (IHDR first, PLTE before IDAT for palette images, IDAT chunks together,
 * IEND last), and undoes the zlib stream of stored deflate blocks (block lengths and their complements, the
 * final-block flag, the Adler-32). Its CRC and Adler-32 are computed bit by bit here, not with the encoder's
 * code, so that the two check each other.
 */
#ifndef BRAID_TESTS_PNG_READER_H
#define BRAID_TESTS_PNG_READER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int width, height, bit_depth, color_type;
  int ncolors;  /* PLTE entries; 0 without PLTE */
  int nidat;    /* IDAT chunks */
  int nblocks;  /* stored deflate blocks */
  uint8_t *raw; /* the inflated data: each row's filter byte, then its pixels */
  size_t raw_len;
  char err[256]; /* why reading failed */
} png_info_t;

/* Reads a PNG from memory or a file. Returns 0, or -1 with the reason in info->err. */
int png_read_buffer(const uint8_t *data, size_t len, png_info_t *info);
int png_read_file(const char *path, png_info_t *info);
void png_info_free(png_info_t *info);

/* The reader's own checksums. */
uint32_t png_reader_crc32(const uint8_t *data, size_t n, uint32_t crc);
uint32_t png_reader_adler32(const uint8_t *data, size_t n);

#endif
