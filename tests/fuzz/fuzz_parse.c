/*
 * libFuzzer target: the parsers of what users and other processes hand the library. The first byte picks
 * one: a unique id's bytes (boot_check_id), a socket address ("host:port"), an ncclConfig_t of any claimed
 * size (comm_config_check), NCCL_ALGO and NCCL_PROTO specs, and NCCL_SOCKET_IFNAME rules. Each must return
 * an error or a value, never crash, read out of bounds or hang.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/socket.h"
#include "bootstrap/bootstrap.h"
#include "core/comm.h"
#include "core/plan.h"
#include "core/tune.h"

/* The input after the selector byte, as a NUL-terminated string. */
static char *text(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (s == NULL) return NULL;
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

/* The config struct as a caller of any header version would pass it: at least as many bytes as it claims. */
static void parse_config(const uint8_t *data, size_t size) {
  ncclConfig_t probe;
  memset(&probe, 0, sizeof probe);
  memcpy(&probe, data, size < sizeof probe ? size : sizeof probe);
  size_t claimed = probe.size < 65536 ? probe.size : 65536, room = claimed > size ? claimed : size;
  char *buf = calloc(1, room > sizeof probe ? room : sizeof probe);
  if (buf == NULL) return;
  memcpy(buf, data, size);
  ncclConfig_t out;
  (void)comm_config_check((const ncclConfig_t *)buf, &out);
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t which = data[0] % 5;
  data++;
  size--;
  if (which == 0) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    memcpy(id.internal, data, size < sizeof id.internal ? size : sizeof id.internal);
    (void)boot_check_id(&id);
    return 0;
  }
  if (which == 2) {
    parse_config(data, size);
    return 0;
  }
  char *s = text(data, size);
  if (s == NULL) return 0;
  if (which == 1) {
    sock_addr_t addr;
    (void)sock_parse_addr(s, &addr);
  } else if (which == 3) {
    uint8_t algos[OP_COUNT];
    tune_parse_algo(s, algos);
    (void)tune_parse_proto(s, "LL");
    (void)tune_parse_proto(s, "LL128");
  } else {
    char *name = strchr(s, '|'); /* "spec|ifname" */
    if (name != NULL) *name++ = '\0';
    (void)sock_ifname_match(s, name != NULL ? name : "eth0");
  }
  free(s);
  return 0;
}
