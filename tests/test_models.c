/* test_models.c - the model zoo (runtime/models) on the CPU backend.
 *
 * - Whole-model backward against finite differences of the forward loss, on tiny instances:
 *   for every tensor, the derivative along a random unit direction within that tensor,
 *   (L(p + h d) - L(p - h d)) / 2h, against grad . d, with a 2% tolerance (a wrong or missing
 *   term is far outside it). Parameters are moved off their initialisation first, so that
 *   GELU, softmax and ReLU are exercised outside their linear range. h: float32 forwards limit
 *   it from below (ResNet fails below 3e-5), curvature from above (ResNet's BatchNorm over a
 *   batch of four 2x2 maps fails at 1e-3), so 2e-4 for ResNet and 1e-3 for the others.
 * - Same seed, same job: bit-identical parameters and losses over a few steps.
 * - The grad-ready hook: ranges cover the gradient buffer exactly once, in backward order
 *   (from the end of the buffer to its start), and each range is final when reported.
 * - Blocks (ZeRO-3 units) tile the parameter buffer; with a block hook that NaN-poisons every
 *   block's parameters and gradients outside its windows, training is bit-identical to no hook
 *   (the windows cover every use), and the events come in the documented order.
 * - llama (llama.c) takes every check gpt takes but causality (test_llama.c has its float64
 *   reference), with its own initialisation rule and exact recompute saving.
 * - train.recompute: block (gpt, bert, llama, resnet) and selective (gpt, bert, llama) train bit-identically
 *   to none, with
 *   and without the block hook, and allocate what they promise (exact for gpt).
 * - Loss falls on a tiny overfit task, for each model. bert joins every one of these; its
 *   correctness against its definition is test_bert's.
 * - Initialisation: every tensor (and buffer) of each model's table against the rule in the
 *   model's header comment (normal with the right std and shape, uniform within its bound,
 *   constants exact); a tensor the test has no rule for fails.
 * - GPT causality: changing token t changes the logits at positions >= t only (bit-exact).
 * - Tensor tables (names, shapes, contiguity), GPT-2 124M's parameter count, configuration from
 *   a job, errors for bad input.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"
#include "runtime/train/models/gpt.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* ------------------------------------------------------------------------------------------ */
/* tiny instances */

static dt_backend *be_new(void)
{
    dt_backend *be = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, e), e);
    return be;
}

static dt_model_config gpt_cfg(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_GPT;
    c.shape.kind = DT_SAMPLE_TOKENS;
    c.shape.seq_len = 10;
    c.shape.vocab_size = 23;
    c.max_batch = 2;
    c.seed = 42;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.block_size = 12;
    return c;
}

/* llama: 4 query heads on 2 key/value heads, head size 4, SwiGLU width 20 */
static dt_model_config llama_cfg(void)
{
    dt_model_config c = gpt_cfg();
    c.arch = DT_ARCH_LLAMA;
    c.seed = 45;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.ffn_hidden = 20;
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    return c;
}

/* bert with the next-sentence head; fixtures' batches for it have padding, token types and the
 * same number of masked targets per sample. */
static dt_model_config bert_cfg(void)
{
    dt_model_config c = gpt_cfg();
    c.arch = DT_ARCH_BERT;
    c.nsp = true;
    return c;
}

static dt_model_config mlp_cfg(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_MLP;
    c.shape.kind = DT_SAMPLE_VECTOR;
    c.shape.input_dim = 7;
    c.shape.n_classes = 5;
    c.max_batch = 6;
    c.seed = 43;
    c.n_hidden = 2;
    c.hidden[0] = 9;
    c.hidden[1] = 6;
    return c;
}

static dt_model_config resnet_cfg(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_RESNET;
    c.shape.kind = DT_SAMPLE_IMAGE;
    c.shape.channels = 3;
    c.shape.height = 8;
    c.shape.width = 8;
    c.shape.input_dim = 3 * 8 * 8;
    c.shape.n_classes = 4;
    c.max_batch = 4;
    c.seed = 44;
    c.depth = 8;
    c.width = 4;
    c.bn_momentum = 0.1f;
    c.bn_eps = 1e-5f;
    return c;
}

/* torchvision's ResNet-50 form (7x7 stem, max-pool, Bottlenecks) at width 2 on 3x32x32 */
static dt_model_config resnet50_cfg(void)
{
    dt_model_config c = resnet_cfg();
    c.imagenet = true;
    c.depth = 50;
    c.width = 2;
    c.shape.height = c.shape.width = 32;
    c.shape.input_dim = 3 * 32 * 32;
    return c;
}

static dt_model *model_new(dt_backend *be, const dt_model_config *c)
{
    dt_model *m = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(dt_model_create(&m, c, be, NULL, e), e);
    return m;
}

static float fwd(dt_model *m, const dt_batch *b, bool training)
{
    float loss = NAN;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(m->ops->forward(m, b, training, &loss, e), e);
    return loss;
}

static void bwd(dt_model *m, float scale, dt_grad_ready_fn ready, void *ctx)
{
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(m->ops->backward(m, scale, ready, ctx, e), e);
}

static float *host_copy(dt_backend *be, const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float) + 4);
    be->memcpy_d2h(be, h, d, n * sizeof(float));
    return h;
}

/* ------------------------------------------------------------------------------------------ */
/* backward against finite differences */

static void check_model_grads(const dt_model_config *cfg, int B, float noise, double h)
{
    dt_backend *be = be_new();
    dt_model *m = model_new(be, cfg);
    dt_test_batch hb;
    dt_test_batch_make(&hb, cfg, B, 7);
    const size_t n = m->num_params;
    /* Move away from the initialisation (GPT-2's std 0.02 keeps every GELU and softmax in its
     * linear range, where a wrong derivative would go unnoticed). */
    float *pn = host_copy(be, m->params, n);
    dt_rng nr;
    dt_rng_seed(&nr, 98);
    for (size_t i = 0; i < n; i++)
        pn[i] += noise * dt_rng_normal(&nr);
    be->memcpy_h2d(be, m->params, pn, n * sizeof(float));
    free(pn);
    be->memset_zero(be, m->grads, n * sizeof(float));
    fwd(m, &hb.b, true);
    bwd(m, 1.0f, NULL, NULL);
    float *g = host_copy(be, m->grads, n), *p0 = host_copy(be, m->params, n);
    float *p = malloc(n * sizeof(float)), *d = calloc(n, sizeof(float));
    dt_rng r;
    dt_rng_seed(&r, 99);
    int bad = 0;
    /* one direction per tensor, then one over everything (index num_tensors) */
    for (int ti = 0; ti <= m->num_tensors; ti++) {
        size_t off = ti < m->num_tensors ? m->tensors[ti].offset : 0;
        size_t cnt = ti < m->num_tensors ? m->tensors[ti].numel : n;
        memset(d, 0, n * sizeof(float));
        double norm = 0;
        for (size_t i = off; i < off + cnt; i++) {
            d[i] = dt_rng_normal(&r);
            norm += (double)d[i] * d[i];
        }
        norm = sqrt(norm);
        double analytic = 0;
        for (size_t i = off; i < off + cnt; i++) {
            d[i] = (float)(d[i] / norm);
            analytic += (double)g[i] * d[i];
        }
        double lp, lm;
        for (size_t i = 0; i < n; i++)
            p[i] = p0[i] + (float)h * d[i];
        be->memcpy_h2d(be, m->params, p, n * sizeof(float));
        lp = fwd(m, &hb.b, true);
        for (size_t i = 0; i < n; i++)
            p[i] = p0[i] - (float)h * d[i];
        be->memcpy_h2d(be, m->params, p, n * sizeof(float));
        lm = fwd(m, &hb.b, true);
        double fd = (lp - lm) / (2 * h);
        const char *name = ti < m->num_tensors ? m->tensors[ti].name : "(all parameters)";
        if (!(fabs(fd - analytic) <= 2e-3 + 2e-2 * fabs(analytic))) {
            dt_test_fail_at(__FILE__, __LINE__, "%s %s: grad.d = %.6g, finite differences %.6g",
                            dt_model_arch_name(cfg->arch), name, analytic, fd);
            bad++;
        }
    }
    be->memcpy_h2d(be, m->params, p0, n * sizeof(float));
    DT_CHECK_INT(bad, 0);

    /* dloss_scale scales, and backward accumulates */
    fwd(m, &hb.b, true);
    bwd(m, 2.0f, NULL, NULL);
    float *g3 = host_copy(be, m->grads, n);
    int mism = 0;
    for (size_t i = 0; i < n; i++)
        mism += !(fabsf(g3[i] - 3.0f * g[i]) <= 1e-5f + 1e-4f * fabsf(3.0f * g[i]));
    DT_CHECK_MSG(mism == 0, "%s: grads after a second backward with scale 2 are not 3x (%d off)",
                 dt_model_arch_name(cfg->arch), mism);
    dt_model_free(m);
    be->close(be);
    dt_test_batch_free(&hb);
    free(g); free(p0); free(p); free(d); free(g3);
}

static void test_gpt_grads(void)
{
    dt_model_config c = gpt_cfg();
    check_model_grads(&c, 2, 0.25f, 1e-3);
}

static void test_llama_grads(void)
{
    dt_model_config c = llama_cfg();
    check_model_grads(&c, 2, 0.25f, 1e-3);
}

static void test_mlp_grads(void)
{
    dt_model_config c = mlp_cfg();
    check_model_grads(&c, 6, 0.25f, 1e-3);
}

static void test_resnet_grads(void)
{
    dt_model_config c = resnet_cfg();
    check_model_grads(&c, 4, 0.25f, 2e-4);
}

/* ------------------------------------------------------------------------------------------ */
/* grad-ready ranges */

typedef struct ready_log {
    int n;
    size_t off[256], cnt[256];
    float *snap[256]; /* gradient range as it was when reported */
    dt_model *m;
} ready_log;

static void on_ready(void *ctx, size_t offset, size_t numel)
{
    ready_log *l = ctx;
    if (l->n >= 256)
        return;
    l->off[l->n] = offset;
    l->cnt[l->n] = numel;
    l->snap[l->n] = malloc(numel * sizeof(float) + 4);
    l->m->be->memcpy_d2h(l->m->be, l->snap[l->n], l->m->grads + offset, numel * sizeof(float));
    l->n++;
}

static void check_ready(const dt_model_config *cfg, int B)
{
    dt_backend *be = be_new();
    dt_model *m = model_new(be, cfg);
    dt_test_batch hb;
    dt_test_batch_make(&hb, cfg, B, 8);
    ready_log *l = calloc(1, sizeof *l);
    l->m = m;
    fwd(m, &hb.b, true);
    bwd(m, 1.0f, on_ready, l);
    DT_REQUIRE(l->n > 1);
    /* backward order: the first range ends the buffer, each next one ends where the previous
     * began, the last starts at 0: together every gradient exactly once */
    DT_CHECK_INT(l->off[0] + l->cnt[0], m->num_params);
    for (int i = 1; i < l->n; i++)
        DT_CHECK_MSG(l->off[i] + l->cnt[i] == l->off[i - 1],
                     "%s: range %d [%zu,+%zu) does not end where range %d begins (%zu)",
                     dt_model_arch_name(cfg->arch), i, l->off[i], l->cnt[i], i - 1, l->off[i - 1]);
    DT_CHECK_INT(l->off[l->n - 1], 0);
    /* and each range was final when reported */
    float *g = host_copy(be, m->grads, m->num_params);
    for (int i = 0; i < l->n; i++)
        DT_CHECK_MSG(memcmp(l->snap[i], g + l->off[i], l->cnt[i] * sizeof(float)) == 0,
                     "%s: range %d changed after it was reported ready",
                     dt_model_arch_name(cfg->arch), i);
    /* ranges align with tensor boundaries */
    for (int i = 0; i < l->n; i++) {
        bool start = false;
        for (int t = 0; t < m->num_tensors; t++)
            start |= m->tensors[t].offset == l->off[i];
        DT_CHECK(start);
    }
    for (int i = 0; i < l->n; i++)
        free(l->snap[i]);
    free(l);
    free(g);
    dt_model_free(m);
    be->close(be);
    dt_test_batch_free(&hb);
}

static void test_ready_ranges(void)
{
    dt_model_config c = gpt_cfg();
    check_ready(&c, 2);
    c = bert_cfg();
    check_ready(&c, 2);
    c = llama_cfg();
    check_ready(&c, 2);
    c = mlp_cfg();
    check_ready(&c, 6);
    c = resnet_cfg();
    check_ready(&c, 4);
    c = resnet50_cfg();
    check_ready(&c, 4);
}

/* ------------------------------------------------------------------------------------------ */
/* blocks and block hooks (ZeRO-3) */

/* A ZeRO-3 stand-in: outside its windows every block's parameters and gradients on the device
 * are NaN; the real values live on the host (p, g) and are put back at BEFORE, taken back (g)
 * at AFTER. Any read of a parameter outside its window turns loss or gradients into NaN, and
 * any gradient written outside its window is lost, so bit-identical results against a model
 * without the hook prove the windows. It also checks the protocol: no nesting, AFTER matches
 * BEFORE, parameters untouched inside windows, ready ranges = the block's, inside its window. */
typedef struct hook_state {
    dt_model *m;
    float *p, *g; /* (num_params) host: the real parameters and gradients */
    float *nan;   /* (num_params) host NaNs */
    int open;     /* block of the open window, or -1 */
    dt_block_event open_ev;
    int nev;
    int ev_block[4096];
    dt_block_event ev[4096];
    int bad;
    int nready;
    int ready_block[256];
} hook_state;

static void hook_fail(hook_state *h, const char *what, int b)
{
    if (h->bad++ < 5)
        dt_test_fail_at(__FILE__, __LINE__, "%s: block hook: %s (block %d, event %d)",
                        dt_model_arch_name(h->m->cfg.arch), what, b, h->nev);
}

static void on_block(void *ctx, int b, dt_block_event ev)
{
    hook_state *h = ctx;
    dt_model *m = h->m;
    dt_backend *be = m->be;
    if (b < 0 || b >= m->num_blocks) {
        hook_fail(h, "block index out of range", b);
        return;
    }
    if (h->nev < 4096) {
        h->ev_block[h->nev] = b;
        h->ev[h->nev] = ev;
    }
    h->nev++;
    const dt_block *k = &m->blocks[b];
    size_t bytes = k->numel * sizeof(float);
    if (ev == DT_BLOCK_BEFORE_FORWARD || ev == DT_BLOCK_BEFORE_BACKWARD) {
        if (h->open != -1)
            hook_fail(h, "BEFORE while another window is open", b);
        h->open = b;
        h->open_ev = ev;
        be->memcpy_h2d(be, m->params + k->offset, h->p + k->offset, bytes);
        be->memcpy_h2d(be, m->grads + k->offset, h->g + k->offset, bytes);
        return;
    }
    if (h->open != b || ev != h->open_ev + 1)
        hook_fail(h, "AFTER without its BEFORE", b);
    h->open = -1;
    float *now = host_copy(be, m->params + k->offset, k->numel);
    if (memcmp(now, h->p + k->offset, bytes) != 0)
        hook_fail(h, "parameters changed inside the window", b);
    free(now);
    be->memcpy_d2h(be, h->g + k->offset, m->grads + k->offset, bytes);
    be->memcpy_h2d(be, m->params + k->offset, h->nan, bytes);
    be->memcpy_h2d(be, m->grads + k->offset, h->nan, bytes);
}

static void on_block_ready(void *ctx, size_t offset, size_t numel)
{
    hook_state *h = ctx;
    int b = h->open;
    if (b < 0 || h->open_ev != DT_BLOCK_BEFORE_BACKWARD || h->m->blocks[b].offset != offset ||
        h->m->blocks[b].numel != numel)
        hook_fail(h, "ready range outside its block's backward window", b);
    if (h->nready < 256)
        h->ready_block[h->nready] = b;
    h->nready++;
}

/* The block order model.h promises for one forward (bwd false) or backward of m. */
static int expected_events(const dt_model *m, bool bwd, int *seq)
{
    int n = 0, nb = m->num_blocks;
    bool gpt = m->cfg.arch == DT_ARCH_GPT || m->cfg.arch == DT_ARCH_BERT; /* a tied head */
    if (!bwd) {
        for (int b = 0; b < nb; b++)
            seq[n++] = b;
        if (gpt)
            seq[n++] = 0; /* the tied head */
    } else {
        if (gpt)
            seq[n++] = 0;
        for (int b = nb - 1; b >= 0; b--)
            seq[n++] = b;
    }
    return n;
}

static void check_event_order(hook_state *h, bool bwd)
{
    int seq[512];
    int n = expected_events(h->m, bwd, seq);
    DT_CHECK_MSG(h->nev == 2 * n, "%s: %d block events in a %s, expected %d",
                 dt_model_arch_name(h->m->cfg.arch), h->nev, bwd ? "backward" : "forward", 2 * n);
    for (int i = 0; i < n && 2 * i + 1 < h->nev && 2 * i + 1 < 4096; i++) {
        dt_block_event before = bwd ? DT_BLOCK_BEFORE_BACKWARD : DT_BLOCK_BEFORE_FORWARD;
        DT_CHECK_MSG(h->ev_block[2 * i] == seq[i] && h->ev[2 * i] == before &&
                         h->ev_block[2 * i + 1] == seq[i] && h->ev[2 * i + 1] == before + 1,
                     "%s: window %d is block %d (event %d), expected block %d",
                     dt_model_arch_name(h->m->cfg.arch), i, h->ev_block[2 * i], (int)h->ev[2 * i],
                     seq[i]);
    }
    /* windows per block and pass: blocks[b].windows */
    for (int b = 0; b < h->m->num_blocks; b++) {
        int w = 0;
        for (int i = 0; i < n; i++)
            w += seq[i] == b;
        DT_CHECK_INT(w, h->m->blocks[b].windows);
    }
    h->nev = 0;
}

static void poison_all(hook_state *h)
{
    dt_model *m = h->m;
    m->be->memcpy_h2d(m->be, m->params, h->nan, m->num_params * sizeof(float));
    m->be->memcpy_h2d(m->be, m->grads, h->nan, m->num_params * sizeof(float));
}

/* Trains a model of cfg (with the poisoning block hook when hook) and a reference model of
 * ref_cfg without hook side by side for a few steps (one with two accumulated micro-steps, one
 * on a smaller batch, an evaluation forward) and wants bit-identical losses, gradients,
 * parameters and buffers. */
static void check_against(const dt_model_config *ref_cfg, const dt_model_config *cfg, int B,
                          bool hook)
{
    dt_backend *be = be_new();
    dt_model *ref = model_new(be, ref_cfg), *m = model_new(be, cfg);
    const size_t n = m->num_params;
    DT_REQUIRE(n == ref->num_params && m->num_buffers == ref->num_buffers);
    hook_state *h = calloc(1, sizeof *h);
    h->m = m;
    h->open = -1;
    h->p = host_copy(be, m->params, n);
    h->g = calloc(n, sizeof(float));
    h->nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h->nan[i] = NAN;
    if (hook) {
        dt_model_set_block_hook(m, on_block, h);
        poison_all(h);
    }
    float *pr = host_copy(be, ref->params, n);
    DT_REQUIRE(memcmp(pr, h->p, n * sizeof(float)) == 0);
    /* move off the initialisation (GELU, softmax and ReLU outside their linear ranges) */
    dt_rng nr;
    dt_rng_seed(&nr, 97);
    for (size_t i = 0; i < n; i++)
        h->p[i] = pr[i] += 0.1f * dt_rng_normal(&nr);
    be->memcpy_h2d(be, ref->params, pr, n * sizeof(float));
    if (!hook)
        be->memcpy_h2d(be, m->params, pr, n * sizeof(float));
    free(pr);

    const int steps = 4;
    for (int s = 0; s < steps; s++) {
        /* step 1: two micro-steps accumulated; step 2: a smaller batch (and shorter sequences) */
        dt_model_config bc = *cfg;
        int Bs = B;
        if (s == 2) {
            Bs = B > 1 ? B - 1 : 1;
            if (bc.shape.kind == DT_SAMPLE_TOKENS)
                bc.shape.seq_len -= 3;
        }
        dt_test_batch hb;
        dt_test_batch_make(&hb, &bc, Bs, 20 + (uint64_t)s);
        be->memset_zero(be, ref->grads, n * sizeof(float));
        memset(h->g, 0, n * sizeof(float));
        if (!hook)
            be->memset_zero(be, m->grads, n * sizeof(float));
        for (int micro = 0; micro < (s == 1 ? 2 : 1); micro++) {
            float lr = fwd(ref, &hb.b, true), lm = fwd(m, &hb.b, true);
            DT_CHECK_MSG(memcmp(&lr, &lm, sizeof lr) == 0, "%s step %d: loss %.9g, reference %.9g",
                         dt_model_arch_name(cfg->arch), s, lm, lr);
            if (hook)
                check_event_order(h, false);
            h->nready = 0;
            bwd(ref, 0.5f, NULL, NULL);
            bwd(m, 0.5f, hook ? on_block_ready : NULL, h);
            if (hook) {
                check_event_order(h, true);
                DT_CHECK_INT(h->nready, m->num_blocks);
                for (int i = 0; i < h->nready && i < 256; i++)
                    DT_CHECK_INT(h->ready_block[i], m->num_blocks - 1 - i);
            }
        }
        float *gr = host_copy(be, ref->grads, n);
        float *gm = hook ? h->g : host_copy(be, m->grads, n);
        size_t diff = 0, first = n;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&gr[i], &gm[i], sizeof(float)) != 0) {
                diff++;
                if (first == n)
                    first = i;
            }
        DT_CHECK_MSG(diff == 0,
                     "%s step %d: %zu gradients differ from the reference (first at "
                     "%zu: %.9g vs %.9g)",
                     dt_model_arch_name(cfg->arch), s, diff, first, first < n ? gm[first] : 0.0,
                     first < n ? gr[first] : 0.0);
        if (hook) { /* every block's memory is poisoned again between passes */
            float *pm = host_copy(be, m->params, n);
            size_t finite = 0;
            for (size_t i = 0; i < n; i++)
                finite += !isnan(pm[i]);
            DT_CHECK_INT(finite, 0);
            free(pm);
        }
        /* an SGD step on the host, the same for both */
        float *p = host_copy(be, ref->params, n);
        for (size_t i = 0; i < n; i++)
            p[i] -= 0.05f * gr[i];
        be->memcpy_h2d(be, ref->params, p, n * sizeof(float));
        memcpy(h->p, p, n * sizeof(float));
        if (!hook)
            be->memcpy_h2d(be, m->params, p, n * sizeof(float));
        free(p);
        free(gr);
        if (!hook)
            free(gm);
        dt_test_batch_free(&hb);
    }
    /* evaluation forward, then the buffers (BatchNorm running statistics) */
    dt_test_batch hb;
    dt_test_batch_make(&hb, cfg, B, 30);
    float lr = fwd(ref, &hb.b, false), lm = fwd(m, &hb.b, false);
    DT_CHECK_MSG(memcmp(&lr, &lm, sizeof lr) == 0, "%s eval: loss %.9g, reference %.9g",
                 dt_model_arch_name(cfg->arch), lm, lr);
    if (hook)
        check_event_order(h, false);
    DT_CHECK_INT(h->bad, 0);
    if (m->num_buffers) {
        float *br = host_copy(be, ref->buffers, m->num_buffers);
        float *bm = host_copy(be, m->buffers, m->num_buffers);
        DT_CHECK_MSG(memcmp(br, bm, m->num_buffers * sizeof(float)) == 0,
                     "%s: running statistics differ from the reference",
                     dt_model_arch_name(cfg->arch));
        free(br);
        free(bm);
    }
    dt_test_batch_free(&hb);
    free(h->p);
    free(h->g);
    free(h->nan);
    free(h);
    dt_model_free(m);
    dt_model_free(ref);
    be->close(be);
}

static void test_block_hooks(void)
{
    dt_model_config c = gpt_cfg();
    check_against(&c, &c, 2, true);
    c = bert_cfg();
    check_against(&c, &c, 2, true);
    c = llama_cfg();
    check_against(&c, &c, 2, true);
    c = mlp_cfg();
    check_against(&c, &c, 6, true);
    c = resnet_cfg();
    check_against(&c, &c, 4, true);
    c.depth = 14; /* two blocks per stage: identity shortcuts after projections */
    check_against(&c, &c, 4, true);
    c = resnet50_cfg();
    check_against(&c, &c, 4, true);
}

/* dt_model_lend_grads: backward accumulates into the lent buffer, the model's own one is left
 * as it was, taking it back returns the same buffer and the same gradients come out of a
 * backward there; freeing a model that holds lent memory frees its own buffer only (ASan: no
 * double free, no leak). */
static void test_lend_grads(void)
{
    dt_model_config c = mlp_cfg();
    dt_backend *be = be_new();
    dt_model *m = model_new(be, &c);
    const size_t n = m->num_params;
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, 4, 11);
    float *own = m->grads, *lent = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(be->alloc(be, (void **)&lent, n * sizeof(float), &err), &err);
    be->memset_zero(be, own, n * sizeof(float));
    fwd(m, &hb.b, true);
    bwd(m, 1.0f, NULL, NULL);
    float *ref = host_copy(be, own, n);
    be->memset_zero(be, own, n * sizeof(float));
    DT_CHECK(dt_model_lend_grads(m, lent) == own);
    DT_CHECK(m->grads == lent && m->own_grads == own);
    DT_CHECK(dt_model_lend_grads(m, lent) == own); /* lending again keeps the own buffer */
    fwd(m, &hb.b, true);
    bwd(m, 1.0f, NULL, NULL);
    float *got = host_copy(be, lent, n), *left = host_copy(be, own, n);
    size_t bad = 0, touched = 0;
    for (size_t i = 0; i < n; i++) {
        bad += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
        touched += left[i] != 0.0f;
    }
    DT_CHECK_MSG(bad == 0, "%zu of %zu gradients in the lent buffer differ", bad, n);
    DT_CHECK_MSG(touched == 0, "%zu of the model's own gradients changed while lent", touched);
    DT_CHECK(dt_model_lend_grads(m, NULL) == own);
    DT_CHECK(m->grads == own && m->own_grads == NULL);
    DT_CHECK(dt_model_lend_grads(m, lent) == own);
    dt_model_free(m); /* lent: frees own, not lent */
    be->free(be, lent);
    free(ref);
    free(got);
    free(left);
    dt_test_batch_free(&hb);
    be->close(be);
}

/* ------------------------------------------------------------------------------------------ */
/* activation recomputation */

/* recompute = block (and selective) against none: bit-identical losses, gradients, parameters
 * and running statistics over several steps, with and without the poisoning block hook. */
static void test_recompute_bitwise(void)
{
    const dt_recompute modes[] = {DT_RECOMPUTE_BLOCK, DT_RECOMPUTE_SELECTIVE};
    for (int i = 0; i < 2; i++)
        for (int hook = 0; hook < 2; hook++) {
            dt_model_config ref = gpt_cfg(), c = ref;
            ref.n_layer = c.n_layer = 3;
            c.recompute = modes[i];
            check_against(&ref, &c, 2, hook);
            ref = c = bert_cfg(); /* bert's recomputation likewise */
            ref.n_layer = c.n_layer = 3;
            c.recompute = modes[i];
            check_against(&ref, &c, 2, hook);
            ref = c = llama_cfg(); /* and llama's */
            ref.n_layer = c.n_layer = 3;
            c.recompute = modes[i];
            check_against(&ref, &c, 2, hook);
        }
    for (int depth = 8; depth <= 14; depth += 6)
        for (int hook = 0; hook < 2; hook++) {
            dt_model_config ref = resnet_cfg(), c = ref;
            ref.depth = c.depth = depth;
            c.recompute = DT_RECOMPUTE_BLOCK;
            check_against(&ref, &c, 4, hook);
        }
    for (int hook = 0; hook < 2; hook++) {
        dt_model_config r50 = resnet50_cfg(), c50 = r50;
        c50.recompute = DT_RECOMPUTE_BLOCK;
        check_against(&r50, &c50, 4, hook);
    }
    dt_model_config ref = mlp_cfg(), c = ref;
    c.recompute = DT_RECOMPUTE_BLOCK;
    check_against(&ref, &c, 6, true);
}

static size_t act_bytes(const dt_model_config *cfg)
{
    dt_backend *be = be_new();
    dt_model *m = model_new(be, cfg);
    size_t n = dt_model_activation_bytes(m);
    dt_model_free(m);
    be->close(be);
    return n;
}

/* With recompute = block, gpt allocates one layer of intermediates instead of L: the saving is
 * exactly (L-1) layers of everything but the block outputs (15C + 4 floats per token plus the
 * attention's saved state); selective saves (L-1) layers of the attention's saved state, which
 * on the cpu is the log-sum-exp (B*NH*T floats: the tiled kernel keeps no probabilities), so
 * selective saves little there. resnet keeps one set of conv/BN intermediates instead of one
 * per BasicBlock. */
static void test_recompute_memory(void)
{
    dt_model_config c = gpt_cfg();
    c.n_layer = 4;
    const size_t NR = (size_t)c.max_batch * c.shape.seq_len, C = (size_t)c.n_embd;
    size_t NATT = 0, NDATT = 1;
    dt_backend *be = be_new();
    be->attention_sizes(be, c.max_batch, c.shape.seq_len, c.n_embd, c.n_head, &NATT, &NDATT);
    be->close(be);
    DT_CHECK_INT(NATT, (size_t)c.max_batch * c.n_head * c.shape.seq_len); /* O(T) per head */
    DT_CHECK_INT(NDATT, 0);
    size_t none = act_bytes(&c);
    c.recompute = DT_RECOMPUTE_BLOCK;
    size_t block = act_bytes(&c);
    c.recompute = DT_RECOMPUTE_SELECTIVE;
    size_t sel = act_bytes(&c);
    DT_CHECK_INT(none - block, (size_t)(c.n_layer - 1) * (NR * (15 * C + 4) + NATT) * 4);
    DT_CHECK_INT(none - sel, (size_t)(c.n_layer - 1) * NATT * 4);
    DT_CHECK(none > 0 && block < none / 2);

    /* llama: per layer and token the two RMSNorms' outputs and 1/rms, the rotated q,k,v (3C),
     * the attention output, the residual after attention (7C + 2), gate|up and the SwiGLU output
     * (3F), plus what attention saves (attention_sizes: O(T) per head on the cpu) */
    dt_model_config l = llama_cfg();
    l.n_layer = 4;
    const size_t F = (size_t)l.ffn_hidden;
    size_t NATTl = 0, NDATTl = 1;
    be = be_new();
    be->attention_sizes(be, l.max_batch, l.shape.seq_len, l.n_embd, l.n_head, &NATTl, &NDATTl);
    be->close(be);
    DT_CHECK_INT(NATTl, (size_t)l.max_batch * l.n_head * l.shape.seq_len);
    none = act_bytes(&l);
    l.recompute = DT_RECOMPUTE_BLOCK;
    block = act_bytes(&l);
    l.recompute = DT_RECOMPUTE_SELECTIVE;
    sel = act_bytes(&l);
    DT_CHECK_INT(none - block, (size_t)(l.n_layer - 1) * (NR * (7 * C + 2 + 3 * F) + NATTl) * 4);
    DT_CHECK_INT(none - sel, (size_t)(l.n_layer - 1) * NATTl * 4);

    /* resnet: per BasicBlock, conv1 out, ReLU(BN1), conv2 out (and the shortcut conv's output
     * with a projection) are no longer allocated; four buffers of the largest activation and
     * 2*C_last floats of discarded running statistics are */
    dt_model_config r = resnet_cfg();
    r.depth = 20;
    r.max_batch = 8;
    none = act_bytes(&r);
    r.recompute = DT_RECOMPUTE_BLOCK;
    block = act_bytes(&r);
    const int n = (r.depth - 2) / 6;
    size_t saved = 0, max_act = (size_t)r.width * r.shape.height * r.shape.width;
    int H = r.shape.height, W = r.shape.width;
    for (int stage = 0; stage < 3; stage++)
        for (int j = 0; j < n; j++) {
            bool down = stage > 0 && j == 0;
            if (down) {
                H = (H - 1) / 2 + 1;
                W = (W - 1) / 2 + 1;
            }
            size_t a = (size_t)(r.width << stage) * H * W;
            saved += (down ? 4 : 3) * a;
            max_act = a > max_act ? a : max_act;
        }
    saved *= (size_t)r.max_batch;
    size_t added = 4 * max_act * (size_t)r.max_batch + 2 * (size_t)(4 * r.width);
    DT_CHECK_INT(none - block, (saved - added) * 4);
    DT_CHECK(block < none);

    /* mlp keeps only each layer's input already: block changes nothing */
    dt_model_config p = mlp_cfg();
    none = act_bytes(&p);
    p.recompute = DT_RECOMPUTE_BLOCK;
    DT_CHECK_INT(act_bytes(&p), none);
}

/* The block tables tile the parameter buffer, in order, on tensor boundaries. */
static void check_blocks(const dt_model_config *cfg, const char *const *names, int nnames)
{
    dt_backend *be = be_new();
    dt_model *m = model_new(be, cfg);
    DT_REQUIRE(m->num_blocks >= 2);
    size_t off = 0;
    int t = 0;
    for (int b = 0; b < m->num_blocks; b++) {
        const dt_block *k = &m->blocks[b];
        DT_CHECK_INT(k->offset, off);
        DT_CHECK_INT(k->first_tensor, t);
        DT_CHECK_INT(k->offset, m->tensors[k->first_tensor].offset);
        DT_CHECK_INT(k->offset + k->numel,
                     m->tensors[k->last_tensor].offset + m->tensors[k->last_tensor].numel);
        bool tied = cfg->arch == DT_ARCH_GPT || cfg->arch == DT_ARCH_BERT;
        DT_CHECK(k->windows == (tied && b == 0 ? 2 : 1));
        off += k->numel;
        t = k->last_tensor + 1;
    }
    DT_CHECK_INT(off, m->num_params);
    DT_CHECK_INT(t, m->num_tensors);
    DT_CHECK_INT(m->num_blocks, nnames);
    for (int b = 0; b < nnames && b < m->num_blocks; b++)
        DT_CHECK_STR(m->blocks[b].name, names[b]);
    dt_model_free(m);
    be->close(be);
}

static void test_block_tables(void)
{
    dt_model_config c = gpt_cfg();
    const char *gpt[] = {"embed", "h.0", "h.1", "ln_f"};
    check_blocks(&c, gpt, 4);
    c = bert_cfg();
    const char *bert[] = {"embed", "layer.0", "layer.1", "cls"};
    check_blocks(&c, bert, 4);
    c = llama_cfg();
    const char *llama[] = {"embed", "layers.0", "layers.1", "head"};
    check_blocks(&c, llama, 4);
    c = mlp_cfg();
    const char *mlp[] = {"fc.0", "fc.1", "fc.2"};
    check_blocks(&c, mlp, 3);
    c = resnet_cfg();
    c.depth = 14;
    const char *res[] = {"stem",     "layer1.0", "layer1.1", "layer2.0",
                         "layer2.1", "layer3.0", "layer3.1", "fc"};
    check_blocks(&c, res, 8);
}

/* ------------------------------------------------------------------------------------------ */
/* determinism and training */

/* Runs steps of forward, backward, AdamW on all parameters; losses[steps]. */
static void train(dt_model *m, const dt_batch *b, int steps, float lr, float *losses)
{
    dt_backend *be = m->be;
    float *mm = NULL, *vv = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(be->alloc(be, (void **)&mm, m->num_params * sizeof(float), e), e);
    DT_REQUIRE_OK(be->alloc(be, (void **)&vv, m->num_params * sizeof(float), e), e);
    for (int s = 0; s < steps; s++) {
        be->memset_zero(be, m->grads, m->num_params * sizeof(float));
        losses[s] = fwd(m, b, true);
        bwd(m, 1.0f, NULL, NULL);
        be->adamw_update(be, m->params, m->grads, mm, vv, m->num_params, lr, 0.9f, 0.999f, 1e-8f,
                         0.0f, s + 1);
    }
    be->free(be, mm);
    be->free(be, vv);
}

static void check_determinism(const dt_model_config *cfg, int B)
{
    dt_backend *be = be_new();
    dt_model *a = model_new(be, cfg), *b = model_new(be, cfg);
    DT_REQUIRE(a->num_params == b->num_params);
    float *pa = host_copy(be, a->params, a->num_params), *pb = host_copy(be, b->params, b->num_params);
    DT_CHECK_MSG(memcmp(pa, pb, a->num_params * sizeof(float)) == 0,
                 "%s: same seed, different initial parameters", dt_model_arch_name(cfg->arch));
    dt_test_batch hb;
    dt_test_batch_make(&hb, cfg, B, 9);
    float la[4], lb[4];
    train(a, &hb.b, 4, 1e-2f, la);
    train(b, &hb.b, 4, 1e-2f, lb);
    DT_CHECK_MSG(memcmp(la, lb, sizeof la) == 0, "%s: same seed, different losses",
                 dt_model_arch_name(cfg->arch));
    free(pa);
    free(pb);
    pa = host_copy(be, a->params, a->num_params);
    pb = host_copy(be, b->params, b->num_params);
    DT_CHECK_MSG(memcmp(pa, pb, a->num_params * sizeof(float)) == 0,
                 "%s: same seed, different parameters after training",
                 dt_model_arch_name(cfg->arch));
    if (a->num_buffers) {
        float *ba = host_copy(be, a->buffers, a->num_buffers);
        float *bb = host_copy(be, b->buffers, b->num_buffers);
        DT_CHECK(memcmp(ba, bb, a->num_buffers * sizeof(float)) == 0);
        free(ba);
        free(bb);
    }
    /* another seed: other parameters */
    dt_model_config c2 = *cfg;
    c2.seed++;
    dt_model *c = model_new(be, &c2);
    float *pc = host_copy(be, c->params, c->num_params);
    float *pa0 = NULL;
    dt_model *a0 = model_new(be, cfg);
    pa0 = host_copy(be, a0->params, a0->num_params);
    DT_CHECK(memcmp(pc, pa0, c->num_params * sizeof(float)) != 0);
    free(pa); free(pb); free(pc); free(pa0);
    dt_model_free(a);
    dt_model_free(b);
    dt_model_free(c);
    dt_model_free(a0);
    be->close(be);
    dt_test_batch_free(&hb);
}

static void test_determinism(void)
{
    dt_model_config c = gpt_cfg();
    check_determinism(&c, 2);
    c = bert_cfg();
    check_determinism(&c, 2);
    c = llama_cfg();
    check_determinism(&c, 2);
    c = mlp_cfg();
    check_determinism(&c, 6);
    c = resnet_cfg();
    check_determinism(&c, 4);
}

static void check_overfit(const dt_model_config *cfg, int B, int steps, float lr, float factor)
{
    dt_backend *be = be_new();
    dt_model *m = model_new(be, cfg);
    dt_test_batch hb;
    dt_test_batch_make(&hb, cfg, B, 10);
    float *losses = malloc(sizeof(float) * steps);
    train(m, &hb.b, steps, lr, losses);
    DT_CHECK_MSG(isfinite(losses[steps - 1]) && losses[steps - 1] < factor * losses[0],
                 "%s: loss went from %.4f to %.4f in %d steps (wanted below %.2fx)",
                 dt_model_arch_name(cfg->arch), losses[0], losses[steps - 1], steps, factor);
    if (cfg->shape.kind != DT_SAMPLE_TOKENS) /* classifiers memorise the batch */
        DT_CHECK_MSG(m->last_correct >= B - 1, "%s: %lld of %d correct after training",
                     dt_model_arch_name(cfg->arch), (long long)m->last_correct, B);
    free(losses);
    dt_model_free(m);
    be->close(be);
    dt_test_batch_free(&hb);
}

static void test_overfit_gpt(void)
{
    dt_model_config c = gpt_cfg();
    c.n_embd = 32;
    c.shape.vocab_size = 32;
    c.shape.seq_len = 12;
    c.max_batch = 4;
    check_overfit(&c, 4, 60, 1e-2f, 0.3f);
}

static void test_overfit_llama(void)
{
    dt_model_config c = llama_cfg();
    c.n_embd = 32;
    c.ffn_hidden = 64;
    c.shape.vocab_size = 32;
    c.shape.seq_len = 12;
    c.max_batch = 4;
    check_overfit(&c, 4, 60, 1e-2f, 0.3f);
}

static void test_overfit_bert(void)
{
    dt_model_config c = bert_cfg();
    c.n_embd = 32;
    c.shape.vocab_size = 32;
    c.shape.seq_len = 12;
    c.max_batch = 4;
    check_overfit(&c, 4, 60, 1e-2f, 0.3f);
}

static void test_overfit_mlp(void)
{
    dt_model_config c = mlp_cfg();
    c.max_batch = 16;
    c.hidden[0] = c.hidden[1] = 64;
    check_overfit(&c, 16, 60, 1e-2f, 0.3f);
}

static void test_overfit_resnet(void)
{
    dt_model_config c = resnet_cfg();
    c.max_batch = 8;
    check_overfit(&c, 8, 40, 1e-2f, 0.3f);
}

/* ------------------------------------------------------------------------------------------ */
/* tables, configuration, errors */

static void test_gpt_table(void)
{
    dt_backend *be = be_new();
    dt_model_config c = gpt_cfg();
    dt_model *m = model_new(be, &c);
    const char *names[] = {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias",
                           "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
                           "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.weight",
                           "h.0.ln_2.bias", "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias",
                           "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        DT_CHECK_STR(m->tensors[i].name, names[i]);
    DT_CHECK_STR(m->tensors[m->num_tensors - 1].name, "ln_f.bias");
    DT_CHECK_INT(m->num_tensors, 2 + 12 * c.n_layer + 2);
    int qkv = dt_model_find_tensor(m, "h.1.attn.c_attn.weight");
    DT_REQUIRE(qkv > 0);
    DT_CHECK_INT(m->tensors[qkv].shape[0], 3 * c.n_embd);
    DT_CHECK_INT(m->tensors[qkv].shape[1], c.n_embd);
    DT_CHECK(!m->tensors[qkv].no_decay);
    DT_CHECK(m->tensors[dt_model_find_tensor(m, "h.1.ln_2.weight")].no_decay);
    DT_CHECK(m->tensors[dt_model_find_tensor(m, "h.1.mlp.c_fc.bias")].no_decay);
    DT_CHECK_INT(dt_model_find_tensor(m, "nope"), -1);
    size_t off = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        DT_CHECK_INT(m->tensors[i].offset, off);
        off += m->tensors[i].numel;
    }
    DT_CHECK_INT(off, m->num_params);
    DT_CHECK(m->flops_per_sample > 6.0 * (double)m->num_params * 0.5);

    /* GPT-2 initialisation: std 0.02, residual projections 0.02/sqrt(2L), LN weight 1 */
    float *p = host_copy(be, m->params, m->num_params);
    const dt_tensor_info *t = &m->tensors[dt_model_find_tensor(m, "h.0.attn.c_proj.weight")];
    double ss = 0;
    for (size_t i = 0; i < t->numel; i++)
        ss += (double)p[t->offset + i] * p[t->offset + i];
    DT_CHECK_NEAR(sqrt(ss / t->numel), 0.02 / sqrt(2.0 * c.n_layer), 0.004);
    t = &m->tensors[dt_model_find_tensor(m, "h.1.ln_1.weight")];
    DT_CHECK(p[t->offset] == 1.0f && p[t->offset + t->numel - 1] == 1.0f);
    free(p);
    dt_model_free(m);
    be->close(be);
}

static void test_resnet_table(void)
{
    dt_backend *be = be_new();
    dt_model_config c = resnet_cfg();
    c.depth = 20;
    dt_model *m = model_new(be, &c);
    DT_CHECK_STR(m->tensors[0].name, "conv1.weight");
    DT_CHECK_STR(m->tensors[1].name, "bn1.weight");
    DT_CHECK(dt_model_find_tensor(m, "layer1.2.conv2.weight") > 0);
    DT_CHECK(dt_model_find_tensor(m, "layer2.0.downsample.0.weight") > 0);
    DT_CHECK(dt_model_find_tensor(m, "layer3.0.downsample.1.bias") > 0);
    DT_CHECK_INT(dt_model_find_tensor(m, "layer1.0.downsample.0.weight"), -1);
    DT_CHECK_STR(m->tensors[m->num_tensors - 1].name, "fc.bias");
    int fc = dt_model_find_tensor(m, "fc.weight");
    DT_CHECK_INT(m->tensors[fc].shape[1], 4 * c.width);
    /* 19 conv + 2 projections, each followed by BN: 21 BN layers with 2 buffers each */
    DT_CHECK_INT(m->num_buffer_tensors, 2 * 21);
    DT_CHECK_STR(m->buffer_tensors[0].name, "bn1.running_mean");
    float *bufs = host_copy(be, m->buffers, m->num_buffers);
    DT_CHECK(bufs[0] == 0.0f && bufs[m->buffer_tensors[1].offset] == 1.0f);
    /* a training forward moves the running statistics; eval uses them and changes nothing */
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, 4, 11);
    float lt = fwd(m, &hb.b, true);
    float *after = host_copy(be, m->buffers, m->num_buffers);
    DT_CHECK(memcmp(bufs, after, m->num_buffers * sizeof(float)) != 0);
    float le = fwd(m, &hb.b, false);
    float *after2 = host_copy(be, m->buffers, m->num_buffers);
    DT_CHECK(memcmp(after, after2, m->num_buffers * sizeof(float)) == 0);
    DT_CHECK(isfinite(lt) && isfinite(le) && lt != le);
    dt_err err = {0};
    DT_CHECK(m->ops->backward(m, 1.0f, NULL, NULL, &err) == -EINVAL); /* eval forward last */
    DT_CHECK_CONTAINS(err.msg, "training forward");
    free(bufs);
    free(after);
    free(after2);
    dt_test_batch_free(&hb);
    dt_model_free(m);
    be->close(be);
}

/* SyncBatchNorm's arithmetic on one rank (no communicator) is plain BatchNorm's. */
static void test_syncbn_single_rank(void)
{
    dt_backend *be = be_new();
    dt_model_config c = resnet_cfg();
    dt_model *plain = model_new(be, &c);
    c.sync_bn = true;
    dt_model *sync = model_new(be, &c);
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, 4, 12);
    float l1[3], l2[3];
    train(plain, &hb.b, 3, 1e-2f, l1);
    train(sync, &hb.b, 3, 1e-2f, l2);
    DT_CHECK(memcmp(l1, l2, sizeof l1) == 0);
    float *p1 = host_copy(be, plain->params, plain->num_params);
    float *p2 = host_copy(be, sync->params, sync->num_params);
    DT_CHECK(memcmp(p1, p2, plain->num_params * sizeof(float)) == 0);
    free(p1);
    free(p2);
    dt_test_batch_free(&hb);
    dt_model_free(plain);
    dt_model_free(sync);
    be->close(be);
}

/* ------------------------------------------------------------------------------------------ */
/* initialisation: every tensor of each model's table against the rule of its header comment */

typedef enum { INIT_NONE, INIT_NORMAL, INIT_UNIFORM, INIT_CONST } init_kind;
typedef struct {
    init_kind kind;
    double v; /* NORMAL: std; UNIFORM: bound (values in [-v, v]); CONST: the value */
} init_rule;

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Tolerances are ~6 standard errors of each statistic (never flakes for any seed) plus a small
 * floor: a wrong rule (unscaled c_proj, fan_in for fan_out, uniform for normal, a missing
 * scale) is far outside them for the sizes used here. */
static void check_init(const char *name, const float *x, size_t n, init_rule r)
{
    if (r.kind == INIT_NONE) {
        DT_CHECK_MSG(false, "%s: no initialisation rule in the test for this tensor", name);
        return;
    }
    size_t bad = 0, within = 0;
    double s = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        if (fabs(x[i]) > mx)
            mx = fabs(x[i]);
        if (r.kind == INIT_CONST && x[i] != (float)r.v)
            bad++;
    }
    if (r.kind == INIT_CONST) {
        DT_CHECK_MSG(bad == 0, "%s: %zu of %zu values differ from %g", name, bad, n, r.v);
        return;
    }
    const double mean = s / (double)n;
    double ss = 0;
    for (size_t i = 0; i < n; i++) {
        ss += ((double)x[i] - mean) * ((double)x[i] - mean);
        if (r.kind == INIT_NORMAL && fabs(x[i]) <= r.v)
            within++;
    }
    const double sd = sqrt(ss / (double)n), sn = sqrt((double)n);
    if (r.kind == INIT_NORMAL) {
        DT_CHECK_MSG(fabs(mean) <= 6.0 * r.v / sn, "%s: mean %g, want 0 (std %g, n %zu)", name,
                     mean, r.v, n);
        DT_CHECK_MSG(fabs(sd / r.v - 1.0) <= 6.0 / sqrt(2.0 * n) + 0.01,
                     "%s: std %g, want %g (n %zu)", name, sd, r.v, n);
        DT_CHECK_MSG(mx <= 6.5 * r.v, "%s: max |x| %g > 6.5 std (%g)", name, mx, r.v);
        if (n >= 1000) { /* normal, not uniform: P(|x| <= std) = 0.683 (uniform: 0.577) */
            double f = (double)within / (double)n, tol = 5.0 * sqrt(0.683 * 0.317 / n) + 0.005;
            DT_CHECK_MSG(fabs(f - 0.6827) <= tol, "%s: %.3f of values within 1 std, want 0.683",
                         name, f);
        }
    } else {
        const double want = r.v / sqrt(3.0);
        DT_CHECK_MSG(mx <= r.v * (1.0 + 1e-6), "%s: max |x| %g > bound %g", name, mx, r.v);
        DT_CHECK_MSG(n < 100 || mx >= 0.9 * r.v, "%s: max |x| %g, want near the bound %g", name,
                     mx, r.v);
        DT_CHECK_MSG(sd > 0, "%s: all values equal", name);
        if (n >= 30) {
            DT_CHECK_MSG(fabs(mean) <= 6.0 * want / sn, "%s: mean %g, want 0 (n %zu)", name, mean,
                         n);
            DT_CHECK_MSG(fabs(sd / want - 1.0) <= 2.7 / sn + 0.01, "%s: std %g, want %g (n %zu)",
                         name, sd, want, n);
        }
    }
}

/* gpt.c: normal(0, 0.02) for wte, wpe, c_attn and c_fc; c_proj (both residual projections)
 * 0.02/sqrt(2L); LayerNorm weight 1; every bias 0. */
static init_rule gpt_rule(const dt_tensor_info *t, int L)
{
    const char *n = t->name;
    if (ends_with(n, ".bias"))
        return (init_rule){INIT_CONST, 0.0};
    if (strstr(n, "ln_") && ends_with(n, ".weight"))
        return (init_rule){INIT_CONST, 1.0};
    if (ends_with(n, "c_proj.weight"))
        return (init_rule){INIT_NORMAL, 0.02 / sqrt(2.0 * L)};
    if (!strcmp(n, "wte.weight") || !strcmp(n, "wpe.weight") || ends_with(n, "c_attn.weight") ||
        ends_with(n, "c_fc.weight"))
        return (init_rule){INIT_NORMAL, 0.02};
    return (init_rule){INIT_NONE, 0};
}

/* llama.c (Hugging Face's _init_weights): every matrix normal(0, 0.02), the RMSNorm weights 1. */
static init_rule llama_rule(const dt_tensor_info *t)
{
    if (t->ndim == 1 && ends_with(t->name, "norm.weight"))
        return (init_rule){INIT_CONST, 1.0};
    if (t->ndim == 2 && ends_with(t->name, ".weight"))
        return (init_rule){INIT_NORMAL, 0.02};
    return (init_rule){INIT_NONE, 0};
}

/* bert.c (HF's _init_weights): every matrix normal(0, 0.02), LayerNorm weight 1, every bias 0. */
static init_rule bert_rule(const dt_tensor_info *t)
{
    if (ends_with(t->name, ".bias"))
        return (init_rule){INIT_CONST, 0.0};
    if (ends_with(t->name, "LayerNorm.weight"))
        return (init_rule){INIT_CONST, 1.0};
    if (t->ndim == 2)
        return (init_rule){INIT_NORMAL, 0.02};
    return (init_rule){INIT_NONE, 0};
}

/* resnet.c (torchvision): convolutions He-normal over fan_out = K*R*S, BN weight 1 and bias 0,
 * fc weight and bias uniform(+-1/sqrt(fan_in)); running_mean 0, running_var 1. */
static init_rule resnet_rule(const dt_tensor_info *t, int fc_in)
{
    const char *n = t->name;
    if (t->ndim == 4)
        return (init_rule){INIT_NORMAL,
                           sqrt(2.0 / ((double)t->shape[0] * t->shape[2] * t->shape[3]))};
    if (!strcmp(n, "fc.weight") || !strcmp(n, "fc.bias"))
        return (init_rule){INIT_UNIFORM, 1.0 / sqrt((double)fc_in)};
    if (ends_with(n, "running_mean"))
        return (init_rule){INIT_CONST, 0.0};
    if (ends_with(n, "running_var"))
        return (init_rule){INIT_CONST, 1.0};
    if (t->ndim == 1 && (strstr(n, "bn") || strstr(n, "downsample.1")))
        return (init_rule){INIT_CONST, ends_with(n, ".weight") ? 1.0 : 0.0};
    return (init_rule){INIT_NONE, 0};
}

/* mlp.c: hidden layers He-normal (std sqrt(2/fan_in)), the classifier uniform(+-1/sqrt(fan_in)),
 * biases 0. */
static init_rule mlp_rule(const dt_tensor_info *t, const char *last_weight)
{
    if (ends_with(t->name, ".bias"))
        return (init_rule){INIT_CONST, 0.0};
    if (t->ndim == 2 && !strcmp(t->name, last_weight))
        return (init_rule){INIT_UNIFORM, 1.0 / sqrt((double)t->shape[1])};
    if (t->ndim == 2)
        return (init_rule){INIT_NORMAL, sqrt(2.0 / (double)t->shape[1])};
    return (init_rule){INIT_NONE, 0};
}

static void test_init(void)
{
    dt_backend *be = be_new();
    /* big enough that the statistics mean something (c_proj of 64x64: 4096 values) */
    dt_model_config cg = gpt_cfg();
    cg.n_layer = 4;
    cg.n_head = 4;
    cg.n_embd = 64;
    cg.block_size = 128;
    cg.shape.vocab_size = 300;
    dt_model_config cr = resnet_cfg();
    cr.width = 16;
    cr.depth = 14;
    cr.shape.n_classes = 10;
    dt_model_config cm = mlp_cfg();
    cm.shape.input_dim = 64;
    cm.hidden[0] = 128;
    cm.hidden[1] = 64;
    cm.shape.n_classes = 10;
    dt_model_config cb = cg;
    cb.arch = DT_ARCH_BERT;
    cb.nsp = true;
    dt_model_config cl = llama_cfg();
    cl.n_layer = 3;
    cl.n_embd = 64;
    cl.ffn_hidden = 128;
    cl.shape.vocab_size = 300;
    const dt_model_config *cfgs[5] = {&cg, &cr, &cm, &cb, &cl};
    for (int k = 0; k < 5; k++) {
        dt_model *m = model_new(be, cfgs[k]);
        float *p = host_copy(be, m->params, m->num_params);
        char last[64];
        snprintf(last, sizeof last, "fc.%d.weight", cm.n_hidden);
        for (int i = 0; i < m->num_tensors; i++) {
            const dt_tensor_info *t = &m->tensors[i];
            init_rule r = k == 0   ? gpt_rule(t, cg.n_layer)
                          : k == 1 ? resnet_rule(t, 4 * cr.width)
                          : k == 2 ? mlp_rule(t, last)
                          : k == 3 ? bert_rule(t)
                                   : llama_rule(t);
            check_init(t->name, p + t->offset, t->numel, r);
        }
        free(p);
        if (m->num_buffers) {
            float *b = host_copy(be, m->buffers, m->num_buffers);
            for (int i = 0; i < m->num_buffer_tensors; i++) {
                const dt_tensor_info *t = &m->buffer_tensors[i];
                check_init(t->name, b + t->offset, t->numel, resnet_rule(t, 4 * cr.width));
            }
            free(b);
        }
        dt_model_free(m);
    }
    be->close(be);
}

/* ------------------------------------------------------------------------------------------ */
/* causality of the whole GPT (the kernel-level test is in test_kernels) */

/* Changing the token at position t of sample 0 leaves the logits at positions < t bit-identical
 * and changes those at every position >= t; sample 1 is untouched (bit-identical). Every layer
 * contributes: a leak through attention's mask, the MLP, LayerNorm or the position embedding at
 * any depth would show at some position < t. */
static void test_gpt_causality(void)
{
    dt_backend *be = be_new();
    dt_model_config c = gpt_cfg();
    c.n_layer = 3;
    dt_model *m = model_new(be, &c);
    const int B = 2, T = c.shape.seq_len, V = c.shape.vocab_size;
    const size_t row = (size_t)V * sizeof(float);
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, B, 21);
    DT_REQUIRE(hb.b.T == T);
    DT_REQUIRE(dt_gpt_logits(m) != NULL);
    fwd(m, &hb.b, false);
    float *base = host_copy(be, dt_gpt_logits(m), (size_t)B * T * V);
    const int ts[] = {0, 1, T / 2, T - 1};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        const int t = ts[k];
        const int32_t saved = hb.tokens[t];
        hb.tokens[t] = (saved + 1 + (int32_t)k) % V;
        DT_REQUIRE(hb.tokens[t] != saved);
        fwd(m, &hb.b, false);
        float *got = host_copy(be, dt_gpt_logits(m), (size_t)B * T * V);
        for (int s = 0; s < T; s++) {
            bool same = memcmp(got + (size_t)s * V, base + (size_t)s * V, row) == 0;
            DT_CHECK_MSG(s < t ? same : !same,
                         "token changed at position %d: logits at position %d %s", t, s,
                         same ? "unchanged (the change does not reach them)"
                              : "changed (information flows backwards in time)");
        }
        DT_CHECK_MSG(memcmp(got + (size_t)T * V, base + (size_t)T * V, (size_t)T * row) == 0,
                     "token changed in sample 0 changed sample 1's logits");
        hb.tokens[t] = saved;
        free(got);
    }
    /* the check itself can fail: the unchanged batch reproduces the base bit for bit */
    fwd(m, &hb.b, false);
    float *again = host_copy(be, dt_gpt_logits(m), (size_t)B * T * V);
    DT_CHECK(memcmp(again, base, (size_t)B * T * row) == 0);
    DT_CHECK(dt_gpt_logits(NULL) == NULL);
    free(again);
    free(base);
    dt_test_batch_free(&hb);
    dt_model_free(m);
    be->close(be);
}

static void test_gpt2_124m_count(void)
{
    dt_backend *be = be_new();
    dt_model_config c = gpt_cfg();
    c.n_layer = 12;
    c.n_head = 12;
    c.n_embd = 768;
    c.block_size = 1024;
    c.shape.vocab_size = 50257;
    c.shape.seq_len = 4;
    c.max_batch = 1;
    dt_model *m = model_new(be, &c);
    DT_CHECK_INT(m->num_params, 124439808); /* Hugging Face gpt2 */
    dt_model_free(m);
    be->close(be);
}

static void test_bad_input(void)
{
    dt_backend *be = be_new();
    dt_model_config c = gpt_cfg();
    dt_model *m = model_new(be, &c);
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, 2, 13);
    dt_err err = {0};
    float loss;
    hb.tokens[5] = c.shape.vocab_size;
    DT_CHECK(m->ops->forward(m, &hb.b, true, &loss, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "vocabulary");
    hb.tokens[5] = 0;
    hb.b.B = 3; /* above max_batch */
    DT_CHECK(m->ops->forward(m, &hb.b, true, &loss, &err) == -EINVAL);
    hb.b.B = 2;
    DT_CHECK(m->ops->backward(m, 1.0f, NULL, NULL, &err) == -EINVAL); /* no forward yet */
    dt_test_batch_free(&hb);
    dt_model_free(m);

    dt_model *bad = NULL;
    c.n_embd = 15; /* not divisible by n_head */
    DT_CHECK(dt_model_create(&bad, &c, be, NULL, &err) == -EINVAL && !bad);
    DT_CHECK_CONTAINS(err.msg, "divisible");
    c = gpt_cfg();
    c.shape.seq_len = c.block_size + 1;
    DT_CHECK(dt_model_create(&bad, &c, be, NULL, &err) == -EINVAL && !bad);
    c = resnet_cfg();
    c.depth = 21;
    DT_CHECK(dt_model_create(&bad, &c, be, NULL, &err) == -EINVAL && !bad);
    DT_CHECK_CONTAINS(err.msg, "6n+2");
    c.arch = DT_ARCH_COUNT; /* no such model (a "vit") */
    DT_CHECK(dt_model_create(&bad, &c, be, NULL, &err) == -EINVAL && !bad);
    dt_model_arch arch = DT_ARCH_MLP;
    DT_CHECK(dt_model_arch_parse("vit", &arch, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "unknown model");
    dt_model_free(NULL);
    be->close(be);
}

static void test_config_from_job(void)
{
    dt_job job;
    dt_job_defaults(&job);
    dt_model_config c;
    dt_err err = {0}, *e = &err;
    dt_sample_shape vec = {.kind = DT_SAMPLE_VECTOR, .input_dim = 20, .n_classes = 3};
    job.model_type = DT_MODEL_MLP;
    strcpy(job.hidden, "512, 256,64");
    job.batch_size = 32;
    job.seed = 5;
    DT_REQUIRE_OK(dt_model_config_from_job(&c, &job, &vec, e), e);
    DT_CHECK_STR(dt_model_arch_name(c.arch), "mlp");
    DT_CHECK_INT(c.n_hidden, 3);
    DT_CHECK_INT(c.hidden[0], 512);
    DT_CHECK_INT(c.hidden[2], 64);
    DT_CHECK_INT(c.max_batch, 32);
    DT_CHECK_INT(c.seed, 5);
    strcpy(job.hidden, "512,x");
    DT_CHECK(dt_model_config_from_job(&c, &job, &vec, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "model.hidden");

    dt_sample_shape tok = {.kind = DT_SAMPLE_TOKENS, .seq_len = 64, .vocab_size = 256};
    job.model_type = DT_MODEL_GPT;
    job.n_layer = 4;
    job.n_head = 4;
    job.n_embd = 128;
    job.block_size = 128;
    DT_REQUIRE_OK(dt_model_config_from_job(&c, &job, &tok, e), e);
    DT_CHECK_INT(c.n_embd, 128);
    DT_CHECK_INT(c.shape.seq_len, 64);
    DT_CHECK(dt_model_config_from_job(&c, &job, &vec, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "token");
    DT_CHECK_INT(c.recompute, DT_RECOMPUTE_NONE);
    job.recompute = DT_RECOMP_BLOCK;
    DT_REQUIRE_OK(dt_model_config_from_job(&c, &job, &tok, e), e);
    DT_CHECK_INT(c.recompute, DT_RECOMPUTE_BLOCK);
    job.recompute = DT_RECOMP_SELECTIVE;
    DT_REQUIRE_OK(dt_model_config_from_job(&c, &job, &tok, e), e);
    DT_CHECK_INT(c.recompute, DT_RECOMPUTE_SELECTIVE);
    job.model_type = DT_MODEL_MLP;
    strcpy(job.hidden, "16");
    DT_CHECK(dt_model_config_from_job(&c, &job, &vec, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "train.recompute = selective");
    job.model_type = DT_MODEL_GPT;
    job.recompute = DT_RECOMP_NONE;
    tok.seq_len = 129;
    DT_CHECK(dt_model_config_from_job(&c, &job, &tok, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "block_size");

    dt_sample_shape img = {.kind = DT_SAMPLE_IMAGE, .channels = 3, .height = 32, .width = 32,
                           .input_dim = 3072, .n_classes = 10};
    job.model_type = DT_MODEL_RESNET;
    job.depth = 20;
    job.width = 16;
    job.sync_bn = true;
    DT_REQUIRE_OK(dt_model_config_from_job(&c, &job, &img, e), e);
    DT_CHECK(c.sync_bn);
    DT_CHECK_INT(c.depth, 20);
    DT_CHECK_NEAR(c.bn_momentum, 0.1, 1e-7);
}

static const dt_test tests[] = {
    {"gpt_grads", test_gpt_grads, 0},
    {"llama_grads", test_llama_grads, 0},
    {"mlp_grads", test_mlp_grads, 0},
    {"resnet_grads", test_resnet_grads, 0},
    {"ready_ranges", test_ready_ranges, 0},
    {"block_tables", test_block_tables, 0},
    {"block_hooks", test_block_hooks, 0},
    {"lend_grads", test_lend_grads, 0},
    {"recompute_bitwise", test_recompute_bitwise, 0},
    {"recompute_memory", test_recompute_memory, 0},
    {"determinism", test_determinism, 0},
    {"overfit_gpt", test_overfit_gpt, 0},
    {"overfit_bert", test_overfit_bert, 0},
    {"overfit_llama", test_overfit_llama, 0},
    {"overfit_mlp", test_overfit_mlp, 0},
    {"overfit_resnet", test_overfit_resnet, 0},
    {"gpt_table", test_gpt_table, 0},
    {"resnet_table", test_resnet_table, 0},
    {"syncbn_single_rank", test_syncbn_single_rank, 0},
    {"init", test_init, 0},
    {"gpt_causality", test_gpt_causality, 0},
    {"gpt2_124m_count", test_gpt2_124m_count, 60},
    {"bad_input", test_bad_input, 0},
    {"config_from_job", test_config_from_job, 0},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_models", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
