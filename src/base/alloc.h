/*
 * Allocation accounting: every allocation the library makes on behalf of a communicator is charged to that
 * communicator's account, logged under NCCL_DEBUG_SUBSYS=ALLOC, and fails with a message that names what was
 * being allocated and how much (never a silent NULL).
 *
 * An account may have a parent: a charge to it is a charge to the parent too (a communicator's data path is
 * a sub-account of the communicator, so that what ncclCommSuspend can give back is known apart). Every
 * charge also counts in the process's totals, which a test reads to check that nothing leaked.
 *
 * For tests, BRAID_FAULT_ALLOC=k makes the k-th allocation of the process fail as if memory had run out:
 * every allocator of the library (mem_calloc, shared-memory segments, TCP staging rings, device and
 * page-locked memory) asks mem_fault first.
 */
#ifndef BRAID_BASE_ALLOC_H
#define BRAID_BASE_ALLOC_H

#include <stdatomic.h>
#include <stddef.h>

#include "nccl.h"

/* Bytes currently charged to one owner (a communicator, or the process for shared state). */
typedef struct alloc_acct {
  _Atomic size_t host_bytes; /* host memory, including shared-memory rings */
  _Atomic size_t dev_bytes;  /* device memory */
  _Atomic size_t peak_bytes; /* highest host + device total seen */
  struct alloc_acct *parent; /* charged alike (NULL: none); set before the first charge */
} alloc_acct_t;

/* Zeroed host memory of n * size bytes, charged to acct (may be NULL: charged to nobody). */
ncclResult_t mem_calloc(alloc_acct_t *acct, size_t n, size_t size, const char *what, void **ptr_p);
/* Frees memory from mem_calloc; `bytes` is what was charged (n * size). NULL is ignored. */
void mem_free(alloc_acct_t *acct, void *ptr, size_t bytes);
/* Charges / releases bytes that were allocated elsewhere (shared memory, device memory). */
void mem_charge(alloc_acct_t *acct, size_t bytes, int device, const char *what);
void mem_release(alloc_acct_t *acct, size_t bytes, int device);

/* Asked by every allocator before it allocates `bytes` (device: 1 for device memory): ncclSystemError with a
 * message naming what and how much when BRAID_FAULT_ALLOC picks this allocation, else ncclSuccess. `what`
 * may be NULL: the name set with mem_doing is used. */
ncclResult_t mem_fault(const char *what, size_t bytes, int device);
/* Names what the calling thread allocates next, for allocators that are not told (device memory); NULL
 * clears it. Returns the previous name, to be restored. */
const char *mem_doing(const char *what);
/* The name set with mem_doing on this thread, or `fallback`. */
const char *mem_doing_name(const char *fallback);
/* Allocations counted so far by mem_fault in this process (a test learns how many sites a scenario has). */
long mem_fault_count(void);
/* Bytes charged to any account in this process, now (host or device). */
size_t mem_process_bytes(int device);

/* Allocates an array of n elements of *ptr's type, charged to acct. */
#define MEM_CALLOC(acct, ptr, n, what) mem_calloc((acct), (n), sizeof(*(ptr)), (what), (void **)&(ptr))

#endif
