/*
 * Monitoring, one process: the wire format (round trip, and refusal of every truncated or out-of-range
 * message), the client command parser, the reports on views made by hand (JSON parsed strictly, text counts,
 * verdict words), the registry under concurrent change, and the client protocol's limits on a live monitor.
 *
 * Each of NCCL's RAS bugs named in the design has a case here or in test_ras_poll.c:
 *   - a status that read a communicator's peer table during init (NCCL 2.26, #1669/#1718): registry_churn
 *     snapshots records in state INIT, without a peer table, while other threads make and retire them;
 *   - a text report that miscounted missing ranks (#1762): text_missing_counts;
 *   - JSON invalid whenever a rank is missing (2.28.7-2.28.9): json_missing_valid;
 *   - a fill loop that skipped a not-yet-valid communicator without advancing (#2346): registry_churn checks
 *     that every snapshot lists every live record, INIT ones included, and ends;
 *   - a use-after-free on peer updates (#1996): peer_churn adds, loses and buries peers while other threads
 *     take views and status reports (run under ASan/TSan by the sanitizer builds).
 */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "json.h"
#include "ras/client.h"
#include "ras/mesh.h"
#include "ras/proto.h"
#include "ras/ras.h"
#include "ras/report.h"
#include "ras/wire.h"
#include "ras_util.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static ras_peer_t peer_id(int i, const char *host) {
  ras_peer_t p = {.pid = 1000 + i, .devs = i % 3 == 0 ? 0 : 1ull << (i % 8), .host_hash = 77 + i / 4};
  p.addr.sin.sin_family = AF_INET;
  p.addr.sin.sin_port = htons((uint16_t)(30000 + i));
  p.addr.sin.sin_addr.s_addr = htonl(0x0a000001u + (uint32_t)(i / 4));
  snprintf(p.host, sizeof p.host, "%s", host);
  return p;
}

static ras_rec_t rec(uint64_t nonce, int rank, int nranks, uint64_t colls) {
  ras_rec_t r = {.nonce = nonce, .rank = rank, .nranks = nranks, .dev = -1, .state = RAS_ST_RUNNING};
  r.counts[RAS_OP_ALLREDUCE][0] = colls;
  r.colls = colls;
  r.launched = colls;
  r.now = (ras_wait_t){.kind = -1, .peer = -1, .channel = -1, .step = -1};
  snprintf(r.name, sizeof r.name, "comm %016llx", (unsigned long long)nonce);
  return r;
}

/* ---- Wire ---- */

static void wire_round_trip(void) {
  ras_rec_t recs[5];
  for (int i = 0; i < 5; i++) {
    recs[i] = rec(rnd(), i, 5 + i, rnd() % 1000);
    for (int k = 0; k < RAS_OPS; k++) recs[i].counts[k][0] = rnd(), recs[i].counts[k][1] = rnd();
    recs[i].now = (ras_wait_t){.kind = i % RAS_OPS,
                               .peer = i,
                               .channel = i - 1,
                               .step = 3,
                               .is_send = i & 1,
                               .seq = rnd(),
                               .bytes = rnd(),
                               .done = rnd(),
                               .waited_ms = rnd()};
    recs[i].host_bytes = rnd(), recs[i].dev_bytes = rnd(), recs[i].peak_bytes = rnd();
    recs[i].init_state = i, recs[i].async_error = i + 1, recs[i].state = i;
    snprintf(recs[i].name, sizeof recs[i].name, "n\"a\\m\ne\x01%d", i);
  }
  ras_proc_t proc = {.id = peer_id(3, "host\"one"), .nrecs = 5, .recs = recs};
  for (int brief = 0; brief < 2; brief++) {
    wire_buf_t b = {0};
    wire_put_snapshot(&b, WIRE_REPLY, 42, &proc, brief);
    EXPECT(!b.failed && b.len > WIRE_HEADER);
    wire_msg_t m;
    EXPECT(wire_decode(b.data, b.data + WIRE_HEADER, b.len - WIRE_HEADER, &m) == 0, "brief %d", brief);
    EXPECT(m.type == WIRE_REPLY && m.id == 42 && m.proc.nrecs == 5);
    EXPECT(wire_addr_eq(&m.proc.id.addr, &proc.id.addr) && m.proc.id.pid == proc.id.pid);
    EXPECT(strcmp(m.proc.id.host, "host\"one") == 0, "host %s", m.proc.id.host);
    for (int i = 0; i < 5; i++) {
      const ras_rec_t *x = &m.proc.recs[i], *y = &recs[i];
      EXPECT(x->nonce == y->nonce && x->rank == y->rank && x->nranks == y->nranks && x->state == y->state);
      EXPECT(x->launched == y->launched && x->colls == y->colls && x->init_state == y->init_state);
      EXPECT(memcmp(&x->now, &y->now, sizeof x->now) == 0, "wait of record %d", i);
      if (brief) {
        EXPECT(x->counts[0][0] == 0 && x->name[0] == '\0' && x->host_bytes == 0, "brief carries no counts");
      } else {
        EXPECT(memcmp(x->counts, y->counts, sizeof x->counts) == 0 && x->peak_bytes == y->peak_bytes);
        char want[RAS_NAME_MAX];
        snprintf(want, sizeof want, "n\"a\\m?e?%d", i); /* unprintable bytes arrive as '?' */
        EXPECT(strcmp(x->name, want) == 0, "name \"%s\"", x->name);
      }
    }
    wire_msg_free(&m);
    wire_buf_free(&b);
  }
}

/* Every prefix of a valid message, and every single-byte change of its header and first record, is refused
 * or decodes to a message whose fields are within their bounds. */
static void wire_refusals(void) {
  ras_rec_t r = rec(7, 1, 4, 9);
  ras_proc_t proc = {.id = peer_id(1, "h"), .nrecs = 1, .recs = &r};
  wire_buf_t b = {0};
  wire_put_snapshot(&b, WIRE_KEEPALIVE, 0, &proc, 0);
  wire_msg_t m;
  uint32_t len;
  for (size_t n = WIRE_HEADER; n < b.len; n++)
    EXPECT(wire_decode(b.data, b.data + WIRE_HEADER, n - WIRE_HEADER, &m) != 0, "a %zu-byte prefix decoded",
           n);
  for (size_t i = 0; i < b.len; i++)
    for (int bit = 0; bit < 8; bit++) {
      char *c = malloc(b.len);
      memcpy(c, b.data, b.len);
      c[i] ^= (char)(1 << bit);
      if (wire_frame(c, &len) && len == b.len - WIRE_HEADER &&
          wire_decode(c, c + WIRE_HEADER, len, &m) == 0) {
        for (uint32_t j = 0; j < m.proc.nrecs; j++) {
          const ras_rec_t *x = &m.proc.recs[j];
          EXPECT(x->rank >= 0 && x->rank < x->nranks && x->state <= RAS_ST_ABORTED && x->now.kind < RAS_OPS,
                 "byte %zu bit %d decoded out of range", i, bit);
        }
        wire_msg_free(&m);
      }
      free(c);
    }
  char hdr[WIRE_HEADER];
  memcpy(hdr, b.data, WIRE_HEADER);
  hdr[8] = hdr[9] = hdr[10] = hdr[11] = (char)0xff; /* 4 GiB payload */
  EXPECT(!wire_frame(hdr, &len), "an oversized frame passed");
  wire_buf_free(&b);
}

/* ---- The command parser ---- */

static void proto_parse(void) {
  static const struct {
    const char *line;
    cmd_kind_t kind;
    long value;
    const char *error;
  } cases[] = {
      {"CLIENT PROTOCOL 2", CMD_PROTOCOL, 0, NULL},
      {"client protocol 99", CMD_PROTOCOL, 0, NULL},
      {"TIMEOUT 0", CMD_TIMEOUT, 0, NULL},
      {"timeout 17\r", CMD_TIMEOUT, 17, NULL},
      {"TIMEOUT -1", CMD_ERROR, 0, "ERROR: Invalid timeout value -1\n"},
      {"TIMEOUT 1x", CMD_ERROR, 0, "ERROR: Invalid timeout value 1x\n"},
      {"TIMEOUT 9999999999", CMD_ERROR, 0, "ERROR: Invalid timeout value 9999999999\n"},
      {"SET FORMAT json", CMD_FORMAT, 1, NULL},
      {"set format TEXT", CMD_FORMAT, 0, NULL},
      {"SET FORMAT xml", CMD_ERROR, 0, "ERROR: Invalid format xml\n"},
      {"STATUS", CMD_STATUS, 0, NULL},
      {"Verbose Status", CMD_STATUS, 1, NULL},
      {"STATUSES", CMD_ERROR, 0, "ERROR: Unknown command STATUSES\n"},
      {"MONITOR", CMD_MONITOR, CLIENT_EV_LIFECYCLE, NULL},
      {"monitor trace", CMD_MONITOR, CLIENT_EV_TRACE, NULL},
      {"MONITOR lifecycle,trace", CMD_MONITOR, 3, NULL},
      {"MONITOR all", CMD_MONITOR, 3, NULL},
      {"MONITOR   all", CMD_MONITOR, 3, NULL},
      {"MONITOR life", CMD_ERROR, 0, "ERROR: Invalid event group 'life'\n"},
      {"MONITOR trace,", CMD_MONITOR, CLIENT_EV_TRACE, NULL},
      {"", CMD_EMPTY, 0, NULL},
      {"\r", CMD_EMPTY, 0, NULL},
      {"hello\x1b[2J", CMD_ERROR, 0, "ERROR: Unknown command hello?[2J\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    client_cmd_t c;
    client_parse(cases[i].line, strlen(cases[i].line), &c);
    EXPECT(c.kind == cases[i].kind, "\"%s\": kind %d, expected %d", cases[i].line, c.kind, cases[i].kind);
    if (c.kind != CMD_ERROR && c.kind != CMD_EMPTY && c.kind != CMD_PROTOCOL)
      EXPECT(c.value == cases[i].value, "\"%s\": value %ld", cases[i].line, c.value);
    if (cases[i].error != NULL)
      EXPECT(strcmp(c.error, cases[i].error) == 0, "\"%s\": answered \"%s\"", cases[i].line, c.error);
  }
  char huge[5000];
  memset(huge, 'A', sizeof huge);
  client_cmd_t c;
  client_parse(huge, sizeof huge, &c);
  EXPECT(c.kind == CMD_ERROR && strlen(c.error) < 120 && strstr(c.error, "...") != NULL, "%s", c.error);
}

/* ---- Reports ---- */

/* A job of 3 processes: 0 (self) runs ranks 0-3 of an 8-rank communicator A, 1 (alive) ranks 4-5, 2 (given
 * `state2`) ranks 6-7; process 2 did not answer, so its records are only its last keep-alive's. */
typedef struct {
  view_proc_t procs[3];
  ras_rec_t recs[3][4];
} job_t;

static void job_make(job_t *j, int state2, const char *host) {
  memset(j, 0, sizeof *j);
  int first[3] = {0, 4, 6}, count[3] = {4, 2, 2};
  for (int p = 0; p < 3; p++) {
    for (int i = 0; i < count[p]; i++) j->recs[p][i] = rec(0xa11ce, first[p] + i, 8, 641);
    j->procs[p] =
        (view_proc_t){.proc = {.id = peer_id(p, host), .nrecs = (uint32_t)count[p], .recs = j->recs[p]},
                      .state = p == 0   ? PEER_SELF
                               : p == 1 ? PEER_ALIVE
                                        : state2,
                      .fresh = p < 2,
                      .silent_s = p == 2 ? 12 : 0};
  }
}

static js_t *parse_json(const rpt_t *r) {
  char err[128];
  EXPECT(r->data != NULL && !r->failed);
  js_t *v = js_parse(r->data, r->len, err, sizeof err);
  EXPECT(v != NULL, "invalid JSON: %s\n%s", err, r->data);
  return v;
}

/* Checks one communicator of a parsed status: sizes add up, ranks are unique and in range. */
static void check_comm_json(const js_t *c, int *missing_p) {
  const js_t *size = js_get_type(c, "size", JS_NUM), *rc = js_get_type(c, "ranks_count", JS_NUM);
  const js_t *mc = js_get_type(c, "missing_ranks_count", JS_NUM), *ranks = js_get_type(c, "ranks", JS_ARR);
  const js_t *miss = js_get_type(c, "missing_ranks", JS_ARR);
  EXPECT(size && rc && mc && ranks && miss && js_get_type(c, "hash", JS_STR), "communicator fields");
  EXPECT(rc->num + mc->num == size->num && ranks->n == rc->num && miss->n == mc->num, "counts add up");
  unsigned char seen[64] = {0};
  for (int i = 0; i < ranks->n + miss->n; i++) {
    const js_t *e = i < ranks->n ? &ranks->items[i] : &miss->items[i - ranks->n];
    const js_t *r = js_get_type(e, "rank", JS_NUM);
    EXPECT(r != NULL && r->num >= 0 && r->num < size->num && r->num < 64 && !seen[(int)r->num], "rank");
    seen[(int)r->num] = 1;
    EXPECT(js_get_type(e, "status", JS_OBJ) && js_get_type(e, "host", JS_STR) &&
           js_get_type(e, "pid", JS_NUM));
  }
  *missing_p = (int)mc->num;
}

static void json_missing_valid(void) {
  static const char *const hosts[] = {"node-1", "we\"ird\\host\n\t\x7f"};
  for (int h = 0; h < 2; h++)
    for (int state2 = PEER_ALIVE; state2 <= PEER_DEAD; state2++) {
      job_t j;
      job_make(&j, state2, hosts[h]);
      ras_view_t v = {.procs = j.procs, .nprocs = 3};
      rpt_t out = {0};
      report_json(&v, &out);
      js_t *doc = parse_json(&out);
      const js_t *comms = js_get_type(doc, "communicators", JS_ARR);
      EXPECT(comms != NULL && comms->n == 1 && js_get_type(doc, "nccl_version", JS_STR));
      int missing;
      check_comm_json(&comms->items[0], &missing);
      EXPECT(missing == 2, "%d missing ranks, expected 2 (ranks 6 and 7)", missing);
      const js_t *m0 = &js_get(&comms->items[0], "missing_ranks")->items[0];
      const js_t *st = js_get_type(m0, "status", JS_OBJ);
      EXPECT(js_get_type(st, "unresponsive", JS_BOOL)->num == 1);
      EXPECT(js_get_type(st, "considered_dead", JS_BOOL)->num == (state2 == PEER_DEAD), "state %d", state2);
      EXPECT(js_get_type(m0, "pid", JS_NUM)->num == 1002, "the missing rank's process is found");
      EXPECT(strcmp(js_get_type(m0, "host", JS_STR)->str, hosts[h]) == 0, "host kept exactly");
      js_free(doc);
      rpt_free(&out);
    }
  ras_view_t empty = {0};
  rpt_t out = {0};
  report_json(&empty, &out);
  js_free(parse_json(&out));
  rpt_free(&out);
}

static int count_lines(const char *text, const char *part) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, part)) != NULL; p += strlen(part)) n++;
  return n;
}

static void text_missing_counts(void) {
  job_t j;
  job_make(&j, PEER_DEAD, "node-1");
  j.procs[1].fresh = 0; /* ranks 4-5 missing too, from a process that is alive but did not answer */
  ras_view_t v = {.procs = j.procs, .nprocs = 3};
  rpt_t out = {0};
  report_text(&v, 0, &out);
  EXPECT(out.data != NULL);
  EXPECT(strstr(out.data, "Missing communicator data from 4 ranks\n") != NULL, "%s", out.data);
  EXPECT(count_lines(out.data, "  Rank ") >= 4 && strstr(out.data, "  Rank 4 -- ") &&
         strstr(out.data, "  Rank 7 -- "));
  EXPECT(strstr(out.data, "  Rank 3 -- ") == NULL, "a rank that answered is listed missing");
  EXPECT(strstr(out.data, "Missing communicator data from 1 job process\n") != NULL, "%s", out.data);
  EXPECT(strstr(out.data, "1 job process is considered dead") != NULL, "%s", out.data);
  EXPECT(strstr(out.data, "INCOMPLETE") != NULL && strstr(out.data, "(null)") == NULL);
  rpt_free(&out);
}

/* "ranks 0-6 wait in AllReduce #641 for rank 7, which has launched only up to #640 and waits in AllGather
 * #12 of communicator B". */
static void verdict_words(void) {
  ras_rec_t a[8], b[2];
  for (int r = 0; r < 8; r++) {
    a[r] = rec(0xa, r, 8, r < 7 ? 642 : 641);
    a[r].launched = r < 7 ? 642 : 641;
    if (r < 7)
      a[r].now = (ras_wait_t){.kind = RAS_OP_ALLREDUCE,
                              .peer = (r + 7) % 8,
                              .channel = -1,
                              .step = 0,
                              .seq = 641,
                              .bytes = 4096,
                              .waited_ms = 30000};
  }
  b[0] = rec(0xb, 0, 2, 13);
  b[0].now = (ras_wait_t){
      .kind = RAS_OP_ALLGATHER, .peer = 1, .channel = -1, .step = 0, .seq = 12, .waited_ms = 31000};
  snprintf(b[0].name, sizeof b[0].name, "B");
  b[1] = rec(0xb, 1, 2, 12);
  view_proc_t procs[3] = {
      {.proc = {.id = peer_id(0, "n0"), .nrecs = 7, .recs = a}, .state = PEER_SELF, .fresh = 1},
      {.proc = {.id = peer_id(1, "n1"), .nrecs = 1, .recs = &a[7]}, .state = PEER_ALIVE, .fresh = 1},
      {.proc = {.id = peer_id(2, "n2"), .nrecs = 2, .recs = b}, .state = PEER_ALIVE, .fresh = 1}};
  /* rank 7 of A runs in the process of rank 0 of B */
  procs[1].proc.nrecs = 2;
  ras_rec_t both[2] = {a[7], b[0]};
  procs[1].proc.recs = both;
  procs[2].proc.nrecs = 1;
  procs[2].proc.recs = &b[1];
  ras_view_t v = {.procs = procs, .nprocs = 3};
  rpt_t out = {0};
  report_verdict(&v, &out);
  EXPECT(out.data != NULL);
  EXPECT(strstr(out.data,
                "comm 000000000000000a: ranks 0-6 wait in AllReduce #641 for rank 7 (process 1001 on n1), "
                "which has launched only up to #640 and waits in AllGather #12 of B for rank 1 (31 s)") !=
             NULL,
         "verdict: %s", out.data);
  EXPECT(strstr(out.data, "B: rank 0 waits in AllGather #12 for rank 1") != NULL, "verdict: %s", out.data);
  rpt_free(&out);
  /* nobody behind: all in one call */
  a[7] = a[6];
  a[7].rank = 7;
  both[0] = a[7];
  b[0].now.kind = -1;
  both[1] = b[0];
  report_verdict(&v, &out);
  EXPECT(out.data != NULL &&
             strstr(out.data, "ranks 0-7 wait in AllReduce #641 for each other (no rank is behind)") != NULL,
         "verdict: %s", out.data);
  rpt_free(&out);
}

/* ---- The registry under change ---- */

static atomic_int churn_stop;
static alloc_acct_t churn_acct;

/* Makes and retires records in every state, as inits, splits, failures and destroys do. */
static void *churn(void *arg) {
  uint64_t base = (uint64_t)(uintptr_t)arg << 32;
  ras_peer_t peers[4];
  for (int i = 0; i < 4; i++) peers[i] = peer_id(100 + i, "p");
  for (uint64_t i = 0; !atomic_load(&churn_stop); i++) {
    ras_comm_t *rc;
    ras_peer_t self;
    ras_comm_info_t info = {.nonce = base + i,
                            .rank = (int)(i % 4),
                            .nranks = 4,
                            .dev = -1,
                            .name = "churn",
                            .acct = &churn_acct};
    ras_comm_join(&info, &rc, &self);
    EXPECT(rc != NULL, "monitoring is on");
    if (i % 3 != 0) ras_comm_peers(rc, peers);
    if (i % 3 == 1) ras_comm_ready(rc);
    if (i % 5 == 0) ras_comm_error(rc, ncclRemoteError, i % 3 == 0);
    ras_wait_t w = {.kind = (int)(i % RAS_OPS), .peer = (int)(i % 4), .channel = -1, .step = 0, .seq = i};
    ras_comm_launch(rc, (int)(i % RAS_OPS), i, (int)(i & 1));
    ras_comm_wait(rc, &w, 1.0);
    ras_comm_idle(rc);
    if (i % 7 == 0) ras_comm_aborting(rc);
    ras_comm_retire(rc);
  }
  return NULL;
}

static void registry_churn(void) {
  rt_use_port(0);
  ras_comm_t *keep[3];
  ras_peer_t self, peers[4];
  for (int i = 0; i < 4; i++) peers[i] = peer_id(200 + i, "q");
  for (int i = 0; i < 3; i++) {
    ras_comm_info_t info = {.nonce = 0x5000 + (uint64_t)i, .rank = 1, .nranks = 4, .dev = -1, .name = "keep"};
    ras_comm_join(&info, &keep[i], &self);
    if (i > 0) ras_comm_peers(keep[i], peers);
    if (i == 2) ras_comm_ready(keep[i]);
  }
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1));
  for (int q = 0; q < 3000; q++) {
    ras_proc_t proc;
    EXPECT(ras_local_snapshot(&proc, q & 1) == 0);
    int kept = 0;
    for (uint32_t i = 0; i < proc.nrecs; i++) {
      const ras_rec_t *r = &proc.recs[i];
      EXPECT(r->rank >= 0 && r->rank < r->nranks && r->state <= RAS_ST_ABORTED, "record %u", i);
      if (r->nonce >= 0x5000 && r->nonce < 0x5003) {
        kept++;
        EXPECT(r->state == (r->nonce == 0x5002 ? RAS_ST_RUNNING : RAS_ST_INIT), "state %d", r->state);
        EXPECT((r->root_pid != 0) == (r->nonce != 0x5000), "peer table seen only once published");
      }
    }
    EXPECT(kept == 3, "a snapshot listed %d of the 3 lasting records", kept);
    free(proc.recs);
    char line[1024];
    ras_verdict(line, sizeof line);
  }
  atomic_store(&churn_stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 3; i++) ras_comm_retire(keep[i]);
}

/* ---- Peers that come, talk and vanish ---- */

static sock_addr_t mesh_addr;
static atomic_int peers_done;

static int dial_mesh(void) {
  int fd = socket(mesh_addr.sa.sa_family, SOCK_STREAM, 0);
  socklen_t len = mesh_addr.sa.sa_family == AF_INET ? sizeof mesh_addr.sin : sizeof mesh_addr.sin6;
  EXPECT(fd >= 0 && connect(fd, &mesh_addr.sa, len) == 0, "connect to the mesh");
  return fd;
}

/* 60 fake processes each say HELLO (with the job's proof) and a keep-alive, then vanish without a BYE: the
 * monitor must add, lose and bury each one (their addresses refuse connections) while status runs. */
static void *fake_peers(void *arg) {
  uint64_t job = *(uint64_t *)arg;
  for (int i = 0; i < 60; i++) {
    ras_peer_t fake = peer_id(i, i % 2 ? "fake\"peer" : "fake");
    fake.addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fake.addr.sin.sin_port = htons((uint16_t)rt_free_port());
    ras_rec_t r = rec(job, 1 + i % 3, 4, (uint64_t)i);
    ras_proc_t proc = {.id = fake, .nrecs = 1, .recs = &r};
    wire_buf_t b = {0};
    wire_put_hello(&b, job, &fake);
    wire_put_snapshot(&b, WIRE_KEEPALIVE, 0, &proc, 1);
    int fd = dial_mesh();
    EXPECT(send(fd, b.data, b.len, MSG_NOSIGNAL) == (ssize_t)b.len);
    usleep(i % 4 == 0 ? 50000 : 2000);
    close(fd);
    wire_buf_free(&b);
  }
  /* one that does not know the job, and one that sends garbage: refused, nothing added */
  ras_peer_t stranger = peer_id(99, "stranger");
  wire_buf_t b = {0};
  wire_put_hello(&b, 0xdeadbeef, &stranger);
  int fd = dial_mesh();
  EXPECT(send(fd, b.data, b.len, MSG_NOSIGNAL) == (ssize_t)b.len);
  char junk[64];
  memset(junk, 0x5a, sizeof junk);
  int fd2 = dial_mesh();
  EXPECT(send(fd2, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk);
  usleep(200000);
  close(fd);
  close(fd2);
  wire_buf_free(&b);
  atomic_store(&peers_done, 1);
  return NULL;
}

static void *verdicts(void *arg) {
  (void)arg;
  char line[2048];
  while (!atomic_load(&peers_done)) ras_verdict(line, sizeof line);
  return NULL;
}

static void peer_churn(void) {
  int port = rt_free_port();
  rt_use_port(port);
  ras_comm_t *rc;
  ras_comm_info_t info = {.nonce = 0x10b, .rank = 0, .nranks = 4, .dev = -1, .name = "churn"};
  ras_peer_t self;
  ras_comm_join(&info, &rc, &self);
  EXPECT(rc != NULL && self.addr.sa.sa_family != 0);
  mesh_addr = self.addr;
  int mon = rt_connect(port, 10);
  EXPECT(mon >= 0);
  const char *cmd = "CLIENT PROTOCOL 2\nMONITOR all\n";
  EXPECT(send(mon, cmd, strlen(cmd), MSG_NOSIGNAL) == (ssize_t)strlen(cmd));
  char line[4096];
  EXPECT(rt_line(mon, line, sizeof line, 10) > 0 && strcmp(line, "SERVER PROTOCOL 2\n") == 0, "%s", line);
  EXPECT(rt_line(mon, line, sizeof line, 10) > 0 && strcmp(line, "OK\n") == 0, "%s", line);
  uint64_t job = info.nonce;
  pthread_t t[2];
  pthread_create(&t[0], NULL, fake_peers, &job);
  pthread_create(&t[1], NULL, verdicts, NULL);
  int reports = 0;
  while (!atomic_load(&peers_done) || reports < 5) {
    char err[160];
    char *s = rt_status(port, reports & 1, 0, 20, err, sizeof err);
    EXPECT(s != NULL, "status: %s", err);
    if (reports & 1) {
      js_t *doc = js_parse(s, strlen(s), err, sizeof err);
      EXPECT(doc != NULL, "invalid JSON during peer churn: %s", err);
      js_free(doc);
    }
    free(s);
    reports++;
  }
  pthread_join(t[0], NULL);
  pthread_join(t[1], NULL);
  /* every fake process was new once and dead once; the stranger never appeared */
  int news = 0, deads = 0;
  while ((news < 60 || deads < 60) && rt_line(mon, line, sizeof line, 15) > 0) {
    news += strstr(line, "] PEER_NEW: Process ") != NULL;
    deads += strstr(line, "] PEER_DEAD: Process ") != NULL;
    EXPECT(strstr(line, "stranger") == NULL, "a process without the job's proof was let in: %s", line);
  }
  EXPECT(news == 60 && deads == 60, "%d PEER_NEW and %d PEER_DEAD events for 60 processes that died", news,
         deads);
  close(mon);
  ras_comm_retire(rc);
}

/* ---- The client protocol's limits on a live monitor ---- */

static int say(int fd, const char *s, size_t n) {
  return send(fd, s, n, MSG_NOSIGNAL) == (ssize_t)n;
}

static void client_limits(void) {
  int port = rt_free_port();
  setenv("BRAID_RAS_MAX_CLIENTS", "6", 1);
  setenv("BRAID_RAS_CLIENT_TIMEOUT_S", "2", 1);
  rt_use_port(port);
  ncclUniqueId id;
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));
  char line[4096];
  /* answers as NCCL's server gives them */
  int fd = rt_connect(port, 10);
  const char *cmds = "CLIENT PROTOCOL 2\nTIMEOUT 3\nTIMEOUT x\nSET FORMAT yaml\nHELLO\n";
  EXPECT(say(fd, cmds, strlen(cmds)));
  static const char *const want[] = {"SERVER PROTOCOL 2\n", "OK\n", "ERROR: Invalid timeout value x\n",
                                     "ERROR: Invalid format yaml\n", "ERROR: Unknown command HELLO\n"};
  for (int i = 0; i < 5; i++)
    EXPECT(rt_line(fd, line, sizeof line, 10) > 0 && strcmp(line, want[i]) == 0, "answer %d: %s", i, line);
  /* a line over the limit: one error, then the end */
  char big[3000];
  memset(big, 'x', sizeof big);
  EXPECT(say(fd, big, sizeof big));
  EXPECT(rt_line(fd, line, sizeof line, 10) > 0 && strstr(line, "ERROR: line longer than 1023 bytes") == line,
         "%s", line);
  EXPECT(rt_line(fd, line, sizeof line, 10) == 0, "the connection stays open after an over-long line");
  close(fd);
  /* too many bad commands */
  fd = rt_connect(port, 10);
  for (int i = 0; i < CLIENT_MAX_ERRORS + 4; i++) say(fd, "nonsense\n", 9);
  int errors = 0, n;
  while ((n = rt_line(fd, line, sizeof line, 10)) > 0) errors++;
  EXPECT(n == 0 && errors == CLIENT_MAX_ERRORS + 1, "%d answers before the close", errors);
  close(fd);
  /* a client that stalls mid-line is told why and closed */
  fd = rt_connect(port, 10);
  say(fd, "STAT", 4);
  EXPECT(rt_line(fd, line, sizeof line, 10) > 0 && strstr(line, "ERROR: no command within") == line, "%s",
         line);
  close(fd);
  /* clients over the limit get one error line; those within it are still served */
  int held[6];
  for (int i = 0; i < 6; i++) held[i] = rt_connect(port, 10);
  usleep(300000);
  fd = rt_connect(port, 10);
  EXPECT(rt_line(fd, line, sizeof line, 10) > 0 && strstr(line, "ERROR: too many clients") == line, "%s",
         line);
  close(fd);
  EXPECT(say(held[0], "CLIENT PROTOCOL 2\n", 18) && rt_line(held[0], line, sizeof line, 10) > 0);
  for (int i = 0; i < 6; i++) close(held[i]);
  usleep(300000);
  /* a flood of commands from a client that reads nothing does not stop others from getting a status */
  int flood = rt_connect(port, 10);
  char burst[18 * 1000];
  for (int i = 0; i < 1000; i++) memcpy(burst + 18 * i, "CLIENT PROTOCOL 2\n", 18);
  for (int i = 0; i < 20; i++) send(flood, burst, sizeof burst, MSG_NOSIGNAL | MSG_DONTWAIT);
  char err[160];
  char *s = rt_status(port, 1, 0, 10, err, sizeof err);
  EXPECT(s != NULL, "status beside a flood: %s", err);
  js_t *doc = js_parse(s, strlen(s), err, sizeof err);
  EXPECT(doc != NULL, "%s", err);
  const js_t *comms = js_get_type(doc, "communicators", JS_ARR);
  EXPECT(comms != NULL && comms->n == 1 && js_get_type(&comms->items[0], "size", JS_NUM)->num == 1);
  js_free(doc);
  free(s);
  close(flood);
  EXPECT_OK(ncclCommDestroy(comm));
}

int main(int argc, char **argv) {
  test_filter(argc - 1, argv + 1);
  TEST(wire_round_trip, 60);
  TEST(wire_refusals, 60);
  TEST(proto_parse, 30);
  TEST(json_missing_valid, 30);
  TEST(text_missing_counts, 30);
  TEST(verdict_words, 30);
  TEST(registry_churn, 300);
  TEST(peer_churn, 300);
  TEST(client_limits, 120);
  return test_summary();
}
