/*
 * Allocation accounting (see alloc.h).
 */
#include "alloc.h"

#include <stdlib.h>

#include "log.h"

static void note_peak(alloc_acct_t *acct) {
  size_t total = atomic_load(&acct->host_bytes) + atomic_load(&acct->dev_bytes);
  size_t peak = atomic_load(&acct->peak_bytes);
  while (total > peak && !atomic_compare_exchange_weak(&acct->peak_bytes, &peak, total)) {
  }
}

void mem_charge(alloc_acct_t *acct, size_t bytes, int device, const char *what) {
  if (acct == NULL) return;
  atomic_fetch_add(device ? &acct->dev_bytes : &acct->host_bytes, bytes);
  note_peak(acct);
  INFO(LOG_ALLOC, "%s: %zu bytes of %s memory (now %zu host, %zu device)", what, bytes,
       device ? "device" : "host", atomic_load(&acct->host_bytes), atomic_load(&acct->dev_bytes));
}

void mem_release(alloc_acct_t *acct, size_t bytes, int device) {
  if (acct == NULL) return;
  atomic_fetch_sub(device ? &acct->dev_bytes : &acct->host_bytes, bytes);
}

ncclResult_t mem_calloc(alloc_acct_t *acct, size_t n, size_t size, const char *what, void **ptr_p) {
  void *p = calloc(n > 0 ? n : 1, size > 0 ? size : 1);
  if (p == NULL)
    return log_err(ncclSystemError, "out of host memory allocating %s: %zu x %zu bytes", what, n, size);
  mem_charge(acct, n * size, 0, what);
  *ptr_p = p;
  return ncclSuccess;
}

void mem_free(alloc_acct_t *acct, void *ptr, size_t bytes) {
  if (ptr == NULL) return;
  mem_release(acct, bytes, 0);
  free(ptr);
}
