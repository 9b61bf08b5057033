/*
 * Copy engines straight into the peer's buffer (see ce.h).
 *
 * Eagerly, the peer's outputs (and a pull's inputs) are mapped once per allocation: a small cache keyed by
 * the owner's buffer id and export (a new allocation at the same address has another id, so it is mapped
 * afresh, never written through a stale mapping). An entry leaves the cache, least recently used first, only
 * once the copies into it (or the reads from it) have finished; the rest are unmapped when the communicator
 * is destroyed. A captured step maps the peer's output afresh and hands the mapping to the graph
 * (ce_exec_t.keep), which unmaps it when it is destroyed: a replay may come at any time until then. CUDA
 * documents freeing an exported allocation while another process still has it mapped as undefined: the
 * mapping outlives the call that made it until one of those moments.
 */
#include "ce.h"

#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "base/watchdog.h"
#include "device/dev.h"
#include "gpu/gpu.h"

#define TAG_CE_INIT  0x43454930u /* "0IEC": flag words and the threshold, at init */
#define TAG_CE_READY 0x43455230u /* "0REC": both ranks mapped the other's words (and mailbox) */
#define TAG_CE_STEP  0x43455330u /* "0SEC": a step message, where the ranks have no mailbox */
#define CE_MAGIC     0x42434531u

/* A reduction's chunks start at multiples of this many bytes of its transfer: whole elements of any type,
 * and 16-byte parts for the combine's blocks. */
#define CE_CHUNK_ALIGN (64u * 1024)

/* A rank's flag words (in its own memory), raised by the peer: [W_READY] the peer's outputs are free (this
 * rank may send), [W_DONE] the peer's copy into this rank's outputs has finished (a reduction's: how many of
 * its chunks have landed, reduce_step); and one of its own, [W_BLOCKS], the push kernel's count of its blocks
 * done (dev_push_t). */
enum { W_READY = 0, W_DONE = 1, W_BLOCKS = 2, W_COUNT = 3 };

/* Step messages a mailbox holds. ce_offer sends at most CE_OFFERS_MAX for one plan (the first candidate
 * steps; the kernels move the rest), and a rank can be at most two plans ahead of its peer's reads: it
 * settles each plan, which needs the peer's messages of it, which the peer sends only after it read this
 * rank's messages of the plan before. So a send never finds the mailbox full, and never waits. */
#define CE_MBOX_SLOTS 64
#define CE_OFFERS_MAX (CE_MBOX_SLOTS / 2)

/* How long a receive spins on the mailbox before it also sleeps between looks (the peer's message usually
 * comes within microseconds), and how long each sleep then is. */
#define CE_MBOX_SPIN_US  20.0
#define CE_MBOX_SLEEP_NS 20000

/* Mapped allocations of the peer kept at most for eager steps. */
enum { CE_IMPORTS = 16 };

typedef struct {
  gpu_mem_t *mem; /* the mapping; NULL: free */
  uint64_t buffer_id;
  gpu_export_t blob;
  gpu_event_t *used; /* recorded after the latest step that copied into it */
  uint64_t stamp;    /* for least-recently-used eviction */
} import_t;

struct ce {
  int dev, rank, peer;
  int local; /* the peer is a rank of this process: addresses travel as they are, nothing is mapped */
  const char *name;
  alloc_acct_t *acct;
  boot_t *boot;
  uint64_t min_bytes;   /* the larger of the two ranks' BRAID_CE_MIN_BYTES */
  uint64_t reduce_min;  /* the same of BRAID_CE_REDUCE_MIN_BYTES (UINT64_MAX: reductions never) */
  uint64_t chunk_min;   /* the larger of the two ranks' BRAID_CE_CHUNK_BYTES (at least CE_CHUNK_ALIGN) */
  uint64_t pull_min;    /* the same of BRAID_CE_PULL_MIN_BYTES (UINT64_MAX: never) */
  uint64_t push_min;    /* the same of BRAID_CE_PUSH_MIN_BYTES (UINT64_MAX: never) */
  uint64_t push_xmin;   /* the same of BRAID_CE_PUSH_EXCHANGE_MIN_BYTES (UINT64_MAX: never) */
  struct mbox *inbox;   /* the peer's step messages to this rank */
  struct mbox *outbox;  /* this rank's to the peer: the peer's inbox, mapped here (or its address) */
  char inbox_name[64];  /* another process: the inbox's shared-memory name, until the peer mapped it */
  uint64_t sent, taken; /* messages written to outbox, taken from inbox */
  int peer_pid;         /* another process in this one's pid namespace: checked while waiting (else 0) */
  const volatile int *abort_flag; /* the communicator's: ends a wait for the peer's message */
  gpu_mem_t *words;               /* this rank's words */
  gpu_mem_t *peer_words;          /* the peer's, mapped (another process) */
  uint32_t *mine, *theirs;        /* their device addresses */
  cudaStream_t side;              /* local copies, beside the link's copy; a reduction's combine */
  gpu_event_t *fork, *join;       /* order the side stream after the call's stream, and back */
  import_t imports[CE_IMPORTS];
  uint64_t clock;
  struct offer *offers; /* ce_offer's messages, one per candidate step of the plan, for ce_settle */
  int noffers, cap_offers;
  int offered;       /* the last plan had candidate steps (ce_offered) */
  struct held *held; /* captured steps' mappings made by ce_settle, until ce_step hands them to the graph */
  int nheld, cap_held;
  _Atomic uint64_t logged[OP_COUNT]; /* size classes whose first step was logged (TUNING) */
};

/* What each rank sends the other at init. */
typedef struct {
  uint32_t magic;
  int32_t dev; /* the sender's device (a peer in this process enables access to it) */
  uint64_t min_bytes;
  uint64_t reduce_min;
  uint64_t chunk_min;
  uint64_t pull_min;
  uint64_t push_min;
  uint64_t push_xmin;
  gpu_export_t words;  /* another process: the words' export */
  uint64_t words_at;   /* this process: their address */
  char inbox_name[64]; /* another process: the step-message inbox's shared-memory name ("": none) */
  uint64_t inbox_at;   /* this process: its address (0: none) */
  uint64_t pidns;      /* this process's pid namespace (its inode; 0: unknown) */
} init_msg_t;

/* What each rank sends the other for a candidate step. */
typedef struct step_msg {
  uint32_t magic;
  int32_t kind;    /* the step's call (point-to-point steps as OP_SEND) */
  int32_t willing; /* this rank can take the copy engines for the step */
  int32_t nsend, nrecv;
  int32_t captured; /* the call is being captured into a graph (both ranks must be, or neither) */
  int32_t combine;  /* a reduction: the receiver combines what lands (both ranks must say so) */
  int32_t pull;     /* a reduction's only transfer, received (pulls): read the sender's input */
  int32_t pullable; /* a reduction's only transfer, sent: its input may be read where it lies (in, in_at) */
  uint64_t send_bytes[CE_MAX_XFERS], recv_bytes[CE_MAX_XFERS];
  gpu_ptr_export_t out[CE_MAX_XFERS]; /* this rank's output of each receive, in list order */
  uint64_t out_at[CE_MAX_XFERS];      /* the peer in this process: their addresses instead */
  gpu_ptr_export_t in;                /* pullable: this rank's input */
  uint64_t in_at;
} step_msg_t;

/* A one-way ring of step messages in memory both ranks map (shared memory between processes, or this
 * process's own): the sender writes a slot and then raises `tail` with a release store; the receiver reads
 * `tail` with an acquire load, takes the slot, then raises `head` with a release store, which the sender
 * reads (acquire) before it reuses a slot. Each index has one writer. */
typedef struct mbox {
  _Atomic uint64_t tail; /* messages written (the sender's) */
  char pad0[56];
  _Atomic uint64_t head; /* messages taken (the receiver's) */
  char pad1[56];
  step_msg_t slots[CE_MBOX_SLOTS];
} mbox_t;

/* A message sent by ce_offer, and the step it describes. */
typedef struct offer {
  int step;
  step_msg_t msg;
} offer_t;

/* A mapping of the peer's output made for a captured step. */
typedef struct held {
  int step;
  gpu_mem_t *mem;
} held_t;

/* Unmaps what no graph took (a launch that failed between ce_settle and ce_step). */
static void drop_held(ce_t *ce) {
  for (int i = 0; i < ce->nheld; i++) gpu_mem_release(ce->held[i].mem);
  ce->nheld = 0;
}

/* ---- The step-message mailboxes ---- */

/* This rank's inbox: in shared memory named inbox_name for a peer in another process, else in this
 * process's memory. False (logged) when it cannot be made: both ranks then send their step messages over
 * the bootstrap. */
static int inbox_create(ce_t *ce) {
  if (ce->local) {
    ce->inbox = aligned_alloc(64, sizeof(mbox_t));
    if (ce->inbox != NULL) memset(ce->inbox, 0, sizeof(mbox_t));
    return ce->inbox != NULL;
  }
  static _Atomic unsigned counter;
  snprintf(ce->inbox_name, sizeof ce->inbox_name, "/braid-ce-%d-%d-%u", (int)getpid(), ce->rank,
           atomic_fetch_add(&counter, 1u));
  const int fd = shm_open(ce->inbox_name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, sizeof(mbox_t)) != 0) {
    WARN("%s rank %d: shared memory %s for step messages: %s", ce->name, ce->rank, ce->inbox_name,
         strerror(errno));
    if (fd >= 0) close(fd), shm_unlink(ce->inbox_name);
    ce->inbox_name[0] = 0;
    return 0;
  }
  void *p = mmap(NULL, sizeof(mbox_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    WARN("%s rank %d: mapping %s: %s", ce->name, ce->rank, ce->inbox_name, strerror(errno));
    shm_unlink(ce->inbox_name);
    ce->inbox_name[0] = 0;
    return 0;
  }
  ce->inbox = p; /* a new segment reads as zeros */
  return 1;
}

/* Maps the peer's inbox as this rank's outbox (its name, or its address in this process); false when the
 * peer has none, or (logged) it cannot be mapped. */
static int outbox_map(ce_t *ce, const init_msg_t *theirs) {
  if (ce->local) {
    ce->outbox = (mbox_t *)(uintptr_t)theirs->inbox_at;
    return ce->outbox != NULL;
  }
  if (theirs->inbox_name[0] == 0) return 0;
  const int fd = shm_open(theirs->inbox_name, O_RDWR, 0);
  void *p = fd < 0 ? MAP_FAILED : mmap(NULL, sizeof(mbox_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (p == MAP_FAILED) {
    WARN("%s rank %d: mapping rank %d's step messages (%s): %s", ce->name, ce->rank, ce->peer,
         theirs->inbox_name, strerror(errno));
    return 0;
  }
  ce->outbox = p;
  return 1;
}

/* This process's pid namespace, as its inode (0: unknown). A peer's pid means something here only when the
 * two namespaces are one. */
static uint64_t pid_namespace(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void mbox_release(ce_t *ce) {
  if (ce->inbox_name[0] != 0) shm_unlink(ce->inbox_name);
  if (ce->local) {
    free(ce->inbox);
  } else {
    if (ce->inbox != NULL) munmap(ce->inbox, sizeof(mbox_t));
    if (ce->outbox != NULL) munmap(ce->outbox, sizeof(mbox_t));
  }
  ce->inbox = ce->outbox = NULL;
}

/* Puts m in the peer's inbox; it never waits (CE_MBOX_SLOTS). */
static ncclResult_t mbox_send(ce_t *ce, const step_msg_t *m) {
  mbox_t *o = ce->outbox;
  if (ce->sent - atomic_load_explicit(&o->head, memory_order_acquire) >= CE_MBOX_SLOTS)
    return log_err(ncclInternalError, "%s rank %d: rank %d has not taken %d step messages", ce->name,
                   ce->rank, ce->peer, CE_MBOX_SLOTS);
  o->slots[ce->sent % CE_MBOX_SLOTS] = *m;
  atomic_store_explicit(&o->tail, ++ce->sent, memory_order_release);
  return ncclSuccess;
}

/* Whether the peer's message has come (the slot's contents are visible once it has). */
static int mbox_ready(const ce_t *ce) {
  return atomic_load_explicit(&ce->inbox->tail, memory_order_acquire) != ce->taken;
}

/* Says what mbox_wait waits for (wd_describe_fn_t). */
static void mbox_describe(void *arg, char *buf, size_t len) {
  const ce_t *ce = arg;
  snprintf(buf, len, "%s rank %d: the copy engines wait for rank %d's step message", ce->name, ce->rank,
           ce->peer);
}

/* Waits for the peer's next message: spins for CE_MBOX_SPIN_US, then also sleeps between looks; the
 * watchdog reports it after BRAID_STALL_WARN_S and ends it after BRAID_TIMEOUT_S; an abort or the exit of a
 * peer in another process ends it too. */
static ncclResult_t mbox_wait(ce_t *ce) {
  const double start = time_now();
  wd_timer_t t;
  int timing = 0;
  for (unsigned spins = 1; !mbox_ready(ce); spins++) {
    if (spins % 256 != 0) continue;
    const double now = time_now(), waited = now - start;
    if (waited * 1e6 < CE_MBOX_SPIN_US) continue;
    if (!timing) {
      wd_begin(&t, NULL, &(wd_wait_t){.kind = WD_MAILBOX, .peer = ce->peer, .channel = -1, .op = "mailbox"},
               mbox_describe, ce);
      t.last = start;
      timing = 1;
    }
    if (ce->abort_flag != NULL && __atomic_load_n(ce->abort_flag, __ATOMIC_RELAXED) != 0)
      return log_err(ncclInternalError, "%s rank %d: aborted while waiting for rank %d's step message",
                     ce->name, ce->rank, ce->peer);
    CHECK(wd_check(&t, now));
    if (ce->peer_pid > 0 && kill(ce->peer_pid, 0) != 0 && errno == ESRCH)
      return log_err(ncclRemoteError,
                     "%s rank %d: rank %d (pid %d) exited while this rank waited for its step "
                     "message",
                     ce->name, ce->rank, ce->peer, ce->peer_pid);
    if (waited * 1e6 < 50 * CE_MBOX_SPIN_US)
      sched_yield();
    else
      nanosleep(&(struct timespec){0, CE_MBOX_SLEEP_NS}, NULL);
  }
  return ncclSuccess;
}

/* Takes the peer's next message; the clock and the timeout are read only when it has not come yet. */
static ncclResult_t mbox_recv(ce_t *ce, step_msg_t *m) {
  if (!mbox_ready(ce)) CHECK(mbox_wait(ce));
  *m = ce->inbox->slots[ce->taken % CE_MBOX_SLOTS];
  atomic_store_explicit(&ce->inbox->head, ++ce->taken, memory_order_release);
  return ncclSuccess;
}

/* A step message to the peer and from it: through the mailboxes where both ranks have them, else over the
 * bootstrap (its sockets cost each exchange some 16 us more; docs/perf-notes.md, 98-99). */
static ncclResult_t step_send(ce_t *ce, const step_msg_t *m) {
  return ce->outbox != NULL ? mbox_send(ce, m) : boot_send(ce->boot, ce->peer, TAG_CE_STEP, m, sizeof *m);
}
static ncclResult_t step_recv(ce_t *ce, step_msg_t *m) {
  return ce->outbox != NULL ? mbox_recv(ce, m) : boot_recv(ce->boot, ce->peer, TAG_CE_STEP, m, sizeof *m);
}

static void release(ce_t *ce) {
  for (int i = 0; i < CE_IMPORTS; i++) {
    import_t *e = &ce->imports[i];
    if (e->mem != NULL) gpu_mem_release(e->mem);
    if (e->used != NULL) gpu_event_destroy(e->used);
  }
  free(ce->offers);
  mbox_release(ce);
  drop_held(ce);
  free(ce->held);
  if (ce->fork != NULL) gpu_event_destroy(ce->fork);
  if (ce->join != NULL) gpu_event_destroy(ce->join);
  gpu_stream_destroy(ce->side);
  if (ce->peer_words != NULL) gpu_mem_release(ce->peer_words);
  if (ce->words != NULL) {
    mem_release(ce->acct, gpu_mem_size(ce->words), 1);
    gpu_mem_release(ce->words);
  }
  mem_free(ce->acct, ce, sizeof *ce);
}

/* Sends this rank's word `ok` and returns the AND of it with the peer's: both ranks get the same answer, and
 * neither has it before both sent (after whatever each did before). */
/* Each bit of *bits kept only where the peer's is set too. */
static ncclResult_t both_have(ce_t *ce, uint32_t tag, uint32_t *bits) {
  uint32_t theirs = 0;
  CHECK(boot_send(ce->boot, ce->peer, tag, bits, sizeof *bits));
  CHECK(boot_recv(ce->boot, ce->peer, tag, &theirs, sizeof theirs));
  *bits &= theirs;
  return ncclSuccess;
}

ncclResult_t ce_init(int dev, int rank, int nranks, const tp_peer_t *peers, links_t *links, boot_t *boot,
                     const volatile int *abort_flag, alloc_acct_t *acct, const char *name, ce_t **ce_p) {
  *ce_p = NULL;
  if (dev < 0 || nranks != 2) return ncclSuccess;
  const int peer = 1 - rank;
  /* the same answer on both ranks: both see the same peer table and pick the same transport */
  if (peers[peer].host_hash != peers[rank].host_hash || tp_select(links->tp, peer) != &tp_p2p_ops)
    return ncclSuccess;
  const int local = peers[peer].pid == peers[rank].pid;
  ce_t *ce;
  CHECK(MEM_CALLOC(acct, ce, 1, "copy-engine path"));
  *ce = (ce_t){.dev = dev,
               .rank = rank,
               .peer = peer,
               .local = local,
               .peer_pid = peers[peer].pid,
               .abort_flag = abort_flag,
               .name = name,
               .acct = acct,
               .boot = boot};
  ncclResult_t res;
  gpu_scope_t scope;
  CHECK_GOTO(gpu_enter(dev, &scope), res, fail);
  /* The path is an optimisation: a rank that cannot set it up (logged) says so, and both go without it;
   * only a failed exchange with the peer fails init. */
  int64_t min = param_int(P_BRAID_CE_MIN_BYTES), chunk = param_int(P_BRAID_CE_CHUNK_BYTES),
          reduce_min = param_int(P_BRAID_CE_REDUCE_MIN_BYTES),
          pull_min = param_int(P_BRAID_CE_PULL_MIN_BYTES), push_min = param_int(P_BRAID_CE_PUSH_MIN_BYTES),
          push_xmin = param_int(P_BRAID_CE_PUSH_EXCHANGE_MIN_BYTES);
  init_msg_t mine = {.magic = CE_MAGIC,
                     .dev = dev,
                     .min_bytes = min > 0 ? (uint64_t)min : 0,
                     .reduce_min = reduce_min > 0 ? (uint64_t)reduce_min : UINT64_MAX,
                     .pull_min = pull_min > 0 ? (uint64_t)pull_min : UINT64_MAX,
                     .push_min = push_min > 0 ? (uint64_t)push_min : UINT64_MAX,
                     .push_xmin = push_xmin > 0 ? (uint64_t)push_xmin : UINT64_MAX,
                     /* chunks end at multiples of CE_CHUNK_ALIGN, whatever was asked */
                     .chunk_min = chunk > CE_CHUNK_ALIGN ? ((uint64_t)chunk + CE_CHUNK_ALIGN - 1) /
                                                               CE_CHUNK_ALIGN * CE_CHUNK_ALIGN
                                                         : CE_CHUNK_ALIGN},
             theirs;
  if (mine.min_bytes > 0 && (gpu_dev_alloc(dev, W_COUNT * sizeof(uint32_t), &ce->words) != ncclSuccess ||
                             (!local && gpu_mem_export(ce->words, &mine.words) != ncclSuccess)))
    mine.min_bytes = 0;
  if (ce->words != NULL) {
    mine.words_at = (uint64_t)(uintptr_t)gpu_mem_ptr(ce->words);
    mem_charge(acct, gpu_mem_size(ce->words), 1, "copy-engine flag words");
  }
  if (mine.min_bytes > 0 && param_int(P_BRAID_CE_MAILBOX) != 0)
    inbox_create(ce); /* without it, step messages go over the bootstrap */
  memcpy(mine.inbox_name, ce->inbox_name, sizeof mine.inbox_name);
  mine.inbox_at = (uint64_t)(uintptr_t)ce->inbox;
  mine.pidns = pid_namespace();
  CHECK_GOTO(boot_send(boot, peer, TAG_CE_INIT, &mine, sizeof mine), res, fail_leave);
  CHECK_GOTO(boot_recv(boot, peer, TAG_CE_INIT, &theirs, sizeof theirs), res, fail_leave);
  if (theirs.magic != CE_MAGIC) {
    res = log_err(ncclInternalError, "%s: rank %d sent a malformed copy-engine setup", name, peer);
    goto fail_leave;
  }
  /* either rank's 0 turns the path off on both; otherwise both take the larger threshold */
  int ok = mine.min_bytes > 0 && theirs.min_bytes > 0;
  if (ok) {
    ce->min_bytes = mine.min_bytes > theirs.min_bytes ? mine.min_bytes : theirs.min_bytes;
    ce->reduce_min = mine.reduce_min > theirs.reduce_min ? mine.reduce_min : theirs.reduce_min;
    ce->chunk_min = mine.chunk_min > theirs.chunk_min ? mine.chunk_min : theirs.chunk_min;
    ce->pull_min = mine.pull_min > theirs.pull_min ? mine.pull_min : theirs.pull_min;
    ce->push_min = mine.push_min > theirs.push_min ? mine.push_min : theirs.push_min;
    ce->push_xmin = mine.push_xmin > theirs.push_xmin ? mine.push_xmin : theirs.push_xmin;
    ok = (!local              ? gpu_mem_import(dev, &theirs.words, &ce->peer_words)
          : theirs.dev != dev ? gpu_enable_peer_access(dev, theirs.dev)
                              : ncclSuccess) == ncclSuccess &&
         gpu_stream_create(&ce->side) == ncclSuccess && gpu_event_create(&ce->fork) == ncclSuccess &&
         gpu_event_create(&ce->join) == ncclSuccess;
    /* bit 0 the path, bit 1 the mailboxes; also keeps each rank's words (and their export) and its inbox's
     * name until the other has mapped them */
    uint32_t bits = (uint32_t)ok | (uint32_t)(ok && ce->inbox != NULL && outbox_map(ce, &theirs)) << 1;
    CHECK_GOTO(both_have(ce, TAG_CE_READY, &bits), res, fail_leave);
    ok = bits & 1;
    if (!(bits & 2)) {
      mbox_release(ce);
      if (ok) INFO(LOG_INIT | LOG_TUNING, "%s rank %d: step messages go over the bootstrap", name, rank);
    }
    if (ce->inbox_name[0] != 0) shm_unlink(ce->inbox_name); /* both mapped: nothing left if both crash */
    ce->inbox_name[0] = 0;
    /* a pid from another namespace names some other process here, or none */
    if (local || mine.pidns == 0 || theirs.pidns != mine.pidns) ce->peer_pid = 0;
  }
  gpu_leave(&scope);
  if (!ok) {
    release(ce);
    INFO(LOG_INIT | LOG_TUNING,
         "%s rank %d: no copy-engine path (BRAID_CE_MIN_BYTES is 0 on a rank, or a rank "
         "could not set it up)",
         name, rank);
    return ncclSuccess;
  }
  ce->mine = gpu_mem_ptr(ce->words);
  ce->theirs = local ? (uint32_t *)(uintptr_t)theirs.words_at : gpu_mem_ptr(ce->peer_words);
  INFO(LOG_INIT | LOG_TUNING,
       "%s rank %d: copy engines move steps whose every transfer to or from rank %d moves at least %llu "
       "bytes (BRAID_CE_MIN_BYTES); out-of-place reductions from %llu bytes (BRAID_CE_REDUCE_MIN_BYTES, 0: "
       "never), landing in chunks of at least %llu bytes, combined as they come (BRAID_CE_CHUNK_BYTES); a "
       "reduce's root reads the other rank's input where it lies from %llu bytes, in place or below that "
       "(BRAID_CE_PULL_MIN_BYTES, 0: never); below the copy engines, steps that only copy are pushed by one "
       "kernel from %llu bytes a transfer (BRAID_CE_PUSH_MIN_BYTES, 0: never), from %llu where each rank "
       "sends "
       "and receives (BRAID_CE_PUSH_EXCHANGE_MIN_BYTES)",
       name, rank, peer, (unsigned long long)ce->min_bytes,
       (unsigned long long)(ce->reduce_min == UINT64_MAX ? 0 : ce->reduce_min),
       (unsigned long long)ce->chunk_min, (unsigned long long)(ce->pull_min == UINT64_MAX ? 0 : ce->pull_min),
       (unsigned long long)(ce->push_min >= ce->min_bytes ? 0 : ce->push_min),
       (unsigned long long)(ce->push_xmin >= ce->min_bytes ? 0 : ce->push_xmin));
  *ce_p = ce;
  return ncclSuccess;
fail_leave:
  gpu_leave(&scope);
fail:
  release(ce);
  return res;
}

/* Whether a peer transfer (not a local copy) of the step. */
static int is_peer(const xfer_t *x) {
  return x->recv_peer >= 0 || x->send_peer >= 0;
}

/* Whether a peer transfer belongs to a reduction the copy engines can carry: a send of this rank's input
 * (prepared, which is a copy for every operation but PreMulSum), or a receive combined with this rank's
 * operand into its output. PreMulSum would need the peer's bytes scaled on the way. */
static int combining(const xfer_t *x) {
  return (x->flags & (XF_REDUCE | XF_PREPARE)) != 0;
}
static int combinable(const xfer_t *x) {
  if (x->red == NULL || x->red->kind == RED_PREMULSUM) return 0;
  return x->send_peer >= 0 ? (x->flags & XF_REDUCE) == 0 : (x->flags & XF_REDUCE) != 0;
}

/* The smallest transfer a step that only copies may have and still bypass the rings: pushed by a kernel
 * from push_min (push_xmin where the rank both sends to and receives from the peer), by the copy engines
 * from min_bytes. An eager pushed step costs the host an exchange of step messages with the peer per call:
 * over the bootstrap's sockets that made one-way pushes below 8 MiB slower than the rings; through the
 * mailboxes pushes pay from 2 MiB either way, with a process per rank or one for both (docs/perf-notes.md,
 * 96-99). Both ranks answer alike: one's sends are the other's receives. */
static uint64_t copy_min(const ce_t *ce, int exchange) {
  const uint64_t push = exchange ? ce->push_xmin : ce->push_min;
  return push < ce->min_bytes ? push : ce->min_bytes;
}

/* Whether the step may take the copy engines, from its transfers between the ranks alone: what one rank
 * sends the other receives, and a reduction's send faces a combining receive, so both ranks answer alike.
 * A reduction's step has at most one transfer each way and no local copy. */
static int candidate(const ce_t *ce, const plan_t *plan, const step_t *st) {
  int nsend = 0, nrecv = 0, combines = 0, locals = 0, pulled = 0;
  uint64_t copy_least = UINT64_MAX; /* the smallest plain copy between the ranks (copy_min, after the loop) */
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    if (!is_peer(x)) {
      locals++;
      continue;
    }
    const uint64_t min = !combining(x) ? 0 : ce->reduce_min < ce->pull_min ? ce->reduce_min : ce->pull_min;
    if ((x->recv_peer >= 0 && x->send_peer >= 0) || x->bytes < min || (x->flags & (XF_SEQ | XF_PREPARED)) ||
        (combining(x) && !combinable(x)))
      return 0;
    if (!combining(x) && x->bytes < copy_least) copy_least = x->bytes;
    combines += combining(x);
    pulled |= combining(x) && x->bytes < ce->reduce_min;
    if (x->send_peer >= 0)
      nsend++;
    else
      nrecv++;
  }
  /* plain copies from copy_min: lower for an exchange, where the rank both sends to and receives from the
   * peer */
  if (copy_least < copy_min(ce, nsend > 0 && nrecv > 0)) return 0;
  /* one-shot, the root of a reduce combines in its lane of XF_SEQ transfers (refused above) while the other
   * rank's send looks like the ring's: the step's algorithm settles it for both */
  if (combines > 0 && (st->oneshot || nsend > 1 || nrecv > 1 || locals > 0)) return 0;
  /* below the copy engines' threshold a reduction can only be pulled: one transfer, one way (a reduce) */
  if (pulled && nsend + nrecv != 1) return 0;
  return nsend + nrecv > 0 && nsend <= CE_MAX_XFERS && nrecv <= CE_MAX_XFERS;
}

/* Where the chunks of a reduction's transfer of `bytes` end (ends[], returned: how many): each three fifths
 * of what is left, at least chunk_min, at multiples of CE_CHUNK_ALIGN, so that the last ones, whose combine
 * nothing hides, are small, and the chunks few: each costs the link about 6 us on two H200s, the copy's end,
 * the flag and the next copy's start. The combine of a chunk runs while the rest lands, at about twice the
 * link's rate: halves (the first cut) cost one chunk more from 256 MiB and made reduce-scatter, all-reduce
 * and reduce out of place 4-11 us slower at 512 MiB-1 GiB; two thirds made 1 GiB slower again, the combine no
 * longer keeping up (docs/perf-notes.md, 65 and 91). A function of the size and the agreed minimum: both
 * ranks cut alike. */
static uint32_t chunk_ends(const ce_t *ce, uint64_t bytes, uint64_t *ends) {
  uint32_t n = 0;
  for (uint64_t at = 0; at < bytes;) {
    uint64_t left = bytes - at, c = left / 5 * 3 / CE_CHUNK_ALIGN * CE_CHUNK_ALIGN;
    if (c < ce->chunk_min) c = ce->chunk_min;
    if (c > left || n == DEV_COMBINE_CHUNKS - 1) c = left;
    at += c;
    ends[n++] = at;
  }
  return n;
}

/* This rank's message for a candidate step. */
static void describe(const ce_t *ce, const plan_t *plan, const step_t *st, int capturing, step_msg_t *m) {
  memset(m, 0, sizeof *m);
  m->magic = CE_MAGIC;
  m->kind = st->task->kind == OP_RECV ? OP_SEND : (int32_t)st->task->kind;
  m->willing = 1;
  m->captured = capturing != 0;
  int shared = 0; /* an output shares an input's bytes */
  const xfer_t *send = NULL;
  for (int i = 0; i < st->count; i++) {
    const xfer_t *x = &plan->xfers[st->first + i];
    if (is_peer(x) && combining(x)) m->combine = 1;
    if (!is_peer(x)) {
      if (x->flags != 0) m->willing = 0; /* local copies here are plain copies only */
      continue;
    }
    if (x->send_peer >= 0) {
      send = x;
      m->send_bytes[m->nsend++] = x->bytes;
      continue;
    }
    /* the peer writes this output as soon as this rank's stream reaches the step: no input may share it
     * (in place, a reduction's output is its operand: only a pull, below, takes that) */
    int overlap = 0;
    for (int j = 0; j < st->count; j++) {
      const xfer_t *y = &plan->xfers[st->first + j];
      if (plan_overlap(x->dst, x->bytes, y->src, y->bytes)) overlap = 1;
    }
    shared |= overlap;
    /* a driver failure here (logged) is a refusal, not an error: the peer still gets its answer; a peer in
     * this process needs no export, only memory its device can write. A reduction below the copy engines'
     * threshold is pulled: nothing writes its output but this rank. */
    const int written = !overlap && !(combining(x) && x->bytes < ce->reduce_min);
    int ok = 0;
    if (written && m->willing &&
        gpu_ptr_export(ce->dev, x->dst, ce->local ? NULL : &m->out[m->nrecv], &ok) != ncclSuccess)
      ok = 0;
    if (!ok && written) m->willing = 0;
    m->out_at[m->nrecv] = (uint64_t)(uintptr_t)x->dst;
    m->recv_bytes[m->nrecv++] = x->bytes;
  }
  /* A reduction of one transfer, one way, from BRAID_CE_PULL_MIN_BYTES: the receiver asks for a pull in
   * place, or below the copy engines' threshold; the sender offers its input, readable where it lies, which
   * a peer in this process reads through peer access as it would write an output. */
  const uint64_t bytes = m->nrecv == 1 ? m->recv_bytes[0] : m->send_bytes[0];
  if (m->combine && m->nsend + m->nrecv == 1 && bytes >= ce->pull_min) {
    int ok = 0;
    if (m->nrecv == 1)
      m->pull = shared || bytes < ce->reduce_min;
    else if (gpu_ptr_export(ce->dev, send->src, ce->local ? NULL : &m->in, &ok) == ncclSuccess)
      m->pullable = ok;
    m->in_at = send != NULL ? (uint64_t)(uintptr_t)send->src : 0;
  }
  if (shared && !m->pull) m->willing = 0;
}

/* Whether the two messages (agreed) make the step a pull. */
static int pulls(const step_msg_t *a, const step_msg_t *b) {
  return a->pull || b->pull;
}

/* Whether an agreed step that only copies goes by the push kernel: some transfer between the ranks below
 * the copy engines' threshold. Agreed messages hold the same sizes (one's sends are the other's receives),
 * so both ranks answer alike. */
static int pushes(const ce_t *ce, const step_msg_t *m) {
  if (m->combine) return 0;
  for (int i = 0; i < m->nsend; i++)
    if (m->send_bytes[i] < ce->min_bytes) return 1;
  for (int i = 0; i < m->nrecv; i++)
    if (m->recv_bytes[i] < ce->min_bytes) return 1;
  return 0;
}

/* The decision, the same on both ranks: a symmetric test of the two messages. */
static int agree(const step_msg_t *a, const step_msg_t *b) {
  if (a->magic != CE_MAGIC || b->magic != CE_MAGIC || a->kind != b->kind || a->nsend != b->nrecv ||
      a->nrecv != b->nsend || a->captured != b->captured || a->combine != b->combine)
    return 0;
  for (int i = 0; i < a->nsend; i++)
    if (a->send_bytes[i] != b->recv_bytes[i]) return 0;
  for (int i = 0; i < a->nrecv; i++)
    if (a->recv_bytes[i] != b->send_bytes[i]) return 0;
  /* a pull asked for: one transfer, and the sender's input readable */
  if (pulls(a, b) && (a->nsend + a->nrecv != 1 || !(a->nsend == 1 ? a : b)->pullable)) return 0;
  return a->willing && b->willing;
}

/* Maps the peer's allocation described by x (for `what`, in the log). */
static ncclResult_t map_peer(ce_t *ce, const gpu_ptr_export_t *x, const char *what, gpu_mem_t **mem_p) {
  CHECK(gpu_mem_import(ce->dev, &x->blob, mem_p));
  INFO(LOG_ALLOC | LOG_P2P, "%s rank %d: mapped %zu bytes of rank %d's memory for %s at %p", ce->name,
       ce->rank, gpu_mem_size(*mem_p), ce->peer, what, gpu_mem_ptr(*mem_p));
  return ncclSuccess;
}

/* The peer's allocation described by x, mapped here (from the cache, or mapped now). */
static ncclResult_t import(ce_t *ce, const gpu_ptr_export_t *x, char **base_p) {
  import_t *victim = NULL;
  for (int i = 0; i < CE_IMPORTS; i++) {
    import_t *e = &ce->imports[i];
    if (e->mem != NULL && e->buffer_id == x->buffer_id && memcmp(&e->blob, &x->blob, sizeof e->blob) == 0) {
      e->stamp = ++ce->clock;
      *base_p = gpu_mem_ptr(e->mem);
      return ncclSuccess;
    }
    if (victim == NULL || (victim->mem != NULL && (e->mem == NULL || e->stamp < victim->stamp))) victim = e;
  }
  if (victim->mem != NULL) { /* its copies must be over before it goes */
    if (victim->used != NULL) CHECK(gpu_event_sync(victim->used));
    gpu_mem_release(victim->mem);
    victim->mem = NULL;
  }
  if (victim->used == NULL) CHECK(gpu_event_create(&victim->used));
  CHECK(map_peer(ce, x, "the copy engines", &victim->mem));
  victim->buffer_id = x->buffer_id;
  victim->blob = x->blob;
  victim->stamp = ++ce->clock;
  *base_p = gpu_mem_ptr(victim->mem);
  return ncclSuccess;
}

/* The peer's allocation described by x, mapped afresh for captured step s (held until ce_step). Mapping is
 * among the calls a capture forbids in its strict modes: the thread relaxes its mode around it. */
static ncclResult_t import_held(ce_t *ce, int s, const gpu_ptr_export_t *x, char **base_p) {
  if (ce->nheld == ce->cap_held) {
    int cap = ce->cap_held < 4 ? 4 : 2 * ce->cap_held;
    held_t *h = realloc(ce->held, (size_t)cap * sizeof *h);
    if (h == NULL)
      return log_err(ncclSystemError, "%s: out of host memory for %d graph mappings", ce->name, cap);
    ce->held = h;
    ce->cap_held = cap;
  }
  int saved;
  CHECK(gpu_capture_relax(&saved));
  gpu_mem_t *mem;
  ncclResult_t res = map_peer(ce, x, "a captured copy", &mem);
  gpu_capture_restore(saved);
  if (res != ncclSuccess) return res;
  ce->held[ce->nheld++] = (held_t){s, mem};
  *base_p = gpu_mem_ptr(mem);
  return ncclSuccess;
}

/* The peer's buffer described by x (or, the peer in this process, at `at`), for step s: mapped here. */
static ncclResult_t peer_addr(ce_t *ce, int s, int captured, const gpu_ptr_export_t *x, uint64_t at,
                              char **p) {
  if (ce->local) {
    *p = (char *)(uintptr_t)at;
    return ncclSuccess;
  }
  char *base = NULL;
  CHECK(captured ? import_held(ce, s, x, &base) : import(ce, x, &base));
  *p = base + x->offset;
  return ncclSuccess;
}

/* Points each send of the agreed step s at the peer's output, or a pull's receive at the peer's input. */
static ncclResult_t point_step(ce_t *ce, plan_t *plan, int s, const step_msg_t *peer, int pull) {
  const step_t *st = &plan->steps[s];
  int k = 0;
  for (int i = 0; i < st->count; i++) {
    xfer_t *x = &plan->xfers[st->first + i];
    if (pull && x->recv_peer >= 0) {
      char *p;
      CHECK(peer_addr(ce, s, peer->captured, &peer->in, peer->in_at, &p));
      x->ce_src = p;
    }
    if (pull || x->send_peer < 0) continue;
    CHECK(peer_addr(ce, s, peer->captured, &peer->out[k], peer->out_at[k], &x->ce_dst));
    k++;
  }
  return ncclSuccess;
}

static void log_step(ce_t *ce, const step_t *st, const step_msg_t *m) {
  uint64_t bytes = 0;
  for (int i = 0; i < m->nsend; i++) bytes += m->send_bytes[i];
  for (int i = 0; i < m->nrecv; i++) bytes += m->recv_bytes[i];
  int lvl = log_first_of_class(&ce->logged[st->task->kind], bytes) ? LOG_INFO : LOG_TRACE;
  if (st->ce == STEP_CE_PULL) {
    const int reader = m->nrecv == 1 ? ce->rank : ce->peer;
    LOG_AT(lvl, LOG_TUNING,
           "%s rank %d: %s (call %llu) pulled: rank %d's combine reads rank %d's %llu bytes of input where "
           "they lie (BRAID_CE_PULL_MIN_BYTES)",
           ce->name, ce->rank, plan_op_name(st->task->kind), (unsigned long long)st->task->seq, reader,
           1 - reader, (unsigned long long)bytes);
    return;
  }
  if (st->ce == STEP_CE_PUSH) {
    LOG_AT(
        lvl, LOG_TUNING,
        "%s rank %d: %s (call %llu) pushed by one kernel: %d send%s and %d receive%s, %llu bytes with rank "
        "%d (BRAID_CE_PUSH_MIN_BYTES)",
        ce->name, ce->rank, plan_op_name(st->task->kind), (unsigned long long)st->task->seq, m->nsend,
        m->nsend == 1 ? "" : "s", m->nrecv, m->nrecv == 1 ? "" : "s", (unsigned long long)bytes, ce->peer);
    return;
  }
  uint64_t ends[DEV_COMBINE_CHUNKS];
  LOG_AT(lvl, LOG_TUNING,
         "%s rank %d: %s (call %llu) by the copy engines: %d send%s and %d receive%s, %llu bytes with rank "
         "%d%s%u%s",
         ce->name, ce->rank, plan_op_name(st->task->kind), (unsigned long long)st->task->seq, m->nsend,
         m->nsend == 1 ? "" : "s", m->nrecv, m->nrecv == 1 ? "" : "s", (unsigned long long)bytes, ce->peer,
         m->combine ? ", combined as it lands in " : "",
         m->combine ? chunk_ends(ce, m->nsend ? m->send_bytes[0] : m->recv_bytes[0], ends) : 0,
         m->combine ? " chunks" : "");
}

ncclResult_t ce_offer(ce_t *ce, plan_t *plan) {
  if (ce == NULL) return ncclSuccess; /* plan_build left every step_t.ce 0 */
  ce->noffers = 0;
  int entered = 0, capturing = -1, saved = 0, relaxed = 0;
  gpu_scope_t scope;
  ncclResult_t res = ncclSuccess;
  if (ce->nheld > 0) { /* mappings of a launch that failed */
    CHECK(gpu_enter(ce->dev, &scope));
    entered = 1;
    drop_held(ce);
  }
  for (int s = 0; s < plan->nsteps; s++) {
    step_t *st = &plan->steps[s];
    if (!candidate(ce, plan, st)) continue;
    if (ce->noffers == CE_OFFERS_MAX) { /* both ranks stop at the same candidate step */
      TRACE(LOG_TUNING,
            "%s rank %d: the kernels move the steps after the first %d that could bypass the rings", ce->name,
            ce->rank, CE_OFFERS_MAX);
      break;
    }
    if (!entered) {
      CHECK(gpu_enter(ce->dev, &scope));
      entered = 1;
    }
    if (capturing < 0) { /* an invalidated capture is refused by the launch; here it only says no */
      void *graph;
      uint64_t id;
      if (gpu_stream_capture(plan->tasks[0].stream, &capturing, &graph, &id) != ncclSuccess) capturing = 1;
      /* describing an output is among the calls a capture forbids in its strict modes */
      if (capturing && gpu_capture_relax(&saved) == ncclSuccess) relaxed = 1;
    }
    if (ce->noffers == ce->cap_offers) {
      int cap = ce->cap_offers < 4 ? 4 : 2 * ce->cap_offers;
      offer_t *o = realloc(ce->offers, (size_t)cap * sizeof *o);
      if (o == NULL) {
        res = log_err(ncclSystemError, "%s: out of host memory for %d copy-engine offers", ce->name, cap);
        goto out;
      }
      ce->offers = o;
      ce->cap_offers = cap;
    }
    offer_t *o = &ce->offers[ce->noffers++];
    o->step = s;
    describe(ce, plan, st, capturing, &o->msg);
    CHECK_GOTO(step_send(ce, &o->msg), res, out);
  }
out:
  ce->offered = ce->noffers > 0 || res != ncclSuccess;
  if (relaxed) gpu_capture_restore(saved);
  if (entered) gpu_leave(&scope);
  return res;
}

int ce_offered(const ce_t *ce) {
  return ce != NULL && ce->offered;
}

ncclResult_t ce_settle(ce_t *ce, plan_t *plan) {
  if (ce == NULL || ce->noffers == 0) return ncclSuccess;
  gpu_scope_t scope;
  CHECK(gpu_enter(ce->dev, &scope));
  ncclResult_t res = ncclSuccess;
  for (int k = 0; k < ce->noffers; k++) {
    step_t *st = &plan->steps[ce->offers[k].step];
    const step_msg_t *mine = &ce->offers[k].msg;
    step_msg_t theirs;
    CHECK_GOTO(step_recv(ce, &theirs), res, out);
    if (!agree(mine, &theirs)) {
      if (mine->willing && theirs.willing && mine->captured == theirs.captured && !pulls(mine, &theirs))
        WARN("%s rank %d: %s (call %llu): rank %d describes a different step (%d sends and %d receives); "
             "the kernels move it",
             ce->name, ce->rank, plan_op_name(st->task->kind), (unsigned long long)st->task->seq, ce->peer,
             theirs.nsend, theirs.nrecv);
      continue;
    }
    const int pull = pulls(mine, &theirs);
    CHECK_GOTO(point_step(ce, plan, ce->offers[k].step, &theirs, pull), res, out);
    st->ce = pull ? STEP_CE_PULL : pushes(ce, mine) ? STEP_CE_PUSH : STEP_CE_COPY;
    log_step(ce, st, mine);
  }
out:
  ce->noffers = 0;
  gpu_leave(&scope);
  return res;
}

/* The transfers of a reduction's step (candidate: at most one each way, no local copy): the send goes in
 * chunks (chunk_ends), each raising the receiver's W_DONE to its number; the receive is combined chunk by
 * chunk as it lands, by a kernel on the side stream when this rank also sends (forked after the wait for the
 * peer: its copies must not wait for it), after which the stream clears W_DONE. Sends are enqueued first:
 * where the driver runs what it is given at once, the combine waits for the peer's chunks, and the peer's
 * combine for these. */
static ncclResult_t reduce_step(ce_t *ce, const xfer_t *send, const xfer_t *recv, cudaStream_t stream,
                                uint64_t seq, const ce_exec_t *ex) {
  uint64_t ends[DEV_COMBINE_CHUNKS];
  const int both = send != NULL && recv != NULL;
  if (both) CHECK(gpu_event_record(ce->fork, stream));
  if (send != NULL) {
    const uint32_t n = chunk_ends(ce, send->bytes, ends);
    uint64_t at = 0;
    for (uint32_t c = 0; c < n; c++) {
      CHECK(gpu_copy_dd_async(send->ce_dst + at, send->src + at, ends[c] - at, stream));
      CHECK(gpu_stream_write32(stream, &ce->theirs[W_DONE], c + 1));
      at = ends[c];
    }
  }
  if (recv == NULL) return ncclSuccess;
  cudaStream_t on = both ? ce->side : stream;
  if (both) CHECK(gpu_stream_wait(on, ce->fork));
  const uint32_t n = chunk_ends(ce, recv->bytes, ends);
  CHECK(ex->combine(ex->arg, on, recv, NULL, &ce->mine[W_DONE], ce->peer, seq, n, ends));
  CHECK(gpu_stream_write32(on, &ce->mine[W_DONE], 0));
  if (both) {
    CHECK(gpu_event_record(ce->join, on));
    CHECK(gpu_stream_wait(stream, ce->join));
  }
  return ncclSuccess;
}

/* A pull (STEP_CE_PULL): the sender's stream raises the receiver's `ready` word once it reaches the step
 * (its input is final there) and waits for `done`; the receiver's combine kernel waits for `ready`, reads
 * the input where it lies (ce_src) and combines it with its operand into its output, then the receiver's
 * stream clears `ready` and raises the sender's `done`: the input is the sender's again. The sender raises
 * `ready` with a stream write before its wait, not in it (raise_wait): the root's combine, all of the step's
 * work, must not wait for the sender's wait kernel to find an SM. */
static ncclResult_t pull_step(ce_t *ce, const xfer_t *send, const xfer_t *recv, cudaStream_t stream,
                              uint64_t seq, const ce_exec_t *ex) {
  if (send != NULL) {
    CHECK(gpu_stream_write32(stream, &ce->theirs[W_READY], 1));
    return ex->wait(ex->arg, stream, NULL, &ce->mine[W_DONE], ce->peer, 1, seq);
  }
  const uint64_t end = recv->bytes;
  CHECK(ex->combine(ex->arg, stream, recv, recv->ce_src, &ce->mine[W_READY], ce->peer, seq, 1, &end));
  CHECK(gpu_stream_write32(stream, &ce->mine[W_READY], 0));
  return gpu_stream_write32(stream, &ce->theirs[W_DONE], 1);
}

/* Raises the peer's word `raise` (if not NULL) and waits for this rank's `word` (if not NULL): both in one
 * wait kernel where the rank has both to do, which spares the stream a turn from a write to a kernel; a raise
 * alone with a stream write, which needs no SM, so that the peer's transfer never waits for a kernel of a
 * rank that has no wait of its own behind it (ce.h). */
static ncclResult_t raise_wait(ce_t *ce, cudaStream_t stream, uint32_t *raise, uint32_t *word, int is_send,
                               uint64_t seq, const ce_exec_t *ex) {
  if (word != NULL) return ex->wait(ex->arg, stream, raise, word, ce->peer, is_send, seq);
  return raise != NULL ? gpu_stream_write32(stream, raise, 1) : ncclSuccess;
}

/* The transfers of a step that only copies: the sends into the peer's outputs, the local copies beside them
 * on the side stream; then `done` raised where the rank sends, and awaited where it receives. */
static ncclResult_t copy_step(ce_t *ce, const xfer_t *x, int count, int sends, int recvs, int locals,
                              cudaStream_t stream, uint64_t seq, const ce_exec_t *ex) {
  if (locals > 0) {
    CHECK(gpu_event_record(ce->fork, stream));
    CHECK(gpu_stream_wait(ce->side, ce->fork));
    for (int i = 0; i < count; i++)
      if (!is_peer(&x[i])) CHECK(gpu_copy_dd_async(x[i].dst, x[i].src, x[i].bytes, ce->side));
    CHECK(gpu_event_record(ce->join, ce->side));
  }
  for (int i = 0; i < count; i++)
    if (x[i].send_peer >= 0) CHECK(gpu_copy_dd_async(x[i].ce_dst, x[i].src, x[i].bytes, stream));
  CHECK(raise_wait(ce, stream, sends > 0 ? &ce->theirs[W_DONE] : NULL, recvs > 0 ? &ce->mine[W_DONE] : NULL,
                   0, seq, ex));
  if (locals > 0) CHECK(gpu_stream_wait(stream, ce->join));
  return ncclSuccess;
}

/* The transfers of a pushed step (STEP_CE_PUSH) where the rank sends or copies locally: one push kernel
 * (dev_push_t) with the handshake inside it, its sends into the peer's outputs and its local copies; local
 * copies beyond what the kernel takes follow it on the stream. A rank that only receives, with nothing to
 * copy, raises `ready` with a stream write and waits for `done` as for the copy engines (ce_step). */
static ncclResult_t push_step(ce_t *ce, const xfer_t *x, int count, int sends, int recvs, cudaStream_t stream,
                              uint64_t seq, const ce_exec_t *ex) {
  dev_push_t w = {.ready = sends > 0 ? &ce->mine[W_READY] : NULL,
                  .done = recvs > 0 ? &ce->mine[W_DONE] : NULL,
                  .raise_ready = recvs > 0 ? &ce->theirs[W_READY] : NULL,
                  .raise_done = sends > 0 ? &ce->theirs[W_DONE] : NULL,
                  .blocks = &ce->mine[W_BLOCKS],
                  .seq = seq,
                  .peer = ce->peer};
  for (int i = 0; i < count; i++) /* the sends first: at most CE_MAX_XFERS */
    if (x[i].send_peer >= 0) w.copies[w.ncopies++] = (dev_copy_t){x[i].src, x[i].ce_dst, x[i].bytes};
  int i = 0; /* the local copies the kernel takes, then (from i on) those that follow it */
  for (; i < count && w.ncopies < DEV_PUSH_COPIES; i++)
    if (!is_peer(&x[i]) && x[i].bytes > 0)
      w.copies[w.ncopies++] = (dev_copy_t){x[i].src, x[i].dst, x[i].bytes};
  CHECK(ex->push(ex->arg, stream, &w));
  for (; i < count; i++)
    if (!is_peer(&x[i]) && x[i].bytes > 0) CHECK(gpu_copy_dd_async(x[i].dst, x[i].src, x[i].bytes, stream));
  return ncclSuccess;
}

/* Records, after the step on `stream`, the use of the cached mapping that holds p (if any): it must outlive
 * the copies into it and the reads from it. */
static ncclResult_t mark_used(ce_t *ce, const char *p, cudaStream_t stream) {
  for (int k = 0; p != NULL && k < CE_IMPORTS; k++) {
    import_t *e = &ce->imports[k];
    const char *base = e->mem != NULL ? gpu_mem_ptr(e->mem) : NULL;
    if (base != NULL && p >= base && p < base + gpu_mem_size(e->mem))
      CHECK(gpu_event_record(e->used, stream));
  }
  return ncclSuccess;
}

ncclResult_t ce_step(ce_t *ce, const plan_t *plan, int s, cudaStream_t stream, int capturing,
                     const ce_exec_t *ex) {
  const step_t *st = &plan->steps[s];
  const xfer_t *x = &plan->xfers[st->first];
  const uint64_t seq = st->task->seq;
  int sends = 0, recvs = 0, locals = 0, combines = 0;
  const xfer_t *send = NULL, *recv = NULL;
  for (int i = 0; i < st->count; i++) {
    if (x[i].send_peer >= 0) sends++, send = &x[i];
    if (x[i].recv_peer >= 0) recvs++, recv = &x[i];
    if (!is_peer(&x[i])) locals++;
    if (is_peer(&x[i]) && combining(&x[i])) combines++;
  }
  if (capturing) /* the graph owns the step's mappings from now on */
    for (int i = 0; i < ce->nheld;) {
      if (ce->held[i].step != s) {
        i++;
        continue;
      }
      CHECK(ex->keep(ex->arg, ce->held[i].mem));
      ce->held[i] = ce->held[--ce->nheld];
    }
  if (st->ce == STEP_CE_PULL) {
    CHECK(pull_step(ce, send, recv, stream, seq, ex));
  } else if (st->ce == STEP_CE_PUSH && (sends > 0 || locals > 0)) {
    CHECK(push_step(ce, x, st->count, sends, recvs, stream, seq, ex));
  } else {
    /* `ready` raised where the rank receives, and awaited where it sends */
    CHECK(raise_wait(ce, stream, recvs > 0 ? &ce->theirs[W_READY] : NULL,
                     sends > 0 ? &ce->mine[W_READY] : NULL, 1, seq, ex));
    /* The local copies fork only now: the driver may run a copy within the device as a kernel, whose
     * blocks would hold the SMs the wait kernel above needs, and the link's copy would start only once they
     * ended (2 ms instead of 1.4 for an all-gather of 1 GiB on two H200s); so does a reduction's combine,
     * whose blocks would otherwise hold the SMs while its chunks wait for the peer's, and the peer's for
     * this rank's copies */
    if (combines > 0)
      CHECK(reduce_step(ce, send, recv, stream, seq, ex));
    else
      CHECK(copy_step(ce, x, st->count, sends, recvs, locals, stream, seq, ex));
  }
  if (capturing) return ncclSuccess;
  for (int i = 0; i < st->count; i++) { /* ce_dst is set on copies' sends only, ce_src on pulls' receives */
    CHECK(mark_used(ce, x[i].ce_dst, stream));
    CHECK(mark_used(ce, x[i].ce_src, stream));
  }
  return ncclSuccess;
}

void ce_destroy(ce_t *ce) {
  gpu_scope_t scope;
  if (ce == NULL) return;
  int entered = gpu_enter(ce->dev, &scope) == ncclSuccess;
  release(ce);
  if (entered) gpu_leave(&scope);
}
