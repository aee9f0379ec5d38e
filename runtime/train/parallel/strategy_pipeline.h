/* strategy_pipeline.h - pipeline parallelism (GPipe, 1F1B): each rank holds one stage, a
 * contiguous run of the model's blocks, and micro-batches flow through the stages; a
 * data-parallel sync (DDP, or ZeRO 1-3 by parallel.zero) over the data-parallel group when
 * D > 1. See strategy_pipeline.c for how a
 * step runs. */
#ifndef DT_STRATEGY_PIPELINE_H
#define DT_STRATEGY_PIPELINE_H

#include "runtime/train/parallel/strategy.h"

extern const dt_strategy_ops dt_strategy_pipeline_ops;

/* What the last training micro_step of a pipeline rank measured (for dtrain bench pipeline). */
typedef struct dt_pp_stats {
    int P, M, stage;         /* layout of this rank */
    int slots;               /* activation slots the model holds (GPipe M, 1F1B min(P-s, M)) */
    int peak_in_flight;      /* most micro-batches whose activations were alive at once */
    double step_s;           /* wall time of the last micro_step (the schedule, the loss) */
    double compute_s;        /* of which in the model's stage_forward/stage_backward */
    double fwd_s, bwd_s;     /* ... split into forwards and backwards */
    double idle;             /* 1 - compute_s / step_s: this stage's bubble plus its waits */
    size_t slot_bytes;       /* one micro-batch's activations on this stage (the model's) */
    size_t act_bytes;        /* the model's activation memory plus the strategy's p2p buffers */
    size_t peak_act_bytes;   /* peak_in_flight x slot_bytes: what the schedule kept alive */
} dt_pp_stats;

/* -EINVAL when s is not a pipeline strategy. */
int dt_strategy_pipeline_stats(const dt_strategy *s, dt_pp_stats *out);

#endif
