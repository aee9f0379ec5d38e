/* rdzv.c - see rdzv.h: picks the backend that --rdzv-backend names and forwards every call to
 * its table (rdzv_backend.h). Nothing here knows how a backend works. */
#include "rendezvous/rdzv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous/rdzv_backend.h"
#include "rendezvous/rdzv_c10d.h"
#include "rendezvous/rdzv_etcd.h"
#include "rendezvous/rdzv_static.h"

/* Every backend, in the order the error message lists them. */
static const dt_rdzv_ops *const backends[] = {&dt_rdzv_static_ops, &dt_rdzv_c10d_ops,
                                                  &dt_rdzv_etcd_ops};

struct dt_rdzv {
    const dt_rdzv_ops *ops; /* the chosen backend */
    void *self;             /* its state (owned: ops->close frees it) */
};

int dt_rdzv_open(dt_rdzv **out, const dt_rdzv_opts *opts, dt_err *err)
{
    const dt_rdzv_ops *ops = NULL;
    char names[128] = "";
    *out = NULL;
    for (size_t i = 0; i < sizeof backends / sizeof *backends; i++) {
        if (!strcmp(opts->backend, backends[i]->name))
            ops = backends[i];
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                 i ? (i + 1 == sizeof backends / sizeof *backends ? " or " : ", ") : "",
                 backends[i]->name);
    }
    if (!ops)
        return dt_err_set(err, -EINVAL, "unknown rendezvous backend \"%s\" (%s)", opts->backend,
                          names);
    dt_rdzv *r = calloc(1, sizeof *r);
    if (!r)
        return dt_err_set(err, -ENOMEM, "out of memory");
    r->ops = ops;
    int rc = ops->open(&r->self, opts, err);
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int dt_rdzv_next(dt_rdzv *r, dt_rdzv_round *round, dt_rdzv_status *status, dt_err *err)
{
    return r->ops->next(r->self, round, status, err);
}

int dt_rdzv_poll(dt_rdzv *r, dt_rdzv_status *status, dt_err *err)
{
    return r->ops->poll(r->self, status, err);
}

int dt_rdzv_succeeded(dt_rdzv *r, dt_err *err)
{
    return r->ops->succeeded(r->self, err);
}

int dt_rdzv_failed(dt_rdzv *r, const dt_rdzv_failure *f, int n, dt_err *err)
{
    return r->ops->failed(r->self, f, n, err);
}

int dt_rdzv_abort(dt_rdzv *r, int sig, dt_err *err)
{
    return r ? r->ops->abort(r->self, sig, err) : 0;
}

int dt_rdzv_abort_config(dt_rdzv *r, const dt_rdzv_failure *f, int n, const char *why,
                         dt_err *err)
{
    return r ? r->ops->abort_config(r->self, f, n, why, err) : 0;
}

int dt_rdzv_failures(dt_rdzv *r, dt_rdzv_failure **out, int *n, dt_err *err)
{
    *out = NULL;
    *n = 0;
    return r->ops->failures(r->self, out, n, err);
}

void dt_rdzv_kill(dt_rdzv *r)
{
    if (r && r->ops->kill)
        r->ops->kill(r->self);
}

void dt_rdzv_close(dt_rdzv *r)
{
    if (!r)
        return;
    r->ops->close(r->self);
    free(r);
}
