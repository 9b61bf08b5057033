/*
 * One rank of the multi-host recovery test (test_recover_netns.sh), one process per network namespace:
 *
 *   recover_rank RANK NRANKS VICTIM TOKEN_FILE   joins the communicator at NCCL_COMM_ID and runs all-reduces
 *                                                 until one fails (rank VICTIM kills itself in the middle),
 *                                                 shrinks without VICTIM, checks every collective, then grows
 *                                                 back to NRANKS ranks; the new rank 0 writes the grow token
 *                                                 to TOKEN_FILE for the joiner;
 *   recover_rank join NRANKS TOKEN_FILE           the process that joins by ncclCommGrow as rank NRANKS - 1.
 *
 * Exits 0 when every result was right.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_check.h"
#include "harness.h"

static void check_all(ncclComm_t comm, uint64_t seed) {
  for (int k = 0; k < K_COUNT; k++) {
    coll_case_t c = {.kind = (kind_t)k, .type = ncclFloat, .op = ncclSum, .count = 4099, .seed = seed + k};
    coll_check(comm, &c);
  }
}

static void *die_later(void *arg) {
  usleep(300 * 1000);
  raise(SIGKILL);
  return NULL;
}

static void write_token(const char *path, const ncclUniqueId *token) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  EXPECT(f != NULL && fwrite(token, sizeof *token, 1, f) == 1 && fclose(f) == 0, "writing %s", tmp);
  EXPECT(rename(tmp, path) == 0, "renaming %s", tmp); /* the joiner never sees half a token */
}

static int joiner(int n, const char *path) {
  ncclUniqueId token;
  FILE *f = fopen(path, "rb");
  EXPECT(f != NULL && fread(&token, sizeof token, 1, f) == 1, "reading %s", path);
  fclose(f);
  ncclComm_t grown;
  EXPECT_OK(ncclCommGrow(NULL, n, &token, n - 1, &grown, NULL));
  check_all(grown, 500);
  EXPECT_OK(ncclCommDestroy(grown));
  printf("joiner: rank %d of %d joined, all collectives correct\n", n - 1, n);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "join") == 0) return joiner(atoi(argv[2]), argv[3]);
  if (argc != 5) {
    fprintf(stderr, "usage: recover_rank RANK NRANKS VICTIM TOKEN_FILE | join NRANKS TOKEN_FILE\n");
    return 2;
  }
  int rank = atoi(argv[1]), n = atoi(argv[2]), victim = atoi(argv[3]);
  ncclUniqueId id;
  EXPECT_OK(ncclGetUniqueId(&id)); /* with NCCL_COMM_ID, every rank derives the same id */
  ncclComm_t comm;
  EXPECT_OK(ncclCommInitRank(&comm, n, id, rank));
  pthread_t t;
  if (rank == victim) pthread_create(&t, NULL, die_later, NULL);
  size_t count = 1 << 20;
  float *buf = calloc(count, sizeof(float));
  ncclResult_t res = ncclSuccess;
  while (res == ncclSuccess) res = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
  free(buf);
  EXPECT(res == ncclRemoteError || res == ncclSystemError, "rank %d: the all-reduce returned %d", rank, res);
  ncclComm_t child, grown;
  EXPECT_OK(ncclCommShrink(comm, &victim, 1, &child, NULL, NCCL_SHRINK_ABORT));
  int r;
  EXPECT_OK(ncclCommUserRank(child, &r));
  EXPECT(r == (rank < victim ? rank : rank - 1), "rank %d became %d", rank, r);
  check_all(child, 100);
  ncclUniqueId token;
  if (r == 0) {
    EXPECT_OK(ncclCommGetUniqueId(child, &token));
    write_token(argv[4], &token);
  }
  EXPECT_OK(ncclCommGrow(child, n, r == 0 ? &token : NULL, -1, &grown, NULL));
  check_all(grown, 500);
  EXPECT_OK(ncclCommDestroy(grown));
  EXPECT_OK(ncclCommDestroy(child));
  EXPECT_OK(ncclCommAbort(comm));
  printf("rank %d of %d: shrunk to rank %d, grown back, all collectives correct\n", rank, n, r);
  return 0;
}
