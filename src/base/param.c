/*
 * The parameter registry (see param.h): one table built from params.def, filled from the environment and
 * the configuration files the first time any knob is read.
 *
 * A reload (ncclResetDebugInit) may run while other threads read knobs: a string handed out is never freed
 * (a value that changes gets a new string; the old one is kept, so the memory grows only with changes), and
 * every field a reader loads is an atomic that the reload stores whole.
 */
#include "param.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

typedef enum { KIND_INT, KIND_STR } kind_t;

/* One knob: its declaration and its current value. */
typedef struct {
  const char *name;
  kind_t kind;
  const char *def; /* default, as text */
  const char *help;
  _Atomic(const char *) value;  /* current value as text, or NULL for the default; never freed */
  _Atomic(const char *) source; /* "env" or the file it came from; NULL for the default; never freed */
  _Atomic int64_t ival;         /* parsed value of an integer knob */
} param_t;

/* Loaded values before they are published: a load fills these, then stores them into the table. */
typedef struct {
  const char *value, *source;
  int64_t ival;
} staged_t;

static param_t params[P_COUNT] = {
#define PARAM_INT(n, d, h) [P_##n] = {.name = #n, .kind = KIND_INT, .def = #d, .help = h},
#define PARAM_STR(n, d, h) [P_##n] = {.name = #n, .kind = KIND_STR, .def = d, .help = h},
#include "params.def"
#undef PARAM_INT
#undef PARAM_STR
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t reload_lock = PTHREAD_MUTEX_INITIALIZER;

static param_t *lookup(const char *name, size_t len) {
  for (int i = 0; i < P_COUNT; i++)
    if (strlen(params[i].name) == len && strncmp(params[i].name, name, len) == 0) return &params[i];
  return NULL;
}

/* A copy of `text` that lives as long as the process: the same string when the knob already holds it. */
static const char *keep(const char *old, const char *text) {
  if (old != NULL && strcmp(old, text) == 0) return old;
  const char *copy = strdup(text);
  return copy != NULL ? copy : old;
}

/* Stages a knob's text and parses it; a bad integer keeps the default and says so. */
static void set_value(const param_t *p, staged_t *st, const char *value, const char *source) {
  if (p->kind == KIND_INT) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 0);
    while (*end == ' ' || *end == '\t') end++;
    if (errno != 0 || end == value || *end != '\0') {
      fprintf(stderr, "Braid: ignoring %s=\"%s\" from %s: not an integer\n", p->name, value, source);
      return;
    }
    st->ival = v;
  }
  st->value = keep(atomic_load(&p->value), value);
  st->source = keep(atomic_load(&p->source), source);
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  char *e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = '\0';
  return s;
}

/* Applies NAME=VALUE lines of a configuration file to knobs that no earlier source set. */
static void read_file(const char *path, staged_t *staged) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  char line[1024];
  while (fgets(line, sizeof line, f) != NULL) {
    char *s = trim(line);
    if (*s == '#' || *s == '\0') continue;
    char *eq = strchr(s, '=');
    if (eq == NULL) continue;
    *eq = '\0';
    char *name = trim(s);
    param_t *p = lookup(name, strlen(name));
    if (p != NULL && staged[p - params].value == NULL) set_value(p, &staged[p - params], trim(eq + 1), path);
  }
  fclose(f);
}

static void load(void) {
  staged_t staged[P_COUNT];
  for (int i = 0; i < P_COUNT; i++) {
    param_t *p = &params[i];
    staged[i] = (staged_t){.ival = p->kind == KIND_INT ? strtoll(p->def, NULL, 0) : 0};
    const char *env = getenv(p->name);
    if (env != NULL) set_value(p, &staged[i], env, "env");
  }
  /* The user's file (or NCCL_CONF_FILE) before the system's: the first source to set a knob wins. */
  const char *conf = getenv("NCCL_CONF_FILE");
  if (conf != NULL && *conf != '\0') {
    read_file(conf, staged);
  } else {
    const char *home = getenv("HOME");
    if (home != NULL) {
      char path[4096];
      snprintf(path, sizeof path, "%s/.nccl.conf", home);
      read_file(path, staged);
    }
  }
  read_file("/etc/nccl.conf", staged);
  for (int i = 0; i < P_COUNT; i++) {
    atomic_store(&params[i].ival, staged[i].ival);
    atomic_store(&params[i].value, staged[i].value);
    atomic_store(&params[i].source, staged[i].source);
  }
}

static void ensure_loaded(void) {
  pthread_once(&once, load);
}

void param_reload(void) {
  ensure_loaded();
  pthread_mutex_lock(&reload_lock);
  load();
  pthread_mutex_unlock(&reload_lock);
}

int64_t param_int(param_id_t id) {
  ensure_loaded();
  return atomic_load_explicit(&params[id].ival, memory_order_relaxed);
}

const char *param_str(param_id_t id) {
  ensure_loaded();
  /* acquire: the string's bytes were written before the pointer was stored */
  const char *v = atomic_load_explicit(&params[id].value, memory_order_acquire);
  return v != NULL ? v : params[id].def;
}

int param_is_set(param_id_t id) {
  ensure_loaded();
  return atomic_load_explicit(&params[id].value, memory_order_acquire) != NULL;
}

const char *param_name(param_id_t id) {
  return params[id].name;
}

const char *param_help(param_id_t id) {
  return params[id].help;
}

const char *param_source(param_id_t id) {
  ensure_loaded();
  const char *src = atomic_load_explicit(&params[id].source, memory_order_acquire);
  return src != NULL ? src : "default";
}

int param_find(const char *name) {
  const param_t *p = lookup(name, strlen(name));
  return p != NULL ? (int)(p - params) : -1;
}

int param_is_text(param_id_t id) {
  return params[id].kind == KIND_STR;
}

const char *param_default(param_id_t id) {
  return params[id].def;
}

void param_format(param_id_t id, char *buf, int len) {
  ensure_loaded();
  if (params[id].kind == KIND_INT)
    snprintf(buf, len, "%" PRId64, param_int(id));
  else
    snprintf(buf, len, "%s", param_str(id));
}

/* Appends the NCCL_* variables of the environment that no knob reads to list ("" when none). nccl-tests reads
 * NCCL_TESTS_* itself: those are not the library's. */
void param_unknown_nccl_vars(char *list, size_t len) {
  size_t n = 0;
  list[0] = '\0';
  for (char **e = environ; e != NULL && *e != NULL; e++) {
    const char *eq = strchr(*e, '=');
    if (strncmp(*e, "NCCL_", 5) != 0 || strncmp(*e, "NCCL_TESTS_", 11) == 0 || eq == NULL) continue;
    if (lookup(*e, (size_t)(eq - *e)) != NULL) continue;
    int w = snprintf(list + n, len - n, "%s%.*s", n > 0 ? " " : "", (int)(eq - *e), *e);
    if (w < 0 || (size_t)w >= len - n) {
      snprintf(list + len - 5, 5, " ...");
      return;
    }
    n += (size_t)w;
  }
}
