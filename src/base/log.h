/*
 * Logging in NCCL's format and the library's last-error message.
 *
 * NCCL_DEBUG picks the level (VERSION, WARN, INFO, TRACE), NCCL_DEBUG_SUBSYS the subsystems (a comma list,
 * "^" to exclude), NCCL_DEBUG_FILE the destination ("%h" host, "%p" pid). Lines read
 * "host:pid:tid [dev] NCCL INFO message", as NCCL's do, so existing log tooling keeps working; WARN lines
 * carry the source's "file:line", and NCCL_DEBUG_TIMESTAMP_LEVELS / NCCL_DEBUG_TIMESTAMP_FORMAT put the time
 * in front of the lines of chosen levels (WARN by default), as NCCL 2.28 does.
 */
#ifndef BRAID_BASE_LOG_H
#define BRAID_BASE_LOG_H

#include <stdint.h>
#include "nccl.h"

/* Log levels, as NCCL orders them. */
typedef enum {
  LOG_NONE = 0,
  LOG_VERSION = 1,
  LOG_WARN = 2,
  LOG_INFO = 3,
  LOG_ABORT = 4,
  LOG_TRACE = 5
} log_level_t;

/* Subsystem bits of NCCL_DEBUG_SUBSYS (the same bits as NCCL's). */
enum {
  LOG_INIT = 1 << 0,
  LOG_COLL = 1 << 1,
  LOG_P2P = 1 << 2,
  LOG_SHM = 1 << 3,
  LOG_NET = 1 << 4,
  LOG_GRAPH = 1 << 5,
  LOG_TUNING = 1 << 6,
  LOG_ENV = 1 << 7,
  LOG_ALLOC = 1 << 8,
  LOG_CALL = 1 << 9,
  LOG_PROXY = 1 << 10,
  LOG_NVLS = 1 << 11,
  LOG_BOOTSTRAP = 1 << 12,
  LOG_REG = 1 << 13,
  LOG_PROFILE = 1 << 14,
  LOG_RAS = 1 << 15,
  LOG_ALL = ~0
};

/* Current level and subsystem mask (read them through log_enabled). */
extern int log_level;
extern uint64_t log_mask;

/* Reads the logging variables (again, when called after the first time). */
void log_init(void);
/* Whether a message of this level and subsystem would be written. */
static inline int log_enabled(log_level_t level, uint64_t subsys) {
  if (log_level < 0) log_init();
  return (int)level <= log_level && (level <= LOG_WARN || (subsys & log_mask));
}
/* Writes one log line. Use the macros below, which skip formatting when the line is filtered out. */
void log_write(log_level_t level, uint64_t subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The device number shown in "[dev]" for lines logged by the calling thread. */
void log_set_dev(int dev);
/* Whether `bytes` is the first of its power-of-two size class that *seen (one bit per class) records: for
 * lines logged at INFO once per size class. Thread-safe. */
int log_first_of_class(_Atomic uint64_t *seen, uint64_t bytes);

#define LOG_AT(level, subsys, ...)                                                                           \
  do {                                                                                                       \
    if (log_enabled(level, subsys)) log_write(level, subsys, __FILE__, __LINE__, __VA_ARGS__);               \
  } while (0)
#define WARN(...)          LOG_AT(LOG_WARN, LOG_ALL, __VA_ARGS__)
#define INFO(subsys, ...)  LOG_AT(LOG_INFO, subsys, __VA_ARGS__)
#define TRACE(subsys, ...) LOG_AT(LOG_TRACE, subsys, __VA_ARGS__)

/* Longest last-error message kept (with its NUL). */
#define LOG_ERROR_MAX 1024
/* Reports an error where it starts: logs it at WARN (with the caller's file and line), records it as the
 * calling thread's last error, and returns `res`. */
#define log_err(res, ...) log_err_at(__FILE__, __LINE__, res, __VA_ARGS__)
ncclResult_t log_err_at(const char *file, int line, ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Sets the calling thread's last error without logging it: a message handed over from the thread that did
 * the work (a group's init thread). */
void log_set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes a WARN line that must be seen even when NCCL_DEBUG is unset (a stall report): to the log when WARN
 * is enabled, else to stderr, in the same format. */
#define log_report(...) log_report_at(__FILE__, __LINE__, __VA_ARGS__)
void log_report_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The banner, "NCCL version 2.28.9+braid.<version>[+cuda<major>.<minor>]": NCCL's with Braid in the suffix.
 */
extern const char log_version_string[];
/* Logs the banner: at NCCL_DEBUG=VERSION or WARN as a line of its own, from INFO up as an INFO line. */
void log_banner(void);
/* The name of a result code, as ncclGetErrorString gives it. */
const char *log_result_name(ncclResult_t res);
/* The calling thread's last error message ("" when there was none); valid until its next error. */
const char *log_last_error(void);

/* The newest NCCL release whose whole host API works here, which ncclGetVersion reports and the banner names.
 * 2.29 added one-sided calls (ncclPutSignal, ncclSignal, ncclWaitSignal) that Braid refuses, so a framework
 * that enables features by the run-time version must not take them for working; nccl.h still declares the
 * 2.30.7 surface. */
#define LOG_API_MAJOR 2
#define LOG_API_MINOR 28
#define LOG_API_PATCH 9
#define LOG_API_CODE  (LOG_API_MAJOR * 10000 + LOG_API_MINOR * 100 + LOG_API_PATCH)
/* Logs at INFO (ENV) every knob that is set and where from, as NCCL's "NCCL_X set by environment to V", then
 * one line naming the NCCL_* variables of the environment that Braid does not implement. */
void log_params_set(void);

#endif
