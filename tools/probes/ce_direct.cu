/*
 * Probe: copy-engine transfers between two processes, one GPU each, straight into the peer's own buffer,
 * ordered by stream memory operations alone (no kernel, no host round trip per call). The feasibility
 * questions for a copy-engine path in the library:
 *   - does a legacy IPC handle of a cudaMalloc buffer, opened in the peer process, take copy-engine copies
 *     at the link's speed;
 *   - do cuStreamWriteValue32 into the peer's memory (an opened handle) and cuStreamWaitValue32 on local
 *     memory order the copies across processes;
 *   - what a call costs on top of the copy (the handshake), eagerly and replayed from a CUDA graph, given
 *     that every flag returns to 0 after each call.
 * Per call, on each rank's one stream (both ways at once, as an all-gather; -1 for one way, rank 0 to 1):
 *   receiver: write 1 into the sender's `ready` word;
 *   sender:   wait for its own `ready` == 1, write 0 there, copy into the peer's buffer, write 1 into the
 *             peer's `done` word;
 *   receiver: wait for its own `done` == 1, write 0 there.
 * Not part of the build; the program forks its second rank before either touches CUDA:
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 -o ce_direct tools/probes/ce_direct.cu -lcuda && ./ce_direct [-1]
 *
 * Prints, per size: the time per call (events on rank 0's stream over 20 calls, median of 5), GB/s, the same
 * for 20 calls captured in a graph and replayed, and whether every byte arrived.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "probe.h"

static const size_t kMax = 1ull << 30;

/* The socket to the other rank: exact-size reads and writes, and a barrier. */
static void xfer(int fd, void *buf, size_t n, bool send) {
  char *p = (char *)buf;
  while (n > 0) {
    ssize_t k = send ? write(fd, p, n) : read(fd, p, n);
    if (k <= 0) {
      printf("rank %d: the socket to the other rank closed\n", probe_rank);
      exit(1);
    }
    p += k;
    n -= (size_t)k;
  }
}

static void barrier(int fd) {
  char c = 0;
  xfer(fd, &c, 1, true);
  xfer(fd, &c, 1, false);
}

/* Everything one rank holds: its buffers and flag words, and the peer's opened through IPC handles. */
struct Rank {
  char *src, *dst; /* local: what it sends, where it receives */
  unsigned *flags; /* local: [0] ready (a receiver raises it here), [1] done (a sender raises it here) */
  char *peer_dst;  /* the peer's dst */
  unsigned *peer_flags;
  cudaStream_t s;
};

/* One call on this rank's stream; the first failure, or CUDA_SUCCESS. */
static CUresult call(const Rank &r, size_t bytes, bool sends, bool recvs) {
  CUresult e = CUDA_SUCCESS;
  if (recvs && e == CUDA_SUCCESS) e = cuStreamWriteValue32(r.s, (CUdeviceptr)&r.peer_flags[0], 1, 0);
  if (sends && e == CUDA_SUCCESS)
    e = cuStreamWaitValue32(r.s, (CUdeviceptr)&r.flags[0], 1, CU_STREAM_WAIT_VALUE_EQ);
  if (sends && e == CUDA_SUCCESS) e = cuStreamWriteValue32(r.s, (CUdeviceptr)&r.flags[0], 0, 0);
  if (sends && e == CUDA_SUCCESS)
    e = cudaMemcpyAsync(r.peer_dst, r.src, bytes, cudaMemcpyDeviceToDevice, r.s) == cudaSuccess
            ? CUDA_SUCCESS
            : CUDA_ERROR_UNKNOWN;
  if (sends && e == CUDA_SUCCESS) e = cuStreamWriteValue32(r.s, (CUdeviceptr)&r.peer_flags[1], 1, 0);
  if (recvs && e == CUDA_SUCCESS)
    e = cuStreamWaitValue32(r.s, (CUdeviceptr)&r.flags[1], 1, CU_STREAM_WAIT_VALUE_EQ);
  if (recvs && e == CUDA_SUCCESS) e = cuStreamWriteValue32(r.s, (CUdeviceptr)&r.flags[1], 0, 0);
  return e;
}

/* Whether dst holds the peer's pattern for this size in its first and last MiB. */
static bool arrived(const Rank &r, size_t bytes, int peer) {
  std::vector<unsigned char> h(std::min<size_t>(bytes, 1 << 20));
  bool ok = true;
  for (size_t at : {(size_t)0, bytes - h.size()}) {
    CK(cudaMemcpy(h.data(), r.dst + at, h.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); i++) ok = ok && h[i] == (unsigned char)(peer * 16 + (bytes % 13) + 1);
  }
  return ok;
}

static int run(int rank, int fd, bool both) {
  probe_rank = rank;
  alarm(300); /* a stream that waits forever (the flags never arrive) ends the probe */
  const int peer = 1 - rank;
  const bool sends = both || rank == 0, recvs = both || rank == 1;
  Rank r;
  CK(cudaSetDevice(rank));
  CK(cudaMalloc(&r.src, kMax));
  CK(cudaMalloc(&r.dst, kMax));
  CK(cudaMalloc(&r.flags, 2 * sizeof(unsigned)));
  CK(cudaMemset(r.flags, 0, 2 * sizeof(unsigned)));
  CK(cudaStreamCreateWithFlags(&r.s, cudaStreamNonBlocking));
  cudaIpcMemHandle_t mine[2], theirs[2];
  CK(cudaIpcGetMemHandle(&mine[0], r.dst));
  CK(cudaIpcGetMemHandle(&mine[1], r.flags));
  xfer(fd, mine, sizeof mine, true);
  xfer(fd, theirs, sizeof theirs, false);
  CK(cudaIpcOpenMemHandle((void **)&r.peer_dst, theirs[0], cudaIpcMemLazyEnablePeerAccess));
  CK(cudaIpcOpenMemHandle((void **)&r.peer_flags, theirs[1], cudaIpcMemLazyEnablePeerAccess));
  CK(cudaDeviceSynchronize());
  barrier(fd);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int calls = 20, reps = 5;
  if (rank == 0)
    printf("%s; time per call (us) and GB/s, eager | graph replay\n", both ? "both ways" : "one way");
  for (size_t bytes = 8; bytes <= kMax; bytes *= 4) {
    CK(cudaMemset(r.src, rank * 16 + (int)(bytes % 13) + 1, bytes));
    CK(cudaMemset(r.dst, 0xee, bytes));
    CK(cudaDeviceSynchronize());
    float us[2];
    bool ok[2];
    for (int mode = 0; mode < 2; mode++) {
      cudaGraphExec_t exec = nullptr;
      if (mode == 1) { /* a rank that cannot capture says so, and both skip the graph at this size */
        cudaGraph_t g = nullptr;
        CUresult e = CUDA_SUCCESS;
        CK(cudaStreamBeginCapture(r.s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < calls && e == CUDA_SUCCESS; i++) e = call(r, bytes, sends, recvs);
        cudaError_t end = cudaStreamEndCapture(r.s, &g);
        int can = e == CUDA_SUCCESS && end == cudaSuccess && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess;
        if (g != nullptr) CK(cudaGraphDestroy(g));
        cudaGetLastError();
        int peer_can = 0;
        xfer(fd, &can, sizeof can, true);
        xfer(fd, &peer_can, sizeof peer_can, false);
        if (!can) {
          const char *s = "?";
          cuGetErrorString(e, &s);
          printf("rank %d: capturing stream memory operations failed (%s, end: %s)\n", rank, s,
                 cudaGetErrorString(end));
        }
        if (!can || !peer_can) {
          if (exec != nullptr) CK(cudaGraphExecDestroy(exec));
          us[1] = 0;
          ok[1] = false;
          continue;
        }
      }
      std::vector<float> t;
      for (int k = 0; k < reps + 1; k++) {
        barrier(fd);
        CK(cudaEventRecord(e0, r.s));
        if (mode == 0)
          for (int i = 0; i < calls; i++) DK(call(r, bytes, sends, recvs));
        else
          CK(cudaGraphLaunch(exec, r.s));
        CK(cudaEventRecord(e1, r.s));
        CK(cudaStreamSynchronize(r.s));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (k > 0) t.push_back(ms * 1e3f / calls);
      }
      std::sort(t.begin(), t.end());
      us[mode] = t[t.size() / 2];
      ok[mode] = !recvs || arrived(r, bytes, peer);
      if (exec != nullptr) CK(cudaGraphExecDestroy(exec));
      CK(cudaMemset(r.dst, 0xee, bytes));
      CK(cudaDeviceSynchronize());
    }
    unsigned f[2];
    CK(cudaMemcpy(f, r.flags, sizeof f, cudaMemcpyDeviceToHost));
    barrier(fd);
    if (rank == 0 || recvs) {
      char graph[64] = "not captured";
      if (us[1] > 0)
        snprintf(graph, sizeof graph, "%9.2f us %7.1f GB/s%s", us[1], bytes / us[1] / 1e3,
                 ok[1] ? "" : " WRONG");
      printf("rank %d %10zu B: %9.2f us %7.1f GB/s%s | %s | flags %u %u\n", rank, bytes, us[0],
             bytes / us[0] / 1e3, ok[0] ? "" : " WRONG", graph, f[0], f[1]);
    }
    fflush(stdout);
    barrier(fd);
  }
  CK(cudaIpcCloseMemHandle(r.peer_dst));
  CK(cudaIpcCloseMemHandle(r.peer_flags));
  return 0;
}

int main(int argc, char **argv) {
  const bool both = !(argc > 1 && strcmp(argv[1], "-1") == 0);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  pid_t child = fork(); /* before either process touches CUDA */
  if (child < 0) return 1;
  if (child == 0) {
    close(sv[0]);
    return run(1, sv[1], both);
  }
  close(sv[1]);
  int res = run(0, sv[0], both);
  int status = 0;
  waitpid(child, &status, 0);
  return res != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
