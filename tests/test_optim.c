/* test_optim.c - learning-rate schedules, the optimiser's per-range updates (weight decay only on
 * tensors without no_decay), state buffers, and clipping by the global gradient norm.
 *
 * The optimiser's arithmetic is the backend's (adamw_update, sgd_update, checked against
 * references in the kernel tests); here a recording backend checks what the optimiser asks of
 * it: which ranges, which weight decay, which step count, which clipping factor. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "runtime/train/optim.h"
#include "tests/harness.h"

/* ---- a backend that records the calls the optimiser makes ------------------------------- */

typedef struct call {
    char op;            /* 'a' adamw, 's' sgd, 'c' scale */
    size_t off, n;
    float lr, wd, arg;  /* arg: scale factor, or sgd momentum */
    int64_t t;
    bool first, has_state;
} call;

static call calls[64];
static int ncalls;
static float *base; /* parameter buffer the offsets are measured from */

static int rec_alloc(dt_backend *be, void **p, size_t bytes, dt_err *err)
{
    *p = calloc(1, bytes);
    return *p ? 0 : dt_err_set(err, -ENOMEM, "out of memory");
}
static void rec_free(dt_backend *be, void *p) { free(p); }
static double rec_sumsq(dt_backend *be, const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}
static void rec_scale(dt_backend *be, float *x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
    calls[ncalls++] = (call){.op = 'c', .n = n, .arg = s};
}
static void rec_adamw(dt_backend *be, float *params, const float *grads, float *m, float *v,
                      size_t n, double lr, double b1, double b2, double eps, double wd, int64_t t)
{
    calls[ncalls++] = (call){.op = 'a', .off = (size_t)(params - base), .n = n, .lr = lr,
                             .wd = wd, .t = t, .has_state = m && v};
}
static void rec_sgd(dt_backend *be, float *params, const float *grads, float *buf, size_t n,
                    float lr, float momentum, bool nesterov, float wd, bool first)
{
    calls[ncalls++] = (call){.op = 's', .off = (size_t)(params - base), .n = n, .lr = lr,
                             .wd = wd, .arg = momentum, .first = first, .has_state = buf != NULL};
}

static dt_backend rec_backend = {
    .name = "recording",
    .alloc = rec_alloc,
    .free = rec_free,
    .sumsq = rec_sumsq,
    .scale = rec_scale,
    .adamw_update = rec_adamw,
    .sgd_update = rec_sgd,
};

/* A GPT-like table: weight, bias (no_decay), weight, weight, norm weight and bias (no_decay). */
static dt_tensor_info table[6] = {
    {.name = "w0", .offset = 0, .numel = 10},
    {.name = "b0", .offset = 10, .numel = 2, .no_decay = true},
    {.name = "w1", .offset = 12, .numel = 6},
    {.name = "w2", .offset = 18, .numel = 4},
    {.name = "ln.weight", .offset = 22, .numel = 3, .no_decay = true},
    {.name = "ln.bias", .offset = 25, .numel = 3, .no_decay = true},
};
#define NPARAMS 28

/* ---- schedules ---------------------------------------------------------------------------- */

static void test_schedules(void)
{
    dt_lr_schedule s = {.kind = DT_LR_CONSTANT, .lr = 1.0, .min_lr = 0.1, .warmup_steps = 4,
                        .total_steps = 104};
    DT_CHECK_NEAR(dt_lr_at(&s, 0), 0.25, 1e-12);
    DT_CHECK_NEAR(dt_lr_at(&s, 3), 1.0, 1e-12);
    DT_CHECK_NEAR(dt_lr_at(&s, 50), 1.0, 1e-12);
    DT_CHECK_NEAR(dt_lr_at(&s, 1000), 1.0, 1e-12);

    s.kind = DT_LR_COSINE;
    DT_CHECK_NEAR(dt_lr_at(&s, 1), 0.5, 1e-12);   /* still warming up */
    DT_CHECK_NEAR(dt_lr_at(&s, 4), 1.0, 1e-12);   /* decay starts at the peak */
    DT_CHECK_NEAR(dt_lr_at(&s, 54), 0.55, 1e-12); /* half way: the mean of lr and min_lr */
    DT_CHECK_NEAR(dt_lr_at(&s, 104), 0.1, 1e-12);
    DT_CHECK_NEAR(dt_lr_at(&s, 500), 0.1, 1e-12); /* past the end: min_lr */
    double prev = 2;
    for (int64_t k = 4; k <= 104; k++) { /* monotone after warmup */
        double v = dt_lr_at(&s, k);
        DT_CHECK(v <= prev + 1e-15);
        prev = v;
    }

    s.kind = DT_LR_LINEAR;
    DT_CHECK_NEAR(dt_lr_at(&s, 4), 1.0, 1e-12);
    DT_CHECK_NEAR(dt_lr_at(&s, 29), 0.775, 1e-12);
    DT_CHECK_NEAR(dt_lr_at(&s, 104), 0.1, 1e-12);

    /* no warmup */
    s.warmup_steps = 0;
    DT_CHECK_NEAR(dt_lr_at(&s, 0), 1.0, 1e-12);

    /* train.schedule decodes straight into dt_lr_kind (config.c). */
    dt_job job;
    dt_err err = {0};
    dt_job_defaults(&job);
    DT_CHECK(job.schedule == DT_LR_CONSTANT);
    DT_REQUIRE_OK(dt_job_set(&job, "train.schedule=cosine", &err), &err);
    DT_CHECK(job.schedule == DT_LR_COSINE);
    DT_REQUIRE_OK(dt_job_set(&job, "train.schedule=LINEAR", &err), &err);
    DT_CHECK(job.schedule == DT_LR_LINEAR);
    DT_CHECK(dt_job_set(&job, "train.schedule=step", &err) == -EINVAL);
    DT_CHECK_STR(dt_lr_name(DT_LR_COSINE), "cosine");
}

static void test_config_from_job(void)
{
    dt_job job;
    dt_job_defaults(&job);
    job.optimizer = DT_OPTIM_SGD;
    job.schedule = DT_LR_LINEAR;
    job.lr = 0.5;
    job.min_lr = 0.05;
    job.warmup_steps = 7;
    job.momentum = 0.8;
    job.nesterov = true;
    job.weight_decay = 5e-4;
    job.grad_clip = 2;
    dt_optim_config c;
    dt_lr_schedule s;
    dt_optim_config_from_job(&c, &s, &job, 300);
    DT_CHECK_INT(c.kind, DT_OPTIM_SGD);
    DT_CHECK_NEAR(c.momentum, 0.8, 1e-12);
    DT_CHECK(c.nesterov);
    DT_CHECK_NEAR(c.weight_decay, 5e-4, 1e-12);
    DT_CHECK_NEAR(c.grad_clip, 2, 1e-12);
    DT_CHECK_INT(s.kind, DT_LR_LINEAR);
    DT_CHECK_INT(s.warmup_steps, 7);
    DT_CHECK_INT(s.total_steps, 300);
    DT_CHECK_NEAR(s.lr, 0.5, 1e-12);
    DT_CHECK_NEAR(s.min_lr, 0.05, 1e-12);
}

/* ---- updates -------------------------------------------------------------------------------- */

static void test_adamw_ranges_and_decay(void)
{
    float *params = calloc(NPARAMS, sizeof(float)), *grads = calloc(NPARAMS, sizeof(float));
    base = params;
    ncalls = 0;
    dt_optim_config c = {.kind = DT_OPTIM_ADAMW, .weight_decay = 0.1, .beta1 = 0.9,
                         .beta2 = 0.95, .eps = 1e-8};
    dt_optim *o = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_optim_create(&o, &c, &rec_backend, table, 6, NPARAMS, &err), &err);
    DT_CHECK_INT(o->num_states, 2);
    DT_CHECK_STR(o->states[0].name, "exp_avg");
    DT_CHECK_STR(o->states[1].name, "exp_avg_sq");
    DT_CHECK_STR(o->states[0].prefix, "exp_avg."); /* the checkpoint's names: PyTorch's */
    DT_CHECK_STR(o->states[1].prefix, "exp_avg_sq.");
    for (int i = 0; i < NPARAMS; i++)
        DT_CHECK(o->states[0].buf[i] == 0 && o->states[1].buf[i] == 0);
    dt_optim_step(o, params, grads, 1e-3);
    dt_optim_step(o, params, grads, 2e-3);
    DT_CHECK_INT(o->t, 2);
    /* neighbours with the same flag merge: [w0] [b0] [w1 w2] [ln.weight ln.bias] */
    DT_REQUIRE(ncalls == 8);
    static const size_t off[4] = {0, 10, 12, 22}, n[4] = {10, 2, 10, 6};
    static const float wd[4] = {0.1f, 0, 0.1f, 0};
    for (int k = 0; k < 8; k++) {
        const call *cl = &calls[k];
        DT_CHECK(cl->op == 'a');
        DT_CHECK_INT(cl->off, off[k % 4]);
        DT_CHECK_INT(cl->n, n[k % 4]);
        DT_CHECK_NEAR(cl->wd, wd[k % 4], 1e-9);
        DT_CHECK_INT(cl->t, k / 4 + 1); /* AdamW's t is 1-based */
        DT_CHECK_NEAR(cl->lr, k < 4 ? 1e-3 : 2e-3, 1e-9);
        DT_CHECK(cl->has_state);
    }
    dt_optim_free(o);
    free(params);
    free(grads);
}

static void test_sgd_first_step_and_state(void)
{
    float *params = calloc(NPARAMS, sizeof(float)), *grads = calloc(NPARAMS, sizeof(float));
    base = params;
    ncalls = 0;
    dt_optim_config c = {.kind = DT_OPTIM_SGD, .weight_decay = 5e-4, .momentum = 0.9};
    dt_optim *o = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_optim_create(&o, &c, &rec_backend, table, 6, NPARAMS, &err), &err);
    DT_CHECK_INT(o->num_states, 1);
    DT_CHECK_STR(o->states[0].name, "momentum_buffer");
    DT_CHECK_STR(o->states[0].prefix, "momentum_buffer.");
    DT_CHECK(o->states[0].buf != NULL);
    dt_optim_step(o, params, grads, 0.1);
    dt_optim_step(o, params, grads, 0.1);
    DT_REQUIRE(ncalls == 8);
    for (int k = 0; k < 8; k++) {
        DT_CHECK(calls[k].op == 's');
        DT_CHECK(calls[k].first == (k < 4));
        DT_CHECK(calls[k].has_state);
        DT_CHECK_NEAR(calls[k].arg, 0.9, 1e-7);
    }
    DT_CHECK_NEAR(calls[1].wd, 0, 1e-12);
    DT_CHECK_NEAR(calls[2].wd, 5e-4, 1e-9);
    dt_optim_free(o);

    /* plain SGD keeps no state */
    c.momentum = 0;
    ncalls = 0;
    DT_REQUIRE_OK(dt_optim_create(&o, &c, &rec_backend, table, 6, NPARAMS, &err), &err);
    DT_CHECK_INT(o->num_states, 0);
    DT_CHECK(o->states[0].buf == NULL);
    dt_optim_step(o, params, grads, 0.1);
    DT_CHECK(ncalls == 4 && !calls[0].has_state);
    dt_optim_free(o);
    /* Nesterov without momentum is refused */
    c.nesterov = true;
    DT_CHECK(dt_optim_create(&o, &c, &rec_backend, table, 6, NPARAMS, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "momentum");
    free(params);
    free(grads);
}

static void test_table_must_cover(void)
{
    dt_optim_config c = {.kind = DT_OPTIM_ADAMW};
    dt_optim *o = NULL;
    dt_err err = {0};
    DT_CHECK(dt_optim_create(&o, &c, &rec_backend, table, 6, NPARAMS + 1, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "cover");
    dt_tensor_info gap[2] = {{.name = "a", .offset = 0, .numel = 4},
                             {.name = "b", .offset = 5, .numel = 4}};
    DT_CHECK(dt_optim_create(&o, &c, &rec_backend, gap, 2, 9, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "tensor b");
}

/* ---- clipping ----------------------------------------------------------------------------- */

static void test_clip(void)
{
    float *grads = calloc(NPARAMS, sizeof(float));
    dt_optim_config c = {.kind = DT_OPTIM_ADAMW, .grad_clip = 1.0};
    dt_optim *o = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_optim_create(&o, &c, &rec_backend, table, 6, NPARAMS, &err), &err);
    grads[0] = 6;
    grads[27] = 8; /* norm 10 */
    ncalls = 0;
    double norm = dt_optim_clip(o, grads);
    DT_CHECK_NEAR(norm, 10, 1e-9);
    DT_REQUIRE(ncalls == 1 && calls[0].op == 'c');
    DT_CHECK_INT(calls[0].n, NPARAMS);
    DT_CHECK_NEAR(calls[0].arg, 1.0 / (10 + 1e-6), 1e-7);
    DT_CHECK_NEAR(dt_optim_grad_norm(o, grads), 1.0, 1e-5);
    /* under the threshold: untouched */
    ncalls = 0;
    grads[0] = 0.3f;
    grads[27] = 0.4f;
    DT_CHECK_NEAR(dt_optim_clip(o, grads), 0.5, 1e-6);
    DT_CHECK_INT(ncalls, 0);
    /* non-finite: reported, nothing scaled */
    grads[3] = NAN;
    DT_CHECK(!isfinite(dt_optim_clip(o, grads)));
    DT_CHECK_INT(ncalls, 0);
    grads[3] = 0;
    dt_optim_free(o);
    /* clipping off */
    c.grad_clip = 0;
    DT_REQUIRE_OK(dt_optim_create(&o, &c, &rec_backend, table, 6, NPARAMS, &err), &err);
    grads[0] = 100;
    DT_CHECK_NEAR(dt_optim_clip(o, grads), sqrt(100.0 * 100 + 0.16), 1e-3);
    DT_CHECK_INT(ncalls, 0);
    dt_optim_free(o);
    free(grads);
}

/* ---- the real CPU backend against PyTorch's formulas, in double ------------------------ */

static void test_cpu_numerics(void)
{
    dt_backend *be = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_cpu_backend_create(&be, NULL, &err), &err);
    float *p = NULL, *g = NULL;
    DT_REQUIRE_OK(be->alloc(be, (void **)&p, sizeof(float) * NPARAMS, &err), &err);
    DT_REQUIRE_OK(be->alloc(be, (void **)&g, sizeof(float) * NPARAMS, &err), &err);
    for (int kind = 0; kind < 2; kind++) {
        double rp[NPARAMS], m[NPARAMS] = {0}, v[NPARAMS] = {0};
        for (int i = 0; i < NPARAMS; i++)
            p[i] = (float)(rp[i] = 0.1 * (i % 7) - 0.3);
        dt_optim_config c = {.kind = kind ? DT_OPTIM_SGD : DT_OPTIM_ADAMW, .weight_decay = 0.1,
                             .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .momentum = 0.9,
                             .nesterov = true};
        dt_optim *o = NULL;
        DT_REQUIRE_OK(dt_optim_create(&o, &c, be, table, 6, NPARAMS, &err), &err);
        for (int t = 1; t <= 3; t++) {
            double lr = 0.01 * t;
            for (int i = 0; i < NPARAMS; i++)
                g[i] = (float)(0.05 * ((i * 5 + t) % 9) - 0.2);
            dt_optim_step(o, p, g, lr);
            for (int i = 0; i < NPARAMS; i++) {
                bool decay = !(i >= 10 && i < 12) && i < 22;
                double wd = decay ? 0.1 : 0, gi = g[i];
                if (kind == 0) {
                    m[i] = 0.9 * m[i] + 0.1 * gi;
                    v[i] = 0.95 * v[i] + 0.05 * gi * gi;
                    double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.95, t));
                    rp[i] -= lr * (mh / (sqrt(vh) + 1e-8) + wd * rp[i]);
                } else {
                    double gg = gi + wd * rp[i];
                    m[i] = t == 1 ? gg : 0.9 * m[i] + gg;
                    rp[i] -= lr * (gg + 0.9 * m[i]);
                }
            }
        }
        for (int i = 0; i < NPARAMS; i++)
            DT_CHECK_NEAR(p[i], rp[i], 1e-5);
        DT_CHECK_INT(o->t, 3);
        dt_optim_free(o);
    }
    /* clipping through the backend's sumsq and scale */
    dt_optim_config c = {.kind = DT_OPTIM_ADAMW, .grad_clip = 0.5};
    dt_optim *o = NULL;
    DT_REQUIRE_OK(dt_optim_create(&o, &c, be, table, 6, NPARAMS, &err), &err);
    double ss = 0;
    for (int i = 0; i < NPARAMS; i++) {
        g[i] = (float)(i - 14);
        ss += (double)g[i] * g[i];
    }
    DT_CHECK_NEAR(dt_optim_clip(o, g), sqrt(ss), 1e-6 * sqrt(ss));
    DT_CHECK_NEAR(dt_optim_grad_norm(o, g), 0.5, 1e-5);
    dt_optim_free(o);
    be->free(be, p);
    be->free(be, g);
    dt_backend_close(be);
}

/* AdamW's coefficients are formed in double and rounded once, as torch.optim.AdamW does with its
 * Python floats: after one step at beta2 = 0.999, exp_avg_sq is float((1 - 0.999) * g) * g to the
 * rounding of float, where 1.0f - 0.999f (a float-rounded beta2) was 1.3e-5 relatively off. */
static void test_adamw_coefficients_in_double(void)
{
    dt_backend *be = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_cpu_backend_create(&be, NULL, &err), &err);
    float *p = NULL, *g = NULL;
    DT_REQUIRE_OK(be->alloc(be, (void **)&p, sizeof(float) * NPARAMS, &err), &err);
    DT_REQUIRE_OK(be->alloc(be, (void **)&g, sizeof(float) * NPARAMS, &err), &err);
    for (int i = 0; i < NPARAMS; i++) {
        p[i] = 0.5f;
        g[i] = (float)(0.37 * (i + 1) - 4.0); /* ranges of 10, 2, 10, 6: AVX and scalar tails */
    }
    dt_optim_config c = {.kind = DT_OPTIM_ADAMW, .weight_decay = 0.1, .beta1 = 0.9,
                         .beta2 = 0.999, .eps = 1e-8};
    dt_optim *o = NULL;
    DT_REQUIRE_OK(dt_optim_create(&o, &c, be, table, 6, NPARAMS, &err), &err);
    dt_optim_step(o, p, g, 1e-3);
    double worst_v = 0, worst_m = 0;
    for (int i = 0; i < NPARAMS; i++) {
        double gi = g[i], v = (1 - 0.999) * gi * gi, m = (1 - 0.9) * gi;
        worst_v = fmax(worst_v, fabs(o->states[1].buf[i] - v) / v);
        worst_m = fmax(worst_m, fabs(o->states[0].buf[i] - m) / fabs(m));
    }
    /* two float roundings (the coefficient, each product) at most: 2 x 2^-24 each */
    DT_CHECK_MSG(worst_v < 3e-7, "exp_avg_sq %.3g relatively off (1 - beta2)*g^2", worst_v);
    DT_CHECK_MSG(worst_m < 2e-7, "exp_avg %.3g relatively off (1 - beta1)*g", worst_m);
    dt_optim_free(o);
    be->free(be, p);
    be->free(be, g);
    dt_backend_close(be);
}

/* ---- gradient accumulation: k micro-steps of B == one step of kB -------------------------- */

/* Builds a model of job's type on be; the models are deterministic from the seed. */
static dt_model *build(dt_backend *be, const dt_job *job, const dt_sample_shape *shape)
{
    dt_model_config mc;
    dt_model *m = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_model_config_from_job(&mc, job, shape, &err), &err);
    DT_REQUIRE_OK(dt_model_create(&m, &mc, be, NULL, &err), &err);
    return m;
}

/* One backward pass over `parts` equal slices of batch, each scaled by 1/parts, as the trainer
 * does for grad_accum = parts. */
static void accumulate_grads(dt_model *m, const dt_batch *full, int parts, double *loss)
{
    dt_err err = {0};
    m->be->memset_zero(m->be, m->grads, sizeof(float) * m->num_params);
    int b = full->B / parts, T = full->T > 0 ? full->T : 1;
    size_t xdim = full->x ? (size_t)m->cfg.shape.input_dim : 0;
    *loss = 0;
    for (int k = 0; k < parts; k++) {
        dt_batch part = {.B = b, .T = full->T};
        part.tokens = full->tokens ? full->tokens + (size_t)k * b * T : NULL;
        part.targets = full->targets + (size_t)k * b * T;
        part.x = full->x ? full->x + (size_t)k * b * xdim : NULL;
        float l = 0;
        DT_REQUIRE_OK(m->ops->forward(m, &part, true, &l, &err), &err);
        DT_REQUIRE_OK(m->ops->backward(m, 1.0f / (float)parts, NULL, NULL, &err), &err);
        *loss += l / parts;
    }
}

static void check_accumulation(const char *type)
{
    enum { B = 8, K = 4 };
    dt_backend *be = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_cpu_backend_create(&be, NULL, &err), &err);
    dt_job job;
    dt_job_defaults(&job);
    char set[64];
    snprintf(set, sizeof set, "model.type=%s", type);
    DT_REQUIRE_OK(dt_job_set(&job, set, &err), &err);
    job.batch_size = B;
    job.seed = 5;
    dt_sample_shape shape = {0};
    int32_t tokens[B * 8], targets[B * 8];
    float x[B * 12];
    dt_batch batch = {.B = B, .targets = targets};
    dt_rng r;
    dt_rng_seed(&r, 11);
    if (!strcmp(type, "gpt")) {
        job.n_layer = 2;
        job.n_head = 2;
        job.n_embd = 16;
        job.block_size = 8;
        shape = (dt_sample_shape){.kind = DT_SAMPLE_TOKENS, .seq_len = 8, .vocab_size = 32};
        for (int i = 0; i < B * 8; i++) {
            tokens[i] = (int32_t)dt_rng_below(&r, 32);
            targets[i] = (int32_t)dt_rng_below(&r, 32);
        }
        batch.T = 8;
        batch.tokens = tokens;
    } else {
        strcpy(job.hidden, "16,16");
        shape = (dt_sample_shape){.kind = DT_SAMPLE_VECTOR, .input_dim = 12, .n_classes = 5};
        dt_rng_fill_normal(&r, x, B * 12, 0, 1);
        for (int i = 0; i < B; i++)
            targets[i] = (int32_t)dt_rng_below(&r, 5);
        batch.x = x;
    }
    dt_model *one = build(be, &job, &shape), *acc = build(be, &job, &shape);
    double l1, lk;
    accumulate_grads(one, &batch, 1, &l1);
    accumulate_grads(acc, &batch, K, &lk);
    DT_CHECK_NEAR(l1, lk, 1e-5 * fabs(l1));
    double gmax = 0, dmax = 0;
    for (size_t i = 0; i < one->num_params; i++) {
        gmax = fmax(gmax, fabs(one->grads[i]));
        dmax = fmax(dmax, fabs(one->grads[i] - acc->grads[i]));
    }
    DT_CHECK_MSG(gmax > 0, "%s: zero gradients", type);
    DT_CHECK_MSG(dmax <= 1e-5 * gmax, "%s: gradients of 1 x %d and %d x %d differ by %g (max %g)",
                 type, B, K, B / K, dmax, gmax);
    /* and the optimiser moves both to the same place */
    dt_optim_config c = {.kind = DT_OPTIM_ADAMW, .weight_decay = 0.1, .beta1 = 0.9,
                         .beta2 = 0.999, .eps = 1e-8, .grad_clip = 1.0};
    dt_optim *o1 = NULL, *ok = NULL;
    DT_REQUIRE_OK(dt_optim_create(&o1, &c, be, one->tensors, one->num_tensors, one->num_params,
                                  &err), &err);
    DT_REQUIRE_OK(dt_optim_create(&ok, &c, be, acc->tensors, acc->num_tensors, acc->num_params,
                                  &err), &err);
    double n1 = dt_optim_clip(o1, one->grads), nk = dt_optim_clip(ok, acc->grads);
    DT_CHECK_NEAR(n1, nk, 1e-5 * n1);
    dt_optim_step(o1, one->params, one->grads, 1e-3);
    dt_optim_step(ok, acc->params, acc->grads, 1e-3);
    double pmax = 0;
    for (size_t i = 0; i < one->num_params; i++)
        pmax = fmax(pmax, fabs(one->params[i] - acc->params[i]));
    /* Adam normalises each update to ~lr: rounding differences in gradients near zero move a
     * parameter by a small fraction of lr (measured: < 2e-7 with lr = 1e-3) */
    DT_CHECK_MSG(pmax <= 1e-5, "%s: parameters differ by %g after one step", type, pmax);
    dt_optim_free(o1);
    dt_optim_free(ok);
    dt_model_free(one);
    dt_model_free(acc);
    dt_backend_close(be);
}

static void test_accumulation_mlp(void) { check_accumulation("mlp"); }
static void test_accumulation_gpt(void) { check_accumulation("gpt"); }

/* fp16's dynamic loss scale: halved on an overflowing step (skipped), doubled after `window`
 * clean steps in a row, and a run of DT_LOSS_SCALER_MAX_SKIPS overflows is divergence. */
static void test_loss_scaler(void)
{
    dt_loss_scaler s;
    dt_loss_scaler_init(&s, false, 1024, 3); /* off: scale 1, an overflow is an error */
    DT_CHECK(s.scale == 1.0);
    DT_CHECK_INT(dt_loss_scaler_update(&s, true), 1);
    DT_CHECK(s.scale == 1.0);
    DT_CHECK_INT(dt_loss_scaler_update(&s, false), -EDOM);

    dt_loss_scaler_init(&s, true, 1024, 3);
    DT_CHECK_INT(dt_loss_scaler_update(&s, false), 0);
    DT_CHECK(s.scale == 512.0);
    DT_CHECK_INT((int)s.skipped, 1);
    DT_CHECK_INT(dt_loss_scaler_update(&s, true), 1);
    DT_CHECK_INT(dt_loss_scaler_update(&s, true), 1);
    DT_CHECK(s.scale == 512.0);
    DT_CHECK_INT(dt_loss_scaler_update(&s, false), 0); /* an overflow restarts the window */
    DT_CHECK(s.scale == 256.0);
    for (int k = 0; k < 2; k++)
        DT_CHECK_INT(dt_loss_scaler_update(&s, true), 1);
    DT_CHECK(s.scale == 256.0);
    DT_CHECK_INT(dt_loss_scaler_update(&s, true), 1); /* the third clean step in a row */
    DT_CHECK(s.scale == 512.0);
    DT_CHECK_INT((int)s.skipped, 2);
    for (int k = 0; k < DT_LOSS_SCALER_MAX_SKIPS - 1; k++)
        DT_CHECK_INT(dt_loss_scaler_update(&s, false), 0);
    DT_CHECK_INT(dt_loss_scaler_update(&s, false), -EDOM);
}

int main(int argc, char **argv)
{
static const dt_test tests[] = {
        {"schedules", test_schedules, 0},
        {"config_from_job", test_config_from_job, 0},
        {"adamw_ranges_and_decay", test_adamw_ranges_and_decay, 0},
        {"sgd_first_step_and_state", test_sgd_first_step_and_state, 0},
        {"table_must_cover", test_table_must_cover, 0},
        {"clip", test_clip, 0},
        {"loss_scaler", test_loss_scaler, 0},
        {"cpu_numerics", test_cpu_numerics, 0},
        {"adamw_coefficients_in_double", test_adamw_coefficients_in_double, 0},
        {"accumulation_mlp", test_accumulation_mlp, 0},
        {"accumulation_gpt", test_accumulation_gpt, 0},
    };
    return dt_test_main("test_optim", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
