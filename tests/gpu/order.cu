/*
 * The kernels of test_cuda_order: a user's kernels around a collective on one stream. The round number lives
 * in device memory (so that a graph replays new values): `order_fill` writes the round's input, `order_check`
 * counts the output elements that are not the sum of both ranks' inputs of the round, `order_next` counts the
 * round up. `order_fill` lets the stream's next launch start early (griddepcontrol.launch_dependents, as
 * kernels written for programmatic dependent launch do) and then busy-waits before it writes: a kernel
 * launched after it that overlaps it and reads the input before waiting for it reads the round before's.
 * `order_copy` is such a kernel when `wait` is 0 (the test's control: it shows that the test sees such a
 * read), and a correct one when `wait` is 1.
 */
#include <stdint.h>

/* Rank `rank`'s input element i in round `round`: an integer below 2048, so sums of two are exact. */
static __device__ float order_value(uint64_t i, uint32_t round, int rank) {
  return (float)(((uint32_t)(i * 2654435761ull) + round * 2u + (uint32_t)rank) % 2048u);
}

static __device__ uint64_t order_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static __device__ void order_wait_previous() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

extern "C" __global__ void order_fill(float *buf, uint64_t n, const uint32_t *round, int rank,
                                      uint64_t spin_ns) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const uint32_t r = *(volatile const uint32_t *)round;
  const uint64_t start = order_now();
  while (order_now() - start < spin_ns) {
  }
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    buf[i] = order_value(i, r, rank);
}

extern "C" __global__ void order_check(const float *out, uint64_t n, const uint32_t *round, uint32_t *bad) {
  const uint32_t r = *(volatile const uint32_t *)round;
  uint32_t wrong = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    wrong += out[i] != order_value(i, r, 0) + order_value(i, r, 1);
  if (wrong != 0) atomicAdd(bad, wrong);
}

extern "C" __global__ void order_next(uint32_t *round) {
  *round += 1;
}

extern "C" __global__ void order_copy(const float *src, float *dst, uint64_t n, int wait) {
  if (wait) order_wait_previous();
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

/* Counts the elements of a copy of rank `rank`'s input that are not the round's. */
extern "C" __global__ void order_check_copy(const float *copy, uint64_t n, const uint32_t *round, int rank,
                                            uint32_t *bad) {
  const uint32_t r = *(volatile const uint32_t *)round;
  uint32_t wrong = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    wrong += copy[i] != order_value(i, r, rank);
  if (wrong != 0) atomicAdd(bad, wrong);
}
