/* strategy_pipeline.c - pipeline parallelism: GPipe and 1F1B (PipeDream-Flush) over the
 * pipeline group of the data x tensor x pipeline grid, a data-parallel sync (DDP, ZeRO 1-3)
 * over the data-parallel group when D > 1; see strategy_pipeline.h.
 *
 * open: the world communicator, the grid (grid.h) and its groups (tensor, data, pipeline,
 * embedding), this rank's stage (the blocks dt_job_stage_blocks gives stage pp), the model built
 * as that stage (model.h's pp_* fields) with as many activation slots as the schedule keeps
 * micro-batches alive (GPipe M, 1F1B min(P - stage, M)) and, when T > 1, its tensor-parallel
 * slices (the model's comm is the tensor group); micro-batches of batch_size / M samples, the
 * sync over the stage's replicas (and its optimiser over what it owns of the stage), the p2p
 * buffers, and the whole-model view a checkpoint
 * needs: the stages' tensor tables all-gathered over the pipeline group into one table of whole
 * tensors under the usual names (a name an earlier stage holds too, the tied wte of gpt's last
 * stage, is that stage's), and whole-size staging of the parameters and the optimiser state,
 * filled with the initial parameters.
 * start: every stage takes its tensors from the staging (what a resume loaded into it, or the
 * initial values open put there) into the sync's local buffers, then the sync's start (DDP:
 * the reducer over the data-parallel group).
 *
 * micro_step(batch): the rank's batch (the same samples on every stage of a pipeline: the
 * sampler draws by the data-parallel coordinate) is cut into M micro-batches of near-equal size,
 * and the stage runs its list of pp_schedule.h with each receive moved one compute earlier
 * (dt_pp_post_early: the activation of micro-batch k before the forward of k-1, a gradient
 * before the previous backward where no forward lies between), so a transfer overlaps the
 * compute before its use instead of being asked for only once that compute is done; the input
 * activations land in a ring of nrecv buffers, one more than the slots (at most M: the model
 * borrows its input until the backward; its activation slots are unchanged). Consecutive sends
 * and receives go out as one dt_comm_p2p batch with at most one receive (dt_pp_batch_end: so
 * the wait for micro-batch k's input is not a wait for k+1's), posted at once; before each
 * forward or backward the stage waits, in order, for the batches up to the one holding what
 * that compute reads or overwrites (dt_pp_wait_before: its input's receive, a send still
 * reading the slot's output or the input-gradient buffer, two of which alternate), so the
 * sends it does not touch stay in flight while it computes (GPipe's stage 0 runs its forwards
 * back to back). pp_schedule's tests replay this on a backend that runs each rank's batches
 * one after the other (NCCL's stream): it cannot deadlock (pp_schedule.c says why, and why
 * 1F1B's steady-state gradient receives stay where Megatron puts them). Micro-batch k's
 * backward runs with dloss x valid_k / valid (valid: targets not ignored), so the gradient is
 * exactly the one-process gradient of the batch mean; the last stage's loss, the same
 * weighted sum, is broadcast over the pipeline group, so every rank returns the number one
 * process logs. The DDP reducer hears of finished gradients in the last micro-batch's backward
 * of the last micro-step, so its buckets' all-reduces start during that backward, the
 * cool-down (test_pipeline's overlap_trace sees it in the trace), not after the schedule.
 * sync_grads: DDP's buckets (D > 1), then the tied wte's two copies' gradients summed over the
 * embedding group (stages 0 and P-1), so both take the same update.
 * clip: each rank's sum of squares of what it alone holds, all-reduced over the tensor group
 * and then the pipeline group (an inf or NaN anywhere makes every rank's norm non-finite, so
 * fp16's skip is everywhere).
 * gather_state: every rank's parameters and optimiser state assembled over the tensor group
 * (T > 1) and all-gathered over the pipeline group into the staging, so rank 0 writes whole
 * tensors and any layout resumes them (start slices them again).
 *
 * The model's buffers (resnet's BatchNorm running statistics) belong to their stage: open
 * all-gathers the stages' buffer tables into one whole table (the stages' one after the other)
 * and a copy of every stage's buffers (wbuf), which state offers as the checkpoint's "model"
 * buffers; gather_state refreshes it over the pipeline group (rank 0 writes it), pieces lists
 * each stage's own from its data-parallel rank 0 (sharded saves), and start puts the stage's
 * part of it back (what a resume loaded, or the values open copied). The model's communicator
 * is the tensor group when T > 1, else the stage's data-parallel group: SyncBatchNorm's.
 *
 * The staging (staging.h's dt_staging, as the tensor strategy's) is whole-model sized
 * on every rank, but its memory is resident only while it holds data (from open to start,
 * from a save's gather to the next optimiser step). The groups are grid.h's (dt_groups_open
 * through dt_strategy_open_groups), the tensor group's gather and slice and the norm over split
 * tensors strategy.c's, all shared with strategy_tensor.c.
 *
 * The data-parallel axis is the sync the registry chose (dpsync.h), opened over the stage's
 * data-parallel group (none when D = 1), which builds the optimiser over what the rank owns of
 * the stage: DDP's reducer, ZeRO-1/2's shards of the stage (reduce-scattered buckets, the
 * updated stage all-gathered) or ZeRO-3's (its block hook gathers a block over the group at
 * each of its windows, every micro-batch's forward and backward). backward_begin before every
 * stage backward gives the hook of the step's final one; drop after a run gives back what was
 * gathered for it. The tied wte is held (hold) and summed over the embedding group by sum_tied,
 * which finish calls where the sync needs it: after DDP's average (both copies then sum the
 * same averaged gradients), before ZeRO's reduction (the two stages' replicas shard it
 * differently: their buckets and blocks differ; ZeRO-1/2 on the last stage, whose wte is its
 * first bucket, then starts its reduce-scatters after backward, the buckets after the tied one
 * waiting with it, strictly in order). A pipeline's micro-batches interleave their passes, so
 * the sync learns no window order (ZeRO-3: no prefetch, every gather waited for at its window).
 *
 * Left for later (issue 19): ZeRO 1-2's reduce-scatters on a stage with the tied wte start
 * only after backward where wte is the stage's first bucket (above); ZeRO-3's prefetch in a
 * pipeline; interleaved (virtual-stage) schedules.
 */
#include "runtime/train/parallel/strategy_pipeline.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/parallel/grid.h"
#include "runtime/train/parallel/pp_schedule.h"
#include "runtime/train/obs/flight.h"
#include "runtime/train/obs/trace.h"

typedef struct pipe_impl {
    const dt_job *job;              /* borrowed */
    dt_groups g;                    /* grid and groups (pp: this pipeline; dp: D > 1), owned */
    dt_strategy *self;              /* borrowed: the tied sum's way back (sum_tied) */
    int P, M, stage, slots;
    int nrecv;                      /* input activation buffers (stage > 0): one more than the
                                       slots (at most M), as receives are posted a forward
                                       early */
    dt_pp_schedule_kind kind;
    dt_pp_action *list;             /* (nlist) this stage's schedule, owned */
    dt_pp_action *eval_list;        /* (6M) scratch for evaluation's forward-only list */
    int nlist;
    dt_p2p_op *ops;                 /* (nlist) scratch for one p2p batch */
    dt_comm_work **works;           /* (nlist) posted and not yet waited */
    uint64_t *work_t0;              /* (nlist) their trace starts */
    int *work_mb;                   /* (nlist) the micro-batch of their last receive (what the
                                       batch brings in), or of their first send if none */
    const char **work_name;         /* (nlist) "send", "recv", "send+recv" (literals) */
    int64_t *work_bytes;            /* (nlist) their bytes, both ways */
    int *work_first;                /* (nlist) the list index of their first action */
    int nworks, wfront;             /* posted this step; works[wfront..nworks) not waited */
    int mb_cap;                     /* samples per micro-batch (the model's max_batch) */
    size_t x_numel;                 /* input floats per sample (vector and image data) */
    int *mb_from, *mb_size;         /* (M) the current batch's micro-batches */
    int64_t *mb_valid;              /* (M) their targets that count (>= 0) */
    float **recv_act;               /* (nrecv) (mb_cap, pp_in_numel) backend, stage > 0:
                                       micro-batch k's input in [k % nrecv] */
    float **out;                    /* (slots) the model's output of the slot's micro-batch */
    float *grad_out[2];             /* (mb_cap, pp_out_numel) received for micro-batch j in
                                       [j % 2], stage < P-1 */
    float *grad_in[2];              /* (mb_cap, pp_in_numel) sent, likewise, stage > 0 */
    double *scalars;                /* (8) backend memory for small collectives */
    /* the whole model, as a checkpoint holds it */
    dt_tensor_info *whole;          /* (nwhole) owned, offsets into the staging */
    int nwhole;
    size_t whole_numel;
    dt_tensor_info *tables;         /* (P * maxn) every stage's table, owned */
    int *counts;                    /* (P) tensors per stage */
    int maxn;
    int *tensor_at;                 /* (P * maxn) index in whole of each stage's tensor */
    size_t *sw_at;                  /* (P * maxn) offset of each stage's tensor, whole (not
                                       its tensor-parallel slice), in that stage's tensors
                                       laid one after the other */
    size_t maxsw;                   /* the largest stage's whole tensors, in elements */
    int *tied;                      /* (ntied) this stage's tensors another stage holds too
                                       (gpt's wte on the first and the last stage) */
    int ntied;
    bool tied_copy;                 /* this stage's tied tensors are the later copies: left
                                       out of the norm (the first stage counts them) */
    unsigned char *counted;         /* (this stage's tensors) what this rank counts in the
                                       norm, owned */
    size_t *own_off;                /* (this stage's tensors) offset of each in whole */
    /* the whole model's buffers (BatchNorm's running statistics; none: nwbuf 0): every
     * stage's own, laid one stage after the other, as a checkpoint holds them */
    dt_tensor_info *wbt;            /* (nwbuf) owned, offsets into wbuf */
    int nwbuf;
    size_t wb_numel;
    size_t *wb_base;                /* (P) where each stage's buffers start in wbuf */
    size_t *wb_len;                 /* (P) and how many floats they are */
    size_t wb_max;                  /* the largest stage's */
    float *wbuf;                    /* (wb_numel) backend, owned: the gathered buffers (a
                                       save's), or what a resume loaded (start's) */
    dt_staging stg;        /* (whole_numel) params, then each optimiser state; owned.
                                       Resident from open to start and from a save's gather to
                                       the next optim_step */
    dt_pp_stats st;
} pipe_impl;

static int pipe_rank_batch(const dt_job *job) { return job->batch_size; }

/* ---- the whole-model view ------------------------------------------------------------------ */

/* Every stage's tensor table, all-gathered over the pipeline group, and the whole table. */
static int gather_tables(dt_strategy *s, pipe_impl *p, dt_err *err)
{
    dt_backend *be = s->be;
    const dt_model *m = s->model;
    int32_t *cnt = NULL;
    uint8_t *send = NULL, *recv = NULL;
    int rc = be->alloc(be, (void **)&cnt, sizeof(int32_t) * (size_t)(p->P + 1), err);
    if (rc)
        return rc;
    int32_t mine = m->num_tensors;
    be->memcpy_h2d(be, cnt + p->P, &mine, sizeof mine);
    if ((rc = dt_comm_allgather(p->g.pp, cnt + p->P, cnt, 1, DT_INT32, NULL, err)))
        goto out;
    int32_t counts[DT_MAX_STAGES];
    be->memcpy_d2h(be, counts, cnt, sizeof(int32_t) * (size_t)p->P);
    p->maxn = 0;
    for (int i = 0; i < p->P; i++)
        p->maxn = DT_MAX(p->maxn, counts[i]);
    size_t row = sizeof(dt_tensor_info) * (size_t)p->maxn;
    if ((rc = be->alloc(be, (void **)&send, row, err)) ||
        (rc = be->alloc(be, (void **)&recv, row * (size_t)p->P, err)))
        goto out;
    be->memset_zero(be, send, row);
    be->memcpy_h2d(be, send, m->tensors, sizeof(dt_tensor_info) * (size_t)m->num_tensors);
    if ((rc = dt_comm_allgather(p->g.pp, send, recv, row, DT_UINT8, NULL, err)))
        goto out;
    p->tables = malloc(row * (size_t)p->P);
    p->counts = malloc(sizeof(int) * (size_t)p->P);
    p->tensor_at = malloc(sizeof(int) * (size_t)p->P * (size_t)p->maxn);
    p->sw_at = malloc(sizeof(size_t) * (size_t)p->P * (size_t)p->maxn);
    size_t total = 0;
    for (int i = 0; i < p->P; i++)
        total += (size_t)counts[i];
    p->whole = calloc(total ? total : 1, sizeof(dt_tensor_info));
    if (!p->tables || !p->counts || !p->tensor_at || !p->sw_at || !p->whole) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    be->memcpy_d2h(be, p->tables, recv, row * (size_t)p->P);
    p->nwhole = 0;
    p->whole_numel = 0;
    p->maxsw = 0;
    for (int i = 0; i < p->P; i++) {
        p->counts[i] = counts[i];
        size_t sw = 0;
        for (int t = 0; t < counts[i]; t++) {
            const dt_tensor_info *ti = &p->tables[(size_t)i * p->maxn + t];
            size_t n = dt_tensor_whole_numel(ti);
            p->sw_at[(size_t)i * p->maxn + t] = sw;
            sw += n;
            int w = -1;
            for (int k = 0; k < p->nwhole && w < 0; k++)
                if (!strcmp(p->whole[k].name, ti->name))
                    w = k; /* a tied copy: the earlier stage's is the checkpoint's */
            if (w < 0) { /* the whole tensor, as one process holds it */
                w = p->nwhole++;
                dt_tensor_info *wt = &p->whole[w];
                *wt = *ti;
                memcpy(wt->shape, ti->whole_shape, sizeof wt->shape);
                wt->tp_dim = wt->tp_parts = 0;
                wt->numel = n;
                wt->offset = p->whole_numel;
                p->whole_numel += n;
            }
            p->tensor_at[(size_t)i * p->maxn + t] = w;
        }
        p->maxsw = DT_MAX(p->maxsw, sw);
    }
    /* tensors of this stage that another stage holds too: their gradients are summed over the
     * embedding group (Megatron's tied embedding), and counted once in the norm */
    p->tied = calloc((size_t)p->maxn + 1, sizeof(int));
    p->own_off = calloc((size_t)p->maxn + 1, sizeof(size_t));
    if (!p->tied || !p->own_off) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int t = 0; t < counts[p->stage]; t++) {
        int w = p->tensor_at[(size_t)p->stage * p->maxn + t], holders = 0, first = -1;
        p->own_off[t] = p->whole[w].offset;
        for (int i = 0; i < p->P; i++)
            for (int u = 0; u < counts[i]; u++)
                if (p->tensor_at[(size_t)i * p->maxn + u] == w) {
                    holders++;
                    first = first < 0 ? i : first;
                }
        if (holders < 2)
            continue;
        if (holders != 2 || !p->g.embed) {
            rc = dt_err_set(err, -EINVAL, "tensor %s is held by %d stages; only the first and "
                                          "the last stage may share one (the tied embedding)",
                            p->whole[w].name, holders);
            goto out;
        }
        p->tied[p->ntied++] = t;
        p->tied_copy = first != p->stage;
    }
out:
    be->free(be, cnt);
    be->free(be, send);
    be->free(be, recv);
    return rc ? dt_err_prefix(err, "pipeline: the stages' tensor tables: ") : 0;
}

/* whole (whole_numel) <- every rank's local (its num_params): first the slices of the tensor
 * group assembled into this stage's whole tensors (dt_strategy_tp_gather; T = 1: a copy), then
 * every stage's all-gathered over the pipeline group; a tensor that several stages hold is taken
 * from the first. */
static int gather_whole(dt_strategy *s, pipe_impl *p, const float *local, float *whole,
                        dt_err *err)
{
    dt_backend *be = s->be;
    float *send = NULL, *recv = NULL;
    int rc = be->alloc(be, (void **)&send, sizeof(float) * DT_MAX(p->maxsw, (size_t)1), err);
    if (!rc)
        rc = be->alloc(be, (void **)&recv, sizeof(float) * p->maxsw * (size_t)p->P + 1, err);
    if (rc)
        goto out;
    be->memset_zero(be, send, sizeof(float) * DT_MAX(p->maxsw, (size_t)1));
    if ((rc = dt_strategy_tp_gather(s, p->g.tp, p->g.grid.T, p->g.grid.tp, local, send,
                                    p->sw_at + (size_t)p->stage * p->maxn, err)))
        goto out;
    if ((rc = dt_comm_allgather(p->g.pp, send, recv, p->maxsw, DT_FLOAT32, NULL, err)))
        goto out;
    for (int i = p->P - 1; i >= 0; i--) /* the first stage's copy last: it wins */
        for (int t = 0; t < p->counts[i]; t++) {
            const dt_tensor_info *w = &p->whole[p->tensor_at[(size_t)i * p->maxn + t]];
            be->memcpy_d2d(be, whole + w->offset,
                           recv + (size_t)i * p->maxsw + p->sw_at[(size_t)i * p->maxn + t],
                           sizeof(float) * w->numel);
        }
out:
    be->free(be, send);
    be->free(be, recv);
    return rc;
}

/* ---- open, start ---------------------------------------------------------------------------- */

static int alloc_floats(dt_backend *be, float **p, size_t n, dt_err *err)
{
    int rc = be->alloc(be, (void **)p, sizeof(float) * (n ? n : 1), err);
    if (!rc)
        be->memset_zero(be, *p, sizeof(float) * (n ? n : 1));
    return rc;
}

/* Every stage's buffer table (m->buffer_tensors: BatchNorm's running statistics), all-gathered
 * over the pipeline group into the whole one (p->wbt: the stages' tables one after the other,
 * offsets into p->wbuf), and p->wbuf itself. A stage's buffers belong to it alone (no name is
 * held twice). */
static int gather_buffer_tables(dt_strategy *s, pipe_impl *p, dt_err *err)
{
    dt_backend *be = s->be;
    const dt_model *m = s->model;
    int64_t *cnt = NULL;
    uint8_t *send = NULL, *recv = NULL;
    int rc = be->alloc(be, (void **)&cnt, sizeof(int64_t) * 2 * (size_t)(p->P + 1), err);
    if (rc)
        return rc;
    int64_t mine[2] = {m->num_buffer_tensors, (int64_t)m->num_buffers};
    be->memcpy_h2d(be, cnt + 2 * p->P, mine, sizeof mine);
    if ((rc = dt_comm_allgather(p->g.pp, cnt + 2 * p->P, cnt, 2, DT_INT64, NULL, err)))
        goto out;
    int64_t counts[2 * DT_MAX_STAGES];
    be->memcpy_d2h(be, counts, cnt, sizeof(int64_t) * 2 * (size_t)p->P);
    int maxn = 0, total = 0;
    p->wb_base = calloc((size_t)p->P, sizeof(size_t));
    p->wb_len = calloc((size_t)p->P, sizeof(size_t));
    if (!p->wb_base || !p->wb_len) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    p->wb_numel = p->wb_max = 0;
    for (int i = 0; i < p->P; i++) {
        maxn = DT_MAX(maxn, (int)counts[2 * i]);
        total += (int)counts[2 * i];
        p->wb_base[i] = p->wb_numel;
        p->wb_len[i] = (size_t)counts[2 * i + 1];
        p->wb_numel += p->wb_len[i];
        p->wb_max = DT_MAX(p->wb_max, p->wb_len[i]);
    }
    if (total == 0)
        goto out; /* no buffers anywhere */
    size_t row = sizeof(dt_tensor_info) * (size_t)maxn;
    if ((rc = be->alloc(be, (void **)&send, row, err)) ||
        (rc = be->alloc(be, (void **)&recv, row * (size_t)p->P, err)))
        goto out;
    be->memset_zero(be, send, row);
    be->memcpy_h2d(be, send, m->buffer_tensors,
                   sizeof(dt_tensor_info) * (size_t)m->num_buffer_tensors);
    if ((rc = dt_comm_allgather(p->g.pp, send, recv, row, DT_UINT8, NULL, err)))
        goto out;
    dt_tensor_info *all = malloc(row * (size_t)p->P);
    p->wbt = calloc((size_t)total, sizeof(dt_tensor_info));
    if (!all || !p->wbt) {
        free(all);
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    be->memcpy_d2h(be, all, recv, row * (size_t)p->P);
    for (int i = 0; i < p->P; i++)
        for (int t = 0; t < (int)counts[2 * i]; t++) {
            dt_tensor_info *w = &p->wbt[p->nwbuf++];
            *w = all[(size_t)i * (size_t)maxn + (size_t)t];
            w->offset += p->wb_base[i];
        }
    free(all);
    if ((rc = alloc_floats(be, &p->wbuf, p->wb_numel, err)))
        goto out;
    be->memcpy_d2d(be, p->wbuf + p->wb_base[p->stage], m->buffers,
                   sizeof(float) * m->num_buffers);
out:
    be->free(be, cnt);
    be->free(be, send);
    be->free(be, recv);
    return rc ? dt_err_prefix(err, "pipeline: the stages' buffer tables: ") : 0;
}

/* p->wbuf <- every stage's buffers (the running statistics as they are now), over the
 * pipeline group. */
static int gather_buffers(dt_strategy *s, pipe_impl *p, dt_err *err)
{
    if (!p->nwbuf)
        return 0;
    dt_backend *be = s->be;
    const dt_model *m = s->model;
    float *send = NULL, *recv = NULL;
    int rc = alloc_floats(be, &send, p->wb_max, err);
    if (!rc)
        rc = alloc_floats(be, &recv, p->wb_max * (size_t)p->P, err);
    if (!rc) {
        be->memcpy_d2d(be, send, m->buffers, sizeof(float) * m->num_buffers);
        rc = dt_comm_allgather(p->g.pp, send, recv, p->wb_max, DT_FLOAT32, NULL, err);
    }
    for (int i = 0; i < p->P && !rc; i++)
        be->memcpy_d2d(be, p->wbuf + p->wb_base[i], recv + (size_t)i * p->wb_max,
                       sizeof(float) * p->wb_len[i]);
    be->free(be, send);
    be->free(be, recv);
    return rc ? dt_err_prefix(err, "the stages' buffers: ") : 0;
}

static int pipe_open(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    const dt_job *j = ctx->job;
    const dt_worker_env *e = ctx->env;
    pipe_impl *p = calloc(1, sizeof *p);
    if (!p)
        return dt_err_set(err, -ENOMEM, "out of memory");
    s->impl = p;
    p->job = j;
    p->P = j->pipeline;
    p->M = j->micro_batches > 0 ? j->micro_batches : 1;
    p->kind = j->pp_schedule;
    int rc = dt_strategy_open_world(s, ctx, err);
    if (rc)
        return dt_err_prefix(err, "pipeline: ");
    if ((rc = dt_strategy_open_groups(&p->g, s->comm, ctx, err)))
        return dt_err_prefix(err, "pipeline: process groups: ");
    p->stage = p->g.grid.pp;
    if (p->P != p->g.grid.P || !p->g.pp)
        return dt_err_set(err, -EINVAL, "pipeline: parallel.pipeline = %d but the grid has %d "
                                        "stages",
                          p->P, p->g.grid.P);

    /* this stage's schedule, and the slots it keeps alive */
    int cap = dt_pp_schedule_cap(p->M);
    p->list = calloc((size_t)cap, sizeof *p->list);
    p->eval_list = calloc((size_t)cap, sizeof *p->eval_list);
    p->ops = calloc((size_t)cap, sizeof *p->ops);
    p->works = calloc((size_t)cap, sizeof *p->works);
    p->work_t0 = calloc((size_t)cap, sizeof *p->work_t0);
    p->work_mb = calloc((size_t)cap, sizeof *p->work_mb);
    p->work_name = calloc((size_t)cap, sizeof *p->work_name);
    p->work_bytes = calloc((size_t)cap, sizeof *p->work_bytes);
    p->work_first = calloc((size_t)cap, sizeof *p->work_first);
    p->mb_from = calloc((size_t)p->M, sizeof(int));
    p->mb_size = calloc((size_t)p->M, sizeof(int));
    p->mb_valid = calloc((size_t)p->M, sizeof(int64_t));
    if (!p->list || !p->eval_list || !p->ops || !p->works || !p->work_t0 || !p->work_mb ||
        !p->work_name || !p->work_bytes || !p->work_first || !p->mb_from || !p->mb_size ||
        !p->mb_valid)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if ((rc = dt_pp_schedule_build(p->kind, p->P, p->M, p->stage, p->list, cap, &p->nlist, err)))
        return rc;
    p->slots = dt_pp_max_in_flight(p->list, p->nlist);
    dt_pp_post_early(p->list, p->nlist); /* the same sends and computes, receives earlier */
    p->nrecv = DT_MAX(dt_pp_recv_buffers(p->list, p->nlist), 1);

    /* the model as this stage */
    int blocks[DT_MAX_STAGES];
    if ((rc = dt_job_stage_blocks(j, blocks, err)) < 0)
        return rc;
    dt_model_config mc = *ctx->model;
    mc.pp_size = p->P;
    mc.pp_rank = p->stage;
    mc.pp_first = 0;
    for (int i = 0; i < p->stage; i++)
        mc.pp_first += blocks[i];
    mc.pp_count = blocks[p->stage];
    mc.pp_slots = p->slots;
    mc.tp_size = p->g.grid.T;
    mc.tp_rank = p->g.grid.tp;
    mc.sequence_parallel = p->g.grid.T > 1 && ctx->job->sequence_parallel;
    p->mb_cap = (ctx->model->max_batch + p->M - 1) / p->M;
    mc.max_batch = p->mb_cap;
    const dt_sample_shape *sh = &ctx->model->shape;
    p->x_numel = sh->kind == DT_SAMPLE_VECTOR  ? (size_t)sh->input_dim
                 : sh->kind == DT_SAMPLE_IMAGE ? (size_t)sh->channels * sh->height * sh->width
                                               : 0;
    /* the model's communicator: the tensor group (T > 1), else the stage's data-parallel group
     * (SyncBatchNorm's statistics over the stage's replicas; NULL when D = 1) */
    if ((rc = dt_model_create(&s->model, &mc, s->be, p->g.grid.T > 1 ? p->g.tp : p->g.dp,
                              err)))
        return rc;
    dt_model *m = s->model;
    if (!m->stage)
        return dt_err_set(err, -ENOTSUP, "parallel.pipeline = %d: model %s has no pipeline "
                                         "stages (mlp, gpt, bert, llama and resnet have); use "
                                         "parallel.pipeline = 1",
                          p->P, dt_model_arch_name(mc.arch));
    p->self = s;
    /* the sync over the stage's replicas (none when D = 1); the optimiser is its */
    if ((rc = dt_strategy_open_sync(s, ctx, p->g.dp, err)))
        return dt_err_prefix(err, "pipeline stage %d: %s over its %d replicas: ", p->stage,
                             s->sync ? s->sync->label : ctx->sync->name, p->g.grid.D);

    /* p2p buffers */
    dt_backend *be = s->be;
    p->recv_act = calloc((size_t)p->nrecv, sizeof(float *));
    p->out = calloc((size_t)p->slots, sizeof(float *));
    if (!p->recv_act || !p->out)
        return dt_err_set(err, -ENOMEM, "out of memory");
    size_t in_n = (size_t)p->mb_cap * m->pp_in_numel, out_n = (size_t)p->mb_cap * m->pp_out_numel;
    for (int k = 0; k < p->nrecv && !rc && p->stage > 0; k++)
        rc = alloc_floats(be, &p->recv_act[k], in_n, err);
    for (int k = 0; k < 2 && !rc; k++) {
        if (p->stage > 0)
            rc = alloc_floats(be, &p->grad_in[k], in_n, err);
        if (!rc && p->stage < p->P - 1)
            rc = alloc_floats(be, &p->grad_out[k], out_n, err);
    }
    if (!rc)
        rc = be->alloc(be, (void **)&p->scalars, 8 * sizeof(double), err);
    if (rc)
        return dt_err_prefix(err, "pipeline buffers: ");
    p->st.act_bytes = m->activation_bytes +
                      sizeof(float) * (in_n * (size_t)(p->stage > 0 ? p->nrecv + 2 : 0) +
                                       (p->stage < p->P - 1 ? 2 * out_n : 0));

    /* the whole model for checkpoints */
    if ((rc = gather_tables(s, p, err)))
        return rc;
    if ((rc = dt_staging_alloc(&p->stg, be, 1 + s->optim->num_states, p->whole_numel,
                                        err)))
        return dt_err_prefix(err, "pipeline: ");
    if ((rc = gather_whole(s, p, dt_dpsync_local(s->sync, 0), p->stg.buf[0], err)))
        return dt_err_prefix(err, "pipeline: the initial parameters: ");
    if ((rc = gather_buffer_tables(s, p, err)))
        return rc;
    for (int i = 0; i < p->ntied; i++) /* summed over the embedding group (sum_tied) */
        if ((rc = dt_dpsync_hold(s->sync, p->tied[i], err)))
            return rc;
    if (!(p->counted = dt_strategy_counted(m, p->g.grid.tp, p->tied_copy ? p->tied : NULL,
                                           p->tied_copy ? p->ntied : 0)))
        return dt_err_set(err, -ENOMEM, "out of memory");

    s->whole_params = p->whole_numel;
    p->st.P = p->P;
    p->st.M = p->M;
    p->st.stage = p->stage;
    p->st.slots = p->slots;
    p->st.slot_bytes = m->pp_slot_bytes;
    char tp[32] = ""; /* the run's last line names every factor but data's */
    if (p->g.grid.T > 1)
        snprintf(tp, sizeof tp, "tensor %d x ", p->g.grid.T);
    snprintf(s->summary, sizeof s->summary, "%spipeline %d x %d micro-batches (%s)%s%s", tp,
             p->P, p->M, dt_pp_schedule_name(p->kind), s->sync->sharded ? ", " : "",
             s->sync->sharded ? s->sync->label : "");
    const dt_block *b0 = &m->blocks[0], *b1 = &m->blocks[m->num_blocks - 1];
    DT_DEBUG("pipeline stage %d of %d (rank %d): %s..%s, %zu parameters, %d activation slot%s "
             "of %d samples",
             p->stage, p->P, e->rank, b0->name, b1->name, m->num_params, p->slots,
             p->slots == 1 ? "" : "s", p->mb_cap);
    if (e->rank == 0) {
        char split[DT_MAX_STAGES * 5 + 1] = "";
        for (int i = 0, n = 0; i < p->P && n < (int)sizeof split; i++)
            n += snprintf(split + n, sizeof split - (size_t)n, "%s%d", i ? "," : "", blocks[i]);
        /* with train.global_batch a micro-step may hold fewer than batch_size samples (the
         * model line says how many): its micro-batches are then smaller */
        DT_INFO("pipeline: %d stages of %s blocks (%s), %d micro-batches of %s%d samples%s, "
                "schedule %s, %d data-parallel replica%s; %zu parameters in all",
                p->P, split, j->n_stage_blocks ? "as parallel.stages" : "balanced by cost",
                p->M, j->global_batch > 0 ? "up to " : "", p->mb_cap,
                j->global_batch > 0 ? " per micro-step (train.global_batch sizes the micro-steps)"
                                    : "",
                dt_pp_schedule_name(p->kind), p->g.grid.D, p->g.grid.D == 1 ? "" : "s",
                p->whole_numel);
    }
    return 0;
}

static int pipe_start(dt_strategy *s, dt_err *err)
{
    pipe_impl *p = s->impl;
    /* what a resume loaded into the staging, or the initial parameters open put there */
    int rc = 0;
    for (int k = 0; k < p->stg.n && !rc; k++)
        rc = dt_strategy_tp_slice(s, p->g.grid.tp, p->stg.buf[k], p->own_off,
                                  dt_dpsync_local(s->sync, k), err);
    if (rc)
        return dt_err_prefix(err, "pipeline stage %d: ", p->stage);
    if (p->nwbuf) /* this stage's buffers: as a resume loaded them, or as they were */
        s->be->memcpy_d2d(s->be, s->model->buffers, p->wbuf + p->wb_base[p->stage],
                          sizeof(float) * s->model->num_buffers);
    dt_staging_release(&p->stg, s->be);
    /* the stage of data-parallel rank 0 everywhere (DDP: the reducer checks it across the
     * replicas first), this rank's part of the state */
    if ((rc = dt_dpsync_start(s->sync, err)))
        return dt_err_prefix(err, "pipeline stage %d: %s over its %d replicas: ", p->stage,
                             s->sync->label, p->g.grid.D);
    return 0;
}

/* ---- a step -------------------------------------------------------------------------------- */

/* Micro-batch of b: samples [from, from + count). */
static dt_batch slice(const pipe_impl *p, const dt_batch *b, int from, int count)
{
    return dt_batch_slice(b, from, count, p->x_numel);
}

/* Cuts b into nmb micro-batches of near-equal size (the first ones one larger) and counts
 * their targets that count. */
static void split(pipe_impl *p, const dt_batch *b, int nmb)
{
    size_t per = b->T > 0 ? (size_t)b->T : 1;
    for (int k = 0, at = 0; k < nmb; k++) {
        p->mb_from[k] = at;
        p->mb_size[k] = b->B / nmb + (k < b->B % nmb);
        p->mb_valid[k] = 0;
        for (size_t i = (size_t)at * per; b->targets && i < (size_t)(at + p->mb_size[k]) * per;
             i++)
            p->mb_valid[k] += b->targets[i] >= 0;
        at += p->mb_size[k];
    }
}

/* Waits for the posted p2p batches, in order, up to the one that holds list action `upto`
 * (INT_MAX: all), and frees their handles; a failure names the stage, the rank and the
 * micro-batch the stage was about to compute. */
static int wait_upto(pipe_impl *p, int upto, const char *what, int mb, dt_err *err)
{
    int rc = 0;
    for (; p->wfront < p->nworks && p->work_first[p->wfront] <= upto; p->wfront++) {
        const int i = p->wfront;
        dt_err e2 = {0};
        int r = dt_comm_wait(p->g.pp, p->works[i], rc ? &e2 : err);
        dt_trace_end_async(p->work_t0[i], "p2p", DT_TRACE_COMM, p->work_name[i], "mb",
                           p->work_mb[i], "bytes", p->work_bytes[i]);
        if (r && !rc) {
            rc = r;
            dt_err_prefix(err, "pipeline stage %d of %d (rank %d), %s micro-batch %d: ",
                          p->stage, p->P, p->g.grid.rank, what, mb);
        }
    }
    if (p->wfront == p->nworks)
        p->wfront = p->nworks = 0;
    return rc;
}

/* The p2p operation of comm action a. */
static dt_p2p_op p2p_op(const pipe_impl *p, const dt_model *m, dt_pp_action a)
{
    int slot = a.mb % p->slots, n = p->mb_size[a.mb];
    switch (a.op) {
    case DT_PP_SEND_ACT:
        return (dt_p2p_op){DT_P2P_SEND, p->out[slot], (size_t)n * m->pp_out_numel, DT_FLOAT32,
                           p->stage + 1};
    case DT_PP_RECV_ACT:
        return (dt_p2p_op){DT_P2P_RECV, p->recv_act[a.mb % p->nrecv], (size_t)n * m->pp_in_numel,
                           DT_FLOAT32, p->stage - 1};
    case DT_PP_SEND_GRAD:
        return (dt_p2p_op){DT_P2P_SEND, p->grad_in[a.mb % 2], (size_t)n * m->pp_in_numel,
                           DT_FLOAT32,
                           p->stage - 1};
    default: /* DT_PP_RECV_GRAD */
        return (dt_p2p_op){DT_P2P_RECV, p->grad_out[a.mb % 2], (size_t)n * m->pp_out_numel,
                           DT_FLOAT32,
                           p->stage + 1};
    }
}

/* v[0..n) (n <= 8) from the last stage to every stage of the pipeline. */
static int from_last_stage(dt_strategy *s, pipe_impl *p, double *v, int n, dt_err *err)
{
    uint64_t ts = dt_trace_begin();
    s->be->memcpy_h2d(s->be, p->scalars, v, sizeof(double) * (size_t)n);
    int rc = dt_comm_broadcast(p->g.pp, p->scalars, (size_t)n, DT_FLOAT64, p->P - 1, NULL, err);
    dt_trace_end(ts, DT_TRACE_COMM, "loss from the last stage");
    if (rc)
        return dt_err_prefix(err, "pipeline stage %d (rank %d): the loss from the last stage: ",
                             p->stage, p->g.grid.rank);
    s->be->memcpy_d2h(s->be, v, p->scalars, sizeof(double) * (size_t)n);
    return 0;
}

/* What one run of a list gives back. */
typedef struct run_out {
    double loss_sum; /* last stage: the micro-batches' losses x their valid targets */
    int64_t correct; /* last stage: correct predictions */
    double compute;  /* seconds in stage_forward/stage_backward */
    double fwd, bwd; /* ... in forwards, in backwards */
    int peak;        /* most micro-batches alive at once */
} run_out;

/* Runs list[0..n) on batch (split into p->mb_* already): p2p batches posted as they come,
 * each compute after wait_upto what it needs; training: backward too, micro-batch k's with
 * dloss x valid_k / valid (last: the step's last micro-step, DDP hears of the gradients in its
 * last backward). Waits for everything before it returns. */
static int run_list(dt_strategy *s, pipe_impl *p, const dt_pp_action *list, int n,
                    const dt_batch *batch, bool training, float dloss, bool last, int64_t valid,
                    int last_mb, run_out *o, dt_err *err)
{
    dt_model *m = s->model;
    const dt_model_stage_ops *so = m->stage;
    int live = 0, rc = 0;
    memset(o, 0, sizeof *o);
    for (int i = 0; i < n && !rc; i++) {
        dt_pp_action a = list[i];
        if (dt_pp_op_is_comm(a.op)) {
            /* the batch [i, end): posted at once, waited for before the compute that needs it */
            const int first = i, end = dt_pp_batch_end(list, n, i), nops = end - first;
            bool sends = false, recvs = false;
            int64_t bytes = 0;
            int mb = a.mb;
            for (int k = 0; k < nops; k++) {
                p->ops[k] = p2p_op(p, m, list[first + k]);
                sends |= p->ops[k].kind == DT_P2P_SEND;
                recvs |= p->ops[k].kind == DT_P2P_RECV;
                if (p->ops[k].kind == DT_P2P_RECV)
                    mb = list[first + k].mb;
                bytes += (int64_t)(p->ops[k].count * sizeof(float));
            }
            p->work_t0[p->nworks] = dt_trace_begin();
            p->work_mb[p->nworks] = mb;
            p->work_name[p->nworks] = sends && recvs ? "send+recv" : sends ? "send" : "recv";
            p->work_bytes[p->nworks] = bytes;
            p->work_first[p->nworks] = first;
            if ((rc = dt_comm_p2p(p->g.pp, p->ops, nops, &p->works[p->nworks], err)))
                dt_err_prefix(err, "pipeline stage %d of %d (rank %d), micro-batch %d: ",
                              p->stage, p->P, p->g.grid.rank, a.mb);
            else
                p->nworks++;
            i = end - 1;
            continue;
        }
        bool fwd = a.op == DT_PP_FWD;
        /* what this compute reads, or overwrites while a send still reads it */
        if ((rc = wait_upto(p, dt_pp_wait_before(list, i, p->slots),
                            fwd ? "forward of" : "backward of", a.mb, err)))
            break;
        int slot = a.mb % p->slots;
        dt_batch mb = slice(p, batch, p->mb_from[a.mb], p->mb_size[a.mb]);
        double t1 = dt_now_s();
        dt_flight_phase(fwd ? DT_PHASE_FORWARD : DT_PHASE_BACKWARD);
        uint64_t ts = dt_trace_begin();
        if (fwd) {
            float l = 0;
            rc = so->stage_forward(m, slot, &mb, p->stage > 0 ? p->recv_act[a.mb % p->nrecv] : NULL,
                                   training, &p->out[slot], &l, err);
            o->loss_sum += (double)l * (double)p->mb_valid[a.mb];
            o->correct += m->last_correct;
            live++; /* DT_MAX evaluates its arguments twice */
            o->peak = DT_MAX(o->peak, live);
        } else {
            float dl = valid > 0 ? (float)((double)dloss * (double)p->mb_valid[a.mb] /
                                           (double)valid)
                                 : 0.0f;
            /* DDP's no_sync: the sync hears of the gradients in the step's last backward */
            dt_grad_ready_fn fn;
            void *fctx;
            dt_dpsync_backward_begin(s->sync, last && a.mb == last_mb, &fn, &fctx);
            rc = so->stage_backward(m, slot, dl,
                                    p->stage < p->P - 1 ? p->grad_out[a.mb % 2] : NULL,
                                    p->stage > 0 ? p->grad_in[a.mb % 2] : NULL, fn, fctx, err);
            live--;
        }
        s->be->synchronize(s->be);
        double dt = dt_now_s() - t1;
        o->compute += dt;
        *(fwd ? &o->fwd : &o->bwd) += dt;
        dt_trace_end_arg(ts, fwd ? DT_TRACE_FORWARD : DT_TRACE_BACKWARD,
                         fwd ? "forward" : "backward", "mb", a.mb);
        if (rc)
            dt_err_prefix(err, "pipeline stage %d of %d (rank %d), %s of micro-batch %d: ",
                          p->stage, p->P, p->g.grid.rank, fwd ? "forward" : "backward", a.mb);
    }
    if (rc) {
        dt_err ignored = {0};
        wait_upto(p, INT_MAX, "after", -1, &ignored);
        return rc;
    }
    return wait_upto(p, INT_MAX, "the end of", last_mb, err);
}

static int pipe_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                           float *loss, dt_err *err)
{
    pipe_impl *p = s->impl;
    /* a micro-step of fewer than M samples (train.global_batch's last share) runs as many
     * micro-batches of one as it has samples, through the same schedule for that many (every
     * stage of a pipeline draws the same samples, so all build the same lists) */
    int nmb = DT_MIN(p->M, batch->B), n = p->nlist, rc;
    const dt_pp_action *list = p->list;
    if (nmb < 1)
        return dt_err_set(err, -EINVAL, "pipeline: an empty micro-step");
    if (nmb < p->M) {
        if ((rc = dt_pp_schedule_build(p->kind, p->P, nmb, p->stage, p->eval_list,
                                       dt_pp_schedule_cap(p->M), &n, err)))
            return rc;
        dt_pp_post_early(p->eval_list, n); /* needs no more buffers than M's list */
        list = p->eval_list;
    }
    split(p, batch, nmb);
    int64_t valid = 0;
    for (int k = 0; k < nmb; k++)
        valid += p->mb_valid[k];
    double t0 = dt_now_s();
    run_out o;
    rc = run_list(s, p, list, n, batch, true, dloss, last, valid, nmb - 1, &o, err);
    dt_dpsync_drop(s->sync); /* every block gathered for the run given back (ZeRO-3) */
    if (rc)
        return rc;
    double v = valid > 0 ? o.loss_sum / (double)valid : 0.0;
    if ((rc = from_last_stage(s, p, &v, 1, err)))
        return rc;
    *loss = (float)v;
    p->st.step_s = dt_now_s() - t0;
    p->st.compute_s = o.compute;
    p->st.fwd_s = o.fwd;
    p->st.bwd_s = o.bwd;
    p->st.idle = p->st.step_s > 0 ? 1.0 - o.compute / p->st.step_s : 0;
    p->st.peak_in_flight = o.peak;
    p->st.peak_act_bytes = (size_t)o.peak * s->model->pp_slot_bytes;
    return 0;
}

/* The tied tensors' gradients summed between the first and the last stage (the embedding
 * group), so both copies take the same update and stay equal (ctx: the pipe_impl). */
static int sum_tied(void *ctx, dt_err *err)
{
    pipe_impl *p = ctx;
    const dt_model *m = p->self->model;
    int rc = 0;
    for (int i = 0; i < p->ntied && !rc; i++) {
        const dt_tensor_info *ti = &m->tensors[p->tied[i]];
        uint64_t ts = dt_trace_begin();
        if ((rc = dt_comm_allreduce(p->g.embed, m->grads + ti->offset, ti->numel, DT_FLOAT32,
                                    DT_SUM, NULL, err)))
            dt_err_prefix(err, "pipeline stage %d (rank %d): the tied %s's gradient over the "
                               "embedding group: ",
                          p->stage, p->g.grid.rank, ti->name);
        dt_trace_end(ts, DT_TRACE_COMM, "tied embedding all-reduce");
    }
    return rc;
}

/* The sync's finish over the stage's replicas, with the tied tensors summed where it needs
 * them: after DDP's average, before ZeRO's reduce-scatters (their shards differ between the
 * two stages). */
static int pipe_sync_grads(dt_strategy *s, dt_err *err)
{
    pipe_impl *p = s->impl;
    double t0 = dt_now_s(), waited;
    int rc = dt_dpsync_finish(s->sync, p->ntied ? sum_tied : NULL, p, &waited, err);
    s->comm_time_s = dt_now_s() - t0;
    return rc;
}

/* The mean over every rank of the world (each stage of a pipeline holds the same loss). */
static int pipe_average(dt_strategy *s, double *v, int n, dt_err *err)
{
    pipe_impl *p = s->impl;
    if (n > 8)
        return dt_err_set(err, -EINVAL, "pipeline: average of %d values (8 at most)", n);
    s->be->memcpy_h2d(s->be, p->scalars, v, sizeof(double) * (size_t)n);
    int rc = dt_comm_allreduce(s->comm, p->scalars, (size_t)n, DT_FLOAT64, DT_AVG, NULL, err);
    if (rc)
        return dt_err_prefix(err, "pipeline: averaging over the %d ranks: ", p->g.grid.world);
    s->be->memcpy_d2h(s->be, v, p->scalars, sizeof(double) * (size_t)n);
    return 0;
}

/* The global norm (dpsync.h's clip): each rank's sum of squares of what it alone holds (its
 * slices of the split tensors; the replicated ones on tensor rank 0 only; a tied tensor on the
 * first stage that holds it: p->counted; under ZeRO its shard of them, added over dp first),
 * added over the tensor group and then over the pipeline group (the replicas of a stage hold
 * the same all-reduced gradient); then clip_grad_norm_'s scaling. */
static int pipe_clip(dt_strategy *s, double unscale, double *norm, dt_err *err)
{
    pipe_impl *p = s->impl;
    dt_comm *const groups[2] = {p->g.tp, p->g.pp};
    int rc = dt_dpsync_clip(s->sync, unscale, p->counted, groups, 2, p->scalars, norm, err);
    return rc ? dt_err_prefix(err, "pipeline stage %d: ", p->stage) : 0;
}

/* Forward only: the forward half of GPipe's list over up to M micro-batches (in the slots
 * training uses, pipelined as training's forwards are); the last stage's loss and correct
 * count go to every stage. */
static int pipe_eval_step(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                          dt_err *err)
{
    pipe_impl *p = s->impl;
    int nmb = (batch->B + p->mb_cap - 1) / p->mb_cap;
    if (nmb > p->M)
        return dt_err_set(err, -EINVAL, "pipeline: an evaluation batch of %d samples (%d at "
                                        "most)",
                          batch->B, p->M * p->mb_cap);
    split(p, batch, nmb);
    int n = 0, rc = dt_pp_schedule_build(DT_PP_GPIPE, p->P, nmb, p->stage, p->eval_list,
                                         dt_pp_schedule_cap(p->M), &n, err);
    if (rc)
        return rc;
    dt_pp_post_early(p->eval_list, n); /* forward only: two receive buffers suffice */
    int nf = 0; /* the forward half: everything before the first backward's actions */
    while (nf < n && p->eval_list[nf].op != DT_PP_BWD && p->eval_list[nf].op != DT_PP_RECV_GRAD &&
           p->eval_list[nf].op != DT_PP_SEND_GRAD)
        nf++;
    int64_t valid = 0;
    for (int k = 0; k < nmb; k++)
        valid += p->mb_valid[k];
    run_out o;
    rc = run_list(s, p, p->eval_list, nf, batch, false, 0, false, valid, nmb - 1, &o, err);
    dt_dpsync_drop(s->sync);
    if (rc)
        return dt_err_prefix(err, "evaluation: ");
    double v[2] = {valid > 0 ? o.loss_sum / (double)valid : 0.0, (double)o.correct};
    if ((rc = from_last_stage(s, p, v, 2, err)))
        return rc;
    *loss = (float)v[0];
    *correct = (int64_t)v[1];
    return 0;
}

/* The staging a save read is free again (the trainer fenced the save's copy before this). */
static int pipe_optim_step(dt_strategy *s, double lr, dt_err *err)
{
    pipe_impl *p = s->impl;
    dt_staging_release(&p->stg, s->be);
    return dt_dpsync_step(s->sync, lr, err);
}

/* ---- checkpoints --------------------------------------------------------------------------- */

static int pipe_state(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err)
{
    pipe_impl *p = s->impl;
    int rc = dt_strategy_state_staged(s, p->whole, p->nwhole, &p->stg, bufs, cap, n, err);
    if (rc || !p->nwbuf)
        return rc;
    if (*n >= cap)
        return dt_err_set(err, -ENOSPC, "checkpoint buffers: room for %d, %d needed", cap,
                          *n + 1);
    /* BatchNorm statistics: the gathered copy, which the next forward leaves alone; copied at
     * save all the same, as every layout's buffers are */
    bufs[(*n)++] = (dt_ckpt_buf){"model", "", p->wbt, p->nwbuf, p->wbuf, p->wb_numel, true};
    return 0;
}

/* This stage's tensors (its slices under T > 1) as the sync owns them; the tied copy of a
 * later stage is the earlier stage's to write. */
static int pipe_pieces(dt_strategy *s, dt_ckpt_piece **out, int *n, dt_err *err)
{
    pipe_impl *p = s->impl;
    return dt_strategy_sync_pieces(s, p->g.grid.tp, p->tied_copy ? p->tied : NULL,
                                   p->tied_copy ? p->ntied : 0, out, n, err);
}

static int pipe_gather_state(dt_strategy *s, dt_err *err)
{
    pipe_impl *p = s->impl;
    int rc = dt_staging_commit(&p->stg, s->be, err);
    if (!rc) /* a sharding sync: the shards over dp into the stage's layout first */
        rc = dt_dpsync_gather_state(s->sync, err);
    for (int k = 0; k < p->stg.n && !rc; k++)
        rc = gather_whole(s, p, dt_dpsync_local(s->sync, k), p->stg.buf[k], err);
    if (!rc)
        rc = gather_buffers(s, p, err);
    return rc ? dt_err_prefix(err, "pipeline stage %d: gathering the stages' tensors: ",
                              p->stage)
              : 0;
}

/* The reducer, the groups, then the world and what they served. */
static void pipe_close(dt_strategy *s)
{
    pipe_impl *p = s->impl;
    dt_dpsync_close(s->sync);
    s->sync = NULL;
    s->optim = NULL;
    if (p) {
        dt_groups_close(&p->g);
        if (s->be) {
            for (int k = 0; k < p->nrecv && p->recv_act; k++)
                s->be->free(s->be, p->recv_act[k]);
            for (int k = 0; k < 2; k++) {
                s->be->free(s->be, p->grad_in[k]);
                s->be->free(s->be, p->grad_out[k]);
            }
            s->be->free(s->be, p->scalars);
            s->be->free(s->be, p->wbuf);
        }
        dt_staging_free(&p->stg, s->be);
        free(p->recv_act);
        free(p->out);
        free(p->list);
        free(p->eval_list);
        free(p->ops);
        free(p->works);
        free(p->work_t0);
        free(p->work_mb);
        free(p->work_name);
        free(p->work_bytes);
        free(p->work_first);
        free(p->mb_from);
        free(p->mb_size);
        free(p->mb_valid);
        free(p->whole);
        free(p->tables);
        free(p->counts);
        free(p->tensor_at);
        free(p->sw_at);
        free(p->tied);
        free(p->own_off);
        free(p->counted);
        free(p->wbt);
        free(p->wb_base);
        free(p->wb_len);
    }
    dt_comm_free(s->comm);
    s->comm = NULL;
    dt_model_free(s->model);
    dt_backend_close(s->be);
    free(p);
}

static void pipe_stats(dt_strategy *s, dt_strategy_stats *out)
{
    out->pipeline = true;
    out->pp = ((const pipe_impl *)s->impl)->st;
}

const dt_strategy_ops dt_strategy_pipeline_ops = {
    .name = "pipeline",
    .rank_batch = pipe_rank_batch,
    .open = pipe_open,
    .start = pipe_start,
    .zero_grads = dt_strategy_sync_zero_grads,
    .micro_step = pipe_micro_step,
    .sync_grads = pipe_sync_grads,
    .average = pipe_average,
    .clip = pipe_clip,
    .optim_step = pipe_optim_step,
    .eval_step = pipe_eval_step,
    .state = pipe_state,
    .gather_state = pipe_gather_state,
    .pieces = pipe_pieces,
    .stats = pipe_stats,
    .replica_backend = dt_strategy_backend_one,
    .close = pipe_close,
};
