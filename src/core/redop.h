/*
 * Reduction operations of a communicator: the built-in ones and those made by ncclRedOpCreatePreMulSum, and
 * their resolution into the arithmetic the executor applies (red_t).
 */
#ifndef BRAID_CORE_REDOP_H
#define BRAID_CORE_REDOP_H

#include <stdint.h>

#include "nccl.h"
#include "gpu/host_reduce.h"

/* One PreMulSum operation made by the user. */
typedef struct {
  int used;            /* the slot holds a live operation */
  ncclDataType_t type; /* the type it was made for */
  ncclScalarResidence_t residence;
  unsigned char value[8]; /* the scalar, for ncclScalarHostImmediate */
  const void *ptr;        /* the scalar's address, for ncclScalarDevice (read when the call runs) */
  int next_free;          /* while unused: the next unused slot, -1 at the end of the list */
} redop_user_t;

/* A communicator's user operations; op value ncclNumOps + i names slot i. */
typedef struct {
  redop_user_t *slots;
  int count, cap;
  int free_head; /* 1 + the first unused slot below count, 0 when none (a zeroed table is empty) */
} redop_table_t;

/* Makes a PreMulSum operation; the scalar is read now for ncclScalarHostImmediate. */
ncclResult_t redop_create(redop_table_t *table, const void *scalar, ncclDataType_t type,
                          ncclScalarResidence_t residence, ncclRedOp_t *op_p);
/* Destroys a user operation (built-in operations are an error). */
ncclResult_t redop_destroy(redop_table_t *table, ncclRedOp_t op);
/* Checks that `op` can reduce `type` on this communicator; the message names `func`. */
ncclResult_t redop_check(const redop_table_t *table, ncclRedOp_t op, ncclDataType_t type, const char *func);
/* The arithmetic of `op` on `type` over nranks ranks. On the GPU backend (`on_gpu`) a device-resident
 * PreMulSum factor is left for the kernels to read (red->scalar_dev); on the host backend it is read now. */
void redop_resolve(const redop_table_t *table, ncclRedOp_t op, ncclDataType_t type, int nranks, int on_gpu,
                   red_t *red);
/* Frees the table. */
void redop_free(redop_table_t *table);

#endif
