/*
 * Communicators (see comm.h). Init runs in named phases: bootstrap, peers, links, publish.
 */
#include "comm.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "core/tune.h"
#include "gpu/gpu.h"

#define CONFIG_MAGIC 0xcafebeefu
/* Bootstrap tag of the unique id a split's leader sends to the members of its color. */
#define TAG_SPLIT_ID 0x53504c54u

static const ncclConfig_t config_defaults = NCCL_CONFIG_INITIALIZER;

ncclResult_t comm_config_check(const ncclConfig_t *config, ncclConfig_t *out) {
  *out = config_defaults;
  if (config != NULL) {
    if (config->magic != CONFIG_MAGIC)
      return log_err(ncclInvalidArgument,
                     "config: magic 0x%x is not 0x%x; initialise it with NCCL_CONFIG_INITIALIZER",
                     config->magic, CONFIG_MAGIC);
    size_t least = offsetof(ncclConfig_t, blocking) + sizeof(int);
    if (config->size < least || config->size > 65536)
      return log_err(ncclInvalidArgument, "config: size %zu is not a valid ncclConfig_t size (%zu..65536)",
                     config->size, least);
    /* A caller built against an older header has fewer fields: those keep their defaults. A newer caller's
     * extra fields are ignored. */
    memcpy(out, config, config->size < sizeof *out ? config->size : sizeof *out);
    out->size = sizeof *out;
  }
  if (out->blocking == NCCL_CONFIG_UNDEF_INT) out->blocking = 1;
  if (out->blocking != 0 && out->blocking != 1)
    return log_err(ncclInvalidArgument, "config: blocking is %d; it must be 0 or 1", out->blocking);
  if (out->splitShare != NCCL_CONFIG_UNDEF_INT && out->splitShare != 0 && out->splitShare != 1)
    return log_err(ncclInvalidArgument, "config: splitShare is %d; it must be 0 or 1", out->splitShare);
  if (out->collnetEnable != NCCL_CONFIG_UNDEF_INT && out->collnetEnable != 0 && out->collnetEnable != 1)
    return log_err(ncclInvalidArgument, "config: collnetEnable is %d; it must be 0 or 1", out->collnetEnable);
  if (out->shrinkShare != NCCL_CONFIG_UNDEF_INT && out->shrinkShare != 0 && out->shrinkShare != 1)
    return log_err(ncclInvalidArgument, "config: shrinkShare is %d; it must be 0 or 1", out->shrinkShare);
  if (out->cgaClusterSize != NCCL_CONFIG_UNDEF_INT && out->cgaClusterSize < 0)
    return log_err(ncclInvalidArgument, "config: cgaClusterSize is %d; it must not be negative",
                   out->cgaClusterSize);
  const struct {
    int value;
    const char *name;
  } counts[] = {{out->minCTAs, "minCTAs"}, {out->maxCTAs, "maxCTAs"}, {out->nvlsCTAs, "nvlsCTAs"}};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
    if (counts[i].value != NCCL_CONFIG_UNDEF_INT && counts[i].value < 1)
      return log_err(ncclInvalidArgument, "config: %s is %d; it must be at least 1", counts[i].name,
                     counts[i].value);
  if (out->CTAPolicy != NCCL_CONFIG_UNDEF_INT &&
      (out->CTAPolicy < 0 || out->CTAPolicy > NCCL_CTA_POLICY_ZERO))
    return log_err(ncclInvalidArgument, "config: CTAPolicy is %d; it must be 0, 1 or 2", out->CTAPolicy);
  if (out->graphUsageMode != NCCL_CONFIG_UNDEF_INT && (out->graphUsageMode < 0 || out->graphUsageMode > 2))
    return log_err(ncclInvalidArgument, "config: graphUsageMode is %d; it must be 0, 1 or 2",
                   out->graphUsageMode);
  if (out->graphStreamOrdering != NCCL_CONFIG_UNDEF_INT && out->graphStreamOrdering != 0 &&
      out->graphStreamOrdering != 1)
    return log_err(ncclInvalidArgument, "config: graphStreamOrdering is %d; it must be 0 or 1",
                   out->graphStreamOrdering);
  if (out->minCTAs != NCCL_CONFIG_UNDEF_INT && out->maxCTAs != NCCL_CONFIG_UNDEF_INT &&
      out->minCTAs > out->maxCTAs)
    return log_err(ncclInvalidArgument, "config: minCTAs %d exceeds maxCTAs %d", out->minCTAs, out->maxCTAs);
  return ncclSuccess;
}

ncclResult_t comm_alloc(int nranks, int rank, const ncclConfig_t *config, ncclComm_t *comm_p) {
  ncclConfig_t cfg;
  CHECK(comm_config_check(config, &cfg));
  ncclComm_t comm = calloc(1, sizeof *comm);
  if (comm == NULL) return log_err(ncclSystemError, "out of host memory allocating a communicator");
  comm->magic = COMM_MAGIC;
  comm->dp_acct.parent = &comm->acct; /* the data path's charges are the communicator's too */
  comm->rank = rank;
  comm->nranks = nranks;
  comm->dev = -1;
  comm->config = cfg;
  comm->blocking = cfg.blocking;
  atomic_store(&comm->state, COMM_INITIALIZING);
  atomic_store(&comm->async_error, ncclInProgress);
  char name[32];
  snprintf(name, sizeof name, "comm (init) rank %d", rank);
  /* without a config the caller's header is unknown: it gets the result every NCCL version knows */
  ncclResult_t res = wd_create(name, rank, nranks, config != NULL ? cfg.version : 0, &comm->wd);
  if (res != ncclSuccess) {
    free(comm);
    return res;
  }
  *comm_p = comm;
  return ncclSuccess;
}

/* Equal on ranks of one machine: NCCL_HOSTID if set, else the host name and this boot's id. */
static uint64_t host_hash(void) {
  char buf[512] = {0};
  const char *id = param_str(P_NCCL_HOSTID);
  if (*id != '\0') return hash_bytes(id, strlen(id));
  gethostname(buf, 255);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f != NULL) {
    size_t len = strlen(buf);
    if (fgets(buf + len, sizeof buf - len, f) == NULL) buf[len] = '\0';
    fclose(f);
  }
  return hash_bytes(buf, strlen(buf));
}

/* How a stalled wait of the communicator tells the others what it waits for (wd_exchange_t). */
static void stall_announce(void *arg, const wd_report_t *mine) {
  ncclComm_t comm = arg;
  for (int r = 0; r < comm->nranks; r++)
    if (r != comm->rank) (void)boot_post(comm->boot, r, BOOT_TAG_STATUS, mine, sizeof *mine);
}

/* How it learns what the others wait for (wd_exchange_t). */
static void stall_collect(void *arg, wd_report_t *reports, int *have) {
  ncclComm_t comm = arg;
  char keep[LOG_ERROR_MAX]; /* taking reports fails no call */
  snprintf(keep, sizeof keep, "%s", log_last_error());
  if (boot_poll_all(comm->boot, BOOT_TAG_STATUS, reports, sizeof *reports, have) != ncclSuccess)
    memset(have, 0, (size_t)comm->nranks * sizeof *have);
  log_set_last_error("%s", keep);
}

static ncclResult_t init_bootstrap(ncclComm_t comm, const ncclUniqueId *ids, int nid) {
  CHECK(boot_init(ids, nid, comm->rank, comm->nranks, &comm->abort_flag, &comm->boot));
  comm->nonce = boot_id_nonce(&ids[0]);
  if (comm->config.commName != NULL)
    snprintf(comm->name, sizeof comm->name, "%s", comm->config.commName);
  else
    snprintf(comm->name, sizeof comm->name, "comm %016lx", (unsigned long)comm->nonce);
  wd_set_name(comm->wd, comm->name);
  wd_set_exchange(comm->wd,
                  &(wd_exchange_t){.announce = stall_announce, .collect = stall_collect, .arg = comm});
  boot_set_watchdog(comm->boot, comm->wd);
  return ncclSuccess;
}

/* The staging ring size: BRAID_HOST_BUFFSIZE rounded up to whole pages. */
static size_t ring_bytes(void) {
  int64_t want = param_int(P_BRAID_HOST_BUFFSIZE);
  size_t page = 4096;
  return want < (int64_t)page ? page : ((size_t)want + page - 1) / page * page;
}

/* The knobs from which the GPU executor picks each call's algorithm and each transfer's protocol and
 * channels (core/tune.h). Both ends of a connection must pick alike (DESIGN.md, principle 2): ranks whose
 * knobs differ would each wait for a transfer the other never sends, until BRAID_TIMEOUT_S. Each rank tells
 * the others the values in effect (after parsing: "LL,LL128,Simple" and no NCCL_PROTO are the same); any
 * difference fails init on every rank, naming the knob. */
enum { TUNE_COUNT = TUNE_AGREED_COUNT };

/* What each rank tells the others at init, in one allgather: its peer entry and its tuning knobs. */
typedef struct {
  tp_peer_t peer;
  uint64_t tune[TUNE_COUNT];
  ras_peer_t ras; /* where its process's monitor listens */
} peer_msg_t;

/* Fails where the knobs in effect differ between ranks (all[r].tune), on communicators whose ranks all have a
 * GPU; every rank sees the same table, so every rank fails alike. */
static ncclResult_t check_tuning(ncclComm_t comm, const peer_msg_t *all) {
  for (int r = 0; r < comm->nranks; r++)
    if (all[r].peer.dev < 0) return ncclSuccess; /* the knobs steer the GPU executor only */
  for (int r = 1; r < comm->nranks; r++)
    for (int k = 0; k < TUNE_COUNT; k++)
      if (all[r].tune[k] != all[0].tune[k])
        return log_err(ncclInvalidUsage,
                       "%s: %s differs between ranks (in effect: %llu on rank 0, %llu on rank %d); the GPU "
                       "algorithm and protocol knobs must be the same on all ranks",
                       comm->name, tune_agreed_name(k), (unsigned long long)all[0].tune[k],
                       (unsigned long long)all[r].tune[k], r);
  return ncclSuccess;
}

/* Hands monitoring every rank's identity (the allgather's ras fields). */
static void ras_peers_hook(ncclComm_t comm, const peer_msg_t *all) {
  ras_peer_t *ids = comm->ras != NULL ? malloc((size_t)comm->nranks * sizeof *ids) : NULL;
  if (ids == NULL) return;
  for (int r = 0; r < comm->nranks; r++) ids[r] = all[r].ras;
  ras_comm_peers(comm->ras, ids);
  free(ids);
}

/* Whether two ranks' GPUs are one: the same host and device index, as transport selection assumes. */
static int same_gpu(const tp_peer_t *a, const tp_peer_t *b) {
  return a->host_hash == b->host_hash && a->dev == b->dev;
}

/* Ranks of other processes on this rank's GPU (the same host and device index, as transport selection
 * assumes): the GPU time-slices the processes' kernels, so every wait between them lasts a slice. Said once
 * per process at WARN, naming the ranks and the GPU. */
static void warn_shared_gpu(const ncclComm_t comm) {
  static _Atomic int warned;
  const tp_peer_t *me = &comm->peers[comm->rank];
  if (comm->dev < 0 || atomic_load_explicit(&warned, memory_order_relaxed)) return;
  char ranks[160];
  int n = 0, len = snprintf(ranks, sizeof ranks, "%d", comm->rank);
  for (int r = 0; r < comm->nranks; r++) {
    const tp_peer_t *p = &comm->peers[r];
    if (r == comm->rank || !same_gpu(p, me) || p->pid == me->pid) continue;
    n++;
    if (len < (int)sizeof ranks - 16) len += snprintf(ranks + len, sizeof ranks - (size_t)len, ", %d", r);
  }
  if (n == 0 || atomic_exchange(&warned, 1)) return;
  if (comm->sg != NULL)
    WARN(
        "%s: ranks %s share CUDA device %d from separate processes; the GPU time-slices their kernels: rank "
        "0 "
        "moves the data of their collectives so that those need no time slice (BRAID_SHARED_GPU_LEADER), but "
        "a group it does not take (captured into a CUDA graph, or point-to-point calls alone) waits for time "
        "slices, and so do the processes' own kernels (give each process a GPU of its own for speed)",
        comm->name, ranks, comm->dev);
  else
    WARN("%s: ranks %s share CUDA device %d from separate processes; the GPU time-slices their kernels, so "
         "each collective among them waits for time slices (give each process a GPU of its own for speed, or "
         "set BRAID_SHARED_GPU_LEADER=1 on every rank so that rank 0 moves their collectives' data)",
         comm->name, ranks, comm->dev);
}

/* Ranks of one process on one GPU launch into one context, where kernels are not time-sliced: their launches
 * run together or deadlock waiting for each other, so those ranks split the GPU's multiprocessors. How many
 * ranks of rank r's process are on its GPU (r included). */
static int gpu_sharers(const ncclComm_t comm, int r) {
  const tp_peer_t *me = &comm->peers[r];
  int k = 0;
  for (int q = 0; q < comm->nranks; q++) {
    const tp_peer_t *p = &comm->peers[q];
    k += same_gpu(p, me) && p->pid == me->pid;
  }
  return k;
}

/* Every rank tells the others its host, process, device, ring size and tuning knobs; the ring size cuts
 * plans into slices and the knobs pick algorithms and protocols, so all ranks must agree on them (DESIGN.md,
 * principle 2). */
static ncclResult_t init_peers(ncclComm_t comm) {
  CHECK(MEM_CALLOC(&comm->acct, comm->peers, comm->nranks, "peer table"));
  comm->ring_bytes = ring_bytes();
  peer_msg_t *all = calloc((size_t)comm->nranks, sizeof *all);
  if (all == NULL) return log_err(ncclSystemError, "%s: out of host memory for the peer table", comm->name);
  all[comm->rank].peer = (tp_peer_t){.host_hash = host_hash(),
                                     .pid = (int32_t)getpid(),
                                     .dev = comm->dev,
                                     .ring_bytes = comm->ring_bytes,
                                     .nch = comm->dev >= 0 ? comm->nch : 0,
                                     .sms = comm->dev >= 0 ? comm->sms : 0};
  tune_agreed(all[comm->rank].tune);
  ras_comm_info_t ri = {comm->nonce, comm->rank, comm->nranks, comm->dev, comm->name, &comm->acct};
  ras_comm_join(&ri, &comm->ras, &all[comm->rank].ras);
  ncclResult_t res = boot_allgather(comm->boot, all, sizeof *all);
  for (int r = 0; res == ncclSuccess && r < comm->nranks; r++) comm->peers[r] = all[r].peer;
  if (res == ncclSuccess) ras_peers_hook(comm, all);
  if (res == ncclSuccess) res = check_tuning(comm, all);
  free(all);
  if (res != ncclSuccess) return res;
  /* Both ends of a connection need the same rings, and every rank's launches must fit its own GPU: the
   * fewest channels any rank can run (GPUs with fewer SMs, or a smaller BRAID_CHANNELS) */
  int nch = comm->nch;
  for (int r = 0; r < comm->nranks; r++) {
    if (comm->peers[r].nch > 0 && comm->peers[r].nch < nch) nch = comm->peers[r].nch;
    const int k = gpu_sharers(comm, r);
    const int fit =
        comm->peers[r].sms > 0 && k > 1 ? tune_channels_fit(comm->nranks, comm->peers[r].sms / k) : 0;
    if (fit > 0 && fit < nch) nch = fit;
  }
  if (comm->dev >= 0) comm->sms /= gpu_sharers(comm, comm->rank);
  if (comm->dev >= 0 && nch != comm->nch) {
    INFO(LOG_INIT | LOG_TUNING,
         "%s rank %d: %d channels, the fewest any rank can run beside its process's ranks on its GPU (this "
         "one alone: %d)",
         comm->name, comm->rank, nch, comm->nch);
    comm->nch = nch;
  }
  for (int r = 0; r < comm->nranks; r++)
    if (comm->peers[r].ring_bytes != comm->ring_bytes)
      return log_err(ncclInvalidUsage,
                     "%s: BRAID_HOST_BUFFSIZE gives %zu bytes on rank %d but %lu on rank %d; "
                     "it must be the same on all ranks",
                     comm->name, comm->ring_bytes, comm->rank, (unsigned long)comm->peers[r].ring_bytes, r);
  return ncclSuccess;
}

static ncclResult_t init_links(ncclComm_t comm) {
  tp_config_t tc = {.rank = comm->rank,
                    .nranks = comm->nranks,
                    .nonce = comm->nonce,
                    .peers = comm->peers,
                    .abort_flag = &comm->abort_flag,
                    .ring_bytes = comm->ring_bytes,
                    .nch = tune_rings(comm->nranks, comm->nch),
                    .acct = &comm->dp_acct,
                    .net_name = comm->config.netName};
  return links_init(comm->boot, &tc, &comm->dp_acct, &comm->links);
}

/* GPU communicators connect to every peer now (so that nothing is set up inside a captured call) and make
 * the kernels' view of the connections. The barrier keeps every rank in init until all have mapped their
 * peers' rings: a receiver learns nothing of its sender's import, and one that returned and destroyed its
 * communicator at once would take the memory (and the export's file descriptor server) from under a peer
 * still importing it. */
static ncclResult_t init_gpu(ncclComm_t comm) {
  if (comm->dev < 0) return ncclSuccess;
  CHECK(links_connect_all(comm->links));
  CHECK(boot_barrier(comm->boot));
  CHECK(gx_init(comm->dev, comm->rank, comm->nranks, comm->nch, comm->sms, comm->links, &comm->dp_acct,
                comm->name, &comm->gx));
  CHECK(ce_init(comm->dev, comm->rank, comm->nranks, comm->peers, comm->links, comm->boot, &comm->abort_flag,
                &comm->dp_acct, comm->name, &comm->ce));
  gx_set_ce(comm->gx, comm->ce);
  const sg_setup_t sg = {.dev = comm->dev,
                         .rank = comm->rank,
                         .nranks = comm->nranks,
                         .peers = comm->peers,
                         .links = comm->links,
                         .boot = comm->boot,
                         .abort_flag = &comm->abort_flag,
                         .acct = &comm->dp_acct,
                         .name = comm->name};
  return sg_init(&sg, &comm->sg);
}

ncclResult_t comm_dp_free(ncclComm_t comm) {
  sg_destroy(comm->sg, 0);
  comm->sg = NULL;
  /* waits until no kernel or copy uses the rings (no graph holds them: the callers refuse then) */
  ncclResult_t res = gx_destroy(comm->gx);
  if (res == ncclSuccess) links_destroy(comm->links);
  comm->gx = NULL;
  comm->ce = NULL;
  comm->links = NULL;
  return res;
}

ncclResult_t comm_dp_build(ncclComm_t comm) {
  CHECK(init_links(comm));
  return init_gpu(comm);
}

/* Makes the communicator usable: the release store orders every field written by init before the state. */
static void publish(ncclComm_t comm) {
  atomic_store_explicit(&comm->async_error, ncclSuccess, memory_order_release);
  atomic_store_explicit(&comm->state, COMM_READY, memory_order_release);
  ras_comm_ready(comm->ras);
  INFO(LOG_INIT, "%s rank %d nranks %d dev %d - Init COMPLETE", comm->name, comm->rank, comm->nranks,
       comm->dev);
}

static void banner(void) {
  log_banner();
  log_params_set();
}

static void print_banner(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, banner);
}

ncclResult_t comm_init(ncclComm_t comm, const ncclUniqueId *ids, int nid) {
  ncclResult_t res;
  double t0 = time_now();
  print_banner();
  gpu_scope_t scope = {0};
  if (comm->dev >= 0) {
    CHECK_GOTO(gpu_enter(comm->dev, &scope), res, fail);
    int sms = 0;
    CHECK_GOTO(gpu_device_sms(comm->dev, &sms), res, fail_leave);
    comm->sms = sms;
    comm->nch = tune_channels(comm->nranks, sms);
  }
  CHECK_GOTO(init_bootstrap(comm, ids, nid), res, fail_leave);
  CHECK_GOTO(init_peers(comm), res, fail_leave);
  CHECK_GOTO(comm_dp_build(comm), res, fail_leave);
  warn_shared_gpu(comm);
  if (comm->dev >= 0) gpu_leave(&scope);
  publish(comm);
  INFO(LOG_INIT, "%s rank %d: init took %.1f ms", comm->name, comm->rank, (time_now() - t0) * 1e3);
  return ncclSuccess;
fail_leave:
  if (comm->dev >= 0) gpu_leave(&scope);
fail:
  comm_set_error(comm, res);
  return res;
}

/* Arguments of a non-blocking init, owned by its thread. */
typedef struct {
  ncclComm_t comm;
  int nid;
  ncclUniqueId ids[];
} init_job_t;

static void *init_thread_main(void *arg) {
  init_job_t *job = arg;
  comm_init(job->comm, job->ids, job->nid);
  free(job);
  return NULL;
}

ncclResult_t comm_init_async(ncclComm_t comm, const ncclUniqueId *ids, int nid) {
  init_job_t *job = malloc(sizeof *job + nid * sizeof(ncclUniqueId));
  if (job == NULL) return log_err(ncclSystemError, "out of host memory starting a non-blocking init");
  job->comm = comm;
  job->nid = nid;
  memcpy(job->ids, ids, nid * sizeof(ncclUniqueId));
  int err = pthread_create(&comm->init_thread, NULL, init_thread_main, job);
  if (err != 0) {
    free(job);
    return log_err(ncclSystemError, "cannot start the init thread: %s", strerror(err));
  }
  comm->init_thread_live = 1;
  return ncclInProgress;
}

/* Each rank's color and key, as the split's allgather carries them. */
typedef struct {
  int32_t color, key;
} split_info_t;

/* This rank's place among the ranks of its color, ordered by (key, parent rank): writes its new rank, the
 * number of members and the parent rank of member 0 (the leader). */
static void split_place(const split_info_t *info, int nranks, int me, int *rank_p, int *count_p,
                        int *leader_p) {
  int rank = 0, count = 0, leader = -1;
  for (int r = 0; r < nranks; r++) {
    if (info[r].color != info[me].color) continue;
    count++;
    if (info[r].key < info[me].key || (info[r].key == info[me].key && r < me)) rank++;
    if (leader < 0 || info[r].key < info[leader].key) leader = r;
  }
  *rank_p = rank;
  *count_p = count;
  *leader_p = leader;
}

ncclResult_t comm_split(ncclComm_t parent, int color, int key, const ncclConfig_t *config,
                        ncclComm_t *child_p) {
  ncclResult_t res;
  split_info_t *info;
  CHECK(MEM_CALLOC(&parent->acct, info, parent->nranks, "split table"));
  info[parent->rank] = (split_info_t){.color = color, .key = key};
  CHECK_GOTO(boot_allgather(parent->boot, info, sizeof *info), res, out);
  *child_p = NULL;
  if (color == NCCL_SPLIT_NOCOLOR) goto out;
  int rank, count, leader;
  split_place(info, parent->nranks, parent->rank, &rank, &count, &leader);
  ncclUniqueId id;
  if (parent->rank == leader) {
    CHECK_GOTO(boot_new_unique_id(&id), res, out);
    for (int r = 0; r < parent->nranks; r++)
      if (r != leader && info[r].color == color)
        CHECK_GOTO(boot_send(parent->boot, r, TAG_SPLIT_ID, &id, sizeof id), res, out);
  } else {
    CHECK_GOTO(boot_recv(parent->boot, leader, TAG_SPLIT_ID, &id, sizeof id), res, out);
  }
  ncclComm_t child;
  CHECK_GOTO(comm_alloc(count, rank, config != NULL ? config : &parent->config, &child), res, out);
  child->dev = parent->dev;
  res = comm_init(child, &id, 1);
  if (res != ncclSuccess) {
    comm_destroy(child);
    goto out;
  }
  INFO(LOG_INIT, "%s rank %d: split color %d key %d -> %s rank %d of %d", parent->name, parent->rank, color,
       key, child->name, rank, count);
  *child_p = child;
out:
  mem_free(&parent->acct, info, parent->nranks * sizeof *info);
  return res;
}

/* The magic of a handle, read once: another thread may be destroying the communicator. */
static uint64_t magic_of(ncclComm_t comm) {
  return __atomic_load_n(&comm->magic, __ATOMIC_ACQUIRE);
}

ncclResult_t comm_check(ncclComm_t comm, const char *func) {
  if (comm == NULL) return log_err(ncclInvalidArgument, "%s: comm is NULL", func);
  uint64_t magic = magic_of(comm);
  if (magic == COMM_DEAD) return log_err(ncclInvalidUsage, "%s: the communicator was destroyed", func);
  if (magic != COMM_MAGIC)
    return log_err(ncclInvalidArgument, "%s: comm %p is not a communicator", func, (void *)comm);
  return ncclSuccess;
}

ncclResult_t comm_check_ready(ncclComm_t comm, const char *func) {
  CHECK(comm_check(comm, func));
  switch (atomic_load_explicit(&comm->state, memory_order_acquire)) {
  case COMM_READY:
    /* a kernel that gave up on a peer fails the communicator here (one load of a host-mapped word) */
    if (comm->gx == NULL || comm_async_error(comm) == ncclSuccess) return ncclSuccess;
    break;
  case COMM_INITIALIZING:
    return log_err(ncclInvalidUsage,
                   "%s: %s is still initialising; wait until ncclCommGetAsyncError gives ncclSuccess", func,
                   comm->name[0] ? comm->name : "the communicator");
  case COMM_FINALIZED:
    return log_err(ncclInvalidUsage, "%s: %s was finalized", func, comm->name);
  case COMM_REVOKED:
    return log_err(
        ncclInvalidUsage,
        "%s: %s was revoked (ncclCommRevoke, or ncclCommShrink with NCCL_SHRINK_ABORT); it can only "
        "be shrunk, split, aborted or destroyed",
        func, comm->name);
  case COMM_SUSPENDED:
    return log_err(ncclInvalidUsage, "%s: %s is suspended; call ncclCommResume first", func, comm->name);
  default:
    break;
  }
  return log_err(ncclInvalidUsage, "%s: %s failed earlier (%s: %s); it can only be destroyed or aborted",
                 func, comm->name, log_result_name((ncclResult_t)atomic_load(&comm->async_error)),
                 comm_error_msg(comm) != NULL ? comm_error_msg(comm) : "no message");
}

ncclResult_t comm_check_parent(ncclComm_t comm, const char *func) {
  CHECK(comm_check(comm, func));
  int state = atomic_load_explicit(&comm->state, memory_order_acquire);
  if (state == COMM_FAILED || state == COMM_REVOKED) return ncclSuccess;
  return comm_check_ready(comm, func);
}

ncclResult_t comm_accepts_work(ncclComm_t comm) {
  if (atomic_load(&comm->state) == COMM_READY) return ncclSuccess;
  return comm_check_ready(comm, "ncclGroupEnd");
}

ncclResult_t comm_async_error(ncclComm_t comm) {
  ncclResult_t res = (ncclResult_t)atomic_load_explicit(&comm->async_error, memory_order_acquire);
  /* a revoked communicator's kernels were stopped on purpose: their error is not the communicator's */
  if (res != ncclSuccess || comm->gx == NULL || atomic_load(&comm->state) == COMM_REVOKED) return res;
  res = gx_error(comm->gx);
  if (res == ncclSuccess) res = sg_error(comm->sg);
  if (res != ncclSuccess) comm_set_error(comm, res);
  return res;
}

void comm_set_error(ncclComm_t comm, ncclResult_t res) {
  ras_comm_error(comm->ras, res, atomic_load(&comm->state) == COMM_INITIALIZING);
  int expected = ncclSuccess, first = atomic_compare_exchange_strong(&comm->async_error, &expected, res);
  if (!first) {
    expected = ncclInProgress;
    first = atomic_compare_exchange_strong(&comm->async_error, &expected, res);
  }
  if (first) wd_set_error(comm->wd, res, log_last_error()); /* the failing thread's message is the comm's */
  int state = atomic_load(&comm->state);
  /* a revoked communicator stays revoked: it can be shrunk or split either way */
  while (state != COMM_REVOKED && !atomic_compare_exchange_weak(&comm->state, &state, COMM_FAILED)) {
  }
  if (comm->links != NULL) links_fail(comm->links);
}

const char *comm_error_msg(ncclComm_t comm) {
  if (magic_of(comm) != COMM_MAGIC) return NULL; /* a destroyed one's watchdog is gone */
  const char *msg;
  return wd_error(comm->wd, &msg) != ncclSuccess ? msg : NULL;
}

static void links_release(void *links) {
  links_destroy(links);
}

ncclResult_t comm_finalize(ncclComm_t comm) {
  ncclResult_t res = boot_barrier(comm->boot);
  if (res != ncclSuccess) {
    comm_set_error(comm, res);
    return res;
  }
  atomic_store_explicit(&comm->state, COMM_FINALIZED, memory_order_release);
  ras_comm_finalized(comm->ras);
  return ncclSuccess;
}

/* ---- Handle lifetime ---- */

/* The newest COMM_DEAD_KEPT released headers; the oldest is freed when another comes. */
static pthread_mutex_t dead_lock = PTHREAD_MUTEX_INITIALIZER;
static ncclComm_t dead_ring[COMM_DEAD_KEPT];
static unsigned dead_next;

/* Keeps a destroyed header among the recent ones (freeing the oldest), with its calls freed. */
static void release_header(ncclComm_t comm) {
  plan_free(&comm->plan);
  pthread_mutex_lock(&dead_lock);
  ncclComm_t oldest = dead_ring[dead_next];
  dead_ring[dead_next] = comm;
  dead_next = (dead_next + 1) % COMM_DEAD_KEPT;
  pthread_mutex_unlock(&dead_lock);
  free(oldest);
}

ncclResult_t comm_hold(ncclComm_t comm, const char *func) {
  unsigned prev = atomic_fetch_add(&comm->hold, 1);
  if (!(prev & COMM_HOLD_DEAD)) return ncclSuccess;
  atomic_fetch_sub(&comm->hold, 1); /* the destroy came first: it did not count this hold, and releases */
  return log_err(ncclInvalidUsage, "%s: the communicator was destroyed", func);
}

int comm_unhold(ncclComm_t comm) {
  unsigned prev = atomic_fetch_sub(&comm->hold, 1);
  if (!(prev & COMM_HOLD_DEAD)) return 0;
  if (prev == (COMM_HOLD_DEAD | 1u)) release_header(comm);
  return 1;
}

int comm_dead(ncclComm_t comm) {
  return (atomic_load(&comm->hold) & COMM_HOLD_DEAD) != 0;
}

/* Frees what the communicator owns but its header and its calls. */
static void free_parts(ncclComm_t comm, int aborting) {
  ras_comm_retire(comm->ras); /* first: monitoring reads its memory account until then */
  comm->ras = NULL;
  sg_destroy(comm->sg, aborting); /* first: the leader's work on the path is the executor's */
  comm->sg = NULL;
  if (gx_graphs(comm->gx) > 0) {
    /* CUDA graphs outlive the communicator: its eager work ends first, a later replay leaves at once (the
     * abort flag), and what a replay could reach (the kernel view, the rings, the copy-engine path's words
     * and mappings) stays until the last graph goes */
    gx_quiesce(comm->gx);
    gx_abort(comm->gx);
    gx_retire(comm->gx, links_release, comm->links);
  } else if (gx_destroy(comm->gx) == ncclSuccess) { /* first: waits until no kernel or copy uses them; it
                                                     * frees the copy-engine path too (gx_set_ce) */
    links_destroy(comm->links);
  } /* else a kernel or a copy may still use the rings and mappings: they stay (gx_destroy said so) */
  comm->gx = NULL;
  comm->ce = NULL;
  if (comm->boot != NULL) boot_close(comm->boot);
  mem_free(&comm->acct, comm->peers, comm->nranks * sizeof *comm->peers);
  redop_free(&comm->redops);
  INFO(LOG_INIT | LOG_ALLOC, "%s rank %d: destroyed; its memory peaked at %zu bytes", comm->name, comm->rank,
       atomic_load(&comm->acct.peak_bytes));
  comm->links = NULL;
  comm->boot = NULL;
  comm->peers = NULL;
  wd_destroy(comm->wd); /* last: every wait that used it has ended */
  comm->wd = NULL;
}

/* Marks the communicator dead first (a group that has not run its calls yet drops them, and a thread that
 * comes in now is refused), then waits for threads inside it to leave (an abort makes them leave at once) and
 * frees it. */
static void end_comm(ncclComm_t comm, int aborting) {
  __atomic_store_n(&comm->magic, COMM_DEAD, __ATOMIC_RELEASE);
  unsigned holds = atomic_fetch_or(&comm->hold, COMM_HOLD_DEAD);
  if (comm->init_thread_live) {
    /* a non-blocking init still waiting for its peers would wait up to BRAID_BOOTSTRAP_TIMEOUT_S */
    if (atomic_load_explicit(&comm->state, memory_order_acquire) == COMM_INITIALIZING)
      __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
    pthread_join(comm->init_thread, NULL);
    comm->init_thread_live = 0;
  }
  if (aborting) {
    ras_comm_aborting(comm->ras); /* after the init thread: it sets comm->ras */
    gx_abort(comm->gx);           /* kernels waiting for a peer leave */
    if (comm->links != NULL) links_fail(comm->links);
  }
  while (atomic_load(&comm->busy) > 0) time_sleep_us(1000);
  free_parts(comm, aborting);
  if (holds == 0) release_header(comm); /* else the last group to drop its hold does */
}

void comm_destroy(ncclComm_t comm) {
  end_comm(comm, 0);
}

void comm_abort(ncclComm_t comm) {
  __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
  end_comm(comm, 1);
}
