/*
 * The public surface: version, error strings, every exported symbol, configuration handling, and bad input
 * (each gets ncclInvalidArgument or ncclInvalidUsage and a last-error message naming the problem, and
 * nothing crashes).
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nccl.h"

static ncclUniqueId id;

/* The last error message must contain `what`. */
#define EXPECT_ERR(call, code, what)                                                                         \
  do {                                                                                                       \
    EXPECT_RES(call, code);                                                                                  \
    EXPECT(strstr(ncclGetLastError(NULL), what) != NULL, "last error \"%s\" does not mention \"%s\"",        \
           ncclGetLastError(NULL), what);                                                                    \
  } while (0)

static void version_and_strings(void) {
  int v = 0;
  EXPECT_OK(ncclGetVersion(&v));
  EXPECT(v == 22809, "version %d", v);
  EXPECT_ERR(ncclGetVersion(NULL), ncclInvalidArgument, "version");
  for (int r = 0; r <= ncclNumResults; r++)
    EXPECT(ncclGetErrorString((ncclResult_t)r) != NULL, "string of %d", r);
  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "success string");
  EXPECT(strstr(ncclGetErrorString(ncclNumResults), "unknown") != NULL, "unknown code");
  EXPECT(strcmp(ncclGetErrorString(ncclTimeout), "timeout") == 0, "ncclTimeout's string");
}

/* Every host function of NCCL 2.28.9 is exported under both names, and nothing else is. */
static void exports(void) {
  static const char *names[] = {"AllGather",
                                "AllReduce",
                                "AlltoAll",
                                "Bcast",
                                "Broadcast",
                                "CommAbort",
                                "CommCount",
                                "CommCuDevice",
                                "CommDeregister",
                                "CommDestroy",
                                "CommFinalize",
                                "CommGetAsyncError",
                                "CommInitAll",
                                "CommInitRank",
                                "CommInitRankConfig",
                                "CommInitRankScalable",
                                "CommRegister",
                                "CommRevoke",
                                "CommShrink",
                                "CommSplit",
                                "CommUserRank",
                                "CommWindowDeregister",
                                "CommWindowRegister",
                                "DevCommCreate",
                                "DevCommDestroy",
                                "Gather",
                                "GetErrorString",
                                "GetLastError",
                                "GetUniqueId",
                                "GetVersion",
                                "GinBarrierCreateRequirement",
                                "GroupEnd",
                                "GroupSimulateEnd",
                                "GroupStart",
                                "LLA2ACalcSlots",
                                "LLA2ACreateRequirement",
                                "LsaBarrierCreateRequirement",
                                "MemAlloc",
                                "MemFree",
                                "Recv",
                                "RedOpCreatePreMulSum",
                                "RedOpDestroy",
                                "Reduce",
                                "ReduceScatter",
                                "ResetDebugInit",
                                "Scatter",
                                "Send",
                                "TeamLsa",
                                "TeamRail",
                                "TeamRankToLsa",
                                "TeamRankToWorld",
                                "TeamWorld"};
  void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  EXPECT(lib != NULL, "libnccl.so.2 is not loaded: %s", dlerror());
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "nccl%s", names[i]);
    EXPECT(dlsym(lib, name) != NULL, "%s is not exported", name);
    snprintf(name, sizeof name, "pnccl%s", names[i]);
    EXPECT(dlsym(lib, name) != NULL, "%s is not exported", name);
  }
  EXPECT(dlsym(lib, "comm_init") == NULL && dlsym(lib, "log_err") == NULL, "internal symbols are exported");
}

static void bad_init(void) {
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_ERR(ncclCommInitRank(NULL, 2, id, 0), ncclInvalidArgument, "comm is NULL");
  EXPECT_ERR(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, "nranks");
  EXPECT_ERR(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument, "rank 2");
  EXPECT_ERR(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument, "rank -1");
  ncclUniqueId bad = id;
  bad.internal[5] ^= 0x40;
  EXPECT_RES(ncclCommInitRank(&comm, 1, bad, 0), ncclInvalidArgument);
  memset(&bad, 0, sizeof bad);
  EXPECT_RES(ncclCommInitRank(&comm, 1, bad, 0), ncclInvalidArgument);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0x12345678;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "magic");
  config = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
  config.size = 3;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "size");
  config = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
  config.blocking = 5;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "blocking");
  EXPECT_ERR(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument, "comm");
  int dup[2] = {0, 0};
  ncclComm_t comms[2];
  EXPECT_ERR(ncclCommInitAll(comms, 2, dup), ncclInvalidUsage, "twice");
}

/* A config from an older header (only up to `blocking`) and one from a newer, larger header both work. */
static void config_versions(void) {
  struct {
    ncclConfig_t cfg;
    int future_field[4];
  } big;
  memset(&big, 0x55, sizeof big);
  big.cfg = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
  big.cfg.size = sizeof big;
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRankConfig(&comm, 1, id, 0, &big.cfg));
  EXPECT_OK(ncclCommDestroy(comm));
  /* NCCL 2.28's and 2.29's layouts: the fields after theirs are not read */
  const size_t layouts[2] = {offsetof(ncclConfig_t, graphUsageMode), offsetof(ncclConfig_t, maxP2pPeers)};
  for (int i = 0; i < 2; i++) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.size = layouts[i];
    cfg.version = i == 0 ? 22809 : 22907;
    if (i == 0) cfg.graphUsageMode = 99; /* invalid, but not part of NCCL 2.28's layout */
    cfg.graphStreamOrdering = 99;        /* nor of 2.29's */
    EXPECT_OK(ncclGetUniqueId(&id));
    EXPECT_OK(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg));
    EXPECT_OK(ncclCommDestroy(comm));
  }
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.graphUsageMode = 3;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, "graphUsageMode");
  bad = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
  bad.graphStreamOrdering = 2;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, "graphStreamOrdering");
  ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
  old.size = offsetof(ncclConfig_t, blocking) + sizeof(int);
  old.cgaClusterSize = 12345; /* beyond the old size: must be ignored */
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRankConfig(&comm, 1, id, 0, &old));
  EXPECT_OK(ncclCommDestroy(comm));
}

static void bad_calls(void) {
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));
  float buf[8];
  EXPECT_ERR(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument, "comm is NULL");
  long fake[64] = {0};
  EXPECT_ERR(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, (ncclComm_t)fake, NULL), ncclInvalidArgument,
             "not a communicator");
  EXPECT_ERR(ncclAllReduce(NULL, buf, 8, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
             "sendbuff is NULL");
  EXPECT_ERR(ncclAllReduce(buf, NULL, 8, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
             "recvbuff is NULL");
  EXPECT_OK(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, NULL));
  EXPECT_ERR(ncclAllReduce(buf, buf, 8, (ncclDataType_t)12, ncclSum, comm, NULL), ncclInvalidArgument,
             "datatype");
  EXPECT_ERR(ncclAllReduce(buf, buf, 8, ncclFloat, (ncclRedOp_t)9, comm, NULL), ncclInvalidArgument,
             "operation");
  EXPECT_ERR(ncclBroadcast(buf, buf, 8, ncclFloat, 1, comm, NULL), ncclInvalidArgument, "root 1");
  EXPECT_ERR(ncclReduce(buf, buf, 8, ncclFloat, ncclSum, -1, comm, NULL), ncclInvalidArgument, "root -1");
  EXPECT_ERR(ncclSend(buf, 8, ncclFloat, 3, comm, NULL), ncclInvalidArgument, "peer 3");
  EXPECT_ERR(ncclRecv(buf, 8, ncclFloat, -2, comm, NULL), ncclInvalidArgument, "peer -2");
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  /* A receive from self without the matching send is refused, and the communicator stays usable. */
  EXPECT_ERR(ncclRecv(buf, 8, ncclFloat, 0, comm, NULL), ncclInvalidUsage, "itself");
  EXPECT_OK(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, NULL));
  /* An error inside a group comes back from ncclGroupEnd too. */
  EXPECT_OK(ncclGroupStart());
  EXPECT_RES(ncclAllReduce(NULL, buf, 8, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT_RES(ncclGroupEnd(), ncclInvalidArgument);
  ncclRedOp_t op;
  float scalar = 2;
  EXPECT_ERR(ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat, ncclScalarHostImmediate, comm),
             ncclInvalidArgument, "op");
  EXPECT_ERR(ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat, ncclScalarHostImmediate, comm),
             ncclInvalidArgument, "scalar");
  EXPECT_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  EXPECT_ERR(ncclAllReduce(buf, buf, 8, ncclDouble, op, comm, NULL), ncclInvalidArgument, "made for float");
  EXPECT_OK(ncclRedOpDestroy(op, comm));
  EXPECT_ERR(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "not made");
  EXPECT_ERR(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument, "built-in");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  sim.magic = 1;
  EXPECT_OK(ncclGroupStart());
  EXPECT_ERR(ncclGroupSimulateEnd(&sim), ncclInvalidArgument, "magic");
  sim = (ncclSimInfo_t)NCCL_SIM_INFO_INITIALIZER;
  EXPECT_OK(ncclGroupSimulateEnd(&sim));
  EXPECT_ERR(ncclCommShrink(comm, NULL, 0, NULL, NULL, 0), ncclInvalidArgument, "newcomm");
  ncclComm_t child = (ncclComm_t)fake;
  int self = 0, outside = 3;
  EXPECT_ERR(ncclCommShrink(comm, NULL, 0, &child, NULL, 0), ncclInvalidArgument, "excludeRanksCount");
  EXPECT_ERR(ncclCommShrink(comm, NULL, 1, &child, NULL, 0), ncclInvalidArgument, "excludeRanksList is NULL");
  EXPECT_ERR(ncclCommShrink(comm, &self, 1, &child, NULL, 0), ncclInvalidArgument, "must not call");
  EXPECT_ERR(ncclCommShrink(comm, &outside, 1, &child, NULL, 0), ncclInvalidArgument, "outside 0..0");
  EXPECT_ERR(ncclCommShrink(comm, &outside, 1, &child, NULL, 4), ncclInvalidArgument, "shrinkFlags");
  EXPECT_ERR(ncclCommRevoke(comm, 1), ncclInvalidArgument, "revokeFlags");
  EXPECT_OK(ncclCommRevoke(NULL, 0));
  ncclUniqueId gid;
  EXPECT_ERR(ncclCommGetUniqueId(NULL, &gid), ncclInvalidArgument, "comm is NULL");
  EXPECT_ERR(ncclCommGetUniqueId(comm, NULL), ncclInvalidArgument, "uniqueId");
  EXPECT_ERR(ncclCommGrow(comm, 2, NULL, 0, NULL, NULL), ncclInvalidArgument, "newcomm");
  EXPECT_ERR(ncclCommGrow(comm, 2, NULL, 0, &child, NULL), ncclInvalidArgument, "passes -1");
  EXPECT_ERR(ncclCommGrow(comm, 1, NULL, -1, &child, NULL), ncclInvalidArgument, "must exceed");
  EXPECT_ERR(ncclCommGrow(NULL, 2, NULL, 1, &child, NULL), ncclInvalidArgument, "uniqueId is NULL");
  EXPECT_ERR(ncclCommGrow(NULL, 2, &id, -1, &child, NULL), ncclInvalidArgument, "rank is -1");
  EXPECT_OK(ncclCommGetUniqueId(comm, &gid));
  EXPECT_ERR(ncclCommGetUniqueId(comm, &gid), ncclInvalidUsage, "no ncclCommGrow has used");
  /* a grow whose existing ranks pass no token fails on all of them, naming the cause */
  EXPECT_ERR(ncclCommGrow(comm, 2, NULL, -1, &child, NULL), ncclInvalidArgument, "no existing rank passed");
  EXPECT(child == NULL, "a failed grow left newcomm set");
  EXPECT_ERR(ncclPutSignal(buf, 1, ncclFloat, 0, NULL, 0, 0, 0, 0, comm, NULL), ncclInvalidUsage,
             "ncclPutSignal");
  EXPECT_ERR(ncclSignal(0, 0, 0, 0, comm, NULL), ncclInvalidUsage, "ncclSignal");
  EXPECT_ERR(ncclWaitSignal(0, NULL, comm, NULL), ncclInvalidUsage, "ncclWaitSignal");
  /* after a revoke, every call fails and says why; the communicator can still be destroyed */
  EXPECT_OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  EXPECT_ERR(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage, "revoked");
  EXPECT_ERR(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclInvalidUsage, "revoked already");
  EXPECT_ERR(ncclCommFinalize(comm), ncclInvalidUsage, "revoked");
  EXPECT_ERR(ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage, "revoked");
  int count;
  EXPECT_ERR(ncclCommCount(comm, NULL), ncclInvalidArgument, "count");
  EXPECT_OK(ncclCommDestroy(comm));
  /* The handle of a destroyed communicator is recognised. */
  EXPECT_ERR(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage, "destroyed");
  EXPECT_ERR(ncclCommCount(comm, &count), ncclInvalidUsage, "destroyed");
}

static void memory(void) {
  void *p = NULL;
  EXPECT_OK(ncclMemAlloc(&p, 12345));
  EXPECT(p != NULL && (uintptr_t)p % 4096 == 0, "ncclMemAlloc gave %p", p);
  memset(p, 1, 12345);
  EXPECT_ERR(ncclMemAlloc(NULL, 10), ncclInvalidArgument, "ptr");
  void *none = (void *)1;
  EXPECT_OK(ncclMemAlloc(&none, 0));
  EXPECT(none == NULL, "0 bytes give NULL");
  EXPECT_OK(ncclMemFree(none));
  ncclComm_t comm;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));
  void *handle;
  ncclWindow_t win;
  EXPECT_OK(ncclCommRegister(comm, p, 12345, &handle));
  EXPECT_OK(ncclCommWindowRegister(comm, p, 12345, &win, NCCL_WIN_COLL_SYMMETRIC));
  EXPECT_ERR(ncclCommWindowRegister(comm, (char *)p + 1, 100, &win, NCCL_WIN_COLL_SYMMETRIC),
             ncclInvalidArgument, "aligned");
  EXPECT_OK(ncclAllReduce(p, p, 12345 / 4, ncclFloat, ncclSum, comm, NULL));
  EXPECT_OK(ncclCommWindowDeregister(comm, win));
  EXPECT_OK(ncclCommDeregister(comm, handle));
  long junk[4] = {0};
  EXPECT_ERR(ncclCommDeregister(comm, junk), ncclInvalidArgument, "not a registration");
  EXPECT_OK(ncclCommDestroy(comm));
  EXPECT_OK(ncclMemFree(p));
}

/* Calls deferred to a group's end (split, finalize, suspend, init) whose communicator is destroyed before the
 * group ends: ncclGroupEnd says which call found it gone, and nothing runs on it. */
static void destroyed_in_group(void) {
  static const char *const calls[] = {"ncclCommSplit", "ncclCommFinalize", "ncclCommSuspend",
                                      "ncclCommInitRank"};
  for (int k = 0; k < 4; k++) {
    ncclComm_t comm = NULL, child = NULL;
    EXPECT_OK(ncclGetUniqueId(&id));
    if (k < 3) EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));
    EXPECT_OK(ncclGroupStart());
    if (k == 0) EXPECT_OK(ncclCommSplit(comm, 0, 0, &child, NULL));
    if (k == 1) EXPECT_OK(ncclCommFinalize(comm));
    if (k == 2) EXPECT_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
    if (k == 3) EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));
    EXPECT_OK(ncclCommDestroy(comm));
    EXPECT_RES(ncclGroupEnd(), ncclInvalidUsage);
    char want[128];
    snprintf(want, sizeof want, "%s: the communicator was destroyed before the group's end", calls[k]);
    EXPECT(strstr(ncclGetLastError(NULL), want) != NULL, "last error \"%s\" for %s", ncclGetLastError(NULL),
           calls[k]);
    EXPECT(child == NULL, "%s: a child communicator came back", calls[k]);
  }
}

int main(void) {
  TEST(version_and_strings, 30);
  TEST(exports, 30);
  TEST(bad_init, 60);
  TEST(config_versions, 60);
  TEST(bad_calls, 60);
  TEST(destroyed_in_group, 60);
  TEST(memory, 60);
  return test_summary();
}
