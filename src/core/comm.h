/*
 * Communicators: creation in named phases (bootstrap, peer exchange, links), split, finalize, destroy and
 * abort, and the checks every entry point makes on a handle.
 *
 * The communicator holds pointers to the state of each module (bootstrap, links, plan, reduction ops)
 * rather than their fields. Its state is published with a release store once init is complete; readers
 * (other threads, monitoring) load it with acquire before touching anything else (DESIGN.md, principle 7).
 * A destroyed communicator keeps its small header, marked dead, so that a stale handle is reported as
 * destroyed instead of touching freed memory; the most recent COMM_DEAD_KEPT headers are kept, older ones are
 * freed. A group that holds calls or deferred work of a communicator holds its header (and its calls) until
 * the group ends, whichever thread destroys or aborts it meanwhile (comm_hold).
 */
#ifndef BRAID_CORE_COMM_H
#define BRAID_CORE_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "nccl.h"
#include "base/alloc.h"
#include "base/watchdog.h"
#include "bootstrap/bootstrap.h"
#include "core/gpu_exec.h"
#include "core/ce.h"
#include "core/shared_gpu.h"
#include "core/links.h"
#include "core/plan.h"
#include "core/redop.h"
#include "ras/ras.h"
#include "transport/transport.h"

#define COMM_MAGIC 0x4272616964436f6dull /* a live communicator */
#define COMM_DEAD  0x4272616964446564ull /* a destroyed one */
/* Destroyed communicators whose header is kept so that a stale handle is recognised. */
#define COMM_DEAD_KEPT 256
/* comm.hold: this bit is set once the communicator is destroyed; the bits below count groups' holds. */
#define COMM_HOLD_DEAD 0x40000000u

/* Life of a communicator. REVOKED (ncclCommRevoke, or ncclCommShrink with NCCL_SHRINK_ABORT) and FAILED
 * ones can still be split, shrunk, aborted or destroyed; SUSPENDED ones only resumed, aborted or destroyed.
 */
typedef enum {
  COMM_INITIALIZING,
  COMM_READY,
  COMM_FINALIZED,
  COMM_FAILED,
  COMM_REVOKED,
  COMM_SUSPENDED
} comm_state_t;

struct ncclComm {
  uint64_t magic;          /* COMM_MAGIC, COMM_DEAD after destroy */
  _Atomic int state;       /* comm_state_t; release-stored when it changes */
  _Atomic int async_error; /* ncclResult_t: ncclInProgress during non-blocking init, or the error */
  volatile int abort_flag; /* set once by ncclCommAbort or a fatal error; every wait polls it */
  _Atomic int busy;        /* threads running work on this communicator (abort waits for 0) */
  int rank, nranks;
  int dev;             /* CUDA device, -1 on the host backend (set before init) */
  int nch;             /* GPU: channels a transfer takes at most, the same on all ranks (tune_rings: rings) */
  int sms;             /* GPU: SMs its launches may take (shared by its process's ranks on the GPU) */
  gx_t *gx;            /* GPU executor state; NULL on the host backend */
  ce_t *ce;            /* copy engines into the peer's buffer (core/ce.h); NULL where there are none */
  sg_t *sg;            /* ranks of separate processes on one GPU (core/shared_gpu.h); NULL: not so */
  uint64_t nonce;      /* the unique id's nonce: the communicator's identity */
  char name[64];       /* "comm <nonce> rank r" or the config's commName, for messages */
  int blocking;        /* config.blocking, resolved */
  ncclConfig_t config; /* the configuration as normalised at init (inherited by split) */
  boot_t *boot;        /* bootstrap */
  links_t *links;      /* connections */
  tp_peer_t *peers;    /* [nranks] what each rank told at init */
  plan_t plan;         /* the current group's calls and plan */
  uint64_t next_seq;   /* sequence number of the next call */
  size_t ring_bytes;   /* staging ring per connection, the same on all ranks; plans slice by half of it */
  redop_table_t redops;  /* PreMulSum operations made on this communicator */
  alloc_acct_t acct;     /* memory charged to this communicator */
  alloc_acct_t dp_acct;  /* the part of it that ncclCommSuspend gives back: links, rings, GPU executor */
  uint32_t epoch;        /* shrinks and grows made from this communicator (keys their bootstrap messages) */
  int grow_id_live;      /* ncclCommGetUniqueId made grow_id and no grow has used it yet */
  ncclUniqueId grow_id;  /* that token */
  ras_comm_t *ras;       /* its record in monitoring (ras.h); NULL without */
  pthread_t init_thread; /* non-blocking init runs here */
  int init_thread_live;  /* init_thread must be joined */
  struct ncclComm *group_next; /* next communicator with calls in the calling thread's group */
  int in_group;                /* on the calling thread's group list */
  /* Holds of groups on the header and the calls (count), and COMM_HOLD_DEAD once destroyed: a destroy from
   * any thread sets the bit; whoever drops the last hold of a destroyed communicator releases its header. */
  _Atomic unsigned hold;
  wd_t *wd; /* its watchdog: current wait, stall reports, the failure and its message (base/watchdog.h) */
};

/* Allocates a communicator for `rank` of `nranks` with a validated configuration (NULL: defaults). */
ncclResult_t comm_alloc(int nranks, int rank, const ncclConfig_t *config, ncclComm_t *comm_p);
/* Runs init: bootstrap with the ids, peer exchange, links. On failure the communicator is marked failed. */
ncclResult_t comm_init(ncclComm_t comm, const ncclUniqueId *ids, int nid);
/* Starts comm_init on a thread (non-blocking communicators); ncclCommGetAsyncError reports its end. */
ncclResult_t comm_init_async(ncclComm_t comm, const ncclUniqueId *ids, int nid);
/* Splits `parent`: see ncclCommSplit. *child_p is NULL for NCCL_SPLIT_NOCOLOR. */
ncclResult_t comm_split(ncclComm_t parent, int color, int key, const ncclConfig_t *config,
                        ncclComm_t *child_p);
/* Validates and normalises a user configuration (size, magic, version, values) into *out. */
ncclResult_t comm_config_check(const ncclConfig_t *config, ncclConfig_t *out);
/* Checks a handle given to `func`: NULL, foreign and destroyed handles get a message naming `func`. */
ncclResult_t comm_check(ncclComm_t comm, const char *func);
/* Like comm_check, and the communicator must be ready for work (initialised, not failed or finalized). */
ncclResult_t comm_check_ready(ncclComm_t comm, const char *func);
/* ncclCommGetAsyncError: init's state, or an error a kernel reported (which then fails the communicator). */
ncclResult_t comm_async_error(ncclComm_t comm);
/* Records a fatal error: the communicator fails and tells its peers. */
void comm_set_error(ncclComm_t comm, ncclResult_t res);
/* Finalize: waits for every rank, then no more work is accepted. */
ncclResult_t comm_finalize(ncclComm_t comm);
/* Revoke, shrink, grow, suspend and resume, and what they share with init (core/recover.c). */
/* Makes the data path (links; on a GPU: every connection, the executor and the copy engines), charged to
 * dp_acct: init and ncclCommResume. */
ncclResult_t comm_dp_build(ncclComm_t comm);
/* Frees the data path (ncclCommSuspend, a failed resume); no CUDA graph may hold the communicator.
 * ncclSystemError when a kernel may still use it: it is then left allocated, as gx_destroy says. */
ncclResult_t comm_dp_free(ncclComm_t comm);
/* ncclSuccess while the communicator accepts work; checked again by ncclGroupEnd after it has counted itself
 * busy, so that a call that passed its checks before a revoke or suspend does not run after it. */
ncclResult_t comm_accepts_work(ncclComm_t comm);
/* Like comm_check, and the communicator may be a parent of split or shrink: ready, failed or revoked. */
ncclResult_t comm_check_parent(ncclComm_t comm, const char *func);

/* Frees everything but the dead header; raises the abort flag first when a non-blocking init still runs
 * (it returns at once then instead of waiting for peers). */
void comm_destroy(ncclComm_t comm);
/* Stops all work (waiting for threads inside the communicator to leave) and destroys it. */
void comm_abort(ncclComm_t comm);
/* A group's hold on the header and calls of a communicator, taken by the thread that owns the group. Fails
 * (ncclInvalidUsage naming `func`) when the communicator was destroyed already. */
ncclResult_t comm_hold(ncclComm_t comm, const char *func);
/* Drops a hold; returns whether the communicator was destroyed meanwhile (then, on the last hold, its calls
 * are freed and its header released: the caller must not touch it again). */
int comm_unhold(ncclComm_t comm);
/* Whether the communicator was destroyed (by any thread); safe on a held header. */
int comm_dead(ncclComm_t comm);
/* The message of the communicator's failure, or NULL while it has none (ncclGetLastError). */
const char *comm_error_msg(ncclComm_t comm);

#endif
