/* test_llama.c - the Llama-style decoder (runtime/train/models/llama.c) and its ops
 * (backend_ops.h's rmsnorm, swiglu, rope_qkv) on the CPU backend, against float64 references of
 * the same definitions written here from Hugging Face's LlamaForCausalLM (LlamaRMSNorm,
 * rotate_half / apply_rotary_pos_emb, repeat_kv, LlamaMLP's silu(gate) * up).
 *
 * - Ops: each forward against its double reference, each backward against central finite
 *   differences of that reference's scalar sum(out * R) (h = 1e-5 in double: exact to ~1e-9),
 *   both within 1e-5 relative to the largest magnitude of the tensor compared; backward ops must
 *   accumulate (the gradient buffers start at a known value). rope_qkv with kv heads shared by
 *   3 query heads and head sizes beyond one chunk of the cpu's angle table; its backward is the
 *   transpose (checked elementwise against the finite differences, which for a linear op are the
 *   matrix itself), and a rotation keeps each pair's norm.
 * - The whole model, forward and backward, against a float64 forward of the definition on tiny
 *   shapes (grouped-query with 2 query heads per kv head, and plain multi-head): the loss within
 *   1e-5 relative, every parameter's gradient against central finite differences of the double
 *   loss within 1e-5 of the tensor's largest gradient, after moving the parameters off their
 *   initialisation; for recompute none, block and selective.
 * - Hugging Face's names and shapes, the presets resolving through the job loader (llama3-8b's
 *   parameter count, 8030261248, is Meta's figure), and the configurations refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* ------------------------------------------------------------------------------------------ */
/* helpers */

static dt_backend *be_new(void)
{
    dt_backend *be = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    return be;
}

static float *dev(dt_backend *be, const float *h, size_t n)
{
    float *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(be->alloc(be, (void **)&d, (n ? n : 1) * sizeof(float), &err), &err);
    if (h)
        be->memcpy_h2d(be, d, h, n * sizeof(float));
    return d;
}

static float *host(dt_backend *be, const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    DT_REQUIRE(h);
    be->memcpy_d2h(be, h, d, n * sizeof(float));
    return h;
}

static float *randf(dt_rng *r, size_t n, float lo, float hi)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    DT_REQUIRE(x);
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * dt_rng_uniform(r);
    return x;
}

static double *tod(const float *x, size_t n)
{
    double *d = malloc((n ? n : 1) * sizeof(double));
    DT_REQUIRE(d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* got (minus base, when given: what an accumulating op added) against want, |got - want| <=
 * tol * max |want| over the tensor; returns the worst such ratio. */
static double check_rel(const char *what, const float *got, const float *base,
                        const double *want, size_t n, double tol)
{
    double maxw = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        maxw = DT_MAX(maxw, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        double d = fabs(g - want[i]) / (maxw > 0 ? maxw : 1.0);
        if (!(d <= worst)) {
            worst = d;
            at = i;
        }
    }
    DT_CHECK_MSG(worst <= tol, "%s: element %zu off by %.3g of the largest |%.6g| (got %.9g, "
                               "want %.9g; tolerance %.1g)",
                 what, at, worst, maxw,
                 (double)got[at] - (base ? (double)base[at] : 0.0), want[at], tol);
    return worst;
}

typedef double (*loss_fn)(void *ctx);

/* Central differences of loss with respect to x (n doubles, perturbed in place and restored). */
static void fd_grad(loss_fn loss, void *ctx, double *x, size_t n, double h, double *out)
{
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        out[i] = (lp - lm) / (2 * h);
    }
}

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

#define TOL 1e-5
#define FILL 0.25f /* what backward buffers hold before an op accumulates into them */

/* ------------------------------------------------------------------------------------------ */
/* double references of the ops */

static void ref_rmsnorm(double *out, const double *x, const double *w, int N, int C, double eps)
{
    for (int i = 0; i < N; i++) {
        const double *r = x + (size_t)i * C;
        double s = dot(r, r, (size_t)C) / C;
        double k = 1.0 / sqrt(s + eps);
        for (int j = 0; j < C; j++)
            out[(size_t)i * C + j] = w[j] * (r[j] * k);
    }
}

static double silu(double g) { return g / (1.0 + exp(-g)); }

static void ref_swiglu(double *out, const double *gu, int N, int F)
{
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++)
            out[(size_t)i * F + j] =
                silu(gu[(size_t)i * 2 * F + j]) * gu[(size_t)i * 2 * F + F + j];
}

/* apply_rotary_pos_emb on one head x (hs) at position t, as Hugging Face writes it:
 * x * cos + rotate_half(x) * sin, emb = cat(freqs, freqs), rotate_half = cat(-x2, x1). */
static void ref_rope_head(double *out, const double *x, int t, int hs, double theta)
{
    const int h2 = hs / 2;
    for (int j = 0; j < hs; j++) {
        double inv = 1.0 / pow(theta, (double)(2 * (j % h2)) / hs);
        double a = t * inv, rh = j < h2 ? -x[j + h2] : x[j - h2];
        out[j] = x[j] * cos(a) + rh * sin(a);
    }
}

/* (B,T,(NH+2NKV)hs) [q | k | v] -> (B,T,3 NH hs) with repeat_kv. */
static void ref_rope_qkv(double *out, const double *in, int B, int T, int NH, int NKV, int hs,
                         double theta)
{
    const int rep = NH / NKV;
    const size_t C = (size_t)NH * hs, Cin = C + 2 * (size_t)NKV * hs;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const double *r = in + ((size_t)b * T + t) * Cin;
            double *o = out + ((size_t)b * T + t) * 3 * C;
            for (int h = 0; h < NH; h++) {
                int g = h / rep;
                ref_rope_head(o + (size_t)h * hs, r + (size_t)h * hs, t, hs, theta);
                ref_rope_head(o + C + (size_t)h * hs, r + C + (size_t)g * hs, t, hs, theta);
                memcpy(o + 2 * C + (size_t)h * hs, r + C + (size_t)NKV * hs + (size_t)g * hs,
                       (size_t)hs * sizeof(double));
            }
        }
}

/* ------------------------------------------------------------------------------------------ */
/* the ops */

typedef struct op_ctx {
    int N, C, F, B, T, NH, NKV, hs;
    double *x, *w, *R, *out;
} op_ctx;

static double rms_loss(void *p)
{
    op_ctx *c = p;
    ref_rmsnorm(c->out, c->x, c->w, c->N, c->C, 1e-5);
    return dot(c->out, c->R, (size_t)c->N * c->C);
}

static void test_rmsnorm(void)
{
    dt_backend *be = be_new();
    const int N = 7, C = 45;
    const size_t n = (size_t)N * C;
    dt_rng r;
    dt_rng_seed(&r, 1);
    float *x = randf(&r, n, -2, 3), *w = randf(&r, C, 0.5f, 1.5f), *R = randf(&r, n, -1, 1);
    float *dx = dev(be, x, n), *dw = dev(be, w, C), *dR = dev(be, R, n);
    float *dout = dev(be, NULL, n), *drstd = dev(be, NULL, N);
    be->rmsnorm_fwd(be, dout, drstd, dx, dw, N, C, 1e-5f);
    op_ctx c = {.N = N, .C = C, .x = tod(x, n), .w = tod(w, C), .R = tod(R, n),
                .out = malloc(n * sizeof(double))};
    rms_loss(&c);
    float *out = host(be, dout, n);
    check_rel("rmsnorm_fwd", out, NULL, c.out, n, TOL);
    /* with no rstd kept, the same output */
    be->rmsnorm_fwd(be, dout, NULL, dx, dw, N, C, 1e-5f);
    float *out2 = host(be, dout, n);
    DT_CHECK(!memcmp(out, out2, n * sizeof(float)));
    float *fill = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        fill[i] = FILL;
    float *gx = dev(be, fill, n), *gw = dev(be, fill, C);
    be->rmsnorm_bwd(be, gx, gw, dR, dx, dw, drstd, N, C);
    float *hx = host(be, gx, n), *hw = host(be, gw, C);
    double *fx = malloc(n * sizeof(double)), *fw = malloc(C * sizeof(double));
    fd_grad(rms_loss, &c, c.x, n, 1e-5, fx);
    fd_grad(rms_loss, &c, c.w, C, 1e-5, fw);
    check_rel("rmsnorm_bwd dinp", hx, fill, fx, n, TOL);
    check_rel("rmsnorm_bwd dw", hw, fill, fw, C, TOL);
    /* NULL outputs are skipped */
    be->rmsnorm_bwd(be, NULL, gw, dR, dx, dw, drstd, N, C);
    be->rmsnorm_bwd(be, gx, NULL, dR, dx, dw, drstd, N, C);
    be->close(be);
    free(x); free(w); free(R); free(out); free(out2); free(fill); free(hx); free(hw); free(fx);
    free(fw); free(c.x); free(c.w); free(c.R); free(c.out);
}

static double swiglu_loss(void *p)
{
    op_ctx *c = p;
    ref_swiglu(c->out, c->x, c->N, c->F);
    return dot(c->out, c->R, (size_t)c->N * c->F);
}

static void test_swiglu(void)
{
    dt_backend *be = be_new();
    const int N = 6, F = 37;
    const size_t n = (size_t)N * F;
    dt_rng r;
    dt_rng_seed(&r, 2);
    float *x = randf(&r, 2 * n, -6, 6), *R = randf(&r, n, -1, 1);
    float *dx = dev(be, x, 2 * n), *dR = dev(be, R, n), *dout = dev(be, NULL, n);
    be->swiglu_fwd(be, dout, dx, N, F);
    op_ctx c = {.N = N, .F = F, .x = tod(x, 2 * n), .R = tod(R, n),
                .out = malloc(n * sizeof(double))};
    swiglu_loss(&c);
    float *out = host(be, dout, n);
    check_rel("swiglu_fwd", out, NULL, c.out, n, TOL);
    float *fill = malloc(2 * n * sizeof(float));
    for (size_t i = 0; i < 2 * n; i++)
        fill[i] = FILL;
    float *gx = dev(be, fill, 2 * n);
    be->swiglu_bwd(be, gx, dR, dx, N, F);
    float *hx = host(be, gx, 2 * n);
    double *fx = malloc(2 * n * sizeof(double));
    fd_grad(swiglu_loss, &c, c.x, 2 * n, 1e-5, fx);
    check_rel("swiglu_bwd", hx, fill, fx, 2 * n, TOL);
    be->close(be);
    free(x); free(R); free(out); free(fill); free(hx); free(fx); free(c.x); free(c.R);
    free(c.out);
}

static double rope_loss(void *p)
{
    op_ctx *c = p;
    ref_rope_qkv(c->out, c->x, c->B, c->T, c->NH, c->NKV, c->hs, 10000.0);
    return dot(c->out, c->R, (size_t)c->B * c->T * 3 * c->NH * c->hs);
}

static void rope_case(int B, int T, int NH, int NKV, int hs)
{
    dt_backend *be = be_new();
    const size_t nin = (size_t)B * T * (NH + 2 * NKV) * hs, nat = (size_t)B * T * 3 * NH * hs;
    dt_rng r;
    dt_rng_seed(&r, 3 + (uint64_t)hs);
    float *x = randf(&r, nin, -1, 1), *R = randf(&r, nat, -1, 1);
    float *dx = dev(be, x, nin), *dR = dev(be, R, nat), *dout = dev(be, NULL, nat);
    be->rope_qkv_fwd(be, dout, dx, B, T, NH, NKV, hs, 10000.0f);
    op_ctx c = {.B = B, .T = T, .NH = NH, .NKV = NKV, .hs = hs, .x = tod(x, nin), .R = tod(R, nat),
                .out = malloc(nat * sizeof(double))};
    rope_loss(&c);
    float *out = host(be, dout, nat);
    char what[64];
    snprintf(what, sizeof what, "rope_qkv_fwd (NH %d, NKV %d, hs %d)", NH, NKV, hs);
    check_rel(what, out, NULL, c.out, nat, TOL);
    /* a rotation keeps each pair's length: |q'| = |q| per head and position */
    const size_t C = (size_t)NH * hs, Cin = C + 2 * (size_t)NKV * hs;
    for (size_t row = 0; row < (size_t)B * T; row++)
        for (int h = 0; h < NH; h++) {
            double a = 0, b = 0;
            for (int j = 0; j < hs; j++) {
                a += (double)x[row * Cin + (size_t)h * hs + j] * x[row * Cin + (size_t)h * hs + j];
                b += (double)out[row * 3 * C + (size_t)h * hs + j] *
                     out[row * 3 * C + (size_t)h * hs + j];
            }
            DT_CHECK_MSG(fabs(a - b) <= 1e-5 * a, "row %zu head %d: |q| %.9g, rotated %.9g", row,
                         h, sqrt(a), sqrt(b));
        }
    float *fill = malloc(nin * sizeof(float));
    for (size_t i = 0; i < nin; i++)
        fill[i] = FILL;
    float *gx = dev(be, fill, nin);
    be->rope_qkv_bwd(be, gx, dR, B, T, NH, NKV, hs, 10000.0f);
    float *hx = host(be, gx, nin);
    double *fx = malloc(nin * sizeof(double));
    fd_grad(rope_loss, &c, c.x, nin, 1e-3, fx); /* linear: any h is exact */
    snprintf(what, sizeof what, "rope_qkv_bwd (NH %d, NKV %d, hs %d)", NH, NKV, hs);
    check_rel(what, hx, fill, fx, nin, TOL);
    be->close(be);
    free(x); free(R); free(out); free(fill); free(hx); free(fx); free(c.x); free(c.R);
    free(c.out);
}

static void test_rope_qkv(void)
{
    rope_case(2, 9, 6, 2, 8);    /* 3 query heads per kv head */
    rope_case(1, 5, 2, 2, 6);    /* plain multi-head, an odd half */
    rope_case(1, 3, 2, 1, 160);  /* 80 pairs: more than one chunk of the cpu's angles */
}

/* Position 0 is the identity; HF's angles at a known point: hs = 4, theta = 10000, t = 3:
 * pair 0 turns by 3 rad, pair 1 by 3/100. */
static void test_rope_known(void)
{
    dt_backend *be = be_new();
    const int T = 4, hs = 4;
    float in[T * 3 * hs], out[T * 3 * hs];
    for (int i = 0; i < T * 3 * hs; i++)
        in[i] = (float)(i % 5) - 2.0f;
    float *din = dev(be, in, (size_t)T * 3 * hs), *dout = dev(be, NULL, (size_t)T * 3 * hs);
    be->rope_qkv_fwd(be, dout, din, 1, T, 1, 1, hs, 10000.0f);
    be->memcpy_d2h(be, out, dout, sizeof out);
    for (int j = 0; j < 3 * hs; j++)
        DT_CHECK(out[j] == in[j]);
    const float *q = in + 3 * 3 * hs, *o = out + 3 * 3 * hs;
    DT_CHECK_NEAR(o[0], q[0] * cos(3.0) - q[2] * sin(3.0), 1e-6);
    DT_CHECK_NEAR(o[2], q[2] * cos(3.0) + q[0] * sin(3.0), 1e-6);
    DT_CHECK_NEAR(o[1], q[1] * cos(0.03) - q[3] * sin(0.03), 1e-6);
    DT_CHECK_NEAR(o[3], q[3] * cos(0.03) + q[1] * sin(0.03), 1e-6);
    be->close(be);
}

/* ------------------------------------------------------------------------------------------ */
/* the whole model against a float64 forward of the definition */

static dt_model_config llama_cfg(int nkv)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_LLAMA;
    c.shape.kind = DT_SAMPLE_TOKENS;
    c.shape.seq_len = 5;
    c.shape.vocab_size = 11;
    c.max_batch = 2;
    c.seed = 5;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = nkv;
    c.n_embd = 16;
    c.ffn_hidden = 12;
    c.block_size = 8;
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    return c;
}

typedef struct ref_model {
    const dt_model *m;       /* the table */
    const dt_model_config *c;
    double *p;               /* (num_params) the parameters, as the model lays them out */
    const dt_batch *b;
} ref_model;

static const double *RP(const ref_model *r, const char *fmt, int l)
{
    char nm[DT_TENSOR_NAME_MAX];
    snprintf(nm, sizeof nm, fmt, l);
    int i = dt_model_find_tensor(r->m, nm);
    DT_REQUIRE(i >= 0);
    return r->p + r->m->tensors[i].offset;
}

/* y (N,O) = x (N,I) @ w^T, w (O,I) */
static void lin(double *y, const double *x, const double *w, int N, int I, int O)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            y[(size_t)n * O + o] = dot(x + (size_t)n * I, w + (size_t)o * I, (size_t)I);
}

/* The mean next-token loss of batch b under the parameters r->p, in double, straight from the
 * definition (the header of this file). */
static double ref_loss(void *arg)
{
    const ref_model *r = arg;
    const dt_model_config *c = r->c;
    const int B = r->b->B, T = r->b->T, C = c->n_embd, NH = c->n_head;
    const int NKV = c->n_kv_head ? c->n_kv_head : NH, hs = C / NH, F = c->ffn_hidden;
    const int V = c->shape.vocab_size, N = B * T, rep = NH / NKV;
    double *x = calloc((size_t)N * C, sizeof(double)), *n1 = malloc((size_t)N * C * 8);
    double *q = malloc((size_t)N * NH * hs * 8), *k = malloc((size_t)N * NKV * hs * 8);
    double *v = malloc((size_t)N * NKV * hs * 8), *y = malloc((size_t)N * NH * hs * 8);
    double *o = malloc((size_t)N * C * 8), *g = malloc((size_t)N * F * 8);
    double *u = malloc((size_t)N * F * 8), *lg = malloc((size_t)N * V * 8);
    double *tmp = malloc((size_t)hs * 8), *p = malloc((size_t)T * 8);
    const double *E = RP(r, "model.embed_tokens.weight", 0);
    for (int i = 0; i < N; i++)
        memcpy(x + (size_t)i * C, E + (size_t)r->b->tokens[i] * C, (size_t)C * 8);
    for (int l = 0; l < c->n_layer; l++) {
        ref_rmsnorm(n1, x, RP(r, "model.layers.%d.input_layernorm.weight", l), N, C, c->norm_eps);
        lin(q, n1, RP(r, "model.layers.%d.self_attn.q_proj.weight", l), N, C, NH * hs);
        lin(k, n1, RP(r, "model.layers.%d.self_attn.k_proj.weight", l), N, C, NKV * hs);
        lin(v, n1, RP(r, "model.layers.%d.self_attn.v_proj.weight", l), N, C, NKV * hs);
        for (int i = 0; i < N; i++) { /* rotary, at position t of each sample */
            int t = i % T;
            for (int h = 0; h < NH; h++) {
                ref_rope_head(tmp, q + ((size_t)i * NH + h) * hs, t, hs, c->rope_theta);
                memcpy(q + ((size_t)i * NH + h) * hs, tmp, (size_t)hs * 8);
            }
            for (int h = 0; h < NKV; h++) {
                ref_rope_head(tmp, k + ((size_t)i * NKV + h) * hs, t, hs, c->rope_theta);
                memcpy(k + ((size_t)i * NKV + h) * hs, tmp, (size_t)hs * 8);
            }
        }
        for (int b = 0; b < B; b++) /* causal attention, query head h on kv head h / rep */
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    const double *qq = q + (((size_t)b * T + t) * NH + h) * hs;
                    double mx = -INFINITY, sum = 0;
                    for (int s = 0; s <= t; s++) {
                        p[s] = dot(qq, k + (((size_t)b * T + s) * NKV + h / rep) * hs,
                                   (size_t)hs) / sqrt((double)hs);
                        mx = DT_MAX(mx, p[s]);
                    }
                    for (int s = 0; s <= t; s++)
                        sum += p[s] = exp(p[s] - mx);
                    double *yy = y + (((size_t)b * T + t) * NH + h) * hs;
                    for (int j = 0; j < hs; j++) {
                        double a = 0;
                        for (int s = 0; s <= t; s++)
                            a += p[s] / sum * v[(((size_t)b * T + s) * NKV + h / rep) * hs + j];
                        yy[j] = a;
                    }
                }
        lin(o, y, RP(r, "model.layers.%d.self_attn.o_proj.weight", l), N, NH * hs, C);
        for (size_t i = 0; i < (size_t)N * C; i++)
            x[i] += o[i];
        ref_rmsnorm(n1, x, RP(r, "model.layers.%d.post_attention_layernorm.weight", l), N, C,
                    c->norm_eps);
        lin(g, n1, RP(r, "model.layers.%d.mlp.gate_proj.weight", l), N, C, F);
        lin(u, n1, RP(r, "model.layers.%d.mlp.up_proj.weight", l), N, C, F);
        for (size_t i = 0; i < (size_t)N * F; i++)
            g[i] = silu(g[i]) * u[i];
        lin(o, g, RP(r, "model.layers.%d.mlp.down_proj.weight", l), N, F, C);
        for (size_t i = 0; i < (size_t)N * C; i++)
            x[i] += o[i];
    }
    ref_rmsnorm(n1, x, RP(r, "model.norm.weight", 0), N, C, c->norm_eps);
    lin(lg, n1, RP(r, "lm_head.weight", 0), N, C, V);
    double loss = 0;
    int valid = 0;
    for (int i = 0; i < N; i++) {
        int tg = r->b->targets[i];
        if (tg < 0)
            continue;
        const double *row = lg + (size_t)i * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            mx = DT_MAX(mx, row[j]);
        for (int j = 0; j < V; j++)
            s += exp(row[j] - mx);
        loss += log(s) + mx - row[tg];
        valid++;
    }
    free(x); free(n1); free(q); free(k); free(v); free(y); free(o); free(g); free(u); free(lg);
    free(tmp); free(p);
    return valid ? loss / valid : 0.0;
}

static void model_vs_reference(dt_model_config c, dt_recompute rc)
{
    c.recompute = rc;
    dt_backend *be = be_new();
    dt_model *m = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_model_create(&m, &c, be, NULL, &err), &err);
    const size_t n = m->num_params;
    /* off the initialisation: std 0.02 keeps softmax and silu in their linear ranges */
    float *pf = host(be, m->params, n);
    dt_rng r;
    dt_rng_seed(&r, 6);
    for (size_t i = 0; i < n; i++)
        pf[i] += 0.3f * dt_rng_normal(&r);
    be->memcpy_h2d(be, m->params, pf, n * sizeof(float));
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, c.max_batch, 7);
    float loss = 0;
    be->memset_zero(be, m->grads, n * sizeof(float));
    DT_REQUIRE_OK(m->ops->forward(m, &hb.b, true, &loss, &err), &err);
    DT_REQUIRE_OK(m->ops->backward(m, 1.0f, NULL, NULL, &err), &err);
    float *gf = host(be, m->grads, n);
    ref_model rm = {.m = m, .c = &c, .p = tod(pf, n), .b = &hb.b};
    double want = ref_loss(&rm);
    DT_CHECK_MSG(fabs(loss - want) <= TOL * fabs(want), "loss %.9g, float64 reference %.12g",
                 loss, want);
    double *fd = malloc(n * sizeof(double));
    fd_grad(ref_loss, &rm, rm.p, n, 1e-5, fd);
    double worst = 0;
    for (int t = 0; t < m->num_tensors; t++) {
        const dt_tensor_info *ti = &m->tensors[t];
        char what[160];
        snprintf(what, sizeof what, "NKV %d recompute %d: gradient of %s", c.n_kv_head, (int)rc,
                 ti->name);
        worst = DT_MAX(worst, check_rel(what, gf + ti->offset, NULL, fd + ti->offset, ti->numel,
                                        TOL));
    }
    printf("    n_kv_head %d, recompute %d: loss %.7f (float64 %.7f), worst gradient %.2g of its "
           "tensor's largest\n",
           c.n_kv_head, (int)rc, loss, want, worst);
    dt_test_batch_free(&hb);
    free(pf); free(gf); free(fd); free(rm.p);
    dt_model_free(m);
    be->close(be);
}

static void test_model_gqa(void)
{
    for (int rc = 0; rc < 3; rc++)
        model_vs_reference(llama_cfg(2), (dt_recompute)rc);
}

static void test_model_mha(void)
{
    dt_model_config c = llama_cfg(0); /* n_kv_head 0: one kv head per query head */
    c.n_head = 2;
    c.shape.seq_len = 4;
    model_vs_reference(c, DT_RECOMPUTE_NONE);
}

/* ------------------------------------------------------------------------------------------ */
/* names, presets, configuration */

static void test_names(void)
{
    dt_backend *be = be_new();
    dt_model_config c = llama_cfg(2);
    dt_model *m = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_model_create(&m, &c, be, NULL, &err), &err);
    static const struct {
        const char *name;
        int64_t d0, d1;
    } want[] = {
        {"model.embed_tokens.weight", 11, 16},
        {"model.layers.0.input_layernorm.weight", 16, 0},
        {"model.layers.0.self_attn.q_proj.weight", 16, 16},
        {"model.layers.0.self_attn.k_proj.weight", 8, 16},
        {"model.layers.0.self_attn.v_proj.weight", 8, 16},
        {"model.layers.0.self_attn.o_proj.weight", 16, 16},
        {"model.layers.0.post_attention_layernorm.weight", 16, 0},
        {"model.layers.0.mlp.gate_proj.weight", 12, 16},
        {"model.layers.0.mlp.up_proj.weight", 12, 16},
        {"model.layers.0.mlp.down_proj.weight", 16, 12},
    };
    DT_CHECK_INT(m->num_tensors, 1 + 2 * 9 + 2);
    for (size_t i = 0; i < DT_ARRAY_LEN(want); i++) {
        const dt_tensor_info *t = &m->tensors[i];
        DT_CHECK_STR(t->name, want[i].name);
        DT_CHECK_INT(t->ndim, want[i].d1 ? 2 : 1);
        DT_CHECK_INT(t->shape[0], want[i].d0);
        if (want[i].d1)
            DT_CHECK_INT(t->shape[1], want[i].d1);
        DT_CHECK(t->no_decay == (want[i].d1 == 0));
    }
    DT_CHECK_STR(m->tensors[m->num_tensors - 2].name, "model.norm.weight");
    DT_CHECK_STR(m->tensors[m->num_tensors - 1].name, "lm_head.weight");
    const char *blocks[] = {"embed", "layers.0", "layers.1", "head"};
    DT_CHECK_INT(m->num_blocks, 4);
    for (int b = 0; b < 4 && b < m->num_blocks; b++)
        DT_CHECK_STR(m->blocks[b].name, blocks[b]);
    /* initialisation: matrices normal(0, 0.02), the norms 1 */
    float *p = host(be, m->params, m->num_params);
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        double s = 0, s2 = 0;
        for (size_t j = 0; j < t->numel; j++) {
            s += p[t->offset + j];
            s2 += (double)p[t->offset + j] * p[t->offset + j];
        }
        if (t->ndim == 1) {
            DT_CHECK_MSG(s == (double)t->numel && s2 == (double)t->numel, "%s is not all ones",
                         t->name);
        } else {
            double sd = sqrt(s2 / t->numel - (s / t->numel) * (s / t->numel));
            DT_CHECK_MSG(sd > 0.015 && sd < 0.025 && fabs(s / t->numel) < 0.005,
                         "%s: mean %.4f std %.4f, want normal(0, 0.02)", t->name, s / t->numel,
                         sd);
        }
    }
    free(p);
    dt_model_free(m);
    be->close(be);
}

/* Loads a job from text (plus one override), the config's errors into *msg (malloc'd). */
static int load(const char *text, const char *ov, dt_job *job, char **msg)
{
    char path[512];
    snprintf(path, sizeof path, "%s/job.ini", dt_test_tmpdir());
    DT_REQUIRE(dt_test_write_file(path, text) == 0);
    dt_config_errors errs = {0};
    dt_err err = {0};
    char *ovs[1] = {(char *)ov};
    int rc = dt_job_load(job, path, ovs, ov ? 1 : 0, &errs, &err);
    *msg = calloc(1, 65536);
    DT_REQUIRE(*msg);
    size_t at = (size_t)snprintf(*msg, 65536, "%s\n", err.msg);
    for (int i = 0; i < errs.count && at < 60000; i++)
        at += (size_t)snprintf(*msg + at, 65536 - at, "%s\n", errs.lines[i]);
    return rc;
}

static const char *JOB = "[model]\ntype = llama\npreset = %s\n[data]\ntype = text\n"
                         "path = /usr/share/common-licenses/GPL-3\n";

static void test_presets(void)
{
    dt_job job;
    char *msg = NULL, text[512];
    snprintf(text, sizeof text, JOB, "llama3-8b");
    DT_CHECK_MSG(load(text, NULL, &job, &msg) == 0, "%s", msg ? msg : "");
    DT_CHECK_INT(job.n_layer, 32);
    DT_CHECK_INT(job.n_head, 32);
    DT_CHECK_INT(job.n_kv_head, 8);
    DT_CHECK_INT(job.n_embd, 4096);
    DT_CHECK_INT(job.intermediate_size, 14336);
    DT_CHECK_INT(job.block_size, 8192);
    DT_CHECK_INT(job.seq_len, 8192);
    DT_CHECK_INT(job.vocab_size, 128256);
    DT_CHECK(job.rope_theta == 500000.0);
    /* the model's configuration from it, and its parameter count without building it */
    dt_model_config c;
    dt_sample_shape sh = {.kind = DT_SAMPLE_TOKENS, .seq_len = 8192, .vocab_size = 128256};
    dt_err err = {0};
    DT_REQUIRE_OK(dt_model_config_from_job(&c, &job, &sh, &err), &err);
    const double C = 4096, F = 14336, V = 128256, L = 32, KV = 8 * 128;
    double params = 2 * V * C + L * (2 * C + C * C * 2 + 2 * KV * C + 3 * C * F) + C;
    DT_CHECK_INT((long long)params, 8030261248LL); /* Meta-Llama-3-8B */
    DT_CHECK(c.n_kv_head == 8 && c.ffn_hidden == 14336 && c.rope_theta == 500000.0f);
    free(msg);
    snprintf(text, sizeof text, JOB, "llama3-70b");
    DT_CHECK_MSG(load(text, NULL, &job, &msg) == 0, "%s", msg ? msg : "");
    DT_CHECK(job.n_layer == 80 && job.n_head == 64 && job.n_kv_head == 8 && job.n_embd == 8192 &&
             job.intermediate_size == 28672);
    free(msg);
    /* the tiny one, with explicit keys winning over the preset; Meta's rule without one */
    snprintf(text, sizeof text, JOB, "llama-tiny");
    DT_CHECK_MSG(load(text, "model.n_kv_head=1", &job, &msg) == 0, "%s", msg ? msg : "");
    DT_CHECK(job.n_layer == 4 && job.n_kv_head == 1 && job.intermediate_size == 384 &&
             job.rope_theta == 10000.0);
    free(msg);
    DT_CHECK_MSG(load("[model]\ntype = llama\nn_layer = 2\nn_head = 4\nn_embd = 4096\n"
                        "block_size = 16\n[data]\ntype = text\n"
                        "path = /usr/share/common-licenses/GPL-3\n",
                        NULL, &job, &msg) == 0,
                   "%s", msg ? msg : "");
    DT_CHECK_INT(job.intermediate_size, 11008); /* Llama 2 7B's, from n_embd 4096 */
    DT_CHECK_INT(job.n_kv_head, 4);
    free(msg);
}

static void expect_job_error(const char *preset, const char *ov, const char *needle)
{
    dt_job job;
    char *msg = NULL, text[512];
    snprintf(text, sizeof text, JOB, preset);
    DT_CHECK(load(text, ov, &job, &msg) != 0);
    DT_CHECK_CONTAINS(msg ? msg : "", needle);
    free(msg);
}

static void expect_refused(const dt_model_config *c, const char *needle)
{
    dt_backend *be = be_new();
    dt_model *m = NULL;
    dt_err err = {0};
    DT_CHECK_INT(dt_model_create(&m, c, be, NULL, &err), -EINVAL);
    DT_CHECK(m == NULL);
    DT_CHECK_CONTAINS(err.msg, needle);
    be->close(be);
}

static void test_bad_config(void)
{
    expect_job_error("llama-tiny", "model.n_kv_head=3", "must divide model.n_head = 4");
    expect_job_error("llama-tiny", "model.n_head=128", "even head size"); /* 128 / 128 = 1 */
    expect_job_error("llama-tiny", "model.type=gpt", "is a preset of model llama");
    expect_job_error("llama-tiny", "parallel.tensor=4",
                     "must divide model.n_kv_head = 2 and model.intermediate_size = 384");
    dt_model_config c = llama_cfg(3);
    expect_refused(&c, "must divide model.n_head = 4");
    c = llama_cfg(2);
    c.ffn_hidden = 0;
    expect_refused(&c, "intermediate_size");
    c = llama_cfg(2);
    c.n_embd = 18; /* head size 3: no pairs to turn */
    c.n_head = 6;
    c.n_kv_head = 3;
    expect_refused(&c, "whole, even number");
    c = llama_cfg(2);
    c.shape.seq_len = 9;
    expect_refused(&c, "must be in 1..block_size (8)");
    c = llama_cfg(2);
    c.shape.kind = DT_SAMPLE_VECTOR;
    expect_refused(&c, "needs token data");
}

static const dt_test tests[] = {
    {"rmsnorm", test_rmsnorm, 0},
    {"swiglu", test_swiglu, 0},
    {"rope_qkv", test_rope_qkv, 0},
    {"rope_known", test_rope_known, 0},
    {"model_gqa", test_model_gqa, 120},
    {"model_mha", test_model_mha, 60},
    {"names", test_names, 0},
    {"presets", test_presets, 0},
    {"bad_config", test_bad_config, 0},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_llama", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
