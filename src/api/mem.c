/*
 * Memory entry points: ncclMemAlloc/ncclMemFree, buffer registration and memory windows. On the host
 * backend every buffer is usable as it is, so registration records the buffer and hands back a handle that
 * deregistration checks; collectives work on registered and unregistered buffers alike. A handle is looked
 * up, never dereferenced: a stale or foreign one is an error, not a read of freed memory.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "api.h"
#include "base/check.h"
#include "base/log.h"
#include "core/comm.h"
#include "gpu/gpu.h"

/* A registered buffer or window. The caller's handle is its number, never reused, so a handle that was
 * deregistered stays unknown even when a new registration takes the old one's memory. */
typedef struct reg {
  struct reg *next; /* next live registration (`regs`) */
  uint64_t id;      /* the handle's value */
  ncclComm_t comm;  /* the communicator it was registered with */
  void *buff;
  size_t size;
  int window; /* made by ncclCommWindowRegister */
  int flags;  /* window flags; 0 for plain registrations */
} reg_t;

static pthread_mutex_t regs_lock = PTHREAD_MUTEX_INITIALIZER;
static reg_t *regs;          /* live registrations, newest first */
static uint64_t regs_issued; /* handles handed out so far */

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

static ncclResult_t reg_make(ncclComm_t comm, void *buff, size_t size, int window, int flags, void **handle_p,
                             const char *func) {
  if (buff == NULL) return log_err(ncclInvalidArgument, "%s: buff is NULL", func);
  if (size == 0) return log_err(ncclInvalidArgument, "%s: size is 0", func);
  reg_t *r = malloc(sizeof *r);
  if (r == NULL) return log_err(ncclSystemError, "%s: out of host memory", func);
  *r = (reg_t){.comm = comm, .buff = buff, .size = size, .window = window, .flags = flags};
  pthread_mutex_lock(&regs_lock);
  r->id = ++regs_issued;
  r->next = regs;
  regs = r;
  pthread_mutex_unlock(&regs_lock);
  INFO(LOG_REG, "%s: %s rank %d registered %p (%zu bytes)", func, comm->name, comm->rank, buff, size);
  *handle_p = (void *)(uintptr_t)r->id;
  return ncclSuccess;
}

/* Takes the registration named by `handle` off the list, after checking that it is one of `comm`'s. */
static ncclResult_t reg_drop(ncclComm_t comm, void *handle, int window, const char *func) {
  if (handle == NULL) return log_err(ncclInvalidArgument, "%s: handle is NULL", func);
  uint64_t id = (uintptr_t)handle;
  ncclResult_t res = ncclSuccess;
  reg_t *r = NULL, **link = &regs;
  pthread_mutex_lock(&regs_lock);
  while (*link != NULL && (*link)->id != id) link = &(*link)->next;
  r = *link;
  if (r == NULL)
    res = log_err(ncclInvalidArgument, "%s: handle %p is not a %s (or was deregistered already)", func,
                  handle, window ? "window" : "registration");
  else if (r->window != window)
    res = log_err(ncclInvalidArgument, "%s: handle %p is a %s", func, handle,
                  r->window ? "window (use ncclCommWindowDeregister)"
                            : "registration (use ncclCommDeregister)");
  else if (r->comm != comm)
    res =
        log_err(ncclInvalidArgument, "%s: handle %p was registered with another communicator", func, handle);
  else
    *link = r->next;
  pthread_mutex_unlock(&regs_lock);
  if (res == ncclSuccess) free(r);
  return res;
}

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size, void **handle) {
  CHECK(comm_check_ready(comm, "ncclCommRegister"));
  if (handle == NULL) return log_err(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  return reg_make(comm, buff, size, 0, 0, handle, "ncclCommRegister");
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle) {
  CHECK(comm_check(comm, "ncclCommDeregister"));
  return reg_drop(comm, handle, 0, "ncclCommDeregister");
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
  return reg_make(comm, buff, size, 1, winFlags, (void **)win, "ncclCommWindowRegister");
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win) {
  CHECK(comm_check(comm, "ncclCommWindowDeregister"));
  return reg_drop(comm, win, 1, "ncclCommWindowDeregister");
}

ncclResult_t mem_window_owner(ncclWindow_t win, ncclComm_t *comm_p, void **buff_p) {
  uint64_t id = (uintptr_t)win;
  ncclResult_t res = ncclInvalidArgument;
  pthread_mutex_lock(&regs_lock);
  for (const reg_t *r = regs; r != NULL; r = r->next)
    if (r->id == id && r->window) {
      *comm_p = r->comm;
      *buff_p = r->buff;
      res = ncclSuccess;
      break;
    }
  pthread_mutex_unlock(&regs_lock);
  return res;
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
