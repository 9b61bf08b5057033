/*
 * Facts about NCCL's element types and reduction operations: sizes and names.
 */
#ifndef BRAID_BASE_DTYPE_H
#define BRAID_BASE_DTYPE_H

#include <stddef.h>

#include "nccl.h"

/* Bytes per element of a valid type. */
size_t dtype_size(ncclDataType_t type);
/* "int8", "float", "bfloat16", ... ("?" for an invalid type). */
const char *dtype_name(ncclDataType_t type);
/* Whether the type is a floating-point type. */
int dtype_is_float(ncclDataType_t type);
/* "sum", "prod", "max", "min", "avg", or "premulsum" for a user-made operation. */
const char *redop_name(ncclRedOp_t op);

#endif
