/*
 * The network plugin interface of NCCL 2.28 (`libnccl-net*.so`), versions 6 to 11, as the plugin libraries
 * see it: one table of functions per version, exported under the symbol ncclNetPlugin_vN, and the device
 * properties each version reports. Layouts, names and constants are NCCL's (they are the binary interface);
 * the descriptions are ours.
 *
 * What changed from version to version:
 *   v6  the base: int sizes, properties without a maximum transfer size, at most 8 requests per connection;
 *   v7  connect/accept gain a device-offload handle (always NULL here), getDeviceMr and irecvConsumed added;
 *   v8  regMr takes a size_t, properties say whether a registration is global;
 *   v9  size_t sizes in isend/irecv, properties carry forceFlush, virtual devices and maximum transfer
 *       sizes, makeVDevice added;
 *   v10 init takes a profiler callback, connect a per-connection traffic class, isend/irecv a profiler
 *       handle;
 *   v11 init gets a per-communicator context (and the communicator's id and traffic class), listen and
 *       connect take that context, finalize ends it, setNetAttr added; properties say how many requests a
 *       multi-request may hold.
 * Every version lists the same first seventeen functions in the same order (name to closeListen); only
 * their parameter types differ.
 *
 * Semantics every version shares: listen makes a handle (at most NCCL_NET_HANDLE_MAXSIZE bytes) that the
 * connecting side gets out of band; connect and accept must not block, and return a NULL comm until the
 * connection is up (the caller calls again); isend/irecv may return a NULL request when they cannot take
 * more now (the caller tries again later); test reports completion and, when sizes is not NULL, the bytes
 * moved, and frees the request once done; messages between one sending and one receiving comm match in
 * order.
 */
#ifndef BRAID_TRANSPORT_NET_ABI_H
#define BRAID_TRANSPORT_NET_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Largest handle listen may write. */
#define NCCL_NET_HANDLE_MAXSIZE 128
/* Pointer kinds in ptrSupport and in regMr's type. */
#define NCCL_PTR_HOST   0x1
#define NCCL_PTR_CUDA   0x2
#define NCCL_PTR_DMABUF 0x4
/* Requests a connection may have outstanding (version 6: NCCL_NET_MAX_REQUESTS_V6). */
#define NCCL_NET_MAX_REQUESTS    32
#define NCCL_NET_MAX_REQUESTS_V6 8
/* A receive request pointer holding this value on entry to irecv says completion need not be reported. */
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
/* Physical devices a virtual device may merge. */
#define NCCL_NET_MAX_DEVS_PER_NIC 4
/* Largest transfer assumed for plugins older than v9, which do not report one (1 GiB). */
#define NCCL_NET_DEFAULT_MAX_BYTES (1024L * 1024 * 1024)
/* v10/v11 traffic class meaning "the plugin's default". */
#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)

/* Log levels and the logger a plugin writes through (NCCL's ncclDebugLogLevel values). */
enum {
  NCCL_NET_LOG_NONE = 0,
  NCCL_NET_LOG_VERSION = 1,
  NCCL_NET_LOG_WARN = 2,
  NCCL_NET_LOG_INFO = 3,
  NCCL_NET_LOG_ABORT = 4,
  NCCL_NET_LOG_TRACE = 5
};
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line, const char *fmt,
                                  ...);
/* Profiler callback handed to v10/v11 plugins (Braid passes NULL: no profiler). */
typedef ncclResult_t (*ncclProfilerCallback_t)(void **event, int type, void *parent, int64_t plugin_id,
                                               void *ext);

/* Device offload kinds; 0 is a plain host-driven network, the only kind Braid uses. */
typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

/* Device-offload handle of v7+ connect/accept (Braid never asks for offload: it passes NULL). */
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void *handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_t;

/* Physical devices making up a virtual device (v9+). */
typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC];
} ncclNetVDeviceProps_t;

/* Per-connection settings of v10 connect and v11 init. */
typedef struct {
  int trafficClass;
} ncclNetCommConfig_t;

/* Attributes of v11 setNetAttr (unused by Braid; declared for the table's layout). */
typedef struct {
  int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
} ncclNetCommAttr_t;
typedef struct {
  ncclNetCommAttr_t sendCommAttr, recvCommAttr;
  uint32_t op, algo, proto;
} ncclNetAttr_t;

/* ---- Device properties ---- */

typedef struct {
  char *name;     /* the device's name, for logs */
  char *pciPath;  /* its PCI path in /sys (may be NULL on virtual NICs) */
  uint64_t guid;  /* identifies the NIC chip across its PCI functions */
  int ptrSupport; /* NCCL_PTR_* bits: which memory isend/irecv accept */
  int speed;      /* port speed in Mbps */
  int port;       /* port number */
  float latency;  /* latency in microseconds */
  int maxComms;   /* connections it can make at most */
  int maxRecvs;   /* buffers one grouped irecv may take */
} ncclNetProperties_v6_t;

typedef struct {
  char *name, *pciPath;
  uint64_t guid;
  int ptrSupport, speed, port;
  float latency;
  int maxComms, maxRecvs;
  ncclNetDeviceType netDeviceType; /* offload kind */
  int netDeviceVersion;            /* offload version */
} ncclNetProperties_v7_t;

typedef struct {
  char *name, *pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal; /* a registration may be used on any connection */
  int speed, port;
  float latency;
  int maxComms, maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  char *name, *pciPath;
  uint64_t guid;
  int ptrSupport, regIsGlobal;
  int forceFlush; /* receives into GPU memory must always be flushed */
  int speed, port;
  float latency;
  int maxComms, maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_t vProps; /* the physical devices behind this one */
  size_t maxP2pBytes;           /* largest point-to-point message */
  size_t maxCollBytes;          /* largest collective-network message */
} ncclNetProperties_v9_t;

typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  char *name, *pciPath;
  uint64_t guid;
  int ptrSupport, regIsGlobal, forceFlush, speed, port;
  float latency;
  int maxComms, maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_t vProps;
  size_t maxP2pBytes, maxCollBytes;
  int maxMultiRequestSize; /* requests one multi-request may hold */
} ncclNetProperties_v11_t;

/* ---- The tables ---- */

typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v6_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(int dev, void *handle, void **send_comm);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm);
  ncclResult_t (*regMr)(void *comm, void *data, int size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                              void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, int size, int tag, void *mhandle, void **request);
  ncclResult_t (*irecv)(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                        void **request);
  ncclResult_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *send_comm);
  ncclResult_t (*closeRecv)(void *recv_comm);
  ncclResult_t (*closeListen)(void *listen_comm);
} ncclNet_v6_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v7_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **send_dev);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **recv_dev);
  ncclResult_t (*regMr)(void *comm, void *data, int size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                              void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, int size, int tag, void *mhandle, void **request);
  ncclResult_t (*irecv)(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                        void **request);
  ncclResult_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *send_comm);
  ncclResult_t (*closeRecv)(void *recv_comm);
  ncclResult_t (*closeListen)(void *listen_comm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recv_comm, int n, void *request);
} ncclNet_v7_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **send_dev);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **recv_dev);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                              void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, int size, int tag, void *mhandle, void **request);
  ncclResult_t (*irecv)(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                        void **request);
  ncclResult_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *send_comm);
  ncclResult_t (*closeRecv)(void *recv_comm);
  ncclResult_t (*closeListen)(void *listen_comm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recv_comm, int n, void *request);
} ncclNet_v8_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **send_dev);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **recv_dev);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                              void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle, void **request);
  ncclResult_t (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                        void **request);
  ncclResult_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *send_comm);
  ncclResult_t (*closeRecv)(void *recv_comm);
  ncclResult_t (*closeListen)(void *listen_comm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recv_comm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *dev, ncclNetVDeviceProps_t *props);
} ncclNet_v9_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logger, ncclProfilerCallback_t profiler);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_t *config, void *handle, void **send_comm,
                          ncclNetDeviceHandle_t **send_dev);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **recv_dev);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                              void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                        void **request);
  ncclResult_t (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                        void **phandles, void **request);
  ncclResult_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *send_comm);
  ncclResult_t (*closeRecv)(void *recv_comm);
  ncclResult_t (*closeListen)(void *listen_comm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recv_comm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *dev, ncclNetVDeviceProps_t *props);
} ncclNet_v10_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, uint64_t comm_id, ncclNetCommConfig_t *config, ncclDebugLogger_t logger,
                       ncclProfilerCallback_t profiler);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t *props);
  ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **send_comm,
                          ncclNetDeviceHandle_t **send_dev);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **recv_dev);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                              void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                        void **request);
  ncclResult_t (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                        void **phandles, void **request);
  ncclResult_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *send_comm);
  ncclResult_t (*closeRecv)(void *recv_comm);
  ncclResult_t (*closeListen)(void *listen_comm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recv_comm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *dev, ncclNetVDeviceProps_t *props);
  ncclResult_t (*finalize)(void *ctx);
  ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_t *attr);
} ncclNet_v11_t;

#endif
