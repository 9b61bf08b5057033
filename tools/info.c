/*
 * `braid info` (see info.h). The CUDA driver is probed the way the library loads it, with dlopen, so the
 * answer holds on machines without CUDA too.
 */
#include "info.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/param.h"
#include "device/dev.h"
#include "gpu/gpu.h"

/* What the CUDA driver probe found. */
typedef struct {
  int loadable;  /* libcuda.so.1 could be loaded */
  int ngpus;     /* devices it reports; -1 when it cannot be initialised */
  char why[256]; /* why it could not be loaded or initialised */
} cuda_probe_t;

static void probe_cuda(cuda_probe_t *p) {
  *p = (cuda_probe_t){.ngpus = -1};
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(p->why, sizeof(p->why), "%s", dlerror());
    return;
  }
  p->loadable = 1;
  int (*init)(unsigned) = NULL;
  int (*count)(int *) = NULL;
  void *fn = dlsym(h, "cuInit");
  memcpy(&init, &fn, sizeof(fn));
  fn = dlsym(h, "cuDeviceGetCount");
  memcpy(&count, &fn, sizeof(fn));
  int n = 0, err = init == NULL || count == NULL ? -1 : init(0);
  if (err == 0) err = count(&n);
  if (err == 0)
    p->ngpus = n;
  else
    snprintf(p->why, sizeof(p->why), "cuInit/cuDeviceGetCount failed (CUresult %d)", err);
  dlclose(h);
}

/* The devices the CUDA backend runs on. */
static void print_devices(void) {
  int n = 0;
  if (gpu_device_count(&n) != ncclSuccess) return;
  for (int d = 0; d < n; d++) {
    char busid[16] = "?";
    int sms = 0;
    gpu_device_busid(d, busid);
    gpu_device_sms(d, &sms);
    printf("  GPU %d: PCI %s, %d SMs\n", d, busid, sms);
  }
}

/* The executor the library would use here: its own decision (gpu_backend), or why it has none. */
static void print_backend(void) {
  gpu_backend_t b;
  if (gpu_backend(&b) != ncclSuccess) {
    printf("Backend: none usable: %s\n", log_last_error());
    return;
  }
  printf("Backend: %s (BRAID_DEVICE=%s)\n", b == GPU_BACKEND_HOST ? "host" : "cuda",
         param_str(P_BRAID_DEVICE));
  if (b == GPU_BACKEND_CUDA) print_devices();
}

static void print_system(void) {
  cuda_probe_t p;
  probe_cuda(&p);
  printf("braid %s (NCCL API 2.28.9)\n", BRAID_VERSION);
  if (dev_fatbin_archs[0] != '\0')
    printf("Kernels: %s\n", dev_fatbin_archs);
  else
    printf("Kernels: none (built without nvcc): collectives run on the host backend only\n");
  if (!p.loadable)
    printf("CUDA driver: not loadable (%s)\n", p.why);
  else if (p.ngpus < 0)
    printf("CUDA driver: loaded, %s\n", p.why);
  else
    printf("CUDA driver: loaded, %d device(s)\n", p.ngpus);
  print_backend();
}

static void print_params(void) {
  printf("%-28s %-20s %-8s %s\n", "# parameter", "value", "source", "help");
  for (int i = 0; i < P_COUNT; i++) {
    char value[256];
    param_format((param_id_t)i, value, sizeof(value));
    printf("%-28s %-20s %-8s %s\n", param_name((param_id_t)i), value[0] ? value : "\"\"",
           param_source((param_id_t)i), param_help((param_id_t)i));
  }
}

int info_main(int argc, char **argv) {
  int params_only = 0;
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--params") == 0)
      params_only = 1;
    else {
      fprintf(stderr, "usage: braid info [--params]\n");
      return 2;
    }
  }
  if (!params_only) {
    print_system();
    printf("\n");
  }
  print_params();
  return 0;
}
