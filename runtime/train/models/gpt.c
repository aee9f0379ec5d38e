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
    int wte, wpe, lnfw, lnfb;
    gpt_layer *layers;       /* (L) owned */
    int32_t *tokens;         /* (B,T) device */
    int32_t *targets;        /* (B,T) device */
    dt_recompute recompute;
    int Lk, La;              /* layers of intermediates kept (L, or 1 with recompute = block)
                              * and of attention probabilities (L, or 1 with any recompute) */
    float *encoded;          /* (B,T,C) */
    float *ln1, *ln1_mean, *ln1_rstd; /* (Lk,B,T,C), (Lk,B,T), (Lk,B,T) */
    float *qkv;              /* (Lk,B,T,3C) */
    float *atty;             /* (Lk,B,T,C) */
    float *att;              /* (La,B,NH,T,T) */
    float *res2;             /* (Lk,B,T,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;   /* (Lk,B,T,4C) */
    float *res3;             /* (L,B,T,C) residual after the MLP (block output), always kept:
                              * block l's output is block l+1's input */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
    float *logits;           /* (B,T,V); after a training forward softmax - onehot(target) */
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
    const size_t NR = (size_t)g->Bmax * g->Tmax, NC = NR * g->C;
    const size_t NATT = (size_t)g->Bmax * g->NH * g->Tmax * g->Tmax;
    const size_t k = g->Lk == g->L ? (size_t)l : 0, ka = g->La == g->L ? (size_t)l : 0;
    a->ln1 = g->ln1 + k * NC;
    a->ln1m = g->ln1_mean + k * NR;
    a->ln1r = g->ln1_rstd + k * NR;
    a->qkv = g->qkv + k * 3 * NC;
    a->atty = g->atty + k * NC;
    a->att = g->att + ka * NATT;
    a->res2 = g->res2 + k * NC;
    a->ln2 = g->ln2 + k * NC;
    a->ln2m = g->ln2_mean + k * NR;
    a->ln2r = g->ln2_rstd + k * NR;
    a->fch = g->fch + k * 4 * NC;
    a->fchg = g->fch_gelu + k * 4 * NC;
    a->res3 = g->res3 + (size_t)l * NC;
}

/* Transformer block l on its input res (B,T,C) into a; without output, the last projection and
 * residual (res3, kept from forward) are skipped: that is the recomputation in backward. */
static void block_fwd(dt_model *m, const gpt *g, int l, const float *res, const gpt_acts *a,
                      int B, int T, bool output)
{
    dt_backend *be = m->be;
    const gpt_layer *w = &g->layers[l];
    const int C = g->C, NH = g->NH;
    const size_t N = (size_t)B * T;
    be->layernorm_fwd(be, a->ln1, a->ln1m, a->ln1r, res, P(m, w->ln1w), P(m, w->ln1b), (int)N, C,
                      LN_EPS);
    be->matmul_fwd(be, a->qkv, a->ln1, P(m, w->qkvw), P(m, w->qkvb), (int)N, C, 3 * C);
    be->attention_fwd(be, a->atty, a->att, a->qkv, B, T, C, NH);
    be->matmul_fwd(be, a->res2, a->atty, P(m, w->projw), P(m, w->projb), (int)N, C, C);
    be->accumulate(be, a->res2, res, N * C); // res2 = res + attn
    be->layernorm_fwd(be, a->ln2, a->ln2m, a->ln2r, a->res2, P(m, w->ln2w), P(m, w->ln2b), (int)N,
                      C, LN_EPS);
    be->matmul_fwd(be, a->fch, a->ln2, P(m, w->fcw), P(m, w->fcb), (int)N, C, 4 * C);
    be->gelu_fwd(be, a->fchg, a->fch, N * 4 * C);
    if (!output)
        return;
    be->matmul_fwd(be, a->res3, a->fchg, P(m, w->fcprojw), P(m, w->fcprojb), (int)N, 4 * C, C);
    be->accumulate(be, a->res3, a->res2, N * C); // res3 = res2 + mlp
}

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
    dt_models_event(m, 0, DT_BLOCK_BEFORE_FORWARD);
    be->embedding_fwd(be, g->encoded, g->tokens, P(m, g->wte), P(m, g->wpe), B, T, C);
    dt_models_event(m, 0, DT_BLOCK_AFTER_FORWARD);
    const float *res = g->encoded;
    for (int l = 0; l < g->L; l++) {
        gpt_acts a;
        acts_of(g, l, &a);
        dt_models_event(m, 1 + l, DT_BLOCK_BEFORE_FORWARD);
        block_fwd(m, g, l, res, &a, B, T, true);
        dt_models_event(m, 1 + l, DT_BLOCK_AFTER_FORWARD);
        res = a.res3;
    }
    dt_models_event(m, bl_lnf, DT_BLOCK_BEFORE_FORWARD);
    be->layernorm_fwd(be, g->lnf, g->lnf_mean, g->lnf_rstd, res, P(m, g->lnfw), P(m, g->lnfb),
                      (int)N, C, LN_EPS);
    dt_models_event(m, bl_lnf, DT_BLOCK_AFTER_FORWARD);
    // logits (N,V) = lnf (N,C) @ wte^T: the tied head, block 0's second window
    dt_models_event(m, 0, DT_BLOCK_BEFORE_FORWARD);
    be->matmul_fwd(be, g->logits, g->lnf, P(m, g->wte), NULL, (int)N, C, V);
    dt_models_event(m, 0, DT_BLOCK_AFTER_FORWARD);
    // Training: the classifier's gradient (softmax - onehot, unscaled) replaces the logits in
    // the same pass that computes the losses, so the (N,V) logits, the biggest tensor of the
    // model, are read once per step, not once here and again in backward.
    be->xent_fwd_bwd(be, g->losses, training ? g->logits : NULL, g->logits, g->targets, (int)N, V,
                     1.0f, NULL);
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
    const int B = g->B, T = g->T, C = g->C, V = g->V, NH = g->NH;
    const size_t N = (size_t)B * T, NC = (size_t)g->Bmax * g->Tmax * C;
    const size_t fN = N * sizeof(float);

    /* d loss / d logits = dl * (softmax - onehot), the latter in g->logits since forward; dl
     * goes on the (N,C) operands of the classifier GEMM instead of the (N,V) gradient:
     * dwte += dlogits^T @ (dl * lnf) and dC = (dlogits @ wte) * dl. lnf is not read again. */
    const int bl_lnf = g->L + 1; /* blocks: 0 embed, 1 + l h.l, L + 1 ln_f */
    float dl = g->valid > 0 ? dloss_scale / (float)g->valid : 0.0f;
    be->scale(be, g->lnf, N * C, dl);
    be->memset_zero(be, g->dC, fN * C);
    dt_models_event(m, 0, DT_BLOCK_BEFORE_BACKWARD); /* the tied head */
    be->matmul_bwd(be, g->dC, G(m, g->wte), NULL, g->logits, g->lnf, P(m, g->wte), (int)N, C, V);
    dt_models_event(m, 0, DT_BLOCK_AFTER_BACKWARD);
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
        float *ln1 = a.ln1, *ln1m = a.ln1m, *ln1r = a.ln1r, *qkv = a.qkv, *atty = a.atty;
        float *att = a.att, *res2 = a.res2, *ln2 = a.ln2, *ln2m = a.ln2m, *ln2r = a.ln2r;
        float *fch = a.fch, *fchg = a.fchg;
        dt_models_event(m, 1 + l, DT_BLOCK_BEFORE_BACKWARD);
        if (g->recompute == DT_RECOMPUTE_BLOCK) /* the block's intermediates, from its input */
            block_fwd(m, g, l, res, &a, B, T, false);
        /* g->dres: gradient of this block's output (res3) */
        be->memset_zero(be, g->d4a, fN * 4 * C);
        be->matmul_bwd(be, g->d4a, G(m, w->fcprojw), G(m, w->fcprojb), g->dres, fchg,
                       P(m, w->fcprojw), (int)N, 4 * C, C);
        be->memset_zero(be, g->d4b, fN * 4 * C);
        be->gelu_bwd(be, g->d4b, fch, g->d4a, N * 4 * C);
        be->memset_zero(be, g->dC, fN * C);
        be->matmul_bwd(be, g->dC, G(m, w->fcw), G(m, w->fcb), g->d4b, ln2, P(m, w->fcw), (int)N,
                       C, 4 * C);
        be->layernorm_bwd(be, g->dres, G(m, w->ln2w), G(m, w->ln2b), g->dC, res2, P(m, w->ln2w),
                          ln2m, ln2r, (int)N, C);
        /* g->dres: gradient of res2 */
        be->memset_zero(be, g->dC, fN * C);
        be->matmul_bwd(be, g->dC, G(m, w->projw), G(m, w->projb), g->dres, atty, P(m, w->projw),
                       (int)N, C, C);
        if (g->recompute == DT_RECOMPUTE_SELECTIVE) /* the probabilities, from the kept q,k,v */
            be->attention_fwd(be, g->dqkv, att, qkv, B, T, C, NH); /* dqkv: scratch for y */
        be->memset_zero(be, g->dqkv, fN * 3 * C);
        be->attention_bwd(be, g->dqkv, g->datt, g->dC, qkv, att, B, T, C, NH);
        be->memset_zero(be, g->dC, fN * C);
        be->matmul_bwd(be, g->dC, G(m, w->qkvw), G(m, w->qkvb), g->dqkv, ln1, P(m, w->qkvw),
                       (int)N, C, 3 * C);
        be->layernorm_bwd(be, g->dres, G(m, w->ln1w), G(m, w->ln1b), g->dC, res, P(m, w->ln1w),
                          ln1m, ln1r, (int)N, C);
        /* g->dres: gradient of this block's input */
        dt_models_ready(m, w->ln1w, w->fcprojb, ready, ctx);
        dt_models_event(m, 1 + l, DT_BLOCK_AFTER_BACKWARD);
    }
    dt_models_event(m, 0, DT_BLOCK_BEFORE_BACKWARD);
    be->embedding_bwd(be, G(m, g->wte), G(m, g->wpe), g->dres, g->tokens, B, T, C);
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
                    g->d4a,      g->d4b,      g->datt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(be, bufs[i]);
    free(g->layers);
    free(g);
    m->impl = NULL;
}

static const dt_model_ops gpt_ops = {gpt_forward, gpt_backward, gpt_free};

/* Declares tensor name of shape (d0) (d1 == 0) or (d0,d1); its index goes to *dst. */
static int add_tensor(dt_model *m, int *dst, bool no_decay, int64_t d0, int64_t d1,
                      const char *name, dt_err *err)
{
    int64_t shape[2] = {d0, d1};
    int rc = dt_models_add(m, no_decay, d1 > 0 ? 2 : 1, shape, err, "%s", name);
    if (rc < 0)
        return rc;
    *dst = rc;
    return 0;
}

int dt_gpt_create(dt_model *m, dt_err *err)
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
    g->layers = calloc((size_t)g->L, sizeof *g->layers);
    if (!g->layers)
        return dt_err_set(err, -ENOMEM, "out of memory");
    const int C = g->C, L = g->L;
    int rc;

    char nm[DT_TENSOR_NAME_MAX];
    if ((rc = add_tensor(m, &g->wte, false, g->V, C, "wte.weight", err)) ||
        (rc = add_tensor(m, &g->wpe, false, g->maxT, C, "wpe.weight", err)))
        return rc;
    for (int l = 0; l < L; l++) {
        gpt_layer *w = &g->layers[l];
        const struct {
            int *dst;
            bool no_decay;
            int64_t d0, d1;
            const char *name;
        } t[] = {
            {&w->ln1w, true, C, 0, "ln_1.weight"},
            {&w->ln1b, true, C, 0, "ln_1.bias"},
            {&w->qkvw, false, 3 * C, C, "attn.c_attn.weight"},
            {&w->qkvb, true, 3 * C, 0, "attn.c_attn.bias"},
            {&w->projw, false, C, C, "attn.c_proj.weight"},
            {&w->projb, true, C, 0, "attn.c_proj.bias"},
            {&w->ln2w, true, C, 0, "ln_2.weight"},
            {&w->ln2b, true, C, 0, "ln_2.bias"},
            {&w->fcw, false, 4 * C, C, "mlp.c_fc.weight"},
            {&w->fcb, true, 4 * C, 0, "mlp.c_fc.bias"},
            {&w->fcprojw, false, C, 4 * C, "mlp.c_proj.weight"},
            {&w->fcprojb, true, C, 0, "mlp.c_proj.bias"},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(nm, sizeof nm, "h.%d.%s", l, t[i].name);
            if ((rc = add_tensor(m, t[i].dst, t[i].no_decay, t[i].d0, t[i].d1, nm, err)))
                return rc;
        }
    }
    if ((rc = add_tensor(m, &g->lnfw, true, C, 0, "ln_f.weight", err)) ||
        (rc = add_tensor(m, &g->lnfb, true, C, 0, "ln_f.bias", err)))
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
     * plus causal attention (2*C*T*(T+1) per layer per sample); backward = 2x forward. */
    const double T = g->Tmax;
    double fwd = T * (2.0 * 12.0 * C * (double)C * L + 2.0 * C * (double)g->V) +
                 L * 2.0 * C * T * (T + 1);
    m->flops_per_sample = 3.0 * fwd;

    /* activations: recompute = block keeps one layer of intermediates (and every layer's
     * output res3, the next one's input); selective keeps all but the attention probabilities */
    const size_t NR = (size_t)g->Bmax * g->Tmax, NC = NR * C;
    const size_t NATT = (size_t)g->Bmax * g->NH * g->Tmax * g->Tmax;
    const size_t Lk = (size_t)g->Lk, La = (size_t)g->La;
    struct {
        float **p;
        size_t n;
    } acts[] = {
        {&g->encoded, NC},        {&g->ln1, Lk * NC},       {&g->ln1_mean, Lk * NR},
        {&g->ln1_rstd, Lk * NR},  {&g->qkv, 3 * Lk * NC},   {&g->atty, Lk * NC},
        {&g->att, La * NATT},     {&g->res2, Lk * NC},      {&g->ln2, Lk * NC},
        {&g->ln2_mean, Lk * NR},  {&g->ln2_rstd, Lk * NR},  {&g->fch, 4 * Lk * NC},
        {&g->fch_gelu, 4 * Lk * NC}, {&g->res3, (size_t)L * NC}, {&g->lnf, NC},
        {&g->lnf_mean, NR},      {&g->lnf_rstd, NR},       {&g->logits, NR * g->V},
        {&g->losses, NR},        {&g->dres, NC},           {&g->dC, NC},
        {&g->dqkv, 3 * NC},      {&g->d4a, 4 * NC},        {&g->d4b, 4 * NC},
        {&g->datt, NATT},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if ((rc = dt_models_falloc(m, acts[i].p, acts[i].n, err)))
            return rc;
    if ((rc = dt_models_ialloc(m, &g->tokens, NR, err)))
        return rc;
    if ((rc = dt_models_ialloc(m, &g->targets, NR, err)))
        return rc;

    /* initialisation, in table order */
    float *host = calloc(m->num_params, sizeof(float));
    if (!host)
        return dt_err_set(err, -ENOMEM, "out of memory");
    dt_rng r;
    dt_rng_seed(&r, cfg->seed);
    const float proj_std = 0.02f / sqrtf(2.0f * (float)L);
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        if (t->ndim == 2)
            dt_models_init_normal(host, t, &r, strstr(t->name, "c_proj") ? proj_std : 0.02f);
        else if (strstr(t->name, "ln_") && strstr(t->name, ".weight"))
            dt_models_init_const(host, t, 1.0f);
    }
    dt_models_upload(m, host);
    free(host);
    return 0;
}

const float *dt_gpt_logits(const dt_model *m)
{
    if (!m || m->ops != &gpt_ops || !m->impl)
        return NULL;
    return ((const gpt *)m->impl)->logits;
}
