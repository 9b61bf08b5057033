/*
 * A peer's buffers mapped into this rank: what a direct step (core/ce.h) writes into or reads from, and
 * where ncclCommRegister's zero-copy will map registered buffers.
 *
 * Eagerly, a peer's allocation is mapped once: a small cache keyed by the owner's buffer id and export (a new
 * allocation at the same address has another id, so it is mapped afresh, never written through a stale
 * mapping). An entry leaves the cache, least recently used first, only once the work using it has finished
 * (tp_peer_mem_used records it); the rest are unmapped when the cache is freed. A captured step maps the
 * buffer afresh (tp_peer_mem_map_fresh) and hands the mapping to the graph, which unmaps it when it is
 * destroyed: a replay may come at any time until then. CUDA documents freeing an exported allocation while
 * another process still has it mapped as undefined: the mapping outlives the call that made it until one of
 * those moments.
 */
#ifndef BRAID_TRANSPORT_PEER_MEM_H
#define BRAID_TRANSPORT_PEER_MEM_H

#include <stdint.h>

#include "nccl.h"
#include "gpu/gpu.h"

typedef struct tp_peer_mem tp_peer_mem_t;

/* A cache for `peer`'s buffers on `dev` (names for the log). */
ncclResult_t tp_peer_mem_init(int dev, const char *comm, int rank, int peer, tp_peer_mem_t **c_p);
/* The peer's allocation described by x, mapped here (from the cache, or mapped now); *base_p its base. */
ncclResult_t tp_peer_mem_map(tp_peer_mem_t *c, const gpu_ptr_export_t *x, char **base_p);
/* The same, mapped afresh for a graph to own (the thread's capture mode relaxed around it). */
ncclResult_t tp_peer_mem_map_fresh(tp_peer_mem_t *c, const gpu_ptr_export_t *x, gpu_mem_t **mem_p);
/* Records, after the work on `stream`, the use of the cached mapping that holds p (if any). */
ncclResult_t tp_peer_mem_used(tp_peer_mem_t *c, const char *p, cudaStream_t stream);
/* Unmaps everything; the caller has made sure nothing uses the mappings any more. */
void tp_peer_mem_free(tp_peer_mem_t *c);

#endif
