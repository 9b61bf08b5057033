/*
 * Braid's TCP network behind the network plugin interface (net_abi.h, version 11). Built into the library
 * as the default network "Socket", and exported by libnccl-net-braid.so (src/transport/plugin/) under the
 * name "Braid" for any NCCL-compatible library to load.
 *
 * One device: the interface NCCL_SOCKET_IFNAME picks. Each connection is one TCP socket; a message goes as
 * a 16-byte header (its size and tag) and its bytes. Nothing blocks: connect and accept advance a small
 * state machine per call, isend/irecv queue requests (up to NCCL_NET_MAX_REQUESTS per connection) and test
 * moves as many bytes as the socket takes, in the order the requests were made.
 */
#ifndef BRAID_TRANSPORT_NET_TCP_H
#define BRAID_TRANSPORT_NET_TCP_H

#include "transport/net_abi.h"

/* The built-in table, named "Socket". */
extern const ncclNet_v11_t tp_tcp_net;

/* The table's functions, for libraries that export them under other names and versions. */
ncclResult_t tp_tcp_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_t *config, ncclDebugLogger_t logger,
                         ncclProfilerCallback_t profiler);
ncclResult_t tp_tcp_devices(int *ndev);
ncclResult_t tp_tcp_get_properties(int dev, ncclNetProperties_v11_t *props);
ncclResult_t tp_tcp_listen(void *ctx, int dev, void *handle, void **listen_comm);
ncclResult_t tp_tcp_connect(void *ctx, int dev, void *handle, void **send_comm,
                            ncclNetDeviceHandle_t **send_dev);
ncclResult_t tp_tcp_accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **recv_dev);
ncclResult_t tp_tcp_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle);
ncclResult_t tp_tcp_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                  void **mhandle);
ncclResult_t tp_tcp_dereg_mr(void *comm, void *mhandle);
ncclResult_t tp_tcp_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                          void **request);
ncclResult_t tp_tcp_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                          void **phandles, void **request);
ncclResult_t tp_tcp_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
ncclResult_t tp_tcp_test(void *request, int *done, int *size);
ncclResult_t tp_tcp_close(void *comm);
ncclResult_t tp_tcp_close_listen(void *listen_comm);
ncclResult_t tp_tcp_finalize(void *ctx);

/* The socket of a send or receive comm, for stand-in plugins in the tests that build on this network. */
int tp_tcp_comm_fd(const void *comm);
/* Why the last call on `comm` (a send or receive comm) failed, in plain words ("" if none did). */
const char *tp_tcp_why(const void *comm);
/* Whether errors are logged at WARN (an exported plugin, whose caller cannot ask tp_tcp_why) or only at
 * INFO (built in: the transport reports them once, with the ranks involved). */
void tp_tcp_set_warn_errors(int on);

#endif
