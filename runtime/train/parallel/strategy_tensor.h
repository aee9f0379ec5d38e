/* strategy_tensor.h - Megatron-style tensor parallelism (parallel.tensor = T > 1), composed with
 * a data-parallel sync (DDP or ZeRO 1-3) over the data-parallel groups (D = world / T > 1).
 *
 * The world is laid out by grid.h (rank = dp * T + tp, P = 1): the T consecutive ranks of a
 * tensor group each hold 1/T of every attention and MLP block and of the vocabulary (the gpt
 * model, built with cfg.tp_size = T and cfg.tp_rank = tp over the tensor group's communicator,
 * runs Megatron's column/row splits and all-reduces inside forward and backward, see model.h);
 * the D ranks of a data-parallel group hold the same slices and all-reduce their gradients with
 * ddp.c's reducer (buckets overlapped with backward, no_sync on the accumulation's earlier
 * micro-steps), exactly as DDP does over the world. Every rank of a tensor group draws the same
 * samples (the sampler shards by the data-parallel coordinate).
 *
 *   open        world communicator, grid and groups (the tensor group is the world itself when
 *               D = 1), backend, model (tp slices), optimiser over the local slices, checkpoint
 *               staging (whole tensors), and the whole initial parameters gathered into it
 *   start       every local tensor sliced from the staging (what a load put there, or the
 *               initial parameters), then (D > 1) the reducer over the data-parallel group,
 *               which broadcasts its rank 0's slices
 *   clip        the global norm: sqrt(sum over the tensor group of the split tensors' squares +
 *               the replicated tensors' squares counted once), one all-reduce of a double
 *   average     over the world (the ranks of a tensor group hold the same loss, so the mean is
 *               the data-parallel mean, and a stop flag raised on any rank reaches every rank)
 *   state       whole tensors under the usual names and shapes (the model's and every optimiser
 *               state's), in full-size staging; gather_state all-gathers each buffer over the
 *               tensor group and assembles the whole tensors (dt_tensor_tp_copy)
 *
 * So a checkpoint written at T = 2 is the one T = 1 (or DDP) writes, and resumes at any T, any
 * world, and in PyTorch as a normal GPT-2.
 *
 * Over the data-parallel group the layout holds a data-parallel sync (dpsync.h; the registry
 * picks it from parallel.zero): DDP as above, ZeRO-1/2 (each rank reduce-scatters its slices'
 * gradients with its data-parallel peers, updates its shard of them, all-gathers the updated
 * slices; the norm adds the shards over dp before the tensor group) or ZeRO-3 (the slices
 * themselves sharded, gathered block by block around their use). Checkpoints gather over dp,
 * then over the tensor group, so they are whole tensors as above.
 *
 * Sequence parallelism (parallel.sequence_parallel) is the model's: open passes the flag in the
 * model config and gpt.c does the rest (its LayerNorm gradients are all-reduced inside backward).
 *
 * What it leaves out: pipeline stages (parallel.pipeline > 1 is the pipeline strategy's) and
 * models other than gpt.
 */
#ifndef DT_STRATEGY_TENSOR_H
#define DT_STRATEGY_TENSOR_H

#include "runtime/train/parallel/strategy.h"

extern const dt_strategy_ops dt_strategy_tensor_ops;

#endif
