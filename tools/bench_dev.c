/*
 * A rank's buffers, stream and marks (see bench_dev.h). Every driver call that works on the rank's device
 * makes that device current first: with --single one thread drives several devices in turn, and switching the
 * current context is cheap next to any of these calls.
 */
#include "bench_dev.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/check.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int on_gpu(const dev_rank_t *d) {
  return d->dev >= 0;
}

/* Host memory for the buffers (on the host) or their images (on a GPU); zeroed, so that runs without checks
 * still compute on numbers. */
static ncclResult_t host_alloc(const dev_rank_t *d, char **p) {
  *p = calloc(1, d->bytes);
  if (*p != NULL) return ncclSuccess;
  fprintf(stderr, "braid bench: rank %d: out of host memory for a buffer of %zu bytes\n", d->rank, d->bytes);
  return ncclSystemError;
}

/* The GPU side: stream, buffers (zeroed, as on the host), events. */
static ncclResult_t gpu_setup(dev_rank_t *d) {
  CHECK(drv_use_device(d->dev));
  CHECK(drv_stream_create(&d->stream));
  CHECK(drv_mem_alloc((void **)&d->sbuf, d->bytes));
  CHECK(drv_mem_alloc((void **)&d->rbuf, d->bytes));
  CHECK(drv_memset(d->sbuf, 0, d->bytes, d->stream));
  CHECK(drv_memset(d->rbuf, 0, d->bytes, d->stream));
  d->events = calloc((size_t)d->nmarks, sizeof(*d->events));
  if (d->events == NULL) {
    fprintf(stderr, "braid bench: rank %d: out of host memory for %d events\n", d->rank, d->nmarks);
    return ncclSystemError;
  }
  for (int i = 0; i < d->nmarks; i++) CHECK(drv_event_create(&d->events[i]));
  return drv_stream_sync(d->stream);
}

ncclResult_t dev_setup(dev_rank_t *d, int rank, int dev, size_t bytes, int nmarks) {
  *d = (dev_rank_t){.rank = rank, .dev = dev, .bytes = bytes > 0 ? bytes : 1, .nmarks = nmarks};
  ncclResult_t res = ncclSuccess;
  CHECK_GOTO(host_alloc(d, &d->hsend), res, err);
  CHECK_GOTO(host_alloc(d, &d->hrecv), res, err);
  if (on_gpu(d)) {
    CHECK_GOTO(gpu_setup(d), res, err);
  } else {
    d->sbuf = d->hsend;
    d->rbuf = d->hrecv;
    d->clock = calloc((size_t)nmarks, sizeof(*d->clock));
    if (d->clock == NULL) {
      fprintf(stderr, "braid bench: rank %d: out of host memory for %d marks\n", rank, nmarks);
      res = ncclSystemError;
      goto err;
    }
  }
  return ncclSuccess;
err:
  dev_teardown(d);
  return res;
}

void dev_teardown(dev_rank_t *d) {
  dev_graph_free(d);
  if (on_gpu(d) && drv_use_device(d->dev) == ncclSuccess) {
    /* Failures here are reported by cuda_drv and change nothing: the process is ending. */
    for (int i = 0; d->events != NULL && i < d->nmarks; i++)
      if (d->events[i] != NULL) drv_event_destroy(d->events[i]);
    if (d->sbuf != NULL) drv_mem_free(d->sbuf);
    if (d->rbuf != NULL) drv_mem_free(d->rbuf);
    if (d->stream != NULL) drv_stream_destroy(d->stream);
  }
  free(d->events);
  free(d->clock);
  free(d->hsend);
  free(d->hrecv);
  *d = (dev_rank_t){.dev = d->dev, .rank = d->rank};
}

ncclResult_t dev_enter(const dev_rank_t *d) {
  return on_gpu(d) ? drv_use_device(d->dev) : ncclSuccess;
}

char *dev_host_image(const dev_rank_t *d, const void *buf) {
  const char *p = buf;
  if (p >= d->rbuf && p < d->rbuf + d->bytes) return d->hrecv + (p - d->rbuf);
  return d->hsend + (p - d->sbuf);
}

ncclResult_t dev_upload(const dev_rank_t *d, void *buf, size_t bytes) {
  if (!on_gpu(d) || bytes == 0) return ncclSuccess;
  CHECK(drv_use_device(d->dev));
  return drv_upload(buf, dev_host_image(d, buf), bytes, d->stream);
}

ncclResult_t dev_download(const dev_rank_t *d, const void *buf, size_t bytes) {
  if (!on_gpu(d) || bytes == 0) return ncclSuccess;
  CHECK(drv_use_device(d->dev));
  return drv_download(dev_host_image(d, buf), buf, bytes, d->stream);
}

ncclResult_t dev_sync(const dev_rank_t *d) {
  if (!on_gpu(d)) return ncclSuccess;
  CHECK(drv_use_device(d->dev));
  return drv_stream_sync(d->stream);
}

ncclResult_t dev_mark(dev_rank_t *d, int i) {
  if (!on_gpu(d)) {
    d->clock[i] = now_s();
    return ncclSuccess;
  }
  CHECK(drv_use_device(d->dev));
  return drv_event_record(d->events[i], d->stream);
}

ncclResult_t dev_between_us(dev_rank_t *d, int i, int j, double *us_p) {
  if (!on_gpu(d)) {
    *us_p = (d->clock[j] - d->clock[i]) * 1e6;
    return ncclSuccess;
  }
  float ms;
  CHECK(drv_use_device(d->dev));
  CHECK(drv_event_elapsed_ms(d->events[i], d->events[j], &ms));
  *us_p = (double)ms * 1e3;
  return ncclSuccess;
}

ncclResult_t dev_capture_begin(dev_rank_t *d) {
  if (!on_gpu(d)) {
    fprintf(stderr, "braid bench: rank %d: CUDA graphs need --device cuda\n", d->rank);
    return ncclInvalidUsage;
  }
  CHECK(drv_use_device(d->dev));
  return drv_capture_begin(d->stream);
}

ncclResult_t dev_capture_end(dev_rank_t *d) {
  CHECK(drv_use_device(d->dev));
  return drv_capture_end(d->stream, &d->captured);
}

ncclResult_t dev_graph_instantiate(dev_rank_t *d) {
  CHECK(drv_use_device(d->dev));
  void *captured = d->captured;
  d->captured = NULL;
  return drv_graph_instantiate(captured, &d->graph);
}

ncclResult_t dev_replay(dev_rank_t *d) {
  CHECK(drv_use_device(d->dev));
  return drv_graph_launch(d->graph, d->stream);
}

void dev_graph_free(dev_rank_t *d) {
  if (d->graph != NULL) drv_graph_destroy(d->graph);
  d->graph = NULL;
}
