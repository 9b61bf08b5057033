/*
 * json_check FILE NLIBS NRANKS COLLECTIVE...: checks a `braid bench --json` file. It parses the file with a
 * strict JSON parser of its own (RFC 8259: no trailing commas, no comments, every escape and number form
 * checked, nothing after the value), then checks what the bench promises: the tool's name, the run's mode
 * with NRANKS ranks, NLIBS libraries, and results whose every row has its names, sizes, per-library arrays
 * of NLIBS figures, no wrong values, ratios exactly when there are two libraries, a floor time (a positive
 * number) exactly when the mode says "floor", and at least one row of each COLLECTIVE named. Exits 0, or 1
 * saying what is wrong.
 *
 * json_check --resources FILE NLIBS NRANKS DEVICE [WHAT=A[,B]...]: checks a `braid bench --resources` file
 * the same strict way, then its promises: kind "resources", NRANKS ranks on DEVICE (cuda or host), NLIBS
 * libraries that each completed, and every figure, in order, once, with one value per library: memory
 * figures null on the host and numbers on cuda, times positive, the time per iteration at least the host time
 * of the iteration's calls, and each ratio B/A where it is defined (null otherwise). Each WHAT=A[,B] asserts
 * a figure's values (within 0.05; '*' for any).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A parsed value. Objects keep their keys in order. */
typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype_t;
typedef struct jval {
  jtype_t type;
  double num; /* J_NUM; J_BOOL: 0 or 1 */
  char *str;  /* J_STR */
  int n;      /* J_ARR, J_OBJ: entries */
  struct jval *items;
  char **keys; /* J_OBJ */
} jval_t;

typedef struct {
  const char *s;
  size_t pos, len;
  char err[200];
} parser_t;

static int parse_value(parser_t *p, jval_t *v, int depth);

static int perr(parser_t *p, const char *what) {
  if (p->err[0] == '\0') snprintf(p->err, sizeof(p->err), "%s at byte %zu", what, p->pos);
  return -1;
}

static void skip_ws(parser_t *p) {
  while (p->pos < p->len && strchr(" \t\r\n", p->s[p->pos]) != NULL && p->s[p->pos] != '\0') p->pos++;
}

static int literal(parser_t *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || strncmp(p->s + p->pos, word, n) != 0) return perr(p, "bad literal");
  p->pos += n;
  return 0;
}

/* A string: its unescaped bytes (\u escapes become '?'), which the checks only compare as ASCII. */
static int parse_string(parser_t *p, char **out) {
  if (p->s[p->pos] != '"') return perr(p, "expected a string");
  size_t cap = 16, n = 0;
  char *buf = malloc(cap);
  for (p->pos++;; p->pos++) {
    if (p->pos >= p->len) return free(buf), perr(p, "unterminated string");
    unsigned char ch = (unsigned char)p->s[p->pos];
    if (ch == '"') break;
    if (ch < 0x20) return free(buf), perr(p, "control character in a string");
    if (ch == '\\') {
      char e = ++p->pos < p->len ? p->s[p->pos] : '\0';
      if (e == 'u') {
        for (int k = 1; k <= 4; k++)
          if (p->pos + k >= p->len || !isxdigit((unsigned char)p->s[p->pos + k]))
            return free(buf), perr(p, "bad \\u");
        p->pos += 4;
        ch = '?';
      } else {
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *at = e ? strchr(from, e) : NULL;
        if (at == NULL) return free(buf), perr(p, "bad escape");
        ch = (unsigned char)to[at - from];
      }
    }
    if (n + 2 > cap) buf = realloc(buf, cap *= 2);
    buf[n++] = (char)ch;
  }
  p->pos++;
  buf[n] = '\0';
  *out = buf;
  return 0;
}

/* A number, checked against JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int parse_number(parser_t *p, jval_t *v) {
  size_t i = p->pos;
  const char *s = p->s;
  if (i < p->len && s[i] == '-') i++;
  if (i < p->len && s[i] == '0')
    i++;
  else if (i < p->len && s[i] >= '1' && s[i] <= '9')
    while (i < p->len && isdigit((unsigned char)s[i])) i++;
  else
    return perr(p, "bad number");
  if (i < p->len && s[i] == '.') {
    if (++i >= p->len || !isdigit((unsigned char)s[i])) return perr(p, "bad fraction");
    while (i < p->len && isdigit((unsigned char)s[i])) i++;
  }
  if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
    if (++i < p->len && (s[i] == '+' || s[i] == '-')) i++;
    if (i >= p->len || !isdigit((unsigned char)s[i])) return perr(p, "bad exponent");
    while (i < p->len && isdigit((unsigned char)s[i])) i++;
  }
  v->type = J_NUM;
  v->num = strtod(s + p->pos, NULL);
  p->pos = i;
  return 0;
}

/* An array or object: entries separated by commas between the brackets. */
static int parse_list(parser_t *p, jval_t *v, int object, int depth) {
  v->type = object ? J_OBJ : J_ARR;
  p->pos++;
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == (object ? '}' : ']')) {
    p->pos++;
    return 0;
  }
  for (;;) {
    v->items = realloc(v->items, (size_t)(v->n + 1) * sizeof(*v->items));
    v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof(*v->keys));
    memset(&v->items[v->n], 0, sizeof(*v->items));
    v->keys[v->n] = NULL;
    skip_ws(p);
    if (object) {
      if (p->pos >= p->len || parse_string(p, &v->keys[v->n]) != 0) return perr(p, "expected a key");
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos++] != ':') return perr(p, "expected ':'");
    }
    if (parse_value(p, &v->items[v->n++], depth + 1) != 0) return -1;
    skip_ws(p);
    char ch = p->pos < p->len ? p->s[p->pos++] : '\0';
    if (ch == (object ? '}' : ']')) return 0;
    if (ch != ',') return perr(p, "expected ',' or the closing bracket");
  }
}

static int parse_value(parser_t *p, jval_t *v, int depth) {
  skip_ws(p);
  if (depth > 64) return perr(p, "nested too deep");
  if (p->pos >= p->len) return perr(p, "unexpected end");
  char ch = p->s[p->pos];
  if (ch == '{' || ch == '[') return parse_list(p, v, ch == '{', depth);
  if (ch == '"') {
    v->type = J_STR;
    return parse_string(p, &v->str);
  }
  if (ch == 't' || ch == 'f') {
    v->type = J_BOOL;
    v->num = ch == 't';
    return literal(p, ch == 't' ? "true" : "false");
  }
  if (ch == 'n') {
    v->type = J_NULL;
    return literal(p, "null");
  }
  return parse_number(p, v);
}

static const jval_t *get(const jval_t *obj, const char *key) {
  for (int i = 0; obj != NULL && obj->type == J_OBJ && i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  return NULL;
}

static int failures;

static void bad(const char *where, const char *what) {
  if (failures++ < 20) fprintf(stderr, "json_check: %s: %s\n", where, what);
}

/* Checks that obj[key] exists and has the given type. */
static const jval_t *need(const jval_t *obj, const char *key, jtype_t type, const char *where) {
  const jval_t *v = get(obj, key);
  char what[96];
  snprintf(what, sizeof(what), "\"%s\" %s", key, v == NULL ? "missing" : "has the wrong type");
  if (v == NULL || v->type != type) {
    bad(where, what);
    return NULL;
  }
  return v;
}

/* A per-library array: nlibs numbers (null allowed where a figure may be missing), each >= lo. */
static void check_per_lib(const jval_t *row, const char *key, int nlibs, double lo, int nulls,
                          const char *where) {
  const jval_t *a = need(row, key, J_ARR, where);
  if (a == NULL) return;
  if (a->n != nlibs) bad(where, key);
  for (int l = 0; l < a->n; l++) {
    const jval_t *x = &a->items[l];
    if (!((x->type == J_NUM && x->num >= lo) || (nulls && x->type == J_NULL))) bad(where, key);
  }
}

static void check_row(const jval_t *row, int nlibs, int floor, char *where) {
  const jval_t *coll = need(row, "collective", J_STR, "result");
  snprintf(where, 96, "result %s", coll != NULL ? coll->str : "?");
  need(row, "type", J_STR, where);
  need(row, "op", J_STR, where);
  need(row, "root", J_NUM, where);
  const jval_t *place = need(row, "place", J_STR, where);
  if (place != NULL && strcmp(place->str, "out") != 0 && strcmp(place->str, "in") != 0) bad(where, "place");
  const jval_t *bytes = need(row, "bytes", J_NUM, where), *batch = need(row, "batch", J_NUM, where);
  need(row, "count", J_NUM, where);
  if ((bytes != NULL && bytes->num < 0) || (batch != NULL && batch->num < 1)) bad(where, "bytes or batch");
  check_per_lib(row, "time_us", nlibs, 0, 0, where);
  check_per_lib(row, "algbw", nlibs, 0, 1, where);
  check_per_lib(row, "busbw", nlibs, 0, 1, where);
  check_per_lib(row, "wrong", nlibs, 0, 0, where);
  const jval_t *wrong = get(row, "wrong");
  for (int l = 0; wrong != NULL && wrong->type == J_ARR && l < wrong->n; l++)
    if (wrong->items[l].type == J_NUM && wrong->items[l].num != 0) bad(where, "wrong values");
  const char *ratios[] = {"time_ratio", "busbw_ratio"};
  for (int k = 0; k < 2; k++) {
    const jval_t *r = get(row, ratios[k]);
    if (r == NULL || (nlibs > 1 ? r->type != J_NUM && r->type != J_NULL : r->type != J_NULL))
      bad(where, ratios[k]);
  }
  const jval_t *f = get(row, "floor_us");
  if (f == NULL || (floor ? f->type != J_NUM || f->num <= 0 : f->type != J_NULL)) bad(where, "floor_us");
}

/* The top of either kind of file: the tool, date, GPU and libraries; with `sweep`, the sweep's "mode". */
static void check_header(const jval_t *root, int nlibs, int nranks, int sweep) {
  const jval_t *tool = need(root, "tool", J_STR, "top");
  if (tool != NULL && strcmp(tool->str, "braid bench") != 0) bad("top", "tool is not \"braid bench\"");
  need(root, "date", J_STR, "top");
  need(root, "gpu", J_STR, "top");
  if (sweep) {
    const jval_t *mode = need(root, "mode", J_OBJ, "top");
    const jval_t *n = need(mode, "nranks", J_NUM, "mode");
    if (n != NULL && n->num != nranks) bad("mode", "nranks");
    need(mode, "device", J_STR, "mode");
    need(mode, "layout", J_STR, "mode");
    need(mode, "samples", J_NUM, "mode");
    need(mode, "floor", J_BOOL, "mode");
  }
  const jval_t *libs = need(root, "libraries", J_ARR, "top");
  if (libs != NULL && libs->n != nlibs) bad("libraries", "wrong count");
  for (int l = 0; libs != NULL && l < libs->n; l++) {
    const jval_t *name = need(&libs->items[l], "name", J_STR, "library");
    if (name != NULL && (name->str[0] != 'A' + l || name->str[1] != '\0')) bad("library", "name");
    need(&libs->items[l], "path", J_STR, "library");
    need(&libs->items[l], "version", J_NUM, "library");
  }
}

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 1 << 16;
  char *buf = malloc(cap);
  *len = 0;
  for (size_t got; buf != NULL && (got = fread(buf + *len, 1, cap - *len, f)) > 0;)
    if ((*len += got) == cap) buf = realloc(buf, cap *= 2);
  fclose(f);
  return buf;
}

/* Resources files ------------------------------------------------------------------------------------- */

/* The figures a resources file holds, in order; those ending in _mib are memory. */
static const char *const res_whats[] = {
    "mem_before_init_mib", "init_ms",           "mem_after_init_mib", "mem_bench_mib",
    "first_all_reduce_ms", "mem_after_all_mib", "mem_increase_mib",   "enqueue_us",
    "iteration_us",        "floor_launch_us",   "mem_end_mib"};
#define RES_NWHATS ((int)(sizeof(res_whats) / sizeof(res_whats[0])))

static int is_memory(const char *what) {
  size_t n = strlen(what);
  return n > 4 && strcmp(what + n - 4, "_mib") == 0;
}

/* The floor of the host's time per call: a GPU's, measured by the bench, not a library's cost. */
static int is_floor(const char *what) {
  return strcmp(what, "floor_launch_us") == 0;
}

/* A figure's ratio: B/A of its values where both are numbers, A's positive, and the figure is the library's
 * own (not the memory before init, not the bench's buffers, not the floor); null otherwise. */
static void check_ratio(const jval_t *fig, const char *what, const jval_t *vals, int nlibs) {
  const jval_t *r = get(fig, "ratio");
  int own = strcmp(what, "mem_before_init_mib") != 0 && strcmp(what, "mem_bench_mib") != 0 && !is_floor(what);
  int defined = own && nlibs > 1 && vals != NULL && vals->n == nlibs && vals->items[0].type == J_NUM &&
                vals->items[0].num > 0 && vals->items[1].type == J_NUM;
  if (r == NULL || r->type != (defined ? J_NUM : J_NULL)) {
    bad(what, defined ? "ratio is not a number" : "ratio is not null");
    return;
  }
  double want = defined ? vals->items[1].num / vals->items[0].num : 0;
  if (defined && fabs(r->num - want) > 1e-3 * fabs(want) + 1e-9) bad(what, "ratio is not B/A");
}

/* One figure: its name, one value per library (null exactly for memory and the floor on the host), its
 * ratio. */
static void check_figure(const jval_t *fig, const char *what, int nlibs, int host) {
  const jval_t *name = need(fig, "what", J_STR, what);
  if (name != NULL && strcmp(name->str, what) != 0) bad(what, "figure out of order or misnamed");
  const jval_t *vals = need(fig, "values", J_ARR, what);
  if (vals != NULL && vals->n != nlibs) bad(what, "not one value per library");
  for (int l = 0; vals != NULL && l < vals->n; l++) {
    const jval_t *v = &vals->items[l];
    if ((is_memory(what) || is_floor(what)) && host) {
      if (v->type != J_NULL) bad(what, "memory or the floor on the host is not null");
    } else if (v->type != J_NUM || v->num < 0 || (!is_memory(what) && v->num <= 0)) {
      bad(what, is_memory(what) ? "memory is not a number >= 0" : "time is not a positive number");
    }
  }
  check_ratio(fig, what, vals, nlibs);
}

/* The value of figure `what` for library l, or NaN. */
static double figure(const jval_t *figs, const char *what, int l) {
  for (int i = 0; figs != NULL && i < figs->n; i++) {
    const jval_t *name = get(&figs->items[i], "what"), *vals = get(&figs->items[i], "values");
    if (name == NULL || name->type != J_STR || strcmp(name->str, what) != 0) continue;
    if (vals != NULL && vals->type == J_ARR && l < vals->n && vals->items[l].type == J_NUM)
      return vals->items[l].num;
  }
  return NAN;
}

/* WHAT=A[,B]: the figure's values, within 0.05, '*' for any. */
static void check_assertion(const jval_t *figs, const char *arg, int nlibs) {
  char what[64];
  const char *eq = strchr(arg, '=');
  if (eq == NULL || (size_t)(eq - arg) >= sizeof(what)) {
    bad(arg, "not WHAT=A[,B]");
    return;
  }
  memcpy(what, arg, (size_t)(eq - arg));
  what[eq - arg] = '\0';
  const char *v = eq + 1;
  for (int l = 0; l < nlibs && *v != '\0'; l++) {
    char *end = (char *)v;
    double want = *v == '*' ? NAN : strtod(v, &end);
    if (*v == '*') end++;
    double got = figure(figs, what, l);
    if (!isnan(want) && !(fabs(got - want) <= 0.05)) {
      char msg[96];
      snprintf(msg, sizeof(msg), "library %c: %g, expected %g", 'A' + l, got, want);
      bad(what, msg);
    }
    v = *end == ',' ? end + 1 : end;
  }
}

static void check_resources(const jval_t *root, int nlibs, int nranks, const char *device, int nasserts,
                            char **asserts) {
  const jval_t *kind = need(root, "kind", J_STR, "top"), *dev = need(root, "device", J_STR, "top");
  if (kind != NULL && strcmp(kind->str, "resources") != 0) bad("top", "kind is not \"resources\"");
  if (dev != NULL && strcmp(dev->str, device) != 0) bad("top", "device");
  const jval_t *n = need(root, "nranks", J_NUM, "top");
  if (n != NULL && n->num != nranks) bad("top", "nranks");
  need(root, "buffer_bytes", J_NUM, "top");
  need(root, "iterations", J_NUM, "top");
  const jval_t *libs = get(root, "libraries");
  for (int l = 0; libs != NULL && libs->type == J_ARR && l < libs->n; l++) {
    const jval_t *done = need(&libs->items[l], "complete", J_BOOL, "library");
    if (done != NULL && !done->num) bad("library", "did not complete");
  }
  const jval_t *figs = need(root, "figures", J_ARR, "top");
  if (figs != NULL && figs->n != RES_NWHATS) bad("figures", "not every figure, or more");
  for (int i = 0; figs != NULL && i < figs->n && i < RES_NWHATS; i++)
    check_figure(&figs->items[i], res_whats[i], nlibs, strcmp(device, "host") == 0);
  /* An iteration is nranks calls and the wait for them: never less than their host time. */
  for (int l = 0; l < nlibs; l++)
    if (!(figure(figs, "iteration_us", l) >= figure(figs, "enqueue_us", l) * nranks * (1 - 1e-4)))
      bad("iteration_us", "less than nranks calls' host time");
  for (int a = 0; a < nasserts; a++) check_assertion(figs, asserts[a], nlibs);
}

/* Reads and parses a file; exits on failure. */
static jval_t parse_file(const char *path) {
  parser_t p = {0};
  p.s = read_all(path, &p.len);
  if (p.s == NULL) {
    fprintf(stderr, "json_check: cannot read %s\n", path);
    exit(1);
  }
  jval_t root = {0};
  if (parse_value(&p, &root, 0) == 0) {
    skip_ws(&p);
    if (p.pos != p.len) perr(&p, "text after the value");
  }
  if (p.err[0] != '\0') {
    fprintf(stderr, "json_check: %s: not JSON: %s\n", path, p.err);
    exit(1);
  }
  return root;
}

int main(int argc, char **argv) {
  if (argc >= 6 && strcmp(argv[1], "--resources") == 0) {
    jval_t root = parse_file(argv[2]);
    int nlibs = atoi(argv[3]), nranks = atoi(argv[4]);
    check_header(&root, nlibs, nranks, 0);
    check_resources(&root, nlibs, nranks, argv[5], argc - 6, argv + 6);
    printf("json_check: %s: resources, %d problem(s)\n", argv[2], failures);
    return failures ? 1 : 0;
  }
  if (argc < 5) {
    fprintf(stderr, "usage: json_check FILE NLIBS NRANKS COLLECTIVE...\n"
                    "       json_check --resources FILE NLIBS NRANKS cuda|host [WHAT=A[,B]...]\n");
    return 2;
  }
  jval_t root = parse_file(argv[1]);
  int nlibs = atoi(argv[2]), nranks = atoi(argv[3]);
  check_header(&root, nlibs, nranks, 1);
  const jval_t *results = need(&root, "results", J_ARR, "top");
  const jval_t *mode = get(&root, "mode"), *floor = mode != NULL ? get(mode, "floor") : NULL;
  int with_floor = floor != NULL && floor->type == J_BOOL && floor->num != 0;
  char where[96];
  for (int i = 0; results != NULL && i < results->n; i++)
    check_row(&results->items[i], nlibs, with_floor, where);
  for (int a = 4; a < argc; a++) {
    int rows = 0;
    for (int i = 0; results != NULL && i < results->n; i++) {
      const jval_t *c = get(&results->items[i], "collective");
      rows += c != NULL && c->type == J_STR && strcmp(c->str, argv[a]) == 0;
    }
    if (rows == 0) bad(argv[a], "no result rows");
  }
  printf("json_check: %s: %d result rows, %d problem(s)\n", argv[1], results != NULL ? results->n : 0,
         failures);
  return failures ? 1 : 0;
}
