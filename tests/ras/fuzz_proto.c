/*
 * libFuzzer target: the RAS client protocol's command parser (src/ras/proto.c). The input is what a client
 * sends; it is cut into lines as the server cuts them (at most CLIENT_LINE_MAX bytes each), and every answer
 * must be one bounded line.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ras/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *p = (const char *)data, *end = p + size;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = nl != NULL ? (size_t)(nl - p) : (size_t)(end - p);
    if (len >= CLIENT_LINE_MAX) len = CLIENT_LINE_MAX - 1;
    client_cmd_t c;
    client_parse(p, len, &c);
    if (c.kind == CMD_ERROR) {
      size_t n = strnlen(c.error, sizeof c.error);
      if (n == 0 || n == sizeof c.error || c.error[n - 1] != '\n' || memchr(c.error, '\n', n - 1) != NULL)
        abort();
    }
    if (c.kind == CMD_TIMEOUT && c.value < 0) abort();
    if (c.kind == CMD_MONITOR && (c.value < 1 || c.value > 3)) abort();
    p += len + (nl != NULL && p + len == nl);
  }
  return 0;
}
