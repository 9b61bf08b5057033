/*
 * Logging and the last-error message (see log.h).
 */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "param.h"

int log_level = -1;
uint64_t log_mask = 0;

static FILE *log_file;
/* Where the calling thread's next line goes instead of log_file (log_report). */
static _Thread_local FILE *write_to;
static char host_name[64];
/* NCCL_DEBUG_TIMESTAMP_LEVELS (a bit per log level) and NCCL_DEBUG_TIMESTAMP_FORMAT (strftime's, with "_" for
 * a space and "%<N>f" for N digits of the second's fraction): which lines start with the time, and how. */
static unsigned stamp_levels;
static char stamp_format[128];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int thread_dev = -1;

static const struct {
  const char *name;
  uint64_t bit;
} subsystems[] = {
    {"INIT", LOG_INIT},
    {"COLL", LOG_COLL},
    {"P2P", LOG_P2P},
    {"SHM", LOG_SHM},
    {"NET", LOG_NET},
    {"GRAPH", LOG_GRAPH},
    {"TUNING", LOG_TUNING},
    {"ENV", LOG_ENV},
    {"ALLOC", LOG_ALLOC},
    {"CALL", LOG_CALL},
    {"PROXY", LOG_PROXY},
    {"NVLS", LOG_NVLS},
    {"BOOTSTRAP", LOG_BOOTSTRAP},
    {"REG", LOG_REG},
    {"PROFILE", LOG_PROFILE},
    {"RAS", LOG_RAS},
    {"ALL", LOG_ALL},
};

static int parse_level(const char *s) {
  static const char *names[] = {"VERSION", "WARN", "INFO", "ABORT", "TRACE"};
  for (int i = 0; i < 5; i++)
    if (strcasecmp(s, names[i]) == 0) return i + 1;
  return LOG_NONE;
}

/* NCCL_DEBUG_SUBSYS: "A,B" enables those; "^A,B" enables all but those. */
static uint64_t parse_mask(const char *s) {
  int invert = s[0] == '^';
  uint64_t mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s + invert);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save))
    for (size_t i = 0; i < sizeof subsystems / sizeof subsystems[0]; i++)
      if (strcasecmp(tok, subsystems[i].name) == 0) mask |= subsystems[i].bit;
  return invert ? ~mask : mask;
}

/* NCCL_DEBUG_TIMESTAMP_LEVELS: "A,B" stamps those levels, "^A,B" all but those; ALL for every level. */
static unsigned parse_stamp_levels(const char *s) {
  int invert = s[0] == '^';
  unsigned levels = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s + invert);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save))
    levels |= strcasecmp(tok, "ALL") == 0 ? ~0u : parse_level(tok) != LOG_NONE ? 1u << parse_level(tok) : 0;
  return invert ? ~levels : levels;
}

/* Keeps NCCL_DEBUG_TIMESTAMP_FORMAT with "_" as a space (spaces are awkward on command lines); a format too
 * long to keep falls back to the default. */
static void set_stamp_format(const char *fmt) {
  if (strlen(fmt) >= sizeof stamp_format) fmt = "[%F %T] ";
  snprintf(stamp_format, sizeof stamp_format, "%s", fmt);
  for (char *c = stamp_format; *c != '\0'; c++)
    if (*c == '_') *c = ' ';
}

/* Writes the current local time in stamp_format into buf; returns its length. "%<N>f" (N from 1 to 9)
 * becomes N digits of the fraction of the second before strftime sees the format. */
static size_t format_stamp(char *buf, size_t len) {
  buf[0] = '\0';
  if (stamp_format[0] == '\0') return 0;
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  localtime_r(&ts.tv_sec, &tm);
  char fmt[sizeof stamp_format + 16];
  size_t n = 0;
  for (const char *c = stamp_format; *c != '\0' && n < sizeof fmt - 10; c++) {
    if (c[0] == '%' && c[1] >= '1' && c[1] <= '9' && c[2] == 'f') {
      int digits = c[1] - '0';
      long frac = ts.tv_nsec;
      for (int i = digits; i < 9; i++) frac /= 10;
      n += (size_t)snprintf(fmt + n, sizeof fmt - n, "%0*ld", digits, frac);
      c += 2;
    } else {
      if (c[0] == '%' && c[1] == '%') fmt[n++] = *c++; /* "%%" stays whole */
      fmt[n++] = *c;
    }
  }
  fmt[n] = '\0';
  size_t got = strftime(buf, len, fmt, &tm);
  if (got == 0) got = strftime(buf, len, "[%F %T] ", &tm); /* too long for buf: NCCL's default instead */
  if (got == 0) buf[0] = '\0';
  return got;
}

/* Expands %h (host name) and %p (pid) in NCCL_DEBUG_FILE and opens it. */
static FILE *open_log_file(const char *pattern) {
  char path[4096];
  size_t n = 0;
  for (const char *p = pattern; *p != '\0' && n < sizeof path - 32; p++) {
    if (p[0] == '%' && p[1] == 'h') {
      n += snprintf(path + n, sizeof path - n, "%s", host_name);
      p++;
    } else if (p[0] == '%' && p[1] == 'p') {
      n += snprintf(path + n, sizeof path - n, "%d", (int)getpid());
      p++;
    } else {
      path[n++] = *p;
    }
  }
  /* snprintf returns the untruncated length: a long host name near the end would put n past the buffer. */
  if (n > sizeof path - 1) n = sizeof path - 1;
  path[n] = '\0';
  FILE *f = fopen(path, "w");
  if (f != NULL) setvbuf(f, NULL, _IOLBF, 0);
  return f;
}

void log_init(void) {
  pthread_mutex_lock(&lock);
  gethostname(host_name, sizeof host_name - 1);
  char *dot = strchr(host_name, '.');
  if (dot != NULL) *dot = '\0';
  if (log_file != NULL && log_file != stdout) fclose(log_file);
  log_file = stdout;
  const char *file = param_str(P_NCCL_DEBUG_FILE);
  if (*file != '\0') {
    FILE *f = open_log_file(file);
    if (f != NULL) log_file = f;
  }
  log_mask = parse_mask(param_str(P_NCCL_DEBUG_SUBSYS));
  stamp_levels = parse_stamp_levels(param_str(P_NCCL_DEBUG_TIMESTAMP_LEVELS));
  set_stamp_format(param_str(P_NCCL_DEBUG_TIMESTAMP_FORMAT));
  __atomic_store_n(&log_level, parse_level(param_str(P_NCCL_DEBUG)), __ATOMIC_RELEASE);
  pthread_mutex_unlock(&lock);
}

void log_set_dev(int dev) {
  thread_dev = dev;
}

/* One line in NCCL's shape: the time when NCCL_DEBUG_TIMESTAMP_LEVELS has the level, then
 * "host:pid:tid [dev] NCCL INFO msg"; a WARN carries the source "file:line" before "NCCL WARN" and, as NCCL's
 * do, starts with an empty line; the banner (VERSION) is the message alone. */
static void vwrite(log_level_t level, const char *file, int line, const char *fmt, va_list ap) {
  static const char *names[] = {"", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
  char msg[1024], stamp[160] = "";
  vsnprintf(msg, sizeof msg, fmt, ap);
  long tid = syscall(SYS_gettid);
  pthread_mutex_lock(&lock);
  FILE *out = write_to != NULL ? write_to : log_file; /* log_report's stderr, or the log */
  if (stamp_levels & (1u << level)) format_stamp(stamp, sizeof stamp);
  if (level == LOG_TRACE) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    fprintf(out, "%s%s:%d:%ld [%d] %.6f %s:%d NCCL TRACE %s\n", stamp, host_name, (int)getpid(), tid,
            thread_dev, ts.tv_sec + ts.tv_nsec * 1e-9, file, line, msg);
  } else if (level == LOG_VERSION) {
    fprintf(out, "%s%s\n", stamp, msg);
  } else if (level == LOG_WARN) {
    fprintf(out, "\n%s%s:%d:%ld [%d] %s:%d NCCL WARN %s\n", stamp, host_name, (int)getpid(), tid, thread_dev,
            file, line, msg);
  } else {
    fprintf(out, "%s%s:%d:%ld [%d] NCCL %s %s\n", stamp, host_name, (int)getpid(), tid, thread_dev,
            names[level], msg);
  }
  fflush(out);
  pthread_mutex_unlock(&lock);
}

void log_write(log_level_t level, uint64_t subsys, const char *file, int line, const char *fmt, ...) {
  (void)subsys;
  va_list ap;
  va_start(ap, fmt);
  vwrite(level, file, line, fmt, ap);
  va_end(ap);
}

#define STR_(x) #x
#define STR(x)  STR_(x)
#ifdef BRAID_CUDA_VERSION
#define CUDA_SUFFIX "+cuda" BRAID_CUDA_VERSION
#else
#define CUDA_SUFFIX ""
#endif
/* A literal, so that `strings libnccl.so.2 | grep "NCCL version"` finds it as it finds NCCL's. */
const char log_version_string[] = "NCCL version " STR(LOG_API_MAJOR) "." STR(LOG_API_MINOR) "." STR(
    LOG_API_PATCH) "+braid." BRAID_VERSION CUDA_SUFFIX;

void log_banner(void) {
  if (log_level < 0) log_init();
  if (log_level >= LOG_INFO)
    LOG_AT(LOG_INFO, LOG_ALL, "%s", log_version_string);
  else if (log_level >= LOG_VERSION)
    log_write(LOG_VERSION, LOG_ALL, __FILE__, __LINE__, "%s", log_version_string);
}

const char *log_result_name(ncclResult_t res) {
  switch (res) {
  case ncclSuccess:
    return "no error";
  case ncclUnhandledCudaError:
    return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError:
    return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError:
    return "internal error (run with NCCL_DEBUG=INFO for details)";
  case ncclInvalidArgument:
    return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage:
    return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError:
    return "remote process exited or there was a network error";
  case ncclInProgress:
    return "operation in progress";
  case ncclTimeout:
    return "timeout";
  default:
    return "unknown result code";
  }
}

/* ---- The last error ----
 *
 * One message per thread, as NCCL keeps it: a failure on another thread (a bootstrap root, a non-blocking
 * init, another caller) never overwrites the caller's. Work done on a thread of its own for a caller hands
 * its message over with log_set_last_error; a communicator keeps the message of its own failure (core). */

static _Thread_local char last_error[LOG_ERROR_MAX];

ncclResult_t log_err_at(const char *file, int line, ncclResult_t res, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  if (log_enabled(LOG_WARN, LOG_ALL)) log_write(LOG_WARN, LOG_ALL, file, line, "%s", last_error);
  return res;
}

void log_set_last_error(const char *fmt, ...) {
  char msg[LOG_ERROR_MAX]; /* fmt's arguments may be the thread's own message */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof msg);
}

const char *log_last_error(void) {
  return last_error;
}

void log_report_at(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!log_enabled(LOG_WARN, LOG_ALL)) write_to = stderr; /* NCCL_DEBUG unset: stderr, still NCCL's format */
  vwrite(LOG_WARN, file, line, fmt, ap);
  write_to = NULL;
  va_end(ap);
}

int log_first_of_class(_Atomic uint64_t *seen, uint64_t bytes) {
  int cls = bytes == 0 ? 0 : 64 - __builtin_clzll(bytes);
  uint64_t bit = 1ull << (cls > 63 ? 63 : cls);
  return !(atomic_fetch_or_explicit(seen, bit, memory_order_relaxed) & bit);
}

void log_params_set(void) {
  for (int i = 0; i < P_COUNT; i++) {
    if (!param_is_set((param_id_t)i)) continue;
    char value[256];
    param_format((param_id_t)i, value, sizeof value);
    const char *src = param_source((param_id_t)i);
    if (strcmp(src, "env") != 0)
      INFO(LOG_ENV, "%s set by configuration file %s to %s", param_name((param_id_t)i), src, value);
    else
      INFO(LOG_ENV, "%s set by environment to %s%s", param_name((param_id_t)i), value,
           param_is_text((param_id_t)i) ? "" : ".");
  }
  char list[1024];
  param_unknown_nccl_vars(list, sizeof list);
  if (list[0] != '\0') INFO(LOG_ENV, "NCCL variables set that Braid does not implement (ignored): %s", list);
}
