/*
 * libFuzzer target: decoding what peers send a rank's bootstrap. The input is split in two streams: tagged
 * messages (headers and payloads) on a peer's connection, and what the ring successor sends against the ring
 * (notices). Both are written to socket pairs and read by the progress engine's own readers until the streams
 * end; queued messages are then taken and freed. Sizes up to 2^64, partial headers, bad notices: each must be
 * refused or queued, never overflow or leak.
 *
 * The file of the tagged messages is compiled into this target (its readers are private to it).
 */
#include "../../src/bootstrap/msg.c"

#include <sys/socket.h>
#include <unistd.h>

enum { NRANKS = 4, PEER = 1 };

/* A socket pair whose one end holds `n` bytes and then end-of-stream; returns the other end. */
static int stream_of(const uint8_t *data, size_t n) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  size_t done = 0;
  while (done < n) {
    ssize_t w = send(sv[1], data + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w <= 0) break;
    done += (size_t)w;
  }
  close(sv[1]);
  return sv[0];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > 60000) return 0;
  size_t split = (size_t)data[0] * size / 256;
  boot_t *b = calloc(1, sizeof *b);
  if (b == NULL) return 0;
  b->rank = 0;
  b->nranks = NRANKS;
  b->nonce = 42;
  b->listen_fd = b->ring_recv_fd = -1;
  b->queue_tail = &b->queue;
  b->send_fds = malloc(NRANKS * sizeof *b->send_fds);
  b->recv_fds = malloc(NRANKS * sizeof *b->recv_fds);
  b->closed_at = calloc(NRANKS, sizeof *b->closed_at);
  b->rx = calloc(NRANKS, sizeof *b->rx);
  b->addrs = calloc(NRANKS, sizeof *b->addrs);
  for (int r = 0; r < NRANKS; r++) b->send_fds[r] = b->recv_fds[r] = -1;
  b->fds_ready = 1;
  /* as if a failure were known already: a reader that sees a peer leave fails at once instead of waiting
   * for a notice (boot_blame), which would make every input take half a second */
  snprintf(b->failed, sizeof b->failed, "fuzzing");
  b->recv_fds[PEER] = stream_of(data + 1, split);
  b->ring_send_fd = stream_of(data + 1 + split, size - 1 - split);
  for (int round = 0; round < 64 && b->recv_fds[PEER] >= 0; round++)
    if (read_messages(b, PEER) != ncclSuccess) break;
  for (int round = 0; round < 64 && b->succ_closed == 0 && b->ring_send_fd >= 0; round++) read_successor(b);
  for (uint32_t tag = 0; tag < 4; tag++) free(dequeue(b, PEER, tag));
  boot_free_queue(b);
  sock_close(b->recv_fds[PEER]);
  sock_close(b->ring_send_fd);
  for (int r = 0; r < NRANKS; r++) free(b->rx[r].msg);
  free(b->send_fds);
  free(b->recv_fds);
  free(b->closed_at);
  free(b->rx);
  free(b->addrs);
  free(b->pfds);
  free(b);
  return 0;
}
