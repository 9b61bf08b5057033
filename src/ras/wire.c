/*
 * Snapshots and peer messages on the wire (see wire.h).
 */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

static const char *const op_names[RAS_OPS] = {
    [RAS_OP_ALLREDUCE] = "AllReduce",
    [RAS_OP_BROADCAST] = "Broadcast",
    [RAS_OP_REDUCE] = "Reduce",
    [RAS_OP_ALLGATHER] = "AllGather",
    [RAS_OP_REDUCESCATTER] = "ReduceScatter",
    [RAS_OP_ALLTOALL] = "AlltoAll",
    [RAS_OP_GATHER] = "Gather",
    [RAS_OP_SCATTER] = "Scatter",
    [RAS_OP_SEND] = "Send",
    [RAS_OP_RECV] = "Recv",
};

const char *ras_op_name(int kind) {
  return kind >= 0 && kind < RAS_OPS ? op_names[kind] : "?";
}

/* ---- Encoding ---- */

void wire_buf_free(wire_buf_t *b) {
  free(b->data);
  *b = (wire_buf_t){0};
}

static void put(wire_buf_t *b, const void *p, size_t n) {
  if (b->failed) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    char *d = realloc(b->data, cap);
    if (d == NULL) {
      b->failed = 1;
      return;
    }
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

static void put_u8(wire_buf_t *b, uint8_t v) {
  put(b, &v, 1);
}
static void put_u16(wire_buf_t *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  put(b, x, 2);
}
static void put_u32(wire_buf_t *b, uint32_t v) {
  uint8_t x[4];
  for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
  put(b, x, 4);
}
static void put_u64(wire_buf_t *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  put(b, x, 8);
}
static void put_str(wire_buf_t *b, const char *s, size_t max) {
  size_t n = strnlen(s, max - 1);
  put_u16(b, (uint16_t)n);
  put(b, s, n);
}

/* Starts a message; returns the offset of its header, whose length end_msg fills in. */
static size_t begin_msg(wire_buf_t *b, wire_type_t type) {
  size_t at = b->len;
  put_u32(b, WIRE_MAGIC);
  put_u16(b, WIRE_VERSION);
  put_u16(b, (uint16_t)type);
  put_u32(b, 0);
  return at;
}

static void end_msg(wire_buf_t *b, size_t at) {
  if (b->failed) return;
  uint32_t len = (uint32_t)(b->len - at - WIRE_HEADER);
  for (int i = 0; i < 4; i++) b->data[at + 8 + i] = (char)(uint8_t)(len >> (8 * i));
}

static void put_addr(wire_buf_t *b, const sock_addr_t *a) {
  uint8_t ip[16] = {0};
  uint16_t port = 0, family = 0;
  if (a->sa.sa_family == AF_INET) {
    family = 4;
    memcpy(ip, &a->sin.sin_addr, 4);
    port = ntohs(a->sin.sin_port);
  } else if (a->sa.sa_family == AF_INET6) {
    family = 6;
    memcpy(ip, &a->sin6.sin6_addr, 16);
    port = ntohs(a->sin6.sin6_port);
  }
  put_u16(b, family);
  put_u16(b, port);
  put(b, ip, 16);
}

static void put_peer(wire_buf_t *b, const ras_peer_t *p) {
  put_addr(b, &p->addr);
  put_u32(b, (uint32_t)p->pid);
  put_u64(b, p->devs);
  put_u64(b, p->host_hash);
  put_str(b, p->host, RAS_HOST_MAX);
}

static void put_wait(wire_buf_t *b, const ras_wait_t *w) {
  put_u32(b, (uint32_t)w->kind);
  put_u32(b, (uint32_t)w->peer);
  put_u32(b, (uint32_t)w->channel);
  put_u32(b, (uint32_t)w->step);
  put_u8(b, (uint8_t)(w->is_send != 0));
  put_u64(b, w->seq);
  put_u64(b, w->bytes);
  put_u64(b, w->done);
  put_u64(b, w->waited_ms);
}

static void put_rec(wire_buf_t *b, const ras_rec_t *r, int brief) {
  put_u64(b, r->nonce);
  put_u64(b, r->root_host);
  put_u32(b, (uint32_t)r->root_pid);
  put_u32(b, (uint32_t)r->rank);
  put_u32(b, (uint32_t)r->nranks);
  put_u32(b, (uint32_t)r->dev);
  put_u8(b, (uint8_t)r->state);
  put_u32(b, (uint32_t)r->init_state);
  put_u32(b, (uint32_t)r->async_error);
  put_u64(b, r->launched);
  put_u64(b, r->colls);
  put_wait(b, &r->now);
  if (brief) return;
  for (int k = 0; k < RAS_OPS; k++) {
    put_u64(b, r->counts[k][0]);
    put_u64(b, r->counts[k][1]);
  }
  put_u64(b, r->host_bytes);
  put_u64(b, r->dev_bytes);
  put_u64(b, r->peak_bytes);
  put_str(b, r->name, RAS_NAME_MAX);
}

void wire_put_hello(wire_buf_t *b, uint64_t job, const ras_peer_t *self) {
  size_t at = begin_msg(b, WIRE_HELLO);
  put_u64(b, job);
  put_peer(b, self);
  end_msg(b, at);
}

void wire_put_snapshot(wire_buf_t *b, wire_type_t type, uint64_t id, const ras_proc_t *proc, int brief) {
  size_t at = begin_msg(b, type);
  put_u64(b, id);
  put_u8(b, (uint8_t)(brief != 0));
  put_peer(b, &proc->id);
  put_u32(b, proc->nrecs);
  for (uint32_t i = 0; i < proc->nrecs; i++) put_rec(b, &proc->recs[i], brief);
  end_msg(b, at);
}

void wire_put_request(wire_buf_t *b, uint64_t id) {
  size_t at = begin_msg(b, WIRE_REQUEST);
  put_u64(b, id);
  end_msg(b, at);
}

void wire_put_bye(wire_buf_t *b) {
  end_msg(b, begin_msg(b, WIRE_BYE));
}

/* ---- Decoding ---- */

/* A read cursor; `bad` is set once anything is out of bounds, after which every read gives 0. */
typedef struct {
  const uint8_t *p;
  size_t left;
  int bad;
} rd_t;

static const uint8_t *take(rd_t *r, size_t n) {
  if (r->bad || r->left < n) {
    r->bad = 1;
    return NULL;
  }
  const uint8_t *p = r->p;
  r->p += n;
  r->left -= n;
  return p;
}

static uint64_t get_n(rd_t *r, int n) {
  const uint8_t *p = take(r, (size_t)n);
  uint64_t v = 0;
  for (int i = 0; p != NULL && i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}
#define get_u8(r)  ((uint8_t)get_n((r), 1))
#define get_u16(r) ((uint16_t)get_n((r), 2))
#define get_u32(r) ((uint32_t)get_n((r), 4))
#define get_u64(r) get_n((r), 8)

/* A string of at most max - 1 bytes; bytes outside printable ASCII become '?'. */
static void get_str(rd_t *r, char *out, size_t max) {
  uint16_t n = get_u16(r);
  const uint8_t *p = n < max ? take(r, n) : NULL;
  if (p == NULL) {
    r->bad = 1;
    out[0] = '\0';
    return;
  }
  for (uint16_t i = 0; i < n; i++) out[i] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
  out[n] = '\0';
}

static void get_addr(rd_t *r, sock_addr_t *a) {
  uint16_t family = get_u16(r), port = get_u16(r);
  const uint8_t *ip = take(r, 16);
  memset(a, 0, sizeof *a);
  if (ip == NULL) return;
  if (family == 4) {
    a->sin.sin_family = AF_INET;
    a->sin.sin_port = htons(port);
    memcpy(&a->sin.sin_addr, ip, 4);
  } else if (family == 6) {
    a->sin6.sin6_family = AF_INET6;
    a->sin6.sin6_port = htons(port);
    memcpy(&a->sin6.sin6_addr, ip, 16);
  } else {
    r->bad = 1;
  }
}

static void get_peer(rd_t *r, ras_peer_t *p) {
  get_addr(r, &p->addr);
  p->pid = (int32_t)get_u32(r);
  p->devs = get_u64(r);
  p->host_hash = get_u64(r);
  get_str(r, p->host, RAS_HOST_MAX);
}

static int valid_i32(int32_t v, int32_t lo, int32_t hi) {
  return v >= lo && v <= hi;
}

static void get_wait(rd_t *r, ras_wait_t *w) {
  w->kind = (int32_t)get_u32(r);
  w->peer = (int32_t)get_u32(r);
  w->channel = (int32_t)get_u32(r);
  w->step = (int32_t)get_u32(r);
  w->is_send = get_u8(r) != 0;
  w->seq = get_u64(r);
  w->bytes = get_u64(r);
  w->done = get_u64(r);
  w->waited_ms = get_u64(r);
  if (!valid_i32(w->kind, -1, RAS_OPS - 1) || !valid_i32(w->peer, -1, RAS_MAX_RANKS - 1) ||
      !valid_i32(w->channel, -1, 1 << 16) || !valid_i32(w->step, -1, 1 << 30))
    r->bad = 1;
}

static void get_rec(rd_t *r, ras_rec_t *x, int brief) {
  memset(x, 0, sizeof *x);
  x->nonce = get_u64(r);
  x->root_host = get_u64(r);
  x->root_pid = (int32_t)get_u32(r);
  x->rank = (int32_t)get_u32(r);
  x->nranks = (int32_t)get_u32(r);
  x->dev = (int32_t)get_u32(r);
  x->state = get_u8(r);
  x->init_state = (int32_t)get_u32(r);
  x->async_error = (int32_t)get_u32(r);
  x->launched = get_u64(r);
  x->colls = get_u64(r);
  get_wait(r, &x->now);
  if (!valid_i32(x->nranks, 1, RAS_MAX_RANKS) || !valid_i32(x->rank, 0, x->nranks - 1) ||
      !valid_i32(x->dev, -1, 63) || x->state > RAS_ST_ABORTED || !valid_i32(x->init_state, 0, 64) ||
      !valid_i32(x->async_error, 0, 64) || x->now.peer >= x->nranks)
    r->bad = 1;
  if (brief) return;
  for (int k = 0; k < RAS_OPS; k++) {
    x->counts[k][0] = get_u64(r);
    x->counts[k][1] = get_u64(r);
  }
  x->host_bytes = get_u64(r);
  x->dev_bytes = get_u64(r);
  x->peak_bytes = get_u64(r);
  get_str(r, x->name, RAS_NAME_MAX);
}

/* The fewest bytes a record takes on the wire: bounds how many a payload can hold. */
#define REC_MIN_BYTES 80

static int get_snapshot(rd_t *r, wire_msg_t *m) {
  m->id = get_u64(r);
  int brief = get_u8(r);
  get_peer(r, &m->proc.id);
  uint32_t n = get_u32(r);
  if (r->bad || brief > 1 || n > RAS_MAX_RECS || n > r->left / REC_MIN_BYTES) return -1;
  m->proc.nrecs = n;
  m->proc.recs = n > 0 ? calloc(n, sizeof *m->proc.recs) : NULL;
  if (n > 0 && m->proc.recs == NULL) return -1;
  for (uint32_t i = 0; i < n && !r->bad; i++) get_rec(r, &m->proc.recs[i], brief);
  if (r->bad) {
    free(m->proc.recs);
    m->proc.recs = NULL;
    return -1;
  }
  return 0;
}

int wire_frame(const void *hdr, uint32_t *len_p) {
  rd_t r = {.p = hdr, .left = WIRE_HEADER};
  uint32_t magic = get_u32(&r);
  uint16_t version = get_u16(&r);
  uint16_t type = get_u16(&r);
  uint32_t len = get_u32(&r);
  if (magic != WIRE_MAGIC || version != WIRE_VERSION || type < WIRE_HELLO || type > WIRE_BYE ||
      len > WIRE_MAX_PAYLOAD)
    return 0;
  *len_p = len;
  return 1;
}

int wire_decode(const void *hdr, const void *payload, size_t len, wire_msg_t *msg) {
  uint32_t want;
  memset(msg, 0, sizeof *msg);
  if (!wire_frame(hdr, &want) || want != len) return -1;
  msg->type = (wire_type_t)((const uint8_t *)hdr)[6];
  rd_t r = {.p = payload, .left = len};
  switch (msg->type) {
  case WIRE_HELLO:
    msg->job = get_u64(&r);
    get_peer(&r, &msg->proc.id);
    break;
  case WIRE_KEEPALIVE:
  case WIRE_REPLY:
    if (get_snapshot(&r, msg) != 0) return -1;
    break;
  case WIRE_REQUEST:
    msg->id = get_u64(&r);
    break;
  case WIRE_BYE:
    break;
  }
  if (r.bad || r.left != 0) {
    wire_msg_free(msg);
    return -1;
  }
  return 0;
}

void wire_msg_free(wire_msg_t *msg) {
  free(msg->proc.recs);
  msg->proc.recs = NULL;
  msg->proc.nrecs = 0;
}

int wire_addr_eq(const sock_addr_t *a, const sock_addr_t *b) {
  if (a->sa.sa_family != b->sa.sa_family) return 0;
  if (a->sa.sa_family == AF_INET)
    return a->sin.sin_port == b->sin.sin_port && a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr;
  if (a->sa.sa_family == AF_INET6)
    return a->sin6.sin6_port == b->sin6.sin6_port &&
           memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, sizeof a->sin6.sin6_addr) == 0;
  return 0;
}
