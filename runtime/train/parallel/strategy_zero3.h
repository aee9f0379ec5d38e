/* strategy_zero3.h - ZeRO stage 3 (parallel.zero = 3, FSDP full-shard, device = cpu or cuda):
 * its ops, its memory figures, and the piece (dt_zero3) other strategies hold over a group.
 * What it does is strategy_zero.h's "Stage 3"; this header is apart so
 * that strategy_zero3.c needs nothing of strategy_zero.c (zero.c's dt_strategy_get_mem calls
 * into stage 3, never the reverse: no include loop).
 */
#ifndef DT_STRATEGY_ZERO3_H
#define DT_STRATEGY_ZERO3_H

#include "runtime/train/parallel/strategy.h"

/* Stage 3 (strategy_zero3.c): its own ops, also named "zero". */
extern const dt_strategy_ops dt_strategy_zero3_ops;

/* Stage 3's figures (called by strategy_zero.h's dt_strategy_get_mem), from the allocator's
 * categories. s must be a strategy opened with dt_strategy_zero3_ops. */
void dt_strategy_zero3_mem(dt_strategy *s, dt_strategy_mem *out);

/* ---- ZeRO stage 3 over a group, as a piece (strategy_zero3.c) -----------------------------
 *
 * Stage 3 ("Stage 3" above) of s->model over a group c (the world for the zero strategy, the
 * data-parallel group for the tensor strategy), any backend: the model's block hook gathers
 * each block over c before use and gives it back after; the optimiser is over the shard. Its
 * checkpoint staging is in the local model's layout: dt_zero3_local(z, 0) the parameters,
 * dt_zero3_local(z, 1 + i) optimiser state i (num_params floats each, + N of slack), filled by
 * dt_zero3_gather_state (collective over c) before a save, written by a load before
 * dt_zero3_start (which broadcasts c's rank 0's parameters and slices them and the state).
 * The staging is backend memory (strategy.h's dt_strategy_staging, charged as "other"):
 * resident from open to start and from dt_zero3_gather_state to the next dt_zero3_step, given
 * back in between (where the backend's granule allows), so it is written or read only then. */
typedef struct dt_zero3 dt_zero3;

/* After s->be and s->model exist: the layout, the shard buffers, s->optim over the shard
 * (ctx->optim), the staging holding the initial parameters, the block hook set. Collective over
 * c (borrowed; it and s outlive z). On failure *out is NULL, what it built freed but s->optim. */
int dt_zero3_open(dt_zero3 **out, dt_strategy *s, const dt_strategy_ctx *ctx, dt_comm *c,
                  dt_err *err);
/* Waits for what is in flight, frees, clears the block hook. Accepts NULL. */
void dt_zero3_free(dt_zero3 *z);
float *dt_zero3_local(dt_zero3 *z, int k);
int dt_zero3_start(dt_zero3 *z, dt_err *err);
void dt_zero3_zero_grads(dt_zero3 *z);
/* Forward and backward with the block hook's gathers and, on the last micro-step, the
 * gradients reduce-scattered block by block. */
int dt_zero3_micro_step(dt_zero3 *z, const dt_batch *batch, float dloss, bool last,
                        float *loss, dt_err *err);
/* Waits for the reduce-scatters (*wait_s: how long). */
int dt_zero3_sync_grads(dt_zero3 *z, double *wait_s, dt_err *err);
/* As strategy_zero.h's dt_zero_clip_split; tp_rank < 0: every element of the shard, no groups (the zero
 * strategy's norm). */
int dt_zero3_clip_split(dt_zero3 *z, double unscale, int tp_rank, const int *skip, int nskip,
                        dt_comm *const *groups, int ngroups, double *scratch, double *norm,
                        dt_err *err);
/* The optimiser's update of the shard (local: the next forward gathers it). */
int dt_zero3_step(dt_zero3 *z, double lr);
int dt_zero3_eval(dt_zero3 *z, const dt_batch *batch, float *loss, int64_t *correct,
                  dt_err *err);
int dt_zero3_gather_state(dt_zero3 *z, dt_err *err);

/* For a strategy that drives the model's passes itself (the pipeline's micro-batches):
 * backward_begins before each backward (last: the step's final one, whose blocks' gradients are
 * reduce-scattered as they become final; the others accumulate), drop after a run of passes
 * (every gathered block given back). hold_tensor: the gradients of the block holding that tensor
 * wait, after the final backward, for scatter_held (the pipeline's tied wte, summed over the
 * embedding group first); call scatter_held before dt_zero3_sync_grads. */
void dt_zero3_backward_begins(dt_zero3 *z, bool last);
void dt_zero3_drop(dt_zero3 *z);
int dt_zero3_hold_tensor(dt_zero3 *z, int tensor, dt_err *err);
void dt_zero3_scatter_held(dt_zero3 *z);


#endif
