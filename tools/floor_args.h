/*
 * What the bench's floor kernel (tools/floor.cu) is given, shared by the kernel and the host code that
 * launches it (tools/bench_floor.c). Plain C, no CUDA header.
 *
 * Each rank owns a page of device memory: word FLOOR_COUNT counts the rank's floor launches that have run,
 * word FLOOR_ERROR is 0 or 1 + the rank whose line a launch gave up waiting for, and line r (words
 * FLOOR_LINE + 2r and the next, 16 bytes) is where rank r stores the launch count it has reached.
 */
#ifndef BRAID_TOOLS_FLOOR_ARGS_H
#define BRAID_TOOLS_FLOOR_ARGS_H

/* Ranks one floor launch exchanges lines with: the kernel's parameters carry a page address per rank. */
#define FLOOR_MAX_RANKS 8
/* Bytes of a rank's page. */
#define FLOOR_PAGE_BYTES 4096
/* Threads of the floor kernel's one block: a thread per peer. */
#define FLOOR_THREADS 32

enum { FLOOR_COUNT = 0, FLOOR_ERROR = 1, FLOOR_LINE = 2 };

typedef struct {
  unsigned long long *page;                   /* this rank's page */
  unsigned long long *peers[FLOOR_MAX_RANKS]; /* every rank's page as this rank reaches it */
  unsigned long long timeout_ns;              /* how long a launch waits for a peer's line */
  int rank, nranks;
} floor_args_t;

#endif
