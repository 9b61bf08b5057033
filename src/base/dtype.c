/*
 * Element-type facts (see dtype.h).
 */
#include "dtype.h"

static const struct {
  size_t size;
  const char *name;
  int is_float;
} types[ncclNumTypes] = {
    [ncclInt8] = {1, "int8", 0},         [ncclUint8] = {1, "uint8", 0},
    [ncclInt32] = {4, "int32", 0},       [ncclUint32] = {4, "uint32", 0},
    [ncclInt64] = {8, "int64", 0},       [ncclUint64] = {8, "uint64", 0},
    [ncclFloat16] = {2, "half", 1},      [ncclFloat32] = {4, "float", 1},
    [ncclFloat64] = {8, "double", 1},    [ncclBfloat16] = {2, "bfloat16", 1},
    [ncclFloat8e4m3] = {1, "f8e4m3", 1}, [ncclFloat8e5m2] = {1, "f8e5m2", 1},
};

size_t dtype_size(ncclDataType_t type) {
  return (unsigned)type < ncclNumTypes ? types[type].size : 0;
}

const char *dtype_name(ncclDataType_t type) {
  return (unsigned)type < ncclNumTypes ? types[type].name : "?";
}

int dtype_is_float(ncclDataType_t type) {
  return (unsigned)type < ncclNumTypes && types[type].is_float;
}

const char *redop_name(ncclRedOp_t op) {
  static const char *names[] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < ncclNumOps ? names[op] : "premulsum";
}
