/*
 * Tests of `braid bench`'s command line (tools/bench_opts.c) with nccl-tests 2.19 command lines as people
 * paste them: the program's name picks the collective, every flag nccl-tests takes is honoured with its
 * meaning or refused with a message that names it, and the bench's own options and older forms keep working.
 * Each line is split on spaces, "braid bench" prepended, and parsed; stderr goes to a file, to read what was
 * said.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "harness.h"

/* What parsing one command line gave: the result, the options and what went to stderr. */
typedef struct {
  int res;
  bench_opts_t o;
  char err[4096];
} parsed_t;

static void parse(const char *line, parsed_t *p) {
  char buf[1024], *argv[64];
  int argc = 0;
  snprintf(buf, sizeof buf, "bench %s", line);
  for (char *save = NULL, *tok = strtok_r(buf, " ", &save); tok != NULL && argc < 63;
       tok = strtok_r(NULL, " ", &save))
    argv[argc++] = tok;
  argv[argc] = NULL;
  char path[] = "/tmp/braid_test_bench_opts_XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  memset(p, 0, sizeof *p);
  p->res = bench_parse(argc, argv, &p->o);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  ssize_t n = pread(fd, p->err, sizeof p->err - 1, 0);
  p->err[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
}

static void expect_ok(const char *line, parsed_t *p) {
  parse(line, p);
  EXPECT(p->res == 0, "'%s' was refused: %s", line, p->err);
}

/* The line is refused and the message names `flag`. */
static void expect_refused(const char *line, const char *flag) {
  parsed_t p;
  parse(line, &p);
  EXPECT(p.res == -1, "'%s' was accepted", line);
  EXPECT(strstr(p.err, flag) != NULL, "'%s': the message does not name %s: %s", line, flag, p.err);
}

/* The lines of nccl-tests' README and common variations: sizes, steps, ranks, the collective by program. */
static void test_readme_lines(void) {
  parsed_t p;
  expect_ok("./build/all_reduce_perf -b 8 -e 128M -f 2 -g 8", &p);
  EXPECT(p.o.ncolls == 1 && p.o.colls[0] == COLL_ALL_REDUCE);
  EXPECT(p.o.min_bytes == 8 && p.o.max_bytes == 128u << 20 && p.o.step_factor == 2);
  EXPECT(p.o.nranks_set && p.o.nranks == 8);
  expect_ok("./build/all_reduce_perf -b 8 -e 8G -f 2 -g 1", &p);
  EXPECT(p.o.max_bytes == 8ull << 30 && p.o.nranks == 1);
  expect_ok("sendrecv_perf -b 1M -e 1G -f 2 -g 2", &p);
  EXPECT(p.o.colls[0] == COLL_SENDRECV && p.o.min_bytes == 1u << 20);
  expect_ok("/opt/nccl-tests/build/alltoall_perf -b 0.5k -e 16m -f 4 -g 4", &p);
  EXPECT(p.o.colls[0] == COLL_ALLTOALL && p.o.min_bytes == 512 && p.o.max_bytes == 16u << 20);
  static const struct {
    const char *prog;
    coll_id_t coll;
  } progs[] = {{"all_gather_perf", COLL_ALL_GATHER}, {"reduce_scatter_perf", COLL_REDUCE_SCATTER},
               {"broadcast_perf", COLL_BROADCAST},   {"reduce_perf", COLL_REDUCE},
               {"gather_perf", COLL_GATHER},         {"scatter_perf", COLL_SCATTER}};
  for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
    char line[128];
    snprintf(line, sizeof line, "%s -b 8 -e 1M", progs[i].prog);
    expect_ok(line, &p);
    EXPECT(p.o.ncolls == 1 && p.o.colls[0] == progs[i].coll, "%s", line);
  }
  expect_refused("hypercube_perf -b 8 -e 1M", "hypercube_perf");
  expect_refused("alltoallv_perf -b 8 -e 1M", "alltoallv_perf");
}

/* -t, -i, -n, -m, -w, -N, -c, -z, -a, -G, -T, -d, -o, -r with nccl-tests' meanings. */
static void test_measure_flags(void) {
  parsed_t p;
  expect_ok("all_reduce_perf -b 8 -e 128M -f 2 -t 2 -g 4 -n 50 -w 10 -m 4 -c 3", &p);
  EXPECT(p.o.nranks == 8, "-t 2 -g 4: %d ranks", p.o.nranks);
  EXPECT(p.o.samples == 50 && p.o.warmup == 10 && p.o.agg == 4 && p.o.check == 3);
  expect_ok("all_reduce_perf -t 3", &p);
  EXPECT(p.o.nranks_set && p.o.nranks == 3);
  expect_ok("reduce_scatter_perf -b 1M -e 8M -i 1M -g 2", &p);
  EXPECT(p.o.step_factor == 1 && p.o.step_bytes == 1u << 20, "-i alone adds: factor %zu", p.o.step_factor);
  expect_ok("all_gather_perf -b 1K -e 4K -f 1 -g 2", &p);
  EXPECT(p.o.step_factor == 1 && p.o.step_bytes == 1u << 20);
  expect_ok("all_gather_perf -b 1K -e 64M -f 4 -i 1K -g 2", &p);
  EXPECT(p.o.step_factor == 4, "-f 4 with -i: factor %zu", p.o.step_factor);
  expect_ok("all_reduce_perf -N 3 -a 0 -z 1", &p);
  EXPECT(p.o.cycles == 3 && p.o.average == BENCH_AVG_RANK0 && p.o.blocking == 1);
  expect_ok("all_reduce_perf -N 0 -a 3 -z 3", &p);
  EXPECT(p.o.cycles == 0 && p.o.average == BENCH_AVG_MAX && p.o.blocking == 3);
  expect_ok("all_reduce_perf -a 1 -c 0", &p);
  EXPECT(p.o.average == BENCH_AVG_MEAN && p.o.check == 0);
  expect_ok("all_reduce_perf -a 2 -G 5 -T 60", &p);
  EXPECT(p.o.average == BENCH_AVG_MIN && p.o.graph == 5 && p.o.timeout_s == 60);
  expect_ok("all_reduce_perf -G 0", &p);
  EXPECT(p.o.graph == 0);
  expect_ok("reduce_perf -d bfloat16 -o mulsum -r 3 -g 4", &p);
  EXPECT(p.o.ntypes == 1 && p.o.types[0] == ncclBfloat16 && p.o.nops == 1 &&
         p.o.ops[0] == BENCH_OP_PREMULSUM);
  EXPECT(p.o.root == 3);
  expect_ok("reduce_perf -d all -o all", &p);
  EXPECT(p.o.ntypes == ncclNumTypes && p.o.nops == BENCH_NUM_OPS);
  expect_ok("all_reduce_perf", &p);
  EXPECT(p.o.samples == 20 && p.o.agg == 1 && p.o.cycles == 1 && p.o.check == 1 && p.o.graph == 0);
  EXPECT(p.o.average == BENCH_AVG_MAX && !p.o.nranks_set && p.o.step_factor == 2);
}

/* Every long name nccl-tests has, in one line. */
static void test_long_names(void) {
  parsed_t p;
  expect_ok(
      "all_reduce_perf --nthreads 1 --ngpus 2 --minbytes 64 --maxbytes 1M --stepbytes 64 --stepfactor 2 "
      "--iters 7 --agg_iters 2 --warmup_iters 3 --run_cycles 2 --parallel_init 1 --check 2 --op max "
      "--datatype int32 --root 1 --blocking 2 --stream_null 0 --timeout 30 --cudagraph 0 "
      "--report_cputime 0 --report_timestamps 0 --average 1 --local_register 0 --cta_policy 0 "
      "--device_implementation 0 --device_cta_count 16 --memory 0 --unalign 0 --per_iter_timing 0 "
      "--per_iter_skip 0",
      &p);
  EXPECT(p.o.nranks == 2 && p.o.min_bytes == 64 && p.o.max_bytes == 1u << 20 && p.o.samples == 7);
  EXPECT(p.o.agg == 2 && p.o.warmup == 3 && p.o.cycles == 2 && p.o.check == 2 && p.o.root == 1);
  EXPECT(p.o.blocking == 2 && p.o.timeout_s == 30 && p.o.average == BENCH_AVG_MEAN);
  EXPECT(p.o.ops[0] == ncclMax && p.o.types[0] == ncclInt32);
}

/* What Braid does not measure is refused, by name, unless it is the flag's default (0). */
static void test_refusals(void) {
  parsed_t p;
  expect_ok("all_reduce_perf -y 0 -C 0 -S 0 -R 0 -x 0 -D 0 -M 0 -u 0 -I 0 -K 0 -p 0 -V 32", &p);
  static const char *const lines[][2] = {
      {"all_reduce_perf -y 1", "-y"},           {"all_reduce_perf -C 1", "-C"},
      {"all_reduce_perf -S 1", "-S"},           {"all_reduce_perf -R 2", "-R"},
      {"all_reduce_perf -x 1", "-x"},           {"all_reduce_perf -D 1", "-D"},
      {"all_reduce_perf -M 1", "-M"},           {"all_reduce_perf -u 3", "-u"},
      {"all_reduce_perf -I 1", "-I"},           {"all_reduce_perf -K 2", "-K"},
      {"all_reduce_perf -J r.json", "-J"},      {"all_reduce_perf -q 1", "-q"},
      {"all_reduce_perf --bogus 1", "--bogus"}, {"all_reduce_perf -a 4", "-a"},
      {"all_reduce_perf -z 4", "-z"},           {"all_reduce_perf -p 2", "-p"},
      {"all_reduce_perf -c -1", "-c"},          {"all_reduce_perf -b 1X", "-b"},
      {"all_reduce_perf -d float7", "-d"},      {"all_reduce_perf -o xor", "-o"},
      {"all_reduce_perf -i 0", "-i"},           {"all_reduce_perf -b", "-b"},
      {"all_reduce_perf -V 0", "-V"},           {"all_reduce_perf -b 1M -e 1K", "-b"}};
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) expect_refused(lines[i][0], lines[i][1]);
}

/* The bench's own options and older forms: -G without a count, --samples, --nranks, --list. */
static void test_own_options(void) {
  parsed_t p;
  expect_ok("-G -b 8 -e 64M -f 2 all_reduce", &p);
  EXPECT(p.o.graph == 1 && p.o.min_bytes == 8 && p.o.colls[0] == COLL_ALL_REDUCE);
  expect_ok("--graph all_gather", &p);
  EXPECT(p.o.graph == 1 && p.o.colls[0] == COLL_ALL_GATHER);
  expect_ok("-g 2 -c 1 -n 2 -w 1 -G", &p);
  EXPECT(p.o.graph == 1 && p.o.ncolls == COLL_COUNT);
  expect_ok("--samples 4 --nranks 3 --batch 7 --single --device host all_reduce sendrecv", &p);
  EXPECT(p.o.samples == 4 && p.o.nranks == 3 && p.o.batch == 7 && p.o.single && p.o.ncolls == 2);
  expect_refused("--device host -G 2", "-G");
  expect_refused("-G 2 -z 1", "-z");
}

int main(void) {
  TEST(test_readme_lines, 30);
  TEST(test_measure_flags, 30);
  TEST(test_long_names, 30);
  TEST(test_refusals, 30);
  TEST(test_own_options, 30);
  return test_summary();
}
