/*
 * Reports (see report.h): the view is sorted into communicators (records of the same nonce, by rank), then
 * written as NCCL's text or JSON, with Braid's extra fields, and the verdict.
 */
#include "report.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl.h"
#include "base/log.h"
#include "base/socket.h"

/* Communicators' missing ranks listed one by one at most (the count is always exact). */
#define MISSING_LIST_MAX 4096
/* A rank counts as waiting in a verdict once its wait is this old. */
#define VERDICT_WAIT_MS 1000

/* ---- Output ---- */

void rpt_free(rpt_t *r) {
  free(r->data);
  *r = (rpt_t){0};
}

void rpt_printf(rpt_t *r, const char *fmt, ...) {
  if (r->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = r->cap - r->len;
    int n = vsnprintf(r->data != NULL ? r->data + r->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      r->failed = 1;
      return;
    }
    if ((size_t)n < room) {
      r->len += (size_t)n;
      return;
    }
    size_t cap = r->cap ? r->cap : 4096;
    while (cap - r->len <= (size_t)n) cap *= 2;
    char *d = realloc(r->data, cap);
    if (d == NULL) {
      r->failed = 1;
      return;
    }
    r->data = d;
    r->cap = cap;
  }
}

/* A JSON string: quotes, and every character that JSON requires escaped. */
static void json_str(rpt_t *r, const char *s) {
  rpt_printf(r, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      rpt_printf(r, "\\%c", *p);
    else if (*p < 0x20 || *p >= 0x7f)
      rpt_printf(r, "\\u%04x", *p);
    else
      rpt_printf(r, "%c", *p);
  }
  rpt_printf(r, "\"");
}

void view_free(ras_view_t *v) {
  for (int i = 0; i < v->nprocs; i++) free(v->procs[i].proc.recs);
  free(v->procs);
  v->procs = NULL;
  v->nprocs = 0;
}

/* ---- The view, sorted ---- */

typedef struct {
  const ras_rec_t *rec;
  const view_proc_t *proc;
} ent_t;

/* One communicator: its ranks that answered (fresh), sorted by rank, one entry per rank. */
typedef struct {
  uint64_t nonce;
  int nranks;
  ent_t *ranks;
  int n;
  int missing; /* nranks - n */
  int nodes, per_node_min, per_node_max;
  unsigned status; /* bit per NCCL status: 1 INIT, 2 RUNNING, 4 FINALIZE, 8 ABORT */
  unsigned errors; /* 1 MISMATCH, 2 ERROR, 4 INCOMPLETE */
} comm_t;

typedef struct {
  ent_t *fresh, *stale; /* every record, by (nonce, rank) */
  int nfresh, nstale;
  comm_t *comms;
  int ncomms;
  const ras_view_t *v;
} sorted_t;

static int ent_cmp(const void *a, const void *b) {
  const ras_rec_t *x = ((const ent_t *)a)->rec, *y = ((const ent_t *)b)->rec;
  if (x->nonce != y->nonce) return x->nonce < y->nonce ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

enum { ST_INIT = 1, ST_RUNNING = 2, ST_FINALIZE = 4, ST_ABORT = 8 };
enum { ERR_MISMATCH = 1, ERR_ERROR = 2, ERR_INCOMPLETE = 4 };

static unsigned nccl_status(const ras_rec_t *r) {
  if (r->state == RAS_ST_ABORTED) return ST_ABORT;
  if (r->state == RAS_ST_FINALIZED) return ST_FINALIZE;
  return r->init_state == ncclSuccess ? ST_RUNNING : ST_INIT;
}

static const char *status_name(unsigned bits) {
  return bits & ST_ABORT ? "ABORT" : bits & ST_FINALIZE ? "FINALIZE" : bits & ST_RUNNING ? "RUNNING" : "INIT";
}

static int failed_result(int res) {
  return res != ncclSuccess && res != ncclInProgress;
}

static int waiting(const ras_rec_t *r);

/* Whether the ranks' counts of one collective differ while a rank waits: ranks of a running job are often a
 * call or a few apart, which says nothing until one of them waits. */
static int counts_differ(const comm_t *c) {
  int waits = 0, differ = 0;
  for (int i = 0; i < c->n; i++) {
    const ras_rec_t *r = c->ranks[i].rec, *r0 = c->ranks[0].rec;
    waits |= waiting(r);
    for (int k = 0; k < RAS_OP_SEND; k++)
      differ |= r->counts[k][0] + r->counts[k][1] != r0->counts[k][0] + r0->counts[k][1];
  }
  return waits && differ;
}

static void comm_stats(comm_t *c) {
  c->missing = c->nranks - c->n;
  c->errors = c->missing > 0 ? ERR_INCOMPLETE : 0;
  c->nodes = 0;
  c->per_node_min = c->per_node_max = 0;
  if (counts_differ(c)) c->errors |= ERR_MISMATCH;
  for (int i = 0; i < c->n; i++) {
    const ras_rec_t *r = c->ranks[i].rec;
    c->status |= nccl_status(r);
    if (failed_result(r->init_state) || failed_result(r->async_error)) c->errors |= ERR_ERROR;
    int first = 1, here = 0;
    for (int j = 0; j < c->n; j++) {
      if (c->ranks[j].proc->proc.id.host_hash != c->ranks[i].proc->proc.id.host_hash) continue;
      if (j < i) first = 0;
      here++;
    }
    if (!first) continue;
    c->nodes++;
    if (c->per_node_min == 0 || here < c->per_node_min) c->per_node_min = here;
    if (here > c->per_node_max) c->per_node_max = here;
  }
  if (c->status & (c->status - 1)) c->errors |= ERR_MISMATCH;
}

static void add_ents(const ras_view_t *v, int fresh, ent_t **out, int *n) {
  int count = 0;
  for (int p = 0; p < v->nprocs; p++)
    if (v->procs[p].fresh == fresh) count += (int)v->procs[p].proc.nrecs;
  *out = count > 0 ? malloc((size_t)count * sizeof **out) : NULL;
  *n = 0;
  if (*out == NULL) return;
  for (int p = 0; p < v->nprocs; p++)
    for (uint32_t i = 0; v->procs[p].fresh == fresh && i < v->procs[p].proc.nrecs; i++)
      (*out)[(*n)++] = (ent_t){.rec = &v->procs[p].proc.recs[i], .proc = &v->procs[p]};
  qsort(*out, (size_t)*n, sizeof **out, ent_cmp);
}

/* Sorts the view; returns 0, or -1 when out of memory. */
static int sort_view(const ras_view_t *v, sorted_t *s) {
  *s = (sorted_t){.v = v};
  add_ents(v, 1, &s->fresh, &s->nfresh);
  add_ents(v, 0, &s->stale, &s->nstale);
  s->comms = s->nfresh > 0 ? calloc((size_t)s->nfresh, sizeof *s->comms) : NULL;
  if (s->nfresh > 0 && s->comms == NULL) return -1;
  for (int i = 0; i < s->nfresh; i++) {
    const ras_rec_t *r = s->fresh[i].rec;
    comm_t *c = s->ncomms > 0 ? &s->comms[s->ncomms - 1] : NULL;
    if (c == NULL || c->nonce != r->nonce) {
      c = &s->comms[s->ncomms++];
      *c = (comm_t){.nonce = r->nonce, .nranks = r->nranks, .ranks = &s->fresh[i]};
    }
    if (c->n > 0 && c->ranks[c->n - 1].rec->rank == r->rank) continue; /* one entry per rank */
    if (r->nranks > c->nranks) c->nranks = r->nranks;
    /* compact duplicates out: entries of the communicator stay contiguous */
    c->ranks[c->n++] = s->fresh[i];
  }
  for (int i = 0; i < s->ncomms; i++) comm_stats(&s->comms[i]);
  return 0;
}

static void sorted_free(sorted_t *s) {
  free(s->fresh);
  free(s->stale);
  free(s->comms);
}

/* The latest record of rank `rank` of communicator `nonce`: fresh, else stale (then *stale_p = 1). */
static const ent_t *find_rank(const sorted_t *s, uint64_t nonce, int rank, int *stale_p) {
  ras_rec_t key = {.nonce = nonce, .rank = rank};
  ent_t k = {.rec = &key};
  const ent_t *e = s->nfresh > 0 ? bsearch(&k, s->fresh, (size_t)s->nfresh, sizeof k, ent_cmp) : NULL;
  *stale_p = 0;
  if (e != NULL) return e;
  e = s->nstale > 0 ? bsearch(&k, s->stale, (size_t)s->nstale, sizeof k, ent_cmp) : NULL;
  *stale_p = e != NULL;
  return e;
}

/* The process of a rank that did not answer, from stale records or this process's tables; NULL if unknown.
 * *id_p is filled when the identity is known even though the view has no such process. */
static const view_proc_t *missing_proc(const sorted_t *s, uint64_t nonce, int rank, ras_peer_t *id_p,
                                       int *known_p) {
  int stale;
  const ent_t *e = find_rank(s, nonce, rank, &stale);
  *known_p = 0;
  if (e != NULL) {
    *id_p = e->proc->proc.id;
    *known_p = 1;
    return e->proc;
  }
  if (s->v->where == NULL || !s->v->where(nonce, rank, id_p)) return NULL;
  *known_p = 1;
  for (int p = 0; p < s->v->nprocs; p++)
    if (wire_addr_eq(&s->v->procs[p].proc.id.addr, &id_p->addr)) return &s->v->procs[p];
  return NULL;
}

/* ---- Words ---- */

static const char *comm_label(const ras_rec_t *r, char *buf, size_t size) {
  if (r->name[0] != '\0')
    snprintf(buf, size, "%s", r->name);
  else
    snprintf(buf, size, "comm %016llx", (unsigned long long)r->nonce);
  return buf;
}

static void gpus(rpt_t *out, uint64_t devs) {
  if (devs == 0) {
    rpt_printf(out, "managing no GPU");
    return;
  }
  rpt_printf(out, "managing GPU%s ", devs & (devs - 1) ? "s" : "");
  int first = 1;
  for (int d = 0; d < 64; d++)
    if (devs & (1ull << d)) {
      rpt_printf(out, "%s%d", first ? "" : ",", d);
      first = 0;
    }
}

/* "Process <pid> on node <host> managing GPU <d>", as NCCL names a process. */
static void proc_words(rpt_t *out, const ras_peer_t *id) {
  rpt_printf(out, "Process %d on node %s ", id->pid, id->host);
  gpus(out, id->devs);
}

/* Ranks as ranges: "0-6", "0-2,4,7". */
static void ranges(rpt_t *out, const int *r, int n) {
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
    rpt_printf(out, "%s%d", i > 0 ? "," : "", r[i]);
    if (j > i) rpt_printf(out, "-%d", r[j]);
    i = j + 1;
  }
}

static const char *state_words(int state) {
  switch (state) {
  case PEER_DEAD:
    return "dead";
  case PEER_LEFT:
    return "exited";
  case PEER_UNRESPONSIVE:
    return "unresponsive";
  case PEER_CONNECTING:
    return "not reached yet";
  default:
    return "alive";
  }
}

/* ---- The verdict ---- */

static int waiting(const ras_rec_t *r) {
  return r->now.kind >= 0 && r->now.waited_ms >= VERDICT_WAIT_MS;
}

/* What rank `rank` of communicator `c`, which the waiting ranks wait for, does, in words. */
static void culprit_words(rpt_t *out, const sorted_t *s, const comm_t *c, int rank, uint64_t seq) {
  int stale;
  const ent_t *e = find_rank(s, c->nonce, rank, &stale);
  if (e == NULL) {
    ras_peer_t id;
    int known;
    const view_proc_t *p = missing_proc(s, c->nonce, rank, &id, &known);
    rpt_printf(out, "rank %d", rank);
    if (known) rpt_printf(out, " (process %d on %s)", id.pid, id.host);
    if (p != NULL && p->state == PEER_DEAD)
      rpt_printf(out, ", which is dead");
    else
      rpt_printf(out, ", which does not answer the monitor%s", p == NULL ? " (its process is unknown)" : "");
    return;
  }
  const ras_rec_t *r = e->rec;
  rpt_printf(out, "rank %d (process %d on %s), which ", rank, e->proc->proc.id.pid, e->proc->proc.id.host);
  if (stale) rpt_printf(out, "does not answer; when last heard from %.0f s ago it ", e->proc->silent_s);
  if (r->launched == 0)
    rpt_printf(out, "%s launched no call", stale ? "had" : "has");
  else
    rpt_printf(out, "%s launched %sup to #%llu", stale ? "had" : "has",
               !stale && r->launched <= seq ? "only " : "", (unsigned long long)(r->launched - 1));
  /* what that process waits in: this communicator first, then any other */
  const ras_rec_t *w = r->now.kind >= 0 && (stale || waiting(r)) ? r : NULL;
  for (uint32_t i = 0; w == NULL && i < e->proc->proc.nrecs; i++)
    if (waiting(&e->proc->proc.recs[i])) w = &e->proc->proc.recs[i];
  if (w == NULL) {
    if (r->dev >= 0 && r->launched > 0)
      rpt_printf(out, " and waits in no host call (its GPU work's progress is not visible to the monitor)");
    else
      rpt_printf(out, " and %s idle for %.0f s", stale ? "was" : "is", r->now.waited_ms / 1e3);
    return;
  }
  rpt_printf(out, " and %s in %s #%llu", stale ? "was" : "waits", ras_op_name(w->now.kind),
             (unsigned long long)w->now.seq);
  if (w != r) {
    char lb[RAS_NAME_MAX + 32];
    rpt_printf(out, " of %s", comm_label(w, lb, sizeof lb));
  }
  if (w->now.peer >= 0) rpt_printf(out, " for rank %d", w->now.peer);
  rpt_printf(out, " (%.0f s)", w->now.waited_ms / 1e3);
}

/* A rank that waits, counted in a verdict: its record answered the query and has waited long enough. */
static const ras_rec_t *waiter(const sorted_t *s, const comm_t *c, int rank) {
  int stale;
  const ent_t *e = find_rank(s, c->nonce, rank, &stale);
  return e != NULL && !stale && waiting(e->rec) ? e->rec : NULL;
}

/* Where the chain of waits from `rank` ends: the first rank that does not wait (missing, silent, idle, busy
 * elsewhere), or -1 when the chain goes round (ranks that wait for each other) or has no known peer. */
static int chain_end(const sorted_t *s, const comm_t *c, int rank, int *mark) {
  int start = rank + 1;
  for (int hops = 0; hops <= c->nranks; hops++) {
    const ras_rec_t *r = waiter(s, c, rank);
    if (r == NULL) return rank;
    if (r->now.peer < 0 || r->now.peer >= c->nranks || mark[r->now.peer] == start) return -1;
    mark[rank] = start;
    rank = r->now.peer;
  }
  return -1;
}

/* The verdict of one communicator, if its ranks wait; returns whether it wrote one. */
static int comm_verdict(rpt_t *out, const sorted_t *s, const comm_t *c, int lead) {
  int nw = 0, nend = 0;
  if (c->nranks > (1 << 20)) return 0; /* not a real job: no verdict */
  int *wr = malloc(sizeof(int) * (size_t)c->nranks), *ends = malloc(sizeof(int) * (size_t)c->nranks);
  int *mark = calloc((size_t)c->nranks, sizeof *mark);
  const ras_rec_t *first = NULL, *last = NULL;
  if (wr == NULL || ends == NULL || mark == NULL) goto out;
  for (int rank = 0; rank < c->nranks; rank++) {
    const ras_rec_t *r = waiter(s, c, rank);
    if (r == NULL) continue;
    wr[nw++] = rank;
    if (first == NULL || r->now.seq < first->now.seq) first = r;
    if (last == NULL || r->now.seq > last->now.seq) last = r;
    int end = chain_end(s, c, rank, mark);
    int dup = end < 0;
    for (int i = 0; i < nend && !dup; i++) dup = ends[i] == end;
    if (!dup) ends[nend++] = end;
  }
  if (nw == 0) goto out;
  char lb[RAS_NAME_MAX + 32];
  rpt_printf(out, "%s%s: rank%s ", lead ? "" : "; ", comm_label(first, lb, sizeof lb), nw > 1 ? "s" : "");
  ranges(out, wr, nw);
  rpt_printf(out, " wait%s in %s #%llu", nw > 1 ? "" : "s", ras_op_name(first->now.kind),
             (unsigned long long)first->now.seq);
  if (last->now.seq != first->now.seq)
    rpt_printf(out, "-%s#%llu", last->now.kind == first->now.kind ? "" : ras_op_name(last->now.kind),
               (unsigned long long)last->now.seq);
  if (nend == 0) {
    const ras_rec_t *longest = first;
    for (int i = 0; i < c->n; i++)
      if (waiting(c->ranks[i].rec) && c->ranks[i].rec->now.waited_ms > longest->now.waited_ms)
        longest = c->ranks[i].rec;
    rpt_printf(out, " for each other (no rank is behind); the longest wait: rank %d for rank %d, %.0f s",
               longest->rank, longest->now.peer, longest->now.waited_ms / 1e3);
  } else {
    rpt_printf(out, " for ");
    for (int i = 0; i < nend && i < 3; i++) {
      if (i > 0) rpt_printf(out, "; and for ");
      culprit_words(out, s, c, ends[i], first->now.seq);
    }
    if (nend > 3) rpt_printf(out, "; and for %d more ranks", nend - 3);
  }
out:
  free(wr);
  free(ends);
  free(mark);
  return nw > 0;
}

void report_verdict(const ras_view_t *v, rpt_t *out) {
  sorted_t s;
  if (sort_view(v, &s) == 0) {
    int lead = 1;
    for (int i = 0; i < s.ncomms; i++)
      if (comm_verdict(out, &s, &s.comms[i], lead)) lead = 0;
  }
  sorted_free(&s);
  if (out->data == NULL) rpt_printf(out, "%s", "");
}

/* ---- JSON ---- */

static const char *const nccl_funcs[5] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};
static const int nccl_func_ops[5] = {RAS_OP_BROADCAST, RAS_OP_REDUCE, RAS_OP_ALLGATHER, RAS_OP_REDUCESCATTER,
                                     RAS_OP_ALLREDUCE};

static void json_wait(rpt_t *out, const ras_wait_t *w) {
  if (w->kind < 0) {
    rpt_printf(out, "{\"state\": \"idle\", \"idle_s\": %.3f}", w->waited_ms / 1e3);
    return;
  }
  rpt_printf(
      out,
      "{\"state\": \"waiting\", \"call\": \"%s\", \"seq\": %llu, \"bytes\": %llu, \"peer\": %d, "
      "\"channel\": %d, \"step\": %d, \"direction\": \"%s\", \"bytes_done\": %llu, \"waiting_s\": %.3f}",
      ras_op_name(w->kind), (unsigned long long)w->seq, (unsigned long long)w->bytes, w->peer, w->channel,
      w->step, w->is_send ? "send" : "recv", (unsigned long long)w->done, w->waited_ms / 1e3);
}

static void json_rank(rpt_t *out, const ent_t *e, int first) {
  const ras_rec_t *r = e->rec;
  rpt_printf(out, "%s        {\n          \"rank\": %d,\n          \"host\": ", first ? "" : ",\n", r->rank);
  json_str(out, e->proc->proc.id.host);
  rpt_printf(out,
             ",\n          \"pid\": %d,\n          \"cuda_dev\": %d,\n          \"nvml_dev\": %d,\n"
             "          \"status\": {\n            \"init_state\": %d,\n            \"async_error\": %d,\n"
             "            \"finalize_called\": %s,\n            \"destroy_flag\": %s,\n"
             "            \"abort_flag\": %s\n          },\n          \"collective_counts\": {\n",
             e->proc->proc.id.pid, r->dev, r->dev, r->init_state, r->async_error,
             r->state == RAS_ST_FINALIZED ? "true" : "false", r->state == RAS_ST_ABORTED ? "true" : "false",
             r->state == RAS_ST_ABORTED ? "true" : "false");
  for (int f = 0; f < 5; f++) {
    const uint64_t *c = r->counts[nccl_func_ops[f]];
    rpt_printf(out, "            \"%s\": %llu%s\n", nccl_funcs[f], (unsigned long long)(c[0] + c[1]),
               f < 4 ? "," : "");
  }
  rpt_printf(out, "          },\n          \"operation_counts\": {");
  for (int k = 0; k < RAS_OPS; k++)
    rpt_printf(out, "%s\"%s\": {\"eager\": %llu, \"graph\": %llu}", k ? ", " : "", ras_op_name(k),
               (unsigned long long)r->counts[k][0], (unsigned long long)r->counts[k][1]);
  rpt_printf(out, "},\n          \"launched\": %llu,\n          \"now\": ", (unsigned long long)r->launched);
  json_wait(out, &r->now);
  rpt_printf(out,
             ",\n          \"memory\": {\"host_bytes\": %llu, \"device_bytes\": %llu, \"peak_bytes\": %llu}\n"
             "        }",
             (unsigned long long)r->host_bytes, (unsigned long long)r->dev_bytes,
             (unsigned long long)r->peak_bytes);
}

static void json_missing(rpt_t *out, const sorted_t *s, const comm_t *c) {
  int listed = 0;
  for (int rank = 0, i = 0; rank < c->nranks && listed < MISSING_LIST_MAX; rank++) {
    if (i < c->n && c->ranks[i].rec->rank == rank) {
      i++;
      continue;
    }
    ras_peer_t id = {.pid = -1};
    int known;
    const view_proc_t *p = missing_proc(s, c->nonce, rank, &id, &known);
    int stale;
    const ent_t *last = find_rank(s, c->nonce, rank, &stale);
    rpt_printf(out, "%s        {\n          \"rank\": %d,\n          \"host\": ", listed ? ",\n" : "", rank);
    json_str(out, known ? id.host : "unknown");
    int dev = last != NULL ? last->rec->dev : -1;
    rpt_printf(out,
               ",\n          \"pid\": %d,\n          \"cuda_dev\": %d,\n          \"nvml_dev\": %d,\n"
               "          \"status\": {\n            \"unresponsive\": %s,\n"
               "            \"considered_dead\": %s\n          }",
               known ? id.pid : -1, dev, dev, p == NULL || !p->fresh ? "true" : "false",
               p != NULL && p->state == PEER_DEAD ? "true" : "false");
    if (last != NULL) {
      rpt_printf(out, ",\n          \"last_known\": {\"silent_s\": %.1f, \"launched\": %llu, \"now\": ",
                 last->proc->silent_s, (unsigned long long)last->rec->launched);
      json_wait(out, &last->rec->now);
      rpt_printf(out, "}");
    }
    rpt_printf(out, "\n        }");
    listed++;
  }
}

static void json_comm(rpt_t *out, const sorted_t *s, const comm_t *c, int first) {
  const ras_rec_t *r0 = c->ranks[0].rec;
  rpt_printf(out,
             "%s    {\n      \"hash\": \"0x%llx\",\n      \"secondary_hash\": \"0x%llx:0x%llx\",\n"
             "      \"size\": %d,\n      \"ranks_count\": %d,\n      \"missing_ranks_count\": %d,\n"
             "      \"name\": ",
             first ? "" : ",\n", (unsigned long long)c->nonce, (unsigned long long)r0->root_host,
             (unsigned long long)(uint32_t)r0->root_pid, c->nranks, c->n, c->missing);
  json_str(out, r0->name);
  rpt_printf(out, ",\n      \"status\": \"%s\",\n      \"verdict\": ", status_name(c->status));
  rpt_t v = {0};
  if (comm_verdict(&v, s, c, 1) && v.data != NULL)
    json_str(out, v.data);
  else
    rpt_printf(out, "null");
  rpt_free(&v);
  rpt_printf(out, ",\n      \"ranks\": [\n");
  for (int i = 0; i < c->n; i++) json_rank(out, &c->ranks[i], i == 0);
  rpt_printf(out, "\n      ],\n      \"missing_ranks\": [\n");
  json_missing(out, s, c);
  rpt_printf(out, "\n      ]\n    }");
}

static void timestamp(char *buf, size_t size) {
  time_t t = time(NULL);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, size, "%F %T", &tm);
}

void report_json(const ras_view_t *v, rpt_t *out) {
  sorted_t s;
  int ok = sort_view(v, &s) == 0;
  char ts[64];
  timestamp(ts, sizeof ts);
  rpt_printf(out,
             "{\n  \"nccl_version\": \"%d.%d.%d\",\n  \"cuda_runtime_version\": -1,\n"
             "  \"cuda_driver_version\": -1,\n  \"timestamp\": \"%s\",\n  \"communicators_count\": %d,\n"
             "  \"communicators\": [\n",
             NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, ts, ok ? s.ncomms : 0);
  for (int i = 0; ok && i < s.ncomms; i++) json_comm(out, &s, &s.comms[i], i == 0);
  rpt_printf(out,
             "\n  ],\n  \"ras\": {\n    \"collection_time_sec\": %.3f,\n    \"timeouts_count\": %d\n  },\n"
             "  \"braid\": {\n    \"version\": \"%s\",\n    \"processes\": [",
             v->collect_s, v->timeouts, BRAID_VERSION);
  for (int p = 0; p < v->nprocs; p++) {
    const view_proc_t *vp = &v->procs[p];
    rpt_printf(out, "%s\n      {\"host\": ", p ? "," : "");
    json_str(out, vp->proc.id.host);
    char a[SOCK_ADDR_STRLEN];
    rpt_printf(out, ", \"address\": \"%s\"", sock_addr_str(&vp->proc.id.addr, a));
    rpt_printf(out, ", \"pid\": %d, \"state\": \"%s\", \"answered\": %s, \"silent_s\": %.1f}",
               vp->proc.id.pid, vp->state == PEER_SELF ? "self" : state_words(vp->state),
               vp->fresh ? "true" : "false", vp->state == PEER_SELF ? 0.0 : vp->silent_s);
  }
  rpt_printf(out, "\n    ],\n    \"verdict\": ");
  rpt_t verdict = {0};
  if (ok) report_verdict(v, &verdict);
  if (verdict.len > 0)
    json_str(out, verdict.data);
  else
    rpt_printf(out, "null");
  rpt_free(&verdict);
  rpt_printf(out, "\n  }\n}\n");
  sorted_free(&s);
}

/* ---- Text ---- */

/* Communicators in the order the text shows them (largest first), with their group numbers. */
typedef struct {
  const comm_t *c;
  int group, index;
} shown_t;

static int shown_cmp(const void *a, const void *b) {
  const comm_t *x = ((const shown_t *)a)->c, *y = ((const shown_t *)b)->c;
  if (x->nranks != y->nranks) return y->nranks - x->nranks;
  if (x->nodes != y->nodes) return y->nodes - x->nodes;
  if (x->status != y->status) return (int)y->status - (int)x->status;
  if (x->errors != y->errors) return (int)y->errors - (int)x->errors;
  return (x->nonce > y->nonce) - (x->nonce < y->nonce);
}

static const char *errors_name(unsigned e) {
  static const char *const names[8] = {"OK",
                                       "MISMATCH",
                                       "ERROR",
                                       "ERROR,MISMATCH",
                                       "INCOMPLETE",
                                       "INCOMPLETE,MISMATCH",
                                       "INCOMPLETE,ERROR",
                                       "INCOMPLETE,ERROR,MISMATCH"};
  return names[e & 7];
}

static void range_text(char *buf, size_t size, int lo, int hi) {
  if (lo == hi)
    snprintf(buf, size, "%d", lo);
  else
    snprintf(buf, size, "%d-%d", lo, hi);
}

static void text_summary(rpt_t *out, const ras_view_t *v) {
  int procs = 0, nodes = 0, gpus = 0, ppn_lo = 0, ppn_hi = 0, gpp_lo = -1, gpp_hi = 0;
  for (int i = 0; i < v->nprocs; i++) {
    const view_proc_t *p = &v->procs[i];
    if (p->state == PEER_LEFT) continue;
    procs++;
    int g = __builtin_popcountll(p->proc.id.devs);
    gpus += g;
    if (gpp_lo < 0 || g < gpp_lo) gpp_lo = g;
    if (g > gpp_hi) gpp_hi = g;
    int first = 1, here = 0;
    for (int j = 0; j < v->nprocs; j++) {
      if (v->procs[j].state == PEER_LEFT || v->procs[j].proc.id.host_hash != p->proc.id.host_hash) continue;
      if (j < i) first = 0;
      here++;
    }
    if (!first) continue;
    nodes++;
    if (ppn_lo == 0 || here < ppn_lo) ppn_lo = here;
    if (here > ppn_hi) ppn_hi = here;
  }
  char ppn[32], gpp[32];
  range_text(ppn, sizeof ppn, ppn_lo, ppn_hi);
  range_text(gpp, sizeof gpp, gpp_lo < 0 ? 0 : gpp_lo, gpp_hi);
  rpt_printf(out,
             "Job summary\n===========\n\n"
             "  Nodes  Processes         GPUs  Processes     GPUs\n"
             "(total)   per node  per process    (total)  (total)\n"
             "%7d  %9s  %11s  %9d  %7d\n\n",
             nodes, ppn, gpp, procs, gpus);
}

static void text_table(rpt_t *out, shown_t *sh, int n) {
  if (n == 0) {
    rpt_printf(out, "No communicator data collected!\n");
    return;
  }
  rpt_printf(out, "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
                  "    #  in group  per comm  per node  per comm  in group\n");
  for (int i = 0; i < n;) {
    int j = i, lo = sh[i].c->per_node_min, hi = sh[i].c->per_node_max, total = 0;
    while (j < n && sh[j].group == sh[i].group) {
      if (sh[j].c->per_node_min < lo) lo = sh[j].c->per_node_min;
      if (sh[j].c->per_node_max > hi) hi = sh[j].c->per_node_max;
      total += sh[j].c->n;
      j++;
    }
    char pn[32];
    range_text(pn, sizeof pn, lo, hi);
    rpt_printf(out, "%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n", sh[i].group, j - i, sh[i].c->nodes, pn,
               sh[i].c->nranks, total, status_name(sh[i].c->status), errors_name(sh[i].c->errors));
    i = j;
  }
}

static void text_proc_line(rpt_t *out, const view_proc_t *p) {
  rpt_printf(out, "  ");
  proc_words(out, &p->proc.id);
  rpt_printf(out, " (%s, silent for %.0f s)\n", state_words(p->state), p->silent_s);
}

/* Processes that did not answer, and those considered dead. */
static void text_errors_procs(rpt_t *out, const ras_view_t *v) {
  int silent = 0, dead = 0;
  for (int i = 0; i < v->nprocs; i++) {
    const view_proc_t *p = &v->procs[i];
    if (p->state == PEER_DEAD)
      dead++;
    else if (!p->fresh && p->state != PEER_LEFT)
      silent++;
  }
  if (silent > 0) {
    rpt_printf(out, "INCOMPLETE\n  Missing communicator data from %d job process%s\n", silent,
               silent > 1 ? "es" : "");
    for (int i = 0; i < v->nprocs; i++)
      if (!v->procs[i].fresh && v->procs[i].state != PEER_DEAD && v->procs[i].state != PEER_LEFT)
        text_proc_line(out, &v->procs[i]);
    rpt_printf(out, "\n");
  }
  if (dead > 0) {
    rpt_printf(out, "DEAD\n  %d job process%s considered dead (unreachable via the RAS network)\n", dead,
               dead > 1 ? "es are" : " is");
    for (int i = 0; i < v->nprocs; i++)
      if (v->procs[i].state == PEER_DEAD) text_proc_line(out, &v->procs[i]);
    rpt_printf(out, "\n");
  }
}

static void text_missing_ranks(rpt_t *out, const sorted_t *s, const shown_t *sh, int verbose) {
  const comm_t *c = sh->c;
  rpt_printf(out, "#%d-%d (%016llx) INCOMPLETE\n  Missing communicator data from %d rank%s\n", sh->group,
             sh->index, (unsigned long long)c->nonce, c->missing, c->missing > 1 ? "s" : "");
  int listed = 0, limit = verbose ? MISSING_LIST_MAX : 10;
  for (int rank = 0, i = 0; rank < c->nranks && listed < limit; rank++) {
    if (i < c->n && c->ranks[i].rec->rank == rank) {
      i++;
      continue;
    }
    ras_peer_t id;
    int known;
    const view_proc_t *p = missing_proc(s, c->nonce, rank, &id, &known);
    rpt_printf(out, "  Rank %d -- ", rank);
    if (known) {
      proc_words(out, &id);
      rpt_printf(out, " (%s)\n", p != NULL ? state_words(p->state) : "unknown state");
    } else {
      rpt_printf(out, "[process information not found]\n");
    }
    listed++;
  }
  if (listed < c->missing) rpt_printf(out, "  [%d more]\n", c->missing - listed);
  rpt_printf(out, "\n");
}

static void text_rank_errors(rpt_t *out, const shown_t *sh) {
  const comm_t *c = sh->c;
  rpt_printf(out, "#%d-%d (%016llx) ERROR\n", sh->group, sh->index, (unsigned long long)c->nonce);
  for (int i = 0; i < c->n; i++) {
    const ras_rec_t *r = c->ranks[i].rec;
    int init = failed_result(r->init_state);
    if (!init && !failed_result(r->async_error)) continue;
    rpt_printf(out, "  Rank %d reported %s (%s) -- ", r->rank,
               init ? "an initialization error" : "an asynchronous error",
               log_result_name((ncclResult_t)(init ? r->init_state : r->async_error)));
    proc_words(out, &c->ranks[i].proc->proc.id);
    rpt_printf(out, "\n");
  }
  rpt_printf(out, "\n");
}

/* Ranks whose counts of one collective differ, as NCCL words it. */
static void text_mismatch(rpt_t *out, const shown_t *sh, int verbose) {
  const comm_t *c = sh->c;
  rpt_printf(out, "#%d-%d (%016llx) MISMATCH\n", sh->group, sh->index, (unsigned long long)c->nonce);
  if (c->status & (c->status - 1)) rpt_printf(out, "  Communicator ranks have different status\n");
  for (int k = 0; k < RAS_OP_SEND && counts_differ(c); k++) {
    uint64_t first = c->ranks[0].rec->counts[k][0] + c->ranks[0].rec->counts[k][1];
    int differ = 0;
    for (int i = 1; i < c->n && !differ; i++)
      differ = c->ranks[i].rec->counts[k][0] + c->ranks[i].rec->counts[k][1] != first;
    if (!differ) continue;
    rpt_printf(out, "  Communicator ranks have different %s operation counts\n", ras_op_name(k));
    for (int i = 0; i < c->n && (verbose || i < 10); i++) {
      const ras_rec_t *r = c->ranks[i].rec;
      rpt_printf(out, "  Rank %d has launched %llu -- ", r->rank,
                 (unsigned long long)(r->counts[k][0] + r->counts[k][1]));
      proc_words(out, &c->ranks[i].proc->proc.id);
      rpt_printf(out, "\n");
    }
  }
  rpt_printf(out, "\n");
}

/* What one rank does, in words. */
static void doing(rpt_t *out, const ras_rec_t *r) {
  if (r->now.kind < 0) {
    if (r->launched == 0)
      rpt_printf(out, "idle, no call yet");
    else
      rpt_printf(out, "idle after #%llu%s", (unsigned long long)(r->launched - 1),
                 r->dev >= 0 ? " (GPU work not visible)" : "");
    return;
  }
  rpt_printf(out, "in %s #%llu (%llu bytes), step %d, waiting %s rank %d", ras_op_name(r->now.kind),
             (unsigned long long)r->now.seq, (unsigned long long)r->now.bytes, r->now.step + 1,
             r->now.is_send ? "to send to" : "to receive from", r->now.peer);
  if (r->now.channel >= 0) rpt_printf(out, " on channel %d", r->now.channel);
  rpt_printf(out, " for %.1f s", r->now.waited_ms / 1e3);
}

static void text_activity(rpt_t *out, const shown_t *sh, int verbose) {
  const comm_t *c = sh->c;
  const ras_rec_t *r0 = c->ranks[0].rec;
  char lb[RAS_NAME_MAX + 32];
  rpt_printf(out, "#%d-%d %s (%016llx): %d rank%s, %s\n  Calls on rank %d:", sh->group, sh->index,
             comm_label(r0, lb, sizeof lb), (unsigned long long)c->nonce, c->nranks, c->nranks > 1 ? "s" : "",
             status_name(c->status), r0->rank);
  int any = 0;
  for (int k = 0; k < RAS_OPS; k++) {
    if (r0->counts[k][0] + r0->counts[k][1] == 0) continue;
    rpt_printf(out, "%s %s %llu", any ? "," : "", ras_op_name(k),
               (unsigned long long)(r0->counts[k][0] + r0->counts[k][1]));
    if (r0->counts[k][1] > 0) rpt_printf(out, " (%llu in graphs)", (unsigned long long)r0->counts[k][1]);
    any = 1;
  }
  rpt_printf(out, "%s\n", any ? "" : " none");
  int *grp = malloc(sizeof(int) * (size_t)(c->n > 0 ? c->n : 1));
  for (int i = 0; i < c->n && grp != NULL;) {
    /* ranks in a row doing the same call (or idle after the same call) share a line unless verbose */
    const ras_rec_t *r = c->ranks[i].rec;
    int j = i, n = 0;
    while (j < c->n && (j == i || (!verbose && c->ranks[j].rec->now.kind == r->now.kind &&
                                   c->ranks[j].rec->now.seq == r->now.seq &&
                                   c->ranks[j].rec->launched == r->launched && r->now.kind < 0)))
      grp[n++] = c->ranks[j++].rec->rank;
    rpt_printf(out, "  Rank%s ", n > 1 ? "s" : "");
    ranges(out, grp, n);
    rpt_printf(out, ": ");
    doing(out, r);
    rpt_printf(out, "; memory: host %llu B, device %llu B (peak %llu B)\n", (unsigned long long)r->host_bytes,
               (unsigned long long)r->dev_bytes, (unsigned long long)r->peak_bytes);
    i = j;
  }
  free(grp);
}

static void text_sections(rpt_t *out, const ras_view_t *v, const sorted_t *s, shown_t *sh, int verbose) {
  rpt_t errs = {0}, warns = {0};
  text_errors_procs(&errs, v);
  for (int i = 0; i < s->ncomms; i++) {
    if (sh[i].c->errors & ERR_INCOMPLETE) text_missing_ranks(&errs, s, &sh[i], verbose);
    if (sh[i].c->errors & ERR_ERROR) text_rank_errors(&errs, &sh[i]);
    if (sh[i].c->errors & ERR_MISMATCH) text_mismatch(&warns, &sh[i], verbose);
  }
  if (v->timeouts > 0)
    rpt_printf(&warns, "TIMEOUT\n  %d process%s did not answer within the query's timeout\n\n", v->timeouts,
               v->timeouts > 1 ? "es" : "");
  rpt_t verdict = {0};
  report_verdict(v, &verdict);
  if (verdict.len > 0) rpt_printf(&warns, "STALL\n  %s\n\n", verdict.data);
  rpt_free(&verdict);
  if (errs.len > 0) rpt_printf(out, "\nErrors\n======\n\n%s", errs.data);
  if (warns.len > 0) rpt_printf(out, "\nWarnings\n========\n\n%s", warns.data);
  if (errs.failed || warns.failed) out->failed = 1;
  rpt_free(&errs);
  rpt_free(&warns);
  if (s->ncomms > 0) rpt_printf(out, "\nActivity\n========\n\n");
  for (int i = 0; i < s->ncomms; i++) text_activity(out, &sh[i], verbose);
}

void report_text(const ras_view_t *v, int verbose, rpt_t *out) {
  sorted_t s;
  shown_t *sh = NULL;
  rpt_printf(out, "Braid %s (NCCL API %d.%d.%d), RAS client protocol 2\n\n", BRAID_VERSION, NCCL_MAJOR,
             NCCL_MINOR, NCCL_PATCH);
  text_summary(out, v);
  rpt_printf(out, "Communicators... (%.3fs)\n=============\n\n", v->collect_s);
  if (sort_view(v, &s) != 0 || (s.ncomms > 0 && (sh = malloc((size_t)s.ncomms * sizeof *sh)) == NULL)) {
    rpt_printf(out, "[out of memory]\n");
    sorted_free(&s);
    return;
  }
  for (int i = 0; i < s.ncomms; i++) sh[i] = (shown_t){.c = &s.comms[i]};
  if (s.ncomms > 0) qsort(sh, (size_t)s.ncomms, sizeof *sh, shown_cmp);
  for (int i = 0; i < s.ncomms; i++) {
    int same = i > 0 && sh[i].c->nranks == sh[i - 1].c->nranks && sh[i].c->nodes == sh[i - 1].c->nodes &&
               sh[i].c->status == sh[i - 1].c->status && sh[i].c->errors == sh[i - 1].c->errors;
    sh[i].group = i == 0 ? 0 : sh[i - 1].group + !same;
    sh[i].index = same ? sh[i - 1].index + 1 : 0;
  }
  text_table(out, sh, s.ncomms);
  text_sections(out, v, &s, sh, verbose);
  free(sh);
  sorted_free(&s);
}

/* ---- Events ---- */

void report_event(int json, const char *group, const char *event, const ras_peer_t *peer, const char *details,
                  rpt_t *out) {
  char ts[64];
  timestamp(ts, sizeof ts);
  if (!json) {
    rpt_printf(out, "[%s] %s: ", ts, event);
    if (peer != NULL) {
      proc_words(out, peer);
      rpt_printf(out, " ");
    }
    rpt_printf(out, "%s\n", details);
    return;
  }
  rpt_printf(out, "{\n  \"timestamp\": \"%s\",\n  \"group\": \"%s\",\n  \"event\": ", ts, group);
  json_str(out, event);
  if (peer != NULL) {
    rpt_printf(out, ",\n  \"peer\": {\n    \"host\": ");
    json_str(out, peer->host);
    rpt_printf(out, ",\n    \"pid\": %d,\n    \"cuda_devs\": [", peer->pid);
    for (int d = 0, first = 1; d < 64; d++)
      if (peer->devs & (1ull << d)) {
        rpt_printf(out, "%s%d", first ? "" : ",", d);
        first = 0;
      }
    rpt_printf(out, "],\n    \"nvml_devs\": [");
    for (int d = 0, first = 1; d < 64; d++)
      if (peer->devs & (1ull << d)) {
        rpt_printf(out, "%s%d", first ? "" : ",", d);
        first = 0;
      }
    rpt_printf(out, "]\n  }");
  }
  rpt_printf(out, ",\n  \"details\": ");
  json_str(out, details);
  rpt_printf(out, "\n}\n");
}
