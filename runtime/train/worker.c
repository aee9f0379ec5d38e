/* worker.c - the training loop of `dtrain worker`; see worker.h.
 *
 * Reads top to bottom: checkpoints (open with the strategy's buffers, resume, save), building
 * the trainer, one step, evaluation, the run with its metrics and summary, and the entry point
 * with the error file. How a step is spread over ranks is the strategy's (strategy.h): the loop
 * calls its ops and never asks which one runs. Only dt_worker_main decides an exit code;
 * nothing here exits.
 */
#include "runtime/train/worker.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/job/errfile.h"
#include "runtime/job/worker_guard.h"
#include "runtime/train/parallel/strategies.h"
#include "runtime/train/obs/flight.h"
#include "runtime/train/obs/trace.h"

/* ---- checkpoints ------------------------------------------------------------------------------ */

/* checkpoint.dir, else <output dir>/checkpoints. */
static void ckpt_dir(const dt_trainer *t, char *buf, size_t cap)
{
    if (t->job.ckpt_dir[0])
        dt_strlcpy(buf, t->job.ckpt_dir, cap);
    else
        snprintf(buf, cap, "%s/checkpoints", t->job.output_dir);
}

/* The checkpoint of this trainer: what the strategy says a checkpoint holds (the model's
 * parameters and buffers, the optimiser's state under the optimiser's names). */
static int ckpt_open(dt_trainer *t, dt_err *err)
{
    const dt_job *j = &t->job;
    char dir[DT_PATH_MAX + 32];
    ckpt_dir(t, dir, sizeof dir);
    dt_ckpt_buf bufs[8];
    int n = 0;
    int rc = t->s->ops->state(t->s, bufs, (int)DT_ARRAY_LEN(bufs), &n, err);
    if (rc)
        return rc;
    dt_ckpt_opts co = {.dir = dir, .keep = j->ckpt_keep, .async = j->ckpt_async,
                       .concurrent_copy = j->ckpt_async && t->be->host_memory,
                       .io_buffer = (size_t)j->ckpt_io_buffer_mb << 20,
                       .host_copy = j->ckpt_host_copy};
    dt_ckpt_piece *pieces = NULL;
    if (j->ckpt_sharded && t->s->ops->pieces) { /* every rank writes what it owns */
        if ((rc = t->s->ops->pieces(t->s, &pieces, &co.npieces, err)))
            return rc;
        co.sharded = true;
        co.pieces = pieces;
        co.comm = t->s->comm;
        co.rank = t->env.rank;
        co.world = t->env.world_size;
    }
    rc = dt_ckpt_open(&t->ckpt, &co, t->be, bufs, n, err);
    free(pieces);
    t->ckpt_sharded = co.sharded;
    return rc;
}

/* Resumes from checkpoint.resume. A restart (attempt > 0) of a run that began from an explicit
 * path continues from what this run saved since, not from that path again. */
static int ckpt_resume(dt_trainer *t, dt_err *err)
{
    const dt_job *j = &t->job;
    dt_ckpt_state st;
    dt_ckpt_state_init(&st);
    char path[DT_PATH_MAX + 64] = "";
    bool resumed = false;
    int rc = 0;
    dt_err damaged = {0}; /* resume = auto found only damaged checkpoints (said after the sync) */
    if (j->resume == DT_RESUME_PATH && t->env.attempt > 0)
        rc = dt_ckpt_resume_run(t->ckpt, t->env.run_id, &st, &resumed, path, sizeof path, err);
    if (!rc && !resumed && j->resume != DT_RESUME_NEVER) {
        /* auto: the newest checkpoint of any run under the directory (run_id NULL). */
        if (j->resume == DT_RESUME_AUTO)
            rc = dt_ckpt_resume_run(t->ckpt, NULL, &st, &resumed, path, sizeof path, err);
        else
            rc = dt_ckpt_resume(t->ckpt, j->resume_path, &st, &resumed, path, sizeof path, err);
        /* A bad checkpoint.resume = PATH, or a checkpoint directory of another setup, fails the
         * same way on every restart: a configuration error, which retry scripts must not
         * retry (exit 2). Running out of memory or an I/O error is not. */
        if (rc && rc != -ENOMEM && rc != -EIO && (rc == -EXDEV || j->resume != DT_RESUME_AUTO))
            t->config_error = true;
        if (rc == -EBADMSG && j->resume == DT_RESUME_AUTO) { /* unless another rank has one */
            damaged = *err;
            rc = 0;
        }
    }
    /* another setup's checkpoint where this run will save: stop now, not at that save */
    if (!rc && (rc = dt_ckpt_check_ahead(t->ckpt, resumed ? st.step : 0, t->total_steps, err)))
        t->config_error = rc == -EXDEV;
    /* Every rank resumes from the newest checkpoint any rank found; a rank that could not see it
     * (node-local disks) takes it over the network instead of training from another state. */
    int64_t mine = resumed ? st.step : -1, src_step = mine;
    int src = 0;
    bool adopted = false;
    if (!rc)
        rc = dt_ckpt_sync(t->ckpt, t->s->comm, t->env.rank, &st, &resumed, &src, &src_step, &adopted,
                          err);
    if (!rc && adopted) {
        char a[64] = "found no checkpoint", dir[DT_PATH_MAX + 32];
        if (mine >= 0)
            snprintf(a, sizeof a, "found step %lld", (long long)mine);
        ckpt_dir(t, dir, sizeof dir);
        DT_WARN("rank %d %s in %s but rank %d resumed at step %lld: it took rank %d's model and "
                "optimiser state over the network (the checkpoint directory is not shared "
                "between the nodes, or holds other steps on this one)",
                t->env.rank, a, dir, src, (long long)src_step, src);
    }
    if (!rc && !resumed && damaged.code) { /* no rank found one: never a fresh start over them */
        *err = damaged;
        rc = damaged.code;
        t->config_error = true;
    }
    if (rc || !resumed)
        goto out;
    double opt_t = 0;
    t->step = st.step;
    dt_sampler_set_state(&t->sampler, st.epoch, st.sample_pos);
    dt_ckpt_state_get_rng(&st, "trainer", &t->rng);
    t->optim->t = dt_ckpt_state_get_scalar(&st, "optim_t", &opt_t) == 0 ? (int64_t)opt_t : st.step;
    double scale, clean;
    if (t->scaler.on && dt_ckpt_state_get_scalar(&st, "loss_scale", &scale) == 0 && scale > 0) {
        t->scaler.scale = scale; /* where the last run found it, not train.loss_scale again */
        if (dt_ckpt_state_get_scalar(&st, "loss_scale_clean", &clean) == 0)
            t->scaler.clean = (int)clean;
    }
    t->last_saved_step = st.step;
    t->samples_seen = st.samples_seen;
    double run; /* checkpoints older than the run id start a new one */
    if (dt_ckpt_state_get_scalar(&st, "run", &run) == 0 && run > 0)
        t->run = (uint64_t)run;
    if (adopted) /* rank 0 has no path of its own: say where the state came from */
        snprintf(path, sizeof path, "rank %d's checkpoint, over the network", src);
    if (t->env.rank == 0)
        DT_INFO("resumed from %s: step %lld, epoch %lld, sample %lld (saved by %d rank%s)", path,
                (long long)st.step, (long long)st.epoch, (long long)st.sample_pos, st.world_size,
                st.world_size == 1 ? "" : "s");
out:
    dt_ckpt_state_clear(&st);
    return rc;
}

static int ckpt_save_now(dt_trainer *t, dt_err *err);

/* Saves the current step unless it is saved already, as a "checkpoint" span of the timeline
 * (the copy the training waits for; a background write goes on after it). */
static int ckpt_save(dt_trainer *t, dt_err *err)
{
    if (!t->ckpt || t->last_saved_step == t->step)
        return 0;
    dt_flight_phase(DT_PHASE_CKPT);
    uint64_t ts = dt_trace_begin();
    int rc = ckpt_save_now(t, err);
    dt_trace_end(ts, DT_TRACE_CKPT, "checkpoint");
    return rc;
}

/* Saves the current step: sharded, every rank its own pieces (nothing gathered); else rank 0
 * (tensors are whole and identical on every rank, once the strategy gathered them: every rank
 * comes here at the same steps and takes part). */
static int ckpt_save_now(dt_trainer *t, dt_err *err)
{
    int rc;
    if (!t->ckpt_sharded && t->s->ops->gather_state && (rc = t->s->ops->gather_state(t->s, err)))
        return dt_err_prefix(err, "gathering the checkpoint of step %lld: ", (long long)t->step);
    if (t->ckpt_sharded) { /* what this rank owns now (ZeRO-1/2's buckets move after step 1) */
        dt_ckpt_piece *pieces = NULL;
        int np = 0;
        if ((rc = t->s->ops->pieces(t->s, &pieces, &np, err)) ||
            (rc = dt_ckpt_set_pieces(t->ckpt, pieces, np, err))) {
            free(pieces);
            return dt_err_prefix(err, "the checkpoint of step %lld: ", (long long)t->step);
        }
        free(pieces);
    }
    if (!t->ckpt_sharded && t->env.rank != 0) {
        t->last_saved_step = t->step; /* as rank 0's, so every rank gathers at the same steps */
        return 0;
    }
    dt_ckpt_state st;
    dt_ckpt_state_init(&st);
    st.step = t->step;
    st.epoch = t->sampler.epoch;
    st.sample_pos = t->sampler.pos;
    st.samples_seen = t->samples_seen;
    st.world_size = t->env.world_size;
    st.loss = t->loss;
    st.lr = t->lr;
    dt_strlcpy(st.run_id, t->env.run_id, sizeof st.run_id);
    char *job = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&job, &len);
    if (f) {
        dt_job_print(&t->job, f);
        fclose(f);
    }
    st.job = job;
    rc = dt_ckpt_state_set_rng(&st, "trainer", &t->rng);
    if (!rc)
        rc = dt_ckpt_state_set_scalar(&st, "optim_t", (double)t->optim->t);
    if (!rc)
        rc = dt_ckpt_state_set_scalar(&st, "run", (double)t->run);
    if (!rc && t->scaler.on)
        rc = dt_ckpt_state_set_scalar(&st, "loss_scale", t->scaler.scale);
    if (!rc && t->scaler.on)
        rc = dt_ckpt_state_set_scalar(&st, "loss_scale_clean", (double)t->scaler.clean);
    if (!rc)
        rc = dt_ckpt_save(t->ckpt, &st, err);
    else
        dt_err_set(err, rc, "checkpoint state table full");
    free(job);
    if (!rc)
        t->last_saved_step = t->step;
    return rc;
}

int dt_trainer_save(dt_trainer *t, dt_err *err)
{
    int rc = ckpt_save(t, err);
    if (!rc && t->ckpt)
        rc = dt_ckpt_wait(t->ckpt, err);
    return rc;
}

/* Saves every checkpoint.every steps. */
static int ckpt_after_step(dt_trainer *t, dt_err *err)
{
    if (t->job.ckpt_every > 0 && t->step % t->job.ckpt_every == 0)
        return ckpt_save(t, err);
    return 0;
}

/* Saves at the end, or when stopped by a signal, and waits for it. */
static int ckpt_finish(dt_trainer *t, bool stopped, dt_err *err)
{
    if (stopped && t->env.rank == 0)
        DT_INFO("stopped by a signal; saving step %lld", (long long)t->step);
    int rc = ckpt_save(t, err);
    if (!rc && t->ckpt) /* the save logs where it went */
        rc = dt_ckpt_wait(t->ckpt, err);
    /* Nobody leaves before rank 0's checkpoint is on disk: the agent stops every worker as soon
     * as one exits non-zero (75 after a preemption), which must not cut rank 0's write short. */
    if (t->s->comm && t->env.world_size > 1) {
        dt_err berr = {0};
        int brc = dt_comm_barrier(t->s->comm, &berr);
        if (brc && !rc) {
            rc = brc;
            if (err)
                *err = berr;
        }
    }
    return rc;
}

/* ---- building ------------------------------------------------------------------------------- */

/* train.precision as the backend's type. */
static dt_precision backend_precision(dt_precision_kind p)
{
    switch (p) {
    case DT_PRECISION_BF16:
        return DT_PREC_BF16;
    case DT_PRECISION_FP16:
        return DT_PREC_FP16;
    case DT_PRECISION_FP32:
        break;
    }
    return DT_PREC_FP32;
}

int dt_trainer_init(dt_trainer *t, const dt_job *job, const dt_worker_env *env, dt_err *err)
{
    memset(t, 0, sizeof *t);
    t->job = *job;
    t->env = *env;
    t->last_saved_step = -1;
    const dt_job *j = &t->job;
    /* a fresh start's run id (a resume takes its checkpoint's): 48 random bits, exact in
     * state.json's scalars */
    if (getrandom(&t->run, sizeof t->run, 0) != (ssize_t)sizeof t->run)
        t->run = (uint64_t)dt_wall_s() * 1000003u ^ (uint64_t)getpid();
    t->run = (t->run & 0xffffffffffffULL) | 1;
    dt_rng_seed2(&t->rng, (uint64_t)j->seed, (uint64_t)env->rank + 1);
    int rc;
    /* the grid: which samples this rank draws is the data-parallel rank's (dp of D); the ranks
     * of one tensor group and the stages of one pipeline draw the same. With T = P = 1, dp is
     * the rank and D the world. The agent checked the world already; this says it again for a
     * worker started otherwise. */
    if ((rc = dt_grid_init(&t->grid, env->rank, env->world_size, j->tensor, j->pipeline, err))) {
        t->config_error = true; /* every restart with this world fails the same way */
        goto fail;
    }
    const dt_grid *g = &t->grid;
    DT_INFO("layout: data %d x tensor %d x pipeline %d; this rank: dp %d, tp %d, pp %d", g->D,
            g->T, g->P, g->dp, g->tp, g->pp);
    /* the layout and its data-parallel sync, once; the layout decides how many samples this
     * rank draws per micro-step */
    const dt_dpsync_ops *sync;
    const dt_strategy_ops *ops = dt_strategy_pick(j, g, &sync);
    t->batch = ops->rank_batch(j);
    dt_ddp_opts ddp;
    if ((rc = dt_ddp_opts_from_job(&ddp, j, err))) {
        t->config_error = true;
        goto fail;
    }

    /* data first: a bad file is the most likely error and costs nothing to find. What the
     * data or the model's settings refuse fails every restart alike: a configuration error
     * (running out of memory or an I/O error is not). */
    if ((rc = dt_data_open(&t->data, j, err))) {
        t->config_error = rc != -ENOMEM && rc != -EIO;
        goto fail;
    }
    const dt_sample_shape *shape = &t->data->shape;
    t->tokens = shape->kind == DT_SAMPLE_TOKENS;
    if ((rc = dt_sampler_init(&t->sampler, dt_dataset_size(t->data->train), g->dp, g->D,
                              t->batch, (uint64_t)j->seed, j->shuffle, j->drop_last, err))) {
        dt_err_prefix(err, "%s: ", j->data_path[0] ? j->data_path : "synthetic data");
        t->config_error = rc == -EINVAL; /* too little data for one step, with this world */
        goto fail;
    }
    size_t nidx = (size_t)t->batch;
    if (j->global_batch > 0) {
        /* the step is G samples whatever the world: its micro-steps and this rank's share of
         * each follow from G, the rank's batch and the data-parallel ranks of this start */
        if ((rc = dt_gbatch_init(&t->gb, j->global_batch, g->D, t->batch, err)) ||
            (rc = dt_sampler_set_global(&t->sampler, &t->gb, err))) {
            t->config_error = true; /* every restart with this world fails the same way */
            goto fail;
        }
        t->micro_steps = dt_gbatch_rank_micro_steps(&t->gb, g->dp);
        int fewest = dt_gbatch_rank_micro_steps(&t->gb, g->D - 1);
        if (j->sync_bn && g->D > 1 && fewest != t->gb.micro_steps) {
            t->config_error = true;
            rc = dt_err_set(err, -EINVAL,
                            "train.global_batch = %lld over %d ranks of batch_size %d gives the "
                            "ranks %d or %d micro-steps, and model.sync_bn's collectives need "
                            "the same number on every rank; make train.global_batch a "
                            "multiple of the world size (%d), raise train.batch_size above 1, "
                            "or turn model.sync_bn off",
                            (long long)j->global_batch, g->D, t->batch, fewest,
                            t->gb.micro_steps, g->D);
            goto fail;
        }
        t->steps_per_epoch = dt_sampler_steps_per_epoch(&t->sampler);
        t->items_per_step = j->global_batch * (t->tokens ? shape->seq_len : 1);
        nidx *= (size_t)t->gb.micro_steps;
    } else {
        t->micro_steps = j->grad_accum;
        t->steps_per_epoch = dt_sampler_steps_per_epoch(&t->sampler) / j->grad_accum;
        t->items_per_step = (int64_t)t->batch * (t->tokens ? shape->seq_len : 1) *
                            j->grad_accum * g->D;
    }
    if (t->steps_per_epoch < 1)
        t->steps_per_epoch = 1;
    t->total_steps = j->steps > 0 ? j->steps : (int64_t)j->epochs * t->steps_per_epoch;
    if ((rc = dt_batch_buf_init(&t->batch_buf, shape, t->batch, err)))
        goto fail;
    if (!(t->idx = malloc(sizeof(int64_t) * nidx))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto fail;
    }

    /* the strategy: backend, communicator, model, optimiser */
    dt_backend_opts bo;
    dt_backend_opts_default(&bo);
    bo.device_index = env->local_rank;
    bo.threads = j->threads;
    bo.precision = backend_precision(j->precision);
    bo.mem_limit = (size_t)j->device_memory;
    dt_model_config mc;
    if ((rc = dt_model_config_from_job(&mc, j, shape, err))) {
        t->config_error = rc == -EINVAL;
        goto fail;
    }
    if (mc.max_batch < t->batch)
        mc.max_batch = t->batch;
    dt_optim_config oc;
    dt_optim_config_from_job(&oc, &t->sched, j, t->total_steps);
    dt_strategy_ctx ctx = {.job = j, .env = env, .be_opts = &bo, .model = &mc, .optim = &oc,
                           .grid = g, .ddp = &ddp, .sync = sync};
    if ((rc = dt_strategy_open(&t->s, ops, &ctx, err))) {
        t->config_error = rc == -ENODEV; /* the device the job asks for is not on this node */
        goto fail;
    }
    t->be = t->s->be;
    t->model = t->s->model;
    t->optim = t->s->optim;
    dt_loss_scaler_init(&t->scaler, bo.precision == DT_PREC_FP16, j->loss_scale,
                        j->loss_scale_window);

    /* checkpoints: open and resume; then the strategy makes the ranks agree (DDP: checks the
     * model across ranks and broadcasts rank 0's parameters, which rank 0 just resumed) */
    if ((rc = ckpt_open(t, err))) {
        if (rc == -ENOTDIR) /* a file where checkpoints go: every restart fails the same way */
            t->config_error = true;
        goto fail;
    }
    if ((rc = ckpt_resume(t, err)) || (rc = t->s->ops->start(t->s, err)))
        goto fail;
    /* metrics' peaks are training's: set-up's transients (a resume's staging, the gradient
     * buffer the model zero-fills and ZeRO-2 gives back at once) are not what a step holds */
    dt_mem_reset_peak(t->be);
    return 0;
fail:
    dt_trainer_close(t);
    return rc;
}

void dt_trainer_close(dt_trainer *t)
{
    if (!t)
        return;
    dt_ckpt_close(t->ckpt); /* waits for a pending write of the strategy's buffers */
    t->ckpt = NULL;
    if (t->trace_owned)
        dt_trace_close();
    t->trace_owned = false;
    dt_metrics_close(t->metrics);
    t->metrics = NULL;
    dt_strategy_close(t->s);
    t->s = NULL;
    t->be = NULL;
    t->model = NULL;
    t->optim = NULL;
    dt_sampler_free(&t->sampler);
    dt_batch_buf_free(&t->batch_buf);
    free(t->idx);
    t->idx = NULL;
    dt_data_free(t->data);
    t->data = NULL;
}

/* ---- one step ------------------------------------------------------------------------------- */

const char *dt_trainer_diverged_hint(const dt_job *j)
{
    if (j->grad_clip > 0)
        return "lower train.lr or raise train.warmup_steps (train.grad_clip is already on)";
    return "lower train.lr, or set train.grad_clip (e.g. 1.0)";
}

int dt_trainer_step(dt_trainer *t, dt_err *err)
{
    const dt_job *j = &t->job;
    dt_strategy *s = t->s;
    double t0 = dt_now_s();
    int rc;
    /* the timeline (train.trace): this step's spans, when it is in the traced range */
    dt_trace_step(t->step + 1);
    dt_flight_step_begin(t->step + 1); /* the flight records' position: data, from now */
    const uint64_t ts_step = dt_trace_begin();
    uint64_t ts;
    /* a new accumulation: backward ops accumulate into the gradients */
    s->ops->zero_grads(s);
    double loss_sum = 0;
    /* backward differentiates loss * scale / grad_accum (scale: fp16's loss scale, else 1) */
    const float dloss_accum = t->scaler.on ? (float)(t->scaler.scale / j->grad_accum)
                                           : 1.0f / (float)j->grad_accum;
    /* With a global batch of G the whole step's indices are drawn at once (the position moves
     * by exactly G), and a micro-step of n samples differentiates its mean loss x n x D / G:
     * gradients are averaged over the D data-parallel ranks (DDP: W = D ranks), so the gradient
     * is the mean over exactly G samples however they are shared (see dt_gbatch in data.h).
     * Its loss counts n/G likewise. */
    const bool gb = t->gb.global > 0;
    const double world = t->grid.D, scale0 = t->scaler.on ? t->scaler.scale : 1.0;
    if (gb) {
        ts = dt_trace_begin();
        if ((rc = dt_sampler_next_step(&t->sampler, t->idx, err)))
            return rc;
        dt_trace_end(ts, DT_TRACE_DATA, "sample step");
    }
    int64_t off = 0;
    for (int micro = 0; micro < t->micro_steps; micro++) {
        int n = t->batch;
        dt_flight_micro(micro);
        ts = dt_trace_begin();
        float dloss = dloss_accum;
        const int64_t *idx = t->idx;
        if (gb) {
            n = dt_gbatch_rank_count(&t->gb, micro, t->grid.dp);
            idx = t->idx + off;
            off += n;
            dloss = (float)(scale0 * n * world / (double)t->gb.global);
        } else if ((rc = dt_sampler_next(&t->sampler, t->idx, err))) {
            return rc;
        }
        if ((rc = dt_dataset_fill(t->data->train, idx, n, &t->batch_buf, err)))
            return rc;
        dt_trace_end_arg(ts, DT_TRACE_DATA, "data", "micro_step", micro);
        float loss = 0;
        bool last = micro == t->micro_steps - 1;
        dt_flight_phase(DT_PHASE_FORWARD); /* a strategy marks its backward */
        if ((rc = s->ops->micro_step(s, &t->batch_buf.batch, dloss, last, &loss, err)))
            return rc;
        if (!isfinite(loss))
            return dt_err_set(err, -EDOM,
                              "the training loss is %f at step %lld (micro-step %d): training "
                              "diverged; %s", (double)loss, (long long)t->step + 1, micro,
                              dt_trainer_diverged_hint(j));
        loss_sum += gb ? (double)loss * n : (double)loss;
    }
    dt_flight_phase(DT_PHASE_GRAD_SYNC);
    ts = dt_trace_begin();
    if ((rc = s->ops->sync_grads(s, err)))
        return rc;
    dt_trace_end(ts, DT_TRACE_COMM, "gradient sync");
    t->comm_time_s = s->comm_time_s;
    dt_ddp_stats dst;
    t->comm_bytes = dt_strategy_sync_stats(s, &dst) == 0 ? (int64_t)dst.comm_bytes : -1;
    /* The loss mean and the stop request travel together: a signal reaches the ranks at
     * different steps (or only one of them), and all must stop at the same step boundary, else
     * the one that stops waits at the save's barrier while the others wait in the next step's
     * all-reduce. The mean of 0/1 flags is > 0 when any rank was asked to stop. */
    double v[2] = {gb ? loss_sum * world / (double)t->gb.global : loss_sum / j->grad_accum,
                   t->stop && *t->stop ? 1.0 : 0.0};
    ts = dt_trace_begin();
    if ((rc = s->ops->average(s, v, 2, err)))
        return rc;
    dt_trace_end(ts, DT_TRACE_COMM, "loss average");
    double loss = v[0];
    t->stop_agreed = v[1] > 0;
    t->stop_self = t->stop && *t->stop;
    double scale = t->scaler.scale;
    dt_flight_phase(DT_PHASE_OPTIM);
    ts = dt_trace_begin();
    if ((rc = s->ops->clip(s, t->scaler.on ? 1.0 / scale : 1.0, &t->grad_norm, err)))
        return rc;
    dt_trace_end(ts, DT_TRACE_OPTIM, "clip");
    int apply = dt_loss_scaler_update(&t->scaler, isfinite(t->grad_norm));
    if (apply < 0) {
        char why[128] = "";
        if (t->scaler.on)
            snprintf(why, sizeof why, ", as in the %d steps before it (loss scale now %g)",
                     DT_LOSS_SCALER_MAX_SKIPS - 1, t->scaler.scale);
        return dt_err_set(err, -EDOM, "the gradient norm is %f at step %lld%s: training "
                                      "diverged; %s",
                          t->grad_norm, (long long)t->step + 1, why, dt_trainer_diverged_hint(j));
    }
    if (!apply && t->env.rank == 0)
        DT_INFO("step %lld: inf/NaN gradients at loss scale %g: step skipped, scale now %g",
                (long long)t->step + 1, scale, t->scaler.scale);
    t->lr = dt_lr_at(&t->sched, t->step);
    if (t->ckpt) /* a background save may still be copying the parameters and moments */
        dt_ckpt_fence(t->ckpt);
    ts = dt_trace_begin();
    if (apply && (rc = s->ops->optim_step(s, t->lr, err)))
        return rc;
    s->be->synchronize(s->be);
    dt_trace_end(ts, DT_TRACE_OPTIM, "optimizer");
    t->loss = loss;
    t->step++;
    /* this step's global batch: the world size may have changed since the last resume */
    t->samples_seen += gb ? t->gb.global : (int64_t)t->batch * j->grad_accum * t->grid.D;
    t->step_time_s = dt_now_s() - t0;
    dt_flight_step_end();
    dt_trace_end(ts_step, DT_TRACE_STEP, "step");
    return 0;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

int dt_trainer_eval(dt_trainer *t, double *loss, double *acc, dt_err *err)
{
    const dt_dataset *val = t->data->val;
    if (!val)
        return dt_err_set(err, -ENOENT, "no validation data");
    const dt_job *j = &t->job;
    int64_t n = dt_dataset_size(val);
    /* the data-parallel ranks split the set (a tensor group's ranks share their rank's part) */
    const int dp = t->grid.dp, D = t->grid.D;
    int64_t global = (int64_t)D * t->batch;
    int64_t batches = DT_MIN((int64_t)j->eval_batches, (n + global - 1) / global);
    double sums[3] = {0, 0, 0}; /* loss x samples, correct, samples */
    int rc;
    for (int64_t k = 0; k < batches; k++) {
        dt_eval_indices(n, dp, D, t->batch, k, t->idx);
        /* The last batch wraps around to the start of the set: only the samples before the
         * wrap count, so every validation sample counts once (indices rise along the batch). */
        int valid = 0;
        while (valid < t->batch &&
               k * global + (int64_t)valid * D + dp < n)
            valid++;
        /* A rank with nothing left still runs the forward (of one wrapped sample, not
         * counted): every rank runs as many eval steps, which a strategy that communicates in
         * its forward (ZeRO-3's gathers) needs. */
        if ((rc = dt_dataset_fill(val, t->idx, valid ? valid : 1, &t->batch_buf, err)))
            return rc;
        float l = 0;
        int64_t correct = 0;
        if ((rc = t->s->ops->eval_step(t->s, &t->batch_buf.batch, &l, &correct, err)))
            return rc;
        if (valid == 0)
            continue;
        sums[0] += (double)l * valid;
        sums[1] += (double)correct;
        sums[2] += valid;
    }
    /* means of the sums: their ratios are exact */
    if ((rc = t->s->ops->average(t->s, sums, 3, err)))
        return rc;
    *loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    *acc = t->tokens || !(sums[2] > 0) ? -1.0 : sums[1] / sums[2];
    return 0;
}

/* ---- the timeline (train.trace) ------------------------------------------------------------ */

/* <output_dir>/trace */
static void trace_dir(const dt_trainer *t, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/trace", t->job.output_dir);
}

/* Opens the trace when train.trace asks for one (trace.h); nothing is recorded otherwise. */
static int trace_open(dt_trainer *t, dt_err *err)
{
    int64_t first, last;
    if (dt_job_trace_steps(t->job.trace, &first, &last) || first == 0)
        return 0; /* off (the job's loader rejected anything else) */
    char dir[DT_PATH_MAX + 16];
    trace_dir(t, dir, sizeof dir);
    /* Steps this run does not train (a restart resumed past them): no trace, so the files an
     * earlier attempt wrote of them stay. Every rank resumed the same step and decides alike. */
    if (first > t->total_steps || last <= t->step) {
        if (t->env.rank == 0 && t->step < t->total_steps)
            DT_WARN("train.trace = %s: this run trains steps %lld to %lld, so nothing is "
                    "traced%s; choose steps in that range (e.g. train.trace = %lld-%lld)",
                    t->job.trace, (long long)t->step + 1, (long long)t->total_steps,
                    last <= t->step ? " (an earlier attempt's trace, if any, stays)" : "",
                    (long long)t->step + 1, (long long)DT_MIN(t->step + 3, t->total_steps));
        return 0;
    }
    dt_trace_opts o = {.dir = dir, .rank = t->env.rank, .world_size = t->env.world_size,
                       .first_step = first, .last_step = last};
    int rc = dt_trace_open(&o, err);
    if (rc)
        return rc;
    t->trace_owned = true;
    if (t->env.rank == 0)
        DT_INFO("trace: train.trace = %s; each rank's spans go to %s/rank<N>.json at the end, "
                "all ranks to %s/trace.json", t->job.trace, dir, dir);
    return 0;
}

/* Writes this rank's trace; once every rank wrote its own, rank 0 merges them into trace.json.
 * A trace that cannot be written is a warning, not a failed run; only the barrier's error (a
 * rank gone) is returned. */
static int trace_finish(dt_trainer *t, dt_err *err)
{
    if (!t->trace_owned)
        return 0;
    char path[DT_PATH_MAX + 64], dir[DT_PATH_MAX + 16], merged[DT_PATH_MAX + 32];
    dt_err werr = {0};
    size_t dropped = dt_trace_dropped();
    if (dt_trace_write(path, sizeof path, &werr))
        DT_WARN("rank %d: %s", t->env.rank, werr.msg);
    dt_trace_close();
    t->trace_owned = false;
    if (t->s->comm && t->env.world_size > 1) {
        int rc = dt_comm_barrier(t->s->comm, err);
        if (rc)
            return dt_err_prefix(err, "after writing the trace: ");
    }
    if (t->env.rank != 0)
        return 0;
    trace_dir(t, dir, sizeof dir);
    snprintf(merged, sizeof merged, "%s/trace.json", dir);
    int found = 0;
    if (dt_trace_merge(dir, t->env.world_size, merged, &found, &werr)) {
        DT_WARN("%s", werr.msg);
        return 0;
    }
    if (found < t->env.world_size)
        DT_WARN("trace: %s holds %d of the %d ranks: the others wrote rank<N>.json under their "
                "own host's %s; copy them here and run scripts/trace-png.py %s to merge", merged,
                found, t->env.world_size, dir, dir);
    printf("dtrain: trace in %s (%d rank%s%s; open it in https://ui.perfetto.dev or draw it "
           "with scripts/trace-png.py)\n",
           merged, found, found == 1 ? "" : "s",
           dropped ? ", rank 0 dropped spans past the cap" : "");
    fflush(stdout);
    return 0;
}

/* ---- the run ----------------------------------------------------------------------------------- */

static void human_count(double v, char *buf, size_t cap)
{
    if (v >= 1e6)
        snprintf(buf, cap, "%.2fM", v / 1e6);
    else if (v >= 1e4)
        snprintf(buf, cap, "%.1fk", v / 1e3);
    else
        snprintf(buf, cap, "%.1f", v);
}

static int do_eval(dt_trainer *t, double *val_loss, dt_err *err)
{
    double loss, acc;
    dt_flight_phase(DT_PHASE_EVAL);
    uint64_t ts = dt_trace_begin();
    int rc = dt_trainer_eval(t, &loss, &acc, err);
    dt_trace_end(ts, DT_TRACE_EVAL, "eval");
    if (rc)
        return dt_err_prefix(err, "evaluation at step %lld: ", (long long)t->step);
    if (!isfinite(loss))
        return dt_err_set(err, -EDOM, "the validation loss is %f at step %lld", loss,
                          (long long)t->step);
    dt_eval_record r = {.step = t->step, .val_loss = loss, .val_acc = acc};
    dt_metrics_eval(t->metrics, &r);
    *val_loss = loss;
    return 0;
}

int dt_trainer_run(dt_trainer *t, bool *stopped, dt_err *err)
{
    const dt_job *j = &t->job;
    bool rank0 = t->env.rank == 0;
    int rc;
    if (stopped)
        *stopped = false;
    if ((rc = dt_metrics_open(&t->metrics, j->output_dir, rank0, t->tokens, t->env.attempt, err)))
        return rc;
    char run[16];
    snprintf(run, sizeof run, "%012llx", (unsigned long long)t->run);
    dt_metrics_set_run(t->metrics, run);
    if ((rc = trace_open(t, err)))
        return rc;
    dt_metrics_layout(t->metrics, t->grid.world, t->grid.D, t->grid.T, t->grid.P);
    if (rank0) {
        char how[192];
        const bool dp_only = t->grid.T * t->grid.P == 1; /* the data-parallel ranks are all */
        if (t->gb.global > 0) {
            /* rank 0 has the largest share; the last rank the smallest */
            int64_t most = dt_gbatch_rank_samples(&t->gb, 0),
                    least = dt_gbatch_rank_samples(&t->gb, t->grid.D - 1);
            char share[48];
            if (most == least)
                snprintf(share, sizeof share, "%lld", (long long)most);
            else
                snprintf(share, sizeof share, "%lld or %lld", (long long)least, (long long)most);
            snprintf(how, sizeof how, "global batch %lld: %s per rank x %d %sranks in %d "
                     "micro-step%s of up to %d", (long long)t->gb.global, share, t->grid.D,
                     dp_only ? "" : "data-parallel ", t->gb.micro_steps,
                     t->gb.micro_steps == 1 ? "" : "s", t->batch);
        } else {
            snprintf(how, sizeof how, "batch %d x accum %d x %d %sranks", t->batch,
                     j->grad_accum, t->grid.D, dp_only ? "" : "data-parallel ");
        }
        DT_INFO("data: %s", t->data->desc);
        /* the whole model's count; where rank 0 holds part of it (tensor slices, a pipeline
         * stage), its share too */
        size_t local = t->model->num_params,
               whole = t->s->whole_params ? t->s->whole_params : local;
        char share[64] = "";
        if (whole != local)
            snprintf(share, sizeof share, ", rank 0 holds %zu (%.1f%%)", local,
                     whole ? 100.0 * (double)local / (double)whole : 0.0);
        DT_INFO("model: %s, %zu parameters (%.2f MB)%s on %s; %lld steps of %lld %s (%s)%s",
                dt_model_arch_name(t->model->cfg.arch), whole, (double)whole * 4 / 1e6, share,
                t->be->name, (long long)t->total_steps, (long long)t->items_per_step,
                t->tokens ? "tokens" : "samples", how, t->step ? " (resumed)" : "");
        if (!t->data->val)
            DT_INFO("no validation data (data.val_fraction = 0 and no data.val_path): no eval");
    }
    double start = dt_now_s(), val_loss = NAN;
    /* the log window: means since the last record */
    double win_loss = 0, win_time = 0, win_comm = 0, last_train = NAN, train_time = 0;
    int64_t win_bytes = 0; /* comm_bytes over the window; -1 once a step had none */
    int win_n = 0;
    int64_t steps_run = 0;
    bool evaluated_last = false;
    while (t->step < t->total_steps) {
        /* Several ranks stop only at the boundary they agreed on in the last step (see
         * dt_trainer_step); one process stops at the first boundary after the signal. */
        bool stop = t->stop_agreed || (t->env.world_size == 1 && t->stop && *t->stop);
        if (stop) {
            if (stopped)
                *stopped = true;
            break;
        }
        /* the agent re-arms nothing once it is gone: one getppid() a step says so */
        if (!dt_worker_guard_agent_alive())
            return dt_err_set(err, -ESRCH, "the dtrain agent that started this worker is gone "
                              "(its parent is now pid %d); stopping at step %lld",
                              (int)getppid(), (long long)t->step);
        if ((rc = dt_trainer_step(t, err)))
            return rc;
        steps_run++;
        train_time += t->step_time_s;
        win_loss += t->loss;
        win_time += t->step_time_s;
        win_comm += t->comm_time_s;
        win_bytes = t->comm_bytes < 0 || win_bytes < 0 ? -1 : win_bytes + t->comm_bytes;
        win_n++;
        evaluated_last = false;
        bool last = t->step == t->total_steps;
        if (t->step % j->log_every == 0 || t->step == 1 || last) {
            last_train = win_loss / win_n;
            dt_step_record r = {
                .step = t->step,
                .total_steps = t->total_steps,
                .epoch = t->sampler.epoch,
                .loss = last_train,
                .loss_steps = win_n,
                .lr = t->lr,
                .grad_norm = t->grad_norm,
                .loss_scale = t->scaler.on ? t->scaler.scale : 0,
                .skipped_steps = t->scaler.skipped,
                .items_per_s = (double)t->items_per_step * win_n / win_time,
                .step_time_s = win_time / win_n,
                .comm_time_s = win_comm / win_n,
                .comm_bytes = win_bytes < 0 ? -1 : (double)win_bytes / win_n,
                .peak_mem_bytes = t->be->peak_bytes ? t->be->peak_bytes(t->be) : 0,
                .max_rss_bytes = dt_metrics_max_rss(),
            };
            dt_mem_read(t->be, &r.mem);
            dt_metrics_step(t->metrics, &r);
            /* each record's peaks are its own steps' (and a save after the last record's) */
            dt_mem_reset_peak(t->be);
            win_loss = win_time = win_comm = 0;
            win_n = 0;
            win_bytes = 0;
        }
        if (t->data->val && j->eval_every > 0 && t->step % j->eval_every == 0) {
            if ((rc = do_eval(t, &val_loss, err)))
                return rc;
            evaluated_last = true;
        }
        if ((rc = ckpt_after_step(t, err)))
            return rc;
    }
    if (win_n)
        last_train = win_loss / win_n;
    dt_flight_phase(DT_PHASE_END);
    bool was_stopped = stopped && *stopped;
    /* complete before it began (resumed at its last step): evaluates what it resumed */
    bool complete = steps_run == 0 && !was_stopped;
    if (t->data->val && !evaluated_last && !was_stopped && (rc = do_eval(t, &val_loss, err)))
        return rc;
    if ((rc = ckpt_finish(t, was_stopped, err)))
        return rc;
    dt_metrics_finish_line(t->metrics);
    double wall = dt_now_s() - start;
    if (rank0 && complete) {
        /* Said last, where the summary would be: zeros there would read as a broken run. */
        char what[96], vl[48] = "";
        if (j->steps > 0)
            snprintf(what, sizeof what, "train.steps = %lld", (long long)j->steps);
        else
            snprintf(what, sizeof what, "train.epochs = %d: %lld steps", j->epochs,
                     (long long)t->total_steps);
        if (isfinite(val_loss))
            snprintf(vl, sizeof vl, " (its val loss %.4f)", val_loss);
        printf("dtrain: already complete at step %lld (%s)%s: nothing to train; raise "
               "train.steps to train on, or start over with checkpoint.resume=never (or "
               "another job.output_dir)\n",
               (long long)t->step, what, vl);
        fflush(stdout);
    } else if (rank0) {
        char thr[32], vl[32] = "n/a", tl[32] = "n/a";
        human_count(train_time > 0 ? (double)t->items_per_step * (double)steps_run / train_time
                                   : 0,
                    thr, sizeof thr);
        if (isfinite(val_loss))
            snprintf(vl, sizeof vl, "%.4f", val_loss);
        if (isfinite(last_train)) /* n/a when stopped before its first step */
            snprintf(tl, sizeof tl, "%.4f", last_train);
        char how[sizeof t->s->summary + 2] = "", part[96] = "";
        if (t->s->summary[0])
            snprintf(how, sizeof how, ", %s", t->s->summary);
        if (steps_run != t->step) /* resumed: the time and throughput are this run's */
            snprintf(part, sizeof part, " (%lld of them in this run, resumed at step %lld)",
                     (long long)steps_run, (long long)(t->step - steps_run));
        printf("dtrain: %s after %lld steps%s in %.1f s: train loss %s, val loss %s, %s %s/s "
               "(%d rank%s%s)\n",
               was_stopped ? "stopped" : "done", (long long)t->step, part, wall, tl, vl, thr,
               t->tokens ? "tokens" : "samples", t->env.world_size,
               t->env.world_size > 1 ? "s" : "", how);
        dt_metrics_print_summary(t->metrics, stdout); /* or how many records were lost */
        fflush(stdout);
    }
    return trace_finish(t, err);
}

/* ---- the entry point ---------------------------------------------------------------------------- */

static volatile sig_atomic_t stop_flag;
static volatile sig_atomic_t stop_signal;

/* The first stop signal asks for a checkpoint at the next step boundary. Repeats are ignored:
 * under Slurm every process gets SIGTERM and the agent forwards it again, and a second one must
 * not cut the save short. The hard stop is the agent's SIGKILL after --stop-grace (or kill -9). */
static void on_stop_signal(int sig)
{
    if (stop_flag) {
        static const char msg[] = "dtrain worker: already stopping (saving a checkpoint at the "
                                  "next step boundary); SIGKILL or Ctrl-\\ stops at once\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1); /* async-signal-safe */
        (void)w;
        return;
    }
    stop_flag = 1;
    stop_signal = sig;
}

/* An out-of-device-memory failure (the backend's DT_MEM_OOM_TEXT refusal) gets the layout and
 * what to change appended to its message; true when err is one. */
static bool oom_explain(const dt_job *j, int world, dt_err *err)
{
    if (err->code != -ENOMEM || !strstr(err->msg, DT_MEM_OOM_TEXT))
        return false;
    int T = j->tensor > 0 ? j->tensor : 1, P = j->pipeline > 0 ? j->pipeline : 1;
    int D = world / (T * P) > 0 ? world / (T * P) : 1;
    char fix[512];
    size_t n = 0;
    fix[0] = '\0';
#define FIX(...) n += (size_t)snprintf(fix + n, n < sizeof fix ? sizeof fix - n : 0, __VA_ARGS__)
    if (j->zero < 3 && D > 1)
        FIX("parallel.zero=3 (shards params, grads, optim over D=%d)", D);
    if (j->recompute == DT_RECOMP_NONE)
        FIX("%strain.recompute=block (activations)", n ? "; " : "");
    FIX("%smore parallel.tensor or parallel.pipeline ranks; a smaller train.batch_size (more "
        "train.grad_accum); a larger job.device_memory", n ? "; " : "");
#undef FIX
    char msg[2 * DT_ERR_MSG_MAX]; /* dt_err_set cuts it to what err holds */
    snprintf(msg, sizeof msg, "%s. Layout: D=%d T=%d P=%d zero=%d recompute=%s "
             "micro_batches=%d batch_size=%d. To fit: %s", err->msg, D, T, P, j->zero,
             dt_recompute_name(j->recompute), j->micro_batches, j->batch_size, fix);
    dt_err_set(err, -ENOMEM, "%s", msg);
    return true;
}

int dt_worker_main(const dt_job *job)
{
    static dt_trainer t; /* large (the job); one per process */
    dt_err err = {0};
    dt_worker_env env;
    int code = 1;
    bool stopped = false;
    dt_log_set_role("worker");
    /* first: a worker whose agent is already gone must not start training on its own */
    if (dt_worker_guard_init(&err) != 0 || dt_workenv_read(&env, &err) != 0)
        goto fail;
    dt_log_set_rank(env.world_size > 1 || getenv("RANK") ? env.rank : -1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL); /* the launcher stopping workers, schedulers preempting */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL); /* Slurm's --signal, "checkpoint and go" */
    sigaction(SIGUSR2, &sa, NULL);
    dt_flight_opts fo = {env.rank, env.world_size, env.flight_fd > 2 ? env.flight_fd : -1,
                         (uint32_t)job->flight_records, job->straggler_window,
                         job->straggler_ratio};
    if (dt_flight_open(&fo, &err) != 0 || dt_trainer_init(&t, job, &env, &err) != 0)
        goto fail;
    t.stop = &stop_flag;
    if (dt_trainer_run(&t, &stopped, &err) != 0)
        goto fail;
    dt_trainer_close(&t);
    if (stopped) {
        /* Under an agent what follows is the agent's to say (a regroup or a restart resumes by
         * itself; a preemption ends the job, and the agent says how to resume). */
        const char *next = env.agent_pid ? "checkpoint saved, exit 75 to the agent"
                                         : "run the same command again to resume";
        if (stop_signal && (t.env.world_size == 1 || t.stop_self))
            DT_INFO("stopped by signal %d (%s) after step %lld; %s", (int)stop_signal,
                    strsignal((int)stop_signal), (long long)t.step, next);
        else /* another rank was signalled; all stopped at the same step */
            DT_INFO("stopped with the other ranks (one of them was signalled) after step %lld; "
                    "%s", (long long)t.step, next);
        return DT_EXIT_PREEMPTED;
    }
    return 0;
fail:
    if (t.config_error)
        code = DT_EXIT_CONFIG;
    else if (oom_explain(job, env.world_size, &err))
        code = DT_EXIT_OOM;
    dt_metrics_finish_line(t.metrics);
    DT_ERROR("%s%s", err.msg, t.config_error ? " (a configuration error: the same command "
                                                "fails the same way until it is changed)" : "");
    if (t.trace_owned) { /* what this rank did up to the failure, no merge: others may be gone */
        char tpath[DT_PATH_MAX + 64];
        dt_err terr = {0};
        if (dt_trace_write(tpath, sizeof tpath, &terr) == 0)
            DT_INFO("trace of this rank up to the failure: %s", tpath);
    }
    dt_err ferr = {0};
    if (dt_errfile_write(NULL, env.rank, code, err.msg, &ferr) != 0)
        DT_WARN("could not write the error file: %s", ferr.msg);
    dt_trainer_close(&t);
    return code;
}
