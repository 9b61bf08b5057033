/*
 * The tests' small framework: assertions that stop the test with a message, named cases with a closing
 * "N passed, N failed" line, and multi-process runs where each rank is a child process under a timeout
 * (collectives hang rather than crash, so a stuck rank is killed and reported, never waited on forever).
 */
#ifndef BRAID_TESTS_HARNESS_H
#define BRAID_TESTS_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

/* Fails the current case (process) with file, line and a message. */
void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

/* Fails naming the condition that did not hold, then the message. */
void test_fail_expect(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));

#define EXPECT(cond, ...)                                                                                    \
  do {                                                                                                       \
    if (!(cond)) test_fail_expect(__FILE__, __LINE__, #cond, " " __VA_ARGS__);                               \
  } while (0)
/* Expects an ncclResult_t call to return `want`. */
#define EXPECT_RES(call, want)                                                                               \
  do {                                                                                                       \
    int expect_res_ = (int)(call);                                                                           \
    if (expect_res_ != (int)(want))                                                                          \
      test_fail(__FILE__, __LINE__, "%s returned %d, expected %d", #call, expect_res_, (int)(want));         \
  } while (0)
#define EXPECT_OK(call) EXPECT_RES(call, 0)

/* Runs one case in a child process under a timeout; counts it as passed or failed. */
void test_case(const char *name, void (*fn)(void), int timeout_s);
#define TEST(fn, timeout_s) test_case(#fn, fn, timeout_s)
/* Runs only the cases named in names[0..count) from now on (every case when count is 0); a name that no case
 * has is reported by test_summary as a failure. */
void test_filter(int count, char **names);
/* Prints "N passed, N failed" and returns the exit status for main. */
int test_summary(void);

/* Runs fn(rank, nranks, arg) in nranks child processes. Returns 0 when every rank exits 0 within timeout_s;
 * otherwise kills the rest and returns 1, saying which rank failed or hung. */
int run_ranks(int nranks, int timeout_s, void (*fn)(int rank, int nranks, void *arg), void *arg);
/* Like run_ranks, but returns a bitmask of the ranks that failed or hung (bit r for rank r). */
unsigned run_ranks_mask(int nranks, int timeout_s, void (*fn)(int rank, int nranks, void *arg), void *arg);

/* Runs the test program again (once) with `dir` first on LD_LIBRARY_PATH, e.g. to load the tests' stand-in
 * libcuda.so.1; returns in the program run that way. */
void test_reexec_with_library_dir(char **argv, const char *dir);

/* Lines of the text file at `path` that contain `part`; 0 when the file cannot be read (yet). */
int test_file_lines(const char *path, const char *part);

#endif
