/*
 * ras_json_check FILE [comms=N] [size=N] [ranks=N] [missing=N] [hosts=N] [processes=N]: parses a status
 * document strictly (RFC 8259) and checks its communicators add up (ranks and missing ranks make the size, no
 * rank twice) and each fact given. Prints the facts found in one line. Exits 0, 1 when a fact differs or the
 * document is inconsistent, 2 when it is not valid JSON.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static char *slurp(const char *path, size_t *len_p) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 1 << 16, n = 0, r;
  char *buf = malloc(cap);
  while (buf != NULL && (r = fread(buf + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  *len_p = n;
  return buf;
}

/* Distinct host addresses ("ip:port" without the port) of the processes. */
static int count_hosts(const js_t *procs) {
  char seen[256][64];
  int n = 0;
  for (int i = 0; procs != NULL && i < procs->n; i++) {
    const js_t *a = js_get_type(&procs->items[i], "address", JS_STR);
    if (a == NULL) continue;
    char ip[64];
    snprintf(ip, sizeof ip, "%s", a->str);
    char *colon = strrchr(ip, ':');
    if (colon != NULL) *colon = '\0';
    int dup = 0;
    for (int j = 0; j < n && !dup; j++) dup = strcmp(seen[j], ip) == 0;
    if (!dup && n < 256) snprintf(seen[n++], sizeof seen[0], "%s", ip);
  }
  return n;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: ras_json_check FILE [comms=N] [size=N] [ranks=N] [missing=N] [hosts=N] [processes=N]\n");
    return 2;
  }
  size_t len;
  char *text = slurp(argv[1], &len), err[160];
  js_t *doc = text != NULL ? js_parse(text, len, err, sizeof err) : NULL;
  if (doc == NULL) {
    fprintf(stderr, "%s: %s\n", argv[1], text == NULL ? "cannot read it" : err);
    return 2;
  }
  const js_t *comms = js_get_type(doc, "communicators", JS_ARR);
  const js_t *procs = js_get_type(js_get_type(doc, "braid", JS_OBJ), "processes", JS_ARR);
  long facts[6] = {comms != NULL ? comms->n : -1, -1, 0, 0, count_hosts(procs),
                   procs != NULL ? procs->n : -1};
  int bad = comms == NULL || !js_get_type(doc, "nccl_version", JS_STR);
  for (int i = 0; comms != NULL && i < comms->n; i++) {
    const js_t *c = &comms->items[i], *size = js_get_type(c, "size", JS_NUM);
    const js_t *ranks = js_get_type(c, "ranks", JS_ARR), *miss = js_get_type(c, "missing_ranks", JS_ARR);
    if (size == NULL || ranks == NULL || miss == NULL || ranks->n + miss->n != size->num) {
      bad = 1;
      continue;
    }
    if (facts[1] < size->num) facts[1] = (long)size->num;
    facts[2] += ranks->n;
    facts[3] += miss->n;
  }
  static const char *const names[6] = {"comms", "size", "ranks", "missing", "hosts", "processes"};
  printf("%s:", argv[1]);
  for (int k = 0; k < 6; k++) printf(" %s=%ld", names[k], facts[k]);
  printf("\n");
  for (int a = 2; a < argc; a++)
    for (int k = 0; k < 6; k++) {
      size_t n = strlen(names[k]);
      if (strncmp(argv[a], names[k], n) == 0 && argv[a][n] == '=' && atol(argv[a] + n + 1) != facts[k]) {
        fprintf(stderr, "%s: %s is %ld, expected %s\n", argv[1], names[k], facts[k], argv[a] + n + 1);
        bad = 1;
      }
    }
  js_free(doc);
  free(text);
  return bad;
}
