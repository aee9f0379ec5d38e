/* staging.c - checkpoint staging; see staging.h. */
#include "runtime/train/parallel/staging.h"

#include <string.h>

int dt_staging_alloc(dt_staging *st, dt_backend *be, int n, size_t numel, dt_err *err)
{
    memset(st, 0, sizeof *st);
    st->n = n;
    st->numel = numel;
    size_t bytes = sizeof(float) * (numel ? numel : 1);
    dt_mem_cat old = dt_mem_tag(be, DT_MEM_OTHER); /* checkpoint staging */
    int rc = 0;
    for (int k = 0; k < n && !rc; k++)
        if (!(rc = be->alloc(be, (void **)&st->buf[k], bytes, err)))
            be->memset_zero(be, st->buf[k], bytes); /* nothing loaded: zero state */
    dt_mem_tag(be, old);
    if (rc)
        return dt_err_prefix(err, "checkpoint staging (%zu bytes x %d): ", bytes, n);
    st->resident = true;
    return 0;
}

int dt_staging_commit(dt_staging *st, dt_backend *be, dt_err *err)
{
    for (int k = 0; k < st->n && !st->resident && be->mem_commit; k++) {
        int rc = be->mem_commit(be, st->buf[k], 0, sizeof(float) * st->numel, err);
        if (rc)
            return dt_err_prefix(err, "checkpoint staging: ");
    }
    st->resident = true;
    return 0;
}

void dt_staging_release(dt_staging *st, dt_backend *be)
{
    if (!st->resident || !be->mem_release)
        return;
    for (int k = 0; k < st->n; k++)
        be->mem_release(be, st->buf[k], 0, sizeof(float) * st->numel);
    st->resident = false;
}

void dt_staging_free(dt_staging *st, dt_backend *be)
{
    for (int k = 0; k < 1 + DT_OPTIM_MAX_STATES; k++) {
        if (be)
            be->free(be, st->buf[k]);
        st->buf[k] = NULL;
    }
    st->resident = false;
}
