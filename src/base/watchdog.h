/*
 * The watchdog: deadlines, stall reports and asynchronous errors of every wait the library makes (the host
 * executor's, the GPU work queue's, the copy engines' mailbox, the bootstrap's), and what each communicator
 * waits for now, published for the monitoring layer.
 *
 * A wait runs a wd_timer_t on the waiting thread: wd_begin when it starts, wd_progress whenever it moves,
 * wd_check whenever it did not. After BRAID_STALL_WARN_S without progress wd_check prints one stall report,
 * always (on stderr when NCCL_DEBUG is unset), in NCCL's log format; after BRAID_TIMEOUT_S it fails the wait.
 * A communicator's stalled waits first ask the other ranks what they wait for (wd_exchange_t, through the
 * bootstrap), so that both the report and the error name the rank that is behind, not the ring neighbour
 * that waits for it: each stalled rank says (at half the stall time) what it waits for, and the rank behind
 * is the end of the chain of "waits for" that starts at this rank's peer: a rank that said nothing (stopped,
 * dead, or busy elsewhere), or, in a cycle, the rank of the oldest call.
 *
 * Monitoring reads a communicator's current wait with wd_read (any thread, any rate, lock-free), or walks all
 * communicators' watchdogs with wd_foreach.
 */
#ifndef BRAID_BASE_WATCHDOG_H
#define BRAID_BASE_WATCHDOG_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* NCCL 2.30's result for a wait that timed out, returned to callers whose header knows it (wd_create). */
#define WD_RES_TIMEOUT ((ncclResult_t)8)
/* The NCCL version (ncclConfig_t.version) from which callers know WD_RES_TIMEOUT. */
#define WD_TIMEOUT_VERSION 23000

/* What a wait is for. */
typedef enum {
  WD_IDLE = 0,    /* not waiting */
  WD_COLL = 1,    /* the host executor: a call's step waits for a peer's data or room */
  WD_QUEUE = 2,   /* the GPU work queue: room for a launch, or the last launch's end */
  WD_MAILBOX = 3, /* the copy engines' step messages from the peer */
  WD_BOOT = 4,    /* the bootstrap: init, or a message of the out-of-band network */
} wd_kind_t;

/* A communicator's current wait, as wd_read gives it. Plain values only; copy it, never keep a pointer. */
typedef struct {
  int32_t kind;    /* wd_kind_t */
  int32_t peer;    /* the rank waited for; -1 when none in particular */
  uint64_t seq;    /* the call's sequence number on its communicator (0: not a call) */
  int32_t step;    /* the call's step waited in, from 1 (0: none) */
  int32_t nsteps;  /* its steps */
  int32_t channel; /* GPU channel, -1 when none */
  int32_t behind;  /* the rank the last stall report found behind; -1 when there was none */
  double since;    /* time_now() when the wait last moved (or began) */
  char op[24];     /* the call ("AllReduce", ...) or what the wait is for ("bootstrap") */
} wd_wait_t;

/* One rank's answer to "what do you wait for", exchanged when a wait stalls. */
typedef struct {
  int32_t rank;    /* who says it */
  int32_t stalled; /* 1: it has waited half the stall time at least; 0: it moved again */
  int32_t kind;    /* wd_kind_t of its wait */
  int32_t peer;    /* the rank it waits for, -1 when none in particular */
  uint64_t seq;    /* its call */
  int32_t step;    /* its step */
  int32_t pad;     /* zero */
  char op[24];     /* its call's name */
} wd_report_t;

/* How a communicator's waits ask the other ranks (core supplies it; it must never block for long). */
typedef struct {
  /* Tells every other rank this rank's report (best effort). */
  void (*announce)(void *arg, const wd_report_t *mine);
  /* Takes the latest report of each rank that sent one since the last call: fills reports[r] and sets
   * have[r] for each (reports and have hold nranks entries). */
  void (*collect)(void *arg, wd_report_t *reports, int *have);
  void *arg;
} wd_exchange_t;

/* A communicator's watchdog (one per communicator; opaque). */
typedef struct wd wd_t;

/* Makes a watchdog for `rank` of `nranks` of communicator `name`; `version` is the caller's NCCL version
 * (ncclConfig_t.version, 0 when unknown): it picks the timeout's result. Registers it for wd_foreach. */
ncclResult_t wd_create(const char *name, int rank, int nranks, unsigned version, wd_t **wd_p);
/* Renames it (the communicator's name is known once its bootstrap is up). */
void wd_set_name(wd_t *wd, const char *name);
/* Sets how its waits ask the other ranks (NULL: they do not). */
void wd_set_exchange(wd_t *wd, const wd_exchange_t *ex);
/* Unregisters and frees it. */
void wd_destroy(wd_t *wd);

/* Copies the communicator's current wait (kind WD_IDLE when it waits for nothing). Lock-free. */
void wd_read(const wd_t *wd, wd_wait_t *out);
/* Calls fn for every live watchdog, with its communicator's name and rank, under the registry's lock (fn must
 * not create or destroy communicators). */
void wd_foreach(void (*fn)(void *arg, const char *name, int rank, const wd_t *wd), void *arg);

/* What a timed-out wait returns to this communicator's caller: ncclRemoteError or WD_RES_TIMEOUT. */
ncclResult_t wd_timeout_result(const wd_t *wd);
/* The first asynchronous error recorded, with its message; ncclSuccess while there is none. */
ncclResult_t wd_error(const wd_t *wd, const char **msg_p);
/* Records an asynchronous error and its message (the first one is kept). Returns whether it was the first. */
int wd_set_error(wd_t *wd, ncclResult_t res, const char *msg);

/* Writes what the wait is for into buf: "AllReduce (call #5): step 2 of 6 waits to receive from rank 3". */
typedef void (*wd_describe_fn_t)(void *arg, char *buf, size_t len);

/* One wait, on the waiting thread's stack. */
typedef struct {
  wd_t *wd;                  /* whose (NULL: published nowhere, asks no one) */
  wd_wait_t w;               /* what it waits for */
  wd_describe_fn_t describe; /* says so in words */
  void *arg;
  int64_t warn_s;    /* seconds without progress before the stall report (0: none) */
  int64_t timeout_s; /* seconds without progress before the wait fails (0: never) */
  double margin_s;   /* added to timeout_s (a host wait that must outlast a kernel's own timeout) */
  int ask;           /* may ask the other ranks (wd_begin sets it; a wait inside the exchange clears it) */
  double last;       /* time of the last progress */
  int announced;     /* this wait told the other ranks it is stalled */
  int reported;      /* its stall report was printed */
} wd_timer_t;

/* Starts a wait (and publishes it): BRAID_STALL_WARN_S and BRAID_TIMEOUT_S unless the caller changes
 * warn_s, timeout_s or margin_s afterwards. */
void wd_begin(wd_timer_t *t, wd_t *wd, const wd_wait_t *what, wd_describe_fn_t describe, void *arg);
/* The wait moved: its stall clock starts again. `w` (or NULL) is where it is now, published when it
 * differs in its step, peer or call. */
void wd_progress(wd_timer_t *t, double now, const wd_wait_t *w);
/* The wait did not move: reports a stall once, fails after the timeout (ncclRemoteError, or NCCL 2.30's
 * ncclTimeout for callers that know it, naming the rank behind). Cheap when nothing is due. */
ncclResult_t wd_check(wd_timer_t *t, double now);
/* Whether wd_check has something to do now (a cheap test for waits that describe themselves at a cost). */
int wd_due(const wd_timer_t *t, double now);
/* The wait is somewhere else now (another peer, say) without having moved: publishes it, clock unchanged. */
void wd_relocate(wd_timer_t *t, const wd_wait_t *w);
/* Ends the wait (published as idle). A wait that failed still counts as stalled for the other ranks. */
void wd_end(wd_timer_t *t);

/* A deadline `seconds` from now (0: none), and whether one passed. */
double wd_deadline(int64_t seconds);
int wd_passed(double deadline, double now);

/* Finds the rank behind from the reports of the ranks that are stalled (have[r]): follows "waits for" from
 * `peer` (this rank's), and names in `why` what shows it. Returns -1 when nothing points anywhere. */
int wd_find_behind(int me, int nranks, int peer, const wd_report_t *reports, const int *have, char *why,
                   size_t len);

#endif
