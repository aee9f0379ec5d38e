/* cost.h - what a model's pipeline blocks cost, and the balanced split of them into stages.
 *
 * The blocks parallel.pipeline splits are gpt's transformer blocks, mlp's Linear layers and
 * resnet's residual blocks (the stem on the first stage, the pool and fc on the last). A
 * block's weight is its forward FLOPs a token (a backward is about twice its forward for every
 * piece, so the ratios hold for a step); the first stage holds the embedding besides its blocks,
 * the last ln_f and the head. The pipeline's pace is set by its costliest stage, so the balanced
 * split is the one whose costliest stage is the cheapest.
 *
 * This module sits below the job (config.h includes it, not the other way round): it knows a
 * model only by the shape fields of dt_cost_model, which config.h's dt_job_cost_model fills from
 * a job, so a planner can weigh shapes and stage counts that no job file gives yet. The job's
 * own view (dt_job_pipeline_blocks, dt_job_stage_costs, dt_job_stage_blocks) is in config.h.
 */
#ifndef DT_COST_H
#define DT_COST_H

#include "common/err.h"

/* The models whose blocks the cost model knows. */
typedef enum dt_cost_family {
    DT_COST_OTHER, /* not configured: no blocks */
    DT_COST_GPT,   /* transformer blocks, weighed by FLOPs */
    DT_COST_MLP,   /* Linear layers, which count alike (their widths come from the data) */
    DT_COST_BERT,  /* encoder layers, weighed as gpt's blocks; the MLM head on the last stage */
    DT_COST_LLAMA, /* decoder layers (llama), weighed by FLOPs */
    DT_COST_RESNET, /* residual blocks (resnet), which count alike */
} dt_cost_family;

/* A model's shape as the cost model reads it. */
typedef struct dt_cost_model {
    dt_cost_family family;
    const char *name;   /* the model's name in messages ("resnet"); borrowed, may be "" */
    int n_layer;        /* gpt: transformer blocks (0: not configured) */
    int n_embd;         /* gpt: C, the width (<= 0: unknown, blocks then count alike) */
    int seq_len;        /* gpt: T, tokens a sequence */
    int vocab_size;     /* gpt: V, the head's outputs */
    int n_hidden;       /* mlp: hidden widths, so n_hidden + 1 Linear layers (0: none valid) */
    int n_head, n_kv_head, intermediate_size; /* llama: heads, key/value heads, SwiGLU width */
    int depth;          /* resnet: 6n+2 (3n BasicBlocks), or torchvision's depth with imagenet */
    int imagenet;       /* resnet: 1 for a resnet* preset (18, 26, 34, 50, 101, 152) */
} dt_cost_model;

/* The blocks of m that a pipeline splits into stages: gpt's n_layer, mlp's n_hidden + 1,
 * resnet's residual blocks (CIFAR: (depth - 2) / 2; torchvision's: 8, 8, 16, 16, 33 and 50 for
 * depth 18, 26, 34, 50, 101 and 152); 0 for a model not configured yet. */
int dt_cost_blocks(const dt_cost_model *m);

/* What the blocks of m are called in messages: "transformer blocks (model.n_layer)" for gpt,
 * "residual blocks (model.depth, model.preset)" for resnet, "Linear layers (model.hidden's
 * widths + 1)" otherwise. */
const char *dt_cost_blocks_what(const dt_cost_model *m);

/* What the balanced split weighs (relative forward FLOPs a token): *block one of the blocks,
 * *first what the first stage holds besides its blocks, *last what the last one does. gpt: a
 * transformer block 24*C^2 + 4*T*C (its four GEMMs' 12*C^2 multiply-adds, attention's Q*K^T and
 * A*V), the embedding 0 (a look-up), ln_f and the tied head 2*C*V (the (B,T,C) x (C,V) GEMM;
 * ln_f's O(C) and the cross-entropy's O(V) left out). bert: an encoder layer as a gpt block,
 * the MLM head 2*C^2 + 2*C*(V + 4) (the transform and the decoder over the vocabulary and its 4
 * special tokens). llama: a decoder layer 2 C^2 (2 + 2 n_kv_head / n_head) (q, k, v, o) + 6 C F
 * (SwiGLU's three) + 4 T C, its untied head 2 C V. Other models, and gpt, bert or llama without
 * n_embd: 1,
 * 0, 0. Returns 1 when the costs are the model's, 0 for the uniform fallback. */
int dt_cost_block_flops(const dt_cost_model *m, double *block, double *first, double *last);

/* The contiguous split of L blocks of cost b into P stages (1 <= P <= L; each stage >= 1 block;
 * stage 0 costs first more, stage P-1 last more) whose costliest stage is the cheapest, into
 * blocks[0..P). Among the splits with that maximum, the one with the least sum of squared stage
 * costs; among those, the earlier stages take the more blocks (with first = last = 0: L / P
 * each, the first L % P stages one more). Returns 0, or -ENOMEM. */
int dt_cost_balance(int L, int P, double b, double first, double last, int *blocks);

/* The blocks of each of P pipeline stages of m into blocks[0..P) (1 <= P): given[0..n_given)
 * (parallel.stages) when n_given > 0, else the balanced split of dt_cost_balance over the costs
 * of dt_cost_block_flops; a model without blocks gets P stages of 0. Returns P, or -EINVAL with
 * a message naming parallel.pipeline / parallel.stages when m cannot be split so (a model
 * without a pipeline form and P > 1, more stages than blocks, given stages that do not fit), or
 * -ENOMEM. */
int dt_cost_stage_blocks(const dt_cost_model *m, int P, const int *given, int n_given,
                         int *blocks, dt_err *err);

#endif
