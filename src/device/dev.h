/*
 * What the host and the kernels share: plain C structs and constants, read by host C code and by nvcc.
 *
 * The GPU executor runs one kernel launch per group per GPU. The launch carries a work description by value
 * (dev_work_t): a list of transfers cut into steps. Steps run one after another (a grid-wide barrier
 * separates them); within a step, transfers are grouped into lanes: the transfers of one lane share a
 * connection (or the host chained them: XF_SEQ) and run in list order, different lanes run at the same time
 * on different blocks. Each transfer
 * is split over `nch` channels; channel c of a transfer uses ring c of its connections, so the two ends of a
 * connection see the same sequence of pieces on every ring. A launch runs each lane on dev_work_t.nch blocks,
 * the most channels any of its transfers uses, so a small call takes a block or two, not nch_max per lane.
 *
 * A ring is DEV_SLOTS slots of DEV_SLOT_BYTES in memory the consumer reads (the receiver's GPU for p2p, host
 * memory for shm and net), with two counters in a control block:
 *   tail: slots produced. Written only by the producer, after the slot's bytes (and sizes[slot]), with a
 *         system-scope release: stores to the slot, block barrier, then thread 0 fences and stores tail.
 *   head: slots consumed. Written only by the consumer once every thread of its block has read the slot
 *         (block barrier, then thread 0 stores head); the producer reuses a slot only after it saw head move.
 * The counters only grow, so a kernel continues from where the previous launch left them; the kernel keeps
 * its own copies in dev_comm_t.sent / recvd (device memory), never the host. Nothing on the host counts
 * slots.
 *
 * Slicing: a transfer of `bytes` over `nch` channels is processed in slices of nch * DEV_SLICE_BYTES; slice j
 * covers bytes [j * S, min((j + 1) * S, bytes)) where S = nch * DEV_SLICE_BYTES. A slice is split over the
 * channels in parts that are multiples of 16 bytes: part = roundup16(ceil(slice / nch)), channel c takes
 * [c * part, min((c + 1) * part, slice)) (possibly empty). A channel moves its part in pieces of at most
 * DEV_SLOT_BYTES, one slot each. The transfers of a lane are interleaved slice by slice: slice 0 of every
 * transfer of the lane in list order, then slice 1, ...; a transfer with no bytes left in slice j is skipped.
 * Half a ring per slice per channel is what keeps ring algorithms free of deadlock (as on the host backend).
 */
#ifndef BRAID_DEVICE_DEV_H
#define BRAID_DEVICE_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEV_SLOTS                  8
#define DEV_SLOT_BYTES             (128 * 1024)
#define DEV_SLICE_BYTES            (DEV_SLOTS / 2 * DEV_SLOT_BYTES) /* per channel per slice: half a ring */
#define DEV_MAX_CHANNELS           64
#define DEV_THREADS                512   /* threads per block */
#define DEV_MAX_XFERS              56    /* transfers carried by value in one launch */
#define DEV_MAX_SPILL              65535 /* transfers of one launch whose list is spilled (dev_work_t.ext) */
#define DEV_LANE_XFERS             1024  /* transfers of one lane in one step */
#define DEV_LANE_RINGS             112   /* rings (peer, direction) one lane uses in one step */
#define DEV_MAX_STEPS              16    /* steps carried by value in one launch */
#define DEV_SMALL_XFERS            8     /* transfers of a launch through the small entry point */
#define DEV_KERNEL_NAME            "braid_kernel"
#define DEV_KERNEL_SMALL_NAME      "braid_kernel_small"
#define DEV_KERNEL_LL_NAME         "braid_kernel_ll"
#define DEV_KERNEL_BULK_NAME       "braid_kernel_bulk"
#define DEV_KERNEL_PAIR_NAME       "braid_kernel_pair"
#define DEV_KERNEL_PAIR_AR_NAME    "braid_kernel_pair_ar"
#define DEV_KERNEL_PAIR_AR128_NAME "braid_kernel_pair_ar128"
#define DEV_KERNEL_WAIT_NAME       "braid_kernel_wait"
#define DEV_KERNEL_COMBINE_NAME    "braid_kernel_combine"
#define DEV_KERNEL_PUSH_NAME       "braid_kernel_push"

/* The control block of one ring; 128-byte fields keep the two writers' counters on separate lines. */
typedef struct {
  volatile uint64_t tail; /* slots produced (producer writes) */
  uint64_t pad0[15];
  volatile uint64_t head; /* slots consumed (consumer writes) */
  uint64_t pad1[15];
  volatile uint64_t
      sizes[DEV_SLOTS]; /* bytes in each slot, written by the producer before tail (for proxies) */
  volatile uint64_t pieces[DEV_SLOTS]; /* a dealt transfer's piece in each slot (below), written with sizes */
} dev_ctrl_t;

/* Bytes of one ring in memory: its control block then its slots. */
#define DEV_RING_BYTES ((uint64_t)sizeof(dev_ctrl_t) + (uint64_t)DEV_SLOTS * DEV_SLOT_BYTES)

/* Marks: the Simple rings of a connection whose sender maps the receiver's memory (p2p) also say, chunk by
 * chunk, which bytes of a slot have landed, so that a receiver can start on a slot's first chunks while its
 * last ones are still on the link. A slot is DEV_MARKS chunks of DEV_CHUNK_BYTES; the ring's marks are
 * DEV_SLOTS * DEV_MARKS words in the receiver's memory, word [slot * DEV_MARKS + q] for chunk q of that slot.
 * The sender of the piece with index s on the ring (its count of slots produced before it) stores s + 1 in
 * the mark of each chunk that holds data, after the chunk's bytes and with a system-scope release: the bytes
 * are stored, a warp or block barrier, then one thread fences and stores the mark. A receiver that saw the
 * value (acquire, then a warp barrier) may read the chunk. Values only grow, as pieces do, so an old mark is
 * never mistaken for a new one, and zeroed memory holds none. The marks come on top of the protocol above,
 * not instead of it: every sender also stores the slot's size and the tail, and every receiver stores head,
 * so a receiver may wait on either, and each kernel of a launch may be one kind or the other. Rings of other
 * transports have no marks (dev_ring_t.marks NULL). */
#define DEV_CHUNK_BYTES 4096
#define DEV_MARKS       (DEV_SLOT_BYTES / DEV_CHUNK_BYTES)
#define DEV_MARKS_BYTES ((uint64_t)DEV_SLOTS * DEV_MARKS * sizeof(uint64_t)) /* a ring's marks */

/* A split lane: braid_kernel_bulk may run a lane of two transfers, a send to peer p and a receive from p
 * that overwrites what the send reads (an in-place all-reduce on two ranks: both over the same bytes and
 * channels), on two halves of a grid twice as wide (dev_comm_t.split), so that sending and combining run on
 * different SMs as they do out of place: blocks [0, nch) send, blocks [nch, 2 nch) receive. The receiving
 * half may overwrite chunk q of its part only once the sending half has read it. Each chunk has a guard word
 * in this rank's memory (dev_comm_t.guards, laid out as the receive ring's marks); the value for chunk q is
 * that of the chunk's mark on the receive ring (r + q / DEV_MARKS + 1, r the ring's count before the
 * launch), stored by the sending warp after its reads of the chunk (a warp barrier, then the system fence
 * that also publishes the chunk's mark) and awaited by the receiving warp with acquire order before it
 * stores. Values only grow, as the ring's count does, so a guard of an earlier launch is never taken for
 * this one's; the sending half reads the ring's count before it stores its first guard, and the receiving
 * half moves the count on only after its last one, so both halves see the same count. */

/* Dealt transfers: on two ranks, a collective's transfer that only sends or only receives and is the only
 * transfer of its lane with a peer (a ring algorithm's send or receive, as both ranks' steps hold one alike
 * however their buffers lie), Simple, in its call's dealt band (core/tune.c), over p2p, may be
 * marked dealt (dev_xfer_t.dealt; the host decides from the transfer's collective, algorithm, size and
 * connection, which both ends know alike). Its pieces (DEV_SLOT_BYTES each, piece i at byte
 * i * DEV_SLOT_BYTES) are not cut into a fixed part per channel: the sending blocks of its channels take them
 * from a counter they share, as each finds room on its ring, so a block that moves faster (where it sits on
 * the chip, and the blocks beside it, set its pace) moves more, and all end
 * together. The sender writes each slot's piece index to pieces[slot] beside its size, both before tail; the
 * receiving block of the same channel combines the slot at the piece's place. A sending block that finds no
 * piece left sends an end slot, of size 0, after its last; its receiver stops there. So each ring carries a
 * number of pieces that neither end knows beforehand, then one end slot, and both ends count them alike.
 *
 * The counter of step s of a launch is dev_comm_t.barrier[2 + 2 s] (pieces taken), beside it the sending
 * blocks that took their last ([3 + 2 s]); the last of those resets both to 0 for the next launch, eager or
 * replayed from a graph (a launch that fails part way leaves them, as it leaves its rings' counts, and the
 * error it recorded stays: dev_error_t). A step has at most one dealt send (two ranks: one connection each
 * way, and a lane per connection). A dealt transfer's receiver takes no chunk marks: its senders write none
 * (marks only grow, so skipping some misses nothing later), and it never takes braid_kernel_bulk. */
#define DEV_DEALT_COUNTERS (2 * DEV_MAX_STEPS) /* words of dev_comm_t.barrier after the grid barrier's 2 */

/* The low-latency (LL) protocol, for small transfers on connections whose receiver's memory the sender maps
 * (p2p). A connection has DEV_LL_CHANNELS LL rings besides its `nch_max` rings, back to back
 * DEV_LL_RING_BYTES apart. An LL ring is DEV_LL_SLOTS slots in the receiver's memory, each carrying one piece
 * of at most DEV_LL_PIECE bytes as 16-byte lines; a line holds 8 bytes of data in two 4-byte words, each
 * followed by a 4-byte flag: {d0, flag, d1, flag}. The sender stores every line of a piece with one 16-byte
 * store and flag = (uint32_t)(piece index + 1), the piece index counting the pieces the LL ring has carried;
 * the receiver spins on the lines themselves until both flags of each hold that value. Data and flag land
 * together (a store's 8-byte halves are never seen torn), so there is no fence and no tail counter: one link
 * crossing per piece instead of data, fence and counter.
 *
 * A line's old flag is that of an earlier piece of its slot, so it differs from the current one unless a
 * multiple of 2^32 pieces lie between them: that takes a line no piece of its slot wrote for 2^29 pieces in a
 * row (all of them shorter). The zeroed memory's flag 0 is never current before the count wraps.
 *
 * Room: the slot of piece k is free once the receiver has consumed piece k - DEV_LL_SLOTS. The receiver
 * stores its count of consumed pieces in the ring's control block (`head`, its own memory) after its reads;
 * the sender reads it across the link only when its last reading (dev_comm_t.ll_heads) does not already show
 * room. `tail` is unused. The counts live in dev_comm_t.ll_sent / ll_recvd, per peer and LL channel.
 *
 * The host marks a transfer DEV_XF_LL when it is small enough (every rank decides alike from the size and the
 * knobs), and marks each of its sides (DEV_XF_LL_SEND, DEV_XF_LL_RECV) LL when that connection has an LL
 * ring; an unmarked side runs Simple (the slot rings above). Both ends of a connection see the same
 * transport, so they agree side by side; a transfer may receive LL and send Simple. The host knowing the
 * sides spares the kernel a look at the LL tables before it finds a ring.
 *
 * An LL transfer runs in one slice over its `nch` channels, at most DEV_LL_CHANNELS: channel c moves part c
 * (dev_part, slice 0) through LL ring c of an LL side, or through Simple ring c of a Simple side, in pieces
 * of at most DEV_LL_PIECE bytes. The host sets nch from the size alone (and the communicator's channels, the
 * same on every rank), so both ends cut the transfer alike: several blocks share a transfer that one block
 * would move slowly, since each line is a store the block issues itself. */
#define DEV_LL_SLOTS      8
#define DEV_LL_CHANNELS   40                 /* LL rings per connection (LL itself takes at most 32) */
#define DEV_LL_PIECE      (16 * 1024)        /* data bytes per slot */
#define DEV_LL_SLOT_BYTES (2 * DEV_LL_PIECE) /* lines of a slot: twice the data */

/* The LL128 protocol, for the sizes between LL's and the Simple protocol's on two-rank communicators whose
 * connections both have LL rings: LL's signal in the data, with 120 data bytes per 8-byte flag instead of 8
 * per 8. A line is 128 bytes, 128-byte aligned, stored by 8 threads of a warp in one instruction, 16 bytes
 * each: 120 data bytes, then the flag twice in the last 8 ({.., d, d, flag, flag} in the last thread's 16).
 * It relies on NVLink delivering a warp's store of a whole 128-byte line in ascending address order, so
 * that once the flag at the line's end has landed the data before it has too: true of the path between two
 * GPUs' SMs over NVLink on the GPUs this protocol is enabled for (NCCL enables its LL128 on the same
 * ground), not of PCIe or host memory, which have no LL rings. One instruction: CUDA does not promise that a
 * warp runs converged, and a warp the compiler leaves split stores a line in several, so that its flag may
 * land before its data (seen on two H200s). The code that leads to a line's store is straight-line, and the
 * store checks that the whole warp runs it; a split warp stores the line from its last lane, the data, a
 * system fence, then the flag (ll.cuh, ll128_send). A receiver's warp loads its lines' 16-byte
 * quarters in one instruction until the last quarter of each holds the flag, then loads them once more and
 * takes that: a warp's load of a line is not one read of it, so the quarters of the load that saw the flag
 * may hold older bytes.
 *
 * A warp moves data in units of 4 lines (512 bytes of lines, 480 of data): in unit u of a piece, lane l =
 * 8 g + j carries data bytes 480 u + 16 (7 g + j) .. + 16 for j < 7, and 480 u + 448 + 8 g .. + 8 for j = 7
 * (with the flag), stored at 512 u + 16 l of the slot. So each lane's data is 8-byte aligned in the piece,
 * and an element never straddles two lanes.
 *
 * The pieces go through the LL rings, with their counts, flags (the piece index + 1), heads and room
 * exactly as LL pieces, but into a second set of slots of each LL ring (after its DEV_LL_SLOTS LL slots),
 * DEV_LL128_SLOT_BYTES each: piece k of a ring is in LL slot k % DEV_LL_SLOTS or LL128 slot k %
 * DEV_LL_SLOTS, never both. Each area only ever holds lines of its own format, so a receiver never takes an
 * earlier piece's data for a flag (the flag words of each format are flags in every older line of that
 * area, whose values are older pieces'). Both ends of a connection mark a transfer LL128 alike, from its
 * size and the communicator (gpu_work.c), and every entry point that takes LL transfers moves it: the pair
 * kernel, and the general kernel's LL path; the LL entry point never gets one. A transfer runs over up to
 * DEV_LL_CHANNELS channels, in one slice, each channel's part at most half its LL128 slots
 * (DEV_LL128_PART_MAX), as an LL part is at most half its LL slots: the pair kernel takes those of one piece
 * per channel, the general kernel any. */
#define DEV_LL128_LINE       128
#define DEV_LL128_UNIT_DATA  480 /* data bytes of a warp's unit of 4 lines */
#define DEV_LL128_SLOT_BYTES (48 * 1024)
#define DEV_LL128_PIECE      (DEV_LL128_SLOT_BYTES / 512 * DEV_LL128_UNIT_DATA) /* data bytes per slot */
#define DEV_LL128_PART_MAX   (DEV_LL_SLOTS / 2 * DEV_LL128_PIECE) /* data bytes of a channel's part */
/* An LL ring: its control block, padding to DEV_LL_ALIGN, its LL slots and its LL128 slots; rings start
 * DEV_LL_ALIGN-aligned in their allocation (p2p.c), so that every LL128 slot, and a warp's 512-byte unit in
 * it, is too (a line needs 128). DEV_LL128_AT: the LL128 slots' offset from the ring's data
 * (dev_ring_t.data, right after the control block). */
#define DEV_LL_ALIGN 4096
#define DEV_LL128_AT                                                                                         \
  ((uint64_t)DEV_LL_ALIGN - sizeof(dev_ctrl_t) + (uint64_t)DEV_LL_SLOTS * DEV_LL_SLOT_BYTES)
#define DEV_LL_RING_BYTES                                                                                    \
  ((uint64_t)DEV_LL_ALIGN + (uint64_t)DEV_LL_SLOTS * (DEV_LL_SLOT_BYTES + DEV_LL128_SLOT_BYTES))

/* One ring as this rank's kernel sees it: where to put (or find) slot data and the control block. */
typedef struct {
  char *data;       /* DEV_SLOTS * DEV_SLOT_BYTES; NULL: not connected */
  dev_ctrl_t *ctrl; /* its control block */
  uint64_t *marks;  /* DEV_SLOTS * DEV_MARKS chunk marks (above), or NULL: the ring has none */
} dev_ring_t;

/* Error codes a kernel reports (dev_error_t.code). */
enum { DEV_OK = 0, DEV_ERR_ABORTED = 1, DEV_ERR_TIMEOUT = 2, DEV_ERR_INVALID = 3 };

/* The first error a launch met; host-mapped memory, written once by the first failing block (atomicCAS on
 * code, then the other fields, then a system fence). The host reads it in ncclCommGetAsyncError. */
typedef struct {
  volatile int32_t code; /* DEV_ERR_*, 0 while none */
  int32_t peer;          /* the peer waited for, -1 if none */
  int32_t channel;       /* ring index */
  int32_t is_send;       /* 1: waiting for room to send; 0: waiting for data */
  uint64_t seq;          /* the call's sequence number (dev_work_t.seq + step's task offset) */
  uint64_t waited_ns;    /* how long it waited */
} dev_error_t;

/* A communicator as its kernels see it: made at init and passed by value in every launch's work
 * (dev_work_t.comm); the tables and counters it points at live in device memory. */
typedef struct {
  int32_t rank, nranks;
  int32_t nch_max;      /* rings per connection */
  int16_t batch_pieces; /* a Simple batch moves at most this many pieces (0: what the ring allows) */
  int16_t interleave;   /* > 1: block b serves lane b % interleave, channel b / interleave (block_place) */
  dev_ring_t *send;     /* [nranks * nch_max]: ring c towards peer p at p * nch_max + c */
  dev_ring_t *recv;     /* [nranks * nch_max]: ring c from peer p */
  uint64_t *sent;       /* [nranks * nch_max] slots this rank produced on each send ring */
  uint64_t *recvd;      /* [nranks * nch_max] slots this rank consumed on each recv ring */
  uint64_t *heads; /* [nranks * nch_max] the consumer's head this rank last read on each send ring: a lower
                    * bound of the real one (counters only grow), so a send that the cached value already
                    * allows skips the read across the link */
  dev_ring_t *ll_send; /* [nranks * DEV_LL_CHANNELS]: LL ring c towards peer p at p * DEV_LL_CHANNELS + c
                        * (data NULL: none, Simple only) */
  dev_ring_t *ll_recv; /* [nranks * DEV_LL_CHANNELS] LL ring c from peer p */
  uint64_t *ll_sent;   /* [nranks * DEV_LL_CHANNELS] pieces this rank produced on each LL send ring */
  uint64_t *ll_recvd;  /* [nranks * DEV_LL_CHANNELS] pieces this rank consumed on each LL receive ring */
  uint64_t *ll_heads;  /* [nranks * DEV_LL_CHANNELS] the consumer's LL head as last read */
  uint32_t *barrier; /* [2 + DEV_DEALT_COUNTERS] grid barrier: arrivals, and blocks finished (reset at kernel
                      * end); then the dealt transfers' counters (above) */
  const volatile int32_t *abort_flag; /* host-mapped; nonzero: stop every wait */
  dev_error_t *error;                 /* host-mapped */
  uint64_t timeout_ns;                /* a wait longer than this fails with DEV_ERR_TIMEOUT (0: never) */
  /* A split lane's guards ("A split lane" above), laid out as the marks of the receive rings: those of
   * ring c from peer p at (p * nch_max + c) * DEV_SLOTS * DEV_MARKS; NULL unless the communicator has two
   * ranks. */
  uint64_t *guards;
  int32_t split;      /* 1: braid_kernel_bulk runs the launch's one lane on two halves of its grid */
  int32_t wave_fence; /* 1: braid_kernel_bulk fences a part that only sends once per block and wave of chunks;
                       * 0: once per warp and chunk (set per launch: gpu_work.c, wave_fence) */
} dev_comm_t;

/* Transfer flags (the same values as the planner's XF_*). SEQ and PREPARED are the host's business (lane
 * assignment; PreMulSum of a running result becomes SUM before the launch); the kernel ignores them. */
enum { DEV_XF_REDUCE = 1, DEV_XF_PREPARE = 2, DEV_XF_LAST = 4, DEV_XF_SEQ = 8, DEV_XF_PREPARED = 16 };
/* Set by the GPU executor, not the planner: the transfer is small enough for the LL protocol (above). */
enum { DEV_XF_LL = 32, DEV_XF_LL_SEND = 64, DEV_XF_LL_RECV = 128 };
/* dev_xfer_t.proto of an LL transfer: its LL sides move LL lines, or LL128 lines (above). */
enum { DEV_PROTO_LL = 0, DEV_PROTO_LL128 = 1 };

/* Reduction kinds (the same values as host_reduce.h's red_kind_t). */
enum { DEV_RED_SUM, DEV_RED_PROD, DEV_RED_MAX, DEV_RED_MIN, DEV_RED_PREMULSUM, DEV_RED_SUM_POSTDIV };

/* One transfer: receive from recv_peer (or read src), combine, store to dst and/or send to send_peer. With
 * REDUCE and no recv_peer it combines two local operands instead: dst = prepare(src) (+) dst (a one-shot
 * reduction adding this rank's own data to the running result). */
typedef struct {
  const char *src;   /* local operand, or NULL */
  char *dst;         /* where the result goes, or NULL */
  uint64_t bytes;    /* data bytes */
  int16_t recv_peer; /* -1: none */
  int16_t send_peer; /* -1: none */
  uint8_t flags;     /* DEV_XF_* */
  uint8_t type;      /* ncclDataType_t */
  uint8_t red;       /* DEV_RED_* */
  uint8_t nch;       /* channels it is split over: 1 .. nch_max */
  uint16_t lane;     /* lane within its step */
  uint16_t task;     /* index of its call in the group, for messages */
  uint8_t proto;     /* DEV_PROTO_* of an LL transfer (DEV_XF_LL); DEV_PROTO_LL otherwise */
  uint8_t dealt;     /* 1: its pieces are dealt to its channels as they find room (above) */
  uint8_t pad[2];
  union {
    double f;  /* PREMULSUM factor on a float type */
    int64_t i; /* PREMULSUM factor on an integer type; SUM_POSTDIV divisor */
  } scalar;
  const void *scalar_ptr; /* PREMULSUM with a device-resident factor (of the transfer's type), else NULL */
} dev_xfer_t;

/* A launch's work, passed by value as the kernel's only parameter. Up to DEV_MAX_XFERS transfers travel in
 * `xfers`; a launch with more has its whole list in device memory at `ext` (the work queue's device copy for
 * an eager launch, storage owned by the graph for a captured one), and `xfers` is unused.
 *
 * Completion: an eager launch with a spilled list has a work-queue entry, and its kernel writes `tag` into
 * `*done` (host-mapped: the entry's header) when every block has finished with the work, ext included: the
 * last block to finish stores it, so when the host sees the tag the entry can be reused (the device copy of a
 * spill is rewritten only in stream order after the kernel, so the store needs no fence). Other launches have
 * done == NULL and write nothing: one whose list travels in the parameters holds nothing of the host's
 * once launched, and a captured one must not touch the queue (a replay cannot move its counters).
 *
 * Two entry points take the same work: braid_kernel with all DEV_MAX_XFERS slots, and braid_kernel_small,
 * whose parameter is the first sizeof(dev_work_small_t) bytes of the same struct (DEV_SMALL_XFERS slots), for
 * launches of a few transfers: the driver copies every parameter byte at each launch, and so does each
 * block into its shared memory (general.cuh), 680 bytes instead of 3.3 KB. The fields before `xfers` are one
 * list (DEV_WORK_FIELDS), so the two structs share their layout up to the slots.
 *
 * A third entry point, braid_kernel_ll, takes the small work too, for the launches that are latency alone:
 * one step, no spill, every transfer LL (both of its sides, where it has peers) and at most DEV_LL_PIECE
 * bytes per channel (one piece each). It moves the same pieces through the same LL rings and counts as
 * braid_kernel would, so launches of either kind follow each other on a connection, and the two ends may
 * differ in which they take; it skips the general kernel's lanes, ring tables and per-piece barriers. A
 * ring carries at most DEV_SMALL_XFERS <= DEV_LL_SLOTS of its pieces in one such launch, so room to send
 * only ever waits for earlier launches. */
#define DEV_WORK_FIELDS                                                                                      \
  dev_comm_t comm; /* the communicator's view, by value: read from the parameters, not through a load */     \
  uint64_t seq;    /* sequence number of the group's first call */                                           \
  const dev_xfer_t *ext;   /* the transfer list when it is spilled, else NULL */                             \
  volatile uint64_t *done; /* where to write tag at the end, or NULL */                                      \
  uint64_t tag;                                                                                              \
  uint16_t nxfers, nsteps;                                                                                   \
  uint16_t step_end[DEV_MAX_STEPS];   /* transfers of step s are [step_end[s-1], step_end[s]) */             \
  uint16_t step_lanes[DEV_MAX_STEPS]; /* lanes in step s; the block count covers the widest */               \
  uint16_t nch;                       /* blocks per lane: the most channels a transfer uses, 1 .. nch_max */

typedef struct {
  DEV_WORK_FIELDS
  dev_xfer_t xfers[DEV_MAX_XFERS]; /* sorted by (step, lane), list order kept within a lane */
} dev_work_t;

typedef struct {
  DEV_WORK_FIELDS
  dev_xfer_t xfers[DEV_SMALL_XFERS];
} dev_work_small_t;

/* A seventh entry point, braid_kernel_pair, for the commonest latency-bound launches: what the LL entry
 * takes, restricted to at most one plain send, one receive and one local copy (a two-rank all-reduce,
 * reduce-scatter, all-gather or all-to-all, a send/receive, one side of a broadcast or reduce), so that
 * the host can pass each by itself and nothing on the device walks a list. Each block takes one role on one
 * channel c: blocks [0, send_blocks) send their part of `send` (then copy their part of `copy`), blocks
 * [send_blocks, send_blocks + recv_blocks) receive their part of `recv`, combining it with recv.src when
 * REDUCE is set (the transfer's combine, as braid_kernel_ll computes it, so the bits are the same). Every
 * thread loads the ring, its count and its first line of data itself, all in one trip, and moves its lines
 * from start to end: no block barrier before the first line, and none after it but the one before the
 * counts are stored. The pieces, flags, counts and heads are those of the LL rings (above), one piece per
 * channel and ring, so that pair, LL and general launches follow each other on a connection in any mix and
 * either end may take any of them.
 *
 * A copy goes to the sending blocks, which a launch with a copy has even without a send (then they only
 * copy), except in place (fused 1: the receiving blocks copy after their send).
 *
 * fused: the send's source is the receive's output (an in-place all-reduce), or both are the receive's
 * operand (an out-of-place all-reduce run joined), and there are no sending blocks.
 * 1: each receiving block sends its part first, every thread the lines it then overwrites. 2 (parts
 * of at most a line per thread of half the block): the block's first half sends and its second half
 * receives, as two blocks would, a barrier between the sending half's loads and the receiving half's first
 * store. The host takes this entry only when no other transfer writes what another reads (pair_shape in
 * core/gpu_work.c; the host never asks for 2 now). A transfer that is absent has nch 0.
 *
 * Two more entry points, braid_kernel_pair_ar (LL) and braid_kernel_pair_ar128 (LL128), take the same
 * parameters for one shape only: an all-reduce, in place or out, fused 1, its receive combining on the
 * send's bytes and channels, in that protocol (pair_func in gpu_work.c). Every thread issues the loads of the
 * receive's ring and count and the send's ring, count and head (and its first LL line) before it checks the
 * launch, one trip under the check (pair_ar_load in pair.cuh); in LL it sends its lines, then awaits the
 * peer's and combines each with its own line, the first still in a register; in LL128 each warp sends its
 * units, then awaits the peer's and combines them, as the pair kernel does. Then the barrier and the counts.
 * The pair kernel's fused 1 loads the receive's ring after the send (in LL the operand again), and keeps its
 * state in local memory: a memory trip or two more before the wait. Kernels of their own, so that their
 * registers are their own (no spills; LL128's routine takes nearly all of them, hence two) and the pair
 * kernel's code stays as it is. */
typedef struct {
  dev_comm_t comm;
  uint64_t seq;        /* the call's sequence number (for errors) */
  dev_xfer_t send;     /* an LL send of src as it is to send_peer (no receive, no output, no scaling) */
  dev_xfer_t recv;     /* an LL receive from recv_peer into dst, combined with src when REDUCE */
  dev_xfer_t copy;     /* a local copy of src into dst (no peer, no reduction, no scaling) */
  uint16_t nch;        /* channels of the widest transfer */
  uint8_t send_blocks; /* nch with a send or a copy and not fused, else 0 */
  uint8_t recv_blocks; /* 0 or nch */
  uint8_t fused;       /* 0, 1 or 2 (above) */
  uint8_t pad[3];
} dev_pair_t;

/* The copy-engine path's wait (core/ce.h), a fifth entry point of one thread: it first sets `*raise` (if
 * not NULL) to 1, then spins until `*word` is 1 and sets it back to 0, as spin loops do everywhere
 * (wait.cuh): a wait that outlasts the timeout, or an abort, ends it with the error recorded for
 * ncclCommGetAsyncError, and the stream goes on. A stream memory operation would wait forever instead,
 * replayed from a graph as well as eagerly. The raise is the stream write that would otherwise come just
 * before the wait, folded into it: the stream then turns from its copy to one kernel instead of to a write
 * and a kernel, one turn fewer. */
typedef struct {
  dev_comm_t comm;
  uint32_t *word;  /* in this rank's device memory, raised by the peer's stream */
  uint32_t *raise; /* NULL, or a word of the peer's (mapped here) to set to 1 before the wait */
  uint64_t seq;    /* the call, for the error */
  int32_t peer;
  int32_t is_send; /* the word says the peer's output is free (1) or its copy into ours is done (0) */
} dev_wait_t;

/* The copy-engine path's combine (core/ce.h), a sixth entry point: the peer's copy engines write its
 * contribution into this rank's output `x.dst` chunk by chunk, raising `*word` to c + 1 once chunk c (bytes
 * [ends[c - 1], ends[c]), ends[-1] = 0) has landed; the kernel combines each chunk as it comes, in place:
 * dst = prepare(src) (+) dst, divided at LAST for SUM_POSTDIV, as a transfer that receives would (the
 * kernels' own order of operands, so the result is bitwise the same); or, a pull, the peer's input lies in
 * its own memory (`from`, mapped here) as one chunk, final once `*word` is 1. Each block waits for the chunk
 * itself (thread 0, spin_fails' timeout and abort) and takes its part of it: 16-byte multiples from the
 * chunk's start, as dev_part cuts a slice. Ordering: the peer's stream writes the word only once its copy of
 * the chunk has completed; thread 0 reads it with a system-scope acquire, and the block barrier after that
 * read orders the other threads' loads of the chunk after it. It leaves the word as it found it raised; the
 * stream clears it after the kernel. The operation is never PREMULSUM: the peer's bytes arrive as they were,
 * unscaled. */
#define DEV_COMBINE_CHUNKS 48
typedef struct {
  dev_comm_t comm;
  dev_xfer_t x; /* src: this rank's operand; dst: the output the peer writes into; bytes, type, red, flags */
  uint32_t *word;   /* in this rank's device memory, raised by the peer's stream */
  const char *from; /* NULL: the peer's bytes land in x.dst; else they lie here (a pull: the peer's input,
                       mapped; nchunks 1 and `word` raised once it is final) */
  uint64_t seq;     /* the call, for the error */
  int32_t peer;
  uint32_t nchunks; /* 1 .. DEV_COMBINE_CHUNKS */
  uint32_t tile;    /* 0: block b combines the b-th of gridDim.x equal parts of a chunk; else tiles of this
                       many bytes (a multiple of 16), block b the b-th, b + gridDim.x-th, ... */
  uint32_t pad;
  uint64_t ends[DEV_COMBINE_CHUNKS];
} dev_combine_t;

/* The copy-engine path's push (core/ce.h, STEP_CE_PUSH), a seventh entry point: a step that only copies,
 * moved by one kernel instead of the copy engines, its handshake inside it. Block 0 first raises the peer's
 * `raise_ready` to 1 (this rank's outputs are free) when the rank receives; every block's thread 0 waits
 * for this rank's `ready` to be 1 when it sends (the peer's outputs are free). Then the blocks copy: the
 * sends straight into the peer's outputs (mapped here), the local copies beside them, each copy in tiles of
 * DEV_PUSH_TILE bytes dealt to the blocks round robin. Each block, after a barrier, fences at system scope
 * and counts itself in `blocks` (this rank's memory); the last one to count finds every block's stores
 * ordered before its own, clears `blocks` and `ready`, fences, raises the peer's `raise_done` to 1 when the
 * rank sends, then waits for this rank's `done` to be 1 when it receives (the peer's stores into its
 * outputs have landed) and clears it. Every word is 0 again after the kernel, as after a copy-engine step:
 * the peer raises a word again only in its next step, which starts after this one's last word reached it.
 * The waits give up as spin loops do everywhere (wait.cuh). */
#define DEV_PUSH_COPIES 8
#define DEV_PUSH_TILE   (64u * 1024)
typedef struct {
  const char *src;
  char *dst; /* the peer's output (a send) or this rank's (a local copy) */
  uint64_t bytes;
} dev_copy_t;
typedef struct {
  dev_comm_t comm;
  uint32_t *ready;       /* NULL (the rank does not send), or this rank's word, raised by the peer */
  uint32_t *done;        /* NULL (the rank does not receive), or this rank's word, raised by the peer */
  uint32_t *raise_ready; /* NULL, or the peer's word (mapped here) */
  uint32_t *raise_done;  /* NULL, or the peer's word (mapped here) */
  uint32_t *blocks;      /* this rank's count of blocks done */
  uint64_t seq;          /* the call, for the error */
  int32_t peer;
  uint32_t ncopies; /* 0 .. DEV_PUSH_COPIES */
  dev_copy_t copies[DEV_PUSH_COPIES];
} dev_push_t;

/* Helpers for the slicing arithmetic above, one definition for the host (planner, tests) and the kernel. */
#ifdef __CUDACC__
#define DEV_INLINE __host__ __device__ inline
#else
#define DEV_INLINE static inline
#endif

/* A byte range of a transfer. */
typedef struct {
  uint64_t off, len;
} dev_span_t;

/* Bytes a slice of a transfer over nch channels covers (the last slice may be shorter). */
DEV_INLINE uint64_t dev_slice_stride(uint32_t nch) {
  return (uint64_t)nch * DEV_SLICE_BYTES;
}

/* Slices of a transfer of `bytes` over nch channels. */
DEV_INLINE uint64_t dev_nslices(uint64_t bytes, uint32_t nch) {
  return (bytes + dev_slice_stride(nch) - 1) / dev_slice_stride(nch);
}

/* Channel c's part of slice j of a transfer of `bytes` over nch channels (len 0: nothing for c). A slice is
 * at most nch * DEV_SLICE_BYTES, so the arithmetic inside a slice fits 32 bits for any nch of a transfer. */
DEV_INLINE dev_span_t dev_part(uint64_t bytes, uint32_t nch, uint64_t j, uint32_t c) {
  uint64_t start = j * dev_slice_stride(nch), left = bytes > start ? bytes - start : 0;
  uint32_t slice = (uint32_t)(left < dev_slice_stride(nch) ? left : dev_slice_stride(nch));
  uint32_t part = ((slice + nch - 1) / nch + 15) / 16 * 16;
  uint32_t lo = c * part < slice ? c * part : slice, hi = (c + 1) * part < slice ? (c + 1) * part : slice;
  dev_span_t span = {start + lo, hi - lo};
  return span;
}

/* Whether an LL transfer of `bytes` over nch channels is one piece (DEV_LL_PIECE) on every channel, as
 * braid_kernel_ll requires: the host chooses that entry point by it and the kernel checks it. */
DEV_INLINE int dev_ll_one_piece(uint64_t bytes, uint32_t nch) {
  return bytes <= (uint64_t)nch * DEV_LL_PIECE;
}

/* Whether LL transfer x is one piece of its protocol on every channel, as braid_kernel_pair requires. */
DEV_INLINE int dev_xf_one_piece(const dev_xfer_t *x) {
  return x->proto == DEV_PROTO_LL128 ? x->bytes <= (uint64_t)x->nch * DEV_LL128_PIECE
                                     : dev_ll_one_piece(x->bytes, x->nch);
}

/* Whether LL128 transfer x's part on every channel is at most half its LL128 slots (DEV_LL128_PART_MAX), as
 * every entry point that moves LL128 requires: a part's send then never waits for room its own receive frees
 * (an in-place all-reduce's lane sends its part before it receives). */
DEV_INLINE int dev_ll128_fits(const dev_xfer_t *x) {
  return x->bytes <= (uint64_t)x->nch * DEV_LL128_PART_MAX;
}

/* Whether pair launch p (dev_pair_t) is an all-reduce that braid_kernel_pair_ar (LL) or
 * braid_kernel_pair_ar128 (LL128) takes: fused 1, both sides in one protocol on the same bytes and channels,
 * the receive combining this rank's operand, which is the send's source, and no copy. In place or out: the
 * receive's output is the operand, or lies apart from it (pair_shape in gpu_work.c). The host chooses the
 * entry point by it and the kernels check it. */
DEV_INLINE int dev_pair_ar(const dev_pair_t *p) {
  const dev_xfer_t *s = &p->send, *r = &p->recv;
  return p->fused == 1 && s->proto == r->proto && (r->flags & DEV_XF_REDUCE) != 0 && r->src != NULL &&
         r->src == s->src && r->bytes == s->bytes && r->nch == s->nch && p->copy.nch == 0;
}

/* Offset in an LL ring's data of the slot of piece `count` in protocol `proto` (DEV_PROTO_*). */
DEV_INLINE uint64_t dev_ll_slot_at(uint64_t count, int proto) {
  const uint64_t slot = count % DEV_LL_SLOTS;
  return proto == DEV_PROTO_LL128 ? DEV_LL128_AT + slot * DEV_LL128_SLOT_BYTES : slot * DEV_LL_SLOT_BYTES;
}

/* Whether a transfer's data is scaled on the way (PreMulSum's factor, or the average's division at its last
 * combine): its send is then not a copy. */
DEV_INLINE bool dev_xf_scales(const dev_xfer_t *x) {
  return (x->flags & DEV_XF_PREPARE) &&
         (x->red == DEV_RED_PREMULSUM || (x->red == DEV_RED_SUM_POSTDIV && (x->flags & DEV_XF_LAST)));
}

/* Whether a transfer only sends its source as it is: no receive, no local result, no combine, no scaling
 * (the LL kernel's early part, the pair kernel's send). */
DEV_INLINE bool dev_xf_plain_send(const dev_xfer_t *x) {
  const bool scales = dev_xf_scales(x);
  return x->recv_peer < 0 && x->send_peer >= 0 && x->dst == NULL && x->src != NULL &&
         !(x->flags & DEV_XF_REDUCE) && !scales;
}

/* Pieces (slots) a part of `len` bytes moves in; piece i covers [i * DEV_SLOT_BYTES, min(len, ...)). */
DEV_INLINE uint32_t dev_npieces(uint64_t len) {
  return (uint32_t)((len + DEV_SLOT_BYTES - 1) / DEV_SLOT_BYTES);
}

/* The kernel: extern "C" __global__ void braid_kernel(dev_work_t work), launched with
 * grid = max(step_lanes) * work.nch blocks of DEV_THREADS threads; block b serves lane b / work.nch, channel
 * b % work.nch, or, when comm.interleave > 1, lane b % interleave, channel b / interleave (the grid is then
 * interleave * work.nch, and a block whose lane the launch does not have serves none); rings are still
 * indexed peer * nch_max + channel.
 *
 * The kernels are embedded in the library as dev_nfatbins fatbins (made from src/device by nvcc and ptxas),
 * one per group of entry points that the build compiles side by side; each entry point is in one of them, and
 * the first also carries the PTX of all. dev_nfatbins is 0 in a build without CUDA. */
extern const void *const dev_fatbins[];
extern const int dev_nfatbins;
/* The architectures the fatbins carry, as text: "sm_80 sm_90 compute_90" (cubins, then the PTX); "" without.
 */
extern const char dev_fatbin_archs[];

#endif
