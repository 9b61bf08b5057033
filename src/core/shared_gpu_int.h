/*
 * The shared-GPU path's state (core/shared_gpu.h), for its three files: shared_gpu.c (setup, messages,
 * teardown), shared_gpu_run.c (the leader's local work and the streams' waits) and shared_gpu_watch.c (the
 * thread that bounds the waits).
 */
#ifndef BRAID_CORE_SHARED_GPU_INT_H
#define BRAID_CORE_SHARED_GPU_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/shared_gpu.h"
#include "gpu/gpu.h"
#include "transport/mbox.h"
#include "transport/peer_mem.h"
#include "transport/shm_seg.h"

/* The words of one rank other than the leader, in a page of shared memory both processes map and register:
 * each on a line of its own. */
typedef struct {
  volatile uint32_t ready; /* raised by the rank's stream, waited for and cleared by the leader's */
  uint32_t pad0[15];
  volatile uint32_t done; /* raised by the leader's stream, waited for and cleared by the rank's */
  uint32_t pad1[15];
  volatile uint32_t gave_up[2]; /* host stores: [0] the leader failed or was aborted, [1] the rank */
  volatile uint32_t left[2];    /* host stores: [0] the leader's communicator is gone, [1] the rank's */
} sg_words_t;
#define SG_WORDS_BYTES 4096

/* One call as a rank describes it to the leader. */
typedef struct {
  int32_t kind, type, root, red_kind;
  uint64_t count;
  double fscale;
  int64_t iscale, divisor;
  int32_t has_in, has_out; /* the buffers the call uses on this rank, exported below */
  gpu_ptr_export_t in, out;
} sg_call_t;

/* Why a rank says a group must go the ordinary way (bits). */
enum { SG_NO_EXPORT = 1, SG_CAPTURED = 2, SG_DEV_SCALAR = 4, SG_TOO_MANY = 8 };

typedef struct {
  uint32_t magic;
  int32_t rank;
  int32_t ncalls; /* the group's calls (all of them, even beyond SG_CALLS) */
  uint32_t refuse;
  sg_call_t calls[SG_CALLS];
} sg_msg_t;

/* The leader's answer. */
enum { SG_TAKE = 1, SG_ORDINARY = 2, SG_MISMATCH = 3 };
typedef struct {
  uint32_t magic;
  int32_t verdict;
  char why[232];
} sg_answer_t;

/* The leader's side of another rank, or the other rank's side of the leader. */
typedef struct {
  int rank;
  int pid;                   /* its process, to check while waiting (0: another pid namespace, or unknown) */
  tp_seg_t seg;              /* the rank's words (sg_words_t) */
  sg_words_t *words;         /* NULL until mapped and registered */
  sg_words_t *words_dev;     /* the same, as the device sees it */
  tp_mbox_t *inbox, *outbox; /* leader: the rank's calls in, answers out; the rank: answers in, calls out */
  tp_peer_mem_t *mem;        /* leader: the rank's buffers mapped here */
  sg_msg_t msg;              /* leader: the rank's calls of the group being settled */
} sg_peer_t;

/* What the leader knows of one rank's call: where its buffers are in this process. */
typedef struct {
  const char *in;
  char *out;
  red_t red;
} sg_view_t;

/* Calls whose wait the watch may report, by token. */
#define SG_RECENT 64

struct sg {
  int dev, rank, nranks;
  const char *name;
  alloc_acct_t *acct;
  const volatile int *abort_flag;
  sg_peer_t *peers; /* the leader: [nranks], [0] unused; another rank: [1], the leader */
  int npeers;
  sg_msg_t mine;    /* another rank: its last message */
  int verdict;      /* the last group's answer */
  plan_t local;     /* the leader: the group as local transfers */
  sg_view_t *views; /* the leader: [nranks * SG_CALLS] */
  int cap_views;
  sg_msg_t **msgs; /* the leader: [nranks], each rank's calls of the group being settled */
  int *idx;        /* the leader: [nranks], where one collective is among each rank's calls */
  /* a word the stream sets to a call's token while it waits, and clears after: the watch reads it */
  volatile uint32_t *reached;
  void *reached_dev;
  uint32_t token;
  struct {
    uint32_t token;
    uint64_t seq;
    int kind;
  } recent[SG_RECENT];
  gpu_event_t *last; /* recorded after each call's waits */
  int launched;
  /* the watch */
  pthread_t thread;
  int thread_live;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int stop;
  volatile int quit;     /* ends the mailbox waits: set on a failure, or the communicator's abort */
  _Atomic int failed;    /* ncclResult_t of the first failure */
  _Atomic int aborting;  /* sg_destroy with aborting, or the communicator's abort */
  _Atomic int releasing; /* the watch stores the words this rank's stream waits for, at each round */
};

/* shared_gpu_run.c */
ncclResult_t sg_build_local(sg_t *sg, const plan_t *plan);
ncclResult_t sg_enqueue_leader(sg_t *sg, gx_t *gx, const plan_t *plan);
ncclResult_t sg_enqueue_rank(sg_t *sg, gx_t *gx, const plan_t *plan);
/* Whether call `kind` reads an input, and writes an output, on `rank` (root: of rooted calls). */
int sg_has_in(int kind, int rank, int root);
int sg_has_out(int kind, int rank, int root);

/* shared_gpu_watch.c */
ncclResult_t sg_watch_start(sg_t *sg);
void sg_watch_stop(sg_t *sg);
/* Records the first failure, with `msg` at WARN when `loud` (a wait of this rank's is concerned), else INFO.
 */
void sg_fail(sg_t *sg, ncclResult_t res, int loud, const char *msg);
/* Tells the other side that this rank failed or was aborted (its watch fails that rank's communicator). */
void sg_gave_up(sg_t *sg);
/* Stores every word this rank's stream may wait for (a release). */
void sg_release(sg_t *sg);

#endif
