/*
 * The board: a small region of shared memory, mapped before the bench forks its ranks, through which the
 * rank processes meet (a barrier), pass the unique ids that rank 0 makes and a small blob per rank (the
 * floor probe's IPC handles), and post each row's figures so that every process can read every rank's. With
 * one process driving every rank (--single) the same board serves with a barrier of one.
 */
#ifndef BRAID_TOOLS_BOARD_H
#define BRAID_TOOLS_BOARD_H

#include "nccl.h"

/* Figures one rank posts per row. */
#define BOARD_FIGS 9
/* Unique ids the board carries (one per library). */
#define BOARD_IDS 2

typedef struct board board_t;

/* Maps a board for `nranks` ranks driven by `nprocs` processes. Returns NULL (with the reason on stderr)
 * when the mapping fails. */
board_t *board_create(int nranks, int nprocs);
void board_destroy(board_t *b);
/* Rank `rank`'s figures for row `row`. Rows alternate between two sets of slots, so that one barrier per
 * row suffices: a rank writes row n + 2's figures only after every process has passed row n + 1's barrier,
 * which each reaches only after reading row n's. */
double *board_figs(board_t *b, long row, int rank);
/* The unique ids, written by rank 0 before a barrier and read by the others after it. */
ncclUniqueId *board_ids(board_t *b);
/* Bytes of a rank's blob. */
#define BOARD_BLOB_BYTES 64
/* Rank `rank`'s blob: written by that rank before a barrier, read by the others after it. */
void *board_blob(board_t *b, int rank);
/* Waits until every process has arrived. Everything a process wrote to the board before arriving is
 * visible to every process after it leaves. Returns ncclSuccess, or ncclRemoteError (reported) when
 * another process gave up (board_fail) instead of arriving. */
ncclResult_t board_barrier(board_t *b);
/* Tells the other processes that this one will not arrive any more. */
void board_fail(board_t *b);

#endif
