/*
 * Probe: how fast two processes that share one GPU can hand a turn to each other, by how each waits for the
 * other (the question behind ranks sharing a GPU: every collective between them is such a hand-over). Two
 * processes on GPU 0 share a word in host memory (mapped into both contexts); in round r, process 0 waits
 * until the word reaches 2r and then stores 2r + 1, process 1 waits for 2r + 1 and stores 2r + 2. Variants:
 *   spin    a one-thread kernel per round that spins on the word, then stores (Braid's kernels wait so);
 *   memop   cuStreamWaitValue32 on the word, then cuStreamWriteValue32: no kernel waits;
 *   kernel  cuStreamWaitValue32 on the word, then a one-thread kernel that stores: a kernel per round, as a
 *           collective's data movement would be, started only once the turn has come;
 *   copy    cuStreamWaitValue32, an 8-byte copy by the copy engine within the process's own device memory,
 *           then cuStreamWriteValue32: copy-engine work per round instead of a kernel;
 *   leader  process 0 as in `kernel`, process 1 as in `memop`: only one process's context runs work on the
 *           GPU's engines, as when one rank would move both ranks' data.
 * A spinning kernel gives up after about 2 s (and counts it); the host gives up on a variant after 40 s.
 * Not part of the build:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o shared_gpu_turns tools/probes/shared_gpu_turns.cu -lcuda
 *   ./shared_gpu_turns
 *
 * Prints, per variant, each process's time per round (the median of 3 runs) and the spins given up so far.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x)                                                                                             \
  do {                                                                                                       \
    int rc_ = (int)(x);                                                                                      \
    if (rc_ != 0) {                                                                                          \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, rc_);                                \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)

struct shared_t {
  alignas(4096) volatile unsigned word;
  volatile unsigned failed;
  volatile int ready[2];
  volatile int go;
};

__global__ void spin_then_store(volatile unsigned *word, volatile unsigned *failed, unsigned want) {
  const long long start = clock64();
  while (*word < want) {
    if (clock64() - start > 2000000000ll * 2) { /* about 2 s at 2 GHz */
      atomicAdd((unsigned *)failed, 1u);
      break;
    }
  }
  __threadfence_system();
  *word = want + 1;
  __threadfence_system();
}

__global__ void store(volatile unsigned *word, unsigned value) {
  __threadfence_system();
  *word = value;
  __threadfence_system();
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* One run of `rounds` hand-overs by process `me`; returns its time per round in µs. */
static double run(shared_t *sh, unsigned *dword, unsigned *dfailed, char *scratch, cudaStream_t s, int me,
                  const char *variant, int rounds, int iter) {
  const int gen = 2 * iter + 1; /* both processes meet at a barrier of this generation first */
  if (me == 0) sh->word = 0;
  __sync_synchronize();
  sh->ready[me] = gen;
  while (sh->ready[0] < gen || sh->ready[1] < gen) usleep(100);
  const double t0 = now_us();
  for (int r = 0; r < rounds; r++) {
    const unsigned want = 2u * r + me;
    if (strcmp(variant, "spin") == 0) {
      spin_then_store<<<1, 1, 0, s>>>((volatile unsigned *)dword, (volatile unsigned *)dfailed, want);
    } else {
      CHECK(cuStreamWaitValue32((CUstream)s, (CUdeviceptr)dword, want, CU_STREAM_WAIT_VALUE_GEQ));
      if (strcmp(variant, "kernel") == 0 || (strcmp(variant, "leader") == 0 && me == 0)) {
        store<<<1, 1, 0, s>>>((volatile unsigned *)dword, want + 1);
        continue;
      }
      if (strcmp(variant, "copy") == 0)
        CHECK(cudaMemcpyAsync(scratch + 8, scratch, 8, cudaMemcpyDeviceToDevice, s));
      CHECK(cuStreamWriteValue32((CUstream)s, (CUdeviceptr)dword, want + 1, CU_STREAM_WRITE_VALUE_DEFAULT));
    }
  }
  CHECK(cudaStreamSynchronize(s));
  const double t = (now_us() - t0) / rounds;
  sh->ready[me] = gen + 1;
  while (sh->ready[0] < gen + 1 || sh->ready[1] < gen + 1) usleep(100);
  return t;
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static shared_t *watched;

/* The host's bound: reports where the hand-over stood, then ends the process. */
static void give_up(int sig) {
  fprintf(stderr, "gave up after 40 s: the word is %u\n", watched->word);
  _exit(2);
}

static void process(shared_t *sh, int me) {
  watched = sh;
  signal(SIGALRM, give_up);
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(0));
  CHECK(cudaHostRegister((void *)sh, sizeof *sh, cudaHostRegisterMapped | cudaHostRegisterPortable));
  unsigned *base;
  CHECK(cudaHostGetDevicePointer((void **)&base, (void *)sh, 0));
  unsigned *dword = base + (offsetof(shared_t, word) / sizeof(unsigned));
  unsigned *dfailed = base + (offsetof(shared_t, failed) / sizeof(unsigned));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char *scratch;
  CHECK(cudaMalloc((void **)&scratch, 64));
  static const char *const variants[] = {"spin", "kernel", "copy", "memop", "leader"};
  int iter = 0;
  for (int v = 0; v < 5; v++) {
    const int rounds = strcmp(variants[v], "spin") == 0 ? 20 : 2000;
    double t[3];
    alarm(40);
    for (int k = 0; k < 3; k++) t[k] = run(sh, dword, dfailed, scratch, s, me, variants[v], rounds, iter++);
    alarm(0);
    qsort(t, 3, sizeof t[0], cmp);
    printf("process %d: %-6s %9.1f us per round (median of 3 runs of %d rounds); spins given up so far: %u\n",
           me, variants[v], t[1], rounds, sh->failed);
    fflush(stdout);
  }
  CHECK(cudaFree(scratch));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaHostUnregister((void *)sh));
}

int main(void) {
  shared_t *sh =
      (shared_t *)mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  memset((void *)sh, 0, sizeof *sh);
  pid_t kids[2];
  for (int me = 0; me < 2; me++) {
    kids[me] = fork();
    if (kids[me] == 0) {
      process(sh, me);
      _exit(0);
    }
  }
  int bad = 0;
  for (int me = 0; me < 2; me++) {
    int st = 0;
    waitpid(kids[me], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return bad;
}
