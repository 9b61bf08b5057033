/*
 * The RAS client protocol's command lines, parsed (a pure function, fuzzed by tests/ras/fuzz_proto.c).
 *
 * NCCL's commands, matched without regard to case as NCCL's server does: "CLIENT PROTOCOL <n>",
 * "TIMEOUT <seconds>", "SET FORMAT text|json", "STATUS", "VERBOSE STATUS", "MONITOR [lifecycle,trace,all]".
 * Anything else is an error whose answer line echoes at most 80 printable bytes of what was sent.
 */
#ifndef BRAID_RAS_PROTO_H
#define BRAID_RAS_PROTO_H

#include <stddef.h>

#define RAS_CLIENT_PROTOCOL 2
#define CLIENT_LINE_MAX     1024 /* bytes of one command line, newline included */

/* A parsed command line. */
typedef enum {
  CMD_PROTOCOL, /* CLIENT PROTOCOL n */
  CMD_TIMEOUT,  /* TIMEOUT n (value) */
  CMD_FORMAT,   /* SET FORMAT (value: 0 text, 1 json) */
  CMD_STATUS,   /* STATUS (value: 1 for VERBOSE STATUS) */
  CMD_MONITOR,  /* MONITOR (value: mask of CLIENT_EV_*) */
  CMD_EMPTY,    /* an empty line: ignored */
  CMD_ERROR,    /* anything else: `error` holds the answer */
} cmd_kind_t;

enum { CLIENT_EV_LIFECYCLE = 1, CLIENT_EV_TRACE = 2 };

typedef struct {
  cmd_kind_t kind;
  long value;
  char error[160]; /* CMD_ERROR: the answer line, newline included */
} client_cmd_t;

/* Parses one line (without its newline; a trailing '\r' is ignored). Case-insensitive, as NCCL's server. */
void client_parse(const char *line, size_t len, client_cmd_t *cmd);

#endif
