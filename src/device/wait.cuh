/*
 * The kernels' waits (general.cuh, ll.cuh and the entry points): loads with a stated memory order, and spin
 * loops that give up on an abort, on another block's error or at the communicator's timeout, recording why in
 * host-mapped memory (dev_error_t) for ncclCommGetAsyncError.
 */
#ifndef BRAID_DEVICE_WAIT_CUH
#define BRAID_DEVICE_WAIT_CUH

#include <stdint.h>

#include "device/dev.h"

/* Spins between two looks at the clock (the timeout), and between two looks at the abort flag and the error
 * word. Those two live in host-mapped memory: each look is a read across PCIe, and in an LL wait every thread
 * of every block spins on a line of its own. With a look every 1,024 spins (a few hundred microseconds), a
 * wait that long sent tens of thousands of reads at once; they slowed the kernel by about as long again, so
 * the peer waited as long in turn, and the two GPUs settled at about 0.5 ms per 256 KiB all-reduce. At 2^16
 * spins a thread looks every few tens of milliseconds, which is all an abort needs. */
#define WAIT_CHECK_SPINS 1024
#define WAIT_HOST_SPINS  (1u << 16)

/* ---- The stream's previous kernel ---- */

/* Every entry point's first statement. A launch may overlap the stream's previous kernel (programmatic
 * dependent launch, BRAID_LAUNCH_PDL): the GPU takes in the launch and places its blocks while that kernel
 * ends, instead of after it. This waits until that kernel has completed and its stores are visible, so that
 * nothing after it reads or writes memory the previous kernel still uses; on a launch without the attribute
 * it returns at once. Before compute capability 9.0 there is no such launch (the host never asks for one). */
__device__ __forceinline__ void after_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* ---- Memory operations with a stated order ---- */

/* A load that later loads and stores of this thread cannot pass, at system scope: what the writer published
 * before the value (a slot's bytes, or the room it freed) is visible after it. */
__device__ __forceinline__ uint64_t load_acquire_sys(const volatile uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t load_acquire_sys32(const volatile uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t load_acquire_gpu(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* A fence of release (and acquire) strength: this thread's earlier loads and stores, and by cumulativity
 * those of other threads it synchronised with (a warp or block barrier), are ordered before its later stores,
 * at system scope (the peer GPU's kernels, the host). A flag stored after it (relaxed, or volatile) publishes
 * them. A publication needs no more; __threadfence_system() is a sequentially consistent fence
 * (fence.sc.sys), which orders more than that, at the same speed. */
__device__ __forceinline__ void fence_acq_rel_sys(void) {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ uint64_t global_timer(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* ---- Errors and waits ---- */

/* Records the launch's first error: the code by compare-and-swap (so one block wins), then the details,
 * then a system fence so the host sees them. A later failure leaves the first one in place. */
__device__ void error_record(const dev_comm_t *comm, int code, int peer, int channel, int is_send,
                             uint64_t seq, uint64_t waited_ns) {
  dev_error_t *e = comm->error;
  if (atomicCAS((int *)&e->code, DEV_OK, code) != DEV_OK) return;
  e->peer = peer;
  e->channel = channel;
  e->is_send = is_send;
  e->seq = seq;
  e->waited_ns = waited_ns;
  __threadfence_system();
}

/* What a wait is for, for its error message. */
struct wait_what {
  int peer, channel, is_send;
  uint64_t seq;
};

/* The state of one spin loop. */
struct spin_t {
  uint64_t spins;
  uint64_t start;
};

/* Counts a spin (the first one starts the clock); every WAIT_CHECK_SPINS it checks the deadline, and every
 * WAIT_HOST_SPINS the abort flag and the error word. Returns true when the wait must end: after recording
 * the error it found, or quietly when another block already recorded one. */
__device__ bool spin_fails(const dev_comm_t *comm, spin_t *s, const wait_what &what) {
  if (s->spins++ == 0) s->start = global_timer();
  if (s->spins % WAIT_CHECK_SPINS != 0) return false;
  uint64_t now = global_timer();
  int code = DEV_OK;
  const bool host = s->spins % WAIT_HOST_SPINS == 0;
  if (host && *comm->abort_flag != 0) {
    code = DEV_ERR_ABORTED;
  } else if (host && comm->error->code != DEV_OK) {
    return true;
  } else if (comm->timeout_ns != 0 && now - s->start > comm->timeout_ns) {
    code = DEV_ERR_TIMEOUT;
  }
  if (code == DEV_OK) return false;
  error_record(comm, code, what.peer, what.channel, what.is_send, what.seq, now - s->start);
  return true;
}

/* Thread 0: waits until the 32-bit word *p, raised by the peer or its stream, is at least `target`, read
 * with acquire order (what was published before it is visible after). The copy-engine path's words: 1 for
 * `ready` and `done`, a reduction's chunks landed for the combine. False when the wait failed (spin_fails).
 */
__device__ bool word_wait_at_least(const dev_comm_t *comm, const uint32_t *p, uint32_t target,
                                   const wait_what &what) {
  spin_t s = {0, 0};
  while (load_acquire_sys32(p) < target)
    if (spin_fails(comm, &s, what)) return false;
  return true;
}

/* Thread 0: waits until *p >= target, then returns the value read with acquire order in *v_p. False when
 * the wait failed (spin_fails). */
__device__ bool wait_at_least(const dev_comm_t *comm, const volatile uint64_t *p, uint64_t target,
                              const wait_what &what, uint64_t *v_p) {
  uint64_t v = load_acquire_sys(p);
  spin_t s = {0, 0};
  while (v < target) {
    if (spin_fails(comm, &s, what)) return false;
    v = load_acquire_sys(p);
  }
  *v_p = v;
  return true;
}

#endif
