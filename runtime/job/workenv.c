/* workenv.c - both sides of the agent-worker contract: the writer the agent calls for every
 * worker (dt_workenv_export, with the environment builder it fills) and the reader the built-in
 * worker calls (dt_workenv_read). See workenv.h. */
#include "runtime/job/workenv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "common/env.h"
#include "common/util.h"

/* ---- the environment builder -------------------------------------------------------------- */

static int envb_grow(dt_envb *b, dt_err *err)
{
    if (b->n + 2 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap * 2 : 64;
    char **v = realloc(b->v, cap * sizeof *v);
    if (!v)
        return dt_err_set(err, -ENOMEM, "out of memory building a worker's environment");
    b->v = v;
    b->cap = cap;
    return 0;
}

int dt_envb_init(dt_envb *b, char *const *base, dt_err *err)
{
    memset(b, 0, sizeof *b);
    if (envb_grow(b, err))
        return -ENOMEM;
    b->v[0] = NULL;
    for (size_t i = 0; base && base[i]; i++) {
        if (envb_grow(b, err))
            goto fail;
        if (!(b->v[b->n] = strdup(base[i]))) {
            dt_err_set(err, -ENOMEM, "out of memory building a worker's environment");
            goto fail;
        }
        b->v[++b->n] = NULL;
    }
    return 0;
fail:
    dt_envb_free(b);
    return -ENOMEM;
}

static ssize_t envb_find(const dt_envb *b, const char *name)
{
    size_t k = strlen(name);
    for (size_t i = 0; i < b->n; i++)
        if (!strncmp(b->v[i], name, k) && b->v[i][k] == '=')
            return (ssize_t)i;
    return -1;
}

int dt_envb_set(dt_envb *b, const char *name, const char *value, dt_err *err)
{
    size_t len = strlen(name) + strlen(value) + 2;
    char *s = malloc(len);
    if (!s)
        return dt_err_set(err, -ENOMEM, "out of memory building a worker's environment");
    snprintf(s, len, "%s=%s", name, value);
    ssize_t i = envb_find(b, name);
    if (i >= 0) {
        free(b->v[i]);
        b->v[i] = s;
        return 0;
    }
    if (envb_grow(b, err)) {
        free(s);
        return -ENOMEM;
    }
    b->v[b->n++] = s;
    b->v[b->n] = NULL;
    return 0;
}

int dt_envb_setf(dt_envb *b, dt_err *err, const char *name, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return dt_envb_set(b, name, buf, err);
}

const char *dt_envb_get(const dt_envb *b, const char *name)
{
    ssize_t i = envb_find(b, name);
    return i < 0 ? NULL : strchr(b->v[i], '=') + 1;
}

void dt_envb_free(dt_envb *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->n; i++)
        free(b->v[i]);
    free(b->v);
    memset(b, 0, sizeof *b);
}

/* ---- the writer --------------------------------------------------------------------------- */

int dt_workenv_export(const dt_worker_env *w, dt_envb *b, dt_err *err)
{
    int rc;
    const char *run_id = w->run_id[0] ? w->run_id : "none";
    /* torchrun's names, in the order its docs list them. */
    if ((rc = dt_envb_setf(b, err, "RANK", "%d", w->rank)) ||
        (rc = dt_envb_setf(b, err, "LOCAL_RANK", "%d", w->local_rank)) ||
        (rc = dt_envb_setf(b, err, "WORLD_SIZE", "%d", w->world_size)) ||
        (rc = dt_envb_setf(b, err, "LOCAL_WORLD_SIZE", "%d", w->local_world_size)) ||
        (rc = dt_envb_setf(b, err, "GROUP_RANK", "%d", w->group_rank)) ||
        (rc = dt_envb_setf(b, err, "GROUP_WORLD_SIZE", "%d", w->group_world_size)) ||
        (rc = dt_envb_setf(b, err, "ROLE_RANK", "%d", w->rank)) ||
        (rc = dt_envb_setf(b, err, "ROLE_WORLD_SIZE", "%d", w->world_size)) ||
        (rc = dt_envb_set(b, "ROLE_NAME", w->role[0] ? w->role : "default", err)) ||
        (rc = dt_envb_set(b, "MASTER_ADDR", w->master_addr[0] ? w->master_addr : "127.0.0.1",
                          err)) ||
        (rc = dt_envb_setf(b, err, "MASTER_PORT", "%d", w->master_port)) ||
        (rc = dt_envb_setf(b, err, "TORCHELASTIC_RESTART_COUNT", "%d", w->attempt)) ||
        (rc = dt_envb_setf(b, err, "TORCHELASTIC_MAX_RESTARTS", "%d", w->max_restarts)) ||
        (rc = dt_envb_set(b, "TORCHELASTIC_RUN_ID", run_id, err)) ||
        (rc = dt_envb_set(b, "TORCHELASTIC_USE_AGENT_STORE", "False", err)) ||
        (rc = dt_envb_set(b, "TORCHELASTIC_ERROR_FILE", w->error_file, err)))
        return rc;
    if (w->omp_num_threads > 0 &&
        (rc = dt_envb_setf(b, err, "OMP_NUM_THREADS", "%d", w->omp_num_threads)))
        return rc;
    /* As torchrun's local agent: a PyTorch NCCL collective that fails or hangs ends the process
     * (the agent then restarts the job) instead of blocking forever. */
    if (!dt_envb_get(b, "TORCH_NCCL_ASYNC_ERROR_HANDLING") &&
        (rc = dt_envb_set(b, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", err)))
        return rc;
    /* dtrain's own (common/env.c). */
    if (w->store_addr[0]) {
        if ((rc = dt_envb_set(b, "DTRAIN_STORE_ADDR", w->store_addr, err)) ||
            (rc = dt_envb_setf(b, err, "DTRAIN_STORE_PORT", "%d", w->store_port)))
            return rc;
    }
    if ((rc = dt_envb_set(b, "DTRAIN_RUN_ID", run_id, err)) ||
        (rc = dt_envb_setf(b, err, "DTRAIN_ATTEMPT", "%d", w->attempt)) ||
        (rc = dt_envb_setf(b, err, "DTRAIN_ROUND", "%d", w->round)) ||
        (rc = dt_envb_set(b, "DTRAIN_ERROR_FILE", w->error_file, err)) ||
        (rc = dt_envb_set(b, "DTRAIN_LOCAL_ADDR", w->local_addr[0] ? w->local_addr : "127.0.0.1",
                          err)) ||
        (rc = dt_envb_setf(b, err, "DTRAIN_AGENT_PID", "%d", w->agent_pid)))
        return rc;
    if (w->flight_fd > 2 && (rc = dt_envb_setf(b, err, "DTRAIN_FLIGHT_FD", "%d", w->flight_fd)))
        return rc;
    return 0;
}

/* ---- the reader --------------------------------------------------------------------------- */

static int env_int(const char *name, int def, int min, int *out, dt_err *err)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = def;
        return 0;
    }
    if (dt_parse_int(v, out) != 0 || *out < min)
        return dt_err_set(err, -EINVAL, "environment variable %s=\"%s\" is not a valid number",
                          name, v);
    return 0;
}

/* The first of names that is set and not empty, else def. */
static const char *env_first(const char *a, const char *b, const char *def)
{
    const char *v = getenv(a);
    if ((!v || !*v) && b)
        v = getenv(b);
    return v && *v ? v : def;
}

static int env_str(char *dst, size_t cap, const char *a, const char *b, const char *def,
                   dt_err *err)
{
    const char *v = env_first(a, b, def);
    if (!dt_strlcpy(dst, v, cap))
        return dt_err_set(err, -ENAMETOOLONG, "environment variable %s is too long (%zu bytes, "
                                              "at most %zu)", a, strlen(v), cap - 1);
    return 0;
}

int dt_workenv_read(dt_worker_env *e, dt_err *err)
{
    memset(e, 0, sizeof *e);
    int rc;
    if ((rc = env_int("RANK", 0, 0, &e->rank, err)) ||
        (rc = env_int("LOCAL_RANK", 0, 0, &e->local_rank, err)) ||
        (rc = env_int("WORLD_SIZE", 1, 1, &e->world_size, err)) ||
        (rc = env_int("LOCAL_WORLD_SIZE", 1, 1, &e->local_world_size, err)) ||
        (rc = env_int("GROUP_RANK", 0, 0, &e->group_rank, err)) ||
        (rc = env_int("GROUP_WORLD_SIZE", 1, 1, &e->group_world_size, err)) ||
        (rc = env_int("MASTER_PORT", 0, 0, &e->master_port, err)) ||
        (rc = env_int("TORCHELASTIC_MAX_RESTARTS", 0, 0, &e->max_restarts, err)) ||
        (rc = env_int("DTRAIN_AGENT_PID", 0, 0, &e->agent_pid, err)) ||
        (rc = env_int("DTRAIN_FLIGHT_FD", 0, 0, &e->flight_fd, err)))
        return rc;
    /* OpenMP's own syntax allows lists ("4,2"): the first number, and no error over the rest. */
    const char *omp = getenv("OMP_NUM_THREADS");
    e->omp_num_threads = omp ? atoi(omp) : 0;
    if (e->omp_num_threads < 0)
        e->omp_num_threads = 0;
    if (e->rank >= e->world_size)
        return dt_err_set(err, -EINVAL, "RANK=%d is not below WORLD_SIZE=%d", e->rank,
                          e->world_size);
    if (e->local_rank >= e->local_world_size)
        return dt_err_set(err, -EINVAL, "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d",
                          e->local_rank, e->local_world_size);
    if (e->master_port > 65535)
        return dt_err_set(err, -EINVAL, "environment variable MASTER_PORT=\"%d\" is not a port",
                          e->master_port);
    if ((rc = env_str(e->role, sizeof e->role, "ROLE_NAME", NULL, "default", err)) ||
        (rc = env_str(e->master_addr, sizeof e->master_addr, "MASTER_ADDR", NULL, "127.0.0.1",
                      err)) ||
        (rc = env_str(e->store_addr, sizeof e->store_addr, "DTRAIN_STORE_ADDR", NULL, "", err)) ||
        (rc = env_str(e->run_id, sizeof e->run_id, "DTRAIN_RUN_ID", "TORCHELASTIC_RUN_ID",
                      "local", err)) ||
        (rc = env_str(e->error_file, sizeof e->error_file, "DTRAIN_ERROR_FILE",
                      "TORCHELASTIC_ERROR_FILE", "", err)) ||
        (rc = env_str(e->local_addr, sizeof e->local_addr, "DTRAIN_LOCAL_ADDR", NULL,
                      "127.0.0.1", err)))
        return rc;
    const char *port = dt_env("DTRAIN_STORE_PORT");
    if (port && (dt_parse_int(port, &e->store_port) != 0 || e->store_port < 0 ||
                 e->store_port > 65535))
        return dt_err_set(err, -EINVAL, "environment variable DTRAIN_STORE_PORT=\"%s\" is not a "
                                        "port", port);
    const char *att = env_first("DTRAIN_ATTEMPT", "TORCHELASTIC_RESTART_COUNT", NULL);
    if (att && (dt_parse_int(att, &e->attempt) != 0 || e->attempt < 0))
        return dt_err_set(err, -EINVAL, "environment variable DTRAIN_ATTEMPT=\"%s\" is not a "
                                        "number", att);
    /* The round changes on every restart AND every membership change of an elastic job (where the
     * attempt stays): per-round state such as the communicator's store keys is namespaced by it. */
    e->round = e->attempt; /* run without an agent that sets DTRAIN_ROUND */
    const char *round = env_first("DTRAIN_ROUND", NULL, NULL);
    if (round && (dt_parse_int(round, &e->round) != 0 || e->round < 0))
        return dt_err_set(err, -EINVAL, "environment variable DTRAIN_ROUND=\"%s\" is not a "
                                        "number", round);
    return 0;
}
