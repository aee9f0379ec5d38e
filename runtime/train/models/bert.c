/* bert.c - `bert`: BERT pre-training as Hugging Face's BertForPreTraining defines it, llm.c style
 * (explicit forward and backward).
 *
 * Word, position and token-type embeddings summed and LayerNormed; L post-LayerNorm encoder
 * layers (bidirectional multi-head self-attention over the keys the attention mask keeps, then
 * a 4C MLP with the exact erf GELU, each added to its input and LayerNormed, eps 1e-12); the
 * masked-language-model head (a dense C x C, GELU, LayerNorm, then the decoder tied to the word
 * embeddings with its own bias) and, with cfg.nsp, the next-sentence head (the pooler: dense +
 * tanh on each sample's first token, then cls.seq_relationship, 2 classes). The loss is HF's:
 * the mean cross-entropy over the masked positions (targets >= 0; the rest are ignored) plus,
 * with nsp, the mean next-sentence cross-entropy over the samples. Dropout is left out (as in
 * every model of the zoo), so is HF's padding_idx (no row of the word embeddings is special).
 *
 * Parameters, with Hugging Face's names (Linear weights (out, in) as torch.nn.Linear):
 *   bert.embeddings.word_embeddings.weight (V,C)        bert.embeddings.position_embeddings
 *   .weight (maxT,C)   bert.embeddings.token_type_embeddings.weight (2,C)
 *   bert.embeddings.LayerNorm.weight/.bias (C)
 *   bert.encoder.layer.{l}.attention.self.query/key/value.weight (C,C) and .bias (C)
 *   bert.encoder.layer.{l}.attention.output.dense.weight (C,C) .bias; ...attention.output
 *   .LayerNorm.weight/.bias; ...intermediate.dense.weight (4C,C) .bias (4C); ...output.dense
 *   .weight (C,4C) .bias; ...output.LayerNorm.weight/.bias
 *   cls.predictions.bias (V)   cls.predictions.transform.dense.weight (C,C) .bias
 *   cls.predictions.transform.LayerNorm.weight/.bias
 *   with nsp: bert.pooler.dense.weight (C,C) .bias, cls.seq_relationship.weight (2,C) .bias
 * HF's state dict also lists cls.predictions.decoder.weight and .bias: they are the word
 * embeddings and cls.predictions.bias (tied), which from_pretrained fills from those. Buffer
 * order (names are what matter outside): "embed" = word, position, token type, the embedding
 * LayerNorm; per layer query, key, value weights (contiguous: one (3C,C) GEMM whose rows are
 * q | k | v, the layout attention_pad_fwd reads) then their biases, then the rest in HF's order;
 * "cls" = the transform, the pooler and seq_relationship, and cls.predictions.bias last (so that
 * a pipeline's stages, concatenated, hold the tensors in this order too). The decoder GEMM reads
 * the word embeddings in their block's window and a copy of the bias taken in the cls window
 * (its gradient likewise goes back through a scratch), so no op reads two blocks at once.
 * Initialisation as HF's
 * _init_weights with initializer_range 0.02: every matrix (embeddings included) normal(0, 0.02),
 * LayerNorm weights 1, every bias 0; drawn in the order of the names above from one stream.
 *
 * Blocks (model.h): "embed", "layer.{l}" (one encoder layer each), "cls"; on a pipelined last
 * stage without the embeddings also "head" (its copy of the word embeddings). Block events: forward embed, layer.0 .. layer.{L-1}, cls, embed (the
 * decoder); backward embed (the decoder), cls, layer.{L-1} .. layer.0, embed. So "embed" has two
 * windows when the stage also has the head, as gpt's.
 *
 * Activations per layer as gpt's (about L*B*T*(15C + NH*T) floats, padded attention full
 * (T,T)). cfg.recompute: block keeps each layer's output only (the residual stream) and
 * recomputes the layer's forward at the start of its backward, the output LayerNorm writing into
 * scratch; selective keeps everything but the attention probabilities. The MLM head computes the
 * logits of every position (HF does; a gather of the masked rows would save most of that GEMM).
 *
 * Tensor parallelism (cfg.tp_size = TP > 1, Megatron's BERT layout, as gpt.c's header details):
 * query, key, value column-parallel by heads (each rank its NH/TP heads: rows [r*C/TP,
 * (r+1)*C/TP) of each, so the local (3C/TP, C) GEMM gives q | k | v of its heads), attention
 * .output.dense row-parallel (bias added after the all-reduce), intermediate.dense column-
 * parallel, output.dense row-parallel; the word embeddings and cls.predictions.bias
 * vocabulary-parallel (rows / entries [r*Vp/TP, (r+1)*Vp/TP) of the vocabulary padded to Vp, the
 * padding zero and never trained); replicated: position and token-type embeddings, every
 * LayerNorm, the row-parallel biases, the MLM transform, the pooler and seq_relationship. The
 * collectives are gpt's: the embedding's partial sums all-reduced (then the token types added
 * and LayerNormed on every rank), 2 all-reduces forward (g after each row-parallel GEMM) and 2
 * backward (f: the gradients of each column-parallel GEMM's input) per layer, the vocabulary-
 * parallel cross-entropy's statistics, and the gradient of the decoder's input (the transform's
 * output) all-reduced; the replicated parameters' gradients come from the same all-reduced
 * inputs by the same ops on every rank, so they are the same bits everywhere without a
 * collective. With recompute = block the recomputation repeats both row-parallel all-reduces.
 * Sequence parallelism (cfg.sequence_parallel): gpt's layout (rank r holds the rows [r*N/TP,
 * (r+1)*N/TP) of the N = B*T token rows of the residual stream, the LayerNorms, the residual and
 * bias adds), here per layer: the layer's input all-gathered before the QKV GEMM and again in
 * backward, attention.output's partial sums reduce-scattered, the attention LayerNorm's output
 * all-gathered before intermediate.dense and again in backward, output.dense's reduce-scattered;
 * in backward the gradients of each row-parallel output all-gathered and the column-parallel
 * input gradients reduce-scattered; the LayerNorms' (and the token-type embedding's) gradients,
 * from this rank's rows, all-reduced before they are added. The head all-gathers the last
 * layer's output once and runs the (replicated) transform and pooler on all rows, as TP does
 * (its gradients need no collective), and keeps this rank's rows of its input gradient.
 * Pipeline stages: as gpt's (the stage's encoder layers; the embeddings on stage 0; the MLM and
 * NSP heads on the last, with its own copy of the tied word embeddings; stage input and output
 * the residual stream, 1/TP of it under sequence parallelism). Every stage reads the batch's
 * attention mask; stage 0 its tokens and token types, the last stage its targets and labels.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/train/models/bert.h"
#include "runtime/train/models/models.h"

#define LN_EPS 1e-12f
#define TYPES 2 /* type_vocab_size */

typedef struct bert_layer {
    int qw, kw, vw, qb, kb, vb, aow, aob, alnw, alnb, iw, ib, ow, ob, olnw, olnb;
} bert_layer;

/* One micro-batch's activations (model.h's slots). Fields with B*T rows of width C hold B*T/sd
 * of them under sequence parallelism (esum, encoded, r1, h1, r2, out and their statistics). */
typedef struct bert_slot {
    int32_t *tokens, *types, *mask, *targets, *labels; /* (B,T), (B,T), (B,T), (B,T), (B) */
    float *esum, *emean, *erstd, *encoded; /* (B,T,C), (B,T), (B,T), (B,T,C): the embeddings */
    float *qkv, *atty, *att;               /* (Lk,B,T,3Cl), (Lk,B,T,Cl), (La,B,NHl,T,T) */
    float *r1, *h1, *h1m, *h1r;            /* (Lk,B,T,C), (Lk,B,T,C), (Lk,B,T), (Lk,B,T) */
    float *f, *fg;                         /* (Lk,B,T,4Cl) each */
    float *r2, *h2m, *h2r;                 /* (Lk,B,T,C), (Lk,B,T), (Lk,B,T) */
    float *out;                            /* (Ls,B,T,C): each layer's output, always kept */
    float *t, *tg, *u, *um, *ur;           /* (B,T,C) x3, (B,T) x2: the MLM transform */
    float *logits, *losses;                /* (B,T,Vl), (B,T) */
    float *cls_in, *pool_pre, *pooled;     /* (B,C) each: the NSP head */
    float *nsp_logits, *nsp_losses;        /* (B,2), (B) */
    const float *in;                       /* borrowed: the previous stage's output */
    int B, T, valid;                       /* of the slot's last training forward */
    bool has_mask, can_backward;
} bert_slot;

typedef struct bert {
    int L, NH, C, V, maxT;
    int Bmax, Tmax;
    bool nsp;
    /* tensor parallelism (TP = 1: Cl = C, NHl = NH, Vl = nv = V, v0 = 0, comm NULL) */
    int tp, tpr;
    dt_comm *comm;
    int Cl, NHl, Vl, v0, nv;
    float *xmax, *xsums; /* (B,T), (2,B,T): the vocabulary-parallel cross-entropy's statistics */
    bool sp;             /* sequence parallelism: sd = TP, else 1 */
    int sd;
    float *gat;          /* (B,T,C): the all-gathered operand of the moment (SP) */
    float *dCs;          /* (B*T/TP,C): a reduce-scattered input gradient (SP) */
    float *dln;          /* (4C + TYPES*C): LayerNorm (and token-type) gradients from this rank's
                          * rows, all-reduced before use (SP) */
    /* tensor indices */
    int word, pos, type, elnw, elnb, dbias;
    int tw, tb, tlnw, tlnb, pw, pb, sw, sb;
    bert_layer *layers;  /* (L) owned; only the stage's are set */
    dt_recompute recompute;
    int Lk, La;          /* layers of intermediates kept, of attention probabilities kept */
    /* pipeline stage: encoder layers [lo, hi) (Ls of them) */
    int lo, hi, Ls;
    bool first, last;
    int bl_layer0, bl_cls, bl_head;
    int nslots;
    bert_slot *slots;    /* (nslots) owned */
    bert_slot *s;        /* the slot in use */
    /* backward scratch, shared by the slots */
    float *dres;         /* (B,T,C) rows of the residual stream: the gradient flowing down */
    float *dA;           /* (B,T,C) same rows: a LayerNorm's input gradient */
    float *dC;           /* (B,T,C): a column-parallel GEMM's input gradient */
    float *dqkv, *d4a, *d4b, *datt; /* (B,T,3Cl), (B,T,4Cl) x2, (B,NHl,T,T) */
    float *dhA, *dhB;    /* (B,T,C) each: the MLM transform's gradients */
    float *vb;           /* (Vl): the decoder bias, copied in the cls window for the decoder
                          * GEMM; in backward its gradient before scaling */
    float *dpool, *dpre, *dcls; /* (B,C) each: the NSP head's gradients */
} bert;

static float *P(dt_model *m, int t) { return m->params + m->tensors[t].offset; }
static float *G(dt_model *m, int t) { return m->grads + m->tensors[t].offset; }

/* Where layer l's activations live: its own slot, or the one shared slot when recomputed. */
typedef struct bert_acts {
    float *qkv, *atty, *att, *r1, *h1, *h1m, *h1r, *f, *fg, *r2, *h2m, *h2r, *out;
} bert_acts;

static void acts_of(const bert *g, int l, bert_acts *a)
{
    const bert_slot *s = g->s;
    const size_t NR = (size_t)g->Bmax * g->Tmax, NRs = NR / (size_t)g->sd;
    const size_t NCs = NRs * g->C, NCl = NR * g->Cl;
    const size_t NATT = (size_t)g->Bmax * g->NHl * g->Tmax * g->Tmax;
    const size_t ll = (size_t)(l - g->lo);
    const size_t k = g->Lk == g->Ls ? ll : 0, ka = g->La == g->Ls ? ll : 0;
    a->qkv = s->qkv + k * 3 * NCl;
    a->atty = s->atty + k * NCl;
    a->att = s->att + ka * NATT;
    a->r1 = s->r1 + k * NCs;
    a->h1 = s->h1 + k * NCs;
    a->h1m = s->h1m + k * NRs;
    a->h1r = s->h1r + k * NRs;
    a->f = s->f + k * 4 * NCl;
    a->fg = s->fg + k * 4 * NCl;
    a->r2 = s->r2 + k * NCs;
    a->h2m = s->h2m + k * NRs;
    a->h2r = s->h2r + k * NRs;
    a->out = s->out + ll * NCs;
}

/* ------------------------------------------------------------------------------------------ */
/* tensor-parallel pieces (gpt.c's, over this model's fields) */

static int tp_allreduce(const bert *g, float *x, size_t n, dt_redop op, const char *what,
                        dt_err *err)
{
    if (g->tp == 1)
        return 0;
    int rc = dt_comm_allreduce(g->comm, x, n, DT_FLOAT32, op, NULL, err);
    if (rc)
        dt_err_prefix(err, "bert tensor parallelism (rank %d of %d), all-reduce of %s: ", g->tpr,
                      g->tp, what);
    return rc;
}

/* Sequence parallelism: full (N,C) = every rank's shard (N/TP,C), in rank order. */
static int sp_allgather(const bert *g, const float *shard, float *full, size_t N,
                        const char *what, dt_err *err)
{
    int rc = dt_comm_allgather(g->comm, shard, full, N / (size_t)g->tp * (size_t)g->C,
                               DT_FLOAT32, NULL, err);
    if (rc)
        dt_err_prefix(err, "bert sequence parallelism (rank %d of %d), all-gather of %s: ",
                      g->tpr, g->tp, what);
    return rc;
}

/* Sequence parallelism: shard (N/TP,C) = this rank's rows of full (N,C) summed over the group. */
static int sp_reduce_scatter(const bert *g, const float *full, float *shard, size_t N,
                             const char *what, dt_err *err)
{
    int rc = dt_comm_reduce_scatter(g->comm, full, shard, N / (size_t)g->tp * (size_t)g->C,
                                    DT_FLOAT32, DT_SUM, NULL, err);
    if (rc)
        dt_err_prefix(err, "bert sequence parallelism (rank %d of %d), reduce-scatter of %s: ",
                      g->tpr, g->tp, what);
    return rc;
}

/* Sequence parallelism: g->dln's first n floats (gradients from this rank's rows) summed over
 * the group, then added to the gradients of tensors t[0..k) (their numel each, in order). */
static int sp_sum_grads(dt_model *m, const bert *g, const int *t, int k, const char *what,
                        dt_err *err)
{
    size_t n = 0;
    for (int i = 0; i < k; i++)
        n += m->tensors[t[i]].numel;
    int rc = tp_allreduce(g, g->dln, n, DT_SUM, what, err);
    for (int i = 0, at = 0; !rc && i < k; at += (int)m->tensors[t[i]].numel, i++)
        m->be->accumulate(m->be, G(m, t[i]), g->dln + at, m->tensors[t[i]].numel);
    return rc;
}

/* Where a LayerNorm's (w, b) gradients go: the gradient buffer, or under sequence parallelism
 * the scratch g->dln at float offset at (w's C floats, then b's). */
static float *ln_grad(dt_model *m, const bert *g, int t, size_t at)
{
    return g->sp ? g->dln + at : G(m, t);
}

/* Row-parallel linear + g: out (Ns,C) = inp (N,K) @ w^T (w (C,K), this rank's columns) summed
 * over the tensor group (reduce-scattered under SP), then + bias on every rank. */
static int row_parallel_fwd(dt_model *m, const bert *g, float *out, const float *inp, int w,
                            int b, int N, int K, const char *what, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C;
    if (g->tp == 1) {
        be->matmul_fwd(be, out, inp, P(m, w), P(m, b), N, K, C);
        return 0;
    }
    float *part = g->sp ? g->gat : out;
    be->matmul_fwd(be, part, inp, P(m, w), NULL, N, K, C);
    int rc = g->sp ? sp_reduce_scatter(g, part, out, (size_t)N, what, err)
                   : tp_allreduce(g, out, (size_t)N * C, DT_SUM, what, err);
    if (!rc)
        be->bias_add(be, out, P(m, b), N / g->sd, C);
    return rc;
}

/* The column-parallel GEMMs' input gradient g->dC (N,C), partial over the tensor group: summed
 * (all-reduced) into g->dC, or reduce-scattered into g->dCs under SP; returns where it is. */
static int col_parallel_dinp(const bert *g, const float **dx, size_t N, const char *what,
                             dt_err *err)
{
    *dx = g->sp ? g->dCs : g->dC;
    return g->sp ? sp_reduce_scatter(g, g->dC, g->dCs, N, what, err)
                 : tp_allreduce(g, g->dC, N * g->C, DT_SUM, what, err);
}

/* ------------------------------------------------------------------------------------------ */
/* the encoder layer */

/* Encoder layer l on its input res (Ns,C) into a, its output into a->out; when recompute (the
 * recomputation at the start of the layer's backward) the output LayerNorm writes into g->dA,
 * scratch, and the kept output stays as it is. */
static int layer_fwd(dt_model *m, bert *g, int l, const float *res, const bert_acts *a, int B,
                     int T, bool recompute, dt_err *err)
{
    dt_backend *be = m->be;
    const bert_layer *w = &g->layers[l];
    const int C = g->C, Cl = g->Cl, NHl = g->NHl;
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd;
    const int32_t *mask = g->s->has_mask ? g->s->mask : NULL;
    int rc;
    if (g->sp && (rc = sp_allgather(g, res, g->gat, N, "the layer's input", err)))
        return rc;
    // qkv (N,3Cl) = x @ [Wq|Wk|Wv]^T + [bq|bk|bv]: this rank's heads
    be->matmul_fwd(be, a->qkv, g->sp ? g->gat : res, P(m, w->qw), P(m, w->qb), (int)N, C,
                   3 * Cl);
    be->attention_pad_fwd(be, a->atty, a->att, a->qkv, mask, B, T, Cl, NHl);
    if ((rc = row_parallel_fwd(m, g, a->r1, a->atty, w->aow, w->aob, (int)N, Cl,
                               "attention.output.dense's output", err)))
        return rc;
    be->accumulate(be, a->r1, res, Ns * C); // r1 = x + attention
    be->layernorm_fwd(be, a->h1, a->h1m, a->h1r, a->r1, P(m, w->alnw), P(m, w->alnb), (int)Ns, C,
                      LN_EPS);
    if (g->sp && (rc = sp_allgather(g, a->h1, g->gat, N, "attention.output.LayerNorm's output",
                                    err)))
        return rc;
    be->matmul_fwd(be, a->f, g->sp ? g->gat : a->h1, P(m, w->iw), P(m, w->ib), (int)N, C,
                   4 * Cl);
    be->gelu_erf_fwd(be, a->fg, a->f, N * 4 * Cl);
    if ((rc = row_parallel_fwd(m, g, a->r2, a->fg, w->ow, w->ob, (int)N, 4 * Cl,
                               "output.dense's output", err)))
        return rc;
    be->accumulate(be, a->r2, a->h1, Ns * C); // r2 = h1 + mlp
    be->layernorm_fwd(be, recompute ? g->dA : a->out, a->h2m, a->h2r, a->r2, P(m, w->olnw),
                      P(m, w->olnb), (int)Ns, C, LN_EPS);
    return 0;
}

/* Backward of encoder layer l: g->dres (Ns,C) holds the gradient of its output and gets the
 * gradient of its input res. */
static int layer_bwd(dt_model *m, bert *g, int l, const float *res, const bert_acts *a, int B,
                     int T, dt_err *err)
{
    dt_backend *be = m->be;
    const bert_layer *w = &g->layers[l];
    const int C = g->C, Cl = g->Cl, NHl = g->NHl;
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd;
    const size_t fN = N * sizeof(float), fNs = Ns * sizeof(float);
    const bool sp = g->sp;
    const float *dx;
    int rc;
    if (sp)
        be->memset_zero(be, g->dln, 4 * (size_t)C * sizeof(float));
    /* output.LayerNorm: dA = d r2 */
    be->memset_zero(be, g->dA, fNs * C);
    be->layernorm_bwd(be, g->dA, ln_grad(m, g, w->olnw, 2 * (size_t)C),
                      ln_grad(m, g, w->olnb, 3 * (size_t)C), g->dres, a->r2, P(m, w->olnw),
                      a->h2m, a->h2r, (int)Ns, C);
    be->memcpy_d2d(be, g->dres, g->dA, fNs * C); /* dres: d h1, the residual branch so far */
    /* output.dense (row-parallel): d fg = d r2 @ Wo, from all N rows */
    if (sp && (rc = sp_allgather(g, g->dA, g->gat, N, "the gradient of output.dense's output",
                                 err)))
        return rc;
    be->memset_zero(be, g->d4a, fN * 4 * Cl);
    be->matmul_bwd(be, g->d4a, G(m, w->ow), G(m, w->ob), sp ? g->gat : g->dA, a->fg, P(m, w->ow),
                   (int)N, 4 * Cl, C);
    be->memset_zero(be, g->d4b, fN * 4 * Cl);
    be->gelu_erf_bwd(be, g->d4b, a->f, g->d4a, N * 4 * Cl);
    /* intermediate.dense (column-parallel): its input is h1 */
    if (sp && (rc = sp_allgather(g, a->h1, g->gat, N,
                                 "attention.output.LayerNorm's output (again)", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * C);
    be->matmul_bwd(be, g->dC, G(m, w->iw), G(m, w->ib), g->d4b, sp ? g->gat : a->h1,
                   P(m, w->iw), (int)N, C, 4 * Cl);
    if ((rc = col_parallel_dinp(g, &dx, N, "the gradient of intermediate.dense's input", err)))
        return rc;
    be->accumulate(be, g->dres, dx, Ns * C); /* dres: d h1 */
    /* attention.output.LayerNorm: dA = d r1 */
    be->memset_zero(be, g->dA, fNs * C);
    be->layernorm_bwd(be, g->dA, ln_grad(m, g, w->alnw, 0), ln_grad(m, g, w->alnb, (size_t)C),
                      g->dres, a->r1, P(m, w->alnw), a->h1m, a->h1r, (int)Ns, C);
    be->memcpy_d2d(be, g->dres, g->dA, fNs * C); /* dres: d x, the residual branch so far */
    /* attention.output.dense (row-parallel): d atty into dC (N,Cl) */
    if (sp && (rc = sp_allgather(g, g->dA, g->gat, N,
                                 "the gradient of attention.output.dense's output", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * Cl);
    be->matmul_bwd(be, g->dC, G(m, w->aow), G(m, w->aob), sp ? g->gat : g->dA, a->atty,
                   P(m, w->aow), (int)N, Cl, C);
    if (g->recompute == DT_RECOMPUTE_SELECTIVE) /* the probabilities, from the kept q,k,v */
        be->attention_pad_fwd(be, g->dqkv, a->att, a->qkv, g->s->has_mask ? g->s->mask : NULL,
                              B, T, Cl, NHl); /* dqkv: scratch for the output */
    be->memset_zero(be, g->dqkv, fN * 3 * Cl);
    be->attention_pad_bwd(be, g->dqkv, g->datt, g->dC, a->qkv, a->att, B, T, Cl, NHl);
    /* query, key, value (column-parallel): their input is the layer's input */
    if (sp && (rc = sp_allgather(g, res, g->gat, N, "the layer's input (again)", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * C);
    be->matmul_bwd(be, g->dC, G(m, w->qw), G(m, w->qb), g->dqkv, sp ? g->gat : res, P(m, w->qw),
                   (int)N, C, 3 * Cl);
    if ((rc = col_parallel_dinp(g, &dx, N, "the gradient of the layer's input", err)))
        return rc;
    be->accumulate(be, g->dres, dx, Ns * C); /* dres: d x */
    if (sp) { /* the LayerNorms saw this rank's rows: their gradients summed over the group */
        const int lns[4] = {w->alnw, w->alnb, w->olnw, w->olnb};
        return sp_sum_grads(m, g, lns, 4, "the LayerNorm gradients", err);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* the embeddings */

/* The embeddings into s->encoded (Ns,C): word + position (vocabulary-parallel partial sums
 * under TP, rank 0 adding the positions; all-reduced, or reduce-scattered under SP), + token
 * type, LayerNorm. One window of the "embed" block. */
static int embed_fwd(dt_model *m, bert *g, int B, int T, dt_err *err)
{
    dt_backend *be = m->be;
    bert_slot *s = g->s;
    const int C = g->C;
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd, row0 = (size_t)g->tpr * Ns;
    int rc = 0;
    dt_models_event(m, 0, DT_BLOCK_BEFORE_FORWARD);
    if (g->tp == 1) {
        be->embedding_fwd(be, s->esum, s->tokens, P(m, g->word), P(m, g->pos), B, T, C);
    } else {
        float *part = g->sp ? g->gat : s->esum;
        be->embedding_vp_fwd(be, part, s->tokens, P(m, g->word),
                             g->tpr == 0 ? P(m, g->pos) : NULL, B, T, C, g->v0, g->Vl);
        rc = g->sp ? sp_reduce_scatter(g, part, s->esum, N, "the embeddings", err)
                   : tp_allreduce(g, s->esum, N * C, DT_SUM, "the embeddings", err);
        if (rc)
            return rc;
    }
    /* + the token types of this rank's rows (as one sequence of Ns: no positions added) */
    be->embedding_fwd(be, g->dC, s->types + (g->sp ? row0 : 0), P(m, g->type), NULL, 1, (int)Ns,
                      C);
    be->accumulate(be, s->esum, g->dC, Ns * C);
    be->layernorm_fwd(be, s->encoded, s->emean, s->erstd, s->esum, P(m, g->elnw), P(m, g->elnb),
                      (int)Ns, C, LN_EPS);
    dt_models_event(m, 0, DT_BLOCK_AFTER_FORWARD);
    return 0;
}

/* Backward of the embeddings from g->dres (Ns,C), the gradient of s->encoded; reports "embed"
 * (its gradients are final: this is its last window). */
static int embed_bwd(dt_model *m, bert *g, int B, int T, dt_grad_ready_fn ready, void *ctx,
                     dt_err *err)
{
    dt_backend *be = m->be;
    bert_slot *s = g->s;
    const int C = g->C;
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd, row0 = (size_t)g->tpr * Ns;
    int rc;
    dt_models_event(m, 0, DT_BLOCK_BEFORE_BACKWARD);
    if (g->sp)
        be->memset_zero(be, g->dln, (2 + TYPES) * (size_t)C * sizeof(float));
    be->memset_zero(be, g->dA, Ns * C * sizeof(float));
    be->layernorm_bwd(be, g->dA, ln_grad(m, g, g->elnw, 0), ln_grad(m, g, g->elnb, (size_t)C),
                      g->dres, s->esum, P(m, g->elnw), s->emean, s->erstd, (int)Ns, C);
    be->embedding_bwd(be, g->sp ? g->dln + 2 * (size_t)C : G(m, g->type), NULL, g->dA,
                      s->types + (g->sp ? row0 : 0), 1, (int)Ns, C);
    if (g->sp) {
        const int t[3] = {g->elnw, g->elnb, g->type};
        if ((rc = sp_sum_grads(m, g, t, 3, "the embeddings' LayerNorm and token-type gradients",
                               err)) ||
            (rc = sp_allgather(g, g->dA, g->gat, N, "the embeddings' gradient", err)))
            return rc;
    }
    if (g->tp == 1)
        be->embedding_bwd(be, G(m, g->word), G(m, g->pos), g->dA, s->tokens, B, T, C);
    else
        be->embedding_vp_bwd(be, G(m, g->word), G(m, g->pos), g->sp ? g->gat : g->dA, s->tokens,
                             B, T, C, g->v0, g->Vl);
    dt_models_ready(m, m->blocks[0].first_tensor, m->blocks[0].last_tensor, ready, ctx);
    dt_models_event(m, 0, DT_BLOCK_AFTER_BACKWARD);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* the heads */

/* The MLM (and NSP) heads on x (N,C), all rows (the last layer's output, all-gathered under
 * SP): the transform and the pooler in the "cls" window, the decoder in the word embeddings'
 * (embed's second window, or "head" on a pipelined last stage), then the cross-entropies. A
 * training forward replaces the logits with softmax - onehot (unscaled), as gpt's head. */
static int head_fwd(dt_model *m, bert *g, const float *x, int B, int T, bool training,
                    dt_err *err)
{
    dt_backend *be = m->be;
    bert_slot *s = g->s;
    const int C = g->C, Vl = g->Vl, N = B * T;
    int rc;
    dt_models_event(m, g->bl_cls, DT_BLOCK_BEFORE_FORWARD);
    be->matmul_fwd(be, s->t, x, P(m, g->tw), P(m, g->tb), N, C, C);
    be->gelu_erf_fwd(be, s->tg, s->t, (size_t)N * C);
    be->layernorm_fwd(be, s->u, s->um, s->ur, s->tg, P(m, g->tlnw), P(m, g->tlnb), N, C, LN_EPS);
    be->memcpy_d2d(be, g->vb, P(m, g->dbias), (size_t)Vl * sizeof(float));
    if (g->nsp) { /* pooled (B,C) = tanh(x[b, 0] @ Wp^T + bp); logits (B,2) */
        for (int b = 0; b < B; b++)
            be->memcpy_d2d(be, s->cls_in + (size_t)b * C, x + (size_t)b * T * C,
                           (size_t)C * sizeof(float));
        be->matmul_fwd(be, s->pool_pre, s->cls_in, P(m, g->pw), P(m, g->pb), B, C, C);
        be->tanh_fwd(be, s->pooled, s->pool_pre, (size_t)B * C);
        be->matmul_fwd(be, s->nsp_logits, s->pooled, P(m, g->sw), P(m, g->sb), B, C, TYPES);
        be->xent_fwd_bwd(be, s->nsp_losses, training ? s->nsp_logits : NULL, s->nsp_logits,
                         s->labels, B, TYPES, 1.0f, NULL);
    }
    dt_models_event(m, g->bl_cls, DT_BLOCK_AFTER_FORWARD);
    dt_models_event(m, g->bl_head, DT_BLOCK_BEFORE_FORWARD);
    be->matmul_fwd(be, s->logits, s->u, P(m, g->word), g->vb, N, C, Vl);
    dt_models_event(m, g->bl_head, DT_BLOCK_AFTER_FORWARD);
    float *dlogits = training ? s->logits : NULL;
    if (g->tp == 1) {
        be->xent_fwd_bwd(be, s->losses, dlogits, s->logits, s->targets, N, Vl, 1.0f, NULL);
        return 0;
    }
    be->xent_vp_max(be, g->xmax, s->logits, N, Vl, g->nv);
    if ((rc = tp_allreduce(g, g->xmax, (size_t)N, DT_MAX, "the logits' row maxima", err)))
        return rc;
    be->xent_vp_sums(be, g->xsums, s->logits, g->xmax, s->targets, N, Vl, g->nv, g->v0);
    if ((rc = tp_allreduce(g, g->xsums, 2 * (size_t)N, DT_SUM,
                           "the softmax sums and target logits", err)))
        return rc;
    be->xent_vp_finish(be, s->losses, dlogits, s->logits, g->xmax, g->xsums, s->targets, N, Vl,
                       g->nv, g->v0, 1.0f);
    return 0;
}

/* Backward of the heads: x (N,C) as head_fwd had it; the gradient of x, this rank's rows, goes
 * to g->dres (set, not added). */
static int head_bwd(dt_model *m, bert *g, const float *x, float dloss_scale,
                    dt_grad_ready_fn ready, void *ctx, dt_err *err)
{
    dt_backend *be = m->be;
    bert_slot *s = g->s;
    const int B = s->B, T = s->T, C = g->C, Vl = g->Vl, N = B * T;
    const size_t NC = (size_t)N * C, fNC = NC * sizeof(float);
    const float dl = s->valid > 0 ? dloss_scale / (float)s->valid : 0.0f;
    int rc;
    /* the decoder: dwte += dlogits^T @ (dl u) (u is not read again), dC = dlogits @ wte;
     * the bias: its column sums into g->vb, scaled by dl and added in the cls window */
    be->scale(be, s->u, NC, dl);
    be->memset_zero(be, g->dC, fNC);
    be->memset_zero(be, g->vb, (size_t)Vl * sizeof(float));
    dt_models_event(m, g->bl_head, DT_BLOCK_BEFORE_BACKWARD);
    be->matmul_bwd(be, g->dC, G(m, g->word), g->vb, s->logits, s->u, P(m, g->word), N, C, Vl);
    if (!g->first) /* the last stage's copy of the word embeddings: final now */
        dt_models_ready(m, g->word, g->word, ready, ctx);
    dt_models_event(m, g->bl_head, DT_BLOCK_AFTER_BACKWARD);
    if ((rc = tp_allreduce(g, g->dC, NC, DT_SUM, "the gradient of the decoder's input", err)))
        return rc;
    be->scale(be, g->dC, NC, dl);
    /* the transform, replicated on all N rows: dhA = d tg, dhB = d t, then dX into dhA */
    dt_models_event(m, g->bl_cls, DT_BLOCK_BEFORE_BACKWARD);
    be->scale(be, g->vb, (size_t)Vl, dl);
    be->accumulate(be, G(m, g->dbias), g->vb, (size_t)Vl);
    be->memset_zero(be, g->dhA, fNC);
    be->layernorm_bwd(be, g->dhA, G(m, g->tlnw), G(m, g->tlnb), g->dC, s->tg, P(m, g->tlnw), s->um,
                      s->ur, N, C);
    be->memset_zero(be, g->dhB, fNC);
    be->gelu_erf_bwd(be, g->dhB, s->t, g->dhA, NC);
    float *dX = g->sp ? g->dhA : g->dres; /* all rows; without SP dres holds them all */
    be->memset_zero(be, dX, fNC);
    be->matmul_bwd(be, dX, G(m, g->tw), G(m, g->tb), g->dhB, x, P(m, g->tw), N, C, C);
    if (g->nsp) { /* (softmax - onehot) / B * scale through the pooler to the first tokens */
        const size_t BC = (size_t)B * C, fBC = BC * sizeof(float);
        be->scale(be, s->nsp_logits, (size_t)B * TYPES, dloss_scale / (float)B);
        be->memset_zero(be, g->dpool, fBC);
        be->matmul_bwd(be, g->dpool, G(m, g->sw), G(m, g->sb), s->nsp_logits, s->pooled,
                       P(m, g->sw), B, C, TYPES);
        be->memset_zero(be, g->dpre, fBC);
        be->tanh_bwd(be, g->dpre, s->pooled, g->dpool, BC);
        be->memset_zero(be, g->dcls, fBC);
        be->matmul_bwd(be, g->dcls, G(m, g->pw), G(m, g->pb), g->dpre, s->cls_in, P(m, g->pw), B,
                       C, C);
        for (int b = 0; b < B; b++)
            be->accumulate(be, dX + (size_t)b * T * C, g->dcls + (size_t)b * C, (size_t)C);
    }
    dt_models_ready(m, m->blocks[g->bl_cls].first_tensor, m->blocks[g->bl_cls].last_tensor, ready,
                    ctx);
    dt_models_event(m, g->bl_cls, DT_BLOCK_AFTER_BACKWARD);
    if (g->sp) /* this rank's rows */
        be->memcpy_d2d(be, g->dres, dX + (size_t)g->tpr * (NC / (size_t)g->tp),
                       fNC / (size_t)g->tp);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* forward and backward */

/* Checks batch against the model and uploads what this stage reads into slot s; *valid gets
 * the masked positions (targets >= 0). */
static int load_batch(dt_model *m, bert *g, const dt_batch *batch, const float *in, int *valid,
                      dt_err *err)
{
    dt_backend *be = m->be;
    bert_slot *s = g->s;
    const int B = batch->B, T = batch->T, V = g->V;
    if (B <= 0 || B > g->Bmax || T <= 0 || T > g->Tmax || (g->first && !batch->tokens) ||
        (g->last && !batch->targets) || (g->last && g->nsp && !batch->labels) ||
        (!g->first && !in) || T % g->sd)
        return dt_err_set(err, -EINVAL,
                          "bert forward: batch of %dx%d tokens (at most %dx%d, with %s%s%s "
                          "expected%s)",
                          B, T, g->Bmax, g->Tmax,
                          g->first ? "tokens" : "the previous stage's output",
                          g->last ? " and targets" : "",
                          g->last && g->nsp ? " and next-sentence labels (model.nsp)" : "",
                          g->sp ? "; sequence parallelism: T a multiple of the tensor size" : "");
    const size_t N = (size_t)B * T;
    *valid = 0;
    for (size_t i = 0; i < N; i++) {
        if (g->first && (batch->tokens[i] < 0 || batch->tokens[i] >= V))
            return dt_err_set(err, -EINVAL, "bert forward: token %d at position %zu is outside "
                                            "the vocabulary (0..%d)",
                              batch->tokens[i], i, V - 1);
        if (g->first && batch->types && (batch->types[i] < 0 || batch->types[i] >= TYPES))
            return dt_err_set(err, -EINVAL, "bert forward: token type %d at position %zu (0 or "
                                            "1)",
                              batch->types[i], i);
        if (g->last && batch->targets[i] >= V)
            return dt_err_set(err, -EINVAL, "bert forward: target %d at position %zu is outside "
                                            "the vocabulary (0..%d)",
                              batch->targets[i], i, V - 1);
        if (g->last)
            *valid += batch->targets[i] >= 0;
    }
    for (int b = 0; g->last && g->nsp && b < B; b++)
        if (batch->labels[b] < 0 || batch->labels[b] >= TYPES)
            return dt_err_set(err, -EINVAL, "bert forward: next-sentence label %d of sample %d "
                                            "(0: the second segment follows, 1: random)",
                              batch->labels[b], b);
    if (g->first) {
        be->memcpy_h2d(be, s->tokens, batch->tokens, N * sizeof(int32_t));
        if (batch->types)
            be->memcpy_h2d(be, s->types, batch->types, N * sizeof(int32_t));
        else
            be->memset_zero(be, s->types, N * sizeof(int32_t));
    }
    s->has_mask = batch->mask != NULL;
    if (batch->mask)
        be->memcpy_h2d(be, s->mask, batch->mask, N * sizeof(int32_t));
    if (g->last) {
        be->memcpy_h2d(be, s->targets, batch->targets, N * sizeof(int32_t));
        if (g->nsp)
            be->memcpy_h2d(be, s->labels, batch->labels, (size_t)B * sizeof(int32_t));
    }
    return 0;
}

static int bert_stage_forward(dt_model *m, int slot, const dt_batch *batch, const float *in,
                              bool training, float **out, float *loss, dt_err *err)
{
    bert *g = m->impl;
    if (slot < 0 || slot >= g->nslots)
        return dt_err_set(err, -EINVAL, "bert forward: slot %d of %d", slot, g->nslots);
    bert_slot *s = g->s = &g->slots[slot];
    s->can_backward = false;
    int valid = 0, rc;
    if ((rc = load_batch(m, g, batch, in, &valid, err)))
        return rc;
    const int B = batch->B, T = batch->T;
    const size_t N = (size_t)B * T;
    if (g->first && (rc = embed_fwd(m, g, B, T, err)))
        return rc;
    const float *res = g->first ? s->encoded : in;
    for (int l = g->lo; l < g->hi; l++) {
        bert_acts a;
        acts_of(g, l, &a);
        dt_models_event(m, g->bl_layer0 + l - g->lo, DT_BLOCK_BEFORE_FORWARD);
        if ((rc = layer_fwd(m, g, l, res, &a, B, T, false, err)))
            return rc;
        dt_models_event(m, g->bl_layer0 + l - g->lo, DT_BLOCK_AFTER_FORWARD);
        res = a.out;
    }
    *loss = 0;
    if (out)
        *out = g->last ? NULL : (float *)res;
    if (g->last) {
        if (g->sp && (rc = sp_allgather(g, res, g->gat, N, "the encoder's output", err)))
            return rc;
        if ((rc = head_fwd(m, g, g->sp ? g->gat : res, B, T, training, err)))
            return rc;
        *loss = dt_models_mean_loss(m, s->losses, (int)N, valid);
        if (g->nsp)
            *loss += dt_models_mean_loss(m, s->nsp_losses, B, B);
    }
    m->last_correct = 0;
    s->in = in;
    s->B = B;
    s->T = T;
    s->valid = valid;
    s->can_backward = training;
    return 0;
}

static int bert_stage_backward(dt_model *m, int slot, float dloss_scale, const float *dout,
                               float *din, dt_grad_ready_fn ready, void *ctx, dt_err *err)
{
    bert *g = m->impl;
    dt_backend *be = m->be;
    if (slot < 0 || slot >= g->nslots)
        return dt_err_set(err, -EINVAL, "bert backward: slot %d of %d", slot, g->nslots);
    bert_slot *s = &g->slots[slot];
    if (!s->can_backward)
        return dt_err_set(err, -EINVAL, "bert backward: no training forward to differentiate in "
                                        "slot %d (call forward with training = true before)",
                          slot);
    if (!g->last && !dout)
        return dt_err_set(err, -EINVAL, "bert backward: stage %d of %d needs the next stage's "
                                        "gradient",
                          m->cfg.pp_rank, m->cfg.pp_size);
    s->can_backward = false;
    g->s = s;
    const int B = s->B, T = s->T, C = g->C;
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd;
    const size_t NCs = (size_t)g->Bmax * g->Tmax / (size_t)g->sd * C; /* out's layer stride */
    const float *in0 = g->first ? s->encoded : s->in;
    int rc;
    if (g->last) {
        const float *res_last = g->hi > g->lo ? s->out + (size_t)(g->Ls - 1) * NCs : in0;
        if (g->sp && (rc = sp_allgather(g, res_last, g->gat, N, "the encoder's output (again)",
                                        err)))
            return rc;
        if ((rc = head_bwd(m, g, g->sp ? g->gat : res_last, dloss_scale, ready, ctx, err)))
            return rc;
    } else {
        be->memcpy_d2d(be, g->dres, dout, Ns * C * sizeof(float));
    }
    for (int l = g->hi - 1; l >= g->lo; l--) {
        const bert_layer *w = &g->layers[l];
        const float *res = l == g->lo ? in0 : s->out + (size_t)(l - 1 - g->lo) * NCs;
        bert_acts a;
        acts_of(g, l, &a);
        dt_models_event(m, g->bl_layer0 + l - g->lo, DT_BLOCK_BEFORE_BACKWARD);
        if (g->recompute == DT_RECOMPUTE_BLOCK && /* the intermediates, from the layer's input */
            (rc = layer_fwd(m, g, l, res, &a, B, T, true, err)))
            return rc;
        if ((rc = layer_bwd(m, g, l, res, &a, B, T, err)))
            return rc;
        dt_models_ready(m, w->qw, w->olnb, ready, ctx);
        dt_models_event(m, g->bl_layer0 + l - g->lo, DT_BLOCK_AFTER_BACKWARD);
    }
    if (!g->first) {
        if (din)
            be->memcpy_d2d(be, din, g->dres, Ns * C * sizeof(float));
        return 0;
    }
    return embed_bwd(m, g, B, T, ready, ctx, err);
}

static int bert_forward(dt_model *m, const dt_batch *batch, bool training, float *loss,
                        dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "bert forward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return bert_stage_forward(m, 0, batch, NULL, training, NULL, loss, err);
}

static int bert_backward(dt_model *m, float dloss_scale, dt_grad_ready_fn ready, void *ctx,
                         dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "bert backward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return bert_stage_backward(m, 0, dloss_scale, NULL, NULL, ready, ctx, err);
}

/* The slot's buffers, for allocation and freeing: {field, floats (ints for the int32 ones),
 * shared by the slots (recomputed: slot 0's serves every slot)}. */
typedef struct slot_buf {
    void **p;
    size_t n;
    bool shared, ints;
} slot_buf;

static int slot_bufs(const bert *g, bert_slot *sl, slot_buf *o)
{
    const size_t NR = (size_t)g->Bmax * g->Tmax, NRs = NR / (size_t)g->sd, C = (size_t)g->C;
    const size_t NCs = NRs * C, NC = NR * C, NCl = NR * (size_t)g->Cl, Bm = (size_t)g->Bmax;
    const size_t NATT = Bm * (size_t)g->NHl * g->Tmax * g->Tmax;
    const size_t Lk = (size_t)g->Lk, La = (size_t)g->La, fst = g->first, lst = g->last;
    const size_t nsp = g->last && g->nsp;
    const bool rb = g->recompute == DT_RECOMPUTE_BLOCK, ra = g->La < g->Ls || rb;
    const slot_buf b[] = {
        {(void **)&sl->tokens, fst * NR, false, true},  {(void **)&sl->types, fst * NR, false, true},
        {(void **)&sl->mask, NR, false, true},          {(void **)&sl->targets, lst * NR, false, true},
        {(void **)&sl->labels, nsp * Bm, false, true},  {(void **)&sl->esum, fst * NCs, false, false},
        {(void **)&sl->emean, fst * NRs, false, false}, {(void **)&sl->erstd, fst * NRs, false, false},
        {(void **)&sl->encoded, fst * NCs, false, false},
        {(void **)&sl->qkv, 3 * Lk * NCl, rb, false},   {(void **)&sl->atty, Lk * NCl, rb, false},
        {(void **)&sl->att, La * NATT, ra, false},      {(void **)&sl->r1, Lk * NCs, rb, false},
        {(void **)&sl->h1, Lk * NCs, rb, false},        {(void **)&sl->h1m, Lk * NRs, rb, false},
        {(void **)&sl->h1r, Lk * NRs, rb, false},       {(void **)&sl->f, 4 * Lk * NCl, rb, false},
        {(void **)&sl->fg, 4 * Lk * NCl, rb, false},    {(void **)&sl->r2, Lk * NCs, rb, false},
        {(void **)&sl->h2m, Lk * NRs, rb, false},       {(void **)&sl->h2r, Lk * NRs, rb, false},
        {(void **)&sl->out, (size_t)g->Ls * NCs, false, false},
        {(void **)&sl->t, lst * NC, false, false},      {(void **)&sl->tg, lst * NC, false, false},
        {(void **)&sl->u, lst * NC, false, false},      {(void **)&sl->um, lst * NR, false, false},
        {(void **)&sl->ur, lst * NR, false, false},
        {(void **)&sl->logits, lst * NR * (size_t)g->Vl, false, false},
        {(void **)&sl->losses, lst * NR, false, false},
        {(void **)&sl->cls_in, nsp * Bm * C, false, false},
        {(void **)&sl->pool_pre, nsp * Bm * C, false, false},
        {(void **)&sl->pooled, nsp * Bm * C, false, false},
        {(void **)&sl->nsp_logits, nsp * Bm * TYPES, false, false},
        {(void **)&sl->nsp_losses, nsp * Bm, false, false},
    };
    memcpy(o, b, sizeof b);
    return (int)DT_ARRAY_LEN(b);
}

#define SLOT_BUFS_MAX 40

static void bert_free(dt_model *m)
{
    bert *g = m->impl;
    if (!g)
        return;
    dt_backend *be = m->be;
    slot_buf b[SLOT_BUFS_MAX];
    for (int k = 0; k < g->nslots && g->slots; k++) {
        int n = slot_bufs(g, &g->slots[k], b);
        for (int i = 0; i < n; i++)
            if (!(b[i].shared && k > 0)) /* the shared ones are slot 0's */
                be->free(be, *b[i].p);
    }
    void *bufs[] = {g->dres, g->dA,  g->dC,   g->dqkv,  g->d4a,  g->d4b, g->datt,
                    g->dhA,  g->dhB, g->vb,   g->dpool, g->dpre, g->dcls, g->xmax,
                    g->xsums, g->gat, g->dCs, g->dln};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(be, bufs[i]);
    free(g->slots);
    free(g->layers);
    free(g);
    m->impl = NULL;
}

static const dt_model_ops bert_ops = {bert_forward, bert_backward, bert_free};
static const dt_model_stage_ops bert_stage_ops = {bert_stage_forward, bert_stage_backward};

/* ------------------------------------------------------------------------------------------ */
/* creation */

/* How a tensor is split under tensor parallelism (model.h's dt_tensor_info). */
typedef enum bert_split {
    SPLIT_NONE = 0, /* replicated */
    SPLIT_ROWS,     /* column-parallel by output rows (query, key, value, intermediate) */
    SPLIT_COLS,     /* row-parallel (the dense layers after attention and the MLP) */
    SPLIT_VOCAB,    /* vocabulary-parallel: dim 0 of the vocabulary padded to Vp, Vl rows here */
} bert_split;

/* Declares tensor name of whole shape (d0) (d1 == 0) or (d0,d1), of which this rank holds the
 * slice `split` says; its index goes to *dst. */
static int add_tensor(dt_model *m, const bert *g, int *dst, bool no_decay, bert_split split,
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

/* An encoder layer's tensors, in table order (whole shapes in units of C; d1 0: a vector). */
static const struct {
    size_t at; /* offsetof(bert_layer, ...) */
    bert_split split;
    int d0, d1;
    const char *name;
} layer_tensors[] = {
    {offsetof(bert_layer, qw), SPLIT_ROWS, 1, 1, "attention.self.query.weight"},
    {offsetof(bert_layer, kw), SPLIT_ROWS, 1, 1, "attention.self.key.weight"},
    {offsetof(bert_layer, vw), SPLIT_ROWS, 1, 1, "attention.self.value.weight"},
    {offsetof(bert_layer, qb), SPLIT_ROWS, 1, 0, "attention.self.query.bias"},
    {offsetof(bert_layer, kb), SPLIT_ROWS, 1, 0, "attention.self.key.bias"},
    {offsetof(bert_layer, vb), SPLIT_ROWS, 1, 0, "attention.self.value.bias"},
    {offsetof(bert_layer, aow), SPLIT_COLS, 1, 1, "attention.output.dense.weight"},
    {offsetof(bert_layer, aob), SPLIT_NONE, 1, 0, "attention.output.dense.bias"},
    {offsetof(bert_layer, alnw), SPLIT_NONE, 1, 0, "attention.output.LayerNorm.weight"},
    {offsetof(bert_layer, alnb), SPLIT_NONE, 1, 0, "attention.output.LayerNorm.bias"},
    {offsetof(bert_layer, iw), SPLIT_ROWS, 4, 1, "intermediate.dense.weight"},
    {offsetof(bert_layer, ib), SPLIT_ROWS, 4, 0, "intermediate.dense.bias"},
    {offsetof(bert_layer, ow), SPLIT_COLS, 1, 4, "output.dense.weight"},
    {offsetof(bert_layer, ob), SPLIT_NONE, 1, 0, "output.dense.bias"},
    {offsetof(bert_layer, olnw), SPLIT_NONE, 1, 0, "output.LayerNorm.weight"},
    {offsetof(bert_layer, olnb), SPLIT_NONE, 1, 0, "output.LayerNorm.bias"},
};

/* Draws whole tensor `name` (n elements; a matrix when matrix: normal(0, 0.02); else 1 for a
 * LayerNorm weight, 0 for the rest) from r into whole, and keeps this rank's slice when the
 * model holds the tensor. */
static void init_one(dt_model *m, const bert *g, dt_rng *r, float *whole, float *host,
                     const char *name, size_t n, bool matrix)
{
    if (matrix)
        dt_rng_fill_normal(r, whole, n, 0.0f, 0.02f);
    else
        for (size_t k = 0; k < n; k++)
            whole[k] = strstr(name, "LayerNorm.weight") ? 1.0f : 0.0f;
    int i = dt_model_find_tensor(m, name);
    if (i >= 0)
        dt_tensor_tp_copy(&m->tensors[i], g->tpr, whole, host + m->tensors[i].offset, false);
}

/* Every whole tensor of the whole model, in the header's order, from one stream seeded with
 * cfg.seed; each rank keeps what it holds, so every layout starts from one process's bits. */
static int init_params(dt_model *m, const bert *g, dt_err *err)
{
    const size_t C = (size_t)g->C, V = (size_t)g->V;
    size_t max_whole = DT_MAX(DT_MAX(V, (size_t)g->maxT), 4 * C) * C;
    float *host = calloc(m->num_params, sizeof(float));
    float *whole = malloc(DT_MAX(max_whole, (size_t)1) * sizeof(float));
    if (!host || !whole) {
        free(host);
        free(whole);
        return dt_err_set(err, -ENOMEM, "bert: out of memory for the initial parameters");
    }
    dt_rng r;
    dt_rng_seed(&r, m->cfg.seed);
    char nm[DT_TENSOR_NAME_MAX];
    init_one(m, g, &r, whole, host, "bert.embeddings.word_embeddings.weight", V * C, true);
    init_one(m, g, &r, whole, host, "bert.embeddings.position_embeddings.weight",
             (size_t)g->maxT * C, true);
    init_one(m, g, &r, whole, host, "bert.embeddings.token_type_embeddings.weight", TYPES * C,
             true);
    init_one(m, g, &r, whole, host, "bert.embeddings.LayerNorm.weight", C, false);
    init_one(m, g, &r, whole, host, "bert.embeddings.LayerNorm.bias", C, false);
    for (int l = 0; l < g->L; l++)
        for (size_t i = 0; i < DT_ARRAY_LEN(layer_tensors); i++) {
            snprintf(nm, sizeof nm, "bert.encoder.layer.%d.%s", l, layer_tensors[i].name);
            size_t d1 = (size_t)layer_tensors[i].d1;
            init_one(m, g, &r, whole, host, nm,
                     (size_t)layer_tensors[i].d0 * C * (d1 ? d1 * C : 1), d1 > 0);
        }
    init_one(m, g, &r, whole, host, "cls.predictions.bias", V, false);
    init_one(m, g, &r, whole, host, "cls.predictions.transform.dense.weight", C * C, true);
    init_one(m, g, &r, whole, host, "cls.predictions.transform.dense.bias", C, false);
    init_one(m, g, &r, whole, host, "cls.predictions.transform.LayerNorm.weight", C, false);
    init_one(m, g, &r, whole, host, "cls.predictions.transform.LayerNorm.bias", C, false);
    if (g->nsp) {
        init_one(m, g, &r, whole, host, "bert.pooler.dense.weight", C * C, true);
        init_one(m, g, &r, whole, host, "bert.pooler.dense.bias", C, false);
        init_one(m, g, &r, whole, host, "cls.seq_relationship.weight", TYPES * C, true);
        init_one(m, g, &r, whole, host, "cls.seq_relationship.bias", TYPES, false);
    }
    dt_models_upload(m, host);
    free(host);
    free(whole);
    return 0;
}

/* The tables (model.h): tensors in buffer order and the blocks over them. */
static int build_tables(dt_model *m, bert *g, dt_err *err)
{
    const int C = g->C;
    char nm[DT_TENSOR_NAME_MAX];
    int rc;
    struct {
        int *dst;
        bool no_decay;
        bert_split split;
        int64_t d0, d1;
        const char *name;
    } embed[] = {
        {&g->word, false, SPLIT_VOCAB, g->V, C, "bert.embeddings.word_embeddings.weight"},
        {&g->pos, false, SPLIT_NONE, g->maxT, C, "bert.embeddings.position_embeddings.weight"},
        {&g->type, false, SPLIT_NONE, TYPES, C, "bert.embeddings.token_type_embeddings.weight"},
        {&g->elnw, true, SPLIT_NONE, C, 0, "bert.embeddings.LayerNorm.weight"},
        {&g->elnb, true, SPLIT_NONE, C, 0, "bert.embeddings.LayerNorm.bias"},
    }, cls[] = {
        {&g->tw, false, SPLIT_NONE, C, C, "cls.predictions.transform.dense.weight"},
        {&g->tb, true, SPLIT_NONE, C, 0, "cls.predictions.transform.dense.bias"},
        {&g->tlnw, true, SPLIT_NONE, C, 0, "cls.predictions.transform.LayerNorm.weight"},
        {&g->tlnb, true, SPLIT_NONE, C, 0, "cls.predictions.transform.LayerNorm.bias"},
        {&g->pw, false, SPLIT_NONE, C, C, "bert.pooler.dense.weight"},
        {&g->pb, true, SPLIT_NONE, C, 0, "bert.pooler.dense.bias"},
        {&g->sw, false, SPLIT_NONE, TYPES, C, "cls.seq_relationship.weight"},
        {&g->sb, true, SPLIT_NONE, TYPES, 0, "cls.seq_relationship.bias"},
    };
#define ADD(e) add_tensor(m, g, (e).dst, (e).no_decay, (e).split, (e).d0, (e).d1, (e).name, err)
    for (size_t i = 0; g->first && i < DT_ARRAY_LEN(embed); i++)
        if ((rc = ADD(embed[i])))
            return rc;
    for (int l = g->lo; l < g->hi; l++)
        for (size_t i = 0; i < DT_ARRAY_LEN(layer_tensors); i++) {
            snprintf(nm, sizeof nm, "bert.encoder.layer.%d.%s", l, layer_tensors[i].name);
            int *dst = (int *)((char *)&g->layers[l] + layer_tensors[i].at);
            if ((rc = add_tensor(m, g, dst, layer_tensors[i].d1 == 0, layer_tensors[i].split,
                                 (int64_t)layer_tensors[i].d0 * C,
                                 (int64_t)layer_tensors[i].d1 * C, nm, err)))
                return rc;
        }
    for (size_t i = 0; g->last && i < (g->nsp ? DT_ARRAY_LEN(cls) : 4); i++)
        if ((rc = ADD(cls[i])))
            return rc;
    if (g->last &&
        (rc = add_tensor(m, g, &g->dbias, true, SPLIT_VOCAB, g->V, 0, "cls.predictions.bias",
                         err)))
        return rc;
    if (g->last && !g->first && (rc = ADD(embed[0]))) /* the last stage's copy of the tied word
                                                       * embeddings */
        return rc;
#undef ADD
    int nb = 0;
    if (g->first &&
        (rc = dt_models_add_block(m, g->word, g->elnb, g->last ? 2 : 1, err, "embed")) < 0)
        return rc;
    nb += g->first;
    g->bl_layer0 = nb;
    for (int l = g->lo; l < g->hi; l++, nb++)
        if ((rc = dt_models_add_block(m, g->layers[l].qw, g->layers[l].olnb, 1, err, "layer.%d",
                                      l)) < 0)
            return rc;
    g->bl_cls = nb;
    if (g->last && (rc = dt_models_add_block(m, g->tw, g->dbias, 1, err, "cls")) < 0)
        return rc;
    nb += g->last;
    g->bl_head = g->first ? 0 : nb;
    if (g->last && !g->first &&
        (rc = dt_models_add_block(m, g->word, g->word, 1, err, "head")) < 0)
        return rc;
    return 0;
}

int dt_bert_create(dt_model *m, dt_comm *comm, dt_err *err)
{
    const dt_model_config *cfg = &m->cfg;
    bert *g = calloc(1, sizeof *g);
    if (!g)
        return dt_err_set(err, -ENOMEM, "out of memory");
    m->impl = g;
    m->ops = &bert_ops;
    g->L = cfg->n_layer;
    g->NH = cfg->n_head;
    g->C = cfg->n_embd;
    g->V = cfg->shape.vocab_size;
    g->maxT = cfg->block_size;
    g->Bmax = cfg->max_batch;
    g->Tmax = cfg->shape.seq_len;
    g->nsp = cfg->nsp;
    g->recompute = cfg->recompute;
    g->tp = cfg->tp_size > 1 ? cfg->tp_size : 1;
    g->tpr = g->tp > 1 ? cfg->tp_rank : 0;
    g->comm = g->tp > 1 ? comm : NULL;
    g->Cl = g->C / g->tp;
    g->NHl = g->NH / g->tp;
    g->Vl = (g->V + g->tp - 1) / g->tp;
    g->v0 = g->tpr * g->Vl;
    g->nv = DT_MAX(0, DT_MIN(g->Vl, g->V - g->v0));
    g->sp = cfg->sequence_parallel;
    if (g->sp && g->tp == 1)
        return dt_err_set(err, -EINVAL, "bert: sequence parallelism needs tensor parallelism "
                                        "(tp_size %d; parallel.tensor > 1 with "
                                        "parallel.sequence_parallel = true)",
                          cfg->tp_size);
    if (g->sp && g->Tmax % g->tp)
        return dt_err_set(err, -EINVAL, "bert: sequence parallelism splits the %d tokens of a "
                                        "sequence over the %d tensor ranks: make data.seq_len a "
                                        "multiple of parallel.tensor, or set "
                                        "parallel.sequence_parallel = false",
                          g->Tmax, g->tp);
    g->sd = g->sp ? g->tp : 1;
    const int L = g->L;
    g->lo = 0;
    g->hi = L;
    if (cfg->pp_size > 1) {
        if (cfg->pp_rank < 0 || cfg->pp_rank >= cfg->pp_size || cfg->pp_first < 0 ||
            cfg->pp_count < 1 || cfg->pp_first + cfg->pp_count > L ||
            (cfg->pp_rank == 0) != (cfg->pp_first == 0) ||
            (cfg->pp_rank == cfg->pp_size - 1) != (cfg->pp_first + cfg->pp_count == L))
            return dt_err_set(err, -EINVAL, "bert: pipeline stage %d of %d with layers %d..%d "
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
    if (!(g->layers = calloc((size_t)L, sizeof *g->layers)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    int rc;
    if ((rc = build_tables(m, g, err)) || (rc = dt_models_alloc(m, err)))
        return rc;

    /* FLOPs per sample (forward x 3): the GEMMs (24C^2 per token per layer, this rank's 1/TP;
     * the transform 2C^2 and the decoder 2C*Vl per token on the last stage) plus the
     * bidirectional attention (4*T*C per token per layer, 1/TP); the pooler's O(C^2) per sample
     * and the O(C) work are left out, as for gpt. */
    const double T = g->Tmax, C = g->C, tp = g->tp, Ls = g->Ls;
    double fwd = T * (Ls * (24.0 * C * C + 4.0 * T * C) / tp +
                      (g->last ? 2.0 * C * C + 2.0 * C * (double)g->Vl : 0.0));
    m->flops_per_sample = 3.0 * fwd;

    /* activations, per slot (model.h): what backward recomputes is one copy for all slots */
    g->nslots = cfg->pp_size > 1 && cfg->pp_slots > 1 ? cfg->pp_slots : 1;
    if (!(g->slots = calloc((size_t)g->nslots, sizeof *g->slots)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    size_t before = m->activation_bytes;
    slot_buf b[SLOT_BUFS_MAX];
    for (int k = 0; k < g->nslots; k++) {
        bert_slot *sl = &g->slots[k];
        int n = slot_bufs(g, sl, b);
        size_t shared_bytes = 0;
        for (int i = 0; i < n; i++) {
            if (b[i].shared && k > 0) { /* slot 0's: the same field of g->slots[0] */
                size_t field = (size_t)((char *)b[i].p - (char *)sl);
                *b[i].p = *(void **)((char *)&g->slots[0] + field);
                continue;
            }
            if (!b[i].n)
                continue;
            rc = b[i].ints ? dt_models_ialloc(m, (int32_t **)b[i].p, b[i].n, err)
                           : dt_models_falloc(m, (float **)b[i].p, b[i].n, err);
            if (rc)
                return rc;
            shared_bytes += b[i].shared ? b[i].n * sizeof(float) : 0;
        }
        if (k == 0)
            m->pp_slot_bytes = m->activation_bytes - before - shared_bytes;
    }
    const size_t NR = (size_t)g->Bmax * g->Tmax, NRs = NR / (size_t)g->sd;
    const size_t NC = NR * (size_t)g->C, NCs = NRs * (size_t)g->C, NCl = NR * (size_t)g->Cl;
    const size_t NATT = (size_t)g->Bmax * g->NHl * g->Tmax * g->Tmax, BC = (size_t)g->Bmax * g->C;
    const size_t lst = g->last, nsp = g->last && g->nsp;
    struct {
        float **p;
        size_t n;
    } scratch[] = {
        {&g->dres, NCs},
        {&g->dA, NCs},
        {&g->dC, NC},
        {&g->dqkv, 3 * NCl},
        {&g->d4a, 4 * NCl},
        {&g->d4b, 4 * NCl},
        {&g->datt, NATT},
        {&g->dhA, lst * NC},
        {&g->dhB, lst * NC},
        {&g->vb, lst * (size_t)g->Vl},
        {&g->dpool, nsp * BC},
        {&g->dpre, nsp * BC},
        {&g->dcls, nsp * BC},
        {&g->xmax, g->tp > 1 ? NR : 0},
        {&g->xsums, g->tp > 1 ? 2 * NR : 0},
        {&g->gat, g->sp ? NC : 0},
        {&g->dCs, g->sp ? NCs : 0},
        {&g->dln, g->sp ? (4 + TYPES) * (size_t)g->C : 0},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(scratch); i++)
        if (scratch[i].n && (rc = dt_models_falloc(m, scratch[i].p, scratch[i].n, err)))
            return rc;
    g->s = &g->slots[0];
    m->stage = &bert_stage_ops;
    m->pp_in_numel = g->first ? 0 : (size_t)g->Tmax / (size_t)g->sd * g->C;
    m->pp_out_numel = g->last ? 0 : (size_t)g->Tmax / (size_t)g->sd * g->C;
    return init_params(m, g, err);
}

const float *dt_bert_logits(const dt_model *m)
{
    if (!m || m->ops != &bert_ops || !m->impl)
        return NULL;
    const bert *g = m->impl;
    return g->last ? g->s->logits : NULL;
}
