/* strategy_dp.h - DataParallel: one process drives job.dp_replicas replicas (dp.c). */
#ifndef DT_STRATEGY_DP_H
#define DT_STRATEGY_DP_H

#include "runtime/train/parallel/strategy.h"

extern const dt_strategy_ops dt_strategy_dp_ops;

#endif
