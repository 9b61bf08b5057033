/*
 * What every entry-point file of the api layer shares: NCCL_API defines a public function under both of its
 * names. The implementation is pnccl<Name>; nccl<Name> is a weak alias of it, so a profiling library can
 * interpose nccl<Name> and still reach the implementation.
 */
#ifndef BRAID_API_API_H
#define BRAID_API_API_H

#include "nccl.h"

#define NCCL_API(ret, name, ...)                                                                             \
  ret p##name(__VA_ARGS__);                                                                                  \
  ret name(__VA_ARGS__) __attribute__((visibility("default"), weak, alias("p" #name)));                      \
  __attribute__((visibility("default"))) ret p##name(__VA_ARGS__)

/* The communicator and buffer of a live window (src/api/mem.c); ncclInvalidArgument for anything else. */
ncclResult_t mem_window_owner(ncclWindow_t win, ncclComm_t *comm_p, void **buff_p);

#endif
