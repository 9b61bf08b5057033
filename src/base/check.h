/*
 * The project's error-propagation macros. Everything inside returns ncclResult_t; an error is reported once,
 * where it starts (log_err), and callers pass it up with CHECK or CHECK_GOTO.
 */
#ifndef BRAID_BASE_CHECK_H
#define BRAID_BASE_CHECK_H

#include <errno.h>
#include "nccl.h"

/* Returns from the calling function when `call` does not succeed. */
#define CHECK(call)                                                                                          \
  do {                                                                                                       \
    ncclResult_t check_res_ = (call);                                                                        \
    if (check_res_ != ncclSuccess) return check_res_;                                                        \
  } while (0)

/* Stores the result of `call` in `res` and jumps to `label` when it does not succeed. */
#define CHECK_GOTO(call, res, label)                                                                         \
  do {                                                                                                       \
    (res) = (call);                                                                                          \
    if ((res) != ncclSuccess) goto label;                                                                    \
  } while (0)

/* Runs a system call expression, retrying on EINTR; leaves its value in `ret`. */
#define SYS_RETRY(ret, expr)                                                                                 \
  do {                                                                                                       \
    (ret) = (expr);                                                                                          \
  } while ((ret) == -1 && errno == EINTR)

#endif
