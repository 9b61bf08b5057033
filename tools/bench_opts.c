/*
 * `braid bench` options: nccl-tests' flags (-b -e -f -n -w -c -d -o -r -g -G) plus the bench's own (--lib,
 * --vs, --device, --single, --batch, --json, --png, --timeout, --resources, --floor), and collective names as
 * positional arguments. What depends on the machine (the device, the default rank count) is settled later, in
 * bench.c.
 */
#include "bench.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"

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
  OPT_GPUS
};

void bench_usage(FILE *out) {
  fprintf(
      out,
      "usage: braid bench [options] [collective...]\n"
      "  -b, --minbytes N    smallest size (default 8; K, M, G suffixes)\n"
      "  -e, --maxbytes N    largest size (default 32M)\n"
      "  -f, --stepfactor N  multiply the size by N at each step (default 2)\n"
      "  -n, --samples N     timed samples per size; the median is reported (default 20)\n"
      "      --batch K       iterations per sample (default: per size, so that a sample lasts >= 200 us)\n"
      "  -w, --warmup_iters N  untimed iterations before timing (default 5)\n"
      "  -c, --check 0|1     check results once per size (default 1)\n"
      "  -d, --datatype T    int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3\n"
      "                      f8e5m2, or all (default float)\n"
      "  -o, --op OP         sum prod max min avg premulsum, or all (default sum)\n"
      "  -r, --root N        root of rooted collectives (default 0)\n"
      "  -g, --nranks N      ranks (default: one per GPU; 4 on the host)\n"
      "      --device D      cuda or host (default: cuda when the driver has -g GPUs, else host)\n"
      "      --single        one process drives every rank (ncclCommInitAll, grouped calls)\n"
      "      --gpus N        the ranks share the first N GPUs, rank r on GPU r %% N (kernel traces and\n"
      "                      checks on fewer GPUs than ranks; no figure of the links, and NCCL refuses\n"
      "                      two ranks on one GPU)\n"
      "  -G, --graph         time replays of CUDA graphs of each sample's iterations\n"
      "      --lib PATH      library A (default: ../lib/libnccl.so.2 beside braid)\n"
      "      --vs PATH       library B, measured beside A (another libnccl.so.2)\n"
      "      --json FILE     write every figure as JSON\n"
      "      --png FILE      plot busbw and time against size\n"
      "      --floor         time the floor kernel in every row too (one launch per rank, one line to every\n"
      "                      other rank and back: the floor of a small collective; GPUs only)\n"
      "      --resources     instead of the sweep: device memory, ncclCommInitAll, first call and host\n"
      "                      time per call, each library in a process of its own (-g, --lib, --vs, --json)\n"
      "  -T, --timeout S     kill the ranks after S seconds (default 900; 0: never)\n"
      "  -a, --list          list the collectives\n"
      "Collectives (default: all):");
  for (int c = 0; c < COLL_COUNT; c++) fprintf(out, " %s", bench_colls[c].name);
  fprintf(out, "\n");
}

const char *bench_op_name(int op) {
  return op == BENCH_OP_NONE ? "none" : op == BENCH_OP_PREMULSUM ? "premulsum" : redop_name((ncclRedOp_t)op);
}

/* Parses a size with an optional K, M or G suffix (powers of 1024). */
static int parse_size(const char *s, size_t *v_p) {
  static const char units[] = "KMG";
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s || s[0] == '-') return -1;
  const char *unit = *end != '\0' ? strchr(units, toupper((unsigned char)*end)) : NULL;
  int shift = unit != NULL ? 10 * (int)(unit - units + 1) : 0;
  if (unit != NULL) end++;
  if (*end != '\0' || v > (SIZE_MAX >> shift)) return -1;
  *v_p = (size_t)v << shift;
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
  o->nops = 0;
  for (int op = 0; op < BENCH_NUM_OPS; op++)
    if (strcmp(s, "all") == 0 || strcmp(s, bench_op_name(op)) == 0) o->ops[o->nops++] = op;
  return o->nops > 0 ? 0 : -1;
}

/* Takes the positional collective names; none means all of them. */
static int parse_colls(int argc, char **argv, bench_opts_t *o) {
  o->ncolls = 0;
  if (argc == 0)
    for (int c = 0; c < COLL_COUNT; c++) o->colls[o->ncolls++] = (coll_id_t)c;
  for (int a = 0; a < argc; a++) {
    int c = 0;
    while (c < COLL_COUNT && strcmp(argv[a], bench_colls[c].name) != 0) c++;
    if (c == COLL_COUNT) {
      fprintf(stderr, "braid bench: unknown collective '%s' (braid bench -a lists them)\n", argv[a]);
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
                      .samples = 20,
                      .warmup = 5,
                      .check = 1,
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
  default:
    return -1;
  }
}

/* Applies one option; returns 0, 1 to exit successfully (help, list), -1 for a bad value. */
static int apply_option(int ch, const char *arg, bench_opts_t *o) {
  int factor = 0;
  switch (ch) {
  case 'b':
    return parse_size(arg, &o->min_bytes);
  case 'e':
    return parse_size(arg, &o->max_bytes);
  case 'f':
    if (parse_int(arg, 2, 1 << 20, &factor) != 0) return -1;
    o->step_factor = (size_t)factor;
    return 0;
  case 'n':
    return parse_int(arg, 1, 1 << 20, &o->samples);
  case 'w':
    return parse_int(arg, 0, 1 << 30, &o->warmup);
  case 'c':
    return parse_int(arg, 0, 1, &o->check);
  case 'd':
    return parse_types(arg, o);
  case 'o':
    return parse_ops(arg, o);
  case 'r':
    return parse_int(arg, 0, 1 << 20, &o->root);
  case 'g':
    o->nranks_set = 1;
    return parse_int(arg, 1, 1024, &o->nranks);
  case 'G':
    o->graph = 1;
    return 0;
  case 'T':
    return parse_int(arg, 0, 1 << 24, &o->timeout_s);
  case 'a':
    for (int c = 0; c < COLL_COUNT; c++) printf("%s\n", bench_colls[c].name);
    return 1;
  case 'h':
    bench_usage(stdout);
    return 1;
  default:
    return apply_long_option(ch, arg, o);
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
  if (o->lib_path[0] == '\0' && lib_default_path(o->lib_path, sizeof(o->lib_path)) != 0) return -1;
  return 0;
}

/* The long name of an option without a short one, for messages. */
static const char *long_name(const struct option *longopts, int ch) {
  for (; longopts->name != NULL; longopts++)
    if (longopts->val == ch) return longopts->name;
  return "?";
}

int bench_parse(int argc, char **argv, bench_opts_t *opts_p) {
  static const struct option longopts[] = {{"minbytes", required_argument, NULL, 'b'},
                                           {"maxbytes", required_argument, NULL, 'e'},
                                           {"stepfactor", required_argument, NULL, 'f'},
                                           {"samples", required_argument, NULL, 'n'},
                                           {"iters", required_argument, NULL, 'n'},
                                           {"batch", required_argument, NULL, OPT_BATCH},
                                           {"warmup_iters", required_argument, NULL, 'w'},
                                           {"check", required_argument, NULL, 'c'},
                                           {"datatype", required_argument, NULL, 'd'},
                                           {"op", required_argument, NULL, 'o'},
                                           {"root", required_argument, NULL, 'r'},
                                           {"nranks", required_argument, NULL, 'g'},
                                           {"timeout", required_argument, NULL, 'T'},
                                           {"graph", no_argument, NULL, 'G'},
                                           {"device", required_argument, NULL, OPT_DEVICE},
                                           {"single", no_argument, NULL, OPT_SINGLE},
                                           {"lib", required_argument, NULL, OPT_LIB},
                                           {"vs", required_argument, NULL, OPT_VS},
                                           {"json", required_argument, NULL, OPT_JSON},
                                           {"png", required_argument, NULL, OPT_PNG},
                                           {"resources", no_argument, NULL, OPT_RESOURCES},
                                           {"floor", no_argument, NULL, OPT_FLOOR},
                                           {"gpus", required_argument, NULL, OPT_GPUS},
                                           {"list", no_argument, NULL, 'a'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  bench_opts_t o;
  set_defaults(&o);
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "b:e:f:n:w:c:d:o:r:g:T:Gah", longopts, NULL)) != -1) {
    int res = apply_option(ch, optarg, &o);
    if (res == 1) return 1;
    if (res != 0) {
      if (ch >= OPT_LIB)
        fprintf(stderr, "braid bench: bad value '%s' for --%s\n", optarg, long_name(longopts, ch));
      else if (ch != '?')
        fprintf(stderr, "braid bench: bad value '%s' for -%c\n", optarg, ch);
      bench_usage(stderr);
      return -1;
    }
  }
  if (o.resources && optind < argc) {
    fprintf(stderr, "braid bench: --resources runs every collective once; it takes no collective names\n");
    return -1;
  }
  if (parse_colls(argc - optind, argv + optind, &o) != 0 || validate(&o) != 0) return -1;
  *opts_p = o;
  return 0;
}
