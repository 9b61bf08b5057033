/*
 * Tests of the network plugin loader (src/transport/net_plugin.c) and of the net transport over plugins of
 * each version, with the stand-in plugins of tests/net/plugins: Braid's TCP network exported as v6 only
 * ("StandinV6"), v9 only, v11 only, all of v6 to v11 at once (libnccl-net-braid.so, "Braid"), a plugin whose
 * init fails or that has no devices (libnccl-net-fake.so, "Fake"), and one that exports only a v5 symbol.
 *
 * The program runs itself again with the plugins' folder on LD_LIBRARY_PATH, where `libnccl-net.so` is the v9
 * stand-in, so that library names are found as NCCL finds them. Each case is a process of its own (the loader
 * works once per process); log lines go to a file the case then reads.
 */
#include "harness.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "transport/net_plugin.h"
#include "transport/transport.h"

static char log_path[256];

/* Sets the loader's knobs (NULL: unset) and sends the log to a file of this case. */
static void setup(const char *plugin, const char *fake_faults) {
  if (plugin != NULL)
    setenv("NCCL_NET_PLUGIN", plugin, 1);
  else
    unsetenv("NCCL_NET_PLUGIN");
  if (fake_faults != NULL) setenv("BRAID_FAKE_NET", fake_faults, 1);
  snprintf(log_path, sizeof log_path, "/tmp/braid-netplugin-%d.log", (int)getpid());
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  setenv("NCCL_DEBUG_FILE", log_path, 1);
  param_reload();
  log_init();
}

/* Lines of this case's log holding `part` (the file is removed by the last check of a case). */
static int log_lines(const char *part) {
  return test_file_lines(log_path, part);
}

/* Opens a network for a communicator and checks which one came. */
static np_ctx_t open_expect(const char *want, const char *name, int version) {
  np_ctx_t c;
  EXPECT_OK(np_open(want, 0x1234, &c));
  EXPECT(strcmp(np_name(c.net), name) == 0, "got network %s, expected %s", np_name(c.net), name);
  EXPECT(np_version(c.net) == version, "%s at v%d, expected v%d", name, np_version(c.net), version);
  EXPECT(np_ndevs(c.net) >= 1);
  return c;
}

static void finish(np_ctx_t *c) {
  np_close(c);
  unlink(log_path);
}

/* Unset NCCL_NET_PLUGIN: libnccl-net.so (the v9 stand-in here) comes first. */
static void test_default_library(void) {
  setup(NULL, NULL);
  np_ctx_t c = open_expect(NULL, "StandinV9", 9);
  EXPECT(strstr(np_lib(c.net), "libnccl-net.so") != NULL, "loaded from %s", np_lib(c.net));
  finish(&c);
}

/* A short name is tried as given, then as libnccl-net-NAME.so; a missing one is one line, then the next. */
static void test_search_order(void) {
  setup("nosuch,v6", NULL);
  np_ctx_t c = open_expect(NULL, "StandinV6", 6);
  EXPECT(strstr(np_lib(c.net), "libnccl-net-v6.so") != NULL, "loaded from %s", np_lib(c.net));
  EXPECT(log_lines("could not find: nosuch libnccl-net-nosuch.so") == 1, "see %s", log_path);
  EXPECT(log_lines("NCCL WARN") == 1, "one warning only, see %s", log_path);
  finish(&c);
}

/* A path is used as given; a library name is not prefixed again. */
static void test_path(void) {
  setup(BRAID_NET_PLUGIN_DIR "/libnccl-net-v11.so", NULL);
  np_ctx_t c = open_expect(NULL, "StandinV11", 11);
  finish(&c);
}

static void test_library_name(void) {
  setup("libnccl-net-v9.so", NULL);
  np_ctx_t c = open_expect(NULL, "StandinV9", 9);
  EXPECT(log_lines("libnccl-net-libnccl") == 0, "see %s", log_path);
  finish(&c);
}

/* A library exporting v6 to v11 is used at v11. */
static void test_newest_version(void) {
  setup(BRAID_NET_BRAID_LIB, NULL);
  np_ctx_t c = open_expect(NULL, "Braid", 11);
  finish(&c);
}

/* none (any case) and an empty value load no library: the built-in network. */
static void test_none(void) {
  setup("NONE", NULL);
  np_ctx_t c = open_expect(NULL, "Socket", 11);
  EXPECT(strcmp(np_lib(c.net), "built-in") == 0);
  finish(&c);
  setup("", NULL);
  c = open_expect(NULL, "Socket", 11);
  finish(&c);
}

/* NCCL_NET picks by name, ignoring case; a name nobody offers fails, listing what was found. */
static void test_net_name(void) {
  setup("v9,v6", NULL);
  np_ctx_t c = open_expect("standinv6", "StandinV6", 6);
  np_close(&c);
  c = open_expect("SOCKET", "Socket", 11);
  np_close(&c);
  EXPECT_RES(np_open("Verbs", 1, &c), ncclInvalidUsage);
  const char *err = log_last_error();
  EXPECT(strstr(err, "NCCL_NET=Verbs") != NULL && strstr(err, "StandinV9") != NULL &&
             strstr(err, "StandinV6") != NULL && strstr(err, "Socket (built-in") != NULL,
         "message '%s'", err);
  unlink(log_path);
}

/* A plugin whose init fails, or that has no devices, is one warning naming it; the next network is used. */
static void test_init_fails(void) {
  setup("fake,v9", "init_fails");
  np_ctx_t c = open_expect(NULL, "StandinV9", 9);
  EXPECT(log_lines("WARN NET/Plugin: network Fake (") == 1 && log_lines("failed to initialise") == 1,
         "see %s", log_path);
  EXPECT(log_lines("libnccl-net-fake.so") >= 1, "the library is named, see %s", log_path);
  finish(&c);
}

static void test_no_devices(void) {
  setup("fake", "no_devices");
  np_ctx_t c = open_expect(NULL, "Socket", 11);
  EXPECT(log_lines("reports no devices") == 1, "see %s", log_path);
  EXPECT_RES(np_open("fake", 1, &c), ncclInvalidUsage);
  EXPECT(strstr(log_last_error(), "not usable") != NULL, "message '%s'", log_last_error());
  unlink(log_path);
}

/* A file that is there but no library is one warning naming it and why; then the next network. */
static void test_not_a_library(void) {
  char path[128];
  snprintf(path, sizeof path, "/tmp/braid-notalib-%d.so", (int)getpid());
  FILE *f = fopen(path, "w");
  EXPECT(f != NULL && fputs("not an ELF file\n", f) >= 0 && fclose(f) == 0);
  char spec[160];
  snprintf(spec, sizeof spec, "%s,v11", path);
  setup(spec, NULL);
  np_ctx_t c = open_expect(NULL, "StandinV11", 11);
  char line[200];
  snprintf(line, sizeof line, "NET/Plugin: %s cannot be loaded:", path);
  EXPECT(log_lines(line) == 1 && log_lines("NCCL WARN") == 1, "see %s", log_path);
  unlink(path);
  finish(&c);
}

/* A library exporting only versions below 6 is refused by name. */
static void test_unsupported_version(void) {
  setup("fake-old", NULL);
  np_ctx_t c = open_expect(NULL, "Socket", 11);
  EXPECT(log_lines("exports only ncclNetPlugin_v5") == 1, "see %s", log_path);
  finish(&c);
}

/* ---- Data through each version ---- */

/* Two transport contexts of this process, ranks 0 and 1 of "different hosts", over the network `name`. */
static void stream_over(const char *plugin, const char *want, const char *name) {
  setup(plugin, NULL);
  setenv("NCCL_NET", want, 1);
  param_reload();
  volatile int abort_flag = 0;
  tp_peer_t peers[2] = {{.host_hash = 1, .pid = getpid(), .dev = -1},
                        {.host_hash = 2, .pid = getpid(), .dev = -1}};
  tp_ctx_t *ctx[2];
  for (int r = 0; r < 2; r++) {
    tp_config_t cfg = {
        .rank = r, .nranks = 2, .nonce = 77, .peers = peers, .abort_flag = &abort_flag, .ring_bytes = 40000};
    EXPECT_OK(tp_init(&cfg, &ctx[r]));
  }
  EXPECT(tp_select(ctx[0], 1) == &tp_net_ops);
  char blob[TP_BLOB_BYTES];
  tp_conn_t *s, *r;
  EXPECT_OK(tp_net_ops.listen(ctx[1], 0, blob, &r));
  EXPECT_OK(tp_net_ops.connect(ctx[0], 1, blob, &s));
  EXPECT_OK(tp_net_ops.accept(ctx[1], r));
  uint64_t total = 3 << 20, sent = 0, got = 0, rng = 99;
  for (double start = time_now(); got < total && time_now() - start < 30;) {
    void *p;
    size_t n;
    int done;
    EXPECT_OK(s->ops->send_peek(s, &p, &n));
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    if (n > total - sent) n = total - sent;
    n = (rng >> 33) % 3 == 0 ? n / 3 : n;
    for (size_t i = 0; i < n; i++) ((unsigned char *)p)[i] = (unsigned char)((sent + i) * 131 >> 3);
    EXPECT_OK(s->ops->send_commit(s, n));
    sent += n;
    EXPECT_OK(s->ops->flush(s, &done));
    EXPECT_OK(r->ops->recv_peek(r, &p, &n));
    for (size_t i = 0; i < n; i++)
      EXPECT(((unsigned char *)p)[i] == (unsigned char)((got + i) * 131 >> 3), "byte %llu",
             (unsigned long long)(got + i));
    EXPECT_OK(r->ops->recv_release(r, n));
    got += n;
  }
  EXPECT(got == total, "%llu of %llu bytes arrived", (unsigned long long)got, (unsigned long long)total);
  char line[64];
  snprintf(line, sizeof line, "Using network %s", name);
  EXPECT(log_lines(line) == 2, "see %s", log_path);
  s->ops->close(s);
  r->ops->close(r);
  tp_destroy(ctx[0]);
  tp_destroy(ctx[1]);
  unlink(log_path);
}

static void test_stream_v6(void) {
  stream_over("v6", "StandinV6", "StandinV6");
}

static void test_stream_v9(void) {
  stream_over("v9", "STANDINV9", "StandinV9");
}

static void test_stream_v11(void) {
  stream_over("v11", "StandinV11", "StandinV11");
}

static void test_stream_builtin(void) {
  stream_over("none", "socket", "Socket");
}

int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_NET_PLUGIN_DIR);
  test_filter(argc - 1, argv + 1);
  TEST(test_default_library, 20);
  TEST(test_search_order, 20);
  TEST(test_path, 20);
  TEST(test_library_name, 20);
  TEST(test_newest_version, 20);
  TEST(test_none, 20);
  TEST(test_net_name, 20);
  TEST(test_init_fails, 20);
  TEST(test_no_devices, 20);
  TEST(test_unsupported_version, 20);
  TEST(test_not_a_library, 20);
  TEST(test_stream_v6, 60);
  TEST(test_stream_v9, 60);
  TEST(test_stream_v11, 60);
  TEST(test_stream_builtin, 60);
  return test_summary();
}
