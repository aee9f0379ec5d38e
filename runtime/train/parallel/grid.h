/* grid.h - the job's world laid out as data x tensor x pipeline (parallel.tensor = T,
 * parallel.pipeline = P, D = world / (T x P)), and the process groups carved from it.
 *
 * Rank order, as Megatron-LM's default (tp fastest, then dp, then pp):
 *
 *     rank = (pp * D + dp) * T + tp
 *
 * so a tensor group is T consecutive ranks (inside a node when T divides nproc_per_node), a
 * data-parallel group holds the ranks with the same (tp, pp), a pipeline group the ranks with the
 * same (dp, tp), in stage order. With T = P = 1 the grid is plain data parallelism: dp = rank,
 * D = world, and every strategy derives its data shard from the grid (the sampler draws the
 * samples of data-parallel rank dp of D; the ranks of one tensor group, and every stage of one
 * pipeline, see the same samples).
 *
 * Groups: dt_groups_open splits the world communicator (dt_comm_split) into the tensor, data,
 * pipeline and embedding groups of this rank. The embedding group (P > 1 only) is the first and
 * the last stage of this rank's pipeline, which both hold the tied wte (Megatron's embedding
 * group); ranks of the middle stages have none. A group of one rank is NULL (nothing to
 * communicate: callers skip the collective), so with T = P = 1 only dp is set (= world, borrowed)
 * when world > 1.
 *
 * The splits, in this order on every rank (one dt_comm_split each; a kind whose groups would all
 * be of one rank is not split at all, on any rank):
 *
 *     tensor     color = pp * D + dp (= rank / T)   key = tp   (T > 1)
 *     data       color = pp * T + tp                key = dp   (D > 1 and T x P > 1)
 *     pipeline   color = dp * T + tp                key = pp   (P > 1)
 *     embedding  color = dp * T + tp on stages 0 and P-1, -1 elsewhere; key = pp   (P > 1)
 *
 * Whether T x P divides the world is config.h's dt_parallel_check_world, the message the
 * launcher gives at load and the agent after a rendezvous; dt_grid_init gives it once more.
 *
 * What it may include: comm/, job/config.h, common/. Used by the strategies and worker.c.
 */
#ifndef DT_GRID_H
#define DT_GRID_H

#include "common/err.h"
#include "runtime/comm/comm.h"

typedef struct dt_grid {
    int rank, world;
    int D, T, P;    /* data, tensor, pipeline degrees; D * T * P = world */
    int dp, tp, pp; /* this rank's coordinates */
} dt_grid;

/* Lays out world ranks with T and P (>= 1). -EINVAL with a message naming parallel.tensor and
 * parallel.pipeline and the valid world sizes (the multiples of T x P) when T x P does not divide
 * world, or when rank is not in 0..world-1; g is left untouched on failure. */
int dt_grid_init(dt_grid *g, int rank, int world, int T, int P, dt_err *err);

/* The rank at (dp, tp, pp); -1 when a coordinate is out of range. */
int dt_grid_rank_of(const dt_grid *g, int dp, int tp, int pp);

typedef struct dt_groups {
    dt_grid grid;
    dt_comm *world; /* borrowed */
    dt_comm *tp;    /* T ranks with this (dp, pp), ranked by tp; NULL when T = 1 */
    dt_comm *dp;    /* D ranks with this (tp, pp), ranked by dp; NULL when D = 1; the world
                       itself (borrowed, not freed) when T = P = 1 */
    dt_comm *pp;    /* P ranks with this (dp, tp), ranked by pp; NULL when P = 1 */
    dt_comm *embed; /* stages 0 and P-1 of this pipeline (P > 1, on those two stages); else NULL */
} dt_groups;

/* Splits world (collective over it: every rank calls it at the same point) into g's groups.
 * store: borrowed for the bootstrap (dt_comm_split). On failure nothing is left open. */
int dt_groups_open(dt_groups *out, dt_comm *world, dt_store *store, const dt_grid *g,
                   dt_err *err);

/* Frees the groups it split (not the world). Accepts a zeroed or closed struct. */
void dt_groups_close(dt_groups *g);

#endif
