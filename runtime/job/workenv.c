/* workenv.c - the worker's side of the agent-worker contract; see workenv.h. */
#include "runtime/job/workenv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/util.h"

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

int dt_workenv_read(dt_worker_env *e, dt_err *err)
{
    memset(e, 0, sizeof *e);
    int rc;
    if ((rc = env_int("RANK", 0, 0, &e->rank, err)) ||
        (rc = env_int("LOCAL_RANK", 0, 0, &e->local_rank, err)) ||
        (rc = env_int("WORLD_SIZE", 1, 1, &e->world_size, err)) ||
        (rc = env_int("LOCAL_WORLD_SIZE", 1, 1, &e->local_world_size, err)) ||
        (rc = env_int("GROUP_RANK", 0, 0, &e->group_rank, err)))
        return rc;
    if (e->rank >= e->world_size)
        return dt_err_set(err, -EINVAL, "RANK=%d is not below WORLD_SIZE=%d", e->rank,
                          e->world_size);
    if (e->local_rank >= e->local_world_size)
        return dt_err_set(err, -EINVAL, "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d",
                          e->local_rank, e->local_world_size);
    const char *addr = dt_env("DTRAIN_STORE_ADDR");
    dt_strlcpy(e->store_addr, addr ? addr : "", sizeof e->store_addr);
    const char *port = dt_env("DTRAIN_STORE_PORT");
    if (port && (dt_parse_int(port, &e->store_port) != 0 || e->store_port < 0 ||
                 e->store_port > 65535))
        return dt_err_set(err, -EINVAL, "environment variable DTRAIN_STORE_PORT=\"%s\" is not a "
                                        "port", port);
    const char *id = dt_env("DTRAIN_RUN_ID");
    if (!id)
        id = getenv("TORCHELASTIC_RUN_ID");
    dt_strlcpy(e->run_id, id && *id ? id : "local", sizeof e->run_id);
    const char *att = getenv("DTRAIN_ATTEMPT");
    if (!att || !*att)
        att = getenv("TORCHELASTIC_RESTART_COUNT");
    if (att && *att && (dt_parse_int(att, &e->attempt) != 0 || e->attempt < 0))
        return dt_err_set(err, -EINVAL, "environment variable DTRAIN_ATTEMPT=\"%s\" is not a "
                                        "number", att);
    /* The round changes on every restart AND every membership change of an elastic job (where the
     * attempt stays): per-round state such as the communicator's store keys is namespaced by it. */
    e->round = e->attempt; /* run without an agent that sets DTRAIN_ROUND */
    const char *round = getenv("DTRAIN_ROUND") ? dt_env("DTRAIN_ROUND") : NULL;
    if (round && (dt_parse_int(round, &e->round) != 0 || e->round < 0))
        return dt_err_set(err, -EINVAL, "environment variable DTRAIN_ROUND=\"%s\" is not a "
                                        "number", round);
    return 0;
}

