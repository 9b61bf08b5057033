/*
 * Test data and references (see data.h).
 */
#include "data.h"

#include <math.h>
#include <string.h>

/* Bit layout of a small float format: exponent and mantissa widths, and whether the all-ones exponent means
 * infinity/NaN (IEEE) or is an ordinary exponent (e4m3). */
typedef struct {
  int ebits, mbits, ieee;
} fmt_t;

static const fmt_t fmt_half = {5, 10, 1}, fmt_bf16 = {8, 7, 1}, fmt_e4m3 = {4, 3, 0}, fmt_e5m2 = {5, 2, 1};

static double decode(uint32_t bits, fmt_t f) {
  int bias = (1 << (f.ebits - 1)) - 1;
  uint32_t sign = bits >> (f.ebits + f.mbits) & 1;
  uint32_t e = bits >> f.mbits & ((1u << f.ebits) - 1);
  uint32_t m = bits & ((1u << f.mbits) - 1);
  double v;
  if (f.ieee && e == (1u << f.ebits) - 1)
    v = m ? NAN : INFINITY;
  else if (!f.ieee && e == (1u << f.ebits) - 1 && m == (1u << f.mbits) - 1)
    v = NAN;
  else if (e == 0)
    v = ldexp((double)m, 1 - bias - f.mbits);
  else
    v = ldexp((double)(m | 1u << f.mbits), (int)e - bias - f.mbits);
  return sign ? -v : v;
}

/* Encodes a value that is exactly representable (tests only write such values). */
static uint32_t encode(double v, fmt_t f) {
  int bias = (1 << (f.ebits - 1)) - 1;
  uint32_t sign = v < 0 || (v == 0 && signbit(v));
  double a = fabs(v);
  if (a == 0) return sign << (f.ebits + f.mbits);
  int exp;
  frexp(a, &exp); /* a = x * 2^exp, x in [0.5, 1) */
  int e = exp - 1 + bias;
  uint32_t m;
  if (e <= 0) {
    e = 0;
    m = (uint32_t)ldexp(a, bias - 1 + f.mbits);
  } else {
    m = (uint32_t)(ldexp(a, f.mbits - (exp - 1))) & ((1u << f.mbits) - 1);
  }
  return sign << (f.ebits + f.mbits) | (uint32_t)e << f.mbits | m;
}

size_t data_esize(ncclDataType_t t) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return sizes[t];
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

static int is_unsigned(ncclDataType_t t) {
  return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}

double data_value(uint64_t seed, int rank, size_t i, ncclDataType_t type, ncclRedOp_t op) {
  uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull + (uint64_t)rank * 0x632be59bd9b4e019ull + i);
  if (op == ncclProd) {
    static const double pm[] = {-2, -1, 1, 2};
    return is_unsigned(type) ? (double)(1 + h % 2) : pm[h % 4];
  }
  /* Never zero, so that an output left zeroed (or an input never read) cannot pass for a result. */
  static const double pm2[] = {-2, -1, 1, 2}, pm1[] = {-1, 1};
  if (is_unsigned(type)) return (double)(1 + h % 4);
  if (type == ncclFloat8e5m2) return pm1[h % 2];
  return pm2[h % 4];
}

void data_set(void *buf, size_t i, ncclDataType_t t, double v) {
  char *p = (char *)buf + i * data_esize(t);
  union {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    uint16_t u16;
    float f;
    double d;
  } u;
  switch (t) {
  case ncclInt8:
    u.i8 = (int8_t)v;
    break;
  case ncclUint8:
    u.u8 = (uint8_t)v;
    break;
  case ncclInt32:
    u.i32 = (int32_t)v;
    break;
  case ncclUint32:
    u.u32 = (uint32_t)v;
    break;
  case ncclInt64:
    u.i64 = (int64_t)v;
    break;
  case ncclUint64:
    u.u64 = (uint64_t)v;
    break;
  case ncclFloat16:
    u.u16 = (uint16_t)encode(v, fmt_half);
    break;
  case ncclBfloat16:
    u.u16 = (uint16_t)encode(v, fmt_bf16);
    break;
  case ncclFloat32:
    u.f = (float)v;
    break;
  case ncclFloat64:
    u.d = v;
    break;
  case ncclFloat8e4m3:
    u.u8 = (uint8_t)encode(v, fmt_e4m3);
    break;
  case ncclFloat8e5m2:
    u.u8 = (uint8_t)encode(v, fmt_e5m2);
    break;
  default:
    return;
  }
  memcpy(p, &u, data_esize(t));
}

double data_get(const void *buf, size_t i, ncclDataType_t t) {
  const char *p = (const char *)buf + i * data_esize(t);
  union {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    uint16_t u16;
    float f;
    double d;
  } u;
  memcpy(&u, p, data_esize(t));
  switch (t) {
  case ncclInt8:
    return u.i8;
  case ncclUint8:
    return u.u8;
  case ncclInt32:
    return u.i32;
  case ncclUint32:
    return u.u32;
  case ncclInt64:
    return (double)u.i64;
  case ncclUint64:
    return (double)u.u64;
  case ncclFloat16:
    return decode(u.u16, fmt_half);
  case ncclBfloat16:
    return decode(u.u16, fmt_bf16);
  case ncclFloat32:
    return u.f;
  case ncclFloat64:
    return u.d;
  case ncclFloat8e4m3:
    return decode(u.u8, fmt_e4m3);
  case ncclFloat8e5m2:
    return decode(u.u8, fmt_e5m2);
  default:
    return NAN;
  }
}

void data_fill(void *buf, size_t n, uint64_t seed, int rank, ncclDataType_t type, ncclRedOp_t op) {
  for (size_t i = 0; i < n; i++) data_set(buf, i, type, data_value(seed, rank, i, type, op));
}

/* Wraps an integer result to the type's width, as the library's integer arithmetic does. */
static double wrap(int64_t v, ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
    return (int8_t)v;
  case ncclUint8:
    return (uint8_t)v;
  case ncclInt32:
    return (int32_t)v;
  case ncclUint32:
    return (uint32_t)v;
  case ncclUint64:
    return (double)(uint64_t)v;
  default:
    return (double)v;
  }
}

static int is_int(ncclDataType_t t) {
  return t <= ncclUint64;
}

double data_expect(uint64_t seed, int nranks, size_t i, ncclDataType_t t, ncclRedOp_t op, double scale) {
  int64_t iacc = op == ncclProd ? 1 : 0;
  double facc = op == ncclProd ? 1 : 0;
  for (int r = 0; r < nranks; r++) {
    double v = data_value(seed, r, i, t, op);
    if (r == 0 && (op == ncclMax || op == ncclMin)) facc = v;
    if (op == ncclSum || op == ncclAvg) iacc += (int64_t)v, facc += v;
    if (op == ncclProd) iacc = (int64_t)((uint64_t)iacc * (uint64_t)(int64_t)v), facc *= v;
    if (op == ncclMax) facc = v > facc ? v : facc;
    if (op == ncclMin) facc = v < facc ? v : facc;
    if ((int)op >= ncclNumOps) iacc += (int64_t)v * (int64_t)scale, facc += v * scale;
  }
  if (op == ncclMax || op == ncclMin) return facc;
  if (!is_int(t)) return op == ncclAvg ? facc / nranks : facc;
  if (op == ncclAvg) {
    int64_t sum = (int64_t)wrap(iacc, t);
    return is_unsigned(t) ? (double)((uint64_t)sum / (uint64_t)nranks) : (double)(sum / nranks);
  }
  return wrap(iacc, t);
}

/* Relative precision of a float type. */
static double eps(ncclDataType_t t) {
  switch (t) {
  case ncclFloat16:
    return 0x1p-10;
  case ncclBfloat16:
    return 0x1p-7;
  case ncclFloat8e4m3:
    return 0x1p-3;
  case ncclFloat8e5m2:
    return 0x1p-2;
  case ncclFloat32:
    return 0x1p-23;
  default:
    return 0x1p-52;
  }
}

int data_match(double got, double expected, ncclDataType_t t, ncclRedOp_t op, int nranks) {
  if (is_int(t) || op != ncclAvg) return got == expected;
  /* An average scales every input by 1/nranks, rounded in the type, before summing. */
  return fabs(got - expected) <= 2.0 * (nranks + 1) * eps(t) * (fabs(expected) + 1);
}

void data_poison(void *buf, size_t bytes) {
  memset(buf, 0x7b, bytes);
}

const char *data_type_name(ncclDataType_t t) {
  static const char *n[] = {"int8", "uint8", "int32",  "uint32", "int64", "uint64",
                            "half", "float", "double", "bf16",   "e4m3",  "e5m2"};
  return (unsigned)t < 12 ? n[t] : "?";
}

const char *data_op_name(ncclRedOp_t op) {
  static const char *n[] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < 5 ? n[op] : "premulsum";
}
