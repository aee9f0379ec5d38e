/* cpu.h - internals of the CPU backend (kernels/cpu), shared by its source files only.
 *
 * The CPU backend is the reference implementation of kernels/backend_ops.h: float32 throughout,
 * GEMMs through OpenBLAS (cblas_sgemm), everything else plain loops. Its files:
 *
 *   cpu_backend.c  lifecycle, memory, profiling, the op table
 *   cpu_gemm.c     sgemm-bound ops: matmul, bidirectional attention with a padding mask
 *                  (attention_pad: batched sgemm per batch and head, full (T,T)), conv2d
 *                  (im2col + sgemm, chunked through a private scratch)
 *   cpu_attention.c causal attention with flash-attention's tiling (its own micro-kernels,
 *                  online softmax; saves the log-sum-exp, never a (T,T) matrix)
 *   cpu_ops.c      element-wise, normalisation, softmax, loss, embeddings, BatchNorm, pooling
 *   cpu_optim.c    SGD, AdamW, sum of squares, non-finite count
 *
 * Vectorisation. The Makefile builds with -O2, at which GCC 12 vectorises almost nothing, and for
 * baseline x86-64 (SSE2). The kernel files therefore ask for -O3 with -fno-trapping-math and
 * -fno-math-errno (without them no loop with a comparison or a sqrt is if-converted) and
 * -ffp-contract=fast (FMA where the target has it) through DT_CPU_OPTIMIZE, and compile their hot
 * loops twice, for x86-64-v3 (AVX2+FMA) and baseline, picked at load time by the dynamic loader
 * (DT_CPU_CLONES). Results are deterministic on a given machine; two machines that pick
 * different clones may differ in the last bits. exp and tanh are polynomial approximations that
 * vectorise (libm's are scalar calls: with them GELU alone would cost as much as the GEMMs of
 * gpt-tiny).
 *
 * Profiling: every op starts with DT_CPU_PROF_BEGIN and ends with DT_CPU_PROF_END (a no-op
 * unless profile_enable(true)). GEMM-bound ops report only their GEMM time under their own name;
 * the non-GEMM work inside them (the attention softmax, im2col/col2im, bias columns) is reported
 * under separate non-GEMM entries, so that "share of time in GEMM" means what it says.
 */
#ifndef DT_KERNELS_CPU_H
#define DT_KERNELS_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend_ops.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#define DT_CPU_OPTIMIZE _Pragma("GCC optimize(\"O3\", \"no-trapping-math\", \"no-math-errno\", \"fp-contract=fast\")")
#else
#define DT_CPU_OPTIMIZE
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__OPTIMIZE__) &&    \
    !defined(DT_CPU_NO_CLONES)
#define DT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DT_CPU_CLONES
#endif

/* Every profiled entry. The order is the order profile_read reports them in. */
enum {
    DT_CPU_OP_MEMCPY,
    DT_CPU_OP_MEMSET,
    DT_CPU_OP_MATMUL_FWD,
    DT_CPU_OP_MATMUL_BWD,
    DT_CPU_OP_MATMUL_BIAS,   /* bias broadcast / column sums inside matmul (non-GEMM) */
    DT_CPU_OP_ATTN_FWD,
    DT_CPU_OP_ATTN_BWD,
    DT_CPU_OP_ATTN_SOFTMAX_FWD, /* softmax inside attention_fwd (non-GEMM) */
    DT_CPU_OP_ATTN_SOFTMAX_BWD, /* softmax backward inside attention_bwd (non-GEMM) */
    DT_CPU_OP_CONV_FWD,
    DT_CPU_OP_CONV_BWD,
    DT_CPU_OP_CONV_IM2COL,   /* im2col / col2im / bias inside conv2d (non-GEMM) */
    DT_CPU_OP_BIAS_ADD,
    DT_CPU_OP_BIAS_BWD,
    DT_CPU_OP_LAYERNORM_FWD,
    DT_CPU_OP_LAYERNORM_BWD,
    DT_CPU_OP_GELU_FWD,
    DT_CPU_OP_GELU_BWD,
    DT_CPU_OP_RELU_FWD,
    DT_CPU_OP_RELU_BWD,
    DT_CPU_OP_RESIDUAL,
    DT_CPU_OP_ACCUMULATE,
    DT_CPU_OP_SCALE,
    DT_CPU_OP_EMBEDDING_FWD,
    DT_CPU_OP_EMBEDDING_BWD,
    DT_CPU_OP_XENT,
    DT_CPU_OP_BN_STATS,
    DT_CPU_OP_BN_FWD_APPLY,
    DT_CPU_OP_BN_FWD_EVAL,
    DT_CPU_OP_BN_BWD_REDUCE,
    DT_CPU_OP_BN_BWD_APPLY,
    DT_CPU_OP_MAXPOOL_FWD,
    DT_CPU_OP_MAXPOOL_BWD,
    DT_CPU_OP_AVGPOOL_FWD,
    DT_CPU_OP_AVGPOOL_BWD,
    DT_CPU_OP_SGD,
    DT_CPU_OP_ADAMW,
    DT_CPU_OP_SUMSQ,
    DT_CPU_OP_NONFINITE,
    DT_CPU_OP_TO_HALF,
    DT_CPU_OP_FROM_HALF,
    DT_CPU_OP_EMBEDDING_VP_FWD,
    DT_CPU_OP_EMBEDDING_VP_BWD,
    DT_CPU_OP_XENT_VP,
    DT_CPU_OP_ATTN_PAD_FWD,
    DT_CPU_OP_ATTN_PAD_BWD,
    DT_CPU_OP_GELU_ERF_FWD,
    DT_CPU_OP_GELU_ERF_BWD,
    DT_CPU_OP_TANH_FWD,
    DT_CPU_OP_TANH_BWD,
    DT_CPU_OP_RMSNORM_FWD,
    DT_CPU_OP_RMSNORM_BWD,
    DT_CPU_OP_SWIGLU_FWD,
    DT_CPU_OP_SWIGLU_BWD,
    DT_CPU_OP_ROPE_QKV_FWD,
    DT_CPU_OP_ROPE_QKV_BWD,
    DT_CPU_OP_COUNT
};

typedef struct dt_cpu {
    int threads;
    size_t cur_bytes, peak_bytes; /* resident bytes (all categories) now, and their peak */
    dt_mem_stats mem;             /* the same by category */
    dt_mem_cat mem_cat;           /* what alloc charges now */
    size_t mem_limit;             /* the budget (dt_backend_opts.mem_limit; 0: none) */
    /* conv2d scratch (im2col columns), grown on demand, owned */
    float *scratch;
    size_t scratch_cap; /* floats */
    bool prof_on;
    dt_op_stat stats[DT_CPU_OP_COUNT];
    bool attn_resolved; /* attn_variant was chosen (by the instance's first attention call) */
    int attn_variant;   /* DT_CPU_ATT_*: the attention micro-kernels' instruction set */
} dt_cpu;

#define dt_cpu_of(be) ((dt_cpu *)(be)->impl)

/* Monotonic seconds when profiling is on, else 0 (no clock call). */
double dt_cpu_prof_now(const dt_cpu *c);
/* Adds one call of op that started at t0 (from dt_cpu_prof_now) with `flops`. */
void dt_cpu_prof_add(dt_cpu *c, int op, double t0, double flops);
/* Adds time to op without counting a call (sub-phases of a bigger op). */
void dt_cpu_prof_time(dt_cpu *c, int op, double t0, double flops);

#define DT_CPU_PROF_BEGIN(be) double prof_t0_ = dt_cpu_prof_now(dt_cpu_of(be))
#define DT_CPU_PROF_END(be, op, flops)                                                             \
    do {                                                                                           \
        if (dt_cpu_of(be)->prof_on)                                                                \
            dt_cpu_prof_add(dt_cpu_of(be), (op), prof_t0_, (flops));                               \
    } while (0)

/* Makes sure the scratch holds at least n floats; false when memory is short (the caller then
 * works in smaller pieces or falls back to a direct loop). */
bool dt_cpu_scratch_reserve(dt_cpu *c, size_t n);

/* ---- cpu_gemm.c ---- */
void dt_cpu_matmul_fwd(dt_backend *be, float *out, const float *inp, const float *w,
                       const float *bias, int N, int C, int OC);
void dt_cpu_matmul_bwd(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC);
void dt_cpu_attention_pad_fwd(dt_backend *be, float *out, float *att, const float *qkv,
                              const int32_t *mask, int B, int T, int C, int NH);
void dt_cpu_attention_pad_bwd(dt_backend *be, float *dqkv, float *datt, const float *dout,
                              const float *qkv, const float *att, int B, int T, int C, int NH);
void dt_cpu_conv2d_fwd(dt_backend *be, float *out, const float *inp, const float *w,
                       const float *bias, const dt_conv2d_shape *s);
void dt_cpu_conv2d_bwd(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, const dt_conv2d_shape *s);

/* ---- cpu_attention.c ---- */
/* The attention micro-kernels are compiled for these instruction sets. */
enum { DT_CPU_ATT_BASE = 0, DT_CPU_ATT_V3 = 1, DT_CPU_ATT_V4 = 2 };
/* The variant an instance uses from its first attention call on: the best the CPU runs (x86-64-v4: AVX-512, v3: AVX2+FMA,
 * base: the build's baseline), or DTRAIN_CPU_ATTN_ISA's when the CPU runs that (else a
 * warning and the best). */
int dt_cpu_attention_variant(void);
const char *dt_cpu_attention_variant_name(int v);
void dt_cpu_attention_sizes(dt_backend *be, int B, int T, int C, int NH, size_t *att,
                            size_t *datt);
void dt_cpu_attention_fwd(dt_backend *be, float *out, float *att, const float *qkv, int B, int T,
                          int C, int NH);
void dt_cpu_attention_bwd(dt_backend *be, float *dqkv, float *datt, const float *dout,
                          const float *qkv, const float *att, int B, int T, int C, int NH);

/* ---- cpu_ops.c: helpers used by cpu_gemm.c ---- */
/* Softmax of each of the n rows of (n,T) scores over the columns s with mask[s] != 0 (mask (T),
 * NULL: all), the other columns 0; a row with no such column is all 0. att may alias scores. */
void dt_cpu_softmax_masked(float *att, const float *scores, const int32_t *mask, int n, int T);
/* Softmax backward of n full rows, in place: d[t,s] = scale * p[t,s] * (d[t,s] - sum_u p[t,u]
 * d[t,u]) (0 where p is 0: the masked columns). */
void dt_cpu_softmax_rows_bwd(float *d, const float *p, int n, int T, float scale);
/* out (N,C) = bias broadcast (bias != NULL) */
void dt_cpu_rows_set(float *out, const float *bias, int N, int C);
/* dbias (C) += column sums of x (N,C) with row stride ld. */
void dt_cpu_colsum_acc(float *dbias, const float *x, int N, int C, int ld);
/* Sum of x (n) in double. */
double dt_cpu_sum(const float *x, size_t n);

/* ---- cpu_ops.c: op table entries ---- */
void dt_cpu_bias_add(dt_backend *be, float *out, const float *bias, int N, int C);
void dt_cpu_bias_bwd(dt_backend *be, float *dbias, const float *dout, int N, int C);
void dt_cpu_layernorm_fwd(dt_backend *be, float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C, float eps);
void dt_cpu_layernorm_bwd(dt_backend *be, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int N, int C);
void dt_cpu_gelu_fwd(dt_backend *be, float *out, const float *inp, size_t n);
void dt_cpu_gelu_bwd(dt_backend *be, float *dinp, const float *inp, const float *dout, size_t n);
void dt_cpu_gelu_erf_fwd(dt_backend *be, float *out, const float *inp, size_t n);
void dt_cpu_gelu_erf_bwd(dt_backend *be, float *dinp, const float *inp, const float *dout,
                         size_t n);
void dt_cpu_tanh_fwd(dt_backend *be, float *out, const float *inp, size_t n);
void dt_cpu_tanh_bwd(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n);
void dt_cpu_relu_fwd(dt_backend *be, float *out, const float *inp, size_t n);
void dt_cpu_relu_bwd(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n);
void dt_cpu_residual_fwd(dt_backend *be, float *out, const float *a, const float *b, size_t n);
void dt_cpu_accumulate(dt_backend *be, float *dst, const float *src, size_t n);
void dt_cpu_scale(dt_backend *be, float *x, size_t n, float s);
void dt_cpu_embedding_fwd(dt_backend *be, float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C);
void dt_cpu_embedding_bwd(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                          const int32_t *tokens, int B, int T, int C);
void dt_cpu_xent_fwd_bwd(dt_backend *be, float *losses, float *dlogits, const float *logits,
                         const int32_t *targets, int N, int V, float dloss, int *valid_count);
void dt_cpu_embedding_vp_fwd(dt_backend *be, float *out, const int32_t *tokens,
                             const float *wte, const float *wpe, int B, int T, int C, int v0,
                             int Vl);
void dt_cpu_embedding_vp_bwd(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, int B, int T, int C, int v0, int Vl);
void dt_cpu_xent_vp_max(dt_backend *be, float *maxes, const float *logits, int N, int Vl, int nv);
void dt_cpu_xent_vp_sums(dt_backend *be, float *sums, const float *logits, const float *maxes,
                         const int32_t *targets, int N, int Vl, int nv, int v0);
void dt_cpu_xent_vp_finish(dt_backend *be, float *losses, float *dlogits, const float *logits,
                           const float *maxes, const float *sums, const int32_t *targets, int N,
                           int Vl, int nv, int v0, float dloss);
void dt_cpu_rmsnorm_fwd(dt_backend *be, float *out, float *rstd, const float *inp, const float *w,
                        int N, int C, float eps);
void dt_cpu_rmsnorm_bwd(dt_backend *be, float *dinp, float *dw, const float *dout,
                        const float *inp, const float *w, const float *rstd, int N, int C);
void dt_cpu_swiglu_fwd(dt_backend *be, float *out, const float *inp, int N, int F);
void dt_cpu_swiglu_bwd(dt_backend *be, float *dinp, const float *dout, const float *inp, int N,
                       int F);
void dt_cpu_rope_qkv_fwd(dt_backend *be, float *out, const float *inp, int B, int T, int NH,
                         int NKV, int hs, float theta);
void dt_cpu_rope_qkv_bwd(dt_backend *be, float *dinp, const float *dout, int B, int T, int NH,
                         int NKV, int hs, float theta);
void dt_cpu_bn_stats(dt_backend *be, float *sum, float *sumsq, const float *inp, int N, int C,
                     int HW);
void dt_cpu_bn_fwd_apply(dt_backend *be, float *out, float *mean, float *rstd,
                         float *running_mean, float *running_var, const float *inp,
                         const float *w, const float *b, const float *sum, const float *sumsq,
                         double count, int N, int C, int HW, float momentum, float eps);
void dt_cpu_bn_fwd_eval(dt_backend *be, float *out, const float *inp, const float *running_mean,
                        const float *running_var, const float *w, const float *b, int N, int C,
                        int HW, float eps);
void dt_cpu_bn_bwd_reduce(dt_backend *be, float *dw, float *db, float *sum_dy, float *sum_dy_xhat,
                          const float *dout, const float *inp, const float *mean,
                          const float *rstd, int N, int C, int HW);
void dt_cpu_bn_bwd_apply(dt_backend *be, float *dinp, const float *dout, const float *inp,
                         const float *w, const float *mean, const float *rstd,
                         const float *sum_dy, const float *sum_dy_xhat, double count, int N,
                         int C, int HW);
void dt_cpu_maxpool_fwd(dt_backend *be, float *out, int32_t *idx, const float *inp, int N, int C,
                        int H, int W, int k, int stride, int pad);
void dt_cpu_maxpool_bwd(dt_backend *be, float *dinp, const float *dout, const int32_t *idx, int N,
                        int C, int H, int W, int P, int Q);
void dt_cpu_avgpool_fwd(dt_backend *be, float *out, const float *inp, int N, int C, int HW);
void dt_cpu_avgpool_bwd(dt_backend *be, float *dinp, const float *dout, int N, int C, int HW);

/* ---- cpu_optim.c ---- */
void dt_cpu_sgd_update(dt_backend *be, float *params, const float *grads, float *momentum_buf,
                       size_t n, float lr, float momentum, bool nesterov, float weight_decay,
                       bool first_step);
void dt_cpu_adamw_update(dt_backend *be, float *params, const float *grads, float *m, float *v,
                         size_t n, double lr, double beta1, double beta2, double eps,
                         double weight_decay, int64_t t);
double dt_cpu_sumsq(dt_backend *be, const float *x, size_t n);
size_t dt_cpu_count_nonfinite(dt_backend *be, const float *x, size_t n);
void dt_cpu_to_half(dt_backend *be, uint16_t *half, const float *x, size_t n, float scale,
                    bool bf16);
void dt_cpu_from_half(dt_backend *be, float *x, const uint16_t *half, size_t n, float scale,
                      bool bf16);

#endif
