// gemm.cu - the GEMM-bound ops of the CUDA backend: matmul, attention, conv2d.
//
// Row-major tensors meet column-major cuBLAS through the usual identity: a row-major (R,C)
// matrix is a column-major (C,R) one, so out = inp @ w^T is computed as out^T = w^T... in
// column-major terms (see each call). One helper, gemm(), runs every GEMM: cuBLASLt first (bias
// epilogue, alignment-aware heuristics), cuBLAS GemmEx as the fallback when cuBLASLt offers no
// algorithm for the shape or alignment. Precision is applied there (cuda_internal.h).
//
// Attention follows llm.c's cuBLAS version: q, k, v are permuted into (B,NH,T,hs), scores come
// from one strided-batched GEMM straight into `att`, a causal softmax runs in place, and a second
// batched GEMM gives y. The probabilities stay in `att` and backward reads them, so backward
// needs no recomputation; the price is O(T^2) memory traffic, which a fused (flash) kernel would
// avoid. In bf16/fp16 convert mode everything (B,NH,T,T) is stored in 16 bits (see the attention
// section: a documented deviation from the header's float `att`).
//
// Convolutions use cuDNN's convolution API (heuristic algorithm choice, cached per shape);
// backward accumulates through cuDNN's beta = 1.
#include <math.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "kernels/cuda/cuda_internal.h"

// =============================================================================================
// the GEMM helper
// =============================================================================================

// C (m,n; column-major, ldc) = alpha * op(A) @ op(B) + beta * C (+ bias (m) per column when bias
// is set). op(A) is (m,k), op(B) is (k,n). Batched when batch > 1 with element strides sA, sB,
// sC. A16/B16, when set, are the operands already converted to the 16-bit type (convert mode);
// c16 (convert mode only) makes C itself 16-bit (fp32 accumulation, rounded on store).
typedef struct gemm_desc {
    bool ta, tb;
    int m, n, k;
    const float *A;
    int lda;
    long long sA;
    const float *B;
    int ldb;
    long long sB;
    void *C;
    int ldc;
    long long sC;
    int batch;
    float alpha, beta;
    const float *bias;
    const void *A16, *B16;
    bool c16;
} gemm_desc;

static bool half_mode(const dt_cuda *cu) { return cu->precision != DT_PREC_FP32; }
static bool convert_mode(const dt_cuda *cu) { return half_mode(cu) && cu->gemm_convert; }

// Elements spanned by a stored column-major operand (rows x cols, leading dimension ld).
static size_t footprint(int rows, int cols, int ld, long long stride, int batch)
{
    size_t one = (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
    return batch > 1 ? (size_t)stride * (size_t)(batch - 1) + one : one;
}

// Converts n floats into scratch `slot` in the 16-bit GEMM type; NULL after a failure.
static const void *to16(dt_cuda *cu, int slot, const float *x, size_t n)
{
    void *dst = dt_cuda_scratch(cu, slot, n * 2);
    if (!dst)
        return NULL;
    dt_cuda_to_half(cu, dst, x, n, 1.0f, cu->precision == DT_PREC_BF16);
    return dst;
}

static uint32_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0)
        al >>= 1;
    return al;
}

// cuBLASLt attempt; false when it offers no algorithm (not an error: the caller falls back).
static bool gemm_lt(dt_cuda *cu, const gemm_desc *g, cudaDataType_t abt, cudaDataType_t cty,
                    cublasComputeType_t ct, const void *A, const void *B)
{
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int nres = 0;
    bool ok = false;
    cublasOperation_t opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ra = g->ta ? g->k : g->m, ca = g->ta ? g->m : g->k;
    int rb = g->tb ? g->n : g->k, cb = g->tb ? g->k : g->n;
    uint64_t ws = cu->lt_ws_bytes;
    uint32_t al_a = align_of(A), al_b = align_of(B), al_c = align_of(g->C);
    memset(&heur, 0, sizeof heur);

#define LT(call)                                                                                   \
    do {                                                                                           \
        if ((call) != CUBLAS_STATUS_SUCCESS)                                                       \
            goto done;                                                                             \
    } while (0)
    LT(cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (g->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                          sizeof g->bias));
        uint32_t al_bias = align_of(g->bias);
        if (al_bias < al_c)
            al_c = al_bias; // no separate preference for the bias vector: be conservative
    }
    LT(cublasLtMatrixLayoutCreate(&la, abt, (uint64_t)ra, (uint64_t)ca, g->lda));
    LT(cublasLtMatrixLayoutCreate(&lb, abt, (uint64_t)rb, (uint64_t)cb, g->ldb));
    LT(cublasLtMatrixLayoutCreate(&lc, cty, (uint64_t)g->m, (uint64_t)g->n, g->ldc));
    if (g->batch > 1) {
        int32_t bc = g->batch;
        int64_t sa = g->sA, sb = g->sB, sc = g->sC;
        LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa,
                                            sizeof sa));
        LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb,
                                            sizeof sb));
        LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc,
                                            sizeof sc));
    }
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                            &al_a, sizeof al_a));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                            &al_b, sizeof al_b));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                            &al_c, sizeof al_c));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                            &al_c, sizeof al_c));
    {
        // The heuristic query costs tens of microseconds of host time, and a GPT step makes
        // hundreds of GEMMs of a few dozen shapes: ask once per problem.
        dt_cu_lt_key key;
        memset(&key, 0, sizeof key);
        key.ct = (int)ct, key.abt = (int)abt, key.cty = (int)cty, key.opa = (int)opa;
        key.opb = (int)opb, key.m = g->m, key.n = g->n, key.k = g->k, key.batch = g->batch;
        key.bias = g->bias != NULL, key.lda = g->lda, key.ldb = g->ldb, key.ldc = g->ldc;
        if (g->batch > 1)
            key.sA = g->sA, key.sB = g->sB, key.sC = g->sC;
        key.al_a = al_a, key.al_b = al_b, key.al_c = al_c;
        const dt_cu_lt_algo *hit = NULL;
        for (int i = 0; i < cu->lt_cache_n && !hit; i++)
            if (!memcmp(&cu->lt_cache[i].key, &key, sizeof key))
                hit = &cu->lt_cache[i];
        if (!hit) {
            LT(cublasLtMatmulAlgoGetHeuristic(cu->lt, desc, la, lb, lc, lc, pref, 1, &heur,
                                              &nres));
            dt_cu_lt_algo a;
            memset(&a, 0, sizeof a);
            a.key = key;
            a.found = nres >= 1 && heur.state == CUBLAS_STATUS_SUCCESS;
            a.algo = heur.algo;
            if (cu->lt_cache_n < DT_CU_LT_CACHE) // full: ask every time from then on
                cu->lt_cache[cu->lt_cache_n++] = a;
            if (!a.found)
                goto done;
        } else if (!hit->found) {
            goto done;
        } else {
            heur.algo = hit->algo;
        }
    }
    LT(cublasLtMatmul(cu->lt, desc, &g->alpha, A, la, B, lb, &g->beta, g->C, lc, g->C, lc,
                      &heur.algo, cu->lt_ws, cu->lt_ws_bytes, cu->stream));
    ok = true;
#undef LT
done:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (desc)
        cublasLtMatmulDescDestroy(desc);
    return ok;
}

static void gemm(dt_cuda *cu, const gemm_desc *g)
{
    if (cu->failed || g->m <= 0 || g->n <= 0 || g->k <= 0 || g->batch <= 0)
        return;
    cudaDataType_t abt = CUDA_R_32F, cty = CUDA_R_32F;
    cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    const void *A = g->A, *B = g->B;
    if (!half_mode(cu)) {
        if (cu->tf32)
            ct = CUBLAS_COMPUTE_32F_FAST_TF32;
    } else if (cu->gemm_convert) {
        bool bf = cu->precision == DT_PREC_BF16;
        abt = bf ? CUDA_R_16BF : CUDA_R_16F;
        int ra = g->ta ? g->k : g->m, ca = g->ta ? g->m : g->k;
        int rb = g->tb ? g->n : g->k, cb = g->tb ? g->k : g->n;
        A = g->A16 ? g->A16
                   : to16(cu, DT_CU_SCR_GEMM_A, g->A, footprint(ra, ca, g->lda, g->sA, g->batch));
        B = g->B16 ? g->B16
                   : to16(cu, DT_CU_SCR_GEMM_B, g->B, footprint(rb, cb, g->ldb, g->sB, g->batch));
        if (!A || !B)
            return;
        if (g->c16)
            cty = abt;
    } else {
        ct = cu->precision == DT_PREC_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                           : CUBLAS_COMPUTE_32F_FAST_16F;
    }
    if (g->c16 && cty == CUDA_R_32F) { // a 16-bit C outside convert mode: a programming error
        dt_cuda_note(cu, false, "gemm", "16-bit output requested outside convert mode", __FILE__,
                     __LINE__);
        return;
    }
    // cuBLASLt's alignment preferences do not cover the bias pointer: a fused-bias kernel may
    // assume 16 bytes and fault on a parameter slice aligned to 4 (PyTorch hit this), so such a
    // bias takes the cuBLAS path below.
    if ((!g->bias || align_of(g->bias) >= 16) && gemm_lt(cu, g, abt, cty, ct, A, B))
        return;
    // Fallback: cuBLAS picks a kernel for any alignment; the bias goes on separately.
    cublasOperation_t opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (g->batch > 1)
        DT_CUBLAS_CHECK(cu, cublasGemmStridedBatchedEx(cu->cublas, opa, opb, g->m, g->n, g->k,
                                                       &g->alpha, A, abt, g->lda, g->sA, B, abt,
                                                       g->ldb, g->sB, &g->beta, g->C, cty,
                                                       g->ldc, g->sC, g->batch, ct,
                                                       CUBLAS_GEMM_DEFAULT));
    else
        DT_CUBLAS_CHECK(cu, cublasGemmEx(cu->cublas, opa, opb, g->m, g->n, g->k, &g->alpha, A, abt,
                                         g->lda, B, abt, g->ldb, &g->beta, g->C, cty,
                                         g->ldc, ct, CUBLAS_GEMM_DEFAULT));
    if (g->bias) // C is (m,n) column-major with ldc == m: row-major (n,m), bias per column
        dt_cuda_colbias_add(cu, (float *)g->C, g->bias, g->n, g->m);
}

// =============================================================================================
// matmul
// =============================================================================================

void dt_cuda_matmul_fwd(dt_backend *be, float *out, const float *inp, const float *w,
                        const float *bias, int N, int C, int OC)
{
    DT_CU_BEGIN(be);
    // out^T (OC,N) = w (OC,C) @ inp^T (C,N): w is column-major (C,OC), so transposed.
    gemm_desc g = {};
    g.ta = true;
    g.tb = false;
    g.m = OC;
    g.n = N;
    g.k = C;
    g.A = w;
    g.lda = C;
    g.B = inp;
    g.ldb = C;
    g.C = out;
    g.ldc = OC;
    g.batch = 1;
    g.alpha = 1.0f;
    g.beta = 0.0f;
    g.bias = bias;
    gemm(cu, &g);
    DT_CU_END(DT_CU_OP_MATMUL_FWD, 2.0 * N * C * OC);
}

void dt_cuda_matmul_bwd(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, int N, int C, int OC)
{
    DT_CU_BEGIN(be);
    double flops = 0;
    // dout is an operand of both GEMMs: convert it once.
    const void *dout16 = NULL;
    if (convert_mode(cu) && (dinp || dw)) {
        dout16 = to16(cu, DT_CU_SCR_GEMM_C, dout, (size_t)N * OC);
        if (!dout16)
            goto out;
    }
    if (dinp) {
        // dinp^T (C,N) += w^T (C,OC) @ dout^T (OC,N): both stored that way already.
        gemm_desc g = {};
        g.m = C;
        g.n = N;
        g.k = OC;
        g.A = w;
        g.lda = C;
        g.B = dout;
        g.ldb = OC;
        g.B16 = dout16;
        g.C = dinp;
        g.ldc = C;
        g.batch = 1;
        g.alpha = 1.0f;
        g.beta = 1.0f;
        gemm(cu, &g);
        flops += 2.0 * N * C * OC;
    }
    if (dw) {
        // dw^T (C,OC) += inp^T (C,N) @ dout (N,OC): dout is stored (OC,N), so transposed.
        gemm_desc g = {};
        g.tb = true;
        g.m = C;
        g.n = OC;
        g.k = N;
        g.A = inp;
        g.lda = C;
        g.B = dout;
        g.ldb = OC;
        g.B16 = dout16;
        g.C = dw;
        g.ldc = C;
        g.batch = 1;
        g.alpha = 1.0f;
        g.beta = 1.0f;
        gemm(cu, &g);
        flops += 2.0 * N * C * OC;
    }
    if (dbias)
        dt_cuda_colsum_acc(cu, dbias, dout, N, OC);
out:
    DT_CU_END(DT_CU_OP_MATMUL_BWD, flops);
}

// =============================================================================================
// attention
// =============================================================================================
//
// Two storage modes, one algorithm:
//   fp32 (precision fp32, or DTRAIN_CUDA_GEMM=fast): q, k, v, the scores and `att` are float32,
//     exactly the header's contract (att holds the float probabilities).
//   16-bit (bf16/fp16 in convert mode): q, k, v are permuted straight into bf16/fp16, the score
//     GEMM writes 16-bit scores into the `att` buffer, the softmax runs in place there, and the
//     probabilities stay in `att` as 16-bit values (the first half of its bytes) for backward;
//     `datt` likewise holds 16-bit gradients. This deviates from the header's "att holds float
//     probabilities" on purpose: the (B,NH,T,T) traffic dominates attention at T = 1024, and this
//     halves it and removes four conversion passes. Only attention_bwd of the same backend reads
//     att, so nothing else notices (the GPU tests compare att only in fp32).

__device__ static inline float to_f(float x) { return x; }
__device__ static inline float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ static inline float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ static inline T from_f(float x);
template <> __device__ inline float from_f<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 from_f<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __device__ inline __half from_f<__half>(float x) { return __float2half_rn(x); }

// qkv (B,T,3,NH,hs) -> q, k, v (B,NH,T,hs) each, stored as T.
template <typename T>
__global__ static void attn_permute_kernel(T *__restrict__ q, T *__restrict__ k,
                                           T *__restrict__ v, const float *__restrict__ qkv,
                                           int B, int Tn, int NH, int hs)
{
    size_t n = (size_t)B * NH * Tn * hs;
    int C = NH * hs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        int t = (int)((i / hs) % Tn);
        int h = (int)((i / ((size_t)hs * Tn)) % NH);
        int b = (int)(i / ((size_t)hs * Tn * NH));
        const float *src = qkv + ((size_t)b * Tn + t) * 3 * C + (size_t)h * hs + d;
        q[i] = from_f<T>(src[0]);
        k[i] = from_f<T>(src[C]);
        v[i] = from_f<T>(src[2 * C]);
    }
}

// dqkv (B,T,3,NH,hs) += dq, dk, dv (B,NH,T,hs).
__global__ static void attn_permute_bwd_kernel(float *__restrict__ dqkv,
                                               const float *__restrict__ dq,
                                               const float *__restrict__ dk,
                                               const float *__restrict__ dv, int B, int Tn, int NH,
                                               int hs)
{
    size_t n = (size_t)B * NH * Tn * hs;
    int C = NH * hs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        int t = (int)((i / hs) % Tn);
        int h = (int)((i / ((size_t)hs * Tn)) % NH);
        int b = (int)(i / ((size_t)hs * Tn * NH));
        float *dst = dqkv + ((size_t)b * Tn + t) * 3 * C + (size_t)h * hs + d;
        dst[0] += dq[i];
        dst[C] += dk[i];
        dst[2 * C] += dv[i];
    }
}

// out (B,T,NH,hs) = y (B,NH,T,hs).
__global__ static void attn_unpermute_kernel(float *__restrict__ out, const float *__restrict__ y,
                                             int B, int Tn, int NH, int hs)
{
    size_t n = (size_t)B * NH * Tn * hs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        int t = (int)((i / hs) % Tn);
        int h = (int)((i / ((size_t)hs * Tn)) % NH);
        int b = (int)(i / ((size_t)hs * Tn * NH));
        out[(((size_t)b * Tn + t) * NH + h) * hs + d] = y[i];
    }
}

// dy (B,NH,T,hs), stored as T, = dout (B,T,NH,hs).
template <typename T>
__global__ static void attn_unpermute_bwd_kernel(T *__restrict__ dy,
                                                 const float *__restrict__ dout, int B, int Tn,
                                                 int NH, int hs)
{
    size_t n = (size_t)B * NH * Tn * hs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        int t = (int)((i / hs) % Tn);
        int h = (int)((i / ((size_t)hs * Tn)) % NH);
        int b = (int)(i / ((size_t)hs * Tn * NH));
        dy[i] = from_f<T>(dout[(((size_t)b * Tn + t) * NH + h) * hs + d]);
    }
}

// Merges two (max, sum of exp(x - max)) pairs.
__device__ static inline void softmax_merge(float &m, float &s, float om, float os)
{
    float nm = fmaxf(m, om);
    float a = (m == -INFINITY) ? 0.0f : s * expf(m - nm);
    float b = (om == -INFINITY) ? 0.0f : os * expf(om - nm);
    m = nm;
    s = a + b;
}

// In place over rows of (BH, T, T): row t keeps softmax over columns 0..t, zeros above.
// One warp per row. Scores are already scaled (the GEMM's alpha).
template <typename T>
__global__ static void attn_softmax_fwd_kernel(T *att, int BH, int Tn)
{
    int warps = blockDim.x / 32;
    size_t row = (size_t)blockIdx.x * warps + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)BH * Tn)
        return;
    int t = (int)(row % Tn);
    T *x = att + row * Tn;
    float m = -INFINITY, s = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        float v = to_f(x[j]);
        if (v > m) {
            s = (m == -INFINITY) ? 1.0f : s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        float om = __shfl_xor_sync(0xffffffffu, m, off);
        float os = __shfl_xor_sync(0xffffffffu, s, off);
        softmax_merge(m, s, om, os);
    }
    float inv = 1.0f / s;
    for (int j = lane; j < Tn; j += 32)
        x[j] = from_f<T>(j <= t ? expf(to_f(x[j]) - m) * inv : 0.0f);
}

// In place: d[t,j] = scale * p[t,j] * (d[t,j] - sum_u p[t,u] d[t,u]) for j <= t, 0 above.
template <typename T>
__global__ static void attn_softmax_bwd_kernel(T *d, const T *p, int BH, int Tn, float scale)
{
    int warps = blockDim.x / 32;
    size_t row = (size_t)blockIdx.x * warps + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)BH * Tn)
        return;
    int t = (int)(row % Tn);
    T *dr = d + row * Tn;
    const T *pr = p + row * Tn;
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += to_f(pr[j]) * to_f(dr[j]);
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    for (int j = lane; j < Tn; j += 32)
        dr[j] = from_f<T>(j <= t ? scale * to_f(pr[j]) * (to_f(dr[j]) - s) : 0.0f);
}

// The padded bidirectional form (attention_pad): row (bh, t) is the softmax over the columns j
// with mask[b * Tn + j] != 0 (mask NULL: all), 0 elsewhere and everywhere when no column is
// left. One warp per row; b = bh / NH.
template <typename T>
__global__ static void attn_softmax_pad_fwd_kernel(T *att, const int32_t *mask, int BH, int NH,
                                                   int Tn)
{
    int warps = blockDim.x / 32;
    size_t row = (size_t)blockIdx.x * warps + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)BH * Tn)
        return;
    const int32_t *mk = mask ? mask + (size_t)(row / Tn / NH) * Tn : NULL;
    T *x = att + row * Tn;
    float m = -INFINITY, s = 0.0f;
    for (int j = lane; j < Tn; j += 32) {
        if (mk && !mk[j])
            continue;
        float v = to_f(x[j]);
        if (v > m) {
            s = (m == -INFINITY) ? 1.0f : s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        float om = __shfl_xor_sync(0xffffffffu, m, off);
        float os = __shfl_xor_sync(0xffffffffu, s, off);
        softmax_merge(m, s, om, os);
    }
    float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int j = lane; j < Tn; j += 32)
        x[j] = from_f<T>((!mk || mk[j]) && m != -INFINITY ? expf(to_f(x[j]) - m) * inv : 0.0f);
}

// In place over whole rows: d[t,j] = scale * p[t,j] * (d[t,j] - sum_u p[t,u] d[t,u]).
template <typename T>
__global__ static void attn_softmax_full_bwd_kernel(T *d, const T *p, int BH, int Tn, float scale)
{
    int warps = blockDim.x / 32;
    size_t row = (size_t)blockIdx.x * warps + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)BH * Tn)
        return;
    T *dr = d + row * Tn;
    const T *pr = p + row * Tn;
    float s = 0.0f;
    for (int j = lane; j < Tn; j += 32)
        s += to_f(pr[j]) * to_f(dr[j]);
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    for (int j = lane; j < Tn; j += 32)
        dr[j] = from_f<T>(scale * to_f(pr[j]) * (to_f(dr[j]) - s));
}

// pad: the padded bidirectional softmax (mask may be NULL) instead of the causal one.
template <typename T>
static void softmax_fwd_launch(dt_cuda *cu, T *att, int BH, int Tn, bool pad,
                               const int32_t *mask, int NH)
{
    const int threads = 256, warps = threads / 32;
    size_t rows = (size_t)BH * Tn;
    unsigned blocks = (unsigned)((rows + warps - 1) / warps);
    if (pad)
        attn_softmax_pad_fwd_kernel<T><<<blocks, threads, 0, cu->stream>>>(att, mask, BH, NH, Tn);
    else
        attn_softmax_fwd_kernel<T><<<blocks, threads, 0, cu->stream>>>(att, BH, Tn);
    DT_CU_LAUNCHED(cu);
}

template <typename T>
static void softmax_bwd_launch(dt_cuda *cu, T *d, const T *p, int BH, int Tn, float scale,
                               bool pad)
{
    const int threads = 256, warps = threads / 32;
    size_t rows = (size_t)BH * Tn;
    unsigned blocks = (unsigned)((rows + warps - 1) / warps);
    if (pad)
        attn_softmax_full_bwd_kernel<T><<<blocks, threads, 0, cu->stream>>>(d, p, BH, Tn, scale);
    else
        attn_softmax_bwd_kernel<T><<<blocks, threads, 0, cu->stream>>>(d, p, BH, Tn, scale);
    DT_CU_LAUNCHED(cu);
}

// One batched GEMM over the B*NH heads; all operands (T,hs) or (T,T) per head. In 16-bit mode
// A and B are the 16-bit tensors (passed as A16/B16) and C may be 16-bit (c16).
static void head_gemm(dt_cuda *cu, bool ta, bool tb, int m, int n, int k, const void *A, int lda,
                      long long sA, const void *B, int ldb, long long sB, void *C, bool c16,
                      int ldc, long long sC, int batch, float alpha, bool in16)
{
    gemm_desc g = {};
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = lda;
    g.sA = sA;
    g.ldb = ldb;
    g.sB = sB;
    if (in16) {
        g.A16 = A;
        g.B16 = B;
    } else {
        g.A = (const float *)A;
        g.B = (const float *)B;
    }
    g.C = C;
    g.c16 = c16;
    g.ldc = ldc;
    g.sC = sC;
    g.batch = batch;
    g.alpha = alpha;
    g.beta = 0.0f;
    gemm(cu, &g);
}

// T: the storage type (float, __nv_bfloat16, __half). See the section comment. pad: the
// bidirectional form with a key padding mask (attention_pad_fwd; mask may be NULL), else causal.
template <typename T>
static void attention_fwd_t(dt_cuda *cu, float *out, float *att_buf, const float *qkv, int B,
                            int Tn, int C, int NH, bool pad = false, const int32_t *mask = NULL)
{
    const bool s16 = sizeof(T) == 2;
    int hs = C / NH, BH = B * NH;
    size_t n = (size_t)B * Tn * C;
    long long sQ = (long long)Tn * hs, sA = (long long)Tn * Tn;
    float scale = 1.0f / sqrtf((float)hs);
    // scratch: y (n floats), then q, k, v (n T each)
    char *scr = (char *)dt_cuda_scratch(cu, DT_CU_SCR_ATTN, n * sizeof(float) + 3 * n * sizeof(T));
    if (!scr)
        return;
    float *y = (float *)scr;
    T *q = (T *)(scr + n * sizeof(float)), *k = q + n, *v = k + n;
    T *att = (T *)att_buf;
    attn_permute_kernel<T><<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(q, k, v, qkv, B, Tn, NH,
                                                                         hs);
    DT_CU_LAUNCHED(cu);
    // Per head: att^T (T,T) = k (T,hs) . q^T, i.e. att[t1][t2] = q[t1].k[t2] * scale.
    head_gemm(cu, true, false, Tn, Tn, hs, k, hs, sQ, q, hs, sQ, att, s16, Tn, sA, BH, scale, s16);
    softmax_fwd_launch<T>(cu, att, BH, Tn, pad, mask, NH);
    // y^T (hs,T) = v^T (hs,T) @ att^T: y = att @ v.
    head_gemm(cu, false, false, hs, Tn, Tn, v, hs, sQ, att, Tn, sA, y, false, hs, sQ, BH, 1.0f,
              s16);
    attn_unpermute_kernel<<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(out, y, B, Tn, NH, hs);
    DT_CU_LAUNCHED(cu);
}

template <typename T>
static void attention_bwd_t(dt_cuda *cu, float *dqkv, float *datt_buf, const float *dout,
                            const float *qkv, const float *att_buf, int B, int Tn, int C, int NH,
                            bool pad = false)
{
    const bool s16 = sizeof(T) == 2;
    int hs = C / NH, BH = B * NH;
    size_t n = (size_t)B * Tn * C;
    long long sQ = (long long)Tn * hs, sA = (long long)Tn * Tn;
    float scale = 1.0f / sqrtf((float)hs);
    // scratch: dq, dk, dv (n floats each), then q, k, v, dy (n T each)
    char *scr =
        (char *)dt_cuda_scratch(cu, DT_CU_SCR_ATTN, 3 * n * sizeof(float) + 4 * n * sizeof(T));
    if (!scr)
        return;
    float *dq = (float *)scr, *dk = dq + n, *dv = dk + n;
    T *q = (T *)(scr + 3 * n * sizeof(float)), *k = q + n, *v = k + n, *dy = v + n;
    const T *att = (const T *)att_buf;
    T *datt = (T *)datt_buf;
    attn_permute_kernel<T><<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(q, k, v, qkv, B, Tn, NH,
                                                                         hs);
    DT_CU_LAUNCHED(cu);
    attn_unpermute_bwd_kernel<T><<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(dy, dout, B, Tn,
                                                                               NH, hs);
    DT_CU_LAUNCHED(cu);
    // datt = dy @ v^T (per head): datt^T (T,T) = v (T,hs) . dy^T.
    head_gemm(cu, true, false, Tn, Tn, hs, v, hs, sQ, dy, hs, sQ, datt, s16, Tn, sA, BH, 1.0f,
              s16);
    // dv = att^T @ dy: dv^T (hs,T) = dy^T (hs,T) @ att (T,T).
    head_gemm(cu, false, true, hs, Tn, Tn, dy, hs, sQ, att, Tn, sA, dv, false, hs, sQ, BH, 1.0f,
              s16);
    // dpreatt (scaled), in place in datt.
    softmax_bwd_launch<T>(cu, datt, att, BH, Tn, scale, pad);
    // dq = dpre @ k: dq^T (hs,T) = k^T (hs,T) @ dpre^T.
    head_gemm(cu, false, false, hs, Tn, Tn, k, hs, sQ, datt, Tn, sA, dq, false, hs, sQ, BH, 1.0f,
              s16);
    // dk = dpre^T @ q: dk^T (hs,T) = q^T (hs,T) @ dpre.
    head_gemm(cu, false, true, hs, Tn, Tn, q, hs, sQ, datt, Tn, sA, dk, false, hs, sQ, BH, 1.0f,
              s16);
    attn_permute_bwd_kernel<<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(dqkv, dq, dk, dv, B, Tn,
                                                                          NH, hs);
    DT_CU_LAUNCHED(cu);
}

// ---- flash attention (opt-in: DTRAIN_CUDA_ATTN=flash) ----------------------------------------
//
// FlashAttention-2 style kernels for the 16-bit convert modes and head size 64: tiles of 64
// queries x 64 keys, tensor cores through WMMA (16x16x16, fp32 accumulation), online softmax,
// causal tiles skipped. Nothing (B,NH,T,T) is materialised. What backward needs is saved in the
// `att` buffer instead of probabilities: the row log-sum-exp (B,NH,T) floats, then (from a
// 256-byte boundary) the output O (B,NH,T,hs) in 16 bits. Backward recomputes the scores tile by
// tile (one block per key tile, looping over the query tiles at or below the diagonal), keeps dK
// and dV in shared memory and adds dQ with atomics. Used when hs == 64 and T >= 64; other shapes
// take the cuBLAS path above. Not the default until it has been measured on a GPU.

#define FA_HS 64      // head size
#define FA_TILE 64    // queries and keys per tile
#define FA_THREADS 128 // 4 warps x 16 query rows

namespace wmma = nvcuda::wmma;

template <typename T>
using fa_frag_a_row = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using fa_frag_a_col = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T>
using fa_frag_b_row = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using fa_frag_b_col = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using fa_frag_acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// dst (64 x 64, shared) = rows row0.. of src (rows x 64, global), zero rows past `rows`.
template <typename T>
__device__ static inline void fa_load_tile(T *dst, const T *src, int row0, int rows)
{
    const uint4 *s = reinterpret_cast<const uint4 *>(src);
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    const int per_row = FA_HS * (int)sizeof(T) / 16; // uint4 per row (8)
    for (int i = threadIdx.x; i < FA_TILE * per_row; i += FA_THREADS) {
        int r = i / per_row, c = i % per_row;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < rows)
            v = s[(size_t)(row0 + r) * per_row + c];
        d[i] = v;
    }
}

// out (16 x 64 fp32, shared, ld 64) = A rows (16 x 64, row-major, ld 64) @ B^T where B is a
// (64 x 64, row-major, ld 64) tile: out[i][j] = sum_d A[i][d] B[j][d].
template <typename T>
__device__ static inline void fa_mm_abt(float *out, const T *A, const T *B)
{
    for (int n = 0; n < FA_TILE / 16; n++) {
        fa_frag_acc acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < FA_HS / 16; kk++) {
            fa_frag_a_row<T> a;
            fa_frag_b_col<T> b;
            wmma::load_matrix_sync(a, A + kk * 16, FA_HS);
            wmma::load_matrix_sync(b, B + (n * 16) * FA_HS + kk * 16, FA_HS);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(out + n * 16, acc, FA_TILE, wmma::mem_row_major);
    }
}

// acc (16 x 64 fp32, shared, ld 64) += A (16 x 64, row-major, ld 64) @ B (64 x 64, row-major).
template <typename T>
__device__ static inline void fa_mm_ab_acc(float *acc_s, const T *A, const T *B, bool zero)
{
    for (int n = 0; n < FA_HS / 16; n++) {
        fa_frag_acc acc;
        if (zero)
            wmma::fill_fragment(acc, 0.0f);
        else
            wmma::load_matrix_sync(acc, acc_s + n * 16, FA_HS, wmma::mem_row_major);
        for (int kk = 0; kk < FA_TILE / 16; kk++) {
            fa_frag_a_row<T> a;
            fa_frag_b_row<T> b;
            wmma::load_matrix_sync(a, A + kk * 16, FA_TILE);
            wmma::load_matrix_sync(b, B + (kk * 16) * FA_HS + n * 16, FA_HS);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(acc_s + n * 16, acc, FA_HS, wmma::mem_row_major);
    }
}

// acc (16 x 64 fp32, shared, ld 64) += A^T (rows col0..col0+15 of the transpose of a 64 x 64
// row-major tile A) @ B (64 x 64 row-major): acc[i][d] += sum_q A[q][col0 + i] B[q][d].
template <typename T>
__device__ static inline void fa_mm_atb_acc(float *acc_s, const T *A, int col0, const T *B)
{
    for (int n = 0; n < FA_HS / 16; n++) {
        fa_frag_acc acc;
        wmma::load_matrix_sync(acc, acc_s + n * 16, FA_HS, wmma::mem_row_major);
        for (int kk = 0; kk < FA_TILE / 16; kk++) {
            fa_frag_a_col<T> a; // element (i, q) at A[q * 64 + col0 + i]
            fa_frag_b_row<T> b;
            wmma::load_matrix_sync(a, A + (kk * 16) * FA_TILE + col0, FA_TILE);
            wmma::load_matrix_sync(b, B + (kk * 16) * FA_HS + n * 16, FA_HS);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(acc_s + n * 16, acc, FA_HS, wmma::mem_row_major);
    }
}

// Shared memory of the forward kernel, in elements of each buffer (all offsets 128-byte aligned).
template <typename T> static size_t fa_fwd_smem(void)
{
    return 3 * FA_TILE * FA_HS * sizeof(T)              // Q, K, V tiles
           + 4 * 16 * FA_TILE * sizeof(float)           // S per warp
           + 4 * 16 * FA_TILE * sizeof(T)               // P per warp
           + 4 * 16 * FA_HS * sizeof(float);            // O per warp
}

// grid (query tiles, B*NH), 128 threads. y (BH,T,64) fp32; o16 (BH,T,64); lse (BH,T).
template <typename T>
__global__ static void __launch_bounds__(FA_THREADS)
    fa_fwd_kernel(float *__restrict__ y, T *__restrict__ o16, float *__restrict__ lse,
                  const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                  int Tn, float scale)
{
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T *Qs = (T *)fa_smem;
    T *Ks = Qs + FA_TILE * FA_HS;
    T *Vs = Ks + FA_TILE * FA_HS;
    float *Ss = (float *)(Vs + FA_TILE * FA_HS);
    T *Ps = (T *)(Ss + 4 * 16 * FA_TILE);
    float *Os = (float *)(Ps + 4 * 16 * FA_TILE);
    int bh = blockIdx.y, q0 = blockIdx.x * FA_TILE;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = lane / 2, c0 = (lane % 2) * 32; // this lane: row r of the warp's 16, 32 columns
    int qi = q0 + warp * 16 + r;
    size_t base = (size_t)bh * Tn * FA_HS;
    float *Sw = Ss + warp * 16 * FA_TILE, *Ow = Os + warp * 16 * FA_HS;
    T *Pw = Ps + warp * 16 * FA_TILE;
    fa_load_tile(Qs, q + base, q0, Tn);
    for (int i = lane; i < 16 * FA_HS; i += 32)
        Ow[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int last = q0 + FA_TILE - 1 < Tn - 1 ? q0 + FA_TILE - 1 : Tn - 1; // last query of the tile
    int nkt = last / FA_TILE + 1;                                     // causal: tiles 0..diag
    for (int kt = 0; kt < nkt; kt++) {
        int k0 = kt * FA_TILE;
        __syncthreads(); // everyone is done with the previous K, V tiles
        fa_load_tile(Ks, k + base, k0, Tn);
        fa_load_tile(Vs, v + base, k0, Tn);
        __syncthreads();
        fa_mm_abt(Sw, Qs + warp * 16 * FA_HS, Ks);
        __syncwarp();
        float mx = -INFINITY;
        for (int c = c0; c < c0 + 32; c++) {
            int kj = k0 + c;
            float s = (kj <= qi && kj < Tn) ? Sw[r * FA_TILE + c] * scale : -INFINITY;
            Sw[r * FA_TILE + c] = s;
            mx = fmaxf(mx, s);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float m_new = fmaxf(m, mx);
        float m_use = m_new == -INFINITY ? 0.0f : m_new; // rows past T see only -inf
        float alpha = m == -INFINITY ? 0.0f : expf(m - m_use);
        float rs = 0.0f;
        for (int c = c0; c < c0 + 32; c++) {
            float p = expf(Sw[r * FA_TILE + c] - m_use);
            Pw[r * FA_TILE + c] = from_f<T>(p);
            rs += p;
        }
        rs += __shfl_xor_sync(0xffffffffu, rs, 1);
        l = l * alpha + rs;
        m = m_new;
        for (int d = c0; d < c0 + 32; d++)
            Ow[r * FA_HS + d] *= alpha;
        __syncwarp();
        fa_mm_ab_acc(Ow, Pw, Vs, false);
        __syncwarp();
    }
    if (qi < Tn) {
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        size_t row = base + (size_t)qi * FA_HS;
        for (int d = c0; d < c0 + 32; d++) {
            float o = Ow[r * FA_HS + d] * inv;
            y[row + d] = o;
            o16[row + d] = from_f<T>(o);
        }
        if (c0 == 0)
            lse[(size_t)bh * Tn + qi] = m + logf(l);
    }
}

// D (rows) = sum_d dO[row][d] * O[row][d]; one warp per row of 64.
template <typename T>
__global__ static void fa_bwd_pre_kernel(float *D, const T *dO, const T *o16, size_t rows)
{
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    const T *a = dO + row * FA_HS, *b = o16 + row * FA_HS;
    float s = to_f(a[lane]) * to_f(b[lane]) + to_f(a[lane + 32]) * to_f(b[lane + 32]);
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0)
        D[row] = s;
}

template <typename T> static size_t fa_bwd_smem(void)
{
    return 4 * FA_TILE * FA_HS * sizeof(T)         // K, V, Q, dO tiles
           + 2 * FA_TILE * FA_HS * sizeof(float)   // dK, dV accumulators
           + 2 * 4 * 16 * FA_TILE * sizeof(float)  // per warp: S/P (fp32), dP/dQ scratch
           + 2 * FA_TILE * FA_TILE * sizeof(T)     // P and dS tiles (16-bit, whole block)
           + 2 * FA_TILE * sizeof(float);          // lse and D of the query tile
}

// grid (key tiles, B*NH), 128 threads. dq (zeroed) += ; dk, dv (BH,T,64) fp32 = .
template <typename T>
__global__ static void __launch_bounds__(FA_THREADS)
    fa_bwd_kernel(float *__restrict__ dq, float *__restrict__ dk, float *__restrict__ dv,
                  const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                  const T *__restrict__ dO, const float *__restrict__ lse,
                  const float *__restrict__ D, int Tn, float scale)
{
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T *Ks = (T *)fa_smem;
    T *Vs = Ks + FA_TILE * FA_HS;
    T *Qs = Vs + FA_TILE * FA_HS;
    T *dOs = Qs + FA_TILE * FA_HS;
    float *dKs = (float *)(dOs + FA_TILE * FA_HS);
    float *dVs = dKs + FA_TILE * FA_HS;
    float *Ws = dVs + FA_TILE * FA_HS;        // per warp 16 x 64: S, then P (fp32)
    float *Wd = Ws + 4 * 16 * FA_TILE;        // per warp 16 x 64: dP, then dQ
    T *Ps = (T *)(Wd + 4 * 16 * FA_TILE);     // 64 x 64
    T *dSs = Ps + FA_TILE * FA_TILE;          // 64 x 64
    float *lse_s = (float *)(dSs + FA_TILE * FA_TILE);
    float *D_s = lse_s + FA_TILE;
    int bh = blockIdx.y, k0 = blockIdx.x * FA_TILE;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = lane / 2, c0 = (lane % 2) * 32;
    size_t base = (size_t)bh * Tn * FA_HS;
    float *Sw = Ws + warp * 16 * FA_TILE, *Dw = Wd + warp * 16 * FA_TILE;
    fa_load_tile(Ks, k + base, k0, Tn);
    fa_load_tile(Vs, v + base, k0, Tn);
    for (int i = threadIdx.x; i < FA_TILE * FA_HS; i += FA_THREADS) {
        dKs[i] = 0.0f;
        dVs[i] = 0.0f;
    }
    int nqt = (Tn + FA_TILE - 1) / FA_TILE;
    for (int qt = blockIdx.x; qt < nqt; qt++) { // causal: query tiles at or after this key tile
        int q0 = qt * FA_TILE;
        int qi = q0 + warp * 16 + r;
        __syncthreads(); // the previous query tile is fully consumed
        fa_load_tile(Qs, q + base, q0, Tn);
        fa_load_tile(dOs, dO + base, q0, Tn);
        if (threadIdx.x < FA_TILE) {
            int i = q0 + threadIdx.x;
            lse_s[threadIdx.x] = i < Tn ? lse[(size_t)bh * Tn + i] : 0.0f;
            D_s[threadIdx.x] = i < Tn ? D[(size_t)bh * Tn + i] : 0.0f;
        }
        __syncthreads();
        // P = exp(scale * Q K^T - lse), causal; kept fp32 in Sw and 16-bit in Ps.
        fa_mm_abt(Sw, Qs + warp * 16 * FA_HS, Ks);
        __syncwarp();
        float lrow = lse_s[warp * 16 + r];
        for (int c = c0; c < c0 + 32; c++) {
            int kj = k0 + c;
            float p = (kj <= qi && qi < Tn && kj < Tn) ? expf(Sw[r * FA_TILE + c] * scale - lrow)
                                                       : 0.0f;
            Sw[r * FA_TILE + c] = p;
            Ps[(warp * 16 + r) * FA_TILE + c] = from_f<T>(p);
        }
        // dP = dO V^T
        fa_mm_abt(Dw, dOs + warp * 16 * FA_HS, Vs);
        __syncwarp();
        // dS = scale * P * (dP - D)
        float drow = D_s[warp * 16 + r];
        for (int c = c0; c < c0 + 32; c++) {
            float ds = scale * Sw[r * FA_TILE + c] * (Dw[r * FA_TILE + c] - drow);
            dSs[(warp * 16 + r) * FA_TILE + c] = from_f<T>(ds);
        }
        __syncthreads(); // P and dS complete for all 64 query rows
        // dV (this warp's 16 keys) += P^T dO; dK += dS^T Q
        fa_mm_atb_acc(dVs + warp * 16 * FA_HS, Ps, warp * 16, dOs);
        fa_mm_atb_acc(dKs + warp * 16 * FA_HS, dSs, warp * 16, Qs);
        // dQ (this warp's 16 queries) = dS K, added to global
        fa_mm_ab_acc(Dw, dSs + warp * 16 * FA_TILE, Ks, true);
        __syncwarp();
        for (int i = lane; i < 16 * FA_HS; i += 32) {
            int rr = i / FA_HS, d = i % FA_HS, row = q0 + warp * 16 + rr;
            if (row < Tn)
                atomicAdd(dq + base + (size_t)row * FA_HS + d, Dw[i]);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < FA_TILE * FA_HS; i += FA_THREADS) {
        int kj = k0 + i / FA_HS;
        if (kj < Tn) {
            dk[base + (size_t)kj * FA_HS + i % FA_HS] = dKs[i];
            dv[base + (size_t)kj * FA_HS + i % FA_HS] = dVs[i];
        }
    }
}

static bool use_flash(const dt_cuda *cu, int T, int C, int NH)
{
    return cu->attn_flash && convert_mode(cu) && NH > 0 && C / NH == FA_HS && C % NH == 0 &&
           T >= FA_TILE;
}

// Offsets in the att buffer (float elements): lse at 0, o16 from a 256-byte boundary.
static size_t fa_o16_offset(size_t BH, size_t T) { return (BH * T + 63) / 64 * 64; }

template <typename T>
static void flash_fwd(dt_cuda *cu, float *out, float *att_buf, const float *qkv, int B, int Tn,
                      int C, int NH)
{
    int BH = B * NH;
    size_t n = (size_t)B * Tn * C;
    char *scr = (char *)dt_cuda_scratch(cu, DT_CU_SCR_ATTN, 3 * n * sizeof(T) + n * sizeof(float));
    if (!scr)
        return;
    T *q = (T *)scr, *k = q + n, *v = k + n;
    float *y = (float *)(v + n);
    float *lse = att_buf;
    T *o16 = (T *)(att_buf + fa_o16_offset((size_t)BH, (size_t)Tn));
    attn_permute_kernel<T><<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(q, k, v, qkv, B, Tn, NH,
                                                                         FA_HS);
    DT_CU_LAUNCHED(cu);
    size_t smem = fa_fwd_smem<T>();
    DT_CU_CHECK(cu, cudaFuncSetAttribute(fa_fwd_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((Tn + FA_TILE - 1) / FA_TILE), (unsigned)BH);
    fa_fwd_kernel<T><<<grid, FA_THREADS, smem, cu->stream>>>(y, o16, lse, q, k, v, Tn,
                                                              1.0f / sqrtf((float)FA_HS));
    DT_CU_LAUNCHED(cu);
    attn_unpermute_kernel<<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(out, y, B, Tn, NH, FA_HS);
    DT_CU_LAUNCHED(cu);
}

template <typename T>
static void flash_bwd(dt_cuda *cu, float *dqkv, const float *dout, const float *qkv,
                      const float *att_buf, int B, int Tn, int C, int NH)
{
    int BH = B * NH;
    size_t n = (size_t)B * Tn * C, rows = (size_t)BH * Tn;
    char *scr = (char *)dt_cuda_scratch(
        cu, DT_CU_SCR_ATTN, 4 * n * sizeof(T) + 3 * n * sizeof(float) + rows * sizeof(float));
    if (!scr)
        return;
    T *q = (T *)scr, *k = q + n, *v = k + n, *dy = v + n;
    float *dq = (float *)(dy + n), *dk = dq + n, *dv = dk + n, *D = dv + n;
    const float *lse = att_buf;
    const T *o16 = (const T *)(att_buf + fa_o16_offset((size_t)BH, (size_t)Tn));
    attn_permute_kernel<T><<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(q, k, v, qkv, B, Tn, NH,
                                                                         FA_HS);
    DT_CU_LAUNCHED(cu);
    attn_unpermute_bwd_kernel<T><<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(dy, dout, B, Tn,
                                                                               NH, FA_HS);
    DT_CU_LAUNCHED(cu);
    DT_CU_CHECK(cu, cudaMemsetAsync(dq, 0, n * sizeof(float), cu->stream));
    fa_bwd_pre_kernel<T><<<(unsigned)((rows + 7) / 8), 256, 0, cu->stream>>>(D, dy, o16, rows);
    DT_CU_LAUNCHED(cu);
    size_t smem = fa_bwd_smem<T>();
    DT_CU_CHECK(cu, cudaFuncSetAttribute(fa_bwd_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((Tn + FA_TILE - 1) / FA_TILE), (unsigned)BH);
    fa_bwd_kernel<T><<<grid, FA_THREADS, smem, cu->stream>>>(dq, dk, dv, q, k, v, dy, lse, D, Tn,
                                                              1.0f / sqrtf((float)FA_HS));
    DT_CU_LAUNCHED(cu);
    attn_permute_bwd_kernel<<<dt_cu_blocks(n, 256), 256, 0, cu->stream>>>(dqkv, dq, dk, dv, B, Tn,
                                                                          NH, FA_HS);
    DT_CU_LAUNCHED(cu);
}

// What attention_fwd saves (backend_ops.h): flash, the lse and o16 above; the cuBLAS path, the
// probabilities (B,NH,T,T) (in 16 bits in the convert modes, sized as floats all the same) and a
// datt of that size for the softmax backward.
void dt_cuda_attention_sizes(dt_backend *be, int B, int T, int C, int NH, size_t *att,
                             size_t *datt)
{
    // A shorter sequence than T (below FA_TILE) takes the cuBLAS path: its probabilities must
    // fit too (the sizes serve every call with at most B and T).
    dt_cuda *cu = dt_cuda_of(be);
    size_t BH = (size_t)B * NH, probs = BH * T * T;
    bool flash = B > 0 && T > 0 && use_flash(cu, T, C, NH);
    if (flash) {
        size_t Ts = FA_TILE - 1, fl = fa_o16_offset(BH, (size_t)T) + BH * T * FA_HS / 2;
        probs = BH * Ts * Ts;
        if (att)
            *att = fl > probs ? fl : probs;
        if (datt)
            *datt = probs;
        return;
    }
    if (att)
        *att = probs;
    if (datt)
        *datt = probs;
}

void dt_cuda_attention_fwd(dt_backend *be, float *out, float *att, const float *qkv, int B, int T,
                           int C, int NH)
{
    DT_CU_BEGIN(be);
    if (!cu->failed && B > 0 && T > 0) {
        if (use_flash(cu, T, C, NH) && cu->precision == DT_PREC_BF16)
            flash_fwd<__nv_bfloat16>(cu, out, att, qkv, B, T, C, NH);
        else if (use_flash(cu, T, C, NH))
            flash_fwd<__half>(cu, out, att, qkv, B, T, C, NH);
        else if (!convert_mode(cu))
            attention_fwd_t<float>(cu, out, att, qkv, B, T, C, NH);
        else if (cu->precision == DT_PREC_BF16)
            attention_fwd_t<__nv_bfloat16>(cu, out, att, qkv, B, T, C, NH);
        else
            attention_fwd_t<__half>(cu, out, att, qkv, B, T, C, NH);
    }
    DT_CU_END(DT_CU_OP_ATTN_FWD, 4.0 * B * NH * (double)T * T * (C / NH));
}

void dt_cuda_attention_bwd(dt_backend *be, float *dqkv, float *datt, const float *dout,
                           const float *qkv, const float *att, int B, int T, int C, int NH)
{
    DT_CU_BEGIN(be);
    if (!cu->failed && B > 0 && T > 0) {
        if (use_flash(cu, T, C, NH) && cu->precision == DT_PREC_BF16)
            flash_bwd<__nv_bfloat16>(cu, dqkv, dout, qkv, att, B, T, C, NH);
        else if (use_flash(cu, T, C, NH))
            flash_bwd<__half>(cu, dqkv, dout, qkv, att, B, T, C, NH);
        else if (!convert_mode(cu))
            attention_bwd_t<float>(cu, dqkv, datt, dout, qkv, att, B, T, C, NH);
        else if (cu->precision == DT_PREC_BF16)
            attention_bwd_t<__nv_bfloat16>(cu, dqkv, datt, dout, qkv, att, B, T, C, NH);
        else
            attention_bwd_t<__half>(cu, dqkv, datt, dout, qkv, att, B, T, C, NH);
    }
    DT_CU_END(DT_CU_OP_ATTN_BWD, 8.0 * B * NH * (double)T * T * (C / NH));
}

// The padded bidirectional form (BERT): the cuBLAS path above with the masked softmax (the
// flash kernels are causal only).
void dt_cuda_attention_pad_fwd(dt_backend *be, float *out, float *att, const float *qkv,
                               const int32_t *mask, int B, int T, int C, int NH)
{
    DT_CU_BEGIN(be);
    if (!cu->failed && B > 0 && T > 0) {
        if (!convert_mode(cu))
            attention_fwd_t<float>(cu, out, att, qkv, B, T, C, NH, true, mask);
        else if (cu->precision == DT_PREC_BF16)
            attention_fwd_t<__nv_bfloat16>(cu, out, att, qkv, B, T, C, NH, true, mask);
        else
            attention_fwd_t<__half>(cu, out, att, qkv, B, T, C, NH, true, mask);
    }
    DT_CU_END(DT_CU_OP_ATTN_PAD_FWD, 4.0 * B * NH * (double)T * T * (C / NH));
}

void dt_cuda_attention_pad_bwd(dt_backend *be, float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH)
{
    DT_CU_BEGIN(be);
    if (!cu->failed && B > 0 && T > 0) {
        if (!convert_mode(cu))
            attention_bwd_t<float>(cu, dqkv, datt, dout, qkv, att, B, T, C, NH, true);
        else if (cu->precision == DT_PREC_BF16)
            attention_bwd_t<__nv_bfloat16>(cu, dqkv, datt, dout, qkv, att, B, T, C, NH, true);
        else
            attention_bwd_t<__half>(cu, dqkv, datt, dout, qkv, att, B, T, C, NH, true);
    }
    DT_CU_END(DT_CU_OP_ATTN_PAD_BWD, 8.0 * B * NH * (double)T * T * (C / NH));
}

// =============================================================================================
// conv2d (cuDNN)
// =============================================================================================

typedef struct conv_descs {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
} conv_descs;

static void conv_descs_free(conv_descs *d)
{
    if (d->x)
        cudnnDestroyTensorDescriptor(d->x);
    if (d->y)
        cudnnDestroyTensorDescriptor(d->y);
    if (d->w)
        cudnnDestroyFilterDescriptor(d->w);
    if (d->conv)
        cudnnDestroyConvolutionDescriptor(d->conv);
    memset(d, 0, sizeof *d);
}

static bool conv_descs_make(dt_cuda *cu, const dt_conv2d_shape *s, cudnnMathType_t math,
                            conv_descs *d)
{
    memset(d, 0, sizeof *d);
    cudnnStatus_t st;
#define DN(call)                                                                                   \
    do {                                                                                           \
        if ((st = (call)) != CUDNN_STATUS_SUCCESS) {                                               \
            dt_cuda_note(cu, false, #call, cudnnGetErrorString(st), __FILE__, __LINE__);          \
            conv_descs_free(d);                                                                    \
            return false;                                                                          \
        }                                                                                          \
    } while (0)
    DN(cudnnCreateTensorDescriptor(&d->x));
    DN(cudnnCreateTensorDescriptor(&d->y));
    DN(cudnnCreateFilterDescriptor(&d->w));
    DN(cudnnCreateConvolutionDescriptor(&d->conv));
    DN(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s->N, s->C, s->H,
                                  s->W));
    DN(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s->N, s->K, s->P,
                                  s->Q));
    DN(cudnnSetFilter4dDescriptor(d->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s->K, s->C, s->R,
                                  s->S));
    DN(cudnnSetConvolution2dDescriptor(d->conv, s->pad, s->pad, s->stride, s->stride, 1, 1,
                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DN(cudnnSetConvolutionMathType(d->conv, math));
#undef DN
    return true;
}

static bool same_shape(const dt_conv2d_shape *a, const dt_conv2d_shape *b)
{
    return a->N == b->N && a->C == b->C && a->H == b->H && a->W == b->W && a->K == b->K &&
           a->R == b->R && a->S == b->S && a->stride == b->stride && a->pad == b->pad;
}

// Picks the first algorithm the heuristics rank that succeeds, fits the workspace cap and (in
// strict fp32) uses no tensor cores.
#define CONV_WS_CAP ((size_t)1 << 30)
template <typename Perf>
static int pick_algo(const Perf *perf, int n, bool strict, size_t *ws)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > CONV_WS_CAP)
                continue;
            if (pass == 0 && strict && perf[i].mathType == CUDNN_TENSOR_OP_MATH)
                continue;
            *ws = perf[i].memory;
            return (int)perf[i].algo;
        }
    }
    *ws = 0;
    return -1;
}

static const dt_cu_conv_algo *conv_algo_lookup(dt_cuda *cu, const dt_conv2d_shape *s,
                                               const conv_descs *d, bool strict,
                                               cudnnMathType_t math);

// Makes the descriptors for shape s (into d; the caller frees them with conv_descs_free) and
// returns the algorithms to use; NULL after a failure (d then holds nothing).
static const dt_cu_conv_algo *conv_algo(dt_cuda *cu, const dt_conv2d_shape *s, conv_descs *d)
{
    bool strict = !half_mode(cu) && !cu->tf32;
    cudnnMathType_t math = strict ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    if (!conv_descs_make(cu, s, math, d))
        return NULL; // d is left empty
    const dt_cu_conv_algo *a = conv_algo_lookup(cu, s, d, strict, math);
    if (!a)
        conv_descs_free(d);
    return a;
}

// The cached algorithms for shape s, querying the heuristics on first use; NULL after a failure.
static const dt_cu_conv_algo *conv_algo_lookup(dt_cuda *cu, const dt_conv2d_shape *s,
                                               const conv_descs *d, bool strict,
                                               cudnnMathType_t math)
{
    for (int i = 0; i < cu->conv_cache_n; i++)
        if (same_shape(&cu->conv_cache[i].s, s))
            return &cu->conv_cache[i];
    dt_cu_conv_algo a;
    memset(&a, 0, sizeof a);
    a.s = *s;
    a.math = (int)math;
    cudnnConvolutionFwdAlgoPerf_t pf[16];
    cudnnConvolutionBwdDataAlgoPerf_t pd[16];
    cudnnConvolutionBwdFilterAlgoPerf_t pw[16];
    int nf = 0, nd = 0, nw = 0;
    DT_CUDNN_CHECK(cu, cudnnGetConvolutionForwardAlgorithm_v7(cu->cudnn, d->x, d->w, d->conv, d->y,
                                                              16, &nf, pf));
    DT_CUDNN_CHECK(cu, cudnnGetConvolutionBackwardDataAlgorithm_v7(cu->cudnn, d->w, d->y, d->conv,
                                                                   d->x, 16, &nd, pd));
    DT_CUDNN_CHECK(cu, cudnnGetConvolutionBackwardFilterAlgorithm_v7(cu->cudnn, d->x, d->y,
                                                                     d->conv, d->w, 16, &nw, pw));
    if (cu->failed)
        return NULL;
    a.fwd = pick_algo(pf, nf, strict, &a.ws_fwd);
    a.bwd_data = pick_algo(pd, nd, strict, &a.ws_bwd_data);
    a.bwd_filter = pick_algo(pw, nw, strict, &a.ws_bwd_filter);
    if (a.fwd < 0 || a.bwd_data < 0 || a.bwd_filter < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "no usable algorithm for N=%d C=%d H=%d W=%d K=%d R=%d S=%d",
                 s->N, s->C, s->H, s->W, s->K, s->R, s->S);
        dt_cuda_note(cu, false, "cuDNN convolution heuristics", msg, __FILE__, __LINE__);
        return NULL;
    }
    int slot = cu->conv_cache_n < DT_CU_CONV_CACHE ? cu->conv_cache_n++ : 0; // full: reuse 0
    cu->conv_cache[slot] = a;
    return &cu->conv_cache[slot];
}

void dt_cuda_conv2d_fwd(dt_backend *be, float *out, const float *inp, const float *w,
                        const float *bias, const dt_conv2d_shape *s)
{
    DT_CU_BEGIN(be);
    conv_descs d;
    const dt_cu_conv_algo *a = cu->failed ? NULL : conv_algo(cu, s, &d);
    if (a) {
        void *ws = a->ws_fwd ? dt_cuda_scratch(cu, DT_CU_SCR_CONV, a->ws_fwd) : NULL;
        const float one = 1.0f, zero = 0.0f;
        if (!a->ws_fwd || ws)
            DT_CUDNN_CHECK(cu, cudnnConvolutionForward(cu->cudnn, &one, d.x, inp, d.w, w, d.conv,
                                                       (cudnnConvolutionFwdAlgo_t)a->fwd, ws,
                                                       a->ws_fwd, &zero, d.y, out));
        if (bias)
            dt_cuda_channel_bias_add(cu, out, bias, s->N, s->K, s->P * s->Q);
        conv_descs_free(&d);
    }
    DT_CU_END(DT_CU_OP_CONV_FWD, 2.0 * s->N * s->K * s->P * s->Q * (double)s->C * s->R * s->S);
}

void dt_cuda_conv2d_bwd(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, const dt_conv2d_shape *s)
{
    DT_CU_BEGIN(be);
    conv_descs d;
    double flops = 0, one_pass = 2.0 * s->N * s->K * s->P * s->Q * (double)s->C * s->R * s->S;
    const dt_cu_conv_algo *a = cu->failed ? NULL : conv_algo(cu, s, &d);
    if (a) {
        const float one = 1.0f; // alpha and beta: the gradients accumulate
        if (dinp) {
            void *ws =
                a->ws_bwd_data ? dt_cuda_scratch(cu, DT_CU_SCR_CONV, a->ws_bwd_data) : NULL;
            if (!a->ws_bwd_data || ws)
                DT_CUDNN_CHECK(cu, cudnnConvolutionBackwardData(
                                       cu->cudnn, &one, d.w, w, d.y, dout, d.conv,
                                       (cudnnConvolutionBwdDataAlgo_t)a->bwd_data, ws,
                                       a->ws_bwd_data, &one, d.x, dinp));
            flops += one_pass;
        }
        if (dw) {
            void *ws =
                a->ws_bwd_filter ? dt_cuda_scratch(cu, DT_CU_SCR_CONV, a->ws_bwd_filter) : NULL;
            if (!a->ws_bwd_filter || ws)
                DT_CUDNN_CHECK(cu, cudnnConvolutionBackwardFilter(
                                       cu->cudnn, &one, d.x, inp, d.y, dout, d.conv,
                                       (cudnnConvolutionBwdFilterAlgo_t)a->bwd_filter, ws,
                                       a->ws_bwd_filter, &one, d.w, dw));
            flops += one_pass;
        }
        if (dbias)
            dt_cuda_channel_sum_acc(cu, dbias, dout, s->N, s->K, s->P * s->Q);
        conv_descs_free(&d);
    }
    DT_CU_END(DT_CU_OP_CONV_BWD, flops);
}
