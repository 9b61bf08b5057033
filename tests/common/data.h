/*
 * Test data for collectives: deterministic random inputs per (seed, rank, index), an independent decoder of
 * every NCCL type (written here, not shared with the library), the expected result of every reduction, and
 * output poisoning.
 *
 * Inputs are small non-zero integers chosen so that sums and products over up to 8 ranks are exact in every
 * type where they can be (fp8 e5m2 gets {-1, 1}); integer arithmetic wraps like the library's.
 */
#ifndef BRAID_TESTS_DATA_H
#define BRAID_TESTS_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Bytes per element. */
size_t data_esize(ncclDataType_t type);
/* The input value of element i of `rank` for a test `seed`, for reductions with `op`. */
double data_value(uint64_t seed, int rank, size_t i, ncclDataType_t type, ncclRedOp_t op);
/* Fills n elements of buf with data_value for (seed, rank). */
void data_fill(void *buf, size_t n, uint64_t seed, int rank, ncclDataType_t type, ncclRedOp_t op);
/* Element i of buf as a double. */
double data_get(const void *buf, size_t i, ncclDataType_t type);
/* Writes v (exactly representable in the type) as element i of buf. */
void data_set(void *buf, size_t i, ncclDataType_t type, double v);
/* Expected element i of a reduction of (seed) inputs over nranks ranks; `scale` is the PreMulSum factor when
 * op is not a built-in operation. */
double data_expect(uint64_t seed, int nranks, size_t i, ncclDataType_t type, ncclRedOp_t op, double scale);
/* Whether got matches expected for this type and operation over nranks ranks. */
int data_match(double got, double expected, ncclDataType_t type, ncclRedOp_t op, int nranks);
/* Overwrites bytes with a pattern that no expected result equals. */
void data_poison(void *buf, size_t bytes);
/* Names for messages. */
const char *data_type_name(ncclDataType_t type);
const char *data_op_name(ncclRedOp_t op);

#endif
