/*
 * Allocation accounting: every allocation the library makes on behalf of a communicator is charged to that
 * communicator's account, logged under NCCL_DEBUG_SUBSYS=ALLOC, and fails with a message that names what was
 * being allocated and how much (never a silent NULL).
 */
#ifndef BRAID_BASE_ALLOC_H
#define BRAID_BASE_ALLOC_H

#include <stdatomic.h>
#include <stddef.h>

#include "nccl.h"

/* Bytes currently charged to one owner (a communicator, or the process for shared state). */
typedef struct {
  _Atomic size_t host_bytes; /* host memory, including shared-memory rings */
  _Atomic size_t dev_bytes;  /* device memory */
  _Atomic size_t peak_bytes; /* highest host + device total seen */
} alloc_acct_t;

/* Zeroed host memory of n * size bytes, charged to acct (may be NULL: charged to nobody). */
ncclResult_t mem_calloc(alloc_acct_t *acct, size_t n, size_t size, const char *what, void **ptr_p);
/* Frees memory from mem_calloc; `bytes` is what was charged (n * size). NULL is ignored. */
void mem_free(alloc_acct_t *acct, void *ptr, size_t bytes);
/* Charges / releases bytes that were allocated elsewhere (shared memory, device memory). */
void mem_charge(alloc_acct_t *acct, size_t bytes, int device, const char *what);
void mem_release(alloc_acct_t *acct, size_t bytes, int device);

/* Allocates an array of n elements of *ptr's type, charged to acct. */
#define MEM_CALLOC(acct, ptr, n, what) mem_calloc((acct), (n), sizeof(*(ptr)), (what), (void **)&(ptr))

#endif
