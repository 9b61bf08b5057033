/*
 * What the kernel does to the bytes of one piece: copy them, or combine this rank's data with what arrived,
 * element by element, with the semantics of the host backend (gpu/host_reduce.c).
 *
 * Every type has a "num" class: its stored element S, the type W its arithmetic is done in, and conversions.
 * Integers compute in their own width and wrap (through the unsigned type of that width); float and double
 * compute in themselves; half, bfloat16 and the fp8 formats compute in float and round to nearest even on
 * the way back (fp8 saturating to the largest finite value), converting two elements at a time where the
 * hardware can. Each step of an operation ends rounded to the type, as on the host: PREMULSUM rounds the
 * scaled value before the sum, SUM_POSTDIV the sum before the division. The explicit _rn intrinsics keep the
 * compiler from fusing a multiply and an add into one rounding.
 *
 * The loops are specialised on (num, op) and walk a piece either in 16-byte packs (when every pointer is
 * 16-byte aligned: unrolled, each thread with several loads in flight, consecutive threads on consecutive
 * packs) or element by element (the tail of a piece, and pointers that are not aligned). Ring slots are read
 * with L2-only loads (.cg): their bytes were written by another agent and are read once.
 */
#ifndef BRAID_DEVICE_REDUCE_CUH
#define BRAID_DEVICE_REDUCE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>

#include "device/dev.h"
#include "nccl.h"

/* What a loop computes per element from `l` (this rank's data) and `in` (what arrived). The first six combine
 * both; SCALE and DIV are the one-operand forms used when nothing is received. */
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_PREMULSUM, OP_SUMDIV, OP_SCALE, OP_DIV };

/* Items (16-byte packs for the aligned loops) each thread loads before it stores: enough bytes in flight per
 * block to cover memory latency, few enough registers for no spills. Operations with two operands load
 * twice as much per item; integer division expands to long sequences, and only ends an integer average. */
#define RED_UNROLL 8
template <int OP> struct unroll_of {
  static constexpr int U = OP == OP_SUMDIV || OP == OP_DIV ? 2 : OP < OP_SCALE ? 4 : RED_UNROLL;
};

template <class T, class F> __device__ __forceinline__ T bits_as(const F &f) {
  static_assert(sizeof(T) == sizeof(F), "same size");
  T t;
  memcpy(&t, &f, sizeof t);
  return t;
}

/* ---- Numbers ---- */

/* Integers of stored type S_ and unsigned type U of the same width. */
template <class S_, class U> struct int_num {
  typedef S_ S;
  typedef S_ W;
  typedef int64_t D; /* SUM_POSTDIV's divisor */
  __device__ static W up(S x) {
    return x;
  }
  __device__ static S down(W x) {
    return x;
  }
  __device__ static W round(W x) {
    return x;
  }
  __device__ static W add(W a, W b) {
    return (W)(U)((U)a + (U)b);
  }
  __device__ static W mul(W a, W b) {
    return (W)(U)((U)a * (U)b);
  }
  /* C division of the sign- or zero-extended value, as the host computes it in 64 bits; INT64_MIN / -1
   * would trap there, so -1 negates (wrapping) instead. */
  __device__ static W div(W a, D d) {
    if (S(-1) > S(0)) return (W)((uint64_t)a / (uint64_t)d);
    if (d == -1) return (W)(U)(U(0) - (U)a);
    return (W)((int64_t)a / d);
  }
  __device__ static W factor(const dev_xfer_t &x) {
    return x.scalar_ptr != NULL ? *(const S *)x.scalar_ptr : (W)(U)(uint64_t)x.scalar.i;
  }
  __device__ static D divisor(const dev_xfer_t &x) {
    return x.scalar.i;
  }
  __device__ static void unpack(uint4 v, W *w) {
    memcpy(w, &v, 16);
  }
  __device__ static uint4 pack(const W *w) {
    uint4 v;
    memcpy(&v, w, 16);
    return v;
  }
};

/* float and double: the type is its own arithmetic. */
struct f32_num {
  typedef float S, W, D;
  __device__ static W up(S x) {
    return x;
  }
  __device__ static S down(W x) {
    return x;
  }
  __device__ static W round(W x) {
    return x;
  }
  __device__ static W add(W a, W b) {
    return __fadd_rn(a, b);
  }
  __device__ static W mul(W a, W b) {
    return __fmul_rn(a, b);
  }
  __device__ static W div(W a, D d) {
    return __fdiv_rn(a, d);
  }
  __device__ static W factor(const dev_xfer_t &x) {
    return x.scalar_ptr != NULL ? *(const float *)x.scalar_ptr : (float)x.scalar.f;
  }
  __device__ static D divisor(const dev_xfer_t &x) {
    return (float)x.scalar.i;
  }
  __device__ static void unpack(uint4 v, W *w) {
    memcpy(w, &v, 16);
  }
  __device__ static uint4 pack(const W *w) {
    uint4 v;
    memcpy(&v, w, 16);
    return v;
  }
};

struct f64_num {
  typedef double S, W, D;
  __device__ static W up(S x) {
    return x;
  }
  __device__ static S down(W x) {
    return x;
  }
  __device__ static W round(W x) {
    return x;
  }
  __device__ static W add(W a, W b) {
    return __dadd_rn(a, b);
  }
  __device__ static W mul(W a, W b) {
    return __dmul_rn(a, b);
  }
  __device__ static W div(W a, D d) {
    return __ddiv_rn(a, d);
  }
  __device__ static W factor(const dev_xfer_t &x) {
    return x.scalar_ptr != NULL ? *(const double *)x.scalar_ptr : x.scalar.f;
  }
  __device__ static D divisor(const dev_xfer_t &x) {
    return (double)x.scalar.i;
  }
  __device__ static void unpack(uint4 v, W *w) {
    memcpy(w, &v, 16);
  }
  __device__ static uint4 pack(const W *w) {
    uint4 v;
    memcpy(&v, w, 16);
    return v;
  }
};

/* The formats narrower than float, as raw bits: one element (S) and two (S2) to and from float. */
struct half_fmt {
  typedef uint16_t S;
  typedef uint32_t S2;
  __device__ static float up(S x) {
    return __half2float(__ushort_as_half(x));
  }
  __device__ static S down(float f) {
    return __half_as_ushort(__float2half_rn(f));
  }
  __device__ static float2 up2(S2 x) {
    return __half22float2(bits_as<__half2>(x));
  }
  __device__ static S2 down2(float2 f) {
    return bits_as<S2>(__float22half2_rn(f));
  }
};

struct bf16_fmt {
  typedef uint16_t S;
  typedef uint32_t S2;
  __device__ static float up(S x) {
    return __bfloat162float(__ushort_as_bfloat16(x));
  }
  __device__ static S down(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
  __device__ static float2 up2(S2 x) {
    return __bfloat1622float2(bits_as<__nv_bfloat162>(x));
  }
  __device__ static S2 down2(float2 f) {
    return bits_as<S2>(__float22bfloat162_rn(f));
  }
};

template <__nv_fp8_interpretation_t K> struct fp8_fmt {
  typedef uint8_t S;
  typedef uint16_t S2;
  __device__ static float up(S x) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(x, K)));
  }
  __device__ static S down(float f) {
    return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, K);
  }
  __device__ static float2 up2(S2 x) {
    return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(x, K)));
  }
  __device__ static S2 down2(float2 f) {
    return __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, K);
  }
};

/* A narrow float format F computed in float. */
template <class F> struct small_num {
  typedef typename F::S S;
  typedef float W, D;
  static constexpr int V = 16 / sizeof(S);
  __device__ static W up(S x) {
    return F::up(x);
  }
  __device__ static S down(W x) {
    return F::down(x);
  }
  __device__ static W round(W x) {
    return F::up(F::down(x));
  }
  __device__ static W add(W a, W b) {
    return __fadd_rn(a, b);
  }
  __device__ static W mul(W a, W b) {
    return __fmul_rn(a, b);
  }
  __device__ static W div(W a, D d) {
    return __fdiv_rn(a, d);
  }
  __device__ static W factor(const dev_xfer_t &x) {
    return x.scalar_ptr != NULL ? F::up(*(const S *)x.scalar_ptr) : (float)x.scalar.f;
  }
  __device__ static D divisor(const dev_xfer_t &x) {
    return (float)x.scalar.i;
  }
  __device__ static void unpack(uint4 v, W *w) {
    typename F::S2 p[V / 2];
    memcpy(p, &v, 16);
#pragma unroll
    for (int i = 0; i < V / 2; i++) {
      float2 f = F::up2(p[i]);
      w[2 * i] = f.x;
      w[2 * i + 1] = f.y;
    }
  }
  __device__ static uint4 pack(const W *w) {
    typename F::S2 p[V / 2];
#pragma unroll
    for (int i = 0; i < V / 2; i++) p[i] = F::down2(make_float2(w[2 * i], w[2 * i + 1]));
    uint4 v;
    memcpy(&v, p, 16);
    return v;
  }
};

/* ---- Operations ---- */

/* One operation on one num, with its factor (PREMULSUM, SCALE) and divisor (SUMDIV, DIV) read once. */
template <class N, int OP> struct red_fn {
  typedef typename N::S S;
  typedef typename N::W W;
  static constexpr bool binary = OP < OP_SCALE;
  static constexpr int V = 16 / sizeof(S);
  W k = W(0);
  typename N::D d = typename N::D(1);

  __device__ explicit red_fn(const dev_xfer_t &x) {
    if constexpr (OP == OP_PREMULSUM || OP == OP_SCALE) k = N::factor(x);
    if constexpr (OP == OP_SUMDIV || OP == OP_DIV) d = N::divisor(x);
  }
  /* Max and min keep `in` when the two compare equal or either is NaN. */
  __device__ W apply(W l, W in) const {
    if constexpr (OP == OP_SUM) return N::add(l, in);
    if constexpr (OP == OP_PROD) return N::mul(l, in);
    if constexpr (OP == OP_MAX) return l > in ? l : in;
    if constexpr (OP == OP_MIN) return l < in ? l : in;
    if constexpr (OP == OP_PREMULSUM) return N::add(N::round(N::mul(l, k)), in);
    if constexpr (OP == OP_SUMDIV) return N::div(N::round(N::add(l, in)), d);
    if constexpr (OP == OP_SCALE) return N::mul(l, k);
    return N::div(l, d);
  }
  __device__ S apply_elem(S l, S in) const {
    return N::down(apply(N::up(l), binary ? N::up(in) : W(0)));
  }
  __device__ uint4 apply_pack(uint4 l, uint4 in) const {
    W a[V], b[V];
    N::unpack(l, a);
    if (binary) N::unpack(in, b);
#pragma unroll
    for (int i = 0; i < V; i++) a[i] = apply(a[i], binary ? b[i] : W(0));
    return N::pack(a);
  }
};

/* ---- Memory ---- */

/* The unsigned type of each element size. */
template <int B> struct raw_of;
template <> struct raw_of<1> { typedef uint8_t T; };
template <> struct raw_of<2> { typedef uint16_t T; };
template <> struct raw_of<4> { typedef uint32_t T; };
template <> struct raw_of<8> { typedef unsigned long long T; };
template <> struct raw_of<16> { typedef uint4 T; };

/* Loads an R from p, and stores one, bypassing L1 (nothing is read twice); p is aligned for R when
 * `aligned`, else it is accessed byte by byte. `shared`: p is in shared memory (the LL protocol's staging),
 * which the global-only cache operators cannot reach, so the access is a plain one. */
template <class R> __device__ __forceinline__ R load_raw(const char *p, bool aligned, bool shared) {
  if (shared) return *(const R *)p; /* the staging is 16-byte aligned, like a slot */
  if (aligned) return __ldcg((const R *)p);
  unsigned char b[sizeof(R)];
#pragma unroll
  for (int i = 0; i < (int)sizeof(R); i++) b[i] = __ldcg((const unsigned char *)p + i);
  return bits_as<R>(b);
}

template <class R> __device__ __forceinline__ void store_raw(char *p, R v, bool aligned, bool shared) {
  if (shared) {
    *(R *)p = v;
    return;
  }
  if (aligned) {
    __stcg((R *)p, v);
    return;
  }
  unsigned char b[sizeof(R)];
  memcpy(b, &v, sizeof b);
#pragma unroll
  for (int i = 0; i < (int)sizeof(R); i++) p[i] = (char)b[i];
}

/* The operands and results of one piece: `local` and `in` are read (either may be NULL when the operation
 * does not use it), `dst` and `out` written (either may be NULL). */
struct piece_t {
  const char *local, *in;
  char *dst, *out;
  uint32_t bytes;
};

/* Moves `count` items of R = raw_of<B> from index `first` on, among NT threads (a block's DEV_THREADS, or a
 * warp's 32 in the bulk entry point), `tid` being this thread's index among them: each thread takes items
 * tid, tid + NT, ... in groups of U whose loads are all issued before any store. `fn(l, in)` computes an
 * item. `aligned` says whether `local`, `dst` and `in` are aligned for R (`in` is a slot or the LL staging,
 * or `dst` itself for a local reduction); `out` is always a slot or the LL staging. Whether `in` (or `a`) and
 * `out` are the staging in shared memory is decided once per loop. */
template <int B, int U, int NT, class F>
__device__ __forceinline__ void items_loop(const piece_t &pc, uint32_t tid, uint32_t first, uint32_t count,
                                           bool two, bool aligned, const F &fn) {
  typedef typename raw_of<B>::T R;
  const uint32_t nt = NT, end = first + count;
  const char *a = two ? pc.local : (pc.local != NULL ? pc.local : pc.in);
  const bool a_sh = __isShared(a), in_sh = two && __isShared(pc.in),
             out_sh = pc.out != NULL && __isShared(pc.out);
  uint32_t i = first + tid;
  for (; i + (U - 1) * nt < end; i += U * nt) {
    /* One base per operand and constant offsets, so the addresses cost no registers per item. */
    const size_t at = (size_t)i * B;
    R l[U], r[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      l[u] = load_raw<R>(a + at + u * nt * B, aligned || a_sh, a_sh);
      if (two) r[u] = load_raw<R>(pc.in + at + u * nt * B, aligned || in_sh, in_sh);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      R v = fn(l[u], two ? r[u] : l[u]);
      if (pc.dst != NULL) store_raw<R>(pc.dst + at + u * nt * B, v, aligned, false);
      if (pc.out != NULL) store_raw<R>(pc.out + at + u * nt * B, v, true, out_sh);
    }
  }
  for (; i < end; i += nt) {
    const size_t at = (size_t)i * B;
    R l = load_raw<R>(a + at, aligned || a_sh, a_sh);
    R v = fn(l, two ? load_raw<R>(pc.in + at, aligned || in_sh, in_sh) : l);
    if (pc.dst != NULL) store_raw<R>(pc.dst + at, v, aligned, false);
    if (pc.out != NULL) store_raw<R>(pc.out + at, v, true, out_sh);
  }
}

/* The identity on an item, for copies. */
struct copy_fn {
  template <class R> __device__ R operator()(R l, R) const {
    return l;
  }
};

/* Copies a piece from `local` (or `in` when local is NULL) with the widest accesses the pointers allow (the
 * slots are 16-byte aligned; the user's buffers may not be), then the bytes past the last whole access; NT
 * threads share it (items_loop). */
template <int NT> __device__ __noinline__ void copy_piece(const piece_t pc, uint32_t tid) {
  const char *from = pc.local != NULL ? pc.local : pc.in;
  const uint32_t mis = (uint32_t)(((uintptr_t)from | (uintptr_t)pc.dst) & 15), n = pc.bytes;
  uint32_t head = 0; /* bytes moved by wide accesses */
  if (mis == 0) {
    head = n / 16 * 16;
    items_loop<16, RED_UNROLL, NT>(pc, tid, 0, n / 16, false, true, copy_fn());
  } else if (mis % 8 == 0) {
    head = n / 8 * 8;
    items_loop<8, RED_UNROLL, NT>(pc, tid, 0, n / 8, false, true, copy_fn());
  } else if (mis % 4 == 0) {
    head = n / 4 * 4;
    items_loop<4, RED_UNROLL, NT>(pc, tid, 0, n / 4, false, true, copy_fn());
  }
  items_loop<1, RED_UNROLL, NT>(pc, tid, head, n - head, false, true, copy_fn());
}

/* Combines a piece with fn: 16-byte packs when aligned, then elements. Each (num, op) is a function of its
 * own, called once per piece: the compiler allocates registers for each separately, which keeps the build
 * fast, and the arguments travel by value, in registers rather than on a stack. */
template <class N, int OP, int NT>
__device__ __noinline__ void reduce_piece(const red_fn<N, OP> fn, const piece_t pc, uint32_t tid) {
  typedef red_fn<N, OP> fn_t;
  typedef typename raw_of<sizeof(typename N::S)>::T E;
  const uint32_t es = sizeof(typename N::S), nelem = pc.bytes / es;
  const uintptr_t ptrs = (uintptr_t)pc.local | (uintptr_t)pc.dst | (uintptr_t)pc.in;
  uint32_t done = 0;
  if (ptrs % 16 == 0) {
    items_loop<16, unroll_of<OP>::U, NT>(pc, tid, 0, pc.bytes / 16, fn_t::binary, true,
                                         [&](uint4 l, uint4 in) { return fn.apply_pack(l, in); });
    done = pc.bytes / 16 * (16 / es);
  }
  piece_t rest = pc;
  rest.local += done * es;
  if (rest.in != NULL) rest.in += done * es;
  if (rest.dst != NULL) rest.dst += done * es;
  if (rest.out != NULL) rest.out += done * es;
  items_loop<sizeof(E), 1, NT>(rest, tid, 0, nelem - done, fn_t::binary, ptrs % es == 0, [&](E l, E in) {
    return bits_as<E>(fn.apply_elem(bits_as<typename N::S>(l), bits_as<typename N::S>(in)));
  });
}

template <bool C, class A, class B> struct pick_type { typedef A T; };
template <class A, class B> struct pick_type<false, A, B> { typedef B T; };

/* A num class, or an operation, as a value a generic lambda can take. */
template <class N> struct num_tag { typedef N type; };
template <int OP> struct op_tag { static constexpr int value = OP; };

/* Calls f(num_tag<N>()) for the transfer's type. Signed and unsigned integers of one width share the
 * operations whose bits do not depend on the sign. */
template <int OP, class F> __device__ __forceinline__ void with_num(const dev_xfer_t &x, const F &f) {
  constexpr bool same = OP == OP_SUM || OP == OP_PROD || OP == OP_PREMULSUM || OP == OP_SCALE;
  typedef int_num<typename pick_type<same, uint8_t, int8_t>::T, uint8_t> i8;
  typedef int_num<typename pick_type<same, uint32_t, int32_t>::T, uint32_t> i32;
  typedef int_num<typename pick_type<same, uint64_t, int64_t>::T, uint64_t> i64;
  switch (x.type) {
  case ncclInt8:
    return f(num_tag<i8>());
  case ncclUint8:
    return f(num_tag<int_num<uint8_t, uint8_t>>());
  case ncclInt32:
    return f(num_tag<i32>());
  case ncclUint32:
    return f(num_tag<int_num<uint32_t, uint32_t>>());
  case ncclInt64:
    return f(num_tag<i64>());
  case ncclUint64:
    return f(num_tag<int_num<uint64_t, uint64_t>>());
  case ncclFloat16:
    return f(num_tag<small_num<half_fmt>>());
  case ncclFloat32:
    return f(num_tag<f32_num>());
  case ncclFloat64:
    return f(num_tag<f64_num>());
  case ncclBfloat16:
    return f(num_tag<small_num<bf16_fmt>>());
  case ncclFloat8e4m3:
    return f(num_tag<small_num<fp8_fmt<__NV_E4M3>>>());
  case ncclFloat8e5m2:
    return f(num_tag<small_num<fp8_fmt<__NV_E5M2>>>());
  }
}

/* Calls f(op_tag<OP>(), num_tag<N>()) for a combine of what arrived with this rank's data: the transfer's
 * operation, SUM_POSTDIV dividing at the LAST combine only. The type and operation were validated. */
template <class F> __device__ __forceinline__ void with_binary_op(const dev_xfer_t &x, const F &f) {
  const bool last = (x.flags & DEV_XF_LAST) != 0;
  switch (x.red) {
  case DEV_RED_SUM:
    return with_num<OP_SUM>(x, [&](auto n) { f(op_tag<OP_SUM>(), n); });
  case DEV_RED_PROD:
    return with_num<OP_PROD>(x, [&](auto n) { f(op_tag<OP_PROD>(), n); });
  case DEV_RED_MAX:
    return with_num<OP_MAX>(x, [&](auto n) { f(op_tag<OP_MAX>(), n); });
  case DEV_RED_MIN:
    return with_num<OP_MIN>(x, [&](auto n) { f(op_tag<OP_MIN>(), n); });
  case DEV_RED_PREMULSUM:
    return with_num<OP_PREMULSUM>(x, [&](auto n) { f(op_tag<OP_PREMULSUM>(), n); });
  case DEV_RED_SUM_POSTDIV:
    if (last) return with_num<OP_SUMDIV>(x, [&](auto n) { f(op_tag<OP_SUMDIV>(), n); });
    return with_num<OP_SUM>(x, [&](auto n) { f(op_tag<OP_SUM>(), n); });
  }
}

/* Computes one piece of transfer x (dev.h): with something received and REDUCE, prepare(local) (+) in,
 * divided at the LAST combine of SUM_POSTDIV; received only, a copy; otherwise local, prepared when PREPARE
 * asks (PREMULSUM scales; SUM_POSTDIV divides at LAST). The type and operation were validated. Each (num,
 * op) reads its factor or divisor from the transfer once (red_fn) and runs reduce_piece. NT threads share
 * the piece, `tid` being this one's index among them: by default the whole block. */
template <int NT = DEV_THREADS>
__device__ __forceinline__ void piece_combine(const dev_xfer_t &x, const piece_t &pc,
                                              uint32_t tid = threadIdx.x) {
  const auto run = [&](auto op, auto n) {
    typedef typename decltype(n)::type N;
    reduce_piece<N, decltype(op)::value, NT>(red_fn<N, decltype(op)::value>(x), pc, tid);
  };
  if (pc.in != NULL && pc.local != NULL && (x.flags & DEV_XF_REDUCE)) return with_binary_op(x, run);
  if (pc.in == NULL && (x.flags & DEV_XF_PREPARE)) {
    if (x.red == DEV_RED_PREMULSUM) return with_num<OP_SCALE>(x, [&](auto n) { run(op_tag<OP_SCALE>(), n); });
    if (x.red == DEV_RED_SUM_POSTDIV && (x.flags & DEV_XF_LAST))
      return with_num<OP_DIV>(x, [&](auto n) { run(op_tag<OP_DIV>(), n); });
  }
  piece_t from = pc;
  if (pc.in != NULL) from.local = NULL;
  copy_piece<NT>(from, tid);
}

#endif
