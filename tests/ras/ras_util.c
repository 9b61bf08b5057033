/*
 * The monitoring tests' helpers (see ras_util.h).
 */
#include "ras_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/param.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct sockaddr_in loopback(int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int rt_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len))
    return -1;
  close(fd); /* the kernel does not hand out a port it just gave for a while */
  return ntohs(a.sin_port);
}

void rt_use_port(int port) {
  char v[64];
  snprintf(v, sizeof v, "127.0.0.1:%d", port);
  setenv("NCCL_RAS_ADDR", v, 1);
  param_reload();
}

int rt_connect(int port, double timeout_s) {
  double until = now() + timeout_s;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = loopback(port);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
    if (fd >= 0) close(fd);
    if (now() > until) return -1;
    usleep(20000);
  }
}

/* Waits until fd is readable; 0 on a timeout. */
static int readable(int fd, double until) {
  for (;;) {
    double left = until - now();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc = poll(&p, 1, (int)(left * 1e3) + 1);
    if (rc > 0) return 1;
    if (rc < 0 && errno != EINTR) return 0;
  }
}

int rt_line(int fd, char *buf, size_t size, double timeout_s) {
  double until = now() + timeout_s;
  size_t n = 0;
  while (n + 1 < size) {
    if (!readable(fd, until)) return -1;
    ssize_t r = recv(fd, buf + n, 1, 0);
    if (r <= 0) break;
    if (buf[n++] == '\n') break;
  }
  buf[n] = '\0';
  return (int)n;
}

char *rt_read_all(int fd, double timeout_s, size_t *len_p) {
  double until = now() + timeout_s;
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (buf == NULL || !readable(fd, until)) {
      free(buf);
      return NULL;
    }
    if (cap - n < 16384) {
      char *b = realloc(buf, cap *= 2);
      if (b == NULL) break;
      buf = b;
    }
    ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
    if (r <= 0) break;
    n += (size_t)r;
  }
  buf[n] = '\0';
  *len_p = n;
  return buf;
}

char *rt_status(int port, int json, int verbose, double timeout_s, char *err, size_t err_size) {
  int fd = rt_connect(port, timeout_s);
  if (fd < 0) {
    snprintf(err, err_size, "cannot connect to port %d", port);
    return NULL;
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "CLIENT PROTOCOL 2\nSET FORMAT %s\n%sSTATUS\n", json ? "json" : "text",
           verbose ? "VERBOSE " : "");
  size_t len = 0;
  char *all = send(fd, cmd, strlen(cmd), MSG_NOSIGNAL) == (ssize_t)strlen(cmd)
                  ? rt_read_all(fd, timeout_s, &len)
                  : NULL;
  close(fd);
  if (all == NULL) {
    snprintf(err, err_size, "no whole answer within %.0f s", timeout_s);
    return NULL;
  }
  static const char head[] = "SERVER PROTOCOL 2\nOK\n";
  if (strncmp(all, head, sizeof head - 1) != 0) {
    snprintf(err, err_size, "unexpected answer: %.80s", all);
    free(all);
    return NULL;
  }
  memmove(all, all + sizeof head - 1, len - (sizeof head - 1) + 1);
  return all;
}
