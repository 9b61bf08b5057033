/*
 * libnccl-net-braid.so: Braid's TCP network (net_tcp.c) as a network plugin library that NCCL, or Braid
 * itself, loads through NCCL_NET_PLUGIN=braid. It exports the plugin tables ncclNetPlugin_v6 to _v11 (those
 * BRAID_NET_VERSIONS selects: bit v-6 for version v), each passing its calls on to the version-11 functions,
 * with sizes and properties converted. The network is named BRAID_NET_NAME ("Braid").
 *
 * The tests build it again with one version or another, as stand-ins for plugins written against older
 * NCCL headers.
 */
#include <stdlib.h>
#include <string.h>

#include "transport/net_abi.h"
#include "transport/net_tcp.h"

#ifndef BRAID_NET_VERSIONS
#define BRAID_NET_VERSIONS 0x3f /* versions 6 to 11 */
#endif
#ifndef BRAID_NET_NAME
#define BRAID_NET_NAME "Braid"
#endif

#define EXPORTS(v) ((BRAID_NET_VERSIONS >> ((v)-6)) & 1)
#define PUBLIC     __attribute__((visibility("default")))
/* Adapters; a build exporting fewer versions leaves some unused. */
#define ADAPTER static __attribute__((unused))

/* ---- What every version shares ---- */

ADAPTER ncclResult_t init_v6(ncclDebugLogger_t logger) {
  tp_tcp_set_warn_errors(1); /* the caller cannot ask tp_tcp_why */
  return tp_tcp_init(NULL, 0, NULL, logger, NULL);
}

ADAPTER ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) {
  return init_v6(logger);
}

ADAPTER ncclResult_t init_v11(void **ctx, uint64_t comm_id, ncclNetCommConfig_t *config,
                              ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) {
  tp_tcp_set_warn_errors(1);
  return tp_tcp_init(ctx, comm_id, config, logger, profiler);
}

ADAPTER ncclResult_t listen_v6(int dev, void *handle, void **listen_comm) {
  return tp_tcp_listen(NULL, dev, handle, listen_comm);
}

ADAPTER ncclResult_t connect_v6(int dev, void *handle, void **send_comm) {
  return tp_tcp_connect(NULL, dev, handle, send_comm, NULL);
}

ADAPTER ncclResult_t connect_v7(int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **send_dev) {
  return tp_tcp_connect(NULL, dev, handle, send_comm, send_dev);
}

ADAPTER ncclResult_t connect_v10(int dev, ncclNetCommConfig_t *config, void *handle, void **send_comm,
                                 ncclNetDeviceHandle_t **send_dev) {
  return tp_tcp_connect(NULL, dev, handle, send_comm, send_dev);
}

ADAPTER ncclResult_t accept_v6(void *listen_comm, void **recv_comm) {
  return tp_tcp_accept(listen_comm, recv_comm, NULL);
}

ADAPTER ncclResult_t reg_mr_int(void *comm, void *data, int size, int type, void **mhandle) {
  return tp_tcp_reg_mr(comm, data, (size_t)size, type, mhandle);
}

ADAPTER ncclResult_t isend_int(void *send_comm, void *data, int size, int tag, void *mhandle,
                               void **request) {
  if (size < 0) return ncclInvalidArgument;
  return tp_tcp_isend(send_comm, data, (size_t)size, tag, mhandle, NULL, request);
}

ADAPTER ncclResult_t irecv_int(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                               void **request) {
  size_t wide[NCCL_NET_MAX_REQUESTS];
  if (n < 1 || n > NCCL_NET_MAX_REQUESTS) return ncclInvalidArgument;
  for (int i = 0; i < n; i++) wide[i] = sizes[i] < 0 ? 0 : (size_t)sizes[i];
  return tp_tcp_irecv(recv_comm, n, data, wide, tags, mhandles, NULL, request);
}

ADAPTER ncclResult_t isend_v9(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                              void **request) {
  return tp_tcp_isend(send_comm, data, size, tag, mhandle, NULL, request);
}

ADAPTER ncclResult_t irecv_v9(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                              void **request) {
  return tp_tcp_irecv(recv_comm, n, data, sizes, tags, mhandles, NULL, request);
}

/* ---- Properties ---- */

/* The fields every version's properties share, from version 11's. */
#define COPY_COMMON(dst, src)                                                                                \
  do {                                                                                                       \
    (dst)->name = (src).name;                                                                                \
    (dst)->pciPath = (src).pciPath;                                                                          \
    (dst)->guid = (src).guid;                                                                                \
    (dst)->ptrSupport = (src).ptrSupport;                                                                    \
    (dst)->speed = (src).speed;                                                                              \
    (dst)->port = (src).port;                                                                                \
    (dst)->latency = (src).latency;                                                                          \
    (dst)->maxComms = (src).maxComms;                                                                        \
    (dst)->maxRecvs = (src).maxRecvs;                                                                        \
  } while (0)

ADAPTER ncclResult_t props_v6(int dev, ncclNetProperties_v6_t *props) {
  ncclNetProperties_v11_t p;
  ncclResult_t res = tp_tcp_get_properties(dev, &p);
  if (res == ncclSuccess) COPY_COMMON(props, p);
  return res;
}

ADAPTER ncclResult_t props_v7(int dev, ncclNetProperties_v7_t *props) {
  ncclNetProperties_v11_t p;
  ncclResult_t res = tp_tcp_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  COPY_COMMON(props, p);
  props->netDeviceType = p.netDeviceType;
  props->netDeviceVersion = p.netDeviceVersion;
  return ncclSuccess;
}

ADAPTER ncclResult_t props_v8(int dev, ncclNetProperties_v8_t *props) {
  ncclNetProperties_v11_t p;
  ncclResult_t res = tp_tcp_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  COPY_COMMON(props, p);
  props->regIsGlobal = p.regIsGlobal;
  props->netDeviceType = p.netDeviceType;
  props->netDeviceVersion = p.netDeviceVersion;
  return ncclSuccess;
}

ADAPTER ncclResult_t props_v9(int dev, ncclNetProperties_v9_t *props) {
  ncclNetProperties_v11_t p;
  ncclResult_t res = tp_tcp_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  COPY_COMMON(props, p);
  props->regIsGlobal = p.regIsGlobal;
  props->forceFlush = p.forceFlush;
  props->netDeviceType = p.netDeviceType;
  props->netDeviceVersion = p.netDeviceVersion;
  props->vProps = p.vProps;
  props->maxP2pBytes = p.maxP2pBytes;
  props->maxCollBytes = p.maxCollBytes;
  return ncclSuccess;
}

/* ---- The tables ---- */

#if EXPORTS(6)
PUBLIC const ncclNet_v6_t ncclNetPlugin_v6 = {
    .name = BRAID_NET_NAME,
    .init = init_v6,
    .devices = tp_tcp_devices,
    .getProperties = props_v6,
    .listen = listen_v6,
    .connect = connect_v6,
    .accept = accept_v6,
    .regMr = reg_mr_int,
    .regMrDmaBuf = tp_tcp_reg_mr_dmabuf,
    .deregMr = tp_tcp_dereg_mr,
    .isend = isend_int,
    .irecv = irecv_int,
    .iflush = tp_tcp_iflush,
    .test = tp_tcp_test,
    .closeSend = tp_tcp_close,
    .closeRecv = tp_tcp_close,
    .closeListen = tp_tcp_close_listen,
};
#endif

#if EXPORTS(7)
PUBLIC const ncclNet_v7_t ncclNetPlugin_v7 = {
    .name = BRAID_NET_NAME,
    .init = init_v6,
    .devices = tp_tcp_devices,
    .getProperties = props_v7,
    .listen = listen_v6,
    .connect = connect_v7,
    .accept = tp_tcp_accept,
    .regMr = reg_mr_int,
    .regMrDmaBuf = tp_tcp_reg_mr_dmabuf,
    .deregMr = tp_tcp_dereg_mr,
    .isend = isend_int,
    .irecv = irecv_int,
    .iflush = tp_tcp_iflush,
    .test = tp_tcp_test,
    .closeSend = tp_tcp_close,
    .closeRecv = tp_tcp_close,
    .closeListen = tp_tcp_close_listen,
};
#endif

#if EXPORTS(8)
PUBLIC const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = BRAID_NET_NAME,
    .init = init_v6,
    .devices = tp_tcp_devices,
    .getProperties = props_v8,
    .listen = listen_v6,
    .connect = connect_v7,
    .accept = tp_tcp_accept,
    .regMr = tp_tcp_reg_mr,
    .regMrDmaBuf = tp_tcp_reg_mr_dmabuf,
    .deregMr = tp_tcp_dereg_mr,
    .isend = isend_int,
    .irecv = irecv_int,
    .iflush = tp_tcp_iflush,
    .test = tp_tcp_test,
    .closeSend = tp_tcp_close,
    .closeRecv = tp_tcp_close,
    .closeListen = tp_tcp_close_listen,
};
#endif

#if EXPORTS(9)
PUBLIC const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = BRAID_NET_NAME,
    .init = init_v6,
    .devices = tp_tcp_devices,
    .getProperties = props_v9,
    .listen = listen_v6,
    .connect = connect_v7,
    .accept = tp_tcp_accept,
    .regMr = tp_tcp_reg_mr,
    .regMrDmaBuf = tp_tcp_reg_mr_dmabuf,
    .deregMr = tp_tcp_dereg_mr,
    .isend = isend_v9,
    .irecv = irecv_v9,
    .iflush = tp_tcp_iflush,
    .test = tp_tcp_test,
    .closeSend = tp_tcp_close,
    .closeRecv = tp_tcp_close,
    .closeListen = tp_tcp_close_listen,
};
#endif

#if EXPORTS(10)
PUBLIC const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = BRAID_NET_NAME,
    .init = init_v10,
    .devices = tp_tcp_devices,
    .getProperties = props_v9, /* v10's properties are v9's */
    .listen = listen_v6,
    .connect = connect_v10,
    .accept = tp_tcp_accept,
    .regMr = tp_tcp_reg_mr,
    .regMrDmaBuf = tp_tcp_reg_mr_dmabuf,
    .deregMr = tp_tcp_dereg_mr,
    .isend = tp_tcp_isend,
    .irecv = tp_tcp_irecv,
    .iflush = tp_tcp_iflush,
    .test = tp_tcp_test,
    .closeSend = tp_tcp_close,
    .closeRecv = tp_tcp_close,
    .closeListen = tp_tcp_close_listen,
};
#endif

#if EXPORTS(11)
PUBLIC const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = BRAID_NET_NAME,
    .init = init_v11,
    .devices = tp_tcp_devices,
    .getProperties = tp_tcp_get_properties,
    .listen = tp_tcp_listen,
    .connect = tp_tcp_connect,
    .accept = tp_tcp_accept,
    .regMr = tp_tcp_reg_mr,
    .regMrDmaBuf = tp_tcp_reg_mr_dmabuf,
    .deregMr = tp_tcp_dereg_mr,
    .isend = tp_tcp_isend,
    .irecv = tp_tcp_irecv,
    .iflush = tp_tcp_iflush,
    .test = tp_tcp_test,
    .closeSend = tp_tcp_close,
    .closeRecv = tp_tcp_close,
    .closeListen = tp_tcp_close_listen,
    .finalize = tp_tcp_finalize,
};
#endif
