/*
 * What the GPU tests share: options and the skip when there are not enough GPUs, CUDA calls that fail the
 * test with the error's name, per-rank memory pools, rank processes that receive a unique id through a pipe,
 * a per-case watchdog, and one collective case checked on device buffers.
 *
 * A case is prepared (its buffers poisoned, with guard bytes around them, and its inputs uploaded), launched
 * (the call through the public API, on the rank's stream) and checked (the stream synchronised, the buffers
 * downloaded, every output element compared with the reference from coll_check.h, every byte the call must
 * not write compared with what was uploaded). The three steps are separate so that one process can drive
 * several ranks inside one ncclGroupStart/End.
 *
 * Every test program takes these options before the names of the cases to run (all when none is named):
 *   --host     run on host memory through the host backend (BRAID_DEVICE=host): no GPU is needed, which
 *              checks the tests themselves on a machine without one;
 *   --gpus N   ranks (GPUs) to use (default 2; fewer GPUs than that is a skip);
 *   --devices D  the ranks share the first D GPUs instead, rank r on GPU r % D (1 <= D <= N): a check of the
 *              kernels on a machine with fewer GPUs than ranks (the data then crosses no link, and the
 *              processes' kernels take turns on a GPU, so it is slow);
 *   --count N  the test's large element count (see each test).
 * With too few GPUs (or none, or no driver) a program prints why and exits with 77, which ctest reports as a
 * skip. NCCL_NVLS_ENABLE=0 is set for every program: NVLink multicast is never used.
 */
#ifndef BRAID_TESTS_CUDA_CASE_H
#define BRAID_TESTS_CUDA_CASE_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "coll_check.h"
#include "nccl.h"

/* Exit status of a skipped test (ctest's SKIP_RETURN_CODE). */
#define CUDA_SKIP 77

/* Options, set by cuda_init. */
extern int cuda_host;          /* --host: host memory and the host backend */
extern int cuda_nranks;        /* --gpus */
extern int cuda_ndevs;         /* --devices: GPUs the ranks share (cuda_nranks unless given) */
extern size_t cuda_count_arg;  /* --count, 0 when not given */
extern const char *cuda_match; /* --match: only the cases whose key (coll_key) holds this text; NULL: all */

/* Parses the options, selects the named cases, and exits with CUDA_SKIP when fewer than --devices (or --gpus)
 * devices are usable. It probes the devices in a child process, so the caller itself has touched no CUDA
 * state and may still fork rank processes. */
void cuda_init(int argc, char **argv);

/* Fails the test when a CUDA runtime call did not return cudaSuccess. */
void cuda_ok(cudaError_t err, const char *call, const char *file, int line);
#define CUDA_OK(call) cuda_ok((call), #call, __FILE__, __LINE__)

/* Fails the test, naming `what` and the library's last error, when an NCCL call did not return ncclSuccess.
 */
void cuda_nccl_ok(ncclResult_t res, const char *call, const char *what, ncclComm_t comm, const char *file,
                  int line);
#define NCCL_OK(call, what, comm) cuda_nccl_ok((call), #call, (what), (comm), __FILE__, __LINE__)

/* ---- A rank's device, stream and memory ---- */

typedef struct {
  int dev;
  cudaStream_t stream; /* NULL on the host backend */
  char *dbase;         /* device pool (host memory with --host) */
  size_t dcap, dused;  /* its size and how much is handed out */
  int dbase_owned;     /* 1: allocated by cuda_rank_open */
  char *hbase;         /* host pool (page-locked on CUDA), for images and downloads */
  size_t hcap, hused;
} cuda_rank_t;

/* The GPU of rank `rank`: rank % cuda_ndevs. */
int cuda_dev_of(int rank);
/* Makes rank `rank`'s GPU current, creates a stream and pools of dcap device bytes (or uses `dbase`, which
 * the caller owns, when it is not NULL) and hcap host bytes. */
void cuda_rank_open(cuda_rank_t *r, int rank, size_t dcap, size_t hcap, void *dbase);
/* Makes the communicators of ranks 0 .. n-1, one per rank of one process: ncclCommInitAll over GPUs 0 .. n-1
 * when every rank has a GPU of its own, else one group of ncclCommInitRank calls, each on its rank's GPU
 * (ncclCommInitAll takes each GPU once). */
ncclResult_t cuda_comm_init_all(ncclComm_t *comms, int n);
void cuda_rank_close(cuda_rank_t *r);
/* Bytes from the pools, 256-aligned; the test fails when a pool is too small (a sizing mistake). */
void *cuda_dalloc(cuda_rank_t *r, size_t bytes);
void *cuda_halloc(cuda_rank_t *r, size_t bytes);
/* Hands all of both pools back (after every case using them is checked). */
void cuda_rank_reset(cuda_rank_t *r);

/* Copies between host and device memory, on r's stream, finished when they return. */
void cuda_upload(cuda_rank_t *r, void *dst, const void *src, size_t bytes);
void cuda_download(cuda_rank_t *r, void *dst, const void *src, size_t bytes);
/* Sets bytes of device memory to `byte`, finished when it returns. */
void cuda_fill(cuda_rank_t *r, void *dst, int byte, size_t bytes);
/* Waits for the stream; a failure names `what`. */
void cuda_sync(cudaStream_t stream, const char *what);
/* 1 when everything on the stream has completed, 0 while work is pending; fails on an error. */
int cuda_stream_done(cudaStream_t stream);

/* ---- Rank processes ---- */

/* Runs fn(rank, nranks, id, arg) in nranks child processes, each with device `rank` current. Rank 0 makes
 * the unique id and passes it to the others through a pipe, so the parent never initialises CUDA (a CUDA
 * context does not survive fork). When a rank fails the others get a few seconds to report, then they are
 * killed; so are all ranks after timeout_s. Returns 0 when every rank exited with 0. */
int cuda_run_ranks(int nranks, int timeout_s,
                   void (*fn)(int rank, int nranks, const ncclUniqueId *id, void *arg), void *arg);

/* ---- Watchdog ---- */

/* From now until cuda_unwatch, a process still inside after `seconds` prints "timed out after N s: <what>"
 * and exits with a failure. */
void cuda_watch(const char *what, int seconds);
void cuda_unwatch(void);

/* ---- One collective case ---- */

typedef struct {
  coll_case_t c;
  const char *mode; /* how the ranks are driven, for messages: "procs", "single", "procs/tcp"... */
  ncclComm_t comm;
  cuda_rank_t *r;
  int rank, nranks;
  coll_layout_t lay;
  size_t es;                    /* bytes per element */
  char *dregion[2], *himage[2]; /* device buffers with their guards, and what was uploaded to them */
  size_t region_bytes[2];       /* [0]: send (or the outer buffer in place), [1]: receive */
  int nregions;                 /* 1 in place */
  void *send, *recv;            /* the pointers the call gets */
  void *scalar;                 /* the PreMulSum scalar (device memory for ncclScalarDevice) */
  unsigned char host_scalar[8]; /* ... or host memory */
  ncclRedOp_t op;
  int op_created;
  char what[320]; /* the case, the mode and the rank, in words */
} cuda_case_t;

/* Allocates, poisons and uploads the case's buffers from r's pools. */
void cuda_case_prepare(cuda_case_t *k, ncclComm_t comm, cuda_rank_t *r, const coll_case_t *c,
                       const char *mode);
/* Issues the call on r's stream; fails the test when it does not return ncclSuccess. */
void cuda_case_launch(cuda_case_t *k);
/* Waits for r's stream and checks every byte of the case's buffers. */
void cuda_case_check(cuda_case_t *k);
/* The three in a row, under a watchdog of timeout_s, then resets r's pools. */
void cuda_case_run(ncclComm_t comm, cuda_rank_t *r, const coll_case_t *c, const char *mode, int timeout_s);

/* Sets (on: 1) or unsets the knobs under which every transfer with a peer of a reduce-scatter, all-gather,
 * broadcast, reduce and all-reduce on two GPU ranks is dealt (device/dev.h, "Dealt transfers"), down to one
 * byte: ring algorithms and the Simple protocol only, BRAID_DEALT_MIN_BYTES=1 without an upper bound, every
 * all-reduce as two steps, nothing on the copy engines or the push kernel. */
void cuda_dealt_env(int on);

/* Runs fn over [0, n) in slices on several threads (one when n is small): fn(lo, hi, arg, slot) with slot <
 * CUDA_MAX_THREADS distinct per thread. */
#define CUDA_MAX_THREADS 16
void cuda_par_for(size_t n, void (*fn)(size_t lo, size_t hi, void *arg, int slot), void *arg);

#endif
