/*
 * One collective call checked end to end (see coll_check.h).
 */
#include "coll_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "harness.h"

const char *coll_kind_name(kind_t kind) {
  static const char *names[] = {"AllReduce", "Reduce",   "ReduceScatter", "AllGather",
                                "Broadcast", "AlltoAll", "Gather",        "Scatter"};
  return names[kind];
}

/* Where a case's inputs and outputs sit, in elements of its type. */
typedef struct {
  size_t send_elems, recv_elems; /* buffer sizes */
  size_t send_at;                /* in place: where the input starts inside the output buffer */
} layout_t;

static int reduces(kind_t k) {
  return k == K_ALLREDUCE || k == K_REDUCE || k == K_REDUCESCATTER;
}

static layout_t layout(const coll_case_t *c, int n, int rank) {
  size_t cnt = c->count;
  switch (c->kind) {
  case K_REDUCESCATTER:
    return (layout_t){n * cnt, cnt, 0};
  case K_ALLGATHER:
    return (layout_t){cnt, n * cnt, rank * cnt};
  case K_ALLTOALL:
    return (layout_t){n * cnt, n * cnt, 0};
  case K_GATHER:
    return (layout_t){cnt, n * cnt, rank * cnt};
  case K_SCATTER:
    return (layout_t){n * cnt, cnt, 0};
  default:
    return (layout_t){cnt, cnt, 0};
  }
}

/* The value of input element j of `rank` (ranks' inputs are independent of the kind). */
static double input(const coll_case_t *c, int rank, size_t j) {
  return data_value(c->seed, rank, j, c->type,
                    c->op < ncclNumOps && reduces(c->kind) ? (ncclRedOp_t)c->op : ncclSum);
}

/* Expected output element i of `rank`, or NAN where the output is not written. */
static double expected(const coll_case_t *c, int n, int rank, size_t i) {
  size_t cnt = c->count;
  ncclRedOp_t op = (ncclRedOp_t)c->op;
  switch (c->kind) {
  case K_ALLREDUCE:
    return data_expect(c->seed, n, i, c->type, op, 2.0);
  case K_REDUCE:
    return rank == c->root ? data_expect(c->seed, n, i, c->type, op, 2.0) : NAN;
  case K_REDUCESCATTER:
    return data_expect(c->seed, n, rank * cnt + i, c->type, op, 2.0);
  case K_ALLGATHER:
    return input(c, (int)(i / cnt), i % cnt);
  case K_BROADCAST:
    return input(c, c->root, i);
  case K_ALLTOALL:
    return input(c, (int)(i / cnt), rank * cnt + i % cnt);
  case K_GATHER:
    return rank == c->root ? input(c, (int)(i / cnt), i % cnt) : NAN;
  case K_SCATTER:
    return input(c, c->root, rank * cnt + i);
  default:
    break;
  }
  return NAN;
}

static ncclResult_t call(ncclComm_t comm, const coll_case_t *c, const void *s, void *r, ncclRedOp_t op) {
  ncclDataType_t t = c->type;
  switch (c->kind) {
  case K_ALLREDUCE:
    return ncclAllReduce(s, r, c->count, t, op, comm, NULL);
  case K_REDUCE:
    return ncclReduce(s, r, c->count, t, op, c->root, comm, NULL);
  case K_REDUCESCATTER:
    return ncclReduceScatter(s, r, c->count, t, op, comm, NULL);
  case K_ALLGATHER:
    return ncclAllGather(s, r, c->count, t, comm, NULL);
  case K_BROADCAST:
    return ncclBroadcast(s, r, c->count, t, c->root, comm, NULL);
  case K_ALLTOALL:
    return ncclAlltoAll(s, r, c->count, t, comm, NULL);
  case K_GATHER:
    return ncclGather(s, r, c->count, t, c->root, comm, NULL);
  case K_SCATTER:
    return ncclScatter(s, r, c->count, t, c->root, comm, NULL);
  default:
    return ncclInternalError;
  }
}

/* Makes the operation of the case: built-in, or a PreMulSum by 2 with the scalar on the host or "device". */
static ncclRedOp_t make_op(ncclComm_t comm, const coll_case_t *c, void *scalar) {
  if (!reduces(c->kind) || c->op < ncclNumOps) return (ncclRedOp_t)(reduces(c->kind) ? c->op : ncclSum);
  data_set(scalar, 0, c->type, 2.0);
  ncclRedOp_t op;
  ncclScalarResidence_t where = c->op == ncclNumOps ? ncclScalarHostImmediate : ncclScalarDevice;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&op, scalar, c->type, where, comm));
  return op;
}

static void verify(const coll_case_t *c, int n, int rank, const char *out, size_t elems) {
  ncclRedOp_t op = (ncclRedOp_t)(reduces(c->kind) ? c->op : ncclSum);
  for (size_t i = 0; i < elems; i++) {
    double want = expected(c, n, rank, i);
    if (want != want) continue; /* not written on this rank */
    double got = data_get(out, i, c->type);
    if (!data_match(got, want, c->type, op, n))
      test_fail(
          __FILE__, __LINE__,
          "%s %s %s count %zu %s-place root %d offset %d on rank %d of %d: element %zu is %g, expected %g",
          coll_kind_name(c->kind), data_type_name(c->type), data_op_name(op), c->count,
          c->inplace ? "in" : "out-of", c->root, c->offset, rank, n, i, got, want);
  }
}

void coll_check(ncclComm_t comm, const coll_case_t *c) {
  int n, rank;
  EXPECT_OK(ncclCommCount(comm, &n));
  EXPECT_OK(ncclCommUserRank(comm, &rank));
  size_t es = data_esize(c->type);
  layout_t lay = layout(c, n, rank);
  char *recv_mem = malloc(lay.recv_elems * es + 64), *send_mem = malloc(lay.send_elems * es + 64);
  EXPECT(recv_mem != NULL && send_mem != NULL, "out of memory");
  char *recv = recv_mem + c->offset, *send = send_mem + c->offset;
  data_poison(recv, lay.recv_elems * es);
  if (c->inplace && c->kind == K_REDUCESCATTER) /* the output is block `rank` of the input */
    recv = send + rank * c->count * es;
  else if (c->inplace && c->kind != K_SCATTER) /* the input sits inside the output */
    send = recv + lay.send_at * es;
  for (size_t j = 0; j < lay.send_elems; j++) data_set(send, j, c->type, input(c, rank, j));
  unsigned char scalar[8];
  ncclRedOp_t op = make_op(comm, c, scalar);
  ncclResult_t res = call(comm, c, send, recv, op);
  if (res != ncclSuccess)
    test_fail(__FILE__, __LINE__, "%s %s count %zu on rank %d: %s (%s)", coll_kind_name(c->kind),
              data_type_name(c->type), c->count, rank, ncclGetErrorString(res), ncclGetLastError(comm));
  if ((int)op >= ncclNumOps) EXPECT_OK(ncclRedOpDestroy(op, comm));
  verify(c, n, rank, recv, lay.recv_elems);
  free(recv_mem);
  free(send_mem);
}
