/*
 * Mailboxes (see mbox.h).
 */
#include "transport/mbox.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/check.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "base/watchdog.h"
#include "transport/shm_seg.h"

_Static_assert(sizeof(((tp_mbox_addr_t *)0)->name) >= SHM_NAME_BYTES,
               "a mailbox address holds a segment name");

/* How long a receive spins before it also sleeps between looks (a message usually comes within
 * microseconds), and how long each sleep then is. */
#define MBOX_SPIN_US  20.0
#define MBOX_SLEEP_NS 20000

/* The ring's header, before its slots. */
typedef struct {
  _Atomic uint64_t tail; /* messages written (the sender's) */
  char pad0[56];
  _Atomic uint64_t head; /* messages taken (the receiver's) */
  char pad1[56];
} ring_t;

struct tp_mbox {
  ring_t *ring;
  char *slots;
  size_t bytes;
  int nslots, local, owns; /* owns: this process made the memory (the receiver) */
  uint64_t count;          /* messages sent (outbox) or taken (inbox) through this side */
  tp_seg_t seg;            /* between processes */
};

static size_t ring_bytes(size_t bytes, int slots) {
  return sizeof(ring_t) + bytes * (size_t)slots;
}

static ncclResult_t mbox_new(int local, size_t bytes, int slots, tp_mbox_t **m_p) {
  tp_mbox_t *m = calloc(1, sizeof *m);
  if (m == NULL) return log_err(ncclSystemError, "out of host memory for a mailbox");
  m->bytes = bytes;
  m->nslots = slots;
  m->local = local;
  *m_p = m;
  return ncclSuccess;
}

ncclResult_t tp_mbox_create(const tp_ctx_t *ctx, int peer, int local, size_t bytes, int slots,
                            tp_mbox_t **inbox_p, tp_mbox_addr_t *addr_p) {
  tp_mbox_t *m = NULL;
  CHECK(mbox_new(local, bytes, slots, &m));
  memset(addr_p, 0, sizeof *addr_p);
  const size_t total = ring_bytes(bytes, slots);
  m->owns = 1;
  if (local) {
    m->ring = aligned_alloc(64, (total + 63) / 64 * 64);
    if (m->ring == NULL) {
      free(m);
      return log_err(ncclSystemError, "out of host memory for a mailbox of %zu bytes", total);
    }
    memset(m->ring, 0, total);
    addr_p->at = (uint64_t)(uintptr_t)m->ring;
  } else {
    ncclResult_t res = tp_seg_create(tp_ctx_config(ctx), peer, total, "mailbox", &m->seg);
    if (res != ncclSuccess) {
      free(m);
      return res;
    }
    m->ring = m->seg.base; /* a new segment reads as zeros */
    memcpy(addr_p->name, m->seg.name, sizeof addr_p->name);
  }
  m->slots = (char *)m->ring + sizeof(ring_t);
  *inbox_p = m;
  return ncclSuccess;
}

ncclResult_t tp_mbox_attach(const tp_mbox_addr_t *addr, int local, size_t bytes, int slots,
                            tp_mbox_t **outbox_p) {
  tp_mbox_t *m = NULL;
  CHECK(mbox_new(local, bytes, slots, &m));
  if (local) {
    m->ring = (ring_t *)(uintptr_t)addr->at;
  } else {
    ncclResult_t res = tp_seg_attach(addr->name, ring_bytes(bytes, slots), "mailbox", &m->seg);
    if (res != ncclSuccess) {
      free(m);
      return res;
    }
    m->ring = m->seg.base;
  }
  if (m->ring == NULL) {
    free(m);
    return log_err(ncclInternalError, "a mailbox at no address");
  }
  m->slots = (char *)m->ring + sizeof(ring_t);
  *outbox_p = m;
  return ncclSuccess;
}

void tp_mbox_close(tp_mbox_t *m) {
  if (m == NULL) return;
  if (!m->local)
    tp_seg_close(&m->seg, "mailbox");
  else if (m->owns)
    free(m->ring);
  free(m);
}

ncclResult_t tp_mbox_send(tp_mbox_t *m, const void *msg, const tp_mbox_wait_t *who) {
  if (m->count - atomic_load_explicit(&m->ring->head, memory_order_acquire) >= (uint64_t)m->nslots)
    return log_err(ncclInternalError, "%s rank %d: rank %d has not taken %d %ss", who->comm, who->rank,
                   who->peer, m->nslots, who->what);
  memcpy(m->slots + (m->count % (uint64_t)m->nslots) * m->bytes, msg, m->bytes);
  atomic_store_explicit(&m->ring->tail, ++m->count, memory_order_release);
  return ncclSuccess;
}

/* Whether the next message has come (the slot's contents are visible once it has). */
static int ready(const tp_mbox_t *m) {
  return atomic_load_explicit(&m->ring->tail, memory_order_acquire) != m->count;
}

/* Says what wait_next waits for (wd_describe_fn_t). */
static void describe(void *arg, char *buf, size_t len) {
  const tp_mbox_wait_t *who = arg;
  snprintf(buf, len, "%s rank %d waits for rank %d's %s", who->comm, who->rank, who->peer, who->what);
}

/* Waits for the next message: spins for MBOX_SPIN_US, then also yields, then sleeps between looks; the
 * watchdog reports it after BRAID_STALL_WARN_S and ends it after BRAID_TIMEOUT_S; an abort or the exit of a
 * peer in another process ends it too. */
static ncclResult_t wait_next(const tp_mbox_t *m, const tp_mbox_wait_t *who) {
  const double start = time_now();
  wd_timer_t t;
  int timing = 0;
  for (unsigned spins = 1; !ready(m); spins++) {
    if (spins % 256 != 0) continue;
    const double now = time_now(), waited = now - start;
    if (waited * 1e6 < MBOX_SPIN_US) continue;
    if (!timing) {
      wd_begin(&t, NULL, &(wd_wait_t){.kind = WD_MAILBOX, .peer = who->peer, .channel = -1, .op = "mailbox"},
               describe, (void *)who);
      t.last = start;
      timing = 1;
    }
    if (who->abort_flag != NULL && __atomic_load_n(who->abort_flag, __ATOMIC_RELAXED) != 0)
      return log_err(ncclInternalError, "%s rank %d: aborted while waiting for rank %d's %s", who->comm,
                     who->rank, who->peer, who->what);
    CHECK(wd_check(&t, now));
    if (who->peer_pid > 0 && kill(who->peer_pid, 0) != 0 && errno == ESRCH)
      return log_err(ncclRemoteError, "%s rank %d: rank %d (pid %d) exited while this rank waited for its %s",
                     who->comm, who->rank, who->peer, who->peer_pid, who->what);
    if (waited * 1e6 < 50 * MBOX_SPIN_US)
      sched_yield();
    else
      nanosleep(&(struct timespec){0, MBOX_SLEEP_NS}, NULL);
  }
  return ncclSuccess;
}

ncclResult_t tp_mbox_recv(tp_mbox_t *m, void *msg, const tp_mbox_wait_t *who) {
  if (!ready(m)) CHECK(wait_next(m, who)); /* the clock and the timeout are read only when it has not come */
  memcpy(msg, m->slots + (m->count % (uint64_t)m->nslots) * m->bytes, m->bytes);
  atomic_store_explicit(&m->ring->head, ++m->count, memory_order_release);
  return ncclSuccess;
}

uint64_t tp_pid_namespace(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}
