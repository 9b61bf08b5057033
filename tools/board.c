/*
 * The board (see board.h): an anonymous shared mapping, inherited by the forked rank processes.
 *
 * The barrier is a counter and a generation. A process reads the generation, then adds itself to the counter
 * (acq_rel); the last to arrive resets the counter and advances the generation with a release store, the
 * others wait for the generation to change with acquire loads. The counter's read-modify-writes form one
 * release sequence that the last arriver acquires, and its generation store releases everything it has
 * seen, so each process's writes before arriving happen before every other's reads after leaving. Waiting
 * processes yield, then sleep briefly: barriers are between measurements, never inside one.
 */
#include "board.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

struct board {
  size_t bytes; /* the mapping's size */
  int nranks, nprocs;
  _Atomic unsigned arrived;    /* processes at the current barrier */
  _Atomic unsigned generation; /* barriers completed */
  _Atomic int failed;          /* a process gave up */
  ncclUniqueId ids[BOARD_IDS];
  double figs[]; /* [2][nranks][BOARD_FIGS], then the blobs: [nranks][BOARD_BLOB_BYTES] */
};

/* Bytes of the figures. */
static size_t figs_bytes(int nranks) {
  return 2 * (size_t)nranks * BOARD_FIGS * sizeof(double);
}

board_t *board_create(int nranks, int nprocs) {
  size_t bytes = sizeof(board_t) + figs_bytes(nranks) + (size_t)nranks * BOARD_BLOB_BYTES;
  board_t *b = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (b == MAP_FAILED) {
    fprintf(stderr, "braid bench: cannot map %zu bytes of shared memory: %s\n", bytes, strerror(errno));
    return NULL;
  }
  /* The mapping is zero-filled: counters at 0, no failure. */
  b->bytes = bytes;
  b->nranks = nranks;
  b->nprocs = nprocs;
  return b;
}

void board_destroy(board_t *b) {
  if (b != NULL) munmap(b, b->bytes);
}

double *board_figs(board_t *b, long row, int rank) {
  return &b->figs[((size_t)(row & 1) * (size_t)b->nranks + (size_t)rank) * BOARD_FIGS];
}

void *board_blob(board_t *b, int rank) {
  return (char *)b->figs + figs_bytes(b->nranks) + (size_t)rank * BOARD_BLOB_BYTES;
}

ncclUniqueId *board_ids(board_t *b) {
  return b->ids;
}

ncclResult_t board_barrier(board_t *b) {
  unsigned gen = atomic_load_explicit(&b->generation, memory_order_acquire);
  if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) + 1 == (unsigned)b->nprocs) {
    atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
    atomic_store_explicit(&b->generation, gen + 1, memory_order_release);
    return ncclSuccess;
  }
  for (long spins = 0; atomic_load_explicit(&b->generation, memory_order_acquire) == gen; spins++) {
    if (atomic_load_explicit(&b->failed, memory_order_relaxed)) {
      fprintf(stderr, "braid bench: another rank failed; giving up\n");
      return ncclRemoteError;
    }
    if (spins < 1000)
      sched_yield();
    else
      nanosleep(&(struct timespec){.tv_nsec = 50 * 1000}, NULL);
  }
  return ncclSuccess;
}

void board_fail(board_t *b) {
  atomic_store_explicit(&b->failed, 1, memory_order_relaxed);
}
