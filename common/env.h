/* env.h - every DTRAIN_* environment variable, declared once with its default and meaning.
 *
 * Code reads these through dt_env() so that the table below (printed by `dtrain --help-env`
 * and documented in the README) is the only list. torchrun's own names (RANK, WORLD_SIZE, ...)
 * are set by the agent and read by the worker directly; they are listed in DESIGN.md. */
#ifndef DT_ENV_H
#define DT_ENV_H

#include <stddef.h>

typedef struct dt_env_var {
    const char *name;    /* DTRAIN_... */
    const char *def;     /* default when unset or empty; NULL = no default */
    const char *help;    /* one line */
} dt_env_var;

extern const dt_env_var dt_env_vars[];
extern const size_t dt_env_vars_count;

/* The value of a DTRAIN_* variable from the table, or its default. Asking for a name not in the
 * table is a programming error and returns NULL (and logs once at debug). */
const char *dt_env(const char *name);

#endif
