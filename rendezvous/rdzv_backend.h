/* rdzv_backend.h - what a rendezvous backend implements: one table of functions (dt_rdzv_ops)
 * that rdzv.c dispatches every dt_rdzv_* call to. The backends are rdzv_static.c and
 * rdzv_c10d.c; an etcd backend is one more file with one more table, listed in rdzv.c. A
 * backend uses rdzv_common.h for what they share and never calls another backend.
 *
 * Each function has the contract of the dt_rdzv_* function of the same name (rdzv.h), with the
 * backend's own state (what open made) in place of the dt_rdzv handle. rdzv.c has already dealt
 * with NULL handles, so `self` is never NULL.
 */
#ifndef DT_RDZV_BACKEND_H
#define DT_RDZV_BACKEND_H

#include "common/err.h"
#include "rendezvous/rdzv_types.h"

typedef struct dt_rdzv_ops {
    const char *name; /* what --rdzv-backend says: "static", "c10d" */
    /* Checks opts and opens; on success *self is the backend's state (owned by the caller,
     * freed by close). On failure nothing is left open and *self is untouched or NULL. */
    int (*open)(void **self, const dt_rdzv_opts *opts, dt_err *err);
    int (*next)(void *self, dt_rdzv_round *round, dt_rdzv_status *status, dt_err *err);
    int (*poll)(void *self, dt_rdzv_status *status, dt_err *err);
    int (*succeeded)(void *self, dt_err *err);
    int (*failed)(void *self, const dt_rdzv_failure *f, int n, dt_err *err);
    int (*abort)(void *self, int sig, dt_err *err);
    int (*abort_config)(void *self, const dt_rdzv_failure *f, int n, const char *why,
                        dt_err *err);
    int (*failures)(void *self, dt_rdzv_failure **out, int *n, dt_err *err);
    void (*kill)(void *self); /* NULL: the backend has nothing to simulate */
    void (*close)(void *self);
} dt_rdzv_ops;

#endif
