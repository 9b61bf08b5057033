/*
 * The gate of a listening socket (see gate.h).
 */
#include "gate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/check.h"
#include "base/log.h"
#include "base/socket.h"
#include "base/timeutil.h"
#include "wire.h"

void gate_init(gate_t *gate, size_t hello_bytes, const char *name) {
  *gate = (gate_t){.hello_bytes = hello_bytes, .name = name};
}

void gate_close(gate_t *gate) {
  for (int i = 0; i < gate->n; i++) sock_close(gate->conns[i].fd);
  free(gate->conns);
  gate->conns = NULL;
  gate->n = gate->cap = 0;
}

static int waiting_from(const gate_t *gate, uint64_t host) {
  int n = 0;
  for (int i = 0; i < gate->n; i++) n += gate->conns[i].host == host;
  return n;
}

/* Drops connection i (the last one takes its place). */
static void drop(gate_t *gate, int i) {
  sock_close(gate->conns[i].fd);
  gate->conns[i] = gate->conns[--gate->n];
  gate->dropped++;
}

ncclResult_t gate_accept(gate_t *gate, int listen_fd) {
  while (gate->n < GATE_TOTAL) {
    int fd;
    sock_addr_t peer;
    CHECK(sock_accept_now(listen_fd, &fd, &peer));
    if (fd < 0) return ncclSuccess;
    uint64_t host = sock_host_key(&peer);
    if (waiting_from(gate, host) >= GATE_PER_HOST) {
      char name[SOCK_ADDR_STRLEN];
      if (gate->dropped++ == 0)
        WARN("%s: closed a connection from %s, which already has %d connections that sent nothing yet",
             gate->name, sock_addr_str(&peer, name), GATE_PER_HOST);
      sock_close(fd);
      continue;
    }
    if (gate->n == gate->cap) {
      int cap = gate->cap > 0 ? 2 * gate->cap : 8;
      gate_conn_t *c = realloc(gate->conns, (size_t)cap * sizeof *c);
      if (c == NULL) {
        sock_close(fd);
        return log_err(ncclSystemError, "%s: out of memory for %d waiting connections", gate->name, cap);
      }
      gate->conns = c;
      gate->cap = cap;
    }
    gate->conns[gate->n++] = (gate_conn_t){.fd = fd, .host = host, .deadline = time_now() + HELLO_TIMEOUT_S};
  }
  return ncclSuccess;
}

int gate_poll_fds(const gate_t *gate, struct pollfd *pfds) {
  for (int i = 0; i < gate->n; i++) pfds[i] = (struct pollfd){.fd = gate->conns[i].fd, .events = POLLIN};
  return gate->n;
}

/* Reads what connection i holds now; 1 when its hello is complete, -1 when it closed or failed. */
static int read_hello(gate_t *gate, int i) {
  gate_conn_t *c = &gate->conns[i];
  while (c->got < gate->hello_bytes) {
    ssize_t n = recv(c->fd, c->hello + c->got, gate->hello_bytes - c->got, MSG_DONTWAIT);
    if (n > 0) {
      c->got += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    return -1;
  }
  return 1;
}

void gate_serve(gate_t *gate, const struct pollfd *pfds, int npfds, double now, gate_fn_t fn, void *arg) {
  /* pfds[j] belongs to the connection whose fd it names; the list reorders as connections leave or come */
  for (int j = 0; j < npfds; j++) {
    if (pfds[j].revents == 0) continue;
    int i = 0;
    while (i < gate->n && gate->conns[i].fd != pfds[j].fd) i++;
    if (i == gate->n) continue;
    int state = read_hello(gate, i);
    if (state < 0) {
      drop(gate, i);
    } else if (state > 0) {
      int fd = gate->conns[i].fd;
      char hello[GATE_HELLO_MAX];
      memcpy(hello, gate->conns[i].hello, gate->hello_bytes);
      gate->conns[i] = gate->conns[--gate->n];
      fn(arg, fd, hello);
    }
  }
  for (int i = 0; i < gate->n;) {
    if (now < gate->conns[i].deadline) {
      i++;
      continue;
    }
    INFO(LOG_BOOTSTRAP, "%s: dropped a connection that sent %zu of %zu hello bytes in %d s", gate->name,
         gate->conns[i].got, gate->hello_bytes, HELLO_TIMEOUT_S);
    drop(gate, i);
  }
}
