/*
 * The gate of a listening socket (private to src/bootstrap): connections are accepted as soon as they come
 * and kept, non-blocking, until their first message (a fixed-size hello) is complete. Strangers can then
 * neither stall nor delay anyone: every connection is read as its bytes arrive, each has HELLO_TIMEOUT_S to
 * finish its hello, one host keeps at most GATE_PER_HOST connections waiting (its others are closed at
 * once) and the gate at most GATE_TOTAL (others wait in the listen backlog until some finish).
 */
#ifndef BRAID_BOOTSTRAP_GATE_H
#define BRAID_BOOTSTRAP_GATE_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Largest hello a gate reads. */
#define GATE_HELLO_MAX 512

/* One connection waiting for its hello. */
typedef struct {
  int fd;                     /* the connection (non-blocking) */
  uint64_t host;              /* sock_host_key of where it comes from */
  double deadline;            /* when it is dropped if its hello is still incomplete */
  size_t got;                 /* hello bytes read so far */
  char hello[GATE_HELLO_MAX]; /* the hello */
} gate_conn_t;

typedef struct {
  gate_conn_t *conns; /* waiting connections */
  int n, cap;         /* how many, and room */
  size_t hello_bytes; /* size of the hello every connection owes */
  const char *name;   /* whose gate, for messages */
  uint64_t dropped;   /* connections dropped (timeouts, caps, closed early), for messages */
} gate_t;

/* A complete hello: fn takes over `fd` (closes or keeps it). */
typedef void (*gate_fn_t)(void *arg, int fd, const void *hello);

void gate_init(gate_t *gate, size_t hello_bytes, const char *name);
/* Closes every waiting connection and frees the gate's memory. */
void gate_close(gate_t *gate);
/* Accepts every connection waiting on listen_fd without blocking (see the caps above). */
ncclResult_t gate_accept(gate_t *gate, int listen_fd);
/* Poll entries of the waiting connections, into pfds (room for gate->n); returns how many. */
int gate_poll_fds(const gate_t *gate, struct pollfd *pfds);
/* After poll (the npfds entries gate_poll_fds filled, with revents): reads what arrived, hands every complete
 * hello to fn, and drops connections that closed or whose time is up. */
void gate_serve(gate_t *gate, const struct pollfd *pfds, int npfds, double now, gate_fn_t fn, void *arg);

#endif
