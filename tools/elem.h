/*
 * Reading and writing one element of any NCCL data type as a double, for the bench's data checks.
 *
 * The bench fills buffers with small integers and computes the expected results in double; these codecs
 * convert between double and each type's bits, including the 16-bit and 8-bit floating-point formats
 * (half, bfloat16, f8e4m3, f8e5m2), which C has no type for. Encoding rounds to nearest, ties to even.
 */
#ifndef BRAID_TOOLS_ELEM_H
#define BRAID_TOOLS_ELEM_H

#include "nccl.h"

/* The value of element `i` of the array `buf` of type `type`. */
double elem_get(ncclDataType_t type, const void *buf, size_t i);
/* Stores `v` (rounded to the type; integers are truncated) as element `i` of `buf`. */
void elem_set(ncclDataType_t type, void *buf, size_t i, double v);
/* The relative precision of a type: 2^-(mantissa bits); 0 for integer types. */
double elem_epsilon(ncclDataType_t type);

#endif
