/*
 * TCP sockets for the bootstrap and the net transport: interface selection (NCCL_SOCKET_IFNAME,
 * NCCL_SOCKET_FAMILY), listening, connecting with bounded retries, and whole-message send/receive.
 *
 * Every blocking call polls in short slices, checks `abort_flag` (may be NULL) and gives up at `deadline`
 * (a time_now() value; 0 means no deadline), so no wait here is endless. Errors name the address involved.
 */
#ifndef BRAID_BASE_SOCKET_H
#define BRAID_BASE_SOCKET_H

#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>

#include "nccl.h"

/* An IPv4 or IPv6 socket address. */
typedef union {
  struct sockaddr sa;
  struct sockaddr_in sin;
  struct sockaddr_in6 sin6;
} sock_addr_t;

/* Longest text sock_addr_str writes ("[v6 address]:port"). */
#define SOCK_ADDR_STRLEN 64

/* Picks the address to listen on: the first interface matching NCCL_SOCKET_IFNAME ("eth" prefix,
 * "^docker,lo" excluded prefixes, "=eth0" exact names) and NCCL_SOCKET_FAMILY; by default any interface but
 * docker*, lo and virbr*, then lo. Writes its address (port 0) and, if ifname is not NULL, its name. */
ncclResult_t sock_find_interface(sock_addr_t *addr_p, char *ifname, size_t ifname_len);
/* Whether interface `ifname` passes an NCCL_SOCKET_IFNAME-style rule: comma list of prefixes, "^" to exclude
 * them, "=" for exact names ("^=a,b" excludes exactly a and b). */
int sock_ifname_match(const char *spec, const char *ifname);
/* Finds the local interface from which `remote` is reachable (same subnet), for NCCL_COMM_ID. */
ncclResult_t sock_find_interface_for(const sock_addr_t *remote, sock_addr_t *addr_p);
/* Parses "host:port", "ip:port" or "[ipv6]:port". */
ncclResult_t sock_parse_addr(const char *text, sock_addr_t *addr_p);
/* Formats an address as "ip:port" / "[ip]:port" into buf (SOCK_ADDR_STRLEN bytes) and returns buf. */
const char *sock_addr_str(const sock_addr_t *addr, char *buf);

/* Listens on *addr (port 0: any free port); writes back the bound address. */
ncclResult_t sock_listen(sock_addr_t *addr, int *fd_p);
/* Accepts one connection on a listening socket, waiting until `deadline`. */
ncclResult_t sock_accept(int listen_fd, const volatile int *abort_flag, double deadline, int *fd_p);
/* Accepts one connection if one is waiting, without waiting: *fd_p is -1 when none is. The connection is
 * non-blocking; *peer_p (may be NULL) is the address it comes from. */
ncclResult_t sock_accept_now(int listen_fd, int *fd_p, sock_addr_t *peer_p);
/* A hash of the host part of an address (not the port): connections from one machine share it. */
uint64_t sock_host_key(const sock_addr_t *addr);
/* Connects to addr once, without retrying: a refused or reset connection is ncclRemoteError (nothing listens
 * there: a listener known to have been there is gone). */
ncclResult_t sock_connect_once(const sock_addr_t *addr, const volatile int *abort_flag, double deadline,
                               int *fd_p);
/* Connects to addr, retrying refused or unreachable attempts (BRAID_CONNECT_RETRIES, 100 ms apart). */
ncclResult_t sock_connect(const sock_addr_t *addr, const volatile int *abort_flag, double deadline,
                          int *fd_p);
/* Sends / receives exactly n bytes. A closed or reset connection is ncclRemoteError, naming `what`. */
ncclResult_t sock_send_all(int fd, const void *buf, size_t n, const volatile int *abort_flag, double deadline,
                           const char *what);
ncclResult_t sock_recv_all(int fd, void *buf, size_t n, const volatile int *abort_flag, double deadline,
                           const char *what);
/* Non-blocking send / receive of up to n bytes: writes how many moved (0 if none could). A closed or reset
 * connection is ncclRemoteError. */
ncclResult_t sock_send_some(int fd, const void *buf, size_t n, size_t *moved_p, const char *what);
ncclResult_t sock_recv_some(int fd, void *buf, size_t n, size_t *moved_p, const char *what);
/* Closes a socket (fd < 0 is ignored). */
void sock_close(int fd);

#endif
