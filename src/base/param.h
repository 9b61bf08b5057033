/*
 * The parameter registry: every knob is declared once in params.def and read here.
 *
 * A value comes from the environment, else from a configuration file (NCCL_CONF_FILE or ~/.nccl.conf, then
 * /etc/nccl.conf), else from its default. Values are read once, on first use; nothing else calls getenv.
 */
#ifndef BRAID_BASE_PARAM_H
#define BRAID_BASE_PARAM_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
#define PARAM_INT(name, def, help) P_##name,
#define PARAM_STR(name, def, help) P_##name,
#include "params.def"
#undef PARAM_INT
#undef PARAM_STR
  P_COUNT
} param_id_t;

/* An integer knob's value. */
int64_t param_int(param_id_t id);
/* A string knob's value; "" when unset. */
const char *param_str(param_id_t id);
/* Whether the knob was set (environment or file) rather than left at its default. */
int param_is_set(param_id_t id);
/* The knob's name, its one line of help, and where its value came from ("default", "env" or a file path). */
const char *param_name(param_id_t id);
const char *param_help(param_id_t id);
const char *param_source(param_id_t id);
/* The knob named `name` (its full name, e.g. NCCL_DEBUG), or -1 when there is none. */
int param_find(const char *name);
/* Whether the knob holds text (PARAM_STR) rather than an integer. */
int param_is_text(param_id_t id);
/* The knob's default, as text. */
const char *param_default(param_id_t id);
/* Writes the value as text into buf (for listings). */
void param_format(param_id_t id, char *buf, int len);
/* The NCCL_* variables of the environment that no knob reads, space-separated, into list ("" when none; "
 * ..." ends a list cut short). nccl-tests reads NCCL_TESTS_* itself: those are not the library's. */
void param_unknown_nccl_vars(char *list, size_t len);
/* Reads the environment and configuration files again (logging reset and tests). */
void param_reload(void);

#endif
