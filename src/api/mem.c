/*
 * Memory entry points: ncclMemAlloc/ncclMemFree, buffer registration and memory windows. On the host
 * backend every buffer is usable as it is, so registration records the buffer and hands back a handle that
 * deregistration checks; collectives work on registered and unregistered buffers alike.
 */
#include <stdint.h>
#include <stdlib.h>

#include "api.h"
#include "base/check.h"
#include "base/log.h"
#include "core/comm.h"
#include "gpu/gpu.h"

#define REG_MAGIC 0x42726169645265ull /* a live registration or window */

/* A registered buffer or window. */
typedef struct {
  uint64_t magic;
  ncclComm_t comm; /* the communicator it was registered with */
  void *buff;
  size_t size;
  int flags; /* window flags; 0 for plain registrations */
} reg_t;

NCCL_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size) {
  if (ptr == NULL) return log_err(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  if (size == 0) { /* as NCCL 2.28 accepts it (nccl-tests asks for 0 bytes at its smallest sizes) */
    *ptr = NULL;
    return ncclSuccess;
  }
  return gpu_mem_alloc(size, ptr);
}

NCCL_API(ncclResult_t, ncclMemFree, void *ptr) {
  if (ptr == NULL) return ncclSuccess;
  return gpu_mem_free(ptr);
}

static ncclResult_t reg_make(ncclComm_t comm, void *buff, size_t size, int flags, reg_t **reg_p,
                             const char *func) {
  if (buff == NULL) return log_err(ncclInvalidArgument, "%s: buff is NULL", func);
  if (size == 0) return log_err(ncclInvalidArgument, "%s: size is 0", func);
  reg_t *r = malloc(sizeof *r);
  if (r == NULL) return log_err(ncclSystemError, "%s: out of host memory", func);
  *r = (reg_t){.magic = REG_MAGIC, .comm = comm, .buff = buff, .size = size, .flags = flags};
  INFO(LOG_REG, "%s: %s rank %d registered %p (%zu bytes)", func, comm->name, comm->rank, buff, size);
  *reg_p = r;
  return ncclSuccess;
}

static ncclResult_t reg_drop(ncclComm_t comm, reg_t *r, const char *func) {
  if (r == NULL) return log_err(ncclInvalidArgument, "%s: handle is NULL", func);
  if (r->magic != REG_MAGIC)
    return log_err(ncclInvalidArgument, "%s: handle %p is not a registration", func, (void *)r);
  if (r->comm != comm)
    return log_err(ncclInvalidArgument, "%s: handle %p was registered with another communicator", func,
                   (void *)r);
  r->magic = 0;
  free(r);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size, void **handle) {
  CHECK(comm_check_ready(comm, "ncclCommRegister"));
  if (handle == NULL) return log_err(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  return reg_make(comm, buff, size, 0, (reg_t **)handle, "ncclCommRegister");
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle) {
  CHECK(comm_check(comm, "ncclCommDeregister"));
  return reg_drop(comm, handle, "ncclCommDeregister");
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
         int winFlags) {
  CHECK(comm_check_ready(comm, "ncclCommWindowRegister"));
  if (win == NULL) return log_err(ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
  if (winFlags & ~(NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING))
    return log_err(ncclInvalidArgument, "ncclCommWindowRegister: unknown flags 0x%x", winFlags);
  if ((winFlags & NCCL_WIN_COLL_SYMMETRIC) && (uintptr_t)buff % NCCL_WIN_REQUIRED_ALIGNMENT != 0)
    return log_err(ncclInvalidArgument,
                   "ncclCommWindowRegister: a symmetric window must be aligned to %d bytes",
                   NCCL_WIN_REQUIRED_ALIGNMENT);
  return reg_make(comm, buff, size, winFlags, (reg_t **)win, "ncclCommWindowRegister");
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win) {
  CHECK(comm_check(comm, "ncclCommWindowDeregister"));
  return reg_drop(comm, (reg_t *)win, "ncclCommWindowDeregister");
}

ncclResult_t mem_window_owner(ncclWindow_t win, ncclComm_t *comm_p, void **buff_p) {
  const reg_t *r = (const reg_t *)win;
  if (r == NULL || r->magic != REG_MAGIC) return ncclInvalidArgument;
  *comm_p = r->comm;
  *buff_p = r->buff;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void **outUserPtr) {
  CHECK(comm_check(comm, "ncclWinGetUserPtr"));
  if (outUserPtr == NULL) return log_err(ncclInvalidArgument, "ncclWinGetUserPtr: outUserPtr is NULL");
  ncclComm_t owner = NULL;
  void *buff = NULL;
  if (mem_window_owner(win, &owner, &buff) != ncclSuccess || owner != comm)
    return log_err(ncclInvalidArgument, "ncclWinGetUserPtr: win %p is not a window of this communicator",
                   (void *)win);
  *outUserPtr = buff;
  return ncclSuccess;
}
