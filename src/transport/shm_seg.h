/*
 * POSIX shared-memory segments for the transports of one machine (private to src/transport/): shm's byte
 * rings and gpu_shm's slot rings.
 *
 * The receiving end of a connection creates the segment, named after the communicator's nonce, the two ranks,
 * its pid and a per-process counter, and sends the name to the sender; the sender maps it and removes the
 * name at once, so that nothing is left in /dev/shm once both sides hold a mapping, even if both crash later.
 * The creator removes the name again at close in case no sender ever attached.
 */
#ifndef BRAID_TRANSPORT_SHM_SEG_H
#define BRAID_TRANSPORT_SHM_SEG_H

#include <stddef.h>

#include "nccl.h"
#include "transport/transport.h"

/* Longest segment name, with its terminating NUL. */
#define SHM_NAME_BYTES 96

/* A segment mapped into this process. */
typedef struct {
  void *base;                /* the mapping; NULL when there is none */
  size_t bytes;              /* bytes mapped (the whole segment) */
  char name[SHM_NAME_BYTES]; /* the creator's copy of the name, removed at close; "" on the attaching side */
} tp_seg_t;

/* Creator: makes a fresh zeroed segment of `bytes` for the connection from `peer` and maps it. The pages are
 * reserved now, so a full /dev/shm fails here rather than with SIGBUS later. `what` names the connection in
 * messages. */
ncclResult_t tp_seg_create(const tp_config_t *config, int peer, size_t bytes, const char *what,
                           tp_seg_t *seg_p);
/* Attaching side: maps the segment `name`, checks that it has `bytes` bytes, and removes the name. */
ncclResult_t tp_seg_attach(const char *name, size_t bytes, const char *what, tp_seg_t *seg_p);
/* Unmaps the segment; the creator also removes its name when no attaching side did. */
void tp_seg_close(tp_seg_t *seg, const char *what);

#endif
