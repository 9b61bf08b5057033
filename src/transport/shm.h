/*
 * The shm transport's shared layouts (private to src/transport/): the control block at the start of each
 * POSIX shared-memory segment and the blob that names the segment.
 *
 * A segment belongs to the receiver: it creates it, the sender maps it and unlinks the name. The control
 * block is followed by the byte ring. head and tail count bytes since the start of the connection and never
 * wrap (2^64 bytes); a byte at stream offset x lives at ring[x % ring_bytes].
 */
#ifndef BRAID_TRANSPORT_SHM_H
#define BRAID_TRANSPORT_SHM_H

#include <stdatomic.h>
#include <stdint.h>

#include "transport/shm_seg.h"
#include "transport/transport.h"

/* Bits of shm_ctrl_t.failed: which side called fail. */
#define SHM_FAILED_SENDER   1
#define SHM_FAILED_RECEIVER 2

/* The control block. Each counter has a cache line of its own so that the two sides never write one line. */
typedef struct {
  /* Bytes released by the receiver. Written only by the receiver (release store after it has finished reading
   * them); the sender reads it with an acquire load before reusing that space. */
  _Alignas(64) _Atomic uint64_t head;
  /* Bytes committed by the sender. Written only by the sender (release store after it has written them); the
   * receiver reads it with an acquire load before reading them. */
  _Alignas(64) _Atomic uint64_t tail;
  /* SHM_FAILED_* bits, set with a release fetch-or by the side that fails; the other reads it (acquire). */
  _Alignas(64) _Atomic int failed;
  _Atomic int32_t sender_pid;   /* written once by the sender when it attaches (0 before) */
  _Atomic int32_t receiver_pid; /* written by the receiver before the blob is sent */
  uint64_t ring_bytes;          /* size of the ring that follows the block (a multiple of 64) */
} tp_shm_ctrl_t;

_Static_assert(sizeof(tp_shm_ctrl_t) == 192, "the shm control block is three cache lines");

/* What the receiver sends the sender. */
typedef struct {
  char name[SHM_NAME_BYTES]; /* shm_open name of the segment */
  uint64_t size;             /* bytes of the segment (control block and ring) */
  int32_t receiver_pid;      /* the receiver's process */
  int32_t receiver_rank;     /* checked by the sender against the peer it connects to */
} tp_shm_blob_t;

_Static_assert(sizeof(tp_shm_blob_t) <= TP_BLOB_BYTES, "the shm blob fits in a transport blob");

#endif
