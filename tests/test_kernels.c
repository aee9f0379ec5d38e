/* test_kernels.c - the CPU backend (kernels/cpu) against double-precision references.
 *
 * Every forward op is compared with a naive double-precision implementation written here, and
 * every backward op with central finite differences of that double reference (of the scalar
 * L = sum(out * R) for a random R, so the backward is fed dout = R). Backward ops must
 * ACCUMULATE: every gradient buffer is pre-filled with a known value that the check subtracts.
 * Known values (cross-entropy of uniform logits, LayerNorm moments, causality) and the
 * optimisers (against PyTorch's update rules, by hand) complete it.
 *
 * Tolerances: float32 kernels against float64 references, |got - want| <= atol + rtol*|want|,
 * with rtol 1e-3 for gradients (finite differences with h = 1e-3 on a double function are
 * exact to ~1e-7, so the error measured is the kernel's float32 rounding).
 */
#include <dirent.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "tests/harness.h"

/* ------------------------------------------------------------------------------------------ */
/* helpers */

static dt_backend *be_new(void)
{
    dt_backend *be = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, e), e);
    return be;
}

static void *dev_alloc(dt_backend *be, size_t bytes)
{
    void *p = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(be->alloc(be, &p, bytes ? bytes : 4, e), e);
    return p;
}

/* Device copy of host floats. */
static float *up(dt_backend *be, const float *h, size_t n)
{
    float *d = dev_alloc(be, n * sizeof(float));
    be->memcpy_h2d(be, d, h, n * sizeof(float));
    return d;
}

static int32_t *up_i(dt_backend *be, const int32_t *h, size_t n)
{
    int32_t *d = dev_alloc(be, n * sizeof(int32_t));
    be->memcpy_h2d(be, d, h, n * sizeof(int32_t));
    return d;
}

/* Host copy (malloc'd) of device floats. */
static float *down(dt_backend *be, const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float) + 4);
    be->memcpy_d2h(be, h, d, n * sizeof(float));
    return h;
}

static float *randf(dt_rng *r, size_t n, float lo, float hi)
{
    float *x = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * dt_rng_uniform(r);
    return x;
}

static double *tod(const float *x, size_t n)
{
    double *d = malloc(n * sizeof(double) + 8);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* Device buffer pre-filled with `fill` (to check that backward ops accumulate). */
static float *filled(dt_backend *be, size_t n, float fill)
{
    float *h = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        h[i] = fill;
    float *d = up(be, h, n);
    free(h);
    return d;
}

#define PREFILL 0.25f

/* Compares got (host floats) with want (doubles). Reports the first few misses. */
static int check_close(const char *what, const float *got, const double *want, size_t n,
                       double rtol, double atol)
{
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        double lim = atol + rtol * fabs(want[i]);
        if (!(d <= lim)) {
            if (bad < 5)
                dt_test_fail_at(__FILE__, __LINE__, "%s[%zu]: got %.8g want %.8g (diff %.3g)",
                                what, i, got[i], want[i], d);
            bad++;
        }
        if (d > worst)
            worst = d;
    }
    if (bad)
        dt_test_fail_at(__FILE__, __LINE__, "%s: %d of %zu out of tolerance (worst diff %.3g)",
                        what, bad, n, worst);
    return bad;
}

/* A double-precision forward of some op, as a scalar loss sum(out * R) of its inputs. */
typedef double (*loss_fn)(void *ctx);

/* Central finite differences of loss wrt x (n doubles, perturbed in place and restored), on
 * all elements when n <= maxn, else on maxn sampled ones; compared with got (host floats,
 * which hold PREFILL + gradient). */
static void check_fd(const char *what, loss_fn loss, void *ctx, double *x, size_t n,
                     const float *got, double rtol, double atol, size_t maxn)
{
    const double h = 1e-3;
    dt_rng r;
    dt_rng_seed(&r, 1234 + n);
    size_t checks = n <= maxn ? n : maxn;
    int bad = 0;
    for (size_t c = 0; c < checks; c++) {
        size_t i = n <= maxn ? c : (size_t)dt_rng_below(&r, n);
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        double want = (lp - lm) / (2 * h);
        double g = (double)got[i] - PREFILL;
        double d = fabs(g - want);
        if (!(d <= atol + rtol * fabs(want))) {
            if (bad < 5)
                dt_test_fail_at(__FILE__, __LINE__, "%s: d/dx[%zu]: kernel %.8g, finite "
                                "differences %.8g (diff %.3g)", what, i, g, want, d);
            bad++;
        }
    }
    if (bad)
        dt_test_fail_at(__FILE__, __LINE__, "%s: %d of %zu gradients out of tolerance", what, bad,
                        checks);
}

static double dot_d(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* double references */

static void ref_matmul(double *out, const double *inp, const double *w, const double *bias, int N,
                       int C, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++)
                s += inp[n * C + c] * w[o * C + c];
            out[n * OC + o] = s;
        }
}

/* out (B,T,C) and, when lse != NULL, the log-sum-exp of each row's scaled scores (B,NH,T). */
static void ref_attention_lse(double *out, double *lse, const double *qkv, int B, int T, int C,
                              int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *p = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const double *k = qkv + ((size_t)b * T + s) * 3 * C + C + h * hs;
                    p[s] = scale * dot_d(q, k, hs);
                    if (p[s] > m)
                        m = p[s];
                }
                double sum = 0;
                for (int s = 0; s <= t; s++) {
                    p[s] = exp(p[s] - m);
                    sum += p[s];
                }
                if (lse)
                    lse[((size_t)b * NH + h) * T + t] = m + log(sum);
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0;
                for (int s = 0; s <= t; s++) {
                    const double *v = qkv + ((size_t)b * T + s) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++)
                        o[i] += p[s] / sum * v[i];
                }
            }
    free(p);
}

static void ref_attention(double *out, const double *qkv, int B, int T, int C, int NH)
{
    ref_attention_lse(out, NULL, qkv, B, T, C, NH);
}

/* The analytic gradient of sum(out * dout) wrt qkv (B,T,3C), in double: dqkv is overwritten.
 * (The finite differences of test_attention check small shapes; this one serves large T.) */
static void ref_attention_bwd(double *dqkv, const double *qkv, const double *dout, int B, int T,
                              int C, int NH)
{
    const int hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    double *p = malloc(sizeof(double) * T), *dp = malloc(sizeof(double) * T);
    memset(dqkv, 0, sizeof(double) * (size_t)B * T * 3 * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t row = ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
                const double *q = qkv + row, *g = dout + ((size_t)b * T + t) * C + h * hs;
                double m = -INFINITY, sum = 0, D = 0;
                for (int s = 0; s <= t; s++) {
                    const size_t rs = ((size_t)b * T + s) * 3 * C + (size_t)h * hs;
                    p[s] = scale * dot_d(q, qkv + rs + C, hs);
                    dp[s] = dot_d(g, qkv + rs + 2 * C, hs);
                    m = p[s] > m ? p[s] : m;
                }
                for (int s = 0; s <= t; s++)
                    sum += (p[s] = exp(p[s] - m));
                for (int s = 0; s <= t; s++)
                    D += (p[s] /= sum) * dp[s];
                for (int s = 0; s <= t; s++) {
                    const size_t rs = ((size_t)b * T + s) * 3 * C + (size_t)h * hs;
                    const double ds = scale * p[s] * (dp[s] - D);
                    for (int i = 0; i < hs; i++) {
                        dqkv[row + i] += ds * qkv[rs + C + i];     /* dq */
                        dqkv[rs + C + i] += ds * q[i];            /* dk */
                        dqkv[rs + 2 * C + i] += p[s] * g[i];      /* dv */
                    }
                }
            }
    free(p);
    free(dp);
}

static void ref_conv(double *out, const double *x, const double *w, const double *bias,
                     const dt_conv2d_shape *s)
{
    for (int n = 0; n < s->N; n++)
        for (int k = 0; k < s->K; k++)
            for (int p = 0; p < s->P; p++)
                for (int q = 0; q < s->Q; q++) {
                    double acc = bias ? bias[k] : 0.0;
                    for (int c = 0; c < s->C; c++)
                        for (int r = 0; r < s->R; r++)
                            for (int t = 0; t < s->S; t++) {
                                int ih = p * s->stride - s->pad + r;
                                int iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W)
                                    continue;
                                acc += w[((k * s->C + c) * s->R + r) * s->S + t] *
                                       x[(((size_t)n * s->C + c) * s->H + ih) * s->W + iw];
                            }
                    out[(((size_t)n * s->K + k) * s->P + p) * s->Q + q] = acc;
                }
}

/* Gradients of sum(conv(x,w)+b) * dy), by the direct loops. */
static void ref_conv_bwd(double *dx, double *dw, double *db, const double *dy, const double *x,
                         const double *w, const dt_conv2d_shape *s)
{
    for (int n = 0; n < s->N; n++)
        for (int k = 0; k < s->K; k++)
            for (int p = 0; p < s->P; p++)
                for (int q = 0; q < s->Q; q++) {
                    double g = dy[(((size_t)n * s->K + k) * s->P + p) * s->Q + q];
                    db[k] += g;
                    for (int c = 0; c < s->C; c++)
                        for (int r = 0; r < s->R; r++)
                            for (int t = 0; t < s->S; t++) {
                                int ih = p * s->stride - s->pad + r;
                                int iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W)
                                    continue;
                                size_t wi = ((size_t)(k * s->C + c) * s->R + r) * s->S + t;
                                size_t xi = (((size_t)n * s->C + c) * s->H + ih) * s->W + iw;
                                dw[wi] += g * x[xi];
                                dx[xi] += g * w[wi];
                            }
                }
}

static void ref_layernorm(double *out, const double *x, const double *w, const double *b, int N,
                          int C, double eps)
{
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += x[n * C + c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (x[n * C + c] - m) * (x[n * C + c] - m);
        v /= C;
        double rs = 1.0 / sqrt(v + eps);
        for (int c = 0; c < C; c++)
            out[n * C + c] = (x[n * C + c] - m) * rs * w[c] + b[c];
    }
}

static double ref_gelu1(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* BatchNorm training forward over (N,C,HW) with batch statistics (biased variance). */
static void ref_bn(double *out, const double *x, const double *w, const double *b, int N, int C,
                   int HW, double eps)
{
    for (int c = 0; c < C; c++) {
        double m = 0, v = 0, cnt = (double)N * HW;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++)
                m += x[((size_t)n * C + c) * HW + i];
        m /= cnt;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                double d = x[((size_t)n * C + c) * HW + i] - m;
                v += d * d;
            }
        v /= cnt;
        double rs = 1.0 / sqrt(v + eps);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t j = ((size_t)n * C + c) * HW + i;
                out[j] = w[c] * (x[j] - m) * rs + b[c];
            }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* matmul */

typedef struct {
    double *inp, *w, *bias, *R, *out;
    int N, C, OC;
} mm_ctx;

static double mm_loss(void *p)
{
    mm_ctx *c = p;
    ref_matmul(c->out, c->inp, c->w, c->bias, c->N, c->C, c->OC);
    return dot_d(c->out, c->R, (size_t)c->N * c->OC);
}

static void matmul_case(int N, int C, int OC, bool with_bias)
{
    dt_backend *be = be_new();
    dt_rng r;
    dt_rng_seed(&r, 7 + N * 31 + C);
    float *inp = randf(&r, (size_t)N * C, -1, 1), *w = randf(&r, (size_t)OC * C, -1, 1);
    float *bias = randf(&r, OC, -1, 1), *R = randf(&r, (size_t)N * OC, -1, 1);
    float *d_inp = up(be, inp, (size_t)N * C), *d_w = up(be, w, (size_t)OC * C);
    float *d_b = with_bias ? up(be, bias, OC) : NULL, *d_R = up(be, R, (size_t)N * OC);
    float *d_out = dev_alloc(be, sizeof(float) * N * OC);
    be->matmul_fwd(be, d_out, d_inp, d_w, d_b, N, C, OC);

    mm_ctx c = {tod(inp, (size_t)N * C), tod(w, (size_t)OC * C), with_bias ? tod(bias, OC) : NULL,
                tod(R, (size_t)N * OC), malloc(sizeof(double) * N * OC), N, C, OC};
    mm_loss(&c);
    float *out = down(be, d_out, (size_t)N * OC);
    check_close("matmul_fwd", out, c.out, (size_t)N * OC, 1e-5, 1e-5);

    float *g_inp = filled(be, (size_t)N * C, PREFILL), *g_w = filled(be, (size_t)OC * C, PREFILL);
    float *g_b = filled(be, OC, PREFILL);
    be->matmul_bwd(be, g_inp, g_w, with_bias ? g_b : NULL, d_R, d_inp, d_w, N, C, OC);
    float *h_inp = down(be, g_inp, (size_t)N * C), *h_w = down(be, g_w, (size_t)OC * C);
    float *h_b = down(be, g_b, OC);
    check_fd("matmul_bwd dinp", mm_loss, &c, c.inp, (size_t)N * C, h_inp, 1e-3, 1e-4, 300);
    check_fd("matmul_bwd dw", mm_loss, &c, c.w, (size_t)OC * C, h_w, 1e-3, 1e-4, 300);
    if (with_bias)
        check_fd("matmul_bwd dbias", mm_loss, &c, c.bias, OC, h_b, 1e-3, 1e-4, 300);

    /* NULL outputs are skipped */
    be->matmul_bwd(be, NULL, g_w, NULL, d_R, d_inp, d_w, N, C, OC);
    be->matmul_bwd(be, g_inp, NULL, NULL, d_R, d_inp, d_w, N, C, OC);
    be->close(be);
    free(inp); free(w); free(bias); free(R); free(out); free(h_inp); free(h_w); free(h_b);
    free(c.inp); free(c.w); free(c.bias); free(c.R); free(c.out);
}

static void test_matmul(void)
{
    matmul_case(5, 7, 3, true);
    matmul_case(33, 16, 24, true);
    matmul_case(17, 40, 9, false);
}

/* ------------------------------------------------------------------------------------------ */
/* attention */

typedef struct {
    double *qkv, *R, *out;
    int B, T, C, NH;
} att_ctx;

static double att_loss(void *p)
{
    att_ctx *c = p;
    ref_attention(c->out, c->qkv, c->B, c->T, c->C, c->NH);
    return dot_d(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void attention_case(int B, int T, int C, int NH, size_t maxn)
{
    dt_backend *be = be_new();
    dt_rng r;
    dt_rng_seed(&r, 99 + T);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = 0, ndatt = 0;
    be->attention_sizes(be, B, T, C, NH, &natt, &ndatt);
    DT_CHECK_INT(natt, (size_t)B * NH * T); /* the log-sum-exp: O(T) per head */
    DT_CHECK_INT(ndatt, 0);
    float *qkv = randf(&r, nqkv, -1, 1), *R = randf(&r, nout, -1, 1);
    float *d_qkv = up(be, qkv, nqkv), *d_R = up(be, R, nout);
    float *d_out = dev_alloc(be, nout * 4), *d_att = dev_alloc(be, natt * 4);
    be->attention_fwd(be, d_out, d_att, d_qkv, B, T, C, NH);
    att_ctx c = {tod(qkv, nqkv), tod(R, nout), malloc(nout * sizeof(double)), B, T, C, NH};
    double *lse = malloc(natt * sizeof(double));
    ref_attention_lse(c.out, lse, c.qkv, B, T, C, NH);
    float *out = down(be, d_out, nout);
    check_close("attention_fwd", out, c.out, nout, 1e-4, 1e-5);
    float *att = down(be, d_att, natt); /* the saved log-sum-exp */
    check_close("attention_fwd lse", att, lse, natt, 1e-5, 1e-5);

    float *g = filled(be, nqkv, PREFILL);
    be->attention_bwd(be, g, NULL, d_R, d_qkv, d_att, B, T, C, NH);
    float *hg = down(be, g, nqkv);
    check_fd("attention_bwd dqkv", att_loss, &c, c.qkv, nqkv, hg, 2e-3, 2e-4, maxn);
    be->close(be);
    free(qkv); free(R); free(out); free(att); free(hg); free(c.qkv); free(c.R); free(c.out);
    free(lse);
}

static void test_attention(void)
{
    attention_case(2, 5, 8, 2, 1000);
    attention_case(1, 1, 4, 1, 1000);
    /* T above the tile size (64): several query and key tiles, a partial last one */
    attention_case(2, 70, 8, 2, 600);
    attention_case(1, 130, 12, 3, 400);
}

/* The tiled kernel (cpu_attention.c) on shapes around its tile edges (32 queries x 32 keys,
 * 16-float vectors; head sizes below, at and between multiples of 16) against the double
 * reference's output, log-sum-exp and analytic gradient, in every instruction-set variant this
 * CPU runs (DTRAIN_CPU_ATTN_ISA). Tolerance: |got - want| <= 5e-6 + 5e-6 |want| for out and
 * lse, 3e-5 (+ 3e-5 relative) for the gradient: float32 accumulation over up to T keys (the
 * kernel measured within 1e-6 and 1e-5 on an AVX-512 machine). */
static void attention_tile_case(int B, int T, int C, int NH, const char *isa)
{
    setenv("DTRAIN_CPU_ATTN_ISA", isa, 1);
    dt_backend *be = be_new();
    dt_rng r;
    dt_rng_seed(&r, 7 + T + C);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T;
    float *qkv = randf(&r, nqkv, -1.5f, 1.5f), *R = randf(&r, nout, -1, 1);
    float *d_qkv = up(be, qkv, nqkv), *d_R = up(be, R, nout);
    float *d_out = dev_alloc(be, nout * 4), *d_att = dev_alloc(be, natt * 4);
    be->attention_fwd(be, d_out, d_att, d_qkv, B, T, C, NH);
    unsetenv("DTRAIN_CPU_ATTN_ISA");
    DT_CHECK(dt_cpu_of(be)->attn_resolved);
    DT_CHECK_STR(dt_cpu_attention_variant_name(dt_cpu_of(be)->attn_variant), isa);
    double *xq = tod(qkv, nqkv), *xr = tod(R, nout), *want = malloc(nout * sizeof(double));
    double *lse = malloc(natt * sizeof(double)), *dwant = malloc(nqkv * sizeof(double));
    ref_attention_lse(want, lse, xq, B, T, C, NH);
    ref_attention_bwd(dwant, xq, xr, B, T, C, NH);
    float *out = down(be, d_out, nout), *att = down(be, d_att, natt);
    char what[96];
    snprintf(what, sizeof what, "attention %s B=%d T=%d C=%d NH=%d out", isa, B, T, C, NH);
    check_close(what, out, want, nout, 5e-6, 5e-6);
    snprintf(what, sizeof what, "attention %s B=%d T=%d C=%d NH=%d lse", isa, B, T, C, NH);
    check_close(what, att, lse, natt, 5e-6, 5e-6);
    float *g = filled(be, nqkv, PREFILL);
    be->attention_bwd(be, g, NULL, d_R, d_qkv, d_att, B, T, C, NH);
    float *hg = down(be, g, nqkv);
    for (size_t i = 0; i < nqkv; i++)
        hg[i] -= PREFILL;
    snprintf(what, sizeof what, "attention %s B=%d T=%d C=%d NH=%d dqkv", isa, B, T, C, NH);
    check_close(what, hg, dwant, nqkv, 3e-5, 3e-5);
    be->close(be);
    free(qkv); free(R); free(xq); free(xr); free(want); free(lse); free(dwant); free(out);
    free(att); free(hg);
}

static void test_attention_tiles(void)
{
    static const struct {
        int B, T, C, NH;
    } shapes[] = {
        {1, 1, 16, 1},    {1, 33, 32, 1},  {2, 63, 32, 2},  {1, 64, 64, 1},  {1, 65, 96, 3},
        {2, 128, 128, 4}, {1, 129, 80, 1}, {1, 200, 48, 2}, {1, 300, 128, 2}, /* 80, 24, 64 */
        {1, 257, 36, 3},  {1, 520, 64, 1},
        {1, 70, 256, 4},  {1, 40, 768, 12}, /* rows that crowd L1: K, V copied first */
    };
    static const char *const isas[] = {"base", "v3", "v4"};
    for (size_t k = 0; k < DT_ARRAY_LEN(isas); k++) {
        setenv("DTRAIN_CPU_ATTN_ISA", isas[k], 1);
        int v = dt_cpu_attention_variant();
        unsetenv("DTRAIN_CPU_ATTN_ISA");
        if (v != (int)k) { /* this CPU (or build) does not run it */
            printf("  (%s: not run on this CPU)\n", isas[k]);
            continue;
        }
        for (size_t i = 0; i < DT_ARRAY_LEN(shapes); i++)
            attention_tile_case(shapes[i].B, shapes[i].T, shapes[i].C, shapes[i].NH, isas[k]);
    }
}

static void test_attention_causality(void)
{
    dt_backend *be = be_new();
    const int B = 2, T = 80, C = 16, NH = 4;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = 0;
    be->attention_sizes(be, B, T, C, NH, &natt, NULL);
    dt_rng r;
    dt_rng_seed(&r, 5);
    float *qkv = randf(&r, nqkv, -2, 2);
    float *d_qkv = up(be, qkv, nqkv);
    float *d_out = dev_alloc(be, nout * 4), *d_att = dev_alloc(be, natt * 4);
    be->attention_fwd(be, d_out, d_att, d_qkv, B, T, C, NH);
    float *ref = down(be, d_out, nout);
    for (int tc = 0; tc < T; tc += 13) { /* change token tc (q, k and v) in every batch row */
        float *mod = malloc(nqkv * sizeof(float));
        memcpy(mod, qkv, nqkv * sizeof(float));
        for (int b = 0; b < B; b++)
            for (int i = 0; i < 3 * C; i++)
                mod[((size_t)b * T + tc) * 3 * C + i] += 5.0f + i;
        be->memcpy_h2d(be, d_qkv, mod, nqkv * sizeof(float));
        be->attention_fwd(be, d_out, d_att, d_qkv, B, T, C, NH);
        float *got = down(be, d_out, nout);
        int earlier_changed = 0, own_changed = 0;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < tc; t++)
                for (int i = 0; i < C; i++)
                    earlier_changed += got[((size_t)b * T + t) * C + i] !=
                                       ref[((size_t)b * T + t) * C + i];
            for (int i = 0; i < C; i++)
                own_changed += got[((size_t)b * T + tc) * C + i] != ref[((size_t)b * T + tc) * C + i];
        }
        DT_CHECK_MSG(earlier_changed == 0, "changing token %d changed %d earlier outputs", tc,
                     earlier_changed);
        DT_CHECK_MSG(own_changed > 0, "changing token %d did not change its own output", tc);
        free(mod);
        free(got);
    }
    be->close(be);
    free(qkv);
    free(ref);
}

/* The padded bidirectional form (attention_pad, BERT's): every query over the keys its sample's
 * mask keeps (mask (B,T), NULL: all); no key kept: a zero output. */
static void ref_attention_pad(double *out, const double *qkv, const int32_t *mask, int B, int T,
                              int C, int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *p = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, sum = 0;
                for (int s = 0; s < T; s++) {
                    const double *k = qkv + ((size_t)b * T + s) * 3 * C + C + h * hs;
                    p[s] = scale * dot_d(q, k, hs);
                    if ((!mask || mask[b * T + s]) && p[s] > m)
                        m = p[s];
                }
                for (int s = 0; s < T; s++) {
                    p[s] = !mask || mask[b * T + s] ? exp(p[s] - m) : 0.0;
                    sum += p[s];
                }
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0;
                for (int s = 0; s < T && sum > 0; s++) {
                    const double *v = qkv + ((size_t)b * T + s) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++)
                        o[i] += p[s] / sum * v[i];
                }
            }
    free(p);
}

typedef struct {
    att_ctx a;
    const int32_t *mask;
} att_pad_ctx;

static double att_pad_loss(void *p)
{
    att_pad_ctx *c = p;
    ref_attention_pad(c->a.out, c->a.qkv, c->mask, c->a.B, c->a.T, c->a.C, c->a.NH);
    return dot_d(c->a.out, c->a.R, (size_t)c->a.B * c->a.T * c->a.C);
}

/* attention_pad against the double reference: output, probabilities (rows sum to 1 over the kept
 * keys, exactly 0 at the masked ones; all 0 for a sample with every key masked), and the
 * backward by finite differences. pad_from[b]: the first padded position of sample b (T: none;
 * 0: all masked); no_mask: the NULL mask. */
static void attention_pad_case(int B, int T, int C, int NH, const int *pad_from, bool no_mask,
                               size_t maxn)
{
    dt_backend *be = be_new();
    dt_rng r;
    dt_rng_seed(&r, 77 + T);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    float *qkv = randf(&r, nqkv, -1, 1), *R = randf(&r, nout, -1, 1);
    int32_t *mask = malloc(sizeof(int32_t) * (size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            mask[b * T + t] = no_mask || t < pad_from[b];
    float *d_qkv = up(be, qkv, nqkv), *d_R = up(be, R, nout);
    int32_t *d_mask = no_mask ? NULL : up_i(be, mask, (size_t)B * T);
    float *d_out = filled(be, nout, 7.0f), *d_att = filled(be, natt, 7.0f);
    float *d_datt = filled(be, natt, 123.0f);
    be->attention_pad_fwd(be, d_out, d_att, d_qkv, d_mask, B, T, C, NH);
    att_pad_ctx c = {{tod(qkv, nqkv), tod(R, nout), malloc(nout * sizeof(double)), B, T, C, NH},
                     no_mask ? NULL : mask};
    att_pad_loss(&c);
    float *out = down(be, d_out, nout);
    check_close("attention_pad_fwd", out, c.a.out, nout, 1e-4, 1e-5);
    float *att = down(be, d_att, natt);
    int bad = 0;
    for (size_t row = 0; row < (size_t)B * NH * T; row++) {
        int b = (int)(row / ((size_t)NH * T));
        double sum = 0;
        for (int j = 0; j < T; j++) {
            float a = att[row * T + j];
            if (!mask[b * T + j] && a != 0.0f)
                bad++;
            sum += a;
        }
        if (fabs(sum - (pad_from[b] > 0 || no_mask ? 1.0 : 0.0)) > 1e-5)
            bad++;
    }
    DT_CHECK_MSG(bad == 0, "attention_pad_fwd: %d probability rows or masked keys wrong", bad);
    float *g = filled(be, nqkv, PREFILL);
    be->attention_pad_bwd(be, g, d_datt, d_R, d_qkv, d_att, B, T, C, NH);
    float *hg = down(be, g, nqkv);
    check_fd("attention_pad_bwd dqkv", att_pad_loss, &c, c.a.qkv, nqkv, hg, 2e-3, 2e-4, maxn);
    be->close(be);
    free(qkv); free(R); free(mask); free(out); free(att); free(hg);
    free(c.a.qkv); free(c.a.R); free(c.a.out);
}

static void test_attention_pad(void)
{
    const int none[2] = {5, 5}, some[2] = {5, 2}, one_empty[3] = {70, 0, 33};
    attention_pad_case(2, 5, 8, 2, none, true, 1000);
    attention_pad_case(2, 5, 8, 2, some, false, 1000);
    attention_pad_case(3, 70, 8, 2, one_empty, false, 600);
}

/* ------------------------------------------------------------------------------------------ */
/* conv2d */

typedef struct {
    double *x, *w, *b, *R, *out;
    dt_conv2d_shape s;
} conv_ctx;

static size_t conv_in(const dt_conv2d_shape *s) { return (size_t)s->N * s->C * s->H * s->W; }
static size_t conv_out(const dt_conv2d_shape *s) { return (size_t)s->N * s->K * s->P * s->Q; }
static size_t conv_w(const dt_conv2d_shape *s) { return (size_t)s->K * s->C * s->R * s->S; }

static double conv_loss(void *p)
{
    conv_ctx *c = p;
    ref_conv(c->out, c->x, c->w, c->b, &c->s);
    return dot_d(c->out, c->R, conv_out(&c->s));
}

static void conv_case(int N, int C, int H, int W, int K, int R, int S, int stride, int pad,
                      bool bias)
{
    dt_backend *be = be_new();
    dt_conv2d_shape s;
    dt_conv2d_shape_init(&s, N, C, H, W, K, R, S, stride, pad);
    dt_rng r;
    dt_rng_seed(&r, 11 + C * 7 + R);
    size_t ni = conv_in(&s), no = conv_out(&s), nw = conv_w(&s);
    float *x = randf(&r, ni, -1, 1), *w = randf(&r, nw, -1, 1), *b = randf(&r, K, -1, 1);
    float *Rr = randf(&r, no, -1, 1);
    float *d_x = up(be, x, ni), *d_w = up(be, w, nw), *d_b = bias ? up(be, b, K) : NULL;
    float *d_R = up(be, Rr, no), *d_out = dev_alloc(be, no * 4);
    be->conv2d_fwd(be, d_out, d_x, d_w, d_b, &s);
    conv_ctx c = {tod(x, ni), tod(w, nw), bias ? tod(b, K) : NULL, tod(Rr, no),
                  malloc(no * sizeof(double)), s};
    conv_loss(&c);
    float *out = down(be, d_out, no);
    char what[96];
    snprintf(what, sizeof what, "conv2d_fwd %dx%d s%d p%d", R, S, stride, pad);
    check_close(what, out, c.out, no, 1e-4, 1e-5);

    float *gx = filled(be, ni, PREFILL), *gw = filled(be, nw, PREFILL), *gb = filled(be, K, PREFILL);
    be->conv2d_bwd(be, gx, gw, bias ? gb : NULL, d_R, d_x, d_w, &s);
    float *hx = down(be, gx, ni), *hw = down(be, gw, nw), *hb = down(be, gb, K);
    snprintf(what, sizeof what, "conv2d_bwd %dx%d s%d p%d dinp", R, S, stride, pad);
    check_fd(what, conv_loss, &c, c.x, ni, hx, 1e-3, 1e-4, 250);
    snprintf(what, sizeof what, "conv2d_bwd %dx%d s%d p%d dw", R, S, stride, pad);
    check_fd(what, conv_loss, &c, c.w, nw, hw, 1e-3, 1e-4, 250);
    if (bias) {
        snprintf(what, sizeof what, "conv2d_bwd %dx%d s%d p%d dbias", R, S, stride, pad);
        check_fd(what, conv_loss, &c, c.b, K, hb, 1e-3, 1e-4, 250);
    }
    be->close(be);
    free(x); free(w); free(b); free(Rr); free(out); free(hx); free(hw); free(hb);
    free(c.x); free(c.w); free(c.b); free(c.R); free(c.out);
}

static void test_conv2d(void)
{
    conv_case(2, 3, 6, 5, 4, 3, 3, 1, 1, true);   /* the ResNet 3x3 */
    conv_case(2, 4, 7, 7, 3, 3, 3, 2, 1, false);  /* downsampling 3x3 */
    conv_case(2, 5, 4, 4, 6, 1, 1, 1, 0, true);   /* pointwise: no im2col */
    conv_case(2, 4, 6, 6, 3, 1, 1, 2, 0, false);  /* 1x1 stride 2 shortcut */
    conv_case(1, 2, 5, 6, 2, 5, 3, 1, 2, true);   /* non-square kernel, pad 2 */
    conv_case(1, 2, 9, 9, 2, 3, 3, 3, 0, false);  /* stride 3, no pad */
    conv_case(2, 3, 6, 5, 2, 3, 1, 1, 0, true);   /* 3x1: same width, fewer rows */
    conv_case(1, 2, 5, 7, 3, 1, 5, 1, 2, false);  /* 1x5 pad 2: same width, taller output */
}

/* A convolution big enough that im2col runs in several chunks; against the direct loops. */
static void test_conv2d_chunked(void)
{
    dt_backend *be = be_new();
    dt_conv2d_shape s;
    dt_conv2d_shape_init(&s, 2, 64, 96, 96, 4, 3, 3, 1, 1); /* CRS*PQ = 5.3M floats > 4M */
    dt_rng r;
    dt_rng_seed(&r, 3);
    size_t ni = conv_in(&s), no = conv_out(&s), nw = conv_w(&s);
    float *x = randf(&r, ni, -1, 1), *w = randf(&r, nw, -1, 1), *b = randf(&r, s.K, -1, 1);
    float *dy = randf(&r, no, -1, 1);
    float *d_x = up(be, x, ni), *d_w = up(be, w, nw), *d_b = up(be, b, s.K), *d_dy = up(be, dy, no);
    float *d_out = dev_alloc(be, no * 4);
    be->conv2d_fwd(be, d_out, d_x, d_w, d_b, &s);
    double *X = tod(x, ni), *Wd = tod(w, nw), *Bd = tod(b, s.K), *DY = tod(dy, no);
    double *want = malloc(no * sizeof(double));
    ref_conv(want, X, Wd, Bd, &s);
    float *out = down(be, d_out, no);
    check_close("conv2d_fwd chunked", out, want, no, 1e-4, 1e-4);
    float *gx = filled(be, ni, 0), *gw = filled(be, nw, 0), *gb = filled(be, s.K, 0);
    be->conv2d_bwd(be, gx, gw, gb, d_dy, d_x, d_w, &s);
    double *rx = calloc(ni, sizeof(double)), *rw = calloc(nw, sizeof(double));
    double *rb = calloc(s.K, sizeof(double));
    ref_conv_bwd(rx, rw, rb, DY, X, Wd, &s);
    float *hx = down(be, gx, ni), *hw = down(be, gw, nw), *hb = down(be, gb, s.K);
    check_close("conv2d_bwd chunked dinp", hx, rx, ni, 1e-4, 1e-4);
    check_close("conv2d_bwd chunked dw", hw, rw, nw, 1e-4, 1e-2);
    check_close("conv2d_bwd chunked dbias", hb, rb, s.K, 1e-4, 1e-2);
    be->close(be);
    free(x); free(w); free(b); free(dy); free(X); free(Wd); free(Bd); free(DY); free(want);
    free(out); free(rx); free(rw); free(rb); free(hx); free(hw); free(hb);
}

/* ------------------------------------------------------------------------------------------ */
/* LayerNorm */

typedef struct {
    double *x, *w, *b, *R, *out;
    int N, C;
} ln_ctx;

static double ln_loss(void *p)
{
    ln_ctx *c = p;
    ref_layernorm(c->out, c->x, c->w, c->b, c->N, c->C, 1e-5);
    return dot_d(c->out, c->R, (size_t)c->N * c->C);
}

static void test_layernorm(void)
{
    dt_backend *be = be_new();
    const int N = 6, C = 37;
    size_t n = (size_t)N * C;
    dt_rng r;
    dt_rng_seed(&r, 17);
    float *x = randf(&r, n, -2, 3), *w = randf(&r, C, 0.5f, 1.5f), *b = randf(&r, C, -1, 1);
    float *Rr = randf(&r, n, -1, 1);
    float *d_x = up(be, x, n), *d_w = up(be, w, C), *d_b = up(be, b, C), *d_R = up(be, Rr, n);
    float *d_out = dev_alloc(be, n * 4), *d_mean = dev_alloc(be, N * 4), *d_rstd = dev_alloc(be, N * 4);
    be->layernorm_fwd(be, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 1e-5f);
    ln_ctx c = {tod(x, n), tod(w, C), tod(b, C), tod(Rr, n), malloc(n * sizeof(double)), N, C};
    ln_loss(&c);
    float *out = down(be, d_out, n);
    check_close("layernorm_fwd", out, c.out, n, 1e-4, 1e-5);
    float *gx = filled(be, n, PREFILL), *gw = filled(be, C, PREFILL), *gb = filled(be, C, PREFILL);
    be->layernorm_bwd(be, gx, gw, gb, d_R, d_x, d_w, d_mean, d_rstd, N, C);
    float *hx = down(be, gx, n), *hw = down(be, gw, C), *hb = down(be, gb, C);
    check_fd("layernorm_bwd dinp", ln_loss, &c, c.x, n, hx, 1e-3, 1e-4, 400);
    check_fd("layernorm_bwd dw", ln_loss, &c, c.w, C, hw, 1e-3, 1e-4, 400);
    check_fd("layernorm_bwd db", ln_loss, &c, c.b, C, hb, 1e-3, 1e-4, 400);
    be->close(be);
    free(x); free(w); free(b); free(Rr); free(out); free(hx); free(hw); free(hb);
    free(c.x); free(c.w); free(c.b); free(c.R); free(c.out);
}

/* With unit weight and zero bias, every output row has mean 0 and variance 1. */
static void test_layernorm_moments(void)
{
    dt_backend *be = be_new();
    const int N = 16, C = 768;
    size_t n = (size_t)N * C;
    dt_rng r;
    dt_rng_seed(&r, 18);
    float *x = randf(&r, n, -3, 10);
    float *ones = malloc(C * sizeof(float)), *zeros = calloc(C, sizeof(float));
    for (int i = 0; i < C; i++)
        ones[i] = 1.0f;
    float *d_x = up(be, x, n), *d_w = up(be, ones, C), *d_b = up(be, zeros, C);
    float *d_out = dev_alloc(be, n * 4), *d_mean = dev_alloc(be, N * 4), *d_rstd = dev_alloc(be, N * 4);
    be->layernorm_fwd(be, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 1e-5f);
    float *out = down(be, d_out, n);
    for (int i = 0; i < N; i++) {
        double m = 0, v = 0;
        for (int j = 0; j < C; j++)
            m += out[i * C + j];
        m /= C;
        for (int j = 0; j < C; j++)
            v += (out[i * C + j] - m) * (out[i * C + j] - m);
        v /= C;
        DT_CHECK_NEAR(m, 0.0, 1e-5);
        DT_CHECK_NEAR(v, 1.0, 1e-3);
    }
    be->close(be);
    free(x); free(ones); free(zeros); free(out);
}

/* ------------------------------------------------------------------------------------------ */
/* element-wise */

static void test_gelu(void)
{
    dt_backend *be = be_new();
    const size_t n = 1003; /* not a multiple of any vector width */
    dt_rng r;
    dt_rng_seed(&r, 21);
    float *x = randf(&r, n, -6, 6), *dy = randf(&r, n, -1, 1);
    x[0] = 0.0f; x[1] = -20.0f; x[2] = 20.0f; x[3] = 1e-4f; x[4] = -50.0f;
    float *d_x = up(be, x, n), *d_y = dev_alloc(be, n * 4), *d_dy = up(be, dy, n);
    be->gelu_fwd(be, d_y, d_x, n);
    float *y = down(be, d_y, n);
    double *want = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        want[i] = ref_gelu1(x[i]);
    check_close("gelu_fwd", y, want, n, 1e-5, 1e-6);
    float *g = filled(be, n, PREFILL);
    be->gelu_bwd(be, g, d_x, d_dy, n);
    float *hg = down(be, g, n);
    for (size_t i = 0; i < n; i++) {
        double h = 1e-4, xi = x[i];
        want[i] = PREFILL + dy[i] * (ref_gelu1(xi + h) - ref_gelu1(xi - h)) / (2 * h);
    }
    check_close("gelu_bwd", hg, want, n, 1e-4, 1e-5);
    be->close(be);
    free(x); free(dy); free(y); free(want); free(hg);
}

/* The exact GELU, 0.5 x (1 + erf(x / sqrt 2)), and tanh, against libm's double erf and tanh:
 * relative 1e-5 everywhere, both tails included (the float erfc fit and exp; the error grows to
 * a few 1e-6 in the far negative tail, where -z*z rounds), tanh 1e-6. */
static void test_gelu_erf_tanh(void)
{
    dt_backend *be = be_new();
    const size_t n = 1003;
    dt_rng r;
    dt_rng_seed(&r, 22);
    float *x = randf(&r, n, -8, 8), *dy = randf(&r, n, -1, 1);
    x[0] = 0.0f; x[1] = -20.0f; x[2] = 20.0f; x[3] = 1e-4f; x[4] = -50.0f; x[5] = -1e-6f;
    x[6] = -5.0f; x[7] = 3.5f;
    float *d_x = up(be, x, n), *d_y = dev_alloc(be, n * 4), *d_dy = up(be, dy, n);
    double *want = malloc(n * sizeof(double));
    be->gelu_erf_fwd(be, d_y, d_x, n);
    float *y = down(be, d_y, n);
    for (size_t i = 0; i < n; i++)
        want[i] = 0.5 * x[i] * erfc(-x[i] / sqrt(2.0));
    check_close("gelu_erf_fwd", y, want, n, 1e-5, 1e-30);
    float *g = filled(be, n, PREFILL);
    be->gelu_erf_bwd(be, g, d_x, d_dy, n);
    float *hg = down(be, g, n);
    for (size_t i = 0; i < n; i++) {
        double xi = x[i];
        want[i] = PREFILL + dy[i] * (0.5 * erfc(-xi / sqrt(2.0)) +
                                     xi * exp(-0.5 * xi * xi) / sqrt(2.0 * M_PI));
    }
    check_close("gelu_erf_bwd", hg, want, n, 1e-5, 1e-7);
    free(y);
    free(hg);
    be->tanh_fwd(be, d_y, d_x, n);
    y = down(be, d_y, n);
    for (size_t i = 0; i < n; i++)
        want[i] = tanh((double)x[i]);
    check_close("tanh_fwd", y, want, n, 1e-6, 1e-30);
    g = filled(be, n, PREFILL);
    be->tanh_bwd(be, g, d_y, d_dy, n);
    hg = down(be, g, n);
    for (size_t i = 0; i < n; i++) {
        double t = tanh((double)x[i]);
        want[i] = PREFILL + dy[i] * (1.0 - t * t);
    }
    check_close("tanh_bwd", hg, want, n, 1e-5, 1e-7);
    be->close(be);
    free(x); free(dy); free(y); free(want); free(hg);
}

static void test_relu_residual_scale(void)
{
    dt_backend *be = be_new();
    const size_t n = 517;
    dt_rng r;
    dt_rng_seed(&r, 22);
    float *x = randf(&r, n, -1, 1), *y = randf(&r, n, -1, 1), *dy = randf(&r, n, -1, 1);
    float *d_x = up(be, x, n), *d_y = up(be, y, n), *d_dy = up(be, dy, n);
    float *d_o = dev_alloc(be, n * 4);
    be->relu_fwd(be, d_o, d_x, n);
    float *o = down(be, d_o, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += o[i] != (x[i] > 0 ? x[i] : 0.0f);
    DT_CHECK_INT(bad, 0);
    float *g = filled(be, n, PREFILL);
    be->relu_bwd(be, g, d_o, d_dy, n);
    float *hg = down(be, g, n);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += hg[i] != PREFILL + (x[i] > 0 ? dy[i] : 0.0f);
    DT_CHECK_INT(bad, 0);
    /* in place */
    be->relu_fwd(be, d_x, d_x, n);
    float *xi = down(be, d_x, n);
    DT_CHECK(memcmp(xi, o, n * sizeof(float)) == 0);

    be->memcpy_h2d(be, d_x, x, n * 4);
    be->residual_fwd(be, d_o, d_x, d_y, n);
    free(o);
    o = down(be, d_o, n);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += o[i] != x[i] + y[i];
    DT_CHECK_INT(bad, 0);
    be->accumulate(be, d_o, d_dy, n);
    be->scale(be, d_o, n, -2.0f);
    free(o);
    o = down(be, d_o, n);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += o[i] != -2.0f * ((x[i] + y[i]) + dy[i]);
    DT_CHECK_INT(bad, 0);
    be->close(be);
    free(x); free(y); free(dy); free(o); free(hg); free(xi);
}

static void test_bias(void)
{
    dt_backend *be = be_new();
    const int N = 13, C = 70;
    dt_rng r;
    dt_rng_seed(&r, 23);
    float *x = randf(&r, (size_t)N * C, -1, 1), *b = randf(&r, C, -1, 1);
    float *d_x = up(be, x, (size_t)N * C), *d_b = up(be, b, C);
    be->bias_add(be, d_x, d_b, N, C);
    float *o = down(be, d_x, (size_t)N * C);
    int bad = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++)
            bad += o[i * C + j] != x[i * C + j] + b[j];
    DT_CHECK_INT(bad, 0);
    float *g = filled(be, C, PREFILL);
    be->memcpy_h2d(be, d_x, x, sizeof(float) * N * C);
    be->bias_bwd(be, g, d_x, N, C);
    float *hg = down(be, g, C);
    double *want = malloc(C * sizeof(double));
    for (int j = 0; j < C; j++) {
        want[j] = PREFILL;
        for (int i = 0; i < N; i++)
            want[j] += x[i * C + j];
    }
    check_close("bias_bwd", hg, want, C, 1e-6, 1e-6);
    be->close(be);
    free(x); free(b); free(o); free(hg); free(want);
}

/* ------------------------------------------------------------------------------------------ */
/* embeddings */

static void test_embedding(void)
{
    dt_backend *be = be_new();
    const int B = 3, T = 5, C = 12, V = 7, maxT = 8;
    dt_rng r;
    dt_rng_seed(&r, 31);
    int32_t tok[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)dt_rng_below(&r, V);
    tok[1] = tok[0]; /* repeated tokens must accumulate */
    float *wte = randf(&r, (size_t)V * C, -1, 1), *wpe = randf(&r, (size_t)maxT * C, -1, 1);
    float *dy = randf(&r, (size_t)B * T * C, -1, 1);
    int32_t *d_tok = up_i(be, tok, B * T);
    float *d_wte = up(be, wte, (size_t)V * C), *d_wpe = up(be, wpe, (size_t)maxT * C);
    float *d_dy = up(be, dy, (size_t)B * T * C), *d_o = dev_alloc(be, sizeof(float) * B * T * C);
    be->embedding_fwd(be, d_o, d_tok, d_wte, d_wpe, B, T, C);
    float *o = down(be, d_o, (size_t)B * T * C);
    int bad = 0;
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++)
            bad += o[i * C + c] != wte[tok[i] * C + c] + wpe[(i % T) * C + c];
    DT_CHECK_INT(bad, 0);
    be->embedding_fwd(be, d_o, d_tok, d_wte, NULL, B, T, C); /* no positions */
    free(o);
    o = down(be, d_o, (size_t)B * T * C);
    bad = 0;
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++)
            bad += o[i * C + c] != wte[tok[i] * C + c];
    DT_CHECK_INT(bad, 0);

    float *gte = filled(be, (size_t)V * C, PREFILL), *gpe = filled(be, (size_t)maxT * C, PREFILL);
    be->embedding_bwd(be, gte, gpe, d_dy, d_tok, B, T, C);
    float *hte = down(be, gte, (size_t)V * C), *hpe = down(be, gpe, (size_t)maxT * C);
    double *wte_w = calloc((size_t)V * C, sizeof(double)), *wpe_w = calloc((size_t)maxT * C, 8);
    for (size_t i = 0; i < (size_t)V * C; i++)
        wte_w[i] = PREFILL;
    for (size_t i = 0; i < (size_t)maxT * C; i++)
        wpe_w[i] = PREFILL;
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++) {
            wte_w[tok[i] * C + c] += dy[i * C + c];
            wpe_w[(i % T) * C + c] += dy[i * C + c];
        }
    check_close("embedding_bwd dwte", hte, wte_w, (size_t)V * C, 1e-6, 1e-6);
    check_close("embedding_bwd dwpe", hpe, wpe_w, (size_t)maxT * C, 1e-6, 1e-6);
    be->embedding_bwd(be, gte, NULL, d_dy, d_tok, B, T, C); /* NULL dwpe is skipped */
    be->close(be);
    free(wte); free(wpe); free(dy); free(o); free(hte); free(hpe); free(wte_w); free(wpe_w);
}

/* ------------------------------------------------------------------------------------------ */
/* cross-entropy */

static double ref_xent_row(const double *l, int V, int tgt)
{
    double m = -INFINITY, s = 0;
    for (int j = 0; j < V; j++)
        m = l[j] > m ? l[j] : m;
    for (int j = 0; j < V; j++)
        s += exp(l[j] - m);
    return m + log(s) - l[tgt];
}

typedef struct {
    double *logits;
    const int32_t *tgt;
    int N, V;
    double dloss;
} xe_ctx;

static double xe_loss(void *p)
{
    xe_ctx *c = p;
    double s = 0;
    for (int i = 0; i < c->N; i++)
        if (c->tgt[i] >= 0 && c->tgt[i] < c->V)
            s += c->dloss * ref_xent_row(c->logits + (size_t)i * c->V, c->V, c->tgt[i]);
    return s;
}

static void test_xent(void)
{
    dt_backend *be = be_new();
    const int N = 9, V = 37;
    dt_rng r;
    dt_rng_seed(&r, 41);
    float *l = randf(&r, (size_t)N * V, -4, 4);
    int32_t tgt[N];
    for (int i = 0; i < N; i++)
        tgt[i] = (int32_t)dt_rng_below(&r, V);
    tgt[3] = -1; /* ignored */
    tgt[5] = V;  /* out of range: ignored too, never read past the row */
    const float dloss = 1.0f / 8;
    float *d_l = up(be, l, (size_t)N * V), *d_loss = dev_alloc(be, N * 4);
    float *d_dl = filled(be, (size_t)N * V, 77.0f); /* SET, not accumulated */
    int32_t *d_t = up_i(be, tgt, N);
    int valid = -1;
    be->xent_fwd_bwd(be, d_loss, d_dl, d_l, d_t, N, V, dloss, &valid);
    DT_CHECK_INT(valid, N - 2);
    float *loss = down(be, d_loss, N), *dl = down(be, d_dl, (size_t)N * V);
    xe_ctx c = {tod(l, (size_t)N * V), tgt, N, V, dloss};
    double want[N];
    for (int i = 0; i < N; i++)
        want[i] = tgt[i] < 0 || tgt[i] >= V ? 0.0 : ref_xent_row(c.logits + (size_t)i * V, V, tgt[i]);
    check_close("xent losses", loss, want, N, 1e-5, 1e-5);
    for (size_t i = 0; i < (size_t)N * V; i++)
        dl[i] += PREFILL; /* check_fd subtracts the prefill */
    check_fd("xent dlogits", xe_loss, &c, c.logits, (size_t)N * V, dl, 1e-3, 1e-6, 400);
    int nz = 0;
    for (int j = 0; j < V; j++)
        nz += (dl[3 * V + j] != PREFILL) + (dl[5 * V + j] != PREFILL);
    DT_CHECK_MSG(nz == 0, "ignored target has a non-zero gradient");

    /* dlogits aliasing logits */
    be->xent_fwd_bwd(be, d_loss, d_l, d_l, d_t, N, V, dloss, NULL);
    float *dl2 = down(be, d_l, (size_t)N * V), *loss2 = down(be, d_loss, N);
    for (size_t i = 0; i < (size_t)N * V; i++)
        dl2[i] += PREFILL;
    DT_CHECK(memcmp(dl2, dl, sizeof(float) * N * V) == 0);
    DT_CHECK(memcmp(loss2, loss, sizeof(float) * N) == 0);
    be->close(be);
    free(l); free(loss); free(dl); free(dl2); free(loss2); free(c.logits);
}

/* ------------------------------------------------------------------------------------------ */
/* vocabulary-parallel embedding and cross-entropy (tensor parallelism) */

/* The vocabulary V = 7 padded to 9 over R = 3 slices of 3 rows (the last: row 6 and two padding
 * rows): the slices' partial sums (rank 0 adding wpe) add up to embedding_fwd bit for bit, and
 * the slices' gradients are embedding_bwd's rows of their range. */
static void test_embedding_vp(void)
{
    dt_backend *be = be_new();
    const int B = 3, T = 5, C = 12, V = 7, maxT = 8, R = 3, Vl = 3;
    dt_rng r;
    dt_rng_seed(&r, 32);
    int32_t tok[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)dt_rng_below(&r, V);
    tok[1] = tok[0];
    tok[2] = V - 1; /* the last real row, next to the padding */
    float *wte = randf(&r, (size_t)R * Vl * C, -1, 1), *wpe = randf(&r, (size_t)maxT * C, -1, 1);
    for (size_t i = (size_t)V * C; i < (size_t)R * Vl * C; i++)
        wte[i] = 0.0f; /* padding rows */
    float *dy = randf(&r, (size_t)B * T * C, -1, 1);
    int32_t *d_tok = up_i(be, tok, B * T);
    float *d_wte = up(be, wte, (size_t)V * C), *d_wpe = up(be, wpe, (size_t)maxT * C);
    float *d_dy = up(be, dy, (size_t)B * T * C), *d_o = dev_alloc(be, sizeof(float) * B * T * C);
    be->embedding_fwd(be, d_o, d_tok, d_wte, d_wpe, B, T, C);
    float *want = down(be, d_o, (size_t)B * T * C);
    float *sum = calloc((size_t)B * T * C, sizeof(float));
    float *gte = filled(be, (size_t)V * C, PREFILL), *gpe = filled(be, (size_t)maxT * C, PREFILL);
    be->embedding_bwd(be, gte, gpe, d_dy, d_tok, B, T, C);
    float *hte = down(be, gte, (size_t)V * C), *hpe = down(be, gpe, (size_t)maxT * C);
    for (int k = 0; k < R; k++) {
        float *d_slice = up(be, wte + (size_t)k * Vl * C, (size_t)Vl * C);
        be->embedding_vp_fwd(be, d_o, d_tok, d_slice, k == 0 ? d_wpe : NULL, B, T, C, k * Vl, Vl);
        float *o = down(be, d_o, (size_t)B * T * C);
        int outside = 0;
        for (int i = 0; i < B * T; i++)
            for (int c = 0; c < C; c++) {
                sum[i * C + c] += o[i * C + c];
                bool mine = tok[i] >= k * Vl && tok[i] < (k + 1) * Vl;
                outside += k > 0 && !mine && o[i * C + c] != 0.0f; /* zero for other tokens */
            }
        DT_CHECK_MSG(outside == 0, "slice %d: %d non-zero values for tokens outside it", k,
                     outside);
        float *gs = filled(be, (size_t)Vl * C, PREFILL), *gp = filled(be, (size_t)maxT * C, PREFILL);
        be->embedding_vp_bwd(be, gs, gp, d_dy, d_tok, B, T, C, k * Vl, Vl);
        be->embedding_vp_bwd(be, NULL, NULL, d_dy, d_tok, B, T, C, k * Vl, Vl); /* skipped */
        float *hs = down(be, gs, (size_t)Vl * C), *hp = down(be, gp, (size_t)maxT * C);
        int bad = 0;
        for (int row = 0; row < Vl; row++)
            for (int c = 0; c < C; c++) {
                int v = k * Vl + row;
                float w = v < V ? hte[v * C + c] : PREFILL; /* padding rows get nothing */
                bad += hs[row * C + c] != w;
            }
        DT_CHECK_MSG(bad == 0, "slice %d: %d dwte values differ from embedding_bwd's", k, bad);
        DT_CHECK(memcmp(hp, hpe, sizeof(float) * maxT * C) == 0);
        be->free(be, d_slice);
        be->free(be, gs);
        be->free(be, gp);
        free(o); free(hs); free(hp);
    }
    DT_CHECK_MSG(memcmp(sum, want, sizeof(float) * B * T * C) == 0,
                 "the slices' sum differs from embedding_fwd");
    be->close(be);
    free(wte); free(wpe); free(dy); free(want); free(sum); free(hte); free(hpe);
}

/* xent_vp_* over R slices of Vl columns of logits (N,V), the all-reduces done here on the host,
 * against xent_fwd_bwd on the whole logits. Padding columns hold garbage that must be ignored. */
static void xent_vp_case(int N, int V, int R, uint64_t seed)
{
    dt_backend *be = be_new();
    const int Vl = (V + R - 1) / R;
    dt_rng r;
    dt_rng_seed(&r, seed);
    float *l = randf(&r, (size_t)N * V, -4, 4);
    int32_t tgt[64];
    DT_REQUIRE(N <= 64);
    for (int i = 0; i < N; i++)
        tgt[i] = (int32_t)dt_rng_below(&r, V);
    tgt[1] = -1; /* ignored */
    tgt[2] = V - 1;
    const float dloss = 1.0f / 8;
    float *d_l = up(be, l, (size_t)N * V), *d_loss = dev_alloc(be, N * 4);
    float *d_dl = dev_alloc(be, (size_t)N * V * 4);
    int32_t *d_t = up_i(be, tgt, N);
    be->xent_fwd_bwd(be, d_loss, d_dl, d_l, d_t, N, V, dloss, NULL);
    float *want_loss = down(be, d_loss, N), *want_dl = down(be, d_dl, (size_t)N * V);

    float *slice = malloc(sizeof(float) * N * Vl), *mx = malloc(sizeof(float) * N);
    float *sums = calloc((size_t)2 * N, sizeof(float)), *part = malloc(sizeof(float) * 2 * N);
    float *d_s[16], *d_mx = dev_alloc(be, N * 4), *d_sums = dev_alloc(be, 2 * N * 4);
    DT_REQUIRE(R <= 16);
    for (int i = 0; i < N; i++)
        mx[i] = -INFINITY;
    for (int k = 0; k < R; k++) { /* slices, with garbage in the padding */
        int nv = DT_MAX(0, DT_MIN(Vl, V - k * Vl));
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vl; j++)
                slice[i * Vl + j] = j < nv ? l[i * V + k * Vl + j] : 1e4f;
        d_s[k] = up(be, slice, (size_t)N * Vl);
        be->xent_vp_max(be, d_mx, d_s[k], N, Vl, nv);
        float *m = down(be, d_mx, N);
        for (int i = 0; i < N; i++) { /* all-reduce max */
            if (nv == 0)
                DT_CHECK(m[i] == -INFINITY);
            mx[i] = m[i] > mx[i] ? m[i] : mx[i];
        }
        free(m);
    }
    be->memcpy_h2d(be, d_mx, mx, N * 4);
    for (int k = 0; k < R; k++) {
        int nv = DT_MAX(0, DT_MIN(Vl, V - k * Vl));
        be->xent_vp_sums(be, d_sums, d_s[k], d_mx, d_t, N, Vl, nv, k * Vl);
        be->memcpy_d2h(be, part, d_sums, 2 * N * 4);
        for (int i = 0; i < 2 * N; i++) /* all-reduce sum */
            sums[i] += part[i];
    }
    be->memcpy_h2d(be, d_sums, sums, 2 * N * 4);
    for (int k = 0; k < R; k++) {
        int nv = DT_MAX(0, DT_MIN(Vl, V - k * Vl));
        float *d_g = filled(be, (size_t)N * Vl, 77.0f); /* SET, not accumulated */
        be->xent_vp_finish(be, d_loss, d_g, d_s[k], d_mx, d_sums, d_t, N, Vl, nv, k * Vl, dloss);
        float *loss = down(be, d_loss, N), *g = down(be, d_g, (size_t)N * Vl);
        for (int i = 0; i < N; i++)
            DT_CHECK_MSG(fabsf(loss[i] - want_loss[i]) <= 1e-5f * (1.0f + fabsf(want_loss[i])),
                         "V %d R %d slice %d row %d: loss %.8g, xent_fwd_bwd %.8g", V, R, k, i,
                         loss[i], want_loss[i]);
        int bad = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vl; j++) {
                float w = j < nv && tgt[i] >= 0 ? want_dl[i * V + k * Vl + j] : 0.0f;
                bad += !(fabsf(g[i * Vl + j] - w) <= 1e-6f);
            }
        DT_CHECK_MSG(bad == 0, "V %d R %d slice %d: %d dlogits off", V, R, k, bad);
        /* in place (dlogits = logits), and without a gradient: the same losses */
        be->xent_vp_finish(be, d_loss, d_s[k], d_s[k], d_mx, d_sums, d_t, N, Vl, nv, k * Vl,
                           dloss);
        float *g2 = down(be, d_s[k], (size_t)N * Vl);
        DT_CHECK(memcmp(g2, g, sizeof(float) * N * Vl) == 0);
        be->xent_vp_finish(be, d_loss, NULL, d_s[k], d_mx, d_sums, d_t, N, Vl, nv, k * Vl, dloss);
        float *loss2 = down(be, d_loss, N);
        DT_CHECK(memcmp(loss2, loss, sizeof(float) * N) == 0);
        DT_CHECK(loss[1] == 0.0f);
        be->free(be, d_g);
        free(loss); free(g); free(g2); free(loss2);
    }
    be->close(be);
    free(l); free(want_loss); free(want_dl); free(slice); free(mx); free(sums); free(part);
}

static void test_xent_vp(void)
{
    xent_vp_case(9, 37, 4, 51);   /* 37 -> 40: the last slice has 7 real columns */
    xent_vp_case(6, 37, 1, 52);   /* one slice: the whole vocabulary */
    xent_vp_case(5, 5, 4, 53);    /* 5 -> 8: slice 2 has 1 real column, slice 3 none */
    xent_vp_case(7, 130, 2, 54);  /* even split, rows longer than 8-wide partial sums */
}

/* Cross-entropy of uniform logits is ln V whatever the target. */
static void test_xent_uniform(void)
{
    dt_backend *be = be_new();
    const int N = 4, V = 50257;
    float *l = malloc(sizeof(float) * N * V);
    for (size_t i = 0; i < (size_t)N * V; i++)
        l[i] = 3.25f;
    int32_t tgt[4] = {0, 17, V - 1, 12345};
    float *d_l = up(be, l, (size_t)N * V), *d_loss = dev_alloc(be, N * 4);
    int32_t *d_t = up_i(be, tgt, N);
    be->xent_fwd_bwd(be, d_loss, NULL, d_l, d_t, N, V, 1.0f, NULL);
    float *loss = down(be, d_loss, N);
    for (int i = 0; i < N; i++)
        DT_CHECK_NEAR(loss[i], log((double)V), 1e-5);
    be->close(be);
    free(l); free(loss);
}

/* ------------------------------------------------------------------------------------------ */
/* BatchNorm */

typedef struct {
    double *x, *w, *b, *R, *out;
    int N, C, HW;
} bn_ctx;

static double bn_loss(void *p)
{
    bn_ctx *c = p;
    ref_bn(c->out, c->x, c->w, c->b, c->N, c->C, c->HW, 1e-5);
    return dot_d(c->out, c->R, (size_t)c->N * c->C * c->HW);
}

static void test_batchnorm(void)
{
    dt_backend *be = be_new();
    const int N = 4, C = 3, HW = 10;
    const size_t n = (size_t)N * C * HW;
    dt_rng r;
    dt_rng_seed(&r, 51);
    float *x = randf(&r, n, -1, 3), *w = randf(&r, C, 0.5f, 1.5f), *b = randf(&r, C, -1, 1);
    float *Rr = randf(&r, n, -1, 1);
    float rm0[3] = {0.1f, -0.2f, 0.3f}, rv0[3] = {1.0f, 2.0f, 0.5f};
    float *d_x = up(be, x, n), *d_w = up(be, w, C), *d_b = up(be, b, C), *d_R = up(be, Rr, n);
    float *d_rm = up(be, rm0, C), *d_rv = up(be, rv0, C);
    float *d_sum = dev_alloc(be, C * 4), *d_sq = dev_alloc(be, C * 4), *d_mean = dev_alloc(be, C * 4);
    float *d_rstd = dev_alloc(be, C * 4), *d_out = dev_alloc(be, n * 4);
    const double count = (double)N * HW;
    be->bn_stats(be, d_sum, d_sq, d_x, N, C, HW);
    be->bn_fwd_apply(be, d_out, d_mean, d_rstd, d_rm, d_rv, d_x, d_w, d_b, d_sum, d_sq, count, N,
                     C, HW, 0.1f, 1e-5f);
    bn_ctx c = {tod(x, n), tod(w, C), tod(b, C), tod(Rr, n), malloc(n * sizeof(double)), N, C, HW};
    bn_loss(&c);
    float *out = down(be, d_out, n);
    check_close("bn_fwd_apply", out, c.out, n, 1e-4, 1e-4);

    /* running statistics: momentum 0.1, unbiased variance */
    float *rm = down(be, d_rm, C), *rv = down(be, d_rv, C);
    for (int ch = 0; ch < C; ch++) {
        double m = 0, v = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++)
                m += x[((size_t)i * C + ch) * HW + j];
        m /= count;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++) {
                double d = x[((size_t)i * C + ch) * HW + j] - m;
                v += d * d;
            }
        v /= count - 1;
        DT_CHECK_NEAR(rm[ch], 0.9 * rm0[ch] + 0.1 * m, 1e-5);
        DT_CHECK_NEAR(rv[ch], 0.9 * rv0[ch] + 0.1 * v, 1e-5);
    }

    /* backward: reduce then apply */
    float *gx = filled(be, n, PREFILL), *gw = filled(be, C, PREFILL), *gb = filled(be, C, PREFILL);
    float *d_sdy = dev_alloc(be, C * 4), *d_sdyx = dev_alloc(be, C * 4);
    be->bn_bwd_reduce(be, gw, gb, d_sdy, d_sdyx, d_R, d_x, d_mean, d_rstd, N, C, HW);
    be->bn_bwd_apply(be, gx, d_R, d_x, d_w, d_mean, d_rstd, d_sdy, d_sdyx, count, N, C, HW);
    float *hx = down(be, gx, n), *hw = down(be, gw, C), *hb = down(be, gb, C);
    check_fd("bn_bwd dinp", bn_loss, &c, c.x, n, hx, 1e-3, 1e-4, 400);
    check_fd("bn_bwd dw", bn_loss, &c, c.w, C, hw, 1e-3, 1e-4, 400);
    check_fd("bn_bwd db", bn_loss, &c, c.b, C, hb, 1e-3, 1e-4, 400);

    /* eval: from the running statistics */
    be->bn_fwd_eval(be, d_out, d_x, d_rm, d_rv, d_w, d_b, N, C, HW, 1e-5f);
    float *ev = down(be, d_out, n);
    double *evw = malloc(n * sizeof(double));
    for (int i = 0; i < N; i++)
        for (int ch = 0; ch < C; ch++)
            for (int j = 0; j < HW; j++) {
                size_t k = ((size_t)i * C + ch) * HW + j;
                evw[k] = w[ch] * (x[k] - rm[ch]) / sqrt((double)rv[ch] + 1e-5) + b[ch];
            }
    check_close("bn_fwd_eval", ev, evw, n, 1e-5, 1e-5);
    be->close(be);
    free(x); free(w); free(b); free(Rr); free(out); free(rm); free(rv); free(hx); free(hw);
    free(hb); free(ev); free(evw); free(c.x); free(c.w); free(c.b); free(c.R); free(c.out);
}

/* BatchNorm statistics when |mean| >> std (an audit: the sums of squares rounded to float and
 * var = E[x^2] - mean^2 gave variance 0.967 at mean 1e3 and 0.739 at 3e3 instead of 1).
 * 16384 values per channel of mean + N(0,1): the normalised output has variance 1 within 1e-3,
 * and running_var (momentum 1: the unbiased batch variance) matches the double reference. */
static void test_batchnorm_offset(void)
{
    dt_backend *be = be_new();
    const int N = 16, C = 4, HW = 1024;
    const double offs[4] = {0.0, 100.0, 1000.0, 3000.0};
    const size_t n = (size_t)N * C * HW;
    dt_rng r;
    dt_rng_seed(&r, 53);
    float *x = malloc(n * sizeof(float));
    for (int i = 0; i < N; i++)
        for (int ch = 0; ch < C; ch++)
            dt_rng_fill_normal(&r, x + ((size_t)i * C + ch) * HW, HW, (float)offs[ch], 1.0f);
    float zero[4] = {0}, one[4] = {1, 1, 1, 1};
    float *d_x = up(be, x, n), *d_rm = up(be, zero, C), *d_rv = up(be, one, C);
    float *d_st = dev_alloc(be, 4 * C * 4), *d_out = dev_alloc(be, n * 4);
    float *d_sum = d_st, *d_sq = d_st + C, *d_mean = d_st + 2 * C, *d_rstd = d_st + 3 * C;
    const double count = (double)N * HW;
    be->bn_stats(be, d_sum, d_sq, d_x, N, C, HW);
    be->bn_fwd_apply(be, d_out, d_mean, d_rstd, d_rm, d_rv, d_x, NULL, NULL, d_sum, d_sq, count,
                     N, C, HW, 1.0f, 1e-5f);
    float *out = down(be, d_out, n), *rm = down(be, d_rm, C), *rv = down(be, d_rv, C);
    for (int ch = 0; ch < C; ch++) {
        double m = 0, v = 0, om = 0, ov = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++)
                m += x[((size_t)i * C + ch) * HW + j];
        m /= count;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++) {
                double d = x[((size_t)i * C + ch) * HW + j] - m;
                v += d * d;
                om += out[((size_t)i * C + ch) * HW + j];
            }
        om /= count;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++) {
                double d = out[((size_t)i * C + ch) * HW + j] - om;
                ov += d * d;
            }
        ov /= count;
        DT_CHECK_NEAR(om, 0.0, 1e-3);
        DT_CHECK_NEAR(ov, 1.0, 1e-3);
        DT_CHECK_NEAR(rm[ch], m, 1e-6 * fabs(m) + 1e-6);
        DT_CHECK_NEAR(rv[ch], v / (count - 1), 1e-3);
    }
    be->close(be);
    free(x); free(out); free(rm); free(rv);
}

/* SyncBatchNorm's arithmetic: two "ranks" with unequal parts of the batch, their statistics
 * merged by dt_bn_stats_combine (after the all-gather) and the backward sums added (the
 * all-reduce), give the full-batch forward and backward. offset shifts every input (|mean| >>
 * std: the merge must keep the variance). */
static void batchnorm_split(float offset)
{
    dt_backend *be = be_new();
    const int N = 6, C = 4, HW = 9, H = 2, H2 = N - H;
    const size_t n = (size_t)N * C * HW, nh = (size_t)H * C * HW;
    dt_rng r;
    dt_rng_seed(&r, 52);
    float *x = randf(&r, n, -2, 2), *w = randf(&r, C, 0.5f, 1.5f), *b = randf(&r, C, -1, 1);
    float *dy = randf(&r, n, -1, 1);
    for (size_t i = 0; i < n; i++)
        x[i] += offset;
    float *d_x = up(be, x, n), *d_w = up(be, w, C), *d_b = up(be, b, C), *d_dy = up(be, dy, n);
    float *s_full = dev_alloc(be, 8 * C * 4); /* sum sq mean rstd sdy sdyx, scratch */
    float *sum = s_full, *sq = s_full + C, *mean = s_full + 2 * C, *rstd = s_full + 3 * C;
    float *sdy = s_full + 4 * C, *sdyx = s_full + 5 * C;
    float *out_full = dev_alloc(be, n * 4), *gx_full = filled(be, n, 0);
    float *gw_full = filled(be, C, 0), *gb_full = filled(be, C, 0);
    be->bn_stats(be, sum, sq, d_x, N, C, HW);
    be->bn_fwd_apply(be, out_full, mean, rstd, NULL, NULL, d_x, d_w, d_b, sum, sq, (double)N * HW,
                     N, C, HW, 0.1f, 1e-5f);
    be->bn_bwd_reduce(be, gw_full, gb_full, sdy, sdyx, d_dy, d_x, mean, rstd, N, C, HW);
    be->bn_bwd_apply(be, gx_full, d_dy, d_x, d_w, mean, rstd, sdy, sdyx, (double)N * HW, N, C, HW);

    /* two halves */
    float *st = dev_alloc(be, 12 * C * 4);
    float *sA = st, *qA = st + C, *sB = st + 2 * C, *qB = st + 3 * C;
    float *m2 = st + 4 * C, *r2 = st + 5 * C, *dA = st + 6 * C, *xA = st + 7 * C;
    float *dB = st + 8 * C, *xB = st + 9 * C;
    float *out2 = dev_alloc(be, n * 4), *gx2 = filled(be, n, 0);
    float *gw2 = filled(be, C, 0), *gb2 = filled(be, C, 0);
    be->bn_stats(be, sA, qA, d_x, H, C, HW);
    be->bn_stats(be, sB, qB, d_x + nh, H2, C, HW);
    /* the all-gather: part r = sum | sumsq | count */
    float *parts = malloc(2 * (2 * C + 1) * sizeof(float)), merged[8];
    be->memcpy_d2h(be, parts, sA, 2 * C * sizeof(float));
    be->memcpy_d2h(be, parts + 2 * C + 1, sB, 2 * C * sizeof(float));
    parts[2 * C] = (float)(H * HW);
    parts[4 * C + 1] = (float)(H2 * HW);
    DT_CHECK_NEAR(dt_bn_stats_combine(parts, 2, C, merged, merged + C), (double)N * HW, 0);
    be->memcpy_h2d(be, sA, merged, 2 * C * sizeof(float));
    be->bn_fwd_apply(be, out2, m2, r2, NULL, NULL, d_x, d_w, d_b, sA, qA, (double)N * HW, H, C, HW,
                     0.1f, 1e-5f);
    be->bn_fwd_apply(be, out2 + nh, m2, r2, NULL, NULL, d_x + nh, d_w, d_b, sA, qA,
                     (double)N * HW, H2, C, HW, 0.1f, 1e-5f);
    be->bn_bwd_reduce(be, gw2, gb2, dA, xA, d_dy, d_x, m2, r2, H, C, HW);
    be->bn_bwd_reduce(be, gw2, gb2, dB, xB, d_dy + nh, d_x + nh, m2, r2, H2, C, HW);
    be->accumulate(be, dA, dB, C);
    be->accumulate(be, xA, xB, C);
    be->bn_bwd_apply(be, gx2, d_dy, d_x, d_w, m2, r2, dA, xA, (double)N * HW, H, C, HW);
    be->bn_bwd_apply(be, gx2 + nh, d_dy + nh, d_x + nh, d_w, m2, r2, dA, xA, (double)N * HW, H2,
                     C, HW);
    /* the statistics themselves: mean and rstd of the merge equal the full batch's */
    float *mf = down(be, mean, 2 * C), *ms = down(be, m2, 2 * C); /* mean | rstd */
    for (int c = 0; c < 2 * C; c++)
        DT_CHECK_NEAR(ms[c], mf[c], 2e-6 * fabs(mf[c]) + 1e-6);
    free(mf); free(ms); free(parts);
    float *o1 = down(be, out_full, n), *o2 = down(be, out2, n);
    float *g1 = down(be, gx_full, n), *g2 = down(be, gx2, n);
    double *o1d = tod(o1, n), *g1d = tod(g1, n);
    /* the inputs themselves are only known to ulp(offset) ~ offset * 6e-8 */
    const double ax = 1e-6 + 4e-7 * offset;
    check_close("split bn forward", o2, o1d, n, 1e-5, ax);
    check_close("split bn dinp", g2, g1d, n, 1e-4, ax);
    float *w1 = down(be, gw_full, C), *w2 = down(be, gw2, C);
    double *w1d = tod(w1, C);
    check_close("split bn dw", w2, w1d, C, 1e-5, ax);
    be->close(be);
    free(x); free(w); free(b); free(dy); free(o1); free(o2); free(g1); free(g2); free(o1d);
    free(g1d); free(w1); free(w2); free(w1d);
}

static void test_batchnorm_split(void) { batchnorm_split(0.0f); }
static void test_batchnorm_split_offset(void) { batchnorm_split(1000.0f); }

/* ------------------------------------------------------------------------------------------ */
/* pooling */

typedef struct {
    double *x, *R;
    int N, C, H, W, k, stride, pad;
} mp_ctx;

static double mp_loss(void *ctx)
{
    mp_ctx *c = ctx;
    int P = (c->H + 2 * c->pad - c->k) / c->stride + 1, Q = (c->W + 2 * c->pad - c->k) / c->stride + 1;
    double s = 0;
    for (int nc = 0; nc < c->N * c->C; nc++)
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++) {
                double m = -INFINITY;
                for (int i = 0; i < c->k; i++)
                    for (int j = 0; j < c->k; j++) {
                        int ih = p * c->stride - c->pad + i, iw = q * c->stride - c->pad + j;
                        if (ih >= 0 && ih < c->H && iw >= 0 && iw < c->W) {
                            double v = c->x[((size_t)nc * c->H + ih) * c->W + iw];
                            m = v > m ? v : m;
                        }
                    }
                s += m * c->R[((size_t)nc * P + p) * Q + q];
            }
    return s;
}

static void test_pooling(void)
{
    dt_backend *be = be_new();
    const int N = 2, C = 3, H = 7, W = 6, k = 3, stride = 2, pad = 1;
    const int P = (H + 2 * pad - k) / stride + 1, Q = (W + 2 * pad - k) / stride + 1;
    size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * P * Q;
    dt_rng r;
    dt_rng_seed(&r, 61);
    /* distinct values spaced well apart so finite differences never cross a tie */
    uint64_t *perm = malloc(ni * sizeof(uint64_t));
    dt_rng_permutation(&r, perm, ni);
    float *x = malloc(ni * sizeof(float));
    for (size_t i = 0; i < ni; i++)
        x[i] = 0.05f * (float)perm[i] - 3.0f;
    float *Rr = randf(&r, no, -1, 1);
    float *d_x = up(be, x, ni), *d_R = up(be, Rr, no), *d_o = dev_alloc(be, no * 4);
    int32_t *d_idx = dev_alloc(be, no * 4);
    be->maxpool_fwd(be, d_o, d_idx, d_x, N, C, H, W, k, stride, pad);
    float *g = filled(be, ni, PREFILL);
    be->maxpool_bwd(be, g, d_R, d_idx, N, C, H, W, P, Q);
    float *hg = down(be, g, ni);
    mp_ctx c = {tod(x, ni), tod(Rr, no), N, C, H, W, k, stride, pad};
    check_fd("maxpool_bwd", mp_loss, &c, c.x, ni, hg, 1e-4, 1e-5, 1000);
    float *o = down(be, d_o, no);
    double s = 0;
    for (size_t i = 0; i < no; i++)
        s += (double)o[i] * Rr[i];
    DT_CHECK_NEAR(s, mp_loss(&c), 1e-3);

    /* global average pooling */
    const int HW = 11;
    size_t na = (size_t)N * C * HW;
    float *a = randf(&r, na, -1, 1), *dy = randf(&r, (size_t)N * C, -1, 1);
    float *d_a = up(be, a, na), *d_dy = up(be, dy, (size_t)N * C), *d_ao = dev_alloc(be, N * C * 4);
    be->avgpool_fwd(be, d_ao, d_a, N, C, HW);
    float *ao = down(be, d_ao, (size_t)N * C);
    double want[N * C];
    for (int i = 0; i < N * C; i++) {
        want[i] = 0;
        for (int j = 0; j < HW; j++)
            want[i] += a[i * HW + j];
        want[i] /= HW;
    }
    check_close("avgpool_fwd", ao, want, (size_t)N * C, 1e-6, 1e-6);
    float *ga = filled(be, na, PREFILL);
    be->avgpool_bwd(be, ga, d_dy, N, C, HW);
    float *hga = down(be, ga, na);
    double *gw = malloc(na * sizeof(double));
    for (size_t i = 0; i < na; i++)
        gw[i] = PREFILL + dy[i / HW] / HW;
    check_close("avgpool_bwd", hga, gw, na, 1e-6, 1e-6);
    be->close(be);
    free(perm); free(x); free(Rr); free(hg); free(o); free(a); free(dy); free(ao); free(hga);
    free(gw); free(c.x); free(c.R);
}

/* ------------------------------------------------------------------------------------------ */
/* optimisers */

/* Literal numbers worked out by hand from torch.optim.SGD's rules. */
static void test_sgd_by_hand(void)
{
    dt_backend *be = be_new();
    float p0[3] = {1.0f, 1.0f, 1.0f}, g0[3] = {0.5f, 0.5f, 0.5f};
    float *p = up(be, p0, 3), *g = up(be, g0, 3), *buf = dev_alloc(be, 12);
    /* momentum 0.9, lr 0.1: step 1 buf = g = 0.5, p = 1 - 0.05 = 0.95;
     * step 2 buf = 0.9*0.5 + 0.5 = 0.95, p = 0.95 - 0.095 = 0.855 */
    be->sgd_update(be, p, g, buf, 3, 0.1f, 0.9f, false, 0.0f, true);
    float h[3];
    be->memcpy_d2h(be, h, p, 12);
    DT_CHECK_NEAR(h[0], 0.95, 1e-7);
    be->sgd_update(be, p, g, buf, 3, 0.1f, 0.9f, false, 0.0f, false);
    be->memcpy_d2h(be, h, p, 12);
    DT_CHECK_NEAR(h[1], 0.855, 1e-7);
    /* Nesterov: step 1 buf = 0.5, d = 0.5 + 0.9*0.5 = 0.95, p = 1 - 0.095 = 0.905 */
    be->memcpy_h2d(be, p, p0, 12);
    be->sgd_update(be, p, g, buf, 3, 0.1f, 0.9f, true, 0.0f, true);
    be->memcpy_d2h(be, h, p, 12);
    DT_CHECK_NEAR(h[2], 0.905, 1e-7);
    /* weight decay 0.1, no momentum: d = 0.5 + 0.1*1 = 0.6, p = 1 - 0.06 = 0.94 */
    be->memcpy_h2d(be, p, p0, 12);
    be->sgd_update(be, p, g, NULL, 3, 0.1f, 0.0f, false, 0.1f, true);
    be->memcpy_d2h(be, h, p, 12);
    DT_CHECK_NEAR(h[0], 0.94, 1e-7);
    be->close(be);
}

/* Several steps against the rules of torch.optim.SGD, in double. */
static void test_sgd_steps(void)
{
    dt_backend *be = be_new();
    const size_t n = 101;
    dt_rng r;
    dt_rng_seed(&r, 71);
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        float *p0 = randf(&r, n, -1, 1);
        double *P = tod(p0, n), *Bf = calloc(n, sizeof(double));
        float *p = up(be, p0, n), *buf = dev_alloc(be, n * 4);
        const double lr = 0.05, mom = 0.9, wd = 0.01;
        for (int step = 0; step < 5; step++) {
            float *g0 = randf(&r, n, -1, 1);
            float *g = up(be, g0, n);
            be->sgd_update(be, p, g, buf, n, (float)lr, (float)mom, nesterov, (float)wd, step == 0);
            for (size_t i = 0; i < n; i++) {
                double d = g0[i] + wd * P[i];
                Bf[i] = step == 0 ? d : mom * Bf[i] + d;
                d = nesterov ? d + mom * Bf[i] : Bf[i];
                P[i] -= lr * d;
            }
            be->free(be, g);
            free(g0);
        }
        float *hp = down(be, p, n);
        check_close(nesterov ? "sgd nesterov" : "sgd momentum", hp, P, n, 1e-5, 1e-6);
        free(p0); free(P); free(Bf); free(hp);
    }
    be->close(be);
}

static void test_adamw(void)
{
    dt_backend *be = be_new();
    /* By hand, step 1: m = 0.1 g, v = 0.001 g^2, mhat = g, vhat = g^2, so
     * p = p*(1 - lr*wd) - lr * g/(|g| + eps) = 2*(1 - 0.01*0.1) - 0.01 * 0.5/(0.5 + 1e-8) */
    float p0 = 2.0f, g0 = 0.5f;
    float *p = up(be, &p0, 1), *g = up(be, &g0, 1), *m = dev_alloc(be, 4), *v = dev_alloc(be, 4);
    be->adamw_update(be, p, g, m, v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 1);
    float h;
    be->memcpy_d2h(be, &h, p, 4);
    DT_CHECK_NEAR(h, 2.0 * (1 - 0.001) - 0.01 * 0.5 / (0.5 + 1e-8), 2e-7);

    /* Several steps against torch.optim.AdamW's rules, in double. */
    const size_t n = 257;
    dt_rng r;
    dt_rng_seed(&r, 72);
    float *pp0 = randf(&r, n, -1, 1);
    double *P = tod(pp0, n), *M = calloc(n, 8), *Vv = calloc(n, 8);
    float *pp = up(be, pp0, n), *mm = dev_alloc(be, n * 4), *vv = dev_alloc(be, n * 4);
    const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int t = 1; t <= 6; t++) {
        float *g0h = randf(&r, n, -1, 1);
        float *gd = up(be, g0h, n);
        be->adamw_update(be, pp, gd, mm, vv, n, (float)lr, (float)b1, (float)b2, (float)eps,
                         (float)wd, t);
        for (size_t i = 0; i < n; i++) {
            P[i] *= 1 - lr * wd;
            M[i] = b1 * M[i] + (1 - b1) * g0h[i];
            Vv[i] = b2 * Vv[i] + (1 - b2) * (double)g0h[i] * g0h[i];
            double mh = M[i] / (1 - pow(b1, t)), vh = Vv[i] / (1 - pow(b2, t));
            P[i] -= lr * mh / (sqrt(vh) + eps);
        }
        be->free(be, gd);
        free(g0h);
    }
    float *hp = down(be, pp, n), *hm = down(be, mm, n), *hv = down(be, vv, n);
    check_close("adamw params", hp, P, n, 1e-5, 1e-6);
    check_close("adamw m", hm, M, n, 1e-5, 1e-7);
    check_close("adamw v", hv, Vv, n, 1e-5, 1e-8);
    be->close(be);
    free(pp0); free(P); free(M); free(Vv); free(hp); free(hm); free(hv);
}

static void test_sumsq_nonfinite(void)
{
    dt_backend *be = be_new();
    const size_t n = 10007;
    float *x = malloc(n * sizeof(float));
    double want = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)((int)(i % 17) - 8) * 0.125f;
        want += (double)x[i] * x[i];
    }
    float *d = up(be, x, n);
    DT_CHECK_NEAR(be->sumsq(be, d, n), want, 1e-9 * want);
    DT_CHECK_INT(be->count_nonfinite(be, d, n), 0);
    x[5] = NAN;
    x[77] = INFINITY;
    x[n - 1] = -INFINITY;
    be->memcpy_h2d(be, d, x, n * sizeof(float));
    DT_CHECK_INT(be->count_nonfinite(be, d, n), 3);
    be->close(be);
    free(x);
}

/* to_half / from_half: the roundings a 16-bit DDP payload gets, against values whose 16-bit
 * forms are known, and a round trip (x * 1/4 -> bf16 -> * 4) within bfloat16's precision. */
static void test_half_payloads(void)
{
    dt_backend *be = be_new();
    /* ties to even: 1 + 2^-8 and 1 + 3*2^-8 for bfloat16 (7 mantissa bits), 1 + 2^-11 and
     * 1 + 3*2^-11 for float16 (10); 70000 overflows float16; 2^-24 is float16's smallest
     * subnormal; 65504 is float16's largest finite value and rounds up to 2^16 in bfloat16.
     * (Expected bits from Python's struct 'e' and a plain RNE truncation.) */
    const float x[] = {1.0f, -2.5f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 70000.0f, -0.0f,
                       INFINITY, NAN, 0x1p-24f, 65504.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f};
    const uint16_t want_bf16[] = {0x3f80, 0xc020, 0x3f80, 0x3f82, 0x4789, 0x8000,
                                  0x7f80, 0,      0x3380, 0x4780, 0x3f80, 0x3f80};
    const uint16_t want_f16[] = {0x3c00, 0xc100, 0x3c04, 0x3c0c, 0x7c00, 0x8000,
                                 0x7c00, 0,      0x0001, 0x7bff, 0x3c00, 0x3c02};
    const size_t n = sizeof x / sizeof x[0];
    float *d = up(be, x, n);
    uint16_t *h = NULL, got[16];
    dt_err err = {0};
    DT_REQUIRE_OK(be->alloc(be, (void **)&h, n * sizeof *h, &err), &err);
    for (int bf = 0; bf < 2; bf++) {
        const uint16_t *want = bf ? want_bf16 : want_f16;
        be->to_half(be, h, d, n, 1.0f, bf);
        be->memcpy_d2h(be, got, h, n * sizeof *h);
        for (size_t i = 0; i < n; i++) {
            if (isnan(x[i]))
                DT_CHECK_MSG((got[i] & 0x7fff) > (bf ? 0x7f80 : 0x7c00), "%s NaN -> %#x",
                             bf ? "bf16" : "fp16", got[i]);
            else
                DT_CHECK_MSG(got[i] == want[i], "%s(%a) = %#x, want %#x", bf ? "bf16" : "fp16",
                             (double)x[i], got[i], want[i]);
        }
        float back[16];
        float *db = NULL;
        DT_REQUIRE_OK(be->alloc(be, (void **)&db, n * sizeof *db, &err), &err);
        be->from_half(be, db, h, n, 2.0f, bf);
        be->memcpy_d2h(be, back, db, n * sizeof *db);
        DT_CHECK(back[0] == 2.0f && back[1] == -5.0f && back[5] == 0 && signbit(back[5]));
        DT_CHECK(isinf(back[6]) && isnan(back[7]));
        DT_CHECK(bf ? back[4] == 2 * 70144.0f : isinf(back[4])); /* 0x4789 = 70144 */
        be->free(be, db);
    }
    /* scale on the way in: DDP's 1/world */
    const size_t m = 4097;
    float *y = malloc(m * sizeof *y), *r = malloc(m * sizeof *r);
    for (size_t i = 0; i < m; i++)
        y[i] = (float)sin((double)i) * 3.0f;
    float *dy = up(be, y, m), *dr = NULL;
    uint16_t *hy = NULL;
    DT_REQUIRE_OK(be->alloc(be, (void **)&hy, m * sizeof *hy, &err), &err);
    DT_REQUIRE_OK(be->alloc(be, (void **)&dr, m * sizeof *dr, &err), &err);
    be->to_half(be, hy, dy, m, 0.25f, true);
    be->from_half(be, dr, hy, m, 4.0f, true);
    be->memcpy_d2h(be, r, dr, m * sizeof *r);
    for (size_t i = 0; i < m; i++)
        DT_CHECK_MSG(fabsf(r[i] - y[i]) <= fabsf(y[i]) * 0x1p-8f, "round trip %zu: %g -> %g", i,
                     (double)y[i], (double)r[i]);
    be->close(be);
    free(y);
    free(r);
}

/* ------------------------------------------------------------------------------------------ */
/* backend plumbing */

static void test_memory_and_profile(void)
{
    dt_backend *be = be_new();
    DT_CHECK_STR(be->name, "cpu");
    void *p = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(be->alloc(be, &p, 1 << 20, e), e);
    const unsigned char *b = p;
    int nz = 0;
    for (int i = 0; i < 1 << 20; i++)
        nz += b[i] != 0;
    DT_CHECK_INT(nz, 0);
    DT_CHECK(((uintptr_t)p & 63) == 0);
    DT_CHECK(be->peak_bytes(be) >= (size_t)1 << 20);
    be->free(be, p);
    be->free(be, NULL);

    const int N = 8, C = 16, OC = 4;
    float *x = dev_alloc(be, N * C * 4), *w = dev_alloc(be, OC * C * 4), *o = dev_alloc(be, N * OC * 4);
    be->profile_enable(be, true);
    be->matmul_fwd(be, o, x, w, NULL, N, C, OC);
    be->matmul_fwd(be, o, x, w, NULL, N, C, OC);
    be->gelu_fwd(be, o, o, N * OC);
    dt_op_stat st[64];
    int ns = be->profile_read(be, st, 64);
    DT_REQUIRE(ns > 0 && ns <= 64);
    int seen = 0;
    for (int i = 0; i < ns; i++) {
        if (!strcmp(st[i].name, "matmul_fwd")) {
            seen++;
            DT_CHECK(st[i].gemm);
            DT_CHECK_INT(st[i].calls, 2);
            DT_CHECK_NEAR(st[i].flops, 2.0 * 2 * N * C * OC, 0);
        } else if (!strcmp(st[i].name, "gelu_fwd")) {
            seen++;
            DT_CHECK(!st[i].gemm);
            DT_CHECK_INT(st[i].calls, 1);
        } else {
            DT_CHECK_MSG(st[i].calls == 0, "%s counted %llu calls", st[i].name,
                         (unsigned long long)st[i].calls);
        }
    }
    DT_CHECK_INT(seen, 2);
    be->profile_enable(be, true); /* resets */
    be->profile_read(be, st, 64);
    for (int i = 0; i < ns; i++)
        DT_CHECK_INT(st[i].calls, 0);
    be->profile_enable(be, false);
    be->close(be);

    dt_backend *none = NULL;
    dt_backend_kind kind = DT_BACKEND_CPU;
    DT_CHECK(dt_backend_kind_parse("tpu", &kind, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "unknown device");
    DT_CHECK(dt_backend_open(&none, (dt_backend_kind)7, NULL, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "unknown device");
    dt_backend_close(NULL);
}

/* Instances are independent: two threads, each with its own backend, get the results of one. */
typedef struct {
    const float *x, *w;
    float *out;
    int N, C, OC, T, NH;
} thr_job;

static void *thr_run(void *p)
{
    thr_job *j = p;
    dt_backend *be = NULL;
    if (dt_cpu_backend_create(&be, NULL, NULL) != 0)
        return NULL;
    float *x = NULL, *w = NULL, *o = NULL, *att = NULL, *ao = NULL;
    size_t nx = (size_t)j->N * j->C, nw = (size_t)j->OC * j->C, no = (size_t)j->N * j->OC;
    be->alloc(be, (void **)&x, nx * 4, NULL);
    be->alloc(be, (void **)&w, nw * 4, NULL);
    be->alloc(be, (void **)&o, no * 4, NULL);
    int B = j->N / j->T, Cq = j->OC / 3;
    size_t natt = 0;
    be->attention_sizes(be, B, j->T, Cq, j->NH, &natt, NULL);
    be->alloc(be, (void **)&att, natt * 4, NULL);
    be->alloc(be, (void **)&ao, (size_t)j->N * Cq * 4, NULL);
    be->memcpy_h2d(be, x, j->x, nx * 4);
    be->memcpy_h2d(be, w, j->w, nw * 4);
    be->profile_enable(be, true);
    for (int rep = 0; rep < 20; rep++) {
        be->matmul_fwd(be, o, x, w, NULL, j->N, j->C, j->OC);
        be->attention_fwd(be, ao, att, o, B, j->T, Cq, j->NH);
    }
    be->memcpy_d2h(be, j->out, ao, (size_t)j->N * Cq * 4);
    be->close(be);
    return j;
}

/* job.cpu_bind narrows a worker's affinity after the backend started OpenBLAS's threads; the
 * backend then binds those too, or they would run on every CPU. */
static void test_blas_threads_bound(void)
{
    cpu_set_t all, one;
    DT_REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
    if (CPU_COUNT(&all) < 2)
        DT_SKIP("needs 2 CPUs");
    dt_backend_opts o;
    dt_backend_opts_default(&o);
    o.threads = 2;
    dt_backend *be = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_cpu_backend_create(&be, &o, &err), &err);
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all))
            last = c;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    DT_REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    int n = dt_cpu_backend_bind_blas_threads();
    DT_CHECK_MSG(n >= 1, "bound %d BLAS threads", n);
    /* every thread of this process now runs on that CPU only */
    char want[16];
    snprintf(want, sizeof want, "%d", last);
    DIR *d = opendir("/proc/self/task");
    DT_REQUIRE(d != NULL);
    struct dirent *e;
    int tasks = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], line[256], got[64] = "?";
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "Cpus_allowed_list: %63s", got) == 1)
                break;
        fclose(f);
        tasks++;
        DT_CHECK_MSG(!strcmp(got, want), "thread %s may run on CPUs %s, not only %s", e->d_name,
                     got, want);
    }
    closedir(d);
    DT_CHECK_MSG(tasks >= 2, "%d threads: OpenBLAS started none", tasks);
    dt_backend_close(be);
}

static void test_instances_independent(void)
{
    const int T = 64, B = 4, N = B * T, C = 48, OC = 3 * 32, NH = 4;
    dt_rng r;
    dt_rng_seed(&r, 81);
    float *x = randf(&r, (size_t)N * C, -1, 1), *w = randf(&r, (size_t)OC * C, -1, 1);
    size_t no = (size_t)N * (OC / 3);
    float *ref = malloc(no * 4), *o1 = malloc(no * 4), *o2 = malloc(no * 4);
    thr_job j0 = {x, w, ref, N, C, OC, T, NH}, j1 = j0, j2 = j0;
    j1.out = o1;
    j2.out = o2;
    DT_REQUIRE(thr_run(&j0) != NULL);
    pthread_t t1, t2;
    DT_REQUIRE(pthread_create(&t1, NULL, thr_run, &j1) == 0);
    DT_REQUIRE(pthread_create(&t2, NULL, thr_run, &j2) == 0);
    void *r1, *r2;
    pthread_join(t1, &r1);
    pthread_join(t2, &r2);
    DT_CHECK(r1 && r2);
    DT_CHECK(memcmp(ref, o1, no * 4) == 0);
    DT_CHECK(memcmp(ref, o2, no * 4) == 0);
    free(x); free(w); free(ref); free(o1); free(o2);
}

static const dt_test tests[] = {
    {"matmul", test_matmul, 0},
    {"attention", test_attention, 60},
    {"attention_tiles", test_attention_tiles, 60},
    {"attention_causality", test_attention_causality, 0},
    {"attention_pad", test_attention_pad, 60},
    {"conv2d", test_conv2d, 0},
    {"conv2d_chunked", test_conv2d_chunked, 60},
    {"layernorm", test_layernorm, 0},
    {"layernorm_moments", test_layernorm_moments, 0},
    {"gelu", test_gelu, 0},
    {"gelu_erf_tanh", test_gelu_erf_tanh, 0},
    {"relu_residual_scale", test_relu_residual_scale, 0},
    {"bias", test_bias, 0},
    {"embedding", test_embedding, 0},
    {"xent", test_xent, 0},
    {"xent_uniform", test_xent_uniform, 0},
    {"embedding_vp", test_embedding_vp, 0},
    {"xent_vp", test_xent_vp, 0},
    {"batchnorm", test_batchnorm, 0},
    {"batchnorm_offset", test_batchnorm_offset, 0},
    {"batchnorm_split", test_batchnorm_split, 0},
    {"batchnorm_split_offset", test_batchnorm_split_offset, 0},
    {"pooling", test_pooling, 0},
    {"sgd_by_hand", test_sgd_by_hand, 0},
    {"sgd_steps", test_sgd_steps, 0},
    {"adamw", test_adamw, 0},
    {"sumsq_nonfinite", test_sumsq_nonfinite, 0},
    {"half_payloads", test_half_payloads, 0},
    {"memory_and_profile", test_memory_and_profile, 0},
    {"instances_independent", test_instances_independent, 0},
    {"blas_threads_bound", test_blas_threads_bound, 0},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_kernels", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
