/*
 * One collective call checked end to end on the host backend: inputs from data.h, poisoned outputs, the call
 * through the public API, and every output element compared with an independently computed reference.
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
  K_COUNT
} kind_t;

/* A collective call to check. op >= ncclNumOps means a PreMulSum by 2 (scalar on the host if op ==
 * ncclNumOps, "device" residence otherwise). */
typedef struct {
  kind_t kind;
  ncclDataType_t type;
  int op;
  size_t count; /* per-rank count as the API takes it */
  int inplace;
  int root;
  int offset; /* byte offset of the buffers from an aligned allocation */
  uint64_t seed;
} coll_case_t;

/* Runs one case on this rank and checks its outputs; fails the process with a message on any mismatch. */
void coll_check(ncclComm_t comm, const coll_case_t *c);
/* Name of a kind. */
const char *coll_kind_name(kind_t kind);

#endif
