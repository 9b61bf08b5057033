/*
 * Allocation accounting: sub-accounts charge their parents, the process's totals follow every charge, and
 * BRAID_FAULT_ALLOC fails exactly the allocation it picks with a message naming what and how much.
 *
 * Then the injection at every allocation site in turn: a scenario (init, collectives, suspend and resume, a
 * shrink, destroy) runs on three rank processes with the k-th allocation of one rank failing, for k = 1, 2,
 * ... until the scenario no longer reaches k. Each time the failing rank gets an error whose message names
 * the injected failure, no rank hangs (each run is bounded by the harness), and every rank's accounting is
 * back to zero once its communicators are gone. The same on the CUDA path against the tests' stand-in
 * driver (two ranks), where device and page-locked memory are among the sites.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/alloc.h"
#include "base/param.h"
#include "harness.h"
#include "nccl.h"

static void accounts(void) {
  alloc_acct_t top = {0}, sub = {.parent = &top};
  size_t host0 = mem_process_bytes(0), dev0 = mem_process_bytes(1);
  mem_charge(&sub, 1000, 0, "test host");
  mem_charge(&sub, 300, 1, "test device");
  mem_charge(&top, 50, 0, "test top");
  EXPECT(sub.host_bytes == 1000 && sub.dev_bytes == 300, "sub %zu/%zu", (size_t)sub.host_bytes,
         (size_t)sub.dev_bytes);
  EXPECT(top.host_bytes == 1050 && top.dev_bytes == 300 && top.peak_bytes == 1350, "top %zu/%zu peak %zu",
         (size_t)top.host_bytes, (size_t)top.dev_bytes, (size_t)top.peak_bytes);
  EXPECT(mem_process_bytes(0) == host0 + 1050 && mem_process_bytes(1) == dev0 + 300, "process totals");
  mem_release(&sub, 1000, 0);
  mem_release(&sub, 300, 1);
  mem_release(&top, 50, 0);
  EXPECT(top.host_bytes == 0 && top.dev_bytes == 0 && top.peak_bytes == 1350, "released");
  EXPECT(mem_process_bytes(0) == host0 && mem_process_bytes(1) == dev0, "process totals after release");
}

static void fault_picks_one(void) {
  long base = mem_fault_count();
  char v[32];
  snprintf(v, sizeof v, "%ld", base + 3);
  setenv("BRAID_FAULT_ALLOC", v, 1);
  param_reload();
  alloc_acct_t acct = {0};
  void *p[4] = {0};
  EXPECT_OK(mem_calloc(&acct, 10, 8, "first", &p[0]));
  EXPECT_OK(mem_calloc(&acct, 10, 8, "second", &p[1]));
  EXPECT_RES(mem_calloc(&acct, 7, 3, "the third table", &p[2]), ncclSystemError);
  const char *msg = ncclGetLastError(NULL);
  EXPECT(strstr(msg, "the third table") != NULL && strstr(msg, "21 bytes") != NULL &&
             strstr(msg, "BRAID_FAULT_ALLOC") != NULL,
         "message \"%s\"", msg);
  EXPECT(p[2] == NULL && acct.host_bytes == 160, "a failed allocation was charged or written");
  EXPECT_OK(mem_calloc(&acct, 1, 8, "fourth", &p[3]));
  mem_doing("device rings");
  EXPECT_OK(mem_fault(NULL, 64, 1));
  mem_doing(NULL);
  for (int i = 0; i < 4; i++) mem_free(&acct, p[i], i == 3 ? 8 : 80);
  EXPECT(acct.host_bytes == 0, "left %zu", (size_t)acct.host_bytes);
  unsetenv("BRAID_FAULT_ALLOC");
  param_reload();
}

/* ---- Injection at every site ---- */

#define RESULT_LEN 512
typedef struct {
  ncclUniqueId id;
  int victim;               /* the rank whose allocation fails */
  long k;                   /* which of its allocations */
  int fired;                /* the victim reached its k-th allocation */
  int failed;               /* the victim saw an error */
  char message[RESULT_LEN]; /* the victim's first error */
  size_t left[4][2];        /* each rank's process totals after destroy (host, device) */
} sweep_t;

static sweep_t *sw;

/* The victim's first error. */
static void note_failure(int rank) {
  if (rank != sw->victim || sw->failed) return;
  sw->failed = 1;
  snprintf(sw->message, sizeof sw->message, "%s", ncclGetLastError(NULL));
}

/* One step of the scenario: made only while nothing has failed on this rank, which then leaves for the
 * teardown (as an application would: a failed rank aborts, which ends its peers' waits for it). */
#define STEP(call)                                                                                           \
  do {                                                                                                       \
    if (ok && (call) != ncclSuccess) {                                                                       \
      ok = 0;                                                                                                \
      note_failure(rank);                                                                                    \
    }                                                                                                        \
  } while (0)

static void arm(int rank) {
  char v[32] = "0";
  if (rank == sw->victim) snprintf(v, sizeof v, "%ld", mem_fault_count() + sw->k);
  setenv("BRAID_FAULT_ALLOC", v, 1);
  param_reload();
}

static void scenario_rank(int rank, int n, void *arg) {
  int gpu = arg != NULL;
  arm(rank);
  long start = mem_fault_count();
  /* the stand-in driver never touches buffers; the host backend needs real ones */
  float *buf = gpu ? (float *)(uintptr_t)0x10000000 : calloc(4096, sizeof(float));
  ncclComm_t comm = NULL, child = NULL;
  int ok = 1;
  STEP(ncclCommInitRank(&comm, n, sw->id, rank));
  if (!ok) comm = NULL;
  STEP(ncclAllReduce(buf, buf, 1000, ncclFloat, ncclSum, comm, NULL));
  STEP(ncclAlltoAll(buf, buf + 2048, 100, ncclFloat, comm, NULL));
  STEP(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  STEP(ncclCommResume(comm));
  STEP(ncclAllReduce(buf, buf, 1001, ncclFloat, ncclSum, comm, NULL));
  int gone = n - 1;
  if (rank != gone) STEP(ncclCommShrink(comm, &gone, 1, &child, NULL, NCCL_SHRINK_DEFAULT));
  if (child != NULL) STEP(ncclAllReduce(buf, buf, 999, ncclFloat, ncclSum, child, NULL));
  if (rank == sw->victim) sw->fired = mem_fault_count() - start >= sw->k;
  if (rank == sw->victim && !sw->failed)
    snprintf(sw->message, sizeof sw->message, "%s", ncclGetLastError(NULL));
  if (child != NULL) ncclCommAbort(child);
  if (comm != NULL) ncclCommAbort(comm);
  sw->left[rank][0] = mem_process_bytes(0);
  sw->left[rank][1] = mem_process_bytes(1);
  if (!gpu) free(buf);
}

/* Runs the scenario with the victim's k-th allocation failing, for every k the scenario reaches. */
static void sweep(int nranks, int victim, int gpu) {
  sw = mmap(NULL, sizeof *sw, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(sw != MAP_FAILED, "mmap");
  setenv("BRAID_TIMEOUT_S", "20", 1);
  setenv("BRAID_BOOTSTRAP_TIMEOUT_S", "5", 1); /* a survivor gone from a shrink is waited for this long */
  setenv("BRAID_CONNECT_RETRIES", "5",
         1); /* a peer that failed is gone: its refusal needs no 5 s of retries */
  setenv("BRAID_HOST_BUFFSIZE", "65536", 1);
  int sites = 0;
  for (long k = 1; k < 1000; k++) {
    memset(sw, 0, sizeof *sw);
    sw->victim = victim;
    sw->k = k;
    EXPECT_OK(ncclGetUniqueId(&sw->id));
    /* a hang is a failure: the harness kills ranks still running after 60 s */
    EXPECT(run_ranks(nranks, 60, scenario_rank, gpu ? (void *)sw : NULL) == 0, "k=%ld: a rank failed", k);
    for (int r = 0; r < nranks; r++)
      EXPECT(sw->left[r][0] == 0 && sw->left[r][1] == 0, "k=%ld: rank %d leaks %zu host, %zu device bytes", k,
             r, sw->left[r][0], sw->left[r][1]);
    if (!sw->fired) break;
    sites++;
    /* an optional allocation (the copy engines' words, their mailbox) may fail without failing the
     * scenario, which goes on without it, but the failure is still reported */
    EXPECT(sw->failed || strstr(sw->message, "BRAID_FAULT_ALLOC") != NULL,
           "k=%ld: the failed allocation went unreported", k);
    EXPECT(strstr(sw->message, "BRAID_FAULT_ALLOC") != NULL && strstr(sw->message, "bytes") != NULL &&
               strstr(sw->message, "allocating") != NULL,
           "k=%ld: the error \"%s\" does not say what failed", k, sw->message);
    printf("  k=%ld: %s\n", k, sw->message);
    fflush(stdout);
  }
  EXPECT(sites >= 5, "only %d allocation sites reached", sites);
  printf("  %d allocation sites of rank %d failed in turn\n", sites, victim);
  munmap(sw, sizeof *sw);
}

static void every_site_follower(void) {
  setenv("BRAID_DEVICE", "host", 1);
  sweep(3, 1, 0);
}

static void every_site_leader(void) {
  setenv("BRAID_DEVICE", "host", 1);
  sweep(3, 0, 0);
}

#ifdef BRAID_MOCK_CUDA_DIR
static void every_site_cuda(void) {
  setenv("BRAID_DEVICE", "cuda", 1);
  unsetenv("MOCK_CUDA_STUCK");
  sweep(2, 1, 1);
}
#endif

int main(int argc, char **argv) {
#ifdef BRAID_MOCK_CUDA_DIR
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
#endif
  test_filter(argc - 1, argv + 1);
  TEST(accounts, 10);
  TEST(fault_picks_one, 10);
  TEST(every_site_follower, 300);
  TEST(every_site_leader, 300);
#ifdef BRAID_MOCK_CUDA_DIR
  TEST(every_site_cuda, 300);
#endif
  return test_summary();
}
