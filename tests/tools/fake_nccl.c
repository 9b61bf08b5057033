/*
 * A stand-in NCCL library for testing `braid bench --resources` on the stand-in CUDA driver (mock_cudrv.c):
 * it exports every entry point the bench resolves (tools/lib.c), moves no data, and allocates device memory
 * through the driver at the moments a real library does, in amounts a test can predict, so that the test
 * can check that each memory figure lands where it should:
 *
 *   - ncclCommInitAll: FAKE_INIT_MIB + FAKE_INIT_STEP_MIB * i MiB on the device of communicator i;
 *   - a communicator's first call: FAKE_CONN_MIB MiB on its device (a lazy connection);
 *   - its first call whose send and receive buffers are one (an in-place form): FAKE_STAGING_MIB MiB more.
 *
 * ncclCommDestroy frees them. It reports version 2.27.3, so that a test can tell it from the library beside
 * it. A collective refuses a NULL stream: the bench must pass each rank's own. Built as libnccl.so.2 in a
 * folder of its own, only where CUDA's headers are found (it takes the driver's types from cuda.h).
 */
#include <cuda.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

#define API __attribute__((visibility("default")))

#define FAKE_VERSION       22703
#define FAKE_INIT_MIB      8
#define FAKE_INIT_STEP_MIB 2
#define FAKE_CONN_MIB      6
#define FAKE_STAGING_MIB   2
#define MIB                ((size_t)1 << 20)

/* A communicator: its device's primary context and what it holds there. */
struct ncclComm {
  CUcontext ctx;
  CUdeviceptr init, conn, staging; /* 0 until allocated */
};

/* The driver's entry points this library uses, resolved as the bench resolves them. */
static struct {
  __typeof__(&cuInit) init;
  __typeof__(&cuDeviceGet) device_get;
  __typeof__(&cuDevicePrimaryCtxRetain) retain;
  __typeof__(&cuCtxSetCurrent) set_current;
  __typeof__(&cuMemAlloc) alloc;
  __typeof__(&cuMemFree) free;
} drv;

static int resolve_one(__typeof__(&cuGetProcAddress) get, const char *name, void *slot) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult found;
  if (get(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || fn == NULL) return -1;
  memcpy(slot, &fn, sizeof(fn));
  return 0;
}

static int load_driver(void) {
  if (drv.alloc != NULL) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  void *sym = lib != NULL ? dlsym(lib, "cuGetProcAddress_v2") : NULL;
  if (sym == NULL) return -1;
  __typeof__(&cuGetProcAddress) get;
  memcpy(&get, &sym, sizeof(sym));
  if (resolve_one(get, "cuInit", &drv.init) != 0 || resolve_one(get, "cuDeviceGet", &drv.device_get) != 0 ||
      resolve_one(get, "cuDevicePrimaryCtxRetain", &drv.retain) != 0 ||
      resolve_one(get, "cuCtxSetCurrent", &drv.set_current) != 0 ||
      resolve_one(get, "cuMemFree", &drv.free) != 0 || resolve_one(get, "cuMemAlloc", &drv.alloc) != 0)
    return -1;
  return drv.init(0) == CUDA_SUCCESS ? 0 : -1;
}

/* Allocates `mib` MiB on the communicator's device into *ptr, once. */
static ncclResult_t hold(struct ncclComm *c, CUdeviceptr *ptr, size_t mib) {
  if (*ptr != 0) return ncclSuccess;
  if (drv.set_current(c->ctx) != CUDA_SUCCESS || drv.alloc(ptr, mib * MIB) != CUDA_SUCCESS)
    return ncclUnhandledCudaError;
  return ncclSuccess;
}

/* What every call does: the lazy connection, staging for an in-place call. */
static ncclResult_t touch(ncclComm_t comm, const void *send, const void *recv, cudaStream_t stream) {
  if (comm == NULL || stream == NULL) return ncclInvalidArgument;
  ncclResult_t res = hold(comm, &comm->conn, FAKE_CONN_MIB);
  if (res == ncclSuccess && send != NULL && send == recv) res = hold(comm, &comm->staging, FAKE_STAGING_MIB);
  return res;
}

API ncclResult_t ncclGetVersion(int *version) {
  *version = FAKE_VERSION;
  return ncclSuccess;
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof(*id));
  return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return ncclInvalidUsage; /* the resources bench uses ncclCommInitAll only */
}

API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  if (load_driver() != 0) return ncclSystemError;
  for (int i = 0; i < ndev; i++) {
    CUdevice dev;
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL) return ncclSystemError;
    if (drv.device_get(&dev, devlist != NULL ? devlist[i] : i) != CUDA_SUCCESS ||
        drv.retain(&c->ctx, dev) != CUDA_SUCCESS)
      return ncclInvalidArgument;
    ncclResult_t res = hold(c, &c->init, FAKE_INIT_MIB + FAKE_INIT_STEP_MIB * (size_t)i);
    if (res != ncclSuccess) return res;
    comms[i] = c;
  }
  return ncclSuccess;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (drv.set_current(comm->ctx) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  CUdeviceptr held[] = {comm->init, comm->conn, comm->staging};
  for (int i = 0; i < 3; i++)
    if (held[i] != 0 && drv.free(held[i]) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  free(comm);
  return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t res) {
  return res == ncclSuccess ? "no error" : "stand-in library error";
}

API const char *ncclGetLastError(ncclComm_t comm) {
  return "";
}

API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t type,
                                          ncclScalarResidence_t residence, ncclComm_t comm) {
  *op = ncclNumOps;
  return ncclSuccess;
}

API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return ncclSuccess;
}

API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return touch(comm, send, recv, stream);
}

API ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                            int root, ncclComm_t comm, cudaStream_t stream) {
  return touch(comm, send, recv, stream);
}

API ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                               ncclComm_t comm, cudaStream_t stream) {
  return touch(comm, send, recv, stream);
}

API ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return touch(comm, send, recv, stream);
}

API ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclComm_t comm, cudaStream_t stream) {
  return touch(comm, send, recv, stream);
}

API ncclResult_t ncclAlltoAll(const void *send, void *recv, size_t count, ncclDataType_t type,
                              ncclComm_t comm, cudaStream_t stream) {
  return touch(comm, send, recv, stream);
}

API ncclResult_t ncclGather(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                            ncclComm_t comm, cudaStream_t stream) {
  return touch(comm, send, recv, stream);
}

API ncclResult_t ncclScatter(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                             ncclComm_t comm, cudaStream_t stream) {
  return touch(comm, send, recv, stream);
}

API ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                          cudaStream_t stream) {
  return touch(comm, send, NULL, stream);
}

API ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                          cudaStream_t stream) {
  return touch(comm, NULL, recv, stream);
}

API ncclResult_t ncclGroupStart(void) {
  return ncclSuccess;
}

API ncclResult_t ncclGroupEnd(void) {
  return ncclSuccess;
}
