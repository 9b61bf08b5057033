/*
 * The floor probe of `braid bench --floor` (see bench_floor.h).
 */
#include "bench_floor.h"

#include <stdlib.h>

#include "base/check.h"

int floor_available(char *why, size_t len) {
  if (bench_floor_fatbin_size > 0) return 1;
  snprintf(why, len, "this braid was built without a CUDA compiler, so it has no floor kernel");
  return 0;
}

static int is_local(const bench_proc_t *p, int rank) {
  return rank >= p->first_rank && rank < p->first_rank + p->nlocal;
}

/* Local rank i's kernel and zeroed page; its IPC handle on the board when other processes need it. */
static ncclResult_t make_page(bench_proc_t *p, int i) {
  dev_rank_t *d = &p->ranks[i];
  struct floor_rank *f = &p->floors[i];
  CHECK(dev_enter(d));
  CHECK(drv_module_load(bench_floor_fatbin, &f->module));
  CHECK(drv_module_function(f->module, "braid_floor", &f->kernel));
  CHECK(drv_can_overlap(d->dev, p->o->graph, &f->overlap));
  CHECK(drv_mem_alloc(&f->page, FLOOR_PAGE_BYTES));
  CHECK(drv_memset(f->page, 0, FLOOR_PAGE_BYTES, d->stream));
  CHECK(drv_stream_sync(d->stream));
  f->args = (floor_args_t){
      .page = f->page, .timeout_ns = FLOOR_TIMEOUT_NS, .rank = d->rank, .nranks = p->o->nranks};
  if (p->nlocal < p->o->nranks) CHECK(drv_ipc_handle(f->page, board_blob(p->run->board, d->rank)));
  return ncclSuccess;
}

/* Local rank i reaches every other rank's page: another local rank's through peer access, another process's
 * through its handle. */
static ncclResult_t join_pages(bench_proc_t *p, int i) {
  dev_rank_t *d = &p->ranks[i];
  struct floor_rank *f = &p->floors[i];
  for (int r = 0; r < p->o->nranks; r++) {
    if (r == d->rank) continue;
    if (is_local(p, r)) {
      CHECK(drv_peer_access(d->dev, p->ranks[r - p->first_rank].dev));
      f->args.peers[r] = p->floors[r - p->first_rank].page;
    } else {
      CHECK(dev_enter(d));
      CHECK(drv_ipc_open(board_blob(p->run->board, r), &f->opened[r]));
      f->args.peers[r] = f->opened[r];
    }
  }
  return ncclSuccess;
}

ncclResult_t floor_setup(bench_proc_t *p) {
  /* The parent refused a run without GPUs, without the floor kernel or with more than FLOOR_MAX_RANKS ranks
   * before forking (bench.c, decide_device). */
  p->floors = calloc((size_t)p->nlocal, sizeof(*p->floors));
  if (p->floors == NULL) {
    fprintf(stderr, "braid bench: out of memory for the floor probe of %d ranks\n", p->nlocal);
    return ncclSystemError;
  }
  for (int i = 0; i < p->nlocal; i++) CHECK(make_page(p, i));
  CHECK(board_barrier(p->run->board)); /* every process's handles are on the board */
  for (int i = 0; i < p->nlocal; i++) CHECK(join_pages(p, i));
  return ncclSuccess;
}

ncclResult_t floor_launch(const bench_proc_t *p, int i) {
  struct floor_rank *f = &p->floors[i];
  CHECK(dev_enter(&p->ranks[i]));
  return drv_launch(f->kernel, 1, FLOOR_THREADS, &f->args, p->ranks[i].stream, f->overlap);
}

ncclResult_t floor_check(const bench_proc_t *p) {
  for (int i = 0; i < p->nlocal; i++) {
    const dev_rank_t *d = &p->ranks[i];
    unsigned long long error = 0;
    CHECK(dev_enter(d));
    CHECK(drv_download(&error, (unsigned long long *)p->floors[i].page + FLOOR_ERROR, sizeof(error),
                       d->stream));
    CHECK(drv_stream_sync(d->stream));
    if (error != 0) {
      fprintf(stderr,
              "braid bench: rank %d: a floor launch waited more than %llu s for rank %llu's line; is the "
              "link between their GPUs up?\n",
              d->rank, FLOOR_TIMEOUT_NS / 1000000000ull, error - 1);
      return ncclSystemError;
    }
  }
  return ncclSuccess;
}

void floor_teardown(bench_proc_t *p) {
  for (int i = 0; p->floors != NULL && i < p->nlocal; i++) {
    struct floor_rank *f = &p->floors[i];
    if (dev_enter(&p->ranks[i]) != ncclSuccess) continue;
    /* Failures are reported by cuda_drv and change nothing: the process is ending. */
    for (int r = 0; r < FLOOR_MAX_RANKS; r++)
      if (f->opened[r] != NULL) drv_ipc_close(f->opened[r]);
    if (f->page != NULL) drv_mem_free(f->page);
    if (f->module != NULL) drv_module_unload(f->module);
  }
  free(p->floors);
  p->floors = NULL;
}
