/*
 * The LL protocol's lines (dev.h), as each thread of a block moves its own: a 16-byte line holds 8 data bytes
 * and two copies of the piece's flag, stored in one access and waited for on the line itself. The general
 * kernel's LL path (general.cuh) and the LL entry point both move pieces through ll_lines, which reads this
 * rank's bytes, waits for the arriving line, combines, stores the result and sends it, line by line.
 */
#ifndef BRAID_DEVICE_LL_CUH
#define BRAID_DEVICE_LL_CUH

#include <stdint.h>
#include <string.h>

#include "device/dev.h"
#include "device/reduce.cuh"
#include "device/trace.cuh"
#include "device/wait.cuh"

__device__ __forceinline__ uint4 load_line(const uint4 *p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void store_line(uint4 *p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

__device__ __forceinline__ void prefetch_l2(const void *p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* Every thread: reads line `p` until both its flags hold `flag`; its 8 data bytes in *d. The caller's loops
 * handle a line per thread at a time (one line per piece up to 4 KiB per channel, four at the most): holding
 * a thread's lines of a piece in registers at once pushed the kernel past its register budget (spills).
 * False when the wait failed (the thread's own spin_fails; the others notice the recorded error at their
 * next check). */
__device__ __forceinline__ bool ll_wait_line(const dev_comm_t *comm, const uint4 *p, uint32_t flag,
                                             const wait_what &what, uint2 *d) {
  uint4 v = load_line(p);
  spin_t s = {0, 0};
  while (v.y != flag || v.w != flag) {
    if (spin_fails(comm, &s, what)) return false;
    v = load_line(p);
  }
  *d = make_uint2(v.x, v.z);
  return true;
}

/* Every thread: waits for its lines of the piece of `len` bytes in `slot` carrying `flag` and decodes them
 * into `in`. False when the wait failed. */
__device__ bool ll_read(const dev_comm_t *comm, const uint4 *slot, uint32_t flag, uint32_t len, uint2 *in,
                        const wait_what &what) {
  for (uint32_t i = threadIdx.x; i < (len + 7) / 8; i += DEV_THREADS) {
    if (!ll_wait_line(comm, slot + i, flag, what, &in[i])) return false;
  }
  return true;
}

/* Every thread: encodes its share of `out` (a piece of `len` bytes) into the lines of `slot`, each with one
 * 16-byte store carrying `flag` twice. No fence: each line is its own signal. */
__device__ void ll_write(uint4 *slot, uint32_t flag, uint32_t len, const uint2 *out) {
  const uint32_t lines = (len + 7) / 8;
  for (uint32_t i = threadIdx.x; i < lines; i += DEV_THREADS) {
    const uint2 d = out[i];
    store_line(slot + i, make_uint4(d.x, flag, d.y, flag));
  }
}

/* Bytes of line i of a buffer of `len` bytes (bytes [8 i, 8 i + 8) that lie within it), and whether those
 * starting at `p` are whole 4-byte words, then read or written as such instead of byte by byte (the last line
 * of a buffer of an odd number of 4-byte elements, or a buffer that is 4- but not 8-byte aligned). */
__device__ __forceinline__ uint32_t line_bytes(uint32_t i, uint32_t len) {
  return len - 8 * i < 8 ? len - 8 * i : 8;
}
__device__ __forceinline__ bool line_words(const char *p, uint32_t n) {
  return (((uintptr_t)p | n) & 3) == 0;
}

/* Bytes [8 i, 8 i + 8) of a buffer of `len` bytes at `src` (any alignment; zeros past the end), from L2. */
__device__ __forceinline__ uint2 load8(const char *src, uint32_t i, uint32_t len) {
  if (((uintptr_t)src & 7) == 0 && 8 * i + 8 <= len) return __ldcg((const uint2 *)src + i);
  const char *p = src + 8 * i;
  const uint32_t n = line_bytes(i, len);
  uint32_t w[2] = {0, 0};
  if (line_words(p, n)) {
    for (uint32_t k = 0; k < n / 4; k++) w[k] = __ldcg((const uint32_t *)p + k);
  } else {
    unsigned char b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t k = 0; k < n; k++) b[k] = __ldcg((const unsigned char *)p + k);
    memcpy(w, b, 8);
  }
  return make_uint2(w[0], w[1]);
}

/* Every thread: copies its share of a piece of `len` bytes from `src` into `to` (shared memory), the lines
 * the same thread reads next (ll_read), so the loads travel while it waits for them. */
__device__ void ll_stage_local(uint2 *to, const char *src, uint32_t len) {
  for (uint32_t i = threadIdx.x; i < (len + 7) / 8; i += DEV_THREADS) to[i] = load8(src, i, len);
}

/* Stores `v` as bytes [8 i, 8 i + 8) of a buffer of `len` bytes at `dst` (any alignment; nothing past the
 * end), to L2. */
__device__ __forceinline__ void store8(char *dst, uint32_t i, uint32_t len, uint2 v) {
  if (((uintptr_t)dst & 7) == 0 && 8 * i + 8 <= len) {
    __stcg((uint2 *)dst + i, v);
    return;
  }
  char *p = dst + 8 * i;
  const uint32_t n = line_bytes(i, len), w[2] = {v.x, v.y};
  if (line_words(p, n)) {
    for (uint32_t k = 0; k < n / 4; k++) __stcg((uint32_t *)p + k, w[k]);
    return;
  }
  unsigned char b[8];
  memcpy(b, &v, 8);
  for (uint32_t k = 0; k < n; k++) p[k] = (char)b[k];
}

/* What a thread does to each of its lines of an LL piece (ll_lines): the operands and where the result goes.
 * Any of them may be absent (NULL). */
struct ll_io {
  const char *local; /* this rank's operand */
  const uint4 *in;   /* lines arriving with flag in_flag, the second operand */
  const char *mem;   /* or a second operand in memory (a local reduction's running result) */
  char *dst;         /* where the result is stored */
  uint4 *out;        /* lines the result is sent in, with flag out_flag */
  uint32_t in_flag, out_flag, len;
  uint32_t skip; /* the block's first `skip` threads take no line: thread t takes lines t - skip, t - skip +
                  * the other threads' count, ... (0: every thread of the block) */
  uint32_t
      send_local; /* LL128 only: `out` carries this rank's operand as it is, every unit of a warp sent before
                   * it awaits any (an in-place all-reduce's send and receive by the same warps) */
};

/* A line's combine: each element of this rank's 8 bytes with the other operand's (a line holds whole
 * elements, as parts and pieces start at multiples of 16 bytes), by the same red_fn as reduce_piece's. A
 * unary operation (SCALE, DIV) ignores the second operand. */
template <class N, int OP> struct line_op {
  red_fn<N, OP> fn;
  __device__ explicit line_op(const dev_xfer_t &x) : fn(x) {}
  __device__ uint2 operator()(uint2 l, uint2 in) const {
    typedef typename N::S S;
    constexpr int E = 8 / sizeof(S);
    S a[E], b[E];
    memcpy(a, &l, 8);
    memcpy(b, &in, 8);
#pragma unroll
    for (int e = 0; e < E; e++) a[e] = fn.apply_elem(a[e], b[e]);
    uint2 out;
    memcpy(&out, a, 8);
    return out;
  }
};

/* A line copied: the second operand when there is one, else this rank's. */
struct line_copy {
  bool second;
  __device__ uint2 operator()(uint2 l, uint2 in) const {
    return second ? in : l;
  }
};

/* Every thread: its lines of an LL piece, each on its own from start to end: it reads this rank's 8 bytes
 * (and a second operand in memory) before it waits for the arriving line's flags, combines with fn, stores
 * the bytes that lie within the piece and sends the line. No staging and no barrier. False when the wait
 * failed. */
template <class F>
__device__ __noinline__ bool ll_lines(const F fn, const ll_io io, const dev_comm_t *comm,
                                      const wait_what what) {
  TRACE_AT(TRACE_CALLED);
  for (uint32_t i = threadIdx.x - io.skip; i < (io.len + 7) / 8; i += blockDim.x - io.skip) {
    const uint2 l = io.local != NULL ? load8(io.local, i, io.len) : make_uint2(0, 0);
    uint2 in = io.mem != NULL ? load8(io.mem, i, io.len) : make_uint2(0, 0);
    if (i == 0) TRACE_AT(TRACE_LINES);
    if (io.in != NULL && !ll_wait_line(comm, io.in + i, io.in_flag, what, &in)) return false;
    if (i == 0) TRACE_AT(TRACE_ARRIVED);
    const uint2 v = fn(l, in);
    if (io.dst != NULL) store8(io.dst, i, io.len, v);
    if (io.out != NULL) store_line(io.out + i, make_uint4(v.x, io.out_flag, v.y, io.out_flag));
  }
  return true;
}

/* ---- LL128 (dev.h) ---- */

/* Units (4 lines) of a piece a warp holds at once: its loads of each are in flight together. */
#define LL128_BATCH 2

/* Where lane l's data lies in a unit's 480 data bytes: 16 bytes from here for the first 7 lanes of each line
 * (lanes 8 g + j, j < 7), 8 for its last (j = 7), whose other 8 bytes of the line are the flag. */
__device__ __forceinline__ uint32_t ll128_off(uint32_t l) {
  return (l & 7) < 7 ? 16 * (7 * (l >> 3) + (l & 7)) : 448 + 8 * (l >> 3);
}

/* ---- Straight-line memory operations ----
 *
 * A line's 8 lanes must store it in one instruction (dev.h), so the code that leads to a line's store
 * keeps the warp together: no branch that some lanes take and others not. These are one predicated
 * instruction each, which a compiler cannot turn into a branch; whether every lane of the warp runs the
 * store together is still checked at the store (ll128_send). */

/* 16 bytes at p (16-byte aligned) where `pred`, else zeros. */
__device__ __forceinline__ uint4 ld16_if(const void *p, bool pred) {
  uint4 v;
  asm volatile("{\n\t.reg .pred q;\n\t"
               "setp.ne.u32 q, %5, 0;\n\t"
               "mov.u32 %0, 0;\n\tmov.u32 %1, 0;\n\tmov.u32 %2, 0;\n\tmov.u32 %3, 0;\n\t"
               "@q ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
               : "=&r"(v.x), "=&r"(v.y), "=&r"(v.z), "=&r"(v.w)
               : "l"(p), "r"((uint32_t)pred)
               : "memory");
  return v;
}

/* 8 bytes at p (8-byte aligned) where `pred`, else 0, from L2. Like ld16_if, a volatile statement is
 * issued where it stands: the compiler neither drops it nor moves it past a branch, as it may a plain load
 * whose value only one side of the branch uses (pair_ar_load in pair.cuh issues its loads so before the
 * launch check). */
__device__ __forceinline__ uint64_t ld8_if(const void *p, bool pred) {
  uint64_t v;
  asm volatile("{\n\t.reg .pred q;\n\t"
               "setp.ne.u32 q, %2, 0;\n\t"
               "mov.u64 %0, 0;\n\t"
               "@q ld.global.cg.u64 %0, [%1];\n\t}"
               : "=&l"(v)
               : "l"(p), "r"((uint32_t)pred));
  return v;
}

/* 16 bytes of v at p (16-byte aligned) where `sixteen`, else its first 8 (p 8-byte aligned). */
__device__ __forceinline__ void st16_or_8(void *p, uint4 v, bool sixteen) {
  asm volatile("{\n\t.reg .pred q;\n\t"
               "setp.ne.u32 q, %5, 0;\n\t"
               "@q st.global.cg.v4.u32 [%0], {%1, %2, %3, %4};\n\t"
               "@!q st.global.cg.v2.u32 [%0], {%1, %2};\n\t}" ::"l"(p),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((uint32_t)sixteen)
               : "memory");
}

/* ll128_gather's loads, as loaded (ll128_load), and the shift that makes the lane's data of them
 * (ll128_shift): apart, a warp may have several units' loads in flight before it needs the first. */
struct ll128_raw {
  uint4 a, b;   /* the aligned 16 bytes that hold the lane's first byte, and the next 16 */
  uint32_t mis; /* src's misalignment */
  bool upper;   /* a line's last lane whose 8 bytes are the upper half of a */
};

__device__ __forceinline__ ll128_raw ll128_load(const char *src, uint32_t avail, uint32_t l) {
  const uint32_t g = l >> 3;
  const bool two = (l & 7) < 7;
  const uint32_t off = two ? ll128_off(l) : 448 + 16 * (g >> 1);
  const uint32_t mis = (uint32_t)(uintptr_t)src & 15;
  const char *at = src + off - mis;
  return ll128_raw{ld16_if(at, off < avail), ld16_if(at + 16, mis != 0 && off + 16 - mis < avail), mis,
                   !two && (g & 1) != 0};
}

__device__ __forceinline__ uint4 ll128_shift(const ll128_raw &r) {
  const uint32_t mis = r.mis;
  uint32_t w0 = r.a.x, w1 = r.a.y, w2 = r.a.z, w3 = r.a.w, w4 = r.b.x, w5 = r.b.y, w6 = r.b.z, w7 = r.b.w;
  if (mis & 8) {
    w0 = w2, w1 = w3, w2 = w4, w3 = w5, w4 = w6, w5 = w7;
  }
  if (mis & 4) {
    w0 = w1, w1 = w2, w2 = w3, w3 = w4, w4 = w5;
  }
  const uint32_t sh = 8 * (mis & 3);
  const uint4 v = make_uint4(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh),
                             __funnelshift_r(w2, w3, sh), __funnelshift_r(w3, w4, sh));
  return r.upper ? make_uint4(v.z, v.w, v.z, v.w) : v;
}

/* Lane l's data (ll128_off: 16 bytes, or 8 in .x and .y) of the unit whose 480 data bytes start at `src`,
 * of which the first `avail` lie in the buffer (the rest are unspecified, and never read past the 16-byte
 * block that holds the buffer's last byte). Every lane runs the same instructions: one 16-byte aligned load
 * (two where src is not 16-byte aligned, the same in every lane), then a funnel shift by src's misalignment;
 * a line's last lane loads the aligned 16 bytes that hold its 8 and keeps its half. */
__device__ __forceinline__ uint4 ll128_gather(const char *src, uint32_t avail, uint32_t l) {
  return ll128_shift(ll128_load(src, avail, l));
}

/* Stores lane l's data v (ll128_off) into the unit whose 480 data bytes start at `dst`, the bytes of it
 * within the first `avail`. A whole unit at a 16-byte aligned dst takes one store per lane; otherwise each
 * lane stores 4-byte words (dst and avail multiples of 4) or bytes, each store predicated. */
__device__ __forceinline__ void ll128_scatter(char *dst, uint32_t avail, uint32_t l, uint4 v) {
  const bool two = (l & 7) < 7;
  const uint32_t off = ll128_off(l), n = two ? 16 : 8;
  char *p = dst + off;
  if (((uintptr_t)dst & 15) == 0 && avail >= DEV_LL128_UNIT_DATA) { /* the same in every lane */
    st16_or_8(p, v, two);
    return;
  }
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if ((((uintptr_t)dst | avail) & 3) == 0) {
#pragma unroll
    for (uint32_t k = 0; k < 4; k++)
      if (4 * k < n && off + 4 * k < avail) __stcg((uint32_t *)p + k, w[k]);
    return;
  }
#pragma unroll
  for (uint32_t k = 0; k < 16; k++)
    if (k < n && off + k < avail) p[k] = (char)(w[k / 4] >> (8 * (k % 4)));
}

/* The way ll128_send stores a line when the warp is split: the line's last lane gathers the line's other
 * quarters (shuffles, which every lane of the warp runs, wherever it is split), stores them, fences at
 * system scope, then stores its own quarter with the flag. Out of line: the warp gets here only when the
 * compiler left it split. */
__device__ __noinline__ void ll128_send_split(uint4 *p, uint4 v, uint32_t flag) {
  const uint32_t all = 0xffffffffu, l = threadIdx.x & 31, first = l & ~7u;
  uint4 q[7];
#pragma unroll
  for (uint32_t k = 0; k < 7; k++)
    q[k] = make_uint4(__shfl_sync(all, v.x, first + k), __shfl_sync(all, v.y, first + k),
                      __shfl_sync(all, v.z, first + k), __shfl_sync(all, v.w, first + k));
  if ((l & 7) == 7) {
#pragma unroll
    for (uint32_t k = 0; k < 7; k++) store_line(p - 7 + k, q[k]);
    fence_acq_rel_sys();
    store_line(p, make_uint4(v.x, v.y, flag, flag));
  }
}

/* Every lane of a warp: sends its quarter of an LL128 line at p: v, or for a line's last lane v's first 8
 * bytes and the flag twice. NVLink delivers a line whole when the line's 8 lanes store it in one instruction
 * (dev.h), which they do when every lane of the warp runs it: the check of that (activemask) and the store
 * are one asm statement, with no branch between them. CUDA does not promise that a warp runs converged,
 * and the compiler did leave warps split at this store (in parts that end mid-unit, and between a line's
 * last lane and the others); a split warp stores by ll128_send_split, which orders the line's data before
 * its flag with a fence. */
__device__ __forceinline__ void ll128_send(uint4 *p, uint4 v, uint32_t flag, bool two) {
  uint32_t done;
  asm volatile("{\n\t.reg .pred q, t;\n\t.reg .b32 m, z, w;\n\t"
               "activemask.b32 m;\n\t"
               "setp.eq.b32 q, m, -1;\n\t"
               "setp.ne.u32 t, %6, 0;\n\t"
               "selp.b32 z, %4, %7, t;\n\t"
               "selp.b32 w, %5, %7, t;\n\t"
               "@q st.volatile.global.v4.u32 [%1], {%2, %3, z, w};\n\t"
               "selp.u32 %0, 1, 0, q;\n\t}"
               : "=r"(done)
               : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((uint32_t)two), "r"(flag)
               : "memory");
  if (!done) ll128_send_split(p, v, flag);
}

/* A line's quarter as ll128_wait leaves it, and whether the wait succeeded. */
struct ll128_got {
  uint4 v;
  bool ok;
};

/* Every lane of a warp: waits until every line of the warp's unit (whose quarter lane l loaded as `v`,
 * from `line`) carries `flag` in its last lane, loading the unit again while one does not; then loads it
 * once more and returns that: a warp's load of a line is not one read of it, so quarters loaded with the
 * flag's may be older. Every lane runs the same steps, the timeout's check included (spin_fails: its
 * counts are the same in every lane). ok false in every lane when the wait failed. */
__device__ __noinline__ ll128_got ll128_wait(const dev_comm_t *comm, const uint4 *line, uint32_t flag,
                                             const wait_what what, uint4 v) {
  const uint32_t all = 0xffffffffu;
  const bool two = (threadIdx.x & 7) < 7;
  spin_t s = {0, 0};
  for (;;) {
    if (__all_sync(all, two || (v.z == flag && v.w == flag))) return ll128_got{load_line(line), true};
    if (__any_sync(all, spin_fails(comm, &s, what))) return ll128_got{v, false};
    v = load_line(line);
  }
}

/* Every warp from thread io.skip on (a multiple of 32): the units of an LL128 piece, unit u by warp u % the
 * warps, LL128_BATCH of them at once: it loads the arriving lines and this rank's operand (or a second one in
 * memory) of each, then waits for each unit's flags (ll128_wait), combines with fn (on each 8-byte half),
 * sends the unit's lines (ll128_send) and stores the bytes within the piece; with io.send_local, the warp
 * first sends all its units of this rank's operand as they are. Every lane of a warp runs the
 * same units and the same instructions (the straight-line operations above), so that the warp stays
 * together for its stores of lines. With LOADS_FIRST, the operand's loads of both units of a batch are
 * issued before either is shifted into place, so that they are in flight together (proto_lines asks it where
 * a warp has more than one batch of a receive to combine: with one, the loads of a batch are mostly of one
 * unit, and the extra registers cost more than they save). False (in every lane of the warp) when the wait
 * failed. */
template <class F, bool LOADS_FIRST>
__device__ __noinline__ bool ll128_lines(const F fn, const ll_io io, const dev_comm_t *comm,
                                         const wait_what what) {
  static_assert(LL128_BATCH == 2, "the second pass below picks the unit's values by a select");
  const uint32_t l = threadIdx.x & 31;
  const bool two = (l & 7) < 7;
  const uint32_t warp = (threadIdx.x - io.skip) / 32, nwarps = (blockDim.x - io.skip) / 32;
  const uint32_t units = (io.len + DEV_LL128_UNIT_DATA - 1) / DEV_LL128_UNIT_DATA;
  TRACE_AT(TRACE_CALLED);
  if (io.send_local && io.out != NULL) { /* this rank's bytes go out first, every unit of the warp's */
    for (uint32_t u = warp; u < units; u += nwarps) {
      const uint32_t at = u * DEV_LL128_UNIT_DATA;
      ll128_send(io.out + 32 * u + l, ll128_gather(io.local + at, io.len - at, l), io.out_flag, two);
    }
    TRACE_AT(TRACE_SENT);
  }
  for (uint32_t u0 = warp; u0 < units; u0 += LL128_BATCH * nwarps) {
    uint4 mine[LL128_BATCH], in[LL128_BATCH];
#pragma unroll
    for (int b = 0; b < LL128_BATCH; b++) {
      const uint32_t u = u0 + b * nwarps; /* u < units: the same in every lane */
      in[b] = u < units && io.in != NULL ? load_line(io.in + 32 * u + l) : make_uint4(0, 0, 0, 0);
    }
    if constexpr (LOADS_FIRST) {
      /* the operand's loads of both units, then their shifts: no branch between the loads, so they are in
       * flight together (a unit past the last, or no operand, loads nothing and reads 0) */
      ll128_raw raw[LL128_BATCH];
#pragma unroll
      for (int b = 0; b < LL128_BATCH; b++) {
        const uint32_t u = u0 + b * nwarps, at = u * DEV_LL128_UNIT_DATA;
        raw[b] = ll128_load(io.local + at, u < units && io.local != NULL ? io.len - at : 0, l);
      }
#pragma unroll
      for (int b = 0; b < LL128_BATCH; b++) mine[b] = ll128_shift(raw[b]);
    }
#pragma unroll
    for (int b = 0; b < LL128_BATCH; b++) {
      const uint32_t u = u0 + b * nwarps, at = u * DEV_LL128_UNIT_DATA, avail = io.len - at;
      if constexpr (!LOADS_FIRST)
        mine[b] =
            u < units && io.local != NULL ? ll128_gather(io.local + at, avail, l) : make_uint4(0, 0, 0, 0);
      if (io.in == NULL)
        in[b] = u < units && io.mem != NULL ? ll128_gather(io.mem + at, avail, l) : make_uint4(0, 0, 0, 0);
    }
    /* one copy of the combine for both units (a loop kept rolled, its operands chosen by select), as every
     * operation and type has its own ll128_lines */
#pragma unroll 1
    for (int b = 0; b < LL128_BATCH; b++) {
      const uint32_t u = u0 + b * nwarps, at = u * DEV_LL128_UNIT_DATA;
      if (u >= units) break;
      const uint4 m = b == 0 ? mine[0] : mine[1];
      uint4 v = b == 0 ? in[0] : in[1];
      if (io.in != NULL) {
        if (u == warp && l == 0) TRACE_AT(TRACE_LINES);
        const ll128_got got = ll128_wait(comm, io.in + 32 * u + l, io.in_flag, what, v);
        if (!got.ok) return false;
        v = got.v;
        if (u == warp && l == 0) TRACE_AT(TRACE_ARRIVED);
      }
      /* a line's last lane combines its flag half too (and never uses it): no branch on the lane */
      const uint2 lo = fn(make_uint2(m.x, m.y), make_uint2(v.x, v.y));
      const uint2 hi = fn(make_uint2(m.z, m.w), make_uint2(v.z, v.w));
      const uint4 r = make_uint4(lo.x, lo.y, hi.x, hi.y);
      if (io.out != NULL && !io.send_local) ll128_send(io.out + 32 * u + l, r, io.out_flag, two);
      if (io.dst != NULL) ll128_scatter(io.dst + at, io.len - at, l, r);
    }
  }
  return true;
}

/* Every thread: fn over a piece's lines in the transfer's protocol (dev_xfer_t.proto). With WIDE (the
 * all-reduce's LL128 entry), an LL128 piece in which a warp combines more than one batch of arriving units
 * runs with the operand's loads first (ll128_lines); the other kernels keep one routine, as the second
 * would cost them registers. */
template <bool WIDE, class F>
__device__ __forceinline__ bool proto_lines(const dev_xfer_t &x, const F fn, const ll_io &io,
                                            const dev_comm_t *comm, const wait_what &what) {
  if (x.proto != DEV_PROTO_LL128) return ll_lines(fn, io, comm, what);
  if (WIDE && io.in != NULL && io.local != NULL &&
      (io.len + DEV_LL128_UNIT_DATA - 1) / DEV_LL128_UNIT_DATA > LL128_BATCH * ((blockDim.x - io.skip) / 32))
    return ll128_lines<F, true>(fn, io, comm, what);
  return ll128_lines<F, false>(fn, io, comm, what);
}

/* Every thread: a piece of transfer x by ll_lines (ll128_lines for an LL128 transfer), with the operation
 * piece_combine would apply: with a second operand, this rank's data and REDUCE, the transfer's combine;
 * without one and with PREPARE, its scaling (PREMULSUM) or division (SUM_POSTDIV at LAST); otherwise a
 * copy. WIDE: proto_lines's, for the combine (the all-reduce's LL128 entry). */
template <bool WIDE = false>
__device__ bool ll_piece(const dev_xfer_t &x, const ll_io &io, const dev_comm_t *comm,
                         const wait_what &what) {
  TRACE_AT(TRACE_PIECE);
  const bool second = io.in != NULL || io.mem != NULL;
  bool ok = true;
  if (second && io.local != NULL && (x.flags & DEV_XF_REDUCE)) {
    with_binary_op(x, [&](auto op, auto n) {
      ok = proto_lines<WIDE>(x, line_op<typename decltype(n)::type, decltype(op)::value>(x), io, comm, what);
    });
    return ok;
  }
  if (!second && (x.flags & DEV_XF_PREPARE) && x.red == DEV_RED_PREMULSUM) {
    with_num<OP_SCALE>(x, [&](auto n) {
      ok = proto_lines<false>(x, line_op<typename decltype(n)::type, OP_SCALE>(x), io, comm, what);
    });
    return ok;
  }
  if (!second && (x.flags & DEV_XF_PREPARE) && x.red == DEV_RED_SUM_POSTDIV && (x.flags & DEV_XF_LAST)) {
    with_num<OP_DIV>(x, [&](auto n) {
      ok = proto_lines<false>(x, line_op<typename decltype(n)::type, OP_DIV>(x), io, comm, what);
    });
    return ok;
  }
  return proto_lines<false>(x, line_copy{second}, io, comm, what);
}

#endif
