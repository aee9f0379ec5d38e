/* cpu_gemm.c - the sgemm-bound ops of the CPU backend: matmul, bidirectional attention with a
 * padding mask (attention_pad, BERT's: the full (T,T) probabilities per head), conv2d (causal
 * attention has its own micro-kernels: cpu_attention.c).
 *
 * Everything heavy goes through cblas_sgemm (row-major); what is left around it is O(size of
 * the data), not O(flops):
 *
 * - matmul: one sgemm per product; the bias is broadcast into the output first (beta = 1).
 * - conv2d: im2col into a backend-private scratch, a chunk of whole output rows at a time, and
 *   one sgemm per chunk (K,CRS)@(CRS,cols); 1x1 stride-1 unpadded convolutions skip im2col.
 *   The backward runs the same chunks: dW += dY @ col^T and col = W^T @ dY then col2im.
 *
 * FLOPs reported to the profiler are those the sgemm calls execute (2*M*N*K each).
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"

DT_CPU_OPTIMIZE

/* Target size of the im2col scratch in floats (16 MiB): big enough that each chunk's sgemm is
 * efficient, small enough to stay near the caches' working set. */
#define CONV_SCRATCH_TARGET (4u << 20)

static void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *Cm, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* C = beta*C; sgemm's contract for K = 0, done here to be safe */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                Cm[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * Cm[(size_t)i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}

/* ------------------------------------------------------------------------------------------ */
/* matmul */

void dt_cpu_matmul_fwd(dt_backend *be, float *out, const float *inp, const float *w,
                       const float *bias, int N, int C, int OC)
{
    dt_cpu *c = dt_cpu_of(be);
    if (bias) {
        double t0 = dt_cpu_prof_now(c);
        dt_cpu_rows_set(out, bias, N, OC);
        dt_cpu_prof_add(c, DT_CPU_OP_MATMUL_BIAS, t0, 0);
    }
    double t0 = dt_cpu_prof_now(c);
    // out (N,OC) = inp (N,C) @ w^T (C,OC)
    sgemm(false, true, N, OC, C, 1.0f, inp, C, w, C, bias ? 1.0f : 0.0f, out, OC);
    dt_cpu_prof_add(c, DT_CPU_OP_MATMUL_FWD, t0, 2.0 * N * C * OC);
}

void dt_cpu_matmul_bwd(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC)
{
    dt_cpu *c = dt_cpu_of(be);
    if (dbias) {
        double t0 = dt_cpu_prof_now(c);
        dt_cpu_colsum_acc(dbias, dout, N, OC, OC);
        dt_cpu_prof_add(c, DT_CPU_OP_MATMUL_BIAS, t0, 0);
    }
    double t0 = dt_cpu_prof_now(c);
    double flops = 0;
    if (dinp) { // dinp (N,C) += dout (N,OC) @ w (OC,C)
        sgemm(false, false, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
        flops += 2.0 * N * C * OC;
    }
    if (dw) { // dw (OC,C) += dout^T (OC,N) @ inp (N,C)
        sgemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
        flops += 2.0 * N * C * OC;
    }
    dt_cpu_prof_add(c, DT_CPU_OP_MATMUL_BWD, t0, flops);
}

/* ------------------------------------------------------------------------------------------ */
/* ------------------------------------------------------------------------------------------ */
/* bidirectional attention with a padding mask (causal attention: cpu_attention.c) */

/* Bidirectional attention with a key padding mask: the same strided sgemms per (batch, head),
 * over the whole (T,T) score block (no causal blocks), and the masked softmax between them. */
void dt_cpu_attention_pad_fwd(dt_backend *be, float *out, float *att, const float *qkv,
                              const int32_t *mask, int B, int T, int C, int NH)
{
    dt_cpu *c = dt_cpu_of(be);
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    double t_start = dt_cpu_prof_now(c), t_soft = 0, flops = 0;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs; // (T,hs) ld 3C
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;       // (T,T)
            float *o = out + (size_t)b * T * C + (size_t)h * hs; // (T,hs) ld C
            // scores (T,T) = scale * q @ k^T
            sgemm(false, true, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
            double t0 = dt_cpu_prof_now(c);
            dt_cpu_softmax_masked(a, a, mask ? mask + (size_t)b * T : NULL, T, T);
            if (c->prof_on)
                t_soft += dt_cpu_prof_now(c) - t0;
            // o (T,hs) = att @ v
            sgemm(false, false, T, hs, T, 1.0f, a, T, v, C3, 0.0f, o, C);
            flops += 4.0 * T * T * hs;
        }
    }
    if (c->prof_on) {
        double total = dt_cpu_prof_now(c) - t_start;
        c->stats[DT_CPU_OP_ATTN_PAD_FWD].calls++;
        c->stats[DT_CPU_OP_ATTN_PAD_FWD].seconds += total - t_soft;
        c->stats[DT_CPU_OP_ATTN_PAD_FWD].flops += flops;
        c->stats[DT_CPU_OP_ATTN_SOFTMAX_FWD].calls++;
        c->stats[DT_CPU_OP_ATTN_SOFTMAX_FWD].seconds += t_soft;
    }
}

void dt_cpu_attention_pad_bwd(dt_backend *be, float *dqkv, float *datt, const float *dout,
                              const float *qkv, const float *att, int B, int T, int C, int NH)
{
    dt_cpu *c = dt_cpu_of(be);
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    double t_start = dt_cpu_prof_now(c), t_soft = 0, flops = 0;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
            const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C; // (T,hs) ld 3C
            float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;         // (T,T)
            float *da = datt + ((size_t)b * NH + h) * T * T;             // (T,T)
            const float *dO = dout + (size_t)b * T * C + (size_t)h * hs; // (T,hs) ld C
            // datt (T,T) = dO @ v^T;  dv (T,hs) += att^T @ dO
            sgemm(false, true, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, da, T);
            sgemm(true, false, T, hs, T, 1.0f, a, T, dO, C, 1.0f, dv, C3);
            double t0 = dt_cpu_prof_now(c);
            dt_cpu_softmax_rows_bwd(da, a, T, T, scale); // da = d(scores) * scale
            if (c->prof_on)
                t_soft += dt_cpu_prof_now(c) - t0;
            // dq (T,hs) += dpre @ k;  dk (T,hs) += dpre^T @ q
            sgemm(false, false, T, hs, T, 1.0f, da, T, k, C3, 1.0f, dq, C3);
            sgemm(true, false, T, hs, T, 1.0f, da, T, q, C3, 1.0f, dk, C3);
            flops += 8.0 * T * T * hs;
        }
    }
    if (c->prof_on) {
        double total = dt_cpu_prof_now(c) - t_start;
        c->stats[DT_CPU_OP_ATTN_PAD_BWD].calls++;
        c->stats[DT_CPU_OP_ATTN_PAD_BWD].seconds += total - t_soft;
        c->stats[DT_CPU_OP_ATTN_PAD_BWD].flops += flops;
        c->stats[DT_CPU_OP_ATTN_SOFTMAX_BWD].calls++;
        c->stats[DT_CPU_OP_ATTN_SOFTMAX_BWD].seconds += t_soft;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* conv2d */

/* Valid output columns q for kernel column ks: those with 0 <= q*stride - pad + ks < W. */
static void valid_q(const dt_conv2d_shape *s, int ks, int *qlo, int *qhi)
{
    int lo = 0, hi = s->Q;
    while (lo < hi && lo * s->stride - s->pad + ks < 0)
        lo++;
    while (hi > lo && (hi - 1) * s->stride - s->pad + ks >= s->W)
        hi--;
    *qlo = lo;
    *qhi = hi;
}

/* im2col and col2im. For a kernel tap (ch,kr,ks) the block of col rows for output rows
 * [p0,p1) is the input plane shifted by (kr - pad, ks - pad). With stride 1 and "same" width
 * (Q == W, the 3x3 pad-1 case of every ResNet) that block is ONE contiguous run of the input,
 * except the columns that fall off the left or right edge: one memcpy plus a few zeros per tap,
 * instead of a short copy per output row (rows are only 32, 16, 8 wide in a CIFAR ResNet, so
 * per-row overhead would dominate). Other shapes go row by row. */

/* Output rows [pa,pb) within [p0,p1) whose input row for kernel row kr is inside the image. */
static void valid_p(const dt_conv2d_shape *s, int kr, int p0, int p1, int *pa, int *pb)
{
    int a = p0, b = p1;
    while (a < b && a * s->stride - s->pad + kr < 0)
        a++;
    while (b > a && (b - 1) * s->stride - s->pad + kr >= s->H)
        b--;
    *pa = a;
    *pb = b;
}

static bool conv_same_width(const dt_conv2d_shape *s) { return s->stride == 1 && s->Q == s->W; }

/* col (CRS, (p1-p0)*Q) = the im2col columns of image x (C,H,W) for output rows [p0,p1). */
static void im2col(float *col, const float *x, const dt_conv2d_shape *s, int p0, int p1)
{
    const int Q = s->Q, jn = (p1 - p0) * Q, st = s->stride;
    const bool same = conv_same_width(s);
    const long plane = (long)s->H * s->W;
    for (int ch = 0; ch < s->C; ch++) {
        const float *xc = x + (size_t)ch * plane;
        for (int kr = 0; kr < s->R; kr++) {
            int pa, pb;
            valid_p(s, kr, p0, p1, &pa, &pb);
            for (int ks = 0; ks < s->S; ks++) {
                float *dst = col + ((size_t)(ch * s->R + kr) * s->S + ks) * jn;
                int qlo, qhi;
                valid_q(s, ks, &qlo, &qhi);
                const int off = ks - s->pad; /* input column = q*stride + off */
                if (pa > p0)
                    memset(dst, 0, sizeof(float) * (size_t)(pa - p0) * Q);
                if (p1 > pb)
                    memset(dst + (size_t)(pb - p0) * Q, 0, sizeof(float) * (size_t)(p1 - pb) * Q);
                if (pa >= pb)
                    continue;
                if (same) {
                    float *d = dst + (size_t)(pa - p0) * Q;
                    long i0 = (long)(pa - s->pad + kr) * s->W + off, len = (long)(pb - pa) * Q;
                    long lo = i0 < 0 ? -i0 : 0, hi = len < plane - i0 ? len : plane - i0;
                    memcpy(d + lo, xc + i0 + lo, sizeof(float) * (size_t)(hi - lo));
                    for (int p = pa; p < pb; p++, d += Q) { /* the columns off the edges */
                        for (int q = 0; q < qlo; q++)
                            d[q] = 0.0f;
                        for (int q = qhi; q < Q; q++)
                            d[q] = 0.0f;
                    }
                    continue;
                }
                float *d = dst + (size_t)(pa - p0) * Q;
                for (int p = pa; p < pb; p++, d += Q) {
                    const float *row = xc + (size_t)(p * st - s->pad + kr) * s->W;
                    for (int q = 0; q < qlo; q++)
                        d[q] = 0.0f;
                    if (st == 1) {
                        if (qhi > qlo)
                            memcpy(d + qlo, row + qlo + off, sizeof(float) * (size_t)(qhi - qlo));
                    } else {
                        for (int q = qlo; q < qhi; q++)
                            d[q] = row[q * st + off];
                    }
                    for (int q = qhi; q < Q; q++)
                        d[q] = 0.0f;
                }
            }
        }
    }
}

DT_CPU_CLONES
static void add_run(float *dst, const float *src, long n)
{
    for (long i = 0; i < n; i++)
        dst[i] += src[i];
}

/* dx (C,H,W) += col2im of col (CRS, (p1-p0)*Q) for output rows [p0,p1). Modifies col (zeroes
 * the entries that fall off the image edges). */
static void col2im_acc(float *dx, float *col, const dt_conv2d_shape *s, int p0, int p1)
{
    const int Q = s->Q, jn = (p1 - p0) * Q, st = s->stride;
    const bool same = conv_same_width(s);
    const long plane = (long)s->H * s->W;
    for (int ch = 0; ch < s->C; ch++) {
        float *dxc = dx + (size_t)ch * plane;
        for (int kr = 0; kr < s->R; kr++) {
            int pa, pb;
            valid_p(s, kr, p0, p1, &pa, &pb);
            if (pa >= pb)
                continue;
            for (int ks = 0; ks < s->S; ks++) {
                float *src = col + ((size_t)(ch * s->R + kr) * s->S + ks) * jn +
                             (size_t)(pa - p0) * Q;
                int qlo, qhi;
                valid_q(s, ks, &qlo, &qhi);
                const int off = ks - s->pad; /* input column = q*stride + off */
                if (same) {
                    float *c = src;
                    for (int p = pa; p < pb; p++, c += Q) { /* drop the off-edge columns */
                        for (int q = 0; q < qlo; q++)
                            c[q] = 0.0f;
                        for (int q = qhi; q < Q; q++)
                            c[q] = 0.0f;
                    }
                    long i0 = (long)(pa - s->pad + kr) * s->W + off, len = (long)(pb - pa) * Q;
                    long lo = i0 < 0 ? -i0 : 0, hi = len < plane - i0 ? len : plane - i0;
                    add_run(dxc + i0 + lo, src + lo, hi - lo);
                    continue;
                }
                for (int p = pa; p < pb; p++, src += Q) {
                    float *row = dxc + (size_t)(p * st - s->pad + kr) * s->W;
                    if (st == 1) {
                        for (int q = qlo; q < qhi; q++)
                            row[q + off] += src[q];
                    } else {
                        for (int q = qlo; q < qhi; q++)
                            row[q * st + off] += src[q];
                    }
                }
            }
        }
    }
}

/* Output rows per chunk so that the (CRS, rows*Q) scratch fits; 0 when even one row does not. */
static int conv_chunk_rows(dt_cpu *c, const dt_conv2d_shape *s)
{
    size_t crs = (size_t)s->C * s->R * s->S;
    size_t row = crs * (size_t)s->Q;
    int rows = (int)DT_MIN((size_t)s->P, DT_MAX((size_t)1, CONV_SCRATCH_TARGET / row));
    while (rows > 0 && !dt_cpu_scratch_reserve(c, row * (size_t)rows))
        rows /= 2;
    if (rows == 0)
        DT_ERROR("cpu conv2d: cannot allocate %zu bytes of im2col scratch; using the direct "
                 "(slow) convolution",
                 row * sizeof(float));
    return rows;
}

static bool conv_is_pointwise(const dt_conv2d_shape *s)
{
    return s->R == 1 && s->S == 1 && s->stride == 1 && s->pad == 0;
}

/* The direct convolution, used only when the scratch cannot be allocated. */
static void conv_direct_fwd(float *y, const float *x, const float *w, const dt_conv2d_shape *s)
{
    for (int k = 0; k < s->K; k++)
        for (int p = 0; p < s->P; p++)
            for (int q = 0; q < s->Q; q++) {
                float acc = 0.0f;
                for (int ch = 0; ch < s->C; ch++)
                    for (int kr = 0; kr < s->R; kr++)
                        for (int ks = 0; ks < s->S; ks++) {
                            int ih = p * s->stride - s->pad + kr, iw = q * s->stride - s->pad + ks;
                            if (ih >= 0 && ih < s->H && iw >= 0 && iw < s->W)
                                acc += w[((size_t)(k * s->C + ch) * s->R + kr) * s->S + ks] *
                                       x[((size_t)ch * s->H + ih) * s->W + iw];
                        }
                y[((size_t)k * s->P + p) * s->Q + q] += acc;
            }
}

static void conv_direct_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                            const dt_conv2d_shape *s)
{
    for (int k = 0; k < s->K; k++)
        for (int p = 0; p < s->P; p++)
            for (int q = 0; q < s->Q; q++) {
                float g = dy[((size_t)k * s->P + p) * s->Q + q];
                for (int ch = 0; ch < s->C; ch++)
                    for (int kr = 0; kr < s->R; kr++)
                        for (int ks = 0; ks < s->S; ks++) {
                            int ih = p * s->stride - s->pad + kr, iw = q * s->stride - s->pad + ks;
                            if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W)
                                continue;
                            size_t wi = ((size_t)(k * s->C + ch) * s->R + kr) * s->S + ks;
                            size_t xi = ((size_t)ch * s->H + ih) * s->W + iw;
                            if (dw)
                                dw[wi] += g * x[xi];
                            if (dx)
                                dx[xi] += g * w[wi];
                        }
            }
}

void dt_cpu_conv2d_fwd(dt_backend *be, float *out, const float *inp, const float *w,
                       const float *bias, const dt_conv2d_shape *s)
{
    dt_cpu *c = dt_cpu_of(be);
    const int PQ = s->P * s->Q, CRS = s->C * s->R * s->S;
    const size_t in_sz = (size_t)s->C * s->H * s->W, out_sz = (size_t)s->K * PQ;
    double t_start = dt_cpu_prof_now(c), t_side = 0, flops = 0;
    bool pointwise = conv_is_pointwise(s);
    int rows = pointwise ? s->P : conv_chunk_rows(c, s);
    for (int n = 0; n < s->N; n++) {
        const float *x = inp + n * in_sz;
        float *y = out + n * out_sz; // (K, PQ)
        double t0 = dt_cpu_prof_now(c);
        /* With a bias, y starts as the bias and the GEMMs add to it (beta 1); without, the
         * GEMMs (each chunk writes its own columns) or the direct loop set it. */
        if (bias)
            for (int k = 0; k < s->K; k++)
                for (int j = 0; j < PQ; j++)
                    y[(size_t)k * PQ + j] = bias[k];
        else if (!pointwise && rows == 0)
            memset(y, 0, sizeof(float) * out_sz);
        if (c->prof_on)
            t_side += dt_cpu_prof_now(c) - t0;
        const float beta = bias ? 1.0f : 0.0f;
        if (pointwise) { // y (K,PQ) (+)= w (K,C) @ x (C,PQ)
            sgemm(false, false, s->K, PQ, s->C, 1.0f, w, s->C, x, PQ, beta, y, PQ);
        } else if (rows == 0) {
            conv_direct_fwd(y, x, w, s);
        } else {
            for (int p0 = 0; p0 < s->P; p0 += rows) {
                int p1 = DT_MIN(s->P, p0 + rows), jn = (p1 - p0) * s->Q;
                t0 = dt_cpu_prof_now(c);
                im2col(c->scratch, x, s, p0, p1);
                if (c->prof_on)
                    t_side += dt_cpu_prof_now(c) - t0;
                // y[:, p0*Q : p1*Q] (+)= w (K,CRS) @ col (CRS,jn)
                sgemm(false, false, s->K, jn, CRS, 1.0f, w, CRS, c->scratch, jn, beta,
                      y + (size_t)p0 * s->Q, PQ);
            }
        }
        flops += 2.0 * s->K * (double)CRS * PQ;
    }
    if (c->prof_on) {
        double total = dt_cpu_prof_now(c) - t_start;
        c->stats[DT_CPU_OP_CONV_FWD].calls++;
        c->stats[DT_CPU_OP_CONV_FWD].seconds += total - t_side;
        c->stats[DT_CPU_OP_CONV_FWD].flops += flops;
        c->stats[DT_CPU_OP_CONV_IM2COL].calls++;
        c->stats[DT_CPU_OP_CONV_IM2COL].seconds += t_side;
    }
}

void dt_cpu_conv2d_bwd(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, const dt_conv2d_shape *s)
{
    dt_cpu *c = dt_cpu_of(be);
    const int PQ = s->P * s->Q, CRS = s->C * s->R * s->S;
    const size_t in_sz = (size_t)s->C * s->H * s->W, out_sz = (size_t)s->K * PQ;
    double t_start = dt_cpu_prof_now(c), t_side = 0, flops = 0;
    bool pointwise = conv_is_pointwise(s);
    int rows = (pointwise || (!dinp && !dw)) ? s->P : conv_chunk_rows(c, s);
    for (int n = 0; n < s->N; n++) {
        const float *x = inp + n * in_sz;
        const float *dy = dout + n * out_sz; // (K, PQ)
        float *dx = dinp ? dinp + n * in_sz : NULL;
        if (dbias) {
            double t0 = dt_cpu_prof_now(c);
            for (int k = 0; k < s->K; k++)
                dbias[k] += (float)dt_cpu_sum(dy + (size_t)k * PQ, PQ);
            if (c->prof_on)
                t_side += dt_cpu_prof_now(c) - t0;
        }
        if (pointwise) {
            if (dw) // dw (K,C) += dy (K,PQ) @ x^T (PQ,C)
                sgemm(false, true, s->K, s->C, PQ, 1.0f, dy, PQ, x, PQ, 1.0f, dw, s->C);
            if (dx) // dx (C,PQ) += w^T (C,K) @ dy (K,PQ)
                sgemm(true, false, s->C, PQ, s->K, 1.0f, w, s->C, dy, PQ, 1.0f, dx, PQ);
        } else if (rows == 0) {
            conv_direct_bwd(dx, dw, dy, x, w, s);
        } else if (dw || dx) {
            for (int p0 = 0; p0 < s->P; p0 += rows) {
                int p1 = DT_MIN(s->P, p0 + rows), jn = (p1 - p0) * s->Q;
                const float *dyc = dy + (size_t)p0 * s->Q; // (K, jn) ld PQ
                if (dw) {
                    double t0 = dt_cpu_prof_now(c);
                    im2col(c->scratch, x, s, p0, p1);
                    if (c->prof_on)
                        t_side += dt_cpu_prof_now(c) - t0;
                    // dw (K,CRS) += dy (K,jn) @ col^T (jn,CRS)
                    sgemm(false, true, s->K, CRS, jn, 1.0f, dyc, PQ, c->scratch, jn, 1.0f, dw,
                          CRS);
                }
                if (dx) {
                    // col (CRS,jn) = w^T (CRS,K) @ dy (K,jn)
                    sgemm(true, false, CRS, jn, s->K, 1.0f, w, CRS, dyc, PQ, 0.0f, c->scratch,
                          jn);
                    double t0 = dt_cpu_prof_now(c);
                    col2im_acc(dx, c->scratch, s, p0, p1);
                    if (c->prof_on)
                        t_side += dt_cpu_prof_now(c) - t0;
                }
            }
        }
        flops += ((dw ? 2.0 : 0.0) + (dx ? 2.0 : 0.0)) * s->K * (double)CRS * PQ;
    }
    if (c->prof_on) {
        double total = dt_cpu_prof_now(c) - t_start;
        c->stats[DT_CPU_OP_CONV_BWD].calls++;
        c->stats[DT_CPU_OP_CONV_BWD].seconds += total - t_side;
        c->stats[DT_CPU_OP_CONV_BWD].flops += flops;
        c->stats[DT_CPU_OP_CONV_IM2COL].calls++;
        c->stats[DT_CPU_OP_CONV_IM2COL].seconds += t_side;
    }
}
