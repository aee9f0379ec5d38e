/* strategy_zero3.h - ZeRO stage 3 (parallel.zero = 3, FSDP full-shard, device = cpu): its ops
 * and its memory figures. What it does is strategy_zero.h's "Stage 3"; this header is apart so
 * that strategy_zero3.c needs nothing of strategy_zero.c (zero.c's dt_strategy_get_mem calls
 * into stage 3, never the reverse: no include loop).
 */
#ifndef DT_STRATEGY_ZERO3_H
#define DT_STRATEGY_ZERO3_H

#include "runtime/train/strategy.h"

/* Stage 3 (strategy_zero3.c): its own ops, also named "zero". */
extern const dt_strategy_ops dt_strategy_zero3_ops;

/* Stage 3's figures (called by strategy_zero.h's dt_strategy_get_mem), from the allocator's
 * categories. s must be a strategy opened with dt_strategy_zero3_ops. */
void dt_strategy_zero3_mem(dt_strategy *s, dt_strategy_mem *out);

#endif
