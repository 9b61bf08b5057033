/*
 * Revoke, shrink, grow, suspend and resume (see recover.h).
 */
#include "recover.h"

#include <pthread.h>
#include <string.h>

#include "base/check.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "core/engine.h"
#include "gpu/gpu.h"

/* Bootstrap tag of the id a shrink's leader sends to the survivors; the low 16 bits are the epoch, so that a
 * message of an abandoned shrink is never taken for the next one's. */
#define TAG_SHRINK_ID 0x53480000u

/* Waits until no thread works on the communicator. Callers have changed its state first (sequentially
 * consistent store), and ncclGroupEnd counts itself busy before it reads the state (group.c): either the
 * call sees the new state, or this wait sees the call. */
static void wait_idle(ncclComm_t comm) {
  while (atomic_load(&comm->busy) > 0) time_sleep_us(1000);
}

/* Stops every pending operation: the abort flag ends this rank's waits (host engine, bootstrap, a
 * non-blocking init) and gx_abort its kernels'; once no thread works on the communicator, the failure signal
 * on every connection ends its peers' waits (not before: a transport may free a connection's state when it
 * fails it, under a thread still using it). The flag then goes down again: the bootstrap must still serve a
 * shrink or a split. */
static void stop_all(ncclComm_t comm) {
  __atomic_store_n(&comm->abort_flag, ENGINE_STOP_REVOKE, __ATOMIC_RELEASE);
  gx_abort(comm->gx);
  if (comm->init_thread_live) {
    pthread_join(comm->init_thread, NULL);
    comm->init_thread_live = 0;
  }
  wait_idle(comm);
  if (comm->links != NULL) links_fail(comm->links);
  __atomic_store_n(&comm->abort_flag, 0, __ATOMIC_RELEASE);
}

ncclResult_t comm_revoke(ncclComm_t comm) {
  int state = atomic_load(&comm->state);
  do {
    if (state == COMM_FINALIZED)
      return log_err(ncclInvalidUsage, "ncclCommRevoke: %s rank %d was finalized; destroy it instead",
                     comm->name, comm->rank);
    if (state == COMM_REVOKED)
      return log_err(ncclInvalidUsage, "ncclCommRevoke: %s rank %d was revoked already", comm->name,
                     comm->rank);
  } while (!atomic_compare_exchange_weak(&comm->state, &state, COMM_REVOKED));
  stop_all(comm);
  INFO(LOG_INIT, "%s rank %d nranks %d: revoked; pending calls were stopped", comm->name, comm->rank,
       comm->nranks);
  return ncclSuccess;
}

/* What a shrink's leader tells each survivor. */
typedef struct {
  ncclUniqueId id;       /* the new communicator's */
  uint64_t parent_nonce; /* which communicator is shrunk */
  uint64_t digest;       /* of the exclusion, as a table of nranks bytes (order and repeats do not count) */
  uint32_t epoch;        /* which shrink or grow of the parent this is */
  int32_t nranks;        /* ranks that stay */
} shrink_msg_t;

/* The leader makes the id and sends it to every other survivor; a survivor that cannot be reached is
 * reported and left to the new ring's init, which names every rank that never came. */
static ncclResult_t shrink_lead(ncclComm_t parent, const uint8_t *out, uint32_t tag, shrink_msg_t *msg) {
  CHECK(boot_new_unique_id(&msg->id));
  for (int r = 0; r < parent->nranks; r++) {
    if (out[r] || r == parent->rank) continue;
    if (boot_send(parent->boot, r, tag, msg, sizeof *msg) != ncclSuccess)
      WARN("ncclCommShrink: %s rank %d cannot reach rank %d, which stays; the new communicator's init will "
           "wait for it (BRAID_BOOTSTRAP_TIMEOUT_S)",
           parent->name, parent->rank, r);
  }
  return ncclSuccess;
}

/* A survivor receives the leader's id and checks that both excluded the same ranks in the same shrink. */
static ncclResult_t shrink_follow(ncclComm_t parent, int leader, uint32_t tag, shrink_msg_t *msg) {
  shrink_msg_t got;
  CHECK(boot_recv(parent->boot, leader, tag, &got, sizeof got));
  if (got.parent_nonce != msg->parent_nonce || got.epoch != msg->epoch)
    return log_err(ncclInvalidUsage,
                   "ncclCommShrink: %s rank %d: rank %d's shrink is its shrink or grow #%u, this rank's #%u: "
                   "every rank that stays must make the same calls",
                   parent->name, parent->rank, leader, got.epoch, msg->epoch);
  if (got.digest != msg->digest || got.nranks != msg->nranks)
    return log_err(
        ncclInvalidUsage,
        "ncclCommShrink: %s rank %d excludes other ranks than rank %d (%d stay there, %d here): every "
        "rank that stays must pass the same excludeRanksList",
        parent->name, parent->rank, leader, got.nranks, msg->nranks);
  msg->id = got.id;
  return ncclSuccess;
}

/* Makes and initialises the child of a shrink or grow: `rank` of `nranks` on the id's ring. */
static ncclResult_t make_child(ncclComm_t parent, int nranks, int rank, const ncclUniqueId *id,
                               const ncclConfig_t *config, const char *func, ncclComm_t *child_p) {
  ncclComm_t child;
  CHECK(comm_alloc(nranks, rank, config != NULL ? config : &parent->config, &child));
  child->dev = parent->dev;
  ncclResult_t res = comm_init(child, id, 1);
  if (res != ncclSuccess) {
    comm_destroy(child);
    return res;
  }
  INFO(LOG_INIT, "%s: %s rank %d of %d -> %s rank %d of %d", func, parent->name, parent->rank, parent->nranks,
       child->name, rank, nranks);
  *child_p = child;
  return ncclSuccess;
}

ncclResult_t comm_shrink(ncclComm_t parent, const int *excl, int n, const ncclConfig_t *config, int flags,
                         ncclComm_t *child_p) {
  uint8_t *out;
  CHECK(MEM_CALLOC(&parent->acct, out, parent->nranks, "shrink table"));
  for (int i = 0; i < n; i++) out[excl[i]] = 1;
  int count = 0, rank = -1, leader = -1;
  for (int r = 0; r < parent->nranks; r++) {
    if (out[r]) continue;
    if (leader < 0) leader = r;
    if (r == parent->rank) rank = count;
    count++;
  }
  if (flags & NCCL_SHRINK_ABORT) {
    atomic_store(&parent->state, COMM_REVOKED);
    stop_all(parent);
  }
  shrink_msg_t msg = {.parent_nonce = parent->nonce,
                      .digest = hash_bytes(out, (size_t)parent->nranks),
                      .epoch = ++parent->epoch,
                      .nranks = count};
  uint32_t tag = TAG_SHRINK_ID | (msg.epoch & 0xffffu);
  ncclResult_t res =
      parent->rank == leader ? shrink_lead(parent, out, tag, &msg) : shrink_follow(parent, leader, tag, &msg);
  mem_free(&parent->acct, out, (size_t)parent->nranks);
  if (res != ncclSuccess) return res;
  return make_child(parent, count, rank, &msg.id, config, "ncclCommShrink", child_p);
}

ncclResult_t comm_grow_id(ncclComm_t comm, ncclUniqueId *id_p) {
  if (comm->grow_id_live)
    return log_err(
        ncclInvalidUsage,
        "ncclCommGetUniqueId: %s rank %d made a token that no ncclCommGrow has used yet; each token "
        "serves one grow",
        comm->name, comm->rank);
  CHECK(boot_new_unique_id(&comm->grow_id));
  comm->grow_id_live = 1;
  *id_p = comm->grow_id;
  return ncclSuccess;
}

/* What each existing rank tells the others at a grow. */
typedef struct {
  ncclUniqueId id; /* the coordinator's token */
  int32_t has_id;  /* this rank passed one */
  int32_t nranks;  /* the size it asked for */
} grow_info_t;

/* The token of the grow, the same on every existing rank (each sees the same table). */
static ncclResult_t grow_pick(ncclComm_t parent, const grow_info_t *all, int nranks, ncclUniqueId *id_p) {
  int from = -1;
  for (int r = 0; r < parent->nranks; r++) {
    if (all[r].nranks != nranks)
      return log_err(ncclInvalidArgument, "ncclCommGrow: %s: rank %d asks for %d ranks, rank %d for %d",
                     parent->name, r, all[r].nranks, parent->rank, nranks);
    if (!all[r].has_id) continue;
    if (from >= 0 && memcmp(&all[r].id, &all[from].id, sizeof all[r].id) != 0)
      return log_err(ncclInvalidArgument,
                     "ncclCommGrow: %s: ranks %d and %d pass different tokens; only the "
                     "coordinator passes its token, the others NULL",
                     parent->name, from, r);
    if (from < 0) from = r;
  }
  if (from < 0)
    return log_err(ncclInvalidArgument,
                   "ncclCommGrow: %s: no existing rank passed a token; the coordinator passes the one "
                   "ncclCommGetUniqueId made",
                   parent->name);
  *id_p = all[from].id;
  return ncclSuccess;
}

ncclResult_t comm_grow(ncclComm_t parent, int nranks, const ncclUniqueId *id, const ncclConfig_t *config,
                       ncclComm_t *child_p) {
  grow_info_t *all;
  CHECK(MEM_CALLOC(&parent->acct, all, parent->nranks, "grow table"));
  all[parent->rank] = (grow_info_t){.has_id = id != NULL, .nranks = nranks};
  if (id != NULL) all[parent->rank].id = *id;
  if (id != NULL && parent->grow_id_live && memcmp(id, &parent->grow_id, sizeof *id) == 0)
    parent->grow_id_live = 0; /* used, whatever comes of it */
  ncclUniqueId chosen;
  ncclResult_t res = boot_allgather(parent->boot, all, sizeof *all);
  if (res == ncclSuccess) res = grow_pick(parent, all, nranks, &chosen);
  mem_free(&parent->acct, all, (size_t)parent->nranks * sizeof *all);
  if (res != ncclSuccess) return res;
  parent->epoch++;
  return make_child(parent, nranks, parent->rank, &chosen, config, "ncclCommGrow", child_p);
}

ncclResult_t comm_suspend(ncclComm_t comm) {
  int graphs = gx_graphs(comm->gx);
  if (graphs > 0)
    return log_err(ncclInvalidUsage,
                   "ncclCommSuspend: %s rank %d is used by %d CUDA graph%s, whose replays need its buffers; "
                   "destroy them first. The communicator is unchanged",
                   comm->name, comm->rank, graphs, graphs == 1 ? "" : "s");
  /* every rank has finished its calls: no connection carries anything any more */
  ncclResult_t res = boot_barrier(comm->boot);
  if (res != ncclSuccess) {
    comm_set_error(comm, res);
    return res;
  }
  size_t held = atomic_load(&comm->dp_acct.host_bytes) + atomic_load(&comm->dp_acct.dev_bytes);
  atomic_store(&comm->state, COMM_SUSPENDED);
  wait_idle(comm);
  res = comm_dp_free(comm);
  if (res != ncclSuccess) {
    comm_set_error(comm, res);
    return res;
  }
  INFO(LOG_INIT | LOG_ALLOC, "%s rank %d: suspended; %zu bytes given back", comm->name, comm->rank, held);
  return ncclSuccess;
}

ncclResult_t comm_resume(ncclComm_t comm) {
  if (atomic_load(&comm->state) != COMM_SUSPENDED) return ncclSuccess;
  gpu_scope_t scope = {0};
  ncclResult_t res = comm->dev >= 0 ? gpu_enter(comm->dev, &scope) : ncclSuccess;
  if (res == ncclSuccess) {
    res = comm_dp_build(comm);
    if (comm->dev >= 0) gpu_leave(&scope);
  }
  if (res != ncclSuccess) {
    comm_dp_free(comm);
    comm_set_error(comm, res);
    return res;
  }
  atomic_store(&comm->state, COMM_READY);
  INFO(LOG_INIT | LOG_ALLOC, "%s rank %d: resumed", comm->name, comm->rank);
  return ncclSuccess;
}

uint64_t comm_mem_stat(ncclComm_t comm, ncclCommMemStat_t stat) {
  int dev = comm->dev >= 0; /* a host-backend communicator's "device" memory is host memory */
  uint64_t part = atomic_load(dev ? &comm->dp_acct.dev_bytes : &comm->dp_acct.host_bytes);
  uint64_t all = atomic_load(dev ? &comm->acct.dev_bytes : &comm->acct.host_bytes);
  switch (stat) {
  case ncclStatGpuMemSuspend:
    return part;
  case ncclStatGpuMemSuspended:
    return atomic_load(&comm->state) == COMM_SUSPENDED;
  case ncclStatGpuMemPersist:
    return all - part;
  default:
    return all;
  }
}
