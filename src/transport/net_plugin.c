/*
 * Networks: the plugin loader, the choice of a network per communicator, and the calls into a network of
 * any supported version (see net_plugin.h).
 *
 * The list of networks is made once per process, under a lock, by the first communicator that needs one.
 * Plugins older than v11 are initialised once per process (their init has no context); v11 plugins once
 * per communicator, each getting its own context. Devices and their properties are read at the first
 * successful init.
 */
#include "transport/net_plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/check.h"
#include "base/log.h"
#include "base/param.h"
#include "transport/net_tcp.h"

/* Networks a process may hold: the plugins NCCL_NET_PLUGIN names, and the built-in one. */
#define NP_MAX_NETS 16
/* Devices of one network that Braid looks at. */
#define NP_MAX_DEVS 64

/* Where a network stands. */
enum { NP_LOADED, NP_READY, NP_DISABLED };

struct np_net {
  char lib[PATH_MAX]; /* the library's path, or "built-in" */
  void *dl;           /* its dlopen handle (NULL: built in) */
  int version;        /* 6 to 11 */
  const void *table;  /* its ncclNet_vN_t */
  const char *name;   /* the table's name */
  int state;          /* NP_* */
  int ndevs;          /* devices (once NP_READY) */
  np_props_t *props;  /* their properties */
};

/* The process's networks. */
static struct {
  pthread_mutex_t lock; /* guards everything below and each network's state */
  int listed;           /* 1 once the list is made */
  np_net_t nets[NP_MAX_NETS];
  int n;
} reg = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define T(v) ((const ncclNet_v##v##_t *)n->table)

/* What plugins log through: NCCL's logger signature, into Braid's log. */
static void plugin_logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  if (!log_enabled((log_level_t)level, flags)) return;
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  size_t len = strlen(text);
  if (len > 0 && text[len - 1] == '\n') text[len - 1] = '\0'; /* some plugins end their lines themselves */
  log_write((log_level_t)level, flags, file, line, "%s", text);
}

/* ---- Loading ---- */

/* Whether a dlopen error says only that the file is not there. */
static int not_found(const char *err) {
  return err != NULL && strstr(err, "No such file or directory") != NULL;
}

/* The newest supported table a library exports (*version_p 6 to 11), or NULL; *old_p is the newest older
 * version it exports instead (0: none). */
static const void *find_table(void *dl, int *version_p, int *old_p) {
  char sym[32];
  *old_p = 0;
  for (int v = 11; v >= 2; v--) {
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    const void *t = dlsym(dl, sym);
    if (t == NULL) continue;
    if (v < 6) {
      *old_p = v;
      return NULL;
    }
    *version_p = v;
    return t;
  }
  return NULL;
}

static void add_net(void *dl, const void *table, int version, const char *lib) {
  np_net_t *n = &reg.nets[reg.n++];
  *n = (np_net_t){.dl = dl, .version = version, .table = table, .state = NP_LOADED};
  n->name = ((const ncclNet_v6_t *)table)->name; /* the name is every version's first field */
  if (n->name == NULL) n->name = "(unnamed)";
  snprintf(n->lib, sizeof n->lib, "%s", lib);
}

/* Opens `file`; on failure appends to `missing` (not there) or logs why (there, but unusable). */
static void *open_lib(const char *file, int named, char *missing, size_t missing_len) {
  void *dl = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (dl != NULL) return dl;
  const char *err = dlerror();
  if (not_found(err)) {
    size_t used = strlen(missing);
    snprintf(missing + used, missing_len - used, " %s", file);
  } else {
    LOG_AT(named ? LOG_WARN : LOG_INFO, LOG_INIT | LOG_NET, "NET/Plugin: %s cannot be loaded: %s", file,
           err != NULL ? err : "unknown error");
  }
  return NULL;
}

/* Loads one entry of NCCL_NET_PLUGIN (`named`: the user named it; the default library's absence is normal).
 */
static void load_one(const char *entry, int named) {
  char missing[2 * PATH_MAX] = "", alt[PATH_MAX] = "";
  size_t len = strlen(entry);
  int is_lib = strncmp(entry, "lib", 3) == 0 && len >= 3 && strcmp(entry + len - 3, ".so") == 0;
  if (strchr(entry, '/') == NULL && !is_lib) snprintf(alt, sizeof alt, "libnccl-net-%s.so", entry);
  const char *file = entry;
  void *dl = open_lib(entry, named, missing, sizeof missing);
  if (dl == NULL && alt[0] != '\0') dl = open_lib(file = alt, named, missing, sizeof missing);
  if (dl == NULL) {
    if (missing[0] != '\0')
      LOG_AT(named ? LOG_WARN : LOG_INFO, LOG_INIT | LOG_NET, "NET/Plugin: could not find:%s", missing);
    return;
  }
  char path[PATH_MAX];
  struct link_map *lm = NULL;
  snprintf(path, sizeof path, "%s", dlinfo(dl, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL ? lm->l_name : file);
  int version = 0, old = 0;
  const void *table = find_table(dl, &version, &old);
  if (table == NULL) {
    if (old > 0)
      WARN("NET/Plugin: %s exports only ncclNetPlugin_v%d; Braid supports versions 6 to 11", path, old);
    else
      WARN("NET/Plugin: %s exports no network plugin (no ncclNetPlugin_v6 to _v11)", path);
    dlclose(dl);
    return;
  }
  if (reg.n >= NP_MAX_NETS - 1) {
    WARN("NET/Plugin: %s ignored: at most %d plugins", path, NP_MAX_NETS - 1);
    dlclose(dl);
    return;
  }
  add_net(dl, table, version, path);
  INFO(LOG_INIT | LOG_NET, "NET/Plugin: loaded network %s (v%d) from %s", reg.nets[reg.n - 1].name, version,
       path);
}

/* Makes the process's list: the libraries NCCL_NET_PLUGIN names (or libnccl-net.so), then the built-in. */
static void list_networks(void) {
  int named = param_is_set(P_NCCL_NET_PLUGIN);
  const char *spec = named ? param_str(P_NCCL_NET_PLUGIN) : "libnccl-net.so";
  if (named) INFO(LOG_ENV | LOG_NET, "NCCL_NET_PLUGIN set by environment to %s", spec);
  if (strcasecmp(spec, "none") != 0) {
    char *list = strdup(spec), *save = NULL;
    for (char *e = list != NULL ? strtok_r(list, ",", &save) : NULL; e != NULL;
         e = strtok_r(NULL, ",", &save))
      load_one(e, named);
    free(list);
  }
  add_net(NULL, &tp_tcp_net, 11, "built-in");
  reg.listed = 1;
}

/* ---- Choosing ---- */

/* Reads the devices and their properties at the first successful init. */
static ncclResult_t read_devices(np_net_t *n);

/* Initialises a network for one communicator. A failure disables it (one log line) and is not an error. */
static int init_net(np_net_t *n, uint64_t comm_id, void **ctx_p) {
  ncclResult_t res;
  *ctx_p = NULL;
  if (n->version == 11) {
    ncclNetCommConfig_t cfg = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
    res = T(11)->init(ctx_p, comm_id, &cfg, plugin_logger, NULL);
  } else if (n->state == NP_READY) {
    return 1; /* older versions: initialised once per process */
  } else if (n->version == 10) {
    res = T(10)->init(plugin_logger, NULL);
  } else {
    res = T(6)->init(plugin_logger); /* v6 to v9 share init's signature */
  }
  if (res != ncclSuccess) {
    WARN("NET/Plugin: network %s (%s) failed to initialise (%s); trying the next network", n->name, n->lib,
         log_result_name(res));
    n->state = NP_DISABLED;
    return 0;
  }
  if (n->state == NP_READY) return 1;
  if (read_devices(n) != ncclSuccess || n->ndevs <= 0) {
    if (n->version == 11 && T(11)->finalize != NULL) T(11)->finalize(*ctx_p);
    n->state = NP_DISABLED;
    return 0;
  }
  n->state = NP_READY;
  return 1;
}

/* "Socket (built-in), Braid (/x/libnccl-net-braid.so, v11, failed)" into buf. */
static void describe_networks(char *buf, size_t len) {
  buf[0] = '\0';
  for (int i = 0; i < reg.n; i++) {
    const np_net_t *n = &reg.nets[i];
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%s (%s, v%d%s)", i > 0 ? ", " : "", n->name, n->lib, n->version,
             n->state == NP_DISABLED ? ", not usable" : "");
  }
}

ncclResult_t np_open(const char *want, uint64_t comm_id, np_ctx_t *ctx_p) {
  if (want != NULL && want[0] == '\0') want = NULL;
  pthread_mutex_lock(&reg.lock);
  if (!reg.listed) list_networks();
  np_net_t *chosen = NULL;
  void *ctx = NULL;
  for (int i = 0; i < reg.n && chosen == NULL; i++) {
    np_net_t *n = &reg.nets[i];
    if (n->state == NP_DISABLED || (want != NULL && strcasecmp(want, n->name) != 0)) continue;
    if (init_net(n, comm_id, &ctx)) chosen = n;
  }
  char names[1024];
  describe_networks(names, sizeof names);
  pthread_mutex_unlock(&reg.lock);
  if (chosen == NULL && want != NULL)
    return log_err(ncclInvalidUsage, "NCCL_NET=%s: no usable network of that name; networks found: %s", want,
                   names);
  if (chosen == NULL) return log_err(ncclSystemError, "no usable network; networks found: %s", names);
  INFO(LOG_INIT | LOG_NET, "Using network %s (%s, v%d)", chosen->name, chosen->lib, chosen->version);
  *ctx_p = (np_ctx_t){.net = chosen, .ctx = ctx};
  return ncclSuccess;
}

void np_close(np_ctx_t *c) {
  const np_net_t *n = c->net;
  if (n != NULL && n->version == 11 && T(11)->finalize != NULL) T(11)->finalize(c->ctx);
  c->net = NULL;
}

/* ---- Properties ---- */

/* The fields every version's properties share. */
#define COMMON_PROPS(p, src)                                                                                 \
  do {                                                                                                       \
    snprintf((p)->name, sizeof(p)->name, "%s", (src).name != NULL ? (src).name : "?");                       \
    (p)->ptr_support = (src).ptrSupport;                                                                     \
    (p)->speed = (src).speed;                                                                                \
    (p)->latency = (src).latency;                                                                            \
    (p)->max_comms = (src).maxComms;                                                                         \
    (p)->max_recvs = (src).maxRecvs;                                                                         \
  } while (0)

static ncclResult_t get_props(const np_net_t *n, int dev, np_props_t *p) {
  union {
    ncclNetProperties_v6_t v6;
    ncclNetProperties_v7_t v7;
    ncclNetProperties_v8_t v8;
    ncclNetProperties_v9_t v9;
    ncclNetProperties_v11_t v11;
  } u;
  memset(&u, 0, sizeof u);
  memset(p, 0, sizeof *p);
  size_t max_bytes = 0;
  ncclResult_t res;
  switch (n->version) {
  case 6:
    if ((res = T(6)->getProperties(dev, &u.v6)) == ncclSuccess) COMMON_PROPS(p, u.v6);
    break;
  case 7:
    if ((res = T(7)->getProperties(dev, &u.v7)) == ncclSuccess) COMMON_PROPS(p, u.v7);
    break;
  case 8:
    if ((res = T(8)->getProperties(dev, &u.v8)) == ncclSuccess) COMMON_PROPS(p, u.v8);
    p->reg_is_global = u.v8.regIsGlobal;
    break;
  case 9:
  case 10:
    res = n->version == 9 ? T(9)->getProperties(dev, &u.v9) : T(10)->getProperties(dev, &u.v9);
    if (res == ncclSuccess) COMMON_PROPS(p, u.v9);
    p->reg_is_global = u.v9.regIsGlobal;
    p->force_flush = u.v9.forceFlush;
    max_bytes = u.v9.maxP2pBytes;
    break;
  default:
    if ((res = T(11)->getProperties(dev, &u.v11)) == ncclSuccess) COMMON_PROPS(p, u.v11);
    p->reg_is_global = u.v11.regIsGlobal;
    p->force_flush = u.v11.forceFlush;
    max_bytes = u.v11.maxP2pBytes;
    break;
  }
  if (max_bytes == 0 || max_bytes > NCCL_NET_DEFAULT_MAX_BYTES) max_bytes = NCCL_NET_DEFAULT_MAX_BYTES;
  p->max_bytes = max_bytes;
  p->max_requests = n->version == 6 ? NCCL_NET_MAX_REQUESTS_V6 : NCCL_NET_MAX_REQUESTS;
  if (p->max_recvs < 1) p->max_recvs = 1;
  return res;
}

static ncclResult_t read_devices(np_net_t *n) {
  int ndevs = 0;
  const ncclNet_v6_t *t = n->table; /* devices() has one signature in every version */
  ncclResult_t res = t->devices(&ndevs);
  if (res != ncclSuccess || ndevs <= 0) {
    WARN("NET/Plugin: network %s (%s) reports %s; trying the next network", n->name, n->lib,
         res != ncclSuccess ? "an error when asked for its devices" : "no devices");
    return ncclSystemError;
  }
  if (ndevs > NP_MAX_DEVS) ndevs = NP_MAX_DEVS;
  n->props = calloc((size_t)ndevs, sizeof *n->props);
  if (n->props == NULL)
    return log_err(ncclSystemError, "network %s: out of memory for %d devices", n->name, ndevs);
  for (int d = 0; d < ndevs; d++) {
    np_props_t *p = &n->props[d];
    if (get_props(n, d, p) != ncclSuccess) {
      WARN("NET/Plugin: network %s (%s) failed to describe device %d", n->name, n->lib, d);
      free(n->props);
      n->props = NULL;
      return ncclSystemError;
    }
    INFO(LOG_INIT | LOG_NET,
         "NET/%s: device %d %s: %d Mbps, memory:%s%s%s, %d receives per call, %d requests", n->name, d,
         p->name, p->speed, p->ptr_support & NCCL_PTR_HOST ? " host" : "",
         p->ptr_support & NCCL_PTR_CUDA ? " GPU" : "", p->ptr_support & NCCL_PTR_DMABUF ? " dma-buf" : "",
         p->max_recvs, p->max_requests);
  }
  n->ndevs = ndevs;
  return ncclSuccess;
}

const char *np_name(const np_net_t *n) {
  return n->name;
}

const char *np_lib(const np_net_t *n) {
  return n->lib;
}

int np_version(const np_net_t *n) {
  return n->version;
}

int np_ndevs(const np_net_t *n) {
  return n->ndevs;
}

const np_props_t *np_props(const np_net_t *n, int dev) {
  return &n->props[dev];
}

const char *np_why(const np_net_t *n, const void *comm) {
  return n->table == &tp_tcp_net ? tp_tcp_why(comm) : "";
}

/* ---- Calls ---- */

/* Refuses sizes an int-sized version cannot carry. */
static ncclResult_t fits_int(const np_net_t *n, size_t size, const char *call) {
  if (size <= INT_MAX) return ncclSuccess;
  return log_err(ncclInvalidUsage, "network %s (v%d): %s of %zu bytes; this version takes at most %d",
                 n->name, n->version, call, size, INT_MAX);
}

ncclResult_t np_listen(const np_ctx_t *c, int dev, void *handle, void **listen_p) {
  const np_net_t *n = c->net;
  if (n->version == 11) return T(11)->listen(c->ctx, dev, handle, listen_p);
  return T(6)->listen(dev, handle, listen_p); /* v6 to v10 share listen's signature */
}

ncclResult_t np_connect(const np_ctx_t *c, int dev, void *handle, void **send_p) {
  const np_net_t *n = c->net;
  ncclNetDeviceHandle_t *offload = NULL; /* no device offload asked for */
  ncclNetCommConfig_t cfg = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
  switch (n->version) {
  case 6:
    return T(6)->connect(dev, handle, send_p);
  case 7:
    return T(7)->connect(dev, handle, send_p, &offload);
  case 8:
    return T(8)->connect(dev, handle, send_p, &offload);
  case 9:
    return T(9)->connect(dev, handle, send_p, &offload);
  case 10:
    return T(10)->connect(dev, &cfg, handle, send_p, &offload);
  default:
    return T(11)->connect(c->ctx, dev, handle, send_p, &offload);
  }
}

ncclResult_t np_accept(const np_net_t *n, void *listen, void **recv_p) {
  ncclNetDeviceHandle_t *offload = NULL;
  if (n->version == 6) return T(6)->accept(listen, recv_p);
  return T(7)->accept(listen, recv_p, &offload); /* v7 to v11 share accept's signature */
}

ncclResult_t np_reg(const np_net_t *n, void *comm, void *data, size_t size, int type, void **mhandle_p) {
  if (n->version <= 7) {
    CHECK(fits_int(n, size, "regMr"));
    return T(6)->regMr(comm, data, (int)size, type, mhandle_p); /* v6 and v7: int size */
  }
  return T(8)->regMr(comm, data, size, type, mhandle_p);
}

ncclResult_t np_reg_dmabuf(const np_net_t *n, void *comm, void *data, size_t size, int type, uint64_t offset,
                           int fd, void **mhandle_p) {
  if (T(6)->regMrDmaBuf == NULL) return log_err(ncclInvalidUsage, "network %s has no regMrDmaBuf", n->name);
  return T(6)->regMrDmaBuf(comm, data, size, type, offset, fd, mhandle_p);
}

ncclResult_t np_dereg(const np_net_t *n, void *comm, void *mhandle) {
  return T(6)->deregMr(comm, mhandle);
}

ncclResult_t np_isend(const np_net_t *n, void *comm, void *data, size_t size, int tag, void *mhandle,
                      void **request_p) {
  if (n->version <= 8) {
    CHECK(fits_int(n, size, "isend"));
    return T(6)->isend(comm, data, (int)size, tag, mhandle, request_p);
  }
  if (n->version == 9) return T(9)->isend(comm, data, size, tag, mhandle, request_p);
  return T(10)->isend(comm, data, size, tag, mhandle, NULL, request_p); /* v10, v11 */
}

ncclResult_t np_irecv(const np_net_t *n, void *comm, int count, void **data, const size_t *sizes,
                      const int *tags, void **mhandles, void **request_p) {
  int isizes[NP_MAX_GROUP], itags[NP_MAX_GROUP];
  size_t zsizes[NP_MAX_GROUP];
  void *phandles[NP_MAX_GROUP] = {NULL};
  if (count < 1 || count > NP_MAX_GROUP)
    return log_err(ncclInternalError, "network %s: a grouped receive of %d buffers (1 to %d)", n->name, count,
                   NP_MAX_GROUP);
  for (int i = 0; i < count; i++) {
    if (n->version <= 8) CHECK(fits_int(n, sizes[i], "irecv"));
    isizes[i] = (int)sizes[i];
    zsizes[i] = sizes[i];
    itags[i] = tags[i];
  }
  *request_p = NULL;
  if (n->version <= 8) return T(6)->irecv(comm, count, data, isizes, itags, mhandles, request_p);
  if (n->version == 9) return T(9)->irecv(comm, count, data, zsizes, itags, mhandles, request_p);
  return T(10)->irecv(comm, count, data, zsizes, itags, mhandles, phandles, request_p);
}

ncclResult_t np_iflush(const np_net_t *n, void *comm, int count, void **data, const size_t *sizes,
                       void **mhandles, void **request_p) {
  int isizes[NP_MAX_GROUP];
  *request_p = NULL;
  if (T(6)->iflush == NULL) return ncclSuccess;
  if (count < 1 || count > NP_MAX_GROUP)
    return log_err(ncclInternalError, "network %s: a flush of %d buffers (1 to %d)", n->name, count,
                   NP_MAX_GROUP);
  for (int i = 0; i < count; i++) {
    CHECK(fits_int(n, sizes[i], "iflush"));
    isizes[i] = (int)sizes[i];
  }
  return T(6)->iflush(comm, count, data, isizes, mhandles, request_p); /* every version: int sizes */
}

ncclResult_t np_test(const np_net_t *n, void *request, int *done_p, int *size_p) {
  *size_p = -1; /* stays so when the plugin does not fill it in */
  *done_p = 0;
  return T(6)->test(request, done_p, size_p);
}

void np_close_send(const np_net_t *n, void *comm) {
  if (comm != NULL) (void)T(6)->closeSend(comm);
}

void np_close_recv(const np_net_t *n, void *comm) {
  if (comm != NULL) (void)T(6)->closeRecv(comm);
}

void np_close_listen(const np_net_t *n, void *listen) {
  if (listen != NULL) (void)T(6)->closeListen(listen);
}
