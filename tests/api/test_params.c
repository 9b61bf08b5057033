/*
 * NCCL 2.30's parameter API over the registry: binding by full name, typed reads with range checks, text
 * and raw reads, the list of keys and the dump. Values are set through the environment before the registry
 * is first read, so every expected value is known independently of the library's defaults.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"

#define EXPECT_ERR(call, code, what)                                                                         \
  do {                                                                                                       \
    EXPECT_RES(call, code);                                                                                  \
    EXPECT(strstr(ncclGetLastError(NULL), what) != NULL, "last error \"%s\" does not mention \"%s\"",        \
           ncclGetLastError(NULL), what);                                                                    \
  } while (0)

static void typed_reads(void) {
  setenv("BRAID_HOST_BUFFSIZE", "300000", 1); /* fits 32 bits, not 16 */
  setenv("BRAID_STALL_WARN_S", "-7", 1);
  ncclResetDebugInit(); /* re-reads the registry */
  ncclParamHandle_t h, neg;
  EXPECT_ERR(ncclParamBind(&h, "BRAID_NO_SUCH_KNOB"), ncclInvalidArgument, "BRAID_NO_SUCH_KNOB");
  EXPECT_ERR(ncclParamBind(NULL, "NCCL_DEBUG"), ncclInvalidArgument, "out");
  EXPECT_OK(ncclParamBind(&h, "BRAID_HOST_BUFFSIZE"));
  EXPECT_OK(ncclParamBind(&neg, "BRAID_STALL_WARN_S"));
  int64_t i64 = 0;
  int32_t i32 = 0;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  int16_t i16 = 0;
  int8_t i8 = 0;
  uint8_t u8 = 0;
  uint16_t u16 = 0;
  EXPECT_OK(ncclParamGetI64(h, &i64));
  EXPECT(i64 == 300000, "I64 %lld", (long long)i64);
  EXPECT_OK(ncclParamGetI32(h, &i32));
  EXPECT_OK(ncclParamGetU32(h, &u32));
  EXPECT_OK(ncclParamGetU64(h, &u64));
  EXPECT(i32 == 300000 && u32 == 300000 && u64 == 300000, "%d %u %llu", i32, u32, (unsigned long long)u64);
  EXPECT_ERR(ncclParamGetI16(h, &i16), ncclInvalidArgument, "outside");
  EXPECT_ERR(ncclParamGetU16(h, &u16), ncclInvalidArgument, "outside");
  EXPECT_ERR(ncclParamGetI8(h, &i8), ncclInvalidArgument, "BRAID_HOST_BUFFSIZE");
  EXPECT_ERR(ncclParamGetU8(h, &u8), ncclInvalidArgument, "outside");
  EXPECT_OK(ncclParamGetI8(neg, &i8));
  EXPECT(i8 == -7, "I8 %d", i8);
  EXPECT_ERR(ncclParamGetU64(neg, &u64), ncclInvalidArgument, "outside");
  EXPECT_ERR(ncclParamGetI64(NULL, &i64), ncclInvalidArgument, "handle");
  EXPECT_ERR(ncclParamGetI64((ncclParamHandle_t)&i64, &i64), ncclInvalidArgument, "handle");
  EXPECT_ERR(ncclParamGetI64(h, NULL), ncclInvalidArgument, "out");
}

static void text_reads(void) {
  setenv("BRAID_HOST_BUFFSIZE", "65536", 1);
  setenv("NCCL_SOCKET_IFNAME", "=lo,eth7", 1);
  ncclResetDebugInit();
  ncclParamHandle_t num, text;
  EXPECT_OK(ncclParamBind(&num, "BRAID_HOST_BUFFSIZE"));
  EXPECT_OK(ncclParamBind(&text, "NCCL_SOCKET_IFNAME"));
  const char *s = NULL;
  EXPECT_OK(ncclParamGetStr(text, &s));
  EXPECT(strcmp(s, "=lo,eth7") == 0, "text \"%s\"", s);
  EXPECT_OK(ncclParamGetStr(num, &s));
  EXPECT(strcmp(s, "65536") == 0, "number as text \"%s\"", s);
  int32_t i32;
  EXPECT_ERR(ncclParamGetI32(text, &i32), ncclInvalidArgument, "text parameter");
  char raw[64];
  int len = -1;
  EXPECT_OK(ncclParamGet(text, raw, sizeof raw, &len));
  EXPECT(len == 9 && memcmp(raw, "=lo,eth7", 9) == 0, "raw text of %d bytes", len);
  EXPECT_ERR(ncclParamGet(text, raw, 4, &len), ncclInvalidArgument, "needs 9 bytes");
  EXPECT(len == 0, "len %d after a refusal", len);
  int64_t v = 0;
  EXPECT_OK(ncclParamGet(num, &v, sizeof v, &len));
  EXPECT(len == 8 && v == 65536, "raw number %lld of %d bytes", (long long)v, len);
  int vlen = 0;
  EXPECT_OK(ncclParamGetParameter("NCCL_SOCKET_IFNAME", &s, &vlen));
  EXPECT(vlen == 8 && strcmp(s, "=lo,eth7") == 0, "by key: \"%s\" (%d)", s, vlen);
  EXPECT_ERR(ncclParamGetParameter("NCCL_NOPE", &s, &vlen), ncclInvalidArgument, "NCCL_NOPE");
  EXPECT(s == NULL && vlen == 0, "an unknown key left a value");
}

static void keys_and_dump(void) {
  const char **keys = NULL;
  int n = 0;
  EXPECT_OK(ncclParamGetAllParameterKeys(&keys, &n));
  int seen = 0;
  for (int i = 0; i < n; i++) {
    ncclParamHandle_t h;
    EXPECT_OK(ncclParamBind(&h, keys[i])); /* every key listed binds */
    seen += strcmp(keys[i], "NCCL_DEBUG") == 0 || strcmp(keys[i], "BRAID_FAULT_ALLOC") == 0;
  }
  EXPECT(n > 20 && seen == 2, "%d keys, NCCL_DEBUG and BRAID_FAULT_ALLOC seen %d times", n, seen);
  EXPECT_ERR(ncclParamGetAllParameterKeys(NULL, &n), ncclInvalidArgument, "table");
  /* the dump names every knob once */
  char path[] = "/tmp/braid-params-XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0, "mkstemp");
  fflush(stdout);
  EXPECT(freopen(path, "w", stdout) != NULL, "stdout to %s", path);
  ncclParamDumpAll();
  fflush(stdout);
  for (int i = 0; i < n; i++) {
    char line[128];
    snprintf(line, sizeof line, "%s=", keys[i]);
    EXPECT(test_file_lines(path, line) >= 1, "the dump misses %s", keys[i]);
  }
  unlink(path);
}

int main(void) {
  TEST(typed_reads, 30);
  TEST(text_reads, 30);
  TEST(keys_and_dump, 30);
  return test_summary();
}
