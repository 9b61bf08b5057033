/*
 * Tests of the host reductions against references computed independently: the small float formats are decoded
 * with ldexp and encoded by searching for the nearest value, integers are reduced in exact 64-bit arithmetic
 * and wrapped by masking, floats are reduced in double and rounded once.
 */
#include "harness.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gpu/host_reduce.h"

/* ---- Reference formats ---- */

/* A small float format as the reference sees it. */
typedef struct {
  int ebits, mbits, bias; /* exponent bits, mantissa bits, exponent bias */
  uint32_t max_finite;    /* encoding of the largest finite magnitude */
  int saturates;          /* 1: larger values become max_finite (fp8); 0: they become infinity */
  int ieee_specials;      /* 1: exponent all ones is inf/NaN; 0: only all ones everywhere is NaN (e4m3) */
} ref_fmt_t;

static const ref_fmt_t ref_half = {5, 10, 15, 0x7bff, 0, 1};
static const ref_fmt_t ref_bf16 = {8, 7, 127, 0x7f7f, 0, 1};
static const ref_fmt_t ref_e4m3 = {4, 3, 7, 0x7e, 1, 0};
static const ref_fmt_t ref_e5m2 = {5, 2, 15, 0x7b, 1, 1};

static uint32_t sign_bit(const ref_fmt_t *f) {
  return 1u << (f->ebits + f->mbits);
}

static double ref_decode(const ref_fmt_t *f, uint32_t v) {
  uint32_t mag = v & (sign_bit(f) - 1);
  int e = (int)(mag >> f->mbits);
  double m = (double)(mag & ((1u << f->mbits) - 1));
  double s = (v & sign_bit(f)) ? -1.0 : 1.0;
  if (mag > f->max_finite) {
    if (f->ieee_specials && m == 0) return s * INFINITY;
    return NAN;
  }
  if (e == 0) return s * ldexp(m, 1 - f->bias - f->mbits);
  return s * ldexp(m + ldexp(1, f->mbits), e - f->bias - f->mbits);
}

static int ref_is_nan(const ref_fmt_t *f, uint32_t v) {
  return isnan(ref_decode(f, v));
}

/* Nearest encoding to x, ties to the even encoding; past the top, infinity or saturation. NaN is not handled.
 */
static uint32_t ref_encode(const ref_fmt_t *f, double x) {
  uint32_t sign = signbit(x) ? sign_bit(f) : 0;
  double a = fabs(x);
  uint32_t lo = 0, hi = f->max_finite; /* largest encoding whose value <= a */
  while (lo < hi) {
    uint32_t mid = (lo + hi + 1) / 2;
    if (ref_decode(f, mid) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  double vlo = ref_decode(f, lo);
  if (lo == f->max_finite) {
    double step = vlo - ref_decode(f, lo - 1);
    if (!f->saturates && a >= vlo + step / 2) return sign | (f->max_finite + 1); /* infinity */
    return sign | lo;
  }
  double below = a - vlo, above = ref_decode(f, lo + 1) - a;
  if (below < above || (below == above && (lo & 1) == 0)) return sign | lo;
  return sign | (lo + 1);
}

/* ---- Known values ---- */

static void test_known_patterns(void) {
  EXPECT(red_float_to_half(1.0f) == 0x3c00);
  EXPECT(red_float_to_half(-2.0f) == 0xc000);
  EXPECT(red_float_to_half(65504.0f) == 0x7bff);
  EXPECT(red_float_to_half(65520.0f) == 0x7c00, "65520 is the tie to infinity");
  EXPECT(red_float_to_half(65519.0f) == 0x7bff);
  EXPECT(red_float_to_half(INFINITY) == 0x7c00 && red_float_to_half(-INFINITY) == 0xfc00);
  EXPECT(red_float_to_half(0x1p-24f) == 0x0001 && red_half_to_float(0x0001) == 0x1p-24f);
  EXPECT(red_float_to_half(0x1p-25f) == 0x0000, "tie between 0 and 2^-24 goes to even 0");
  EXPECT(red_float_to_half(0x1.8p-24f) == 0x0002, "tie between 1 and 2 ulps goes to even 2");
  EXPECT(red_float_to_half(0x1.002p0f) == 0x3c00, "halfway above 1.0 rounds to even 1.0");
  EXPECT(red_float_to_half(0x1.006p0f) == 0x3c02, "halfway above 1+1ulp rounds up to even");
  EXPECT(red_float_to_half(0x1p-14f) == 0x0400 && red_half_to_float(0x03ff) == 0x3ffp-24f);
  EXPECT(red_float_to_half(-0.0f) == 0x8000);
  EXPECT(ref_is_nan(&ref_half, red_float_to_half(NAN)));
  EXPECT(red_float_to_bf16(1.0f) == 0x3f80 && red_bf16_to_float(0x3f80) == 1.0f);
  EXPECT(red_float_to_bf16(0x1.01p0f) == 0x3f80 && red_float_to_bf16(0x1.03p0f) == 0x3f82);
  EXPECT(red_float_to_bf16(3.4e38f) == 0x7f80, "rounds past the largest bf16 to infinity");
  EXPECT(ref_is_nan(&ref_bf16, red_float_to_bf16(NAN)));
  EXPECT(red_float_to_e4m3(448.0f) == 0x7e && red_e4m3_to_float(0x7e) == 448.0f);
  EXPECT(red_float_to_e4m3(1.0f) == 0x38 && red_float_to_e4m3(-1.0f) == 0xb8);
  EXPECT(red_float_to_e4m3(1e9f) == 0x7e && red_float_to_e4m3(INFINITY) == 0x7e, "satfinite");
  EXPECT(red_float_to_e4m3(-INFINITY) == 0xfe && red_float_to_e4m3(480.0f) == 0x7e);
  EXPECT(red_float_to_e4m3(0x1p-9f) == 0x01 && red_float_to_e4m3(0x1p-10f) == 0x00);
  EXPECT(isnan(red_e4m3_to_float(0x7f)) && isnan(red_e4m3_to_float(0xff)));
  EXPECT(red_e4m3_to_float(0x78) == 256.0f, "e4m3 has no infinity: exponent 15 is normal");
  EXPECT(red_float_to_e4m3(NAN) == 0x7f || red_float_to_e4m3(NAN) == 0xff);
  EXPECT(red_float_to_e5m2(1.0f) == 0x3c && red_float_to_e5m2(57344.0f) == 0x7b);
  EXPECT(red_float_to_e5m2(1e9f) == 0x7b && red_float_to_e5m2(-INFINITY) == 0xfb, "satfinite");
  EXPECT(red_e5m2_to_float(0x7c) == INFINITY && isnan(red_e5m2_to_float(0x7d)));
  EXPECT(ref_is_nan(&ref_e5m2, red_float_to_e5m2(NAN)));
  EXPECT(red_float_to_e5m2(0x1p-16f) == 0x01 && red_e5m2_to_float(0x01) == 0x1p-16f);
}

/* ---- Exhaustive conversions ---- */

typedef float (*to_float_fn)(uint32_t v);
typedef uint32_t (*from_float_fn)(float f);

static float half_in(uint32_t v) {
  return red_half_to_float((uint16_t)v);
}
static uint32_t half_out(float f) {
  return red_float_to_half(f);
}
static float bf16_in(uint32_t v) {
  return red_bf16_to_float((uint16_t)v);
}
static uint32_t bf16_out(float f) {
  return red_float_to_bf16(f);
}
static float e4m3_in(uint32_t v) {
  return red_e4m3_to_float((uint8_t)v);
}
static uint32_t e4m3_out(float f) {
  return red_float_to_e4m3(f);
}
static float e5m2_in(uint32_t v) {
  return red_e5m2_to_float((uint8_t)v);
}
static uint32_t e5m2_out(float f) {
  return red_float_to_e5m2(f);
}

/* Every encoding decodes like the reference and converts back to itself (NaN to some NaN); every midpoint
 * between neighbours, and the floats just either side of it, convert as the reference says. */
static void check_format(const ref_fmt_t *f, to_float_fn in, from_float_fn out) {
  uint32_t n = sign_bit(f) << 1;
  for (uint32_t v = 0; v < n; v++) {
    double want = ref_decode(f, v);
    float got = in(v);
    if (isnan(want)) {
      EXPECT(isnan(got), "pattern 0x%x", v);
      EXPECT(ref_is_nan(f, out(got)), "pattern 0x%x: NaN converted to 0x%x", v, out(got));
      continue;
    }
    EXPECT((double)got == want && !signbit(got) == !signbit(want), "0x%x decoded to %a, want %a", v, got,
           want);
    uint32_t back = v;
    if (isinf(want) && f->saturates) back = (v & sign_bit(f)) | f->max_finite; /* satfinite: no way back */
    EXPECT(out(got) == back, "0x%x round-tripped to 0x%x", v, out(got));
  }
  for (uint32_t v = 0; v < f->max_finite; v++) {
    for (int s = 0; s < 2; s++) {
      double mid = (ref_decode(f, v) + ref_decode(f, v + 1)) / 2 * (s ? -1 : 1);
      float probes[3] = {(float)mid, nextafterf((float)mid, 0), nextafterf((float)mid, INFINITY)};
      for (int p = 0; p < 3; p++) {
        EXPECT((double)probes[0] == mid, "midpoint above 0x%x not exact in float", v);
        uint32_t want = ref_encode(f, probes[p]), got = out(probes[p]);
        EXPECT(got == want, "%a converted to 0x%x, want 0x%x", probes[p], got, want);
      }
    }
  }
}

static void test_half_exhaustive(void) {
  check_format(&ref_half, half_in, half_out);
}

static void test_bf16_exhaustive(void) {
  check_format(&ref_bf16, bf16_in, bf16_out);
}

static void test_fp8_exhaustive(void) {
  check_format(&ref_e4m3, e4m3_in, e4m3_out);
  check_format(&ref_e5m2, e5m2_in, e5m2_out);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Random float bit patterns of every exponent convert as the reference says. */
static void test_random_conversions(void) {
  const ref_fmt_t *fmts[4] = {&ref_half, &ref_bf16, &ref_e4m3, &ref_e5m2};
  from_float_fn outs[4] = {half_out, bf16_out, e4m3_out, e5m2_out};
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = (uint32_t)rnd();
    float x;
    memcpy(&x, &u, sizeof x);
    for (int k = 0; k < 4; k++) {
      uint32_t got = outs[k](x);
      if (isnan(x)) {
        EXPECT(ref_is_nan(fmts[k], got), "NaN 0x%x converted to 0x%x", u, got);
        continue;
      }
      uint32_t want = ref_encode(fmts[k], x);
      EXPECT(got == want, "format %d: %a (0x%08x) converted to 0x%x, want 0x%x", k, x, u, got, want);
    }
  }
}

/* ---- Reductions ---- */

static const red_kind_t kinds[] = {RED_SUM, RED_PROD, RED_MAX, RED_MIN, RED_PREMULSUM, RED_SUM_POSTDIV};
static const char *kind_names[] = {"sum", "prod", "max", "min", "premulsum", "sum_postdiv"};

static size_t type_size(ncclDataType_t t) {
  static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return sizes[t];
}

static int is_float(ncclDataType_t t) {
  return t >= ncclFloat16;
}

static int is_signed(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
}

static const ref_fmt_t *small_fmt(ncclDataType_t t) {
  switch (t) {
  case ncclFloat16:
    return &ref_half;
  case ncclBfloat16:
    return &ref_bf16;
  case ncclFloat8e4m3:
    return &ref_e4m3;
  case ncclFloat8e5m2:
    return &ref_e5m2;
  default:
    return NULL;
  }
}

static uint64_t get_bits(ncclDataType_t t, const void *buf, size_t i) {
  uint64_t v = 0;
  memcpy(&v, (const char *)buf + i * type_size(t), type_size(t)); /* little-endian host */
  return v;
}

static void put_bits(ncclDataType_t t, void *buf, size_t i, uint64_t v) {
  memcpy((char *)buf + i * type_size(t), &v, type_size(t));
}

/* An integer element as a 64-bit value (sign-extended for signed types). */
static int64_t get_int(ncclDataType_t t, const void *buf, size_t i) {
  uint64_t v = get_bits(t, buf, i);
  int bits = (int)type_size(t) * 8;
  if (is_signed(t) && bits < 64 && (v >> (bits - 1)) & 1) return (int64_t)v - ((int64_t)1 << bits);
  return (int64_t)v;
}

/* x modulo 2^bits of the type, as stored bits. */
static uint64_t wrap(ncclDataType_t t, uint64_t x) {
  int bits = (int)type_size(t) * 8;
  return bits == 64 ? x : x & ((UINT64_C(1) << bits) - 1);
}

static double get_float(ncclDataType_t t, const void *buf, size_t i) {
  uint64_t v = get_bits(t, buf, i);
  if (small_fmt(t)) return ref_decode(small_fmt(t), (uint32_t)v);
  if (t == ncclFloat32) {
    float f;
    memcpy(&f, &v, sizeof f);
    return f;
  }
  double d;
  memcpy(&d, &v, sizeof d);
  return d;
}

/* x rounded to the type, as stored bits. */
static uint64_t float_bits_of(ncclDataType_t t, double x) {
  if (isnan(x)) return UINT64_MAX; /* compared specially */
  if (small_fmt(t)) return ref_encode(small_fmt(t), x);
  uint64_t v = 0;
  if (t == ncclFloat32) {
    float f = (float)x;
    memcpy(&v, &f, sizeof f);
  } else {
    memcpy(&v, &x, sizeof x);
  }
  return v;
}

static double round_to(ncclDataType_t t, double x) {
  if (isnan(x)) return x;
  uint64_t bits = float_bits_of(t, x), tmp[1] = {bits};
  return get_float(t, tmp, 0);
}

/* The reference for one element: prepared local (prep) and combined result (comb). */
static void ref_element(const red_t *r, const void *local, const void *in, size_t i, int last, uint64_t *prep,
                        uint64_t *comb) {
  ncclDataType_t t = r->type;
  if (!is_float(t)) {
    uint64_t a = (uint64_t)get_int(t, local, i), b = (uint64_t)get_int(t, in, i), c;
    *prep = wrap(t, r->kind == RED_PREMULSUM ? a * (uint64_t)r->iscale : a);
    int sgn = is_signed(t);
    switch (r->kind) {
    case RED_PROD:
      c = a * b;
      break;
    case RED_MAX:
      c = sgn ? ((int64_t)a > (int64_t)b ? a : b) : (a > b ? a : b);
      break;
    case RED_MIN:
      c = sgn ? ((int64_t)a < (int64_t)b ? a : b) : (a < b ? a : b);
      break;
    default:
      c = *prep + b;
      break;
    }
    c = wrap(t, c);
    if (r->kind == RED_SUM_POSTDIV && last) {
      uint64_t tmp[1] = {c};
      c = sgn ? (uint64_t)(get_int(t, tmp, 0) / r->divisor) : c / (uint64_t)r->divisor;
      c = wrap(t, c);
    }
    *comb = c;
    return;
  }
  double a = get_float(t, local, i), b = get_float(t, in, i), c;
  double p = a;
  if (r->kind == RED_PREMULSUM)
    p = t == ncclFloat64 ? a * r->fscale : round_to(t, (float)(a * (double)(float)r->fscale));
  *prep = float_bits_of(t, p);
  switch (r->kind) {
  case RED_PROD:
    c = round_to(t, a * b);
    break;
  case RED_MAX:
    c = a > b ? a : b;
    break;
  case RED_MIN:
    c = a < b ? a : b;
    break;
  default:
    c = round_to(t, p + b);
    break;
  }
  if (r->kind == RED_SUM_POSTDIV && last)
    c = t == ncclFloat64 ? c / (double)r->divisor : round_to(t, (float)(c / (double)(float)r->divisor));
  *comb = float_bits_of(t, c);
}

/* Fills n elements with random values: integers of every magnitude, finite floats of moderate range. */
static void fill_random(ncclDataType_t t, void *buf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t v = rnd();
    if (!is_float(t) && rnd() % 4 == 0) v = rnd() % 16 - 8; /* small values too, so products are not all 0 */
    if (small_fmt(t)) {
      while (isnan(ref_decode(small_fmt(t), (uint32_t)wrap(t, v))) ||
             isinf(ref_decode(small_fmt(t), (uint32_t)wrap(t, v))))
        v = rnd();
    } else if (t == ncclFloat32) {
      float f = ldexpf((float)(int32_t)v / 0x1p31f, (int)(rnd() % 40) - 20);
      memcpy(&v, &f, sizeof f);
    } else if (t == ncclFloat64) {
      double d = ldexp((double)(int64_t)v / 0x1p63, (int)(rnd() % 80) - 40);
      memcpy(&v, &d, sizeof d);
    }
    put_bits(t, buf, i, v);
  }
}

static int same_result(ncclDataType_t t, uint64_t want, uint64_t got) {
  if (want == UINT64_MAX && is_float(t)) { /* NaN expected */
    uint64_t tmp[1] = {got};
    return isnan(get_float(t, tmp, 0));
  }
  return want == got;
}

/* Runs prepare and combine (last = 0 and 1) on count elements at byte offset `skew`, with out separate, out
 * == local or out == in (alias 0, 1, 2), and checks every element. */
static void check_reduction(const red_t *r, size_t count, size_t skew, int alias) {
  size_t sz = type_size(r->type), bytes = count * sz + skew + 16;
  char *local = malloc(bytes), *in = malloc(bytes), *out = malloc(bytes), *saved = malloc(bytes);
  EXPECT(local && in && out && saved);
  fill_random(r->type, local + skew, count);
  fill_random(r->type, in + skew, count);
  memcpy(saved, local, bytes);
  for (int step = 0; step < 3; step++) {
    memcpy(local, saved, bytes);
    char *dst = alias == 1 ? local + skew : alias == 2 ? in + skew : out + skew;
    char *in_copy = malloc(bytes);
    EXPECT(in_copy);
    memcpy(in_copy, in, bytes);
    if (step == 0)
      red_prepare(r, dst, local + skew, count);
    else
      red_combine(r, dst, local + skew, in + skew, count, step == 2);
    for (size_t i = 0; i < count; i++) {
      uint64_t prep, comb;
      ref_element(r, saved + skew, in_copy + skew, i, step == 2, &prep, &comb);
      uint64_t want = step == 0 ? prep : comb, got = get_bits(r->type, dst, i);
      EXPECT(same_result(r->type, want, got),
             "type %d %s step %d alias %d count %zu [%zu]: got 0x%llx want 0x%llx", (int)r->type,
             kind_names[r->kind], step, alias, count, i, (unsigned long long)got, (unsigned long long)want);
    }
    memcpy(in, in_copy, bytes); /* undo out == in */
    free(in_copy);
  }
  free(local);
  free(in);
  free(out);
  free(saved);
}

static red_t make_red(ncclDataType_t t, red_kind_t k) {
  red_t r = {.kind = k, .type = t, .fscale = 1.0 / 3.0, .iscale = -3, .divisor = 3};
  if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2) r.fscale = 0.3;
  return r;
}

static void test_every_kind_every_type(void) {
  for (int t = 0; t < ncclNumTypes; t++)
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      red_t r = make_red((ncclDataType_t)t, kinds[k]);
      check_reduction(&r, 1001, 0, 0);
      check_reduction(&r, 1001, 1, 0);
    }
}

static void test_aliasing(void) {
  for (int t = 0; t < ncclNumTypes; t++)
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      red_t r = make_red((ncclDataType_t)t, kinds[k]);
      check_reduction(&r, 777, 1, 1);
      check_reduction(&r, 777, 3, 2);
    }
}

/* Counts around the chunk size, and 0 (nothing written). */
static void test_counts(void) {
  static const size_t counts[] = {1, 2, 3, 255, 256, 257, 511, 512, 513};
  for (int t = 0; t < ncclNumTypes; t++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      red_t r = make_red((ncclDataType_t)t, c % 2 ? RED_PREMULSUM : RED_SUM);
      check_reduction(&r, counts[c], c % 3, (int)(c % 3));
    }
  unsigned char a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {9}, out[8];
  memset(out, 0xab, sizeof out);
  red_t r = make_red(ncclFloat32, RED_PREMULSUM);
  red_prepare(&r, out, a, 0);
  red_combine(&r, out, a, b, 0, 1);
  r.kind = RED_SUM;
  red_prepare(&r, out, a, 0);
  for (int i = 0; i < 8; i++) EXPECT(out[i] == 0xab, "count 0 wrote byte %d", i);
}

static void test_large_counts(void) {
  static const ncclDataType_t types[] = {ncclFloat32, ncclInt32, ncclUint8, ncclFloat64};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    red_t r = make_red(types[i], i % 2 ? RED_SUM : RED_PREMULSUM);
    check_reduction(&r, 5000003, 1, (int)(i % 3));
  }
}

static void test_int_wraparound(void) {
  int8_t a8[2] = {127, -128}, b8[2] = {1, -1}, o8[2];
  red_t r = make_red(ncclInt8, RED_SUM);
  red_combine(&r, o8, a8, b8, 2, 1);
  EXPECT(o8[0] == -128 && o8[1] == 127);
  uint8_t u8a[1] = {255}, u8b[1] = {1}, u8o[1];
  r.type = ncclUint8;
  red_combine(&r, u8o, u8a, u8b, 1, 1);
  EXPECT(u8o[0] == 0);
  int32_t a32[2] = {INT32_MAX, 65536}, b32[2] = {1, 65536}, o32[2];
  r.type = ncclInt32;
  red_combine(&r, o32, a32, b32, 2, 1);
  EXPECT(o32[0] == INT32_MIN);
  r.kind = RED_PROD;
  red_combine(&r, o32, a32, b32, 2, 1);
  EXPECT(o32[0] == INT32_MAX && o32[1] == 0, "65536^2 wraps to 0");
  int64_t a64[1] = {INT64_MAX}, b64[1] = {2}, o64[1];
  r.type = ncclInt64;
  red_combine(&r, o64, a64, b64, 1, 1);
  EXPECT(o64[0] == -2);
  uint64_t ua[1] = {UINT64_MAX}, ub[1] = {UINT64_MAX}, uo[1];
  r.type = ncclUint64;
  r.kind = RED_MAX;
  red_combine(&r, uo, ua, (uint64_t[]){1}, 1, 1);
  EXPECT(uo[0] == UINT64_MAX, "unsigned compare");
  r.kind = RED_SUM;
  red_combine(&r, uo, ua, ub, 1, 1);
  EXPECT(uo[0] == UINT64_MAX - 1);
  r.type = ncclInt64;
  r.kind = RED_MIN;
  red_combine(&r, o64, (int64_t[]){-1}, (int64_t[]){INT64_MAX}, 1, 1);
  EXPECT(o64[0] == -1, "signed compare");
  r.kind = RED_PREMULSUM;
  r.iscale = 3;
  red_prepare(&r, o64, a64, 1);
  EXPECT(o64[0] == INT64_MAX - 2, "INT64_MAX * 3 wraps");
}

static void test_postdiv_negative(void) {
  int32_t a[4] = {-7, 7, -6, INT32_MIN}, b[4] = {0, 0, -1, 0}, o[4];
  red_t r = make_red(ncclInt32, RED_SUM_POSTDIV);
  r.divisor = 2;
  red_combine(&r, o, a, b, 4, 0);
  EXPECT(o[0] == -7 && o[2] == -7, "no division unless last");
  red_combine(&r, o, a, b, 4, 1);
  EXPECT(o[0] == -3 && o[1] == 3 && o[2] == -3 && o[3] == INT32_MIN / 2, "truncation toward zero");
  int8_t a8[2] = {-100, 100}, b8[2] = {-100, 100}, o8[2];
  r.type = ncclInt8;
  r.divisor = 3;
  red_combine(&r, o8, a8, b8, 2, 1);
  EXPECT(o8[0] == 18 && o8[1] == -18, "sum wraps (-200 -> 56, 200 -> -56) before dividing");
  int64_t a64[1] = {INT64_MIN}, o64[1];
  r.type = ncclInt64;
  r.divisor = -1;
  red_combine(&r, o64, a64, (int64_t[]){0}, 1, 1);
  EXPECT(o64[0] == INT64_MIN, "INT64_MIN / -1 wraps");
  uint32_t ua[1] = {0xfffffffeu}, uo[1];
  r.type = ncclUint32;
  r.divisor = 2;
  red_combine(&r, uo, ua, (uint32_t[]){0}, 1, 1);
  EXPECT(uo[0] == 0x7fffffffu, "unsigned division");
}

static void test_premulsum_rounding(void) {
  /* Half: 1.0 * (1/3) rounds to 0x3555 before the add; 0x3555 + 1.0 = 1.33325..., rounded to 0x3d55. */
  uint16_t a[1] = {0x3c00}, b[1] = {0x3c00}, o[1];
  red_t r = make_red(ncclFloat16, RED_PREMULSUM);
  red_prepare(&r, o, a, 1);
  EXPECT(o[0] == 0x3555, "got 0x%x", o[0]);
  red_combine(&r, o, a, b, 1, 1);
  EXPECT(o[0] == 0x3d55, "got 0x%x", o[0]);
  /* e4m3: 448 * 2 saturates to 448, then 448 + 448 saturates again. */
  uint8_t e[1] = {0x7e}, eo[1];
  r = make_red(ncclFloat8e4m3, RED_PREMULSUM);
  r.fscale = 2.0;
  red_combine(&r, eo, e, e, 1, 1);
  EXPECT(eo[0] == 0x7e, "got 0x%x", eo[0]);
  /* float: the product is rounded to float before the add (no fused multiply-add). */
  float fa[1] = {1.0f + 0x1p-23f}, fb[1] = {-1.0f}, fo[1];
  r = make_red(ncclFloat32, RED_PREMULSUM);
  r.fscale = 1.0 + 0x1p-23;
  red_combine(&r, fo, fa, fb, 1, 1);
  EXPECT(fo[0] == 0x1p-22f, "got %a", fo[0]);
  /* Float average: SUM_POSTDIV divides in the type. */
  double da[1] = {1.0}, db[1] = {2.0}, dout[1];
  r = make_red(ncclFloat64, RED_SUM_POSTDIV);
  red_combine(&r, dout, da, db, 1, 1);
  EXPECT(dout[0] == 1.0);
}

int main(void) {
  TEST(test_known_patterns, 10);
  TEST(test_half_exhaustive, 60);
  TEST(test_bf16_exhaustive, 60);
  TEST(test_fp8_exhaustive, 10);
  TEST(test_random_conversions, 120);
  TEST(test_every_kind_every_type, 60);
  TEST(test_aliasing, 60);
  TEST(test_counts, 60);
  TEST(test_large_counts, 300);
  TEST(test_int_wraparound, 10);
  TEST(test_postdiv_negative, 10);
  TEST(test_premulsum_rounding, 10);
  return test_summary();
}
