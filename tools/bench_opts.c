/*
 * `braid bench` options: every flag of nccl-tests 2.19, either honoured with nccl-tests' meaning or refused
 * with a message that names it, plus the bench's own long options (--lib, --vs, --device, --single, --batch,
 * --json, --png, --resources, --floor, --gpus, --list), and collective names as positional arguments (an
 * nccl-tests program name such as all_reduce_perf names its collective). What depends on the machine (the
 * device, the default rank count) is settled later, in bench.c.
 */
#include "bench.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "png.h"

/* Options without a short form. */
enum {
  OPT_LIB = 256,
  OPT_VS,
  OPT_DEVICE,
  OPT_SINGLE,
  OPT_BATCH,
  OPT_JSON,
  OPT_PNG,
  OPT_RESOURCES,
  OPT_FLOOR,
  OPT_GPUS,
  OPT_LIST
};

void bench_usage(FILE *out) {
  fprintf(
      out,
      "usage: braid bench [options] [collective...]\n"
      "nccl-tests' flags (a whole nccl-tests command line works, its program name naming the collective):\n"
      "  -b, --minbytes N    smallest size (default 8; K, M, G suffixes)\n"
      "  -e, --maxbytes N    largest size (default 32M)\n"
      "  -f, --stepfactor N  multiply the size by N at each step (default 2; 1: add -i instead)\n"
      "  -i, --stepbytes N   with -f 1, add N bytes at each step (default 1M)\n"
      "  -n, --iters N       timed samples per size; the median is reported (default 20)\n"
      "  -m, --agg_iters N   calls per iteration, in one group; the time is per call (default 1)\n"
      "  -w, --warmup_iters N  untimed iterations before timing (default 5)\n"
      "  -N, --run_cycles N  run everything N times (default 1; 0: until the timeout)\n"
      "  -c, --check N       checked iterations per size (default 1; 0: no check)\n"
      "  -d, --datatype T    int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3\n"
      "                      f8e5m2, or all (default float)\n"
      "  -o, --op OP         sum prod max min avg premulsum (or mulsum), or all (default sum)\n"
      "  -r, --root N        root of rooted collectives (default 0)\n"
      "  -t, --nthreads T    with -g G: T x G ranks (default 1)\n"
      "  -g, --ngpus N       ranks (default: one per GPU; 4 on the host)\n"
      "  -z, --blocking Z    0: calls back to back; 1 or 2: the host waits for each iteration; 3: for each\n"
      "                      sample (default 0)\n"
      "  -a, --average A     the row's time: 0 rank 0's, 1 the ranks' mean, 2 the fastest, 3 the slowest\n"
      "                      rank's (default 3)\n"
      "  -G, --cudagraph N   time CUDA graphs of each sample's iterations, replayed N times (default 0)\n"
      "  -T, --timeout S     kill the ranks after S seconds (default 900; 0: never)\n"
      "  -p, --parallel_init 0|1  accepted: the ranks always initialise concurrently\n"
      "  -V, --device_cta_count N accepted: it matters only with -D, which Braid refuses\n"
      "  -y, -C, -S, -R, -x, -D, -M, -u, -I, -K: accepted when 0 (their default), refused otherwise;\n"
      "  -J: refused (--json writes Braid's JSON)\n"
      "Braid's own:\n"
      "      --batch K       iterations per sample (default: per size, so that a sample lasts >= 200 us)\n"
      "      --device D      cuda or host (default: cuda when the driver has -g GPUs, else host)\n"
      "      --single        one process drives every rank (ncclCommInitAll, grouped calls)\n"
      "      --gpus N        the ranks share the first N GPUs, rank r on GPU r %% N (kernel traces and\n"
      "                      checks on fewer GPUs than ranks; no figure of the links, and NCCL refuses\n"
      "                      two ranks on one GPU)\n"
      "      --lib PATH      library A (default: libnccl.so.2 in the lib folder beside braid's)\n"
      "      --vs PATH       library B, measured beside A (another libnccl.so.2)\n"
      "      --json FILE     write every figure as JSON\n"
      "      --png FILE      plot busbw and time against size\n"
      "      --floor         time the floor kernel in every row too (one launch per rank, one line to every\n"
      "                      other rank and back: the floor of a small collective; GPUs only)\n"
      "      --resources     instead of the sweep: device memory, ncclCommInitAll, first call and host\n"
      "                      time per call, each library in a process of its own (-g, --lib, --vs, --json)\n"
      "      --list          list the collectives\n"
      "Collectives (default: all):");
  for (int c = 0; c < COLL_COUNT; c++) fprintf(out, " %s", bench_colls[c].name);
  fprintf(out, "\n");
}

const char *bench_op_name(int op) {
  return op == BENCH_OP_NONE ? "none" : op == BENCH_OP_PREMULSUM ? "premulsum" : redop_name((ncclRedOp_t)op);
}

/* Parses a size as nccl-tests does: a number, fractions allowed, with an optional K, M or G (powers of 1024,
 * either case). */
static int parse_size(const char *s, size_t *v_p) {
  static const char units[] = "KMG";
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || !isdigit((unsigned char)s[0]) || !isfinite(v)) return -1;
  const char *unit = *end != '\0' ? strchr(units, toupper((unsigned char)*end)) : NULL;
  if (unit != NULL) {
    v *= (double)(1ull << (10 * (unit - units + 1)));
    end++;
  }
  if (*end != '\0' || v >= 0x1p63) return -1;
  *v_p = (size_t)v;
  return 0;
}

/* Parses a whole number in [lo, hi]. */
static int parse_int(const char *s, int lo, int hi, int *v_p) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return -1;
  *v_p = (int)v;
  return 0;
}

static int parse_types(const char *s, bench_opts_t *o) {
  o->ntypes = 0;
  for (int t = 0; t < ncclNumTypes; t++)
    if (strcmp(s, "all") == 0 || strcmp(s, dtype_name((ncclDataType_t)t)) == 0)
      o->types[o->ntypes++] = (ncclDataType_t)t;
  return o->ntypes > 0 ? 0 : -1;
}

static int parse_ops(const char *s, bench_opts_t *o) {
  if (strcmp(s, "mulsum") == 0) s = "premulsum"; /* nccl-tests' name */
  o->nops = 0;
  for (int op = 0; op < BENCH_NUM_OPS; op++)
    if (strcmp(s, "all") == 0 || strcmp(s, bench_op_name(op)) == 0) o->ops[o->nops++] = op;
  return o->nops > 0 ? 0 : -1;
}

/* The collective a positional argument names: the bench's name, or an nccl-tests program (all_reduce_perf,
 * ./build/all_reduce_perf); COLL_COUNT when none. */
static int coll_named(const char *arg) {
  const char *base = strrchr(arg, '/') != NULL ? strrchr(arg, '/') + 1 : arg;
  size_t n = strlen(base);
  if (n > 5 && strcmp(base + n - 5, "_perf") == 0) n -= 5;
  int c = 0;
  while (c < COLL_COUNT && (strlen(bench_colls[c].name) != n || strncmp(base, bench_colls[c].name, n) != 0))
    c++;
  return c;
}

/* Takes the positional collective names; none means all of them. */
static int parse_colls(int argc, char **argv, bench_opts_t *o) {
  o->ncolls = 0;
  if (argc == 0)
    for (int c = 0; c < COLL_COUNT; c++) o->colls[o->ncolls++] = (coll_id_t)c;
  for (int a = 0; a < argc; a++) {
    int c = coll_named(argv[a]);
    if (c == COLL_COUNT) {
      fprintf(stderr, "braid bench: unknown collective '%s' (braid bench --list lists them)\n", argv[a]);
      return -1;
    }
    if (o->ncolls == COLL_COUNT) {
      fprintf(stderr, "braid bench: too many collectives\n");
      return -1;
    }
    o->colls[o->ncolls++] = (coll_id_t)c;
  }
  return 0;
}

static void set_defaults(bench_opts_t *o) {
  *o = (bench_opts_t){.min_bytes = 8,
                      .max_bytes = 32 << 20,
                      .step_factor = 2,
                      .step_bytes = 1 << 20,
                      .samples = 20,
                      .warmup = 5,
                      .check = 1,
                      .agg = 1,
                      .cycles = 1,
                      .average = BENCH_AVG_MAX,
                      .root = 0,
                      .nranks = 4,
                      .timeout_s = 900};
  parse_types("float", o);
  parse_ops("sum", o);
}

/* Copies a path option's value; refuses one too long to keep. */
static int set_path(char *dst, const char *arg) {
  if (strlen(arg) >= PATH_MAX || arg[0] == '\0') return -1;
  strcpy(dst, arg);
  return 0;
}

static int parse_device(const char *arg, bench_opts_t *o) {
  if (strcmp(arg, "cuda") == 0)
    o->device = BENCH_DEVICE_CUDA;
  else if (strcmp(arg, "host") == 0)
    o->device = BENCH_DEVICE_HOST;
  else
    return -1;
  return 0;
}

/* The options without a short form. */
static int apply_long_option(int ch, const char *arg, bench_opts_t *o) {
  switch (ch) {
  case OPT_LIB:
    return set_path(o->lib_path, arg);
  case OPT_VS:
    return set_path(o->vs_path, arg);
  case OPT_JSON:
    return set_path(o->json_path, arg);
  case OPT_PNG:
    return set_path(o->png_path, arg);
  case OPT_DEVICE:
    return parse_device(arg, o);
  case OPT_SINGLE:
    o->single = 1;
    return 0;
  case OPT_RESOURCES:
    o->resources = 1;
    return 0;
  case OPT_FLOOR:
    o->floor = 1;
    return 0;
  case OPT_BATCH:
    return parse_int(arg, 1, 1 << 20, &o->batch);
  case OPT_GPUS:
    return parse_int(arg, 1, 1024, &o->gpus);
  case OPT_LIST:
    for (int c = 0; c < COLL_COUNT; c++) printf("%s\n", bench_colls[c].name);
    return 1;
  default:
    return -1;
  }
}

/* nccl-tests' flags that change nothing Braid measures differently, and those it refuses unless they are 0
 * (their default): what each would ask for, for the message. */
static int refused_unless_zero(int ch, const char *arg) {
  static const struct {
    int ch;
    const char *what;
  } flags[] = {{'y', "calls on the NULL stream (each rank runs on a stream of its own)"},
               {'C', "CPU time instead of GPU time"},
               {'S', "timestamps in the table"},
               {'R', "registered buffers (ncclCommRegister, symmetric windows)"},
               {'x', "a CTA policy in the communicator's configuration"},
               {'D', "a device-API implementation of the collectives"},
               {'M', "a memory report (--resources measures memory)"},
               {'u', "misaligned buffers"},
               {'I', "per-iteration timing"},
               {'K', "per-iteration timing's skipped samples"}};
  int v = 0;
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
    if (flags[i].ch != ch) continue;
    if (parse_int(arg, INT32_MIN, INT32_MAX, &v) != 0) return -1;
    if (v == 0) return 0;
    fprintf(stderr, "braid bench: -%c %s: %s is not something braid bench measures\n", ch, arg,
            flags[i].what);
    return -2;
  }
  return -1;
}

/* nccl-tests' flags that shape the measurement. */
static int apply_measure_option(int ch, const char *arg, bench_opts_t *o) {
  int v = 0;
  switch (ch) {
  case 'n':
    return parse_int(arg, 1, 1 << 20, &o->samples);
  case 'm':
    return parse_int(arg, 1, 1 << 16, &o->agg);
  case 'w':
    return parse_int(arg, 0, 1 << 30, &o->warmup);
  case 'N':
    return parse_int(arg, 0, 1 << 20, &o->cycles);
  case 'c':
    return parse_int(arg, 0, 1 << 16, &o->check);
  case 'z':
    return parse_int(arg, 0, 3, &o->blocking);
  case 'a':
    if (parse_int(arg, 0, 3, &v) != 0) return -1;
    o->average = (bench_avg_t)v;
    return 0;
  case 'G':
    return parse_int(arg, 0, 1 << 20, &o->graph);
  case 'p':
    return parse_int(arg, 0, 1, &v);
  case 'V':
    return parse_int(arg, 1, 128, &v);
  case 'J':
    fprintf(stderr, "braid bench: -J %s: nccl-tests' JSON is not written; --json FILE writes Braid's\n", arg);
    return -2;
  default:
    return -1;
  }
}

/* Applies one option; returns 0, 1 to exit successfully (help, list), -1 for a bad value, -2 for a refusal
 * already reported. */
static int apply_option(int ch, const char *arg, bench_opts_t *o, int *threads_p, int *gpus_p) {
  int factor = 0;
  switch (ch) {
  case 'b':
    return parse_size(arg, &o->min_bytes);
  case 'e':
    return parse_size(arg, &o->max_bytes);
  case 'i':
    return parse_size(arg, &o->step_bytes) != 0 || o->step_bytes == 0 ? -1 : 0;
  case 'f':
    if (parse_int(arg, 1, 1 << 20, &factor) != 0) return -1;
    o->step_factor = (size_t)factor;
    return 0;
  case 'd':
    return parse_types(arg, o);
  case 'o':
    return parse_ops(arg, o);
  case 'r':
    return parse_int(arg, 0, 1 << 20, &o->root);
  case 't':
    return parse_int(arg, 1, 1024, threads_p);
  case 'g':
    return parse_int(arg, 1, 1024, gpus_p);
  case 'T':
    return parse_int(arg, 0, 1 << 24, &o->timeout_s);
  case 'h':
    bench_usage(stdout);
    return 1;
  default:
    if (ch >= OPT_LIB) return apply_long_option(ch, arg, o);
    int res = refused_unless_zero(ch, arg);
    return res != -1 ? res : apply_measure_option(ch, arg, o);
  }
}

/* Checks what no single option can: how the options fit together. */
static int validate(bench_opts_t *o) {
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "braid bench: -b %zu is larger than -e %zu\n", o->min_bytes, o->max_bytes);
    return -1;
  }
  if (o->nranks_set && o->root >= o->nranks) {
    fprintf(stderr, "braid bench: root %d is not a rank of %d\n", o->root, o->nranks);
    return -1;
  }
  if (o->graph && o->device == BENCH_DEVICE_HOST) {
    fprintf(stderr, "braid bench: -G (CUDA graphs) needs --device cuda\n");
    return -1;
  }
  if (o->single && o->graph && o->gpus > 0) {
    fprintf(stderr,
            "braid bench: -G with --single and --gpus: one process's captures of two ranks on one GPU "
            "fail to instantiate (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); drop --single\n");
    return -1;
  }
  if (o->graph && o->blocking != 0) {
    fprintf(stderr, "braid bench: -z %d waits between iterations, which a CUDA graph (-G) replays without\n",
            o->blocking);
    return -1;
  }
  if (o->resources && o->gpus > 0) {
    fprintf(stderr, "braid bench: --resources measures each GPU's memory: one rank per GPU (no --gpus)\n");
    return -1;
  }
  if (o->resources && (o->graph || o->png_path[0] != '\0' || o->floor)) {
    fprintf(stderr, "braid bench: --resources measures eager calls and draws nothing (no -G, no --png, no "
                    "--floor)\n");
    return -1;
  }
  if (o->gpus > 0 && o->device == BENCH_DEVICE_HOST) {
    fprintf(stderr, "braid bench: --gpus places ranks on GPUs: it needs --device cuda\n");
    return -1;
  }
  if (o->floor && o->device == BENCH_DEVICE_HOST) {
    fprintf(stderr, "braid bench: --floor launches a kernel: it needs --device cuda\n");
    return -1;
  }
  if (o->png_path[0] != '\0' && !png_available()) {
    fprintf(stderr,
            "braid bench: --png: this braid was built without zlib (zlib1g-dev), so it writes no PNG\n");
    return -1;
  }
  if (o->lib_path[0] == '\0' && lib_default_path(o->lib_path, sizeof(o->lib_path)) != 0) return -1;
  return 0;
}

/* The name of an option, for messages: "-b" or "--lib". */
static void option_name(const struct option *longopts, int ch, char *buf, size_t len) {
  snprintf(buf, len, "-%c", ch);
  if (ch < OPT_LIB) return;
  for (; longopts->name != NULL; longopts++)
    if (longopts->val == ch) snprintf(buf, len, "--%s", longopts->name);
}

static const struct option longopts[] = {
    /* nccl-tests 2.19's, with its long names */
    {"nthreads", required_argument, NULL, 't'},
    {"ngpus", required_argument, NULL, 'g'},
    {"minbytes", required_argument, NULL, 'b'},
    {"maxbytes", required_argument, NULL, 'e'},
    {"stepbytes", required_argument, NULL, 'i'},
    {"stepfactor", required_argument, NULL, 'f'},
    {"iters", required_argument, NULL, 'n'},
    {"agg_iters", required_argument, NULL, 'm'},
    {"warmup_iters", required_argument, NULL, 'w'},
    {"run_cycles", required_argument, NULL, 'N'},
    {"parallel_init", required_argument, NULL, 'p'},
    {"check", required_argument, NULL, 'c'},
    {"op", required_argument, NULL, 'o'},
    {"datatype", required_argument, NULL, 'd'},
    {"root", required_argument, NULL, 'r'},
    {"blocking", required_argument, NULL, 'z'},
    {"stream_null", required_argument, NULL, 'y'},
    {"timeout", required_argument, NULL, 'T'},
    {"cudagraph", required_argument, NULL, 'G'},
    {"report_cputime", required_argument, NULL, 'C'},
    {"report_timestamps", required_argument, NULL, 'S'},
    {"output_file", required_argument, NULL, 'J'},
    {"average", required_argument, NULL, 'a'},
    {"local_register", required_argument, NULL, 'R'},
    {"cta_policy", required_argument, NULL, 'x'},
    {"device_implementation", required_argument, NULL, 'D'},
    {"device_cta_count", required_argument, NULL, 'V'},
    {"memory", required_argument, NULL, 'M'},
    {"unalign", required_argument, NULL, 'u'},
    {"per_iter_timing", required_argument, NULL, 'I'},
    {"per_iter_skip", required_argument, NULL, 'K'},
    {"help", no_argument, NULL, 'h'},
    /* the bench's own */
    {"samples", required_argument, NULL, 'n'},
    {"nranks", required_argument, NULL, 'g'},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"single", no_argument, NULL, OPT_SINGLE},
    {"lib", required_argument, NULL, OPT_LIB},
    {"vs", required_argument, NULL, OPT_VS},
    {"json", required_argument, NULL, OPT_JSON},
    {"png", required_argument, NULL, OPT_PNG},
    {"resources", no_argument, NULL, OPT_RESOURCES},
    {"floor", no_argument, NULL, OPT_FLOOR},
    {"gpus", required_argument, NULL, OPT_GPUS},
    {"list", no_argument, NULL, OPT_LIST},
    {NULL, 0, NULL, 0}};

/* Reads the options into *o; returns as apply_option does, after the getopt loop. */
static int parse_options(int argc, char **argv, bench_opts_t *o) {
  int ch, threads = 0, gpus = 0, factor_set = 0, step_set = 0;
  optind = 0; /* 0, not 1: glibc then forgets an earlier parse's state (tests parse many lines) */
  opterr = 0; /* unknown flags are reported below, by name */
  while ((ch = getopt_long(argc, argv, ":t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:S:J:a:R:x:D:V:M:u:I:K:h",
                           longopts, NULL)) != -1) {
    char name[64];
    option_name(longopts, ch == '?' || ch == ':' ? optopt : ch, name, sizeof name);
    if (ch == '?') {
      if (optopt != 0)
        fprintf(stderr, "braid bench: unknown option -%c\n", optopt);
      else
        fprintf(stderr, "braid bench: unknown option %s\n", argv[optind - 1]);
      return -2;
    }
    if (ch == ':') {
      fprintf(stderr, "braid bench: %s needs a value\n", optopt != 0 ? name : argv[optind - 1]);
      return -2;
    }
    factor_set |= ch == 'f';
    step_set |= ch == 'i';
    int res = apply_option(ch, optarg, o, &threads, &gpus);
    if (res == 1 || res == -2) return res;
    if (res != 0) {
      fprintf(stderr, "braid bench: bad value '%s' for %s\n", optarg, name);
      return -1;
    }
  }
  if (step_set && !factor_set) o->step_factor = 1; /* nccl-tests' default factor is 1: -i alone adds */
  if (threads > 0 || gpus > 0) {
    o->nranks_set = 1;
    o->nranks = (threads > 0 ? threads : 1) * (gpus > 0 ? gpus : 1);
  }
  return 0;
}

/* Whether s is a whole number (a value, not the next option). */
static int is_number(const char *s) {
  char *end;
  if (s == NULL) return 0;
  strtol(s, &end, 10);
  return end != s && *end == '\0';
}

/* nccl-tests' -G takes a count, the bench's older -G (--graph) none: a -G that no number follows means -G 1.
 * Copies argv into args (2 * argc + 1 entries, NULL-terminated) with those counts added. */
static int add_graph_counts(int argc, char **argv, char **args) {
  static char one[] = "1", cudagraph[] = "--cudagraph";
  int n = 0;
  for (int a = 0; a < argc; a++) {
    int graph =
        strcmp(argv[a], "-G") == 0 || strcmp(argv[a], "--cudagraph") == 0 || strcmp(argv[a], "--graph") == 0;
    args[n++] = graph ? cudagraph : argv[a];
    if (graph && !is_number(a + 1 < argc ? argv[a + 1] : NULL)) args[n++] = one;
  }
  args[n] = NULL;
  return n;
}

int bench_parse(int argc, char **argv, bench_opts_t *opts_p) {
  bench_opts_t o;
  set_defaults(&o);
  char **args = calloc(2 * (size_t)argc + 1, sizeof *args);
  if (args == NULL) {
    fprintf(stderr, "braid bench: out of memory for %d arguments\n", argc);
    return -1;
  }
  argc = add_graph_counts(argc, argv, args);
  argv = args;
  int res = parse_options(argc, argv, &o);
  if (res == 0 && o.resources && optind < argc) {
    fprintf(stderr, "braid bench: --resources runs every collective once; it takes no collective names\n");
    res = -2;
  }
  if (res == 0 && (parse_colls(argc - optind, argv + optind, &o) != 0 || validate(&o) != 0)) res = -2;
  if (res == -1) bench_usage(stderr);
  free(args);
  if (res == 0) *opts_p = o;
  return res == 1 ? 1 : res == 0 ? 0 : -1;
}
