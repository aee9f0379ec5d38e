/* ckpt_sync.c - every rank resumes from the same checkpoint (dt_ckpt_sync, see ckpt.h).
 *
 * Each rank first resumes on its own from the checkpoint directory it sees; this file then makes
 * them agree: an all-gather of the steps found, and, when they differ (node-local directories),
 * a broadcast of the source rank's state and checkpointed buffers.
 */
#include "runtime/train/ckpt_core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"

static int host_collective(dt_ckpt *c, dt_comm *comm, void *host, size_t bytes, int root,
                           void *recv, dt_err *err)
{
    size_t n = bytes / 4, total = recv ? bytes * (size_t)dt_comm_world_size(comm) : 0;
    if (!c->be)
        return recv ? dt_comm_allgather(comm, host, recv, n, DT_FLOAT32, NULL, err)
                    : dt_comm_broadcast(comm, host, n, DT_FLOAT32, root, NULL, err);
    char *dev = NULL;
    int rc = c->be->alloc(c->be, (void **)&dev, bytes + total, err);
    if (rc)
        return rc;
    c->be->memcpy_h2d(c->be, dev, host, bytes);
    rc = recv ? dt_comm_allgather(comm, dev, dev + bytes, n, DT_FLOAT32, NULL, err)
              : dt_comm_broadcast(comm, dev, n, DT_FLOAT32, root, NULL, err);
    if (!rc)
        c->be->memcpy_d2h(c->be, recv ? recv : host, recv ? dev + bytes : dev, recv ? total : bytes);
    c->be->free(c->be, dev);
    return rc;
}

int dt_ckpt_sync(dt_ckpt *c, dt_comm *comm, int rank, dt_ckpt_state *st, bool *resumed,
                 int *src_rank, int64_t *src_step, bool *adopted, dt_err *err)
{
    *adopted = false;
    *src_rank = rank;
    *src_step = *resumed ? st->step : -1;
    int world = dt_comm_world_size(comm);
    if (!comm || world < 2)
        return 0;
    /* every rank's step + 1 (0 = none), in two floats that hold 20 and 24 bits exactly (raw
     * copies through a float32 all-gather) */
    int64_t v = *resumed ? st->step + 1 : 0;
    float mine[2] = {(float)(v & 0xFFFFF), (float)(v >> 20)};
    float *all = calloc((size_t)world * 2, sizeof *all);
    if (!all)
        return dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
    int rc = host_collective(c, comm, mine, sizeof mine, 0, all, err);
    int64_t best = -1;
    int src = 0;
    bool alike = true;
    for (int r = 0; r < world && !rc; r++) {
        int64_t vr = (int64_t)all[2 * r] + ((int64_t)all[2 * r + 1] << 20);
        alike = alike && (r == 0 || vr == best);
        if (vr > best) {
            best = vr;
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
     * buffers. */
    union {
        dt_ckpt_state s;
        float words[(sizeof(dt_ckpt_state) + 3) / 4];
    } u;
    memset(&u, 0, sizeof u);
    u.s = *st;
    u.s.job = NULL; /* a pointer of the source rank's: not sent */
    if ((rc = host_collective(c, comm, &u, sizeof u, src, NULL, err)))
        return rc;
    for (int i = 0; i < c->nbufs; i++)
        if (c->bufs[i].numel &&
            (rc = dt_comm_broadcast(comm, c->bufs[i].data, c->bufs[i].numel, DT_FLOAT32, src, NULL,
                                    err)))
            return dt_err_prefix(err, "checkpoint: taking rank %d's %s buffers: ", src,
                                 c->bufs[i].file);
    if (rank != src) {
        dt_ckpt_state_clear(st);
        *st = u.s;
    }
    *adopted = v != best;
    *resumed = true;
    return 0;
}
