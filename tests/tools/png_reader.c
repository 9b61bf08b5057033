/*
 * The tests' PNG reader (see png_reader.h).
 */
#include "png_reader.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(png_info_t *info, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(png_info_t *info, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(info->err, sizeof(info->err), fmt, ap);
  va_end(ap);
  return -1;
}

uint32_t png_reader_crc32(const uint8_t *data, size_t n, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < n; i++) {
    crc ^= data[i];
    for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1)));
  }
  return ~crc;
}

uint32_t png_reader_adler32(const uint8_t *data, size_t n) {
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < n; i++) {
    a = (a + data[i]) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Undoes a zlib stream of stored blocks into info->raw. */
static int inflate_stored(const uint8_t *z, size_t n, png_info_t *info) {
  if (n < 6) return fail(info, "zlib stream of %zu bytes is too short", n);
  if ((z[0] & 0x0f) != 8 || ((unsigned)z[0] << 8 | z[1]) % 31 != 0 || (z[1] & 0x20))
    return fail(info, "bad zlib header %02x %02x", z[0], z[1]);
  info->raw = malloc(n);
  if (info->raw == NULL) return fail(info, "out of memory");
  size_t pos = 2;
  for (int final = 0; !final;) {
    if (pos + 5 > n - 4) return fail(info, "deflate block header past the end at %zu", pos);
    final = z[pos] & 1;
    if ((z[pos] >> 1 & 3) != 0) return fail(info, "deflate block of type %d, not stored", z[pos] >> 1 & 3);
    unsigned len = z[pos + 1] | (unsigned)z[pos + 2] << 8, nlen = z[pos + 3] | (unsigned)z[pos + 4] << 8;
    if ((len ^ 0xffffu) != nlen) return fail(info, "stored block LEN %u, NLEN %u", len, nlen);
    pos += 5;
    if (pos + len > n - 4) return fail(info, "stored block of %u bytes past the end", len);
    memcpy(info->raw + info->raw_len, z + pos, len);
    info->raw_len += len;
    pos += len;
    info->nblocks++;
  }
  if (pos != n - 4) return fail(info, "%zu bytes between the last block and the Adler-32", n - 4 - pos);
  if (be32(z + pos) != png_reader_adler32(info->raw, info->raw_len))
    return fail(info, "Adler-32 %08x, data gives %08x", be32(z + pos),
                png_reader_adler32(info->raw, info->raw_len));
  return 0;
}

static int read_ihdr(const uint8_t *d, uint32_t len, png_info_t *info) {
  if (len != 13) return fail(info, "IHDR of %u bytes", len);
  info->width = (int)be32(d);
  info->height = (int)be32(d + 4);
  info->bit_depth = d[8];
  info->color_type = d[9];
  if (info->width <= 0 || info->height <= 0) return fail(info, "image of %dx%d", info->width, info->height);
  if (d[10] != 0 || d[11] != 0 || d[12] != 0) return fail(info, "compression/filter/interlace not 0");
  if (info->bit_depth != 8 || (info->color_type != 3 && info->color_type != 2))
    return fail(info, "bit depth %d, colour type %d", info->bit_depth, info->color_type);
  return 0;
}

/* Checks the inflated size and the filter bytes. */
static int check_rows(png_info_t *info) {
  size_t row = 1 + (size_t)info->width * (info->color_type == 2 ? 3 : 1);
  if (info->raw_len != row * (size_t)info->height)
    return fail(info, "%zu bytes of image data for %dx%d", info->raw_len, info->width, info->height);
  for (int y = 0; y < info->height; y++)
    if (info->raw[(size_t)y * row] > 4)
      return fail(info, "row %d has filter type %d", y, info->raw[(size_t)y * row]);
  return 0;
}

/* Walks the chunks; collects IDAT data into *z. */
static int read_chunks(const uint8_t *data, size_t len, png_info_t *info, uint8_t *z, size_t *zlen) {
  size_t pos = 8;
  int seen_iend = 0, idat_done = 0, last_idat = 0;
  for (int index = 0; !seen_iend; index++) {
    if (pos + 12 > len) return fail(info, "chunk header past the end at %zu", pos);
    uint32_t n = be32(data + pos);
    const uint8_t *type = data + pos + 4, *body = data + pos + 8;
    if (n > len - pos - 12) return fail(info, "chunk of %u bytes past the end", n);
    uint32_t crc = png_reader_crc32(body, n, png_reader_crc32(type, 4, 0));
    if (crc != be32(body + n))
      return fail(info, "%.4s chunk CRC %08x, data gives %08x", type, be32(body + n), crc);
    int is_idat = memcmp(type, "IDAT", 4) == 0;
    if (index == 0 && memcmp(type, "IHDR", 4) != 0) return fail(info, "first chunk is %.4s", type);
    if (index == 0 && read_ihdr(body, n, info) != 0) return -1;
    if (memcmp(type, "PLTE", 4) == 0) {
      if (*zlen > 0 || n % 3 != 0 || n == 0 || n > 768)
        return fail(info, "PLTE of %u bytes or after IDAT", n);
      info->ncolors = (int)n / 3;
    }
    if (is_idat && idat_done) return fail(info, "IDAT chunks are not consecutive");
    if (!is_idat && last_idat) idat_done = 1;
    if (is_idat) {
      if (info->color_type == 3 && info->ncolors == 0) return fail(info, "IDAT before PLTE");
      memcpy(z + *zlen, body, n);
      *zlen += n;
      info->nidat++;
    }
    last_idat = is_idat;
    seen_iend = memcmp(type, "IEND", 4) == 0;
    if (seen_iend && n != 0) return fail(info, "IEND with %u bytes", n);
    pos += 12 + n;
  }
  if (pos != len) return fail(info, "%zu bytes after IEND", len - pos);
  if (info->nidat == 0) return fail(info, "no IDAT chunk");
  return 0;
}

int png_read_buffer(const uint8_t *data, size_t len, png_info_t *info) {
  static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  memset(info, 0, sizeof(*info));
  if (len < 8 || memcmp(data, signature, 8) != 0) return fail(info, "no PNG signature");
  uint8_t *z = malloc(len);
  size_t zlen = 0;
  if (z == NULL) return fail(info, "out of memory");
  int res = read_chunks(data, len, info, z, &zlen);
  if (res == 0) res = inflate_stored(z, zlen, info);
  if (res == 0) res = check_rows(info);
  free(z);
  return res;
}

int png_read_file(const char *path, png_info_t *info) {
  FILE *f = fopen(path, "rb");
  memset(info, 0, sizeof(*info));
  if (f == NULL) return fail(info, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *data = size > 0 ? malloc((size_t)size) : NULL;
  int res = data != NULL && fread(data, 1, (size_t)size, f) == (size_t)size ? 0 : -1;
  fclose(f);
  res = res == 0 ? png_read_buffer(data, (size_t)size, info) : fail(info, "cannot read %s", path);
  free(data);
  return res;
}

void png_info_free(png_info_t *info) {
  free(info->raw);
  info->raw = NULL;
}
