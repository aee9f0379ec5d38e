/* model.h - the interface of the model zoo (runtime/models): mlp, resnet, gpt, bert, llama.
 *
 * Models are written once, llm.c style, with explicit forward and backward passes against the
 * op table of kernels/backend.h. All parameters live in one contiguous backend buffer and all
 * gradients in another with the same layout, described by a table of named tensors; DDP buckets
 * are slices of the gradient buffer, checkpoints are the parameter buffer plus the table, and the
 * start-up broadcast is one call. Non-trained state (BatchNorm running statistics) lives in a
 * third buffer with its own table.
 *
 * Tensor names follow the conventions of the wider ecosystem (GPT-2: wte, wpe, h.0.ln_1.weight,
 * h.0.attn.c_attn.weight, ...; Llama: model.layers.0.self_attn.q_proj.weight, ...; torchvision's
 * names for resnet) so that a safetensors file
 * written by dtrain is readable by other tools.
 */
#ifndef DT_MODEL_H
#define DT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "runtime/comm/comm.h"

#define DT_TENSOR_NAME_MAX 96
#define DT_TENSOR_MAX_DIMS 4

typedef struct dt_tensor_info {
    char name[DT_TENSOR_NAME_MAX];
    int ndim;
    int64_t shape[DT_TENSOR_MAX_DIMS];
    size_t offset;  /* in elements (float32) from the start of its buffer */
    size_t numel;
    bool no_decay;  /* biases and normalisation parameters: no weight decay */
    /* Tensor parallelism (cfg.tp_size > 1): how this rank's tensor (shape) is a slice of the
     * whole one (whole_shape, the tensor as one process holds it and a checkpoint saves it).
     * tp_parts == 0: replicated, every rank of the tensor group holds the whole tensor
     * (whole_shape == shape). Else dimension tp_dim of the whole tensor is tp_parts equal parts
     * (gpt's c_attn: 3, q k v; otherwise 1); chunk = shape[tp_dim] / tp_parts, and this rank
     * holds, of every part in turn, the chunk elements from tp_rank * chunk within the part.
     * Indices past the part's end (a vocabulary padded to a multiple of the tensor size) are
     * padding: zero in the parameters, never trained, not saved. */
    int tp_dim, tp_parts;
    int64_t whole_shape[DT_TENSOR_MAX_DIMS];
} dt_tensor_info;

/* Elements of t's whole tensor (whole_shape; numel when replicated). */
size_t dt_tensor_whole_numel(const dt_tensor_info *t);

/* Host copy between t's whole tensor (whole_shape, row-major) and the slice rank tp_rank holds
 * (shape, as t describes it; a plain copy when replicated). to_whole: local -> its elements of
 * whole (the padding is dropped, the rest of whole untouched); else whole -> local (the padding
 * zeroed). Checkpoints gather with it on save and slice with it on load. */
void dt_tensor_tp_copy(const dt_tensor_info *t, int tp_rank, float *whole, float *local,
                       bool to_whole);

/* What one sample looks like; produced by the data module, consumed by model creation. */
typedef enum dt_sample_kind { DT_SAMPLE_TOKENS = 0, DT_SAMPLE_VECTOR = 1, DT_SAMPLE_IMAGE = 2 }
    dt_sample_kind;

typedef struct dt_sample_shape {
    dt_sample_kind kind;
    int seq_len;     /* tokens: T (inputs and targets are T tokens each) */
    int vocab_size;  /* tokens: token ids are < vocab_size */
    bool mlm;        /* tokens: masked-LM samples (bert; data/mlm.h): batches carry token types,
                      * an attention mask and next-sentence labels, and the targets are the
                      * masked positions' tokens (-1 elsewhere) */
    int input_dim;   /* vector: features per sample */
    int channels, height, width; /* image: (C,H,W) */
    int n_classes;   /* vector and image: labels are < n_classes */
} dt_sample_shape;

/* A batch, in host memory; the model copies it to the device. */
typedef struct dt_batch {
    int B;                  /* samples */
    int T;                  /* tokens per sample (tokens kind), else 0 */
    const int32_t *tokens;  /* (B,T) inputs (tokens kind) */
    const int32_t *targets; /* (B,T) next tokens (tokens kind) or (B) labels; < 0 = ignore */
    const float *x;         /* (B, input numel) inputs (vector and image kinds) */
    /* bert (all NULL for the other models, and each may be NULL for bert): */
    const int32_t *types;   /* (B,T) token type (segment) ids, 0 or 1; NULL: all 0 */
    const int32_t *mask;    /* (B,T) attention mask: 1 a token, 0 padding that no position
                             * attends to; NULL: all 1 */
    const int32_t *labels;  /* (B) next-sentence labels (0: the second segment follows the
                             * first, 1: a random one), for cfg.nsp; NULL: none */
} dt_batch;

/* The samples [from, from + count) of b, as a view (every array b has, offset): per is the
 * floats per sample of x (0 when b has none). For the strategies that cut a batch. */
dt_batch dt_batch_slice(const dt_batch *b, int from, int count, size_t per);

/* train.recompute: which activations backward recomputes instead of keeping them from forward.
 * The recomputation runs the same ops on the same inputs, and backward then runs the same ops in
 * the same order, so gradients are bit-identical to DT_RECOMPUTE_NONE on the cpu backend
 * (tests/test_models.c) and on any backend whose ops are deterministic run to run. */
typedef enum dt_recompute {
    DT_RECOMPUTE_NONE = 0,      /* keep every layer's activations (fastest, most memory) */
    DT_RECOMPUTE_BLOCK = 1,     /* keep each block's input (gpt: the residual stream; resnet:
                                 * each BasicBlock's output), recompute the block's forward at
                                 * the start of its backward: one block's intermediates are
                                 * allocated instead of one per block */
    DT_RECOMPUTE_SELECTIVE = 2, /* gpt, bert, llama (Megatron's selective mode): keep everything
                                 * but what attention saves for its backward per layer (causal
                                 * attention: the backend's attention_sizes, cuda's cuBLAS path
                                 * the probabilities (B,NH,T,T), the cpu only the log-sum-exp
                                 * (B,NH,T), as it never stores probabilities; bert's padded
                                 * attention: its probabilities (B,NH,T,T)), recompute it
                                 * from the saved q,k,v in backward */
} dt_recompute;

/* The model zoo's architectures: dt_model_create builds one of these. The list is models/'s (the
 * job's model.type maps onto it in dt_model_config_from_job); dt_model_arch_name gives the
 * names back. Adding a model: its value here (before DT_ARCH_COUNT), its name in zoo.c's table,
 * its checks in check_config and its create in dt_model_create (zoo.c). */
typedef enum dt_model_arch {
    DT_ARCH_MLP = 0,
    DT_ARCH_RESNET,
    DT_ARCH_GPT,
    DT_ARCH_BERT,
    DT_ARCH_LLAMA,
    DT_ARCH_COUNT /* not an architecture: how many there are */
} dt_model_arch;

/* "mlp", "resnet", "gpt"; "?" for a value that is none. */
const char *dt_model_arch_name(dt_model_arch arch);

/* The architecture called name (one of dt_model_arch_name's): 0, or -EINVAL with a message
 * listing the names. */
int dt_model_arch_parse(const char *name, dt_model_arch *out, dt_err *err);

typedef struct dt_model_config {
    dt_model_arch arch;
    dt_sample_shape shape;
    int max_batch;        /* activations are allocated for batches up to this size */
    uint64_t seed;        /* initialisation */
    /* gpt, bert and llama (block_size: bert's max_position_embeddings) */
    int n_layer, n_head, n_embd, block_size;
    bool nsp;             /* bert: the next-sentence head (the pooler and cls.seq_relationship) */
    /* llama: n_kv_head key/value heads (grouped-query attention; 0 = n_head, which it must
     * divide), ffn_hidden the SwiGLU width (Hugging Face's intermediate_size), rope_theta the
     * rotary base, norm_eps RMSNorm's epsilon (0: 1e-5) */
    int n_kv_head, ffn_hidden;
    float rope_theta, norm_eps;
    /* mlp: hidden widths */
    int n_hidden;
    int hidden[16];
    /* resnet: depth = 6n+2 (20, 32, 44, 56, 110), width = channels of the first stage; with
     * imagenet, torchvision's ImageNet ResNet of depth 18, 34 (BasicBlocks), 50, 101 or 152
     * (Bottlenecks), width = the stem's channels (torchvision: 64; the stages' planes are width,
     * 2 width, 4 width, 8 width) */
    int depth, width;
    bool imagenet;
    bool sync_bn;         /* all-reduce BatchNorm statistics through `comm` */
    float bn_momentum, bn_eps;
    dt_recompute recompute; /* gpt, bert, llama: all three; resnet: none, block; mlp: none, block (an mlp
                             * keeps only each layer's input already: block is none) */
    /* Tensor parallelism (gpt, and bert and llama as their headers say; 0 or 1: none): this rank is
     * tp_rank of tp_size and holds
     * 1/tp_size of every attention and MLP block (Megatron: c_attn and c_fc column-parallel,
     * the c_proj's row-parallel) and of the vocabulary (wte: vocab-parallel embedding, tied
     * head and cross-entropy); LayerNorms, wpe and the row-parallel biases are replicated. The
     * comm given to dt_model_create is then the tensor group (tp_size ranks), which forward
     * and backward all-reduce over. Initialisation draws every whole tensor from the same
     * stream as tp_size = 1 and keeps this rank's slice, so every layout starts bit-identical.
     * Tensor tables (m->tensors) describe the local slices, with tp_dim/tp_parts/whole_shape. */
    int tp_size, tp_rank;
    /* Sequence parallelism (Megatron-SP; gpt, bert and llama, needs tp_size > 1 and shape.seq_len
     * divisible by tp_size, else dt_model_create is -EINVAL): the residual stream, the
     * LayerNorms and the row-parallel bias adds hold this rank's 1/tp_size of the batch's
     * tokens instead of all of them, the all-reduces become reduce-scatters and all-gathers
     * (gpt.c's header: the layout and what is communicated), and a pipeline stage's input and
     * output are those shards (pp_in_numel and pp_out_numel shrink by tp_size). Gradients
     * are those of sequence_parallel = false, to rounding. */
    bool sequence_parallel;
    /* Pipeline parallelism (pp_size 0 or 1: none): this model is stage pp_rank of pp_size and
     * holds the run [pp_first, pp_first + pp_count) of the model's pipeline blocks, the units
     * runtime/job/config.h's dt_job_stage_blocks counts (mlp: the Linear layers fc.i; gpt: the
     * transformer blocks h.i, with the embedding (wte, wpe) on stage 0 and ln_f and the head on
     * the last stage, which holds its own copy of the tied wte; resnet: the residual blocks
     * layer{s}.{j}, with the stem on stage 0 and the pool and fc on the last). Tensors keep their whole-model
     * names (fc.3.weight on whichever stage holds layer 3); initialisation draws every tensor of
     * the whole model from the same stream as pp_size = 1 and keeps this stage's, so a pipeline
     * starts bit-identical to one process. pp_slots (0 or 1: one): how many micro-batches'
     * activations the stage keeps at once (GPipe: M; 1F1B: min(P - pp_rank, M)), each in its
     * slot; max_batch is then the micro-batch size. Such a model is driven through m->stage
     * (dt_model_stage_ops, below); its forward/backward refuse to run. */
    int pp_size, pp_rank, pp_first, pp_count, pp_slots;
} dt_model_config;

/* Called by backward as soon as grads[offset, offset+numel) is final for this backward pass.
 * Ranges are reported once each, together covering every gradient, in backward order. Each
 * range is exactly one block's range (see dt_block below). */
typedef void (*dt_grad_ready_fn)(void *ctx, size_t offset, size_t numel);

/* ---- blocks and block hooks (ZeRO-3 / FSDP) ----------------------------------------------
 *
 * A model's parameter buffer is cut into blocks: contiguous ranges that tile it exactly, in
 * buffer order, each a whole number of tensors, each the unit a ZeRO-3 strategy gathers:
 *   gpt:    "embed" (wte, wpe), "h.0" ... "h.{L-1}" (one transformer block each), "ln_f"
 *   llama:  "embed" (embed_tokens), "layers.0" ... "layers.{L-1}", "head" (norm, lm_head)
 *   resnet: "stem" (conv1, bn1), "layer1.0" ... (one residual block each), "fc"
 *   mlp:    "fc.0" ... "fc.{K}" (one Linear each)
 * The gradient buffer has the same layout, so a block's range is also its gradient range.
 *
 * When m->block_hook is set, forward and backward bracket every use of a block's parameters
 * and gradients with events: hook(ctx, b, BEFORE_x) just before the first op that reads block b's
 * parameters (or accumulates into its gradients), hook(ctx, b, AFTER_x) just after the last
 * such op of that use. Between the two is a "window". The contract:
 *   - Outside its windows, a block's parameter memory and gradient memory are neither read nor
 *     written by the model: they may hold garbage (a ZeRO-3 strategy gathers the parameters at
 *     BEFORE and may drop them at AFTER; it may also keep the gradients elsewhere between
 *     windows, restoring them at BEFORE_BACKWARD). Buffers (BatchNorm running statistics) are
 *     not covered: they are not sharded.
 *   - Windows never nest or overlap: at most one is open at a time, and a BEFORE is always
 *     followed by the AFTER of the same block and pass before any other event.
 *   - Order, per forward (training or not): BEFORE_FORWARD/AFTER_FORWARD for blocks 0, 1, ...,
 *     num_blocks-1, in buffer order; per backward: BEFORE_BACKWARD/AFTER_BACKWARD for blocks
 *     num_blocks-1, ..., 1, 0; plus the extra windows of tied blocks (below). With
 *     cfg.recompute, a block's backward window also holds the recomputation of its forward
 *     (no extra events: the parameters are read again inside BEFORE/AFTER_BACKWARD).
 *   - Tied weights: a block may have more than one window per pass; blocks[b].windows says
 *     how many. Only gpt's and bert's "embed" have two (bert.c: its MLM decoder reads the word
 *     embeddings again, after the "cls" window). gpt's output projection is wte again, so a gpt
 *     forward is embed, h.0 .. h.{L-1}, ln_f, embed (the head); a gpt backward is embed (the
 *     head: reads wte, accumulates into wte's gradient), ln_f, h.{L-1} .. h.0, embed (the
 *     embedding backward, which reads no parameter but accumulates into wte's and wpe's
 *     gradients).
 *   - Gradients: a block's gradients are final at its last AFTER_BACKWARD of the backward pass.
 *     The grad-ready callback of backward reports exactly blocks[b]'s range once, inside that
 *     last window, just before its AFTER_BACKWARD (so ready ranges come in block order
 *     num_blocks-1 .. 0).
 *   - A forward or backward that fails before its first event emits none; one that fails in a
 *     window (SyncBatchNorm's collectives) returns without the AFTER.
 * The hook runs on the thread that calls forward/backward; on an asynchronous backend (CUDA)
 * the events are in the order ops are enqueued on the compute stream, so a strategy that
 * gathers on another stream orders them with events against that stream. */
typedef enum dt_block_event {
    DT_BLOCK_BEFORE_FORWARD = 0,
    DT_BLOCK_AFTER_FORWARD = 1,
    DT_BLOCK_BEFORE_BACKWARD = 2,
    DT_BLOCK_AFTER_BACKWARD = 3,
} dt_block_event;

#define DT_BLOCK_NAME_MAX 32

typedef struct dt_block {
    char name[DT_BLOCK_NAME_MAX]; /* "embed", "h.3", "ln_f", "stem", "layer2.0", "fc", "fc.1" */
    size_t offset, numel;         /* elements, in the parameter (and gradient) buffer */
    int first_tensor, last_tensor; /* m->tensors[first..last] (inclusive) */
    int windows;                  /* windows per forward and per backward pass (1; gpt embed 2) */
} dt_block;

typedef void (*dt_block_hook_fn)(void *ctx, int block, dt_block_event ev);

typedef struct dt_model dt_model;

typedef struct dt_model_ops {
    /* Forward on batch (batch->B <= max_batch). *loss (host) = mean loss over valid targets.
     * training: BatchNorm uses batch statistics and updates running ones. */
    int (*forward)(dt_model *m, const dt_batch *batch, bool training, float *loss, dt_err *err);
    /* Backward of the last training forward: grads += d(dloss_scale * loss)/d(params). */
    int (*backward)(dt_model *m, float dloss_scale, dt_grad_ready_fn ready, void *ready_ctx,
                    dt_err *err);
    void (*free)(dt_model *m);
} dt_model_ops;

/* ---- pipeline stages (cfg.pp_size > 1) --------------------------------------------------------
 * m->stage is NULL in a model without a stage form: the pipeline strategy refuses it. A model
 * with a stage form runs them for pp_size <= 1 too, as the one stage of one (forward and
 * backward are then slot 0 of it). The contract, for whoever writes a model's stages (mlp.c,
 * gpt.c, bert.c, llama.c and resnet.c implement them):
 *   - A micro-batch's forward on stage s runs in one of cfg.pp_slots slots, which keeps its
 *     activations until that slot's stage_backward (or the slot's next forward, which
 *     discards them). Slots are independent: forwards of several micro-batches may run
 *     before their backwards, in any order, and backwards in any order of their own. What
 *     a backward needs of its forward is the slot's, BatchNorm's batch statistics too
 *     (resnet: each slot keeps every BN's mean and 1/std of its micro-batch); the running
 *     statistics (m->buffers) are the stage's, moved by every training forward in the
 *     order the forwards run, as one process with train.grad_accum moves them.
 *   - stage_forward(m, slot, batch, in, training, out, loss, err): batch is the
 *     micro-batch (batch->B <= cfg.max_batch samples, host memory): stage 0 reads its inputs
 *     (tokens or x), the last stage its targets, every stage its B (and T). in (backend
 *     memory, (B, m->pp_in_numel)) is the previous stage's output for this micro-batch,
 *     NULL on stage 0; it is borrowed until the slot's stage_backward, which reads it again,
 *     and must not change meanwhile. *out (backend memory of the model, (B,
 *     m->pp_out_numel)) is this stage's output, what the next stage gets as `in`: valid and
 *     unchanged until this slot's next stage_forward; NULL on the last stage. *loss is the
 *     micro-batch's mean loss over its valid targets on the last stage (and last_correct
 *     its correct predictions), 0 elsewhere. Block events as forward, for this stage's
 *     blocks (indices into m->blocks, which lists this stage's blocks only).
 *   - stage_backward(m, slot, dloss_scale, dout, din, ready, ctx, err): the backward of
 *     the slot's last training forward. On the last stage dout is NULL and the gradients
 *     accumulate d(dloss_scale x loss)/d(params), as backward; elsewhere dout (backend
 *     memory, (B, m->pp_out_numel), read only) is the gradient of the step's objective
 *     with respect to the slot's *out (the next stage's din) and the gradients accumulate
 *     that gradient's pull-back (dloss_scale is ignored). din (backend memory, (B,
 *     m->pp_in_numel)) is overwritten with the gradient with respect to the slot's `in`;
 *     NULL on stage 0. ready reports this stage's blocks exactly as backward does.
 *   - Memory the backward recomputes anyway (gpt's recompute modes) may be one copy for all
 *     slots; pp_slot_bytes is what each slot beyond the first adds.
 *   - The stages of one model, chained (stage s's *out as stage s+1's in, stage s+1's din
 *     as stage s's dout), compute what forward and backward of the whole model compute, to
 *     rounding: same ops, same per-sample order; only sums over the batch split into
 *     micro-batches differ. */
typedef struct dt_model_stage_ops {
    int (*stage_forward)(dt_model *m, int slot, const dt_batch *batch, const float *in,
                         bool training, float **out, float *loss, dt_err *err);
    int (*stage_backward)(dt_model *m, int slot, float dloss_scale, const float *dout,
                          float *din, dt_grad_ready_fn ready, void *ready_ctx, dt_err *err);
} dt_model_stage_ops;

struct dt_model {
    dt_model_config cfg;
    dt_backend *be;            /* borrowed; outlives the model */
    float *params;             /* (num_params) backend memory, owned */
    float *grads;              /* (num_params) same layout: what backward accumulates into. The
                                  model's own buffer (owned), or memory a caller lent it with
                                  dt_model_lend_grads */
    float *own_grads;          /* the model's own gradient buffer while grads is lent memory
                                  (owned); NULL otherwise */
    size_t num_params;
    dt_tensor_info *tensors;   /* (num_tensors) host, owned, in buffer order */
    int num_tensors;
    float *buffers;            /* (num_buffers) non-trained state, owned; NULL when none */
    size_t num_buffers;
    dt_tensor_info *buffer_tensors;
    int num_buffer_tensors;
    double flops_per_sample;   /* forward + backward FLOPs for one sample (MFU, benchmarks) */
    int64_t last_correct;      /* classification: correct predictions in the last forward */
    dt_block *blocks;          /* (num_blocks) host, owned: tiles the parameter buffer */
    int num_blocks;
    dt_block_hook_fn block_hook; /* NULL: no events; set by the strategy before forward */
    void *block_hook_ctx;
    size_t activation_bytes;   /* backend memory the model holds besides params, grads, buffers */
    size_t pp_in_numel;        /* pipeline stage: elements per sample of the activation it
                                  receives (0 on stage 0, which reads the batch) */
    size_t pp_out_numel;       /* ... and of the one it sends (0 on the last stage) */
    size_t pp_slot_bytes;      /* backend memory each activation slot beyond the first adds
                                  (part of activation_bytes, which also counts what the slots
                                  share) */
    const dt_model_ops *ops;
    const dt_model_stage_ops *stage; /* pipeline stages; NULL: the model has no stage form */
    void *impl;
};

/* Builds a model from cfg on backend be, initialised deterministically from cfg->seed (GPT-2:
 * normal(0, 0.02), residual projections scaled by 1/sqrt(2L); He for convolutions). comm is
 * borrowed (it must outlive the model): SyncBatchNorm's (may be NULL), or, with cfg->tp_size >
 * 1, the tensor group, required, of tp_size ranks of which this is tp_rank. -EINVAL, naming
 * the setting to change, for tp_size > 1 on a model other than gpt or llama, an n_head (llama:
 * n_kv_head, ffn_hidden) tp_size does not divide, tp_rank outside 0..tp_size-1, no comm or a comm
 * of another size or rank. */
int dt_model_create(dt_model **out, const dt_model_config *cfg, dt_backend *be, dt_comm *comm,
                    dt_err *err);

/* Accepts NULL. */
void dt_model_free(dt_model *m);

/* Index of the tensor called name, or -1. */
int dt_model_find_tensor(const dt_model *m, const char *name);

/* Lends m another gradient buffer: from now on backward accumulates into grads (num_params
 * floats of m's backend memory, owned by the caller, alive until it takes it back) instead of
 * the model's own buffer; grads NULL gives the model its own buffer back. Returns the model's
 * own buffer, which stays the model's (dt_model_free frees it, lent or not) and is left as it
 * is: copying gradients between the two, or giving the own buffer's memory back while it is
 * not used (mem_release), is the caller's. DDP lends the model communicator memory this way
 * (dpsync/ddp.h, "Communicator memory"), which the ranks of a host reduce from in place. */
float *dt_model_lend_grads(dt_model *m, float *grads);

/* Installs (fn, ctx) as m's block hook (fn NULL: none); see dt_block_event for the contract. */
void dt_model_set_block_hook(dt_model *m, dt_block_hook_fn fn, void *ctx);

/* Bytes of backend memory m holds for activations, their backward scratch and its batch
 * inputs (tokens, targets, images): everything it allocated besides the parameter, gradient and
 * buffer storage. Sized at creation for (max_batch, seq_len) and cfg.recompute. */
size_t dt_model_activation_bytes(const dt_model *m);

struct dt_job;

/* Fills cfg from the [model] keys of a loaded job (presets already applied by the config
 * loader), the data's sample shape and [train] batch_size (max_batch) and [job] seed:
 *   gpt:    n_layer, n_head, n_embd, block_size; needs token samples with seq_len <= block_size
 *   bert:   as gpt, and nsp
 *   llama:  gpt's and n_kv_head, intermediate_size (ffn_hidden), rope_theta, rms_norm_eps
 *   resnet with a resnet* preset: imagenet, depth from the preset
 *   mlp:    hidden "512,256" -> n_hidden, hidden[]; vector or image samples (images flattened)
 *   resnet: depth (6n+2), width, sync_bn; image samples; BatchNorm momentum 0.1, eps 1e-5
 *   all:    [train] recompute (selective: gpt and bert)
 * Returns 0, or -EINVAL with a message naming the [model] key or the data that does not fit
 * (cfg is then partly filled). */
int dt_model_config_from_job(dt_model_config *cfg, const struct dt_job *job,
                             const dt_sample_shape *shape, dt_err *err);

#endif
