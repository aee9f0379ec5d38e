/* env.h - every DTRAIN_* environment variable, declared once with its default and meaning.
 *
 * Every DTRAIN_* variable dtrain reads is in the table in common/env.c (printed by
 * `dtrain --help-env` and documented in the README), and code reads them through dt_env(), which
 * returns the table's default for an unset or empty one. The exceptions call getenv() because
 * they must tell "unset" from "set to the default", or run before dt_env may log:
 *   - common/log.c (dt_log_init) reads DTRAIN_LOG: it sets up the logging dt_env itself uses;
 *   - cmd/bench/bench_rdzv.c lowers the log level only when DTRAIN_LOG is unset;
 *   - runtime/job/workenv.c reads DTRAIN_ATTEMPT, falling back to TORCHELASTIC_RESTART_COUNT
 *     when unset, and DTRAIN_ROUND, falling back to the attempt when unset;
 *   - cmd/bench/bench_launch.c's child prints DTRAIN_ATTEMPT as the agent set it ("?" when unset), as
 *     a user's worker script would.
 * DTRAIN_BIN is read by the tests only (tests/harness.c) and is not in the table.
 * torchrun's own names (RANK, WORLD_SIZE, ...) are set by the agent and read by the worker
 * directly; they are listed in DESIGN.md. */
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
