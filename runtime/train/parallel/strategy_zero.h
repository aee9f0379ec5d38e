/* strategy_zero.h - ZeRO (parallel.zero = 1 | 2): data parallelism with the optimiser state
 * (stage 1) and the gradients too (stage 2) sharded across the ranks, as DeepSpeed's ZeRO
 * stages 1 and 2 and PyTorch's ZeroRedundancyOptimizer / FSDP SHARD_GRAD_OP.
 *
 * One replica per process, as DDP; what differs is who holds what (ddp.h, "Sharding", has the
 * layout):
 *   - the gradient buckets are reduce-scattered (averaged) instead of all-reduced, launched from
 *     backward's grad-ready hook as DDP's all-reduces are, so they overlap backward; rank r
 *     keeps chunk r of every bucket (its "shard": about num_params / N elements);
 *   - the optimiser (optim.h, dt_optim_create_ranges) holds state for the shard only and updates
 *     the shard's parameters; the updated parameters are then all-gathered, so every rank holds
 *     the whole model for the next forward;
 *   - stage 1 keeps the whole flat gradient buffer (backward writes there); stage 2 gives a
 *     bucket's memory of it back (backend mem_release, in the backend's granules: pages on
 *     the cpu, 2 MiB on cuda) as soon as the bucket is reduce-scattered, and commits and zeroes
 *     each block's range before its backward (ddp.h, "Sharding"); where the backend cannot
 *     give the buffer back (granule 0) it stays resident and the figures say so. With
 *     train.grad_accum = k the first k-1 micro-steps accumulate the whole gradient locally (no
 *     synchronisation: DDP's no_sync), so during those the whole buffer is resident at stage 2
 *     as well; it is given back during the last micro-step's backward.
 *   - after the first step the buckets are rebuilt from backward's ready order, as DDP's are
 *     (GPT's tied embedding gets the last bucket to itself); the shards move with them, the
 *     optimiser state through the checkpoint staging, once, at the end of the first update;
 *   - s->comm_time_s is the wait for the reduce-scatters (sync_grads), as DDP's; the
 *     parameters' all-gather in optim_step counts in the step time only.
 * Per rank (Ψ parameters, N ranks, fp32 AdamW): stage 0 4Ψ + 4Ψ + 8Ψ; stage 1 4Ψ + 4Ψ + 4Ψ/N
 * (the gradient shard) + 8Ψ/N; stage 2 4Ψ + (about two buckets + 4Ψ/N) + 8Ψ/N.
 *
 * Numerics: on one host the shards hold the bits DDP's all-reduce gives (comm_shm.c sums every
 * element in rank order), the optimiser updates element by element, so the parameters are bit
 * for bit DDP's. The global gradient norm is summed from the shards' sums of squares (each
 * rank's in double, then the ranks' in rank order), DDP's over the whole buffer at once: the
 * norm may differ in its last bits, and with train.grad_clip active the clip factor (a float)
 * then can too. Between hosts (TCP ring) the reduction order differs from the all-reduce's.
 *
 * Checkpoints hold whole tensors: `state` hands the checkpoint full-size staging buffers for
 * the optimiser state (backend memory, resident only while used: given back with mem_release
 * where the backend can); gather_state commits and fills them (all-gather of the shards) before
 * a save and optim_step gives them back after it; after a load, start takes this rank's slice
 * and gives them back. So a
 * checkpoint written at any stage and world size resumes at any other.
 *
 * A rank that dies mid reduce-scatter or all-gather fails the step with the comm layer's error
 * (naming the collective, its sequence number and the rank) within ddp.timeout.
 *
 * Stage 3 (parallel.zero = 3, strategy_zero3.c, device = cpu or cuda): the parameters are
 * sharded too, per block of the model (model.h: buckets = blocks, each cut into N chunks of
 * ceil(n/N), the last padded; rank r keeps chunk r of every block in its persistent shard). The
 * model's block hook gathers a block into the flat parameter buffer at BEFORE_FORWARD /
 * BEFORE_BACKWARD (through a padded staging buffer, prefetched one window ahead once the window
 * order was seen in the first step; the block's range committed (mem_commit) before the copy
 * into it) and gives its granules back (mem_release) at AFTER; a block's gradient range is
 * committed and zeroed at its first backward window of a step, reduce-scattered at its last
 * AFTER_BACKWARD of the last micro-step and given back (earlier micro-steps of an accumulation
 * keep the whole gradient buffer, as stage 2). Nothing relies on released memory reading as
 * zero (the strict contract of backend_ops.h); where the backend's granule is 0 nothing is
 * given back and the figures show the flat buffers resident. The
 * optimiser steps the shard in place (a tensor table of the shard layout). Per rank: 4Ψ/N +
 * about two blocks of parameters, 4Ψ/N + about one block of gradients, 8Ψ/N of AdamW state.
 * Bit for bit DDP's on one host (the same reductions, the same element-wise update); the norm
 * as stages 1-2. Checkpoints through full-size staging as above, the parameters included: a
 * save gathers them, a load is sliced at start. Every micro-step communicates, so
 * train.global_batch (unequal micro-steps across ranks) is refused, and every rank must run
 * as many eval forwards (the trainer does). dt_strategy_zero_stats is -EINVAL for it (no
 * reducer); dt_strategy_get_mem reports its allocator figures.
 */
#ifndef DT_STRATEGY_ZERO_H
#define DT_STRATEGY_ZERO_H

#include <stddef.h>

#include "runtime/train/parallel/strategy.h"
#include "runtime/train/parallel/strategy_zero3.h" /* stage 3's ops: zero.c dispatches to them */

extern const dt_strategy_ops dt_strategy_zero_ops;

/* What s holds (strategy.h's dt_strategy_mem), measured where it can be; any strategy. */
void dt_strategy_get_mem(dt_strategy *s, dt_strategy_mem *out);

/* ---- ZeRO stages 1-2 over a data-parallel group, as a piece other strategies hold -----------
 *
 * What the zero strategy does over the world, the tensor and pipeline strategies do over the
 * data-parallel group of their grid (grid.h): the same reducer in its sharding mode over their
 * local model (a tensor slice, a pipeline stage, or both), the optimiser over this rank's shard
 * of it, and a staging of the optimiser state in the local model's layout (num_params floats per
 * state), through which their own whole-tensor checkpoint staging reads and writes:
 *
 *   open        after s->be and s->model exist: the reducer (checks the local model over dp,
 *               broadcasts dp rank 0's parameters, fixes the shards), s->optim over the shard
 *   micro_step  backward with dt_ddp_grad_ready and dt_zero_ddp(z) on the last micro-step
 *   sync_grads  dt_ddp_finish(dt_zero_ddp(z)): this rank's averaged shard in dt_zero_grads(z)
 *   clip        dt_zero_sumsq over dp of the tensors the caller counts (then the caller's own
 *               sums over tensor and pipeline ranks), the scaling on dt_zero_grads(z)
 *   optim_step  dt_zero_step: the update of the shard, the all-gather of the parameters
 *   save        dt_zero_gather_state (collective over dp), then the caller reads
 *               dt_zero_local_state(z, i) as it read s->optim->states[i].buf
 *   load        the caller writes dt_zero_local_state(z, i), then dt_zero_take_state
 *
 * The staging is backend memory charged to DT_MEM_OTHER, resident between a save or a load and
 * the next update and given back (mem_release) otherwise. */
typedef struct dt_zero dt_zero;

/* Opens stage job.zero (1 or 2; else -EINVAL) over dp (borrowed, two ranks or more; it and s
 * outlive z) for s->model on s->be, and builds s->optim from ctx->optim over the shard.
 * Collective over dp. On failure *out is NULL and whatever was built is freed, except s->optim
 * (the strategy's close frees it). */
int dt_zero_open(dt_zero **out, dt_strategy *s, const dt_strategy_ctx *ctx, dt_comm *dp,
                 dt_err *err);

/* The reducer first, then the staging. Accepts NULL. Before s's comm and backend are freed. */
void dt_zero_free(dt_zero *z);

int dt_zero_stage(const dt_zero *z);
struct dt_ddp *dt_zero_ddp(dt_zero *z);

/* Zeroes the gradients the next micro-steps accumulate into (stage 2: gives their memory back;
 * each block's range is committed and zeroed before its backward). */
void dt_zero_zero_grads(dt_zero *z);

/* This rank's averaged gradient shard after sync_grads (backend memory), and its elements. */
float *dt_zero_grads(dt_zero *z, size_t *numel);

/* *sum = the sum over dp of each rank's sum of squares of its shard's elements that lie in a
 * tensor marked counted[i] != 0 (s->model's table; counted NULL: every element), the ranks'
 * sums added in rank order on every rank (the same double everywhere). Collective over dp. */
int dt_zero_sumsq(dt_zero *z, const unsigned char *counted, double *sum, dt_err *err);

/* dt_strategy_clip_split (strategy.h) for a sharded gradient: unscale the shard; the sum of
 * squares of the tensors split over the tensor group (on every rank) and of the replicated ones
 * (on tensor rank 0 only), none of skip[0..nskip), over the shards (dt_zero_sumsq, collective
 * over dp), then all-reduced over each non-NULL groups[g] in turn (tensor, pipeline) in scratch
 * (one double of backend memory); *norm its square root, the clip scaling on the shard. */
int dt_zero_clip_split(dt_zero *z, double unscale, int tp_rank, const int *skip, int nskip,
                       dt_comm *const *groups, int ngroups, double *scratch, double *norm,
                       dt_err *err);

/* The optimiser step on the shard at lr, then the all-gather of the updated parameters over
 * dp; after the first step, the move of the shards to the rebuilt buckets. Collective. */
int dt_zero_step(dt_zero *z, double lr, dt_err *err);

/* Optimiser state i in s->model's buffer layout (num_params floats): what dt_zero_gather_state
 * filled, or where a load is to be written before dt_zero_take_state. */
float *dt_zero_local_state(dt_zero *z, int i);

/* dt_zero_local_state(z, i) = every rank's shard of state i put in place. Collective over dp. */
int dt_zero_gather_state(dt_zero *z, dt_err *err);

/* Each state's shard = this rank's slice of dt_zero_local_state (zeros when nothing was
 * written there); then the staging goes back (mem_release). Local. */
void dt_zero_take_state(dt_zero *z);

/* The sharded part of dt_strategy_get_mem's figures: grads (stage 2 resident bytes + shard),
 * grads_peak, comm, ckpt_staging, zero_stage. */
void dt_zero_mem(dt_zero *z, dt_strategy_mem *out);

struct dt_ddp_stats;
/* The ZeRO strategy's reducer figures (ddp.h's dt_ddp_stats: buckets, rebuilt, launches early
 * and late, shard size, resident gradients). -EINVAL when s is not the zero strategy. */
int dt_strategy_zero_stats(dt_strategy *s, struct dt_ddp_stats *out);

#endif
