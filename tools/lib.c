/*
 * Loading the measured NCCL library (see lib.h). The entry points are looked up by name in a table that
 * points into nccl_lib_t, so adding a function means one field and one table line.
 */
#include "lib.h"

#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* One entry point: its exported name and where its address goes in nccl_lib_t. */
typedef struct {
  const char *name;
  size_t offset;
} symbol_t;

#define SYM(field)                                                                                           \
  { "nccl" #field, offsetof(nccl_lib_t, field) }
static const symbol_t symbols[] = {
    SYM(GetVersion),    SYM(GetUniqueId),    SYM(CommInitRank), SYM(CommInitAll),
    SYM(CommDestroy),   SYM(GetErrorString), SYM(GetLastError), SYM(RedOpCreatePreMulSum),
    SYM(RedOpDestroy),  SYM(AllReduce),      SYM(Reduce),       SYM(Broadcast),
    SYM(ReduceScatter), SYM(AllGather),      SYM(AlltoAll),     SYM(Gather),
    SYM(Scatter),       SYM(Send),           SYM(Recv),         SYM(GroupStart),
    SYM(GroupEnd),
};
#undef SYM

int lib_default_path(char *buf, size_t len) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n < 0) {
    fprintf(stderr, "braid: cannot read /proc/self/exe: %s\n", strerror(errno));
    return -1;
  }
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash != NULL) *slash = '\0';
  /* The build's lib folder, else the installed one (lib/<multiarch> under /usr). */
  static const char *const dirs[] = {"lib", BRAID_INSTALL_LIBDIR};
  for (int i = 0; i < 2; i++) {
    if ((size_t)snprintf(buf, len, "%s/../%s/libnccl.so.2", exe, dirs[i]) >= len) {
      fprintf(stderr, "braid: library path beside %s is too long\n", exe);
      return -1;
    }
    if (access(buf, F_OK) == 0) return 0;
  }
  snprintf(buf, len, "%s/../lib/libnccl.so.2", exe);
  return 0;
}

int lib_open(const char *path, nccl_lib_t *lib_p) {
  nccl_lib_t lib = {0};
  if (strlen(path) >= sizeof(lib.path)) {
    fprintf(stderr, "braid: library path too long: %s\n", path);
    return -1;
  }
  strcpy(lib.path, path);
  lib.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == NULL) {
    fprintf(stderr, "braid: cannot load %s: %s\n", path, dlerror());
    return -1;
  }
  for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
    void *fn = dlsym(lib.handle, symbols[i].name);
    if (fn == NULL) {
      fprintf(stderr, "braid: %s does not export %s\n", path, symbols[i].name);
      dlclose(lib.handle);
      return -1;
    }
    /* POSIX guarantees a data pointer from dlsym converts to a function pointer; copy its bytes. */
    memcpy((char *)&lib + symbols[i].offset, &fn, sizeof(fn));
  }
  *lib_p = lib;
  return 0;
}

void lib_close(nccl_lib_t *lib) {
  if (lib->handle != NULL) dlclose(lib->handle);
  lib->handle = NULL;
}

void lib_report(const nccl_lib_t *lib, ncclComm_t comm, const char *who, const char *what, ncclResult_t res) {
  const char *last = lib->GetLastError(comm);
  fprintf(stderr, "%s: %s failed: %s (%s)\n", who, what, lib->GetErrorString(res),
          last != NULL && last[0] != '\0' ? last : "no further detail");
}
