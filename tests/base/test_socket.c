/*
 * Tests of base/socket: the NCCL_SOCKET_IFNAME rules, interface selection on this machine, address parsing
 * and formatting, and connections whose waits end on a deadline, an abort or a closed peer.
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/timeutil.h"
#include "harness.h"

static void set_param(const char *name, const char *value) {
  if (value != NULL)
    setenv(name, value, 1);
  else
    unsetenv(name);
  param_reload();
}

static void test_ifname_rules(void) {
  EXPECT(sock_ifname_match("eth", "eth0"));
  EXPECT(sock_ifname_match("ib,eth", "eth1"));
  EXPECT(!sock_ifname_match("ib,eth", "lo"));
  EXPECT(!sock_ifname_match("^docker,lo", "docker0"));
  EXPECT(!sock_ifname_match("^docker,lo", "lo"));
  EXPECT(sock_ifname_match("^docker,lo", "eth0"));
  EXPECT(sock_ifname_match("=eth0", "eth0"));
  EXPECT(!sock_ifname_match("=eth0", "eth01"));
  EXPECT(!sock_ifname_match("=eth", "eth0"));
  EXPECT(sock_ifname_match("=eth1,eth0", "eth0"));
  EXPECT(!sock_ifname_match("^=eth0", "eth0"));
  EXPECT(sock_ifname_match("^=eth0", "eth01"));
}

/* The name of the first interface up with an IPv4 address that is not loopback/docker/virbr; "" if none. */
static void first_plain_interface(char *name, size_t len) {
  struct ifaddrs *list;
  name[0] = '\0';
  EXPECT(getifaddrs(&list) == 0);
  for (struct ifaddrs *ifa = list; ifa != NULL && name[0] == '\0'; ifa = ifa->ifa_next)
    if (ifa->ifa_addr != NULL && ifa->ifa_addr->sa_family == AF_INET && (ifa->ifa_flags & IFF_UP) &&
        sock_ifname_match("^docker,lo,virbr", ifa->ifa_name))
      snprintf(name, len, "%s", ifa->ifa_name);
  freeifaddrs(list);
}

static void test_interface_selection(void) {
  sock_addr_t addr;
  char name[64], buf[SOCK_ADDR_STRLEN];
  set_param("NCCL_SOCKET_IFNAME", "lo");
  set_param("NCCL_SOCKET_FAMILY", "AF_INET");
  EXPECT_OK(sock_find_interface(&addr, name, sizeof name));
  EXPECT(strcmp(name, "lo") == 0 && addr.sa.sa_family == AF_INET, "got %s", name);
  EXPECT(strcmp(sock_addr_str(&addr, buf), "127.0.0.1:0") == 0, "got %s", buf);

  set_param("NCCL_SOCKET_IFNAME", "=lo");
  EXPECT_OK(sock_find_interface(&addr, name, sizeof name));
  EXPECT(strcmp(name, "lo") == 0);
  set_param("NCCL_SOCKET_IFNAME", "=l");
  EXPECT_RES(sock_find_interface(&addr, name, sizeof name), ncclSystemError);
  EXPECT(strstr(log_last_error(), "NCCL_SOCKET_IFNAME") != NULL, "message: %s", log_last_error());
  set_param("NCCL_SOCKET_FAMILY", "AF_UNIX");
  EXPECT_RES(sock_find_interface(&addr, name, sizeof name), ncclInvalidArgument);
  set_param("NCCL_SOCKET_FAMILY", NULL);

  char plain[64];
  first_plain_interface(plain, sizeof plain);
  set_param("NCCL_SOCKET_IFNAME", NULL);
  EXPECT_OK(sock_find_interface(&addr, name, sizeof name));
  if (plain[0] != '\0')
    EXPECT(strcmp(name, plain) == 0, "default picked %s, expected %s", name, plain);
  else
    EXPECT(strncmp(name, "lo", 2) == 0, "default picked %s, expected loopback", name);
  set_param("NCCL_SOCKET_IFNAME", "^lo");
  if (plain[0] != '\0') {
    EXPECT_OK(sock_find_interface(&addr, name, sizeof name));
    EXPECT(strncmp(name, "lo", 2) != 0, "^lo picked %s", name);
    set_param("NCCL_SOCKET_IFNAME", "^=lo");
    EXPECT_OK(sock_find_interface(&addr, name, sizeof name));
    EXPECT(strcmp(name, "lo") != 0);
  }
  set_param("NCCL_SOCKET_IFNAME", NULL);
}

static void test_interface_for(void) {
  sock_addr_t remote, local;
  char buf[SOCK_ADDR_STRLEN];
  EXPECT_OK(sock_parse_addr("127.0.0.1:5000", &remote));
  EXPECT_OK(sock_find_interface_for(&remote, &local));
  EXPECT(strcmp(sock_addr_str(&local, buf), "127.0.0.1:0") == 0, "got %s", buf);
}

static void test_parse_format(void) {
  sock_addr_t addr;
  char buf[SOCK_ADDR_STRLEN];
  EXPECT_OK(sock_parse_addr("10.1.2.3:41234", &addr));
  EXPECT(addr.sa.sa_family == AF_INET);
  EXPECT(strcmp(sock_addr_str(&addr, buf), "10.1.2.3:41234") == 0, "got %s", buf);
  EXPECT_OK(sock_parse_addr("[fd00::2]:80", &addr));
  EXPECT(addr.sa.sa_family == AF_INET6);
  EXPECT(strcmp(sock_addr_str(&addr, buf), "[fd00::2]:80") == 0, "got %s", buf);
  EXPECT_OK(sock_parse_addr("::1:7", &addr));
  EXPECT(strcmp(sock_addr_str(&addr, buf), "[::1]:7") == 0, "got %s", buf);
  EXPECT_OK(sock_parse_addr("localhost:99", &addr));
  EXPECT(ntohs(addr.sin.sin_port) == 99);
  EXPECT_RES(sock_parse_addr("10.1.2.3", &addr), ncclInvalidArgument);
  EXPECT_RES(sock_parse_addr("10.1.2.3:70000", &addr), ncclInvalidArgument);
  EXPECT_RES(sock_parse_addr("10.1.2.3:x", &addr), ncclInvalidArgument);
  EXPECT_RES(sock_parse_addr("[fd00::2:80", &addr), ncclInvalidArgument);
  EXPECT_RES(sock_parse_addr("no.such.host.invalid:1", &addr), ncclInvalidArgument);
}

/* A listening loopback socket and one connection to it: fds[0] connected side, fds[1] accepted side. */
static void loopback_pair(const char *ip, int *listen_fd, int fds[2]) {
  sock_addr_t addr;
  char text[64];
  snprintf(text, sizeof text, "%s:0", ip);
  EXPECT_OK(sock_parse_addr(text, &addr));
  EXPECT_OK(sock_listen(&addr, listen_fd));
  EXPECT(addr.sin.sin_port != 0);
  EXPECT_OK(sock_connect(&addr, NULL, time_now() + 5, &fds[0]));
  EXPECT_OK(sock_accept(*listen_fd, NULL, time_now() + 5, &fds[1]));
}

static void test_transfer(void) {
  const char *ips[] = {"127.0.0.1", "[::1]"};
  for (int i = 0; i < 2; i++) {
    int lfd, fds[2];
    loopback_pair(ips[i], &lfd, fds);
    /* Larger than the socket buffers, so both sides must poll: the child sends while the parent receives. */
    size_t n = 8 << 20;
    char *buf = malloc(n), *got = malloc(n);
    for (size_t k = 0; k < n; k++) buf[k] = (char)(k * 131 + 7);
    pid_t pid = fork();
    if (pid == 0) {
      EXPECT_OK(sock_send_all(fds[0], buf, n, NULL, time_now() + 20, "test send"));
      _exit(0);
    }
    EXPECT_OK(sock_recv_all(fds[1], got, n, NULL, time_now() + 20, "test recv"));
    EXPECT(memcmp(buf, got, n) == 0);
    size_t moved = 1;
    EXPECT_OK(sock_recv_some(fds[1], got, 16, &moved, "test recv_some"));
    EXPECT(moved == 0);
    EXPECT_OK(sock_send_some(fds[1], "x", 1, &moved, "test send_some"));
    EXPECT(moved == 1);
    sock_close(fds[0]);
    EXPECT_RES(sock_recv_all(fds[1], got, 4, NULL, time_now() + 5, "the closed test connection"),
               ncclRemoteError);
    EXPECT(strstr(log_last_error(), "the closed test connection") != NULL, "message: %s", log_last_error());
    sock_close(fds[1]);
    sock_close(lfd);
    free(buf);
    free(got);
  }
}

static void test_deadline(void) {
  int lfd, fds[2];
  loopback_pair("127.0.0.1", &lfd, fds);
  char c;
  double t0 = time_now();
  EXPECT_RES(sock_recv_all(fds[1], &c, 1, NULL, t0 + 0.3, "a byte that never comes"), ncclSystemError);
  double took = time_now() - t0;
  EXPECT(took >= 0.29 && took < 1.0, "took %.2f s", took);
  EXPECT(strstr(log_last_error(), "a byte that never comes") != NULL, "message: %s", log_last_error());
  EXPECT(strstr(log_last_error(), "127.0.0.1") != NULL, "message: %s", log_last_error());
  EXPECT_RES(sock_accept(lfd, NULL, time_now() + 0.2, &fds[0]), ncclSystemError);
}

static volatile int abort_flag;

static void *raise_abort(void *arg) {
  time_sleep_us(300000);
  __atomic_store_n(&abort_flag, 1, __ATOMIC_RELAXED);
  return arg;
}

static void test_abort(void) {
  int lfd, fds[2];
  loopback_pair("127.0.0.1", &lfd, fds);
  pthread_t thread;
  pthread_create(&thread, NULL, raise_abort, NULL);
  char c;
  double t0 = time_now();
  EXPECT_RES(sock_recv_all(fds[1], &c, 1, &abort_flag, 0, "an aborted receive"), ncclInternalError);
  EXPECT(time_now() - t0 < 1.0);
  EXPECT(strstr(log_last_error(), "aborted") != NULL, "message: %s", log_last_error());
  pthread_join(thread, NULL);
}

static void test_connect_refused(void) {
  sock_addr_t addr;
  int lfd, fd;
  EXPECT_OK(sock_parse_addr("127.0.0.1:0", &addr));
  EXPECT_OK(sock_listen(&addr, &lfd));
  sock_close(lfd); /* the port is now (almost certainly) closed */
  set_param("BRAID_CONNECT_RETRIES", "3");
  double t0 = time_now();
  EXPECT_RES(sock_connect(&addr, NULL, 0, &fd), ncclSystemError);
  double took = time_now() - t0;
  EXPECT(took >= 0.25 && took < 2.0, "took %.2f s", took);
  EXPECT(strstr(log_last_error(), "refused") != NULL, "message: %s", log_last_error());
}

int main(void) {
  TEST(test_ifname_rules, 10);
  TEST(test_interface_selection, 10);
  TEST(test_interface_for, 10);
  TEST(test_parse_format, 10);
  TEST(test_transfer, 30);
  TEST(test_deadline, 10);
  TEST(test_abort, 10);
  TEST(test_connect_refused, 10);
  return test_summary();
}
