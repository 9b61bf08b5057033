/*
 * What the GPU executor's tests share (test_gpu_exec.c, test_gpu_work.c, test_ce.c): rank processes with
 * their logs, and what the stand-in driver (tests/gpu/mock_cuda.h) saw of the last launch. Only they
 * include it.
 */
#ifndef BRAID_TESTS_CORE_GX_MOCK_H
#define BRAID_TESTS_CORE_GX_MOCK_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "device/dev.h"
#include "harness.h"
#include "nccl.h"
#include "../gpu/mock_cuda.h"

typedef struct {
  ncclUniqueId id;
  char log_dir[64];
} shared_t;

/* Sends this rank process's log to rank<rank>.log in the shared folder, whose name lands in path. */
static inline void rank_log(const shared_t *sh, int rank, char *path, size_t size) {
  snprintf(path, size, "%s/rank%d.log", sh->log_dir, rank);
  setenv("NCCL_DEBUG_FILE", path, 1);
  param_reload();
  log_init();
}

/* Runs fn on two rank processes that log into a fresh folder (rank_log), removed afterwards. */
static inline void run_with_logs(void (*fn)(int rank, int nranks, void *arg), int timeout_s) {
  shared_t sh;
  snprintf(sh.log_dir, sizeof sh.log_dir, "/tmp/braid-test-launch-XXXXXX");
  EXPECT(mkdtemp(sh.log_dir) != NULL);
  EXPECT_OK(ncclGetUniqueId(&sh.id));
  EXPECT(run_ranks(2, timeout_s, fn, &sh) == 0, "a rank failed");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", sh.log_dir);
  EXPECT(system(cmd) == 0);
}

/* Runs fn in one process (rank 0 of 1) that logs into a fresh folder, removed afterwards. */
static inline void run_one_process(void (*fn)(int rank, int nranks, void *arg), int timeout_s) {
  shared_t sh;
  snprintf(sh.log_dir, sizeof sh.log_dir, "/tmp/braid-test-launch-XXXXXX");
  EXPECT(mkdtemp(sh.log_dir) != NULL);
  EXPECT(run_ranks(1, timeout_s, fn, &sh) == 0, "the process failed");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", sh.log_dir);
  EXPECT(system(cmd) == 0);
}

/* A symbol of the loaded stand-in driver (tests/gpu/mock_cuda.h). */
static inline void *mock_sym(const char *name) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *s = lib != NULL ? dlsym(lib, name) : NULL;
  EXPECT(s != NULL, "the loaded libcuda.so.1 is not the stand-in driver");
  return s;
}

/* The stand-in driver's record of what it saw. */
static inline mock_cuda_stats_t *mock_stats(void) {
  return mock_sym("mock_cuda_stats");
}

/* The transfers of the last launch (at most DEV_MAX_XFERS; none when spilled): the work's list, or a pair
 * launch's send, receive and copy. */
static inline int last_xfers(const mock_cuda_stats_t *s, dev_xfer_t *out) {
  if (s->last_pair) {
    const dev_pair_t *p = (const dev_pair_t *)s->last_work;
    int n = 0;
    if (p->send.nch > 0) out[n++] = p->send;
    if (p->recv.nch > 0) out[n++] = p->recv;
    if (p->copy.nch > 0) out[n++] = p->copy;
    return n;
  }
  const dev_work_t *w = (const dev_work_t *)s->last_work;
  if (w->ext != NULL) return 0;
  memcpy(out, w->xfers, (size_t)w->nxfers * sizeof *out);
  return w->nxfers;
}

/* Whether every transfer of the last launch is (ll = 1) or is not (ll = 0) marked LL, an LL one on `nch`
 * channels, with each side that has a peer marked LL too (the stand-in's p2p connections all have LL rings)
 * or neither side; its transfer count in *n. */
static inline int last_launch_ll(const mock_cuda_stats_t *s, int ll, int nch, int *n) {
  static dev_xfer_t xs[DEV_MAX_XFERS];
  *n = last_xfers(s, xs);
  for (int i = 0; i < *n; i++) {
    const dev_xfer_t *x = &xs[i];
    int marked = (x->flags & DEV_XF_LL) != 0;
    if (marked != ll || (ll && x->nch != nch)) return 0;
    if (((x->flags & DEV_XF_LL_SEND) != 0) != (ll && x->send_peer >= 0)) return 0;
    if (((x->flags & DEV_XF_LL_RECV) != 0) != (ll && x->recv_peer >= 0)) return 0;
  }
  return *n > 0;
}

/* Whether every transfer of the last launch has a peer and is marked LL with the LL128 protocol on `nch`
 * channels, each side with a peer marked LL; its transfer count in *n. */
static inline int last_launch_ll128(const mock_cuda_stats_t *s, int nch, int *n) {
  static dev_xfer_t xs[DEV_MAX_XFERS];
  *n = last_xfers(s, xs);
  for (int i = 0; i < *n; i++) {
    const dev_xfer_t *x = &xs[i];
    if (!(x->flags & DEV_XF_LL) || x->proto != DEV_PROTO_LL128 || x->nch != nch) return 0;
    if (x->send_peer < 0 && x->recv_peer < 0) return 0;
    if (((x->flags & DEV_XF_LL_SEND) != 0) != (x->send_peer >= 0)) return 0;
    if (((x->flags & DEV_XF_LL_RECV) != 0) != (x->recv_peer >= 0)) return 0;
  }
  return *n > 0;
}

/* The entry point of the last launch: 'p' (pair), 'l' (LL), 'b' (bulk), 's' (small) or 'f' (full). */
static inline char last_entry(const mock_cuda_stats_t *s) {
  return s->last_pair ? 'p' : s->last_ll ? 'l' : s->last_bulk ? 'b' : s->last_small ? 's' : 'f';
}

/* A group of `calls` sends from `buf` and as many receives into `out` of `count` floats each, to and from
 * `peer`. */
static inline void send_recv_group(void *buf, void *out, size_t count, int calls, int peer, ncclComm_t comm) {
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < calls; i++) {
    EXPECT_OK(ncclSend(buf, count, ncclFloat, peer, comm, NULL));
    EXPECT_OK(ncclRecv(out, count, ncclFloat, peer, comm, NULL));
  }
  EXPECT_OK(ncclGroupEnd());
}

/* The cap on Simple batches the last launch passed its kernel (dev_comm_t.batch_pieces). */
static inline int last_batch(const mock_cuda_stats_t *s) {
  return ((const dev_work_t *)s->last_work)->comm.batch_pieces;
}

/* Destroys the stand-in driver's one graph (mock_cuda.h); how many user objects it held. */
static inline int mock_graph_destroy(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *sym = lib != NULL ? dlsym(lib, MOCK_CUDA_GRAPH_DESTROY) : NULL;
  EXPECT(sym != NULL, "the stand-in driver exports no %s", MOCK_CUDA_GRAPH_DESTROY);
  mock_cuda_graph_destroy_fn destroy;
  memcpy(&destroy, &sym, sizeof sym);
  return destroy();
}

/* A communicator of the rank process whose log (TUNING at INFO) goes to the file named in path. */
static inline ncclComm_t tuning_comm(const shared_t *sh, int rank, int nranks, char *path, size_t size) {
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  rank_log(sh, rank, path, size);
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  return comm;
}

/* What the aborting thread needs: the communicator, and the log in which the WARN of the full queue shows. */
typedef struct {
  ncclComm_t comm;
  const char *log_path;
} aborter_t;

#endif
