/*
 * `braid info` (see info.h). The CUDA driver is probed the way the library loads it, with dlopen, so the
 * answer holds on machines without CUDA too.
 */
#include "info.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Each knob's default as declared, and whether it is an integer: the page shows defaults, never the values
 * in effect, so that it reads the same wherever it is generated. */
static const char *const declared_default[P_COUNT] = {
#define PARAM_INT(name, def, help) [P_##name] = #def,
#define PARAM_STR(name, def, help) [P_##name] = def,
#include "base/params.def"
#undef PARAM_INT
#undef PARAM_STR
};
static const unsigned char declared_int[P_COUNT] = {
#define PARAM_INT(name, def, help) [P_##name] = 1,
#define PARAM_STR(name, def, help) [P_##name] = 0,
#include "base/params.def"
#undef PARAM_INT
#undef PARAM_STR
};

static int is_knob_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static int is_knob_name(const char *s, size_t len) {
  for (int i = 0; i < P_COUNT; i++) {
    const char *name = param_name((param_id_t)i);
    if (strlen(name) == len && strncmp(name, s, len) == 0) return 1;
  }
  return 0;
}

/* Prints text for a table cell: Markdown's '|', '<', '*' and '~' escaped, every knob it names in backticks.
 */
static void print_cell(const char *s) {
  while (*s != '\0') {
    size_t n = 0;
    while (is_knob_char(s[n])) n++;
    if (n > 0 && is_knob_name(s, n)) {
      printf("`%.*s`", (int)n, s);
      s += n;
    } else if (n > 0) {
      printf("%.*s", (int)n, s);
      s += n;
    } else {
      if (*s == '|' || *s == '*' || *s == '~')
        printf("\\%c", *s);
      else if (*s == '<')
        fputs("&lt;", stdout);
      else
        putchar(*s);
      s++;
    }
  }
}

/* An integer default, with its size in KiB, MiB or GiB where it is a whole number of them. */
static void print_int_default(const char *text) {
  long long v = strtoll(text, NULL, 0);
  static const char *const units[] = {"KiB", "MiB", "GiB"};
  int u = -1;
  long long shown = v;
  while (u < 2 && shown >= 1024 && shown % 1024 == 0) {
    shown /= 1024;
    u++;
  }
  if (u >= 0)
    printf("%lld (%lld %s)", v, shown, units[u]);
  else
    printf("%lld", v);
}

/* The page docs/knobs.md: every knob with its type, default and help, as a Markdown table. */
static void print_params_markdown(void) {
  printf(
      "# Knobs\n\n"
      "<!-- Generated by `braid info --params --markdown` from the parameter registry; do not edit. -->\n\n"
      "Every knob Braid reads, with its default. A value comes from the environment, else from a "
      "`NAME=VALUE`\nline of the file `NCCL_CONF_FILE` names (or of `~/.nccl.conf` when it is unset), else "
      "from `/etc/nccl.conf`,\nelse from the default. `braid info --params` prints the values in effect "
      "and where each came from.\n\n");
  printf("| knob | type | default | what it does |\n|---|---|---|---|\n");
  for (int i = 0; i < P_COUNT; i++) {
    printf("| `%s` | %s | ", param_name((param_id_t)i), declared_int[i] ? "integer" : "string");
    if (declared_int[i])
      print_int_default(declared_default[i]);
    else if (declared_default[i][0] == '\0')
      printf("unset");
    else
      printf("`%s`", declared_default[i]);
    printf(" | ");
    print_cell(param_help((param_id_t)i));
    printf(" |\n");
  }
}

int info_main(int argc, char **argv) {
  int params_only = 0, markdown = 0;
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--params") == 0)
      params_only = 1;
    else if (strcmp(argv[a], "--markdown") == 0)
      markdown = 1;
    else {
      fprintf(stderr, "usage: braid info [--params [--markdown]]\n");
      return 2;
    }
  }
  if (markdown) {
    if (!params_only) {
      fprintf(stderr, "braid info: --markdown goes with --params (braid info --params --markdown)\n");
      return 2;
    }
    print_params_markdown();
    return 0;
  }
  if (!params_only) {
    print_system();
    printf("\n");
  }
  print_params();
  return 0;
}
