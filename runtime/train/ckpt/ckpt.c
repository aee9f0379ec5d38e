/* ckpt.c - the resume state every checkpoint carries (ckpt.h's dt_ckpt_state): step, loss, named
 * RNG streams and scalars, and the job it was written with. Plain values, no files: the object
 * that saves and loads them is ckpt_core.c (registration, staging, open/close), ckpt_write.c,
 * ckpt_read.c and ckpt_sync.c, which share ckpt_core.h.
 */
#include "runtime/train/ckpt/ckpt.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* ======================================================================== state helpers === */

void dt_ckpt_state_init(dt_ckpt_state *st)
{
    memset(st, 0, sizeof *st);
    st->loss = NAN;
}

void dt_ckpt_state_clear(dt_ckpt_state *st)
{
    free(st->job);
    dt_ckpt_state_init(st);
}

static int check_name(const char *name)
{
    return (!name || !name[0] || strlen(name) >= DT_CKPT_NAME_MAX) ? -EINVAL : 0;
}

int dt_ckpt_state_set_rng(dt_ckpt_state *st, const char *name, const dt_rng *rng)
{
    if (check_name(name))
        return -EINVAL;
    for (int i = 0; i < st->num_rng; i++)
        if (!strcmp(st->rng[i].name, name)) {
            st->rng[i].rng = *rng;
            return 0;
        }
    if (st->num_rng == DT_CKPT_MAX_RNG)
        return -ENOSPC;
    dt_strlcpy(st->rng[st->num_rng].name, name, DT_CKPT_NAME_MAX);
    st->rng[st->num_rng++].rng = *rng;
    return 0;
}

int dt_ckpt_state_set_scalar(dt_ckpt_state *st, const char *name, double value)
{
    if (check_name(name))
        return -EINVAL;
    for (int i = 0; i < st->num_scalars; i++)
        if (!strcmp(st->scalars[i].name, name)) {
            st->scalars[i].value = value;
            return 0;
        }
    if (st->num_scalars == DT_CKPT_MAX_SCALARS)
        return -ENOSPC;
    dt_strlcpy(st->scalars[st->num_scalars].name, name, DT_CKPT_NAME_MAX);
    st->scalars[st->num_scalars++].value = value;
    return 0;
}

int dt_ckpt_state_get_rng(const dt_ckpt_state *st, const char *name, dt_rng *out)
{
    for (int i = 0; i < st->num_rng; i++)
        if (!strcmp(st->rng[i].name, name)) {
            *out = st->rng[i].rng;
            return 0;
        }
    return -ENOENT;
}

int dt_ckpt_state_get_scalar(const dt_ckpt_state *st, const char *name, double *out)
{
    for (int i = 0; i < st->num_scalars; i++)
        if (!strcmp(st->scalars[i].name, name)) {
            *out = st->scalars[i].value;
            return 0;
        }
    return -ENOENT;
}
