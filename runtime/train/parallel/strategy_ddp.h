/* strategy_ddp.h - DistributedDataParallel: one replica per process, gradients all-reduced in
 * buckets while backward runs (ddp.c's reducer). */
#ifndef DT_STRATEGY_DDP_H
#define DT_STRATEGY_DDP_H

#include "runtime/train/parallel/strategy.h"

extern const dt_strategy_ops dt_strategy_ddp_ops;

#endif
