/*
 * Tests of base/param: defaults, values from the environment, from NCCL_CONF_FILE and from ~/.nccl.conf,
 * which source wins, how integers are parsed, and the declarations in params.def. Each case runs in its own
 * process, points HOME at an empty temporary folder and clears the knobs it reads, so the caller's settings
 * never leak in.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/param.h"
#include "harness.h"

/* The knobs the cases read; cleared before each case. */
static const char *const used_knobs[] = {"BRAID_TIMEOUT_S",     "BRAID_DEVICE",       "BRAID_CONNECT_RETRIES",
                                         "BRAID_HOST_BUFFSIZE", "NCCL_SOCKET_IFNAME", "NCCL_CONF_FILE"};

/* A fresh temporary folder, its path written into dir. */
static void make_temp_dir(char *dir, size_t len) {
  snprintf(dir, len, "/tmp/braid_test_param_XXXXXX");
  EXPECT(mkdtemp(dir) != NULL, "mkdtemp failed");
}

/* Writes text into dir/name and the file's path into path. */
static void write_file(const char *dir, const char *name, const char *text, char *path, size_t len) {
  snprintf(path, len, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  EXPECT(f != NULL, "cannot create %s", path);
  EXPECT(fputs(text, f) >= 0);
  EXPECT(fclose(f) == 0);
}

/* Clears the knobs the cases use and points HOME at an empty folder (kept in home). */
static void isolate(char *home, size_t len) {
  for (size_t i = 0; i < sizeof used_knobs / sizeof used_knobs[0]; i++) unsetenv(used_knobs[i]);
  make_temp_dir(home, len);
  setenv("HOME", home, 1);
  param_reload();
}

static void expect_int(param_id_t id, int64_t want, const char *source) {
  EXPECT(param_int(id) == want, "%s = %lld, expected %lld", param_name(id), (long long)param_int(id),
         (long long)want);
  EXPECT(strcmp(param_source(id), source) == 0, "%s from %s, expected %s", param_name(id), param_source(id),
         source);
}

static void expect_str(param_id_t id, const char *want, const char *source) {
  EXPECT(strcmp(param_str(id), want) == 0, "%s = \"%s\", expected \"%s\"", param_name(id), param_str(id),
         want);
  EXPECT(strcmp(param_source(id), source) == 0, "%s from %s, expected %s", param_name(id), param_source(id),
         source);
}

static void test_defaults(void) {
  char home[256];
  isolate(home, sizeof home);
  expect_int(P_BRAID_TIMEOUT_S, 1800, "default");
  expect_str(P_BRAID_DEVICE, "auto", "default");
  expect_str(P_NCCL_SOCKET_IFNAME, "", "default");
  EXPECT(!param_is_set(P_BRAID_TIMEOUT_S));
  EXPECT(!param_is_set(P_BRAID_DEVICE));
  EXPECT(!param_is_set(P_NCCL_SOCKET_IFNAME));
  rmdir(home);
}

static void test_environment(void) {
  char home[256];
  isolate(home, sizeof home);
  setenv("BRAID_TIMEOUT_S", "42", 1);
  setenv("BRAID_DEVICE", "host", 1);
  param_reload();
  expect_int(P_BRAID_TIMEOUT_S, 42, "env");
  expect_str(P_BRAID_DEVICE, "host", "env");
  EXPECT(param_is_set(P_BRAID_TIMEOUT_S) && param_is_set(P_BRAID_DEVICE));
  /* A reload after the variable is gone goes back to the default. */
  unsetenv("BRAID_TIMEOUT_S");
  param_reload();
  expect_int(P_BRAID_TIMEOUT_S, 1800, "default");
  rmdir(home);
}

static void test_integer_parsing(void) {
  char home[256];
  isolate(home, sizeof home);
  setenv("BRAID_TIMEOUT_S", "0x10", 1);
  setenv("BRAID_CONNECT_RETRIES", "-3", 1);
  param_reload();
  expect_int(P_BRAID_TIMEOUT_S, 16, "env");
  expect_int(P_BRAID_CONNECT_RETRIES, -3, "env");
  /* Bad integers keep the default (and say so on stderr). */
  setenv("BRAID_TIMEOUT_S", "12abc", 1);
  setenv("BRAID_CONNECT_RETRIES", "", 1);
  setenv("BRAID_HOST_BUFFSIZE", "99999999999999999999999", 1);
  param_reload();
  expect_int(P_BRAID_TIMEOUT_S, 1800, "default");
  expect_int(P_BRAID_CONNECT_RETRIES, 50, "default");
  expect_int(P_BRAID_HOST_BUFFSIZE, 1048576, "default");
  EXPECT(!param_is_set(P_BRAID_TIMEOUT_S));
  rmdir(home);
}

static const char conf_text[] = "# a comment line\n"
                                "\n"
                                "BRAID_TIMEOUT_S = 77\n"
                                "   # an indented comment\n"
                                "BRAID_DEVICE=cuda\n"
                                "NOT_A_KNOB=5\n"
                                "no equals sign here\n"
                                "  NCCL_SOCKET_IFNAME\t=  eth0,ib  \n";

static void test_conf_file(void) {
  char home[256], path[512];
  isolate(home, sizeof home);
  write_file(home, "braid.conf", conf_text, path, sizeof path);
  setenv("NCCL_CONF_FILE", path, 1);
  param_reload();
  expect_int(P_BRAID_TIMEOUT_S, 77, path);
  expect_str(P_BRAID_DEVICE, "cuda", path);
  expect_str(P_NCCL_SOCKET_IFNAME, "eth0,ib", path);
  EXPECT(param_is_set(P_BRAID_DEVICE));
  expect_int(P_BRAID_CONNECT_RETRIES, 50, "default");
  unlink(path);
  rmdir(home);
}

static void test_env_beats_file(void) {
  char home[256], path[512];
  isolate(home, sizeof home);
  write_file(home, "braid.conf", conf_text, path, sizeof path);
  setenv("NCCL_CONF_FILE", path, 1);
  setenv("BRAID_TIMEOUT_S", "5", 1);
  setenv("BRAID_DEVICE", "host", 1);
  param_reload();
  expect_int(P_BRAID_TIMEOUT_S, 5, "env");
  expect_str(P_BRAID_DEVICE, "host", "env");
  expect_str(P_NCCL_SOCKET_IFNAME, "eth0,ib", path);
  unlink(path);
  rmdir(home);
}

static void test_home_conf(void) {
  char home[256], home_conf[512], other[512];
  isolate(home, sizeof home);
  write_file(home, ".nccl.conf", "BRAID_TIMEOUT_S=11\nBRAID_DEVICE=host\n", home_conf, sizeof home_conf);
  param_reload();
  expect_int(P_BRAID_TIMEOUT_S, 11, home_conf);
  expect_str(P_BRAID_DEVICE, "host", home_conf);
  /* NCCL_CONF_FILE replaces ~/.nccl.conf: knobs only the home file sets go back to their defaults. */
  write_file(home, "other.conf", "BRAID_TIMEOUT_S=22\n", other, sizeof other);
  setenv("NCCL_CONF_FILE", other, 1);
  param_reload();
  expect_int(P_BRAID_TIMEOUT_S, 22, other);
  expect_str(P_BRAID_DEVICE, "auto", "default");
  unlink(home_conf);
  unlink(other);
  rmdir(home);
}

static void test_format(void) {
  char home[256], buf[64];
  isolate(home, sizeof home);
  setenv("BRAID_TIMEOUT_S", "0x20", 1);
  setenv("NCCL_SOCKET_IFNAME", "^docker,lo", 1);
  param_reload();
  param_format(P_BRAID_TIMEOUT_S, buf, sizeof buf);
  EXPECT(strcmp(buf, "32") == 0, "got \"%s\"", buf);
  param_format(P_NCCL_SOCKET_IFNAME, buf, sizeof buf);
  EXPECT(strcmp(buf, "^docker,lo") == 0, "got \"%s\"", buf);
  param_format(P_BRAID_DEVICE, buf, sizeof buf);
  EXPECT(strcmp(buf, "auto") == 0, "got \"%s\"", buf);
  param_format(P_BRAID_HOST_BUFFSIZE, buf, 4);
  EXPECT(strcmp(buf, "104") == 0, "a short buffer holds a truncated value, got \"%s\"", buf);
  rmdir(home);
}

static void test_declarations(void) {
  for (int i = 0; i < P_COUNT; i++) {
    const char *name = param_name((param_id_t)i);
    const char *help = param_help((param_id_t)i);
    EXPECT(name != NULL && name[0] != '\0', "knob %d has no name", i);
    EXPECT(help != NULL && help[0] != '\0', "%s has no help", name);
    EXPECT(strncmp(name, "NCCL_", 5) == 0 || strncmp(name, "BRAID_", 6) == 0, "%s: bad prefix", name);
    for (int j = 0; j < i; j++)
      EXPECT(strcmp(name, param_name((param_id_t)j)) != 0, "%s declared twice", name);
  }
}

/* A string another thread read stays readable, with the value it had, while the knobs are read again
 * (ncclResetDebugInit): a reload never frees a string it handed out. */
static void test_reload_keeps_strings(void) {
  char home[256];
  isolate(home, sizeof home);
  setenv("NCCL_SOCKET_IFNAME", "=eth7", 1);
  param_reload();
  const char *before = param_str(P_NCCL_SOCKET_IFNAME), *source = param_source(P_NCCL_SOCKET_IFNAME);
  for (int i = 0; i < 4; i++) {
    setenv("NCCL_SOCKET_IFNAME", i % 2 ? "^lo,docker" : "=eth8", 1);
    param_reload();
  }
  EXPECT(strcmp(before, "=eth7") == 0, "a string read before the reload now reads \"%s\"", before);
  EXPECT(strcmp(source, "env") == 0, "a source read before the reload now reads \"%s\"", source);
  expect_str(P_NCCL_SOCKET_IFNAME, "^lo,docker", "env");
}

/* Readers on other threads while one thread reloads (what the thread sanitizer build checks). */
static void *read_knobs(void *arg) {
  volatile size_t sum = 0;
  for (int i = 0; i < 20000; i++)
    sum += strlen(param_str(P_NCCL_SOCKET_IFNAME)) + (size_t)param_int(P_BRAID_TIMEOUT_S);
  (void)arg;
  return (void *)(uintptr_t)(sum == 0); /* read, so no compiler calls it unused */
}

static void test_reload_under_readers(void) {
  char home[256];
  isolate(home, sizeof home);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) EXPECT(pthread_create(&t[i], NULL, read_knobs, NULL) == 0);
  for (int i = 0; i < 200; i++) {
    setenv("NCCL_SOCKET_IFNAME", i % 2 ? "=eth7" : "^lo", 1);
    setenv("BRAID_TIMEOUT_S", i % 2 ? "7" : "9", 1);
    param_reload();
  }
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  expect_int(P_BRAID_TIMEOUT_S, 7, "env");
}

int main(void) {
  TEST(test_defaults, 10);
  TEST(test_environment, 10);
  TEST(test_integer_parsing, 10);
  TEST(test_conf_file, 10);
  TEST(test_env_beats_file, 10);
  TEST(test_home_conf, 10);
  TEST(test_format, 10);
  TEST(test_declarations, 10);
  TEST(test_reload_keeps_strings, 10);
  TEST(test_reload_under_readers, 30);
  return test_summary();
}
