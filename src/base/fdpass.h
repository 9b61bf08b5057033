/*
 * Passing file descriptors between processes of one machine (for cuMem allocations exported as POSIX file
 * descriptors).
 *
 * A process that serves descriptors runs one small server thread, started at the first fd_serve, listening on
 * an abstract Unix socket named after its pid and a random number that every token it hands out carries (so
 * two copies of the library in one process have servers of their own). An importer connects, sends the
 * token it was given, and gets a duplicate of the descriptor back (SCM_RIGHTS). The server only answers
 * processes of the same user id (SO_PEERCRED). Nothing waits on the serving side's main thread, so two
 * processes importing from each other at the same time cannot deadlock.
 */
#ifndef BRAID_BASE_FDPASS_H
#define BRAID_BASE_FDPASS_H

#include <stdint.h>
#include <sys/types.h>

#include "nccl.h"

/* Serves a duplicate of `fd` (the caller keeps its own) under a fresh random token. */
ncclResult_t fd_serve(int fd, uint64_t *token_p);
/* Stops serving a token and closes the duplicate. */
void fd_unserve(uint64_t token);
/* Gets the descriptor served under `token` by process `pid` (bounded by BRAID_BOOTSTRAP_TIMEOUT_S;
 * abort-aware when abort_flag is not NULL). The caller owns *fd_p. */
ncclResult_t fd_fetch(pid_t pid, uint64_t token, const volatile int *abort_flag, int *fd_p);

#endif
