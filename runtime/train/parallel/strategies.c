/* strategies.c - the registry of strategies; see strategies.h. The only file that knows the
 * implementations by name. */
#include "runtime/train/parallel/strategies.h"

#include <errno.h>
#include <stdlib.h>

#include "common/log.h"
#include "runtime/train/parallel/strategy_ddp.h"
#include "runtime/train/parallel/strategy_dp.h"
#include "runtime/train/parallel/strategy_pipeline.h"
#include "runtime/train/parallel/strategy_single.h"
#include "runtime/train/parallel/strategy_tensor.h"
#include "runtime/train/parallel/strategy_zero.h"

const dt_strategy_ops *dt_strategy_pick(const dt_job *job, int world_size)
{
    if (job->strategy == DT_STRATEGY_DP)
        return &dt_strategy_dp_ops; /* with parallel.zero > 0 the job does not validate */
    if (job->pipeline > 1)
        return &dt_strategy_pipeline_ops; /* tensor slices inside a stage; DDP or ZeRO over the
                                             data-parallel groups when D > 1 */
    if (job->tensor > 1)
        return &dt_strategy_tensor_ops; /* DDP or ZeRO over the data-parallel groups when D > 1 */
    /* stage 3 on one rank shards nothing but still gathers and gives back each block, so
     * its memory and its path (commits, releases, the prefetch, the collectives over one
     * rank) are what one GPU can measure; stages 1-2 on one rank would only add copies */
    if (world_size > 1 || job->zero == 3)
        return job->zero == 3  ? &dt_strategy_zero3_ops
               : job->zero > 0 ? &dt_strategy_zero_ops
                               : &dt_strategy_ddp_ops;
    if (job->zero > 0)
        DT_INFO("parallel.zero = %d with one rank: nothing to shard, training as a single "
                "process", job->zero);
    return &dt_strategy_single_ops;
}

int dt_strategy_open(dt_strategy **out, const dt_strategy_ops *ops, const dt_strategy_ctx *ctx,
                     dt_err *err)
{
    *out = NULL;
    dt_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dt_err_set(err, -ENOMEM, "out of memory");
    s->ops = ops;
    s->replicas = 1;
    int rc = ops->open(s, ctx, err);
    if (rc) {
        dt_strategy_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void dt_strategy_close(dt_strategy *s)
{
    if (!s)
        return;
    s->ops->close(s);
    free(s);
}
