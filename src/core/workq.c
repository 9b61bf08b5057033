/*
 * The work queue's accounting (see workq.h).
 *
 * Invariants, checked by the tests after every operation: head <= tail <= head + cap; the outstanding
 * entries are in launch order, contiguous in position (each starts where the previous one ended, its skipped
 * bytes included), the first starts at head and the last ends at tail; an entry never straddles the end of
 * the ring (its offset plus its payload fits).
 */
#include "workq.h"

#include <stdlib.h>

#include "base/log.h"

uint64_t wq_size(int64_t fifo_bytes, int fifo_bytes_set, int64_t fifo_depth, int fifo_depth_set) {
  int64_t want = WQ_DEFAULT_BYTES;
  const char *from = "default";
  if (fifo_bytes_set) {
    want = fifo_bytes, from = "NCCL_WORK_FIFO_BYTES";
  } else if (fifo_depth_set) {
    want = fifo_depth > INT64_MAX / WQ_DEPTH_UNIT ? INT64_MAX : fifo_depth * WQ_DEPTH_UNIT;
    from = "NCCL_WORK_FIFO_DEPTH";
  }
  uint64_t cap = WQ_MIN_BYTES;
  while (cap < WQ_MAX_BYTES && (int64_t)cap < want) cap <<= 1;
  if ((int64_t)cap != want)
    INFO(LOG_INIT, "%s asks for a %lld-byte work queue; using %llu (a power of two from %u to %u)", from,
         (long long)want, (unsigned long long)cap, WQ_MIN_BYTES, WQ_MAX_BYTES);
  return cap;
}

ncclResult_t wq_init(workq_t *wq, uint64_t cap) {
  *wq = (workq_t){.cap = cap, .next_tag = 1};
  /* at most one entry per WQ_ALIGN bytes can be outstanding */
  wq->ents_cap = (uint32_t)(cap / WQ_ALIGN);
  wq->ents = calloc(wq->ents_cap, sizeof *wq->ents);
  if (wq->ents == NULL)
    return log_err(ncclSystemError, "out of host memory for a work queue of %llu bytes",
                   (unsigned long long)cap);
  return ncclSuccess;
}

void wq_free(workq_t *wq) {
  free(wq->ents);
  wq->ents = NULL;
}

uint64_t wq_entry_bytes(uint64_t spill) {
  return (WQ_ALIGN + spill + WQ_ALIGN - 1) / WQ_ALIGN * WQ_ALIGN;
}

int wq_reserve(workq_t *wq, int captured, uint64_t bytes, uint64_t seq, const char *op, double now,
               wq_slot_t *slot_p) {
  *slot_p = (wq_slot_t){0};
  if (captured) return 1;
  uint64_t off = wq->tail & (wq->cap - 1);
  /* an entry does not straddle the ring's end: skip to its start, charging the skipped bytes */
  uint64_t skip = off + bytes > wq->cap ? wq->cap - off : 0;
  if (skip != 0 && wq->count == 0) { /* empty: both ends move to the ring's start, nothing is skipped */
    wq->tail += skip;
    wq->head = wq->tail;
    off = skip = 0;
  }
  if (bytes > wq->cap || wq->tail + skip + bytes - wq->head > wq->cap) return 0;
  wq_entry_t *e = &wq->ents[(wq->first + wq->count) % wq->ents_cap];
  *e = (wq_entry_t){.tag = wq->next_tag++,
                    .pos = wq->tail,
                    .bytes = skip + bytes,
                    .off = skip ? 0 : off,
                    .seq = seq,
                    .op = op,
                    .t_enq = now};
  wq->count++;
  wq->tail += skip + bytes;
  *slot_p = (wq_slot_t){.queued = 1, .off = e->off, .tag = e->tag};
  return 1;
}

void wq_cancel(workq_t *wq, const wq_slot_t *slot) {
  if (!slot->queued || wq->count == 0) return;
  wq_entry_t *e = &wq->ents[(wq->first + wq->count - 1) % wq->ents_cap];
  if (e->tag != slot->tag) return; /* only the newest can be taken back */
  wq->tail = e->pos;
  wq->count--;
  wq->next_tag--;
}

uint32_t wq_reclaim(workq_t *wq, wq_done_fn done, void *ctx) {
  uint32_t n = 0;
  while (wq->count > 0) {
    const wq_entry_t *e = &wq->ents[wq->first];
    if (done != NULL && !done(ctx, e)) break;
    wq->head = e->pos + e->bytes;
    wq->first = (wq->first + 1) % wq->ents_cap;
    wq->count--;
    n++;
  }
  return n;
}

uint64_t wq_outstanding(const workq_t *wq) {
  return wq->tail - wq->head;
}

const wq_entry_t *wq_oldest(const workq_t *wq) {
  return wq->count > 0 ? &wq->ents[wq->first] : NULL;
}
