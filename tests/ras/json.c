/*
 * The tests' strict JSON parser (see json.h): recursive descent over the grammar of RFC 8259.
 */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct {
  const char *p, *end, *start;
  char *err;
  size_t err_size;
  int failed;
} st_t;

static void fail(st_t *s, const char *why) {
  if (!s->failed) snprintf(s->err, s->err_size, "%s at byte %ld", why, (long)(s->p - s->start));
  s->failed = 1;
}

static void ws(st_t *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int lit(st_t *s, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) return 0;
  s->p += n;
  return 1;
}

static int hex4(st_t *s, unsigned *v) {
  *v = 0;
  for (int i = 0; i < 4; i++, s->p++) {
    if (s->p >= s->end) return 0;
    char c = *s->p;
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return 0;
    *v = *v * 16 + (unsigned)d;
  }
  return 1;
}

static void put_utf8(char *out, size_t *n, unsigned cp) {
  if (cp < 0x80) {
    out[(*n)++] = (char)cp;
  } else if (cp < 0x800) {
    out[(*n)++] = (char)(0xc0 | (cp >> 6));
    out[(*n)++] = (char)(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out[(*n)++] = (char)(0xe0 | (cp >> 12));
    out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[(*n)++] = (char)(0x80 | (cp & 0x3f));
  } else {
    out[(*n)++] = (char)(0xf0 | (cp >> 18));
    out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[(*n)++] = (char)(0x80 | (cp & 0x3f));
  }
}

static char *string(st_t *s) {
  if (s->p >= s->end || *s->p != '"') {
    fail(s, "expected a string");
    return NULL;
  }
  s->p++;
  char *out = malloc((size_t)(s->end - s->p) + 1);
  size_t n = 0;
  while (out != NULL && s->p < s->end && *s->p != '"') {
    unsigned char c = (unsigned char)*s->p;
    if (c < 0x20) {
      fail(s, "control character in a string");
      break;
    }
    if (c != '\\') {
      out[n++] = (char)c;
      s->p++;
      continue;
    }
    s->p++;
    if (s->p >= s->end) break;
    char e = *s->p++;
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e != '\0' && simple != NULL) {
      out[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
      continue;
    }
    unsigned cp, lo;
    if (e != 'u' || !hex4(s, &cp)) {
      fail(s, "bad escape");
      break;
    }
    if (cp >= 0xd800 && cp < 0xdc00) {
      if (!lit(s, "\\u") || !hex4(s, &lo) || lo < 0xdc00 || lo >= 0xe000) {
        fail(s, "unpaired surrogate");
        break;
      }
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    } else if (cp >= 0xdc00 && cp < 0xe000) {
      fail(s, "unpaired surrogate");
      break;
    }
    put_utf8(out, &n, cp);
  }
  if (!s->failed && (s->p >= s->end || *s->p != '"')) fail(s, "unterminated string");
  if (s->failed || out == NULL) {
    free(out);
    return NULL;
  }
  s->p++;
  out[n] = '\0';
  return out;
}

static int digits(st_t *s) {
  const char *b = s->p;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9') s->p++;
  return s->p > b;
}

static void number(st_t *s, js_t *v) {
  const char *b = s->p;
  if (s->p < s->end && *s->p == '-') s->p++;
  if (s->p < s->end && *s->p == '0')
    s->p++;
  else if (!digits(s))
    return fail(s, "bad number");
  if (s->p < s->end && *s->p == '.' && (s->p++, !digits(s))) return fail(s, "bad fraction");
  if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
    s->p++;
    if (s->p < s->end && (*s->p == '+' || *s->p == '-')) s->p++;
    if (!digits(s)) return fail(s, "bad exponent");
  }
  char buf[64];
  size_t n = (size_t)(s->p - b) < sizeof buf - 1 ? (size_t)(s->p - b) : sizeof buf - 1;
  memcpy(buf, b, n);
  buf[n] = '\0';
  v->type = JS_NUM;
  v->num = strtod(buf, NULL);
}

static void value(st_t *s, js_t *v, int depth);

static void add(st_t *s, js_t *v, char *key, int depth) {
  js_t *items = realloc(v->items, (size_t)(v->n + 1) * sizeof *items);
  char **keys = v->type == JS_OBJ ? realloc(v->keys, (size_t)(v->n + 1) * sizeof *keys) : NULL;
  if (items == NULL || (v->type == JS_OBJ && keys == NULL)) {
    if (items != NULL) v->items = items;
    free(key);
    return fail(s, "out of memory");
  }
  v->items = items;
  if (keys != NULL) v->keys = keys;
  memset(&v->items[v->n], 0, sizeof *v->items);
  if (keys != NULL) v->keys[v->n] = key;
  v->n++;
  value(s, &v->items[v->n - 1], depth + 1);
}

static void container(st_t *s, js_t *v, int depth, char close) {
  v->type = close == '}' ? JS_OBJ : JS_ARR;
  s->p++;
  ws(s);
  if (s->p < s->end && *s->p == close) {
    s->p++;
    return;
  }
  for (;;) {
    char *key = NULL;
    ws(s);
    if (v->type == JS_OBJ) {
      key = string(s);
      ws(s);
      if (s->failed || s->p >= s->end || *s->p != ':') {
        free(key);
        return fail(s, "expected ':'");
      }
      s->p++;
    }
    add(s, v, key, depth);
    if (s->failed) return;
    ws(s);
    if (s->p < s->end && *s->p == ',') {
      s->p++;
      continue;
    }
    if (s->p < s->end && *s->p == close) {
      s->p++;
      return;
    }
    return fail(s, "expected ',' or a closing bracket");
  }
}

static void value(st_t *s, js_t *v, int depth) {
  ws(s);
  if (depth > MAX_DEPTH) return fail(s, "nested too deep");
  if (s->p >= s->end) return fail(s, "unexpected end");
  char c = *s->p;
  if (c == '{' || c == '[') return container(s, v, depth, c == '{' ? '}' : ']');
  if (c == '"') {
    v->type = JS_STR;
    v->str = string(s);
    return;
  }
  if (lit(s, "true"))
    *v = (js_t){.type = JS_BOOL, .num = 1};
  else if (lit(s, "false"))
    *v = (js_t){.type = JS_BOOL};
  else if (lit(s, "null"))
    *v = (js_t){.type = JS_NULL};
  else if (c == '-' || (c >= '0' && c <= '9'))
    number(s, v);
  else
    fail(s, "unexpected character");
}

static void js_clear(js_t *v) {
  for (int i = 0; i < v->n; i++) {
    js_clear(&v->items[i]);
    if (v->keys != NULL) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
}

js_t *js_parse(const char *text, size_t len, char *err, size_t err_size) {
  st_t s = {.p = text, .end = text + len, .start = text, .err = err, .err_size = err_size};
  js_t *v = calloc(1, sizeof *v);
  if (v == NULL) return NULL;
  value(&s, v, 0);
  ws(&s);
  if (!s.failed && s.p != s.end) fail(&s, "text after the value");
  if (s.failed) {
    js_free(v);
    return NULL;
  }
  return v;
}

void js_free(js_t *v) {
  if (v == NULL) return;
  js_clear(v);
  free(v);
}

const js_t *js_get(const js_t *obj, const char *key) {
  if (obj == NULL || obj->type != JS_OBJ) return NULL;
  for (int i = 0; i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  return NULL;
}

const js_t *js_get_type(const js_t *obj, const char *key, js_type_t type) {
  const js_t *v = js_get(obj, key);
  return v != NULL && v->type == type ? v : NULL;
}
