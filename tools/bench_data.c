/*
 * The bench's test data: what each rank sends, what each received element must then hold, and the check.
 *
 * Values are small integers chosen from a hash of (rank, index, seed), so that every sum, product, maximum
 * and premulsum the library computes is exact in every type, in any order of accumulation, and the expected
 * results can be computed in double on the host. Bounds: for reductions at most ACTIVE ranks hold a non-zero
 * (non-one, for prod) value at each index, each in [-2, 2] ([0, 3] unsigned, [-1, 1] for f8e5m2, {-1, 1, 2}
 * for prod), so no partial result exceeds 16 in magnitude: within int8, and exact in f8e4m3 (integers to 16)
 * and f8e5m2 (integers to 8, powers of two beyond). Only avg on floating-point types is inexact (NCCL
 * multiplies by 1/nranks); it is compared with a tolerance.
 *
 * Buffers reach 4 GiB, so filling and checking them is split over threads (data_set_threads): each thread
 * owns a contiguous range of elements, and the caller joins them all before reading the buffer or the count.
 */
#include "bench.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "base/dtype.h"
#include "elem.h"

/* Ranks that contribute to each reduced element (see above). */
#define ACTIVE 4
/* What receive buffers hold before a checked call; no correct result is this large. */
#define POISON 99.0
/* The most threads, and the fewest elements a thread is given. */
#define MAX_THREADS    64
#define MIN_PER_THREAD (1 << 18)

static int nthreads = 1;

void data_set_threads(int n) {
  nthreads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int is_unsigned(ncclDataType_t t) {
  return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}

/* Data for collectives that reduce nothing: any rank, any index; wider values so misplaced blocks show. */
static double moved_value(ncclDataType_t t, uint64_t h) {
  if (is_unsigned(t)) return (double)(h % 33);
  if (t == ncclFloat8e5m2) return (double)(h % 17) - 8;
  return (double)(h % 33) - 16;
}

/* Whether `rank` contributes to reduced element i: one rank in every `stride`, shifting with i. */
static int active(const coll_call_t *c, int rank, size_t i) {
  size_t stride = ((size_t)c->nranks + ACTIVE - 1) / ACTIVE;
  return ((size_t)rank + i + c->seed) % stride == 0;
}

double data_value(const coll_call_t *c, int rank, size_t i) {
  uint64_t h = mix(mix(i ^ ((uint64_t)c->seed << 40)) + (uint64_t)rank);
  if (c->op_kind == BENCH_OP_NONE) return moved_value(c->type, h);
  if (c->op_kind == ncclProd) {
    static const double signed_factors[] = {-1, 1, 2};
    if (!active(c, rank, i)) return 1;
    return is_unsigned(c->type) ? (double)(1 + h % 2) : signed_factors[h % 3];
  }
  if (!active(c, rank, i)) return 0;
  if (is_unsigned(c->type)) return (double)(h % 4);
  if (c->type == ncclFloat8e5m2) return (double)(h % 3) - 1;
  return (double)(h % 5) - 2;
}

double data_reduced(const coll_call_t *c, size_t i) {
  double acc = c->op_kind == ncclProd  ? 1
               : c->op_kind == ncclMax ? -INFINITY
               : c->op_kind == ncclMin ? INFINITY
                                       : 0;
  for (int r = 0; r < c->nranks; r++) {
    double v = data_value(c, r, i);
    switch (c->op_kind) {
    case ncclProd:
      acc *= v;
      break;
    case ncclMax:
      acc = fmax(acc, v);
      break;
    case ncclMin:
      acc = fmin(acc, v);
      break;
    case BENCH_OP_PREMULSUM:
      acc += BENCH_PREMUL_SCALAR * v;
      break;
    default:
      acc += v;
      break;
    }
  }
  if (c->op_kind == ncclAvg) acc = dtype_is_float(c->type) ? acc / c->nranks : trunc(acc / c->nranks);
  return acc;
}

/* The tolerance of a comparison, relative to max(1, |expected|): 0 except for avg on floating point. */
static double tolerance(const coll_call_t *c) {
  if (c->op_kind != ncclAvg || !dtype_is_float(c->type)) return 0;
  /* NCCL scales each input by a rounded 1/nranks and rounds every partial sum: a few units of the last
   * place, which in the 8-bit formats is a sizeable fraction of the small values used here. */
  return 4 * elem_epsilon(c->type);
}

/* One thread's share of a fill, poison or check. */
typedef enum { WORK_FILL, WORK_POISON, WORK_CHECK } work_t;
typedef struct {
  work_t work;
  const coll_t *coll;
  const coll_call_t *call;
  size_t lo, hi;
  size_t wrong; /* WORK_CHECK's result */
} part_t;

static void *run_part(void *arg) {
  part_t *p = arg;
  const coll_call_t *c = p->call;
  if (p->work == WORK_FILL) {
    for (size_t i = p->lo; i < p->hi; i++) elem_set(c->type, c->send, i, data_value(c, c->rank, i));
  } else if (p->work == WORK_POISON) {
    for (size_t i = p->lo; i < p->hi; i++) elem_set(c->type, c->recv, i, POISON);
  } else {
    double tol = tolerance(c);
    for (size_t i = p->lo; i < p->hi; i++) {
      double got = elem_get(c->type, c->recv, i), want = p->coll->expect(c, i);
      if (!(got == want || fabs(got - want) <= tol * fmax(1, fabs(want)))) p->wrong++;
    }
  }
  return NULL;
}

/* Runs `work` over n elements, split over up to nthreads threads (a part whose thread cannot be started runs
 * here). Returns the wrong count of a check. */
static size_t split(work_t work, const coll_t *coll, const coll_call_t *call, size_t n) {
  part_t parts[MAX_THREADS];
  pthread_t tids[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  size_t nparts = n / MIN_PER_THREAD < (size_t)nthreads ? n / MIN_PER_THREAD : (size_t)nthreads;
  if (nparts < 1) nparts = 1;
  for (size_t j = 0; j < nparts; j++) {
    parts[j] =
        (part_t){.work = work, .coll = coll, .call = call, .lo = n * j / nparts, .hi = n * (j + 1) / nparts};
    if (j > 0) started[j] = pthread_create(&tids[j], NULL, run_part, &parts[j]) == 0;
  }
  size_t wrong = 0;
  for (size_t j = 0; j < nparts; j++) {
    if (started[j])
      pthread_join(tids[j], NULL);
    else
      run_part(&parts[j]);
    wrong += parts[j].wrong;
  }
  return wrong;
}

void data_fill(const coll_call_t *c) {
  split(WORK_FILL, NULL, c, c->shape.send_elems);
}

void data_poison(const coll_call_t *c) {
  split(WORK_POISON, NULL, c, c->shape.recv_elems);
}

size_t data_check(const coll_t *coll, const coll_call_t *c) {
  return split(WORK_CHECK, coll, c, c->shape.recv_elems);
}
