/*
 * libFuzzer target: the bootstrap root's handling of what connections send it. The input is a sequence of
 * hellos and links (root_msg_t), fed to the root's dispatch as complete first messages for one id; a byte of
 * each decides whether its magic and nonce are made right, so most reach the id's state. Then the id moves
 * on now and after its deadline. Whatever a message claims (2^31 ranks, negative counts, duplicates), the
 * root must answer or drop it in time and memory that grow with the messages, never with the claims.
 *
 * The root's file is compiled into this target (its state is private to it); replies go to closed
 * descriptors.
 */
#include "../../src/bootstrap/root.c"

#define FUZZ_NONCE 0x1234567887654321ull

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int quiet;
  if (!quiet) {
    setenv("BRAID_BOOTSTRAP_TIMEOUT_S", "5", 1);
    quiet = 1;
  }
  served_t *s = calloc(1, sizeof *s);
  if (s == NULL) return 0;
  s->nonce = FUZZ_NONCE;
  svc.ids = s;
  svc.nids = 1;
  for (size_t off = 0; off + 1 + sizeof(root_msg_t) <= size && off < 64 * (1 + sizeof(root_msg_t));
       off += 1 + sizeof(root_msg_t)) {
    root_msg_t m;
    memcpy(&m, data + off + 1, sizeof m);
    uint8_t fix = data[off];
    if (fix & 1) m.magic = BOOT_MAGIC;
    if (fix & 2) m.nonce = FUZZ_NONCE;
    if (fix & 4) m.type = (fix & 8) ? MSG_LINK : MSG_HELLO;
    if (fix & 16) m.nranks = (m.nranks & 0xff) + 1; /* small blocks complete, so replies go out too */
    if (fix & 32) m.rank = m.rank & 0xff;
    if (fix & 64) m.nid = 1, m.index = 0;
    on_hello(NULL, -1, &m);
    s->link_sent = 1; /* a link would go to whatever address the input names: never sent here */
    if (step(s, time_now())) break;
  }
  if (s->error[0] == '\0' && s->nranks > 0) step(s, time_now() + 1e6); /* past the deadline */
  svc.ids = NULL;
  svc.nids = 0;
  served_free(s);
  return 0;
}
