/*
 * Allocation accounting (see alloc.h).
 */
#include "alloc.h"

#include <stdlib.h>

#include "check.h"
#include "log.h"
#include "param.h"

/* The process's totals: every account's charges, whatever its owner. */
static _Atomic size_t process_bytes[2];
/* Allocations mem_fault has been asked about. */
static _Atomic long fault_count;
/* What the calling thread is allocating (mem_doing). */
static _Thread_local const char *doing;

static void note_peak(alloc_acct_t *acct) {
  size_t total = atomic_load(&acct->host_bytes) + atomic_load(&acct->dev_bytes);
  size_t peak = atomic_load(&acct->peak_bytes);
  while (total > peak && !atomic_compare_exchange_weak(&acct->peak_bytes, &peak, total)) {
  }
}

void mem_charge(alloc_acct_t *acct, size_t bytes, int device, const char *what) {
  if (acct == NULL) return;
  atomic_fetch_add(&process_bytes[device != 0], bytes);
  for (alloc_acct_t *a = acct; a != NULL; a = a->parent) {
    atomic_fetch_add(device ? &a->dev_bytes : &a->host_bytes, bytes);
    note_peak(a);
  }
  INFO(LOG_ALLOC, "%s: %zu bytes of %s memory (now %zu host, %zu device)", what, bytes,
       device ? "device" : "host", atomic_load(&acct->host_bytes), atomic_load(&acct->dev_bytes));
}

void mem_release(alloc_acct_t *acct, size_t bytes, int device) {
  if (acct == NULL) return;
  atomic_fetch_sub(&process_bytes[device != 0], bytes);
  for (alloc_acct_t *a = acct; a != NULL; a = a->parent)
    atomic_fetch_sub(device ? &a->dev_bytes : &a->host_bytes, bytes);
}

ncclResult_t mem_fault(const char *what, size_t bytes, int device) {
  long n = atomic_fetch_add(&fault_count, 1) + 1;
  int64_t pick = param_int(P_BRAID_FAULT_ALLOC);
  if (pick <= 0 || n != pick) return ncclSuccess;
  return log_err(ncclSystemError,
                 "out of %s memory allocating %s: %zu bytes (allocation %ld, failed on purpose: %s=%lld)",
                 device ? "device" : "host", what != NULL ? what : mem_doing_name("memory"), bytes, n,
                 param_name(P_BRAID_FAULT_ALLOC), (long long)pick);
}

const char *mem_doing(const char *what) {
  const char *prev = doing;
  doing = what;
  return prev;
}

const char *mem_doing_name(const char *fallback) {
  return doing != NULL ? doing : fallback;
}

long mem_fault_count(void) {
  return atomic_load(&fault_count);
}

size_t mem_process_bytes(int device) {
  return atomic_load(&process_bytes[device != 0]);
}

ncclResult_t mem_calloc(alloc_acct_t *acct, size_t n, size_t size, const char *what, void **ptr_p) {
  CHECK(mem_fault(what, n * size, 0));
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
