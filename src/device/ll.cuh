/*
 * The LL protocol's lines (dev.h), as each thread of a block moves its own: a 16-byte line holds 8 data bytes
 * and two copies of the piece's flag, stored in one access and waited for on the line itself. The general
 * kernel's LL path (kernels.cu) and the LL entry point both move pieces through ll_lines, which reads this
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

/* Every thread: a piece of transfer x by ll_lines, with the operation piece_combine would apply: with a
 * second operand, this rank's data and REDUCE, the transfer's combine; without one and with PREPARE, its
 * scaling (PREMULSUM) or division (SUM_POSTDIV at LAST); otherwise a copy. */
__device__ bool ll_piece(const dev_xfer_t &x, const ll_io &io, const dev_comm_t *comm,
                         const wait_what &what) {
  TRACE_AT(TRACE_PIECE);
  const bool second = io.in != NULL || io.mem != NULL;
  bool ok = true;
  if (second && io.local != NULL && (x.flags & DEV_XF_REDUCE)) {
    with_binary_op(x, [&](auto op, auto n) {
      ok = ll_lines(line_op<typename decltype(n)::type, decltype(op)::value>(x), io, comm, what);
    });
    return ok;
  }
  if (!second && (x.flags & DEV_XF_PREPARE) && x.red == DEV_RED_PREMULSUM) {
    with_num<OP_SCALE>(
        x, [&](auto n) { ok = ll_lines(line_op<typename decltype(n)::type, OP_SCALE>(x), io, comm, what); });
    return ok;
  }
  if (!second && (x.flags & DEV_XF_PREPARE) && x.red == DEV_RED_SUM_POSTDIV && (x.flags & DEV_XF_LAST)) {
    with_num<OP_DIV>(
        x, [&](auto n) { ok = ll_lines(line_op<typename decltype(n)::type, OP_DIV>(x), io, comm, what); });
    return ok;
  }
  return ll_lines(line_copy{second}, io, comm, what);
}

#endif
