/* ckpt_sync.c - every rank resumes from the same checkpoint (dt_ckpt_sync, see ckpt.h).
 *
 * Each rank first resumes on its own from the checkpoint directory it sees; this file then makes
 * them agree: an all-gather of the steps found, and, when they differ (node-local directories),
 * a broadcast of the source rank's state and checkpointed buffers.
 */
#include "runtime/train/ckpt/ckpt_core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"

int dt_ckpt_sync(dt_ckpt *c, dt_comm *comm, int rank, dt_ckpt_state *st, bool *resumed,
                 int *src_rank, int64_t *src_step, bool *adopted, dt_err *err)
{
    *adopted = false;
    *src_rank = rank;
    *src_step = *resumed ? st->step : -1;
    int world = dt_comm_world_size(comm);
    if (!comm || world < 2)
        return 0;
    /* every rank's step + 1 (0 = none), exact as int64 */
    int64_t v = *resumed ? st->step + 1 : 0;
    int64_t *all = calloc((size_t)world, sizeof *all);
    if (!all)
        return dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
    int rc = dt_ckpt__host_collective(c, comm, &v, 1, DT_INT64, 0, all, err);
    int64_t best = -1;
    int src = 0;
    bool alike = true;
    for (int r = 0; r < world && !rc; r++) {
        alike = alike && (r == 0 || all[r] == best);
        if (all[r] > best) {
            best = all[r];
            src = r;
        }
    }
    free(all);
    if (rc)
        return rc;
    *src_rank = src;
    *src_step = best - 1;
    if (alike)
        return 0;
    /* Some rank did not see the newest checkpoint any rank found (a directory that is not shared
     * between nodes, or holds other steps on some node): every rank takes that rank's state and
     * buffers. The state goes as raw bytes (every rank runs the same binary). */
    dt_ckpt_state s;
    memcpy(&s, st, sizeof s);
    s.job = NULL; /* a pointer of the source rank's: not sent */
    if ((rc = dt_ckpt__host_collective(c, comm, &s, sizeof s, DT_UINT8, src, NULL, err)))
        return dt_err_prefix(err, "checkpoint: taking rank %d's state: ", src);
    for (int i = 0; i < c->nbufs; i++)
        if (c->bufs[i].numel &&
            (rc = dt_comm_broadcast(comm, c->bufs[i].data, c->bufs[i].numel, DT_FLOAT32, src, NULL,
                                    err)))
            return dt_err_prefix(err, "checkpoint: taking rank %d's %s buffers: ", src,
                                 c->bufs[i].file);
    if (rank != src) {
        dt_ckpt_state_clear(st);
        *st = s;
    }
    *adopted = v != best;
    *resumed = true;
    return 0;
}
