/*
 * The monitor's reports: NCCL's text and JSON status formats (with Braid's extra fields), the job-wide
 * verdict, and the MONITOR event lines. Pure functions of a view of the job (no sockets, no locks), so that
 * every format is tested on views made by hand.
 *
 * A view is what one query learnt: every process the monitor knows, each with its state, and the records of
 * its communicators: fresh ones when it answered the query, otherwise the latest ones its keep-alives
 * carried (shown only as "last known"). A rank is missing from a communicator when no process answered for
 * it; its process is found from the last keep-alives or from this process's own peer tables.
 */
#ifndef BRAID_RAS_REPORT_H
#define BRAID_RAS_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "ras/wire.h"

/* A process as the monitor sees it. */
typedef enum {
  PEER_SELF,         /* this process */
  PEER_CONNECTING,   /* known, never heard from yet */
  PEER_ALIVE,        /* heard from within the keep-alive timeout */
  PEER_UNRESPONSIVE, /* silent for longer than that */
  PEER_DEAD,         /* its connections closed and it could not be reached, or silent past the dead timeout */
  PEER_LEFT,         /* it said goodbye (the process exited normally) */
} peer_state_t;

typedef struct {
  ras_proc_t proc; /* identity and records */
  int state;       /* peer_state_t */
  int fresh;       /* 1: the records answer this query; 0: the last keep-alive's (brief) */
  double silent_s; /* seconds since it was last heard from */
} view_proc_t;

typedef struct {
  view_proc_t *procs;
  int nprocs;
  double collect_s; /* how long the query took */
  int timeouts;     /* processes asked that did not answer in time */
  /* Where rank `rank` of communicator `nonce` runs, from this process's own peer tables (may be NULL). */
  int (*where)(uint64_t nonce, int rank, ras_peer_t *peer_p);
} ras_view_t;

/* Output text, grown as needed. */
typedef struct {
  char *data;
  size_t len, cap;
  int failed; /* out of memory: the text is cut short */
} rpt_t;

void rpt_free(rpt_t *r);
void rpt_printf(rpt_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The status report: NCCL's text layout, or its JSON document (always valid JSON). `verbose` lists every
 * rank in text. */
void report_text(const ras_view_t *v, int verbose, rpt_t *out);
void report_json(const ras_view_t *v, rpt_t *out);
/* The verdict for every communicator of the view whose ranks disagree, in one line ("" when none). */
void report_verdict(const ras_view_t *v, rpt_t *out);
/* One MONITOR event in text or JSON (NCCL's formats). `peer` may be NULL. */
void report_event(int json, const char *group, const char *event, const ras_peer_t *peer, const char *details,
                  rpt_t *out);
/* Frees the records of every process and the array. */
void view_free(ras_view_t *v);

#endif
