/*
 * The floor kernel of `braid bench --floor` (tools/bench_floor.c): the least a collective whose result on
 * every rank depends on every other rank's data must do on the GPU. One block of one warp; thread t stores a
 * 16-byte line holding this launch's number into rank t's page (over the link), then waits until rank t's
 * line in this rank's page holds at least that number. Launch n of every rank therefore ends only after
 * every rank has started launch n: one kernel launch and one crossing of the link each way, at the same
 * time, with no data beyond the line. A collective on the same ranks, launched the same way (eagerly or from
 * a graph, and overlapping the stream's previous kernel where Braid's launches can: bench_floor.c), cannot
 * take less.
 *
 * The launch number is kept in the page itself (launches on one stream run one after the other), so that
 * launches replayed from a graph, whose parameters are fixed at capture, still count up. A wait gives up
 * after args.timeout_ns and records which rank it waited for, so that a broken link fails the bench instead
 * of hanging it; once one has, the launches after it do not wait at all (a batch would otherwise take a
 * timeout per launch before the host sees the error).
 */
#include "floor_args.h"

static __device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static __device__ unsigned long long load_volatile(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

extern "C" __global__ void __launch_bounds__(FLOOR_THREADS)
    braid_floor(const __grid_constant__ floor_args_t a) {
#if __CUDA_ARCH__ >= 900
  /* a launch that overlaps the previous kernel (drv_launch) may start before that one's stores are visible */
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  int t = threadIdx.x;
  unsigned long long n = load_volatile(a.page + FLOOR_COUNT) + 1;
  const bool failed = load_volatile(a.page + FLOOR_ERROR) != 0;
  if (t < a.nranks && t != a.rank && !failed) {
    unsigned long long *line = a.peers[t] + FLOOR_LINE + 2 * a.rank;
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %1};" ::"l"(line), "l"(n) : "memory");
    const unsigned long long *mine = a.page + FLOOR_LINE + 2 * t;
    unsigned long long start = global_ns();
    for (unsigned spins = 1; load_volatile(mine) < n; spins++)
      if (spins % 1024 == 0 && global_ns() - start > a.timeout_ns) {
        a.page[FLOOR_ERROR] = 1 + (unsigned long long)t;
        break;
      }
  }
  __syncwarp();
  if (t == 0) a.page[FLOOR_COUNT] = n;
}

/* The floor of the host's time per call (`braid bench --resources`): a kernel that does nothing, launched
 * eagerly with a parameter block like a library's, so that its host time is the launch's alone. */
extern "C" __global__ void braid_floor_empty(const __grid_constant__ floor_args_t a) {
  (void)a;
}
