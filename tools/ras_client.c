/*
 * `braid ras` (see ras_client.h). One connection per query, as the protocol wants: the server closes it at
 * the end of a status report.
 */
#include "ras_client.h"

#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/param.h"

typedef struct {
  char host[256], port[32];
  const char *format; /* NULL: the server's default (text) */
  const char *groups; /* MONITOR groups, "" for the default */
  int timeout;        /* -1: the server's default */
  int verbose, monitor;
  double watch_s; /* 0: once */
} opts_t;

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: braid ras [options]\n"
      "Query the state of a running job (NCCL's RAS protocol).\n"
      "  -f, --format=FMT       text or json (text by default)\n"
      "  -h, --host=HOST        host of the job's RAS socket (default: NCCL_RAS_ADDR, else localhost)\n"
      "  -p, --port=PORT        its port (default: NCCL_RAS_ADDR's, else 28028)\n"
      "  -t, --timeout=SECS     how long the job's processes wait for each other's answers (0: no limit)\n"
      "  -v, --verbose          list every rank\n"
      "  -m, --monitor[=GROUPS] print events as they happen: lifecycle (default), trace, all\n"
      "      --watch=SECONDS    print the status again every SECONDS\n"
      "      --help             this text\n");
}

/* The default address: NCCL_RAS_ADDR ("host:port", "[v6]:port"). */
static void default_addr(opts_t *o) {
  const char *spec = param_str(P_NCCL_RAS_ADDR);
  const char *colon = spec[0] == '[' ? strstr(spec, "]:") : strrchr(spec, ':');
  snprintf(o->host, sizeof o->host, "localhost");
  snprintf(o->port, sizeof o->port, "28028");
  if (colon == NULL) return;
  const char *h = spec[0] == '[' ? spec + 1 : spec;
  if (colon > h && (size_t)(colon - h) < sizeof o->host)
    snprintf(o->host, sizeof o->host, "%.*s", (int)(colon - h), h);
  snprintf(o->port, sizeof o->port, "%s", colon + (spec[0] == '[' ? 2 : 1));
}

/* Parses the options; returns 0, or the exit status to leave with. */
static int parse(int argc, char **argv, opts_t *o) {
  static const struct option longs[] = {{"format", required_argument, NULL, 'f'},
                                        {"host", required_argument, NULL, 'h'},
                                        {"monitor", optional_argument, NULL, 'm'},
                                        {"port", required_argument, NULL, 'p'},
                                        {"timeout", required_argument, NULL, 't'},
                                        {"verbose", no_argument, NULL, 'v'},
                                        {"watch", required_argument, NULL, 'w'},
                                        {"help", no_argument, NULL, 'H'},
                                        {NULL, 0, NULL, 0}};
  *o = (opts_t){.timeout = -1, .groups = ""};
  default_addr(o);
  optind = 1;
  int c;
  char *end;
  while ((c = getopt_long(argc, argv, "f:h:m::p:t:v", longs, NULL)) != -1) {
    switch (c) {
    case 'f':
      if (strcasecmp(optarg, "text") != 0 && strcasecmp(optarg, "json") != 0) {
        fprintf(stderr, "braid ras: format \"%s\" is neither text nor json\n", optarg);
        return 2;
      }
      o->format = optarg;
      break;
    case 'h':
      snprintf(o->host, sizeof o->host, "%s", optarg);
      break;
    case 'p':
      snprintf(o->port, sizeof o->port, "%s", optarg);
      break;
    case 'm':
      o->monitor = 1;
      o->groups = optarg != NULL ? optarg : "";
      break;
    case 't':
      o->timeout = (int)strtol(optarg, &end, 10);
      if (*optarg == '\0' || *end != '\0' || o->timeout < 0) {
        fprintf(stderr, "braid ras: timeout \"%s\" is not a number of seconds\n", optarg);
        return 2;
      }
      break;
    case 'v':
      o->verbose = 1;
      break;
    case 'w':
      o->watch_s = strtod(optarg, &end);
      if (*optarg == '\0' || *end != '\0' || o->watch_s <= 0) {
        fprintf(stderr, "braid ras: --watch needs a positive number of seconds, not \"%s\"\n", optarg);
        return 2;
      }
      break;
    case 'H':
      usage(stdout);
      return -1;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "braid ras: unexpected argument \"%s\"\n", argv[optind]);
    return 2;
  }
  return 0;
}

/* Connects to the job; -1 with a message when it cannot. `wait_s` bounds every read and write. */
static int dial(const opts_t *o, double wait_s) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  int rc = getaddrinfo(o->host, o->port, &hints, &res);
  if (rc != 0) {
    fprintf(stderr, "braid ras: cannot resolve %s:%s: %s\n", o->host, o->port, gai_strerror(rc));
    return -1;
  }
  int fd = -1, err = 0;
  for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    struct timeval tv = {.tv_sec = (time_t)wait_s, .tv_usec = (suseconds_t)((wait_s - (time_t)wait_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    fprintf(stderr,
            "braid ras: cannot connect to %s:%s: %s (is a job with monitoring running there? see "
            "NCCL_RAS_ADDR)\n",
            o->host, o->port, strerror(err));
  return fd;
}

static int say(int fd, const char *line) {
  size_t n = strlen(line), done = 0;
  while (done < n) {
    ssize_t w = send(fd, line + done, n - done, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fprintf(stderr, "braid ras: sending \"%.*s\" failed: %s\n", (int)strcspn(line, "\n"), line,
              strerror(errno));
      return -1;
    }
    done += (size_t)w;
  }
  return 0;
}

/* Reads one answer line into buf; -1 with a message on a timeout, an error or a closed connection. */
static int hear(int fd, char *buf, size_t size) {
  size_t len = 0;
  while (len + 1 < size) {
    ssize_t r = recv(fd, buf + len, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      fprintf(stderr, "braid ras: %s\n", r == 0 ? "the job closed the connection" : "no answer in time");
      return -1;
    }
    if (buf[len++] == '\n') break;
  }
  buf[len] = '\0';
  return 0;
}

/* Sends one command and expects "OK". */
static int ask_ok(int fd, const char *line) {
  char ans[512];
  if (say(fd, line) != 0 || hear(fd, ans, sizeof ans) != 0) return -1;
  if (strcasecmp(ans, "OK\n") == 0) return 0;
  fprintf(stderr, "braid ras: the job answered \"%s\" to %s", strtok(ans, "\n"), line);
  return -1;
}

/* The protocol's opening: versions, timeout, format. */
static int open_session(const opts_t *o, double wait_s) {
  int fd = dial(o, wait_s);
  if (fd < 0) return -1;
  char line[128], ans[512];
  if (say(fd, "CLIENT PROTOCOL 2\n") != 0 || hear(fd, ans, sizeof ans) != 0) goto fail;
  if (strncasecmp(ans, "SERVER PROTOCOL ", 16) != 0) {
    fprintf(stderr, "braid ras: unexpected answer from the job: %s", ans);
    goto fail;
  }
  if (o->timeout >= 0) {
    snprintf(line, sizeof line, "TIMEOUT %d\n", o->timeout);
    if (ask_ok(fd, line) != 0) goto fail;
  }
  if (o->format != NULL) {
    snprintf(line, sizeof line, "SET FORMAT %s\n", o->format);
    if (ask_ok(fd, line) != 0) goto fail;
  }
  return fd;
fail:
  close(fd);
  return -1;
}

/* One status report to stdout. */
static int status_once(const opts_t *o) {
  double wait_s = (o->timeout > 0 ? o->timeout : o->timeout == 0 ? 60 : 5) + 5;
  int fd = open_session(o, wait_s);
  if (fd < 0) return 1;
  int res = say(fd, o->verbose ? "VERBOSE STATUS\n" : "STATUS\n") == 0 ? 0 : 1;
  char buf[65536];
  size_t total = 0;
  for (;;) {
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      fprintf(stderr, "braid ras: the status did not come within %.0f s\n", wait_s);
      res = 1;
    }
    if (r <= 0) break;
    fwrite(buf, 1, (size_t)r, stdout);
    total += (size_t)r;
  }
  fflush(stdout);
  close(fd);
  if (res == 0 && total == 0) {
    fprintf(stderr, "braid ras: the job sent an empty status\n");
    res = 1;
  }
  return res;
}

static int monitor(const opts_t *o) {
  int fd = open_session(o, 10);
  if (fd < 0) return 1;
  char line[256];
  snprintf(line, sizeof line, "MONITOR%s%s\n", *o->groups ? " " : "", o->groups);
  if (ask_ok(fd, line) != 0) {
    close(fd);
    return 1;
  }
  struct timeval none = {0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none); /* events come when they come */
  fprintf(stderr, "braid ras: watching for events (Ctrl+C to stop)\n");
  char buf[4096];
  ssize_t r;
  while ((r = recv(fd, buf, sizeof buf, 0)) > 0 || (r < 0 && errno == EINTR)) {
    if (r > 0) fwrite(buf, 1, (size_t)r, stdout);
    fflush(stdout);
  }
  fprintf(stderr, "braid ras: the job closed the connection\n");
  close(fd);
  return 0;
}

int ras_main(int argc, char **argv) {
  opts_t o;
  int res = parse(argc, argv, &o);
  if (res != 0) return res < 0 ? 0 : res;
  if (o.monitor) return monitor(&o);
  if (o.watch_s <= 0) return status_once(&o);
  int tty = isatty(STDOUT_FILENO);
  for (;;) {
    if (tty) printf("\033[H\033[2J");
    time_t t = time(NULL);
    char ts[64];
    strftime(ts, sizeof ts, "%F %T", localtime(&t));
    if (o.format == NULL || strcasecmp(o.format, "text") == 0)
      printf("braid ras --watch %g: %s:%s at %s\n\n", o.watch_s, o.host, o.port, ts);
    if (status_once(&o) != 0) fprintf(stderr, "braid ras: trying again in %g s\n", o.watch_s);
    fflush(stdout);
    struct timespec ts_sleep = {(time_t)o.watch_s, (long)((o.watch_s - (time_t)o.watch_s) * 1e9)};
    nanosleep(&ts_sleep, NULL);
  }
}
