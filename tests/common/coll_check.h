/*
 * One collective call checked end to end on the host backend: inputs from data.h, poisoned outputs, the call
 * through the public API, and every output element compared with an independently computed reference.
 *
 * The pieces (buffer layout, inputs, expected outputs, the call itself, verification) are exported too, so
 * that the GPU tests check the same cases on device buffers.
 */
#ifndef BRAID_TESTS_COLL_CHECK_H
#define BRAID_TESTS_COLL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

typedef enum {
  K_ALLREDUCE,
  K_REDUCE,
  K_REDUCESCATTER,
  K_ALLGATHER,
  K_BROADCAST,
  K_ALLTOALL,
  K_GATHER,
  K_SCATTER,
  K_SENDRECV, /* a ring shift: each rank sends to rank + 1 and receives from rank - 1, in one group */
  K_COUNT
} kind_t;

/* A collective call to check. op >= ncclNumOps means a PreMulSum by 2 (scalar on the host if op ==
 * ncclNumOps, "device" residence otherwise). */
typedef struct {
  kind_t kind;
  ncclDataType_t type;
  int op;
  size_t count; /* per-rank count as the API takes it */
  int inplace;  /* 1: in place (ignored for K_SENDRECV); 2: a send/receive into the buffer it sends too */
  int root;
  int offset; /* byte offset of the buffers from an aligned allocation */
  uint64_t seed;
} coll_case_t;

/* Runs one case on this rank and checks its outputs; fails the process with a message on any mismatch. */
void coll_check(ncclComm_t comm, const coll_case_t *c);
/* The same on buffers from `alloc`, freed with `release` (memory the host can read and write, such as the
 * tests' stand-in driver's device memory). */
void coll_check_in(ncclComm_t comm, const coll_case_t *c, void *(*alloc)(size_t bytes),
                   void (*release)(void *p));
/* Name of a kind. */
const char *coll_kind_name(kind_t kind);

/* ---- The pieces ---- */

/* A case's buffers on one rank, in elements. In place, one buffer lies inside the other: the input inside
 * the output (`at` elements in), or for reduce-scatter and scatter the output inside the input. */
typedef struct {
  size_t send_elems, recv_elems;
  size_t at;            /* in place: where the inner buffer starts inside the outer one */
  int recv_inside_send; /* in place: 1 when the output is the inner buffer */
} coll_layout_t;

/* Whether the kind takes a reduction operation. */
int coll_reduces(kind_t kind);
/* Whether the case really runs in place (send/recv only with inplace 2: the receive into the buffer sent). */
int coll_inplace(const coll_case_t *c);
coll_layout_t coll_layout(const coll_case_t *c, int nranks, int rank);
/* Input element j of `rank`. */
double coll_input(const coll_case_t *c, int rank, size_t j);
/* Expected output element i of `rank`, or NAN where the call does not write the output. */
double coll_expected(const coll_case_t *c, int nranks, int rank, size_t i);
/* The operation as the reference sees it (ncclSum for kinds that do not reduce; a PreMulSum is any value
 * >= ncclNumOps). */
ncclRedOp_t coll_ref_op(const coll_case_t *c);
/* The PreMulSum scalar of every case. */
#define COLL_PREMUL_SCALAR 2.0
/* Makes the call's operation: a built-in one, or a PreMulSum by 2 whose scalar is written to `scalar` (host
 * memory, or device memory that the caller filled when `scalar_is_device`). Destroy it with ncclRedOpDestroy
 * when *created_p is set. */
ncclRedOp_t coll_make_op(ncclComm_t comm, const coll_case_t *c, void *scalar, int scalar_is_device,
                         int *created_p);
/* Issues the call (send/recv as a group of one send and one receive). */
ncclResult_t coll_call(ncclComm_t comm, const coll_case_t *c, const void *send, void *recv, ncclRedOp_t op,
                       cudaStream_t stream);
/* The case's collective, type, operation, count and placement, the same on every rank (its root, offset and
 * seed are not in it: a skewed sweep gives ranks different offsets). */
void coll_key(const coll_case_t *c, char *buf, size_t len);
/* One line naming the case, for messages: its key, root, offset, seed and rank. */
void coll_describe(const coll_case_t *c, int nranks, int rank, char *buf, size_t len);

#endif
