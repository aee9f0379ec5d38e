// ops.cu - the non-GEMM ops of the CUDA backend: element-wise, LayerNorm, embeddings, the fused
// classifier, BatchNorm stages, pooling, optimisers and reductions.
//
// Every kernel is fp32 in and out (cuda_internal.h: precision only changes GEMMs). Shapes and
// semantics are kernels/backend_ops.h's; backward kernels accumulate (+=). Reductions that many
// blocks share (column sums, per-channel sums, embedding scatter, max-pool scatter) use
// atomicAdd, so their results are not bit-reproducible from run to run (the order of additions
// varies); they match the CPU reference within the test tolerances. Per-channel BatchNorm sums
// and the global sum of squares accumulate in double.
//
// Patterns, following llm.c: one warp per row for row-wise ops with short rows (LayerNorm,
// attention softmax in gemm.cu), one block per row for long rows (the classifier over V),
// grid-stride loops for element-wise ops, a (32 x 8) tile per column block for column sums.
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_internal.h"

#define THREADS 256
#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

// =============================================================================================
// reduction helpers
// =============================================================================================

__device__ static inline float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ static inline double warp_sum_d(double v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Sum over the block, valid in thread 0. blockDim.x is a multiple of 32, at most 1024. Every
// thread of the block must call it.
__device__ static inline double block_sum_d(double v)
{
    __shared__ double part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_sum_d(v);
    __syncthreads(); // part may still be read by an earlier call
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (unsigned)nw) ? part[threadIdx.x] : 0.0;
    if (warp == 0)
        v = warp_sum_d(v);
    return v;
}

static unsigned reduce_blocks(const dt_cuda *cu, size_t n)
{
    unsigned cap = (unsigned)(cu->sm_count > 0 ? cu->sm_count * 4 : 512);
    return dt_cu_blocks(n, THREADS, cap);
}

// Copies `bytes` (<= 64) of device memory to the pinned host buffer and waits; NULL after a
// failure.
static const void *read_back(dt_cuda *cu, const void *dev, size_t bytes)
{
    if (cu->failed)
        return NULL;
    DT_CU_CHECK(cu, cudaMemcpyAsync(cu->host_pinned, dev, bytes, cudaMemcpyDeviceToHost,
                                    cu->stream));
    DT_CU_CHECK(cu, cudaStreamSynchronize(cu->stream));
    return cu->failed ? NULL : cu->host_pinned;
}

// =============================================================================================
// column sums: out0 (cols) += sum_r f(r,c).x, out1 (cols) += sum_r f(r,c).y
// =============================================================================================

template <typename F>
__global__ static void colreduce_kernel(float *out0, float *out1, int rows, int cols, F f)
{
    __shared__ float s0[8][33], s1[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    float a0 = 0.0f, a1 = 0.0f;
    if (c < cols) {
        for (int r = blockIdx.y * 8 + ty; r < rows; r += gridDim.y * 8) {
            float2 v = f(r, c);
            a0 += v.x;
            a1 += v.y;
        }
    }
    s0[ty][tx] = a0;
    s1[ty][tx] = a1;
    __syncthreads();
    if (ty != 0 || c >= cols)
        return;
    for (int y = 1; y < 8; y++) {
        a0 += s0[y][tx];
        a1 += s1[y][tx];
    }
    if (gridDim.y == 1) {
        if (out0)
            out0[c] += a0;
        if (out1)
            out1[c] += a1;
    } else {
        if (out0)
            atomicAdd(out0 + c, a0);
        if (out1)
            atomicAdd(out1 + c, a1);
    }
}

template <typename F>
static void colreduce(dt_cuda *cu, float *out0, float *out1, int rows, int cols, F f)
{
    if (rows <= 0 || cols <= 0)
        return;
    unsigned gx = (unsigned)((cols + 31) / 32);
    unsigned want = (unsigned)(cu->sm_count > 0 ? cu->sm_count * 4 : 512);
    unsigned gy = want > gx ? (want + gx - 1) / gx : 1;
    unsigned gy_max = (unsigned)((rows + 63) / 64); // at least 8 rows per thread
    if (gy > gy_max)
        gy = gy_max;
    if (gy < 1)
        gy = 1;
    if (gy > 65535)
        gy = 65535;
    colreduce_kernel<<<dim3(gx, gy), dim3(32, 8), 0, cu->stream>>>(out0, out1, rows, cols, f);
    DT_CU_LAUNCHED(cu);
}

struct ColSumF {
    const float *x;
    int C;
    __device__ float2 operator()(int r, int c) const
    {
        return make_float2(x[(size_t)r * C + c], 0.0f);
    }
};

void dt_cuda_colsum_acc(dt_cuda *cu, float *dbias, const float *x, int N, int C)
{
    colreduce(cu, dbias, (float *)NULL, N, C, ColSumF{x, C});
}

// =============================================================================================
// per-channel sums over (N, HW) of (N,C,HW) tensors, in double
// =============================================================================================

template <typename F>
__global__ static void chanreduce_kernel(double *acc, int N, int C, int HW, F f)
{
    int c = blockIdx.x;
    size_t total = (size_t)N * HW;
    double a0 = 0.0, a1 = 0.0;
    for (size_t e = blockIdx.y * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.y * blockDim.x) {
        size_t n = e / HW, i = e % HW;
        float2 v = f(((size_t)n * C + c) * HW + i, c);
        a0 += v.x;
        a1 += v.y;
    }
    a0 = block_sum_d(a0);
    a1 = block_sum_d(a1);
    if (threadIdx.x == 0) {
        atomicAdd(acc + c, a0);
        atomicAdd(acc + C + c, a1);
    }
}

// acc (2C) = zeroed, then per-channel sums of f; returns acc (scratch) or NULL after a failure.
template <typename F>
static double *chanreduce(dt_cuda *cu, int N, int C, int HW, F f)
{
    double *acc = (double *)dt_cuda_scratch(cu, DT_CU_SCR_RED, 2 * (size_t)C * sizeof(double));
    if (!acc)
        return NULL;
    DT_CU_CHECK(cu, cudaMemsetAsync(acc, 0, 2 * (size_t)C * sizeof(double), cu->stream));
    size_t total = (size_t)N * HW;
    unsigned want = (unsigned)(cu->sm_count > 0 ? cu->sm_count * 4 : 512);
    unsigned gy = (want + (unsigned)C - 1) / (unsigned)C;
    unsigned gy_max = (unsigned)((total + THREADS - 1) / THREADS);
    if (gy > gy_max)
        gy = gy_max;
    if (gy < 1)
        gy = 1;
    if (gy > 65535)
        gy = 65535;
    chanreduce_kernel<<<dim3((unsigned)C, gy), THREADS, 0, cu->stream>>>(acc, N, C, HW, f);
    DT_CU_LAUNCHED(cu);
    return acc;
}

// set0/set1 = acc halves (SET); add0/add1 += acc halves. Any pointer may be NULL.
__global__ static void chan_finalize_kernel(const double *acc, int C, float *set0, float *set1,
                                            float *add0, float *add1)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float v0 = (float)acc[c], v1 = (float)acc[C + c];
    if (set0)
        set0[c] = v0;
    if (set1)
        set1[c] = v1;
    if (add0)
        add0[c] += v0;
    if (add1)
        add1[c] += v1;
}

static void chan_finalize(dt_cuda *cu, const double *acc, int C, float *set0, float *set1,
                          float *add0, float *add1)
{
    chan_finalize_kernel<<<dt_cu_blocks((size_t)C, THREADS), THREADS, 0, cu->stream>>>(
        acc, C, set0, set1, add0, add1);
    DT_CU_LAUNCHED(cu);
}

struct ChanSumF {
    const float *x;
    __device__ float2 operator()(size_t idx, int c) const { return make_float2(x[idx], 0.0f); }
};

void dt_cuda_channel_sum_acc(dt_cuda *cu, float *dbias, const float *dout, int N, int K, int HW)
{
    double *acc = chanreduce(cu, N, K, HW, ChanSumF{dout});
    if (acc)
        chan_finalize(cu, acc, K, NULL, NULL, dbias, NULL);
}

__global__ static void channel_bias_add_kernel(float *out, const float *bias, int N, int K, int HW)
{
    size_t n = (size_t)N * K * HW;
    GRID_STRIDE(i, n)
    out[i] += bias[(i / HW) % K];
}

void dt_cuda_channel_bias_add(dt_cuda *cu, float *out, const float *bias, int N, int K, int HW)
{
    size_t n = (size_t)N * K * HW;
    channel_bias_add_kernel<<<dt_cu_blocks(n, THREADS), THREADS, 0, cu->stream>>>(out, bias, N, K,
                                                                                   HW);
    DT_CU_LAUNCHED(cu);
}

// =============================================================================================
// conversions: GEMM operands in the 16-bit modes (scale 1) and DDP's 16-bit gradient payloads,
// with the roundings of common/half.h (to nearest even; overflow to inf; NaN stays NaN)
// =============================================================================================

__global__ static void to_half_kernel(uint16_t *dst, const float *x, size_t n, float scale,
                                      bool bf16)
{
    GRID_STRIDE(i, n)
    {
        float v = x[i] * scale;
        dst[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
                      : __half_as_ushort(__float2half_rn(v));
    }
}

void dt_cuda_to_half(dt_cuda *cu, void *dst, const float *x, size_t n, float scale, bool bf16)
{
    if (n == 0)
        return;
    to_half_kernel<<<dt_cu_blocks(n, THREADS), THREADS, 0, cu->stream>>>((uint16_t *)dst, x, n,
                                                                          scale, bf16);
    DT_CU_LAUNCHED(cu);
}

__global__ static void from_half_kernel(float *x, const uint16_t *src, size_t n, float scale,
                                        bool bf16)
{
    GRID_STRIDE(i, n)
    x[i] = (bf16 ? __bfloat162float(__ushort_as_bfloat16(src[i]))
                 : __half2float(__ushort_as_half(src[i]))) *
           scale;
}

void dt_cuda_op_to_half(dt_backend *be, uint16_t *half, const float *x, size_t n, float scale,
                        bool bf16)
{
    DT_CU_BEGIN(be);
    dt_cuda_to_half(cu, half, x, n, scale, bf16);
    DT_CU_END(DT_CU_OP_TO_HALF, 0);
}

void dt_cuda_op_from_half(dt_backend *be, float *x, const uint16_t *half, size_t n, float scale,
                          bool bf16)
{
    DT_CU_BEGIN(be);
    if (n > 0) {
        from_half_kernel<<<dt_cu_blocks(n, THREADS), THREADS, 0, cu->stream>>>(x, half, n, scale,
                                                                                bf16);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_FROM_HALF, 0);
}

// =============================================================================================
// bias
// =============================================================================================

__global__ static void colbias_add_kernel(float *out, const float *bias, int N, int C)
{
    size_t n = (size_t)N * C;
    GRID_STRIDE(i, n)
    out[i] += bias[i % C];
}

void dt_cuda_colbias_add(dt_cuda *cu, float *out, const float *bias, int N, int C)
{
    size_t n = (size_t)N * C;
    colbias_add_kernel<<<dt_cu_blocks(n, THREADS), THREADS, 0, cu->stream>>>(out, bias, N, C);
    DT_CU_LAUNCHED(cu);
}

void dt_cuda_bias_add(dt_backend *be, float *out, const float *bias, int N, int C)
{
    DT_CU_BEGIN(be);
    dt_cuda_colbias_add(cu, out, bias, N, C);
    DT_CU_END(DT_CU_OP_BIAS_ADD, 0);
}

void dt_cuda_bias_bwd(dt_backend *be, float *dbias, const float *dout, int N, int C)
{
    DT_CU_BEGIN(be);
    dt_cuda_colsum_acc(cu, dbias, dout, N, C);
    DT_CU_END(DT_CU_OP_BIAS_BWD, 0);
}

// =============================================================================================
// LayerNorm
// =============================================================================================

// One warp per row: two passes (mean, then the variance around it) for accuracy.
__global__ static void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp,
                                            const float *w, const float *b, int N, int C,
                                            float eps)
{
    int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    int row = blockIdx.x * warps + threadIdx.x / 32;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int j = lane; j < C; j += 32)
        s += x[j];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int j = lane; j < C; j += 32) {
        float d = x[j] - m;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(warp_sum(v) / C + eps);
    float *o = out + (size_t)row * C;
    for (int j = lane; j < C; j += 32)
        o[j] = (x[j] - m) * rs * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f);
    if (lane == 0) {
        if (mean)
            mean[row] = m;
        if (rstd)
            rstd[row] = rs;
    }
}

void dt_cuda_layernorm_fwd(dt_backend *be, float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C, float eps)
{
    DT_CU_BEGIN(be);
    const int warps = THREADS / 32;
    if (N > 0) { // a grid of 0 blocks is an invalid launch, which would fail the backend
        layernorm_fwd_kernel<<<(unsigned)((N + warps - 1) / warps), THREADS, 0, cu->stream>>>(
            out, mean, rstd, inp, w, b, N, C, eps);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_LAYERNORM_FWD, 0);
}

// dinp += (w*dout - mean(w*dout) - xhat * mean(w*dout*xhat)) * rstd, one warp per row.
__global__ static void layernorm_bwd_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                                 const float *w, const float *mean,
                                                 const float *rstd, int N, int C)
{
    int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    int row = blockIdx.x * warps + threadIdx.x / 32;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float m = mean[row], rs = rstd[row];
    float a = 0.0f, bsum = 0.0f;
    for (int j = lane; j < C; j += 32) {
        float g = (w ? w[j] : 1.0f) * dy[j];
        a += g;
        bsum += g * (x[j] - m) * rs;
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
    float *dx = dinp + (size_t)row * C;
    for (int j = lane; j < C; j += 32) {
        float g = (w ? w[j] : 1.0f) * dy[j];
        float xh = (x[j] - m) * rs;
        dx[j] += (g - a - xh * bsum) * rs;
    }
}

struct LnDwDbF {
    const float *dout, *inp, *mean, *rstd;
    int C;
    __device__ float2 operator()(int r, int c) const
    {
        size_t i = (size_t)r * C + c;
        float dy = dout[i];
        return make_float2(dy * (inp[i] - mean[r]) * rstd[r], dy);
    }
};

void dt_cuda_layernorm_bwd(dt_backend *be, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const float *mean, const float *rstd,
                           int N, int C)
{
    DT_CU_BEGIN(be);
    if (dinp && N > 0) {
        const int warps = THREADS / 32;
        layernorm_bwd_dinp_kernel<<<(unsigned)((N + warps - 1) / warps), THREADS, 0,
                                    cu->stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
        DT_CU_LAUNCHED(cu);
    }
    if (dw || db)
        colreduce(cu, dw, db, N, C, LnDwDbF{dout, inp, mean, rstd, C});
    DT_CU_END(DT_CU_OP_LAYERNORM_BWD, 0);
}

// =============================================================================================
// decoder ops (llama): RMSNorm, SwiGLU, rotary embeddings with grouped-query heads
// =============================================================================================

// One warp per row, as LayerNorm.
__global__ static void rmsnorm_fwd_kernel(float *out, float *rstd, const float *inp,
                                          const float *w, int N, int C, float eps)
{
    int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    int row = blockIdx.x * warps + threadIdx.x / 32;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int j = lane; j < C; j += 32)
        ss += x[j] * x[j];
    float rs = 1.0f / sqrtf(warp_sum(ss) / C + eps);
    float *o = out + (size_t)row * C;
    for (int j = lane; j < C; j += 32)
        o[j] = w[j] * (x[j] * rs);
    if (lane == 0 && rstd)
        rstd[row] = rs;
}

void dt_cuda_rmsnorm_fwd(dt_backend *be, float *out, float *rstd, const float *inp,
                         const float *w, int N, int C, float eps)
{
    DT_CU_BEGIN(be);
    const int warps = THREADS / 32;
    if (N > 0) {
        rmsnorm_fwd_kernel<<<(unsigned)((N + warps - 1) / warps), THREADS, 0, cu->stream>>>(
            out, rstd, inp, w, N, C, eps);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_RMSNORM_FWD, 0);
}

// dinp += (w*dout - xhat * mean(w*dout*xhat)) * rstd, one warp per row.
__global__ static void rmsnorm_bwd_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                               const float *w, const float *rstd, int N, int C)
{
    int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    int row = blockIdx.x * warps + threadIdx.x / 32;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float rs = rstd[row], dot = 0.0f;
    for (int j = lane; j < C; j += 32)
        dot += w[j] * dy[j] * (x[j] * rs);
    dot = warp_sum(dot) / C;
    float *dx = dinp + (size_t)row * C;
    for (int j = lane; j < C; j += 32)
        dx[j] += (w[j] * dy[j] - (x[j] * rs) * dot) * rs;
}

struct RmsDwF {
    const float *dout, *inp, *rstd;
    int C;
    __device__ float2 operator()(int r, int c) const
    {
        size_t i = (size_t)r * C + c;
        return make_float2(dout[i] * (inp[i] * rstd[r]), 0.0f);
    }
};

void dt_cuda_rmsnorm_bwd(dt_backend *be, float *dinp, float *dw, const float *dout,
                         const float *inp, const float *w, const float *rstd, int N, int C)
{
    DT_CU_BEGIN(be);
    if (dinp && N > 0) {
        const int warps = THREADS / 32;
        rmsnorm_bwd_dinp_kernel<<<(unsigned)((N + warps - 1) / warps), THREADS, 0,
                                  cu->stream>>>(dinp, dout, inp, w, rstd, N, C);
        DT_CU_LAUNCHED(cu);
    }
    if (dw)
        colreduce(cu, dw, (float *)NULL, N, C, RmsDwF{dout, inp, rstd, C});
    DT_CU_END(DT_CU_OP_RMSNORM_BWD, 0);
}

__global__ static void swiglu_fwd_kernel(float *out, const float *inp, int F, size_t n)
{
    GRID_STRIDE(i, n)
    {
        size_t r = i / F, j = i % F;
        float g = inp[r * 2 * F + j], u = inp[r * 2 * F + F + j];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

void dt_cuda_swiglu_fwd(dt_backend *be, float *out, const float *inp, int N, int F)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)N * F;
    if (n) {
        swiglu_fwd_kernel<<<dt_cu_blocks(n, THREADS), THREADS, 0, cu->stream>>>(out, inp, F, n);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_SWIGLU_FWD, 0);
}

__global__ static void swiglu_bwd_kernel(float *dinp, const float *dout, const float *inp, int F,
                                         size_t n)
{
    GRID_STRIDE(i, n)
    {
        size_t r = i / F, j = i % F, gi = r * 2 * F + j, ui = gi + F;
        float g = inp[gi], u = inp[ui], dy = dout[i];
        float sg = 1.0f / (1.0f + expf(-g));
        dinp[ui] += dy * g * sg;
        dinp[gi] += dy * u * sg * (1.0f + g * (1.0f - sg));
    }
}

void dt_cuda_swiglu_bwd(dt_backend *be, float *dinp, const float *dout, const float *inp, int N,
                        int F)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)N * F;
    if (n) {
        swiglu_bwd_kernel<<<dt_cu_blocks(n, THREADS), THREADS, 0, cu->stream>>>(dinp, dout, inp,
                                                                               F, n);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_SWIGLU_BWD, 0);
}

// cos and sin of position t's angle for pair i (backend_ops.h: float32 as Hugging Face's
// inv_freq and t * inv_freq; precise powf, cosf and sinf, not the fast intrinsics).
__device__ static inline void rope_angle(int t, int i, int hs, float theta, float *c, float *s)
{
    float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
    float a = (float)t * inv;
    *c = cosf(a);
    *s = sinf(a);
}

// One thread per element of out (B,T,3 NH hs).
__global__ static void rope_qkv_fwd_kernel(float *out, const float *inp, int T, int NH, int NKV,
                                           int hs, float theta, size_t n)
{
    const int h2 = hs / 2, rep = NH / NKV;
    const size_t C = (size_t)NH * hs, Cin = C + 2 * (size_t)NKV * hs;
    GRID_STRIDE(e, n)
    {
        size_t r = e / (3 * C), within = e % (3 * C);
        int part = (int)(within / C), h = (int)(within % C) / hs, j = (int)(within % hs);
        int t = (int)(r % T);
        const float *row = inp + r * Cin;
        if (part == 2) {
            out[e] = row[C + (size_t)NKV * hs + (size_t)(h / rep) * hs + j];
            continue;
        }
        const float *x = part == 0 ? row + (size_t)h * hs : row + C + (size_t)(h / rep) * hs;
        int i = j < h2 ? j : j - h2;
        float c, s;
        rope_angle(t, i, hs, theta, &c, &s);
        out[e] = j < h2 ? c * x[i] - s * x[i + h2] : c * x[i + h2] + s * x[i];
    }
}

// One thread per element of dinp (B,T,(NH+2NKV)hs): the transpose, summed over the query heads
// that share a kv head.
__global__ static void rope_qkv_bwd_kernel(float *dinp, const float *dout, int T, int NH,
                                           int NKV, int hs, float theta, size_t n)
{
    const int h2 = hs / 2, rep = NH / NKV;
    const size_t C = (size_t)NH * hs, Ckv = (size_t)NKV * hs, Cin = C + 2 * Ckv;
    GRID_STRIDE(e, n)
    {
        size_t r = e / Cin, within = e % Cin;
        int t = (int)(r % T);
        const float *row = dout + r * 3 * C;
        int j, h0, nh;
        const float *base;
        if (within < C) { // q: its own head
            h0 = (int)(within / hs);
            j = (int)(within % hs);
            nh = 1;
            base = row;
        } else if (within < C + Ckv) { // k: the rep query heads of kv head g
            h0 = (int)((within - C) / hs) * rep;
            j = (int)((within - C) % hs);
            nh = rep;
            base = row + C;
        } else { // v: summed, not rotated
            int g = (int)((within - C - Ckv) / hs);
            j = (int)((within - C - Ckv) % hs);
            float acc = 0.0f;
            for (int h = g * rep; h < (g + 1) * rep; h++)
                acc += row[2 * C + (size_t)h * hs + j];
            dinp[e] += acc;
            continue;
        }
        int i = j < h2 ? j : j - h2;
        float c, s, acc = 0.0f;
        rope_angle(t, i, hs, theta, &c, &s);
        for (int h = h0; h < h0 + nh; h++) {
            const float *d = base + (size_t)h * hs;
            acc += j < h2 ? c * d[i] + s * d[i + h2] : c * d[i + h2] - s * d[i];
        }
        dinp[e] += acc;
    }
}

void dt_cuda_rope_qkv_fwd(dt_backend *be, float *out, const float *inp, int B, int T, int NH,
                          int NKV, int hs, float theta)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)B * T * 3 * NH * hs;
    if (n) {
        rope_qkv_fwd_kernel<<<dt_cu_blocks(n, THREADS), THREADS, 0, cu->stream>>>(
            out, inp, T, NH, NKV, hs, theta, n);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_ROPE_QKV_FWD, 0);
}

void dt_cuda_rope_qkv_bwd(dt_backend *be, float *dinp, const float *dout, int B, int T, int NH,
                          int NKV, int hs, float theta)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)B * T * (NH + 2 * NKV) * hs;
    if (n) {
        rope_qkv_bwd_kernel<<<dt_cu_blocks(n, THREADS), THREADS, 0, cu->stream>>>(
            dinp, dout, T, NH, NKV, hs, theta, n);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_ROPE_QKV_BWD, 0);
}

// =============================================================================================
// element-wise
// =============================================================================================

#define GELU_K 0.7978845608028654f // sqrt(2/pi)

__global__ static void gelu_fwd_kernel(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

__global__ static void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float x = inp[i];
        float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) +
                  0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += g * dout[i];
    }
}

// The exact GELU x * Phi(x) (normcdff) and its derivative Phi(x) + x phi(x).
__global__ static void gelu_erf_fwd_kernel(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float x = inp[i];
        out[i] = x * normcdff(x);
    }
}

__global__ static void gelu_erf_bwd_kernel(float *dinp, const float *inp, const float *dout,
                                           size_t n)
{
    GRID_STRIDE(i, n)
    {
        float x = inp[i];
        float g = normcdff(x) + x * 0.3989422804014327f * expf(-0.5f * x * x);
        dinp[i] += g * dout[i];
    }
}

__global__ static void tanh_fwd_kernel(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n)
    out[i] = tanhf(inp[i]);
}

__global__ static void tanh_bwd_kernel(float *dinp, const float *out, const float *dout, size_t n)
{
    GRID_STRIDE(i, n)
    dinp[i] += (1.0f - out[i] * out[i]) * dout[i];
}

__global__ static void relu_fwd_kernel(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n)
    out[i] = fmaxf(inp[i], 0.0f);
}

__global__ static void relu_bwd_kernel(float *dinp, const float *out, const float *dout, size_t n)
{
    GRID_STRIDE(i, n)
    if (out[i] > 0.0f)
        dinp[i] += dout[i];
}

__global__ static void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n)
    out[i] = a[i] + b[i];
}

__global__ static void accumulate_kernel(float *dst, const float *src, size_t n)
{
    GRID_STRIDE(i, n)
    dst[i] += src[i];
}

__global__ static void scale_kernel(float *x, size_t n, float s)
{
    GRID_STRIDE(i, n)
    x[i] *= s;
}

#define EW_LAUNCH(kernel, n, ...)                                                                  \
    do {                                                                                           \
        if ((n) > 0) {                                                                             \
            kernel<<<dt_cu_blocks((n), THREADS), THREADS, 0, cu->stream>>>(__VA_ARGS__);           \
            DT_CU_LAUNCHED(cu);                                                                    \
        }                                                                                          \
    } while (0)

void dt_cuda_gelu_fwd(dt_backend *be, float *out, const float *inp, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(gelu_fwd_kernel, n, out, inp, n);
    DT_CU_END(DT_CU_OP_GELU_FWD, 0);
}

void dt_cuda_gelu_bwd(dt_backend *be, float *dinp, const float *inp, const float *dout, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(gelu_bwd_kernel, n, dinp, inp, dout, n);
    DT_CU_END(DT_CU_OP_GELU_BWD, 0);
}

void dt_cuda_gelu_erf_fwd(dt_backend *be, float *out, const float *inp, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(gelu_erf_fwd_kernel, n, out, inp, n);
    DT_CU_END(DT_CU_OP_GELU_ERF_FWD, 0);
}

void dt_cuda_gelu_erf_bwd(dt_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(gelu_erf_bwd_kernel, n, dinp, inp, dout, n);
    DT_CU_END(DT_CU_OP_GELU_ERF_BWD, 0);
}

void dt_cuda_tanh_fwd(dt_backend *be, float *out, const float *inp, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(tanh_fwd_kernel, n, out, inp, n);
    DT_CU_END(DT_CU_OP_TANH_FWD, 0);
}

void dt_cuda_tanh_bwd(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(tanh_bwd_kernel, n, dinp, out, dout, n);
    DT_CU_END(DT_CU_OP_TANH_BWD, 0);
}

void dt_cuda_relu_fwd(dt_backend *be, float *out, const float *inp, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(relu_fwd_kernel, n, out, inp, n);
    DT_CU_END(DT_CU_OP_RELU_FWD, 0);
}

void dt_cuda_relu_bwd(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(relu_bwd_kernel, n, dinp, out, dout, n);
    DT_CU_END(DT_CU_OP_RELU_BWD, 0);
}

void dt_cuda_residual_fwd(dt_backend *be, float *out, const float *a, const float *b, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(residual_kernel, n, out, a, b, n);
    DT_CU_END(DT_CU_OP_RESIDUAL, 0);
}

void dt_cuda_accumulate(dt_backend *be, float *dst, const float *src, size_t n)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(accumulate_kernel, n, dst, src, n);
    DT_CU_END(DT_CU_OP_ACCUMULATE, 0);
}

void dt_cuda_scale(dt_backend *be, float *x, size_t n, float s)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(scale_kernel, n, x, n, s);
    DT_CU_END(DT_CU_OP_SCALE, 0);
}

// =============================================================================================
// embeddings
// =============================================================================================

__global__ static void embedding_fwd_kernel(float *out, const int32_t *tokens, const float *wte,
                                            const float *wpe, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    GRID_STRIDE(i, n)
    {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        float v = wte[(size_t)tokens[bt] * C + c];
        if (wpe)
            v += wpe[(size_t)t * C + c];
        out[i] = v;
    }
}

__global__ static void embedding_bwd_kernel(float *dwte, float *dwpe, const float *dout,
                                            const int32_t *tokens, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    GRID_STRIDE(i, n)
    {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        float g = dout[i];
        if (dwte)
            atomicAdd(dwte + (size_t)tokens[bt] * C + c, g);
        if (dwpe)
            atomicAdd(dwpe + (size_t)t * C + c, g);
    }
}

void dt_cuda_embedding_fwd(dt_backend *be, float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int B, int T, int C)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)B * T * C;
    EW_LAUNCH(embedding_fwd_kernel, n, out, tokens, wte, wpe, B, T, C);
    DT_CU_END(DT_CU_OP_EMBEDDING_FWD, 0);
}

void dt_cuda_embedding_bwd(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                           const int32_t *tokens, int B, int T, int C)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)B * T * C;
    EW_LAUNCH(embedding_bwd_kernel, n, dwte, dwpe, dout, tokens, B, T, C);
    DT_CU_END(DT_CU_OP_EMBEDDING_BWD, 0);
}

// Vocabulary-parallel (backend_ops.h): this slice holds rows [v0, v0+Vl) of the table.
__global__ static void embedding_vp_fwd_kernel(float *out, const int32_t *tokens,
                                               const float *wte, const float *wpe, int B, int T,
                                               int C, int v0, int Vl)
{
    size_t n = (size_t)B * T * C;
    GRID_STRIDE(i, n)
    {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        int row = tokens[bt] - v0;
        float v = row >= 0 && row < Vl ? wte[(size_t)row * C + c] : 0.0f;
        if (wpe)
            v += wpe[(size_t)t * C + c];
        out[i] = v;
    }
}

__global__ static void embedding_vp_bwd_kernel(float *dwte, float *dwpe, const float *dout,
                                               const int32_t *tokens, int B, int T, int C,
                                               int v0, int Vl)
{
    size_t n = (size_t)B * T * C;
    GRID_STRIDE(i, n)
    {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        int row = tokens[bt] - v0;
        float g = dout[i];
        if (dwte && row >= 0 && row < Vl)
            atomicAdd(dwte + (size_t)row * C + c, g);
        if (dwpe)
            atomicAdd(dwpe + (size_t)t * C + c, g);
    }
}

void dt_cuda_embedding_vp_fwd(dt_backend *be, float *out, const int32_t *tokens,
                              const float *wte, const float *wpe, int B, int T, int C, int v0,
                              int Vl)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)B * T * C;
    EW_LAUNCH(embedding_vp_fwd_kernel, n, out, tokens, wte, wpe, B, T, C, v0, Vl);
    DT_CU_END(DT_CU_OP_EMBEDDING_VP_FWD, 0);
}

void dt_cuda_embedding_vp_bwd(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                              const int32_t *tokens, int B, int T, int C, int v0, int Vl)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)B * T * C;
    EW_LAUNCH(embedding_vp_bwd_kernel, n, dwte, dwpe, dout, tokens, B, T, C, v0, Vl);
    DT_CU_END(DT_CU_OP_EMBEDDING_VP_BWD, 0);
}

// =============================================================================================
// vocabulary-parallel cross-entropy: three stages around the caller's all-reduces, one block
// per row for the two row reductions, element-wise for the loss and the gradient
// =============================================================================================

#define XENT_VP_THREADS 256

__global__ static void __launch_bounds__(XENT_VP_THREADS)
    xent_vp_max_kernel(float *maxes, const float *logits, int Vl, int nv)
{
    __shared__ float part[XENT_VP_THREADS / 32];
    const float *x = logits + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < nv; j += blockDim.x)
        m = fmaxf(m, x[j]);
    for (int off = 16; off > 0; off >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0)
        part[warp] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < XENT_VP_THREADS / 32; w++)
            m = fmaxf(m, part[w]);
        maxes[blockIdx.x] = m;
    }
}

__global__ static void __launch_bounds__(XENT_VP_THREADS)
    xent_vp_sums_kernel(float *sums, const float *logits, const float *maxes,
                        const int32_t *targets, int N, int Vl, int nv, int v0)
{
    __shared__ float part[XENT_VP_THREADS / 32];
    size_t row = blockIdx.x;
    const float *x = logits + row * Vl;
    float m = maxes[row], s = 0.0f;
    for (int j = threadIdx.x; j < nv; j += blockDim.x)
        s += expf(x[j] - m);
    s = warp_sum(s);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0)
        part[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < XENT_VP_THREADS / 32; w++)
            s += part[w];
        sums[row] = s;
        int tgt = targets[row], col = tgt - v0;
        sums[(size_t)N + row] = tgt >= 0 && col >= 0 && col < nv ? x[col] : 0.0f;
    }
}

__global__ static void xent_vp_loss_kernel(float *losses, const float *maxes, const float *sums,
                                           const int32_t *targets, int N)
{
    GRID_STRIDE(i, (size_t)N)
    {
        losses[i] = targets[i] >= 0 ? maxes[i] + logf(sums[i]) - sums[(size_t)N + i] : 0.0f;
    }
}

// dlogits may alias logits: each element is read, then written, by the same thread.
__global__ static void xent_vp_grad_kernel(float *dlogits, const float *logits,
                                           const float *maxes, const float *sums,
                                           const int32_t *targets, int N, int Vl, int nv, int v0,
                                           float dloss)
{
    size_t n = (size_t)N * Vl;
    GRID_STRIDE(k, n)
    {
        size_t i = k / Vl;
        int j = (int)(k % Vl), tgt = targets[i];
        float d = 0.0f;
        if (tgt >= 0 && j < nv) {
            float lse = maxes[i] + logf(sums[i]);
            d = dloss * (expf(logits[k] - lse) - (j == tgt - v0 ? 1.0f : 0.0f));
        }
        dlogits[k] = d;
    }
}

void dt_cuda_xent_vp_max(dt_backend *be, float *maxes, const float *logits, int N, int Vl, int nv)
{
    DT_CU_BEGIN(be);
    if (N > 0) {
        xent_vp_max_kernel<<<(unsigned)N, XENT_VP_THREADS, 0, cu->stream>>>(maxes, logits, Vl,
                                                                           nv);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_XENT_VP, 0);
}

void dt_cuda_xent_vp_sums(dt_backend *be, float *sums, const float *logits, const float *maxes,
                          const int32_t *targets, int N, int Vl, int nv, int v0)
{
    DT_CU_BEGIN(be);
    if (N > 0) {
        xent_vp_sums_kernel<<<(unsigned)N, XENT_VP_THREADS, 0, cu->stream>>>(
            sums, logits, maxes, targets, N, Vl, nv, v0);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_XENT_VP, 0);
}

void dt_cuda_xent_vp_finish(dt_backend *be, float *losses, float *dlogits, const float *logits,
                            const float *maxes, const float *sums, const int32_t *targets,
                            int N, int Vl, int nv, int v0, float dloss)
{
    DT_CU_BEGIN(be);
    // the losses first: they read only maxes and sums, never the logits dlogits may overwrite
    EW_LAUNCH(xent_vp_loss_kernel, (size_t)N, losses, maxes, sums, targets, N);
    if (dlogits)
        EW_LAUNCH(xent_vp_grad_kernel, (size_t)N * Vl, dlogits, logits, maxes, sums, targets, N,
                  Vl, nv, v0, dloss);
    DT_CU_END(DT_CU_OP_XENT_VP, 0);
}

// =============================================================================================
// the fused classifier: softmax + cross-entropy + gradient, one block per row
// =============================================================================================

__device__ static inline void online_merge(float &m, float &s, float om, float os)
{
    float nm = fmaxf(m, om);
    float a = (m == -INFINITY) ? 0.0f : s * expf(m - nm);
    float b = (om == -INFINITY) ? 0.0f : os * expf(om - nm);
    m = nm;
    s = a + b;
}

// Reads the row twice (max and sum of exponentials in one online pass, then the gradient), never
// stores probabilities. dlogits may alias logits: every thread reads an element before it writes
// it, and the target logit is read before the barrier that precedes any write.
__global__ static void __launch_bounds__(1024) xent_kernel(float *losses, float *dlogits, const float *logits,
                                   const int32_t *targets, int V, float dloss, int *valid_count)
{
    __shared__ float wm[32], wsum[32];
    __shared__ float row_m, row_s;
    size_t row = blockIdx.x;
    const float *x = logits + row * V;
    int tgt = targets[row];
    bool valid = tgt >= 0 && tgt < V;
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = x[j];
        if (v > m) {
            s = (m == -INFINITY) ? 1.0f : s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1)
        online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, off),
                     __shfl_xor_sync(0xffffffffu, s, off));
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    if (lane == 0) {
        wm[warp] = m;
        wsum[warp] = s;
    }
    float xt = (threadIdx.x == 0 && valid) ? x[tgt] : 0.0f;
    __syncthreads();
    if (warp == 0) {
        m = lane < nw ? wm[lane] : -INFINITY;
        s = lane < nw ? wsum[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1)
            online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, off),
                         __shfl_xor_sync(0xffffffffu, s, off));
        if (lane == 0) {
            row_m = m;
            row_s = s;
            if (losses)
                losses[row] = valid ? logf(s) + m - xt : 0.0f;
            if (valid && valid_count)
                atomicAdd(valid_count, 1);
        }
    }
    __syncthreads();
    if (!dlogits)
        return;
    float *d = dlogits + row * V;
    m = row_m;
    float inv = 1.0f / row_s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float p = expf(x[j] - m) * inv;
        d[j] = valid ? dloss * (p - (j == tgt ? 1.0f : 0.0f)) : 0.0f;
    }
}

void dt_cuda_xent_fwd_bwd(dt_backend *be, float *losses, float *dlogits, const float *logits,
                          const int32_t *targets, int N, int V, float dloss, int *valid_count)
{
    DT_CU_BEGIN(be);
    int *counter = NULL;
    if (valid_count) {
        counter = (int *)dt_cuda_scratch(cu, DT_CU_SCR_RED, 64);
        if (counter)
            DT_CU_CHECK(cu, cudaMemsetAsync(counter, 0, sizeof(int), cu->stream));
    }
    if (N > 0) {
        int threads = V >= 4096 ? 1024 : V >= 1024 ? 512 : 128;
        xent_kernel<<<(unsigned)N, threads, 0, cu->stream>>>(losses, dlogits, logits, targets, V,
                                                             dloss, counter);
        DT_CU_LAUNCHED(cu);
    }
    if (valid_count) {
        const void *h = counter ? read_back(cu, counter, sizeof(int)) : NULL;
        *valid_count = h ? *(const int *)h : -1;
    }
    DT_CU_END(DT_CU_OP_XENT, 0);
}

// =============================================================================================
// BatchNorm stages (kernels/backend_ops.h: SyncBatchNorm all-reduces between them)
// =============================================================================================

// Shifted values d = x - K, K = the channel's first value (sample 0, position 0): sum(d) and
// sum(d^2) accumulate in double without the cancellation of E[x^2] - mean^2 (as the CPU
// reference, kernels/cpu/cpu_ops.c).
struct BnStatsF {
    const float *x;
    int HW;
    __device__ float2 operator()(size_t idx, int c) const
    {
        float d = x[idx] - x[(size_t)c * HW];
        return make_float2(d, d * d);
    }
};

// sum = sum(d) + n*K, sumsq = M2 = sum(d^2) - sum(d)^2/n (the centred sum of squares).
__global__ static void bn_stats_finalize_kernel(const double *acc, const float *x, int C, int HW,
                                                double cnt, float *sum, float *sumsq)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double s = acc[c], q = acc[C + c];
    double K = cnt > 0.0 ? (double)x[(size_t)c * HW] : 0.0;
    double m2 = cnt > 0.0 ? q - s * s / cnt : 0.0;
    sum[c] = (float)(s + cnt * K);
    sumsq[c] = (float)(m2 > 0.0 ? m2 : 0.0);
}

void dt_cuda_bn_stats(dt_backend *be, float *sum, float *sumsq, const float *inp, int N, int C,
                      int HW)
{
    DT_CU_BEGIN(be);
    double *acc = chanreduce(cu, N, C, HW, BnStatsF{inp, HW});
    if (acc) {
        bn_stats_finalize_kernel<<<dt_cu_blocks((size_t)C, THREADS), THREADS, 0, cu->stream>>>(
            acc, inp, C, HW, (double)N * HW, sum, sumsq);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_BN_STATS, 0);
}

// Per channel: mean, rstd from the (global) sums; running statistics with momentum (unbiased
// variance, as PyTorch).
__global__ static void bn_moments_kernel(float *mean, float *rstd, float *running_mean,
                                         float *running_var, const float *sum, const float *sumsq,
                                         double count, int C, float momentum, float eps)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double m = (double)sum[c] / count;
    double var = (double)sumsq[c] / count; // sumsq is the centred M2 (bn_stats)
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

// out = w * (x - mean) * rstd + b per channel (w, b may be NULL: 1 and 0).
__global__ static void bn_apply_kernel(float *out, const float *inp, const float *mean,
                                       const float *rstd, const float *w, const float *b, int N,
                                       int C, int HW)
{
    size_t n = (size_t)N * C * HW;
    GRID_STRIDE(i, n)
    {
        int c = (int)((i / HW) % C);
        out[i] = (w ? w[c] : 1.0f) * (inp[i] - mean[c]) * rstd[c] + (b ? b[c] : 0.0f);
    }
}

void dt_cuda_bn_fwd_apply(dt_backend *be, float *out, float *mean, float *rstd,
                          float *running_mean, float *running_var, const float *inp,
                          const float *w, const float *b, const float *sum, const float *sumsq,
                          double count, int N, int C, int HW, float momentum, float eps)
{
    DT_CU_BEGIN(be);
    float *tmp = NULL;
    if (!mean || !rstd) { // not needed by the caller (eval-like use): keep them in scratch
        tmp = (float *)dt_cuda_scratch(cu, DT_CU_SCR_RED, 2 * (size_t)C * sizeof(float));
        if (!tmp)
            goto out;
        if (!mean)
            mean = tmp;
        if (!rstd)
            rstd = tmp + C;
    }
    bn_moments_kernel<<<dt_cu_blocks((size_t)C, THREADS), THREADS, 0, cu->stream>>>(
        mean, rstd, running_mean, running_var, sum, sumsq, count, C, momentum, eps);
    DT_CU_LAUNCHED(cu);
    EW_LAUNCH(bn_apply_kernel, (size_t)N * C * HW, out, inp, mean, rstd, w, b, N, C, HW);
out:
    DT_CU_END(DT_CU_OP_BN_FWD_APPLY, 0);
}

__global__ static void bn_eval_kernel(float *out, const float *inp, const float *rm,
                                      const float *rv, const float *w, const float *b, int N,
                                      int C, int HW, float eps)
{
    size_t n = (size_t)N * C * HW;
    GRID_STRIDE(i, n)
    {
        int c = (int)((i / HW) % C);
        float rs = 1.0f / sqrtf(rv[c] + eps);
        out[i] = (w ? w[c] : 1.0f) * (inp[i] - rm[c]) * rs + (b ? b[c] : 0.0f);
    }
}

void dt_cuda_bn_fwd_eval(dt_backend *be, float *out, const float *inp, const float *running_mean,
                         const float *running_var, const float *w, const float *b, int N, int C,
                         int HW, float eps)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(bn_eval_kernel, (size_t)N * C * HW, out, inp, running_mean, running_var, w, b, N, C,
              HW, eps);
    DT_CU_END(DT_CU_OP_BN_FWD_EVAL, 0);
}

struct BnBwdF {
    const float *dy, *x, *mean, *rstd;
    __device__ float2 operator()(size_t idx, int c) const
    {
        float g = dy[idx];
        return make_float2(g, g * (x[idx] - mean[c]) * rstd[c]);
    }
};

void dt_cuda_bn_bwd_reduce(dt_backend *be, float *dw, float *db, float *sum_dy,
                           float *sum_dy_xhat, const float *dout, const float *inp,
                           const float *mean, const float *rstd, int N, int C, int HW)
{
    DT_CU_BEGIN(be);
    double *acc = chanreduce(cu, N, C, HW, BnBwdF{dout, inp, mean, rstd});
    if (acc)
        chan_finalize(cu, acc, C, sum_dy, sum_dy_xhat, db, dw);
    DT_CU_END(DT_CU_OP_BN_BWD_REDUCE, 0);
}

__global__ static void bn_bwd_apply_kernel(float *dinp, const float *dout, const float *inp,
                                           const float *w, const float *mean, const float *rstd,
                                           const float *sum_dy, const float *sum_dy_xhat,
                                           float inv_count, int N, int C, int HW)
{
    size_t n = (size_t)N * C * HW;
    GRID_STRIDE(i, n)
    {
        int c = (int)((i / HW) % C);
        float rs = rstd[c];
        float xh = (inp[i] - mean[c]) * rs;
        dinp[i] += (w ? w[c] : 1.0f) * rs *
                   (dout[i] - sum_dy[c] * inv_count - xh * sum_dy_xhat[c] * inv_count);
    }
}

void dt_cuda_bn_bwd_apply(dt_backend *be, float *dinp, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd,
                          const float *sum_dy, const float *sum_dy_xhat, double count, int N,
                          int C, int HW)
{
    DT_CU_BEGIN(be);
    float inv_count = (float)(1.0 / count);
    EW_LAUNCH(bn_bwd_apply_kernel, (size_t)N * C * HW, dinp, dout, inp, w, mean, rstd, sum_dy,
              sum_dy_xhat, inv_count, N, C, HW);
    DT_CU_END(DT_CU_OP_BN_BWD_APPLY, 0);
}

// =============================================================================================
// pooling
// =============================================================================================

// One thread per output; idx is the argmax within the input plane (h*W + w); ties keep the first
// in row-major window order; a window entirely in the padding gives 0 and idx -1 (as the CPU).
__global__ static void maxpool_fwd_kernel(float *out, int32_t *idx, const float *inp, int N, int C,
                                          int H, int W, int k, int stride, int pad, int P, int Q)
{
    size_t n = (size_t)N * C * P * Q;
    GRID_STRIDE(i, n)
    {
        int q = (int)(i % Q), p = (int)((i / Q) % P);
        size_t plane = i / ((size_t)P * Q);
        const float *x = inp + plane * H * W;
        float best = -INFINITY;
        int bi = -1;
        for (int r = 0; r < k; r++) {
            int h = p * stride - pad + r;
            if (h < 0 || h >= H)
                continue;
            for (int s = 0; s < k; s++) {
                int ww = q * stride - pad + s;
                if (ww < 0 || ww >= W)
                    continue;
                float v = x[h * W + ww];
                if (bi < 0 || v > best) {
                    best = v;
                    bi = h * W + ww;
                }
            }
        }
        out[i] = bi < 0 ? 0.0f : best;
        idx[i] = bi;
    }
}

__global__ static void maxpool_bwd_kernel(float *dinp, const float *dout, const int32_t *idx,
                                          int N, int C, int H, int W, int P, int Q)
{
    size_t n = (size_t)N * C * P * Q;
    GRID_STRIDE(i, n)
    {
        int j = idx[i];
        if (j >= 0)
            atomicAdd(dinp + (i / ((size_t)P * Q)) * H * W + j, dout[i]);
    }
}

void dt_cuda_maxpool_fwd(dt_backend *be, float *out, int32_t *idx, const float *inp, int N, int C,
                         int H, int W, int k, int stride, int pad)
{
    DT_CU_BEGIN(be);
    int P = (H + 2 * pad - k) / stride + 1, Q = (W + 2 * pad - k) / stride + 1;
    EW_LAUNCH(maxpool_fwd_kernel, (size_t)N * C * P * Q, out, idx, inp, N, C, H, W, k, stride, pad,
              P, Q);
    DT_CU_END(DT_CU_OP_MAXPOOL_FWD, 0);
}

void dt_cuda_maxpool_bwd(dt_backend *be, float *dinp, const float *dout, const int32_t *idx,
                         int N, int C, int H, int W, int P, int Q)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(maxpool_bwd_kernel, (size_t)N * C * P * Q, dinp, dout, idx, N, C, H, W, P, Q);
    DT_CU_END(DT_CU_OP_MAXPOOL_BWD, 0);
}

// One warp per (n,c) plane.
__global__ static void avgpool_fwd_kernel(float *out, const float *inp, int planes, int HW)
{
    int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    int pl = blockIdx.x * warps + threadIdx.x / 32;
    if (pl >= planes)
        return;
    const float *x = inp + (size_t)pl * HW;
    float s = 0.0f;
    for (int j = lane; j < HW; j += 32)
        s += x[j];
    s = warp_sum(s);
    if (lane == 0)
        out[pl] = s / HW;
}

__global__ static void avgpool_bwd_kernel(float *dinp, const float *dout, size_t n, int HW)
{
    GRID_STRIDE(i, n)
    dinp[i] += dout[i / HW] / (float)HW;
}

void dt_cuda_avgpool_fwd(dt_backend *be, float *out, const float *inp, int N, int C, int HW)
{
    DT_CU_BEGIN(be);
    int planes = N * C, warps = THREADS / 32;
    if (planes > 0) {
        avgpool_fwd_kernel<<<(unsigned)((planes + warps - 1) / warps), THREADS, 0, cu->stream>>>(
            out, inp, planes, HW);
        DT_CU_LAUNCHED(cu);
    }
    DT_CU_END(DT_CU_OP_AVGPOOL_FWD, 0);
}

void dt_cuda_avgpool_bwd(dt_backend *be, float *dinp, const float *dout, int N, int C, int HW)
{
    DT_CU_BEGIN(be);
    size_t n = (size_t)N * C * HW;
    EW_LAUNCH(avgpool_bwd_kernel, n, dinp, dout, n, HW);
    DT_CU_END(DT_CU_OP_AVGPOOL_BWD, 0);
}

// =============================================================================================
// optimisers
// =============================================================================================

__global__ static void sgd_kernel(float *p, const float *grads, float *buf, size_t n, float lr,
                                  float momentum, bool nesterov, float wd, bool first)
{
    GRID_STRIDE(i, n)
    {
        float g = grads[i] + wd * p[i];
        float step = g;
        if (momentum != 0.0f) {
            float b = first ? g : momentum * buf[i] + g;
            buf[i] = b;
            step = nesterov ? g + momentum * b : b;
        }
        p[i] -= lr * step;
    }
}

// PyTorch's AdamW order (as the CPU reference): p *= 1 - lr*wd; m = lerp(m, g, 1-b1);
// v = b2 v + (1-b2) g^2; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
/* a = 1 - b1, c = 1 - b2, decay, step_size and sqrt_bc2 formed in double on the host. */
__global__ static void adamw_kernel(float *p, const float *grads, float *m, float *v, size_t n,
                                    float a, float b2, float c, float eps, float decay,
                                    float step_size, float sqrt_bc2)
{
    GRID_STRIDE(i, n)
    {
        float g = grads[i];
        float pi = p[i] * decay;
        float mi = m[i] + a * (g - m[i]);
        float vi = v[i] * b2 + c * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * (mi / (sqrtf(vi) / sqrt_bc2 + eps));
    }
}

void dt_cuda_sgd_update(dt_backend *be, float *params, const float *grads, float *momentum_buf,
                        size_t n, float lr, float momentum, bool nesterov, float weight_decay,
                        bool first_step)
{
    DT_CU_BEGIN(be);
    EW_LAUNCH(sgd_kernel, n, params, grads, momentum_buf, n, lr, momentum, nesterov, weight_decay,
              first_step);
    DT_CU_END(DT_CU_OP_SGD, 0);
}

void dt_cuda_adamw_update(dt_backend *be, float *params, const float *grads, float *m, float *v,
                          size_t n, double lr, double beta1, double beta2, double eps,
                          double weight_decay, int64_t t)
{
    DT_CU_BEGIN(be);
    /* in double, rounded once: torch.optim.AdamW's Python-float arithmetic */
    double bc1 = 1.0 - pow(beta1, (double)t);
    double bc2 = 1.0 - pow(beta2, (double)t);
    float a = (float)(1.0 - beta1), b2 = (float)beta2, c = (float)(1.0 - beta2);
    float step_size = (float)(lr / bc1), sqrt_bc2 = (float)sqrt(bc2);
    float decay = (float)(1.0 - lr * weight_decay);
    EW_LAUNCH(adamw_kernel, n, params, grads, m, v, n, a, b2, c, (float)eps, decay, step_size,
              sqrt_bc2);
    DT_CU_END(DT_CU_OP_ADAMW, 0);
}

// =============================================================================================
// reductions to the host
// =============================================================================================

__global__ static void sumsq_kernel(double *acc, const float *x, size_t n)
{
    double s = 0.0;
    GRID_STRIDE(i, n)
    {
        double v = x[i];
        s += v * v;
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0)
        atomicAdd(acc, s);
}

__global__ static void nonfinite_kernel(unsigned long long *acc, const float *x, size_t n)
{
    unsigned long long c = 0;
    GRID_STRIDE(i, n)
    c += isfinite(x[i]) ? 0ull : 1ull;
    for (int off = 16; off > 0; off >>= 1)
        c += __shfl_xor_sync(0xffffffffu, c, off);
    if (threadIdx.x % 32 == 0 && c)
        atomicAdd(acc, c);
}

double dt_cuda_sumsq(dt_backend *be, const float *x, size_t n)
{
    DT_CU_BEGIN(be);
    double r = NAN;
    double *acc = (double *)dt_cuda_scratch(cu, DT_CU_SCR_RED, 64);
    if (acc) {
        DT_CU_CHECK(cu, cudaMemsetAsync(acc, 0, sizeof(double), cu->stream));
        if (n > 0) {
            sumsq_kernel<<<reduce_blocks(cu, n), THREADS, 0, cu->stream>>>(acc, x, n);
            DT_CU_LAUNCHED(cu);
        }
        const void *h = read_back(cu, acc, sizeof(double));
        if (h)
            r = *(const double *)h;
    }
    DT_CU_END(DT_CU_OP_SUMSQ, 0);
    return r;
}

size_t dt_cuda_count_nonfinite(dt_backend *be, const float *x, size_t n)
{
    DT_CU_BEGIN(be);
    size_t r = n ? n : 1; // after a failure: everything is suspect
    unsigned long long *acc = (unsigned long long *)dt_cuda_scratch(cu, DT_CU_SCR_RED, 64);
    if (acc) {
        DT_CU_CHECK(cu, cudaMemsetAsync(acc, 0, sizeof *acc, cu->stream));
        if (n > 0) {
            nonfinite_kernel<<<reduce_blocks(cu, n), THREADS, 0, cu->stream>>>(acc, x, n);
            DT_CU_LAUNCHED(cu);
        }
        const void *h = read_back(cu, acc, sizeof *acc);
        if (h)
            r = (size_t) * (const unsigned long long *)h;
    }
    DT_CU_END(DT_CU_OP_NONFINITE, 0);
    return r;
}
