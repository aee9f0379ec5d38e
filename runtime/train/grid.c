/* grid.c - the data x tensor x pipeline grid of a job's ranks and its process groups; see
 * grid.h.
 *
 * The grid is arithmetic on (rank, world, T, P): nothing is stored or exchanged to know one's
 * coordinates, so an elastic job whose world changes re-derives D = world / (T x P) at every
 * start. Whether T x P divides the world is said by config.h's dt_parallel_check_world, the one
 * message the launcher (at load), the agent (after the rendezvous) and the workers give.
 *
 * The groups are communicators split from the world with one dt_comm_split per kind of group,
 * in a fixed order (tensor, data, pipeline, embedding) that every rank follows. A split whose
 * groups would all hold one rank is not made at all (every rank knows T, D and P, so every rank
 * skips the same splits, and the collective order stays the same everywhere).
 */
#include "runtime/train/grid.h"

#include <string.h>

#include "runtime/job/config.h"

/* ---- the grid ------------------------------------------------------------------------------ */

int dt_grid_init(dt_grid *g, int rank, int world, int T, int P, dt_err *err)
{
    int rc = dt_parallel_check_world(world, T, P, err);
    if (rc)
        return rc;
    if (rank < 0 || rank >= world)
        return dt_err_set(err, -EINVAL, "rank %d is outside the world of %d ranks (0..%d)", rank,
                          world, world - 1);
    memset(g, 0, sizeof *g);
    g->rank = rank;
    g->world = world;
    g->T = T;
    g->P = P;
    g->D = world / (T * P);
    /* rank = (pp * D + dp) * T + tp */
    g->tp = rank % T;
    g->dp = rank / T % g->D;
    g->pp = rank / (T * g->D);
    return 0;
}

int dt_grid_rank_of(const dt_grid *g, int dp, int tp, int pp)
{
    if (dp < 0 || dp >= g->D || tp < 0 || tp >= g->T || pp < 0 || pp >= g->P)
        return -1;
    return (pp * g->D + dp) * g->T + tp;
}
