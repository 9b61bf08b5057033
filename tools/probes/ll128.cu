/*
 * Probe: what a two-GPU one-shot all-reduce would take with 128-byte lines (120 data bytes and an 8-byte flag
 * at the line's end, each line stored by 8 threads of a warp in one instruction: "LL128") against the LL
 * protocol's 16-byte lines (8 data bytes, two 4-byte flags), and whether the 128-byte lines arrive whole.
 * Both GPUs send their whole operand to the other at once and add what arrives to their own, as Braid's pair
 * entry point runs a two-rank all-reduce: nch sending blocks and nch receiving blocks of 512 threads, one
 * part per channel, each channel a ring of 8 slots in the receiver's memory with a head the receiver stores
 * and the sender reads across the link only when its last reading shows no room. A warp moves 4 lines (480
 * data bytes) per store; the receiving warp loads its lines until the last 16 bytes of each hold the flag.
 *
 * Two modes: timed (kernels captured 100 in a row into a CUDA graph per GPU, both graphs launched together;
 * microseconds per all-reduce, the median of 7 runs after a warm-up), and checked (every received word is
 * compared with what the peer sent, which changes with every launch, so a line taken torn, or stale data
 * taken for new, is counted). One process drives both GPUs; not part of the build:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -o ll128 tools/probes/ll128.cu -lcuda && ./ll128
 *
 * Environment: PROBE_CHECK_ONLY (set: the checked mode alone), PROBE_VMM=1 (the rings in cuMem memory mapped
 * for both GPUs, as Braid allocates them, instead of cudaMalloc), PROBE_OFFSET=N (the rings N bytes past
 * their allocation's start), PROBE_RELOAD=1 (once every flag of a unit has been seen, the warp loads its
 * lines again and takes those), PROBE_DIVERGE=1 (the sender's flag lanes load their data through a call of
 * their own, then the warp meets at a __syncwarp before it stores its lines).
 *
 * On two H200s (2026-11-26): the flags alone are not enough. A warp's load of a line is not one read of it:
 * some builds of this probe counted no wrong word in about 20,000 checked launches, another (the same code
 * with the options above compiled in, all off) 1.4 million in 47 of 68 checked rows. With PROBE_RELOAD=1
 * none, whatever the memory, the offset (0, 384, 4096) or PROBE_DIVERGE. Braid's kernels later showed what
 * most likely made those wrong words: a line stored by a split warp, in several
 * instructions, its flag before its data; this probe does not check that its warps store converged.
 */
#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "probe.h"

enum { NCH = 64, THREADS = 512, SLOTS = 8, SLOT_BYTES = 72 * 1024, ITERS = 100, RUNS = 7 };

struct side {
  char *ring;              /* this GPU's receive rings: NCH * SLOTS slots, in its memory */
  char *peer_ring;         /* the peer's receive rings, mapped */
  volatile uint64_t *head; /* [NCH] this GPU's consumed counts (the peer reads them) */
  volatile uint64_t *peer_head;
  uint64_t *sent, *recvd, *seen; /* [NCH] each, this GPU's own counts */
  const uint32_t *src;           /* this GPU's operand */
  const uint32_t *expect;        /* the peer's operand (checked mode) */
  uint32_t *dst;
  unsigned long long *errors;
  int reload;  /* after every flag of a unit is seen, load its lines once more and take those */
  int diverge; /* the sender's flag lanes load their data through a call of their own (the others inline),
                * then the warp meets at a __syncwarp before its store of the lines */
};

__device__ __forceinline__ void st16(void *p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
__device__ __forceinline__ uint4 ld16(const void *p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

/* Words w .. w + n - 1 (n <= 4) of a part of `words` words, zero past its end. */
__device__ __forceinline__ uint4 load_words(const uint32_t *p, uint32_t w, uint32_t n, uint32_t words) {
  uint32_t v[4] = {0, 0, 0, 0};
  if (n == 4 && w + 4 <= words) return __ldcg((const uint4 *)(p + w));
  if (n == 2 && w + 2 <= words) {
    const uint2 d = __ldcg((const uint2 *)(p + w));
    return make_uint4(d.x, d.y, 0, 0);
  }
  for (uint32_t k = 0; k < n; k++)
    if (w + k < words) v[k] = __ldcg(p + w + k);
  return make_uint4(v[0], v[1], v[2], v[3]);
}

/* The diverging lanes' load (diverge): out of line, so that they branch away from the others. */
__device__ __noinline__ uint4 load_apart(const uint32_t *p, uint32_t w, uint32_t n, uint32_t words) {
  return load_words(p, w, n, words);
}

/* Where lane l of a warp puts its data in a warp's unit: LL128: 4 lines of 128 bytes (480 data bytes, 120
 * words); lanes 8g .. 8g + 6 carry 16 bytes each (data words 4 (7g + j)), lane 8g + 7 carries 8 (words
 * 112 + 2g) and the flag. LL: 32 lines of 16 bytes (256 data bytes, 64 words), lane l words 2l, 2l + 1. */
template <bool BIG> struct fmt {
  static constexpr uint32_t unit_words = BIG ? 120 : 64;
  __device__ static uint32_t word(uint32_t l) {
    return BIG ? ((l & 7) < 7 ? 4 * (7 * (l >> 3) + (l & 7)) : 112 + 2 * (l >> 3)) : 2 * l;
  }
  __device__ static uint32_t nwords(uint32_t l) {
    return BIG ? ((l & 7) < 7 ? 4 : 2) : 2;
  }
  __device__ static uint4 encode(uint4 d, uint32_t l, uint32_t flag) {
    if (!BIG) return make_uint4(d.x, flag, d.y, flag);
    return (l & 7) == 7 ? make_uint4(d.x, d.y, flag, flag) : d;
  }
  __device__ static bool flag_ok(uint4 v, uint32_t l, uint32_t flag) {
    if (!BIG) return v.y == flag && v.w == flag;
    return (l & 7) != 7 || (v.z == flag && v.w == flag);
  }
  __device__ static uint4 decode(uint4 v) {
    return BIG ? v : make_uint4(v.x, v.z, 0, 0);
  }
};

template <bool BIG, bool CHECK, int BATCH>
__global__ void __launch_bounds__(THREADS, 1) pair(side s, uint32_t bytes, uint32_t nch) {
  typedef fmt<BIG> F;
  const bool sender = blockIdx.x < nch;
  const uint32_t c = sender ? blockIdx.x : blockIdx.x - nch;
  const uint32_t part = ((bytes + nch - 1) / nch + 15) / 16 * 16;
  const uint32_t lo = min(c * part, bytes), hi = min(lo + part, bytes), words = (hi - lo) / 4;
  const uint32_t l = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const uint32_t units = (words + F::unit_words - 1) / F::unit_words;
  if (sender) {
    const uint64_t count = s.sent[c];
    if (s.seen[c] + SLOTS <= count) {
      if (threadIdx.x == 0) {
        uint64_t h;
        while ((h = s.peer_head[c]) + SLOTS <= count) {
        }
        s.seen[c] = h;
      }
    }
    __syncthreads();
    const uint32_t flag = (uint32_t)count + 1;
    char *lines = s.peer_ring + ((size_t)c * SLOTS + count % SLOTS) * SLOT_BYTES;
    const uint32_t *src = s.src + lo / 4;
    for (uint32_t u0 = warp; u0 < units; u0 += BATCH * nwarps) {
      uint4 d[BATCH];
#pragma unroll
      for (int b = 0; b < BATCH; b++) {
        const uint32_t u = u0 + b * nwarps;
        if (s.diverge && (l & 7) == 7)
          d[b] = u < units ? load_apart(src, u * F::unit_words + F::word(l), F::nwords(l), words)
                           : make_uint4(0, 0, 0, 0);
        else
          d[b] = u < units ? load_words(src, u * F::unit_words + F::word(l), F::nwords(l), words)
                           : make_uint4(0, 0, 0, 0);
        if (CHECK) d[b] = make_uint4(d[b].x + flag, d[b].y + flag, d[b].z + flag, d[b].w + flag);
      }
      if (s.diverge) __syncwarp();
#pragma unroll
      for (int b = 0; b < BATCH; b++) {
        const uint32_t u = u0 + b * nwarps;
        if (u < units) st16(lines + (size_t)u * 512 + 16 * l, F::encode(d[b], l, flag));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) s.sent[c] = count + 1;
    return;
  }
  const uint64_t count = s.recvd[c];
  const uint32_t flag = (uint32_t)count + 1;
  const char *lines = s.ring + ((size_t)c * SLOTS + count % SLOTS) * SLOT_BYTES;
  const uint32_t *src = s.src + lo / 4;
  uint32_t *dst = s.dst + lo / 4;
  unsigned long long bad = 0;
  for (uint32_t u0 = warp; u0 < units; u0 += BATCH * nwarps) {
    uint4 mine[BATCH], v[BATCH];
    bool ok[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; b++) {
      const uint32_t u = u0 + b * nwarps;
      mine[b] = u < units ? load_words(src, u * F::unit_words + F::word(l), F::nwords(l), words)
                          : make_uint4(0, 0, 0, 0);
      v[b] = u < units ? ld16(lines + (size_t)u * 512 + 16 * l) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < BATCH; b++) {
      const uint32_t u = u0 + b * nwarps;
      if (u >= units) continue; /* warp-uniform */
      for (;;) {
        ok[b] = F::flag_ok(v[b], l, flag);
        if (BIG) ok[b] = __shfl_sync(0xffffffffu, ok[b], l | 7);
        if (!__any_sync(0xffffffffu, !ok[b])) break;
        if (!ok[b]) v[b] = ld16(lines + (size_t)u * 512 + 16 * l);
      }
      if (s.reload) {
        __syncwarp();
        v[b] = ld16(lines + (size_t)u * 512 + 16 * l);
      }
      const uint4 in = F::decode(v[b]);
      const uint32_t w = u * F::unit_words + F::word(l), n = F::nwords(l);
      const uint32_t r[4] = {mine[b].x + in.x, mine[b].y + in.y, mine[b].z + in.z, mine[b].w + in.w};
      const uint32_t got[4] = {in.x, in.y, in.z, in.w};
      if (n == 4 && w + 4 <= words) {
        __stcg((uint4 *)(dst + w), make_uint4(r[0], r[1], r[2], r[3]));
      } else {
        for (uint32_t k = 0; k < n; k++)
          if (w + k < words) dst[w + k] = r[k];
      }
      if (CHECK)
        for (uint32_t k = 0; k < n; k++)
          if (w + k < words && got[k] != s.expect[lo / 4 + w + k] + flag) bad++;
    }
  }
  if (CHECK && bad) atomicAdd(s.errors, bad);
  __syncthreads();
  if (threadIdx.x == 0) {
    s.recvd[c] = count + 1;
    s.head[c] = count + 1;
  }
}

/* A variant: the format, the channels (nch sending blocks and as many receiving) and the units a warp
 * holds at once (batch 2, 4 or 8). */
struct variant {
  bool big;
  uint32_t nch, batch;
};

/* Whether a transfer of `bytes` is one piece per channel of variant v: its part within a slot's data. */
static bool fits(const variant &v, uint32_t bytes) {
  return bytes / v.nch <= (v.big ? 60u : 32u) * 1024;
}

template <bool BIG, bool CHECK>
static void launch(const side &s, uint32_t bytes, uint32_t nch, uint32_t batch, cudaStream_t st) {
  if (batch == 2) pair<BIG, CHECK, 2><<<2 * nch, THREADS, 0, st>>>(s, bytes, nch);
  if (batch == 4) pair<BIG, CHECK, 4><<<2 * nch, THREADS, 0, st>>>(s, bytes, nch);
  if (batch == 8) pair<BIG, CHECK, 8><<<2 * nch, THREADS, 0, st>>>(s, bytes, nch);
}
static void launch(const variant &v, bool check, const side &s, uint32_t bytes, cudaStream_t st) {
  if (v.big)
    check ? launch<true, true>(s, bytes, v.nch, v.batch, st)
          : launch<true, false>(s, bytes, v.nch, v.batch, st);
  else
    check ? launch<false, true>(s, bytes, v.nch, v.batch, st)
          : launch<false, false>(s, bytes, v.nch, v.batch, st);
}

/* The receive rings of GPU d (readable and writable by both GPUs): cudaMalloc, or with PROBE_VMM=1 a cuMem
 * allocation mapped for both, as Braid's are; PROBE_OFFSET bytes past the allocation's start. Zeroed. */
static char *ring_alloc(int d, size_t bytes) {
  const size_t off = getenv("PROBE_OFFSET") != NULL ? strtoull(getenv("PROBE_OFFSET"), NULL, 0) : 0;
  char *p = NULL;
  if (getenv("PROBE_VMM") != NULL && atoi(getenv("PROBE_VMM")) != 0) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d;
    size_t gran = 0;
    DK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const size_t size = (bytes + off + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    DK(cuMemCreate(&h, size, &prop, 0));
    CUdeviceptr va;
    DK(cuMemAddressReserve(&va, size, gran, 0, 0));
    DK(cuMemMap(va, size, 0, h, 0));
    CUmemAccessDesc acc[2] = {};
    for (int k = 0; k < 2; k++) {
      acc[k].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      acc[k].location.id = k;
      acc[k].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    DK(cuMemSetAccess(va, size, acc, 2));
    p = (char *)va;
  } else {
    CK(cudaMalloc(&p, bytes + off));
  }
  CK(cudaMemset(p, 0, bytes + off));
  return p + off;
}

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    printf("needs two GPUs\n");
    return 1;
  }
  const size_t max_bytes = 2u << 20;
  side s[2];
  cudaStream_t st[2];
  std::vector<uint32_t> host[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
    s[d].ring = ring_alloc(d, (size_t)NCH * SLOTS * SLOT_BYTES);
    s[d].reload = getenv("PROBE_RELOAD") != NULL && atoi(getenv("PROBE_RELOAD")) != 0;
    s[d].diverge = getenv("PROBE_DIVERGE") != NULL && atoi(getenv("PROBE_DIVERGE")) != 0;
    uint64_t *w;
    CK(cudaMalloc(&w, 4 * NCH * sizeof(uint64_t)));
    CK(cudaMemset(w, 0, 4 * NCH * sizeof(uint64_t)));
    s[d].head = w;
    s[d].sent = w + NCH;
    s[d].recvd = w + 2 * NCH;
    s[d].seen = w + 3 * NCH;
    uint32_t *buf;
    CK(cudaMalloc(&buf, 3 * max_bytes));
    s[d].src = buf;
    s[d].expect = buf + max_bytes / 4;
    s[d].dst = buf + 2 * max_bytes / 4;
    CK(cudaMalloc(&s[d].errors, sizeof(unsigned long long)));
    CK(cudaMemset(s[d].errors, 0, sizeof(unsigned long long)));
    host[d].resize(max_bytes / 4);
    uint32_t x = 12345u + 777u * d;
    for (auto &v : host[d]) v = (x = x * 1664525u + 1013904223u);
    CK(cudaMemcpy((void *)s[d].src, host[d].data(), max_bytes, cudaMemcpyHostToDevice));
  }
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    s[d].peer_ring = s[1 - d].ring;
    s[d].peer_head = s[1 - d].head;
    CK(cudaMemcpy((void *)s[d].expect, host[1 - d].data(), max_bytes, cudaMemcpyHostToDevice));
  }

  const variant vs[] = {{false, 32, 4}, {true, 32, 4}, {true, 32, 8}, {true, 48, 4},
                        {true, 64, 2},  {true, 64, 4}, {true, 32, 2}};
  enum { nv = sizeof(vs) / sizeof(vs[0]) };
  /* Checked: every size, every variant, 300 launches each. */
  const uint32_t checked[] = {4, 1024, 4100, 65536, 262144 + 52, 524288, 1000004, 1048576, 1572864, 1966080};
  for (const variant &v : vs)
    for (uint32_t bytes : checked) {
      if (!fits(v, bytes)) continue;
      for (int it = 0; it < 300; it++)
        for (int d = 0; d < 2; d++) {
          CK(cudaSetDevice(d));
          launch(v, true, s[d], bytes, st[d]);
        }
      unsigned long long errs = 0, e;
      for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaStreamSynchronize(st[d]));
        CK(cudaMemcpy(&e, s[d].errors, sizeof(e), cudaMemcpyDeviceToHost));
        CK(cudaMemset(s[d].errors, 0, sizeof(e)));
        errs += e;
      }
      printf("check %-5s %2u ch, batch %u, %8u B: %llu wrong words\n", v.big ? "LL128" : "LL", v.nch, v.batch,
             bytes, errs);
    }

  if (getenv("PROBE_CHECK_ONLY") != NULL) return 0;
  /* Timed: graphs of ITERS launches per GPU, both launched back to back, each timed by its events. */
  const uint32_t timed[] = {65536,  131072,  262144,  393216,  524288,
                            786432, 1048576, 1572864, 1966080, 2097152};
  printf("us per all-reduce, median of %d runs of %d, GPU0/GPU1; variants:\n", RUNS, ITERS);
  for (const variant &v : vs) printf("  %s %u ch batch %u\n", v.big ? "LL128" : "LL", v.nch, v.batch);
  for (uint32_t bytes : timed) {
    double med[nv][2] = {};
    for (int k = 0; k < nv; k++) {
      const variant &v = vs[k];
      if (!fits(v, bytes)) continue;
      cudaGraphExec_t ge[2];
      cudaEvent_t ev[2][2];
      for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st[d], cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < ITERS; i++) launch(v, false, s[d], bytes, st[d]);
        CK(cudaStreamEndCapture(st[d], &g));
        CK(cudaGraphInstantiate(&ge[d], g, 0));
        CK(cudaGraphDestroy(g));
        CK(cudaEventCreate(&ev[d][0]));
        CK(cudaEventCreate(&ev[d][1]));
      }
      std::vector<float> t[2];
      for (int r = 0; r < RUNS + 2; r++) {
        for (int d = 0; d < 2; d++) {
          CK(cudaSetDevice(d));
          CK(cudaEventRecord(ev[d][0], st[d]));
          CK(cudaGraphLaunch(ge[d], st[d]));
          CK(cudaEventRecord(ev[d][1], st[d]));
        }
        for (int d = 0; d < 2; d++) {
          CK(cudaSetDevice(d));
          CK(cudaStreamSynchronize(st[d]));
          float ms;
          CK(cudaEventElapsedTime(&ms, ev[d][0], ev[d][1]));
          if (r >= 2) t[d].push_back(ms * 1000.0f / ITERS);
        }
      }
      for (int d = 0; d < 2; d++) {
        std::sort(t[d].begin(), t[d].end());
        med[k][d] = t[d][RUNS / 2];
        CK(cudaSetDevice(d));
        CK(cudaGraphExecDestroy(ge[d]));
        CK(cudaEventDestroy(ev[d][0]));
        CK(cudaEventDestroy(ev[d][1]));
      }
    }
    printf("%8u", bytes);
    for (int k = 0; k < nv; k++) printf(" %5.2f/%5.2f", med[k][0], med[k][1]);
    printf("\n");
  }
  return 0;
}
