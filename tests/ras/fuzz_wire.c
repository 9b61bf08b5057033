/*
 * libFuzzer target: the peer mesh's message decoder (src/ras/wire.c). The input is a byte stream as a
 * connection would carry it: frames are taken off it as the monitor does (header, then its payload), each
 * decoded; every message that decodes is encoded again and must decode to the same thing.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ras/wire.h"

static void same(const wire_msg_t *a, const wire_msg_t *b) {
  if (a->type != b->type || a->id != b->id || a->job != b->job || a->proc.nrecs != b->proc.nrecs) abort();
  for (uint32_t i = 0; i < a->proc.nrecs; i++)
    if (memcmp(&a->proc.recs[i], &b->proc.recs[i], sizeof a->proc.recs[i]) != 0) abort();
}

static void round_trip(const wire_msg_t *m, int brief) {
  wire_buf_t b = {0};
  switch (m->type) {
  case WIRE_HELLO:
    wire_put_hello(&b, m->job, &m->proc.id);
    break;
  case WIRE_KEEPALIVE:
  case WIRE_REPLY:
    wire_put_snapshot(&b, m->type, m->id, &m->proc, brief);
    break;
  case WIRE_REQUEST:
    wire_put_request(&b, m->id);
    break;
  case WIRE_BYE:
    wire_put_bye(&b);
    break;
  }
  wire_msg_t again;
  if (b.failed || wire_decode(b.data, b.data + WIRE_HEADER, b.len - WIRE_HEADER, &again) != 0) abort();
  same(m, &again);
  wire_msg_free(&again);
  wire_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  while (size >= WIRE_HEADER) {
    uint32_t len;
    if (!wire_frame(data, &len) || size - WIRE_HEADER < len) break;
    wire_msg_t m;
    if (wire_decode(data, data + WIRE_HEADER, len, &m) == 0) {
      int brief = len > 8 && data[WIRE_HEADER + 8] == 1; /* the flag after the id */
      round_trip(&m, brief);
      wire_msg_free(&m);
    }
    data += WIRE_HEADER + len;
    size -= WIRE_HEADER + len;
  }
  return 0;
}
