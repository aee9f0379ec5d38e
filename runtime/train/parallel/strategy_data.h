/* strategy_data.h - one replica of the whole model per process, kept in step over the world by
 * a data-parallel sync (dpsync.h): the layout of a job without tensor or pipeline parallelism.
 * Its three names are the ones its runs always had, after the sync it holds: single (none: one
 * rank), ddp (DDP), zero (ZeRO stages 1-3). */
#ifndef DT_STRATEGY_DATA_H
#define DT_STRATEGY_DATA_H

#include "runtime/train/parallel/strategy.h"

extern const dt_strategy_ops dt_strategy_single_ops;
extern const dt_strategy_ops dt_strategy_ddp_ops;
extern const dt_strategy_ops dt_strategy_zero_ops;

#endif
