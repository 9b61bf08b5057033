/*
 * The child process of `braid bench --resources` (see bench_res.h): one library, every rank in this process
 * (rank r on device r, as --single), measured in steps, each writing its figures as soon as it has them.
 *
 *   1. every device's primary context is retained and made current, then each GPU's used memory (total -
 *      free) is read: "before init", the contexts alone;
 *   2. ncclCommInitAll is timed, then the memory read again;
 *   3. the bench's buffers and streams are made; what they took is measured across their creation (the
 *      driver rounds allocations up, so this is more exact than their nominal size) and taken off every later
 *      figure; the first all_reduce is timed from the group's start to the end of every stream's
 *      synchronisation;
 *   4. every other collective, then every in-place form, runs once; memory is read after synchronising;
 *   5. after a synchronised warm-up, a loop of small all_reduces without synchronisation times what a call
 *      costs the host, then the synchronisation is timed with it; then the same loop of what any library's
 *      eager call must do at least, on every GPU: make the rank's context current and launch a kernel (an
 *      empty one, tools/floor.cu): the floor of the host's time per call;
 *   6. the communicators are destroyed and everything freed.
 * Memory is read device-wide (cuMemGetInfo), so it holds only on GPUs nothing else uses; the figure is the
 * largest over the GPUs. On the host backend there is no device memory: those figures stay NaN.
 */
#include "bench_res.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "base/check.h"
#include "bench_floor.h"
#include "stats.h"

#define MIB 1048576.0

/* The child's state: its ranks and, per GPU, the memory readings later figures are taken relative to. */
typedef struct {
  const bench_opts_t *o;
  const bench_run_t *run;
  int lib;
  int n;              /* ranks, all in this process */
  dev_rank_t *ranks;  /* [n] buffers, stream and communicator of each rank */
  coll_call_t *calls; /* [n] the calls of the collective being run */
  double *before;     /* [n] MiB used before init */
  double *bench;      /* [n] MiB the bench's buffers and streams took */
  double *used;       /* [n] MiB used at the latest reading */
  res_figs_t *figs;
} res_proc_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reports a failed library call once, naming the rank; passes the result on. */
static ncclResult_t called(const res_proc_t *p, int rank, ncclComm_t comm, const char *what,
                           ncclResult_t res) {
  if (res != ncclSuccess) {
    char who[64];
    snprintf(who, sizeof(who), "braid bench --resources: rank %d, library %c", rank, 'A' + p->lib);
    lib_report(&p->run->libs[p->lib], comm, who, what, res);
  }
  return res;
}

/* Memory --------------------------------------------------------------------------------------------------
 */

/* Reads every GPU's used memory into p->used, in MiB; NaN on the host. */
static ncclResult_t read_used(res_proc_t *p) {
  for (int i = 0; i < p->n; i++) {
    p->used[i] = NAN;
    if (!p->run->gpu) continue;
    size_t free_bytes, total;
    CHECK(drv_mem_info(p->ranks[i].dev, &free_bytes, &total));
    p->used[i] = (double)(total - free_bytes) / MIB;
  }
  return ncclSuccess;
}

/* The largest over the GPUs of the latest reading, less the bench's own memory and (with `relative`) less
 * the reading before init: the library's figure on its worst GPU. NaN on the host. */
static double worst_gpu(const res_proc_t *p, int relative) {
  double worst = NAN;
  for (int i = 0; i < p->n; i++)
    worst = fmax(worst, p->used[i] - p->bench[i] - (relative ? p->before[i] : 0));
  return worst;
}

/* Calls ----------------------------------------------------------------------------------------------------
 */

/* Points every rank's call of `coll` (float sum, root -r) at its buffers, in place or not. */
static void prepare(res_proc_t *p, const coll_t *coll, size_t bytes, int in_place) {
  for (int i = 0; i < p->n; i++) {
    dev_rank_t *d = &p->ranks[i];
    coll_call_t *c = &p->calls[i];
    *c = (coll_call_t){.lib = &p->run->libs[p->lib],
                       .comm = d->comms[p->lib],
                       .stream = d->stream,
                       .rank = d->rank,
                       .nranks = p->n,
                       .root = p->o->root,
                       .type = ncclFloat,
                       .op = ncclSum,
                       .op_kind = ncclSum,
                       .send = d->sbuf,
                       .recv = d->rbuf};
    coll->shape(bytes, sizeof(float), p->n, c->rank, c->root, &c->shape);
    if (in_place) coll->place(c, d->rbuf, &c->send, &c->recv);
  }
}

/* One iteration: every rank's call, in one group (even of one rank, so that every library is timed the same
 * way). */
static ncclResult_t group_call(const res_proc_t *p, const coll_t *coll) {
  const nccl_lib_t *l = &p->run->libs[p->lib];
  CHECK(called(p, 0, NULL, "ncclGroupStart", l->GroupStart()));
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < p->n && res == ncclSuccess; i++)
    res = called(p, p->calls[i].rank, p->calls[i].comm, coll->api, coll->run(&p->calls[i]));
  /* Closed even after a failed call, so that the library's group depth stays balanced. */
  ncclResult_t end = called(p, 0, NULL, "ncclGroupEnd", l->GroupEnd());
  return res != ncclSuccess ? res : end;
}

static ncclResult_t sync_all(const res_proc_t *p) {
  for (int i = 0; i < p->n; i++) CHECK(dev_sync(&p->ranks[i]));
  return ncclSuccess;
}

/* The steps ------------------------------------------------------------------------------------------------
 */

/* Step 1: every device's primary context, then the memory they hold alone. */
static ncclResult_t open_devices(res_proc_t *p) {
  int ndev = 0;
  char why[160];
  if (p->run->gpu && (drv_open(&ndev, why, sizeof(why)) != ncclSuccess || ndev < p->n)) {
    fprintf(stderr, "braid bench --resources: the CUDA driver has %d GPUs for %d ranks%s%s\n", ndev, p->n,
            ndev == 0 ? ": " : "", ndev == 0 ? why : "");
    return ncclSystemError;
  }
  for (int i = 0; i < p->n; i++) {
    p->ranks[i] = (dev_rank_t){.rank = i, .dev = p->run->gpu ? i : -1};
    CHECK(dev_enter(&p->ranks[i]));
  }
  CHECK(read_used(p));
  for (int i = 0; i < p->n; i++) p->before[i] = p->used[i];
  p->figs->v[RES_MEM_BEFORE_INIT] = worst_gpu(p, 0);
  return ncclSuccess;
}

/* Step 2: ncclCommInitAll over devices 0 to n-1 (ranks' indices on the host), then memory. */
static ncclResult_t init_comms(res_proc_t *p) {
  ncclComm_t *comms = calloc((size_t)p->n, sizeof(*comms));
  int *devs = calloc((size_t)p->n, sizeof(*devs));
  ncclResult_t res = ncclSuccess;
  if (comms == NULL || devs == NULL) {
    fprintf(stderr, "braid bench --resources: out of memory for %d communicators\n", p->n);
    res = ncclSystemError;
    goto out;
  }
  for (int i = 0; i < p->n; i++) devs[i] = i;
  double t0 = now_s();
  res = called(p, 0, NULL, "ncclCommInitAll", p->run->libs[p->lib].CommInitAll(comms, p->n, devs));
  double t1 = now_s();
  if (res != ncclSuccess) goto out;
  p->figs->v[RES_INIT_MS] = (t1 - t0) * 1e3;
  for (int i = 0; i < p->n; i++) p->ranks[i].comms[p->lib] = comms[i];
  CHECK_GOTO(read_used(p), res, out);
  p->figs->v[RES_MEM_AFTER_INIT] = worst_gpu(p, 0);
out:
  free(devs);
  free(comms);
  return res;
}

/* Step 3, first half: each rank's buffers and stream, and the memory they took on each GPU. */
static ncclResult_t make_buffers(res_proc_t *p) {
  CHECK(read_used(p));
  for (int i = 0; i < p->n; i++) p->bench[i] = p->used[i];
  for (int i = 0; i < p->n; i++) {
    dev_rank_t *d = &p->ranks[i];
    ncclComm_t comm = d->comms[p->lib];
    CHECK(dev_setup(d, i, d->dev, RES_BYTES, 1));
    d->comms[p->lib] = comm; /* dev_setup starts the rank afresh */
  }
  CHECK(read_used(p));
  for (int i = 0; i < p->n; i++) p->bench[i] = p->used[i] - p->bench[i];
  p->figs->v[RES_MEM_BENCH] = NAN;
  for (int i = 0; i < p->n; i++) p->figs->v[RES_MEM_BENCH] = fmax(p->figs->v[RES_MEM_BENCH], p->bench[i]);
  return ncclSuccess;
}

/* Step 3, second half: the first all_reduce, out of place, until every stream has finished it. */
static ncclResult_t first_call(res_proc_t *p) {
  const coll_t *coll = &bench_colls[COLL_ALL_REDUCE];
  prepare(p, coll, RES_BYTES, 0);
  double t0 = now_s();
  CHECK(group_call(p, coll));
  CHECK(sync_all(p));
  p->figs->v[RES_FIRST_MS] = (now_s() - t0) * 1e3;
  return ncclSuccess;
}

/* Step 4: every other collective once, then every in-place form (a library may set up staging for those),
 * then memory. */
static ncclResult_t every_coll(res_proc_t *p) {
  for (int in_place = 0; in_place < 2; in_place++)
    for (int c = 0; c < COLL_COUNT; c++) {
      const coll_t *coll = &bench_colls[c];
      if ((in_place && !coll->in_place) || (!in_place && c == COLL_ALL_REDUCE)) continue;
      prepare(p, coll, RES_BYTES, in_place);
      CHECK(group_call(p, coll));
    }
  CHECK(sync_all(p));
  CHECK(read_used(p));
  p->figs->v[RES_MEM_AFTER_ALL] = worst_gpu(p, 0);
  p->figs->v[RES_MEM_INCREASE] = worst_gpu(p, 1);
  return ncclSuccess;
}

/* Step 5: the host's time per eager call, and its floor. The timed loop never synchronises, so it measures
 * what a call costs the calling thread (the GPU works behind it); RES_LOOP stays below the queues' depths
 * (bench_res.h), so no call waits for the GPU. The synchronisation is then timed with the loop: time per
 * iteration. The floor is timed the same way: per iteration and rank, the rank's context made current (one
 * thread drives every GPU, as a library's calls in a group do) and one launch of an empty kernel on its
 * stream (NaN on the host and in a build without the kernel). The two loops take turns, RES_ROUNDS times, and
 * each figure is the median of its rounds. */
static ncclResult_t launch_empties(res_proc_t *p, drv_function_t *fns, int overlap, int iters) {
  floor_args_t args = {0};
  for (int k = 0; k < iters; k++)
    for (int i = 0; i < p->n; i++) {
      CHECK(dev_enter(&p->ranks[i]));
      CHECK(drv_launch(fns[i], 1, FLOOR_THREADS, &args, p->ranks[i].stream, overlap));
    }
  return ncclSuccess;
}

/* The floor's kernel on every rank's device (fns[i]); *on stays 0 on the host and in a build without it.
 * *overlap: its launches overlap the stream's previous kernel, as Braid's eager ones do where they can
 * (drv_can_overlap; the GPUs are alike). */
static ncclResult_t floor_open(res_proc_t *p, drv_module_t *mods, drv_function_t *fns, int *on,
                               int *overlap) {
  char why[160];
  *on = 0;
  *overlap = 0;
  if (!p->run->gpu || !floor_available(why, sizeof why)) return ncclSuccess;
  if (p->n > 0) CHECK(drv_can_overlap(p->ranks[0].dev, 0, overlap));
  for (int i = 0; i < p->n; i++) {
    CHECK(dev_enter(&p->ranks[i]));
    CHECK(drv_module_load(bench_floor_fatbin, &mods[i]));
    CHECK(drv_module_function(mods[i], "braid_floor_empty", &fns[i]));
  }
  *on = 1;
  return ncclSuccess;
}

static ncclResult_t host_loops(res_proc_t *p, drv_module_t *mods, drv_function_t *fns) {
  const coll_t *coll = &bench_colls[COLL_ALL_REDUCE];
  prepare(p, coll, RES_SMALL_BYTES, 0);
  for (int i = 0; i < RES_WARMUP; i++) CHECK(group_call(p, coll));
  CHECK(sync_all(p));
  int floor, overlap;
  CHECK(floor_open(p, mods, fns, &floor, &overlap));
  if (floor) {
    CHECK(launch_empties(p, fns, overlap, RES_WARMUP));
    CHECK(sync_all(p));
  }
  double enq[RES_ROUNDS], iter[RES_ROUNDS], flr[RES_ROUNDS];
  for (int r = 0; r < RES_ROUNDS; r++) {
    double t0 = now_s();
    for (int i = 0; i < RES_LOOP; i++) CHECK(group_call(p, coll));
    double t1 = now_s();
    CHECK(sync_all(p));
    double t2 = now_s();
    enq[r] = (t1 - t0) * 1e6 / ((double)RES_LOOP * p->n);
    iter[r] = (t2 - t0) * 1e6 / RES_LOOP;
    if (!floor) continue;
    t0 = now_s();
    CHECK(launch_empties(p, fns, overlap, RES_LOOP));
    t1 = now_s();
    CHECK(sync_all(p));
    flr[r] = (t1 - t0) * 1e6 / ((double)RES_LOOP * p->n);
  }
  p->figs->v[RES_ENQUEUE_US] = stats_median(enq, RES_ROUNDS);
  p->figs->v[RES_ITER_US] = stats_median(iter, RES_ROUNDS);
  if (floor) p->figs->v[RES_FLOOR_US] = stats_median(flr, RES_ROUNDS);
  CHECK(read_used(p));
  p->figs->v[RES_MEM_END] = worst_gpu(p, 0);
  return ncclSuccess;
}

static ncclResult_t eager_loops(res_proc_t *p) {
  drv_module_t *mods = calloc((size_t)p->n, sizeof *mods);
  drv_function_t *fns = calloc((size_t)p->n, sizeof *fns);
  ncclResult_t res = mods != NULL && fns != NULL ? ncclSuccess : ncclSystemError;
  if (res != ncclSuccess) fprintf(stderr, "braid bench --resources: out of memory for the floor loop\n");
  if (res == ncclSuccess) res = host_loops(p, mods, fns);
  for (int i = 0; mods != NULL && i < p->n; i++)
    if (mods[i] != NULL && dev_enter(&p->ranks[i]) == ncclSuccess) drv_module_unload(mods[i]);
  free(mods);
  free(fns);
  return res;
}

/* Step 6: the communicators, then the ranks' buffers and streams. */
static ncclResult_t destroy_all(res_proc_t *p) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < p->n; i++) {
    dev_rank_t *d = &p->ranks[i];
    if (d->comms[p->lib] == NULL) continue;
    ncclResult_t r =
        called(p, i, d->comms[p->lib], "ncclCommDestroy", p->run->libs[p->lib].CommDestroy(d->comms[p->lib]));
    d->comms[p->lib] = NULL;
    if (res == ncclSuccess) res = r;
  }
  for (int i = 0; i < p->n; i++) dev_teardown(&p->ranks[i]);
  return res;
}

static ncclResult_t run_steps(res_proc_t *p) {
  CHECK(open_devices(p));
  CHECK(init_comms(p));
  CHECK(make_buffers(p));
  CHECK(first_call(p));
  CHECK(every_coll(p));
  CHECK(eager_loops(p));
  return destroy_all(p);
}

int res_measure(const bench_opts_t *o, const bench_run_t *run, int lib, res_figs_t *figs) {
  int n = o->nranks;
  res_proc_t p = {.o = o, .run = run, .lib = lib, .n = n, .figs = figs};
  p.ranks = calloc((size_t)n, sizeof(*p.ranks));
  p.calls = calloc((size_t)n, sizeof(*p.calls));
  p.before = calloc((size_t)n, sizeof(*p.before));
  p.bench = calloc((size_t)n, sizeof(*p.bench));
  p.used = calloc((size_t)n, sizeof(*p.used));
  ncclResult_t res = ncclSystemError;
  if (p.ranks == NULL || p.calls == NULL || p.before == NULL || p.bench == NULL || p.used == NULL)
    fprintf(stderr, "braid bench --resources: out of memory for %d ranks\n", n);
  else
    res = run_steps(&p);
  /* After a failure nothing is destroyed: a communicator may have work queued that never completes, and
   * freeing device memory under it could wait for ever. The process is ending. */
  figs->complete = res == ncclSuccess;
  free(p.ranks);
  free(p.calls);
  free(p.before);
  free(p.bench);
  free(p.used);
  return res == ncclSuccess ? 0 : 1;
}
