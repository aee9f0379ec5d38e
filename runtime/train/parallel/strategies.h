/* strategies.h - the registry of strategies: which implementation of strategy.h a job runs.
 *
 *   job.strategy = ddp, one rank      single  (strategy_single.c)
 *   job.strategy = ddp, several ranks ddp     (strategy_ddp.c)
 *     and parallel.zero = 1 or 2      zero    (strategy_zero.c; one rank: single, said once)
 *   job.strategy = dp                 dp      (strategy_dp.c; one rank only; no zero)
 *   parallel.tensor > 1, pipeline 1   tensor  (strategy_tensor.c; DDP over the data-parallel
 *                                              groups when world > tensor)
 *
 * The trainer picks (dt_strategy_pick) before it builds anything, to learn the rank's batch
 * (ops->rank_batch), then opens the strategy once the data has told it the model's shape. */
#ifndef DT_STRATEGIES_H
#define DT_STRATEGIES_H

#include "runtime/train/parallel/strategy.h"

/* The implementation for job on a world of world_size ranks (never NULL: ddp is the default). */
const dt_strategy_ops *dt_strategy_pick(const dt_job *job, int world_size);

/* Opens ops on this rank (*out owned by the caller: dt_strategy_close). On failure *out is NULL,
 * what was built is freed, and err says what failed. */
int dt_strategy_open(dt_strategy **out, const dt_strategy_ops *ops, const dt_strategy_ctx *ctx,
                     dt_err *err);

/* Accepts NULL. */
void dt_strategy_close(dt_strategy *s);

#endif
