/*
 * The parameter registry: every knob is declared once in params.def and read here.
 *
 * A value comes from the environment, else from a configuration file (NCCL_CONF_FILE or ~/.nccl.conf, then
 * /etc/nccl.conf), else from its default. Values are read once, on first use; nothing else calls getenv.
 */
#ifndef BRAID_BASE_PARAM_H
#define BRAID_BASE_PARAM_H

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
/* Writes the value as text into buf (for listings). */
void param_format(param_id_t id, char *buf, int len);
/* Logs at INFO (ENV) every knob that is set and where from, as NCCL's "NCCL_X set by environment to V", then
 * one line naming the NCCL_* variables of the environment that Braid does not implement. */
void param_log_set(void);
/* Reads the environment and configuration files again (logging reset and tests). */
void param_reload(void);

#endif
