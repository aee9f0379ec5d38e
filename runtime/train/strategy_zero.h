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
 *     bucket's pages of it back as soon as the bucket is reduce-scattered (device = cpu only;
 *     on cuda stage 2 is refused with a message). With train.grad_accum = k the first k-1
 *     micro-steps accumulate the whole gradient locally (no synchronisation: DDP's no_sync), so
 *     during those the whole buffer is resident at stage 2 as well; the pages are given back
 *     during the last micro-step's backward.
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
 * the optimiser state (on cpu, reserved address space whose pages exist only while used);
 * gather_state fills them (all-gather of the shards) before a save and optim_step gives them
 * back after it; after a load, start takes this rank's slice and gives them back. So a
 * checkpoint written at any stage and world size resumes at any other.
 *
 * A rank that dies mid reduce-scatter or all-gather fails the step with the comm layer's error
 * (naming the collective, its sequence number and the rank) within ddp.timeout.
 *
 * Stage 3 (parallel.zero = 3, strategy_zero3.c, device = cpu): the parameters are sharded too,
 * per block of the model (model.h: buckets = blocks, each cut into N chunks of ceil(n/N), the
 * last padded; rank r keeps chunk r of every block in its persistent shard). The model's block
 * hook gathers a block into the flat parameter buffer at BEFORE_FORWARD / BEFORE_BACKWARD
 * (through a padded staging buffer, prefetched one window ahead once the window order was seen
 * in the first step) and gives its pages back (mem_release) at AFTER; a block's gradients are
 * reduce-scattered at its last AFTER_BACKWARD of the last micro-step and their pages given back
 * (earlier micro-steps of an accumulation keep the whole gradient buffer, as stage 2). The
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

#include "runtime/train/strategy.h"
#include "runtime/train/strategy_zero3.h" /* stage 3's ops: zero.c dispatches to them */

extern const dt_strategy_ops dt_strategy_zero_ops;

/* What s holds (strategy.h's dt_strategy_mem), measured where it can be; any strategy. */
void dt_strategy_get_mem(dt_strategy *s, dt_strategy_mem *out);

struct dt_ddp_stats;
/* The ZeRO strategy's reducer figures (ddp.h's dt_ddp_stats: buckets, rebuilt, launches early
 * and late, shard size, resident gradients). -EINVAL when s is not the zero strategy. */
int dt_strategy_zero_stats(dt_strategy *s, struct dt_ddp_stats *out);

#endif
