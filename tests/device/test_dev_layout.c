/*
 * Tests of what the host and the kernels share (device/dev.h), runnable without a GPU: the sizes and field
 * offsets of the structs both sides read (the work travels in the kernel parameters, at most 4 KiB), the
 * slicing arithmetic (every byte of a transfer in exactly one part, parts on 16-byte boundaries, pieces that
 * fit a slot, at most half a ring per part), and the fatbin embedded in the library.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "device/dev.h"
#include "harness.h"

/* ---- Layout ---- */

static void test_struct_sizes(void) {
  EXPECT(sizeof(dev_ctrl_t) == 384, "dev_ctrl_t is %zu bytes", sizeof(dev_ctrl_t));
  EXPECT(offsetof(dev_ctrl_t, tail) == 0);
  EXPECT(offsetof(dev_ctrl_t, head) == 128, "head shares no cache line with tail");
  EXPECT(offsetof(dev_ctrl_t, sizes) == 256);
  EXPECT(offsetof(dev_ctrl_t, pieces) == 256 + DEV_SLOTS * 8, "a dealt slot's piece beside its size");
  EXPECT(sizeof(dev_ring_t) == 24);
  EXPECT(offsetof(dev_ring_t, marks) == 16);
  EXPECT(sizeof(dev_error_t) == 32, "dev_error_t is %zu bytes", sizeof(dev_error_t));
  EXPECT(sizeof(dev_comm_t) == 144, "dev_comm_t is %zu bytes", sizeof(dev_comm_t));
  EXPECT(sizeof(dev_xfer_t) == 56, "dev_xfer_t is %zu bytes", sizeof(dev_xfer_t));
  EXPECT(offsetof(dev_xfer_t, recv_peer) == 24);
  EXPECT(offsetof(dev_xfer_t, scalar) == 40);
  EXPECT(offsetof(dev_xfer_t, scalar_ptr) == 48);
  EXPECT(sizeof(dev_work_t) == 248 + DEV_MAX_XFERS * sizeof(dev_xfer_t), "dev_work_t is %zu bytes",
         sizeof(dev_work_t));
  EXPECT(sizeof(dev_work_t) <= 4096, "dev_work_t (%zu bytes) exceeds the kernel parameter limit",
         sizeof(dev_work_t));
  EXPECT(offsetof(dev_work_t, step_lanes) == 212);
  EXPECT(offsetof(dev_work_t, nch) == 244, "nch fills the padding before the transfers");
  EXPECT(offsetof(dev_work_t, xfers) % 8 == 0);
  /* the small entry point reads the head of the same struct */
  EXPECT(offsetof(dev_work_small_t, xfers) == offsetof(dev_work_t, xfers));
  EXPECT(offsetof(dev_work_small_t, nch) == offsetof(dev_work_t, nch));
  EXPECT(sizeof(dev_work_small_t) == 248 + DEV_SMALL_XFERS * sizeof(dev_xfer_t), "dev_work_small_t is %zu",
         sizeof(dev_work_small_t));
  /* the copy-engine path's combine: the communicator, one transfer, the word, a pull's source, the call, the
   * peer, the chunks, the tile, its chunks' ends */
  EXPECT(sizeof(dev_combine_t) == sizeof(dev_comm_t) + sizeof(dev_xfer_t) + 40 + DEV_COMBINE_CHUNKS * 8,
         "dev_combine_t is %zu bytes", sizeof(dev_combine_t));
  EXPECT(sizeof(dev_combine_t) <= 4096, "dev_combine_t (%zu bytes) exceeds the kernel parameter limit",
         sizeof(dev_combine_t));
  EXPECT(offsetof(dev_combine_t, ends) % 8 == 0);
  /* the push: the communicator, five words, the call, the peer, the count of copies, the copies (source,
   * destination, bytes) */
  EXPECT(sizeof(dev_copy_t) == 24);
  EXPECT(sizeof(dev_push_t) == sizeof(dev_comm_t) + 5 * 8 + 8 + 8 + DEV_PUSH_COPIES * sizeof(dev_copy_t),
         "dev_push_t is %zu bytes", sizeof(dev_push_t));
  EXPECT(sizeof(dev_push_t) <= 4096, "dev_push_t (%zu bytes) exceeds the kernel parameter limit",
         sizeof(dev_push_t));
  EXPECT(offsetof(dev_push_t, copies) % 8 == 0);
}

static void test_constants(void) {
  EXPECT(DEV_SLOT_BYTES % 16 == 0);
  EXPECT(DEV_SLICE_BYTES == DEV_SLOTS / 2 * DEV_SLOT_BYTES, "a slice per channel is half a ring");
  EXPECT(DEV_RING_BYTES == sizeof(dev_ctrl_t) + (uint64_t)DEV_SLOTS * DEV_SLOT_BYTES);
  EXPECT(DEV_MAX_CHANNELS <= 255, "dev_xfer_t.nch is 8 bits");
  EXPECT(DEV_MAX_STEPS <= 16 && DEV_MAX_XFERS <= 255, "the kernel indexes lane transfers in 8 bits");
  EXPECT(DEV_THREADS % 32 == 0);
  /* LL: a line is 16 bytes carrying 8 of data; a slot holds one piece; a piece is whole lines */
  EXPECT(DEV_LL_SLOT_BYTES == 2 * DEV_LL_PIECE && DEV_LL_PIECE % 8 == 0);
  EXPECT(DEV_LL_RING_BYTES ==
         DEV_LL_ALIGN + (uint64_t)DEV_LL_SLOTS * (DEV_LL_SLOT_BYTES + DEV_LL128_SLOT_BYTES));
  EXPECT(sizeof(dev_ctrl_t) + (uint64_t)DEV_LL_SLOTS * DEV_LL_SLOT_BYTES <=
         sizeof(dev_ctrl_t) + DEV_LL128_AT);
  /* LL128: a slot of whole warp units, each 4 lines of 120 data bytes */
  EXPECT(DEV_LL128_SLOT_BYTES % 512 == 0 && DEV_LL128_UNIT_DATA == 4 * (DEV_LL128_LINE - 8));
  EXPECT(DEV_LL128_PIECE == DEV_LL128_SLOT_BYTES / 512 * DEV_LL128_UNIT_DATA && DEV_LL128_PIECE % 16 == 0);
  /* from a DEV_LL_ALIGN-aligned ring, every LL128 slot is DEV_LL_ALIGN-aligned */
  EXPECT((sizeof(dev_ctrl_t) + DEV_LL128_AT) % DEV_LL_ALIGN == 0 && DEV_LL_RING_BYTES % DEV_LL_ALIGN == 0 &&
         DEV_LL128_SLOT_BYTES % DEV_LL_ALIGN == 0);
  EXPECT(dev_ll_slot_at(9, DEV_PROTO_LL) == DEV_LL_SLOT_BYTES &&
         dev_ll_slot_at(9, DEV_PROTO_LL128) == DEV_LL128_AT + DEV_LL128_SLOT_BYTES);
  /* marks: a slot is whole chunks, and a chunk whole 16-byte packs */
  EXPECT(DEV_SLOT_BYTES % DEV_CHUNK_BYTES == 0 && DEV_CHUNK_BYTES % 16 == 0);
  const int planner = DEV_XF_REDUCE | DEV_XF_PREPARE | DEV_XF_LAST | DEV_XF_SEQ | DEV_XF_PREPARED;
  const int ll = DEV_XF_LL | DEV_XF_LL_SEND | DEV_XF_LL_RECV;
  EXPECT((ll & planner) == 0 && ll <= 0xff, "the LL marks take bits of dev_xfer_t.flags the planner leaves");
  EXPECT((DEV_XF_LL & (DEV_XF_LL_SEND | DEV_XF_LL_RECV)) == 0 && (DEV_XF_LL_SEND & DEV_XF_LL_RECV) == 0);
  /* the kernel copies its work to shared memory a word per thread */
  EXPECT(sizeof(dev_work_t) % 8 == 0 && sizeof(dev_work_t) / 8 <= DEV_THREADS);
  EXPECT(sizeof(dev_work_small_t) % 8 == 0);
  EXPECT(DEV_SMALL_XFERS <= DEV_MAX_XFERS);
}

/* ---- Slicing ---- */

/* Walks a transfer the way a channel does (slice by slice, channels in order) and checks that the parts
 * tile [0, bytes) in order, start on 16-byte boundaries, are 16-byte multiples except at the very end, lie
 * in their slice, and move in at most half a ring of pieces that each fit a slot. */
static void check_slicing(uint64_t bytes, uint32_t nch) {
  uint64_t stride = dev_slice_stride(nch), nslices = dev_nslices(bytes, nch), cursor = 0;
  EXPECT(stride == (uint64_t)nch * DEV_SLICE_BYTES);
  EXPECT(nslices == (bytes + stride - 1) / stride, "bytes %llu nch %u", (unsigned long long)bytes, nch);
  for (uint64_t j = 0; j < nslices; j++) {
    uint64_t slice_end = (j + 1) * stride < bytes ? (j + 1) * stride : bytes;
    for (uint32_t c = 0; c < nch; c++) {
      dev_span_t p = dev_part(bytes, nch, j, c);
      EXPECT(p.off == cursor, "bytes %llu nch %u slice %llu channel %u: part at %llu, expected %llu",
             (unsigned long long)bytes, nch, (unsigned long long)j, c, (unsigned long long)p.off,
             (unsigned long long)cursor);
      EXPECT((p.len == 0 || p.off % 16 == 0) && p.off + p.len <= slice_end, "an empty part sits at the end");
      EXPECT(p.len % 16 == 0 || p.off + p.len == bytes, "bytes %llu nch %u: part of %llu bytes",
             (unsigned long long)bytes, nch, (unsigned long long)p.len);
      uint32_t npieces = dev_npieces(p.len);
      EXPECT(npieces <= DEV_SLOTS / 2, "a part takes at most half a ring (%u pieces)", npieces);
      uint64_t moved = 0;
      for (uint32_t i = 0; i < npieces; i++) {
        uint64_t at = (uint64_t)i * DEV_SLOT_BYTES,
                 n = p.len - at < DEV_SLOT_BYTES ? p.len - at : DEV_SLOT_BYTES;
        EXPECT(n > 0 && n <= DEV_SLOT_BYTES);
        moved += n;
      }
      EXPECT(moved == p.len);
      cursor += p.len;
    }
    EXPECT(cursor == slice_end, "slice %llu of %llu bytes over %u channels not covered",
           (unsigned long long)j, (unsigned long long)bytes, nch);
  }
  EXPECT(cursor == bytes, "%llu bytes over %u channels: %llu covered", (unsigned long long)bytes, nch,
         (unsigned long long)cursor);
  /* Past the last slice there is nothing, for any channel. */
  EXPECT(dev_part(bytes, nch, nslices, 0).len == 0);
}

/* Sizes near the edges that matter: small ones, multiples of 16 and of a slice, and one byte either side. */
static void test_slicing_edges(void) {
  for (uint32_t nch = 1; nch <= DEV_MAX_CHANNELS; nch++) {
    for (uint64_t b = 0; b <= 300; b++) check_slicing(b, nch);
    uint64_t stride = dev_slice_stride(nch);
    for (uint64_t k = 1; k <= 3; k++) {
      for (int64_t d = -17; d <= 17; d++) check_slicing((uint64_t)((int64_t)(k * stride) + d), nch);
      check_slicing(k * DEV_SLOT_BYTES * nch + 16, nch);
      check_slicing(k * DEV_SLOT_BYTES - 1, nch);
    }
  }
  check_slicing(0, 1);
  EXPECT(dev_nslices(0, 4) == 0);
}

/* Random sizes up to 256 MiB (a simple generator, fixed seed: failures reproduce). */
static void test_slicing_random(void) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int t = 0; t < 3000; t++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t bytes = (state >> 20) % ((uint64_t)256 << 20);
    if (t % 3 == 0) bytes &= ~(uint64_t)15; /* element-sized transfers are common */
    check_slicing(bytes, 1 + (uint32_t)(state >> 59) % DEV_MAX_CHANNELS);
  }
}

/* A slice splits evenly when it can: parts differ by at most one 16-byte unit plus the rounding. */
static void test_parts_balanced(void) {
  dev_span_t a = dev_part((uint64_t)4 * DEV_SLICE_BYTES, 4, 0, 0),
             b = dev_part((uint64_t)4 * DEV_SLICE_BYTES, 4, 0, 3);
  EXPECT(a.len == DEV_SLICE_BYTES && b.len == DEV_SLICE_BYTES && b.off == 3ull * DEV_SLICE_BYTES);
  dev_span_t c = dev_part(100, 4, 0, 0), d = dev_part(100, 4, 0, 3);
  EXPECT(c.len == 32 && d.off == 96 && d.len == 4, "100 bytes over 4 channels: 32, 32, 32, 4");
}

/* ---- The embedded fatbins ---- */

#ifdef BRAID_HAVE_FATBIN
/* How many of the space-separated groups of comma-separated names in `groups` name `name`. */
static int group_count(const char *groups, const char *name) {
  int n = 0;
  const size_t len = strlen(name);
  for (const char *p = groups; *p != '\0';) {
    const size_t tok = strcspn(p, ", ");
    n += tok == len && strncmp(p, name, len) == 0;
    p += tok;
    p += *p != '\0';
  }
  return n;
}
#endif

static void test_fatbin(void) {
#ifdef BRAID_HAVE_FATBIN
  EXPECT(dev_nfatbins == BRAID_NFATBINS, "%d fatbins embedded, the build made %d", dev_nfatbins,
         BRAID_NFATBINS);
  for (int i = 0; i < dev_nfatbins; i++) {
    const unsigned char *f = dev_fatbins[i];
    EXPECT((uintptr_t)f % 8 == 0, "fatbin %d is 8-byte aligned", i);
    uint32_t magic;
    uint16_t header;
    uint64_t size;
    memcpy(&magic, f, sizeof magic);
    memcpy(&header, f + 6, sizeof header);
    memcpy(&size, f + 8, sizeof size);
    EXPECT(magic == 0xba55ed50u && header == 16 && size > 16, "fatbin %d: magic %#x, header %u, %llu bytes",
           i, magic, header, (unsigned long long)size);
  }
  EXPECT(dev_fatbin_archs[0] != '\0', "the fatbins' architectures are named");
  /* every entry point in exactly one group of ptxas's (CMakeLists.txt), and nothing else there */
  static const char *const names[] = {
      DEV_KERNEL_NAME,         DEV_KERNEL_SMALL_NAME,   DEV_KERNEL_LL_NAME,         DEV_KERNEL_BULK_NAME,
      DEV_KERNEL_PAIR_NAME,    DEV_KERNEL_PAIR_AR_NAME, DEV_KERNEL_PAIR_AR128_NAME, DEV_KERNEL_WAIT_NAME,
      DEV_KERNEL_COMBINE_NAME, DEV_KERNEL_PUSH_NAME};
  const char *groups = BRAID_KERNEL_GROUPS;
  int tokens = 0;
  for (const char *p = groups; *p != '\0'; p++)
    tokens += *p != ',' && *p != ' ' && (p == groups || p[-1] == ',' || p[-1] == ' ');
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    EXPECT(group_count(groups, names[i]) == 1, "%s is in %d of the groups \"%s\"", names[i],
           group_count(groups, names[i]), groups);
  EXPECT(tokens == (int)(sizeof names / sizeof names[0]), "the groups \"%s\" name %d kernels, dev.h %zu",
         groups, tokens, sizeof names / sizeof names[0]);
#else
  EXPECT(dev_nfatbins == 0, "a build without CUDA has no kernels");
#endif
}

int main(void) {
  TEST(test_struct_sizes, 10);
  TEST(test_constants, 10);
  TEST(test_slicing_edges, 120);
  TEST(test_slicing_random, 120);
  TEST(test_parts_balanced, 10);
  TEST(test_fatbin, 10);
  return test_summary();
}
