/*
 * The `braid` command: dispatches to its subcommands (bench, info, ras) and answers --version and --help.
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "info.h"
#include "ras_client.h"

static void usage(FILE *out) {
  fprintf(out, "usage: braid <command> [options]\n"
               "  bench [options] [collective...]  measure collectives, nccl-tests style (braid bench -h)\n"
               "  info [--params [--markdown]]     backend, CUDA driver and every parameter\n"
               "                                   (--markdown: the knob page, docs/knobs.md)\n"
               "  ras [options]                    a running job's status and events (braid ras --help)\n"
               "  --version                        print the version\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("braid %s (NCCL API 2.28.9)\n", BRAID_VERSION);
    return 0;
  }
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "bench") == 0) return bench_main(argc - 1, argv + 1);
  if (strcmp(cmd, "info") == 0) return info_main(argc - 1, argv + 1);
  if (strcmp(cmd, "ras") == 0) return ras_main(argc - 1, argv + 1);
  fprintf(stderr, "braid: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
