/* cpu_ops.c - the non-GEMM ops of the CPU backend: element-wise, normalisation, softmax,
 * cross-entropy, embeddings, BatchNorm and pooling.
 *
 * Everything here is a plain loop over contiguous rows, written so that GCC vectorises it
 * (see cpu.h: -O3 for this file, AVX2 clones of the hot kernels). Reductions over a row use
 * eight partial sums, which the vectoriser maps onto vector registers without needing
 * -ffast-math; reductions over a whole batch (BatchNorm statistics, bias gradients) accumulate
 * in double.
 *
 * exp and tanh: dt_expf is Cephes' single-precision polynomial (relative error about 2e-7)
 * with the exponent scaling done on the bits, branch-free so that it vectorises; tanh is built
 * on it. libm's expf and tanhf are scalar calls that cost more than the GEMMs they sit between
 * (GELU runs on 4C values per token per layer).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/cpu.h"

DT_CPU_OPTIMIZE

/* ------------------------------------------------------------------------------------------ */
/* vectorisable math */

static inline float bits_to_float(uint32_t u)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = u};
    return v.f;
}

/* exp(x) for x in [-87.3, 88.7] (clamped outside: exp(-inf) gives ~1e-38, not 0). */
static inline float dt_expf(float x)
{
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.7f ? 88.7f : x;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504088896341f + magic) - magic;
    float f = x - n * 0.693359375f;
    f = f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * f + 1.3981999507e-3f;
    p = p * f + 8.3334519073e-3f;
    p = p * f + 4.1665795894e-2f;
    p = p * f + 1.6666665459e-1f;
    p = p * f + 5.0000001201e-1f;
    p = p * f * f + f + 1.0f;
    int32_t ni = (int32_t)n;
    return p * bits_to_float((uint32_t)(ni + 127) << 23);
}

static inline float dt_tanhf(float x)
{
    float ax = x < 0.0f ? -x : x;
    float e = dt_expf(-2.0f * ax);
    float t = (1.0f - e) / (1.0f + e);
    return x < 0.0f ? -t : t;
}

/* Sum and dot product with eight partial sums. */
static inline float sum8(const float *x, int n)
{
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += x[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        s += x[i];
    return s;
}

static inline float max8(const float *x, int n)
{
    float m = -INFINITY;
    float acc[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                    -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int j = 0; j < 8; j++)
        m = acc[j] > m ? acc[j] : m;
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* ------------------------------------------------------------------------------------------ */
/* helpers shared with cpu_gemm.c (attention_pad) */

static void softmax_masked_rows(float *att, const float *scores, const int32_t *mask, int n,
                                int T)
{
    for (int t = 0; t < n; t++) {
        const float *s = scores + (size_t)t * T;
        float *a = att + (size_t)t * T;
        float m = -INFINITY;
        for (int i = 0; i < T; i++) {
            float v = !mask || mask[i] ? s[i] : -INFINITY;
            m = v > m ? v : m;
        }
        if (m == -INFINITY) { /* every key masked */
            for (int i = 0; i < T; i++)
                a[i] = 0.0f;
            continue;
        }
        float acc[8] = {0};
        int i = 0;
        for (; i + 8 <= T; i += 8)
            for (int j = 0; j < 8; j++) {
                float e = !mask || mask[i + j] ? dt_expf(s[i + j] - m) : 0.0f;
                a[i + j] = e;
                acc[j] += e;
            }
        float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; i < T; i++) {
            float e = !mask || mask[i] ? dt_expf(s[i] - m) : 0.0f;
            a[i] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
        for (i = 0; i < T; i++)
            a[i] *= inv;
    }
}

void dt_cpu_softmax_masked(float *att, const float *scores, const int32_t *mask, int n, int T)
{
    softmax_masked_rows(att, scores, mask, n, T);
}

DT_CPU_CLONES
static void softmax_rows_bwd(float *d, const float *p, int n, int T, float scale)
{
    for (int t = 0; t < n; t++) {
        float *dr = d + (size_t)t * T;
        const float *pr = p + (size_t)t * T;
        float acc[8] = {0};
        int i = 0;
        for (; i + 8 <= T; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += pr[i + j] * dr[i + j];
        float dot = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; i < T; i++)
            dot += pr[i] * dr[i];
        for (i = 0; i < T; i++)
            dr[i] = scale * pr[i] * (dr[i] - dot);
    }
}

void dt_cpu_softmax_rows_bwd(float *d, const float *p, int n, int T, float scale)
{
    softmax_rows_bwd(d, p, n, T, scale);
}

void dt_cpu_rows_set(float *out, const float *bias, int N, int C)
{
    for (int i = 0; i < N; i++)
        memcpy(out + (size_t)i * C, bias, sizeof(float) * C);
}

DT_CPU_CLONES
void dt_cpu_colsum_acc(float *dbias, const float *x, int N, int C, int ld)
{
    enum { TILE = 64 };
    double acc[TILE];
    for (int c0 = 0; c0 < C; c0 += TILE) {
        int cn = DT_MIN(TILE, C - c0);
        for (int j = 0; j < cn; j++)
            acc[j] = 0.0;
        for (int i = 0; i < N; i++) {
            const float *row = x + (size_t)i * ld + c0;
            for (int j = 0; j < cn; j++)
                acc[j] += row[j];
        }
        for (int j = 0; j < cn; j++)
            dbias[c0 + j] += (float)acc[j];
    }
}

DT_CPU_CLONES
double dt_cpu_sum(const float *x, size_t n)
{
    double acc[4] = {0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            acc[j] += x[i + j];
    double s = (acc[0] + acc[2]) + (acc[1] + acc[3]);
    for (; i < n; i++)
        s += x[i];
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* bias, residual, scaling */

void dt_cpu_bias_add(dt_backend *be, float *out, const float *bias, int N, int C)
{
    DT_CPU_PROF_BEGIN(be);
    for (int i = 0; i < N; i++) {
        float *row = out + (size_t)i * C;
        for (int j = 0; j < C; j++)
            row[j] += bias[j];
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_BIAS_ADD, 0);
}

void dt_cpu_bias_bwd(dt_backend *be, float *dbias, const float *dout, int N, int C)
{
    DT_CPU_PROF_BEGIN(be);
    dt_cpu_colsum_acc(dbias, dout, N, C, C);
    DT_CPU_PROF_END(be, DT_CPU_OP_BIAS_BWD, 0);
}

void dt_cpu_residual_fwd(dt_backend *be, float *out, const float *a, const float *b, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    DT_CPU_PROF_END(be, DT_CPU_OP_RESIDUAL, 0);
}

void dt_cpu_accumulate(dt_backend *be, float *dst, const float *src, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
    DT_CPU_PROF_END(be, DT_CPU_OP_ACCUMULATE, 0);
}

void dt_cpu_scale(dt_backend *be, float *x, size_t n, float s)
{
    DT_CPU_PROF_BEGIN(be);
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
    DT_CPU_PROF_END(be, DT_CPU_OP_SCALE, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* LayerNorm */

DT_CPU_CLONES
static void layernorm_fwd_rows(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, int N, int C, float eps)
{
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        float m = sum8(x, C) / (float)C;
        float acc[8] = {0};
        int j = 0;
        for (; j + 8 <= C; j += 8)
            for (int k = 0; k < 8; k++) {
                float d = x[j + k] - m;
                acc[k] += d * d;
            }
        float v = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; j < C; j++)
            v += (x[j] - m) * (x[j] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + eps);
        for (j = 0; j < C; j++)
            y[j] = (x[j] - m) * s * w[j] + b[j];
        if (mean)
            mean[i] = m;
        if (rstd)
            rstd[i] = s;
    }
}

void dt_cpu_layernorm_fwd(dt_backend *be, float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C, float eps)
{
    DT_CPU_PROF_BEGIN(be);
    layernorm_fwd_rows(out, mean, rstd, inp, w, b, N, C, eps);
    DT_CPU_PROF_END(be, DT_CPU_OP_LAYERNORM_FWD, 0);
}

DT_CPU_CLONES
static void layernorm_bwd_rows(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        const float *dy = dout + (size_t)i * C;
        const float m = mean[i], s = rstd[i];
        float a1[8] = {0}, a2[8] = {0};
        int j = 0;
        for (; j + 8 <= C; j += 8)
            for (int k = 0; k < 8; k++) {
                float xh = (x[j + k] - m) * s;
                float dn = w[j + k] * dy[j + k];
                a1[k] += dn;
                a2[k] += dn * xh;
            }
        float dmean = ((a1[0] + a1[4]) + (a1[1] + a1[5])) + ((a1[2] + a1[6]) + (a1[3] + a1[7]));
        float dxh = ((a2[0] + a2[4]) + (a2[1] + a2[5])) + ((a2[2] + a2[6]) + (a2[3] + a2[7]));
        for (; j < C; j++) {
            float xh = (x[j] - m) * s;
            float dn = w[j] * dy[j];
            dmean += dn;
            dxh += dn * xh;
        }
        dmean /= (float)C;
        dxh /= (float)C;
        if (db)
            for (j = 0; j < C; j++)
                db[j] += dy[j];
        if (dw)
            for (j = 0; j < C; j++)
                dw[j] += (x[j] - m) * s * dy[j];
        if (dinp) {
            float *dx = dinp + (size_t)i * C;
            for (j = 0; j < C; j++) {
                float xh = (x[j] - m) * s;
                dx[j] += (w[j] * dy[j] - dmean - xh * dxh) * s;
            }
        }
    }
}

void dt_cpu_layernorm_bwd(dt_backend *be, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int N, int C)
{
    DT_CPU_PROF_BEGIN(be);
    layernorm_bwd_rows(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    DT_CPU_PROF_END(be, DT_CPU_OP_LAYERNORM_BWD, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* decoder ops (llama): RMSNorm, SwiGLU, rotary embeddings with grouped-query heads */

DT_CPU_CLONES
static void rmsnorm_fwd_rows(float *out, float *rstd, const float *inp, const float *w, int N,
                             int C, float eps)
{
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        float acc[8] = {0};
        int j = 0;
        for (; j + 8 <= C; j += 8)
            for (int k = 0; k < 8; k++)
                acc[k] += x[j + k] * x[j + k];
        float ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; j < C; j++)
            ss += x[j] * x[j];
        float s = 1.0f / sqrtf(ss / (float)C + eps);
        for (j = 0; j < C; j++)
            y[j] = w[j] * (x[j] * s);
        if (rstd)
            rstd[i] = s;
    }
}

void dt_cpu_rmsnorm_fwd(dt_backend *be, float *out, float *rstd, const float *inp, const float *w,
                        int N, int C, float eps)
{
    DT_CPU_PROF_BEGIN(be);
    rmsnorm_fwd_rows(out, rstd, inp, w, N, C, eps);
    DT_CPU_PROF_END(be, DT_CPU_OP_RMSNORM_FWD, 0);
}

DT_CPU_CLONES
static void rmsnorm_bwd_rows(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        const float s = rstd[i];
        if (dw)
            for (int j = 0; j < C; j++)
                dw[j] += dy[j] * (x[j] * s);
        if (!dinp)
            continue;
        float acc[8] = {0};
        int j = 0;
        for (; j + 8 <= C; j += 8)
            for (int k = 0; k < 8; k++)
                acc[k] += w[j + k] * dy[j + k] * (x[j + k] * s);
        float dot = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; j < C; j++)
            dot += w[j] * dy[j] * (x[j] * s);
        dot /= (float)C;
        float *dx = dinp + (size_t)i * C;
        for (j = 0; j < C; j++)
            dx[j] += (w[j] * dy[j] - (x[j] * s) * dot) * s;
    }
}

void dt_cpu_rmsnorm_bwd(dt_backend *be, float *dinp, float *dw, const float *dout,
                        const float *inp, const float *w, const float *rstd, int N, int C)
{
    DT_CPU_PROF_BEGIN(be);
    rmsnorm_bwd_rows(dinp, dw, dout, inp, w, rstd, N, C);
    DT_CPU_PROF_END(be, DT_CPU_OP_RMSNORM_BWD, 0);
}

DT_CPU_CLONES
static void swiglu_fwd_rows(float *out, const float *inp, int N, int F)
{
    for (int i = 0; i < N; i++) {
        const float *g = inp + (size_t)i * 2 * F, *u = g + F;
        float *o = out + (size_t)i * F;
        for (int j = 0; j < F; j++)
            o[j] = g[j] / (1.0f + dt_expf(-g[j])) * u[j];
    }
}

void dt_cpu_swiglu_fwd(dt_backend *be, float *out, const float *inp, int N, int F)
{
    DT_CPU_PROF_BEGIN(be);
    swiglu_fwd_rows(out, inp, N, F);
    DT_CPU_PROF_END(be, DT_CPU_OP_SWIGLU_FWD, 0);
}

/* d silu(g)/dg = sig(g) (1 + g (1 - sig(g))). */
DT_CPU_CLONES
static void swiglu_bwd_rows(float *dinp, const float *dout, const float *inp, int N, int F)
{
    for (int i = 0; i < N; i++) {
        const float *g = inp + (size_t)i * 2 * F, *u = g + F, *dy = dout + (size_t)i * F;
        float *dg = dinp + (size_t)i * 2 * F, *du = dg + F;
        for (int j = 0; j < F; j++) {
            float sg = 1.0f / (1.0f + dt_expf(-g[j]));
            float silu = g[j] * sg;
            du[j] += dy[j] * silu;
            dg[j] += dy[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
        }
    }
}

void dt_cpu_swiglu_bwd(dt_backend *be, float *dinp, const float *dout, const float *inp, int N,
                       int F)
{
    DT_CPU_PROF_BEGIN(be);
    swiglu_bwd_rows(dinp, dout, inp, N, F);
    DT_CPU_PROF_END(be, DT_CPU_OP_SWIGLU_BWD, 0);
}

/* cos and sin of position t's angles t * f_i for i in [i0, i0 + n) (backend_ops.h: float32, as
 * Hugging Face's LlamaRotaryEmbedding computes inv_freq and its product with the position). */
#define ROPE_CHUNK 64
static void rope_angles(float *c, float *s, int t, int i0, int n, int hs, float theta)
{
    for (int k = 0; k < n; k++) {
        float inv = 1.0f / powf(theta, (float)(2 * (i0 + k)) / (float)hs);
        float a = (float)t * inv;
        c[k] = cosf(a);
        s[k] = sinf(a);
    }
}

/* o = rope(x) over the pairs [i0, i0 + n) of one head (hs) with angles (c, s); back: the
 * transpose (rotation by -a), accumulated into o. */
static inline void rope_pairs(float *o, const float *x, const float *c, const float *s, int i0,
                              int n, int h2, bool back)
{
    for (int k = 0; k < n; k++) {
        const int i = i0 + k;
        const float a = x[i], b = x[i + h2];
        if (back) {
            o[i] += c[k] * a + s[k] * b;
            o[i + h2] += c[k] * b - s[k] * a;
        } else {
            o[i] = c[k] * a - s[k] * b;
            o[i + h2] = c[k] * b + s[k] * a;
        }
    }
}

/* Forward (back false: dst = out (B,T,3 NH hs) from src = inp (B,T,(NH+2NKV)hs)) or backward
 * (back: dst = dinp += from src = dout) of rope_qkv. Offsets are taken on the two sides, the
 * "in" side (B,T,(NH+2NKV)hs) and the attention side (B,T,3 NH hs), and each pair of them maps
 * src to dst in the direction of the pass. */
static void rope_qkv(float *dst, const float *src, int B, int T, int NH, int NKV, int hs,
                     float theta, bool back)
{
    const int h2 = hs / 2, rep = NH / NKV;
    const size_t C = (size_t)NH * hs, Ckv = (size_t)NKV * hs, Cin = C + 2 * Ckv, Cat = 3 * C;
    float c[ROPE_CHUNK], s[ROPE_CHUNK];
    for (int t = 0; t < T; t++)
        for (int i0 = 0; i0 < h2; i0 += ROPE_CHUNK) {
            const int n = DT_MIN(ROPE_CHUNK, h2 - i0);
            rope_angles(c, s, t, i0, n, hs, theta);
            for (int b = 0; b < B; b++) {
                const size_t ri = ((size_t)b * T + t) * Cin, ra = ((size_t)b * T + t) * Cat;
                for (int h = 0; h < NH; h++) {
                    const size_t q = ri + (size_t)h * hs, qa = ra + (size_t)h * hs;
                    const size_t k = ri + C + (size_t)(h / rep) * hs, ka = ra + C + (size_t)h * hs;
                    rope_pairs(dst + (back ? q : qa), src + (back ? qa : q), c, s, i0, n, h2, back);
                    rope_pairs(dst + (back ? k : ka), src + (back ? ka : k), c, s, i0, n, h2, back);
                }
            }
        }
    for (size_t r = 0; r < (size_t)B * T; r++) /* v: copied to (summed from) every query head */
        for (int h = 0; h < NH; h++) {
            const size_t v = r * Cin + C + Ckv + (size_t)(h / rep) * hs;
            const size_t va = r * Cat + 2 * C + (size_t)h * hs;
            if (back)
                for (int i = 0; i < hs; i++)
                    dst[v + i] += src[va + i];
            else
                memcpy(dst + va, src + v, (size_t)hs * sizeof(float));
        }
}

void dt_cpu_rope_qkv_fwd(dt_backend *be, float *out, const float *inp, int B, int T, int NH,
                         int NKV, int hs, float theta)
{
    DT_CPU_PROF_BEGIN(be);
    rope_qkv(out, inp, B, T, NH, NKV, hs, theta, false);
    DT_CPU_PROF_END(be, DT_CPU_OP_ROPE_QKV_FWD, 0);
}

void dt_cpu_rope_qkv_bwd(dt_backend *be, float *dinp, const float *dout, int B, int T, int NH,
                         int NKV, int hs, float theta)
{
    DT_CPU_PROF_BEGIN(be);
    rope_qkv(dinp, dout, B, T, NH, NKV, hs, theta, true);
    DT_CPU_PROF_END(be, DT_CPU_OP_ROPE_QKV_BWD, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* activations */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

DT_CPU_CLONES
static void gelu_fwd_loop(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_C * x * x * x);
        out[i] = 0.5f * x * (1.0f + dt_tanhf(u));
    }
}

void dt_cpu_gelu_fwd(dt_backend *be, float *out, const float *inp, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    gelu_fwd_loop(out, inp, n);
    DT_CPU_PROF_END(be, DT_CPU_OP_GELU_FWD, 0);
}

DT_CPU_CLONES
static void gelu_bwd_loop(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_C * x * x * x);
        float t = dt_tanhf(u);
        float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        float g = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
        dinp[i] += g * dout[i];
    }
}

void dt_cpu_gelu_bwd(dt_backend *be, float *dinp, const float *inp, const float *dout, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    gelu_bwd_loop(dinp, inp, dout, n);
    DT_CPU_PROF_END(be, DT_CPU_OP_GELU_BWD, 0);
}

/* The exact GELU x * Phi(x). Phi from erfc by Numerical Recipes' Chebyshev fit (erfcc:
 * fractional error below 1.2e-7 for every argument), evaluated with dt_expf so that the loop
 * vectorises: with z = |x| / sqrt(2) and c = erfc(z), Phi(x) = c / 2 for x < 0 and 1 - c / 2
 * for x >= 0, so both tails keep their relative precision. */
#define SQRT1_2 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

static inline float phi_cdf(float x)
{
    float z = (x < 0.0f ? -x : x) * SQRT1_2;
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = -1.26551223f +
              t * (1.00002368f +
                   t * (0.37409196f +
                        t * (0.09678418f +
                             t * (-0.18628806f +
                                  t * (0.27886807f +
                                       t * (-1.13520398f +
                                            t * (1.48851587f +
                                                 t * (-0.82215223f + t * 0.17087277f))))))));
    float c = t * dt_expf(-z * z + p);
    return x < 0.0f ? 0.5f * c : 1.0f - 0.5f * c;
}

DT_CPU_CLONES
static void gelu_erf_fwd_loop(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = x * phi_cdf(x);
    }
}

void dt_cpu_gelu_erf_fwd(dt_backend *be, float *out, const float *inp, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    gelu_erf_fwd_loop(out, inp, n);
    DT_CPU_PROF_END(be, DT_CPU_OP_GELU_ERF_FWD, 0);
}

DT_CPU_CLONES
static void gelu_erf_bwd_loop(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float g = phi_cdf(x) + x * INV_SQRT_2PI * dt_expf(-0.5f * x * x);
        dinp[i] += g * dout[i];
    }
}

void dt_cpu_gelu_erf_bwd(dt_backend *be, float *dinp, const float *inp, const float *dout,
                         size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    gelu_erf_bwd_loop(dinp, inp, dout, n);
    DT_CPU_PROF_END(be, DT_CPU_OP_GELU_ERF_BWD, 0);
}

/* tanh: libm's (BERT's pooler runs it on (B,C) only; dt_tanhf loses relative precision near 0,
 * where 1 - exp(-2|x|) cancels). */
void dt_cpu_tanh_fwd(dt_backend *be, float *out, const float *inp, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    for (size_t i = 0; i < n; i++)
        out[i] = tanhf(inp[i]);
    DT_CPU_PROF_END(be, DT_CPU_OP_TANH_FWD, 0);
}

void dt_cpu_tanh_bwd(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    for (size_t i = 0; i < n; i++)
        dinp[i] += (1.0f - out[i] * out[i]) * dout[i];
    DT_CPU_PROF_END(be, DT_CPU_OP_TANH_BWD, 0);
}

void dt_cpu_relu_fwd(dt_backend *be, float *out, const float *inp, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    DT_CPU_PROF_END(be, DT_CPU_OP_RELU_FWD, 0);
}

void dt_cpu_relu_bwd(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    for (size_t i = 0; i < n; i++) {
        float d = dout[i]; /* loaded unconditionally, so the loop vectorises */
        dinp[i] += out[i] > 0.0f ? d : 0.0f;
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_RELU_BWD, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* embeddings */

void dt_cpu_embedding_fwd(dt_backend *be, float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    DT_CPU_PROF_BEGIN(be);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tokens[b * T + t] * C;
            if (wpe) {
                const float *p = wpe + (size_t)t * C;
                for (int i = 0; i < C; i++)
                    o[i] = e[i] + p[i];
            } else {
                memcpy(o, e, sizeof(float) * C);
            }
        }
    DT_CPU_PROF_END(be, DT_CPU_OP_EMBEDDING_FWD, 0);
}

void dt_cpu_embedding_bwd(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                          const int32_t *tokens, int B, int T, int C)
{
    DT_CPU_PROF_BEGIN(be);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            if (dwte) {
                float *e = dwte + (size_t)tokens[b * T + t] * C;
                for (int i = 0; i < C; i++)
                    e[i] += d[i];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)t * C;
                for (int i = 0; i < C; i++)
                    p[i] += d[i];
            }
        }
    DT_CPU_PROF_END(be, DT_CPU_OP_EMBEDDING_BWD, 0);
}

/* Vocabulary-parallel: this slice holds rows [v0, v0+Vl) of the table. */
void dt_cpu_embedding_vp_fwd(dt_backend *be, float *out, const int32_t *tokens,
                             const float *wte, const float *wpe, int B, int T, int C, int v0,
                             int Vl)
{
    DT_CPU_PROF_BEGIN(be);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            int row = tokens[b * T + t] - v0;
            const float *e = row >= 0 && row < Vl ? wte + (size_t)row * C : NULL;
            const float *p = wpe ? wpe + (size_t)t * C : NULL;
            for (int i = 0; i < C; i++)
                o[i] = (e ? e[i] : 0.0f) + (p ? p[i] : 0.0f);
        }
    DT_CPU_PROF_END(be, DT_CPU_OP_EMBEDDING_VP_FWD, 0);
}

void dt_cpu_embedding_vp_bwd(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, int B, int T, int C, int v0, int Vl)
{
    DT_CPU_PROF_BEGIN(be);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            int row = tokens[b * T + t] - v0;
            if (dwte && row >= 0 && row < Vl) {
                float *e = dwte + (size_t)row * C;
                for (int i = 0; i < C; i++)
                    e[i] += d[i];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)t * C;
                for (int i = 0; i < C; i++)
                    p[i] += d[i];
            }
        }
    DT_CPU_PROF_END(be, DT_CPU_OP_EMBEDDING_VP_BWD, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* softmax + cross-entropy */

DT_CPU_CLONES
static int xent_rows(float *losses, float *dlogits, const float *logits, const int32_t *targets,
                     int N, int V, float dloss)
{
    int valid = 0;
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        int tgt = targets[i];
        if (tgt < 0 || tgt >= V) {
            losses[i] = 0.0f;
            if (dlogits)
                memset(dlogits + (size_t)i * V, 0, sizeof(float) * V);
            continue;
        }
        valid++;
        float m = max8(l, V);
        float acc[8] = {0};
        int j = 0;
        for (; j + 8 <= V; j += 8)
            for (int k = 0; k < 8; k++)
                acc[k] += dt_expf(l[j + k] - m);
        float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; j < V; j++)
            sum += dt_expf(l[j] - m);
        float lse = m + logf(sum);
        losses[i] = lse - l[tgt];
        if (dlogits) { /* may alias logits: each element is read before it is written */
            float *d = dlogits + (size_t)i * V;
            for (j = 0; j < V; j++)
                d[j] = dloss * dt_expf(l[j] - lse);
            d[tgt] -= dloss;
        }
    }
    return valid;
}

void dt_cpu_xent_fwd_bwd(dt_backend *be, float *losses, float *dlogits, const float *logits,
                         const int32_t *targets, int N, int V, float dloss, int *valid_count)
{
    DT_CPU_PROF_BEGIN(be);
    int valid = xent_rows(losses, dlogits, logits, targets, N, V, dloss);
    if (valid_count)
        *valid_count = valid;
    DT_CPU_PROF_END(be, DT_CPU_OP_XENT, 0);
}

/* Vocabulary-parallel cross-entropy (backend_ops.h): the three stages around the all-reduces.
 * The same arithmetic as xent_rows (eight partial sums of dt_expf, lse = max + log(sum),
 * gradient exp(logit - lse)), so a slice that holds the whole vocabulary matches it. */
void dt_cpu_xent_vp_max(dt_backend *be, float *maxes, const float *logits, int N, int Vl, int nv)
{
    DT_CPU_PROF_BEGIN(be);
    for (int i = 0; i < N; i++)
        maxes[i] = max8(logits + (size_t)i * Vl, nv);
    DT_CPU_PROF_END(be, DT_CPU_OP_XENT_VP, 0);
}

DT_CPU_CLONES
static void xent_vp_sum_rows(float *sums, const float *logits, const float *maxes,
                             const int32_t *targets, int N, int Vl, int nv, int v0)
{
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vl;
        float m = maxes[i];
        float acc[8] = {0};
        int j = 0;
        for (; j + 8 <= nv; j += 8)
            for (int k = 0; k < 8; k++)
                acc[k] += dt_expf(l[j + k] - m);
        float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; j < nv; j++)
            sum += dt_expf(l[j] - m);
        sums[i] = sum;
        int col = targets[i] - v0;
        sums[N + i] = targets[i] >= 0 && col >= 0 && col < nv ? l[col] : 0.0f;
    }
}

void dt_cpu_xent_vp_sums(dt_backend *be, float *sums, const float *logits, const float *maxes,
                         const int32_t *targets, int N, int Vl, int nv, int v0)
{
    DT_CPU_PROF_BEGIN(be);
    xent_vp_sum_rows(sums, logits, maxes, targets, N, Vl, nv, v0);
    DT_CPU_PROF_END(be, DT_CPU_OP_XENT_VP, 0);
}

void dt_cpu_xent_vp_finish(dt_backend *be, float *losses, float *dlogits, const float *logits,
                           const float *maxes, const float *sums, const int32_t *targets, int N,
                           int Vl, int nv, int v0, float dloss)
{
    DT_CPU_PROF_BEGIN(be);
    for (int i = 0; i < N; i++) {
        int tgt = targets[i];
        float *d = dlogits ? dlogits + (size_t)i * Vl : NULL;
        if (tgt < 0) {
            losses[i] = 0.0f;
            if (d)
                memset(d, 0, sizeof(float) * Vl);
            continue;
        }
        float lse = maxes[i] + logf(sums[i]);
        losses[i] = lse - sums[N + i];
        if (!d)
            continue;
        const float *l = logits + (size_t)i * Vl; /* may alias d: read before written */
        for (int j = 0; j < nv; j++)
            d[j] = dloss * dt_expf(l[j] - lse);
        for (int j = nv; j < Vl; j++)
            d[j] = 0.0f;
        int col = tgt - v0;
        if (col >= 0 && col < nv)
            d[col] -= dloss;
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_XENT_VP, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* BatchNorm: inp (N,C,HW) */

/* Per channel: sum = sum(x) and sumsq = sum((x - mean)^2), the centred sum of squares (M2),
 * not sum(x^2): E[x^2] - mean^2 cancels catastrophically when |mean| >> std. One pass over
 * shifted values d = x - K in double, K = the channel's first value (within a few standard
 * deviations of the mean), then M2 = sum(d^2) - sum(d)^2 / n. */
void dt_cpu_bn_stats(dt_backend *be, float *sum, float *sumsq, const float *inp, int N, int C,
                     int HW)
{
    DT_CPU_PROF_BEGIN(be);
    const double cnt = (double)N * HW;
    for (int c = 0; c < C; c++) {
        const double K = (N > 0 && HW > 0) ? (double)inp[(size_t)c * HW] : 0.0;
        double s = 0.0, ss = 0.0;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            double a[4] = {0}, q[4] = {0};
            int i = 0;
            for (; i + 4 <= HW; i += 4)
                for (int k = 0; k < 4; k++) {
                    double d = (double)x[i + k] - K;
                    a[k] += d;
                    q[k] += d * d;
                }
            for (; i < HW; i++) {
                double d = (double)x[i] - K;
                a[0] += d;
                q[0] += d * d;
            }
            s += (a[0] + a[1]) + (a[2] + a[3]);
            ss += (q[0] + q[1]) + (q[2] + q[3]);
        }
        double m2 = cnt > 0.0 ? ss - s * s / cnt : 0.0;
        sum[c] = (float)(s + cnt * K);
        sumsq[c] = (float)(m2 > 0.0 ? m2 : 0.0);
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_BN_STATS, 0);
}

static void bn_normalise(float *out, const float *inp, const float *mean, const float *rstd,
                         const float *w, const float *b, int N, int C, int HW)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
            const float sc = (w ? w[c] : 1.0f) * rstd[c], m = mean[c];
            const float sh = b ? b[c] : 0.0f;
            for (int i = 0; i < HW; i++) /* x - m first: no cancellation when |m| >> std */
                y[i] = (x[i] - m) * sc + sh;
        }
}

void dt_cpu_bn_fwd_apply(dt_backend *be, float *out, float *mean, float *rstd,
                         float *running_mean, float *running_var, const float *inp,
                         const float *w, const float *b, const float *sum, const float *sumsq,
                         double count, int N, int C, int HW, float momentum, float eps)
{
    DT_CPU_PROF_BEGIN(be);
    for (int c = 0; c < C; c++) {
        double m = (double)sum[c] / count;
        double var = (double)sumsq[c] / count; /* sumsq is the centred M2 (see bn_stats) */
        if (var < 0.0)
            var = 0.0;
        mean[c] = (float)m;
        rstd[c] = (float)(1.0 / sqrt(var + (double)eps));
        if (running_mean)
            running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * m);
        if (running_var) {
            double unbiased = count > 1.0 ? var * count / (count - 1.0) : var;
            running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * unbiased);
        }
    }
    bn_normalise(out, inp, mean, rstd, w, b, N, C, HW);
    DT_CPU_PROF_END(be, DT_CPU_OP_BN_FWD_APPLY, 0);
}

void dt_cpu_bn_fwd_eval(dt_backend *be, float *out, const float *inp, const float *running_mean,
                        const float *running_var, const float *w, const float *b, int N, int C,
                        int HW, float eps)
{
    DT_CPU_PROF_BEGIN(be);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
            float rs = (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
            const float sc = (w ? w[c] : 1.0f) * rs, m = running_mean[c];
            const float sh = b ? b[c] : 0.0f;
            for (int i = 0; i < HW; i++)
                y[i] = (x[i] - m) * sc + sh;
        }
    DT_CPU_PROF_END(be, DT_CPU_OP_BN_FWD_EVAL, 0);
}

void dt_cpu_bn_bwd_reduce(dt_backend *be, float *dw, float *db, float *sum_dy, float *sum_dy_xhat,
                          const float *dout, const float *inp, const float *mean,
                          const float *rstd, int N, int C, int HW)
{
    DT_CPU_PROF_BEGIN(be);
    for (int c = 0; c < C; c++) {
        double sdy = 0.0, sdyx = 0.0;
        const float m = mean[c], s = rstd[c];
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            const float *dy = dout + ((size_t)n * C + c) * HW;
            float a[8] = {0}, q[8] = {0};
            int i = 0;
            for (; i + 8 <= HW; i += 8)
                for (int k = 0; k < 8; k++) {
                    a[k] += dy[i + k];
                    q[k] += dy[i + k] * (x[i + k] - m);
                }
            double pa = 0.0, pq = 0.0;
            for (int k = 0; k < 8; k++) {
                pa += a[k];
                pq += q[k];
            }
            for (; i < HW; i++) {
                pa += dy[i];
                pq += dy[i] * (x[i] - m);
            }
            sdy += pa;
            sdyx += pq * s;
        }
        if (dw)
            dw[c] += (float)sdyx;
        if (db)
            db[c] += (float)sdy;
        sum_dy[c] = (float)sdy;
        sum_dy_xhat[c] = (float)sdyx;
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_BN_BWD_REDUCE, 0);
}

void dt_cpu_bn_bwd_apply(dt_backend *be, float *dinp, const float *dout, const float *inp,
                         const float *w, const float *mean, const float *rstd,
                         const float *sum_dy, const float *sum_dy_xhat, double count, int N,
                         int C, int HW)
{
    DT_CPU_PROF_BEGIN(be);
    for (int c = 0; c < C; c++) {
        const float m = mean[c], s = rstd[c];
        const float k = (w ? w[c] : 1.0f) * s;
        const float mdy = (float)(sum_dy[c] / count), mdyx = (float)(sum_dy_xhat[c] / count);
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            const float *dy = dout + ((size_t)n * C + c) * HW;
            float *dx = dinp + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++) {
                float xh = (x[i] - m) * s;
                dx[i] += k * (dy[i] - mdy - xh * mdyx);
            }
        }
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_BN_BWD_APPLY, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* pooling */

void dt_cpu_maxpool_fwd(dt_backend *be, float *out, int32_t *idx, const float *inp, int N, int C,
                        int H, int W, int k, int stride, int pad)
{
    DT_CPU_PROF_BEGIN(be);
    const int P = (H + 2 * pad - k) / stride + 1, Q = (W + 2 * pad - k) / stride + 1;
    for (int nc = 0; nc < N * C; nc++) {
        const float *x = inp + (size_t)nc * H * W;
        float *y = out + (size_t)nc * P * Q;
        int32_t *ix = idx + (size_t)nc * P * Q;
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++) {
                float best = -INFINITY;
                int32_t bi = -1;
                for (int kr = 0; kr < k; kr++) {
                    int ih = p * stride - pad + kr;
                    if (ih < 0 || ih >= H)
                        continue;
                    for (int ks = 0; ks < k; ks++) {
                        int iw = q * stride - pad + ks;
                        if (iw < 0 || iw >= W)
                            continue;
                        float v = x[ih * W + iw];
                        if (bi < 0 || v > best) {
                            best = v;
                            bi = ih * W + iw;
                        }
                    }
                }
                y[p * Q + q] = bi < 0 ? 0.0f : best;
                ix[p * Q + q] = bi;
            }
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_MAXPOOL_FWD, 0);
}

void dt_cpu_maxpool_bwd(dt_backend *be, float *dinp, const float *dout, const int32_t *idx, int N,
                        int C, int H, int W, int P, int Q)
{
    DT_CPU_PROF_BEGIN(be);
    for (int nc = 0; nc < N * C; nc++) {
        float *dx = dinp + (size_t)nc * H * W;
        const float *dy = dout + (size_t)nc * P * Q;
        const int32_t *ix = idx + (size_t)nc * P * Q;
        for (int j = 0; j < P * Q; j++)
            if (ix[j] >= 0)
                dx[ix[j]] += dy[j];
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_MAXPOOL_BWD, 0);
}

void dt_cpu_avgpool_fwd(dt_backend *be, float *out, const float *inp, int N, int C, int HW)
{
    DT_CPU_PROF_BEGIN(be);
    for (int nc = 0; nc < N * C; nc++)
        out[nc] = (float)(dt_cpu_sum(inp + (size_t)nc * HW, HW) / HW);
    DT_CPU_PROF_END(be, DT_CPU_OP_AVGPOOL_FWD, 0);
}

void dt_cpu_avgpool_bwd(dt_backend *be, float *dinp, const float *dout, int N, int C, int HW)
{
    DT_CPU_PROF_BEGIN(be);
    for (int nc = 0; nc < N * C; nc++) {
        float g = dout[nc] / (float)HW;
        float *dx = dinp + (size_t)nc * HW;
        for (int i = 0; i < HW; i++)
            dx[i] += g;
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_AVGPOOL_BWD, 0);
}
