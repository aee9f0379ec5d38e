/* dpsync_zero12.c - ZeRO stages 1 and 2 as a data-parallel sync (dpsync.h's zero-1 and zero-2,
 * parallel.zero = 1 | 2): data parallelism with the optimiser state (stage 1) and the gradients
 * too (stage 2) sharded across the ranks, as DeepSpeed's ZeRO stages 1 and 2 and PyTorch's
 * ZeroRedundancyOptimizer / FSDP SHARD_GRAD_OP.
 *
 * Over a data-parallel group of N ranks holding the same model (the world, or grid.h's dp
 * group of a tensor or pipeline layout), as DDP; what differs is who holds what (ddp.h,
 * "Sharding", has the layout):
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
 *     (GPT's tied embedding gets the last bucket to itself); the shards move with them, once,
 *     at the end of the first update: the optimiser state window by window of the model's
 *     layout through one buffer of at most ctx.io_buffer bytes (each rank puts what its old
 *     shard holds of the window there, zeros elsewhere; a sum over the group, exact since the
 *     old shards tile the model once; each rank takes its new ranges of it), one state at a
 *     time, by way of the new gradient shard (dead until the next finish): nothing more is
 *     resident than the window;
 *   - finish's wait is the wait for the reduce-scatters, as DDP's; the parameters' all-gather
 *     in step counts in the step time only;
 *   - a tensor held for another group (hold: the pipeline's tied embedding, which the first
 *     and the last stage both hold and whose replicas shard it differently, their buckets
 *     differing) is left out of the ranges the hook passes on; finish has the layout sum it
 *     first, then hands it to the reducer (the buckets after it wait, strictly in order).
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
 * Checkpoint state: local(1 + i) is a full-size staging of optimiser state i in the model's
 * layout (backend memory, resident only while used: given back with mem_release
 * where the backend can); gather_state commits and fills them (all-gather of the shards) before
 * a save and optim_step gives them back after it; after a load, start takes this rank's slice
 * and gives them back. So a checkpoint written at any stage and world size resumes at any other.
 * owned(k) is this rank's chunk of every bucket: the parameters where they live in the model's
 * buffer, the state in the optimiser's shard.
 *
 * A rank that dies mid reduce-scatter or all-gather fails the step with the comm layer's error
 * (naming the collective, its sequence number and the rank) within ddp.timeout.
 */
#include "runtime/train/parallel/dpsync/dpsync_zero12.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

typedef struct zero_impl {
    dt_ddp *ddp;                         /* the reducer (sharding mode), owned */
    int stage;                           /* 1 or 2 */
    float *full[DT_OPTIM_MAX_STATES];    /* (num_params, and up to the granule's next multiple)
                                            checkpoint staging per state: backend memory
                                            charged as DT_MEM_OTHER, owned */
    size_t full_bytes;                   /* bytes of each full[] allocation */
    bool resident;                       /* full[] are committed: usable, and counted */
    size_t held;                         /* bytes of full[] resident, as the allocator's
                                            statistics count them */
    int *hold;                           /* (nhold) tensors summed elsewhere first (hold) */
    int nhold;
    size_t window;                       /* floats of the relayout's buffer */
} zero_impl;

/* The allocator's resident bytes now (all categories: what one release or commit changes). */
static size_t total_now(dt_backend *be)
{
    dt_mem_stats st;
    dt_mem_read(be, &st);
    return st.total;
}

/* Full-size staging of the optimiser state for checkpoints, backend memory: zeroed (alloc's
 * contract: what start slices when nothing was loaded) and resident until start took this
 * rank's slice, then given back (mem_release) between a save or a load and the next update.
 * Each buffer is a whole number of granules where the backend gives memory back, so that
 * nothing of it stays resident once released. */
static int alloc_staging(dt_dpsync *y, zero_impl *z, dt_err *err)
{
    dt_backend *be = y->be;
    int rc = 0;
    z->full_bytes = y->model->num_params * sizeof(float);
    dt_mem_cat old = dt_mem_tag(be, DT_MEM_OTHER); /* checkpoint staging */
    for (int i = 0; i < y->optim->num_states && !rc; i++) {
        if ((rc = be->alloc(be, (void **)&z->full[i], z->full_bytes ? z->full_bytes : 1, err)))
            break;
        size_t g = dt_mem_granule(be, z->full[i]);
        if (i == 0 && g && z->full_bytes % g) { /* once more, rounded up to the granule */
            be->free(be, z->full[i]);
            z->full[i] = NULL;
            z->full_bytes = (z->full_bytes / g + 1) * g;
            rc = be->alloc(be, (void **)&z->full[i], z->full_bytes, err);
        }
    }
    dt_mem_tag(be, old);
    if (rc)
        return dt_err_prefix(err, "ZeRO: checkpoint staging: ");
    z->held = z->full_bytes * (size_t)y->optim->num_states;
    z->resident = true;
    return 0;
}

/* The staging becomes usable again before a save or a relayout writes all of it (its contents
 * are undefined until then). */
static int commit_staging(dt_dpsync *y, zero_impl *z, dt_err *err)
{
    dt_backend *be = y->be;
    if (z->resident || !be->mem_commit)
        return 0;
    for (int i = 0; i < y->optim->num_states; i++) {
        size_t before = total_now(be);
        int rc = be->mem_commit(be, z->full[i], 0, z->full_bytes, err);
        size_t after = total_now(be);
        z->held += after > before ? after - before : 0;
        if (rc)
            return dt_err_prefix(err, "ZeRO: checkpoint staging: ");
    }
    z->resident = true;
    return 0;
}

/* The staging's memory goes back (nothing reads it before the next commit_staging). */
static void release_staging(dt_dpsync *y, zero_impl *z)
{
    dt_backend *be = y->be;
    if (!z->resident || !be->mem_release)
        return;
    for (int i = 0; i < y->optim->num_states; i++) {
        size_t before = total_now(be);
        be->mem_release(be, z->full[i], 0, z->full_bytes);
        size_t after = total_now(be), n = before > after ? before - after : 0;
        z->held -= DT_MIN(n, z->held);
    }
    z->resident = false;
}

static int zero_open(dt_dpsync *y, const dt_dpsync_ctx *ctx, dt_err *err)
{
    int stage = y->ops->zero_stage;
    zero_impl *z = calloc(1, sizeof *z);
    if (!z)
        return dt_err_set(err, -ENOMEM, "out of memory");
    y->impl = z;
    z->stage = stage;
    z->window = (ctx->io_buffer ? ctx->io_buffer : (size_t)64 << 20) / sizeof(float);
    snprintf(y->label, sizeof y->label, "ZeRO-%d", stage);
    y->sharded = true;
    dt_ddp_opts o = *ctx->ddp;
    o.shard = true;
    o.release = stage == 2;
    int rc = dt_ddp_create(&z->ddp, y->model, y->dp, &o, err);
    if (rc)
        return rc;
    const dt_optim_range *ranges;
    int nr;
    size_t numel;
    dt_ddp_shard_ranges(z->ddp, &ranges, &nr, &numel);
    const dt_model *m = y->model;
    if ((rc = dt_optim_create_ranges(&y->optim, ctx->optim, y->be, m->tensors, m->num_tensors,
                                     m->num_params, ranges, nr, numel, err)) ||
        (rc = alloc_staging(y, z, err)))
        return rc;
    if (ctx->announce)
        DT_INFO("ZeRO stage %d: %zu parameters, this rank's shard %zu (%.1f%%), optimiser state "
                "%.2f MB per rank (%.2f MB whole)",
                stage, m->num_params, numel, 100.0 * (double)numel / (double)m->num_params,
                (double)numel * 4 * y->optim->num_states / 1e6,
                (double)m->num_params * 4 * y->optim->num_states / 1e6);
    return 0;
}

static float *local_state(dt_dpsync *y, zero_impl *z, int i)
{
    dt_err err = {0};
    if (commit_staging(y, z, &err)) /* only after start: a load writes while it is resident */
        DT_WARN("%s", err.msg);
    return z->full[i];
}

/* Each state's shard = this rank's slice of the staging (zeros when nothing was written
 * there); then the staging goes back (mem_release). Local. */
static void take_state(dt_dpsync *y, zero_impl *z)
{
    dt_optim *o = y->optim;
    for (int i = 0; i < o->num_states; i++)
        dt_ddp_slice_shard(z->ddp, z->full[i], o->states[i].buf);
    release_staging(y, z);
}

/* Group rank 0's parameters and buffers, as DDP (the reducer took them at open, before a
 * load); this rank's slice of what a load put in the staging (zeros when nothing was). */
static int zero_start(dt_dpsync *y, dt_err *err)
{
    zero_impl *z = y->impl;
    dt_model *m = y->model;
    int rc;
    if ((rc = dt_comm_broadcast(y->dp, m->params, m->num_params, DT_FLOAT32, 0, NULL, err)))
        return dt_err_prefix(err, "ZeRO: broadcasting rank 0's parameters: ");
    if (m->num_buffers &&
        (rc = dt_comm_broadcast(y->dp, m->buffers, m->num_buffers, DT_FLOAT32, 0, NULL, err)))
        return dt_err_prefix(err, "ZeRO: broadcasting rank 0's buffers: ");
    take_state(y, z);
    return 0;
}

static void zero_zero_grads(dt_dpsync *y)
{
    zero_impl *z = y->impl;
    if (z->stage == 2)
        dt_ddp_release_grads(z->ddp); /* each block is committed and zeroed before its backward */
    else
        y->be->memset_zero(y->be, y->model->grads, sizeof(float) * y->model->num_params);
}

/* Every final range to the reducer, but the parts that are held tensors (finish reports them
 * once the layout summed them). */
static void zero_grad_ready(dt_dpsync *y, size_t offset, size_t numel)
{
    zero_impl *z = y->impl;
    if (!z->nhold) {
        dt_ddp_grad_ready(z->ddp, offset, numel);
        return;
    }
    const dt_model *m = y->model;
    size_t lo = offset, hi = offset + numel;
    while (lo < hi) {
        size_t cut = hi, next = hi; /* [lo, cut) is passed on, [cut, next) held back */
        for (int i = 0; i < z->nhold; i++) {
            const dt_tensor_info *ti = &m->tensors[z->hold[i]];
            size_t a = ti->offset, b = ti->offset + ti->numel;
            if (b <= lo || a >= hi || a >= cut)
                continue;
            cut = DT_MAX(a, lo);
            next = DT_MIN(b, hi);
        }
        if (cut > lo)
            dt_ddp_grad_ready(z->ddp, lo, cut - lo);
        lo = next;
    }
}

static int zero_hold(dt_dpsync *y, int tensor, dt_err *err)
{
    zero_impl *z = y->impl;
    int *h = realloc(z->hold, sizeof *h * (size_t)(z->nhold + 1));
    if (!h)
        return dt_err_set(err, -ENOMEM, "out of memory");
    z->hold = h;
    z->hold[z->nhold++] = tensor;
    return 0;
}

/* The held tensors summed by the layout first (on this rank's own gradients), handed to the
 * reducer then; then its reduce-scatters are waited for. */
static int zero_finish(dt_dpsync *y, dt_dpsync_sum_fn sum, void *ctx, double *wait_s,
                       dt_err *err)
{
    zero_impl *z = y->impl;
    int rc = sum ? sum(ctx, err) : 0;
    for (int i = 0; i < z->nhold && !rc; i++) {
        const dt_tensor_info *ti = &y->model->tensors[z->hold[i]];
        dt_ddp_grad_ready(z->ddp, ti->offset, ti->numel);
    }
    if (rc)
        return rc;
    double t0 = dt_now_s();
    rc = dt_ddp_finish(z->ddp, err);
    *wait_s = dt_now_s() - t0;
    return rc;
}

static int zero_average(dt_dpsync *y, double *v, int n, dt_err *err)
{
    return dt_ddp_average(((zero_impl *)y->impl)->ddp, v, n, err);
}

/* This rank's averaged gradient shard after finish (backend memory), and its elements. */
static float *shard_grads(dt_dpsync *y, size_t *numel)
{
    *numel = y->optim->state_numel;
    return dt_ddp_shard_grads(((zero_impl *)y->impl)->ddp);
}

static void zero_scale(dt_dpsync *y, float f)
{
    size_t n;
    float *g = shard_grads(y, &n);
    y->be->scale(y->be, g, n, f);
}

/* Each rank's sum of squares of its shard (the padding is zero), or of the parts of it that
 * lie in counted tensors (one sumsq per run of them inside a range), then the ranks' sums added
 * in rank order on every rank. */
static int zero_sumsq(dt_dpsync *y, const unsigned char *counted, double *sum, dt_err *err)
{
    zero_impl *z = y->impl;
    const dt_model *m = y->model;
    dt_backend *be = y->be;
    size_t n;
    const float *g = shard_grads(y, &n);
    double mine = 0;
    if (!counted) {
        mine = be->sumsq(be, g, n);
    } else {
        const dt_optim_range *ranges;
        int nr;
        size_t numel;
        dt_ddp_shard_ranges(z->ddp, &ranges, &nr, &numel);
        for (int r = 0; r < nr; r++) {
            size_t lo = ranges[r].off, hi = lo + ranges[r].n, from = lo, to = lo;
            for (int t = 0; t < m->num_tensors && lo < hi; t++) { /* tensors in buffer order */
                const dt_tensor_info *ti = &m->tensors[t];
                size_t a = DT_MAX(ti->offset, lo), b = DT_MIN(ti->offset + ti->numel, hi);
                if (a >= b)
                    continue;
                if (counted[t] && a == to) { /* extends the run */
                    to = b;
                    continue;
                }
                if (to > from)
                    mine += be->sumsq(be, g + ranges[r].at + (from - lo), to - from);
                from = a;
                to = counted[t] ? b : a;
            }
            if (to > from)
                mine += be->sumsq(be, g + ranges[r].at + (from - lo), to - from);
        }
    }
    return dt_ddp_sum_double(z->ddp, mine, sum, err);
}

/* win (b - a floats) = elements [a, b) of the model's layout of what a shard src (ranges
 * od[0..nod)) holds, zeros elsewhere. Local. */
static void fill_window(dt_backend *be, float *win, size_t a, size_t b, const dt_optim_range *od,
                        int nod, const float *src)
{
    be->memset_zero(be, win, (b - a) * sizeof(float));
    for (int k = 0; k < nod; k++) {
        size_t lo = DT_MAX(a, od[k].off), hi = DT_MIN(b, od[k].off + od[k].n);
        if (lo < hi)
            be->memcpy_d2d(be, win + (lo - a), src + od[k].at + (lo - od[k].off),
                           (hi - lo) * sizeof(float));
    }
}

/* dst (the new layout's ranges nw[0..nnw)) = src (the old's, od[0..nod)) over the group, window
 * by window of the model's layout through win (window floats): each rank's old pieces of the
 * window, zeros elsewhere, summed (every element is one rank's: exact), then each rank's new
 * pieces taken. dst's padding is zeroed. Collective over the group. */
static int move_state(dt_dpsync *y, const dt_optim_range *od, int nod, const float *src,
                      const dt_optim_range *nw, int nnw, size_t numel, float *dst, float *win,
                      size_t window, dt_err *err)
{
    dt_backend *be = y->be;
    size_t total = y->model->num_params;
    be->memset_zero(be, dst, numel * sizeof(float));
    for (size_t a = 0; a < total; a += window) {
        size_t b = DT_MIN(total, a + window);
        fill_window(be, win, a, b, od, nod, src);
        int rc = dt_comm_allreduce(y->dp, win, b - a, DT_FLOAT32, DT_SUM, NULL, err);
        if (rc)
            return rc;
        for (int k = 0; k < nnw; k++) {
            size_t lo = DT_MAX(a, nw[k].off), hi = DT_MIN(b, nw[k].off + nw[k].n);
            if (lo < hi)
                be->memcpy_d2d(be, dst + nw[k].at + (lo - nw[k].off), win + (lo - a),
                               (hi - lo) * sizeof(float));
        }
    }
    return 0;
}

/* The reducer rebuilt its buckets from the first backward's ready order (ddp.h): the state
 * moves from the old shards to the new ones, one state at a time through a bounded window
 * (move_state), never through whole-size staging: into the new gradient shard (the new
 * layout's size, and dead until the next finish writes it), then the old state's buffer goes
 * and the new one takes a copy. So nothing more is resident at any time than the window. */
static int relayout(dt_dpsync *y, zero_impl *z, dt_err *err)
{
    dt_optim *o = y->optim;
    dt_backend *be = y->be;
    const dt_optim_range *r;
    int nold, nnew, rc = 0;
    size_t numel, window = DT_MAX((size_t)1, DT_MIN(z->window, y->model->num_params));
    dt_ddp_shard_ranges(z->ddp, &r, &nold, &numel);
    dt_optim_range *old = malloc(sizeof *old * (size_t)(nold ? nold : 1));
    float *fresh[DT_OPTIM_MAX_STATES] = {0}, *win = NULL;
    if (!old)
        return dt_err_set(err, -ENOMEM, "out of memory");
    memcpy(old, r, sizeof *old * (size_t)nold);
    if ((rc = dt_ddp_relayout(z->ddp, err)))
        goto out;
    dt_ddp_shard_ranges(z->ddp, &r, &nnew, &numel);
    float *via = dt_ddp_shard_grads(z->ddp); /* (numel) */
    dt_mem_cat cat = dt_mem_tag(be, DT_MEM_OTHER); /* the I/O buffer */
    rc = be->alloc(be, (void **)&win, window * sizeof(float), err);
    dt_mem_tag(be, cat);
    for (int i = 0; i < o->num_states && !rc; i++) {
        if ((rc = move_state(y, old, nold, o->states[i].buf, r, nnew, numel, via, win, window,
                             err)))
            break;
        be->free(be, o->states[i].buf);
        o->states[i].buf = NULL;
        cat = dt_mem_tag(be, DT_MEM_OPTIM);
        rc = be->alloc(be, (void **)&fresh[i], numel * sizeof(float), err);
        dt_mem_tag(be, cat);
        if (!rc)
            be->memcpy_d2d(be, fresh[i], via, numel * sizeof(float));
    }
    if (!rc && (rc = dt_optim_set_ranges(o, r, nnew, numel, fresh, err)) == 0)
        memset(fresh, 0, sizeof fresh);
out:
    for (int i = 0; i < DT_OPTIM_MAX_STATES; i++)
        if (fresh[i])
            be->free(be, fresh[i]);
    if (win)
        be->free(be, win);
    free(old);
    return rc ? dt_err_prefix(err, "ZeRO: moving the optimiser state to the rebuilt buckets: ")
              : 0;
}

/* The update of the shard at lr, then the all-gather of the updated parameters over the group;
 * after the first step, the move of the shards to the rebuilt buckets. */
static int zero_step(dt_dpsync *y, double lr, dt_err *err)
{
    zero_impl *z = y->impl;
    release_staging(y, z); /* the trainer fenced the last save's copy before this */
    dt_optim_step(y->optim, y->model->params, dt_ddp_shard_grads(z->ddp), lr);
    int rc = dt_ddp_gather_params(z->ddp, err);
    if (rc)
        return dt_err_prefix(err, "ZeRO: gathering the updated parameters: ");
    return dt_ddp_relayout_pending(z->ddp) ? relayout(y, z, err) : 0;
}

static float *zero_local(dt_dpsync *y, int k)
{
    return k == 0 ? y->model->params : local_state(y, y->impl, k - 1);
}

/* local(1 + i) = every rank's shard of state i put in place, on group rank 0 only: the one
 * that writes a whole-tensor checkpoint (world rank 0), and whose peers in the tensor and
 * pipeline layouts' gathers are group rank 0 of their groups too (the grid puts dp innermost
 * but for tp); the other ranks' local(1 + i) are left as they are. Window by window of the
 * model's layout (at most io_buffer): each rank's pieces of the window, zeros elsewhere, summed
 * to rank 0 (exact: every element is one rank's), into its staging; the others take part
 * through one window buffer and hold nothing whole. Collective over the group. */
static int zero_gather_state(dt_dpsync *y, dt_err *err)
{
    zero_impl *z = y->impl;
    dt_optim *o = y->optim;
    dt_backend *be = y->be;
    bool root = y->rank == 0;
    size_t total = y->model->num_params, window = DT_MAX((size_t)1, DT_MIN(z->window, total));
    float *win = NULL;
    int rc = root ? commit_staging(y, z, err) : 0;
    if (!rc && !root) {
        dt_mem_cat cat = dt_mem_tag(be, DT_MEM_OTHER); /* the I/O buffer */
        rc = be->alloc(be, (void **)&win, window * sizeof(float), err);
        dt_mem_tag(be, cat);
    }
    const dt_optim_range *r;
    int nr;
    size_t numel;
    dt_ddp_shard_ranges(z->ddp, &r, &nr, &numel);
    for (int i = 0; i < o->num_states && !rc; i++)
        for (size_t a = 0; a < total && !rc; a += window) {
            size_t b = DT_MIN(total, a + window);
            float *w = root ? z->full[i] + a : win;
            fill_window(be, w, a, b, r, nr, o->states[i].buf);
            if ((rc = dt_comm_reduce(y->dp, w, b - a, DT_FLOAT32, DT_SUM, 0, NULL, err)))
                dt_err_prefix(err, "ZeRO: gathering %s: ", o->states[i].name);
        }
    if (win)
        be->free(be, win);
    return rc;
}

/* This rank's chunk of every bucket: the parameters in the model's buffer, the state in the
 * optimiser's shard layout. */
static int zero_owned(dt_dpsync *y, int k, dt_dpsync_piece *out, int cap, int *n)
{
    zero_impl *z = y->impl;
    const dt_optim_range *ranges;
    int nr;
    size_t numel;
    dt_ddp_shard_ranges(z->ddp, &ranges, &nr, &numel);
    int c = 0;
    for (int r = 0; r < nr; r++) {
        if (!ranges[r].n)
            continue;
        if (c < cap)
            out[c] = (dt_dpsync_piece){
                ranges[r].off, ranges[r].n,
                k == 0 ? y->model->params + ranges[r].off
                       : y->optim->states[k - 1].buf + ranges[r].at};
        c++;
    }
    *n = c;
    return c > cap ? -ENOSPC : 0;
}

/* The whole figures, then what the shards change: gradients (stage 2: the resident bytes and
 * their peak, + the shard), the 16-bit payloads, the staging held. */
static void zero_mem(dt_dpsync *y, dt_dpsync_mem *out)
{
    zero_impl *z = y->impl;
    dt_dpsync_mem_whole(y->model, y->optim, out);
    dt_ddp_stats st;
    dt_ddp_get_stats(z->ddp, &st);
    size_t shard = st.shard_numel * sizeof(float);
    out->zero_stage = z->stage;
    out->comm = st.payload_bytes;
    if (z->stage == 2) {
        out->grads = st.grads_resident + shard;
        out->grads_peak = DT_MAX(st.grads_resident_peak, st.grads_resident) + shard;
    } else {
        out->grads = out->grads_peak = y->model->num_params * sizeof(float) + shard;
    }
    out->ckpt_staging = z->held;
}

static int zero_stats(dt_dpsync *y, dt_ddp_stats *out)
{
    zero_impl *z = y->impl;
    if (!z || !z->ddp)
        return -EAGAIN;
    dt_ddp_get_stats(z->ddp, out);
    return 0;
}

/* The reducer first, then the staging, then the optimiser. */
static void zero_close(dt_dpsync *y)
{
    zero_impl *z = y->impl;
    if (z) {
        dt_ddp_free(z->ddp);
        for (int i = 0; i < DT_OPTIM_MAX_STATES; i++)
            if (z->full[i])
                y->be->free(y->be, z->full[i]);
        free(z->hold);
        free(z);
    }
    dt_optim_free(y->optim);
}

#define ZERO_OPS(stage)                                                                         \
    {                                                                                           \
        .name = "zero-" #stage, .zero_stage = stage, .needs_group = true, .open = zero_open,    \
        .start = zero_start, .zero_grads = zero_zero_grads, .grad_ready = zero_grad_ready,      \
        .hold = zero_hold, .finish = zero_finish, .average = zero_average, .scale = zero_scale,  \
        .sumsq = zero_sumsq, .step = zero_step, .local = zero_local,                            \
        .gather_state = zero_gather_state, .owned = zero_owned, .mem = zero_mem,                \
        .stats = zero_stats, .close = zero_close,                                               \
    }

const dt_dpsync_ops dt_dpsync_zero1_ops = ZERO_OPS(1);
const dt_dpsync_ops dt_dpsync_zero2_ops = ZERO_OPS(2);
