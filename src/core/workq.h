/*
 * The work queue of a GPU communicator: bounded space for its eager launches, reclaimed only from launches
 * whose completion was observed.
 *
 * Each eager launch whose transfer list does not fit in the kernel parameters takes one entry: a header the
 * kernel writes when it is done (its tag, in host-mapped memory), followed by the list (the spill). A launch
 * whose list fits holds nothing of the host's once launched, and takes none. Entries are contiguous byte
 * ranges of a ring of `cap` bytes; an entry that would straddle the end of the ring starts at the beginning
 * instead, the skipped bytes charged to it. Entries are reclaimed in launch order, from the oldest, and only
 * when the caller says the oldest is done (its kernel wrote its tag), so space can neither leak nor be reused
 * under a kernel that still reads it.
 *
 * Captured launches (CUDA graphs) never take an entry: their work lives in the graph's own storage and a
 * replay cannot move any counter here (DESIGN.md, principle 3). This is the property that NCCL's work FIFO
 * lacked when a captured launch advanced its "sent" counter and eager launches then waited forever for space
 * that no kernel would ever release.
 *
 * This module is pure accounting (no device calls), so it is tested on its own under a model of the GPU.
 * It is not thread-safe: a communicator's launches are made by one thread at a time.
 */
#ifndef BRAID_CORE_WORKQ_H
#define BRAID_CORE_WORKQ_H

#include <stdint.h>

#include "nccl.h"

/* Bytes of an entry's header (where the kernel writes its tag); entries are multiples of this. */
#define WQ_ALIGN 64
/* The smallest queue (bytes), the default, and the largest. */
#define WQ_MIN_BYTES     (64u << 10)
#define WQ_DEFAULT_BYTES (1u << 20)
#define WQ_MAX_BYTES     (1u << 30)
/* NCCL_WORK_FIFO_DEPTH counts entries of this many bytes. */
#define WQ_DEPTH_UNIT 512

/* One eager launch still in the queue. */
typedef struct {
  uint64_t tag;   /* launch number (from 1): what the kernel writes into the header when done */
  uint64_t pos;   /* byte position where the entry starts (grows forever; pos % cap is its offset) */
  uint64_t bytes; /* bytes it holds, the skipped end of the ring included */
  uint64_t off;   /* byte offset of its header in the ring */
  uint64_t seq;   /* sequence number of its first call, and what that call is, for messages */
  const char *op;
  double t_enq; /* when it was enqueued (seconds, time_now) */
} wq_entry_t;

typedef struct {
  uint64_t cap;        /* ring bytes: a power of two */
  uint64_t head, tail; /* byte positions: reclaimed up to head, reserved up to tail (tail - head <= cap) */
  wq_entry_t *ents;    /* outstanding entries, a circular list of ents_cap */
  uint32_t ents_cap, first, count;
  uint64_t next_tag;
} workq_t;

/* Where a launch's entry is (queued 0: the launch is captured and has none). */
typedef struct {
  int queued;
  uint64_t off; /* byte offset of the header in the ring; the spill follows it */
  uint64_t tag;
} wq_slot_t;

/* The queue size from NCCL_WORK_FIFO_BYTES (or, when only it is set, NCCL_WORK_FIFO_DEPTH entries of
 * WQ_DEPTH_UNIT bytes): rounded up to a power of two within [WQ_MIN_BYTES, WQ_MAX_BYTES]. A value outside
 * that range or not a power of two is logged once at INFO with the size used instead. */
uint64_t wq_size(int64_t fifo_bytes, int fifo_bytes_set, int64_t fifo_depth, int fifo_depth_set);

ncclResult_t wq_init(workq_t *wq, uint64_t cap);
void wq_free(workq_t *wq);

/* Bytes an entry with `spill` bytes of transfer list takes (header included). */
uint64_t wq_entry_bytes(uint64_t spill);

/* Makes room for a launch. A captured launch gets no entry and changes nothing (returns 1). An eager one
 * takes `bytes` (wq_entry_bytes; at most cap) when they are free and returns 1; returns 0, changing
 * nothing, when they are not (the caller reclaims and tries again). */
int wq_reserve(workq_t *wq, int captured, uint64_t bytes, uint64_t seq, const char *op, double now,
               wq_slot_t *slot_p);
/* Takes back the newest entry, whose launch failed before it reached the GPU (so it will never be done). */
void wq_cancel(workq_t *wq, const wq_slot_t *slot);

/* Whether an entry's kernel has finished with it: the caller reads the entry's header. */
typedef int (*wq_done_fn)(void *ctx, const wq_entry_t *entry);
/* Reclaims the oldest entries while `done` says they are finished; returns how many. With done == NULL,
 * reclaims every entry (the caller observed that every launch made so far has finished). */
uint32_t wq_reclaim(workq_t *wq, wq_done_fn done, void *ctx);

/* Bytes outstanding (reserved and not reclaimed), and the oldest outstanding entry (NULL when none). */
uint64_t wq_outstanding(const workq_t *wq);
const wq_entry_t *wq_oldest(const workq_t *wq);

#endif
