/*
 * Tests of gpu/gpu_cuda against a stand-in driver (mock_cuda.c, loaded as libcuda.so.1): entry points
 * resolved for CUDA 12.0, the backend choice, devices and primary contexts, device memory of both kinds
 * exported to and imported by other processes, ncclMemAlloc's registry, pinned host memory, events, capture,
 * the kernel cache and launches, and failures reported with the driver call's name and values.
 *
 * In a build without CUDA's headers the mock is not built and the interface refuses every device call: that
 * is what is tested then.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "device/dev.h"
#include "gpu/gpu.h"
#include "gpu/gpu_cuda.h"
#include "harness.h"

#ifdef BRAID_MOCK_CUDA_DIR

#include "mock_cuda.h"

/* The mock's counters; valid once the library loaded the driver. */
static mock_cuda_stats_t *stats(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  EXPECT(lib != NULL, "the driver is not loaded");
  mock_cuda_stats_t *s = dlsym(lib, "mock_cuda_stats");
  EXPECT(s != NULL, "the loaded libcuda.so.1 is not the mock");
  return s;
}

static void set_param(const char *name, const char *value) {
  setenv(name, value, 1);
  param_reload();
}

static int contains(const char *text, const char *part) {
  return strstr(text, part) != NULL;
}

static void test_devices(void) {
  int n = 0, sms = 0, yes = 0;
  EXPECT_OK(gpu_device_count(&n));
  EXPECT(n == 2, "%d devices", n);
  EXPECT(stats()->proc_version == 12000 && stats()->legacy_stream,
         "entry points resolved for version %d, legacy stream %d", stats()->proc_version,
         stats()->legacy_stream);
  EXPECT_OK(gpu_device_sms(1, &sms));
  EXPECT(sms == MOCK_CUDA_SMS);
  char busid[16];
  EXPECT_OK(gpu_device_busid(1, busid));
  EXPECT(strcmp(busid, "0000:1b:00.0") == 0, "bus id %s", busid);
  EXPECT_OK(gpu_can_access_peer(0, 1, &yes));
  EXPECT(yes == 1);
  EXPECT_OK(gpu_can_access_peer(1, 1, &yes));
  EXPECT(yes == 1);
  EXPECT_RES(gpu_device_sms(2, &sms), ncclInvalidArgument);
  EXPECT(contains(log_last_error(), "device 2 does not exist"), "message: %s", log_last_error());
}

static void test_contexts(void) {
  int dev = -1;
  EXPECT_OK(gpu_current_device(&dev));
  EXPECT(dev == 0, "no context current, yet device %d", dev);
  gpu_scope_t outer, inner;
  EXPECT_OK(gpu_enter(1, &outer));
  EXPECT(outer.switched == 1 && outer.saved == NULL);
  EXPECT_OK(gpu_current_device(&dev));
  EXPECT(dev == 1);
  EXPECT_OK(gpu_enter(1, &inner));
  EXPECT(inner.switched == 0, "entering the current device again switched contexts");
  gpu_leave(&inner);
  EXPECT_OK(gpu_enter(0, &inner));
  EXPECT_OK(gpu_current_device(&dev));
  EXPECT(dev == 0);
  gpu_leave(&inner);
  EXPECT_OK(gpu_current_device(&dev));
  EXPECT(dev == 1, "leaving device 0 did not restore device 1");
  gpu_leave(&outer);
  for (int i = 0; i < 5; i++) {
    EXPECT_OK(gpu_enter(1, &outer));
    gpu_leave(&outer);
  }
  EXPECT(stats()->retains == 2, "%d primary-context retains for 2 devices", stats()->retains);
  EXPECT_OK(gpu_enable_peer_access(0, 1));
  EXPECT_OK(gpu_enable_peer_access(0, 1)); /* already enabled is fine */
  EXPECT_OK(gpu_enable_peer_access(1, 1));
}

static void expect_filled(const unsigned char *p, size_t n, unsigned char v, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) test_fail(__FILE__, __LINE__, "%s: byte %zu is %u, expected %u", what, i, p[i], v);
}

static void test_dev_alloc(void) {
  gpu_mem_t *m = NULL;
  EXPECT_OK(gpu_dev_alloc(1, 100000, &m));
  EXPECT(gpu_mem_size(m) == 2 * MOCK_CUDA_GRANULARITY, "size %zu: not rounded to the granularity",
         gpu_mem_size(m));
  expect_filled(gpu_mem_ptr(m), gpu_mem_size(m), 0, "a fresh allocation");
  EXPECT(stats()->last_create_device == 1);
  EXPECT(stats()->last_access_devices == 2, "access granted to %d devices (owner and its peer expected)",
         stats()->last_access_devices);
  int dev = -1;
  EXPECT_OK(gpu_current_device(&dev));
  EXPECT(dev == 0, "gpu_dev_alloc left device %d current", dev);
  gpu_mem_release(m);
  mock_cuda_stats_t *s = stats();
  EXPECT(s->live_handles == 0 && s->live_maps == 0 && s->live_ranges == 0,
         "leaked: %d handles, %d maps, %d ranges", s->live_handles, s->live_maps, s->live_ranges);
}

static void test_out_of_memory(void) {
  gpu_mem_t *m = NULL;
  EXPECT_RES(gpu_dev_alloc(0, (size_t)MOCK_CUDA_MEM_LIMIT * 2, &m), ncclUnhandledCudaError);
  const char *msg = log_last_error();
  EXPECT(contains(msg, "out of device memory") && contains(msg, "cuMemCreate") &&
             contains(msg, "8589934592 bytes") && contains(msg, "CUDA_ERROR_OUT_OF_MEMORY"),
         "message: %s", msg);
  EXPECT(stats()->live_handles == 0 && stats()->live_ranges == 0);
}

/* What the importing children of one case share. */
typedef struct {
  gpu_export_t blob;
  size_t bytes;
} shared_t;

static void import_rank(int rank, int nranks, void *arg) {
  shared_t *sh = arg;
  mock_cuda_stats_t before = *stats(); /* the owner's allocation is counted too: it was live at the fork */
  gpu_mem_t *m = NULL;
  EXPECT_OK(gpu_mem_import(rank % 2, &sh->blob, &m));
  EXPECT(gpu_mem_size(m) == sh->bytes);
  unsigned char *p = gpu_mem_ptr(m);
  for (size_t i = 0; i < 4096; i++) EXPECT(p[i] == (unsigned char)(i * 7), "byte %zu", i);
  p[4096 + rank] = (unsigned char)(0xC0 + rank); /* the owner sees this: the memory is shared, not copied */
  if (getenv("MOCK_CUDA_NO_VMM") == NULL) EXPECT(stats()->last_access_devices == 1);
  gpu_mem_release(m);
  mock_cuda_stats_t *s = stats();
  EXPECT(s->live_handles == before.live_handles && s->live_maps == before.live_maps &&
             s->live_ranges == before.live_ranges && s->live_legacy == before.live_legacy,
         "leaked: %d handles, %d maps, %d ranges, %d legacy", s->live_handles - before.live_handles,
         s->live_maps - before.live_maps, s->live_ranges - before.live_ranges,
         s->live_legacy - before.live_legacy);
}

/* Allocates on device 0, exports, lets children import and write, and checks what they wrote. */
static void export_import(void) {
  shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(sh != MAP_FAILED);
  gpu_mem_t *m = NULL;
  EXPECT_OK(gpu_dev_alloc(0, 3 * MOCK_CUDA_GRANULARITY, &m));
  sh->bytes = gpu_mem_size(m);
  unsigned char *p = gpu_mem_ptr(m);
  for (size_t i = 0; i < 4096; i++) p[i] = (unsigned char)(i * 7);
  EXPECT_OK(gpu_mem_export(m, &sh->blob));
  gpu_export_t again;
  EXPECT_OK(gpu_mem_export(m, &again)); /* a second export describes the same allocation */
  EXPECT(memcmp(&again, &sh->blob, sizeof again) == 0);
  EXPECT(run_ranks(4, 30, import_rank, sh) == 0);
  for (int r = 0; r < 4; r++) EXPECT(p[4096 + r] == 0xC0 + r, "rank %d's write is missing", r);

  gpu_mem_t *self = NULL;
  EXPECT_RES(gpu_mem_import(1, &sh->blob, &self), ncclInvalidUsage);
  EXPECT(contains(log_last_error(), "this same process"), "message: %s", log_last_error());
  gpu_export_t bad = sh->blob;
  bad.bytes[0] ^= 0xFF;
  EXPECT_RES(gpu_mem_import(1, &bad, &self), ncclInvalidArgument);
  gpu_mem_release(m);
  munmap(sh, sizeof *sh);
}

static void test_export_import_cumem(void) {
  export_import();
  EXPECT(stats()->live_handles == 0 && stats()->live_ranges == 0);
}

static void test_export_import_legacy(void) {
  setenv("MOCK_CUDA_NO_VMM", "1", 1);
  export_import();
  EXPECT(stats()->live_legacy == 0);
}

static void import_released(int rank, int nranks, void *arg) {
  gpu_mem_t *m = NULL;
  EXPECT_RES(gpu_mem_import(0, arg, &m), ncclSystemError);
  EXPECT(contains(log_last_error(), "serves no descriptor"), "message: %s", log_last_error());
}

static void test_import_after_release(void) {
  gpu_export_t *blob = mmap(NULL, sizeof *blob, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  gpu_mem_t *m = NULL;
  EXPECT_OK(gpu_dev_alloc(0, 1, &m));
  EXPECT_OK(gpu_mem_export(m, blob));
  gpu_mem_release(m);
  EXPECT(run_ranks(1, 30, import_released, blob) == 0);
}

static void test_mem_alloc_registry(void) {
  gpu_scope_t scope;
  EXPECT_OK(gpu_enter(1, &scope));
  void *p = NULL, *q = NULL;
  EXPECT_OK(gpu_cuda_mem_alloc(1000, &p));
  EXPECT(stats()->last_create_device == 1, "ncclMemAlloc did not allocate on the current device");
  EXPECT(stats()->last_access_devices == 2);
  EXPECT_OK(gpu_cuda_mem_alloc(5000, &q));
  gpu_leave(&scope);
  EXPECT_OK(gpu_cuda_mem_free(p));
  EXPECT_RES(gpu_cuda_mem_free(p), ncclInvalidArgument);
  EXPECT(contains(log_last_error(), "not allocated by ncclMemAlloc"), "message: %s", log_last_error());
  int x;
  EXPECT_RES(gpu_cuda_mem_free(&x), ncclInvalidArgument);
  EXPECT_OK(gpu_cuda_mem_free(q));
  EXPECT(stats()->live_handles == 0 && stats()->live_maps == 0);
}

static void test_host_memory(void) {
  void *host = NULL, *dev = NULL;
  EXPECT_OK(gpu_host_alloc(10000, &host, &dev));
  EXPECT(host != NULL && dev != NULL);
  expect_filled(host, 10000, 0, "pinned host memory");
  char src[64] = "copied to the device";
  EXPECT_OK(gpu_copy_to_device(dev, src, sizeof src));
  EXPECT(strcmp(host, src) == 0);
  gpu_host_free(host);
  static char buf[8192];
  EXPECT_OK(gpu_host_register(buf, sizeof buf, &dev));
  EXPECT(dev == buf);
  gpu_host_unregister(buf);
  EXPECT(stats()->live_host == 0, "%d pinned allocations or registrations left", stats()->live_host);
}

static void test_events_and_streams(void) {
  gpu_scope_t scope;
  EXPECT_OK(gpu_enter(0, &scope));
  gpu_event_t *ev = NULL;
  EXPECT_OK(gpu_event_create(&ev));
  EXPECT_OK(gpu_event_record(ev, NULL));
  EXPECT_OK(gpu_stream_wait(NULL, ev));
  int yes = -1;
  void *graph;
  uint64_t id;
  EXPECT_OK(gpu_stream_capture(NULL, &yes, &graph, &id));
  EXPECT(yes == 0);
  EXPECT_OK(gpu_stream_capture((cudaStream_t)MOCK_CUDA_CAPTURING, &yes, &graph, &id));
  EXPECT(yes == 1);
  EXPECT_OK(gpu_stream_sync(NULL));
  gpu_event_destroy(ev);
  EXPECT(stats()->live_events == 0);
  gpu_leave(&scope);
}

static void count_release(void *arg) {
  (*(int *)arg)++;
}

/* Capture queries give the graph, which holds a release callback until it is destroyed; the capture mode is
 * relaxed and put back. */
static void test_graph_holds(void) {
  gpu_scope_t scope;
  EXPECT_OK(gpu_enter(0, &scope));
  int yes = -1;
  void *graph = (void *)1;
  uint64_t id = 1;
  EXPECT_OK(gpu_stream_capture(NULL, &yes, &graph, &id));
  EXPECT(yes == 0 && graph == NULL && id == 0);
  EXPECT_OK(gpu_stream_capture((cudaStream_t)MOCK_CUDA_CAPTURING, &yes, &graph, &id));
  EXPECT(yes == 1 && graph != NULL && id == 7);
  int released = 0;
  EXPECT_OK(gpu_graph_hold(graph, count_release, &released));
  EXPECT_OK(gpu_graph_hold(graph, count_release, &released));
  EXPECT(released == 0);
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *sym = lib != NULL ? dlsym(lib, MOCK_CUDA_GRAPH_DESTROY) : NULL;
  EXPECT(sym != NULL, "the stand-in driver exports %s", MOCK_CUDA_GRAPH_DESTROY);
  mock_cuda_graph_destroy_fn destroy;
  memcpy(&destroy, &sym, sizeof sym);
  EXPECT(destroy() == 2 && released == 2, "%d releases ran", released);
  int saved = -1;
  EXPECT_OK(gpu_capture_relax(&saved));
  EXPECT(stats()->capture_mode == 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */ && saved == 0);
  gpu_capture_restore(saved);
  EXPECT(stats()->capture_mode == 0);
  gpu_leave(&scope);
}

static void test_kernels(void) {
  static const unsigned char fatbin[16] = {1};
  gpu_func_t *f0 = NULL, *f0again = NULL, *f1 = NULL, *bad = NULL;
  EXPECT_OK(gpu_func_load(0, (const void *[]){fatbin}, 1, MOCK_CUDA_KERNEL, &f0));
  EXPECT_OK(gpu_func_load(0, (const void *[]){fatbin}, 1, MOCK_CUDA_KERNEL, &f0again));
  EXPECT(f0 == f0again && stats()->module_loads == 1, "%d modules loaded", stats()->module_loads);
  EXPECT_OK(gpu_func_load(1, (const void *[]){fatbin}, 1, MOCK_CUDA_KERNEL, &f1));
  EXPECT(stats()->module_loads == 2, "one module per device expected, %d loaded", stats()->module_loads);
  EXPECT_RES(gpu_func_load(1, (const void *[]){fatbin}, 1, "missing_kernel", &bad), ncclUnhandledCudaError);
  EXPECT(contains(log_last_error(), "cuModuleGetFunction") &&
             contains(log_last_error(), "CUDA_ERROR_NOT_FOUND") &&
             contains(log_last_error(), "missing_kernel"),
         "message: %s", log_last_error());
  EXPECT(stats()->module_loads == 2, "a failed look-up loaded or unloaded a module");
  struct {
    uint64_t tag;
    char rest[3000];
  } param = {.tag = 0x0123456789abcdefull};
  gpu_scope_t scope;
  EXPECT_OK(gpu_enter(1, &scope));
  EXPECT_OK(gpu_launch(f1, 6, DEV_THREADS, &param, sizeof param, NULL, 0));
  EXPECT(stats()->launches == 1 && stats()->last_param == param.tag && stats()->last_grid == 6 &&
         stats()->last_block == DEV_THREADS && stats()->plain_launches == 1 &&
         stats()->overlap_launches == 0);
  /* overlapping the previous kernel: cuLaunchKernelEx with that one attribute, the same grid and parameter */
  param.tag = 0xfedcba9876543210ull;
  EXPECT_OK(gpu_launch(f1, 5, DEV_THREADS, &param, sizeof param, NULL, 1));
  EXPECT(stats()->launches == 2 && stats()->last_param == param.tag && stats()->last_grid == 5 &&
             stats()->plain_launches == 1 && stats()->overlap_launches == 1,
         "%d launches, %llu plain, %llu overlapping", stats()->launches,
         (unsigned long long)stats()->plain_launches, (unsigned long long)stats()->overlap_launches);
  gpu_leave(&scope);
  /* the stand-in's device is of compute capability MOCK_CUDA_CC_MAJOR (9.0), its driver CUDA 12.8 */
  int eager = 0, captured = 0;
  EXPECT_OK(gpu_overlap_support(1, &eager, &captured));
  EXPECT(eager == 1 && captured == 1, "overlap eagerly %d, captured %d", eager, captured);
  EXPECT_RES(gpu_overlap_support(2, &eager, &captured), ncclInvalidArgument);
}

/* Kernels spread over several fatbins: each is looked up in order, a module loaded once per device, a fatbin
 * without code for the device passed over, and a kernel none holds is an error that names it. */
static void test_kernel_groups(void) {
  static const char first[64] = MOCK_CUDA_ONLY_IMAGE MOCK_CUDA_KERNEL "," MOCK_CUDA_KERNEL_LL;
  static const char second[64] = MOCK_CUDA_ONLY_IMAGE MOCK_CUDA_KERNEL_SMALL;
  static const char no_code[64] = MOCK_CUDA_NO_CODE_IMAGE;
  const void *both[] = {first, second}, *skip[] = {no_code, second};
  gpu_func_t *f = NULL;
  EXPECT_OK(gpu_func_load(0, both, 2, MOCK_CUDA_KERNEL_SMALL, &f));
  EXPECT(f != NULL && stats()->module_loads == 2, "%d modules loaded", stats()->module_loads);
  EXPECT_OK(gpu_func_load(0, both, 2, MOCK_CUDA_KERNEL_LL, &f));
  EXPECT_OK(gpu_func_load(0, both, 2, MOCK_CUDA_KERNEL, &f));
  EXPECT_OK(gpu_func_load(0, both, 2, MOCK_CUDA_KERNEL_SMALL, &f));
  EXPECT(stats()->module_loads == 2, "modules loaded again: %d", stats()->module_loads);
  EXPECT_RES(gpu_func_load(0, both, 2, MOCK_CUDA_KERNEL_BULK, &f), ncclUnhandledCudaError);
  EXPECT(contains(log_last_error(), MOCK_CUDA_KERNEL_BULK) && contains(log_last_error(), "none of the 2"),
         "message: %s", log_last_error());
  EXPECT_OK(gpu_func_load(1, skip, 2, MOCK_CUDA_KERNEL_SMALL, &f));
  EXPECT(stats()->module_loads == 3, "%d modules loaded", stats()->module_loads);
  EXPECT_RES(gpu_func_load(1, skip, 2, MOCK_CUDA_KERNEL, &f), ncclUnhandledCudaError);
  EXPECT(contains(log_last_error(), "none of the 2"), "message: %s", log_last_error());
}

/* A fatbin without code for the device: the error names the device's architecture and the build's. */
static void test_no_code_for_device(void) {
  static const char image[64] = MOCK_CUDA_NO_CODE_IMAGE;
  gpu_func_t *f = NULL;
  EXPECT_RES(gpu_func_load(0, (const void *[]){image}, 1, MOCK_CUDA_KERNEL, &f), ncclUnhandledCudaError);
  const char *msg = log_last_error();
  EXPECT(contains(msg, "device 0 is sm_90 (compute capability 9.0)") && contains(msg, "BRAID_CUDA_ARCHS"),
         "message: %s", msg);
  EXPECT(contains(msg, dev_fatbin_archs[0] != '\0' ? dev_fatbin_archs : "carries none"), "message: %s", msg);
  EXPECT(f == NULL && stats()->module_loads == 0, "%d modules loaded", stats()->module_loads);
}

static void test_backend_auto(void) {
  set_param("BRAID_DEVICE", "auto");
  gpu_backend_t b;
  EXPECT_OK(gpu_backend(&b));
  /* This build's kernels decide: without them the host backend is chosen even with devices present. */
  EXPECT(b == (dev_nfatbins > 0 ? GPU_BACKEND_CUDA : GPU_BACKEND_HOST), "backend %d", (int)b);
}

static void test_backend_cuda(void) {
  set_param("BRAID_DEVICE", "cuda");
  gpu_backend_t b;
  if (dev_nfatbins > 0) {
    EXPECT_OK(gpu_backend(&b));
    EXPECT(b == GPU_BACKEND_CUDA);
    return;
  }
  EXPECT_RES(gpu_backend(&b), ncclInvalidUsage);
  EXPECT(contains(log_last_error(), "no GPU kernels") && contains(log_last_error(), "2 devices"),
         "message: %s", log_last_error());
}

static void test_no_device(void) {
  setenv("MOCK_CUDA_DEVICES", "0", 1);
  set_param("BRAID_DEVICE", "auto");
  gpu_backend_t b;
  EXPECT_OK(gpu_backend(&b));
  EXPECT(b == GPU_BACKEND_HOST);
  int n;
  EXPECT_RES(gpu_device_count(&n), ncclInvalidUsage);
  EXPECT(contains(log_last_error(), "no CUDA device found") &&
             contains(log_last_error(), "CUDA_ERROR_NO_DEVICE"),
         "message: %s", log_last_error());
}

/* Runs this program again with the mock first on the library path: dlopen reads LD_LIBRARY_PATH only at
 * start. */
int main(int argc, char **argv) {
  test_reexec_with_library_dir(argv, BRAID_MOCK_CUDA_DIR);
  TEST(test_devices, 30);
  TEST(test_contexts, 30);
  TEST(test_dev_alloc, 30);
  TEST(test_out_of_memory, 30);
  TEST(test_export_import_cumem, 60);
  TEST(test_export_import_legacy, 60);
  TEST(test_import_after_release, 30);
  TEST(test_mem_alloc_registry, 30);
  TEST(test_host_memory, 30);
  TEST(test_graph_holds, 30);
  TEST(test_events_and_streams, 30);
  TEST(test_kernels, 30);
  TEST(test_kernel_groups, 30);
  TEST(test_no_code_for_device, 30);
  TEST(test_backend_auto, 30);
  TEST(test_backend_cuda, 30);
  TEST(test_no_device, 30);
  return test_summary();
}

#else /* no CUDA headers: the interface refuses every device call */

static void test_refusals(void) {
  int n;
  EXPECT_RES(gpu_device_count(&n), ncclInvalidUsage);
  EXPECT(strstr(log_last_error(), "no CUDA support") != NULL, "message: %s", log_last_error());
  gpu_mem_t *m;
  EXPECT_RES(gpu_dev_alloc(0, 1, &m), ncclInvalidUsage);
  gpu_backend_t b;
  EXPECT_OK(gpu_backend(&b));
  EXPECT(b == GPU_BACKEND_HOST);
}

int main(void) {
  TEST(test_refusals, 30);
  return test_summary();
}

#endif
