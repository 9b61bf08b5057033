/*
 * A rank's side of the bench's memory and timing: its buffers, its stream and the marks that bound timed
 * samples, on a CUDA device or on the host, behind one interface so that the measurement loop is the same
 * for both.
 *
 * On a GPU the buffers are device memory, the stream is a non-blocking stream of the device's primary
 * context, marks are CUDA events recorded on that stream, and the host images (used to make and check data)
 * are separate host buffers that uploads and downloads copy, ordered on the stream. On the host the buffers
 * are host memory and their own images, the stream is NULL (the host backend runs each call before it
 * returns), uploads and downloads between a buffer and itself do nothing, and a mark reads the clock.
 */
#ifndef BRAID_TOOLS_BENCH_DEV_H
#define BRAID_TOOLS_BENCH_DEV_H

#include <stddef.h>

#include "cuda_drv.h"
#include "lib.h"

/* Libraries a rank holds a communicator of (bench.h's BENCH_MAX_LIBS). */
#define DEV_MAX_LIBS 2

typedef struct {
  int rank;            /* the global rank */
  int dev;             /* its CUDA device; -1 on the host */
  cudaStream_t stream; /* NULL on the host */
  size_t bytes;        /* the size of each buffer */
  char *sbuf, *rbuf;   /* the buffers the library is given */
  char *hsend, *hrecv; /* their host images (the buffers themselves on the host) */
  int nmarks;
  drv_event_t *events; /* [nmarks] on a GPU */
  double *clock;       /* [nmarks] on the host: seconds */
  drv_graph_t graph;   /* the graph being timed, or NULL */
  void *captured;      /* what the capture ended with, until it is instantiated into `graph` */
  ncclComm_t comms[DEV_MAX_LIBS];
} dev_rank_t;

/* Sets up rank `rank` on device `dev` (-1: the host) with two buffers of `bytes` and room for `nmarks`
 * marks. On failure what was set up is torn down. */
ncclResult_t dev_setup(dev_rank_t *d, int rank, int dev, size_t bytes, int nmarks);
/* Frees what dev_setup made (not the communicators). */
void dev_teardown(dev_rank_t *d);
/* Makes the rank's device current on this thread (nothing on the host). */
ncclResult_t dev_enter(const dev_rank_t *d);

/* The host image of a pointer into sbuf or rbuf. */
char *dev_host_image(const dev_rank_t *d, const void *buf);
/* Copies `bytes` at buf's host image into buf, and back. */
ncclResult_t dev_upload(const dev_rank_t *d, void *buf, size_t bytes);
ncclResult_t dev_download(const dev_rank_t *d, const void *buf, size_t bytes);
/* Waits for everything queued on the rank's stream. */
ncclResult_t dev_sync(const dev_rank_t *d);

/* Records mark i at this point of the stream. */
ncclResult_t dev_mark(dev_rank_t *d, int i);
/* Microseconds from mark i to mark j (waits for mark j). */
ncclResult_t dev_between_us(dev_rank_t *d, int i, int j, double *us_p);

/* Graphs: start capturing the stream; end the capture; instantiate the graph (once every capture of the
 * process has ended: drv_graph_instantiate); replay it; free it. */
ncclResult_t dev_capture_begin(dev_rank_t *d);
ncclResult_t dev_capture_end(dev_rank_t *d);
ncclResult_t dev_graph_instantiate(dev_rank_t *d);
ncclResult_t dev_replay(dev_rank_t *d);
void dev_graph_free(dev_rank_t *d);

#endif
