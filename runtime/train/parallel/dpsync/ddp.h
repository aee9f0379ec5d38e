/* ddp.h - DistributedDataParallel: gradient synchronisation of one model replica per process.
 *
 * The reducer of PyTorch DDP, for dtrain's flat buffers:
 *   - at creation, every rank checks that it built the same model as rank 0 (parameter count,
 *     tensor names and shapes; the error says which tensor differs) and receives rank 0's
 *     parameters and buffers, so every replica starts identical whatever its seed;
 *   - gradients are grouped into buckets: contiguous slices of the flat gradient buffer (no
 *     copies), in reverse buffer order, which is the order backward finishes them; the first
 *     bucket is small (first_bucket_mb) so communication starts early, the others hold up to
 *     bucket_cap_mb; a tensor is never split;
 *   - backward reports each range as its gradients become final (dt_ddp_grad_ready, the model's
 *     grad-ready hook); a bucket whose last gradient is final is all-reduced (averaged) at once,
 *     asynchronously, while backward continues with earlier layers. Buckets are launched in
 *     bucket order on every rank (a bucket that completes early waits for its predecessors), so
 *     the collectives match across ranks whatever the hook's timing;
 *   - dt_ddp_finish, before the optimiser step, launches whatever was not reported (a model that
 *     reports nothing still trains correctly, only without overlap) and waits for every bucket;
 *   - after the first synchronised backward the buckets are rebuilt from the order in which the
 *     model reported its gradients, as PyTorch does after its first iteration, so that the last
 *     bucket holds only what backward finishes last (see rebuild() in ddp.c).
 * Gradient accumulation: pass the hook to the backward of the last micro-step only (no_sync for
 * the others); the earlier micro-steps just accumulate locally.
 *
 * Compression (ddp.compress = bf16 | fp16): each bucket is converted to 16 bits (pre-divided by
 * the world size, so an fp16 sum cannot overflow where the average would not) before the
 * all-reduce, and converted back after; the reduction itself accumulates in float32 on the CPU
 * collectives (NCCL sums in the 16-bit type); on CUDA the conversions are backend ops, so the
 * payloads stay in device memory.
 *
 * Low-bit compression (ddp.compress = int8 | 1bit, opts.lowbit): each bucket goes through
 * lowbit.h's quantised all-reduce instead (compressed chunks to their owners, summed in float32,
 * the averaged shard compressed again and all-gathered, decompressed alike on every rank), in
 * three stages pipelined over the buckets: a bucket's chunks are sent when it is launched (from
 * the hook, overlapping backward), its shard reduced and all-gathered when the next bucket is
 * launched (or in dt_ddp_finish), and decompressed into m->grads in dt_ddp_finish. While it is
 * off (dt_ddp_set_lowbit: 1bit's warm-up) buckets are all-reduced in float32 as without
 * compression. The buckets are not rebuilt (the quantisation blocks follow them, and a resumed
 * job must quantise as one that ran through), so gpt's tied embedding shares the last bucket
 * with the first blocks and that bucket is reduced after backward. Host memory only (the quantisers are the CPU reference) and not with sharding:
 * dt_ddp_create refuses both.
 *
 * Communicator memory: with more than one rank on a host-memory backend (device = cpu), the
 * all-reduced buffer (the flat gradients, or the 16-bit payloads when compressing) lives in the
 * communicator's memory (dt_comm_mem_alloc), so the ranks of a host reduce straight from each
 * other's gradients instead of staging copies. While the reducer lives the model accumulates
 * there: the reducer lends it that memory (model.h's dt_model_lend_grads) and gives the model's
 * own buffer's memory back meanwhile; dt_ddp_free gives the model its own buffer back, with the
 * current gradients.
 *
 * Sharding (opts.shard: ZeRO stages 1 and 2, see dpsync_zero12.c). Instead of all-reducing a
 * bucket, the reducer reduce-scatters it (averaged, or 16-bit with compress, as above) and each
 * rank keeps its shard of the result:
 *   - bucket b = [lo, hi) of n elements is cut into N chunks of c = ceil(n / N) elements; rank r
 *     owns [lo + r*c, min(lo + (r+1)*c, hi)) (empty for ranks past the end when n < N*c - c);
 *     the last chunk is padded to c: the reduce-scatter reads N*c elements from lo, up to N-1
 *     past hi, i.e. from the bucket above, whose sums land only in padding and are dropped
 *     (zeroed). The bucket at the end of the buffer is cut to a multiple of N (what it leaves
 *     goes to the next bucket), so no read leaves the buffer. The rebuild after the first
 *     backward moves the shards, so it waits for the caller (dt_ddp_relayout below);
 *   - the rank's chunks, packed in bucket order, form its shard layout: dt_ddp_shard_ranges
 *     gives them as optimiser ranges, and after dt_ddp_finish dt_ddp_shard_grads holds this
 *     rank's averaged gradients in that layout (the padding zero), while m->grads holds only
 *     this rank's own, unreduced gradients;
 *   - the reduction is the all-reduce's (comm_shm.c sums every element in rank order whichever
 *     rank sums it), so on one host a shard holds the bits DDP's all-reduce gives; between
 *     hosts (the TCP ring, hierarchical) the order differs and so may the last bits;
 *   - dt_ddp_gather_params all-gathers the updated chunks into every rank's m->params, in place,
 *     bucket after bucket from the end of the buffer (a chunk's padding then reads, and writes
 *     back, values of the bucket above that every rank already holds alike);
 *   - opts.release (ZeRO-2, any backend): gradient memory goes back through the backend's
 *     mem_release / mem_commit (backend_ops.h: a released granule is inaccessible until
 *     committed, and a commit gives undefined contents), in granules of dt_mem_granule(m->grads)
 *     (0: nothing goes back, and the figures say so). The reducer installs the model's block
 *     hook (model.h): at a block's first BEFORE_BACKWARD since the buffer went back, the
 *     block's gradient range is committed and zeroed, exactly that range (memset_zero), so
 *     backward accumulates into zeros; its later windows (a tied block, the micro-steps of an
 *     accumulation) find it as they left it. With compress, a bucket's 16-bit payloads are
 *     committed before to_half writes them. Once a bucket's reduce-scatter is done, the
 *     granules lying wholly inside its range (and the one it shares with the buckets above,
 *     all done by then) go back, except what the padded read of the bucket below still
 *     reaches; from the hook, a bucket is waited for and released when the bucket two after it
 *     is launched, so about two buckets are in flight; dt_ddp_finish gives everything back.
 *     The resident bytes are the allocator's statistics, read around each release and commit
 *     (nothing becomes resident otherwise): see dt_ddp_stats.grads_resident_peak. A caller that
 *     replaces the block hook must call the reducer's from its own.
 *
 * All calls come from the thread that runs backward (the hook) and the trainer's thread, which
 * are the same thread in dtrain's worker.
 */
#ifndef DT_DDP_H
#define DT_DDP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "runtime/comm/comm.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"
#include "runtime/train/optim.h"

typedef struct dt_ddp_opts {
    double bucket_cap_mb;   /* bucket size in MiB (25) */
    double first_bucket_mb; /* size of the first bucket in MiB (1) */
    dt_dtype compress;      /* payload dtype: DT_FLOAT32 = no compression */
    bool broadcast_buffers; /* dt_ddp_finish also broadcasts the model's buffers from rank 0 */
    bool check_consistency; /* compare the model across ranks at creation */
    bool shard;             /* reduce-scatter instead of all-reduce (ZeRO; see "Sharding") */
    bool release;           /* shard: give back a bucket's gradient memory once reduced */
    int lowbit;             /* 0, or lowbit.h's DT_LOWBIT_INT8 / DT_LOWBIT_1BIT (compress is
                               then DT_FLOAT32: see "Low-bit compression") */
    int64_t lowbit_warmup;  /* ddp.compress_warmup_steps: the sync's caller turns the low-bit
                               path on once this many updates are done (dt_ddp_set_lowbit) */
    bool lowbit_stochastic; /* ddp.compress_stochastic (int8): stochastic rounding, drawn from
                               (lowbit_seed, the step dt_ddp_set_lowbit gives, bucket, chunk,
                               rank) */
    uint64_t lowbit_seed;   /* job.seed */
} dt_ddp_opts;

void dt_ddp_opts_default(dt_ddp_opts *o);

/* The [ddp] keys of job. -EINVAL on an unknown compress value. */
int dt_ddp_opts_from_job(dt_ddp_opts *o, const dt_job *job, dt_err *err);

typedef struct dt_ddp dt_ddp;

/* What the reducer did, for metrics and benchmarks. */
typedef struct dt_ddp_stats {
    int num_buckets;
    size_t largest_bucket;   /* elements */
    bool rebuilt;            /* buckets rebuilt from the first backward's ready order */
    uint64_t syncs;          /* completed dt_ddp_finish calls */
    uint64_t bucket_syncs;   /* buckets synchronised over all syncs (the launches due) */
    uint64_t launched_early; /* buckets launched from the hook (overlapped with backward) */
    uint64_t launched_late;  /* buckets launched by dt_ddp_finish (not overlapped) */
    double wait_s;           /* total time dt_ddp_finish spent waiting */
    bool comm_memory;        /* the buckets all-reduce communicator memory (see above) */
    size_t shard_numel;      /* shard: elements of this rank's shard layout (padding included) */
    size_t grads_resident_peak; /* release: most bytes of m->grads (and of the 16-bit payloads
                                   when compressing) resident, as the allocator counts them,
                                   seen at every commit (where they grow) since the last
                                   dt_ddp_release_grads (the accumulation's micro-steps
                                   included: their gradients stay resident) */
    size_t grads_resident;   /* release: bytes of m->grads resident now (after the last
                                finish or release: the partial granules at its ends) */
    size_t payload_bytes;    /* shard: bytes of the 16-bit payload buffers held (release: the
                                resident part of the whole-buffer one), 0 without compress */
    uint64_t comm_bytes;     /* bytes this rank sent for the gradients of the last sync, from
                                its first bucket's launch to the last bucket's wait in
                                dt_ddp_finish, as the communicator counted them
                                (dt_comm_stats.sent_bytes: wire bytes, not sizes) */
    uint64_t comm_bytes_total; /* the same summed over every sync */
    uint64_t lowbit_syncs;   /* syncs that went through the low-bit all-reduce */
} dt_ddp_stats;

/* Creates the reducer of model m over comm c (both borrowed; they outlive it: free the reducer
 * first, see "Communicator memory" above), checks the model
 * against rank 0's (when o->check_consistency) and broadcasts rank 0's parameters and buffers.
 * Every rank must call it. opts may be NULL for the defaults. Fails with -EPROTO and a message
 * naming what differs when the models do not match. */
int dt_ddp_create(dt_ddp **out, dt_model *m, dt_comm *c, const dt_ddp_opts *opts, dt_err *err);

/* Waits for anything in flight; gives the model its own gradient buffer back. Accepts NULL. */
void dt_ddp_free(dt_ddp *d);

/* The grad-ready hook (dt_grad_ready_fn) to pass to the model's backward with ctx = the dt_ddp:
 * grads[offset, offset+numel) are final for this backward. Never fails by itself: an error is
 * kept and returned by dt_ddp_finish. */
void dt_ddp_grad_ready(void *ctx, size_t offset, size_t numel);

/* Launches the buckets not launched yet, waits for all of them, converts compressed buckets
 * back, and (broadcast_buffers) broadcasts the buffers from rank 0. Afterwards m->grads holds
 * the gradients averaged over ranks, and the reducer is ready for the next backward. */
int dt_ddp_finish(dt_ddp *d, dt_err *err);

/* Mean of v[0..n) over ranks (float64 on the wire, summed in double: eval counts stay exact to
 * 2^53; for metrics: losses, eval sums). */
int dt_ddp_average(dt_ddp *d, double *v, int n, dt_err *err);

void dt_ddp_get_stats(const dt_ddp *d, dt_ddp_stats *s);

/* opts.lowbit: whether the next sync (the buckets the next backward hands over) goes through the
 * low-bit all-reduce (on) or float32 (off: 1bit's warm-up), and its step (the optimiser's
 * update count: what stochastic rounding draws from). Set it before that backward, alike on
 * every rank; ignored without opts.lowbit. Created on, at step 0. */
void dt_ddp_set_lowbit(dt_ddp *d, bool on, int64_t step);

/* The low-bit all-reduce (lowbit.h) of opts.lowbit, or NULL: 1bit's residuals for checkpoints. */
struct dt_lowbit *dt_ddp_lowbit(dt_ddp *d);

/* ---- sharding (opts.shard) ---- */

/* This rank's ranges of the parameter buffer, as optimiser ranges (at = offset in the shard
 * layout), one per bucket (some may be empty): *ranges borrowed from the reducer, *n of them;
 * *numel = elements of the shard layout. */
void dt_ddp_shard_ranges(const dt_ddp *d, const dt_optim_range **ranges, int *n, size_t *numel);

/* The rebuild (see above) in sharding mode: after the first synchronised backward the buckets
 * would move, and the shards with them, but this backward's shard and the optimiser's state are
 * in the old layout. So dt_ddp_finish only plans it, and the caller applies it once the
 * optimiser stepped on the old layout: keep the old ranges (dt_ddp_shard_ranges),
 * dt_ddp_relayout (buckets, ranges and the gradient shard anew: ranges and shard pointers given
 * before are stale), then move what lives in the old layout to the new one (dpsync_zero12.c's
 * relayout does it through a bounded window). */
bool dt_ddp_relayout_pending(const dt_ddp *d);
int dt_ddp_relayout(dt_ddp *d, dt_err *err);

/* This rank's averaged gradients in the shard layout (backend memory, shard numel), valid after
 * dt_ddp_finish until the next backward's hook. */
float *dt_ddp_shard_grads(dt_ddp *d);

/* All-gathers every rank's ranges of m->params into every rank's m->params (after the
 * optimiser updated this rank's). Collective. */
int dt_ddp_gather_params(dt_ddp *d, dt_err *err);

/* shard (shard numel) = this rank's ranges of full (num_params); the padding is zeroed. Local. */
void dt_ddp_slice_shard(dt_ddp *d, const float *full, float *shard);

/* Sum over the ranks of one double per rank, exactly the same on every rank (every rank's value
 * is gathered and they are added in rank order, in double). Collective. */
int dt_ddp_sum_double(dt_ddp *d, double v, double *sum, dt_err *err);

/* release: gives back m->grads (and the 16-bit payloads); each block's gradients are committed
 * and zeroed at its next BEFORE_BACKWARD, so the next backward accumulates into zeros (the start
 * of an accumulation, without touching the buffer now). */
void dt_ddp_release_grads(dt_ddp *d);

#endif
