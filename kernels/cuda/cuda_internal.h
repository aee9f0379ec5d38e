// cuda_internal.h - internals of the CUDA backend (kernels/cuda), shared by its .cu files only.
//
// Files of libdtrain_cuda.so:
//   core.cu      the failure state (dt_cuda_note) and the memory statistics (dt_cuda_mem_charge)
//                every other file reports to
//   backend.cu   lifecycle, the memory arena and scratch, copies, profiling, the op table, and
//                the per-device compute-stream registry the NCCL backend reads
//   vmm.cu       allocations of a granule (2 MiB) and more on the driver's virtual memory
//                management, so mem_release / mem_commit can give memory back and take it again
//   gemm.cu      GEMM-bound ops: matmul (cuBLASLt, bias epilogue), attention (cuBLAS batched
//                GEMMs around own permute/softmax kernels), conv2d (cuDNN)
//   ops.cu       everything else: element-wise, LayerNorm, embeddings, the fused classifier,
//                BatchNorm stages, pooling, optimisers, reductions
//   ../../runtime/comm/comm_nccl.cu   the NCCL comm backend (uses the stream registry below)
//
// Precision (kernels/backend_ops.h): every tensor the op table sees is float32. Precision only
// changes how GEMMs compute:
//   fp32  true fp32 (CUBLAS_COMPUTE_32F, cuDNN FMA math), so the CUDA backend matches the CPU
//         reference closely; DTRAIN_CUDA_TF32=1 allows TF32 tensor cores instead.
//   bf16  GEMM inputs rounded to bfloat16, tensor cores, fp32 accumulation and fp32 output.
//         DTRAIN_CUDA_GEMM=convert (default) converts A and B into a bf16 scratch and runs a
//         native bf16 x bf16 -> fp32 GEMM; =fast hands the fp32 matrices to cuBLAS with
//         CUBLAS_COMPUTE_32F_FAST_16BF and lets it down-convert. Convolutions use TF32 (cuDNN's
//         tensor-core path for fp32 tensors).
//   fp16  as bf16 with float16 (values beyond 65504 become inf: the worker's loss scaling and
//         count_nonfinite handle that).
//
// Errors: ops cannot return errors (kernels/backend_ops.h). The first CUDA/cuBLAS/cuDNN failure is
// logged once with file and line, the backend is marked failed, and from then on every read back
// to the host (memcpy_d2h, sumsq, count_nonfinite, xent's valid_count) returns NaN / all-ones
// bytes, so the worker sees a non-finite loss and stops instead of training on garbage.
#ifndef DT_CUDA_INTERNAL_H
#define DT_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "common/err.h"
#include "common/log.h"
#include "kernels/backend_ops.h"
}

// ---- profiled entries (profile_read reports them in this order) ------------------------------
enum {
    DT_CU_OP_MEMCPY,
    DT_CU_OP_MEMSET,
    DT_CU_OP_MATMUL_FWD,
    DT_CU_OP_MATMUL_BWD,
    DT_CU_OP_ATTN_FWD,
    DT_CU_OP_ATTN_BWD,
    DT_CU_OP_CONV_FWD,
    DT_CU_OP_CONV_BWD,
    DT_CU_OP_BIAS_ADD,
    DT_CU_OP_BIAS_BWD,
    DT_CU_OP_LAYERNORM_FWD,
    DT_CU_OP_LAYERNORM_BWD,
    DT_CU_OP_GELU_FWD,
    DT_CU_OP_GELU_BWD,
    DT_CU_OP_RELU_FWD,
    DT_CU_OP_RELU_BWD,
    DT_CU_OP_RESIDUAL,
    DT_CU_OP_ACCUMULATE,
    DT_CU_OP_SCALE,
    DT_CU_OP_EMBEDDING_FWD,
    DT_CU_OP_EMBEDDING_BWD,
    DT_CU_OP_XENT,
    DT_CU_OP_BN_STATS,
    DT_CU_OP_BN_FWD_APPLY,
    DT_CU_OP_BN_FWD_EVAL,
    DT_CU_OP_BN_BWD_REDUCE,
    DT_CU_OP_BN_BWD_APPLY,
    DT_CU_OP_MAXPOOL_FWD,
    DT_CU_OP_MAXPOOL_BWD,
    DT_CU_OP_AVGPOOL_FWD,
    DT_CU_OP_AVGPOOL_BWD,
    DT_CU_OP_SGD,
    DT_CU_OP_ADAMW,
    DT_CU_OP_SUMSQ,
    DT_CU_OP_NONFINITE,
    DT_CU_OP_TO_HALF,
    DT_CU_OP_FROM_HALF,
    DT_CU_OP_EMBEDDING_VP_FWD,
    DT_CU_OP_EMBEDDING_VP_BWD,
    DT_CU_OP_XENT_VP,
    DT_CU_OP_ATTN_PAD_FWD,
    DT_CU_OP_ATTN_PAD_BWD,
    DT_CU_OP_GELU_ERF_FWD,
    DT_CU_OP_GELU_ERF_BWD,
    DT_CU_OP_TANH_FWD,
    DT_CU_OP_TANH_BWD,
    DT_CU_OP_RMSNORM_FWD,
    DT_CU_OP_RMSNORM_BWD,
    DT_CU_OP_SWIGLU_FWD,
    DT_CU_OP_SWIGLU_BWD,
    DT_CU_OP_ROPE_QKV_FWD,
    DT_CU_OP_ROPE_QKV_BWD,
    DT_CU_OP_COUNT
};

// ---- scratch slots: private device buffers, grown on demand, reused across calls -------------
enum {
    DT_CU_SCR_GEMM_A,  // 16-bit copy of a GEMM's A operand (convert mode)
    DT_CU_SCR_GEMM_B,  // 16-bit copy of a GEMM's B operand (convert mode)
    DT_CU_SCR_GEMM_C,  // 16-bit copy of a third operand converted once for two GEMMs
    DT_CU_SCR_ATTN,    // attention: q, k, v, y and their gradients, (B,NH,T,hs) each
    DT_CU_SCR_CONV,    // cuDNN workspace
    DT_CU_SCR_RED,     // small reductions (double accumulators, counters)
    DT_CU_SCR_COUNT
};

struct dt_cu_arena; // backend.cu
struct dt_cu_vmm;   // vmm.cu

// cuDNN algorithm choice for one convolution shape (cached: the heuristics query costs ~ms).
typedef struct dt_cu_conv_algo {
    dt_conv2d_shape s;
    int math;          // cudnnMathType_t used
    int fwd, bwd_data, bwd_filter;
    size_t ws_fwd, ws_bwd_data, ws_bwd_filter;
} dt_cu_conv_algo;

#define DT_CU_CONV_CACHE 64

// A cuBLASLt problem (everything the heuristic looks at) and the algorithm it chose; found =
// false when it offered none (the cuBLAS fallback then). Keys are compared with memcmp: zeroed
// before they are filled.
typedef struct dt_cu_lt_key {
    int ct, abt, cty, opa, opb, m, n, k, batch, bias;
    int64_t lda, ldb, ldc, sA, sB, sC;
    uint32_t al_a, al_b, al_c;
} dt_cu_lt_key;

typedef struct dt_cu_lt_algo {
    dt_cu_lt_key key;
    bool found;
    cublasLtMatmulAlgo_t algo;
} dt_cu_lt_algo;

#define DT_CU_LT_CACHE 128

// The instance's memory figures: by category (mem_stats; mem_external counts there only), and
// in_use / peak (peak_bytes): arena blocks at their carved size plus charged VMM granules.
typedef struct dt_cu_mem {
    dt_mem_stats stats;
    size_t in_use, peak;
} dt_cu_mem;

typedef struct dt_cuda {
    int device;
    int sm_count;
    int cc_major, cc_minor;
    char gpu_name[256];
    size_t total_mem;
    size_t mem_limit;   // the budget alloc and commit keep to (dt_backend_opts.mem_limit, at most
                        // total_mem; default total_mem)
    dt_precision precision;
    bool tf32;          // fp32 mode may use TF32 tensor cores (DTRAIN_CUDA_TF32=1)
    bool gemm_convert;  // 16-bit modes: convert operands into scratch (else cuBLAS FAST_16*)
    bool attn_flash;    // DTRAIN_CUDA_ATTN=flash: fused attention kernels (gemm.cu) where they apply

    cudaStream_t stream; // the compute stream: every op of this instance runs on it
    cublasHandle_t cublas;
    cublasLtHandle_t lt;
    cudnnHandle_t cudnn;
    void *lt_ws;        // cuBLASLt/cuBLAS workspace (arena memory), lt_ws_bytes long
    size_t lt_ws_bytes;

    dt_cu_mem mem;             // what alloc and the backend hold (core.cu: dt_cuda_mem_charge)
    struct dt_cu_arena *arena; // small allocations, scratch and workspaces
    struct dt_cu_vmm *vmm;     // allocations of a granule and more; NULL: the arena serves all
    void *scr[DT_CU_SCR_COUNT];
    size_t scr_bytes[DT_CU_SCR_COUNT];
    void *host_pinned;  // 64 bytes of pinned host memory for small read-backs

    dt_cu_conv_algo conv_cache[DT_CU_CONV_CACHE];
    int conv_cache_n;
    dt_cu_lt_algo lt_cache[DT_CU_LT_CACHE]; // cuBLASLt heuristics: one query per problem
    int lt_cache_n;

    bool failed;        // a CUDA call failed: see the file comment
    char fail_msg[DT_ERR_MSG_MAX + 512];

    bool prof_on;
    dt_op_stat stats[DT_CU_OP_COUNT];
} dt_cuda;

#define dt_cuda_of(be) ((dt_cuda *)(be)->impl)

// ---- errors ----------------------------------------------------------------------------------
// Records the first failure (logged once with where), marks the backend failed. Returns false
// when `ok` is false so call sites can bail out.
bool dt_cuda_note(dt_cuda *cu, bool ok, const char *what, const char *detail, const char *file,
                  int line);

#define DT_CU_CHECK(cu, call)                                                                      \
    do {                                                                                           \
        cudaError_t dt_e_ = (call);                                                                \
        if (dt_e_ != cudaSuccess)                                                                  \
            dt_cuda_note((cu), false, #call, cudaGetErrorString(dt_e_), __FILE__, __LINE__);      \
    } while (0)

#define DT_CUBLAS_CHECK(cu, call)                                                                  \
    do {                                                                                           \
        cublasStatus_t dt_s_ = (call);                                                             \
        if (dt_s_ != CUBLAS_STATUS_SUCCESS)                                                        \
            dt_cuda_note((cu), false, #call, cublasGetStatusString(dt_s_), __FILE__, __LINE__);   \
    } while (0)

#define DT_CUDNN_CHECK(cu, call)                                                                   \
    do {                                                                                           \
        cudnnStatus_t dt_s_ = (call);                                                              \
        if (dt_s_ != CUDNN_STATUS_SUCCESS)                                                         \
            dt_cuda_note((cu), false, #call, cudnnGetErrorString(dt_s_), __FILE__, __LINE__);     \
    } while (0)

// After a kernel launch: catches launch-configuration errors (no synchronisation).
#define DT_CU_LAUNCHED(cu) DT_CU_CHECK((cu), cudaGetLastError())

// ---- op prologue / epilogue ------------------------------------------------------------------
// Makes the instance's device current for this thread (cheap when it already is).
dt_cuda *dt_cuda_enter(dt_backend *be);
double dt_cuda_prof_begin(dt_cuda *cu);
void dt_cuda_prof_end(dt_cuda *cu, int op, double t0, double flops);

#define DT_CU_BEGIN(be)                                                                            \
    dt_cuda *cu = dt_cuda_enter(be);                                                               \
    double prof_t0_ = cu->prof_on ? dt_cuda_prof_begin(cu) : 0.0

#define DT_CU_END(op, flops)                                                                       \
    do {                                                                                           \
        if (cu->prof_on)                                                                           \
            dt_cuda_prof_end(cu, (op), prof_t0_, (double)(flops));                                 \
    } while (0)

// ---- memory ----------------------------------------------------------------------------------
// Memory comes from two allocators (backend.cu's file comment has the figures):
//   the arena (backend.cu): cudaMalloc'ed chunks carved into 256-byte aligned blocks; every
//     allocation below one granule, the backend's scratch and workspaces; mem_granule 0;
//   vmm.cu: an allocation of a granule or more is a reserved virtual range whose granules are
//     backed one by one (cuMemCreate + cuMemMap), so mem_release can unmap them (once the
//     compute stream is past the work issued before the release) and mem_commit map new ones.
// Both charge the statistics through dt_cuda_mem_charge, so in_use, peak_bytes and mem_stats
// cover the instance's whole device footprint (vmm: mapped granules the caller has not
// released; a released granule stops counting at the mem_release call). DTRAIN_CUDA_VMM=0 (or
// a driver or device without virtual memory management) leaves everything to the arena.

// A scratch buffer of at least `bytes` for slot; the previous contents are lost when it grows.
// NULL after a failure (out of memory is logged and marks the backend failed).
void *dt_cuda_scratch(dt_cuda *cu, int slot, size_t bytes);
// core.cu. Charges (add) or gives back (!add) bytes of category cat: the statistics, in_use and
// the peak.
void dt_cuda_mem_charge(dt_cuda *cu, dt_mem_cat cat, size_t bytes, bool add);

// vmm.cu. Sets cu->vmm when the driver, the device and DTRAIN_CUDA_VMM allow (needs the device
// current); otherwise leaves it NULL, says why once (DT_INFO), and the arena serves everything.
void dt_cuda_vmm_init(dt_cuda *cu);
// After the stream is synchronised: gives every VMM allocation back (without the statistics)
// and frees cu->vmm. Accepts cu->vmm == NULL.
void dt_cuda_vmm_close(dt_cuda *cu);
// Whether an allocation of `bytes` goes to vmm.cu (false when cu->vmm is NULL).
bool dt_cuda_vmm_wants(const dt_cuda *cu, size_t bytes);
// The granule of the VMM allocation base; 0 when base is not one (arena memory).
size_t dt_cuda_vmm_granule(const dt_cuda *cu, const void *base);
// Whether releases wait for their event (memory that waiting would give back).
bool dt_cuda_vmm_pending(const dt_cuda *cu);
// Unmaps the granules of pending releases whose event has completed; wait: waits for all of them.
// Accepts cu->vmm == NULL.
void dt_cuda_vmm_poll(dt_cuda *cu, bool wait);
// alloc for dt_cuda_vmm_wants(cu, bytes): zeroed (on the stream), charged to cat. 0, or -ENOMEM
// (-EIO for another driver error) with err set and nothing held.
int dt_cuda_vmm_alloc(dt_cuda *cu, void **out, size_t bytes, dt_mem_cat cat, dt_err *err);
// free, after the caller synchronised the device: false when p is not a VMM allocation.
bool dt_cuda_vmm_free(dt_cuda *cu, void *p);
// mem_release / mem_commit of backend_ops.h for a VMM allocation base (nothing for another base).
void dt_cuda_vmm_release(dt_cuda *cu, void *base, size_t off, size_t bytes);
int dt_cuda_vmm_commit(dt_cuda *cu, void *base, size_t off, size_t bytes, dt_err *err);

// ---- launch helpers --------------------------------------------------------------------------
static inline unsigned dt_cu_blocks(size_t n, unsigned threads, unsigned cap = 65535u * 8u)
{
    size_t b = (n + threads - 1) / threads;
    if (b < 1)
        b = 1;
    return (unsigned)(b > cap ? cap : b);
}

// ---- ops.cu helpers used by gemm.cu ----------------------------------------------------------
// out (N,C) += bias (C) broadcast over rows.
void dt_cuda_colbias_add(dt_cuda *cu, float *out, const float *bias, int N, int C);
// dbias (C) += column sums of x (N,C) row-major.
void dt_cuda_colsum_acc(dt_cuda *cu, float *dbias, const float *x, int N, int C);
// out (N,K,HW) += bias (K) per channel.
void dt_cuda_channel_bias_add(dt_cuda *cu, float *out, const float *bias, int N, int K, int HW);
// dbias (K) += sums of dout (N,K,HW) per channel.
void dt_cuda_channel_sum_acc(dt_cuda *cu, float *dbias, const float *dout, int N, int K, int HW);
// x (n) fp32 * scale -> dst (n) bf16 (bf16 = true) or fp16, rounded to nearest even.
void dt_cuda_to_half(dt_cuda *cu, void *dst, const float *x, size_t n, float scale, bool bf16);

// ---- op table entries ------------------------------------------------------------------------
// gemm.cu
void dt_cuda_matmul_fwd(dt_backend *be, float *out, const float *inp, const float *w,
                        const float *bias, int N, int C, int OC);
void dt_cuda_matmul_bwd(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, int N, int C, int OC);
void dt_cuda_attention_sizes(dt_backend *be, int B, int T, int C, int NH, size_t *att,
                             size_t *datt);
void dt_cuda_attention_fwd(dt_backend *be, float *out, float *att, const float *qkv, int B, int T,
                           int C, int NH);
void dt_cuda_attention_bwd(dt_backend *be, float *dqkv, float *datt, const float *dout,
                           const float *qkv, const float *att, int B, int T, int C, int NH);
void dt_cuda_attention_pad_fwd(dt_backend *be, float *out, float *att, const float *qkv,
                               const int32_t *mask, int B, int T, int C, int NH);
void dt_cuda_attention_pad_bwd(dt_backend *be, float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH);
void dt_cuda_conv2d_fwd(dt_backend *be, float *out, const float *inp, const float *w,
                        const float *bias, const dt_conv2d_shape *s);
void dt_cuda_conv2d_bwd(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, const dt_conv2d_shape *s);
// ops.cu
void dt_cuda_bias_add(dt_backend *be, float *out, const float *bias, int N, int C);
void dt_cuda_bias_bwd(dt_backend *be, float *dbias, const float *dout, int N, int C);
void dt_cuda_layernorm_fwd(dt_backend *be, float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C, float eps);
void dt_cuda_layernorm_bwd(dt_backend *be, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const float *mean, const float *rstd,
                           int N, int C);
void dt_cuda_gelu_fwd(dt_backend *be, float *out, const float *inp, size_t n);
void dt_cuda_gelu_bwd(dt_backend *be, float *dinp, const float *inp, const float *dout, size_t n);
void dt_cuda_gelu_erf_fwd(dt_backend *be, float *out, const float *inp, size_t n);
void dt_cuda_gelu_erf_bwd(dt_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n);
void dt_cuda_tanh_fwd(dt_backend *be, float *out, const float *inp, size_t n);
void dt_cuda_tanh_bwd(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n);
void dt_cuda_relu_fwd(dt_backend *be, float *out, const float *inp, size_t n);
void dt_cuda_relu_bwd(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n);
void dt_cuda_residual_fwd(dt_backend *be, float *out, const float *a, const float *b, size_t n);
void dt_cuda_accumulate(dt_backend *be, float *dst, const float *src, size_t n);
void dt_cuda_scale(dt_backend *be, float *x, size_t n, float s);
void dt_cuda_embedding_fwd(dt_backend *be, float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int B, int T, int C);
void dt_cuda_embedding_bwd(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                           const int32_t *tokens, int B, int T, int C);
void dt_cuda_xent_fwd_bwd(dt_backend *be, float *losses, float *dlogits, const float *logits,
                          const int32_t *targets, int N, int V, float dloss, int *valid_count);
void dt_cuda_embedding_vp_fwd(dt_backend *be, float *out, const int32_t *tokens,
                              const float *wte, const float *wpe, int B, int T, int C, int v0,
                              int Vl);
void dt_cuda_embedding_vp_bwd(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                              const int32_t *tokens, int B, int T, int C, int v0, int Vl);
void dt_cuda_xent_vp_max(dt_backend *be, float *maxes, const float *logits, int N, int Vl,
                         int nv);
void dt_cuda_xent_vp_sums(dt_backend *be, float *sums, const float *logits, const float *maxes,
                          const int32_t *targets, int N, int Vl, int nv, int v0);
void dt_cuda_xent_vp_finish(dt_backend *be, float *losses, float *dlogits, const float *logits,
                            const float *maxes, const float *sums, const int32_t *targets,
                            int N, int Vl, int nv, int v0, float dloss);
void dt_cuda_rmsnorm_fwd(dt_backend *be, float *out, float *rstd, const float *inp,
                         const float *w, int N, int C, float eps);
void dt_cuda_rmsnorm_bwd(dt_backend *be, float *dinp, float *dw, const float *dout,
                         const float *inp, const float *w, const float *rstd, int N, int C);
void dt_cuda_swiglu_fwd(dt_backend *be, float *out, const float *inp, int N, int F);
void dt_cuda_swiglu_bwd(dt_backend *be, float *dinp, const float *dout, const float *inp, int N,
                        int F);
void dt_cuda_rope_qkv_fwd(dt_backend *be, float *out, const float *inp, int B, int T, int NH,
                          int NKV, int hs, float theta);
void dt_cuda_rope_qkv_bwd(dt_backend *be, float *dinp, const float *dout, int B, int T, int NH,
                          int NKV, int hs, float theta);
void dt_cuda_bn_stats(dt_backend *be, float *sum, float *sumsq, const float *inp, int N, int C,
                      int HW);
void dt_cuda_bn_fwd_apply(dt_backend *be, float *out, float *mean, float *rstd,
                          float *running_mean, float *running_var, const float *inp,
                          const float *w, const float *b, const float *sum, const float *sumsq,
                          double count, int N, int C, int HW, float momentum, float eps);
void dt_cuda_bn_fwd_eval(dt_backend *be, float *out, const float *inp, const float *running_mean,
                         const float *running_var, const float *w, const float *b, int N, int C,
                         int HW, float eps);
void dt_cuda_bn_bwd_reduce(dt_backend *be, float *dw, float *db, float *sum_dy,
                           float *sum_dy_xhat, const float *dout, const float *inp,
                           const float *mean, const float *rstd, int N, int C, int HW);
void dt_cuda_bn_bwd_apply(dt_backend *be, float *dinp, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd,
                          const float *sum_dy, const float *sum_dy_xhat, double count, int N,
                          int C, int HW);
void dt_cuda_maxpool_fwd(dt_backend *be, float *out, int32_t *idx, const float *inp, int N, int C,
                         int H, int W, int k, int stride, int pad);
void dt_cuda_maxpool_bwd(dt_backend *be, float *dinp, const float *dout, const int32_t *idx,
                         int N, int C, int H, int W, int P, int Q);
void dt_cuda_avgpool_fwd(dt_backend *be, float *out, const float *inp, int N, int C, int HW);
void dt_cuda_avgpool_bwd(dt_backend *be, float *dinp, const float *dout, int N, int C, int HW);
void dt_cuda_sgd_update(dt_backend *be, float *params, const float *grads, float *momentum_buf,
                        size_t n, float lr, float momentum, bool nesterov, float weight_decay,
                        bool first_step);
void dt_cuda_adamw_update(dt_backend *be, float *params, const float *grads, float *m, float *v,
                          size_t n, double lr, double beta1, double beta2, double eps,
                          double weight_decay, int64_t t);
double dt_cuda_sumsq(dt_backend *be, const float *x, size_t n);
size_t dt_cuda_count_nonfinite(dt_backend *be, const float *x, size_t n);
void dt_cuda_op_to_half(dt_backend *be, uint16_t *half, const float *x, size_t n, float scale,
                        bool bf16);
void dt_cuda_op_from_half(dt_backend *be, float *x, const uint16_t *half, size_t n, float scale,
                          bool bf16);

// ---- compute-stream registry (for the NCCL backend in the same library) -----------------------
// Records `ev` on the compute stream of the newest live backend instance on `device` (under the
// registry lock, so the stream cannot be destroyed meanwhile). Returns false when no backend
// instance lives on that device (the caller then synchronises the device instead). The NCCL
// backend makes its comm stream wait for this event before every collective, so a bucket
// all-reduce starts after the backward kernels that produced the bucket, and runs while the
// following backward kernels do.
bool dt_cuda_record_on_compute_stream(int device, cudaEvent_t ev);

#endif
