/* staging.h - checkpoint staging: whole-size buffers of backend memory that hold data only
 * between a fill and its use, and give their memory back (backend mem_release) in between.
 *
 * A layout or a data-parallel sync that keeps part of a model assembles the whole tensors a
 * checkpoint holds in these (the tensor and pipeline layouts: the whole model; ZeRO-3: its local
 * model's parameters and optimiser state); between checkpoints a rank then holds its own part
 * only. What it may include: kernels/, common/, the optimiser's state count (optim.h). */
#ifndef DT_STAGING_H
#define DT_STAGING_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "runtime/train/optim.h"

/* Checkpoint staging: whole-model buffers of backend memory (charged as "other"), buf[0] for
 * the parameters and buf[1 + i] for optimiser state i, laid out by a table of whole tensors (the
 * strategy's). A save fills them (gather_state) and reads them; a load writes them and start
 * slices them. Between the two they need not hold anything: release gives their memory back
 * (backend mem_release: inaccessible until committed; nothing where the backend's granule is
 * 0), commit takes it again before the next fill (undefined contents: a fill writes every
 * tensor of the table, which tiles the buffers), so between checkpoints a rank holds its own
 * part of the model only. */
typedef struct dt_staging {
    float *buf[1 + DT_OPTIM_MAX_STATES]; /* (numel) each, owned */
    int n;                               /* buffers: 1 + the optimiser's states */
    size_t numel;                        /* floats per buffer: the whole model's */
    bool resident;                       /* its memory is committed (usable) */
} dt_staging;

/* n buffers of numel floats on be, zeroed (what start takes when nothing was loaded: the
 * optimiser state starts at zero) and resident. -errno and err on failure; free what was made
 * with dt_staging_free. */
int dt_staging_alloc(dt_staging *st, dt_backend *be, int n, size_t numel, dt_err *err);

/* Makes the memory usable again before a fill (nothing when it is); contents undefined. */
int dt_staging_commit(dt_staging *st, dt_backend *be, dt_err *err);

/* Gives the memory back (nothing when it is not resident). */
void dt_staging_release(dt_staging *st, dt_backend *be);

/* Frees the buffers; accepts a zeroed struct. */
void dt_staging_free(dt_staging *st, dt_backend *be);

#endif
