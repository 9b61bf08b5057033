/*
 * Element codecs (see elem.h). The small floating-point formats share one encoder and one decoder,
 * parameterised by their exponent and mantissa widths.
 */
#include "elem.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A binary floating-point format narrower than float. */
typedef struct {
  int ebits;    /* exponent field width */
  int mbits;    /* mantissa field width */
  int ieee_inf; /* 1: an all-ones exponent means inf/NaN (IEEE); 0: only S.1111.111 is NaN (e4m3) */
} minifloat_t;

static const minifloat_t fmt_half = {5, 10, 1};
static const minifloat_t fmt_bf16 = {8, 7, 1};
static const minifloat_t fmt_e4m3 = {4, 3, 0};
static const minifloat_t fmt_e5m2 = {5, 2, 1};

static double mini_decode(const minifloat_t *f, uint32_t bits) {
  uint32_t mant = bits & ((1u << f->mbits) - 1);
  uint32_t efield = (bits >> f->mbits) & ((1u << f->ebits) - 1);
  int sign = (bits >> (f->ebits + f->mbits)) & 1;
  int bias = (1 << (f->ebits - 1)) - 1;
  uint32_t emax = (1u << f->ebits) - 1;
  double v;
  if (f->ieee_inf && efield == emax)
    v = mant != 0 ? NAN : INFINITY;
  else if (!f->ieee_inf && efield == emax && mant == (1u << f->mbits) - 1)
    v = NAN;
  else if (efield == 0)
    v = ldexp((double)mant, 1 - bias - f->mbits);
  else
    v = ldexp((double)((1u << f->mbits) | mant), (int)efield - bias - f->mbits);
  return sign ? -v : v;
}

/* The largest finite magnitude's bits (without sign). */
static uint32_t mini_max_bits(const minifloat_t *f) {
  uint32_t emax = (1u << f->ebits) - 1;
  if (f->ieee_inf) return ((emax - 1) << f->mbits) | ((1u << f->mbits) - 1);
  return (emax << f->mbits) | ((1u << f->mbits) - 2);
}

static uint32_t mini_encode(const minifloat_t *f, double v) {
  uint32_t sign = signbit(v) ? 1u << (f->ebits + f->mbits) : 0;
  uint32_t emax = (1u << f->ebits) - 1;
  double a = fabs(v);
  if (isnan(v)) return sign | (emax << f->mbits) | ((1u << f->mbits) - 1);
  if (a == 0) return sign;
  int bias = (1 << (f->ebits - 1)) - 1, emin = 1 - bias, e;
  frexp(a, &e);
  e -= 1; /* a = 1.m * 2^e */
  int scale = (e < emin ? emin : e) - f->mbits;
  /* q holds the significand (with its leading one for normal numbers) in units of the last place. */
  uint64_t q = (uint64_t)nearbyint(ldexp(a, -scale));
  if (q >> (f->mbits + 1)) {
    q >>= 1;
    e++;
  }
  uint32_t bits;
  if (e < emin)
    bits = (uint32_t)q; /* subnormal; q == 2^mbits lands on the smallest normal */
  else
    bits = ((uint32_t)(e + bias) << f->mbits) | ((uint32_t)q & ((1u << f->mbits) - 1));
  if (isinf(v) || bits > mini_max_bits(f))
    bits = f->ieee_inf ? emax << f->mbits : mini_max_bits(f); /* e4m3 saturates: it has no infinity */
  return sign | bits;
}

double elem_get(ncclDataType_t type, const void *buf, size_t i) {
  const char *p = buf;
  switch (type) {
  case ncclInt8:
    return ((const int8_t *)p)[i];
  case ncclUint8:
    return ((const uint8_t *)p)[i];
  case ncclInt32:
    return ((const int32_t *)p)[i];
  case ncclUint32:
    return ((const uint32_t *)p)[i];
  case ncclInt64:
    return (double)((const int64_t *)p)[i];
  case ncclUint64:
    return (double)((const uint64_t *)p)[i];
  case ncclFloat16:
    return mini_decode(&fmt_half, ((const uint16_t *)p)[i]);
  case ncclFloat32:
    return ((const float *)p)[i];
  case ncclFloat64:
    return ((const double *)p)[i];
  case ncclBfloat16:
    return mini_decode(&fmt_bf16, ((const uint16_t *)p)[i]);
  case ncclFloat8e4m3:
    return mini_decode(&fmt_e4m3, ((const uint8_t *)p)[i]);
  case ncclFloat8e5m2:
    return mini_decode(&fmt_e5m2, ((const uint8_t *)p)[i]);
  default:
    return NAN;
  }
}

void elem_set(ncclDataType_t type, void *buf, size_t i, double v) {
  char *p = buf;
  switch (type) {
  case ncclInt8:
    ((int8_t *)p)[i] = (int8_t)v;
    break;
  case ncclUint8:
    ((uint8_t *)p)[i] = (uint8_t)v;
    break;
  case ncclInt32:
    ((int32_t *)p)[i] = (int32_t)v;
    break;
  case ncclUint32:
    ((uint32_t *)p)[i] = (uint32_t)v;
    break;
  case ncclInt64:
    ((int64_t *)p)[i] = (int64_t)v;
    break;
  case ncclUint64:
    ((uint64_t *)p)[i] = (uint64_t)v;
    break;
  case ncclFloat16:
    ((uint16_t *)p)[i] = (uint16_t)mini_encode(&fmt_half, v);
    break;
  case ncclFloat32:
    ((float *)p)[i] = (float)v;
    break;
  case ncclFloat64:
    ((double *)p)[i] = v;
    break;
  case ncclBfloat16:
    ((uint16_t *)p)[i] = (uint16_t)mini_encode(&fmt_bf16, v);
    break;
  case ncclFloat8e4m3:
    ((uint8_t *)p)[i] = (uint8_t)mini_encode(&fmt_e4m3, v);
    break;
  case ncclFloat8e5m2:
    ((uint8_t *)p)[i] = (uint8_t)mini_encode(&fmt_e5m2, v);
    break;
  default:
    break;
  }
}

double elem_epsilon(ncclDataType_t type) {
  switch (type) {
  case ncclFloat16:
    return ldexp(1, -fmt_half.mbits);
  case ncclFloat32:
    return ldexp(1, -23);
  case ncclFloat64:
    return ldexp(1, -52);
  case ncclBfloat16:
    return ldexp(1, -fmt_bf16.mbits);
  case ncclFloat8e4m3:
    return ldexp(1, -fmt_e4m3.mbits);
  case ncclFloat8e5m2:
    return ldexp(1, -fmt_e5m2.mbits);
  default:
    return 0;
  }
}
