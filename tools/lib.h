/*
 * The NCCL library that `braid bench` measures, loaded at run time with dlopen so that the same tool can
 * measure Braid's libnccl.so.2 or any other build of the NCCL API (--lib PATH), or two of them side by side
 * (--vs PATH): each is loaded with RTLD_LOCAL, so two libraries exporting the same names live in one process,
 * each with its own state. Every function the bench calls is resolved here once; a library that lacks one of
 * them is refused with the missing name.
 */
#ifndef BRAID_TOOLS_LIB_H
#define BRAID_TOOLS_LIB_H

#include <limits.h>

#include "nccl.h"

/* The loaded library: its handle, its path and the entry points the bench uses. */
typedef struct {
  void *handle;
  char path[PATH_MAX];
  ncclResult_t (*GetVersion)(int *version);
  ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
  ncclResult_t (*CommInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
  ncclResult_t (*CommInitAll)(ncclComm_t *comms, int ndev, const int *devlist);
  ncclResult_t (*CommDestroy)(ncclComm_t comm);
  const char *(*GetErrorString)(ncclResult_t res);
  const char *(*GetLastError)(ncclComm_t comm);
  ncclResult_t (*RedOpCreatePreMulSum)(ncclRedOp_t *op, void *scalar, ncclDataType_t type,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
  ncclResult_t (*RedOpDestroy)(ncclRedOp_t op, ncclComm_t comm);
  ncclResult_t (*AllReduce)(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                            ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*Reduce)(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                         int root, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*Broadcast)(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                            ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ReduceScatter)(const void *send, void *recv, size_t recvcount, ncclDataType_t type,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*AllGather)(const void *send, void *recv, size_t sendcount, ncclDataType_t type,
                            ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*AlltoAll)(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream);
  ncclResult_t (*Gather)(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                         ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*Scatter)(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                          ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*Send)(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                       cudaStream_t stream);
  ncclResult_t (*Recv)(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                       cudaStream_t stream);
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
} nccl_lib_t;

/* Writes the default library path into buf: libnccl.so.2 in ../lib/ beside the running braid executable.
 * Returns 0, or -1 (with a message on stderr) when the executable's path cannot be read. */
int lib_default_path(char *buf, size_t len);
/* Loads the library at `path` and resolves every entry point. Returns 0, or -1 with the reason on stderr. */
int lib_open(const char *path, nccl_lib_t *lib_p);
/* Unloads the library. */
void lib_close(nccl_lib_t *lib);
/* Prints "what failed: <error string> (<last error>)" for a failed call on stderr, prefixed by `who`. */
void lib_report(const nccl_lib_t *lib, ncclComm_t comm, const char *who, const char *what, ncclResult_t res);

#endif
