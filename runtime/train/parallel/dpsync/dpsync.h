/* dpsync.h - the data-parallel axis as one interface: how the replicas of one set of parameters
 * keep their gradients, parameters and optimiser state in step over a data-parallel group.
 *
 * A layout (strategy.h) decides what a rank holds of the model (all of it, its tensor-parallel
 * slices, a pipeline stage, or a stage's slices) and who its replicas are (grid.h's dp group);
 * a dpsync is what it holds over those replicas, the one way the layout reaches DDP or ZeRO.
 * Every layout but DP (one process driving replicas, dp.h) holds exactly one, and never asks
 * which: a new flavour (a gradient compression, another sharding) is a new file in this folder
 * and a line in the registry (strategies.c), never an edit of the layouts.
 *
 * Flavours (the ops tables, each in its own file):
 *   none    dpsync_none.c    no replicas (a group of one, or none): the whole optimiser, the
 *                            whole gradient, nothing to communicate
 *   ddp     dpsync_ddp.c     DistributedDataParallel over ddp.h's reducer: gradient buckets
 *                            all-reduced (averaged) from backward's grad-ready hook, overlapped
 *                            with backward, optionally as 16-bit payloads or through the
 *                            int8 / 1bit all-reduce of lowbit.h (ddp.compress)
 *   zero-1  dpsync_zero12.c  ZeRO stage 1 (the reducer's shard mode): buckets reduce-scattered,
 *                            the optimiser state 1/N per rank, the updated parameters
 *                            all-gathered
 *   zero-2  dpsync_zero12.c  stage 2: also the gradient memory given back as buckets reduce
 *   zero-3  dpsync_zero3.c   stage 3 (FSDP full shard): the parameters too, gathered per block
 *                            by the model's block hook around each use, prefetched one window
 *                            ahead once the order of windows was seen
 * dpsync_zero12.c and dpsync_zero3.c open with the long form of what they do; ddp.h is the
 * reducer under ddp and zero-1/2.
 *
 * A sync is opened over a set of parameters (ctx.model: the flat parameter and gradient buffers
 * of a dt_model and its tensor table, whatever the model is a part of) and a data-parallel group
 * (ctx.dp: the ranks holding the same parameters; the world for a whole model, grid.h's dp group
 * under tensor or pipeline parallelism). It builds the optimiser over what this rank owns
 * (y->optim: the whole local model, or its shard) and owns it.
 *
 * The calls, in the order a layout makes them (every rank of the group at the same points: most
 * are collective over ctx.dp):
 *
 *   open            after the model is built, before a checkpoint is loaded: the reducer or
 *                   the shard layout, y->optim, the staging of the checkpoint state
 *   local, owned    where the checkpoint state lives (below); a load writes local(k)
 *   start           after the load (or none): every replica takes group rank 0's parameters
 *                   and buffers (the model's, or what the load wrote), this rank takes its part
 *                   of the optimiser state from local(k)
 *   one step:
 *     zero_grads    the gradients the next micro-steps accumulate into are zero
 *     per micro-step, for a whole model:
 *       forward_begin(training); model forward; forward_end(rc)
 *       backward_begin(last) -> the grad-ready hook to give the backward (NULL: none);
 *       model backward; backward_end(rc)
 *     for a pipeline stage, whose micro-batches interleave their passes: backward_begin before
 *       each stage backward (last: the step's final one), drop after the schedule's run; no
 *       forward_begin/end nor backward_end (so the sync learns no window order: no prefetch)
 *     finish        the gradients are final: averaged over the group (replicated flavours) or
 *                   this rank's averaged shard (sharded ones); the held tensors (hold) summed
 *                   over their other group by the layout's callback, where the flavour needs
 *                   it
 *     clip          dt_dpsync_clip: scale (fp16's unscale) and sumsq of what this rank owns,
 *                   summed over the group where it is sharded, then the layout's groups
 *                   (tensor, pipeline), then the clip scaling
 *     step          the optimiser update of what this rank owns (and what must follow: zero-1/2
 *                   all-gather the updated parameters)
 *   a save:         gather_state (collective), then the layout reads local(k)
 *   eval:           forward_begin(false); forward; forward_end(rc)
 *   close
 *
 * Checkpoint state. Buffer k = 0 is the parameters, k = 1 + i optimiser state i (y->optim's
 * states, in their order), each in the model's layout (num_params floats: the local model, as
 * the layout hands it on to its own whole-tensor assembly). Two views:
 *   - local(y, k): the whole local buffer, backend memory: the model's own buffers where the
 *     flavour keeps them whole (none, ddp; zero-1/2's parameters), else a staging of the sync's
 *     (zero-1/2's optimiser state, zero-3's everything), resident only between a gather_state
 *     (or open) and the next step (or start). gather_state fills it (collective over the
 *     group); a load writes it and start takes it back. This is today's checkpoint path: the
 *     checkpoint holds whole tensors, written by rank 0.
 *   - owned(y, k): what this rank alone holds of buffer k, as pieces [off, off + n) of the local
 *     layout with the backend memory holding them: the tensors (model.h's table maps an offset
 *     to a tensor and a slice of it) and slices a sharded checkpoint would write from this rank
 *     without gathering. y->replicated says whether every rank of the group owns the same
 *     (none, ddp: then group rank 0's pieces are the ones to write).
 *
 * Memory figures (mem) and statistics (stats: the reducer's) are ops too: whoever reports them
 * (dtrain bench memory, the tests) asks the sync the layout holds (strategy.h's
 * dt_strategy_get_mem), never a flavour by name.
 *
 * What it may include: common/, kernels/, runtime/comm/, runtime/job/config.h, the model
 * (models/model.h), the optimiser (optim.h), parallel/staging.h, ckpt/xxh64.h (zero-3's model
 * digest) and this folder's ddp.h. Never a layout (strategy*.h), worker.h or the registry.
 */
#ifndef DT_DPSYNC_H
#define DT_DPSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/train/models/model.h"
#include "runtime/train/optim.h"
#include "runtime/train/parallel/dpsync/ddp.h"

typedef struct dt_dpsync dt_dpsync;

/* What a sync is opened with. All borrowed; they outlive the sync. */
typedef struct dt_dpsync_ctx {
    dt_model *model;              /* the parameters and gradients synchronised (its backend is
                                     the sync's): the whole model, a tensor shard, a stage */
    dt_comm *dp;                  /* the data-parallel group: the ranks holding the same
                                     parameters. NULL only for a flavour without needs_group */
    const dt_optim_config *optim; /* the optimiser built over what this rank owns */
    const dt_ddp_opts *ddp;       /* the [ddp] keys, decoded once (buckets, compression,
                                     broadcast_buffers); shard/release are the flavour's own */
    bool announce;                /* say at INFO what this rank holds (the world's rank 0) */
    size_t io_buffer;             /* bytes of the one buffer a move of state between layouts
                                     goes through (checkpoint.io_buffer_mb; 0: 64 MiB) */
} dt_dpsync_ctx;

/* Memory one rank holds for its model state, in bytes, measured where it can be (for `dtrain
 * bench memory` and the tests). */
typedef struct dt_dpsync_mem {
    int zero_stage;         /* 0 for flavours other than ZeRO */
    size_t params;          /* parameters (whole at stages 0-2; stage 3: the allocator's
                               resident parameter bytes now: shard, gather staging and the
                               flat buffer's pages held) */
    size_t params_peak;     /* stage 3: the most parameter bytes resident during the steps
                               (the allocator's count, seen at every window's start, where it
                               only grows); else = params */
    size_t grads;           /* gradients held now (after a step): the flat buffer's resident
                               bytes (stage 2: the allocator's count; else its size) + the
                               reduced shard */
    size_t grads_peak;      /* stage 3: as params_peak, for gradients;
                               stage 2: the most the gradients (and the 16-bit payloads) held
                               since the step began (the allocator's count, seen at every
                               commit, + the shard); else = grads */
    size_t optim;           /* optimiser state this rank holds (its shard at stages 1-3) */
    size_t comm;            /* zero: the 16-bit payload buffers of ddp.compress (stage 2: the
                               resident part; stage 3: the allocator's comm bytes); else 0 */
    /* stage 3: block gathers waited for at once (the first step's, the first window of each
     * forward) and served by a prefetch; the windows of a forward and a backward as recorded;
     * forward passes run */
    uint64_t gathers_sync, gathers_prefetched, windows, forwards;
    size_t ckpt_staging;    /* checkpoint staging held now (full-size optimiser state between
                               a save and the next update on cpu; always on cuda) */
} dt_dpsync_mem;

/* A run of a local buffer this rank owns: elements [off, off + n) of the model's layout, held
 * at data (backend memory, n floats). */
typedef struct dt_dpsync_piece {
    size_t off, n;
    const float *data;
} dt_dpsync_piece;

/* The layout's sum of the held tensors' gradients over their other group (the tied embedding
 * of a pipeline's first and last stage), in place in the model's gradient buffer; called by
 * finish where the flavour needs it. 0 or -errno and err. */
typedef int (*dt_dpsync_sum_fn)(void *ctx, dt_err *err);

typedef struct dt_dpsync_ops {
    const char *name;   /* "none", "ddp", "zero-1", "zero-2", "zero-3" */
    int zero_stage;     /* the ZeRO stage the flavour is (0: none, ddp), for figures */
    bool needs_group;   /* opened over a communicator, even a group of one rank (every flavour
                           but none) */
    bool replicated;    /* every rank of the group owns the same (none, ddp) */

    /* Builds the sync over y->model and y->dp (set, with y->be, before it is called) and
     * y->optim. Collective over the group. -errno and err on failure; close is still called. */
    int (*open)(dt_dpsync *y, const dt_dpsync_ctx *ctx, dt_err *err);
    /* After a load wrote local(k) (or none did): every rank takes group rank 0's parameters and
     * buffers, and its part of the state. Collective. */
    int (*start)(dt_dpsync *y, dt_err *err);
    void (*zero_grads)(dt_dpsync *y);
    /* A whole-model pass (NULL: nothing to do). forward_end and backward_end get the pass's
     * return code and give the pass's result: rc, or the first error the sync met inside the
     * pass (a block hook cannot stop the model), with err. */
    void (*forward_begin)(dt_dpsync *y, bool training);
    int (*forward_end)(dt_dpsync *y, int rc, dt_err *err);
    /* Before every backward (a whole model's or a stage micro-batch's); last: the step's final
     * one, whose gradients are synchronised as they become final. */
    void (*backward_begin)(dt_dpsync *y, bool last);
    int (*backward_end)(dt_dpsync *y, int rc, dt_err *err);
    /* The grad-ready hook's work (NULL: the flavour needs no hook); called by
     * dt_dpsync_grad_ready in the final backward only. */
    void (*grad_ready)(dt_dpsync *y, size_t offset, size_t numel);
    /* After a run of a stage's passes: whatever was gathered for them given back (NULL). */
    void (*drop)(dt_dpsync *y);
    /* Tensor (index into the model's table) is also held by another rank outside the group and
     * its gradient is summed with that copy by the layout (finish's sum); NULL: nothing to do
     * (the flavour's finish sums after its own average). */
    int (*hold)(dt_dpsync *y, int tensor, dt_err *err);
    /* The gradients final: see dt_dpsync_finish. *wait_s the time spent waiting for the
     * group's collectives. */
    int (*finish)(dt_dpsync *y, dt_dpsync_sum_fn sum, void *ctx, double *wait_s, dt_err *err);
    /* Mean of v[0..n) over the group (float64 all-reduce; unchanged without a group). */
    int (*average)(dt_dpsync *y, double *v, int n, dt_err *err);
    /* What this rank owns of the final gradient, times f. */
    void (*scale)(dt_dpsync *y, float f);
    /* *sum = the sum of squares of the final gradient elements this rank owns that lie in
     * tensors with counted[t] != 0 (counted NULL: all it owns, as one sum), added over the
     * group where the flavour is sharded (in rank order: the same double on every rank). */
    int (*sumsq)(dt_dpsync *y, const unsigned char *counted, double *sum, dt_err *err);
    /* One optimiser update at lr of what this rank owns, and what must follow it. */
    int (*step)(dt_dpsync *y, double lr, dt_err *err);
    float *(*local)(dt_dpsync *y, int k);
    /* Before a save (collective): local(k) holds buffer k for every k (NULL: it always does);
     * a sharded flavour fills them on group rank 0 only (zero-1/2/3: the others' are left as
     * they are), the one whose tensors a whole-tensor checkpoint writes. */
    int (*gather_state)(dt_dpsync *y, dt_err *err);
    int (*owned)(dt_dpsync *y, int k, dt_dpsync_piece *out, int cap, int *n);
    void (*mem)(dt_dpsync *y, dt_dpsync_mem *out);
    /* The reducer's figures (ddp.h); -ENOTSUP for a flavour without one, -EAGAIN before it
     * exists (ddp: from start). */
    int (*stats)(dt_dpsync *y, dt_ddp_stats *out);
    /* Frees y->impl and y->optim; accepts an open that failed half way. */
    void (*close)(dt_dpsync *y);
} dt_dpsync_ops;

/* A sync: the public part, then the flavour's state. */
struct dt_dpsync {
    const dt_dpsync_ops *ops;
    dt_model *model;  /* borrowed (ctx.model) */
    dt_backend *be;   /* borrowed: the model's */
    dt_comm *dp;      /* borrowed (ctx.dp), or NULL */
    int rank, size;   /* this rank's place in the group (0 of 1 without one) */
    dt_optim *optim;  /* over what this rank owns; owned by the sync */
    char label[16];   /* for summaries and messages: "" (none), "DDP", "ZeRO-1", "ZeRO-2",
                         "ZeRO-3" */
    bool sharded;     /* the optimiser state is split over the group (ZeRO) */
    void *impl;
};

/* Opens ops over ctx (*out owned by the caller: dt_dpsync_close). -EINVAL when ops needs a
 * group and ctx->dp is NULL. On failure *out is NULL and what was built is freed. */
int dt_dpsync_open(dt_dpsync **out, const dt_dpsync_ops *ops, const dt_dpsync_ctx *ctx,
                   dt_err *err);

/* Accepts NULL. Before the group, the model and the backend are freed. */
void dt_dpsync_close(dt_dpsync *y);

int dt_dpsync_start(dt_dpsync *y, dt_err *err);
void dt_dpsync_zero_grads(dt_dpsync *y);

/* The passes (see the header). backward_begin gives the hook for the backward: *fn and *ctx
 * (fn NULL: none; a hook only in the final backward, last). */
void dt_dpsync_forward_begin(dt_dpsync *y, bool training);
int dt_dpsync_forward_end(dt_dpsync *y, int rc, dt_err *err);
void dt_dpsync_backward_begin(dt_dpsync *y, bool last, dt_grad_ready_fn *fn, void **ctx);
int dt_dpsync_backward_end(dt_dpsync *y, int rc, dt_err *err);
void dt_dpsync_drop(dt_dpsync *y);

/* The grad-ready hook (model.h's dt_grad_ready_fn) with ctx = the dt_dpsync. */
void dt_dpsync_grad_ready(void *ctx, size_t offset, size_t numel);

/* Tensor t's gradient is summed over another group by the layout (see finish). */
int dt_dpsync_hold(dt_dpsync *y, int tensor, dt_err *err);

/* After the step's final backward: the gradients final (averaged over the group, or this rank's
 * averaged shard). sum (NULL: none), the layout's sum of the held tensors' gradients over their
 * other group, is called where the flavour needs it: after its average where every replica
 * holds the averaged gradient (none, ddp: so both copies are summed alike), before its
 * reduction where the copies would be sharded differently (zero). *wait_s the time waited for
 * the group. The first error a hook met in the backward comes back here too. */
int dt_dpsync_finish(dt_dpsync *y, dt_dpsync_sum_fn sum, void *ctx, double *wait_s,
                     dt_err *err);

int dt_dpsync_average(dt_dpsync *y, double *v, int n, dt_err *err);

/* The clip of the global gradient: unscale (fp16: 1 / the loss scale) first when not 1; the sum
 * of squares of what this rank owns of the counted tensors (counted[t] for tensor t of the
 * model's table; NULL: everything it owns, one sum), over the group where sharded; then
 * all-reduced over each non-NULL groups[0..ngroups) in turn (the layout's tensor and pipeline
 * groups: their ranks own different parameters) through scratch (one double of backend memory;
 * unused when ngroups is 0); *norm its square root; when train.grad_clip (y->optim's) is set
 * and the norm finite and above it, what this rank owns times grad_clip / (norm + 1e-6). An inf
 * or NaN anywhere makes every rank's norm non-finite (nothing clipped). */
int dt_dpsync_clip(dt_dpsync *y, double unscale, const unsigned char *counted,
                   dt_comm *const *groups, int ngroups, double *scratch, double *norm,
                   dt_err *err);

int dt_dpsync_step(dt_dpsync *y, double lr, dt_err *err);

/* Checkpoint state (see the header): local buffer k (0 parameters, 1 + i optimiser state i),
 * whole in the model's layout; gather_state fills every one (collective); owned gives this
 * rank's pieces of buffer k into out[0..cap) (-ENOSPC, *n the count needed, when cap is too
 * small). The pieces of all ranks of a sharded flavour tile [0, num_params) once. */
float *dt_dpsync_local(dt_dpsync *y, int k);
int dt_dpsync_gather_state(dt_dpsync *y, dt_err *err);
int dt_dpsync_owned(dt_dpsync *y, int k, dt_dpsync_piece *out, int cap, int *n);

void dt_dpsync_get_mem(dt_dpsync *y, dt_dpsync_mem *out);
int dt_dpsync_stats(dt_dpsync *y, dt_ddp_stats *out);

/* ---- what the flavours share ----------------------------------------------------------------- */

/* The figures of a replica that holds model and optim whole (none, ddp; DP's master): params
 * and grads num_params floats each, optim its states; peaks = the figures. */
void dt_dpsync_mem_whole(const dt_model *m, const dt_optim *o, dt_dpsync_mem *out);

/* sumsq of a whole local gradient (none, ddp): of m->grads, all of it in one sum (counted NULL)
 * or one sum per run of neighbouring counted tensors. */
double dt_dpsync_sumsq_whole(const dt_model *m, const unsigned char *counted);

#endif
