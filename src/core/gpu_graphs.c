/*
 * The GPU executor's graph lifetimes (see gpu_exec.h).
 *
 * Captured launches take nothing from the work queue: what they need (a spilled transfer list, in-place
 * all-to-all staging, a mapping of the peer's buffer for a direct step) is owned by a graph token, tied to
 * the graph's life with a CUDA user object; the token is released when the graph, its executable copies and
 * their launches are gone, and its memory is freed by the next call of the executor.
 *
 * While a graph holds a token of the communicator, gx_graphs reports it, and ncclCommDestroy and
 * ncclCommAbort retire the executor instead of freeing it (gx_retire): once the last eager launch has
 * finished (gx_quiesce) the kernels see the abort flag (a replay after the destroy leaves at once), and
 * everything a replay could reach (the kernel view, the flags, the connections' rings) is kept until the last
 * graph is gone, then freed by the next call of the executor (gx_sweep).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "core/gpu_exec_int.h"

/* The graph's release callback, on a driver thread: no CUDA call, only two atomic operations. The token is
 * marked released first (the next sweep may free it at once, so it is not touched after), then the count
 * drops: whoever sees the count reach zero sees every token released. The executor outlives the count
 * (gx_destroy runs only at zero; gx_retire keeps it until then). */
static void token_release(void *arg) {
  token_t *t = arg;
  gx_t *gx = t->gx;
  atomic_store_explicit(&t->released, 1, memory_order_release);
  atomic_fetch_add_explicit(&gx->unswept, 1, memory_order_release);
  atomic_fetch_sub_explicit(&gx->graphs, 1, memory_order_release);
}

static void token_free(gx_t *gx, token_t *t) {
  for (tbuf_t *b = t->bufs, *next; b != NULL; b = next) {
    next = b->next;
    if (b->mem != NULL) {
      mem_release(gx->acct, gpu_mem_size(b->mem), 1);
      gpu_mem_release(b->mem);
    }
    if (b->stage != NULL) {
      mem_release(gx->acct, b->stage_bytes, 0);
      gpu_host_free(b->stage);
    }
    if (b->mapped != NULL) gpu_mem_release(b->mapped);
    free(b);
  }
  free(t);
}

/* Frees the tokens whose graphs are gone (the caller has entered the device). */
void gx_tokens_sweep(gx_t *gx) {
  /* every launch calls this: with no token released since the last sweep, the list is not walked */
  if (atomic_load_explicit(&gx->unswept, memory_order_acquire) == 0) return;
  for (token_t **pp = &gx->tokens; *pp != NULL;) {
    token_t *t = *pp;
    if (!atomic_load_explicit(&t->released, memory_order_acquire)) {
      pp = &t->next;
      continue;
    }
    *pp = t->next;
    if (gx->pending == t) gx->pending = NULL;
    token_free(gx, t);
    atomic_fetch_sub_explicit(&gx->unswept, 1, memory_order_relaxed);
  }
}

/* The token of the capture `capture_id` (into `graph`): the one an earlier call of the same capture made, or
 * a new one that the graph holds from now on (so the communicator knows a graph uses it). Capture ids are
 * never reused in a process, unlike graph handles. */
ncclResult_t gx_token_for(gx_t *gx, void *graph, uint64_t capture_id, token_t **t_p) {
  if (gx->pending != NULL && gx->pending_capture == capture_id) {
    *t_p = gx->pending;
    return ncclSuccess;
  }
  token_t *t = calloc(1, sizeof *t);
  if (t == NULL) return log_err(ncclSystemError, "%s: out of host memory for a graph token", gx->name);
  t->gx = gx;
  atomic_fetch_add_explicit(&gx->graphs, 1, memory_order_relaxed);
  ncclResult_t res = gpu_graph_hold(graph, token_release, t);
  if (res != ncclSuccess) {
    /* not held: no callback will come, so the count goes back now */
    atomic_fetch_sub_explicit(&gx->graphs, 1, memory_order_relaxed);
    free(t);
    return res;
  }
  t->next = gx->tokens;
  gx->tokens = t;
  gx->pending = t;
  gx->pending_capture = capture_id;
  *t_p = t;
  return ncclSuccess;
}

/* Device memory of `bytes` owned by token t, with (stage != NULL) a page-locked copy to fill it from.
 * Allocation is one of the calls a capture forbids in its strict modes: the thread relaxes its mode around
 * it. */
ncclResult_t gx_token_alloc(gx_t *gx, token_t *t, size_t bytes, int staged, tbuf_t **b_p) {
  tbuf_t *b = calloc(1, sizeof *b);
  if (b == NULL) return log_err(ncclSystemError, "%s: out of host memory for a graph token", gx->name);
  b->next = t->bufs;
  t->bufs = b;
  int saved;
  CHECK(gpu_capture_relax(&saved));
  void *unused;
  mem_doing("graph-owned work or scratch");
  ncclResult_t res = gpu_dev_alloc(gx->dev, bytes, &b->mem);
  mem_doing(NULL);
  if (res == ncclSuccess) mem_charge(gx->acct, gpu_mem_size(b->mem), 1, "graph-owned work or scratch");
  if (res == ncclSuccess && staged) {
    res = gpu_host_alloc(bytes, &b->stage, &unused);
    if (res == ncclSuccess) {
      b->stage_bytes = bytes;
      mem_charge(gx->acct, bytes, 0, "graph-owned work (page-locked)");
    }
  }
  gpu_capture_restore(saved);
  *b_p = b;
  return res;
}

/* The graph being captured keeps `mapping` (its token unmaps it when the graph is destroyed); on failure
 * the caller still owns it. */
ncclResult_t gx_token_keep(gx_t *gx, token_t *t, gpu_mem_t *mapping) {
  tbuf_t *b = calloc(1, sizeof *b);
  if (b == NULL) return log_err(ncclSystemError, "%s: out of host memory for a graph token", gx->name);
  b->mapped = mapping;
  b->next = t->bufs;
  t->bufs = b;
  return ncclSuccess;
}

/* Where a captured launch's spill goes: device memory the graph owns, filled by a copy node at each replay
 * from a page-locked copy it also owns. */
ncclResult_t gx_capture_place(gx_t *gx, const launch_ctx_t *lc, uint64_t spill) {
  tbuf_t *b;
  CHECK(gx_token_alloc(gx, lc->token, spill, 1, &b));
  memcpy(b->stage, gx->xf, spill);
  gx->work.ext = gpu_mem_ptr(b->mem);
  return gpu_copy_async(gpu_mem_ptr(b->mem), b->stage, spill, lc->s);
}

/* ---- Retired executors ---- */

/* Executors retired while graphs held them, until the last graph goes. */
static pthread_mutex_t retired_lock = PTHREAD_MUTEX_INITIALIZER;
static gx_t *retired;
static _Atomic int nretired;

void gx_retire(gx_t *gx, void (*release)(void *), void *arg) {
  gx->retire_free = release;
  gx->retire_arg = arg;
  INFO(LOG_INIT,
       "%s rank %d: %d CUDA graphs still hold the communicator; its device memory is kept until they "
       "are destroyed",
       gx->name, gx->rank, gx_graphs(gx));
  pthread_mutex_lock(&retired_lock);
  gx->retired_next = retired;
  retired = gx;
  atomic_fetch_add(&nretired, 1);
  pthread_mutex_unlock(&retired_lock);
}

void gx_sweep(void) {
  if (atomic_load_explicit(&nretired, memory_order_relaxed) == 0) return;
  gx_t *done = NULL;
  pthread_mutex_lock(&retired_lock);
  for (gx_t **pp = &retired; *pp != NULL;) {
    gx_t *gx = *pp;
    if (gx_graphs(gx) > 0) {
      pp = &gx->retired_next;
      continue;
    }
    *pp = gx->retired_next;
    gx->retired_next = done;
    done = gx;
    atomic_fetch_sub(&nretired, 1);
  }
  pthread_mutex_unlock(&retired_lock);
  while (done != NULL) {
    gx_t *gx = done;
    done = gx->retired_next;
    void (*release)(void *) = gx->retire_free;
    void *arg = gx->retire_arg;
    /* a stuck kernel keeps the connections too (gx_destroy said so) */
    if (gx_destroy(gx) == ncclSuccess && release != NULL) release(arg);
  }
}
