/*
 * A stand-in network plugin for the tests: Braid's TCP network (net_tcp.c) exported as version 11 under the
 * name "Fake", misbehaving in the ways the plugin interface allows, as BRAID_FAKE_NET picks (comma list):
 *   init_fails        init returns an error
 *   no_devices        devices reports none
 *   slow_accept       accept gives nothing for its first 40 calls per listen, sleeping 5 ms in each
 *   blocking_connect  connect does not return until the peer's accept has taken the connection (up to 60 s)
 *   sizes_unset       test never writes the size
 *   partial           isend/irecv refuse every other call (NULL request); test says "not done" twice first
 *   fail_after=N      once a send comm has sent N bytes, its isend and test fail (ncclSystemError)
 *   cuda              says it takes GPU memory too (NCCL_PTR_CUDA; "GPU memory" is host memory here), and
 *                     iflush gives a request that finishes at its second test; fake_net_flushes counts them
 * Built with FAKE_NET_OLD it exports only an ncclNetPlugin_v5 symbol, which no supported version reads.
 */
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/net_abi.h"
#include "transport/net_tcp.h"

#define PUBLIC __attribute__((visibility("default")))

#ifdef FAKE_NET_OLD
/* Only the symbol matters: a loader must refuse it by name. */
PUBLIC const char ncclNetPlugin_v5[64] = "an old plugin table";
#else

/* A comm and what the faults count on it. */
typedef struct {
  void *inner; /* the TCP network's comm */
  int is_send; /* 1: a send comm */
  size_t sent; /* bytes handed to isend */
  int calls;   /* isend/irecv calls so far */
  int accepts; /* listen comms: accept calls so far */
} fake_comm_t;

/* A request and how often it was tested. */
typedef struct {
  fake_comm_t *comm;
  void *inner; /* NULL: a flush */
  int tests;
} fake_req_t;

/* Flushes finished (cuda), for the tests to read through dlsym. */
PUBLIC _Atomic int fake_net_flushes;

static int has(const char *fault) {
  const char *v = getenv("BRAID_FAKE_NET");
  return v != NULL && strstr(v, fault) != NULL;
}

static size_t fail_after(void) {
  const char *v = getenv("BRAID_FAKE_NET"), *at = v != NULL ? strstr(v, "fail_after=") : NULL;
  return at != NULL ? (size_t)strtoull(at + strlen("fail_after="), NULL, 10) : SIZE_MAX;
}

static fake_comm_t *wrap(void *inner, int is_send) {
  fake_comm_t *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->inner = inner;
  c->is_send = is_send;
  return c;
}

static ncclResult_t fake_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_t *config,
                              ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) {
  if (has("init_fails")) return ncclSystemError;
  tp_tcp_set_warn_errors(1);
  return tp_tcp_init(ctx, comm_id, config, logger, profiler);
}

static ncclResult_t fake_devices(int *ndev) {
  if (has("no_devices")) {
    *ndev = 0;
    return ncclSuccess;
  }
  return tp_tcp_devices(ndev);
}

static ncclResult_t fake_listen(void *ctx, int dev, void *handle, void **listen_comm) {
  void *inner;
  ncclResult_t res = tp_tcp_listen(ctx, dev, handle, &inner);
  if (res != ncclSuccess) return res;
  *listen_comm = wrap(inner, 0);
  return *listen_comm != NULL ? ncclSuccess : ncclSystemError;
}

/* blocking_connect: waits for the acceptor's one-byte acknowledgement. */
static ncclResult_t wait_accepted(void *inner) {
  struct pollfd p = {.fd = tp_tcp_comm_fd(inner), .events = POLLIN};
  char ack;
  if (poll(&p, 1, 60000) != 1 || recv(p.fd, &ack, 1, 0) != 1) return ncclRemoteError;
  return ncclSuccess;
}

static ncclResult_t fake_connect(void *ctx, int dev, void *handle, void **send_comm,
                                 ncclNetDeviceHandle_t **send_dev) {
  void *inner = NULL;
  *send_comm = NULL;
  do {
    ncclResult_t res = tp_tcp_connect(ctx, dev, handle, &inner, send_dev);
    if (res != ncclSuccess) return res;
    if (inner == NULL && has("blocking_connect")) usleep(1000);
  } while (inner == NULL && has("blocking_connect"));
  if (inner == NULL) return ncclSuccess;
  if (has("blocking_connect") && wait_accepted(inner) != ncclSuccess) {
    tp_tcp_close(inner);
    return ncclRemoteError;
  }
  *send_comm = wrap(inner, 1);
  return *send_comm != NULL ? ncclSuccess : ncclSystemError;
}

static ncclResult_t fake_accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **recv_dev) {
  fake_comm_t *l = listen_comm;
  void *inner = NULL;
  *recv_comm = NULL;
  if (has("slow_accept") && l->accepts++ < 40) {
    usleep(5000);
    return ncclSuccess;
  }
  ncclResult_t res = tp_tcp_accept(l->inner, &inner, recv_dev);
  if (res != ncclSuccess || inner == NULL) return res;
  if (has("blocking_connect")) {
    char ack = 1;
    if (send(tp_tcp_comm_fd(inner), &ack, 1, MSG_NOSIGNAL) != 1) return ncclRemoteError;
  }
  *recv_comm = wrap(inner, 0);
  return *recv_comm != NULL ? ncclSuccess : ncclSystemError;
}

static ncclResult_t fake_props(int dev, ncclNetProperties_v11_t *props) {
  ncclResult_t res = tp_tcp_get_properties(dev, props);
  if (res == ncclSuccess && has("cuda")) props->ptrSupport |= NCCL_PTR_CUDA;
  return res;
}

static ncclResult_t fake_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
  if (type == NCCL_PTR_CUDA && has("cuda")) type = NCCL_PTR_HOST;
  return tp_tcp_reg_mr(((fake_comm_t *)comm)->inner, data, size, type, mhandle);
}

static ncclResult_t fake_dereg_mr(void *comm, void *mhandle) {
  return tp_tcp_dereg_mr(((fake_comm_t *)comm)->inner, mhandle);
}

/* partial: every other request is refused for now. */
static int refuse(fake_comm_t *c) {
  return has("partial") && c->calls++ % 2 == 0;
}

static ncclResult_t wrap_req(fake_comm_t *c, void *inner, void **request) {
  *request = NULL;
  if (inner == NULL) return ncclSuccess;
  fake_req_t *r = calloc(1, sizeof *r);
  if (r == NULL) return ncclSystemError;
  *r = (fake_req_t){.comm = c, .inner = inner};
  *request = r;
  return ncclSuccess;
}

static ncclResult_t fake_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                               void *phandle, void **request) {
  fake_comm_t *c = send_comm;
  void *inner = NULL;
  *request = NULL;
  if (c->sent >= fail_after()) return ncclSystemError;
  if (refuse(c)) return ncclSuccess;
  ncclResult_t res = tp_tcp_isend(c->inner, data, size, tag, mhandle, phandle, &inner);
  if (res != ncclSuccess) return res;
  if (inner != NULL) c->sent += size;
  return wrap_req(c, inner, request);
}

static ncclResult_t fake_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                               void **phandles, void **request) {
  fake_comm_t *c = recv_comm;
  void *inner = NULL;
  *request = NULL;
  if (refuse(c)) return ncclSuccess;
  ncclResult_t res = tp_tcp_irecv(c->inner, n, data, sizes, tags, mhandles, phandles, &inner);
  if (res != ncclSuccess) return res;
  return wrap_req(c, inner, request);
}

static ncclResult_t fake_test(void *request, int *done, int *size) {
  fake_req_t *r = request;
  int got = -1;
  *done = 0;
  if (r->inner == NULL) { /* a flush: done at the second test */
    *done = r->tests++ > 0;
    if (*done) {
      fake_net_flushes++;
      free(r);
    }
    return ncclSuccess;
  }
  if (r->comm->is_send && r->comm->sent >= fail_after()) return ncclSystemError;
  if (has("partial") && r->tests++ < 2) return ncclSuccess;
  ncclResult_t res = tp_tcp_test(r->inner, done, &got);
  if (res != ncclSuccess || !*done) return res;
  if (size != NULL && !has("sizes_unset")) *size = got;
  free(r);
  return ncclSuccess;
}

static ncclResult_t fake_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                                void **request) {
  *request = NULL;
  if (!has("cuda")) return ncclSuccess;
  fake_req_t *r = calloc(1, sizeof *r);
  if (r == NULL) return ncclSystemError;
  r->comm = recv_comm;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t fake_close(void *comm) {
  fake_comm_t *c = comm;
  if (c == NULL) return ncclSuccess;
  tp_tcp_close(c->inner);
  free(c);
  return ncclSuccess;
}

static ncclResult_t fake_close_listen(void *listen_comm) {
  fake_comm_t *l = listen_comm;
  if (l == NULL) return ncclSuccess;
  tp_tcp_close_listen(l->inner);
  free(l);
  return ncclSuccess;
}

PUBLIC const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = "Fake",
    .init = fake_init,
    .devices = fake_devices,
    .getProperties = fake_props,
    .listen = fake_listen,
    .connect = fake_connect,
    .accept = fake_accept,
    .regMr = fake_reg_mr,
    .regMrDmaBuf = tp_tcp_reg_mr_dmabuf,
    .deregMr = fake_dereg_mr,
    .isend = fake_isend,
    .irecv = fake_irecv,
    .iflush = fake_iflush,
    .test = fake_test,
    .closeSend = fake_close,
    .closeRecv = fake_close,
    .closeListen = fake_close_listen,
    .finalize = tp_tcp_finalize,
};
#endif
