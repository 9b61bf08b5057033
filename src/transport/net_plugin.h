/*
 * Networks: loading network plugins (NCCL's `libnccl-net*.so`, versions 6 to 11) beside the built-in TCP
 * network, choosing one per communicator, and calling it whatever its version (private to src/transport/).
 *
 * Search, as NCCL 2.28 does it: with NCCL_NET_PLUGIN unset, `libnccl-net.so`; otherwise each name of its
 * comma list as given and then, unless it is a path or already a library name, as `libnccl-net-NAME.so`;
 * `none` (or an empty value) loads no library. A library is used at the newest version it exports
 * (ncclNetPlugin_v11 down to _v6). The built-in network "Socket" comes last. A communicator takes the first
 * network whose name matches NCCL_NET (or its config's netName; case-insensitive, any when unset), whose
 * init succeeds and which reports at least one device. Libraries stay loaded until the process ends.
 *
 * Every failure along the way (not found, no supported version, init failed, no devices) is one log line
 * naming the library and why; NCCL_NET naming no network found fails with the list of those found.
 */
#ifndef BRAID_TRANSPORT_NET_PLUGIN_H
#define BRAID_TRANSPORT_NET_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/net_abi.h"

/* A loaded network (process-wide, never freed). */
typedef struct np_net np_net_t;

/* What one device of a network offers, whatever the plugin's version. */
typedef struct {
  char name[64];     /* the device's name */
  int ptr_support;   /* NCCL_PTR_* bits: memory isend/irecv take */
  int speed;         /* Mbps */
  float latency;     /* microseconds */
  int max_comms;     /* connections at most */
  int max_recvs;     /* buffers per grouped receive */
  int force_flush;   /* receives into GPU memory always need a flush */
  int reg_is_global; /* one registration serves every connection */
  size_t max_bytes;  /* largest message (below 2 GiB: test reports sizes as int) */
  int max_requests;  /* requests a connection may have outstanding */
} np_props_t;

/* A communicator's use of a network: the network and, for v11 plugins, the context its init gave. */
typedef struct {
  np_net_t *net;
  void *ctx;
} np_ctx_t;

/* Picks the network for a communicator: the first usable one whose name matches `want` (NULL or "": any).
 * `comm_id` identifies the communicator to v11 plugins. */
ncclResult_t np_open(const char *want, uint64_t comm_id, np_ctx_t *ctx_p);
/* Ends a communicator's use of its network (v11: finalize). */
void np_close(np_ctx_t *ctx);

const char *np_name(const np_net_t *n);
/* The library it came from (its path), or "built-in". */
const char *np_lib(const np_net_t *n);
int np_version(const np_net_t *n);
int np_ndevs(const np_net_t *n);
/* Device `dev` (0 <= dev < np_ndevs). */
const np_props_t *np_props(const np_net_t *n, int dev);
/* Why the last call on `comm` failed, when the network can say (the built-in one); "" otherwise. */
const char *np_why(const np_net_t *n, const void *comm);

/* The plugin's calls (net_abi.h), the same for every version. Sizes that an older version cannot carry
 * (int) are refused with ncclInvalidUsage. np_test writes -1 to *size_p when the plugin left it unset. */
ncclResult_t np_listen(const np_ctx_t *c, int dev, void *handle, void **listen_p);
ncclResult_t np_connect(const np_ctx_t *c, int dev, void *handle, void **send_p);
ncclResult_t np_accept(const np_net_t *n, void *listen, void **recv_p);
ncclResult_t np_reg(const np_net_t *n, void *comm, void *data, size_t size, int type, void **mhandle_p);
ncclResult_t np_reg_dmabuf(const np_net_t *n, void *comm, void *data, size_t size, int type, uint64_t offset,
                           int fd, void **mhandle_p);
ncclResult_t np_dereg(const np_net_t *n, void *comm, void *mhandle);
ncclResult_t np_isend(const np_net_t *n, void *comm, void *data, size_t size, int tag, void *mhandle,
                      void **request_p);
/* At most NP_MAX_GROUP buffers. */
ncclResult_t np_irecv(const np_net_t *n, void *comm, int count, void **data, const size_t *sizes,
                      const int *tags, void **mhandles, void **request_p);
ncclResult_t np_iflush(const np_net_t *n, void *comm, int count, void **data, const size_t *sizes,
                       void **mhandles, void **request_p);
ncclResult_t np_test(const np_net_t *n, void *request, int *done_p, int *size_p);
void np_close_send(const np_net_t *n, void *comm);
void np_close_recv(const np_net_t *n, void *comm);
void np_close_listen(const np_net_t *n, void *listen);

/* Most buffers np_irecv passes in one grouped receive. */
#define NP_MAX_GROUP 8

#endif
