/*
 * Element-wise reductions on host memory (see host_reduce.h).
 *
 * Buffers are walked in chunks of CHUNK elements. A chunk is copied into aligned local arrays of the type's
 * arithmetic type ("wide": uint64_t for every integer, float for the 32-bit and smaller floats, double for
 * double), reduced there and converted back on the way out. Copying makes any byte alignment safe, and since
 * a chunk is read completely before any of it is written, `out` may be exactly `local` or `in`. The loops
 * over local arrays always run CHUNK times, a constant the compiler can vectorise at -O2; lanes past the end
 * of a short chunk hold zeros and are never stored.
 *
 * A reduction is made of steps, each one conversion in, one operation, one conversion out: PREMULSUM is a
 * scaling step followed by a sum, SUM_POSTDIV a sum followed (when `last`) by a division. Because every step
 * ends by storing the type, the product and the sum are rounded to the type in between, as on the GPU.
 *
 * Max and min keep `in` when the two compare equal or either is NaN. SUM_POSTDIV's divisor is expected to be
 * positive (it is the number of ranks).
 */
#include "host_reduce.h"

#include <string.h>

#include "base/dtype.h"

/* Elements per chunk: 2 KiB of wide values, small enough for several arrays on the stack. */
enum { CHUNK = 256 };

/* ---- The 16- and 8-bit float formats ---- */

/* A small binary float format: its layout and what happens past its largest finite value. */
typedef struct {
  int mbits;   /* stored mantissa bits */
  int bias;    /* exponent bias */
  float magic; /* 2^(emin - mbits + 23), emin = 1 - bias: a float whose last bit is worth a subnormal's */
  uint32_t max_finite; /* encoding of the largest finite magnitude */
  uint32_t overflow;   /* what a larger magnitude becomes: infinity, or max_finite when saturating */
  uint32_t inf;        /* encoding of infinity (above max_finite; for a format without one, never matches) */
  uint32_t nan;        /* encoding of the quiet NaN produced */
  uint32_t sign;       /* the sign bit */
} minifloat_t;

/* IEEE binary16: overflows to infinity. */
static const minifloat_t half_fmt = {10, 15, 0x1p-1f, 0x7bff, 0x7c00, 0x7c00, 0x7e00, 0x8000};
/* OCP E4M3 ("fn"): no infinities, S.1111.111 is NaN, largest finite 448; conversions saturate. */
static const minifloat_t e4m3_fmt = {3, 7, 0x1p14f, 0x7e, 0x7e, 0x100, 0x7f, 0x80};
/* OCP E5M2: IEEE-like with infinities, largest finite 57344; conversions saturate. */
static const minifloat_t e5m2_fmt = {2, 15, 0x1p7f, 0x7b, 0x7b, 0x7c, 0x7e, 0x80};

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* a when cond, else b, by masking: the conversions below compute every case and pick one without branches, so
 * that loops over them vectorise (a branch would keep the compiler from evaluating the float operations
 * whose results it does not need, which could raise floating-point flags). */
static inline uint32_t pick(int cond, uint32_t a, uint32_t b) {
  uint32_t mask = 0u - (uint32_t)cond;
  return (a & mask) | (b & ~mask);
}

static inline uint32_t mini_from_float(const minifloat_t *fmt, float f) {
  uint32_t u = float_bits(f), mag = u & 0x7fffffffu, shift = 23 - (uint32_t)fmt->mbits;
  uint32_t sign = (u >> 31) * fmt->sign;
  /* Normal results: round the mantissa in place, ties to even (adding just under half, plus one when the kept
   * part is odd); a carry moves into the exponent by itself. Then rebias the exponent. */
  uint32_t rounded = (mag + (1u << (shift - 1)) - 1 + ((mag >> shift) & 1)) >> shift;
  uint32_t normal = rounded - ((uint32_t)(127 - fmt->bias) << fmt->mbits);
  /* Subnormal results: adding magic leaves a float whose last bit is the result's last bit, so the FPU
   * rounds, ties to even; what the sum's bits grew by is the encoding (2^mbits: the smallest normal). */
  uint32_t sub = float_bits(bits_float(mag) + fmt->magic) - float_bits(fmt->magic);
  uint32_t enc = pick(mag < (uint32_t)(128 - fmt->bias) << 23, sub, normal);
  enc = pick(enc > fmt->max_finite, fmt->overflow, enc);
  return sign | pick(mag > 0x7f800000u, fmt->nan, enc);
}

static inline float mini_to_float(const minifloat_t *fmt, uint32_t v) {
  uint32_t mag = v & (fmt->sign - 1), sign = pick((v & fmt->sign) != 0, 0x80000000u, 0);
  uint32_t normal = (mag << (23 - fmt->mbits)) + ((uint32_t)(127 - fmt->bias) << 23);
  /* The inverse of the subnormal trick above: exact, and immune to flushing float subnormals. */
  uint32_t sub = float_bits(bits_float(float_bits(fmt->magic) + mag) - fmt->magic);
  uint32_t special = pick(mag == fmt->inf, 0x7f800000u, 0x7fc00000u);
  uint32_t bits = pick(mag > fmt->max_finite, special, pick(mag < (1u << fmt->mbits), sub, normal));
  return bits_float(sign | bits);
}

float red_half_to_float(uint16_t h) {
  return mini_to_float(&half_fmt, h);
}

uint16_t red_float_to_half(float f) {
  return (uint16_t)mini_from_float(&half_fmt, f);
}

float red_e4m3_to_float(uint8_t v) {
  return mini_to_float(&e4m3_fmt, v);
}

uint8_t red_float_to_e4m3(float f) {
  return (uint8_t)mini_from_float(&e4m3_fmt, f);
}

float red_e5m2_to_float(uint8_t v) {
  return mini_to_float(&e5m2_fmt, v);
}

uint8_t red_float_to_e5m2(float f) {
  return (uint8_t)mini_from_float(&e5m2_fmt, f);
}

/* bfloat16 is the top half of a float, so subnormals and infinities need no special case. */
float red_bf16_to_float(uint16_t h) {
  return bits_float((uint32_t)h << 16);
}

uint16_t red_float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  /* Adding just under half a unit, plus one when the kept part is odd, rounds to nearest, ties to even. */
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16, quiet_nan = (u >> 16) | 0x40;
  return (uint16_t)pick((u & 0x7fffffffu) > 0x7f800000u, quiet_nan, rounded);
}

/* ---- Arithmetic on chunks of wide values ---- */

/* A chunk of wide values, aligned for any of them. */
typedef union {
  uint64_t u[CHUNK]; /* integers, sign- or zero-extended */
  float f[CHUNK];    /* floats of 32 bits or fewer */
  double d[CHUNK];   /* doubles */
} wide_t;

/* One step: a = a (op) b for SUM, PROD, MAX, MIN; a *= scale for PREMULSUM; a /= divisor for SUM_POSTDIV. */
static void int_step(const red_t *red, red_kind_t kind, int is_signed, uint64_t *restrict a,
                     const uint64_t *restrict b) {
  /* Flipping the top bit of sign-extended values maps signed order onto unsigned order. */
  uint64_t flip = is_signed ? UINT64_C(1) << 63 : 0, scale = (uint64_t)red->iscale;
  switch (kind) {
  case RED_SUM:
    for (int i = 0; i < CHUNK; i++) a[i] += b[i];
    break;
  case RED_PROD:
    for (int i = 0; i < CHUNK; i++) a[i] *= b[i];
    break;
  case RED_MAX:
    for (int i = 0; i < CHUNK; i++) a[i] = (a[i] ^ flip) > (b[i] ^ flip) ? a[i] : b[i];
    break;
  case RED_MIN:
    for (int i = 0; i < CHUNK; i++) a[i] = (a[i] ^ flip) < (b[i] ^ flip) ? a[i] : b[i];
    break;
  case RED_PREMULSUM:
    for (int i = 0; i < CHUNK; i++) a[i] *= scale;
    break;
  case RED_SUM_POSTDIV:
    if (!is_signed) {
      for (int i = 0; i < CHUNK; i++) a[i] /= (uint64_t)red->divisor;
    } else if (red->divisor == -1) { /* INT64_MIN / -1 would trap; negation wraps the same way */
      for (int i = 0; i < CHUNK; i++) a[i] = 0 - a[i];
    } else {
      /* Converting back to int64_t without relying on implementation-defined conversions. */
      for (int i = 0; i < CHUNK; i++) {
        int64_t v = a[i] <= INT64_MAX ? (int64_t)a[i] : -(int64_t)~a[i] - 1;
        a[i] = (uint64_t)(v / red->divisor);
      }
    }
    break;
  }
}

/* The same step for a float type W, generated for float and double. */
#define FLOAT_STEP(W)                                                                                        \
  static void W##_step(const red_t *red, red_kind_t kind, W *restrict a, const W *restrict b) {              \
    W scale = (W)red->fscale, divisor = (W)red->divisor;                                                     \
    switch (kind) {                                                                                          \
    case RED_SUM:                                                                                            \
      for (int i = 0; i < CHUNK; i++) a[i] += b[i];                                                          \
      break;                                                                                                 \
    case RED_PROD:                                                                                           \
      for (int i = 0; i < CHUNK; i++) a[i] *= b[i];                                                          \
      break;                                                                                                 \
    case RED_MAX:                                                                                            \
      for (int i = 0; i < CHUNK; i++) a[i] = a[i] > b[i] ? a[i] : b[i];                                      \
      break;                                                                                                 \
    case RED_MIN:                                                                                            \
      for (int i = 0; i < CHUNK; i++) a[i] = a[i] < b[i] ? a[i] : b[i];                                      \
      break;                                                                                                 \
    case RED_PREMULSUM:                                                                                      \
      for (int i = 0; i < CHUNK; i++) a[i] *= scale;                                                         \
      break;                                                                                                 \
    case RED_SUM_POSTDIV:                                                                                    \
      for (int i = 0; i < CHUNK; i++) a[i] /= divisor;                                                       \
      break;                                                                                                 \
    }                                                                                                        \
  }
FLOAT_STEP(float)
FLOAT_STEP(double)

/* ---- Per-type conversions between stored elements and wide values ---- */

static inline uint64_t sign_extend(int64_t v) {
  return (uint64_t)v;
}

static inline uint64_t same_u64(uint64_t v) {
  return v;
}

static inline float same_float(float v) {
  return v;
}

static inline double same_double(double v) {
  return v;
}

/* Which step function a type's arithmetic uses. */
typedef enum { ARITH_INT, ARITH_UINT, ARITH_FLOAT, ARITH_DOUBLE } arith_t;

/* Every type: its enum; how it is stored (S, read, and U, the same bits unsigned, written); its wide type W
 * and arithmetic; and the conversions from S to W and from W to U. */
#define RED_TYPES(X)                                                                                         \
  X(ncclInt8, int8_t, uint8_t, uint64_t, ARITH_INT, sign_extend, same_u64)                                   \
  X(ncclUint8, uint8_t, uint8_t, uint64_t, ARITH_UINT, same_u64, same_u64)                                   \
  X(ncclInt32, int32_t, uint32_t, uint64_t, ARITH_INT, sign_extend, same_u64)                                \
  X(ncclUint32, uint32_t, uint32_t, uint64_t, ARITH_UINT, same_u64, same_u64)                                \
  X(ncclInt64, int64_t, uint64_t, uint64_t, ARITH_INT, sign_extend, same_u64)                                \
  X(ncclUint64, uint64_t, uint64_t, uint64_t, ARITH_UINT, same_u64, same_u64)                                \
  X(ncclFloat16, uint16_t, uint16_t, float, ARITH_FLOAT, red_half_to_float, red_float_to_half)               \
  X(ncclFloat32, float, float, float, ARITH_FLOAT, same_float, same_float)                                   \
  X(ncclFloat64, double, double, double, ARITH_DOUBLE, same_double, same_double)                             \
  X(ncclBfloat16, uint16_t, uint16_t, float, ARITH_FLOAT, red_bf16_to_float, red_float_to_bf16)              \
  X(ncclFloat8e4m3, uint8_t, uint8_t, float, ARITH_FLOAT, red_e4m3_to_float, red_float_to_e4m3)              \
  X(ncclFloat8e5m2, uint8_t, uint8_t, float, ARITH_FLOAT, red_e5m2_to_float, red_float_to_e5m2)

/* widen_T: the first n stored elements at src into a whole chunk of wide values (zeros past n).
 * narrow_T: the first n wide values back to stored elements at dst. */
#define DEFINE_CONVERSIONS(type, S, U, W, arith, to_wide, from_wide)                                         \
  static void widen_##type(wide_t *dst, const void *src, size_t n) {                                         \
    S s[CHUNK];                                                                                              \
    W *d = (W *)dst;                                                                                         \
    if (sizeof(S) == sizeof(W)) { /* same size: the conversion keeps the bits (floats, 64-bit integers) */   \
      memcpy(d, src, n * sizeof(S));                                                                         \
      if (n < CHUNK) memset(d + n, 0, (CHUNK - n) * sizeof(W));                                              \
      return;                                                                                                \
    }                                                                                                        \
    memcpy(s, src, n * sizeof(S));                                                                           \
    if (n < CHUNK) memset(s + n, 0, (CHUNK - n) * sizeof(S));                                                \
    for (int i = 0; i < CHUNK; i++) d[i] = to_wide(s[i]);                                                    \
  }                                                                                                          \
  static void narrow_##type(void *dst, const wide_t *src, size_t n) {                                        \
    U u[CHUNK];                                                                                              \
    const W *w = (const W *)src;                                                                             \
    if (sizeof(U) == sizeof(W)) {                                                                            \
      memcpy(dst, w, n * sizeof(U));                                                                         \
      return;                                                                                                \
    }                                                                                                        \
    for (int i = 0; i < CHUNK; i++) u[i] = from_wide(w[i]);                                                  \
    memcpy(dst, u, n * sizeof(U));                                                                           \
  }
RED_TYPES(DEFINE_CONVERSIONS)

/* What the reduction loops need to know about a type. */
typedef struct {
  size_t size;                                            /* bytes per element */
  arith_t arith;                                          /* which step function applies */
  void (*widen)(wide_t *dst, const void *src, size_t n);  /* stored elements to wide values */
  void (*narrow)(void *dst, const wide_t *src, size_t n); /* wide values to stored elements */
} type_ops_t;

#define TYPE_OPS_ENTRY(type, S, U, W, arith_, to_wide, from_wide)                                            \
  [type] = {.size = sizeof(S), .arith = arith_, .widen = widen_##type, .narrow = narrow_##type},
static const type_ops_t type_ops[ncclNumTypes] = {RED_TYPES(TYPE_OPS_ENTRY)};

/* ---- Driving the steps over whole buffers ---- */

/* dst = a (op) b on n <= CHUNK elements; for the one-operand kinds (PREMULSUM, SUM_POSTDIV) b is NULL. dst
 * may be a or b. */
static void chunk_step(const red_t *red, red_kind_t kind, void *dst, const void *a, const void *b, size_t n) {
  const type_ops_t *t = &type_ops[red->type];
  wide_t wa, wb;
  t->widen(&wa, a, n);
  if (b) t->widen(&wb, b, n);
  switch (t->arith) {
  case ARITH_INT:
  case ARITH_UINT:
    int_step(red, kind, t->arith == ARITH_INT, wa.u, wb.u);
    break;
  case ARITH_FLOAT:
    float_step(red, kind, wa.f, wb.f);
    break;
  case ARITH_DOUBLE:
    double_step(red, kind, wa.d, wb.d);
    break;
  }
  t->narrow(dst, &wa, n);
}

int red_is_identity(const red_t *red) {
  switch (red->kind) {
  case RED_PREMULSUM:
    return red->scalar_dev == NULL && (dtype_is_float(red->type) ? red->fscale == 1.0 : red->iscale == 1);
  case RED_SUM_POSTDIV:
    return red->divisor == 1;
  default:
    return 1;
  }
}

void red_prepare(const red_t *red, void *out, const void *local, size_t count) {
  size_t size = type_ops[red->type].size;
  if (red->kind != RED_PREMULSUM) {
    if (out != local) memmove(out, local, count * size);
    return;
  }
  for (size_t off = 0; off < count; off += CHUNK) {
    size_t n = count - off < CHUNK ? count - off : CHUNK;
    chunk_step(red, RED_PREMULSUM, (char *)out + off * size, (const char *)local + off * size, NULL, n);
  }
}

void red_combine(const red_t *red, void *out, const void *local, const void *in, size_t count, int last) {
  size_t size = type_ops[red->type].size;
  red_kind_t binary = red->kind == RED_PREMULSUM || red->kind == RED_SUM_POSTDIV ? RED_SUM : red->kind;
  for (size_t off = 0; off < count; off += CHUNK) {
    size_t n = count - off < CHUNK ? count - off : CHUNK;
    const char *a = (const char *)local + off * size, *b = (const char *)in + off * size;
    char *o = (char *)out + off * size;
    /* The scaled local chunk, stored (so rounded) as the type. */
    unsigned char scaled[CHUNK * sizeof(double)];
    if (red->kind == RED_PREMULSUM) {
      chunk_step(red, RED_PREMULSUM, scaled, a, NULL, n);
      a = (const char *)scaled;
    }
    chunk_step(red, binary, o, a, b, n);
    if (red->kind == RED_SUM_POSTDIV && last) chunk_step(red, RED_SUM_POSTDIV, o, o, NULL, n);
  }
}
