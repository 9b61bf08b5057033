/*
 * One library on one form of one row, over this process's ranks: the check, the warm-up and the timed
 * samples.
 *
 * An iteration is one call per local rank; with several local ranks (--single) the calls of an iteration are
 * one group (ncclGroupStart/End), each rank's call on its own stream. A sample is `batch` back-to-back
 * iterations between two marks on each rank's stream (CUDA events; the clock on the host backend, whose calls
 * complete before they return); the samples follow one another with no synchronisation in between, so a
 * rank's GPU never waits for its host between marks once the queue is full (unless -z asks it to). With -m
 * an iteration is that many calls per rank, in one group. With -G N the `batch` iterations are captured once
 * into a graph per rank and each sample replays it N times. A rank's figure is the median over its samples of
 * the sample's time divided by its number of calls per rank.
 */
#include "bench.h"

#include <math.h>
#include <stdlib.h>

#include "base/check.h"
#include "base/dtype.h"
#include "bench_floor.h"
#include "stats.h"

ncclResult_t bench_called(const bench_proc_t *p, int lib, int rank, ncclComm_t comm, const char *what,
                          ncclResult_t res) {
  if (res != ncclSuccess) {
    char who[64];
    snprintf(who, sizeof(who), "braid bench: rank %d, library %c", rank, 'A' + lib);
    lib_report(&p->run->libs[lib], comm, who, what, res);
  }
  return res;
}

/* One iteration: `agg` calls of every local rank, grouped when there are several (-m, --single); or every
 * local rank's floor launch. */
static ncclResult_t iteration(const bench_proc_t *p, const coll_t *coll, int lib, int agg) {
  if (lib == BENCH_FLOOR) {
    for (int i = 0; i < p->nlocal; i++) CHECK(floor_launch(p, i));
    return ncclSuccess;
  }
  const nccl_lib_t *l = &p->run->libs[lib];
  int grouped = p->nlocal > 1 || agg > 1;
  if (grouped) CHECK(bench_called(p, lib, p->first_rank, NULL, "ncclGroupStart", l->GroupStart()));
  ncclResult_t res = ncclSuccess;
  for (int k = 0; k < agg && res == ncclSuccess; k++) {
    for (int i = 0; i < p->nlocal && res == ncclSuccess; i++) {
      coll_call_t *c = bench_call(p, lib, i);
      res = bench_called(p, lib, c->rank, c->comm, coll->api, coll->run(c));
    }
  }
  if (grouped) {
    /* Closed even after a failed call, so that the library's group depth stays balanced. */
    ncclResult_t end = bench_called(p, lib, p->first_rank, NULL, "ncclGroupEnd", l->GroupEnd());
    if (res == ncclSuccess) res = end;
  }
  return res;
}

static ncclResult_t sync_all(const bench_proc_t *p) {
  for (int i = 0; i < p->nlocal; i++) CHECK(dev_sync(&p->ranks[i]));
  return ncclSuccess;
}

/* n iterations of -m calls each; with -z 1 or 2 the host waits for each before the next. */
static ncclResult_t repeat(const bench_proc_t *p, const coll_t *coll, int lib, int n) {
  int agg = lib == BENCH_FLOOR ? 1 : p->o->agg;
  for (int i = 0; i < n; i++) {
    CHECK(iteration(p, coll, lib, agg));
    if (p->o->blocking == 1 || p->o->blocking == 2) CHECK(sync_all(p));
  }
  return ncclSuccess;
}

/* The call as the data functions see it: the same shape and placement, on the buffers' host images. */
static coll_call_t host_view(const dev_rank_t *d, const coll_call_t *c) {
  coll_call_t h = *c;
  h.send = dev_host_image(d, c->send);
  h.recv = dev_host_image(d, c->recv);
  return h;
}

/* One checked iteration on fresh data. Each rank's receive side is poisoned and its send side filled on the
 * host images (in that order: in place, the send data lies inside the receive buffer), both are uploaded,
 * the calls run, and the receive side comes back to be compared with what it must hold. */
static ncclResult_t check_once(const bench_proc_t *p, const coll_t *coll, int lib, double *wrong_p) {
  for (int i = 0; i < p->nlocal; i++) {
    const dev_rank_t *d = &p->ranks[i];
    const coll_call_t *c = bench_call(p, lib, i);
    coll_call_t h = host_view(d, c);
    size_t esize = dtype_size(c->type);
    data_poison(&h);
    data_fill(&h);
    CHECK(dev_upload(d, c->recv, c->shape.recv_elems * esize));
    CHECK(dev_upload(d, c->send, c->shape.send_elems * esize));
  }
  CHECK(sync_all(p));
  CHECK(iteration(p, coll, lib, 1));
  for (int i = 0; i < p->nlocal; i++) {
    const dev_rank_t *d = &p->ranks[i];
    const coll_call_t *c = bench_call(p, lib, i);
    coll_call_t h = host_view(d, c);
    CHECK(dev_sync(d));
    CHECK(dev_download(d, c->recv, c->shape.recv_elems * dtype_size(c->type)));
    CHECK(dev_sync(d));
    wrong_p[i] += (double)data_check(coll, &h);
  }
  return ncclSuccess;
}

/* Captures `batch` iterations into a graph per rank, then replays each once untimed (the first launch of a
 * graph also uploads it). With one process for several ranks, every capture ends before any graph is
 * instantiated (drv_graph_instantiate). */
static ncclResult_t capture(bench_proc_t *p, const coll_t *coll, int lib, int batch) {
  for (int i = 0; i < p->nlocal; i++) CHECK(dev_capture_begin(&p->ranks[i]));
  CHECK(repeat(p, coll, lib, batch));
  for (int i = 0; i < p->nlocal; i++) CHECK(dev_capture_end(&p->ranks[i]));
  for (int i = 0; i < p->nlocal; i++) CHECK(dev_graph_instantiate(&p->ranks[i]));
  for (int i = 0; i < p->nlocal; i++) CHECK(dev_replay(&p->ranks[i]));
  return sync_all(p);
}

/* The timed samples: marks 0 to samples on every rank, `batch` iterations (or -G replays of their graph)
 * between two; with -z 3 the host waits for each sample before the next. */
static ncclResult_t run_samples(bench_proc_t *p, const coll_t *coll, int lib, int batch) {
  int samples = p->o->samples;
  for (int s = 0; s <= samples; s++) {
    for (int i = 0; i < p->nlocal; i++) CHECK(dev_mark(&p->ranks[i], s));
    if (s == samples) break;
    if (p->o->graph)
      for (int g = 0; g < p->o->graph; g++)
        for (int i = 0; i < p->nlocal; i++) CHECK(dev_replay(&p->ranks[i]));
    else
      CHECK(repeat(p, coll, lib, batch));
    if (p->o->blocking == 3) CHECK(sync_all(p));
  }
  return ncclSuccess;
}

/* Each rank's median time per call over its samples; `scratch` holds `samples` doubles. */
static ncclResult_t medians(bench_proc_t *p, int lib, int batch, double *scratch, double *time_us_p) {
  int samples = p->o->samples;
  double calls = (double)batch * (p->o->graph ? p->o->graph : 1) * (lib == BENCH_FLOOR ? 1 : p->o->agg);
  for (int i = 0; i < p->nlocal; i++) {
    for (int s = 0; s < samples; s++) {
      CHECK(dev_between_us(&p->ranks[i], s, s + 1, &scratch[s]));
      scratch[s] /= calls;
    }
    time_us_p[i] = stats_median(scratch, samples);
  }
  return ncclSuccess;
}

ncclResult_t measure_lib(bench_proc_t *p, const coll_t *coll, int lib, int batch, double *time_us_p,
                         double *wrong_p) {
  for (int i = 0; i < p->nlocal; i++) wrong_p[i] = NAN;
  double *scratch = malloc((size_t)p->o->samples * sizeof(*scratch));
  if (scratch == NULL) {
    fprintf(stderr, "braid bench: out of memory for %d samples\n", p->o->samples);
    return ncclSystemError;
  }
  ncclResult_t res = ncclSuccess;
  if (p->o->check && lib != BENCH_FLOOR) {
    for (int i = 0; i < p->nlocal; i++) wrong_p[i] = 0;
    for (int k = 0; k < p->o->check; k++) CHECK_GOTO(check_once(p, coll, lib, wrong_p), res, out);
  }
  CHECK_GOTO(repeat(p, coll, lib, p->o->warmup), res, out);
  CHECK_GOTO(sync_all(p), res, out);
  if (p->o->graph) CHECK_GOTO(capture(p, coll, lib, batch), res, out);
  CHECK_GOTO(run_samples(p, coll, lib, batch), res, out);
  CHECK_GOTO(medians(p, lib, batch, scratch, time_us_p), res, out);
  if (lib == BENCH_FLOOR) CHECK_GOTO(floor_check(p), res, out);
out:
  for (int i = 0; i < p->nlocal; i++) dev_graph_free(&p->ranks[i]);
  free(scratch);
  return res;
}
