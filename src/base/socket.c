/*
 * TCP sockets (see socket.h): which interface to use, and listen/accept/connect/send/receive calls that never
 * wait without bound. Every wait is a poll() of at most POLL_SLICE_MS, after which the abort flag and the
 * deadline are checked, so an abort or a dead peer is noticed within a slice.
 */
#include "socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "hash.h"
#include "log.h"
#include "param.h"
#include "timeutil.h"

/* Longest wait of one poll() before the abort flag and the deadline are checked again. */
#define POLL_SLICE_MS 100
/* Pause between two attempts of a refused connection. */
#define CONNECT_RETRY_US 100000

/* Default interface rules: anything but these prefixes, else loopback. */
#define DEFAULT_IFNAME  "^docker,lo,virbr"
#define LOOPBACK_IFNAME "lo"

static socklen_t addr_len(const sock_addr_t *addr) {
  return addr->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

const char *sock_addr_str(const sock_addr_t *addr, char *buf) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (addr->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &addr->sin.sin_addr, ip, sizeof ip);
    snprintf(buf, SOCK_ADDR_STRLEN, "%s:%u", ip, ntohs(addr->sin.sin_port));
  } else if (addr->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &addr->sin6.sin6_addr, ip, sizeof ip);
    snprintf(buf, SOCK_ADDR_STRLEN, "[%s]:%u", ip, ntohs(addr->sin6.sin6_port));
  } else {
    snprintf(buf, SOCK_ADDR_STRLEN, "<family %d>", addr->sa.sa_family);
  }
  return buf;
}

/* The remote address of a connected socket as text, for error messages. */
static const char *peer_str(int fd, char *buf) {
  sock_addr_t addr;
  socklen_t len = sizeof addr;
  memset(&addr, 0, sizeof addr);
  if (getpeername(fd, &addr.sa, &len) != 0) {
    snprintf(buf, SOCK_ADDR_STRLEN, "<fd %d>", fd);
    return buf;
  }
  return sock_addr_str(&addr, buf);
}

/* ---- Interface selection ---- */

int sock_ifname_match(const char *spec, const char *ifname) {
  int exclude = spec[0] == '^';
  if (exclude) spec++;
  int exact = spec[0] == '=';
  if (exact) spec++;
  int match = 0;
  while (*spec != '\0' && !match) {
    size_t len = strcspn(spec, ",");
    if (len > 0) {
      match =
          exact ? strlen(ifname) == len && strncmp(ifname, spec, len) == 0 : strncmp(ifname, spec, len) == 0;
    }
    spec += len + (spec[len] == ',');
  }
  return exclude ? !match : match;
}

/* NCCL_SOCKET_FAMILY as an address family: AF_UNSPEC when unset. */
static ncclResult_t wanted_family(int *family_p) {
  const char *text = param_str(P_NCCL_SOCKET_FAMILY);
  if (*text == '\0')
    *family_p = AF_UNSPEC;
  else if (strcmp(text, "AF_INET") == 0)
    *family_p = AF_INET;
  else if (strcmp(text, "AF_INET6") == 0)
    *family_p = AF_INET6;
  else
    return log_err(ncclInvalidArgument, "NCCL_SOCKET_FAMILY=\"%s\" is neither AF_INET nor AF_INET6", text);
  return ncclSuccess;
}

/* Whether an interface address can be used: up, IPv4 or IPv6 (not link-local), of the wanted family. */
static int usable(const struct ifaddrs *ifa, int family) {
  if (ifa->ifa_addr == NULL || !(ifa->ifa_flags & IFF_UP)) return 0;
  int fam = ifa->ifa_addr->sa_family;
  if (fam != AF_INET && fam != AF_INET6) return 0;
  if (family != AF_UNSPEC && fam != family) return 0;
  if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr))
    return 0;
  return 1;
}

/* The first usable interface whose name matches `spec`; NULL when none does. */
static const struct ifaddrs *first_match(const struct ifaddrs *list, const char *spec, int family) {
  for (const struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next)
    if (usable(ifa, family) && sock_ifname_match(spec, ifa->ifa_name)) return ifa;
  return NULL;
}

/* Copies an interface's address (port 0) and name to the caller. */
static void take_interface(const struct ifaddrs *ifa, sock_addr_t *addr_p, char *ifname, size_t ifname_len) {
  memset(addr_p, 0, sizeof *addr_p);
  memcpy(addr_p, ifa->ifa_addr,
         ifa->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
  if (ifname != NULL && ifname_len > 0) snprintf(ifname, ifname_len, "%s", ifa->ifa_name);
}

/* Lists the usable interfaces' names into buf, for the message of a failed selection. */
static void list_interfaces(const struct ifaddrs *list, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = '\0';
  for (const struct ifaddrs *ifa = list; ifa != NULL && n < len; ifa = ifa->ifa_next)
    if (usable(ifa, AF_UNSPEC))
      n += snprintf(buf + n, len - n, "%s%s(%s)", n > 0 ? ", " : "", ifa->ifa_name,
                    ifa->ifa_addr->sa_family == AF_INET ? "v4" : "v6");
}

ncclResult_t sock_find_interface(sock_addr_t *addr_p, char *ifname, size_t ifname_len) {
  int family = AF_UNSPEC;
  CHECK(wanted_family(&family));
  struct ifaddrs *list;
  if (getifaddrs(&list) != 0) return log_err(ncclSystemError, "getifaddrs failed: %s", strerror(errno));
  const char *spec = param_str(P_NCCL_SOCKET_IFNAME);
  const struct ifaddrs *found;
  if (*spec != '\0') {
    found = first_match(list, spec, family);
  } else {
    found = first_match(list, DEFAULT_IFNAME, family);
    if (found == NULL) found = first_match(list, LOOPBACK_IFNAME, family);
  }
  ncclResult_t res = ncclSuccess;
  if (found != NULL) {
    take_interface(found, addr_p, ifname, ifname_len);
  } else {
    char names[512];
    list_interfaces(list, names, sizeof names);
    res = log_err(ncclSystemError,
                  "no network interface matches NCCL_SOCKET_IFNAME=\"%s\" NCCL_SOCKET_FAMILY=\"%s\""
                  " (interfaces up: %s)",
                  spec, param_str(P_NCCL_SOCKET_FAMILY), names);
  }
  freeifaddrs(list);
  return res;
}

/* Whether `a` and `b` lie in the subnet given by `mask` (all of the same family). */
static int same_subnet(const struct sockaddr *a, const struct sockaddr *b, const struct sockaddr *mask) {
  const unsigned char *pa, *pb, *pm;
  size_t len;
  if (a->sa_family == AF_INET) {
    pa = (const unsigned char *)&((const struct sockaddr_in *)a)->sin_addr;
    pb = (const unsigned char *)&((const struct sockaddr_in *)b)->sin_addr;
    pm = (const unsigned char *)&((const struct sockaddr_in *)mask)->sin_addr;
    len = 4;
  } else {
    pa = (const unsigned char *)&((const struct sockaddr_in6 *)a)->sin6_addr;
    pb = (const unsigned char *)&((const struct sockaddr_in6 *)b)->sin6_addr;
    pm = (const unsigned char *)&((const struct sockaddr_in6 *)mask)->sin6_addr;
    len = 16;
  }
  for (size_t i = 0; i < len; i++)
    if ((pa[i] & pm[i]) != (pb[i] & pm[i])) return 0;
  return 1;
}

/* Asks the kernel's routing table which local address would reach `remote` (a UDP connect sends nothing). */
static ncclResult_t route_source(const sock_addr_t *remote, sock_addr_t *addr_p) {
  char name[SOCK_ADDR_STRLEN];
  int fd = socket(remote->sa.sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return log_err(ncclSystemError, "socket(UDP) failed: %s", strerror(errno));
  sock_addr_t local;
  socklen_t len = sizeof local;
  memset(&local, 0, sizeof local);
  if (connect(fd, &remote->sa, addr_len(remote)) != 0 || getsockname(fd, &local.sa, &len) != 0) {
    int err = errno;
    close(fd);
    return log_err(ncclSystemError, "no local interface reaches %s: %s", sock_addr_str(remote, name),
                   strerror(err));
  }
  close(fd);
  local.sin.sin_port = 0; /* sin_port and sin6_port share their offset */
  *addr_p = local;
  return ncclSuccess;
}

ncclResult_t sock_find_interface_for(const sock_addr_t *remote, sock_addr_t *addr_p) {
  struct ifaddrs *list;
  if (getifaddrs(&list) != 0) return log_err(ncclSystemError, "getifaddrs failed: %s", strerror(errno));
  const struct ifaddrs *found = NULL;
  for (const struct ifaddrs *ifa = list; ifa != NULL && found == NULL; ifa = ifa->ifa_next)
    if (usable(ifa, remote->sa.sa_family) && ifa->ifa_netmask != NULL &&
        same_subnet(ifa->ifa_addr, &remote->sa, ifa->ifa_netmask))
      found = ifa;
  if (found != NULL) take_interface(found, addr_p, NULL, 0);
  freeifaddrs(list);
  return found != NULL ? ncclSuccess : route_source(remote, addr_p);
}

ncclResult_t sock_parse_addr(const char *text, sock_addr_t *addr_p) {
  char host[256];
  const char *port;
  if (text[0] == '[') {
    const char *close_br = strchr(text, ']');
    if (close_br == NULL || close_br[1] != ':' || (size_t)(close_br - text - 1) >= sizeof host)
      return log_err(ncclInvalidArgument, "address \"%s\" is not of the form [ipv6]:port", text);
    snprintf(host, sizeof host, "%.*s", (int)(close_br - text - 1), text + 1);
    port = close_br + 2;
  } else {
    const char *colon = strrchr(text, ':');
    if (colon == NULL || colon == text || (size_t)(colon - text) >= sizeof host)
      return log_err(ncclInvalidArgument, "address \"%s\" is not of the form host:port", text);
    snprintf(host, sizeof host, "%.*s", (int)(colon - text), text);
    port = colon + 1;
  }
  char *end;
  long p = strtol(port, &end, 10);
  if (*port == '\0' || *end != '\0' || p < 0 || p > 65535)
    return log_err(ncclInvalidArgument, "address \"%s\": port \"%s\" is not a number from 0 to 65535", text,
                   port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0)
    return log_err(ncclInvalidArgument, "address \"%s\": cannot resolve \"%s\": %s", text, host,
                   gai_strerror(rc));
  memset(addr_p, 0, sizeof *addr_p);
  memcpy(addr_p, res->ai_addr, res->ai_addrlen <= sizeof *addr_p ? res->ai_addrlen : sizeof *addr_p);
  addr_p->sin.sin_port = htons((uint16_t)p);
  freeaddrinfo(res);
  return ncclSuccess;
}

/* ---- Waiting ---- */

/* Whether the abort flag is raised. The flag is written by another thread (any store); it publishes no data,
 * so a relaxed load suffices: the poll slice bounds how late it is seen. */
static int aborted(const volatile int *abort_flag) {
  return abort_flag != NULL && __atomic_load_n(abort_flag, __ATOMIC_RELAXED) != 0;
}

/* Waits until fd has one of `events` (or an error/hangup), the abort flag rises, or the deadline passes. */
static ncclResult_t wait_fd(int fd, short events, const volatile int *abort_flag, double deadline,
                            const char *doing, const char *where) {
  for (;;) {
    if (aborted(abort_flag)) return log_err(ncclInternalError, "%s %s: aborted", doing, where);
    int slice = POLL_SLICE_MS;
    if (deadline > 0) {
      double left = deadline - time_now();
      if (left <= 0) return log_err(ncclSystemError, "%s %s: timed out (deadline passed)", doing, where);
      if (left * 1000 < slice) slice = (int)(left * 1000) + 1;
    }
    struct pollfd pfd = {.fd = fd, .events = events};
    int n = poll(&pfd, 1, slice);
    if (n > 0) return ncclSuccess;
    if (n < 0 && errno != EINTR)
      return log_err(ncclSystemError, "%s %s: poll failed: %s", doing, where, strerror(errno));
  }
}

/* ---- Connections ---- */

static ncclResult_t set_nodelay(int fd, const char *where) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    return log_err(ncclSystemError, "setsockopt(TCP_NODELAY) on %s failed: %s", where, strerror(errno));
  return ncclSuccess;
}

static ncclResult_t set_nonblocking(int fd, int on, const char *where) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) != 0)
    return log_err(ncclSystemError, "fcntl(O_NONBLOCK) on %s failed: %s", where, strerror(errno));
  return ncclSuccess;
}

ncclResult_t sock_listen(sock_addr_t *addr, int *fd_p) {
  char name[SOCK_ADDR_STRLEN];
  sock_addr_str(addr, name);
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return log_err(ncclSystemError, "socket() to listen on %s failed: %s", name, strerror(errno));
  ncclResult_t res = ncclSuccess;
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) {
    res = log_err(ncclSystemError, "setsockopt(SO_REUSEADDR) on %s failed: %s", name, strerror(errno));
    goto err_close_fd;
  }
  if (bind(fd, &addr->sa, addr_len(addr)) != 0) {
    res = log_err(ncclSystemError, "bind to %s failed: %s", name, strerror(errno));
    goto err_close_fd;
  }
  if (listen(fd, SOMAXCONN) != 0) {
    res = log_err(ncclSystemError, "listen on %s failed: %s", name, strerror(errno));
    goto err_close_fd;
  }
  /* Non-blocking, so that an accept after poll() never blocks when a pending connection went away. */
  CHECK_GOTO(set_nonblocking(fd, 1, name), res, err_close_fd);
  socklen_t len = sizeof *addr;
  if (getsockname(fd, &addr->sa, &len) != 0) {
    res = log_err(ncclSystemError, "getsockname of %s failed: %s", name, strerror(errno));
    goto err_close_fd;
  }
  *fd_p = fd;
  return ncclSuccess;
err_close_fd:
  close(fd);
  return res;
}

ncclResult_t sock_accept(int listen_fd, const volatile int *abort_flag, double deadline, int *fd_p) {
  char name[SOCK_ADDR_STRLEN];
  sock_addr_t local;
  socklen_t len = sizeof local;
  memset(&local, 0, sizeof local);
  getsockname(listen_fd, &local.sa, &len);
  sock_addr_str(&local, name);
  for (;;) {
    CHECK(wait_fd(listen_fd, POLLIN, abort_flag, deadline, "waiting for a connection on", name));
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      ncclResult_t res = set_nodelay(fd, name);
      if (res != ncclSuccess)
        close(fd);
      else
        *fd_p = fd;
      return res;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      return log_err(ncclSystemError, "accept on %s failed: %s", name, strerror(errno));
  }
}

ncclResult_t sock_accept_now(int listen_fd, int *fd_p, sock_addr_t *peer_p) {
  sock_addr_t peer;
  socklen_t len = sizeof peer;
  memset(&peer, 0, sizeof peer);
  int fd = accept4(listen_fd, &peer.sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
  *fd_p = -1;
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
      return ncclSuccess;
    /* out of descriptors: the connection stays in the backlog until some are free again */
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) return ncclSuccess;
    return log_err(ncclSystemError, "accept failed: %s", strerror(errno));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (peer_p != NULL) *peer_p = peer;
  *fd_p = fd;
  return ncclSuccess;
}

uint64_t sock_host_key(const sock_addr_t *addr) {
  if (addr->sa.sa_family == AF_INET) return hash_bytes(&addr->sin.sin_addr, sizeof addr->sin.sin_addr);
  if (addr->sa.sa_family == AF_INET6) return hash_bytes(&addr->sin6.sin6_addr, sizeof addr->sin6.sin6_addr);
  return 0;
}

/* Whether a failed connection attempt is worth repeating (the listener may not be up yet). */
static int retryable(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
         err == ECONNRESET;
}

/* One non-blocking connection attempt; on failure *err_p holds the errno (0 on success). */
static ncclResult_t connect_once(const sock_addr_t *addr, const volatile int *abort_flag, double deadline,
                                 const char *name, int *fd_p, int *err_p) {
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return log_err(ncclSystemError, "socket() to connect to %s failed: %s", name, strerror(errno));
  ncclResult_t res = ncclSuccess;
  int err = 0;
  if (connect(fd, &addr->sa, addr_len(addr)) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      CHECK_GOTO(wait_fd(fd, POLLOUT, abort_flag, deadline, "connecting to", name), res, err_close_fd);
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
  }
  *err_p = err;
  if (err != 0) goto err_close_fd;
  CHECK_GOTO(set_nonblocking(fd, 0, name), res, err_close_fd);
  CHECK_GOTO(set_nodelay(fd, name), res, err_close_fd);
  *fd_p = fd;
  return ncclSuccess;
err_close_fd:
  close(fd);
  return res;
}

ncclResult_t sock_connect_once(const sock_addr_t *addr, const volatile int *abort_flag, double deadline,
                               int *fd_p) {
  char name[SOCK_ADDR_STRLEN];
  sock_addr_str(addr, name);
  int err;
  CHECK(connect_once(addr, abort_flag, deadline, name, fd_p, &err));
  if (err == 0) return ncclSuccess;
  /* refused, or reset from the backlog of a listener that closed: nobody listens there any more */
  return log_err(err == ECONNREFUSED || err == ECONNRESET ? ncclRemoteError : ncclSystemError,
                 "connect to %s failed: %s", name, strerror(err));
}

ncclResult_t sock_connect(const sock_addr_t *addr, const volatile int *abort_flag, double deadline,
                          int *fd_p) {
  char name[SOCK_ADDR_STRLEN];
  sock_addr_str(addr, name);
  int64_t retries = param_int(P_BRAID_CONNECT_RETRIES);
  for (int64_t attempt = 0;; attempt++) {
    int err;
    CHECK(connect_once(addr, abort_flag, deadline, name, fd_p, &err));
    if (err == 0) return ncclSuccess;
    if (!retryable(err)) return log_err(ncclSystemError, "connect to %s failed: %s", name, strerror(err));
    if (attempt >= retries)
      return log_err(ncclSystemError, "connect to %s failed after %lld retries: %s", name, (long long)retries,
                     strerror(err));
    if (deadline > 0 && time_now() + CONNECT_RETRY_US * 1e-6 > deadline)
      return log_err(ncclSystemError, "connect to %s failed before the deadline (%lld attempts): %s", name,
                     (long long)attempt + 1, strerror(err));
    if (aborted(abort_flag)) return log_err(ncclInternalError, "connecting to %s: aborted", name);
    time_sleep_us(CONNECT_RETRY_US);
  }
}

/* ---- Data ---- */

/* Turns a failed send/recv into the error it is: a closed connection is the peer's doing. */
static ncclResult_t io_error(int fd, int err, const char *op, const char *what, size_t done, size_t n) {
  char name[SOCK_ADDR_STRLEN];
  peer_str(fd, name);
  if (err == ECONNRESET || err == EPIPE || err == 0)
    return log_err(ncclRemoteError,
                   "%s: connection with %s closed by the peer during %s after %zu of %zu bytes%s%s", what,
                   name, op, done, n, err != 0 ? ": " : "", err != 0 ? strerror(err) : "");
  return log_err(ncclSystemError, "%s: %s on the connection with %s failed after %zu of %zu bytes: %s", what,
                 op, name, done, n, strerror(err));
}

ncclResult_t sock_send_some(int fd, const void *buf, size_t n, size_t *moved_p, const char *what) {
  ssize_t ret;
  SYS_RETRY(ret, send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL));
  if (ret < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    ret = 0;
  else if (ret < 0)
    return io_error(fd, errno, "send", what, 0, n);
  *moved_p = (size_t)ret;
  return ncclSuccess;
}

ncclResult_t sock_recv_some(int fd, void *buf, size_t n, size_t *moved_p, const char *what) {
  ssize_t ret;
  if (n == 0) {
    *moved_p = 0;
    return ncclSuccess;
  }
  SYS_RETRY(ret, recv(fd, buf, n, MSG_DONTWAIT));
  if (ret == 0) return io_error(fd, 0, "receive", what, 0, n);
  if (ret < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    ret = 0;
  else if (ret < 0)
    return io_error(fd, errno, "receive", what, 0, n);
  *moved_p = (size_t)ret;
  return ncclSuccess;
}

/* Moves exactly n bytes in one direction, polling between partial transfers. */
static ncclResult_t transfer_all(int fd, char *buf, size_t n, int sending, const volatile int *abort_flag,
                                 double deadline, const char *what) {
  char name[SOCK_ADDR_STRLEN], where[256] = "";
  size_t done = 0;
  while (done < n) {
    ssize_t ret;
    if (sending)
      SYS_RETRY(ret, send(fd, buf + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL));
    else
      SYS_RETRY(ret, recv(fd, buf + done, n - done, MSG_DONTWAIT));
    if (ret > 0) {
      done += (size_t)ret;
      continue;
    }
    if (ret == 0 && !sending) return io_error(fd, 0, "receive", what, done, n);
    if (ret < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return io_error(fd, errno, sending ? "send" : "receive", what, done, n);
    if (where[0] == '\0') snprintf(where, sizeof where, "%s (peer %s)", what, peer_str(fd, name));
    CHECK(wait_fd(fd, sending ? POLLOUT : POLLIN, abort_flag, deadline, sending ? "sending" : "receiving",
                  where));
  }
  return ncclSuccess;
}

ncclResult_t sock_send_all(int fd, const void *buf, size_t n, const volatile int *abort_flag, double deadline,
                           const char *what) {
  return transfer_all(fd, (char *)buf, n, 1, abort_flag, deadline, what);
}

ncclResult_t sock_recv_all(int fd, void *buf, size_t n, const volatile int *abort_flag, double deadline,
                           const char *what) {
  return transfer_all(fd, buf, n, 0, abort_flag, deadline, what);
}

void sock_close(int fd) {
  if (fd >= 0) close(fd);
}
