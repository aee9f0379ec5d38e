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
 * Communicator memory: with more than one rank on a host-memory backend (device = cpu), the
 * all-reduced buffer (the flat gradients, or the 16-bit payloads when compressing) lives in the
 * communicator's memory (dt_comm_mem_alloc), so the ranks of a host reduce straight from each
 * other's gradients instead of staging copies. While the reducer lives, m->grads points there;
 * dt_ddp_free puts the model's own buffer back, with the current gradients.
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
#include "runtime/train/model.h"

typedef struct dt_ddp_opts {
    double bucket_cap_mb;   /* bucket size in MiB (25) */
    double first_bucket_mb; /* size of the first bucket in MiB (1) */
    dt_dtype compress;      /* payload dtype: DT_FLOAT32 = no compression */
    bool broadcast_buffers; /* dt_ddp_finish also broadcasts the model's buffers from rank 0 */
    bool check_consistency; /* compare the model across ranks at creation */
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

#endif
