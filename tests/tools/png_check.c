/*
 * png_check FILE [MIN_WIDTH MIN_HEIGHT]: exits 0 when FILE is a valid PNG as `braid bench --png` writes them
 * (png_reader.h: signature, chunk CRCs, IHDR, stored deflate blocks, Adler-32) of at least the given size;
 * otherwise says why and exits 1. Used by the tool's script tests.
 */
#include <stdio.h>
#include <stdlib.h>

#include "png_reader.h"

int main(int argc, char **argv) {
  if (argc != 2 && argc != 4) {
    fprintf(stderr, "usage: png_check FILE [MIN_WIDTH MIN_HEIGHT]\n");
    return 2;
  }
  png_info_t info;
  if (png_read_file(argv[1], &info) != 0) {
    fprintf(stderr, "png_check: %s: %s\n", argv[1], info.err);
    png_info_free(&info);
    return 1;
  }
  int min_w = argc == 4 ? atoi(argv[2]) : 1, min_h = argc == 4 ? atoi(argv[3]) : 1;
  int ok = info.width >= min_w && info.height >= min_h;
  printf("png_check: %s: %dx%d, colour type %d, %d colours, %d IDAT, %d stored blocks%s\n", argv[1],
         info.width, info.height, info.color_type, info.ncolors, info.nidat, info.nblocks,
         ok ? "" : ": too small");
  png_info_free(&info);
  return ok ? 0 : 1;
}
