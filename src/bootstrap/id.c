/*
 * Unique ids (see bootstrap.h): making, checking and reading them.
 *
 * The nonce is the id's secret: every message of the communicator carries it, and a connection that does not
 * is dropped. An id from ncclGetUniqueId has a random nonce, known only to the processes the application
 * hands the id to. An id made from NCCL_COMM_ID is computed by every rank from what it was told, so its nonce
 * comes from BRAID_COMM_SECRET (which the launcher sets on every rank) and the address; without the secret it
 * is the address's hash, which anyone who can reach the address can compute too.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/random.h>

#include "base/check.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/param.h"
#include "bootstrap.h"
#include "root.h"
#include "wire.h"

static void encode_id(const id_body_t *body, ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  memcpy(id->internal, body, sizeof *body);
  uint64_t sum = hash_bytes(id->internal, sizeof id->internal);
  memcpy(id->internal, &sum, sizeof sum);
}

void id_decode(const ncclUniqueId *id, id_body_t *body) {
  memcpy(body, id->internal, sizeof *body);
}

ncclResult_t boot_check_id(const ncclUniqueId *id) {
  id_body_t body;
  id_decode(id, &body);
  if (body.magic != BOOT_MAGIC)
    return log_err(ncclInvalidArgument,
                   "ncclUniqueId was not made by this library (magic %#llx, expected %#llx)",
                   (unsigned long long)body.magic, (unsigned long long)BOOT_MAGIC);
  if (body.version != ID_VERSION)
    return log_err(ncclInvalidArgument, "ncclUniqueId has version %u, this library reads version %u",
                   body.version, ID_VERSION);
  ncclUniqueId copy = *id;
  memset(copy.internal, 0, sizeof body.checksum);
  uint64_t sum = hash_bytes(copy.internal, sizeof copy.internal);
  if (sum != body.checksum)
    return log_err(ncclInvalidArgument, "ncclUniqueId is corrupt (checksum %#llx, contents hash to %#llx)",
                   (unsigned long long)body.checksum, (unsigned long long)sum);
  if (body.root.sa.sa_family != AF_INET && body.root.sa.sa_family != AF_INET6)
    return log_err(ncclInvalidArgument, "ncclUniqueId names a root of address family %d",
                   body.root.sa.sa_family);
  if (body.nonce == 0) return log_err(ncclInvalidArgument, "ncclUniqueId has no nonce");
  return ncclSuccess;
}

uint64_t boot_id_nonce(const ncclUniqueId *id) {
  id_body_t body;
  id_decode(id, &body);
  return body.nonce;
}

static ncclResult_t random_nonce(uint64_t *nonce_p) {
  uint64_t nonce = 0;
  while (nonce == 0) {
    ssize_t n = getrandom(&nonce, sizeof nonce, 0);
    if (n != (ssize_t)sizeof nonce) {
      if (n < 0 && errno == EINTR) continue;
      return log_err(ncclSystemError, "getrandom for the unique id's nonce failed: %s",
                     n < 0 ? strerror(errno) : "short read");
    }
  }
  *nonce_p = nonce;
  return ncclSuccess;
}

ncclResult_t boot_start_root(const sock_addr_t *addr, uint64_t nonce) {
  sock_addr_t at;
  return root_serve(addr, nonce, &at);
}

ncclResult_t boot_new_unique_id(ncclUniqueId *id_p) {
  id_body_t body;
  memset(&body, 0, sizeof body);
  body.magic = BOOT_MAGIC;
  body.version = ID_VERSION;
  CHECK(random_nonce(&body.nonce));
  CHECK(root_serve(NULL, body.nonce, &body.root));
  encode_id(&body, id_p);
  return ncclSuccess;
}

static void warn_open(void) {
  WARN("bootstrap: NCCL_COMM_ID=%s without BRAID_COMM_SECRET: anyone who can reach that address can join or "
       "disturb this job's bootstrap; set BRAID_COMM_SECRET to the same secret on every rank",
       param_str(P_NCCL_COMM_ID));
}

/* The nonce of an NCCL_COMM_ID id: the same on every rank that has the same variables. */
uint64_t boot_comm_id_nonce(const char *comm_id) {
  const char *secret = param_str(P_BRAID_COMM_SECRET);
  if (*secret == '\0') {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, warn_open);
    return hash_bytes(comm_id, strlen(comm_id)) | 1;
  }
  uint64_t parts[2] = {hash_bytes(secret, strlen(secret)), hash_bytes(comm_id, strlen(comm_id))};
  return hash_bytes(parts, sizeof parts) | 1;
}

ncclResult_t boot_get_unique_id(ncclUniqueId *id_p) {
  const char *comm_id = param_str(P_NCCL_COMM_ID);
  if (*comm_id == '\0') return boot_new_unique_id(id_p);
  /* Every rank computes the same id from the same variables, so no id needs to travel: the body is zeroed
   * whole, padding included, so that every rank produces the same bytes. */
  id_body_t body;
  memset(&body, 0, sizeof body);
  body.magic = BOOT_MAGIC;
  body.version = ID_VERSION;
  body.flags = ID_ROOT_BY_RANK0;
  CHECK(sock_parse_addr(comm_id, &body.root));
  body.nonce = boot_comm_id_nonce(comm_id);
  encode_id(&body, id_p);
  return ncclSuccess;
}
