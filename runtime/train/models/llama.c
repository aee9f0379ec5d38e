/* llama.c - `llama`: a Llama-style decoder (Hugging Face's LlamaForCausalLM), llm.c style
 * (explicit forward and backward, written as gpt.c is).
 *
 * A token embedding (no position embedding), L pre-norm blocks, each
 *   h   = x + o_proj(attention(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))   n1 = RMSNorm1(x)
 *   out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))                         n2 = RMSNorm2(h)
 * with causal grouped-query attention (n_head query heads of size hs = C/NH sharing n_kv_head
 * key/value heads, query head h reading kv head h / (NH/NKV), Hugging Face's repeat_kv), rotary
 * position embeddings on q and k (Hugging Face's rotate_half convention: the pairs are (i, i +
 * hs/2), f_i = 1/theta^(2i/hs); backend_ops.h's rope_qkv), a final RMSNorm and an output
 * projection of its own (untied), softmax cross-entropy over the next token. No biases anywhere.
 *
 * Parameters, in buffer order, with Hugging Face's names (so an exported file loads with
 * LlamaForCausalLM.from_pretrained; hs = C/NH, F = ffn_hidden, Linear weights (out, in)):
 *   model.embed_tokens.weight (V,C)
 *   model.layers.{l}.input_layernorm.weight (C)
 *   model.layers.{l}.self_attn.q_proj.weight (NH*hs,C) .k_proj.weight (NKV*hs,C)
 *     .v_proj.weight (NKV*hs,C) .o_proj.weight (C,NH*hs)
 *   model.layers.{l}.post_attention_layernorm.weight (C)
 *   model.layers.{l}.mlp.gate_proj.weight (F,C) .up_proj.weight (F,C) .down_proj.weight (C,F)
 *   model.norm.weight (C)  lm_head.weight (V,C)
 * q, k and v are consecutive in the buffer, so one matmul over the (NH+2NKV)*hs rows projects
 * all three, [q | k | v] per token; gate and up likewise, one matmul of 2F rows, [gate | up] per
 * token (what swiglu_fwd reads). Initialisation as Hugging Face's _init_weights: every matrix
 * normal(0, 0.02), the RMSNorm weights 1.
 *
 * Blocks (model.h): 0 "embed" (embed_tokens), 1+l "layers.l", L+1 "head" (model.norm and
 * lm_head). One window each per pass; backward reports head, layers.{L-1} .. layers.0, embed.
 *
 * Activations per layer as gpt.c keeps them: the RMSNorms' outputs and 1/rms (B,T,C), (B,T),
 * the rotated and repeated q,k,v (B,T,3C) (attention's input, what its backward reads), the
 * attention output (B,T,C) and probabilities (B,NH,T,T), the residual after attention, the
 * gate|up projection (B,T,2F) and the SwiGLU output (B,T,F), the block output. The projection
 * before the rotation ((B,T,(NH+2NKV)hs)) and its gradient are one scratch for every layer: the
 * rotation is linear, so its backward needs nothing of its input. cfg.recompute: `block` keeps
 * each block's output and recomputes the rest inside its backward window, `selective` the
 * attention probabilities (gpt.c's modes exactly).
 *
 * Tensor parallelism (cfg.tp_size = TP > 1, Megatron's layout as gpt.c's; TP divides n_head,
 * n_kv_head and ffn_hidden): rank r holds the query heads [r NH/TP, (r+1) NH/TP) and the kv
 * heads [r NKV/TP, (r+1) NKV/TP) (q_proj, k_proj, v_proj column-parallel: tp_dim 0, one part
 * each), which are exactly the kv heads its query heads read (NH/NKV query heads per kv head on
 * every rank), so attention runs locally with NH/TP and NKV/TP heads; o_proj row-parallel
 * (tp_dim 1); gate_proj and up_proj column-parallel, down_proj row-parallel; embed_tokens
 * vocabulary-parallel (rows of the vocabulary padded to a multiple of TP, the padding rows zero
 * and never trained) and lm_head likewise, its logits (B,T,Vp/TP) going to the vocabulary-
 * parallel cross-entropy; the RMSNorm weights replicated. The collectives are gpt.c's: per layer
 * the all-reduce after each row-parallel projection in forward and of the gradient of each
 * column-parallel region's input in backward (4 of (B,T,C) per layer and step), the embedding's
 * partial sums, the head input's gradient, and the cross-entropy's statistics; the replicated
 * RMSNorm weights' gradients come out the same bits on every rank without an all-reduce.
 * Sequence parallelism (cfg.sequence_parallel): the residual stream and the RMSNorms hold this
 * rank's 1/TP of the token rows, the all-reduces become reduce-scatters and all-gathers, and the
 * RMSNorm weight gradients from this rank's rows are all-reduced before their ready report
 * (gpt.c's header has the layout and the volume; the rows split is the same). The rotary
 * embedding runs in the column-parallel region, on all B*T rows, so every token keeps its
 * position.
 * Pipeline stages (cfg.pp_size > 1; with or without tensor parallelism): the stage holds layers
 * [lo, hi); stage 0 the embedding too, the last stage model.norm and lm_head (no tied tensor
 * crosses stages). A stage's input and output are the residual stream (its shard under sequence
 * parallelism). Activation slots per micro-batch as gpt.c's.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/train/models/llama.h"
#include "runtime/train/models/models.h"

typedef struct llama_layer {
    int n1w, qw, kw, vw, ow, n2w, gw, uw, dw; /* tensor indices */
} llama_layer;

/* One micro-batch's activations (model.h's slots): what the llama fields of the same names point
 * to while it is in use. */
typedef struct llama_slot {
    int32_t *tokens, *targets;
    float *encoded, *ln1, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_rstd, *gu, *hsw, *res3,
        *lnf, *lnf_rstd, *logits, *losses;
    const float *in;         /* (B,T,C) borrowed: the previous stage's output (stage > 0) */
    int B, T, valid;         /* of the slot's last training forward */
    bool can_backward;
} llama_slot;

typedef struct llama {
    int L, NH, NKV, C, hs, F, V, maxT;
    float theta, eps;
    int Bmax, Tmax;          /* activations are allocated for (Bmax,Tmax) */
    size_t natt, ndatt;      /* floats of one layer's attention state at (Bmax,Tmax) and of its
                                backward scratch: the backend's attention_sizes */
    /* tensor parallelism (TP = 1: the whole model, comm NULL) */
    int tp, tpr;
    dt_comm *comm;           /* the tensor group (borrowed); NULL when tp == 1 */
    int NHl, NKVl, Cl, Ckv, Fl; /* this rank's query heads, kv heads, NHl*hs, NKVl*hs, F/TP */
    int Vl, v0, nv;          /* vocabulary rows here (Vp/TP), the first one's id, real ones */
    float *xmax, *xsums;     /* (B,T), (2,B,T): vocabulary-parallel cross-entropy statistics */
    /* sequence parallelism: sd = TP with it, else 1 (gpt.c's layout) */
    bool sp;
    int sd;
    float *gat;              /* (B,T,C) SP scratch: the gathered operand of the moment */
    float *dCs;              /* (B*T/TP,C) SP scratch: a reduce-scattered input gradient */
    float *dln;              /* (2C) SP scratch: a block's RMSNorm weight gradients */
    int embw, nfw, headw;
    llama_layer *layers;     /* (L) owned */
    dt_recompute recompute;
    int Lk, La;              /* layers of intermediates and of attention probabilities kept */
    /* the slot in use (use_slot); B*T rows in a (B,T,C) or (B,T) shape are B*T/sd of them under
     * sequence parallelism: encoded, ln1*, res2, ln2*, res3, lnf* */
    int32_t *tokens, *targets; /* (B,T) device */
    float *encoded;          /* (B,T,C) */
    float *ln1, *ln1_rstd;   /* (Lk,B,T,C), (Lk,B,T) */
    float *qkv;              /* (Lk,B,T,3Cl) rotated q, repeated and rotated k, repeated v */
    float *atty;             /* (Lk,B,T,Cl) */
    float *att;              /* (La,natt): what attention_fwd saves for attention_bwd */
    float *res2;             /* (Lk,B,T,C) */
    float *ln2, *ln2_rstd;
    float *gu;               /* (Lk,B,T,2Fl) [gate | up] */
    float *hsw;              /* (Lk,B,T,Fl) silu(gate) * up */
    float *res3;             /* (Ls,B,T,C) block outputs, always kept */
    float *lnf, *lnf_rstd;   /* (B,T,C), (B,T) */
    float *logits;           /* (B,T,Vl); after a training forward softmax - onehot(target) */
    float *losses;           /* (B,T) */
    /* scratch: the projection before the rotation and its gradient (one buffer: (B,T,(NHl +
     * 2NKVl)hs)), the backward's */
    float *qkvp, *dres, *dC, *dqkv, *dh, *dgu, *datt;
    /* pipeline stage: layers [lo, hi) (Ls of them); block indices of layers.lo and the head */
    int lo, hi, Ls;
    bool first, last;
    int bl_h0, bl_head;
    int nslots;
    llama_slot *slots;       /* (nslots) owned */
} llama;

static void use_slot(llama *g, int k)
{
    llama_slot *s = &g->slots[k];
    g->tokens = s->tokens;
    g->targets = s->targets;
    g->encoded = s->encoded;
    g->ln1 = s->ln1;
    g->ln1_rstd = s->ln1_rstd;
    g->qkv = s->qkv;
    g->atty = s->atty;
    g->att = s->att;
    g->res2 = s->res2;
    g->ln2 = s->ln2;
    g->ln2_rstd = s->ln2_rstd;
    g->gu = s->gu;
    g->hsw = s->hsw;
    g->res3 = s->res3;
    g->lnf = s->lnf;
    g->lnf_rstd = s->lnf_rstd;
    g->logits = s->logits;
    g->losses = s->losses;
}

static float *P(dt_model *m, int t) { return m->params + m->tensors[t].offset; }
static float *G(dt_model *m, int t) { return m->grads + m->tensors[t].offset; }

/* Where layer l's activations live (sizes for (Bmax,Tmax); a smaller batch uses the start of
 * each). */
typedef struct llama_acts {
    float *ln1, *ln1r, *qkv, *atty, *att, *res2, *ln2, *ln2r, *gu, *hsw, *res3;
} llama_acts;

static void acts_of(const llama *g, int l, llama_acts *a)
{
    const size_t NR = (size_t)g->Bmax * g->Tmax / (size_t)g->sd, NC = NR * g->C;
    const size_t NA = (size_t)g->Bmax * g->Tmax; /* the column-parallel region: all rows */
    const size_t NATT = g->natt;
    const size_t ll = (size_t)(l - g->lo);
    const size_t k = g->Lk == g->Ls ? ll : 0, ka = g->La == g->Ls ? ll : 0;
    a->ln1 = g->ln1 + k * NC;
    a->ln1r = g->ln1_rstd + k * NR;
    a->qkv = g->qkv + k * 3 * NA * g->Cl;
    a->atty = g->atty + k * NA * g->Cl;
    a->att = g->att + ka * NATT;
    a->res2 = g->res2 + k * NC;
    a->ln2 = g->ln2 + k * NC;
    a->ln2r = g->ln2_rstd + k * NR;
    a->gu = g->gu + k * 2 * NA * g->Fl;
    a->hsw = g->hsw + k * NA * g->Fl;
    a->res3 = g->res3 + ll * NC;
}

/* ------------------------------------------------------------------------------------------ */
/* tensor-parallel pieces (gpt.c's, for this model's messages) */

static int tp_allreduce(const llama *g, float *x, size_t n, dt_redop op, const char *what,
                        dt_err *err)
{
    if (g->tp == 1)
        return 0;
    int rc = dt_comm_allreduce(g->comm, x, n, DT_FLOAT32, op, NULL, err);
    if (rc)
        dt_err_prefix(err, "llama tensor parallelism (rank %d of %d), all-reduce of %s: ",
                      g->tpr, g->tp, what);
    return rc;
}

/* Sequence parallelism: full (N,C) = every rank's shard (N/TP,C), in rank order. */
static int sp_allgather(const llama *g, const float *shard, float *full, size_t N,
                        const char *what, dt_err *err)
{
    int rc = dt_comm_allgather(g->comm, shard, full, N / (size_t)g->tp * (size_t)g->C,
                               DT_FLOAT32, NULL, err);
    if (rc)
        dt_err_prefix(err, "llama sequence parallelism (rank %d of %d), all-gather of %s: ",
                      g->tpr, g->tp, what);
    return rc;
}

/* Sequence parallelism: shard (N/TP,C) = this rank's rows of full (N,C) summed over the group. */
static int sp_reduce_scatter(const llama *g, const float *full, float *shard, size_t N,
                             const char *what, dt_err *err)
{
    int rc = dt_comm_reduce_scatter(g->comm, full, shard, N / (size_t)g->tp * (size_t)g->C,
                                    DT_FLOAT32, DT_SUM, NULL, err);
    if (rc)
        dt_err_prefix(err, "llama sequence parallelism (rank %d of %d), reduce-scatter of %s: ",
                      g->tpr, g->tp, what);
    return rc;
}

/* Sequence parallelism: the RMSNorm weight gradients in g->dln (nln x C, from this rank's tokens)
 * summed over the group and added to the gradients of the tensors w[0..nln). */
static int sp_norm_grads(dt_model *m, const llama *g, const int *w, int nln, const char *what,
                         dt_err *err)
{
    const size_t C = (size_t)g->C;
    int rc = tp_allreduce(g, g->dln, (size_t)nln * C, DT_SUM, what, err);
    for (int i = 0; !rc && i < nln; i++)
        m->be->accumulate(m->be, G(m, w[i]), g->dln + (size_t)i * C, C);
    return rc;
}

/* Row-parallel linear (o_proj, down_proj): out (N/sd,C) = inp (N,K) @ w^T, w (C,K) this rank's
 * columns, summed over the tensor group (all-reduced; reduce-scattered under sequence
 * parallelism, through g->gat). TP = 1: one matmul. */
static int row_parallel_fwd(dt_model *m, const llama *g, float *out, const float *inp, int w,
                            int N, int K, const char *what, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C;
    float *part = g->sp ? g->gat : out;
    be->matmul_fwd(be, part, inp, P(m, w), NULL, N, K, C);
    if (g->tp == 1)
        return 0;
    return g->sp ? sp_reduce_scatter(g, part, out, (size_t)N, what, err)
                 : tp_allreduce(g, out, (size_t)N * C, DT_SUM, what, err);
}

/* The gradient dC (N,C) of a column-parallel region's input, summed over the tensor group: in
 * place (all-reduce), or reduce-scattered into g->dCs under sequence parallelism. */
static int col_parallel_dinp(const llama *g, size_t N, const char *what, dt_err *err)
{
    return g->sp ? sp_reduce_scatter(g, g->dC, g->dCs, N, what, err)
                 : tp_allreduce(g, g->dC, N * g->C, DT_SUM, what, err);
}

/* ------------------------------------------------------------------------------------------ */
/* a decoder block */

/* Block l on its input res (B,T,C) into a; without output, the last projection and residual
 * (res3, kept from forward) are skipped: that is the recomputation in backward. */
static int block_fwd(dt_model *m, llama *g, int l, const float *res, const llama_acts *a, int B,
                     int T, bool output, dt_err *err)
{
    dt_backend *be = m->be;
    const llama_layer *w = &g->layers[l];
    const int C = g->C, Cl = g->Cl, Fl = g->Fl;
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd;
    int rc;
    be->rmsnorm_fwd(be, a->ln1, a->ln1r, res, P(m, w->n1w), (int)Ns, C, g->eps);
    if (g->sp && (rc = sp_allgather(g, a->ln1, g->gat, N, "input_layernorm's output", err)))
        return rc;
    // qkvp (N,Cl+2Ckv) = [q | k | v] of this rank's heads; then rotated and repeated (N,3Cl)
    be->matmul_fwd(be, g->qkvp, g->sp ? g->gat : a->ln1, P(m, w->qw), NULL, (int)N, C,
                   Cl + 2 * g->Ckv);
    be->rope_qkv_fwd(be, a->qkv, g->qkvp, B, T, g->NHl, g->NKVl, g->hs, g->theta);
    be->attention_fwd(be, a->atty, a->att, a->qkv, B, T, Cl, g->NHl);
    if ((rc = row_parallel_fwd(m, g, a->res2, a->atty, w->ow, (int)N, Cl, "o_proj's output",
                               err)))
        return rc;
    be->accumulate(be, a->res2, res, Ns * C); // res2 = res + attention
    be->rmsnorm_fwd(be, a->ln2, a->ln2r, a->res2, P(m, w->n2w), (int)Ns, C, g->eps);
    if (g->sp &&
        (rc = sp_allgather(g, a->ln2, g->gat, N, "post_attention_layernorm's output", err)))
        return rc;
    // gu (N,2Fl) = [gate | up]; hsw (N,Fl) = silu(gate) * up
    be->matmul_fwd(be, a->gu, g->sp ? g->gat : a->ln2, P(m, w->gw), NULL, (int)N, C, 2 * Fl);
    be->swiglu_fwd(be, a->hsw, a->gu, (int)N, Fl);
    if (!output)
        return 0;
    if ((rc = row_parallel_fwd(m, g, a->res3, a->hsw, w->dw, (int)N, Fl, "down_proj's output",
                               err)))
        return rc;
    be->accumulate(be, a->res3, a->res2, Ns * C); // res3 = res2 + mlp
    return 0;
}

/* Backward of block l: g->dres (B,T,C) holds the gradient of its output and gets the gradient of
 * its input res; a holds its intermediates (recomputed already when they are not kept). */
static int block_bwd(dt_model *m, llama *g, int l, const float *res, const llama_acts *a, int B,
                     int T, dt_err *err)
{
    dt_backend *be = m->be;
    const llama_layer *w = &g->layers[l];
    const int C = g->C, Cl = g->Cl, Fl = g->Fl, Cp = Cl + 2 * g->Ckv;
    const size_t N = (size_t)B * T, fN = N * sizeof(float), Ns = N / (size_t)g->sd;
    const bool sp = g->sp;
    float *dn2 = sp ? g->dln + C : G(m, w->n2w), *dn1 = sp ? g->dln : G(m, w->n1w);
    float *dCin = sp ? g->dCs : g->dC; /* the gradient of an RMSNorm's output, its rows */
    int rc;
    if (sp) {
        be->memset_zero(be, g->dln, 2 * (size_t)C * sizeof(float));
        if ((rc = sp_allgather(g, g->dres, g->gat, N, "the gradient of the block's output",
                               err)))
            return rc;
    }
    be->memset_zero(be, g->dh, fN * Fl);
    be->matmul_bwd(be, g->dh, G(m, w->dw), NULL, sp ? g->gat : g->dres, a->hsw, P(m, w->dw),
                   (int)N, Fl, C);
    be->memset_zero(be, g->dgu, fN * 2 * Fl);
    be->swiglu_bwd(be, g->dgu, g->dh, a->gu, (int)N, Fl);
    if (sp && (rc = sp_allgather(g, a->ln2, g->gat, N, "post_attention_layernorm's output "
                                                       "(again)", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * C);
    be->matmul_bwd(be, g->dC, G(m, w->gw), NULL, g->dgu, sp ? g->gat : a->ln2, P(m, w->gw),
                   (int)N, C, 2 * Fl);
    if ((rc = col_parallel_dinp(g, N, "the gradient of post_attention_layernorm's output", err)))
        return rc;
    be->rmsnorm_bwd(be, g->dres, dn2, dCin, a->res2, P(m, w->n2w), a->ln2r, (int)Ns, C);
    /* g->dres: gradient of res2 */
    if (sp && (rc = sp_allgather(g, g->dres, g->gat, N, "the gradient of res2", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * Cl);
    be->matmul_bwd(be, g->dC, G(m, w->ow), NULL, sp ? g->gat : g->dres, a->atty, P(m, w->ow),
                   (int)N, Cl, C);
    if (g->recompute == DT_RECOMPUTE_SELECTIVE) /* the probabilities, from the kept q,k,v */
        be->attention_fwd(be, g->dqkv, a->att, a->qkv, B, T, Cl, g->NHl); /* dqkv: scratch */
    be->memset_zero(be, g->dqkv, fN * 3 * Cl);
    be->attention_bwd(be, g->dqkv, g->datt, g->dC, a->qkv, a->att, B, T, Cl, g->NHl);
    be->memset_zero(be, g->qkvp, fN * Cp); /* now the gradient of the projection */
    be->rope_qkv_bwd(be, g->qkvp, g->dqkv, B, T, g->NHl, g->NKVl, g->hs, g->theta);
    if (sp && (rc = sp_allgather(g, a->ln1, g->gat, N, "input_layernorm's output (again)", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * C);
    be->matmul_bwd(be, g->dC, G(m, w->qw), NULL, g->qkvp, sp ? g->gat : a->ln1, P(m, w->qw),
                   (int)N, C, Cp);
    if ((rc = col_parallel_dinp(g, N, "the gradient of input_layernorm's output", err)))
        return rc;
    be->rmsnorm_bwd(be, g->dres, dn1, dCin, res, P(m, w->n1w), a->ln1r, (int)Ns, C);
    if (sp) { /* the RMSNorms saw this rank's rows: their gradients summed over the group */
        const int ns[2] = {w->n1w, w->n2w};
        return sp_norm_grads(m, g, ns, 2, "the RMSNorm gradients", err);
    }
    return 0;
}

/* The embedding into g->encoded (B,T,C) (gpt.c's embed_fwd without positions). */
static int embed_fwd(dt_model *m, llama *g, int B, int T, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C;
    float *part = g->sp ? g->gat : g->encoded;
    dt_models_event(m, 0, DT_BLOCK_BEFORE_FORWARD);
    if (g->tp == 1)
        be->embedding_fwd(be, g->encoded, g->tokens, P(m, g->embw), NULL, B, T, C);
    else
        be->embedding_vp_fwd(be, part, g->tokens, P(m, g->embw), NULL, B, T, C, g->v0, g->Vl);
    dt_models_event(m, 0, DT_BLOCK_AFTER_FORWARD);
    if (g->sp)
        return sp_reduce_scatter(g, part, g->encoded, (size_t)B * T, "the embeddings", err);
    return tp_allreduce(g, g->encoded, (size_t)B * T * C, DT_SUM, "the embeddings", err);
}

/* The head (block bl_head: model.norm and lm_head) on the last block's output res and the loss:
 * logits (N,Vl), losses (N); training: the logits' gradient (softmax - onehot, unscaled) replaces
 * them (gpt.c's head_fwd). */
static int head_fwd(dt_model *m, llama *g, const float *res, int N, bool training, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C, Vl = g->Vl;
    int rc;
    dt_models_event(m, g->bl_head, DT_BLOCK_BEFORE_FORWARD);
    be->rmsnorm_fwd(be, g->lnf, g->lnf_rstd, res, P(m, g->nfw), N / g->sd, C, g->eps);
    if (g->sp && (rc = sp_allgather(g, g->lnf, g->gat, (size_t)N, "model.norm's output", err)))
        return rc;
    be->matmul_fwd(be, g->logits, g->sp ? g->gat : g->lnf, P(m, g->headw), NULL, N, C, Vl);
    dt_models_event(m, g->bl_head, DT_BLOCK_AFTER_FORWARD);
    float *dlogits = training ? g->logits : NULL;
    if (g->tp == 1) {
        be->xent_fwd_bwd(be, g->losses, dlogits, g->logits, g->targets, N, Vl, 1.0f, NULL);
        return 0;
    }
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

static int llama_stage_forward(dt_model *m, int slot, const dt_batch *batch, const float *in,
                               bool training, float **out, float *loss, dt_err *err)
{
    llama *g = m->impl;
    dt_backend *be = m->be;
    const int B = batch->B, T = batch->T, V = g->V;
    if (slot < 0 || slot >= g->nslots)
        return dt_err_set(err, -EINVAL, "llama forward: slot %d of %d", slot, g->nslots);
    llama_slot *sl = &g->slots[slot];
    sl->can_backward = false;
    use_slot(g, slot);
    if (B <= 0 || B > g->Bmax || T <= 0 || T > g->Tmax || (g->first && !batch->tokens) ||
        (g->last && !batch->targets) || (!g->first && !in) || T % g->sd)
        return dt_err_set(err, -EINVAL,
                          "llama forward: batch of %dx%d tokens (at most %dx%d, with %s%s "
                          "expected%s)",
                          B, T, g->Bmax, g->Tmax,
                          g->first ? "inputs" : "the previous stage's output",
                          g->last ? " and targets" : "",
                          g->sp ? "; sequence parallelism: T a multiple of the tensor size" : "");
    const size_t N = (size_t)B * T;
    int valid = 0;
    for (size_t i = 0; i < N; i++) {
        if (g->first && (batch->tokens[i] < 0 || batch->tokens[i] >= V))
            return dt_err_set(err, -EINVAL, "llama forward: token %d at position %zu is outside "
                                            "the vocabulary (0..%d)",
                              batch->tokens[i], i, V - 1);
        if (!g->last)
            continue;
        if (batch->targets[i] >= V)
            return dt_err_set(err, -EINVAL, "llama forward: target %d at position %zu is "
                                            "outside the vocabulary (0..%d)",
                              batch->targets[i], i, V - 1);
        valid += batch->targets[i] >= 0;
    }
    if (g->first)
        be->memcpy_h2d(be, g->tokens, batch->tokens, N * sizeof(int32_t));
    if (g->last)
        be->memcpy_h2d(be, g->targets, batch->targets, N * sizeof(int32_t));

    int rc;
    if (g->first && (rc = embed_fwd(m, g, B, T, err)))
        return rc;
    const float *res = g->first ? g->encoded : in;
    for (int l = g->lo; l < g->hi; l++) {
        llama_acts a;
        acts_of(g, l, &a);
        dt_models_event(m, g->bl_h0 + l - g->lo, DT_BLOCK_BEFORE_FORWARD);
        if ((rc = block_fwd(m, g, l, res, &a, B, T, true, err)))
            return rc;
        dt_models_event(m, g->bl_h0 + l - g->lo, DT_BLOCK_AFTER_FORWARD);
        res = a.res3;
    }
    *loss = 0;
    if (out)
        *out = g->last ? NULL : (float *)res;
    if (g->last) {
        if ((rc = head_fwd(m, g, res, (int)N, training, err)))
            return rc;
        *loss = dt_models_mean_loss(m, g->losses, (int)N, valid);
    }
    m->last_correct = 0;
    sl->in = in;
    sl->B = B;
    sl->T = T;
    sl->valid = valid;
    sl->can_backward = training;
    return 0;
}

static int llama_stage_backward(dt_model *m, int slot, float dloss_scale, const float *dout,
                                float *din, dt_grad_ready_fn ready, void *ctx, dt_err *err)
{
    llama *g = m->impl;
    dt_backend *be = m->be;
    if (slot < 0 || slot >= g->nslots)
        return dt_err_set(err, -EINVAL, "llama backward: slot %d of %d", slot, g->nslots);
    llama_slot *sl = &g->slots[slot];
    if (!sl->can_backward)
        return dt_err_set(err, -EINVAL, "llama backward: no training forward to differentiate "
                                        "in slot %d (call forward with training = true before)",
                          slot);
    if (!g->last && !dout)
        return dt_err_set(err, -EINVAL, "llama backward: stage %d of %d needs the next stage's "
                                        "gradient",
                          m->cfg.pp_rank, m->cfg.pp_size);
    sl->can_backward = false;
    use_slot(g, slot);
    const int B = sl->B, T = sl->T, C = g->C;
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd;
    const size_t NC = (size_t)g->Bmax * g->Tmax / (size_t)g->sd * C; /* res3's layer stride */
    const size_t fN = N * sizeof(float), fNs = Ns * sizeof(float);
    const float *in0 = g->first ? g->encoded : sl->in; /* the stage's input */
    int rc;

    if (g->last) {
        /* the head (gpt.c's): dl on the (N,C) operands of the classifier GEMM, not the (N,V)
         * gradient: dW += dlogits^T @ (dl * x), dC = (dlogits @ W) * dl */
        float dl = sl->valid > 0 ? dloss_scale / (float)sl->valid : 0.0f;
        float *x = g->sp ? g->gat : g->lnf, *dx = g->sp ? g->dCs : g->dC;
        const float *res_last = g->hi > g->lo ? g->res3 + (size_t)(g->Ls - 1) * NC : in0;
        dt_models_event(m, g->bl_head, DT_BLOCK_BEFORE_BACKWARD);
        if (g->sp && (rc = sp_allgather(g, g->lnf, g->gat, N, "model.norm's output (again)",
                                        err)))
            return rc;
        be->scale(be, x, N * C, dl);
        be->memset_zero(be, g->dC, fN * C);
        be->matmul_bwd(be, g->dC, G(m, g->headw), NULL, g->logits, x, P(m, g->headw), (int)N, C,
                       g->Vl);
        if ((rc = col_parallel_dinp(g, N, "the gradient of model.norm's output", err)))
            return rc;
        be->scale(be, dx, Ns * C, dl);
        be->memset_zero(be, g->dres, fNs * C);
        if (g->sp)
            be->memset_zero(be, g->dln, (size_t)C * sizeof(float));
        be->rmsnorm_bwd(be, g->dres, g->sp ? g->dln : G(m, g->nfw), dx, res_last, P(m, g->nfw),
                        g->lnf_rstd, (int)Ns, C);
        if (g->sp && (rc = sp_norm_grads(m, g, &g->nfw, 1, "model.norm's gradient", err)))
            return rc;
        dt_models_ready(m, g->nfw, g->headw, ready, ctx);
        dt_models_event(m, g->bl_head, DT_BLOCK_AFTER_BACKWARD);
    } else {
        be->memcpy_d2d(be, g->dres, dout, fNs * C); /* the gradient of the stage's output */
    }

    for (int l = g->hi - 1; l >= g->lo; l--) {
        const llama_layer *w = &g->layers[l];
        const float *res = l == g->lo ? in0 : g->res3 + (size_t)(l - 1 - g->lo) * NC;
        llama_acts a;
        acts_of(g, l, &a);
        dt_models_event(m, g->bl_h0 + l - g->lo, DT_BLOCK_BEFORE_BACKWARD);
        if (g->recompute == DT_RECOMPUTE_BLOCK &&
            (rc = block_fwd(m, g, l, res, &a, B, T, false, err)))
            return rc;
        if ((rc = block_bwd(m, g, l, res, &a, B, T, err)))
            return rc;
        dt_models_ready(m, w->n1w, w->dw, ready, ctx);
        dt_models_event(m, g->bl_h0 + l - g->lo, DT_BLOCK_AFTER_BACKWARD);
    }
    if (!g->first) {
        if (din)
            be->memcpy_d2d(be, din, g->dres, fNs * C);
        return 0;
    }
    if (g->sp && (rc = sp_allgather(g, g->dres, g->gat, N, "the embeddings' gradient", err)))
        return rc;
    dt_models_event(m, 0, DT_BLOCK_BEFORE_BACKWARD);
    if (g->tp == 1)
        be->embedding_bwd(be, G(m, g->embw), NULL, g->dres, g->tokens, B, T, C);
    else
        be->embedding_vp_bwd(be, G(m, g->embw), NULL, g->sp ? g->gat : g->dres, g->tokens, B, T,
                             C, g->v0, g->Vl);
    dt_models_ready(m, g->embw, g->embw, ready, ctx);
    dt_models_event(m, 0, DT_BLOCK_AFTER_BACKWARD);
    return 0;
}

static int llama_forward(dt_model *m, const dt_batch *batch, bool training, float *loss,
                         dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "llama forward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return llama_stage_forward(m, 0, batch, NULL, training, NULL, loss, err);
}

static int llama_backward(dt_model *m, float dloss_scale, dt_grad_ready_fn ready, void *ctx,
                          dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "llama backward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return llama_stage_backward(m, 0, dloss_scale, NULL, NULL, ready, ctx, err);
}

/* The fields of a slot that slot 0 may share with the others (what backward recomputes). */
#define SLOT_FIELDS(s)                                                                             \
    {(s)->tokens,   (s)->targets, (s)->encoded, (s)->ln1,  (s)->ln1_rstd, (s)->qkv,                \
     (s)->atty,     (s)->att,     (s)->res2,    (s)->ln2,  (s)->ln2_rstd, (s)->gu,                 \
     (s)->hsw,      (s)->res3,    (s)->lnf,     (s)->lnf_rstd, (s)->logits, (s)->losses}

static void llama_free(dt_model *m)
{
    llama *g = m->impl;
    if (!g)
        return;
    dt_backend *be = m->be;
    for (int k = 0; k < g->nslots && g->slots; k++) {
        const llama_slot *s = &g->slots[k], *s0 = &g->slots[0];
        void *bufs[] = SLOT_FIELDS(s);
        const void *zero[] = SLOT_FIELDS(s0);
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (k == 0 || bufs[i] != zero[i]) /* slot 0's, shared: freed with slot 0 */
                be->free(be, bufs[i]);
    }
    void *bufs[] = {g->qkvp, g->dres, g->dC,   g->dqkv,  g->dh,  g->dgu,
                    g->datt, g->xmax, g->xsums, g->gat, g->dCs, g->dln};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(be, bufs[i]);
    free(g->slots);
    free(g->layers);
    free(g);
    m->impl = NULL;
}

static const dt_model_ops llama_ops = {llama_forward, llama_backward, llama_free};
static const dt_model_stage_ops llama_stage_ops = {llama_stage_forward, llama_stage_backward};

/* ------------------------------------------------------------------------------------------ */
/* construction */

/* How a tensor is split under tensor parallelism (model.h's dt_tensor_info). */
typedef enum llama_split {
    SPLIT_NONE = 0, /* replicated (the RMSNorm weights) */
    SPLIT_ROWS,     /* column-parallel (q, k, v, gate, up) and the vocabulary: dim 0 */
    SPLIT_COLS,     /* row-parallel (o_proj, down_proj): dim 1 */
    SPLIT_VOCAB,    /* embed_tokens, lm_head: dim 0, the vocabulary padded to Vl * TP rows */
} llama_split;

/* Declares tensor name of whole shape (d0) (d1 == 0) or (d0,d1), of which this rank holds the
 * slice `split` says; its index goes to *dst. */
static int add_tensor(dt_model *m, const llama *g, int *dst, bool no_decay, llama_split split,
                      int64_t d0, int64_t d1, const char *name, dt_err *err)
{
    int64_t whole[2] = {d0, d1}, shape[2] = {d0, d1};
    int tp_dim = 0, tp_parts = 0;
    if (g->tp > 1 && split != SPLIT_NONE) {
        tp_dim = split == SPLIT_COLS ? 1 : 0;
        tp_parts = 1;
        shape[tp_dim] = split == SPLIT_VOCAB ? g->Vl : whole[tp_dim] / g->tp;
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

/* A block's tensors in table order, after "model.layers.{l}.". */
static const struct {
    size_t at; /* offsetof(llama_layer, ...) */
    llama_split split;
    const char *name;
} layer_tensors[] = {
    {offsetof(llama_layer, n1w), SPLIT_NONE, "input_layernorm.weight"},
    {offsetof(llama_layer, qw), SPLIT_ROWS, "self_attn.q_proj.weight"},
    {offsetof(llama_layer, kw), SPLIT_ROWS, "self_attn.k_proj.weight"},
    {offsetof(llama_layer, vw), SPLIT_ROWS, "self_attn.v_proj.weight"},
    {offsetof(llama_layer, ow), SPLIT_COLS, "self_attn.o_proj.weight"},
    {offsetof(llama_layer, n2w), SPLIT_NONE, "post_attention_layernorm.weight"},
    {offsetof(llama_layer, gw), SPLIT_ROWS, "mlp.gate_proj.weight"},
    {offsetof(llama_layer, uw), SPLIT_ROWS, "mlp.up_proj.weight"},
    {offsetof(llama_layer, dw), SPLIT_COLS, "mlp.down_proj.weight"},
};

/* Whole shape of layer tensor i. */
static void layer_shape(const llama *g, size_t i, int64_t *d0, int64_t *d1)
{
    const int64_t C = g->C, Q = (int64_t)g->NH * g->hs, K = (int64_t)g->NKV * g->hs, F = g->F;
    const int64_t shapes[][2] = {{C, 0}, {Q, C}, {K, C}, {K, C}, {C, Q},
                                 {C, 0}, {F, C}, {F, C}, {C, F}};
    *d0 = shapes[i][0];
    *d1 = shapes[i][1];
}

/* Draws whole tensor `name` of n elements (normal(0, 0.02) for a matrix, 1 for a norm weight)
 * from r into whole, and keeps this rank's slice when the model holds the tensor. */
static void init_one(dt_model *m, const llama *g, dt_rng *r, float *whole, float *host,
                     const char *name, size_t n, bool matrix)
{
    if (matrix)
        dt_rng_fill_normal(r, whole, n, 0.0f, 0.02f);
    else
        for (size_t k = 0; k < n; k++)
            whole[k] = 1.0f;
    int i = dt_model_find_tensor(m, name);
    if (i >= 0)
        dt_tensor_tp_copy(&m->tensors[i], g->tpr, whole, host + m->tensors[i].offset, false);
}

/* Every whole tensor of the whole model from one stream seeded with cfg.seed, in the whole
 * model's table order; this rank keeps what it holds, so every layout starts from the bits one
 * process starts from. */
static int init_params(dt_model *m, const llama *g, dt_err *err)
{
    const size_t C = (size_t)g->C;
    const size_t max_whole = DT_MAX(DT_MAX((size_t)g->V, (size_t)g->F), (size_t)g->NH * g->hs) * C;
    float *host = calloc(m->num_params, sizeof(float));
    float *whole = malloc(DT_MAX(max_whole, (size_t)1) * sizeof(float));
    if (!host || !whole) {
        free(host);
        free(whole);
        return dt_err_set(err, -ENOMEM, "llama: out of memory for the initial parameters");
    }
    dt_rng r;
    dt_rng_seed(&r, m->cfg.seed);
    char nm[DT_TENSOR_NAME_MAX];
    init_one(m, g, &r, whole, host, "model.embed_tokens.weight", (size_t)g->V * C, true);
    for (int l = 0; l < g->L; l++)
        for (size_t i = 0; i < DT_ARRAY_LEN(layer_tensors); i++) {
            int64_t d0, d1;
            layer_shape(g, i, &d0, &d1);
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, layer_tensors[i].name);
            init_one(m, g, &r, whole, host, nm, (size_t)d0 * (size_t)(d1 ? d1 : 1), d1 > 0);
        }
    init_one(m, g, &r, whole, host, "model.norm.weight", C, false);
    init_one(m, g, &r, whole, host, "lm_head.weight", (size_t)g->V * C, true);
    dt_models_upload(m, host);
    free(host);
    free(whole);
    return 0;
}

/* Activations per slot and the shared scratch (the header says what each holds). */
static int alloc_acts(dt_model *m, llama *g, dt_err *err)
{
    const int C = g->C;
    const size_t NR = (size_t)g->Bmax * g->Tmax, NC = NR * C, NCl = NR * g->Cl;
    m->be->attention_sizes(m->be, g->Bmax, g->Tmax, g->Cl, g->NHl, &g->natt, &g->ndatt);
    const size_t NF = NR * g->Fl, NATT = g->natt;
    const size_t Lk = (size_t)g->Lk, La = (size_t)g->La;
    const size_t NRs = NR / (size_t)g->sd, NCs = NRs * C;
    int rc;
    if (!(g->slots = calloc((size_t)g->nslots, sizeof *g->slots)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    size_t before = m->activation_bytes;
    for (int k = 0; k < g->nslots; k++) {
        llama_slot *sl = &g->slots[k];
        const size_t fst = g->first, lst = g->last;
        const bool rb = g->recompute == DT_RECOMPUTE_BLOCK, ra = g->La < g->Ls || rb;
        struct {
            float **p;
            size_t n;
            bool shared; /* recomputed in backward: slot 0's serves every slot */
        } acts[] = {
            {&sl->encoded, fst * NCs, false}, {&sl->ln1, Lk * NCs, rb},
            {&sl->ln1_rstd, Lk * NRs, rb},    {&sl->qkv, 3 * Lk * NCl, rb},
            {&sl->atty, Lk * NCl, rb},        {&sl->att, La * NATT, ra},
            {&sl->res2, Lk * NCs, rb},        {&sl->ln2, Lk * NCs, rb},
            {&sl->ln2_rstd, Lk * NRs, rb},    {&sl->gu, 2 * Lk * NF, rb},
            {&sl->hsw, Lk * NF, rb},          {&sl->res3, (size_t)g->Ls * NCs, false},
            {&sl->lnf, lst * NCs, false},     {&sl->lnf_rstd, lst * NRs, false},
            {&sl->logits, lst * NR * g->Vl, false}, {&sl->losses, lst * NR, false},
        };
        size_t shared_bytes = 0;
        for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
            if (!acts[i].n)
                continue;
            if (acts[i].shared && k > 0) { /* slot 0's: the same field of g->slots[0] */
                size_t field = (size_t)((char *)acts[i].p - (char *)sl);
                *acts[i].p = *(float **)((char *)&g->slots[0] + field);
                continue;
            }
            if ((rc = dt_models_falloc(m, acts[i].p, acts[i].n, err)))
                return rc;
            shared_bytes += acts[i].shared ? acts[i].n * sizeof(float) : 0;
        }
        if (g->first && (rc = dt_models_ialloc(m, &sl->tokens, NR, err)))
            return rc;
        if (g->last && (rc = dt_models_ialloc(m, &sl->targets, NR, err)))
            return rc;
        if (k == 0)
            m->pp_slot_bytes = m->activation_bytes - before - shared_bytes;
    }
    struct {
        float **p;
        size_t n;
    } scratch[] = {
        {&g->qkvp, NR * (size_t)(g->Cl + 2 * g->Ckv)},
        {&g->dres, NCs}, {&g->dC, NC}, {&g->dqkv, 3 * NCl}, {&g->dh, NF}, {&g->dgu, 2 * NF},
        {&g->datt, g->ndatt},
        {&g->gat, g->sp ? NC : 0}, {&g->dCs, g->sp ? NCs : 0}, {&g->dln, g->sp ? 2 * (size_t)C : 0},
        {&g->xmax, g->tp > 1 ? NR : 0}, {&g->xsums, g->tp > 1 ? 2 * NR : 0},
    };
    for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++)
        if (scratch[i].n && (rc = dt_models_falloc(m, scratch[i].p, scratch[i].n, err)))
            return rc;
    use_slot(g, 0);
    return 0;
}

int dt_llama_create(dt_model *m, dt_comm *comm, dt_err *err)
{
    const dt_model_config *cfg = &m->cfg;
    llama *g = calloc(1, sizeof *g);
    if (!g)
        return dt_err_set(err, -ENOMEM, "out of memory");
    m->impl = g;
    m->ops = &llama_ops;
    g->L = cfg->n_layer;
    g->NH = cfg->n_head;
    g->NKV = cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head;
    g->C = cfg->n_embd;
    g->hs = g->C / g->NH;
    g->F = cfg->ffn_hidden;
    g->V = cfg->shape.vocab_size;
    g->maxT = cfg->block_size;
    g->theta = cfg->rope_theta;
    g->eps = cfg->norm_eps > 0 ? cfg->norm_eps : 1e-5f;
    g->Bmax = cfg->max_batch;
    g->Tmax = cfg->shape.seq_len;
    g->recompute = cfg->recompute;
    /* tensor parallelism: the registry (zoo.c) checked tp_size, tp_rank, the divisibility and
     * comm */
    g->tp = cfg->tp_size > 1 ? cfg->tp_size : 1;
    g->tpr = g->tp > 1 ? cfg->tp_rank : 0;
    g->comm = g->tp > 1 ? comm : NULL;
    g->NHl = g->NH / g->tp;
    g->NKVl = g->NKV / g->tp;
    g->Cl = g->NHl * g->hs;
    g->Ckv = g->NKVl * g->hs;
    g->Fl = g->F / g->tp;
    g->Vl = (g->V + g->tp - 1) / g->tp;
    g->v0 = g->tpr * g->Vl;
    g->nv = DT_MAX(0, DT_MIN(g->Vl, g->V - g->v0));
    g->sp = cfg->sequence_parallel;
    if (g->sp && g->tp == 1)
        return dt_err_set(err, -EINVAL, "llama: sequence parallelism needs tensor parallelism "
                                        "(tp_size %d; parallel.tensor > 1 with "
                                        "parallel.sequence_parallel = true)",
                          cfg->tp_size);
    if (g->sp && g->Tmax % g->tp)
        return dt_err_set(err, -EINVAL, "llama: sequence parallelism splits the %d tokens of a "
                                        "sequence over the %d tensor ranks: make data.seq_len a "
                                        "multiple of parallel.tensor, or set "
                                        "parallel.sequence_parallel = false",
                          g->Tmax, g->tp);
    g->sd = g->sp ? g->tp : 1;
    if (!(g->layers = calloc((size_t)g->L, sizeof *g->layers)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    const int C = g->C, L = g->L;
    int rc;
    /* the pipeline stage: layers [lo, hi) */
    g->lo = 0;
    g->hi = L;
    if (cfg->pp_size > 1) {
        if (cfg->pp_rank < 0 || cfg->pp_rank >= cfg->pp_size || cfg->pp_first < 0 ||
            cfg->pp_count < 1 || cfg->pp_first + cfg->pp_count > L ||
            (cfg->pp_rank == 0) != (cfg->pp_first == 0) ||
            (cfg->pp_rank == cfg->pp_size - 1) != (cfg->pp_first + cfg->pp_count == L))
            return dt_err_set(err, -EINVAL, "llama: pipeline stage %d of %d with layers %d..%d "
                                            "of the model's %d (the first stage starts at layer "
                                            "0, the last ends at layer %d; parallel.stages)",
                              cfg->pp_rank, cfg->pp_size, cfg->pp_first,
                              cfg->pp_first + cfg->pp_count - 1, L, L - 1);
        g->lo = cfg->pp_first;
        g->hi = cfg->pp_first + cfg->pp_count;
    }
    g->Ls = g->hi - g->lo;
    g->first = g->lo == 0;
    g->last = g->hi == L;
    g->Lk = g->recompute == DT_RECOMPUTE_BLOCK ? DT_MIN(g->Ls, 1) : g->Ls;
    g->La = g->recompute == DT_RECOMPUTE_NONE ? g->Ls : DT_MIN(g->Ls, 1);

    /* the tensor table */
    char nm[DT_TENSOR_NAME_MAX];
    if (g->first && (rc = add_tensor(m, g, &g->embw, false, SPLIT_VOCAB, g->V, C,
                                     "model.embed_tokens.weight", err)))
        return rc;
    for (int l = g->lo; l < g->hi; l++)
        for (size_t i = 0; i < DT_ARRAY_LEN(layer_tensors); i++) {
            int64_t d0, d1;
            layer_shape(g, i, &d0, &d1);
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, layer_tensors[i].name);
            int *dst = (int *)((char *)&g->layers[l] + layer_tensors[i].at);
            if ((rc = add_tensor(m, g, dst, d1 == 0, layer_tensors[i].split, d0, d1, nm, err)))
                return rc;
        }
    if (g->last &&
        ((rc = add_tensor(m, g, &g->nfw, true, SPLIT_NONE, C, 0, "model.norm.weight", err)) ||
         (rc = add_tensor(m, g, &g->headw, false, SPLIT_VOCAB, g->V, C, "lm_head.weight", err))))
        return rc;
    /* blocks: the embedding, each decoder layer, the head (model.norm and lm_head) */
    int nb = 0;
    if (g->first && (rc = dt_models_add_block(m, g->embw, g->embw, 1, err, "embed")) < 0)
        return rc;
    nb += g->first;
    g->bl_h0 = nb;
    for (int l = g->lo; l < g->hi; l++, nb++)
        if ((rc = dt_models_add_block(m, g->layers[l].n1w, g->layers[l].dw, 1, err, "layers.%d",
                                      l)) < 0)
            return rc;
    g->bl_head = nb;
    if (g->last && (rc = dt_models_add_block(m, g->nfw, g->headw, 1, err, "head")) < 0)
        return rc;
    if ((rc = dt_models_alloc(m, err)))
        return rc;

    /* FLOPs (forward = the matmuls, 2 per multiply-add, plus causal attention; backward twice
     * that), this rank's share under tensor parallelism: per token and layer the q,k,v
     * projection C x (NH + 2NKV) hs, o_proj, the three SwiGLU matrices C x F, over TP; the
     * head's C x Vl on the last stage; attention 2 C T (T+1) per sample and layer, over TP */
    const double T = g->Tmax, tp = g->tp, Ls = g->Ls, hsd = g->hs;
    const double per_layer = C * (g->NH + 2.0 * g->NKV) * hsd + g->NH * hsd * C + 3.0 * C * g->F;
    double fwd = T * (2.0 * per_layer * Ls / tp + (g->last ? 2.0 * C * (double)g->Vl : 0.0)) +
                 Ls * 2.0 * C * T * (T + 1) / tp;
    m->flops_per_sample = 3.0 * fwd;

    g->nslots = cfg->pp_size > 1 && cfg->pp_slots > 1 ? cfg->pp_slots : 1;
    if ((rc = alloc_acts(m, g, err)))
        return rc;
    m->stage = &llama_stage_ops;
    m->pp_in_numel = g->first ? 0 : (size_t)g->Tmax / (size_t)g->sd * C;
    m->pp_out_numel = g->last ? 0 : (size_t)g->Tmax / (size_t)g->sd * C;
    return init_params(m, g, err);
}
