/* strategy_pipeline.h - pipeline parallelism (GPipe, 1F1B): each rank holds one stage, a
 * contiguous run of the model's blocks, and micro-batches flow through the stages; a
 * data-parallel sync (DDP, or ZeRO 1-3 by parallel.zero) over the data-parallel group when
 * D > 1. See strategy_pipeline.c for how a
 * step runs. */
#ifndef DT_STRATEGY_PIPELINE_H
#define DT_STRATEGY_PIPELINE_H

#include "runtime/train/parallel/strategy.h"

extern const dt_strategy_ops dt_strategy_pipeline_ops;

#endif
