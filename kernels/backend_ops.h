/* backend_ops.h - the op table every model is written against, and the types around it.
 *
 * A leaf of kernels/ (it includes common/err.h only): the backends (kernels/cpu, kernels/cuda)
 * include it to fill the table in, and kernels/backend.h, which opens them by name, includes
 * it back for everyone else, so that no backend ever includes backend.h. Users outside
 * kernels/ include kernels/backend.h, not this file.
 *
 * Models (runtime/train/models) are written once, with explicit forward and backward passes, against
 * this table. kernels/cpu is the reference implementation (OpenBLAS GEMM, plain C loops);
 * kernels/cuda implements the same ops on the GPU and must match the CPU within stated
 * tolerances. The backend knows nothing about processes, sockets or files.
 *
 * Conventions
 * - Every float pointer is backend memory ("device memory": host memory on the CPU backend)
 *   obtained from alloc; int32 pointers (tokens, targets, labels, pooling indices) likewise.
 * - Row-major. Shapes in comments use llm.c letters: B batch, T time, C channels, V vocabulary,
 *   NH heads, N rows (= B*T or B), OC output channels; images are (N,C,H,W).
 * - Backward ops ACCUMULATE (+=) into every gradient they write, parameter and input gradients
 *   alike, so gradient accumulation over micro-steps and residual branches need no extra op.
 *   The caller zeroes gradients when a new accumulation starts. Pointers documented as
 *   "may be NULL" skip that output.
 * - Ops are asynchronous with respect to the host on devices that can be (CUDA: one compute
 *   stream per backend); memcpy_d2h and synchronize wait. The CPU backend is synchronous.
 * - Ops never fail at run time except through alloc. Shape mistakes are programming errors
 *   that no op checks, in any build (a wrong size reads or writes out of bounds): the callers
 *   (runtime/train/models) must pass consistent sizes; tests/test_kernels.c and test_models.c
 *   under SANITIZE=address,undefined are what catch them.
 * - One backend instance per thread that drives it: instances are independent (DP runs one per
 *   replica), and an instance is not safe for concurrent use.
 */
#ifndef DT_BACKEND_OPS_H
#define DT_BACKEND_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct dt_backend dt_backend;

/* Shape of a 2-D convolution: input (N,C,H,W), weight (K,C,R,S), output (N,K,P,Q) with
 * P = (H + 2*pad - R)/stride + 1 and Q = (W + 2*pad - S)/stride + 1. */
typedef struct dt_conv2d_shape {
    int N, C, H, W;   /* input */
    int K, R, S;      /* output channels, kernel height, kernel width */
    int stride, pad;
    int P, Q;         /* output height and width: filled by dt_conv2d_shape_init */
} dt_conv2d_shape;

void dt_conv2d_shape_init(dt_conv2d_shape *s, int N, int C, int H, int W, int K, int R, int S,
                          int stride, int pad);

typedef enum dt_precision {
    DT_PREC_FP32 = 0, /* everything float32 */
    DT_PREC_BF16 = 1, /* GEMMs in bfloat16 with fp32 accumulation; master weights fp32 */
    DT_PREC_FP16 = 2, /* GEMMs in float16 (the caller does loss scaling) */
} dt_precision;

/* Time accounting per op, for `dtrain bench train` and `dtrain bench kernels`. */
typedef struct dt_op_stat {
    const char *name;  /* op name, e.g. "matmul_fwd" (static string) */
    bool gemm;         /* GEMM-bound (matmul, attention GEMMs, conv) */
    uint64_t calls;
    double seconds;    /* wall time inside the op (after synchronising on devices) */
    double flops;      /* floating-point operations counted for GEMM-bound ops, else 0 */
} dt_op_stat;

/* Memory accounting by category (issue 17). Every byte alloc hands out is charged to the
 * backend's current category (mem_category; DT_MEM_OTHER until someone sets another), and the
 * backend keeps, per category, the bytes resident now and their peak, and the peak of the total.
 * The values travel nowhere (append, never renumber anyway). */
typedef enum dt_mem_cat {
    DT_MEM_OTHER = 0,  /* everything untagged: model buffers, checkpoint staging, backend scratch */
    DT_MEM_PARAMS = 1, /* model parameters (master weights) */
    DT_MEM_GRADS = 2,  /* parameter gradients */
    DT_MEM_OPTIM = 3,  /* optimiser state (AdamW m and v, SGD momentum) */
    DT_MEM_ACTS = 4,   /* activations, their gradients, inputs and targets of a step */
    DT_MEM_COMM = 5,   /* communication buffers (DDP scratch, compressed payloads, staging) */
} dt_mem_cat;
#define DT_MEM_CAT_COUNT 6

/* Bytes per category (cpu: the bytes alloc was asked for; cuda: the arena's blocks, rounded up
 * to 256 bytes, the mapped granules of its virtual-memory allocations, and the backend's own
 * scratch and workspaces as DT_MEM_OTHER). cur: resident now (allocated, minus what
 * mem_release gave back);
 * peak: the largest cur each category reached; total: the sum of cur; total_peak: the largest
 * total reached (not the sum of the peaks, which may come at different times). */
typedef struct dt_mem_stats {
    size_t cur[DT_MEM_CAT_COUNT];
    size_t peak[DT_MEM_CAT_COUNT];
    size_t total, total_peak;
} dt_mem_stats;

/* "other", "params", "grads", "optim", "activations", "comm"; "unknown" otherwise. */
const char *dt_mem_cat_name(dt_mem_cat c);
/* The bookkeeping both backends share: charge / give back bytes of category c (a value outside
 * the enum counts as DT_MEM_OTHER); sub never goes below 0. */
void dt_mem_stats_add(dt_mem_stats *s, dt_mem_cat c, size_t bytes);
void dt_mem_stats_sub(dt_mem_stats *s, dt_mem_cat c, size_t bytes);
/* Sets be's current category and returns the previous one, for a caller that brackets its
 * allocations: `dt_mem_cat old = dt_mem_tag(be, DT_MEM_PARAMS); ...alloc...; dt_mem_tag(be,
 * old);`. A backend without accounting (mem_category NULL) ignores it and returns
 * DT_MEM_OTHER. */
dt_mem_cat dt_mem_tag(dt_backend *be, dt_mem_cat cat);
/* The budget check both backends share: 0 when limit is 0 or s->total + bytes fits in limit;
 * else -ENOMEM with a message (who: the backend's name) naming the request (bytes, category),
 * the budget, what is held now by category and peak (the run's peak so far). */
#define DT_MEM_OOM_TEXT "out of device memory" /* in every refusal's message, for its reader */
int dt_mem_admit(const dt_mem_stats *s, size_t limit, size_t peak, const char *who, dt_mem_cat c,
                 size_t bytes, dt_err *err);
/* be's statistics; all zero for a backend without accounting (mem_stats NULL). */
void dt_mem_read(dt_backend *be, dt_mem_stats *out);
/* be->mem_external when be has it. */
void dt_mem_external(dt_backend *be, dt_mem_cat cat, size_t bytes, bool add);
/* be->mem_granule(be, base) when be has it, else 0 (base cannot give memory back). */
size_t dt_mem_granule(dt_backend *be, const void *base);
/* be->mem_reset_peak when be has it: the statistics' peaks start again from what is resident
 * now (peak_bytes, the whole run's peak, is left alone). */
void dt_mem_reset_peak(dt_backend *be);

/* The devices a backend computes on; kernels/ owns the list (the job's device key maps onto it,
 * dt_backend_kind_name gives the names back). DT_BACKEND_AUTO is a request only (dt_backend_open:
 * cuda where it loads and sees a GPU, else cpu); a backend's kind is one of the others. */
typedef enum dt_backend_kind {
    DT_BACKEND_AUTO = 0,
    DT_BACKEND_CPU,
    DT_BACKEND_CUDA
} dt_backend_kind;

typedef struct dt_backend_opts {
    int device_index;     /* CUDA device ordinal (LOCAL_RANK); ignored on the CPU */
    int threads;          /* CPU: BLAS/compute threads for this instance (1) */
    dt_precision precision;
    size_t mem_limit;     /* the device's budget (job.device_memory): alloc and mem_commit
                             refuse (-ENOMEM, a message with what was asked and what is held by
                             category) what would take mem_stats' total beyond it; 0 = none
                             (cpu: unlimited; cuda: the device's own memory, as the driver
                             reports it at start; a larger value is that too) */
} dt_backend_opts;

void dt_backend_opts_default(dt_backend_opts *o);

struct dt_backend {
    const char *name;  /* "cpu" or "cuda" (dt_backend_kind_name(kind)), for messages */
    dt_backend_kind kind;
    bool host_memory;  /* the host can read and write this backend's memory in place (cpu):
                          what would else go through memcpy_h2d/d2h and a host copy may be done
                          there directly */
    void *impl;        /* backend private state */
    dt_precision precision;

    /* ---- lifecycle and memory ---- */
    void (*close)(dt_backend *be); /* frees impl and be itself */
    /* Allocates `bytes` of zeroed backend memory. */
    int (*alloc)(dt_backend *be, void **p, size_t bytes, dt_err *err);
    void (*free)(dt_backend *be, void *p); /* accepts NULL */
    void (*memcpy_h2d)(dt_backend *be, void *dst, const void *src, size_t bytes);
    void (*memcpy_d2h)(dt_backend *be, void *dst, const void *src, size_t bytes); /* waits */
    void (*memcpy_d2d)(dt_backend *be, void *dst, const void *src, size_t bytes);
    void (*memset_zero)(dt_backend *be, void *p, size_t bytes);
    void (*synchronize)(dt_backend *be);
    /* Peak bytes allocated since creation: mem_stats' total_peak (cuda: the arena's blocks and
     * the mapped granules, which include the backend's own scratch and workspaces, counted as
     * DT_MEM_OTHER). */
    size_t (*peak_bytes)(dt_backend *be);
    /* ---- memory accounting (see dt_mem_cat) ----
     * mem_category: later allocs are charged to cat; returns the previous current category
     * (use dt_mem_tag, which accepts a backend without accounting). Free gives the bytes back to
     * the category the allocation was charged to, whatever is current then.
     * mem_stats: copies the statistics.
     * mem_release / mem_commit / mem_granule: giving memory back early, keeping the allocation
     * (ZeRO-2/3 drop the gradient and parameter ranges they do not own). The unit is the
     * granule, mem_granule(be, base) bytes (a power of two), counted from an address that is a
     * multiple of it; 0 when the allocation base cannot give memory back (then release does
     * nothing, commit returns 0, and the memory stays resident, as the statistics say).
     *   mem_release(base, offset, bytes): the granules lying wholly inside [offset, offset +
     *     bytes) of the allocation base (a pointer alloc returned; the range must lie inside
     *     it) go back to the system and become INACCESSIBLE: a touch faults (cpu: SIGSEGV;
     *     cuda: an illegal address) until they are committed again. Work already issued on the
     *     device that reads or writes them is allowed to finish first (cuda: the release is
     *     ordered after it); the host must not touch them after the call.
     *   mem_commit(base, offset, bytes, err): every released granule touching the range becomes
     *     usable again, its contents UNDEFINED (cpu under DTRAIN_CPU_MEM_POISON=1, as the tests
     *     run: every byte 0xFF, a NaN in every float, so a reader that forgot to write first
     *     shows up); granules of the range that were not
     *     released keep their contents. 0, or -ENOMEM (err says so).
     * Both adjust the charged category's resident bytes by what they really release or take
     * back (granule by granule; releasing or committing twice counts once), so the statistics
     * are exact: nothing becomes resident behind the allocator's back, and a caller commits a
     * range before it writes there, and zeroes it itself if it wants zeros.
     * Both backends keep released physical memory for the next commit of the same category
     * (a caching allocator's reuse: ZeRO-3's next window takes the last one's pages), charged to
     * nothing while kept, and give it back when a commit of that category leaves some unused,
     * at any alloc, and before a budget or the device would refuse: so beyond the statistics a
     * process holds at most what it released since that category's last commit.
     *   cpu: granule = the page size (DTRAIN_CPU_MEM_GRANULE=bytes, a power-of-two multiple of it,
     *        emulates a coarser one, e.g. 2097152 for cuda's); release maps the granules anew
     *        PROT_NONE, commit maps them read-write from a memfd page pool (kernels/cpu/
     *        cpu_pool.c; DTRAIN_CPU_MEM_POOL=0: pages go back to the kernel at release), filled
     *        with 0xFF under DTRAIN_CPU_MEM_POISON=1 (the tests: a NaN in every float).
     *   cuda: allocations from the granule (2 MiB on current GPUs) up are backed by the driver's
     *        virtual memory management (cuMemCreate/cuMemMap): release unmaps the granules once
     *        the device is done with them and keeps their chunks, commit maps a kept chunk or
     *        new physical memory (synchronously); smaller allocations come from the arena and
     *        report granule 0. */
    dt_mem_cat (*mem_category)(dt_backend *be, dt_mem_cat cat);
    void (*mem_stats)(dt_backend *be, dt_mem_stats *out);
    /* mem_external: charges (add) or gives back (!add) bytes of category cat that this
     * instance's device holds outside alloc (communicator memory: dt_comm_mem_alloc's shared
     * memory), so that the statistics cover them; the caller pairs every add with one !add. */
    void (*mem_external)(dt_backend *be, dt_mem_cat cat, size_t bytes, bool add);
    void (*mem_release)(dt_backend *be, void *base, size_t offset, size_t bytes);
    int (*mem_commit)(dt_backend *be, void *base, size_t offset, size_t bytes, dt_err *err);
    size_t (*mem_granule)(dt_backend *be, const void *base);
    /* mem_reset_peak: mem_stats' peak[] and total_peak become cur[] and total (what a
     * measurement of the steps alone starts from, after set-up freed or gave back what it
     * needed only once: ZeRO-3's whole initial parameters); peak_bytes is not reset. */
    void (*mem_reset_peak)(dt_backend *be);
    /* The PCI address ("0000:3B:00.0") of visible device `device` (any of them, not only this
     * backend's), to bind workers near their GPU; 0 or a negative errno. NULL on the CPU. */
    int (*device_pci_bus_id)(dt_backend *be, int device, char *buf, size_t cap);
    /* Per-op time accounting: profile_enable(true) resets and starts counting (it may
     * synchronise after every op, so it is for benchmarks only); profile_read copies up to max
     * stats and returns how many there are. Either may be NULL when unsupported. */
    void (*profile_enable)(dt_backend *be, bool on);
    int (*profile_read)(dt_backend *be, dt_op_stat *out, int max);

    /* ---- GEMM-bound ---- */
    /* out (N,OC) = inp (N,C) @ w^T, w (OC,C); + bias (OC) when bias != NULL. */
    void (*matmul_fwd)(dt_backend *be, float *out, const float *inp, const float *w,
                       const float *bias, int N, int C, int OC);
    /* dinp (N,C) += dout (N,OC) @ w (OC,C); dw (OC,C) += dout^T @ inp;
     * dbias (OC) += column sums of dout. dinp, dw, dbias may each be NULL. */
    void (*matmul_bwd)(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC);
    /* Causal multi-head self-attention.
     * qkv (B,T,3C): per position [q (NH,hs) | k (NH,hs) | v (NH,hs)], hs = C/NH.
     * out (B,T,C) = softmax(q k^T / sqrt(hs), causal) v, heads concatenated.
     * att: what fwd saves for bwd, in the backend's own layout; its size in floats comes from
     * attention_sizes, as does that of bwd's scratch datt (either may be 0: NULL is then
     * allowed); the sizes for (B,T) serve every call with at most B and T (a model allocates
     * once for its largest batch). cpu: the log-sum-exp of each query row's scaled scores, (B,NH,T) (flash-
     * attention's tiling: no (T,T) matrix is ever stored), datt 0; cuda: the probabilities
     * (B,NH,T,T) and a datt of that size on the cuBLAS path, the log-sum-exp and a 16-bit copy
     * of the output with DTRAIN_CUDA_ATTN=flash where it applies (datt 0). A buffer larger than
     * asked for is fine (the (B,NH,T,T) of every backend before attention_sizes existed). */
    void (*attention_sizes)(dt_backend *be, int B, int T, int C, int NH, size_t *att,
                            size_t *datt);
    void (*attention_fwd)(dt_backend *be, float *out, float *att, const float *qkv, int B, int T,
                          int C, int NH);
    /* dqkv (B,T,3C) += gradient; att as fwd left it; datt is scratch (overwritten). */
    void (*attention_bwd)(dt_backend *be, float *dqkv, float *datt, const float *dout,
                          const float *qkv, const float *att, int B, int T, int C, int NH);
    /* Bidirectional multi-head self-attention with a key padding mask (BERT's encoder; Hugging
     * Face's attention_mask): qkv, out and att as attention_fwd, but every query attends to
     * every key s of its sample with mask[b,s] != 0 (mask (B,T) int32, NULL: every key):
     * att[b,h,t,s] = softmax over those keys of q_t.k_s / sqrt(hs), 0 at the masked keys (their
     * probability is exactly 0, where Hugging Face adds the dtype's minimum to the score);
     * a sample whose keys are all masked gets all-zero probabilities and a zero output. */
    void (*attention_pad_fwd)(dt_backend *be, float *out, float *att, const float *qkv,
                              const int32_t *mask, int B, int T, int C, int NH);
    /* dqkv (B,T,3C) += gradient of attention_pad_fwd; datt (B,NH,T,T) is scratch. The mask is
     * in att already (masked keys have probability 0, hence no gradient). */
    void (*attention_pad_bwd)(dt_backend *be, float *dqkv, float *datt, const float *dout,
                              const float *qkv, const float *att, int B, int T, int C, int NH);
    /* out (N,K,P,Q) = conv(inp (N,C,H,W), w (K,C,R,S)) + bias (K) when bias != NULL. */
    void (*conv2d_fwd)(dt_backend *be, float *out, const float *inp, const float *w,
                       const float *bias, const dt_conv2d_shape *s);
    /* dinp, dw, dbias (each may be NULL) += gradients from dout (N,K,P,Q). */
    void (*conv2d_bwd)(dt_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, const dt_conv2d_shape *s);

    /* ---- element-wise and normalisation ---- */
    /* out (N,C) += bias (C) broadcast over rows. */
    void (*bias_add)(dt_backend *be, float *out, const float *bias, int N, int C);
    /* dbias (C) += column sums of dout (N,C). */
    void (*bias_bwd)(dt_backend *be, float *dbias, const float *dout, int N, int C);
    /* LayerNorm over the last dim: out (N,C), saves mean (N) and rstd (N); w, b (C). */
    void (*layernorm_fwd)(dt_backend *be, float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C, float eps);
    void (*layernorm_bwd)(dt_backend *be, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int N, int C);
    /* GELU, tanh approximation: out (n) = gelu(inp). */
    void (*gelu_fwd)(dt_backend *be, float *out, const float *inp, size_t n);
    void (*gelu_bwd)(dt_backend *be, float *dinp, const float *inp, const float *dout, size_t n);
    /* GELU, exact: out (n) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))) (BERT's "gelu",
     * torch.nn.functional.gelu without approximation); bwd: dinp += (Phi(x) + x phi(x)) * dout. */
    void (*gelu_erf_fwd)(dt_backend *be, float *out, const float *inp, size_t n);
    void (*gelu_erf_bwd)(dt_backend *be, float *dinp, const float *inp, const float *dout,
                         size_t n);
    /* tanh: out (n) = tanh(inp); bwd uses the forward OUTPUT: dinp += (1 - out^2) * dout.
     * out may alias inp. */
    void (*tanh_fwd)(dt_backend *be, float *out, const float *inp, size_t n);
    void (*tanh_bwd)(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n);
    /* ReLU: out = max(inp, 0); bwd uses the forward OUTPUT (out > 0). out may alias inp. */
    void (*relu_fwd)(dt_backend *be, float *out, const float *inp, size_t n);
    void (*relu_bwd)(dt_backend *be, float *dinp, const float *out, const float *dout, size_t n);
    /* out (n) = a + b (residual add); its backward is accumulate() into both inputs. */
    void (*residual_fwd)(dt_backend *be, float *out, const float *a, const float *b, size_t n);
    /* dst (n) += src. */
    void (*accumulate)(dt_backend *be, float *dst, const float *src, size_t n);
    /* x (n) *= s. */
    void (*scale)(dt_backend *be, float *x, size_t n, float s);

    /* ---- embeddings ---- */
    /* out (B,T,C) = wte[tokens[b,t]] + wpe[t] (wpe (maxT,C) may be NULL); tokens (B,T) int32. */
    void (*embedding_fwd)(dt_backend *be, float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C);
    /* dwte (V,C) and dwpe (maxT,C) (may be NULL) += scatter of dout (B,T,C). */
    void (*embedding_bwd)(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                          const int32_t *tokens, int B, int T, int C);

    /* ---- vocabulary-parallel embedding (tensor parallelism, Megatron's VocabParallelEmbedding)
     * wte (Vl,C) holds rows [v0, v0+Vl) of the whole table (a tensor-parallel rank's slice).
     * fwd: out (B,T,C) = (v0 <= tokens[b,t] < v0+Vl ? wte[tokens[b,t] - v0] : 0) + wpe[t]
     * (wpe (maxT,C) may be NULL): a partial sum the caller all-reduces over the vocabulary's
     * ranks (one rank passing wpe, so that it is added once). bwd: dwte (Vl,C) += the rows of
     * dout (B,T,C) whose token is in the range; dwpe (maxT,C) (may be NULL; dwte likewise)
     * += scatter of every row. With v0 = 0 and Vl >= every token they are embedding_fwd/bwd. */
    void (*embedding_vp_fwd)(dt_backend *be, float *out, const int32_t *tokens, const float *wte,
                             const float *wpe, int B, int T, int C, int v0, int Vl);
    void (*embedding_vp_bwd)(dt_backend *be, float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, int B, int T, int C, int v0, int Vl);

    /* ---- vocabulary-parallel cross-entropy (Megatron's vocab_parallel_cross_entropy) ----
     * logits (N,Vl) are columns [v0, v0+Vl) of the whole (N,V) logits; only the first nv
     * columns are real (nv <= Vl; the rest are the padding of a vocabulary padded to a multiple
     * of the rank count: never part of the softmax, the loss or a maximum). In three stages,
     * with all-reduces over the vocabulary's ranks between them, so the whole logits are never
     * gathered:
     *   xent_vp_max:    maxes (N) = max over the nv real columns of each row (-INFINITY when
     *                   nv == 0)                                          (all-reduce max)
     *   xent_vp_sums:   sums (2N): sums[i] = sum over the real columns of exp(logit - maxes[i]),
     *                   sums[N + i] = the logit of targets[i] when it is one of this slice's
     *                   real columns, else 0                               (all-reduce sum)
     *   xent_vp_finish: losses (N) = log(sums[i]) + maxes[i] - sums[N + i] for targets[i] >= 0,
     *                   0 for ignored targets (< 0); when dlogits (N,Vl) != NULL it is SET to
     *                   dloss * (softmax - onehot) on the real columns of valid rows and 0
     *                   everywhere else (padding, ignored rows); dlogits may alias logits.
     * Targets >= V are the caller's to reject (as for xent_fwd_bwd). */
    void (*xent_vp_max)(dt_backend *be, float *maxes, const float *logits, int N, int Vl, int nv);
    void (*xent_vp_sums)(dt_backend *be, float *sums, const float *logits, const float *maxes,
                         const int32_t *targets, int N, int Vl, int nv, int v0);
    void (*xent_vp_finish)(dt_backend *be, float *losses, float *dlogits, const float *logits,
                           const float *maxes, const float *sums, const int32_t *targets, int N,
                           int Vl, int nv, int v0, float dloss);

    /* ---- decoder ops (llama: RMSNorm, SwiGLU, rotary embeddings with grouped-query heads) ----
     * RMSNorm over the last dim (Hugging Face's LlamaRMSNorm): rstd (N) = 1/sqrt(mean_j x^2 +
     * eps), out (N,C) = w * (x * rstd), w (C); rstd is saved for bwd (may be NULL in fwd).
     * bwd: with xhat = x * rstd, dinp (N,C) += rstd * (w*dout - xhat * mean_j(w*dout*xhat)),
     * dw (C) += column sums of dout * xhat; dinp and dw may each be NULL. */
    void (*rmsnorm_fwd)(dt_backend *be, float *out, float *rstd, const float *inp, const float *w,
                        int N, int C, float eps);
    void (*rmsnorm_bwd)(dt_backend *be, float *dinp, float *dw, const float *dout,
                        const float *inp, const float *w, const float *rstd, int N, int C);
    /* SwiGLU (LlamaMLP's act_fn(gate_proj(x)) * up_proj(x)): inp (N,2F) rows [gate (F) | up
     * (F)], out (N,F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)). bwd: dinp (N,2F) += the
     * gradient of both halves from dout (N,F). */
    void (*swiglu_fwd)(dt_backend *be, float *out, const float *inp, int N, int F);
    void (*swiglu_bwd)(dt_backend *be, float *dinp, const float *dout, const float *inp, int N,
                       int F);
    /* Rotary position embeddings and grouped-query heads into attention_fwd's qkv layout
     * (LlamaAttention: apply_rotary_pos_emb with rotate_half, then repeat_kv). inp (B,T,(NH +
     * 2 NKV) hs): per position [q (NH,hs) | k (NKV,hs) | v (NKV,hs)], NKV dividing NH, hs even;
     * out (B,T,3 NH hs): [q' (NH,hs) | k' (NH,hs) | v' (NH,hs)], where query head h reads kv
     * head g = h / (NH/NKV): q'_h = rope(q_h, t), k'_h = rope(k_g, t), v'_h = v_g, with, for
     * i < hs/2, rope(x,t)_i = x_i cos(a) - x_{i+hs/2} sin(a), rope(x,t)_{i+hs/2} = x_{i+hs/2}
     * cos(a) + x_i sin(a), a = t * f_i, f_i = 1 / theta^(2i/hs), t the position 0..T-1; f_i, a,
     * cos and sin in float32 as Hugging Face computes them (inv_freq, then t * inv_freq).
     * bwd: dinp += the transpose: every head's gradient rotated back by -a, the NH/NKV query
     * heads' gradients of a shared kv head summed. */
    void (*rope_qkv_fwd)(dt_backend *be, float *out, const float *inp, int B, int T, int NH,
                         int NKV, int hs, float theta);
    void (*rope_qkv_bwd)(dt_backend *be, float *dinp, const float *dout, int B, int T, int NH,
                         int NKV, int hs, float theta);

    /* ---- loss ---- */
    /* Fused softmax + cross-entropy over logits (N,V) with targets (N) int32; a target outside
     * [0, V) is ignored (loss 0, gradient 0; models reject targets >= V before they get here).
     * losses (N) = -log softmax(logits)[target].
     * When dlogits (N,V) != NULL it is SET (not accumulated) to
     * dloss * (softmax(logits) - onehot(target)); dlogits may alias logits.
     * *valid_count (host, may be NULL) gets the number of targets in [0, V). */
    void (*xent_fwd_bwd)(dt_backend *be, float *losses, float *dlogits, const float *logits,
                         const int32_t *targets, int N, int V, float dloss, int *valid_count);

    /* ---- BatchNorm, in stages so that SyncBatchNorm can all-reduce between them ----
     * inp (N,C,HW). Training forward:
     *   bn_stats: sum (C) = sum(x) and sumsq (C) = sum((x - mean)^2) over N*HW: the CENTRED
     *     sum of squares (M2, about this call's own mean), computed stably (shifted sums in
     *     double), so that the variance keeps its precision when |mean| >> std
     *     (SyncBN: all-gather sum | sumsq | count per rank and merge with dt_bn_stats_combine;
     *     M2s are not additive across ranks)
     *   bn_fwd_apply: mean = sum/count, var = sumsq/count, rstd (C), from the (merged) statistics
     *     and their count; updates running_mean and running_var (unbiased) with momentum;
     *     out = w * (x - mean) * rstd + b
     * Eval forward: bn_fwd_eval from the running statistics.
     * Backward:
     *   bn_bwd_reduce: dw (C) += sum dout*xhat, db (C) += sum dout, and sets sum_dy (C),
     *     sum_dy_xhat (C) (local)                     (SyncBN: all-reduce sum_dy, sum_dy_xhat)
     *   bn_bwd_apply: dinp += w*rstd*(dout - sum_dy/count - xhat*sum_dy_xhat/count) */
    void (*bn_stats)(dt_backend *be, float *sum, float *sumsq, const float *inp, int N, int C,
                     int HW);
    void (*bn_fwd_apply)(dt_backend *be, float *out, float *mean, float *rstd, float *running_mean,
                         float *running_var, const float *inp, const float *w, const float *b,
                         const float *sum, const float *sumsq, double count, int N, int C, int HW,
                         float momentum, float eps);
    void (*bn_fwd_eval)(dt_backend *be, float *out, const float *inp, const float *running_mean,
                        const float *running_var, const float *w, const float *b, int N, int C,
                        int HW, float eps);
    void (*bn_bwd_reduce)(dt_backend *be, float *dw, float *db, float *sum_dy, float *sum_dy_xhat,
                          const float *dout, const float *inp, const float *mean,
                          const float *rstd, int N, int C, int HW);
    void (*bn_bwd_apply)(dt_backend *be, float *dinp, const float *dout, const float *inp,
                         const float *w, const float *mean, const float *rstd,
                         const float *sum_dy, const float *sum_dy_xhat, double count, int N, int C,
                         int HW);

    /* ---- pooling ---- */
    /* Max pooling k x k, stride, pad: out (N,C,P,Q), idx (N,C,P,Q) int32 argmax within the
     * input plane (saved for bwd). */
    void (*maxpool_fwd)(dt_backend *be, float *out, int32_t *idx, const float *inp, int N, int C,
                        int H, int W, int k, int stride, int pad);
    void (*maxpool_bwd)(dt_backend *be, float *dinp, const float *dout, const int32_t *idx, int N,
                        int C, int H, int W, int P, int Q);
    /* Global average pooling: out (N,C) = mean over HW of inp (N,C,HW). */
    void (*avgpool_fwd)(dt_backend *be, float *out, const float *inp, int N, int C, int HW);
    void (*avgpool_bwd)(dt_backend *be, float *dinp, const float *dout, int N, int C, int HW);

    /* ---- optimisers (on a contiguous range of the flat parameter buffer) ---- */
    /* SGD with momentum (PyTorch semantics, dampening 0): g = grad + wd*p; buf = momentum*buf + g
     * (buf = g on the first step, signalled by first_step); step = nesterov ? g + momentum*buf
     * : buf (or g when momentum == 0, buf may then be NULL); p -= lr * step. */
    void (*sgd_update)(dt_backend *be, float *params, const float *grads, float *momentum_buf,
                       size_t n, float lr, float momentum, bool nesterov, float weight_decay,
                       bool first_step);
    /* AdamW (decoupled weight decay, PyTorch semantics): t is the 1-based step count.
     * m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= lr*(mhat/(sqrt(vhat)+eps) + wd*p).
     * The hyper-parameters are doubles, as PyTorch's Python floats are: the coefficients
     * (1 - b1, 1 - b2, 1 - lr*wd, lr / (1 - b1^t), sqrt(1 - b2^t)) are formed in double on the
     * host and rounded to float once, as torch.optim.AdamW does (1 - b2 from a float-rounded b2
     * would be 1.3e-5 off at b2 = 0.999). */
    void (*adamw_update)(dt_backend *be, float *params, const float *grads, float *m, float *v,
                         size_t n, double lr, double beta1, double beta2, double eps,
                         double weight_decay, int64_t t);
    /* Sum of squares of x (n), accumulated in double, returned to the host (waits). */
    double (*sumsq)(dt_backend *be, const float *x, size_t n);
    /* Number of non-finite values in x (n) (waits); used for fp16 loss-scaling overflow. */
    size_t (*count_nonfinite)(dt_backend *be, const float *x, size_t n);

    /* ---- 16-bit payloads (DDP gradient compression) ----
     * to_half: half (n) = x (n) * scale, rounded to nearest even to bfloat16 (bf16) or float16
     * (overflow becomes inf, NaN stays NaN); from_half: x (n) = half (n) widened, * scale. The
     * roundings are common/half.h's, bit for bit (NaN payloads aside). */
    void (*to_half)(dt_backend *be, uint16_t *half, const float *x, size_t n, float scale,
                    bool bf16);
    void (*from_half)(dt_backend *be, float *x, const uint16_t *half, size_t n, float scale,
                      bool bf16);
};

/* Merges the BatchNorm statistics of R parts exactly (Chan et al.'s parallel variance; what
 * SyncBatchNorm does after an all-gather): parts (R * (2C+1)) host, part r = sum (C) | sumsq (C)
 * | count (1), as bn_stats writes them (sumsq centred on the part's own mean) followed by the
 * part's sample count. Writes the merged sum (C) and centred sumsq (C) (host) and returns the
 * total count. Computed in double; parts with count 0 are ignored. */
double dt_bn_stats_combine(const float *parts, int R, int C, float *sum, float *sumsq);

/* Every backend's create function has this contract: *out gets a new instance (free it with
 * its close, or dt_backend_close) filled in for opts (NULL: dt_backend_opts_default), or an
 * error is returned (negative errno, err says what). libdtrain_cuda.so exports one under
 * DT_CUDA_BACKEND_CREATE_SYMBOL (kernels/cuda), which kernels/backend.c looks up. */
typedef int (*dt_cuda_backend_create_fn)(dt_backend **out, const dt_backend_opts *opts,
                                         dt_err *err);
#define DT_CUDA_BACKEND_CREATE_SYMBOL "dt_cuda_backend_create"

#endif
