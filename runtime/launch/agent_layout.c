/* agent_layout.c - see agent_layout.h. */
#include "runtime/launch/agent_layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"

#define CHOICE_MAX 1024 /* the most a published layout may be */

int dt_agent_layout_round(dt_agent_layout_fn fn, void *arg, const dt_rdzv_round *rd, int nproc,
                          double timeout_s, bool (*over)(void *arg), void *over_arg,
                          int *tensor, int *pipeline, char *choice, size_t cap, dt_err *err)
{
    char key[DT_RDZV_STR + 96];
    dt_store *s = NULL;
    int rc;
    if (rd->group_world_size == 1) /* alone: nobody to agree with */
        return fn(arg, 1, nproc, NULL, choice, cap, tensor, pipeline, err);
    snprintf(key, sizeof key, "dtrain/%s/layout/r%d/%d", rd->run_id, rd->round, rd->master_port);
    if ((rc = dt_store_connect(&s, rd->store_addr, rd->store_port, NULL, err)))
        return dt_err_prefix(err, "parallel.layout = auto: the round's store: ");
    if (rd->group_rank == 0) {
        dt_err pe = {0};
        rc = fn(arg, rd->group_world_size, nproc, NULL, choice, cap, tensor, pipeline,
                &pe);
        char v[CHOICE_MAX + 8];
        snprintf(v, sizeof v, "%s%s", rc ? "!" : "", rc ? pe.msg : choice);
        int sr = dt_store_set(s, key, v, strlen(v), err);
        if (rc && err)
            *err = pe;
        else if (sr)
            rc = dt_err_prefix(err, "parallel.layout = auto: publishing the layout: ");
        dt_store_free(s);
        return rc;
    }
    void *v = NULL;
    size_t len = 0;
    double deadline = dt_now_s() + timeout_s;
    for (;;) {
        rc = dt_store_get(s, key, &v, &len, 200, err);
        if (rc != -ETIMEDOUT && rc != -ENOENT)
            break;
        if (over && over(over_arg)) {
            dt_store_free(s);
            return dt_err_set(err, -ECANCELED, "the round ended before its layout came");
        }
        if (dt_now_s() >= deadline) {
            rc = -ETIMEDOUT;
            break;
        }
    }
    dt_store_free(s);
    if (rc == -ETIMEDOUT)
        return dt_err_set(err, -ETIMEDOUT, "parallel.layout = auto: group rank 0 (%s) gave no "
                          "layout for round %d within %g s",
                          rd->master_addr, rd->round, timeout_s);
    if (rc)
        return dt_err_prefix(err, "parallel.layout = auto: reading the layout: ");
    char *text = v;
    if (text[0] == '!') {
        rc = dt_err_set(err, -EINVAL, "group rank 0 (%s): %s", rd->master_addr, text + 1);
    } else {
        rc = fn(arg, rd->group_world_size, nproc, text, choice, cap, tensor, pipeline,
                err);
    }
    free(v);
    return rc;
}
