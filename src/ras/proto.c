/*
 * The client protocol's command lines (see proto.h).
 */
#include "proto.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Copies at most 80 bytes of `s` for an error line, with anything unprintable as '?'. */
static void echo(char *dst, size_t size, const char *s, size_t len) {
  size_t n = len < 80 ? len : 80, i;
  if (n >= size) n = size - 1;
  for (i = 0; i < n; i++) dst[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
  dst[i] = '\0';
  if (len > n && i >= 3) memcpy(dst + i - 3, "...", 3);
}

static int prefix(const char *line, size_t len, const char *word) {
  size_t n = strlen(word);
  return len >= n && strncasecmp(line, word, n) == 0;
}

/* Parses "lifecycle,trace,all" into a mask; returns 0, or -1 with the bad token in `bad`. */
static int parse_groups(const char *s, size_t len, long *mask_p, char *bad, size_t bad_size) {
  long mask = 0;
  size_t i = 0;
  while (i < len) {
    size_t j = i;
    while (j < len && s[j] != ',') j++;
    size_t n = j - i;
    if (n == 9 && strncasecmp(s + i, "lifecycle", 9) == 0)
      mask |= CLIENT_EV_LIFECYCLE;
    else if (n == 5 && strncasecmp(s + i, "trace", 5) == 0)
      mask |= CLIENT_EV_TRACE;
    else if (n == 3 && strncasecmp(s + i, "all", 3) == 0)
      mask |= CLIENT_EV_LIFECYCLE | CLIENT_EV_TRACE;
    else {
      echo(bad, bad_size, s + i, n);
      return -1;
    }
    i = j + 1;
  }
  *mask_p = mask != 0 ? mask : CLIENT_EV_LIFECYCLE;
  return 0;
}

/* A non-negative decimal number filling s[0..len) (at most 9 digits). */
static int parse_count(const char *s, size_t len, long *v_p) {
  if (len == 0 || len > 9) return -1;
  long v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  *v_p = v;
  return 0;
}

void client_parse(const char *line, size_t len, client_cmd_t *cmd) {
  char shown[96];
  memset(cmd, 0, sizeof *cmd);
  if (len > 0 && line[len - 1] == '\r') len--;
  if (len == 0) {
    cmd->kind = CMD_EMPTY;
  } else if (prefix(line, len, "client protocol ")) {
    cmd->kind = CMD_PROTOCOL; /* the client's version is not checked, as NCCL's server does not */
  } else if (prefix(line, len, "timeout ")) {
    cmd->kind = CMD_TIMEOUT;
    if (parse_count(line + 8, len - 8, &cmd->value) != 0) {
      echo(shown, sizeof shown, line + 8, len - 8);
      cmd->kind = CMD_ERROR;
      snprintf(cmd->error, sizeof cmd->error, "ERROR: Invalid timeout value %s\n", shown);
    }
  } else if (prefix(line, len, "set format ")) {
    cmd->kind = CMD_FORMAT;
    if (len - 11 == 4 && strncasecmp(line + 11, "text", 4) == 0) {
      cmd->value = 0;
    } else if (len - 11 == 4 && strncasecmp(line + 11, "json", 4) == 0) {
      cmd->value = 1;
    } else {
      echo(shown, sizeof shown, line + 11, len - 11);
      cmd->kind = CMD_ERROR;
      snprintf(cmd->error, sizeof cmd->error, "ERROR: Invalid format %s\n", shown);
    }
  } else if (len == 6 && strncasecmp(line, "status", 6) == 0) {
    cmd->kind = CMD_STATUS;
  } else if (len == 14 && strncasecmp(line, "verbose status", 14) == 0) {
    cmd->kind = CMD_STATUS;
    cmd->value = 1;
  } else if ((len == 7 && strncasecmp(line, "monitor", 7) == 0) || prefix(line, len, "monitor ")) {
    size_t at = 7;
    while (at < len && line[at] == ' ') at++;
    cmd->kind = CMD_MONITOR;
    if (parse_groups(line + at, len - at, &cmd->value, shown, sizeof shown) != 0) {
      cmd->kind = CMD_ERROR;
      snprintf(cmd->error, sizeof cmd->error, "ERROR: Invalid event group '%s'\n", shown);
    }
  } else {
    echo(shown, sizeof shown, line, len);
    cmd->kind = CMD_ERROR;
    snprintf(cmd->error, sizeof cmd->error, "ERROR: Unknown command %s\n", shown);
  }
}
