/*
 * A peer's buffers mapped into this rank (see peer_mem.h).
 */
#include "transport/peer_mem.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"

/* Mapped allocations of the peer kept at most for eager work. */
enum { PEER_MEM_ENTRIES = 16 };

typedef struct {
  gpu_mem_t *mem; /* the mapping; NULL: free */
  uint64_t buffer_id;
  gpu_export_t blob;
  gpu_event_t *used; /* recorded after the latest work that used it */
  uint64_t stamp;    /* for least-recently-used eviction */
} entry_t;

struct tp_peer_mem {
  int dev, rank, peer;
  const char *comm;
  uint64_t clock;
  entry_t entries[PEER_MEM_ENTRIES];
};

ncclResult_t tp_peer_mem_init(int dev, const char *comm, int rank, int peer, tp_peer_mem_t **c_p) {
  tp_peer_mem_t *c = calloc(1, sizeof *c);
  if (c == NULL) return log_err(ncclSystemError, "%s: out of host memory for rank %d's mappings", comm, peer);
  *c = (tp_peer_mem_t){.dev = dev, .rank = rank, .peer = peer, .comm = comm};
  *c_p = c;
  return ncclSuccess;
}

/* Maps the peer's allocation described by x (for `what`, in the log). */
static ncclResult_t map(tp_peer_mem_t *c, const gpu_ptr_export_t *x, const char *what, gpu_mem_t **mem_p) {
  CHECK(gpu_mem_import(c->dev, &x->blob, mem_p));
  INFO(LOG_ALLOC | LOG_P2P, "%s rank %d: mapped %zu bytes of rank %d's memory for %s at %p", c->comm, c->rank,
       gpu_mem_size(*mem_p), c->peer, what, gpu_mem_ptr(*mem_p));
  return ncclSuccess;
}

ncclResult_t tp_peer_mem_map(tp_peer_mem_t *c, const gpu_ptr_export_t *x, char **base_p) {
  entry_t *victim = NULL;
  for (int i = 0; i < PEER_MEM_ENTRIES; i++) {
    entry_t *e = &c->entries[i];
    if (e->mem != NULL && e->buffer_id == x->buffer_id && memcmp(&e->blob, &x->blob, sizeof e->blob) == 0) {
      e->stamp = ++c->clock;
      *base_p = gpu_mem_ptr(e->mem);
      return ncclSuccess;
    }
    if (victim == NULL || (victim->mem != NULL && (e->mem == NULL || e->stamp < victim->stamp))) victim = e;
  }
  if (victim->mem != NULL) { /* the work using it must be over before it goes */
    if (victim->used != NULL) CHECK(gpu_event_sync(victim->used));
    gpu_mem_release(victim->mem);
    victim->mem = NULL;
  }
  if (victim->used == NULL) CHECK(gpu_event_create(&victim->used));
  CHECK(map(c, x, "the copy engines", &victim->mem));
  victim->buffer_id = x->buffer_id;
  victim->blob = x->blob;
  victim->stamp = ++c->clock;
  *base_p = gpu_mem_ptr(victim->mem);
  return ncclSuccess;
}

ncclResult_t tp_peer_mem_map_fresh(tp_peer_mem_t *c, const gpu_ptr_export_t *x, gpu_mem_t **mem_p) {
  int saved;
  CHECK(gpu_capture_relax(&saved)); /* mapping is among the calls a capture forbids in its strict modes */
  ncclResult_t res = map(c, x, "a captured copy", mem_p);
  gpu_capture_restore(saved);
  return res;
}

ncclResult_t tp_peer_mem_used(tp_peer_mem_t *c, const char *p, cudaStream_t stream) {
  for (int k = 0; p != NULL && k < PEER_MEM_ENTRIES; k++) {
    entry_t *e = &c->entries[k];
    const char *base = e->mem != NULL ? gpu_mem_ptr(e->mem) : NULL;
    if (base != NULL && p >= base && p < base + gpu_mem_size(e->mem))
      CHECK(gpu_event_record(e->used, stream));
  }
  return ncclSuccess;
}

void tp_peer_mem_free(tp_peer_mem_t *c) {
  if (c == NULL) return;
  for (int i = 0; i < PEER_MEM_ENTRIES; i++) {
    if (c->entries[i].mem != NULL) gpu_mem_release(c->entries[i].mem);
    if (c->entries[i].used != NULL) gpu_event_destroy(c->entries[i].used);
  }
  free(c);
}
