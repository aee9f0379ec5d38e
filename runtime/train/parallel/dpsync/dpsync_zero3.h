/* dpsync_zero3.h - ZeRO stage 3 (parallel.zero = 3, FSDP full shard) as a data-parallel sync:
 * the parameters, gradients and optimiser state sharded over the group per block of the model,
 * each block gathered by the model's block hook around its use. dpsync_zero3.c says how. */
#ifndef DT_DPSYNC_ZERO3_H
#define DT_DPSYNC_ZERO3_H

#include "runtime/train/parallel/dpsync/dpsync.h"

extern const dt_dpsync_ops dt_dpsync_zero3_ops;

#endif
