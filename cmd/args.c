/* args.c - see args.h. */
#include "cmd/args.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/util.h"
#include "runtime/job/config.h"

enum { G_NODES, G_RDZV, G_RESTART, G_LOGS, G_OTHER };

typedef struct opt {
    const char *name;  /* with dashes */
    char short_name;
    const char *key;   /* section.key of the job table; NULL for a special flag */
    bool takes_value;
    int group;
    const char *help;  /* NULL: the table's help */
    const char *metavar; /* the value's placeholder in --help */
} opt;

static const opt opts[] = {
    {"nnodes", 0, "elastic.nnodes", true, G_NODES, NULL, "N|MIN:MAX"},
    {"nproc-per-node", 0, "elastic.nproc_per_node", true, G_NODES, NULL, "N|auto|cpu|gpu"},
    {"node-rank", 0, "rendezvous.node_rank", true, G_NODES, NULL, "N"},
    {"standalone", 0, "rendezvous.standalone", false, G_NODES, NULL, NULL},
    {"master-addr", 0, "rendezvous.master_addr", true, G_NODES, NULL, "HOST"},
    {"master-port", 0, "rendezvous.master_port", true, G_NODES, NULL, "PORT"},
    {"local-addr", 0, "rendezvous.local_addr", true, G_NODES, NULL, "HOST"},
    {"rdzv-backend", 0, "rendezvous.backend", true, G_RDZV, NULL, "static|c10d|etcd"},
    {"rdzv-endpoint", 0, "rendezvous.endpoint", true, G_RDZV, NULL, "HOST[:PORT]"},
    {"rdzv-id", 0, "rendezvous.id", true, G_RDZV, NULL, "ID"},
    {"rdzv-conf", 0, "rendezvous.conf", true, G_RDZV, NULL, "K=V,..."},
    {"max-restarts", 0, "elastic.max_restarts", true, G_RESTART, NULL, "N"},
    {"monitor-interval", 0, "elastic.monitor_interval", true, G_RESTART, NULL, "SECONDS"},
    {"stop-grace", 0, "elastic.stop_grace", true, G_RESTART, NULL, "SECONDS"},
    {"log-dir", 0, "elastic.log_dir", true, G_LOGS, NULL, "DIR"},
    {"redirects", 'r', "elastic.redirects", true, G_LOGS, NULL, "MODE"},
    {"tee", 't', "elastic.tee", true, G_LOGS, NULL, "MODE"},
    {"local-ranks-filter", 0, "elastic.local_ranks_filter", true, G_LOGS, NULL, "RANKS"},
    {"print-config", 0, NULL, false, G_OTHER, "print the fully resolved job as INI and exit", NULL},
    {"no-python", 0, NULL, false, G_OTHER,
     "run the positional program itself, not python3 PROGRAM (no-op after --)", NULL},
    {"run-path", 0, NULL, false, G_OTHER, "torchrun's; accepted: a PROGRAM.py runs as python3 PROGRAM.py", NULL},
    {"python", 0, NULL, true, G_OTHER,
     "the interpreter of a SCRIPT.py (default: DTRAIN_PYTHON, else python3 from PATH)", "PATH"},
    {"start-method", 0, NULL, true, G_OTHER,
     "torchrun's; accepted and ignored: dtrain always fork+execs its workers", "spawn|fork|forkserver"},
    {"role", 0, "elastic.role", true, G_NODES, NULL, "NAME"},
    {"module", 'm', NULL, false, G_OTHER, "torchrun's; dtrain runs commands: -- python3 -m MODULE", NULL},
    {"help", 'h', NULL, false, G_OTHER, "this help", NULL},
    {"help-env", 0, NULL, false, G_OTHER, "list the DTRAIN_* environment variables", NULL},
    {"help-config", 0, NULL, false, G_OTHER, "print the job file reference (every key, type, default)", NULL},
    {"version", 'V', NULL, false, G_OTHER, "print the version and exit", NULL},
};

static const char *const group_names[] = {
    "Nodes and workers", "Rendezvous", "Failures and restarts", "Logs", "Other"};

static const dt_cfg_field *field_of(const char *key)
{
    const char *dot = strchr(key, '.');
    for (int i = 0; i < dt_cfg_fields_count; i++) {
        const dt_cfg_field *f = &dt_cfg_fields[i];
        if (strlen(f->section) == (size_t)(dot - key) && !strncmp(f->section, key, (size_t)(dot - key)) &&
            !strcmp(f->key, dot + 1))
            return f;
    }
    return NULL;
}

/* "--nproc_per_node" and "--nproc-per-node" are the same option. */
static bool same_name(const char *a, const char *b, size_t blen)
{
    size_t i = 0;
    for (; i < blen && a[i]; i++) {
        char x = a[i] == '_' ? '-' : a[i], y = b[i] == '_' ? '-' : b[i];
        if (x != y)
            return false;
    }
    return i == blen && a[i] == '\0';
}

static const opt *find_long(const char *name, size_t len)
{
    for (size_t i = 0; i < DT_ARRAY_LEN(opts); i++)
        if (same_name(opts[i].name, name, len))
            return &opts[i];
    return NULL;
}

/* Appends a setting; source is copied (NULL = an override, named by its position). */
static int push_setting(dt_args *a, const char *text, const char *source, dt_err *err)
{
    dt_setting *grown = realloc(a->settings, sizeof *grown * (size_t)(a->n_settings + 1));
    if (!grown)
        return dt_err_set(err, -ENOMEM, "out of memory parsing the command line");
    a->settings = grown;
    char *src = NULL;
    if (source) {
        char **o = realloc(a->owned, sizeof *o * (size_t)(a->n_owned + 1));
        if (!o)
            return dt_err_set(err, -ENOMEM, "out of memory parsing the command line");
        a->owned = o;
        if (!(src = strdup(source)))
            return dt_err_set(err, -ENOMEM, "out of memory parsing the command line");
        a->owned[a->n_owned++] = src;
    }
    a->settings[a->n_settings].text = text;
    a->settings[a->n_settings].source = src;
    a->n_settings++;
    return 0;
}

static int push_key_from(dt_args *a, const char *key, const char *value, const char *source,
                         dt_err *err);

static int push_key(dt_args *a, const char *key, const char *value, dt_err *err)
{
    size_t n = strlen(key) + strlen(value) + 2;
    char *s = malloc(n);
    char **grown = realloc(a->flag_keys, sizeof(char *) * (size_t)(a->n_flag_keys + 1));
    if (!s || !grown) {
        free(s);
        if (grown)
            a->flag_keys = grown;
        return dt_err_set(err, -ENOMEM, "out of memory parsing the command line");
    }
    a->flag_keys = grown;
    snprintf(s, n, "%s=%s", key, value);
    a->flag_keys[a->n_flag_keys++] = s;
    return 0;
}

static int push_key_from(dt_args *a, const char *key, const char *value, const char *source,
                         dt_err *err)
{
    int rc = push_key(a, key, value, err);
    return rc ? rc : push_setting(a, a->flag_keys[a->n_flag_keys - 1], source, err);
}

/* Checks one flag value through the job table now, so the message names the flag. */
static int check_value(const opt *o, const char *value, const char *how, dt_err *err)
{
    static dt_job scratch; /* large */
    dt_err e;
    char buf[DT_PATH_MAX + 64];
    dt_job_defaults(&scratch);
    snprintf(buf, sizeof buf, "%s=%s", o->key, value);
    /* The key's own form only: how it combines with other keys is checked once all are set. */
    if (dt_job_set(&scratch, buf, &e) == 0)
        return 0;
    /* e.msg is "override: section.key: why"; keep the why. */
    const char *why = strstr(e.msg, ": ");
    why = why ? why + 2 : e.msg;
    const char *why2 = strstr(why, ": ");
    return dt_err_set(err, -EINVAL, "%s%s: %s", how, o->name, why2 ? why2 + 2 : why);
}

static int take_env(dt_args *a, dt_err *err)
{
    for (size_t i = 0; i < DT_ARRAY_LEN(opts); i++) {
        const opt *o = &opts[i];
        if (!o->key)
            continue;
        char env[64] = "PET_";
        size_t k = 4;
        for (const char *p = o->name; *p && k < sizeof env - 1; p++)
            env[k++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
        env[k] = '\0';
        const char *v = getenv(env);
        if (!v || !*v)
            continue;
        if (!o->takes_value) {
            bool b;
            if (dt_parse_bool(v, &b)) {
                if (strcmp(v, "") == 0)
                    continue;
                return dt_err_set(err, -EINVAL, "environment %s=%s: expected true or false", env, v);
            }
            char src[80];
            snprintf(src, sizeof src, "environment %s", env);
            if (push_key_from(a, o->key, b ? "true" : "false", src, err))
                return err ? err->code : -ENOMEM;
            continue;
        }
        int rc = check_value(o, v, "", err);
        if (rc) {
            dt_err_prefix(err, "environment %s: ", env);
            return rc;
        }
        char src[80];
        snprintf(src, sizeof src, "environment %s", env);
        if (push_key_from(a, o->key, v, src, err))
            return err ? err->code : -ENOMEM;
    }
    /* DTRAIN_OUTPUT_DIR is job.output_dir at the rank of the environment: above the file, below
     * overrides and flags. The workers get it in the job the launcher resolved, not from the
     * environment again. */
    const char *out = getenv("DTRAIN_OUTPUT_DIR");
    if (out && *out && push_key_from(a, "job.output_dir", out, "environment DTRAIN_OUTPUT_DIR", err))
        return err ? err->code : -ENOMEM;
    return 0;
}

static int unknown_option(const char *arg, size_t len, dt_err *err)
{
    const char *names[DT_ARRAY_LEN(opts)];
    char word[128];
    for (size_t i = 0; i < DT_ARRAY_LEN(opts); i++)
        names[i] = opts[i].name;
    snprintf(word, sizeof word, "%.*s", (int)(len < 100 ? len : 100), arg);
    const char *near = dt_nearest(word, names, DT_ARRAY_LEN(opts));
    if (near)
        return dt_err_set(err, -EINVAL, "unknown option --%s; did you mean --%s?", word, near);
    return dt_err_set(err, -EINVAL, "unknown option --%s (see dtrain --help)", word);
}

/* The precedence class of a setting: PET_* environment (0), section.key=value overrides (1),
 * launcher flags (2). */
static int setting_class(const dt_setting *s)
{
    if (!s->source)
        return 1;
    return strncmp(s->source, "environment", 11) == 0 ? 0 : 2;
}

/* Orders the settings lowest precedence first (stable within a class, so the last of a class
 * wins): PET_* below overrides below flags (issue #2: the command line, then section.key=value
 * overrides, then the file, then defaults; PET_* stand in for flags not given). */
static int order_settings(dt_args *a, dt_err *err)
{
    if (a->n_settings < 2)
        return 0;
    dt_setting *sorted = malloc(sizeof *sorted * (size_t)a->n_settings);
    if (!sorted)
        return dt_err_set(err, -ENOMEM, "out of memory parsing the command line");
    int k = 0;
    for (int c = 0; c <= 2; c++)
        for (int i = 0; i < a->n_settings; i++)
            if (setting_class(&a->settings[i]) == c)
                sorted[k++] = a->settings[i];
    free(a->settings);
    a->settings = sorted;
    return 0;
}

/* The interpreter of SCRIPT.py into a->python (owned): flag (--python), else DTRAIN_PYTHON,
 * else python3; a name without a slash is looked up in PATH, so that messages can say which
 * file ran (a name not found stays as it is: the agent then says it cannot run it). A path
 * given that is no executable file is an error. */
static int resolve_python(dt_args *a, const char *flag, dt_err *err)
{
    const char *env = dt_env("DTRAIN_PYTHON");
    const char *want = flag ? flag : env && *env ? env : "python3";
    a->python_from = flag ? "--python" : env && *env ? "DTRAIN_PYTHON" : NULL;
    if (strchr(want, '/')) {
        if (access(want, X_OK) != 0)
            return dt_err_set(err, -EINVAL, "%s %s: %s (give the path of a python interpreter)",
                              a->python_from, want, strerror(errno));
        return (a->python = strdup(want)) ? 0 : dt_err_set(err, -ENOMEM, "out of memory");
    }
    const char *path = getenv("PATH");
    char cand[4096];
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        if (n && (size_t)snprintf(cand, sizeof cand, "%.*s/%s", (int)n, p, want) < sizeof cand &&
            access(cand, X_OK) == 0)
            return (a->python = strdup(cand)) ? 0 : dt_err_set(err, -ENOMEM, "out of memory");
        p += n + (p[n] == ':');
    }
    return (a->python = strdup(want)) ? 0 : dt_err_set(err, -ENOMEM, "out of memory");
}

int dt_args_parse(dt_args *a, int argc, char **argv, dt_err *err)
{
    bool no_python = false;
    const char *python_flag = NULL; /* --python */
    int rc;
    memset(a, 0, sizeof *a);
    a->overrides = calloc((size_t)argc + 1, sizeof(char *));
    if (!a->overrides)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if ((rc = take_env(a, err)))
        return rc;
    const char *pet_np = getenv("PET_NO_PYTHON");
    if (pet_np && *pet_np) {
        bool b;
        if (dt_parse_bool(pet_np, &b))
            return dt_err_set(err, -EINVAL, "environment PET_NO_PYTHON=%s: expected true or false",
                              pet_np);
        no_python = b;
    }
    int i = 1;
    for (; i < argc; i++) {
        char *arg = argv[i];
        if (!strcmp(arg, "--")) {
            i++;
            if (i >= argc)
                return dt_err_set(err, -EINVAL, "nothing after --: give the command to run, e.g. "
                                                "dtrain --nproc-per-node=2 -- python3 train.py");
            break;
        }
        if (arg[0] == '-' && arg[1] != '\0') {
            const opt *o = NULL;
            const char *value = NULL;
            char how[8] = "--";
            if (arg[1] == '-') {
                const char *name = arg + 2;
                const char *eq = strchr(name, '=');
                size_t len = eq ? (size_t)(eq - name) : strlen(name);
                o = find_long(name, len);
                if (!o)
                    return unknown_option(name, len, err);
                if (eq)
                    value = eq + 1;
            } else {
                for (size_t k = 0; k < DT_ARRAY_LEN(opts); k++)
                    if (opts[k].short_name && opts[k].short_name == arg[1])
                        o = &opts[k];
                if (!o)
                    return dt_err_set(err, -EINVAL, "unknown option %s (see dtrain --help)", arg);
                snprintf(how, sizeof how, "-%c/--", arg[1]);
                if (arg[2])
                    value = arg + 2 + (arg[2] == '=');
            }
            char flagname[64];
            snprintf(flagname, sizeof flagname, "--%s", o->name);
            if (!o->takes_value) {
                if (value && o->key) {
                    bool b;
                    if (dt_parse_bool(value, &b))
                        return dt_err_set(err, -EINVAL, "--%s takes no value (or true/false), got \"%s\"",
                                          o->name, value);
                    if ((rc = push_key_from(a, o->key, b ? "true" : "false", flagname, err)))
                        return rc;
                    continue;
                }
                if (value)
                    return dt_err_set(err, -EINVAL, "--%s takes no value", o->name);
                if (o->key) {
                    if ((rc = push_key_from(a, o->key, "true", flagname, err)))
                        return rc;
                } else if (!strcmp(o->name, "print-config"))
                    a->print_config = true;
                else if (!strcmp(o->name, "no-python"))
                    no_python = true;
                else if (!strcmp(o->name, "run-path"))
                    ; /* torchrun runs the script in-process; dtrain runs python3 SCRIPT */
                else if (!strcmp(o->name, "module"))
                    return dt_err_set(err, -EINVAL,
                                      "%s: dtrain runs commands: use -- python3 -m MODULE ...",
                                      arg);
                else if (!strcmp(o->name, "help"))
                    a->help = true;
                else if (!strcmp(o->name, "help-env"))
                    a->help_env = true;
                else if (!strcmp(o->name, "help-config"))
                    a->help_config = true;
                else if (!strcmp(o->name, "version"))
                    a->version = true;
                continue;
            }
            if (!value) {
                if (i + 1 >= argc)
                    return dt_err_set(err, -EINVAL, "%s%s needs a value", how, o->name);
                value = argv[++i];
            }
            if (!o->key) {
                if (!strcmp(o->name, "python"))
                    python_flag = value;
                if (!strcmp(o->name, "start-method")) {
                    if (strcmp(value, "spawn") && strcmp(value, "fork") &&
                        strcmp(value, "forkserver"))
                        return dt_err_set(err, -EINVAL,
                                          "--start-method: \"%s\" is not one of spawn, fork, "
                                          "forkserver",
                                          value);
                    a->start_method = value;
                }
                continue;
            }
            if ((rc = check_value(o, value, how, err)))
                return rc;
            if ((rc = push_key_from(a, o->key, value, flagname, err)))
                return rc;
            continue;
        }
        /* A positional. */
        if (a->job_path) {
            if (!strchr(arg, '=') || !strchr(arg, '.'))
                return dt_err_set(err, -EINVAL,
                                  "unexpected argument \"%s\" after %s: overrides are "
                                  "section.key=value (example: train.lr=1e-3)",
                                  arg, a->job_path);
            a->overrides[a->n_overrides++] = arg;
            if ((rc = push_setting(a, arg, NULL, err)))
                return rc;
            continue;
        }
        size_t len = strlen(arg);
        bool is_py = len > 3 && !strcmp(arg + len - 3, ".py");
        if (no_python || is_py)
            break; /* a program: everything from here is its command line */
        a->job_path = arg;
    }
    if (i < argc) {
        bool python = !no_python && strcmp(argv[i - 1], "--") != 0;
        int n = argc - i + (python ? 1 : 0);
        a->command = calloc((size_t)n + 1, sizeof(char *));
        if (!a->command)
            return dt_err_set(err, -ENOMEM, "out of memory");
        int k = 0;
        if (python && (rc = resolve_python(a, python_flag, err)))
            return rc;
        if (python)
            a->command[k++] = a->python;
        for (; i < argc; i++)
            a->command[k++] = argv[i];
        a->n_command = k;
        if (a->job_path)
            return dt_err_set(err, -EINVAL,
                              "both a job file (%s) and a command were given; use one",
                              a->job_path);
    }
    if (python_flag && !a->python)
        return dt_err_set(err, -EINVAL, "--python %s chooses the interpreter of a SCRIPT.py "
                          "(dtrain [options] --python PATH SCRIPT.py); after -- the command "
                          "names its own", python_flag);
    if (!a->job_path && !a->command && !a->help && !a->version && !a->help_env &&
        !a->help_config)
        return dt_err_set(err, -EINVAL,
                          "no job given: dtrain [options] JOB.ini, or dtrain [options] -- COMMAND "
                          "(see dtrain --help)");
    return order_settings(a, err);
}

void dt_args_free(dt_args *a)
{
    for (int i = 0; i < a->n_flag_keys; i++)
        free(a->flag_keys[i]);
    free(a->flag_keys);
    for (int i = 0; i < a->n_owned; i++)
        free(a->owned[i]);
    free(a->owned);
    free(a->settings);
    free(a->overrides);
    free(a->command);
    free(a->python);
    memset(a, 0, sizeof *a);
}

void dt_args_print_help(FILE *out)
{
    fprintf(out,
            "usage: dtrain [options] JOB.ini [section.key=value ...]\n"
            "       dtrain [options] -- COMMAND [ARGS...]\n"
            "       dtrain [options] SCRIPT.py [ARGS...]\n"
            "       dtrain worker|store|bench|ckpt|debug|plan ...   (dtrain SUBCOMMAND --help)\n"
            "\n"
            "Runs a training job (or any command) as one worker per device on this node, joined\n"
            "with the other nodes of the job through a rendezvous store; restarts every worker on\n"
            "every node after a failure while --max-restarts allows. Options match torchrun's,\n"
            "with dashes or underscores, and are also read from PET_* variables (PET_NNODES...).\n");
    for (int g = 0; g <= G_OTHER; g++) {
        fprintf(out, "\n%s:\n", group_names[g]);
        for (size_t i = 0; i < DT_ARRAY_LEN(opts); i++) {
            const opt *o = &opts[i];
            if (o->group != g)
                continue;
            const dt_cfg_field *f = o->key ? field_of(o->key) : NULL;
            char left[96];
            const char *mv = o->takes_value ? (o->metavar ? o->metavar : "V") : NULL;
            if (o->short_name)
                snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->name, mv ? " " : "",
                         mv ? mv : "");
            else
                snprintf(left, sizeof left, "--%s%s%s", o->name, mv ? " " : "", mv ? mv : "");
            if (strlen(left) > 32)
                fprintf(out, "  %s\n  %-32s %s", left, "", o->help ? o->help : (f ? f->help : ""));
            else
                fprintf(out, "  %-32s %s", left, o->help ? o->help : (f ? f->help : ""));
            if (f && o->takes_value)
                fprintf(out, " [default: %s]", f->def[0] ? f->def : "\"\"");
            fprintf(out, "\n");
        }
    }
    fprintf(out,
            "\nExit codes: 0 success; 1 a worker failed and the restart budget is spent; 2 usage\n"
            "or job-file error; 75 preempted (the workers saved a checkpoint after SIGTERM, SIGUSR1\n"
            "or SIGUSR2: run the same command again to resume); 128+N the agent was stopped by\n"
            "signal N (SIGINT, SIGHUP, SIGQUIT; SIGTERM when the workers did not all save).\n");
}
