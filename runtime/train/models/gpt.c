/* gpt.c - `gpt`: the GPT-2 architecture, llm.c style (explicit forward and backward).
 *
 * Token and learned position embeddings, L pre-LayerNorm blocks (causal multi-head attention
 * and a 4C tanh-GELU MLP, each added to the residual stream), a final LayerNorm and the output
 * projection tied to the token embedding, softmax cross-entropy over the next token.
 *
 * Parameters, in buffer order, with Hugging Face GPT-2 names:
 *   wte.weight (V,C) wpe.weight (maxT,C)
 *   h.{l}.ln_1.weight (C) h.{l}.ln_1.bias (C)
 *   h.{l}.attn.c_attn.weight (3C,C) h.{l}.attn.c_attn.bias (3C)
 *   h.{l}.attn.c_proj.weight (C,C) h.{l}.attn.c_proj.bias (C)
 *   h.{l}.ln_2.weight (C) h.{l}.ln_2.bias (C)
 *   h.{l}.mlp.c_fc.weight (4C,C) h.{l}.mlp.c_fc.bias (4C)
 *   h.{l}.mlp.c_proj.weight (C,4C) h.{l}.mlp.c_proj.bias (C)
 *   ln_f.weight (C) ln_f.bias (C)
 * Linear weights are stored (out, in) like torch.nn.Linear (Hugging Face's Conv1D stores the
 * transpose). Initialisation as GPT-2: normal(0, 0.02), the two residual projections (c_proj)
 * scaled by 1/sqrt(2L), LayerNorm weight 1, biases 0.
 *
 * Blocks (model.h): 0 "embed" (wte, wpe), 1+l "h.l", L+1 "ln_f". Backward reports, in order:
 * ln_f, then each block from h.{L-1} to h.0, then wte and wpe together last (wte's gradient is
 * only final after the embedding backward, as it is tied to the output projection). Block
 * events: forward embed, h.0 .. h.{L-1}, ln_f, embed (head); backward embed (head), ln_f,
 * h.{L-1} .. h.0, embed.
 *
 * Activations are kept per layer as in llm.c (about L*B*T*(16C + NH*T) floats); the backward
 * needs only a few (B,T,C)/(B,T,4C) scratch buffers besides. cfg.recompute (model.h): `block`
 * keeps only each block's output (L*B*T*C, the residual stream) plus one layer's intermediates,
 * and recomputes block l's forward (all but its last projection) at the start of its backward,
 * inside its backward window; `selective` keeps everything but the attention probabilities
 * (one (B,NH,T,T) slot instead of L), recomputed by attention_fwd just before attention_bwd. Where the GEMM time goes: every
 * projection is one matmul over all B*T rows, and attention is the backend's batched GEMMs, so
 * the non-GEMM work is O(B*T*C) per layer plus the O(B*NH*T*T) softmax.
 *
 * Tensor parallelism (cfg.tp_size = TP > 1, Megatron-LM's layout; model.h): rank r of the tensor
 * group holds
 *   c_attn (3C/TP, C) + bias: column-parallel by heads, heads [r*NH/TP, (r+1)*NH/TP): its q rows,
 *     then its k rows, then its v rows (tp_dim 0, tp_parts 3); attention runs locally over
 *     NH/TP heads of the same head size (the backend's ops with C/TP and NH/TP);
 *   attn.c_proj (C, C/TP): row-parallel (tp_dim 1); mlp.c_fc (4C/TP, C) + bias: column-parallel;
 *     mlp.c_proj (C, 4C/TP): row-parallel;
 *   wte (Vp/TP, C): vocabulary-parallel, rows [r*Vp/TP, (r+1)*Vp/TP) of the vocabulary padded
 *     to Vp, the next multiple of TP (as Megatron pads it); padding rows are zero, their logits
 *     are left out of every maximum, softmax and loss, so they get no gradient and stay zero;
 *     whole_shape keeps the real (V,C);
 *   replicated: wpe, the LayerNorms, ln_f and the two row-parallel biases.
 * The collectives are Megatron's conjugate operators, every one an all-reduce (sum) of a
 * contiguous (B,T,C) buffer over the tensor group: g after each row-parallel c_proj in forward
 * (the partial products; its bias is then added on every rank, after the all-reduce, so each
 * rank's residual stream is the same bits), f at the input of each column-parallel region in
 * backward (the gradient of ln_1's and ln_2's output): 2 forward and 2 backward per layer. The
 * embedding is a partial sum too (each rank its vocabulary's rows, zero for other tokens, rank
 * 0 adds wpe once; all-reduced), and the head computes only its logits (B,T,Vp/TP) with a
 * vocabulary-parallel cross-entropy (row maxima all-reduced with max, sums of exponentials and
 * target logits with sum; the whole logits are never gathered) and all-reduces the gradient
 * of its input (lnf) in backward. The replicated parameters' gradients are NOT all-reduced:
 * they are computed from the same all-reduced inputs by the same ops on every rank, so they
 * come out bit-identical across the group (tests/test_tp.c checks it; Megatron all-reduces them
 * only under sequence parallelism). With recompute = block the recomputation repeats the
 * forward's all-reduce of attn.c_proj inside the block's backward window. TP = 1 runs exactly
 * the ops it always ran.
 * Per step and rank: 4L + 2 all-reduces of B*T*C floats (the layers', the embedding's, the head
 * input's gradient; (4L+2)*B*T*C*4 bytes, Megatron's volume) and two of B*T and 2*B*T floats
 * for the loss; nothing (B,T,V)-sized is ever communicated or copied. The embedding's partial
 * sums hold one non-zero term per element besides wpe, so the all-reduced embedding is the
 * bits TP = 1 computes; everything after it matches TP = 1 to float32 rounding (different
 * summation orders in the split GEMMs).
 * For readers adding stages (pipeline parallelism): forward is embed_fwd, block_fwd per layer,
 * ln_f, head_fwd; backward is the head and ln_f, then block_bwd per layer (after the
 * recomputation), then the embedding's backward; each takes and leaves the residual stream in
 * g->encoded / g->res3 / g->dres.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/train/models/gpt.h"
#include "runtime/train/models/models.h"

typedef struct gpt_layer {
    int ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
} gpt_layer;

typedef struct gpt {
    int L, NH, C, V, maxT;
    int Bmax, Tmax;          /* activations are allocated for (Bmax,Tmax) */
    /* tensor parallelism (TP = 1: Cl = C, NHl = NH, Vl = nv = V, v0 = 0, comm NULL) */
    int tp, tpr;             /* group size and this rank */
    dt_comm *comm;           /* the tensor group (borrowed); NULL when tp == 1 */
    int Cl, NHl;             /* attention width and heads on this rank: C/TP, NH/TP */
    int Vl, v0, nv;          /* vocabulary rows here (Vp/TP), the first one's id, real ones */
    float *xmax, *xsums;     /* (B,T), (2,B,T): vocabulary-parallel cross-entropy statistics */
    int wte, wpe, lnfw, lnfb;
    gpt_layer *layers;       /* (L) owned */
    int32_t *tokens;         /* (B,T) device */
    int32_t *targets;        /* (B,T) device */
    dt_recompute recompute;
    int Lk, La;              /* layers of intermediates kept (L, or 1 with recompute = block)
                              * and of attention probabilities (L, or 1 with any recompute) */
    float *encoded;          /* (B,T,C) */
    float *ln1, *ln1_mean, *ln1_rstd; /* (Lk,B,T,C), (Lk,B,T), (Lk,B,T) */
    float *qkv;              /* (Lk,B,T,3Cl) */
    float *atty;             /* (Lk,B,T,Cl) */
    float *att;              /* (La,B,NHl,T,T) */
    float *res2;             /* (Lk,B,T,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;   /* (Lk,B,T,4Cl) */
    float *res3;             /* (L,B,T,C) residual after the MLP (block output), always kept:
                              * block l's output is block l+1's input */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
    float *logits;           /* (B,T,Vl); after a training forward softmax - onehot(target) */
    float *losses;           /* (B,T) */
    float *dres, *dC, *dqkv, *d4a, *d4b, *datt; /* backward scratch */
    int B, T, valid;         /* of the last training forward */
    bool can_backward;
} gpt;

static float *P(dt_model *m, int t) { return m->params + m->tensors[t].offset; }
static float *G(dt_model *m, int t) { return m->grads + m->tensors[t].offset; }

#define LN_EPS 1e-5f

/* Where layer l's activations live: its own slot, or the one shared slot when they are
 * recomputed (sizes are for (Bmax,Tmax); a smaller batch uses the start of each slot). */
typedef struct gpt_acts {
    float *ln1, *ln1m, *ln1r, *qkv, *atty, *att, *res2, *ln2, *ln2m, *ln2r, *fch, *fchg, *res3;
} gpt_acts;

static void acts_of(const gpt *g, int l, gpt_acts *a)
{
    const size_t NR = (size_t)g->Bmax * g->Tmax, NC = NR * g->C, NCl = NR * g->Cl;
    const size_t NATT = (size_t)g->Bmax * g->NHl * g->Tmax * g->Tmax;
    const size_t k = g->Lk == g->L ? (size_t)l : 0, ka = g->La == g->L ? (size_t)l : 0;
    a->ln1 = g->ln1 + k * NC;
    a->ln1m = g->ln1_mean + k * NR;
    a->ln1r = g->ln1_rstd + k * NR;
    a->qkv = g->qkv + k * 3 * NCl;
    a->atty = g->atty + k * NCl;
    a->att = g->att + ka * NATT;
    a->res2 = g->res2 + k * NC;
    a->ln2 = g->ln2 + k * NC;
    a->ln2m = g->ln2_mean + k * NR;
    a->ln2r = g->ln2_rstd + k * NR;
    a->fch = g->fch + k * 4 * NCl;
    a->fchg = g->fch_gelu + k * 4 * NCl;
    a->res3 = g->res3 + (size_t)l * NC;
}

/* ------------------------------------------------------------------------------------------ */
/* tensor-parallel pieces */

/* In-place all-reduce of x (n floats) over the tensor group (a no-op without one). */
static int tp_allreduce(const gpt *g, float *x, size_t n, dt_redop op, const char *what,
                        dt_err *err)
{
    if (g->tp == 1)
        return 0;
    int rc = dt_comm_allreduce(g->comm, x, n, DT_FLOAT32, op, NULL, err);
    if (rc)
        dt_err_prefix(err, "gpt tensor parallelism (rank %d of %d), all-reduce of %s: ", g->tpr,
                      g->tp, what);
    return rc;
}

/* Row-parallel linear + g (Megatron's RowParallelLinear): out (N,C) = inp (N,K) @ w^T, w (C,K)
 * this rank's columns, summed over the tensor group, + bias (C, replicated) added after the sum
 * on every rank. TP = 1: the one fused matmul it always was. */
static int row_parallel_fwd(dt_model *m, const gpt *g, float *out, const float *inp, int w,
                            int b, int N, int K, const char *what, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C;
    if (g->tp == 1) {
        be->matmul_fwd(be, out, inp, P(m, w), P(m, b), N, K, C);
        return 0;
    }
    be->matmul_fwd(be, out, inp, P(m, w), NULL, N, K, C);
    int rc = tp_allreduce(g, out, (size_t)N * C, DT_SUM, what, err);
    if (!rc)
        be->bias_add(be, out, P(m, b), N, C);
    return rc;
}

/* Transformer block l on its input res (B,T,C) into a; without output, the last projection and
 * residual (res3, kept from forward) are skipped: that is the recomputation in backward. Under
 * tensor parallelism c_attn and c_fc are column-parallel (f, identity in forward, before them),
 * the c_proj's row-parallel with g (row_parallel_fwd). */
static int block_fwd(dt_model *m, const gpt *g, int l, const float *res, const gpt_acts *a,
                     int B, int T, bool output, dt_err *err)
{
    dt_backend *be = m->be;
    const gpt_layer *w = &g->layers[l];
    const int C = g->C, Cl = g->Cl, NHl = g->NHl;
    const size_t N = (size_t)B * T;
    int rc;
    be->layernorm_fwd(be, a->ln1, a->ln1m, a->ln1r, res, P(m, w->ln1w), P(m, w->ln1b), (int)N, C,
                      LN_EPS);
    // qkv (N,3Cl): this rank's heads
    be->matmul_fwd(be, a->qkv, a->ln1, P(m, w->qkvw), P(m, w->qkvb), (int)N, C, 3 * Cl);
    be->attention_fwd(be, a->atty, a->att, a->qkv, B, T, Cl, NHl);
    if ((rc = row_parallel_fwd(m, g, a->res2, a->atty, w->projw, w->projb, (int)N, Cl,
                               "attn.c_proj's output", err)))
        return rc;
    be->accumulate(be, a->res2, res, N * C); // res2 = res + attn
    be->layernorm_fwd(be, a->ln2, a->ln2m, a->ln2r, a->res2, P(m, w->ln2w), P(m, w->ln2b), (int)N,
                      C, LN_EPS);
    be->matmul_fwd(be, a->fch, a->ln2, P(m, w->fcw), P(m, w->fcb), (int)N, C, 4 * Cl);
    be->gelu_fwd(be, a->fchg, a->fch, N * 4 * Cl);
    if (!output)
        return 0;
    if ((rc = row_parallel_fwd(m, g, a->res3, a->fchg, w->fcprojw, w->fcprojb, (int)N, 4 * Cl,
                               "mlp.c_proj's output", err)))
        return rc;
    be->accumulate(be, a->res3, a->res2, N * C); // res3 = res2 + mlp
    return 0;
}

/* Backward of transformer block l: g->dres (B,T,C) holds the gradient of its output and gets
 * the gradient of its input res; a holds its intermediates (recomputed already when they are
 * not kept). f's backward all-reduces dC, the gradient of ln_2's and ln_1's output, before
 * each LayerNorm backward; the row-parallel c_proj's (g) backward is the identity. */
static int block_bwd(dt_model *m, gpt *g, int l, const float *res, const gpt_acts *a, int B,
                     int T, dt_err *err)
{
    dt_backend *be = m->be;
    const gpt_layer *w = &g->layers[l];
    const int C = g->C, Cl = g->Cl, NHl = g->NHl;
    const size_t N = (size_t)B * T, fN = N * sizeof(float);
    int rc;
    be->memset_zero(be, g->d4a, fN * 4 * Cl);
    be->matmul_bwd(be, g->d4a, G(m, w->fcprojw), G(m, w->fcprojb), g->dres, a->fchg,
                   P(m, w->fcprojw), (int)N, 4 * Cl, C);
    be->memset_zero(be, g->d4b, fN * 4 * Cl);
    be->gelu_bwd(be, g->d4b, a->fch, g->d4a, N * 4 * Cl);
    be->memset_zero(be, g->dC, fN * C);
    be->matmul_bwd(be, g->dC, G(m, w->fcw), G(m, w->fcb), g->d4b, a->ln2, P(m, w->fcw), (int)N,
                   C, 4 * Cl);
    if ((rc = tp_allreduce(g, g->dC, N * C, DT_SUM, "the gradient of ln_2's output", err)))
        return rc;
    be->layernorm_bwd(be, g->dres, G(m, w->ln2w), G(m, w->ln2b), g->dC, a->res2, P(m, w->ln2w),
                      a->ln2m, a->ln2r, (int)N, C);
    /* g->dres: gradient of res2 */
    be->memset_zero(be, g->dC, fN * Cl);
    be->matmul_bwd(be, g->dC, G(m, w->projw), G(m, w->projb), g->dres, a->atty, P(m, w->projw),
                   (int)N, Cl, C);
    if (g->recompute == DT_RECOMPUTE_SELECTIVE) /* the probabilities, from the kept q,k,v */
        be->attention_fwd(be, g->dqkv, a->att, a->qkv, B, T, Cl, NHl); /* dqkv: scratch for y */
    be->memset_zero(be, g->dqkv, fN * 3 * Cl);
    be->attention_bwd(be, g->dqkv, g->datt, g->dC, a->qkv, a->att, B, T, Cl, NHl);
    be->memset_zero(be, g->dC, fN * C);
    be->matmul_bwd(be, g->dC, G(m, w->qkvw), G(m, w->qkvb), g->dqkv, a->ln1, P(m, w->qkvw),
                   (int)N, C, 3 * Cl);
    if ((rc = tp_allreduce(g, g->dC, N * C, DT_SUM, "the gradient of ln_1's output", err)))
        return rc;
    be->layernorm_bwd(be, g->dres, G(m, w->ln1w), G(m, w->ln1b), g->dC, res, P(m, w->ln1w),
                      a->ln1m, a->ln1r, (int)N, C);
    /* g->dres: gradient of this block's input */
    return 0;
}

/* The embeddings into g->encoded (B,T,C) for tokens (device). TP > 1: the vocabulary-parallel
 * partial sum (rank 0 adds wpe), all-reduced after the block's window. */
static int embed_fwd(dt_model *m, gpt *g, int B, int T, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C;
    dt_models_event(m, 0, DT_BLOCK_BEFORE_FORWARD);
    if (g->tp == 1)
        be->embedding_fwd(be, g->encoded, g->tokens, P(m, g->wte), P(m, g->wpe), B, T, C);
    else
        be->embedding_vp_fwd(be, g->encoded, g->tokens, P(m, g->wte),
                             g->tpr == 0 ? P(m, g->wpe) : NULL, B, T, C, g->v0, g->Vl);
    dt_models_event(m, 0, DT_BLOCK_AFTER_FORWARD);
    return tp_allreduce(g, g->encoded, (size_t)B * T * C, DT_SUM, "the embeddings", err);
}

/* The tied head and the loss: logits (N,Vl) = lnf (N,C) @ wte^T (block 0's second window),
 * then losses (N). Training: the classifier's gradient (softmax - onehot, unscaled) replaces
 * the logits in the same pass that computes the losses, so the (N,V) logits, the biggest tensor
 * of the model, are read once per step, not once here and again in backward. TP > 1: the
 * vocabulary-parallel cross-entropy, whose statistics are all-reduced between its stages. */
static int head_fwd(dt_model *m, gpt *g, int N, bool training, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C, Vl = g->Vl;
    dt_models_event(m, 0, DT_BLOCK_BEFORE_FORWARD);
    be->matmul_fwd(be, g->logits, g->lnf, P(m, g->wte), NULL, N, C, Vl);
    dt_models_event(m, 0, DT_BLOCK_AFTER_FORWARD);
    float *dlogits = training ? g->logits : NULL;
    if (g->tp == 1) {
        be->xent_fwd_bwd(be, g->losses, dlogits, g->logits, g->targets, N, Vl, 1.0f, NULL);
        return 0;
    }
    int rc;
    be->xent_vp_max(be, g->xmax, g->logits, N, Vl, g->nv);
    if ((rc = tp_allreduce(g, g->xmax, (size_t)N, DT_MAX, "the logits' row maxima", err)))
        return rc;
    be->xent_vp_sums(be, g->xsums, g->logits, g->xmax, g->targets, N, Vl, g->nv, g->v0);
    if ((rc = tp_allreduce(g, g->xsums, 2 * (size_t)N, DT_SUM,
                           "the softmax sums and target logits", err)))
        return rc;
    be->xent_vp_finish(be, g->losses, dlogits, g->logits, g->xmax, g->xsums, g->targets, N, Vl,
                       g->nv, g->v0, 1.0f);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* forward and backward */

static int gpt_forward(dt_model *m, const dt_batch *batch, bool training, float *loss, dt_err *err)
{
    gpt *g = m->impl;
    dt_backend *be = m->be;
    const int B = batch->B, T = batch->T, C = g->C, V = g->V;
    g->can_backward = false;
    if (B <= 0 || B > g->Bmax || T <= 0 || T > g->Tmax || !batch->tokens || !batch->targets)
        return dt_err_set(err, -EINVAL,
                          "gpt forward: batch of %dx%d tokens (at most %dx%d, with inputs and "
                          "targets expected)",
                          B, T, g->Bmax, g->Tmax);
    const size_t N = (size_t)B * T;
    int valid = 0; /* targets that count (>= 0), known here without asking the device */
    for (size_t i = 0; i < N; i++) {
        if (batch->tokens[i] < 0 || batch->tokens[i] >= V)
            return dt_err_set(err, -EINVAL, "gpt forward: token %d at position %zu is outside "
                                            "the vocabulary (0..%d)",
                              batch->tokens[i], i, V - 1);
        if (batch->targets[i] >= V)
            return dt_err_set(err, -EINVAL, "gpt forward: target %d at position %zu is outside "
                                            "the vocabulary (0..%d)",
                              batch->targets[i], i, V - 1);
        valid += batch->targets[i] >= 0;
    }
    be->memcpy_h2d(be, g->tokens, batch->tokens, N * sizeof(int32_t));
    be->memcpy_h2d(be, g->targets, batch->targets, N * sizeof(int32_t));

    const int bl_lnf = g->L + 1; /* blocks: 0 embed, 1 + l h.l, L + 1 ln_f */
    int rc;
    if ((rc = embed_fwd(m, g, B, T, err)))
        return rc;
    const float *res = g->encoded;
    for (int l = 0; l < g->L; l++) {
        gpt_acts a;
        acts_of(g, l, &a);
        dt_models_event(m, 1 + l, DT_BLOCK_BEFORE_FORWARD);
        if ((rc = block_fwd(m, g, l, res, &a, B, T, true, err)))
            return rc;
        dt_models_event(m, 1 + l, DT_BLOCK_AFTER_FORWARD);
        res = a.res3;
    }
    dt_models_event(m, bl_lnf, DT_BLOCK_BEFORE_FORWARD);
    be->layernorm_fwd(be, g->lnf, g->lnf_mean, g->lnf_rstd, res, P(m, g->lnfw), P(m, g->lnfb),
                      (int)N, C, LN_EPS);
    dt_models_event(m, bl_lnf, DT_BLOCK_AFTER_FORWARD);
    if ((rc = head_fwd(m, g, (int)N, training, err)))
        return rc;
    *loss = dt_models_mean_loss(m, g->losses, (int)N, valid);
    m->last_correct = 0;
    g->B = B;
    g->T = T;
    g->valid = valid;
    g->can_backward = training;
    return 0;
}

static int gpt_backward(dt_model *m, float dloss_scale, dt_grad_ready_fn ready, void *ctx,
                        dt_err *err)
{
    gpt *g = m->impl;
    dt_backend *be = m->be;
    if (!g->can_backward)
        return dt_err_set(err, -EINVAL, "gpt backward: no training forward to differentiate "
                                        "(call forward with training = true just before)");
    g->can_backward = false;
    const int B = g->B, T = g->T, C = g->C;
    const size_t N = (size_t)B * T, NC = (size_t)g->Bmax * g->Tmax * C;
    const size_t fN = N * sizeof(float);
    int rc;

    /* d loss / d logits = dl * (softmax - onehot), the latter in g->logits since forward; dl
     * goes on the (N,C) operands of the classifier GEMM instead of the (N,V) gradient:
     * dwte += dlogits^T @ (dl * lnf) and dC = (dlogits @ wte) * dl. lnf is not read again.
     * TP > 1: dC is this rank's vocabulary's share, all-reduced (the head's f). */
    const int bl_lnf = g->L + 1; /* blocks: 0 embed, 1 + l h.l, L + 1 ln_f */
    float dl = g->valid > 0 ? dloss_scale / (float)g->valid : 0.0f;
    be->scale(be, g->lnf, N * C, dl);
    be->memset_zero(be, g->dC, fN * C);
    dt_models_event(m, 0, DT_BLOCK_BEFORE_BACKWARD); /* the tied head */
    be->matmul_bwd(be, g->dC, G(m, g->wte), NULL, g->logits, g->lnf, P(m, g->wte), (int)N, C,
                   g->Vl);
    dt_models_event(m, 0, DT_BLOCK_AFTER_BACKWARD);
    if ((rc = tp_allreduce(g, g->dC, N * C, DT_SUM, "the gradient of ln_f's output", err)))
        return rc;
    be->scale(be, g->dC, N * C, dl);
    const float *res_last = g->L > 0 ? g->res3 + (size_t)(g->L - 1) * NC : g->encoded;
    be->memset_zero(be, g->dres, fN * C);
    dt_models_event(m, bl_lnf, DT_BLOCK_BEFORE_BACKWARD);
    be->layernorm_bwd(be, g->dres, G(m, g->lnfw), G(m, g->lnfb), g->dC, res_last, P(m, g->lnfw),
                      g->lnf_mean, g->lnf_rstd, (int)N, C);
    dt_models_ready(m, g->lnfw, g->lnfb, ready, ctx);
    dt_models_event(m, bl_lnf, DT_BLOCK_AFTER_BACKWARD);

    for (int l = g->L - 1; l >= 0; l--) {
        const gpt_layer *w = &g->layers[l];
        const float *res = l == 0 ? g->encoded : g->res3 + (size_t)(l - 1) * NC;
        gpt_acts a;
        acts_of(g, l, &a);
        dt_models_event(m, 1 + l, DT_BLOCK_BEFORE_BACKWARD);
        if (g->recompute == DT_RECOMPUTE_BLOCK && /* the block's intermediates, from its input */
            (rc = block_fwd(m, g, l, res, &a, B, T, false, err)))
            return rc;
        if ((rc = block_bwd(m, g, l, res, &a, B, T, err)))
            return rc;
        dt_models_ready(m, w->ln1w, w->fcprojb, ready, ctx);
        dt_models_event(m, 1 + l, DT_BLOCK_AFTER_BACKWARD);
    }
    dt_models_event(m, 0, DT_BLOCK_BEFORE_BACKWARD);
    if (g->tp == 1)
        be->embedding_bwd(be, G(m, g->wte), G(m, g->wpe), g->dres, g->tokens, B, T, C);
    else
        be->embedding_vp_bwd(be, G(m, g->wte), G(m, g->wpe), g->dres, g->tokens, B, T, C, g->v0,
                             g->Vl);
    dt_models_ready(m, g->wte, g->wpe, ready, ctx);
    dt_models_event(m, 0, DT_BLOCK_AFTER_BACKWARD);
    return 0;
}

static void gpt_free(dt_model *m)
{
    gpt *g = m->impl;
    if (!g)
        return;
    dt_backend *be = m->be;
    void *bufs[] = {g->tokens,   g->targets,  g->encoded, g->ln1,      g->ln1_mean, g->ln1_rstd,
                    g->qkv,      g->atty,     g->att,     g->res2,     g->ln2,      g->ln2_mean,
                    g->ln2_rstd, g->fch,      g->fch_gelu, g->res3,    g->lnf,      g->lnf_mean,
                    g->lnf_rstd, g->logits,   g->losses,  g->dres,     g->dC,       g->dqkv,
                    g->d4a,      g->d4b,      g->datt,    g->xmax,     g->xsums};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(be, bufs[i]);
    free(g->layers);
    free(g);
    m->impl = NULL;
}

static const dt_model_ops gpt_ops = {gpt_forward, gpt_backward, gpt_free};

/* How a tensor is split under tensor parallelism (model.h's dt_tensor_info). */
typedef enum gpt_split {
    SPLIT_NONE = 0, /* replicated */
    SPLIT_ROWS,     /* column-parallel (c_fc) and the vocabulary (wte): dim 0 in TP parts */
    SPLIT_QKV,      /* c_attn: dim 0 is q | k | v, each in TP parts */
    SPLIT_COLS,     /* row-parallel (c_proj weights): dim 1 in TP parts */
} gpt_split;

/* Declares tensor name of whole shape (d0) (d1 == 0) or (d0,d1), of which this rank holds the
 * slice `split` says (dim 0 of wte: the padded vocabulary's rows, Vl); its index goes to *dst. */
static int add_tensor(dt_model *m, const gpt *g, int *dst, bool no_decay, gpt_split split,
                      int64_t d0, int64_t d1, const char *name, dt_err *err)
{
    int64_t whole[2] = {d0, d1}, shape[2] = {d0, d1};
    int tp_dim = 0, tp_parts = 0;
    if (g->tp > 1 && split != SPLIT_NONE) {
        tp_dim = split == SPLIT_COLS ? 1 : 0;
        tp_parts = split == SPLIT_QKV ? 3 : 1;
        shape[tp_dim] = whole[tp_dim] / g->tp;
        if (dst == &g->wte)
            shape[0] = g->Vl;
    }
    int rc = dt_models_add(m, no_decay, d1 > 0 ? 2 : 1, shape, err, "%s", name);
    if (rc < 0)
        return rc;
    dt_tensor_info *t = &m->tensors[rc];
    t->tp_dim = tp_dim;
    t->tp_parts = tp_parts;
    t->whole_shape[0] = whole[0];
    t->whole_shape[1] = d1 > 0 ? whole[1] : 0;
    *dst = rc;
    return 0;
}

/* Draws every whole tensor from one stream seeded with cfg.seed, in table order (GPT-2's rules,
 * the header comment), and keeps this rank's slice: every tensor-parallel layout starts from the
 * bits TP = 1 starts from. Uploads the result. */
static int init_params(dt_model *m, const gpt *g, dt_err *err)
{
    size_t max_whole = 0;
    for (int i = 0; i < m->num_tensors; i++)
        max_whole = DT_MAX(max_whole, dt_tensor_whole_numel(&m->tensors[i]));
    float *host = calloc(m->num_params, sizeof(float));
    float *whole = malloc(DT_MAX(max_whole, (size_t)1) * sizeof(float));
    if (!host || !whole) {
        free(host);
        free(whole);
        return dt_err_set(err, -ENOMEM, "gpt: out of memory for the initial parameters");
    }
    dt_rng r;
    dt_rng_seed(&r, m->cfg.seed);
    const float proj_std = 0.02f / sqrtf(2.0f * (float)g->L);
    for (int i = 0; i < m->num_tensors; i++) {
        dt_tensor_info *t = &m->tensors[i];
        size_t n = dt_tensor_whole_numel(t);
        if (t->ndim == 2)
            dt_rng_fill_normal(&r, whole, n, 0.0f, strstr(t->name, "c_proj") ? proj_std : 0.02f);
        else
            for (size_t k = 0; k < n; k++)
                whole[k] = strstr(t->name, "ln_") && strstr(t->name, ".weight") ? 1.0f : 0.0f;
        dt_tensor_tp_copy(t, g->tpr, whole, host + t->offset, false);
    }
    dt_models_upload(m, host);
    free(host);
    free(whole);
    return 0;
}

int dt_gpt_create(dt_model *m, dt_comm *comm, dt_err *err)
{
    const dt_model_config *cfg = &m->cfg;
    gpt *g = calloc(1, sizeof *g);
    if (!g)
        return dt_err_set(err, -ENOMEM, "out of memory");
    m->impl = g;
    m->ops = &gpt_ops;
    g->L = cfg->n_layer;
    g->NH = cfg->n_head;
    g->C = cfg->n_embd;
    g->V = cfg->shape.vocab_size;
    g->maxT = cfg->block_size;
    g->Bmax = cfg->max_batch;
    g->Tmax = cfg->shape.seq_len;
    g->recompute = cfg->recompute;
    g->Lk = g->recompute == DT_RECOMPUTE_BLOCK ? DT_MIN(g->L, 1) : g->L;
    g->La = g->recompute == DT_RECOMPUTE_NONE ? g->L : DT_MIN(g->L, 1);
    /* tensor parallelism: the registry (model.c) checked tp_size, tp_rank, n_head and comm */
    g->tp = cfg->tp_size > 1 ? cfg->tp_size : 1;
    g->tpr = g->tp > 1 ? cfg->tp_rank : 0;
    g->comm = g->tp > 1 ? comm : NULL;
    g->Cl = g->C / g->tp;
    g->NHl = g->NH / g->tp;
    g->Vl = (g->V + g->tp - 1) / g->tp; /* the vocabulary padded to Vp = Vl * TP */
    g->v0 = g->tpr * g->Vl;
    g->nv = DT_MAX(0, DT_MIN(g->Vl, g->V - g->v0));
    g->layers = calloc((size_t)g->L, sizeof *g->layers);
    if (!g->layers)
        return dt_err_set(err, -ENOMEM, "out of memory");
    const int C = g->C, L = g->L;
    int rc;

    char nm[DT_TENSOR_NAME_MAX];
    if ((rc = add_tensor(m, g, &g->wte, false, SPLIT_ROWS, g->V, C, "wte.weight", err)) ||
        (rc = add_tensor(m, g, &g->wpe, false, SPLIT_NONE, g->maxT, C, "wpe.weight", err)))
        return rc;
    for (int l = 0; l < L; l++) {
        gpt_layer *w = &g->layers[l];
        const struct {
            int *dst;
            bool no_decay;
            gpt_split split;
            int64_t d0, d1;
            const char *name;
        } t[] = {
            {&w->ln1w, true, SPLIT_NONE, C, 0, "ln_1.weight"},
            {&w->ln1b, true, SPLIT_NONE, C, 0, "ln_1.bias"},
            {&w->qkvw, false, SPLIT_QKV, 3 * C, C, "attn.c_attn.weight"},
            {&w->qkvb, true, SPLIT_QKV, 3 * C, 0, "attn.c_attn.bias"},
            {&w->projw, false, SPLIT_COLS, C, C, "attn.c_proj.weight"},
            {&w->projb, true, SPLIT_NONE, C, 0, "attn.c_proj.bias"},
            {&w->ln2w, true, SPLIT_NONE, C, 0, "ln_2.weight"},
            {&w->ln2b, true, SPLIT_NONE, C, 0, "ln_2.bias"},
            {&w->fcw, false, SPLIT_ROWS, 4 * C, C, "mlp.c_fc.weight"},
            {&w->fcb, true, SPLIT_ROWS, 4 * C, 0, "mlp.c_fc.bias"},
            {&w->fcprojw, false, SPLIT_COLS, C, 4 * C, "mlp.c_proj.weight"},
            {&w->fcprojb, true, SPLIT_NONE, C, 0, "mlp.c_proj.bias"},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(nm, sizeof nm, "h.%d.%s", l, t[i].name);
            if ((rc = add_tensor(m, g, t[i].dst, t[i].no_decay, t[i].split, t[i].d0, t[i].d1, nm,
                                 err)))
                return rc;
        }
    }
    if ((rc = add_tensor(m, g, &g->lnfw, true, SPLIT_NONE, C, 0, "ln_f.weight", err)) ||
        (rc = add_tensor(m, g, &g->lnfb, true, SPLIT_NONE, C, 0, "ln_f.bias", err)))
        return rc;
    /* blocks (model.h): the embeddings, each transformer block, ln_f; the embeddings have a
     * second window per pass for the tied output projection */
    if ((rc = dt_models_add_block(m, g->wte, g->wpe, 2, err, "embed")) < 0)
        return rc;
    for (int l = 0; l < L; l++)
        if ((rc = dt_models_add_block(m, g->layers[l].ln1w, g->layers[l].fcprojb, 1, err, "h.%d",
                                      l)) < 0)
            return rc;
    if ((rc = dt_models_add_block(m, g->lnfw, g->lnfb, 1, err, "ln_f")) < 0)
        return rc;
    if ((rc = dt_models_alloc(m, err)))
        return rc;

    /* FLOPs: forward = the matmuls (12C^2 per token per layer, 2CV for the output projection)
     * plus causal attention (2*C*T*(T+1) per layer per sample); backward = 2x forward. Under
     * tensor parallelism this rank's share: 12C^2/TP per layer, 2C*Vp/TP for its logits (the
     * padding included: it is computed) and its heads' attention; the LayerNorms and the other
     * O(C) work every rank repeats are not counted, as they are not at TP = 1. */
    const double T = g->Tmax, tp = g->tp;
    double fwd = T * (2.0 * 12.0 * C * (double)C * L / tp + 2.0 * C * (double)g->Vl) +
                 L * 2.0 * C * T * (T + 1) / tp;
    m->flops_per_sample = 3.0 * fwd;

    /* activations: recompute = block keeps one layer of intermediates (and every layer's
     * output res3, the next one's input); selective keeps all but the attention probabilities.
     * Under tensor parallelism the attention and MLP intermediates and the logits are this
     * rank's share (Cl = C/TP, NHl = NH/TP heads, Vl vocabulary rows); the residual stream and
     * the LayerNorms' are whole on every rank. */
    const size_t NR = (size_t)g->Bmax * g->Tmax, NC = NR * C, NCl = NR * g->Cl;
    const size_t NATT = (size_t)g->Bmax * g->NHl * g->Tmax * g->Tmax;
    const size_t Lk = (size_t)g->Lk, La = (size_t)g->La;
    struct {
        float **p;
        size_t n;
    } acts[] = {
        {&g->encoded, NC},        {&g->ln1, Lk * NC},       {&g->ln1_mean, Lk * NR},
        {&g->ln1_rstd, Lk * NR},  {&g->qkv, 3 * Lk * NCl},  {&g->atty, Lk * NCl},
        {&g->att, La * NATT},     {&g->res2, Lk * NC},      {&g->ln2, Lk * NC},
        {&g->ln2_mean, Lk * NR},  {&g->ln2_rstd, Lk * NR},  {&g->fch, 4 * Lk * NCl},
        {&g->fch_gelu, 4 * Lk * NCl}, {&g->res3, (size_t)L * NC}, {&g->lnf, NC},
        {&g->lnf_mean, NR},      {&g->lnf_rstd, NR},       {&g->logits, NR * g->Vl},
        {&g->losses, NR},        {&g->dres, NC},           {&g->dC, NC},
        {&g->dqkv, 3 * NCl},     {&g->d4a, 4 * NCl},       {&g->d4b, 4 * NCl},
        {&g->datt, NATT},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if ((rc = dt_models_falloc(m, acts[i].p, acts[i].n, err)))
            return rc;
    if (g->tp > 1 && ((rc = dt_models_falloc(m, &g->xmax, NR, err)) ||
                      (rc = dt_models_falloc(m, &g->xsums, 2 * NR, err))))
        return rc;
    if ((rc = dt_models_ialloc(m, &g->tokens, NR, err)))
        return rc;
    if ((rc = dt_models_ialloc(m, &g->targets, NR, err)))
        return rc;
    return init_params(m, g, err);
}

const float *dt_gpt_logits(const dt_model *m)
{
    if (!m || m->ops != &gpt_ops || !m->impl)
        return NULL;
    return ((const gpt *)m->impl)->logits;
}
