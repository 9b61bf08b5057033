/*
 * NCCL's RAS client protocol (see client.h). Everything here runs on the monitor thread.
 */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "base/timeutil.h"
#include "ras/proto.h"

#define MAX_LISTEN      4   /* addresses NCCL_RAS_ADDR resolves to that are bound */
#define BIND_RETRY_S    5.0 /* another process of the node serves the address: try again this often */
#define QUERY_TIMEOUT_S 5.0 /* a query's default timeout (times NCCL_RAS_TIMEOUT_FACTOR), as NCCL's */
#define REFUSE_PER_S    20  /* clients over the limit answered per second (the others wait in the backlog) */
#define LINES_PER_POLL  16  /* command lines of one client handled per poll */

/* ---- Clients ---- */

/* The mesh's side, given at client_start (the mesh drives this module from its thread). */
static void (*start_query)(double timeout_s);
static double timeout_factor = 1.0;

typedef enum { C_CMD, C_QUERY, C_CLOSING } cstate_t;

typedef struct client {
  struct client *next;
  int fd;
  cstate_t state;
  int json, verbose, errors;
  long mask;              /* MONITOR groups (0: not monitoring) */
  double query_timeout_s; /* TIMEOUT */
  char in[CLIENT_LINE_MAX];
  size_t in_len;
  rpt_t out;
  size_t out_off;
  double deadline; /* C_CMD: a command by then; with output queued: some of it read by then */
  double queued;   /* C_QUERY: when it asked (answers go in that order) */
} client_t;

static struct {
  int listen_fd[MAX_LISTEN];
  int nlisten;
  double next_bind;
  int bind_warned;
  client_t *clients;
  int nclients;
  double refuse_second;
  int refused_this_second;
  ras_view_t last;    /* the last query's view */
  double last_time;   /* when it ended (0: none) */
  rpt_t renders[3];   /* the last view as text, verbose text and JSON, made on demand */
  double tokens;      /* status answers that may go now (budget) */
  double budget_time; /* when the bucket was last filled */
} cs = {.nlisten = 0};

/* ---- The listener ---- */

/* Splits NCCL_RAS_ADDR into host and port ("host:port", "[v6]:port"). */
static int split_addr(const char *spec, char *host, size_t hsize, char *port, size_t psize) {
  const char *colon = spec[0] == '[' ? strstr(spec, "]:") : strrchr(spec, ':');
  if (colon == NULL) return -1;
  const char *h = spec[0] == '[' ? spec + 1 : spec;
  size_t hl = (size_t)(colon - h);
  const char *p = colon + (spec[0] == '[' ? 2 : 1);
  if (hl == 0 || hl >= hsize || strlen(p) == 0 || strlen(p) >= psize) return -1;
  memcpy(host, h, hl);
  host[hl] = '\0';
  snprintf(port, psize, "%s", p);
  return 0;
}

/* Binds every address NCCL_RAS_ADDR resolves to. An address in use means another process of the node serves
 * it: that is normal, and this process tries again later in case that one exits. */
static void try_bind(double now) {
  const char *spec = param_str(P_NCCL_RAS_ADDR);
  char host[256], port[32];
  cs.next_bind = now + BIND_RETRY_S;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  int rc = split_addr(spec, host, sizeof host, port, sizeof port) != 0
               ? EAI_NONAME
               : getaddrinfo(host, port, &hints, &res);
  if (rc != 0) {
    if (!cs.bind_warned++)
      WARN("RAS: NCCL_RAS_ADDR=\"%s\" is not a usable host:port; no client can connect", spec);
    cs.next_bind = 0;
    return;
  }
  int in_use = 0;
  for (struct addrinfo *ai = res; ai != NULL && cs.nlisten < MAX_LISTEN; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      cs.listen_fd[cs.nlisten++] = fd;
      continue;
    }
    in_use |= errno == EADDRINUSE;
    if (errno != EADDRINUSE && !cs.bind_warned++)
      INFO(LOG_RAS, "RAS: cannot listen for clients on %s: %s", spec, strerror(errno));
    close(fd);
  }
  freeaddrinfo(res);
  if (cs.nlisten > 0) {
    cs.next_bind = 0;
    INFO(LOG_RAS | LOG_INIT, "RAS: answering clients on %s", spec);
  } else if (in_use) {
    TRACE(LOG_RAS, "RAS: %s is served by another process of this node", spec);
  }
}

void client_start(void (*query)(double timeout_s), double factor) {
  start_query = query;
  timeout_factor = factor;
  try_bind(time_now());
}

/* ---- Output ---- */

static void send_out(client_t *c, double now) {
  while (c->out_off < c->out.len) {
    ssize_t n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      c->state = C_CLOSING; /* the client went away: drop what is left */
      c->out_off = c->out.len;
      return;
    }
    c->out_off += (size_t)n;
    c->deadline = now + (double)param_int(P_BRAID_RAS_CLIENT_TIMEOUT_S);
  }
  c->out.len = c->out_off = 0;
}

static void reply(client_t *c, const char *text, size_t len, double now) {
  if (c->out.len - c->out_off + len > CLIENT_OUT_MAX) {
    c->state = C_CLOSING; /* it reads nothing of what it asked for */
    c->out.len = c->out_off = 0;
    return;
  }
  if (c->out_off == c->out.len) {
    c->out.len = c->out_off = 0;
    c->deadline = now + (double)param_int(P_BRAID_RAS_CLIENT_TIMEOUT_S);
  }
  rpt_printf(&c->out, "%.*s", (int)len, text);
  if (c->out.failed) c->state = C_CLOSING;
}

/* The last view in the client's format, rendered once per format. */
static const rpt_t *render(int json, int verbose) {
  int k = json ? 2 : verbose;
  rpt_t *r = &cs.renders[k];
  if (r->len == 0 && !r->failed) {
    if (json)
      report_json(&cs.last, r);
    else
      report_text(&cs.last, verbose, r);
  }
  return r;
}

/* Answers a STATUS from the last view; the connection then closes (the end of a report). */
static void answer_status(client_t *c, double now) {
  const rpt_t *r = render(c->json, c->verbose);
  if (r->len > 0) reply(c, r->data, r->len, now);
  if (r->failed) reply(c, "ERROR: out of memory writing the report\n", 40, now);
  c->state = C_CLOSING;
}

/* Whether a status answer may go now: a token bucket of BRAID_RAS_MAX_STATUS_PER_S answers a second, a tenth
 * of a second's worth at once at most, so that clients over the rate wait a little each, not a second. */
static int budget(double now) {
  int64_t rate = param_int(P_BRAID_RAS_MAX_STATUS_PER_S);
  if (rate <= 0) return 1;
  double burst = rate / 10.0 > 1 ? rate / 10.0 : 1;
  cs.tokens += (now - cs.budget_time) * (double)rate;
  if (cs.tokens > burst) cs.tokens = burst;
  cs.budget_time = now;
  if (cs.tokens < 1) return 0;
  cs.tokens -= 1;
  return 1;
}

/* Serves waiting clients from the last view while it is young enough and the budget lasts; otherwise starts
 * a query (which joins the one in flight, if any). */
static void serve_waiting(double now) {
  double young = (double)param_int(P_BRAID_RAS_MIN_QUERY_MS) * 1e-3;
  int want_query = 0;
  double timeout = 0;
  for (client_t *c = cs.clients; c != NULL; c = c->next) {
    if (c->state != C_QUERY) continue;
    if (cs.last_time > 0 && now - cs.last_time <= young && c->queued <= cs.last_time + young) {
      if (!budget(now)) return;
      answer_status(c, now);
      send_out(c, now);
    } else {
      want_query = 1;
      if (c->query_timeout_s > timeout) timeout = c->query_timeout_s;
    }
  }
  if (want_query) start_query(timeout);
}

void client_query_done(ras_view_t *view) {
  view_free(&cs.last);
  cs.last = *view;
  *view = (ras_view_t){0};
  cs.last_time = time_now();
  for (int k = 0; k < 3; k++) rpt_free(&cs.renders[k]);
  /* the clients that waited for it are served first */
  double now = cs.last_time;
  for (client_t *c = cs.clients; c != NULL; c = c->next)
    if (c->state == C_QUERY && c->queued <= now && budget(now)) {
      answer_status(c, now);
      send_out(c, now);
    }
}

/* ---- Commands ---- */

static void command(client_t *c, const char *line, size_t len, double now) {
  client_cmd_t cmd;
  client_parse(line, len, &cmd);
  char buf[64];
  switch (cmd.kind) {
  case CMD_EMPTY:
    return;
  case CMD_PROTOCOL:
    snprintf(buf, sizeof buf, "SERVER PROTOCOL %d\n", RAS_CLIENT_PROTOCOL);
    reply(c, buf, strlen(buf), now);
    return;
  case CMD_TIMEOUT:
    c->query_timeout_s = (double)cmd.value; /* 0: no timeout (the mesh's query still bounds it) */
    reply(c, "OK\n", 3, now);
    return;
  case CMD_FORMAT:
    c->json = (int)cmd.value;
    reply(c, "OK\n", 3, now);
    return;
  case CMD_MONITOR:
    c->mask = cmd.value;
    reply(c, "OK\n", 3, now);
    return;
  case CMD_STATUS:
    c->verbose = (int)cmd.value;
    c->state = C_QUERY;
    c->queued = now;
    return;
  case CMD_ERROR:
    reply(c, cmd.error, strlen(cmd.error), now);
    if (++c->errors >= CLIENT_MAX_ERRORS) {
      const char *bye = "ERROR: too many bad commands; closing\n";
      reply(c, bye, strlen(bye), now);
      c->state = C_CLOSING;
    }
    return;
  }
}

/* Reads a client's lines while it waits for nothing (a client is read only once its answers are out). */
static void client_input(client_t *c, double now) {
  if (c->state != C_CMD) return;
  ssize_t n = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    c->state = C_CLOSING;
    c->out_off = c->out.len;
    return;
  }
  if (n > 0) c->in_len += (size_t)n;
  size_t at = 0;
  for (int lines = 0; lines < LINES_PER_POLL && c->state == C_CMD; lines++) {
    char *nl = memchr(c->in + at, '\n', c->in_len - at);
    if (nl == NULL) break;
    command(c, c->in + at, (size_t)(nl - (c->in + at)), now);
    at = (size_t)(nl - c->in) + 1;
    c->deadline = now + (double)param_int(P_BRAID_RAS_CLIENT_TIMEOUT_S);
  }
  memmove(c->in, c->in + at, c->in_len - at);
  c->in_len -= at;
  if (c->in_len == sizeof c->in && c->state == C_CMD) {
    char msg[80];
    snprintf(msg, sizeof msg, "ERROR: line longer than %d bytes; closing\n", CLIENT_LINE_MAX - 1);
    reply(c, msg, strlen(msg), now);
    c->state = C_CLOSING;
  }
}

static void client_close(client_t **pp) {
  client_t *c = *pp;
  *pp = c->next;
  close(c->fd);
  rpt_free(&c->out);
  free(c);
  cs.nclients--;
}

static void accept_clients(int lfd, double now) {
  for (;;) {
    int64_t max = param_int(P_BRAID_RAS_MAX_CLIENTS);
    if (cs.nclients >= max) {
      if (now - cs.refuse_second >= 1.0) {
        cs.refuse_second = now;
        cs.refused_this_second = 0;
      }
      if (cs.refused_this_second >= REFUSE_PER_S) return;
    }
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (cs.nclients >= max) {
      char msg[96];
      snprintf(msg, sizeof msg, "ERROR: too many clients (BRAID_RAS_MAX_CLIENTS=%lld); try again later\n",
               (long long)max);
      ssize_t w = send(fd, msg, strlen(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
      (void)w;
      close(fd);
      cs.refused_this_second++;
      continue;
    }
    client_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
      close(fd);
      return;
    }
    c->fd = fd;
    c->query_timeout_s = QUERY_TIMEOUT_S * timeout_factor;
    c->deadline = now + (double)param_int(P_BRAID_RAS_CLIENT_TIMEOUT_S);
    c->next = cs.clients;
    cs.clients = c;
    cs.nclients++;
  }
}

/* ---- Polling ---- */

int client_pollfds(struct pollfd *pfd, int cap) {
  int n = 0;
  int full = cs.nclients >= param_int(P_BRAID_RAS_MAX_CLIENTS) && cs.refused_this_second >= REFUSE_PER_S;
  for (int i = 0; i < cs.nlisten && n < cap; i++)
    pfd[n++] = (struct pollfd){.fd = cs.listen_fd[i], .events = full ? 0 : POLLIN};
  for (client_t *c = cs.clients; c != NULL && n < cap; c = c->next) {
    short ev = (c->state == C_CMD ? POLLIN : 0) | (c->out_off < c->out.len ? POLLOUT : 0);
    pfd[n++] = (struct pollfd){.fd = c->fd, .events = ev};
  }
  return n;
}

void client_handle(const struct pollfd *pfd, int n, double now) {
  int i = 0;
  for (; i < cs.nlisten && i < n; i++)
    if (pfd[i].revents & POLLIN) accept_clients(pfd[i].fd, now);
  /* new clients went to the front of the list: find each polled one by its descriptor */
  for (; i < n; i++) {
    if (pfd[i].revents == 0) continue;
    for (client_t *c = cs.clients; c != NULL; c = c->next) {
      if (c->fd != pfd[i].fd) continue;
      if (pfd[i].revents & (POLLOUT | POLLERR | POLLHUP)) send_out(c, now);
      if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) client_input(c, now);
      break;
    }
  }
}

double client_timers(double now) {
  double next = now + 1.0;
  if (cs.nlisten == 0 && cs.next_bind > 0) {
    if (now >= cs.next_bind) try_bind(now);
    if (cs.next_bind > 0 && cs.next_bind < next) next = cs.next_bind;
  }
  serve_waiting(now);
  for (client_t **pp = &cs.clients; *pp != NULL;) {
    client_t *c = *pp;
    if (c->out_off < c->out.len) send_out(c, now);
    int drained = c->out_off >= c->out.len;
    if (c->state == C_CMD && drained && c->mask == 0 && now > c->deadline) {
      const char *msg = "ERROR: no command within BRAID_RAS_CLIENT_TIMEOUT_S; closing\n";
      reply(c, msg, strlen(msg), now);
      send_out(c, now);
      c->state = C_CLOSING;
      drained = 1; /* one try: it is not waited for */
    }
    if ((c->state == C_CLOSING && drained) || (!drained && now > c->deadline)) {
      client_close(pp);
      continue;
    }
    if (c->state == C_QUERY) next = now + 0.002;
    pp = &c->next;
  }
  return next;
}

/* ---- Events and the end ---- */

void client_event(int group, const char *event, const ras_peer_t *peer, const char *details) {
  rpt_t lines[2] = {{0}, {0}};
  double now = time_now();
  for (client_t *c = cs.clients; c != NULL; c = c->next) {
    if (!(c->mask & group) || c->state != C_CMD) continue;
    rpt_t *r = &lines[c->json];
    if (r->len == 0)
      report_event(c->json, group == CLIENT_EV_LIFECYCLE ? "LIFECYCLE" : "TRACE", event, peer, details, r);
    if (r->len > 0) reply(c, r->data, r->len, now);
    send_out(c, now);
  }
  rpt_free(&lines[0]);
  rpt_free(&lines[1]);
}

void client_stop(void) {
  while (cs.clients != NULL) client_close(&cs.clients);
  for (int i = 0; i < cs.nlisten; i++) close(cs.listen_fd[i]);
  cs.nlisten = 0;
  view_free(&cs.last);
  for (int k = 0; k < 3; k++) rpt_free(&cs.renders[k]);
}

void client_forget(void) {
  client_stop();
  cs.last_time = 0;
  cs.next_bind = 0;
}
