/* strategies.c - the registry of strategies; see strategies.h. The only file that knows the
 * implementations by name. */
#include "runtime/train/parallel/strategies.h"

#include <errno.h>
#include <stdlib.h>

#include "common/log.h"
#include "runtime/train/parallel/dpsync/dpsync_ddp.h"
#include "runtime/train/parallel/dpsync/dpsync_none.h"
#include "runtime/train/parallel/dpsync/dpsync_zero12.h"
#include "runtime/train/parallel/dpsync/dpsync_zero3.h"
#include "runtime/train/parallel/strategy_data.h"
#include "runtime/train/parallel/strategy_dp.h"
#include "runtime/train/parallel/strategy_pipeline.h"
#include "runtime/train/parallel/strategy_tensor.h"

/* The sync over D data-parallel ranks; data: the layout of a whole model per rank. */
static const dt_dpsync_ops *pick_sync(const dt_job *job, const dt_grid *g, bool data)
{
    if (job->zero == 3 && (g->D > 1 || data))
        return &dt_dpsync_zero3_ops;
    if (g->D > 1)
        return job->zero == 1 ? &dt_dpsync_zero1_ops
               : job->zero == 2 ? &dt_dpsync_zero2_ops
                                : &dt_dpsync_ddp_ops;
    if (job->zero > 0 && g->rank == 0)
        DT_INFO("parallel.zero = %d with %s: nothing to shard over, %s", job->zero,
                data ? "one rank" : "D = 1",
                data ? "training as a single process"
                     : "every rank keeps the optimiser state of its part of the model");
    return &dt_dpsync_none_ops;
}

const dt_strategy_ops *dt_strategy_pick(const dt_job *job, const dt_grid *g,
                                        const dt_dpsync_ops **sync)
{
    *sync = NULL;
    if (job->strategy == DT_STRATEGY_DP)
        return &dt_strategy_dp_ops; /* with parallel.zero > 0 the job does not validate */
    bool data = job->pipeline <= 1 && job->tensor <= 1;
    *sync = pick_sync(job, g, data);
    if (job->pipeline > 1)
        return &dt_strategy_pipeline_ops;
    if (job->tensor > 1)
        return &dt_strategy_tensor_ops;
    return *sync == &dt_dpsync_none_ops  ? &dt_strategy_single_ops
           : *sync == &dt_dpsync_ddp_ops ? &dt_strategy_ddp_ops
                                         : &dt_strategy_zero_ops;
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
