/* strategies.h - the registry: which layout of strategy.h a job runs, and which data-parallel
 * sync (dpsync/dpsync.h) the layout holds.
 *
 *   job.strategy = dp                 dp        (strategy_dp.c; one rank only; no sync)
 *   parallel.pipeline > 1             pipeline  (strategy_pipeline.c; tensor slices inside a
 *                                                stage when parallel.tensor > 1)
 *   parallel.tensor > 1               tensor    (strategy_tensor.c)
 *   otherwise                         the data layout (strategy_data.c): single with one rank,
 *                                     ddp with several, zero with parallel.zero > 0
 *
 * and the sync, over the layout's data-parallel group of D ranks (grid.h):
 *
 *   parallel.zero = 3, D > 1 (or the data layout, any D)  zero-3   (dpsync_zero3.c)
 *   parallel.zero = 1 or 2, D > 1                         zero-1/2 (dpsync_zero12.c)
 *   D > 1                                                 ddp      (dpsync_ddp.c)
 *   D = 1                                                 none     (dpsync_none.c; said once
 *                                                                   when parallel.zero is set)
 *
 * Stage 3 on one rank of the data layout shards nothing but still gathers and gives back each
 * block, so its memory and its path (commits, releases, the prefetch, the collectives over one
 * rank) are what one GPU can measure; stages 1-2 on one rank would only add copies.
 *
 * The trainer picks before it builds anything, to learn the rank's batch (ops->rank_batch),
 * then opens the layout once the data has told it the model's shape. This is the only file that
 * knows the layouts and the syncs by name. */
#ifndef DT_STRATEGIES_H
#define DT_STRATEGIES_H

#include "runtime/train/parallel/strategy.h"

/* The layout for job on the grid g (never NULL), and in *sync the data-parallel sync it holds
 * (NULL for dp). */
const dt_strategy_ops *dt_strategy_pick(const dt_job *job, const dt_grid *g,
                                        const dt_dpsync_ops **sync);

/* Opens ops on this rank (*out owned by the caller: dt_strategy_close). On failure *out is NULL,
 * what was built is freed, and err says what failed. */
int dt_strategy_open(dt_strategy **out, const dt_strategy_ops *ops, const dt_strategy_ctx *ctx,
                     dt_err *err);

/* Accepts NULL. */
void dt_strategy_close(dt_strategy *s);

#endif
