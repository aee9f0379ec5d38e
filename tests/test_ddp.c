/* test_ddp.c - DistributedDataParallel (and DataParallel) against a single worker.
 *
 * The reference is one model trained in the test process on the global batch (N x B samples)
 * with the same optimiser. The DDP run is N forked ranks, each with its own slice of that batch,
 * a different initialisation seed (DDP must replace it with rank 0's parameters), and a real
 * communicator over a store server on 127.0.0.1. After every step each rank copies its
 * parameters into shared memory; the test then checks that every rank holds exactly rank 0's
 * parameters and that they match the reference within a tight tolerance, step after step, for
 * every model of the zoo (resnet with SyncBatchNorm, whose statistics then equal the single
 * worker's). Also: gradient accumulation (k micro-steps of B = one step of kB, synchronising
 * once), compressed gradients, the model-consistency check, buckets launched from backward, and
 * a killed rank turning into an error in the survivors.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "rendezvous/store.h"
#include "runtime/comm/comm.h"
#include "runtime/train/parallel/dpsync/ddp.h"
#include "runtime/train/parallel/dpsync/lowbit.h"
#include "runtime/train/parallel/dp.h"
#include "runtime/train/models/model.h"
#include "runtime/train/optim.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* ------------------------------------------------------------------------------------------ */
/* Models and data                                                                            */
/* ------------------------------------------------------------------------------------------ */

static dt_model_config model_cfg(const char *type, int max_batch)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    dt_err err = {0};
    DT_REQUIRE_OK(dt_model_arch_parse(type, &c.arch, &err), &err);
    c.max_batch = max_batch;
    c.seed = 42;
    if (!strcmp(type, "gpt")) {
        c.shape.kind = DT_SAMPLE_TOKENS;
        c.shape.seq_len = 8;
        c.shape.vocab_size = 19;
        c.n_layer = 2;
        c.n_head = 2;
        c.n_embd = 16;
        c.block_size = 8;
    } else if (!strcmp(type, "mlp")) {
        c.shape.kind = DT_SAMPLE_VECTOR;
        c.shape.input_dim = 7;
        c.shape.n_classes = 5;
        c.n_hidden = 2;
        c.hidden[0] = 12;
        c.hidden[1] = 8;
    } else {
        c.shape.kind = DT_SAMPLE_IMAGE;
        c.shape.channels = 3;
        c.shape.height = 8;
        c.shape.width = 8;
        c.shape.input_dim = 3 * 8 * 8;
        c.shape.n_classes = 4;
        c.depth = 8;
        c.width = 4;
        c.bn_momentum = 0.1f;
        c.bn_eps = 1e-5f;
    }
    return c;
}

/* The global batch of step `step` (n samples), all targets valid, so that the mean loss of the
 * whole batch is the mean of equal slices' means. */
typedef struct gbatch {
    int n, T, D;
    int32_t *tokens, *targets;
    float *x;
} gbatch;

static void make_gbatch(gbatch *g, const dt_model_config *c, int n, int step)
{
    memset(g, 0, sizeof *g);
    dt_rng r;
    dt_rng_seed2(&r, 777, (uint64_t)step);
    g->n = n;
    if (c->shape.kind == DT_SAMPLE_TOKENS) {
        int T = c->shape.seq_len, V = c->shape.vocab_size;
        g->T = T;
        g->tokens = malloc(sizeof(int32_t) * (size_t)n * T);
        g->targets = malloc(sizeof(int32_t) * (size_t)n * T);
        for (int i = 0; i < n * T; i++) {
            g->tokens[i] = (int32_t)dt_rng_below(&r, (uint64_t)V);
            g->targets[i] = (int32_t)dt_rng_below(&r, (uint64_t)V);
        }
    } else {
        int D = c->shape.input_dim;
        g->D = D;
        g->x = malloc(sizeof(float) * (size_t)n * D);
        g->targets = malloc(sizeof(int32_t) * (size_t)n);
        for (int i = 0; i < n * D; i++)
            g->x[i] = 2.0f * dt_rng_uniform(&r) - 1.0f;
        for (int i = 0; i < n; i++)
            g->targets[i] = (int32_t)dt_rng_below(&r, (uint64_t)c->shape.n_classes);
    }
}

/* Samples [first, first+count) of g as a batch (pointers into g). */
static dt_batch slice(const gbatch *g, int first, int count)
{
    dt_batch b;
    memset(&b, 0, sizeof b);
    b.B = count;
    b.T = g->T;
    if (g->tokens) {
        b.tokens = g->tokens + (size_t)first * g->T;
        b.targets = g->targets + (size_t)first * g->T;
    } else {
        b.x = g->x + (size_t)first * g->D;
        b.targets = g->targets + first;
    }
    return b;
}

static void free_gbatch(gbatch *g)
{
    free(g->tokens);
    free(g->targets);
    free(g->x);
}

static dt_optim *new_optim(dt_backend *be, const dt_model *m, bool adamw)
{
    dt_optim_config oc;
    memset(&oc, 0, sizeof oc);
    oc.kind = adamw ? DT_OPTIM_ADAMW : DT_OPTIM_SGD;
    oc.momentum = 0.9;
    oc.beta1 = 0.9;
    oc.beta2 = 0.95;
    /* The gradient of attention's key bias is zero up to rounding (softmax ignores a constant per
     * row); AdamW with a tiny eps turns that noise into steps of +-lr that no two summation
     * orders share. A larger eps keeps AdamW's normalisation of every real gradient. */
    oc.eps = 1e-4;
    oc.weight_decay = 0.01;
    dt_optim *o = NULL;
    dt_err err = {0};
    if (dt_optim_create(&o, &oc, be, m->tensors, m->num_tensors, m->num_params, &err) != 0) {
        fprintf(stderr, "optim: %s\n", err.msg);
        return NULL;
    }
    return o;
}

#define LR 0.05

/* ------------------------------------------------------------------------------------------ */
/* A group of forked ranks                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct run_cfg {
    const char *type;
    int N;           /* ranks */
    int B;           /* samples per rank per micro-step */
    int accum;       /* micro-steps per step */
    int steps;
    bool adamw;
    dt_dtype compress;
    int lowbit;      /* DT_LOWBIT_INT8 / DT_LOWBIT_1BIT (ddp.compress = int8 / 1bit), or 0 */
    int warmup;      /* 1bit: float32 steps first */
    bool stochastic; /* int8: stochastic rounding */
    double bucket_cap_mb, first_bucket_mb;
    int timeout_ms;
    int kill_rank;   /* -1: nobody; else this rank dies in step kill_step */
    int kill_step;
    bool differ;     /* the last rank builds a different model */
    bool no_sync_bn; /* resnet: plain BatchNorm (per-rank statistics) */
    char run_id[64];
    int port;
    float *out;      /* shared: (N, steps, num_params + num_buffers) */
    size_t per;      /* num_params + num_buffers */
    int *status_out; /* shared: per rank, 0 ok */
    char *msg_out;   /* shared: per rank, 512 bytes: the error a rank saw */
} run_cfg;

static void rank_body(run_cfg *rc, int rank)
{
    dt_err err = {0};
    dt_store *store = NULL;
    dt_comm *comm = NULL;
    dt_backend *be = NULL;
    dt_model *m = NULL;
    dt_optim *opt = NULL;
    dt_ddp *ddp = NULL;
    dt_store_opts so;
    dt_store_opts_default(&so);
    if (dt_store_connect(&store, "127.0.0.1", rc->port, &so, &err) != 0)
        goto fail;
    dt_comm_opts co;
    dt_comm_opts_default(&co);
    co.rank = rank;
    co.world_size = rc->N;
    co.local_rank = rank;
    co.local_world_size = rc->N;
    co.run_id = rc->run_id;
    co.timeout_ms = rc->timeout_ms ? rc->timeout_ms : 30000;
    if (dt_comm_init(&comm, store, &co, &err) != 0 ||
        dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err) != 0)
        goto fail;
    dt_model_config mc = model_cfg(rc->type, rc->B);
    mc.seed = 42 + (uint64_t)rank * 1000; /* DDP must overwrite this with rank 0's */
    mc.sync_bn = !rc->no_sync_bn;
    if (rc->differ && rank == rc->N - 1) {
        if (!strcmp(rc->type, "mlp")) { /* same parameter count, other shapes */
            mc.hidden[0] = 10;
            mc.hidden[1] = 10;
        }
        else
            mc.n_embd = 8;
    }
    if (dt_model_create(&m, &mc, be, comm, &err) != 0)
        goto fail;
    if (!(opt = new_optim(be, m, rc->adamw))) {
        dt_err_set(&err, -ENOMEM, "optimiser");
        goto fail;
    }
    dt_ddp_opts dopts;
    dt_ddp_opts_default(&dopts);
    dopts.compress = rc->compress;
    dopts.lowbit = rc->lowbit;
    dopts.lowbit_stochastic = rc->stochastic;
    dopts.lowbit_seed = 7;
    if (rc->bucket_cap_mb > 0)
        dopts.bucket_cap_mb = rc->bucket_cap_mb;
    if (rc->first_bucket_mb > 0)
        dopts.first_bucket_mb = rc->first_bucket_mb;
    if (dt_ddp_create(&ddp, m, comm, &dopts, &err) != 0)
        goto fail;
    const int global = rc->N * rc->B * rc->accum;
    float *raw = rc->lowbit ? malloc(m->num_params * sizeof *raw) : NULL;
    /* 1bit: the sums over steps of the exact average gradient and of what was applied */
    double *sum_exact = rc->lowbit == DT_LOWBIT_1BIT ? calloc(m->num_params, sizeof(double)) : NULL;
    double *sum_applied = sum_exact ? calloc(m->num_params, sizeof(double)) : NULL;
    for (int step = 0; step < rc->steps; step++) {
        gbatch g;
        make_gbatch(&g, &mc, global, step);
        dt_ddp_set_lowbit(ddp, step >= rc->warmup, step);
        be->memset_zero(be, m->grads, m->num_params * sizeof(float));
        for (int k = 0; k < rc->accum; k++) {
            if (rank == rc->kill_rank && step == rc->kill_step && k == rc->accum - 1) {
                kill(getpid(), SIGKILL);
            }
            dt_batch b = slice(&g, rank * rc->B * rc->accum + k * rc->B, rc->B);
            float loss;
            bool last = k == rc->accum - 1;
            if (m->ops->forward(m, &b, true, &loss, &err) != 0 ||
                m->ops->backward(m, 1.0f / (float)rc->accum, last ? dt_ddp_grad_ready : NULL,
                                 last ? ddp : NULL, &err) != 0)
                goto fail;
        }
        free_gbatch(&g);
        if (raw)
            memcpy(raw, m->grads, m->num_params * sizeof *raw);
        if (dt_ddp_finish(ddp, &err) != 0)
            goto fail;
        if (rc->lowbit == DT_LOWBIT_INT8) {
            /* The quantisation bound, element by element, against the exact float32 average:
             * each rank's chunk is rounded to nearest at scale s = max|x| / 127 of its block
             * (error <= s / 2, <= M / 254 with M the largest |gradient| of any rank), the
             * average of N such errors too, and the averaged shard once more (its scale
             * <= M / 127): |int8 - exact| <= M / 127. Stochastic rounding errs by less than a
             * whole scale each time: 2 M / 127. */
            float mx = 0;
            for (size_t i = 0; i < m->num_params; i++)
                mx = DT_MAX(mx, fabsf(raw[i]));
            if (dt_comm_allreduce(comm, &mx, 1, DT_FLOAT32, DT_MAX, NULL, &err) != 0 ||
                dt_comm_allreduce(comm, raw, m->num_params, DT_FLOAT32, DT_AVG, NULL, &err) != 0)
                goto fail;
            size_t bad = 0, worst = 0;
            for (size_t i = 0; i < m->num_params; i++) {
                double e = fabs((double)m->grads[i] - raw[i]);
                if (e > (rc->stochastic ? 2 : 1) * mx / 127.0 * 1.0001 + 1e-12) {
                    if (!bad || e > fabs((double)m->grads[worst] - raw[worst]))
                        worst = i;
                    bad++;
                }
            }
            RCHECK(!bad, "step %d: %zu gradients off the int8 bound %g, worst [%zu] %g for %g",
                   step, bad, mx / 127.0, worst, (double)m->grads[worst], (double)raw[worst]);
        }
        if (sum_exact && step < rc->warmup) { /* float32: the average itself (raw, copied after a
                                                 backward whose buckets all-reduce in place,
                                                 may be half averaged already) */
            for (size_t i = 0; i < m->num_params; i++) {
                sum_exact[i] += m->grads[i];
                sum_applied[i] += m->grads[i];
            }
        } else if (sum_exact) {
            if (dt_comm_allreduce(comm, raw, m->num_params, DT_FLOAT32, DT_AVG, NULL, &err) != 0)
                goto fail;
            for (size_t i = 0; i < m->num_params; i++) {
                sum_exact[i] += raw[i];
                sum_applied[i] += m->grads[i];
            }
        }
        dt_optim_step(opt, m->params, m->grads, LR);
        float *dst = rc->out + ((size_t)rank * rc->steps + step) * rc->per;
        be->memcpy_d2h(be, dst, m->params, m->num_params * sizeof(float));
        if (m->num_buffers)
            be->memcpy_d2h(be, dst + m->num_params, m->buffers, m->num_buffers * sizeof(float));
    }
    if (sum_exact) {
        /* Error feedback's identity: with v = g + e_old per rank, e_new = v - C(v), the shard's
         * w = mean C(v) + s_old, s_new = w - C(w) and C(w) applied, the applied sum over the
         * steps is the exact sum minus what the residuals still hold:
         *   sum applied + mean over ranks of e + s = sum of the exact averages
         * (from zero residuals; up to float32 rounding). The compression's error never gets
         * lost, only delayed. */
        dt_lowbit *q = dt_ddp_lowbit(ddp);
        float *e = dt_lowbit_worker_residual(q), *s = malloc(m->num_params * sizeof *s);
        memcpy(raw, e, m->num_params * sizeof *raw);
        dt_lowbit_server_get(q, s); /* this rank's chunks; 0 elsewhere: summed, the whole */
        if (dt_comm_allreduce(comm, raw, m->num_params, DT_FLOAT32, DT_AVG, NULL, &err) != 0 ||
            dt_comm_allreduce(comm, s, m->num_params, DT_FLOAT32, DT_SUM, NULL, &err) != 0)
            goto fail;
        double scale = 0, worst = 0;
        size_t at = 0;
        for (size_t i = 0; i < m->num_params; i++)
            scale = DT_MAX(scale, fabs(sum_exact[i]));
        for (size_t i = 0; i < m->num_params; i++) {
            double d = fabs(sum_applied[i] + raw[i] + s[i] - sum_exact[i]);
            if (d > worst)
                worst = d, at = i;
        }
        RCHECK(worst <= 1e-5 * scale + 1e-9,
               "1bit: applied + residuals - exact = %g at [%zu] after %d steps (sums up to %g)",
               worst, at, rc->steps, scale);
        RCHECK(scale > 0, "no gradient");
        free(s);
        free(sum_exact);
        free(sum_applied);
    }
    free(raw);
    dt_ddp_stats st;
    dt_ddp_get_stats(ddp, &st);
    RCHECK(st.lowbit_syncs == (uint64_t)(rc->lowbit ? rc->steps - rc->warmup : 0),
           "%llu low-bit syncs in %d steps", (unsigned long long)st.lowbit_syncs, rc->steps);
    RCHECK(st.syncs == (uint64_t)rc->steps, "%llu syncs", (unsigned long long)st.syncs);
    RCHECK(st.launched_early + st.launched_late == st.bucket_syncs,
           "%llu + %llu launches for %llu buckets due over %d steps (no_sync must not launch)",
           (unsigned long long)st.launched_early, (unsigned long long)st.launched_late,
           (unsigned long long)st.bucket_syncs, rc->steps);
    RCHECK(st.rebuilt == (rc->steps >= 2 && !rc->lowbit),
           "the buckets were %s after the first step (low-bit: static)",
           st.rebuilt ? "rebuilt" : "not rebuilt");
    RCHECK(st.comm_memory == (rc->N > 1), "communicator memory %s with %d ranks",
           st.comm_memory ? "used" : "not used", rc->N);
    /* comm_bytes, as the communicator counted them, against the ring all-reduce's 2 (n-1)/n of
     * the payload per step (shared memory on one host: chunk j goes to its owner, the owner's
     * reduced chunk to every peer). At 2 ranks that is exactly the payload; above, each step of
     * each bucket may differ by the chunks' rounding to 16 elements (and SyncBatchNorm's
     * statistics travel inside the window too: resnet is left out). */
    if (rc->N > 1 && !m->num_buffers && !rc->lowbit) {
        size_t es = rc->compress == DT_FLOAT32 ? 4 : 2;
        double want = 2.0 * (rc->N - 1) / rc->N * (double)(m->num_params * es) * rc->steps;
        double slack = rc->N == 2 ? 0 : (double)rc->steps * st.num_buckets * rc->N * 16 * es * 2;
        RCHECK(fabs((double)st.comm_bytes_total - want) <= slack,
               "comm_bytes %llu over %d steps, the ring formula %.0f (+- %.0f)",
               (unsigned long long)st.comm_bytes_total, rc->steps, want, slack);
        RCHECK(st.comm_bytes * (uint64_t)rc->steps == st.comm_bytes_total || rc->N > 2,
               "comm_bytes %llu in the last step, %llu in %d", (unsigned long long)st.comm_bytes,
               (unsigned long long)st.comm_bytes_total, rc->steps);
    }
    /* Every model reports its gradients: every bucket goes out from backward. */
    RCHECK(st.launched_late == 0, "%llu buckets not launched from backward",
           (unsigned long long)st.launched_late);
    dt_ddp_free(ddp);
    dt_optim_free(opt);
    dt_model_free(m);
    dt_backend_close(be);
    dt_comm_free(comm);
    dt_store_free(store);
    rc->status_out[rank] = dt_test_rank_failed ? 1 : 0;
    _exit(dt_test_rank_failed ? 1 : 0);
fail:
    dt_strlcpy(rc->msg_out + (size_t)rank * 512, err.msg, 512);
    rc->status_out[rank] = 2;
    _exit(2);
}

static void ddp_rank(int rank, int n, void *arg) { rank_body(arg, rank); }

/* Runs the DDP group; returns per-rank exit statuses in status (waitpid form). */
static void run_ddp(run_cfg *rc, int *status)
{
    static int counter;
    snprintf(rc->run_id, sizeof rc->run_id, "ddp-%d-%d", (int)getpid(), ++counter);
    dt_test_run_ranks(rc->run_id, rc->N, &rc->port, ddp_rank, rc, 120, status);
}

/* The shared output area for rc (freed by unmap_out). */
static void map_out(run_cfg *rc, size_t per)
{
    rc->per = per;
    size_t bytes = (size_t)rc->N * rc->steps * per * sizeof(float) + 8 * sizeof(int) + 8 * 512;
    char *p = dt_test_shared_map(bytes);
    rc->out = (float *)p;
    rc->status_out = (int *)(p + (size_t)rc->N * rc->steps * per * sizeof(float));
    rc->msg_out = (char *)(rc->status_out + 8);
}

static void unmap_out(run_cfg *rc)
{
    size_t bytes = (size_t)rc->N * rc->steps * rc->per * sizeof(float) + 8 * sizeof(int) + 8 * 512;
    munmap(rc->out, bytes);
}

/* ------------------------------------------------------------------------------------------ */
/* The single-worker reference                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Trains one model on the global batches; ref (steps, per) gets params (+ buffers) after each
 * step. Returns per. */
static size_t reference(const char *type, int global, int steps, bool adamw, float **ref)
{
    dt_err err = {0};
    dt_backend *be = NULL;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    dt_model_config mc = model_cfg(type, global);
    dt_model *m = NULL;
    DT_REQUIRE_OK(dt_model_create(&m, &mc, be, NULL, &err), &err);
    dt_optim *opt = new_optim(be, m, adamw);
    DT_REQUIRE(opt);
    size_t per = m->num_params + m->num_buffers;
    *ref = malloc((size_t)steps * per * sizeof(float));
    for (int step = 0; step < steps; step++) {
        gbatch g;
        make_gbatch(&g, &mc, global, step);
        dt_batch b = slice(&g, 0, global);
        be->memset_zero(be, m->grads, m->num_params * sizeof(float));
        float loss;
        DT_REQUIRE_OK(m->ops->forward(m, &b, true, &loss, &err), &err);
        DT_REQUIRE_OK(m->ops->backward(m, 1.0f, NULL, NULL, &err), &err);
        free_gbatch(&g);
        dt_optim_step(opt, m->params, m->grads, LR);
        float *dst = *ref + (size_t)step * per;
        be->memcpy_d2h(be, dst, m->params, m->num_params * sizeof(float));
        if (m->num_buffers)
            be->memcpy_d2h(be, dst + m->num_params, m->buffers, m->num_buffers * sizeof(float));
    }
    dt_optim_free(opt);
    dt_model_free(m);
    dt_backend_close(be);
    return per;
}

/* Largest |a - b| / (|b| + scale) over n values (scale: the typical magnitude, so that values
 * near zero are compared absolutely); differences up to abs_tol count as none. */
static double max_rel(const float *a, const float *b, size_t n, double abs_tol, size_t *where)
{
    double amax = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        amax = DT_MAX(amax, fabs((double)b[i]));
    double scale = 1e-2 * amax + 1e-12;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        double e = d <= abs_tol ? 0 : d / (fabs((double)b[i]) + scale);
        if (e > worst || e != e) {
            worst = e != e ? INFINITY : e;
            if (where)
                *where = i;
        }
    }
    return worst;
}

/* Runs rc against the reference and checks every step; tol is relative. */
static void check_equivalence(run_cfg *rc, double tol)
{
    const double abs_tol = 0;
    float *ref = NULL;
    int global = rc->N * rc->B * rc->accum;
    size_t per = reference(rc->type, global, rc->steps, rc->adamw, &ref);
    map_out(rc, per);
    int status[8];
    run_ddp(rc, status);
    for (int r = 0; r < rc->N; r++) {
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                     "%s: rank %d of %d ended with status %d: %s", rc->type, r, rc->N, status[r],
                     rc->msg_out + (size_t)r * 512);
    }
    for (int s = 0; s < rc->steps; s++) {
        const float *r0 = rc->out + (size_t)s * per;
        for (int r = 1; r < rc->N; r++) {
            const float *rr = rc->out + ((size_t)r * rc->steps + s) * per;
            DT_CHECK_MSG(memcmp(rr, r0, per * sizeof(float)) == 0,
                         "%s step %d: rank %d's parameters differ from rank 0's", rc->type, s, r);
        }
        size_t where = 0;
        double e = max_rel(r0, ref + (size_t)s * per, per, abs_tol, &where);
        DT_CHECK_MSG(e <= tol,
                     "%s, %d ranks x batch %d x accum %d, step %d: relative error %.3g > %.3g "
                     "at %zu (%.8g vs %.8g)",
                     rc->type, rc->N, rc->B, rc->accum, s, e, tol, where, (double)r0[where],
                     (double)ref[(size_t)s * per + where]);
        if (e > tol)
            break;
    }
    free(ref);
    unmap_out(rc);
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static run_cfg base_cfg(const char *type, int N, int B)
{
    run_cfg rc;
    memset(&rc, 0, sizeof rc);
    rc.type = type;
    rc.N = N;
    rc.B = B;
    rc.accum = 1;
    rc.steps = 4;
    rc.compress = DT_FLOAT32;
    rc.kill_rank = -1;
    return rc;
}

static void test_ddp_mlp(void)
{
    for (int N = 1; N <= 4; N++) {
        run_cfg rc = base_cfg("mlp", N, 3);
        rc.bucket_cap_mb = 0.0005; /* ~130 floats: several buckets */
        rc.first_bucket_mb = 0.0002;
        check_equivalence(&rc, 1e-4);
    }
}

static void test_ddp_gpt(void)
{
    for (int N = 2; N <= 3; N++) {
        run_cfg rc = base_cfg("gpt", N, 2);
        rc.bucket_cap_mb = 0.004;
        rc.first_bucket_mb = 0.001;
        check_equivalence(&rc, 2e-4);
    }
    /* AdamW too (its normalised steps amplify rounding differences a little). */
    run_cfg rc = base_cfg("gpt", 2, 2);
    rc.adamw = true;
    check_equivalence(&rc, 2e-3);
}

static void test_ddp_resnet_syncbn(void)
{
    run_cfg rc = base_cfg("resnet", 2, 2);
    rc.bucket_cap_mb = 0.002;
    check_equivalence(&rc, 2e-4);
}

static void test_grad_accumulation(void)
{
    /* 3 micro-steps of 2 on each of 2 ranks = one step of 12 on one worker, with one
     * synchronisation per step (checked in the ranks: launches = buckets x steps). */
    run_cfg rc = base_cfg("mlp", 2, 2);
    rc.accum = 3;
    rc.bucket_cap_mb = 0.0005;
    check_equivalence(&rc, 1e-4);
    run_cfg rg = base_cfg("gpt", 2, 1);
    rg.accum = 2;
    check_equivalence(&rg, 2e-4);
}

static void test_compression(void)
{
    run_cfg rc = base_cfg("mlp", 2, 3);
    rc.compress = DT_BFLOAT16;
    check_equivalence(&rc, 3e-2);
    run_cfg rf = base_cfg("mlp", 3, 2);
    rf.compress = DT_FLOAT16;
    check_equivalence(&rf, 5e-3);
}

/* ddp.compress = int8 against one process on the same global batch. The check derived from the
 * quantisation bound is the gradient's, every step, element by element (in the ranks, above):
 * |int8 average - exact average| <= M / 127. Then the ranks' parameters bit-identical (every rank
 * applies the same decompressed bytes) and, as a looser check, the parameters near the
 * reference's: a step moves a parameter by lr x g and int8 changes g by under 1% of the largest
 * gradient, so a parameter near zero (check_equivalence measures against |b| + 1% of the
 * largest) may differ by a few percent after 4 steps (gpt: 2.3e-2 measured): 5e-2. Also with
 * accumulation (one low-bit sync per step), 3 ranks, and several buckets in flight (overlap). */
static void test_int8(void)
{
    run_cfg rc = base_cfg("gpt", 2, 2);
    rc.lowbit = DT_LOWBIT_INT8;
    rc.bucket_cap_mb = 0.004; /* several buckets: sends overlap backward, reduces pipelined */
    rc.first_bucket_mb = 0.001;
    check_equivalence(&rc, 5e-2);
    run_cfg r3 = base_cfg("mlp", 3, 2);
    r3.lowbit = DT_LOWBIT_INT8;
    r3.accum = 2;
    r3.bucket_cap_mb = 0.0005;
    check_equivalence(&r3, 5e-2);
    /* stochastic rounding: errors up to a whole scale, twice round-to-nearest's (the gradient
     * bound above says 2 M / 127), so twice the parameters' tolerance (6.3e-2 measured) */
    run_cfg rs = base_cfg("gpt", 2, 2);
    rs.lowbit = DT_LOWBIT_INT8;
    rs.stochastic = true;
    check_equivalence(&rs, 1e-1);
}

/* ddp.compress = 1bit, 2 and 3 ranks, after 2 float32 steps: the ranks' parameters
 * bit-identical step after step, and error feedback's identity (in the ranks, above). Not
 * against one process: 1-bit gradients change the trajectory (test_lowbit checks the loss
 * falls). */
static void test_1bit(void)
{
    for (int N = 2; N <= 3; N++) {
        run_cfg rc = base_cfg(N == 2 ? "gpt" : "mlp", N, 2);
        rc.lowbit = DT_LOWBIT_1BIT;
        rc.warmup = 2;
        rc.steps = 6;
        rc.bucket_cap_mb = N == 2 ? 0.004 : 0.0005;
        rc.first_bucket_mb = N == 2 ? 0.001 : 0.0002;
        float *ref = NULL;
        size_t per = reference(rc.type, N * rc.B, 1, false, &ref);
        free(ref);
        map_out(&rc, per);
        int status[8];
        run_ddp(&rc, status);
        for (int r = 0; r < rc.N; r++)
            DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                         "1bit: rank %d of %d ended with status %d: %s", r, rc.N, status[r],
                         rc.msg_out + (size_t)r * 512);
        for (int s = 0; s < rc.steps; s++)
            for (int r = 1; r < rc.N; r++)
                DT_CHECK_MSG(memcmp(rc.out + ((size_t)r * rc.steps + s) * per,
                                    rc.out + (size_t)s * per, per * sizeof(float)) == 0,
                             "1bit step %d: rank %d's parameters differ from rank 0's", s, r);
        unmap_out(&rc);
    }
}

static void test_consistency_check(void)
{
    for (int t = 0; t < 2; t++) {
        run_cfg rc = base_cfg(t ? "gpt" : "mlp", 2, 2);
        rc.differ = true;
        rc.steps = 1;
        map_out(&rc, 1);
        int status[8];
        run_ddp(&rc, status);
        for (int r = 0; r < 2; r++) {
            const char *msg = rc.msg_out + (size_t)r * 512;
            DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 2,
                         "rank %d: status %d", r, status[r]);
            DT_CHECK_CONTAINS(msg, "differs across ranks");
            DT_CHECK_CONTAINS(msg, t ? "rank 1 built" : "on rank 0 but");
        }
        if (!t)
            DT_CHECK_CONTAINS(rc.msg_out, "h");
        unmap_out(&rc);
    }
}

static void test_killed_peer(void)
{
    /* Rank 2 dies just before its last backward of step 1: the survivors' dt_ddp_finish fails
     * within the timeout, naming a rank. */
    run_cfg rc = base_cfg("mlp", 3, 2);
    rc.kill_rank = 2;
    rc.kill_step = 1;
    rc.timeout_ms = 20000;
    map_out(&rc, 1000);
    int status[8];
    uint64_t t0 = dt_now_ns();
    run_ddp(&rc, status);
    double s = (double)(dt_now_ns() - t0) / 1e9;
    DT_CHECK(WIFSIGNALED(status[2]) && WTERMSIG(status[2]) == SIGKILL);
    for (int r = 0; r < 2; r++) {
        const char *msg = rc.msg_out + (size_t)r * 512;
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 2, "rank %d: status %d",
                     r, status[r]);
        DT_CHECK_CONTAINS(msg, "allreduce #");
        DT_CHECK_CONTAINS(msg, "rank ");
    }
    DT_CHECK_CONTAINS(rc.msg_out, "rank 2");
    DT_CHECK_MSG(s < 15, "the survivors took %.1f s to notice", s);
    unmap_out(&rc);
}

static void test_buckets(void)
{
    /* One rank (no communication), to look at the bucket layout alone. */
    dt_err err = {0};
    dt_backend *be = NULL;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    dt_comm_opts co;
    dt_comm_opts_default(&co);
    dt_comm *c = NULL;
    DT_REQUIRE_OK(dt_comm_init(&c, NULL, &co, &err), &err);
    dt_model_config mc = model_cfg("gpt", 2);
    dt_model *m = NULL;
    DT_REQUIRE_OK(dt_model_create(&m, &mc, be, NULL, &err), &err);
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.first_bucket_mb = 1e-4; /* 26 floats: the first bucket is a single tensor (ln_f) */
    o.bucket_cap_mb = 0.01;   /* 2621 floats */
    dt_ddp *d = NULL;
    DT_REQUIRE_OK(dt_ddp_create(&d, m, c, &o, &err), &err);
    dt_ddp_stats st;
    dt_ddp_get_stats(d, &st);
    DT_CHECK(st.num_buckets >= 4);
    DT_CHECK(st.largest_bucket <= 2621);
    {
        /* A cap below a tensor's size: the tensor gets a bucket of its own, never split. */
        dt_ddp_opts small = o;
        small.bucket_cap_mb = 0.001; /* 262 floats < c_fc.weight (1024) */
        dt_ddp *d2 = NULL;
        DT_REQUIRE_OK(dt_ddp_create(&d2, m, c, &small, &err), &err);
        dt_ddp_stats s2;
        dt_ddp_get_stats(d2, &s2);
        DT_CHECK(s2.largest_bucket >= 1024);
        DT_CHECK(s2.num_buckets > st.num_buckets);
        dt_ddp_free(d2);
    }
    gbatch g;
    make_gbatch(&g, &mc, 2, 0);
    dt_batch b = slice(&g, 0, 2);
    float loss;
    for (int step = 0; step < 2; step++) {
        DT_REQUIRE_OK(m->ops->forward(m, &b, true, &loss, &err), &err);
        DT_REQUIRE_OK(m->ops->backward(m, 1.0f, dt_ddp_grad_ready, d, &err), &err);
        DT_REQUIRE_OK(dt_ddp_finish(d, &err), &err);
    }
    dt_ddp_stats st2;
    dt_ddp_get_stats(d, &st2);
    DT_CHECK_INT(st2.launched_early, st2.bucket_syncs);
    DT_CHECK_INT(st2.launched_late, 0);
    /* Rebuilt from GPT's ready order: wte and wpe, reported last, are a bucket of their own, so
     * there is one bucket more than the static layout's and none is larger. */
    DT_CHECK(st2.rebuilt);
    DT_CHECK(st2.largest_bucket <= st.largest_bucket);
    DT_CHECK(st2.num_buckets >= st.num_buckets);
    st = st2;
    /* A second backward before finish is a model bug that is reported, not hidden. */
    DT_REQUIRE_OK(m->ops->forward(m, &b, true, &loss, &err), &err);
    DT_REQUIRE_OK(m->ops->backward(m, 1.0f, dt_ddp_grad_ready, d, &err), &err);
    DT_REQUIRE_OK(m->ops->forward(m, &b, true, &loss, &err), &err);
    DT_REQUIRE_OK(m->ops->backward(m, 1.0f, dt_ddp_grad_ready, d, &err), &err);
    DT_CHECK(dt_ddp_finish(d, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "twice");
    /* Without any report, finish launches everything itself. */
    DT_REQUIRE_OK(m->ops->forward(m, &b, true, &loss, &err), &err);
    DT_REQUIRE_OK(m->ops->backward(m, 1.0f, NULL, NULL, &err), &err);
    uint64_t late = st.launched_late;
    DT_REQUIRE_OK(dt_ddp_finish(d, &err), &err);
    dt_ddp_get_stats(d, &st);
    DT_CHECK_INT(st.launched_late - late, st.num_buckets);
    double v[3] = {1.5, -2, 3};
    DT_REQUIRE_OK(dt_ddp_average(d, v, 3, &err), &err);
    DT_CHECK(v[0] == 1.5 && v[1] == -2 && v[2] == 3);
    free_gbatch(&g);
    dt_ddp_free(d);
    dt_ddp_free(NULL);
    dt_model_free(m);
    dt_comm_free(c);
    dt_backend_close(be);
}

static void test_opts_from_job(void)
{
    dt_job job;
    dt_job_defaults(&job);
    dt_ddp_opts o;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_ddp_opts_from_job(&o, &job, &err), &err);
    DT_CHECK_NEAR(o.bucket_cap_mb, 25, 0);
    DT_CHECK_NEAR(o.first_bucket_mb, 1, 0);
    DT_CHECK(o.compress == DT_FLOAT32 && o.broadcast_buffers && o.check_consistency);
    job.compress = DT_COMPRESS_BF16;
    DT_REQUIRE_OK(dt_ddp_opts_from_job(&o, &job, &err), &err);
    DT_CHECK(o.compress == DT_BFLOAT16);
}

/* ------------------------------------------------------------------------------------------ */
/* The real binary: dtrain worker under the launcher                                          */
/* ------------------------------------------------------------------------------------------ */

/* The source tree (the parent of build/, where the dtrain binary lives). */
static const char *repo_dir(void) { return dt_test_repo_dir("configs"); }

/* The "loss" (or key) of the last record of `type` in dir/metrics.jsonl; NAN when absent. */
static double last_metric(const char *dir, const char *type, const char *key)
{
    char path[PATH_MAX + 32], *text = NULL, pat[64], tpat[64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (dt_read_file(path, &text, NULL, NULL) != 0)
        return NAN;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    snprintf(tpat, sizeof tpat, "\"type\":\"%s\"", type);
    double v = NAN;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *k = strstr(line, pat);
        if (strstr(line, tpat) && k)
            v = strtod(k + strlen(pat), NULL);
    }
    free(text);
    return v;
}

static int run_cmd(const char *cmd, char **out, int timeout_s)
{
    char full[16384];
    /* no inherited launcher environment: these are jobs of their own */
    snprintf(full, sizeof full,
             "cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
             "-u DTRAIN_STORE_ADDR -u DTRAIN_STORE_PORT -u DTRAIN_OUTPUT_DIR %s",
             repo_dir(), cmd);
    return dt_test_run(full, out, timeout_s);
}

static void test_worker_ddp_dp_single(void)
{
    /* The same job four ways on the same global batch of 64 samples: one worker with batch 64,
     * DDP on 2 workers with 32 each, DP with 2 replicas of 32 (both transports). The distributed
     * sampler gives them the same samples per step, so the runs agree up to rounding. */
    const char *tmp = dt_test_tmpdir();
    const char *common = "configs/mlp.ini job.device=cpu train.steps=30 job.log_every=10 "
                         "checkpoint.every=0 train.eval_every=0";
    char cmd[4096], *out = NULL;
    double loss[4], val[4];
    const char *names[4] = {"single", "ddp", "dp", "dp-collectives"};
    for (int k = 0; k < 4; k++) {
        const char *how = k == 0   ? "--nproc-per-node=1 %s train.batch_size=64"
                          : k == 1 ? "--nproc-per-node=2 %s train.batch_size=32"
                          : k == 2 ? "--nproc-per-node=1 %s train.batch_size=32 job.strategy=dp "
                                     "job.dp_replicas=2"
                                   : "--nproc-per-node=1 %s train.batch_size=32 job.strategy=dp "
                                     "job.dp_replicas=2 job.dp_transport=collectives";
        char args[1024];
        snprintf(args, sizeof args, how, common);
        snprintf(cmd, sizeof cmd, "%s --standalone --max-restarts=0 %s job.output_dir=%s/%s",
                 dt_test_dtrain_bin(), args, tmp, names[k]);
        int rc = run_cmd(cmd, &out, 120);
        DT_CHECK_MSG(rc == 0, "%s: exit %d: %.3000s", names[k], rc, out ? out : "");
        free(out);
        out = NULL;
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", tmp, names[k]);
        loss[k] = last_metric(dir, "train", "loss");
        val[k] = last_metric(dir, "eval", "val_loss");
        DT_CHECK_MSG(isfinite(loss[k]) && isfinite(val[k]), "%s: loss %g, val %g", names[k],
                     loss[k], val[k]);
        /* comm_bytes: the reducer's (its exact value is checked in the ranks of the DDP tests);
         * none without one */
        double cb = last_metric(dir, "train", "comm_bytes");
        DT_CHECK_MSG(k == 1 ? cb > 0 : isnan(cb), "%s: comm_bytes %g", names[k], cb);
    }
    for (int k = 1; k < 4; k++) {
        DT_CHECK_MSG(fabs(loss[k] - loss[0]) <= 1e-3 * fabs(loss[0]),
                     "%s train loss %.7f vs single %.7f", names[k], loss[k], loss[0]);
        DT_CHECK_MSG(fabs(val[k] - val[0]) <= 1e-3 * fabs(val[0]),
                     "%s val loss %.7f vs single %.7f", names[k], val[k], val[0]);
    }
}

/* pids of parent's children whose command line contains `word`. */
static int children_with(pid_t parent, const char *word, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) && n < max) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char p[300], buf[4096];
        snprintf(p, sizeof p, "/proc/%s/stat", de->d_name);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0)
            continue;
        buf[r] = 0;
        char *rp = strrchr(buf, ')');
        int ppid = 0;
        char state;
        if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2 || ppid != parent)
            continue;
        snprintf(p, sizeof p, "/proc/%s/cmdline", de->d_name);
        fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0)
            continue;
        buf[r] = 0;
        bool found = false;
        for (char *a = buf; a < buf + r; a += strlen(a) + 1)
            found = found || !strcmp(a, word);
        if (found)
            out[n++] = (pid_t)atoi(de->d_name);
    }
    if (d)
        closedir(d);
    return n;
}

static void test_launcher_restarts_after_kill(void)
{
    /* kill -9 one of two DDP workers mid-run: the survivor's collective fails at once naming
     * the dead rank, the agent restarts both, they resume from the last checkpoint, the job
     * completes. */
    const char *tmp = dt_test_tmpdir();
    char cmd[4096], log[PATH_MAX + 16], metrics[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/agent.log", tmp);
    snprintf(metrics, sizeof metrics, "%s/kill/metrics.jsonl", tmp);
    snprintf(cmd, sizeof cmd,
             "exec %s --standalone --nproc-per-node=2 --max-restarts=1 configs/mlp.ini "
             "job.device=cpu train.steps=600 job.log_every=10 checkpoint.every=40 "
             "job.output_dir=%s/kill ddp.timeout=60",
             dt_test_dtrain_bin(), tmp);
    fflush(stdout);
    fflush(stderr);
    pid_t agent = fork();
    DT_REQUIRE(agent >= 0);
    if (agent == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || chdir(repo_dir()) != 0)
            _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        unsetenv("RANK");
        unsetenv("WORLD_SIZE");
        unsetenv("DTRAIN_STORE_ADDR");
        unsetenv("DTRAIN_STORE_PORT");
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* Wait for step 60 or more in the metrics (a checkpoint exists by then). */
    uint64_t deadline = dt_now_ns() + 90ull * 1000000000ull;
    bool reached = false;
    while (!reached && dt_now_ns() < deadline) {
        char *text = NULL;
        if (dt_read_file(metrics, &text, NULL, NULL) == 0) {
            reached = strstr(text, "\"step\":60,") || strstr(text, "\"step\":70,") ||
                      strstr(text, "\"step\":80,");
            free(text);
        }
        if (waitpid(agent, NULL, WNOHANG) == agent)
            break;
        dt_sleep_ms(20);
    }
    DT_REQUIRE(reached);
    /* the agent is sh's exec'd dtrain (same pid); its workers are `dtrain worker` children */
    pid_t kids[8];
    int n = children_with(agent, "worker", kids, 8);
    DT_REQUIRE(n == 2);
    kill(kids[n - 1], SIGKILL);
    int status = 0;
    while (dt_now_ns() < deadline + 60ull * 1000000000ull) {
        if (waitpid(agent, &status, WNOHANG) == agent)
            break;
        dt_sleep_ms(50);
    }
    char *text = NULL;
    dt_read_file(log, &text, NULL, NULL);
    DT_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the job ended with %d: %.4000s",
                 status, text ? text : "");
    DT_CHECK_CONTAINS(text, "exited while this rank waited for it"); /* the survivor noticed */
    DT_CHECK_CONTAINS(text, "allreduce #");
    DT_CHECK_CONTAINS(text, "resumed from");
    DT_CHECK_CONTAINS(text, "all workers succeeded");
    free(text);
    char dir[PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/kill", tmp);
    DT_CHECK_NEAR(last_metric(dir, "train", "step"), 600, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* DataParallel                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Trains K DP replicas on the same global batches as reference(), parameters and gradients
 * going through `transport` (dt_dp_opts); out (steps, per); *eval (may be NULL) = the loss of an
 * evaluation forward on the first batch after the last step. */
static void run_dp(const char *type, int K, int global, int steps, dt_dp_transport_kind transport,
                   float *out, dt_dp_stats *stats, float *eval)
{
    dt_err err = {0};
    dt_model_config mc = model_cfg(type, global);
    dt_dp_opts o;
    memset(&o, 0, sizeof o);
    o.replicas = K;
    o.device = DT_BACKEND_CPU;
    o.transport = transport;
    o.timeout_ms = 60000;
    dt_backend_opts_default(&o.backend);
    dt_dp *d = NULL;
    DT_REQUIRE_OK(dt_dp_create(&d, &mc, &o, &err), &err);
    DT_CHECK_INT(dt_dp_replicas(d), K);
    dt_model *m = dt_dp_master(d);
    dt_backend *be = dt_dp_backend(d, 0);
    dt_optim *opt = new_optim(be, m, false);
    DT_REQUIRE(opt);
    size_t per = m->num_params + m->num_buffers;
    for (int step = 0; step < steps; step++) {
        gbatch g;
        make_gbatch(&g, &mc, global, step);
        dt_batch b = slice(&g, 0, global);
        be->memset_zero(be, m->grads, m->num_params * sizeof(float));
        float loss = 0;
        DT_REQUIRE_OK(dt_dp_forward_backward(d, &b, 1.0f, &loss, &err), &err);
        DT_CHECK(isfinite(loss));
        free_gbatch(&g);
        dt_optim_step(opt, m->params, m->grads, LR);
        float *dst = out + (size_t)step * per;
        be->memcpy_d2h(be, dst, m->params, m->num_params * sizeof(float));
        if (m->num_buffers)
            be->memcpy_d2h(be, dst + m->num_params, m->buffers, m->num_buffers * sizeof(float));
    }
    if (eval) {
        gbatch g;
        make_gbatch(&g, &mc, global, 0);
        dt_batch b = slice(&g, 0, global);
        DT_REQUIRE_OK(dt_dp_forward_eval(d, &b, eval, NULL, &err), &err);
        free_gbatch(&g);
    }
    if (stats)
        dt_dp_get_stats(d, stats);
    /* The master holds the optimiser state: more memory than any other replica. */
    if (K > 1)
        DT_CHECK(be->peak_bytes(be) > dt_dp_backend(d, 1)->peak_bytes(dt_dp_backend(d, 1)));
    dt_optim_free(opt);
    dt_dp_free(d);
}

static void test_dp_equals_single(void)
{
    /* Both transports: the master's copies and sums, and broadcast + reduce over a communicator
     * of the replica threads (what NCCL does between GPUs; shared memory here). On 2 replicas the
     * two sum the same two numbers per element, so they agree bit for bit. */
    const char *types[] = {"mlp", "gpt"};
    const dt_dp_transport_kind transports[] = {DT_DP_TRANSPORT_MASTER, DT_DP_TRANSPORT_COLLECTIVES};
    for (int t = 0; t < 2; t++)
        for (int K = 1; K <= 4; K++) {
            int global = K * 2 + (K == 3); /* 7 on 3 replicas: unequal chunks (3, 3, 1) */
            float *ref = NULL;
            size_t per = reference(types[t], global, 3, false, &ref);
            float *out[2];
            for (int x = 0; x < 2; x++) {
                out[x] = malloc(3 * per * sizeof(float));
                dt_dp_stats st;
                run_dp(types[t], K, global, 3, transports[x], out[x], &st, NULL);
                DT_CHECK_INT(st.steps, 3);
                DT_CHECK_INT(st.replicas, K);
                DT_CHECK_MSG(st.collectives == (x == 1 && K > 1), "%s on %d replicas: collectives %d",
                             dt_dp_transport_name(transports[x]), K, st.collectives);
                for (int s = 0; s < 3; s++) {
                    size_t where = 0;
                    double e =
                        max_rel(out[x] + (size_t)s * per, ref + (size_t)s * per, per, 0, &where);
                    DT_CHECK_MSG(e <= 1e-4,
                                 "DP (%s) %s, %d replicas, batch %d, step %d: error %.3g at %zu",
                                 dt_dp_transport_name(transports[x]), types[t], K, global, s, e, where);
                }
            }
            if (K <= 2)
                DT_CHECK_MSG(!memcmp(out[0], out[1], 3 * per * sizeof(float)),
                             "DP %s on %d replicas: master and collectives differ", types[t], K);
            free(out[0]);
            free(out[1]);
            free(ref);
        }
}

/* Gradient accumulation through DP: two micro-steps of 4 samples at dloss_scale 1/2 leave the
 * master the gradients one pass over all 8 gives, with either transport (the master accumulates,
 * the other replicas start each pass from zero). */
static void test_dp_accumulation(void)
{
    const dt_dp_transport_kind transports[] = {DT_DP_TRANSPORT_MASTER, DT_DP_TRANSPORT_COLLECTIVES};
    for (int x = 0; x < 2; x++) {
        dt_model_config mc = model_cfg("gpt", 8);
        dt_dp_opts o;
        memset(&o, 0, sizeof o);
        o.replicas = 2;
        o.device = DT_BACKEND_CPU;
        o.transport = transports[x];
        o.timeout_ms = 60000;
        dt_backend_opts_default(&o.backend);
        gbatch g;
        make_gbatch(&g, &mc, 8, 0);
        float *grads[2] = {NULL, NULL};
        size_t n = 0;
        for (int way = 0; way < 2; way++) {
            dt_dp *d = NULL;
            dt_err err = {0};
            DT_REQUIRE_OK(dt_dp_create(&d, &mc, &o, &err), &err);
            dt_model *m = dt_dp_master(d);
            dt_backend *be = dt_dp_backend(d, 0);
            n = m->num_params;
            be->memset_zero(be, m->grads, n * sizeof(float));
            float loss = 0;
            for (int k = 0; k < (way ? 1 : 2); k++) {
                dt_batch b = way ? slice(&g, 0, 8) : slice(&g, 4 * k, 4);
                DT_REQUIRE_OK(dt_dp_forward_backward(d, &b, way ? 1.0f : 0.5f, &loss, &err),
                              &err);
            }
            grads[way] = malloc(n * sizeof(float));
            be->memcpy_d2h(be, grads[way], m->grads, n * sizeof(float));
            dt_dp_free(d);
        }
        size_t where = 0;
        double e = max_rel(grads[0], grads[1], n, 0, &where);
        DT_CHECK_MSG(e <= 1e-5, "DP (%s): 2 micro-steps of 4 vs one of 8: error %.3g at %zu",
                     dt_dp_transport_name(transports[x]), e, where);
        free(grads[0]);
        free(grads[1]);
        free_gbatch(&g);
    }
}

static void test_dp_transport_errors(void)
{
    dt_model_config mc = model_cfg("mlp", 4);
    dt_dp_opts o;
    memset(&o, 0, sizeof o);
    o.replicas = 2;
    o.device = DT_BACKEND_CPU;
    o.transport = (dt_dp_transport_kind)7; /* not a transport */
    dt_backend_opts_default(&o.backend);
    dt_dp *d = NULL;
    dt_err err = {0};
    DT_CHECK_INT(dt_dp_create(&d, &mc, &o, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "use auto, master or collectives");
    DT_CHECK(d == NULL);
    /* the job key reaches the options */
    dt_job job;
    dt_backend_opts bo;
    dt_backend_opts_default(&bo);
    dt_job_defaults(&job);
    DT_CHECK(job.dp_transport == DT_DP_TRANSPORT_AUTO);
    DT_REQUIRE_OK(dt_job_set(&job, "job.dp_transport=collectives", &err), &err);
    dt_dp_opts_from_job(&o, &job, &bo);
    DT_CHECK(o.transport == DT_DP_TRANSPORT_COLLECTIVES);
    DT_CHECK_INT(o.timeout_ms, 300000);
}

static void test_dp_equals_ddp(void)
{
    /* resnet with plain BatchNorm: neither equals a single worker (each replica normalises its
     * own chunk), but DP and DDP (broadcast_buffers) do the same thing and must agree. */
    run_cfg rc = base_cfg("resnet", 2, 2);
    rc.no_sync_bn = true;
    rc.steps = 3;
    dt_model_config mc = model_cfg("resnet", 4);
    dt_model *probe = NULL;
    dt_backend *be = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    DT_REQUIRE_OK(dt_model_create(&probe, &mc, be, NULL, &err), &err);
    size_t per = probe->num_params + probe->num_buffers;
    dt_model_free(probe);
    dt_backend_close(be);
    map_out(&rc, per);
    int status[8];
    run_ddp(&rc, status);
    for (int r = 0; r < 2; r++)
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d: %d %s", r,
                     status[r], rc.msg_out + (size_t)r * 512);
    float *dp = malloc(3 * per * sizeof(float));
    /* Evaluation normalises with the running statistics, which must reach replica 1 from the
     * master (by broadcast with collectives): both transports evaluate alike. */
    const dt_dp_transport_kind transports[] = {DT_DP_TRANSPORT_MASTER, DT_DP_TRANSPORT_COLLECTIVES};
    float eval[2];
    for (int x = 0; x < 2; x++) {
        run_dp("resnet", 2, 4, 3, transports[x], dp, NULL, &eval[x]);
        for (int s = 0; s < 3; s++) {
            size_t where = 0;
            double e = max_rel(dp + (size_t)s * per, rc.out + (size_t)s * per, per, 0, &where);
            DT_CHECK_MSG(e <= 2e-4, "resnet DP (%s) vs DDP, step %d: error %.3g at %zu",
                         dt_dp_transport_name(transports[x]), s, e, where);
        }
    }
    DT_CHECK_MSG(isfinite(eval[0]) && eval[0] == eval[1], "resnet DP eval loss: master %.9g, "
                 "collectives %.9g", eval[0], eval[1]);
    free(dp);
    unmap_out(&rc);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"opts_from_job", test_opts_from_job, 0},
        {"buckets", test_buckets, 0},
        {"ddp_mlp_1_to_4_ranks", test_ddp_mlp, 120},
        {"ddp_gpt", test_ddp_gpt, 120},
        {"ddp_resnet_syncbn", test_ddp_resnet_syncbn, 120},
        {"grad_accumulation", test_grad_accumulation, 120},
        {"compression", test_compression, 120},
        {"int8", test_int8, 120},
        {"1bit", test_1bit, 120},
        {"consistency_check", test_consistency_check, 60},
        {"killed_peer", test_killed_peer, 60},
        {"dp_equals_single", test_dp_equals_single, 60},
        {"dp_equals_ddp_resnet", test_dp_equals_ddp, 60},
        {"dp_transport_errors", test_dp_transport_errors, 30},
        {"dp_accumulation", test_dp_accumulation, 60},
        {"worker_ddp_dp_single", test_worker_ddp_dp_single, 240},
        {"launcher_restarts_after_kill", test_launcher_restarts_after_kill, 240},
    };
    return dt_test_main("test_ddp", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
