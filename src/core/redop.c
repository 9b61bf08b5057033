/*
 * Reduction operations (see redop.h).
 */
#include "redop.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"

ncclResult_t redop_create(redop_table_t *t, const void *scalar, ncclDataType_t type,
                          ncclScalarResidence_t residence, ncclRedOp_t *op_p) {
  /* a destroyed slot is taken again first, from the list of unused ones: creating n operations is O(n) */
  int slot = t->free_head > 0 ? t->free_head - 1 : t->count;
  if (slot == t->cap) {
    if (t->cap > INT32_MAX / 2 - ncclNumOps)
      return log_err(ncclInvalidUsage, "ncclRedOpCreatePreMulSum: %d operations exist already", t->count);
    int cap = t->cap > 0 ? 2 * t->cap : 8;
    redop_user_t *s = realloc(t->slots, cap * sizeof *s);
    if (s == NULL)
      return log_err(ncclSystemError, "ncclRedOpCreatePreMulSum: out of host memory for %d operations", cap);
    t->slots = s;
    t->cap = cap;
  }
  if (slot == t->count)
    t->count++;
  else
    t->free_head = t->slots[slot].next_free + 1;
  redop_user_t *u = &t->slots[slot];
  *u = (redop_user_t){.used = 1, .type = type, .residence = residence, .ptr = scalar};
  if (residence == ncclScalarHostImmediate) memcpy(u->value, scalar, dtype_size(type));
  *op_p = (ncclRedOp_t)(ncclNumOps + slot);
  return ncclSuccess;
}

static redop_user_t *lookup(const redop_table_t *t, ncclRedOp_t op) {
  int slot = (int)op - ncclNumOps;
  if (slot < 0 || slot >= t->count || !t->slots[slot].used) return NULL;
  return &t->slots[slot];
}

ncclResult_t redop_destroy(redop_table_t *t, ncclRedOp_t op) {
  if ((int)op >= 0 && (int)op < ncclNumOps)
    return log_err(ncclInvalidArgument, "ncclRedOpDestroy: op %d is a built-in operation", (int)op);
  redop_user_t *u = lookup(t, op);
  if (u == NULL)
    return log_err(ncclInvalidArgument, "ncclRedOpDestroy: op %d was not made on this communicator", (int)op);
  u->used = 0;
  u->next_free = t->free_head - 1;
  t->free_head = (int)(u - t->slots) + 1;
  return ncclSuccess;
}

ncclResult_t redop_check(const redop_table_t *t, ncclRedOp_t op, ncclDataType_t type, const char *func) {
  if ((int)op >= 0 && (int)op < ncclNumOps) return ncclSuccess;
  const redop_user_t *u = lookup(t, op);
  if (u == NULL) return log_err(ncclInvalidArgument, "%s: invalid reduction operation %d", func, (int)op);
  if (u->type != type)
    return log_err(ncclInvalidArgument, "%s: operation %d was made for %s but the call reduces %s", func,
                   (int)op, dtype_name(u->type), dtype_name(type));
  return ncclSuccess;
}

/* The value of a scalar of `type` as a double and as an integer. */
static void decode_scalar(const void *p, ncclDataType_t type, double *f, int64_t *i) {
  union {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    uint16_t h;
    float f32;
    double f64;
  } v;
  memcpy(&v, p, dtype_size(type));
  switch (type) {
  case ncclInt8:
    *i = v.i8;
    break;
  case ncclUint8:
    *i = v.u8;
    break;
  case ncclInt32:
    *i = v.i32;
    break;
  case ncclUint32:
    *i = v.u32;
    break;
  case ncclInt64:
    *i = v.i64;
    break;
  case ncclUint64:
    *i = (int64_t)v.u64;
    break;
  case ncclFloat16:
    *f = red_half_to_float(v.h);
    break;
  case ncclBfloat16:
    *f = red_bf16_to_float(v.h);
    break;
  case ncclFloat32:
    *f = v.f32;
    break;
  case ncclFloat64:
    *f = v.f64;
    break;
  case ncclFloat8e4m3:
    *f = red_e4m3_to_float(v.u8);
    break;
  case ncclFloat8e5m2:
    *f = red_e5m2_to_float(v.u8);
    break;
  default:
    break;
  }
}

void redop_resolve(const redop_table_t *t, ncclRedOp_t op, ncclDataType_t type, int nranks, int on_gpu,
                   red_t *red) {
  static const red_kind_t builtin[] = {RED_SUM, RED_PROD, RED_MAX, RED_MIN};
  *red = (red_t){.kind = RED_SUM, .type = type, .fscale = 1.0, .iscale = 1, .divisor = 1};
  if ((int)op >= 0 && (int)op < ncclAvg) {
    red->kind = builtin[op];
  } else if (op == ncclAvg) {
    red->kind = dtype_is_float(type) ? RED_PREMULSUM : RED_SUM_POSTDIV;
    red->fscale = 1.0 / nranks;
    red->divisor = nranks;
  } else {
    const redop_user_t *u = lookup(t, op);
    red->kind = RED_PREMULSUM;
    if (on_gpu && u->residence == ncclScalarDevice) {
      red->scalar_dev = u->ptr; /* device memory: only the kernels may read it, when they run */
      return;
    }
    decode_scalar(u->residence == ncclScalarHostImmediate ? (const void *)u->value : u->ptr, type,
                  &red->fscale, &red->iscale);
  }
}

void redop_free(redop_table_t *t) {
  free(t->slots);
  memset(t, 0, sizeof *t);
}
