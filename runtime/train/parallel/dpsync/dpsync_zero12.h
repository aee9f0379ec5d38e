/* dpsync_zero12.h - ZeRO stages 1 and 2 as data-parallel syncs (parallel.zero = 1 | 2): the
 * optimiser state (stage 1) and the gradients too (stage 2) sharded over the group, as
 * DeepSpeed's ZeRO-1/2 and PyTorch's ZeroRedundancyOptimizer / FSDP SHARD_GRAD_OP, over ddp.h's
 * reducer in its sharding mode. dpsync_zero12.c says how. */
#ifndef DT_DPSYNC_ZERO12_H
#define DT_DPSYNC_ZERO12_H

#include "runtime/train/parallel/dpsync/dpsync.h"

extern const dt_dpsync_ops dt_dpsync_zero1_ops;
extern const dt_dpsync_ops dt_dpsync_zero2_ops;

#endif
