/* dpsync_none.h - the data-parallel sync of a rank without replicas: nothing to synchronise. */
#ifndef DT_DPSYNC_NONE_H
#define DT_DPSYNC_NONE_H

#include "runtime/train/parallel/dpsync/dpsync.h"

extern const dt_dpsync_ops dt_dpsync_none_ops;

/* Its ops on a replica that holds the whole local model, gradient and optimiser (y->optim over
 * all of it), which ddp's replicas borrow: zero the gradient, scale it, its sum of squares
 * (dt_dpsync_sumsq_whole), the update, the local buffers (the model's parameters, the
 * optimiser's states), the one piece it owns of each, the whole figures. */
void dt_dpsync_none_zero_grads(dt_dpsync *y);
void dt_dpsync_none_scale(dt_dpsync *y, float f);
int dt_dpsync_none_sumsq(dt_dpsync *y, const unsigned char *counted, double *sum, dt_err *err);
int dt_dpsync_none_step(dt_dpsync *y, double lr, dt_err *err);
float *dt_dpsync_none_local(dt_dpsync *y, int k);
int dt_dpsync_none_owned(dt_dpsync *y, int k, dt_dpsync_piece *out, int cap, int *n);
void dt_dpsync_none_mem(dt_dpsync *y, dt_dpsync_mem *out);

#endif
