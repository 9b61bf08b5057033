/*
 * The work queue's accounting under a model of the GPU.
 *
 * The model keeps a stream of kernels in launch order: eager ones, which write their entry's tag into the
 * entry's header when they finish (as the kernel does in host-mapped memory), and replays of captured
 * graphs, which touch nothing of the queue. The GPU runs the stream's oldest kernel when the test lets it.
 * After every operation the test checks the queue's invariants against its own bookkeeping: every byte of
 * the ring belongs to at most one outstanding entry, the outstanding bytes are exactly the entries' bytes,
 * nothing goes negative, and an entry is reclaimed only after its kernel finished. A launch that cannot get
 * space although the GPU has nothing left to run is the leak that hung NCCL; the test fails on it.
 *
 * Cases: NCCL's scenario with the smallest queue (2 eager, 1 captured, 100,000 eager with a stream
 * synchronisation after each and replays every 1,000), the same with the host running ahead of the GPU,
 * randomised sequences (eager launches with spills of every size, captures, replays, failed launches, GPU
 * progress, reclaims), and the broken design (captured launches taking entries) to show the check catches
 * the leak.
 */
#include <stdlib.h>
#include <string.h>

#include "core/workq.h"
#include "harness.h"

enum { MAX_PENDING = 1 << 16 };

/* A kernel on the model's stream: eager (with its entry) or a graph replay (tag 0). */
typedef struct {
  uint64_t tag, off;
} kernel_t;

typedef struct {
  workq_t wq;
  uint64_t *hdr;    /* the header word of each WQ_ALIGN unit of the ring: what a kernel wrote */
  uint64_t *owner;  /* the tag owning each unit of the ring (0: free) */
  kernel_t *stream; /* pending kernels, a circular list */
  uint32_t first, npend;
  uint64_t done_upto; /* eager tags finished so far (they finish in order) */
  int captured_takes; /* the broken design: captured launches take entries */
  uint64_t launches, replays;
} model_t;

static void model_init(model_t *m, uint64_t cap) {
  memset(m, 0, sizeof *m);
  EXPECT_OK(wq_init(&m->wq, cap));
  m->hdr = calloc(cap / WQ_ALIGN, sizeof *m->hdr);
  m->owner = calloc(cap / WQ_ALIGN, sizeof *m->owner);
  m->stream = calloc(MAX_PENDING, sizeof *m->stream);
  EXPECT(m->hdr != NULL && m->owner != NULL && m->stream != NULL, "out of memory");
}

static void model_free(model_t *m) {
  wq_free(&m->wq);
  free(m->hdr);
  free(m->owner);
  free(m->stream);
}

/* The queue's invariants, and that they agree with the model's ownership map. */
static void check(const model_t *m) {
  const workq_t *q = &m->wq;
  EXPECT(q->head <= q->tail && q->tail - q->head <= q->cap, "head %llu tail %llu cap %llu",
         (unsigned long long)q->head, (unsigned long long)q->tail, (unsigned long long)q->cap);
  uint64_t sum = 0, pos = q->head;
  for (uint32_t i = 0; i < q->count; i++) {
    const wq_entry_t *e = &q->ents[(q->first + i) % q->ents_cap];
    EXPECT(e->pos == pos, "entry %u starts at %llu, expected %llu", i, (unsigned long long)e->pos,
           (unsigned long long)pos);
    sum += e->bytes;
    pos += e->bytes;
  }
  EXPECT(sum == wq_outstanding(q), "entries hold %llu bytes, the queue says %llu", (unsigned long long)sum,
         (unsigned long long)wq_outstanding(q));
}

/* Marks the units of [off, off + bytes) as owned by tag (0: frees them), checking they were free. */
static void own(model_t *m, uint64_t off, uint64_t bytes, uint64_t tag) {
  for (uint64_t u = off / WQ_ALIGN; u < (off + bytes) / WQ_ALIGN; u++) {
    if (tag != 0)
      EXPECT(m->owner[u] == 0, "unit %llu given to %llu while %llu holds it", (unsigned long long)u,
             (unsigned long long)tag, (unsigned long long)m->owner[u]);
    m->owner[u] = tag;
  }
}

static int header_done(void *ctx, const wq_entry_t *e) {
  const model_t *m = ctx;
  return m->hdr[e->off / WQ_ALIGN] == e->tag;
}

static void push_kernel(model_t *m, uint64_t tag, uint64_t off) {
  EXPECT(m->npend < MAX_PENDING, "model stream overflow");
  m->stream[(m->first + m->npend++) % MAX_PENDING] = (kernel_t){tag, off};
}

/* The GPU finishes its oldest kernel; returns 0 when the stream is empty. */
static int gpu_step(model_t *m) {
  if (m->npend == 0) return 0;
  kernel_t k = m->stream[m->first];
  m->first = (m->first + 1) % MAX_PENDING;
  m->npend--;
  if (k.tag != 0) {
    /* the kernel reads its entry: nobody else may have been given it meanwhile */
    EXPECT(m->owner[k.off / WQ_ALIGN] == k.tag, "kernel %llu runs on an entry given to %llu",
           (unsigned long long)k.tag, (unsigned long long)m->owner[k.off / WQ_ALIGN]);
    m->hdr[k.off / WQ_ALIGN] = k.tag;
    m->done_upto = k.tag;
  }
  return 1;
}

/* Reclaims: everything taken back must have finished on the GPU, and what is left starts with an entry that
 * has not. */
static void reclaim(model_t *m) {
  uint64_t head = m->wq.head;
  uint32_t n = wq_reclaim(&m->wq, header_done, m);
  const wq_entry_t *e = wq_oldest(&m->wq);
  EXPECT(e == NULL || !header_done(m, e), "entry %llu is done but was left", (unsigned long long)e->tag);
  if (n > 0 && !m->captured_takes)
    EXPECT(e == NULL || e->tag > m->done_upto, "reclaimed past an entry the GPU has not finished");
  /* free the units of everything reclaimed: from the old head to the new one */
  for (uint64_t p = head; p < m->wq.head; p += WQ_ALIGN) m->owner[(p % m->wq.cap) / WQ_ALIGN] = 0;
  check(m);
}

/* An eager launch with `spill` bytes of transfers, as the executor makes it: reserve, reclaiming while the
 * GPU progresses; returns 0 when the queue stays full with nothing left on the GPU (the leak). */
static int launch_eager(model_t *m, uint64_t spill) {
  uint64_t bytes = wq_entry_bytes(spill);
  wq_slot_t slot;
  while (!wq_reserve(&m->wq, 0, bytes, m->launches, "AllReduce", 0, &slot)) {
    reclaim(m);
    if (wq_reserve(&m->wq, 0, bytes, m->launches, "AllReduce", 0, &slot)) break;
    if (!gpu_step(m)) return 0;
  }
  EXPECT(slot.queued && slot.off % WQ_ALIGN == 0 && slot.off + bytes <= m->wq.cap, "bad slot at %llu",
         (unsigned long long)slot.off);
  own(m, slot.off, bytes, slot.tag);
  m->hdr[slot.off / WQ_ALIGN] = 0; /* the host clears the header before the launch */
  m->launches++;
  push_kernel(m, slot.tag, slot.off);
  check(m);
  return 1;
}

/* A captured launch: no entry and no counter moves (or, in the broken design, an entry no kernel frees). */
static int launch_captured(model_t *m) {
  workq_t before = m->wq;
  wq_slot_t slot;
  if (m->captured_takes) {
    while (!wq_reserve(&m->wq, 0, WQ_ALIGN, 0, "AllReduce", 0, &slot)) {
      reclaim(m);
      if (!gpu_step(m)) return 0;
    }
    own(m, slot.off, WQ_ALIGN, slot.tag);
    return 1;
  }
  EXPECT(wq_reserve(&m->wq, 1, WQ_ALIGN, 0, "AllReduce", 0, &slot) == 1 && !slot.queued,
         "a captured launch took an entry");
  EXPECT(memcmp(&before, &m->wq, sizeof before) == 0, "a captured launch changed the queue");
  return 1;
}

static void sync_stream(model_t *m) {
  while (gpu_step(m)) {
  }
  reclaim(m);
}

/* NCCL's sequence; returns the number of eager launches that got space (all of them when nothing leaks). */
static uint64_t nccl_scenario(int captured_takes, int sync_each) {
  model_t m;
  model_init(&m, WQ_MIN_BYTES);
  m.captured_takes = captured_takes;
  uint64_t ok = 0;
  for (int i = 0; i < 2; i++) ok += launch_eager(&m, 0);
  if (!launch_captured(&m)) goto out;
  for (int i = 0; i < 100000; i++) {
    if (i % 1000 == 0) push_kernel(&m, 0, 0); /* a replay */
    if (!launch_eager(&m, 0)) break;
    ok++;
    if (sync_each) sync_stream(&m);
    /* the broken design also takes an entry per replay, like NCCL's captured launch did once */
    if (captured_takes && i % 1000 == 0 && !launch_captured(&m)) break;
  }
  if (ok == 100002) {
    sync_stream(&m);
    EXPECT(wq_outstanding(&m.wq) == 0, "%llu bytes outstanding after the GPU ran everything",
           (unsigned long long)wq_outstanding(&m.wq));
  }
out:
  model_free(&m);
  return ok;
}

static void nccl_sequence_synced(void) {
  EXPECT(nccl_scenario(0, 1) == 100002, "an eager launch never got space");
}

static void nccl_sequence_running_ahead(void) {
  EXPECT(nccl_scenario(0, 0) == 100002, "an eager launch never got space");
}

/* The check can fail: with captured launches taking entries that no kernel releases, space leaks until an
 * eager launch waits forever. */
static void broken_design_is_caught(void) {
  EXPECT(nccl_scenario(1, 1) < 100002, "the leak of the broken design went unnoticed");
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Random spill: mostly none, sometimes a few transfers, rarely most of the queue. */
static uint64_t random_spill(uint64_t *s, uint64_t cap) {
  uint64_t r = rnd(s) % 100;
  if (r < 60) return 0;
  if (r < 95) return rnd(s) % 4096;
  return rnd(s) % (cap - WQ_ALIGN - 1);
}

static void randomised(void) {
  for (uint64_t seed = 1; seed <= 40; seed++) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull;
    model_t m;
    model_init(&m, seed % 2 ? WQ_MIN_BYTES : WQ_MIN_BYTES * 4);
    int graphs = 0;
    for (int op = 0; op < 20000; op++) {
      uint64_t r = rnd(&s) % 100;
      if (r < 45) {
        EXPECT(launch_eager(&m, random_spill(&s, m.wq.cap)), "seed %llu op %d: leak",
               (unsigned long long)seed, op);
      } else if (r < 50) {
        EXPECT(launch_captured(&m), "seed %llu: capture", (unsigned long long)seed);
        graphs++;
      } else if (r < 60) {
        if (graphs > 0) push_kernel(&m, 0, 0);
      } else if (r < 63) {
        /* a launch that fails after its reservation: taken back, never seen by the GPU */
        wq_slot_t slot;
        uint64_t bytes = wq_entry_bytes(random_spill(&s, m.wq.cap));
        if (wq_reserve(&m.wq, 0, bytes, 0, "Send", 0, &slot)) {
          own(&m, slot.off, bytes, slot.tag);
          wq_cancel(&m.wq, &slot);
          own(&m, slot.off, bytes, 0);
          check(&m);
        }
      } else if (r < 90) {
        for (uint64_t k = rnd(&s) % 8; k > 0 && gpu_step(&m); k--) {
        }
      } else {
        reclaim(&m);
      }
    }
    sync_stream(&m);
    EXPECT(wq_outstanding(&m.wq) == 0 && m.wq.count == 0, "seed %llu: %llu bytes left",
           (unsigned long long)seed, (unsigned long long)wq_outstanding(&m.wq));
    for (uint64_t u = 0; u < m.wq.cap / WQ_ALIGN; u++)
      EXPECT(m.owner[u] == 0, "seed %llu: unit %llu still owned", (unsigned long long)seed,
             (unsigned long long)u);
    model_free(&m);
  }
}

/* Sizes: NCCL_WORK_FIFO_BYTES wins over the legacy depth; results are powers of two within the limits. */
static void sizes(void) {
  EXPECT(wq_size(0, 0, 0, 0) == WQ_DEFAULT_BYTES, "default");
  EXPECT(wq_size(65536, 1, 0, 0) == 65536, "minimum");
  EXPECT(wq_size(1000, 1, 0, 0) == WQ_MIN_BYTES, "below the minimum");
  EXPECT(wq_size(100000, 1, 0, 0) == 131072, "rounded up");
  EXPECT(wq_size(1ll << 40, 1, 0, 0) == WQ_MAX_BYTES, "above the maximum");
  EXPECT(wq_size(0, 0, 256, 1) == 131072, "depth in 512-byte entries");
  EXPECT(wq_size(65536, 1, 1 << 20, 1) == 65536, "bytes win over depth");
  EXPECT(wq_entry_bytes(0) == WQ_ALIGN && wq_entry_bytes(1) == 2 * WQ_ALIGN, "entry sizes");
}

/* An entry as large as the queue fits once the queue is empty, wherever the ring's end was. */
static void whole_queue_entry(void) {
  model_t m;
  model_init(&m, WQ_MIN_BYTES);
  EXPECT(launch_eager(&m, 100), "small entry");
  EXPECT(launch_eager(&m, WQ_MIN_BYTES - WQ_ALIGN), "an entry of the whole queue");
  sync_stream(&m);
  EXPECT(wq_outstanding(&m.wq) == 0, "left over");
  wq_slot_t slot;
  EXPECT(wq_reserve(&m.wq, 0, WQ_MIN_BYTES + WQ_ALIGN, 0, "x", 0, &slot) == 0, "more than the queue");
  model_free(&m);
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(sizes, 10);
  TEST(whole_queue_entry, 10);
  TEST(nccl_sequence_synced, 60);
  TEST(nccl_sequence_running_ahead, 60);
  TEST(broken_design_is_caught, 60);
  TEST(randomised, 120);
  return test_summary();
}
