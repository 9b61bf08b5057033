/*
 * What the monitoring tests share: a free port for a job's client address, and a RAS client that sends
 * commands and reads the answers (every read bounded by a timeout).
 */
#ifndef BRAID_TESTS_RAS_UTIL_H
#define BRAID_TESTS_RAS_UTIL_H

#include <stddef.h>

/* A TCP port on 127.0.0.1 that nothing listens on now. */
int rt_free_port(void);
/* Sets NCCL_RAS_ADDR=127.0.0.1:port (port 0: a port of its own) and reloads the knobs. */
void rt_use_port(int port);
/* Connects to 127.0.0.1:port, retrying for up to timeout_s; -1 if it cannot. */
int rt_connect(int port, double timeout_s);
/* Reads one line (newline kept) into buf; returns its length, 0 at end of stream, -1 on a timeout. */
int rt_line(int fd, char *buf, size_t size, double timeout_s);
/* Reads until the server closes; returns the bytes (NUL-terminated, *len_p without it) or NULL on a timeout.
 */
char *rt_read_all(int fd, double timeout_s, size_t *len_p);
/* A whole status exchange: CLIENT PROTOCOL 2, SET FORMAT, (VERBOSE) STATUS. Returns the report alone (the
 * answer lines before it checked and stripped), or NULL with the reason in err. */
char *rt_status(int port, int json, int verbose, double timeout_s, char *err, size_t err_size);

#endif
