/* strategy_single.h - one process, one replica: the strategy of a run with one rank. */
#ifndef DT_STRATEGY_SINGLE_H
#define DT_STRATEGY_SINGLE_H

#include "runtime/train/parallel/strategy.h"

extern const dt_strategy_ops dt_strategy_single_ops;

#endif
