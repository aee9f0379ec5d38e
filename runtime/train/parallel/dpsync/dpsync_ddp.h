/* dpsync_ddp.h - DistributedDataParallel as a data-parallel sync: ddp.h's reducer over the
 * group, every replica holding the whole (local) model, gradient and optimiser state. */
#ifndef DT_DPSYNC_DDP_H
#define DT_DPSYNC_DDP_H

#include "runtime/train/parallel/dpsync/dpsync.h"

extern const dt_dpsync_ops dt_dpsync_ddp_ops;

#endif
