/*
 * The collectives `braid bench` measures: for each, how a sweep size becomes counts (nccl-tests' rules),
 * its bus-bandwidth factor (nccl-tests' definitions, so tables compare directly), where its in-place
 * buffers lie (NCCL's in-place rules), the call itself and the value each received element must hold.
 */
#include "bench.h"

#include "base/dtype.h"

/* Sizes ---------------------------------------------------------------------------------------------- */

/* One buffer of count elements on every rank (all_reduce, broadcast, sendrecv). */
static void shape_flat(size_t bytes, size_t esize, int nranks, int rank, int root, coll_shape_t *s) {
  size_t count = bytes / esize;
  *s = (coll_shape_t){.count = count, .send_elems = count, .recv_elems = count, .bytes = count * esize};
}

/* As shape_flat, but only the root receives (reduce). */
static void shape_to_root(size_t bytes, size_t esize, int nranks, int rank, int root, coll_shape_t *s) {
  shape_flat(bytes, esize, nranks, rank, root, s);
  if (rank != root) s->recv_elems = 0;
}

/* A send block per rank, gathered into nranks blocks (all_gather). */
static void shape_gather_all(size_t bytes, size_t esize, int nranks, int rank, int root, coll_shape_t *s) {
  size_t count = bytes / esize / (size_t)nranks;
  *s = (coll_shape_t){count, count, count * nranks, count * nranks * esize};
}

/* As shape_gather_all, but only the root receives (gather). */
static void shape_gather(size_t bytes, size_t esize, int nranks, int rank, int root, coll_shape_t *s) {
  shape_gather_all(bytes, esize, nranks, rank, root, s);
  if (rank != root) s->recv_elems = 0;
}

/* nranks send blocks, one received block (reduce_scatter, scatter). */
static void shape_scatter(size_t bytes, size_t esize, int nranks, int rank, int root, coll_shape_t *s) {
  size_t count = bytes / esize / (size_t)nranks;
  *s = (coll_shape_t){count, count * nranks, count, count * nranks * esize};
}

/* nranks blocks each way (alltoall). */
static void shape_alltoall(size_t bytes, size_t esize, int nranks, int rank, int root, coll_shape_t *s) {
  size_t count = bytes / esize / (size_t)nranks;
  *s = (coll_shape_t){count, count * nranks, count * nranks, count * nranks * esize};
}

/* Bus bandwidth factors ------------------------------------------------------------------------------- */

static double factor_all_reduce(int n) {
  return 2.0 * (n - 1) / n;
}

static double factor_spread(int n) {
  return (double)(n - 1) / n;
}

static double factor_one(int n) {
  return 1.0;
}

/* In-place placement ---------------------------------------------------------------------------------- */

/* The send buffer is the receive buffer. */
static void place_same(const coll_call_t *c, char *base, void **send_p, void **recv_p) {
  *send_p = base;
  *recv_p = base;
}

/* The send buffer is this rank's block of the receive buffer (all_gather, gather). */
static void place_send_block(const coll_call_t *c, char *base, void **send_p, void **recv_p) {
  *send_p = base + (size_t)c->rank * c->shape.count * dtype_size(c->type);
  *recv_p = base;
}

/* The receive buffer is this rank's block of the send buffer (reduce_scatter, scatter). */
static void place_recv_block(const coll_call_t *c, char *base, void **send_p, void **recv_p) {
  *send_p = base;
  *recv_p = base + (size_t)c->rank * c->shape.count * dtype_size(c->type);
}

/* Calls -------------------------------------------------------------------------------------------- */

static ncclResult_t run_all_reduce(const coll_call_t *c) {
  return c->lib->AllReduce(c->send, c->recv, c->shape.count, c->type, c->op, c->comm, c->stream);
}

static ncclResult_t run_all_gather(const coll_call_t *c) {
  return c->lib->AllGather(c->send, c->recv, c->shape.count, c->type, c->comm, c->stream);
}

static ncclResult_t run_reduce_scatter(const coll_call_t *c) {
  return c->lib->ReduceScatter(c->send, c->recv, c->shape.count, c->type, c->op, c->comm, c->stream);
}

static ncclResult_t run_broadcast(const coll_call_t *c) {
  return c->lib->Broadcast(c->send, c->recv, c->shape.count, c->type, c->root, c->comm, c->stream);
}

static ncclResult_t run_reduce(const coll_call_t *c) {
  return c->lib->Reduce(c->send, c->recv, c->shape.count, c->type, c->op, c->root, c->comm, c->stream);
}

static ncclResult_t run_alltoall(const coll_call_t *c) {
  return c->lib->AlltoAll(c->send, c->recv, c->shape.count, c->type, c->comm, c->stream);
}

/* A ring in one group: send to the next rank, receive from the previous one. */
static ncclResult_t run_sendrecv(const coll_call_t *c) {
  int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
  ncclResult_t res = c->lib->GroupStart();
  if (res != ncclSuccess) return res;
  res = c->lib->Send(c->send, c->shape.count, c->type, next, c->comm, c->stream);
  if (res == ncclSuccess) res = c->lib->Recv(c->recv, c->shape.count, c->type, prev, c->comm, c->stream);
  /* The group is closed even after a failed call, so that the library's group depth stays balanced. */
  ncclResult_t end = c->lib->GroupEnd();
  return res != ncclSuccess ? res : end;
}

static ncclResult_t run_gather(const coll_call_t *c) {
  return c->lib->Gather(c->send, c->recv, c->shape.count, c->type, c->root, c->comm, c->stream);
}

static ncclResult_t run_scatter(const coll_call_t *c) {
  return c->lib->Scatter(c->send, c->recv, c->shape.count, c->type, c->root, c->comm, c->stream);
}

/* Expected results: element i of the receive buffer ------------------------------------------------- */

static double expect_reduced(const coll_call_t *c, size_t i) {
  return data_reduced(c, i);
}

static double expect_reduced_block(const coll_call_t *c, size_t i) {
  return data_reduced(c, (size_t)c->rank * c->shape.count + i);
}

static double expect_gathered(const coll_call_t *c, size_t i) {
  return data_value(c, (int)(i / c->shape.count), i % c->shape.count);
}

static double expect_root(const coll_call_t *c, size_t i) {
  return data_value(c, c->root, i);
}

static double expect_alltoall(const coll_call_t *c, size_t i) {
  size_t count = c->shape.count;
  return data_value(c, (int)(i / count), (size_t)c->rank * count + i % count);
}

static double expect_root_block(const coll_call_t *c, size_t i) {
  return data_value(c, c->root, (size_t)c->rank * c->shape.count + i);
}

static double expect_prev(const coll_call_t *c, size_t i) {
  return data_value(c, (c->rank + c->nranks - 1) % c->nranks, i);
}

/* The table ---------------------------------------------------------------------------------------- */

/* alltoall and sendrecv have no in-place form: NCCL does not define one (every rank would overwrite data
 * that a peer still has to read). */
const coll_t bench_colls[COLL_COUNT] = {
    [COLL_ALL_REDUCE] = {.name = "all_reduce",
                         .api = "ncclAllReduce",
                         .reduces = 1,
                         .in_place = 1,
                         .shape = shape_flat,
                         .busbw_factor = factor_all_reduce,
                         .place = place_same,
                         .run = run_all_reduce,
                         .expect = expect_reduced},
    [COLL_ALL_GATHER] = {.name = "all_gather",
                         .api = "ncclAllGather",
                         .in_place = 1,
                         .shape = shape_gather_all,
                         .busbw_factor = factor_spread,
                         .place = place_send_block,
                         .run = run_all_gather,
                         .expect = expect_gathered},
    [COLL_REDUCE_SCATTER] = {.name = "reduce_scatter",
                             .api = "ncclReduceScatter",
                             .reduces = 1,
                             .in_place = 1,
                             .shape = shape_scatter,
                             .busbw_factor = factor_spread,
                             .place = place_recv_block,
                             .run = run_reduce_scatter,
                             .expect = expect_reduced_block},
    [COLL_BROADCAST] = {.name = "broadcast",
                        .api = "ncclBroadcast",
                        .rooted = 1,
                        .in_place = 1,
                        .shape = shape_flat,
                        .busbw_factor = factor_one,
                        .place = place_same,
                        .run = run_broadcast,
                        .expect = expect_root},
    [COLL_REDUCE] = {.name = "reduce",
                     .api = "ncclReduce",
                     .reduces = 1,
                     .rooted = 1,
                     .in_place = 1,
                     .shape = shape_to_root,
                     .busbw_factor = factor_one,
                     .place = place_same,
                     .run = run_reduce,
                     .expect = expect_reduced},
    [COLL_ALLTOALL] = {.name = "alltoall",
                       .api = "ncclAlltoAll",
                       .shape = shape_alltoall,
                       .busbw_factor = factor_spread,
                       .run = run_alltoall,
                       .expect = expect_alltoall},
    [COLL_SENDRECV] = {.name = "sendrecv",
                       .api = "ncclSend/ncclRecv",
                       .shape = shape_flat,
                       .busbw_factor = factor_one,
                       .run = run_sendrecv,
                       .expect = expect_prev},
    [COLL_GATHER] = {.name = "gather",
                     .api = "ncclGather",
                     .rooted = 1,
                     .in_place = 1,
                     .shape = shape_gather,
                     .busbw_factor = factor_spread,
                     .place = place_send_block,
                     .run = run_gather,
                     .expect = expect_gathered},
    [COLL_SCATTER] = {.name = "scatter",
                      .api = "ncclScatter",
                      .rooted = 1,
                      .in_place = 1,
                      .shape = shape_scatter,
                      .busbw_factor = factor_spread,
                      .place = place_recv_block,
                      .run = run_scatter,
                      .expect = expect_root_block},
};
