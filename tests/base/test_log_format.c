/*
 * Tests of NCCL's log conventions in base/log and base/param: the version banner ("NCCL version
 * 2.28.9+braid.<version>[+cuda<X.Y>]", a line of its own at VERSION and WARN, an INFO line from INFO up),
 * WARN lines as NCCL 2.28 writes them (an empty line, the time, "host:pid:tid [dev] file:line NCCL WARN msg",
 * the file and line the error's caller's, relative to src/ in the library), NCCL_DEBUG_TIMESTAMP_LEVELS and
 * NCCL_DEBUG_TIMESTAMP_FORMAT, and the ENV lines: every knob that is set and where from, and one line naming
 * the NCCL_* variables Braid does not implement. Each case runs in its own process and logs into a file.
 */
#include <ctype.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/param.h"
#include "harness.h"

/* Where a case logs: its temporary folder, and the file NCCL_DEBUG_FILE names in it. */
typedef struct {
  char dir[256];
  char path[512];
  char text[16384];
} log_t;

/* Sets the environment (NAME=VALUE strings, NULL-terminated; NCCL_DEBUG_FILE too), reloads the knobs and
 * starts logging into a fresh folder. */
static void start_log(log_t *l, const char *const *env) {
  snprintf(l->dir, sizeof l->dir, "/tmp/braid_test_log_format_XXXXXX");
  EXPECT(mkdtemp(l->dir) != NULL);
  snprintf(l->path, sizeof l->path, "%s/log", l->dir);
  setenv("HOME", l->dir, 1);
  unsetenv("NCCL_CONF_FILE");
  setenv("NCCL_DEBUG_FILE", l->path, 1);
  for (; *env != NULL; env++) EXPECT(putenv((char *)*env) == 0);
  param_reload();
  log_init();
}

/* The log's text, read into l->text; the file and folder are removed. */
static const char *end_log(log_t *l) {
  FILE *f = fopen(l->path, "r");
  size_t n = f != NULL ? fread(l->text, 1, sizeof l->text - 1, f) : 0;
  l->text[n] = '\0';
  if (f != NULL) fclose(f);
  unlink(l->path);
  rmdir(l->dir);
  return l->text;
}

/* Whether some line of `text` matches the extended regular expression `re` whole. */
static int has_line(const char *text, const char *re) {
  regex_t r;
  char anchored[512];
  snprintf(anchored, sizeof anchored, "^%s$", re);
  EXPECT(regcomp(&r, anchored, REG_EXTENDED | REG_NEWLINE | REG_NOSUB) == 0, "bad pattern %s", re);
  int found = regexec(&r, text, 0, NULL, 0) == 0;
  regfree(&r);
  return found;
}

#define HOST_PID_TID "[^: ]+:[0-9]+:[0-9]+ "
#define STAMP        "\\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\] "

static void test_banner(void) {
  EXPECT(has_line(log_version_string,
                  "NCCL version 2\\.28\\.9\\+braid\\.[0-9]+\\.[0-9]+\\.[0-9]+(\\+cuda[0-9]+\\.[0-9]+)?"),
         "banner %s", log_version_string);
  log_t l;
  char want[256];
  static const char *const version[] = {"NCCL_DEBUG=VERSION", NULL};
  start_log(&l, version);
  log_banner();
  snprintf(want, sizeof want, "%s\n", log_version_string);
  EXPECT(strcmp(end_log(&l), want) == 0, "at VERSION: \"%s\"", l.text);
  static const char *const info[] = {"NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT", NULL};
  start_log(&l, info);
  log_banner();
  snprintf(want, sizeof want, " NCCL INFO %s\n", log_version_string);
  EXPECT(has_line(end_log(&l), HOST_PID_TID "\\[-1\\] NCCL INFO NCCL version .*") &&
             strstr(l.text, want) != NULL,
         "at INFO: \"%s\"", l.text);
}

/* A WARN as NCCL writes it, with the caller's file and line: here this file's, in the library relative to
 * src/. */
static void test_warn_line(void) {
  log_t l;
  static const char *const warn[] = {"NCCL_DEBUG=WARN", NULL};
  start_log(&l, warn);
  int line = __LINE__ + 1;
  EXPECT(log_err(ncclInvalidArgument, "bad %s", "argument") == ncclInvalidArgument);
  void *p = NULL;
  EXPECT(mem_calloc(NULL, (size_t)1 << 62, 64, "a test's impossible buffer", &p) == ncclSystemError);
  end_log(&l);
  char want[256];
  snprintf(want, sizeof want,
           STAMP HOST_PID_TID "\\[-1\\] [^ ]*test_log_format\\.c:%d NCCL WARN bad argument", line);
  EXPECT(has_line(l.text, want), "no line %s in \"%s\"", want, l.text);
  EXPECT(strncmp(l.text, "\n[", 2) == 0, "a WARN starts with an empty line: \"%s\"", l.text);
  EXPECT(
      has_line(l.text, STAMP HOST_PID_TID "\\[-1\\] base/alloc\\.c:[0-9]+ NCCL WARN out of host memory .*"),
      "the library's WARN names base/alloc.c: \"%s\"", l.text);
}

/* NCCL_DEBUG_TIMESTAMP_LEVELS and NCCL_DEBUG_TIMESTAMP_FORMAT. */
static void test_timestamps(void) {
  log_t l;
  static const char *const info_only[] = {"NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=ALL",
                                          "NCCL_DEBUG_TIMESTAMP_LEVELS=INFO", NULL};
  start_log(&l, info_only);
  INFO(LOG_INIT, "info line");
  WARN("warn line");
  end_log(&l);
  EXPECT(has_line(l.text, STAMP HOST_PID_TID "\\[-1\\] NCCL INFO info line"), "\"%s\"", l.text);
  EXPECT(has_line(l.text, HOST_PID_TID "\\[-1\\] [^ ]+:[0-9]+ NCCL WARN warn line"), "\"%s\"", l.text);
  /* "^WARN": every level but WARN; the fraction of the second, "_" for a space, "%%" kept. */
  static const char *const fraction[] = {"NCCL_DEBUG_TIMESTAMP_LEVELS=^WARN",
                                         "NCCL_DEBUG_TIMESTAMP_FORMAT=%H:%M:%S.%3f_%%_", NULL};
  start_log(&l, fraction);
  INFO(LOG_INIT, "info line");
  WARN("warn line");
  end_log(&l);
  EXPECT(has_line(l.text,
                  "[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} % " HOST_PID_TID "\\[-1\\] NCCL INFO info line"),
         "\"%s\"", l.text);
  EXPECT(has_line(l.text, HOST_PID_TID "\\[-1\\] [^ ]+:[0-9]+ NCCL WARN warn line"), "\"%s\"", l.text);
  /* VERSION stamped, with the default format; then an empty format: no time at all. */
  static const char *const version[] = {"NCCL_DEBUG=VERSION", "NCCL_DEBUG_TIMESTAMP_LEVELS=VERSION",
                                        "NCCL_DEBUG_TIMESTAMP_FORMAT=[%F %T] ", NULL};
  start_log(&l, version);
  log_banner();
  EXPECT(has_line(end_log(&l), STAMP "NCCL version .*"), "\"%s\"", l.text);
  static const char *const none[] = {"NCCL_DEBUG=WARN", "NCCL_DEBUG_TIMESTAMP_LEVELS=ALL",
                                     "NCCL_DEBUG_TIMESTAMP_FORMAT=", NULL};
  start_log(&l, none);
  WARN("warn line");
  EXPECT(has_line(end_log(&l), HOST_PID_TID "\\[-1\\] [^ ]+:[0-9]+ NCCL WARN warn line"), "\"%s\"", l.text);
}

/* Every knob that is set, and where from; the NCCL_* variables no knob reads, in one line. */
static void test_env_lines(void) {
  char conf[300];
  log_t l;
  static const char *const env[] = {
      "NCCL_DEBUG=INFO",    "NCCL_DEBUG_SUBSYS=ENV", "BRAID_TIMEOUT_S=100",    "NCCL_PROTO=LL,Simple",
      "NCCL_IB_HCA=mlx5_0", "NCCL_NCHANNELS=4",      "NCCL_TESTS_SPLIT=AND 1", NULL};
  start_log(&l, env);
  snprintf(conf, sizeof conf, "%s/nccl.conf", l.dir);
  FILE *f = fopen(conf, "w");
  EXPECT(f != NULL);
  fprintf(f, "BRAID_HOST_BUFFSIZE=65536\nNCCL_P2P_LEVEL=NVL\n");
  fclose(f);
  setenv("NCCL_CONF_FILE", conf, 1);
  param_reload();
  log_params_set();
  unlink(conf);
  end_log(&l);
  EXPECT(has_line(l.text, HOST_PID_TID "\\[-1\\] NCCL INFO BRAID_TIMEOUT_S set by environment to 100\\."),
         "\"%s\"", l.text);
  EXPECT(has_line(l.text, HOST_PID_TID "\\[-1\\] NCCL INFO NCCL_PROTO set by environment to LL,Simple"),
         "\"%s\"", l.text);
  EXPECT(has_line(l.text, HOST_PID_TID "\\[-1\\] NCCL INFO BRAID_HOST_BUFFSIZE set by configuration file "
                                       ".*/nccl\\.conf to 65536"),
         "\"%s\"", l.text);
  EXPECT(has_line(l.text, HOST_PID_TID "\\[-1\\] NCCL INFO NCCL variables set that Braid does not implement "
                                       "\\(ignored\\): NCCL_IB_HCA NCCL_NCHANNELS"),
         "\"%s\"", l.text);
  EXPECT(strstr(l.text, "NCCL_TESTS_SPLIT") == NULL &&
         strstr(l.text, "TIMEOUT_S set by environment to 100.\n"));
  EXPECT(strstr(l.text, "NCCL_DEBUG_SUBSYS set by environment to ENV") != NULL, "\"%s\"", l.text);
}

int main(void) {
  TEST(test_banner, 10);
  TEST(test_warn_line, 10);
  TEST(test_timestamps, 10);
  TEST(test_env_lines, 10);
  return test_summary();
}
