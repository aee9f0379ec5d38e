/* sampler.h - which samples each rank reads: the distributed sampler (a per-epoch permutation,
 * a global position) and the arithmetic of a global batch (train.global_batch) over
 * data-parallel ranks and micro-steps; implemented in sampler.c. It knows sample indices only,
 * never the data (data.h, which includes this header, reads them). */
#ifndef DT_DATA_SAMPLER_H
#define DT_DATA_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

/* ---- the distributed sampler ----------------------------------------------------------------
 * Epoch e visits the samples in the order of a permutation seeded by (seed, e) (identity when
 * shuffle is off). The position is a GLOBAL index into that order: a step of world_size ranks
 * with batch_size samples each consumes positions [pos, pos + world_size*batch_size), and rank r
 * takes positions pos + r, pos + r + W, ... (interleaved, as PyTorch's DistributedSampler).
 * Because the state is (epoch, pos) and not per rank, a job resumed with another world size or
 * batch size continues exactly where it stopped, and no sample is seen twice in an epoch.
 *
 * End of epoch: with drop_last, a step that would run past the end starts the next epoch instead
 * (the tail is dropped); without it, the last step is completed with samples from the start of
 * the same permutation (each rank still gets batch_size samples), then the next epoch starts.
 */
/* ---- a global batch (train.global_batch) --------------------------------------------------
 * A step of G samples over W data-parallel ranks whose micro-batches hold at most B samples
 * each (B: the rank's batch). It runs in M = ceil(G / (W*B)) micro-steps, the fewest that hold
 * G, split as evenly as they go: micro-step m takes g_m = floor(G/M) samples, one more for the
 * first G mod M of them, and rank r takes floor(g_m/W) of those, one more when r < g_m mod W
 * (never more than B). Then every g_m >= W, so every rank runs all M micro-steps, unless B = 1
 * and W does not divide G: there an even split could leave a rank with nothing, so the
 * micro-steps are full (W samples) but the last, which takes the rest, and the ranks past the
 * rest run M-1 micro-steps (a rank's micro-steps are always a prefix 0..M_r-1). When W*B*M = G
 * every micro-step is W*B samples, B per rank: the layout of the plain sampler with
 * grad_accum = M. Every rank has at least one sample per step when G >= W.
 *
 * The gradient is the mean over exactly the G samples: a rank's micro-step of n samples
 * differentiates its mean loss times n*W/G, and DDP's all-reduce averages over the W ranks, so
 * the sum is (1/G) x the sum of the per-sample gradients whatever W and the shares are. */
typedef struct dt_gbatch {
    int64_t global;  /* G */
    int world;       /* W */
    int cap;         /* B: samples one rank's micro-step may hold */
    int micro_steps; /* M */
} dt_gbatch;

/* Fails (-EINVAL, naming the fix) when G < W: every rank needs a sample per step. */
int dt_gbatch_init(dt_gbatch *g, int64_t global, int world, int cap, dt_err *err);
/* g_m: the samples of micro-step m over all ranks. */
int64_t dt_gbatch_micro_size(const dt_gbatch *g, int m);
/* The offset of micro-step m's first sample within the step (sum of g_k, k < m). */
int64_t dt_gbatch_micro_offset(const dt_gbatch *g, int m);
/* Rank r's samples in micro-step m (0..B). */
int dt_gbatch_rank_count(const dt_gbatch *g, int m, int rank);
/* Rank r's micro-steps with samples (M_r: 1..M), and its samples per step (sum over m). */
int dt_gbatch_rank_micro_steps(const dt_gbatch *g, int rank);
int64_t dt_gbatch_rank_samples(const dt_gbatch *g, int rank);

typedef struct dt_sampler {
    int64_t n;           /* dataset size */
    int rank, world_size;
    int batch_size;      /* per rank */
    dt_gbatch gb;        /* global-batch mode when gb.global > 0 (dt_sampler_set_global) */
    uint64_t seed;
    bool shuffle, drop_last;
    int64_t epoch;       /* state: current epoch (0-based) */
    int64_t pos;         /* state: global position within the epoch's order */
    uint64_t *perm;      /* (n) order of the cached epoch, owned; NULL when !shuffle */
    int64_t perm_epoch;  /* epoch perm belongs to (-1 = none) */
} dt_sampler;

/* Fails when one step needs more samples than an epoch has with drop_last (the message says
 * how many there are and what to change). */
int dt_sampler_init(dt_sampler *s, int64_t n, int rank, int world_size, int batch_size,
                    uint64_t seed, bool shuffle, bool drop_last, dt_err *err);
void dt_sampler_free(dt_sampler *s);

/* Switches s to global-batch mode with g (g->world and g->cap must be s's world size and
 * batch size): then a step consumes exactly g->global positions and is drawn with
 * dt_sampler_next_step, not dt_sampler_next. With drop_last, fails when an epoch has fewer
 * samples than one step. End of epoch as in the plain mode, per step: with drop_last a step
 * that would run past the end starts the next epoch; without it the last step is completed
 * with samples from the start of the same order. */
int dt_sampler_set_global(dt_sampler *s, const dt_gbatch *g, dt_err *err);

/* Steps per epoch for the current world and batch size (in global-batch mode: for G). */
int64_t dt_sampler_steps_per_epoch(const dt_sampler *s);

/* Global-batch mode: writes this rank's sample indices of the next step, micro-step after
 * micro-step (dt_gbatch_rank_count(&s->gb, m, rank) of them for micro-step m, at most
 * M x batch_size in all), into idx and advances the position by exactly G. Fails on -ENOMEM,
 * or -EINVAL when s is not in global-batch mode. */
int dt_sampler_next_step(dt_sampler *s, int64_t *idx, dt_err *err);

/* Writes this rank's batch_size sample indices of the next step into idx and advances the
 * state (starting a new epoch first when the current one is done). Fails only on -ENOMEM. */
int dt_sampler_next(dt_sampler *s, int64_t *idx, dt_err *err);

/* Sets the state (from a checkpoint): any epoch >= 0 and 0 <= pos. A position at or past the
 * end simply starts the next epoch at the next call. */
void dt_sampler_set_state(dt_sampler *s, int64_t epoch, int64_t pos);

/* Indices of evaluation batch k (0-based) for rank r: a fixed, unshuffled walk through the
 * validation set, interleaved over ranks, wrapping around at the end. */
void dt_eval_indices(int64_t n, int rank, int world_size, int batch_size, int64_t k, int64_t *idx);

#endif
