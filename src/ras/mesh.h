/*
 * The monitor thread and its peer mesh.
 *
 * One thread per process runs a poll loop over: a wake-up pipe, the mesh listener, one outgoing connection
 * to every known peer process (which carries everything this process sends it) and the incoming connection
 * each peer made (which carries everything it sends), and the client listener and clients (client.h).
 *
 * A connection starts with a HELLO that carries the job proof (the nonce of a communicator both ends are
 * in) and the sender's identity; an incoming connection whose first message is anything else, or whose proof
 * this process does not know, is closed. Every keep-alive interval (1 s times NCCL_RAS_TIMEOUT_FACTOR) each
 * peer gets a KEEPALIVE with this process's brief snapshot. A peer is
 *   - alive while it was heard from within 5 s (times the factor), unresponsive after that;
 *   - dead when its connection closes without a BYE and a new connection to it is refused (a process that
 *     died: seen at once), or after 60 s (times the factor) of silence (a process stopped or cut off);
 *   - left when it said BYE (its process exited normally).
 * Silence is measured only while this thread itself runs: after the loop was held up (a loaded or stopped
 * process), every peer gets the time back, so load never makes a live process look dead.
 *
 * A query (a client's STATUS) asks every reachable peer for its full snapshot and ends when all answered or
 * at its timeout; the view it makes goes to client.c.
 */
#ifndef BRAID_RAS_MESH_H
#define BRAID_RAS_MESH_H

#include "nccl.h"
#include "base/socket.h"
#include "ras/report.h"

/* What the mesh reads of this process's records (ras.c gives it at mesh_start): a snapshot of them (brief:
 * the keep-alive's summary; 0 or -1 when out of memory), the peers of ready communicators, and whether a
 * job proof is one of its communicators'. */
typedef struct {
  int (*snapshot)(ras_proc_t *proc, int brief);
  void (*peers)(void (*fn)(const ras_peer_t *peer, uint64_t job, void *arg), void *arg);
  int (*known_job)(uint64_t job);
  int (*rank_peer)(uint64_t nonce, int rank, ras_peer_t *peer_p); /* ras_view_t.where */
} mesh_source_t;

/* Starts the monitor thread with its mesh listener, on the interface the bootstrap uses; writes the listening
 * address. `src` stays valid while the thread runs. */
ncclResult_t mesh_start(const mesh_source_t *src, sock_addr_t *addr_p);
/* Wakes the thread: a communicator became ready (new peers to connect) or left. */
void mesh_wake(void);
/* A copy of what the mesh knows now: this process (its records in full) and every peer with its latest
 * keep-alive snapshot. For the verdict, from any thread. Returns 0, or -1 when out of memory. */
int mesh_view(ras_view_t *view);
/* This process's identity, as HELLOs carry it (set again when it runs on one more device). */
void mesh_set_self(const ras_peer_t *self);
/* Fork: the mesh lock is held across fork (prepare / parent); a child forgets the parent's mesh (its thread
 * and sockets belong to the parent). */
void mesh_atfork_prepare(void);
void mesh_atfork_parent(void);
void mesh_atfork_child(void);

#endif
