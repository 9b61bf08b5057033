/*
 * A strict JSON parser for the monitoring tests (RFC 8259: no trailing commas, no comments, every escape and
 * number form checked, control characters refused, nothing after the value), with a small tree to query.
 */
#ifndef BRAID_TESTS_RAS_JSON_H
#define BRAID_TESTS_RAS_JSON_H

#include <stddef.h>

typedef enum { JS_NULL, JS_BOOL, JS_NUM, JS_STR, JS_ARR, JS_OBJ } js_type_t;

typedef struct js {
  js_type_t type;
  double num;       /* JS_NUM; JS_BOOL: 0 or 1 */
  char *str;        /* JS_STR (decoded, UTF-8) */
  int n;            /* JS_ARR, JS_OBJ: entries */
  struct js *items; /* [n] */
  char **keys;      /* JS_OBJ: [n] */
} js_t;

/* Parses text[0..len); returns a tree (free with js_free), or NULL with the reason and offset in err. */
js_t *js_parse(const char *text, size_t len, char *err, size_t err_size);
void js_free(js_t *v);
/* The member `key` of an object (NULL if absent or not an object). */
const js_t *js_get(const js_t *obj, const char *key);
/* The same, required to be of `type` (NULL otherwise). */
const js_t *js_get_type(const js_t *obj, const char *key, js_type_t type);

#endif
