/*
 * NCCL 2.30's parameter API over Braid's one registry (base/param.h): every knob of params.def, NCCL_* and
 * BRAID_* alike, by its full name. Integer knobs read as any integer type their value fits; every knob reads
 * as text. Handles point into a table that lives as long as the process.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "base/check.h"
#include "base/log.h"
#include "base/param.h"

/* A handle: which knob. */
struct ncclParamHandle {
  param_id_t id;
};

static struct ncclParamHandle handles[P_COUNT];
static const char *names[P_COUNT];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void make_tables(void) {
  for (int i = 0; i < P_COUNT; i++) {
    handles[i].id = (param_id_t)i;
    names[i] = param_name((param_id_t)i);
  }
}

/* Checks a handle; *id_p is its knob. */
static ncclResult_t check_handle(ncclParamHandle_t h, const void *out, const char *func, param_id_t *id_p) {
  pthread_once(&tables_once, make_tables);
  if (h == NULL || h < handles || h >= handles + P_COUNT)
    return log_err(ncclInvalidArgument, "%s: handle %p is not one ncclParamBind made", func, (void *)h);
  if (out == NULL) return log_err(ncclInvalidArgument, "%s: out is NULL", func);
  *id_p = h->id;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclParamBind, ncclParamHandle_t *out, const char *key) {
  if (out == NULL || key == NULL)
    return log_err(ncclInvalidArgument, "ncclParamBind: %s is NULL", out == NULL ? "out" : "key");
  pthread_once(&tables_once, make_tables);
  int id = param_find(key);
  if (id < 0) return log_err(ncclInvalidArgument, "ncclParamBind: no parameter is named \"%s\"", key);
  *out = &handles[id];
  return ncclSuccess;
}

/* An integer knob's value, checked against the range [lo, hi] of the type asked for. */
static ncclResult_t get_int(ncclParamHandle_t h, const void *out, const char *func, int64_t lo, uint64_t hi,
                            int64_t *v_p) {
  param_id_t id;
  CHECK(check_handle(h, out, func, &id));
  if (param_is_text(id))
    return log_err(ncclInvalidArgument, "%s: %s is a text parameter; read it with ncclParamGetStr", func,
                   param_name(id));
  int64_t v = param_int(id);
  if (v < lo || (v > 0 && (uint64_t)v > hi))
    return log_err(ncclInvalidArgument, "%s: %s is %" PRId64 ", outside the type's %" PRId64 "..%" PRIu64,
                   func, param_name(id), v, lo, hi);
  *v_p = v;
  return ncclSuccess;
}

#define TYPED_GETTER(suffix, ctype, lo, hi)                                                                  \
  NCCL_API(ncclResult_t, ncclParamGet##suffix, ncclParamHandle_t h, ctype *out) {                            \
    int64_t v;                                                                                               \
    CHECK(get_int(h, out, "ncclParamGet" #suffix, (lo), (hi), &v));                                          \
    *out = (ctype)v;                                                                                         \
    return ncclSuccess;                                                                                      \
  }

TYPED_GETTER(I8, int8_t, INT8_MIN, INT8_MAX)
TYPED_GETTER(I16, int16_t, INT16_MIN, INT16_MAX)
TYPED_GETTER(I32, int32_t, INT32_MIN, INT32_MAX)
TYPED_GETTER(I64, int64_t, INT64_MIN, INT64_MAX)
TYPED_GETTER(U8, uint8_t, 0, UINT8_MAX)
TYPED_GETTER(U16, uint16_t, 0, UINT16_MAX)
TYPED_GETTER(U32, uint32_t, 0, UINT32_MAX)
TYPED_GETTER(U64, uint64_t, 0, UINT64_MAX)

/* The value as text, in a buffer of the calling thread (one per function, as NCCL's lifetimes say). */
static const char *as_text(param_id_t id, char *buf, int len) {
  if (param_is_text(id)) return param_str(id);
  param_format(id, buf, len);
  return buf;
}

NCCL_API(ncclResult_t, ncclParamGetStr, ncclParamHandle_t h, const char **out) {
  static _Thread_local char buf[32];
  param_id_t id;
  CHECK(check_handle(h, out, "ncclParamGetStr", &id));
  *out = as_text(id, buf, sizeof buf);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclParamGet, ncclParamHandle_t h, void *out, int maxLen, int *len) {
  param_id_t id;
  CHECK(check_handle(h, out, "ncclParamGet", &id));
  if (len == NULL) return log_err(ncclInvalidArgument, "ncclParamGet: len is NULL");
  int64_t v = param_int(id);
  const void *from = param_is_text(id) ? (const void *)param_str(id) : (const void *)&v;
  int need = param_is_text(id) ? (int)strlen(param_str(id)) + 1 : (int)sizeof v;
  if (maxLen < need) {
    *len = 0;
    return log_err(ncclInvalidArgument, "ncclParamGet: %s needs %d bytes; maxLen is %d", param_name(id), need,
                   maxLen);
  }
  memcpy(out, from, (size_t)need);
  *len = need;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclParamGetParameter, const char *key, const char **value, int *valueLen) {
  static _Thread_local char buf[32];
  if (key == NULL || value == NULL || valueLen == NULL)
    return log_err(ncclInvalidArgument, "ncclParamGetParameter: %s is NULL",
                   key == NULL     ? "key"
                   : value == NULL ? "value"
                                   : "valueLen");
  int id = param_find(key);
  if (id < 0) {
    *value = NULL;
    *valueLen = 0;
    return log_err(ncclInvalidArgument, "ncclParamGetParameter: no parameter is named \"%s\"", key);
  }
  *value = as_text((param_id_t)id, buf, sizeof buf);
  *valueLen = (int)strlen(*value);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclParamGetAllParameterKeys, const char ***table, int *tableLen) {
  if (table == NULL || tableLen == NULL)
    return log_err(ncclInvalidArgument, "ncclParamGetAllParameterKeys: %s is NULL",
                   table == NULL ? "table" : "tableLen");
  pthread_once(&tables_once, make_tables);
  *table = names;
  *tableLen = P_COUNT;
  return ncclSuccess;
}

NCCL_API(void, ncclParamDumpAll, void) {
  char buf[32];
  for (int i = 0; i < P_COUNT; i++) {
    param_id_t id = (param_id_t)i;
    printf("%s=%s (%s; default %s): %s\n", param_name(id), as_text(id, buf, sizeof buf), param_source(id),
           param_default(id), param_help(id));
  }
  fflush(stdout);
}
