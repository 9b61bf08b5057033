/*
 * NCCL's RAS client protocol on NCCL_RAS_ADDR (default localhost:28028), served by the monitor thread.
 *
 * Text lines: "CLIENT PROTOCOL <n>" -> "SERVER PROTOCOL 2"; "TIMEOUT <s>" and "SET FORMAT text|json" -> "OK";
 * "STATUS" / "VERBOSE STATUS" -> the report, after which the server closes the connection; "MONITOR
 * [lifecycle,trace,all]" -> "OK", then one event per line (text) or object (JSON) as peers come and go.
 * Anything else gets "ERROR: ..." and the connection stays open.
 *
 * The processes of a node share the address: the first to bind it serves, the others try again every few
 * seconds (so another takes over when that one exits). The listener binds only what NCCL_RAS_ADDR names
 * (loopback by default). Limits, each answered with one ERROR line before the connection closes: a line
 * longer than CLIENT_LINE_MAX, more than CLIENT_MAX_ERRORS bad commands, more clients than
 * BRAID_RAS_MAX_CLIENTS, a client that reads nothing of what it asked for within BRAID_RAS_CLIENT_TIMEOUT_S
 * (or holds more than CLIENT_OUT_MAX bytes unread). Queries are pooled: a STATUS joins the query in flight,
 * or is answered from the last one when it is younger than BRAID_RAS_MIN_QUERY_MS, so that no polling rate
 * makes the mesh do more than one query per that interval, and a client's lines are read only while its
 * previous answer is out, so that a flood costs the job nothing more.
 */
#ifndef BRAID_RAS_CLIENT_H
#define BRAID_RAS_CLIENT_H

#include <poll.h>
#include <stddef.h>

#include "ras/proto.h"
#include "ras/report.h"

#define CLIENT_LINE_MAX   1024        /* bytes of one command line, newline included */
#define CLIENT_MAX_ERRORS 16          /* bad commands before the connection is closed */
#define CLIENT_OUT_MAX    (16u << 20) /* bytes a client may leave unread */

/* Monitor thread: binds the client listener (or plans to try again). `query` starts a query of the mesh
 * unless one runs (its view comes back through client_query_done); `factor` scales the timeouts. */
void client_start(void (*query)(double timeout_s), double factor);
/* Adds its file descriptors to pfd (at most cap); returns how many. */
int client_pollfds(struct pollfd *pfd, int cap);
/* Handles what poll reported on the descriptors client_pollfds added. */
void client_handle(const struct pollfd *pfd, int n, double now);
/* Timers (bind retries, client deadlines); returns the next time it needs to run. */
double client_timers(double now);
/* A query ended: answers every client waiting for it. Takes the view's records (leaves it empty). */
void client_query_done(ras_view_t *view);
/* A mesh event for MONITOR clients (group CLIENT_EV_*). */
void client_event(int group, const char *event, const ras_peer_t *peer, const char *details);
/* Closes every client and the listener. */
void client_stop(void);
/* In a forked child: forgets the parent's descriptors without closing them. */
void client_forget(void);

#endif
