/* args.h - the launcher's command line, torchrun-compatible.
 *
 *   dtrain [launcher options] JOB.ini [section.key=value ...]
 *   dtrain [launcher options] -- COMMAND [ARGS...]
 *   dtrain [launcher options] SCRIPT.py [ARGS...]        (runs python3 SCRIPT.py, as torchrun;
 *                                                        --python PATH or DTRAIN_PYTHON choose
 *                                                        the interpreter)
 *
 * Every launcher option is accepted with dashes and with underscores, as --opt=value or
 * --opt value, and from its PET_* environment variable as torchrun reads them. Each option is a
 * key of the job table ([elastic] or [rendezvous]), so the file, the overrides and the flags
 * share one parser and one validator. Precedence, lowest first: defaults, the job file, PET_*
 * variables (defaults under the flags, as torchrun reads them) and DTRAIN_OUTPUT_DIR (as
 * job.output_dir), then section.key=value overrides, then flags (dt_args.settings' order).
 */
#ifndef DT_ARGS_H
#define DT_ARGS_H

#include <stdbool.h>
#include <stdio.h>

#include "common/err.h"
#include "runtime/job/config.h"

typedef struct dt_args {
    const char *job_path;   /* JOB.ini, or NULL */
    char **overrides;       /* section.key=value from the command line (borrowed from argv) */
    int n_overrides;
    char **flag_keys;       /* section.key=value made from flags and PET_* (owned) */
    int n_flag_keys;
    dt_setting *settings;   /* every assignment, lowest precedence first: PET_*, then
                               section.key=value overrides, then flags (each class in command-line
                               order); each names its source (owned
                               array; text and source point into flag_keys, argv or owned) */
    int n_settings;
    char **owned;           /* source names of settings (owned) */
    int n_owned;
    char **command;         /* the worker command (NULL-terminated, owned array of borrowed
                               strings), or NULL in job-file mode */
    int n_command;
    const char *start_method; /* --start-method (torchrun's; accepted, ignored), or NULL */
    char *python;           /* SCRIPT.py form: the interpreter command[0] runs, as found in PATH
                               (owned), else NULL */
    const char *python_from; /* where it was chosen: "--python", "DTRAIN_PYTHON", or NULL (the
                               first python3 on PATH) */
    bool print_config;
    bool help;
    bool help_env;
    bool help_config;
    bool version;
} dt_args;

/* Parses argv (argv[0] is the program). Returns 0, or -EINVAL with a message that names the
 * wrong flag or value and, where one is close, the valid spelling. */
int dt_args_parse(dt_args *a, int argc, char **argv, dt_err *err);
void dt_args_free(dt_args *a);
void dt_args_print_help(FILE *out);

#endif
