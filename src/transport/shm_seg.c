/*
 * POSIX shared-memory segments (see shm_seg.h).
 */
#include "transport/shm_seg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"

/* Distinguishes the segments one process creates. */
static _Atomic unsigned segment_counter;

static ncclResult_t map_fd(int fd, size_t bytes, const char *what, void **base_p) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return log_err(ncclSystemError, "%s: mmap of %zu bytes failed: %s", what, bytes, strerror(errno));
  *base_p = p;
  return ncclSuccess;
}

ncclResult_t tp_seg_create(const tp_config_t *config, int peer, size_t bytes, const char *what,
                           tp_seg_t *seg_p) {
  ncclResult_t res;
  CHECK(mem_fault(what, bytes, 0));
  tp_seg_t s = {.bytes = bytes};
  snprintf(s.name, sizeof s.name, "/braid-%016llx-r%d-s%d-p%d-%u", (unsigned long long)config->nonce,
           config->rank, peer, (int)getpid(),
           atomic_fetch_add_explicit(&segment_counter, 1, memory_order_relaxed));
  int fd = shm_open(s.name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return log_err(ncclSystemError, "%s: shm_open(%s) failed: %s", what, s.name, strerror(errno));
  if (ftruncate(fd, (off_t)bytes) != 0) {
    res = log_err(ncclSystemError, "%s: ftruncate(%s, %zu) failed: %s", what, s.name, bytes, strerror(errno));
    goto err_unlink;
  }
  int err = posix_fallocate(fd, 0, (off_t)bytes);
  if (err != 0) {
    res = log_err(ncclSystemError, "%s: reserving %zu bytes for %s failed: %s", what, bytes, s.name,
                  strerror(err));
    goto err_unlink;
  }
  CHECK_GOTO(map_fd(fd, bytes, what, &s.base), res, err_unlink);
  close(fd);
  *seg_p = s;
  return ncclSuccess;

err_unlink:
  shm_unlink(s.name);
  close(fd);
  return res;
}

ncclResult_t tp_seg_attach(const char *name, size_t bytes, const char *what, tp_seg_t *seg_p) {
  ncclResult_t res;
  tp_seg_t s = {.bytes = bytes};
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return log_err(ncclSystemError, "%s: shm_open(%s) failed: %s", what, name, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != bytes) {
    res = log_err(ncclInternalError, "%s: segment %s has %lld bytes, expected %zu", what, name,
                  (long long)st.st_size, bytes);
    goto err_close_fd;
  }
  CHECK_GOTO(map_fd(fd, bytes, what, &s.base), res, err_close_fd);
  /* Both sides hold a mapping now; the name is no longer needed (the creator's close ignores ENOENT). */
  if (shm_unlink(name) != 0 && errno != ENOENT)
    WARN("%s: shm_unlink(%s) failed: %s", what, name, strerror(errno));
  close(fd);
  *seg_p = s;
  return ncclSuccess;

err_close_fd:
  close(fd);
  return res;
}

void tp_seg_close(tp_seg_t *seg, const char *what) {
  if (seg->base != NULL) munmap(seg->base, seg->bytes);
  seg->base = NULL;
  /* The attaching side normally removed the name already; it is still there when nobody attached. */
  if (seg->name[0] != '\0' && shm_unlink(seg->name) != 0 && errno != ENOENT)
    WARN("%s: shm_unlink(%s) failed: %s", what, seg->name, strerror(errno));
  seg->name[0] = '\0';
}
