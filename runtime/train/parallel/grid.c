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
#include "runtime/train/parallel/grid.h"

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

/* ---- the groups ------------------------------------------------------------------------------
 *
 * Colors and keys of the splits (every rank passes its own; the ranks with one color form a
 * group, ordered by key):
 *
 *   tensor     color = pp * D + dp  (= rank / T)   key = tp    when T > 1
 *   data       color = pp * T + tp                 key = dp    when D > 1 and T x P > 1
 *   pipeline   color = dp * T + tp                 key = pp    when P > 1
 *   embedding  color = dp * T + tp on stages 0 and P-1, else -1 (no group)
 *                                                  key = pp    when P > 1
 *
 * With T = P = 1 the data group is the world itself (borrowed) when D > 1. */

/* One split of world (collective), or none when `make` is false on every rank. */
static int split(dt_comm *world, dt_store *store, bool make, int color, int key, dt_comm **out,
                 const char *what, dt_err *err)
{
    *out = NULL;
    if (!make)
        return 0;
    int rc = dt_comm_split(world, store, color, key, out, err);
    if (rc)
        return dt_err_prefix(err, "splitting the %s groups: ", what);
    dt_comm_set_label(*out, what); /* the flight records' name of the group */
    return 0;
}

int dt_groups_open(dt_groups *out, dt_comm *world, dt_store *store, const dt_grid *g,
                   dt_err *err)
{
    memset(out, 0, sizeof *out);
    if (dt_comm_world_size(world) != g->world || dt_comm_rank(world) != g->rank)
        return dt_err_set(err, -EINVAL,
                          "the grid is for rank %d of %d but the communicator is rank %d of %d",
                          g->rank, g->world, dt_comm_rank(world), dt_comm_world_size(world));
    dt_groups s = {.grid = *g, .world = world};
    const int D = g->D, T = g->T, P = g->P;
    const bool last_or_first = g->pp == 0 || g->pp == P - 1;
    int rc;
    if ((rc = split(world, store, T > 1, g->pp * D + g->dp, g->tp, &s.tp, "tensor", err)) ||
        (rc = split(world, store, D > 1 && T * P > 1, g->pp * T + g->tp, g->dp, &s.dp, "data",
                    err)) ||
        (rc = split(world, store, P > 1, g->dp * T + g->tp, g->pp, &s.pp, "pipeline", err)) ||
        (rc = split(world, store, P > 1, last_or_first ? g->dp * T + g->tp : -1, g->pp,
                    &s.embed, "embedding", err)))
        goto fail;
    if (D > 1 && T * P == 1)
        s.dp = world; /* borrowed: plain data parallelism */
    *out = s;
    return 0;
fail:
    dt_groups_close(&s);
    return rc;
}

void dt_groups_close(dt_groups *g)
{
    if (!g)
        return;
    /* the embedding group before the pipeline group: the reverse of the splits */
    dt_comm_free(g->embed);
    dt_comm_free(g->pp);
    if (g->dp != g->world)
        dt_comm_free(g->dp);
    dt_comm_free(g->tp);
    g->embed = g->pp = g->dp = g->tp = NULL;
}
