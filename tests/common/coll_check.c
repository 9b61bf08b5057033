/*
 * One collective call checked end to end (see coll_check.h).
 */
#include "coll_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "harness.h"

const char *coll_kind_name(kind_t kind) {
  static const char *names[] = {"AllReduce", "Reduce", "ReduceScatter", "AllGather", "Broadcast",
                                "AlltoAll",  "Gather", "Scatter",       "SendRecv"};
  return (unsigned)kind < K_COUNT ? names[kind] : "?";
}

int coll_reduces(kind_t k) {
  return k == K_ALLREDUCE || k == K_REDUCE || k == K_REDUCESCATTER;
}

int coll_inplace(const coll_case_t *c) {
  return c->inplace == 2 || (c->inplace && c->kind != K_SENDRECV);
}

coll_layout_t coll_layout(const coll_case_t *c, int n, int rank) {
  size_t cnt = c->count, mine = (size_t)rank * cnt;
  switch (c->kind) {
  case K_REDUCESCATTER:
    return (coll_layout_t){n * cnt, cnt, mine, 1};
  case K_SCATTER:
    return (coll_layout_t){n * cnt, cnt, mine, 1};
  case K_ALLGATHER:
  case K_GATHER:
    return (coll_layout_t){cnt, n * cnt, mine, 0};
  case K_ALLTOALL:
    return (coll_layout_t){n * cnt, n * cnt, 0, 0};
  default:
    return (coll_layout_t){cnt, cnt, 0, 0};
  }
}

ncclRedOp_t coll_ref_op(const coll_case_t *c) {
  return coll_reduces(c->kind) ? (ncclRedOp_t)c->op : ncclSum;
}

/* Ranks' inputs are independent of the kind; only the operation shapes their range. */
double coll_input(const coll_case_t *c, int rank, size_t j) {
  ncclRedOp_t op = coll_ref_op(c);
  return data_value(c->seed, rank, j, c->type, (int)op < ncclNumOps ? op : ncclSum);
}

double coll_expected(const coll_case_t *c, int n, int rank, size_t i) {
  size_t cnt = c->count;
  ncclRedOp_t op = coll_ref_op(c);
  switch (c->kind) {
  case K_ALLREDUCE:
    return data_expect(c->seed, n, i, c->type, op, COLL_PREMUL_SCALAR);
  case K_REDUCE:
    return rank == c->root ? data_expect(c->seed, n, i, c->type, op, COLL_PREMUL_SCALAR) : NAN;
  case K_REDUCESCATTER:
    return data_expect(c->seed, n, rank * cnt + i, c->type, op, COLL_PREMUL_SCALAR);
  case K_ALLGATHER:
    return coll_input(c, (int)(i / cnt), i % cnt);
  case K_BROADCAST:
    return coll_input(c, c->root, i);
  case K_ALLTOALL:
    return coll_input(c, (int)(i / cnt), rank * cnt + i % cnt);
  case K_GATHER:
    return rank == c->root ? coll_input(c, (int)(i / cnt), i % cnt) : NAN;
  case K_SCATTER:
    return coll_input(c, c->root, rank * cnt + i);
  case K_SENDRECV:
    return coll_input(c, (rank + n - 1) % n, i);
  default:
    break;
  }
  return NAN;
}

static ncclResult_t sendrecv(ncclComm_t comm, const coll_case_t *c, const void *s, void *r, cudaStream_t st) {
  int n, rank;
  ncclResult_t res = ncclCommCount(comm, &n);
  if (res == ncclSuccess) res = ncclCommUserRank(comm, &rank);
  if (res != ncclSuccess) return res;
  if ((res = ncclGroupStart()) != ncclSuccess) return res;
  ncclResult_t send_res = ncclSend(s, c->count, c->type, (rank + 1) % n, comm, st);
  ncclResult_t recv_res = ncclRecv(r, c->count, c->type, (rank + n - 1) % n, comm, st);
  res = ncclGroupEnd();
  return send_res != ncclSuccess ? send_res : recv_res != ncclSuccess ? recv_res : res;
}

ncclResult_t coll_call(ncclComm_t comm, const coll_case_t *c, const void *s, void *r, ncclRedOp_t op,
                       cudaStream_t st) {
  ncclDataType_t t = c->type;
  switch (c->kind) {
  case K_ALLREDUCE:
    return ncclAllReduce(s, r, c->count, t, op, comm, st);
  case K_REDUCE:
    return ncclReduce(s, r, c->count, t, op, c->root, comm, st);
  case K_REDUCESCATTER:
    return ncclReduceScatter(s, r, c->count, t, op, comm, st);
  case K_ALLGATHER:
    return ncclAllGather(s, r, c->count, t, comm, st);
  case K_BROADCAST:
    return ncclBroadcast(s, r, c->count, t, c->root, comm, st);
  case K_ALLTOALL:
    return ncclAlltoAll(s, r, c->count, t, comm, st);
  case K_GATHER:
    return ncclGather(s, r, c->count, t, c->root, comm, st);
  case K_SCATTER:
    return ncclScatter(s, r, c->count, t, c->root, comm, st);
  case K_SENDRECV:
    return sendrecv(comm, c, s, r, st);
  default:
    return ncclInternalError;
  }
}

ncclRedOp_t coll_make_op(ncclComm_t comm, const coll_case_t *c, void *scalar, int scalar_is_device,
                         int *created_p) {
  *created_p = 0;
  if (!coll_reduces(c->kind) || c->op < ncclNumOps) return coll_ref_op(c);
  if (!scalar_is_device) data_set(scalar, 0, c->type, COLL_PREMUL_SCALAR);
  ncclRedOp_t op;
  ncclScalarResidence_t where = c->op == ncclNumOps ? ncclScalarHostImmediate : ncclScalarDevice;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&op, scalar, c->type, where, comm));
  *created_p = 1;
  return op;
}

void coll_key(const coll_case_t *c, char *buf, size_t len) {
  const char *op = !coll_reduces(c->kind) ? "-"
                   : c->op < ncclNumOps   ? data_op_name((ncclRedOp_t)c->op)
                   : c->op == ncclNumOps  ? "premulsum(host scalar)"
                                          : "premulsum(device scalar)";
  snprintf(buf, len, "%s %s op %s count %zu %s", coll_kind_name(c->kind), data_type_name(c->type), op,
           c->count, coll_inplace(c) ? "in-place" : "out-of-place");
}

void coll_describe(const coll_case_t *c, int n, int rank, char *buf, size_t len) {
  char key[160];
  coll_key(c, key, sizeof key);
  snprintf(buf, len, "%s root %d offset %d B seed %llu, rank %d of %d", key, c->root, c->offset,
           (unsigned long long)c->seed, rank, n);
}

static void verify(const coll_case_t *c, int n, int rank, const char *out, size_t elems) {
  ncclRedOp_t op = coll_ref_op(c);
  for (size_t i = 0; i < elems; i++) {
    double want = coll_expected(c, n, rank, i);
    if (want != want) continue; /* not written on this rank */
    double got = data_get(out, i, c->type);
    if (!data_match(got, want, c->type, op, n)) {
      char what[256];
      coll_describe(c, n, rank, what, sizeof what);
      test_fail(__FILE__, __LINE__, "%s: element %zu is %g, expected %g", what, i, got, want);
    }
  }
}

static void *host_alloc(size_t bytes) {
  return malloc(bytes);
}

void coll_check(ncclComm_t comm, const coll_case_t *c) {
  coll_check_in(comm, c, host_alloc, free);
}

void coll_check_in(ncclComm_t comm, const coll_case_t *c, void *(*alloc)(size_t bytes),
                   void (*release)(void *p)) {
  int n, rank;
  EXPECT_OK(ncclCommCount(comm, &n));
  EXPECT_OK(ncclCommUserRank(comm, &rank));
  size_t es = data_esize(c->type);
  coll_layout_t lay = coll_layout(c, n, rank);
  char *recv_mem = alloc(lay.recv_elems * es + 64), *send_mem = alloc(lay.send_elems * es + 64);
  EXPECT(recv_mem != NULL && send_mem != NULL, "out of memory");
  char *recv = recv_mem + c->offset, *send = send_mem + c->offset;
  data_poison(recv, lay.recv_elems * es);
  if (coll_inplace(c) && lay.recv_inside_send)
    recv = send + lay.at * es;
  else if (coll_inplace(c))
    send = recv + lay.at * es;
  for (size_t j = 0; j < lay.send_elems; j++) data_set(send, j, c->type, coll_input(c, rank, j));
  unsigned char scalar[8];
  int created;
  ncclRedOp_t op = coll_make_op(comm, c, scalar, 0, &created);
  ncclResult_t res = coll_call(comm, c, send, recv, op, NULL);
  if (res != ncclSuccess) {
    char what[256];
    coll_describe(c, n, rank, what, sizeof what);
    test_fail(__FILE__, __LINE__, "%s: %s (%s)", what, ncclGetErrorString(res), ncclGetLastError(comm));
  }
  if (created) EXPECT_OK(ncclRedOpDestroy(op, comm));
  verify(c, n, rank, recv, lay.recv_elems);
  release(recv_mem);
  release(send_mem);
}
