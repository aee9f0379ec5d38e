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
 * Activations are kept per layer as in llm.c (about L*B*T*16C floats, plus what the backend's
 * attention saves for its backward: attention_sizes, on the cpu the log-sum-exp, B*NH*T per
 * layer (its tiled kernel never stores the (T,T) probabilities); on cuda's cuBLAS path the
 * probabilities, B*NH*T*T); the backward needs only a few (B,T,C)/(B,T,4C) scratch buffers
 * besides (and attention's datt, none on the cpu). cfg.recompute (model.h): `block` keeps only
 * each block's output (L*B*T*C, the residual stream) plus one layer's intermediates, and
 * recomputes block l's forward (all but its last projection) at the start of its backward,
 * inside its backward window; `selective` keeps everything but the attention's saved state (one
 * slot instead of L), recomputed by attention_fwd just before attention_bwd: Megatron's mode on
 * cuda's cuBLAS path (the probabilities), little to gain on the cpu (L-1 log-sum-exps for one
 * more attention forward per layer). Where the time goes: every projection is one matmul over
 * all B*T rows, and attention is the backend's (cpu: flash-attention's tiling, its own
 * micro-kernels), so the non-GEMM work is O(B*T*C) per layer plus the O(B*NH*T*T) softmax.
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
 * Sequence parallelism (cfg.sequence_parallel, Megatron-SP, TP > 1, T a multiple of TP): the
 * regions TP replicates (the residual stream, the LayerNorms, the row-parallel bias adds and
 * the residual adds; this model has no dropout) are split over the group instead of repeated.
 * Layout: the activations stay (B,T,C) row-major and rank r holds the contiguous rows
 * [r*N/TP, (r+1)*N/TP) of the N = B*T token rows, (B*T/TP, C). That is exactly the sequence
 * slice [r*T/TP, (r+1)*T/TP) when B = 1 (Megatron's split of its (T,B,C) layout along T is
 * likewise a contiguous 1/TP of the token rows; in our (B,T) order a contiguous 1/TP of the
 * rows covers whole samples first). Every op of the split regions is per token (wpe is added
 * before the split, in the embedding), so any equal split of the rows computes the same
 * numbers; this one is what comm.h's all-gather and reduce-scatter move (contiguous chunks
 * in rank order), so no strided copy or transpose is ever made, and T % TP == 0 makes every
 * micro-batch's B*T divisible. The collectives, each over the (B,T,C) rows: the embedding's
 * partial sums reduce-scattered into the shards; per layer, ln_1's and ln_2's outputs (this
 * rank's rows, what forward keeps) all-gathered (g-bar) before c_attn and c_fc, the c_proj's
 * partial products reduce-scattered (g-bar's conjugate) instead of all-reduced, the bias then
 * added to the shard; ln_f's output all-gathered before the vocabulary-parallel head. In
 * backward the transposes: the gradient of each row-parallel output all-gathered (the c_proj's
 * weight and bias gradients then come from all N rows, so the bias gradient is whole and the
 * same bits on every rank without an all-reduce), ln_1's, ln_2's and ln_f's outputs all-gathered
 * again for the weight gradients of the GEMMs they feed (Megatron's choice: keep 1/TP, gather
 * twice), the input gradients of the column-parallel GEMMs (and the head's) reduce-scattered,
 * and the gradient of the embeddings' output all-gathered. The LayerNorms' weight and bias
 * gradients see only this rank's rows: they are computed into a scratch (g->dln), all-reduced
 * over the group (one all-reduce of 4C per block, 2C for ln_f) and added to the gradient
 * buffer just before the block's grad-ready report, so gradient accumulation over micro-steps
 * is never summed twice and the strategies change nothing. Per layer and step: 2 all-gathers
 * + 2 reduce-scatters forward and 4 all-gathers + 2 reduce-scatters backward of (B,T,C), each
 * moving (TP-1)/TP of it per rank, against TP's 4 all-reduces (2x that each): 10 units
 * against 8, 1.25x TP's volume for the two re-gathers, and the kept (B,T,C)-sized activations per layer (ln_1 and
 * ln_2 outputs, res2, res3 and the LayerNorm statistics), the embeddings' and ln_f's are 1/TP.
 * With pipeline stages the stage boundaries carry the shards ((B*T/TP,C) per rank: pp_in_numel
 * and pp_out_numel are T*C/TP), TP times less than without.
 * Pipeline stages (model.h, cfg.pp_size > 1; with or without tensor parallelism): the
 * stage holds transformer blocks [lo, hi); stage 0 also the embeddings (wte, wpe), the last
 * stage ln_f and the head with its own copy of the tied wte (the strategy all-reduces the two
 * copies' gradients over the embedding group, so they stay equal). Tables, in buffer order:
 * stage 0 wte, wpe, h.lo..; a middle stage h.lo..h.{hi-1}; the last h.., ln_f, then wte when it
 * is not also stage 0 (one stage: the table above). Blocks likewise: "embed" (two windows when
 * the stage also holds the head), "h.l", "ln_f", and "head" (wte, the last stage's). A stage's
 * input and output are the residual stream (B,T,C), whole on every rank of a tensor group (the
 * stage's tensors are then its slices, as above). Initialisation draws the whole model's
 * stream and keeps the stage's tensors (wte on both ends). Activations are per slot (model.h):
 * each slot has its own set of everything forward keeps (tokens, targets, the per-layer
 * activations of the stage's layers, ln_f's and the logits on the last stage); the backward
 * scratch is shared. One stage of one is the whole model with one slot: the same ops as ever.
 */
#include <math.h>
#include <stddef.h>
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
    /* sequence parallelism (the header): sd = TP with it, else 1; the residual stream, the
     * LayerNorms' inputs, outputs and statistics and the stage's input and output hold
     * N / sd of the N = B*T token rows, this rank's shard (rows [tpr*N/sd, (tpr+1)*N/sd)) */
    bool sp;
    int sd;
    float *gat;              /* (B,T,C) SP scratch: the gathered operand of the moment (a
                              * LayerNorm's output, a row-parallel GEMM's partial sums, the
                              * gradient of the residual stream) */
    float *dCs;              /* (B*T/TP,C) SP scratch: a reduce-scattered input gradient */
    float *dln;              /* (4C) SP scratch: a block's LayerNorm gradients from this
                              * rank's tokens (ln_1 w|b, ln_2 w|b), all-reduced before use */
    int wte, wpe, lnfw, lnfb;
    gpt_layer *layers;       /* (L) owned */
    int32_t *tokens;         /* (B,T) device */
    int32_t *targets;        /* (B,T) device */
    dt_recompute recompute;
    int Lk, La;              /* layers of intermediates kept (L, or 1 with recompute = block)
                              * and of the attention's saved state (L, or 1 with any
                              * recompute) */
    size_t natt, ndatt;      /* floats of one layer's attention state at (Bmax, Tmax), and of
                              * its backward scratch: the backend's attention_sizes (cpu: the
                              * log-sum-exp, B*NHl*T, and 0; cuda's cuBLAS path: the
                              * probabilities, B*NHl*T*T both) */
    /* the fields with B*T rows in a (B,T,C) or (B,T) shape hold B*T/sd of them under
     * sequence parallelism: encoded, ln1*, res2, ln2*, res3, lnf* */
    float *encoded;          /* (B,T,C) */
    float *ln1, *ln1_mean, *ln1_rstd; /* (Lk,B,T,C), (Lk,B,T), (Lk,B,T) */
    float *qkv;              /* (Lk,B,T,3Cl) */
    float *atty;             /* (Lk,B,T,Cl) */
    float *att;              /* (La, natt): what attention_fwd saves for attention_bwd */
    float *res2;             /* (Lk,B,T,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;   /* (Lk,B,T,4Cl) */
    float *res3;             /* (L,B,T,C) residual after the MLP (block output), always kept:
                              * block l's output is block l+1's input */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
    float *logits;           /* (B,T,Vl); after a training forward softmax - onehot(target) */
    float *losses;           /* (B,T) */
    float *dres, *dC, *dqkv, *d4a, *d4b, *datt; /* backward scratch */
    /* pipeline stage (model.h): transformer blocks [lo, hi) (Ls of them), the embeddings on
     * the first stage, ln_f and the head on the last; block indices of h.lo, ln_f, the head */
    int lo, hi, Ls;
    bool first, last;
    int bl_h0, bl_lnf, bl_head;
    int nslots;
    struct gpt_slot *slots;  /* (nslots) owned: the pointers above (tokens .. losses) point
                              * into the slot in use (use_slot) */
} gpt;

/* One micro-batch's activations (model.h's slots): what the gpt fields of the same names point
 * to while it is in use. */
typedef struct gpt_slot {
    int32_t *tokens, *targets;
    float *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *fch_gelu, *res3, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
    const float *in;         /* (B,T,C) borrowed: the previous stage's output (stage > 0) */
    int B, T, valid;         /* of the slot's last training forward */
    bool can_backward;
} gpt_slot;

static void use_slot(gpt *g, int k)
{
    gpt_slot *s = &g->slots[k];
    g->tokens = s->tokens;
    g->targets = s->targets;
    g->encoded = s->encoded;
    g->ln1 = s->ln1;
    g->ln1_mean = s->ln1_mean;
    g->ln1_rstd = s->ln1_rstd;
    g->qkv = s->qkv;
    g->atty = s->atty;
    g->att = s->att;
    g->res2 = s->res2;
    g->ln2 = s->ln2;
    g->ln2_mean = s->ln2_mean;
    g->ln2_rstd = s->ln2_rstd;
    g->fch = s->fch;
    g->fch_gelu = s->fch_gelu;
    g->res3 = s->res3;
    g->lnf = s->lnf;
    g->lnf_mean = s->lnf_mean;
    g->lnf_rstd = s->lnf_rstd;
    g->logits = s->logits;
    g->losses = s->losses;
}

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
    const size_t NR = (size_t)g->Bmax * g->Tmax / (size_t)g->sd, NC = NR * g->C;
    const size_t NCl = (size_t)g->Bmax * g->Tmax * g->Cl; /* the column-parallel region: all rows */
    const size_t NATT = g->natt;
    const size_t ll = (size_t)(l - g->lo); /* the stage's layer l: its slot's index */
    const size_t k = g->Lk == g->Ls ? ll : 0, ka = g->La == g->Ls ? ll : 0;
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
    a->res3 = g->res3 + ll * NC;
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

/* Sequence parallelism: full (N,C) = every rank's shard (N/TP,C), in rank order (g-bar). */
static int sp_allgather(const gpt *g, const float *shard, float *full, size_t N, const char *what,
                        dt_err *err)
{
    int rc = dt_comm_allgather(g->comm, shard, full, N / (size_t)g->tp * (size_t)g->C,
                               DT_FLOAT32, NULL, err);
    if (rc)
        dt_err_prefix(err, "gpt sequence parallelism (rank %d of %d), all-gather of %s: ",
                      g->tpr, g->tp, what);
    return rc;
}

/* Sequence parallelism: shard (N/TP,C) = this rank's rows of full (N,C) summed over the group. */
static int sp_reduce_scatter(const gpt *g, const float *full, float *shard, size_t N,
                             const char *what, dt_err *err)
{
    int rc = dt_comm_reduce_scatter(g->comm, full, shard, N / (size_t)g->tp * (size_t)g->C,
                                    DT_FLOAT32, DT_SUM, NULL, err);
    if (rc)
        dt_err_prefix(err, "gpt sequence parallelism (rank %d of %d), reduce-scatter of %s: ",
                      g->tpr, g->tp, what);
    return rc;
}

/* Sequence parallelism: the LayerNorm gradients in g->dln (n floats, from this rank's tokens
 * only) summed over the group, then added to the gradients of the tensors at w (2C floats per
 * LayerNorm: the weight, then the bias right after it; a block's ln_1 and ln_2 are w[0], w[1]).
 * Every rank adds the same sums, so the replicated gradients stay the same bits on each. */
static int sp_ln_grads(dt_model *m, const gpt *g, const int *w, int nln, const char *what,
                       dt_err *err)
{
    const size_t C2 = 2 * (size_t)g->C;
    int rc = tp_allreduce(g, g->dln, (size_t)nln * C2, DT_SUM, what, err);
    for (int i = 0; !rc && i < nln; i++)
        m->be->accumulate(m->be, G(m, w[i]), g->dln + (size_t)i * C2, C2);
    return rc;
}

/* Row-parallel linear + g (Megatron's RowParallelLinear): out (N,C) = inp (N,K) @ w^T, w (C,K)
 * this rank's columns, summed over the tensor group, + bias (C, replicated) added after the sum
 * on every rank. TP = 1: the one fused matmul it always was. Sequence parallelism: the partial
 * products go to g->gat and are reduce-scattered, so out is this rank's shard (N/TP,C), and
 * the bias is added to the shard. */
static int row_parallel_fwd(dt_model *m, const gpt *g, float *out, const float *inp, int w,
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

/* Transformer block l on its input res (B,T,C) into a; without output, the last projection and
 * residual (res3, kept from forward) are skipped: that is the recomputation in backward. Under
 * tensor parallelism c_attn and c_fc are column-parallel (f, identity in forward, before them),
 * the c_proj's row-parallel with g (row_parallel_fwd). Sequence parallelism: res, the
 * LayerNorms and the residual adds are this rank's N/TP rows; each LayerNorm's output is
 * all-gathered into g->gat (g-bar) for the column-parallel GEMM, which runs on all N rows. */
static int block_fwd(dt_model *m, const gpt *g, int l, const float *res, const gpt_acts *a,
                     int B, int T, bool output, dt_err *err)
{
    dt_backend *be = m->be;
    const gpt_layer *w = &g->layers[l];
    const int C = g->C, Cl = g->Cl, NHl = g->NHl;
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd; /* all rows; the residual's */
    int rc;
    be->layernorm_fwd(be, a->ln1, a->ln1m, a->ln1r, res, P(m, w->ln1w), P(m, w->ln1b), (int)Ns,
                      C, LN_EPS);
    if (g->sp && (rc = sp_allgather(g, a->ln1, g->gat, N, "ln_1's output", err)))
        return rc;
    // qkv (N,3Cl): this rank's heads, from ln_1's output on all N rows
    be->matmul_fwd(be, a->qkv, g->sp ? g->gat : a->ln1, P(m, w->qkvw), P(m, w->qkvb), (int)N, C, 3 * Cl);
    be->attention_fwd(be, a->atty, a->att, a->qkv, B, T, Cl, NHl);
    if ((rc = row_parallel_fwd(m, g, a->res2, a->atty, w->projw, w->projb, (int)N, Cl,
                               "attn.c_proj's output", err)))
        return rc;
    be->accumulate(be, a->res2, res, Ns * C); // res2 = res + attn
    be->layernorm_fwd(be, a->ln2, a->ln2m, a->ln2r, a->res2, P(m, w->ln2w), P(m, w->ln2b),
                      (int)Ns, C, LN_EPS);
    if (g->sp && (rc = sp_allgather(g, a->ln2, g->gat, N, "ln_2's output", err)))
        return rc;
    be->matmul_fwd(be, a->fch, g->sp ? g->gat : a->ln2, P(m, w->fcw), P(m, w->fcb), (int)N, C,
                   4 * Cl);
    be->gelu_fwd(be, a->fchg, a->fch, N * 4 * Cl);
    if (!output)
        return 0;
    if ((rc = row_parallel_fwd(m, g, a->res3, a->fchg, w->fcprojw, w->fcprojb, (int)N, 4 * Cl,
                               "mlp.c_proj's output", err)))
        return rc;
    be->accumulate(be, a->res3, a->res2, Ns * C); // res3 = res2 + mlp
    return 0;
}

/* Backward of transformer block l: g->dres (B,T,C) holds the gradient of its output and gets
 * the gradient of its input res; a holds its intermediates (recomputed already when they are
 * not kept). f's backward all-reduces dC, the gradient of ln_2's and ln_1's output, before
 * each LayerNorm backward; the row-parallel c_proj's (g) backward is the identity.
 * Sequence parallelism: g->dres is this rank's N/TP rows. Each row-parallel backward first
 * all-gathers it (the backward of the reduce-scatter) into g->gat, from which the c_proj's
 * weight and bias gradients come over all N rows (so the bias gradient needs no all-reduce);
 * each column-parallel GEMM's input (the LayerNorm's output, kept as this rank's rows) is
 * all-gathered again into g->gat, and the input gradient dC (N,C) is reduce-scattered into
 * g->dCs (N/TP,C) instead of all-reduced (g-bar's backward); the LayerNorm gradients, from
 * this rank's rows only, go to g->dln and are all-reduced over the group at the end. */
static int block_bwd(dt_model *m, gpt *g, int l, const float *res, const gpt_acts *a, int B,
                     int T, dt_err *err)
{
    dt_backend *be = m->be;
    const gpt_layer *w = &g->layers[l];
    const int C = g->C, Cl = g->Cl, NHl = g->NHl;
    const size_t N = (size_t)B * T, fN = N * sizeof(float), Ns = N / (size_t)g->sd;
    const bool sp = g->sp;
    float *dln2w = sp ? g->dln + 2 * C : G(m, w->ln2w), *dln2b = sp ? g->dln + 3 * C : G(m, w->ln2b);
    float *dln1w = sp ? g->dln : G(m, w->ln1w), *dln1b = sp ? g->dln + C : G(m, w->ln1b);
    float *dCin = sp ? g->dCs : g->dC; /* the gradient of a LayerNorm's output, its rows */
    int rc;
    if (sp) {
        be->memset_zero(be, g->dln, 4 * (size_t)C * sizeof(float));
        if ((rc = sp_allgather(g, g->dres, g->gat, N, "the gradient of the block's output",
                               err)))
            return rc;
    }
    be->memset_zero(be, g->d4a, fN * 4 * Cl);
    be->matmul_bwd(be, g->d4a, G(m, w->fcprojw), G(m, w->fcprojb), sp ? g->gat : g->dres,
                   a->fchg, P(m, w->fcprojw), (int)N, 4 * Cl, C);
    be->memset_zero(be, g->d4b, fN * 4 * Cl);
    be->gelu_bwd(be, g->d4b, a->fch, g->d4a, N * 4 * Cl);
    if (sp && (rc = sp_allgather(g, a->ln2, g->gat, N, "ln_2's output (again)", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * C);
    be->matmul_bwd(be, g->dC, G(m, w->fcw), G(m, w->fcb), g->d4b, sp ? g->gat : a->ln2,
                   P(m, w->fcw), (int)N, C, 4 * Cl);
    if ((rc = sp ? sp_reduce_scatter(g, g->dC, g->dCs, N, "the gradient of ln_2's output", err)
                 : tp_allreduce(g, g->dC, N * C, DT_SUM, "the gradient of ln_2's output", err)))
        return rc;
    be->layernorm_bwd(be, g->dres, dln2w, dln2b, dCin, a->res2, P(m, w->ln2w), a->ln2m, a->ln2r,
                      (int)Ns, C);
    /* g->dres: gradient of res2 */
    if (sp && (rc = sp_allgather(g, g->dres, g->gat, N, "the gradient of res2", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * Cl);
    be->matmul_bwd(be, g->dC, G(m, w->projw), G(m, w->projb), sp ? g->gat : g->dres, a->atty,
                   P(m, w->projw), (int)N, Cl, C);
    if (g->recompute == DT_RECOMPUTE_SELECTIVE) /* the probabilities, from the kept q,k,v */
        be->attention_fwd(be, g->dqkv, a->att, a->qkv, B, T, Cl, NHl); /* dqkv: scratch for y */
    be->memset_zero(be, g->dqkv, fN * 3 * Cl);
    be->attention_bwd(be, g->dqkv, g->datt, g->dC, a->qkv, a->att, B, T, Cl, NHl);
    if (sp && (rc = sp_allgather(g, a->ln1, g->gat, N, "ln_1's output (again)", err)))
        return rc;
    be->memset_zero(be, g->dC, fN * C);
    be->matmul_bwd(be, g->dC, G(m, w->qkvw), G(m, w->qkvb), g->dqkv, sp ? g->gat : a->ln1,
                   P(m, w->qkvw), (int)N, C, 3 * Cl);
    if ((rc = sp ? sp_reduce_scatter(g, g->dC, g->dCs, N, "the gradient of ln_1's output", err)
                 : tp_allreduce(g, g->dC, N * C, DT_SUM, "the gradient of ln_1's output", err)))
        return rc;
    be->layernorm_bwd(be, g->dres, dln1w, dln1b, dCin, res, P(m, w->ln1w), a->ln1m, a->ln1r,
                      (int)Ns, C);
    /* g->dres: gradient of this block's input */
    if (sp) { /* ln_1 and ln_2 saw this rank's rows: their gradients summed over the group */
        const int lns[2] = {w->ln1w, w->ln2w};
        return sp_ln_grads(m, g, lns, 2, "the LayerNorm gradients", err);
    }
    return 0;
}

/* The embeddings into g->encoded (B,T,C) for tokens (device). TP > 1: the vocabulary-parallel
 * partial sum (rank 0 adds wpe), all-reduced after the block's window; with sequence
 * parallelism the partial sums go to g->gat and are reduce-scattered into encoded, this
 * rank's rows. */
static int embed_fwd(dt_model *m, gpt *g, int B, int T, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C;
    float *part = g->sp ? g->gat : g->encoded;
    dt_models_event(m, 0, DT_BLOCK_BEFORE_FORWARD);
    if (g->tp == 1)
        be->embedding_fwd(be, g->encoded, g->tokens, P(m, g->wte), P(m, g->wpe), B, T, C);
    else
        be->embedding_vp_fwd(be, part, g->tokens, P(m, g->wte),
                             g->tpr == 0 ? P(m, g->wpe) : NULL, B, T, C, g->v0, g->Vl);
    dt_models_event(m, 0, DT_BLOCK_AFTER_FORWARD);
    if (g->sp)
        return sp_reduce_scatter(g, part, g->encoded, (size_t)B * T, "the embeddings", err);
    return tp_allreduce(g, g->encoded, (size_t)B * T * C, DT_SUM, "the embeddings", err);
}

/* The tied head and the loss: logits (N,Vl) = x (N,C) @ wte^T (block 0's second window), x
 * ln_f's output (lnf; with sequence parallelism g->gat, where it was all-gathered),
 * then losses (N). Training: the classifier's gradient (softmax - onehot, unscaled) replaces
 * the logits in the same pass that computes the losses, so the (N,V) logits, the biggest tensor
 * of the model, are read once per step, not once here and again in backward. TP > 1: the
 * vocabulary-parallel cross-entropy, whose statistics are all-reduced between its stages. */
static int head_fwd(dt_model *m, gpt *g, const float *x, int N, bool training, dt_err *err)
{
    dt_backend *be = m->be;
    const int C = g->C, Vl = g->Vl;
    dt_models_event(m, g->bl_head, DT_BLOCK_BEFORE_FORWARD);
    be->matmul_fwd(be, g->logits, x, P(m, g->wte), NULL, N, C, Vl);
    dt_models_event(m, g->bl_head, DT_BLOCK_AFTER_FORWARD);
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

static int gpt_stage_forward(dt_model *m, int slot, const dt_batch *batch, const float *in,
                             bool training, float **out, float *loss, dt_err *err)
{
    gpt *g = m->impl;
    dt_backend *be = m->be;
    const int B = batch->B, T = batch->T, C = g->C, V = g->V;
    if (slot < 0 || slot >= g->nslots)
        return dt_err_set(err, -EINVAL, "gpt forward: slot %d of %d", slot, g->nslots);
    gpt_slot *sl = &g->slots[slot];
    sl->can_backward = false;
    use_slot(g, slot);
    if (B <= 0 || B > g->Bmax || T <= 0 || T > g->Tmax || (g->first && !batch->tokens) ||
        (g->last && !batch->targets) || (!g->first && !in) || T % g->sd)
        return dt_err_set(err, -EINVAL,
                          "gpt forward: batch of %dx%d tokens (at most %dx%d, with %s%s "
                          "expected%s)",
                          B, T, g->Bmax, g->Tmax,
                          g->first ? "inputs" : "the previous stage's output",
                          g->last ? " and targets" : "",
                          g->sp ? "; sequence parallelism: T a multiple of the tensor size" : "");
    const size_t N = (size_t)B * T;
    int valid = 0; /* targets that count (>= 0), known here without asking the device */
    for (size_t i = 0; i < N; i++) {
        if (g->first && (batch->tokens[i] < 0 || batch->tokens[i] >= V))
            return dt_err_set(err, -EINVAL, "gpt forward: token %d at position %zu is outside "
                                            "the vocabulary (0..%d)",
                              batch->tokens[i], i, V - 1);
        if (!g->last)
            continue;
        if (batch->targets[i] >= V)
            return dt_err_set(err, -EINVAL, "gpt forward: target %d at position %zu is outside "
                                            "the vocabulary (0..%d)",
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
        gpt_acts a;
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
        dt_models_event(m, g->bl_lnf, DT_BLOCK_BEFORE_FORWARD);
        be->layernorm_fwd(be, g->lnf, g->lnf_mean, g->lnf_rstd, res, P(m, g->lnfw),
                          P(m, g->lnfb), (int)(N / (size_t)g->sd), C, LN_EPS);
        dt_models_event(m, g->bl_lnf, DT_BLOCK_AFTER_FORWARD);
        if (g->sp && (rc = sp_allgather(g, g->lnf, g->gat, N, "ln_f's output", err)))
            return rc;
        if ((rc = head_fwd(m, g, g->sp ? g->gat : g->lnf, (int)N, training, err)))
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

static int gpt_stage_backward(dt_model *m, int slot, float dloss_scale, const float *dout,
                              float *din, dt_grad_ready_fn ready, void *ctx, dt_err *err)
{
    gpt *g = m->impl;
    dt_backend *be = m->be;
    if (slot < 0 || slot >= g->nslots)
        return dt_err_set(err, -EINVAL, "gpt backward: slot %d of %d", slot, g->nslots);
    gpt_slot *sl = &g->slots[slot];
    if (!sl->can_backward)
        return dt_err_set(err, -EINVAL, "gpt backward: no training forward to differentiate in "
                                        "slot %d (call forward with training = true before)",
                          slot);
    if (!g->last && !dout)
        return dt_err_set(err, -EINVAL, "gpt backward: stage %d of %d needs the next stage's "
                                        "gradient",
                          m->cfg.pp_rank, m->cfg.pp_size);
    sl->can_backward = false;
    use_slot(g, slot);
    const int B = sl->B, T = sl->T, C = g->C;
    /* N rows; Ns of them in the residual stream (sequence parallelism: this rank's), NC the
     * stride of res3's layers */
    const size_t N = (size_t)B * T, Ns = N / (size_t)g->sd;
    const size_t NC = (size_t)g->Bmax * g->Tmax / (size_t)g->sd * C;
    const size_t fN = N * sizeof(float), fNs = Ns * sizeof(float);
    const float *in0 = g->first ? g->encoded : sl->in; /* the stage's input */
    int rc;

    if (g->last) {
        /* d loss / d logits = dl * (softmax - onehot), the latter in g->logits since forward;
         * dl goes on the (N,C) operands of the classifier GEMM instead of the (N,V) gradient:
         * dwte += dlogits^T @ (dl * lnf) and dC = (dlogits @ wte) * dl. lnf is not read again.
         * TP > 1: dC is this rank's vocabulary's share, all-reduced (the head's f).
         * Sequence parallelism: ln_f's output is all-gathered into g->gat again (forward kept
         * this rank's rows), dC reduce-scattered into g->dCs, and ln_f's backward runs on this
         * rank's rows, its gradients all-reduced. */
        float dl = sl->valid > 0 ? dloss_scale / (float)sl->valid : 0.0f;
        float *x = g->sp ? g->gat : g->lnf, *dx = g->sp ? g->dCs : g->dC;
        if (g->sp && (rc = sp_allgather(g, g->lnf, g->gat, N, "ln_f's output (again)", err)))
            return rc;
        be->scale(be, x, N * C, dl);
        be->memset_zero(be, g->dC, fN * C);
        dt_models_event(m, g->bl_head, DT_BLOCK_BEFORE_BACKWARD); /* the tied head */
        be->matmul_bwd(be, g->dC, G(m, g->wte), NULL, g->logits, x, P(m, g->wte), (int)N, C,
                       g->Vl);
        if (!g->first) /* the last stage's copy of wte: final now */
            dt_models_ready(m, g->wte, g->wte, ready, ctx);
        dt_models_event(m, g->bl_head, DT_BLOCK_AFTER_BACKWARD);
        if ((rc = g->sp ? sp_reduce_scatter(g, g->dC, g->dCs, N, "the gradient of ln_f's output",
                                            err)
                        : tp_allreduce(g, g->dC, N * C, DT_SUM, "the gradient of ln_f's output",
                                       err)))
            return rc;
        be->scale(be, dx, Ns * C, dl);
        const float *res_last = g->hi > g->lo ? g->res3 + (size_t)(g->Ls - 1) * NC : in0;
        be->memset_zero(be, g->dres, fNs * C);
        if (g->sp)
            be->memset_zero(be, g->dln, 2 * (size_t)C * sizeof(float));
        dt_models_event(m, g->bl_lnf, DT_BLOCK_BEFORE_BACKWARD);
        be->layernorm_bwd(be, g->dres, g->sp ? g->dln : G(m, g->lnfw),
                          g->sp ? g->dln + C : G(m, g->lnfb), dx, res_last, P(m, g->lnfw),
                          g->lnf_mean, g->lnf_rstd, (int)Ns, C);
        if (g->sp && (rc = sp_ln_grads(m, g, &g->lnfw, 1, "ln_f's gradients", err)))
            return rc;
        dt_models_ready(m, g->lnfw, g->lnfb, ready, ctx);
        dt_models_event(m, g->bl_lnf, DT_BLOCK_AFTER_BACKWARD);
    } else {
        be->memcpy_d2d(be, g->dres, dout, fNs * C); /* the gradient of the stage's output */
    }

    for (int l = g->hi - 1; l >= g->lo; l--) {
        const gpt_layer *w = &g->layers[l];
        const float *res = l == g->lo ? in0 : g->res3 + (size_t)(l - 1 - g->lo) * NC;
        gpt_acts a;
        acts_of(g, l, &a);
        dt_models_event(m, g->bl_h0 + l - g->lo, DT_BLOCK_BEFORE_BACKWARD);
        if (g->recompute == DT_RECOMPUTE_BLOCK && /* the block's intermediates, from its input */
            (rc = block_fwd(m, g, l, res, &a, B, T, false, err)))
            return rc;
        if ((rc = block_bwd(m, g, l, res, &a, B, T, err)))
            return rc;
        dt_models_ready(m, w->ln1w, w->fcprojb, ready, ctx);
        dt_models_event(m, g->bl_h0 + l - g->lo, DT_BLOCK_AFTER_BACKWARD);
    }
    if (!g->first) {
        if (din) /* the gradient of the stage's input, for the previous stage */
            be->memcpy_d2d(be, din, g->dres, fNs * C);
        return 0;
    }
    /* sequence parallelism: the backward of the embedding's reduce-scatter, an all-gather */
    if (g->sp && (rc = sp_allgather(g, g->dres, g->gat, N, "the embeddings' gradient", err)))
        return rc;
    dt_models_event(m, 0, DT_BLOCK_BEFORE_BACKWARD);
    if (g->tp == 1)
        be->embedding_bwd(be, G(m, g->wte), G(m, g->wpe), g->dres, g->tokens, B, T, C);
    else
        be->embedding_vp_bwd(be, G(m, g->wte), G(m, g->wpe), g->sp ? g->gat : g->dres,
                             g->tokens, B, T, C, g->v0, g->Vl);
    dt_models_ready(m, g->wte, g->wpe, ready, ctx);
    dt_models_event(m, 0, DT_BLOCK_AFTER_BACKWARD);
    return 0;
}

static int gpt_forward(dt_model *m, const dt_batch *batch, bool training, float *loss, dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "gpt forward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return gpt_stage_forward(m, 0, batch, NULL, training, NULL, loss, err);
}

static int gpt_backward(dt_model *m, float dloss_scale, dt_grad_ready_fn ready, void *ctx,
                        dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "gpt backward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return gpt_stage_backward(m, 0, dloss_scale, NULL, NULL, ready, ctx, err);
}

static void gpt_free(dt_model *m)
{
    gpt *g = m->impl;
    if (!g)
        return;
    dt_backend *be = m->be;
    for (int k = 0; k < g->nslots && g->slots; k++) {
        gpt_slot *s = &g->slots[k];
        void *bufs[] = {s->tokens,   s->targets,  s->encoded, s->ln1,      s->ln1_mean,
                        s->ln1_rstd, s->qkv,      s->atty,    s->att,      s->res2,
                        s->ln2,      s->ln2_mean, s->ln2_rstd, s->fch,     s->fch_gelu,
                        s->res3,     s->lnf,      s->lnf_mean, s->lnf_rstd, s->logits,
                        s->losses};
        const gpt_slot *s0 = &g->slots[0];
        const void *shared[] = {s0->ln1,      s0->ln1_mean, s0->ln1_rstd, s0->qkv,
                                s0->atty,     s0->att,      s0->res2,     s0->ln2,
                                s0->ln2_mean, s0->ln2_rstd, s0->fch,      s0->fch_gelu};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
            bool theirs = false; /* slot 0's, shared: freed with slot 0 */
            for (size_t j = 0; k > 0 && bufs[i] && j < sizeof shared / sizeof shared[0]; j++)
                theirs = theirs || bufs[i] == shared[j];
            if (!theirs)
                be->free(be, bufs[i]);
        }
    }
    void *bufs[] = {g->dres, g->dC,   g->dqkv,  g->d4a, g->d4b,
                    g->datt, g->xmax, g->xsums, g->gat, g->dCs, g->dln};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(be, bufs[i]);
    free(g->slots);
    free(g->layers);
    free(g);
    m->impl = NULL;
}

static const dt_model_ops gpt_ops = {gpt_forward, gpt_backward, gpt_free};
static const dt_model_stage_ops gpt_stage_ops = {gpt_stage_forward, gpt_stage_backward};

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

/* A transformer block's tensors, in table order (whole shapes in units of C; d1 0: a vector). */
static const struct {
    size_t at;           /* offsetof(gpt_layer, ...): where its index goes */
    bool no_decay;
    gpt_split split;
    int d0, d1;          /* x C */
    const char *name;
} layer_tensors[] = {
    {offsetof(gpt_layer, ln1w), true, SPLIT_NONE, 1, 0, "ln_1.weight"},
    {offsetof(gpt_layer, ln1b), true, SPLIT_NONE, 1, 0, "ln_1.bias"},
    {offsetof(gpt_layer, qkvw), false, SPLIT_QKV, 3, 1, "attn.c_attn.weight"},
    {offsetof(gpt_layer, qkvb), true, SPLIT_QKV, 3, 0, "attn.c_attn.bias"},
    {offsetof(gpt_layer, projw), false, SPLIT_COLS, 1, 1, "attn.c_proj.weight"},
    {offsetof(gpt_layer, projb), true, SPLIT_NONE, 1, 0, "attn.c_proj.bias"},
    {offsetof(gpt_layer, ln2w), true, SPLIT_NONE, 1, 0, "ln_2.weight"},
    {offsetof(gpt_layer, ln2b), true, SPLIT_NONE, 1, 0, "ln_2.bias"},
    {offsetof(gpt_layer, fcw), false, SPLIT_ROWS, 4, 1, "mlp.c_fc.weight"},
    {offsetof(gpt_layer, fcb), true, SPLIT_ROWS, 4, 0, "mlp.c_fc.bias"},
    {offsetof(gpt_layer, fcprojw), false, SPLIT_COLS, 1, 4, "mlp.c_proj.weight"},
    {offsetof(gpt_layer, fcprojb), true, SPLIT_NONE, 1, 0, "mlp.c_proj.bias"},
};

/* Draws whole tensor `name` of n elements (a matrix when matrix) from r by GPT-2's rules (the
 * header comment) into whole, and keeps this rank's slice when the model holds the tensor. */
static void init_one(dt_model *m, const gpt *g, dt_rng *r, float *whole, float *host,
                     const char *name, size_t n, bool matrix)
{
    const float proj_std = 0.02f / sqrtf(2.0f * (float)g->L);
    if (matrix)
        dt_rng_fill_normal(r, whole, n, 0.0f, strstr(name, "c_proj") ? proj_std : 0.02f);
    else
        for (size_t k = 0; k < n; k++)
            whole[k] = strstr(name, "ln_") && strstr(name, ".weight") ? 1.0f : 0.0f;
    int i = dt_model_find_tensor(m, name);
    if (i >= 0)
        dt_tensor_tp_copy(&m->tensors[i], g->tpr, whole, host + m->tensors[i].offset, false);
}

/* Draws every whole tensor of the whole model from one stream seeded with cfg.seed, in the
 * whole model's table order, and keeps what this rank holds (its tensor-parallel slices, its
 * pipeline stage's tensors): every layout starts from the bits one process starts from.
 * Uploads the result. */
static int init_params(dt_model *m, const gpt *g, dt_err *err)
{
    const size_t C = (size_t)g->C;
    size_t max_whole = DT_MAX(DT_MAX((size_t)g->V, (size_t)g->maxT), 4 * C) * C;
    float *host = calloc(m->num_params, sizeof(float));
    float *whole = malloc(DT_MAX(max_whole, (size_t)1) * sizeof(float));
    if (!host || !whole) {
        free(host);
        free(whole);
        return dt_err_set(err, -ENOMEM, "gpt: out of memory for the initial parameters");
    }
    dt_rng r;
    dt_rng_seed(&r, m->cfg.seed);
    char nm[DT_TENSOR_NAME_MAX];
    init_one(m, g, &r, whole, host, "wte.weight", (size_t)g->V * C, true);
    init_one(m, g, &r, whole, host, "wpe.weight", (size_t)g->maxT * C, true);
    for (int l = 0; l < g->L; l++)
        for (size_t i = 0; i < DT_ARRAY_LEN(layer_tensors); i++) {
            snprintf(nm, sizeof nm, "h.%d.%s", l, layer_tensors[i].name);
            size_t d1 = (size_t)layer_tensors[i].d1;
            init_one(m, g, &r, whole, host, nm,
                     (size_t)layer_tensors[i].d0 * C * (d1 ? d1 * C : 1), d1 > 0);
        }
    init_one(m, g, &r, whole, host, "ln_f.weight", C, false);
    init_one(m, g, &r, whole, host, "ln_f.bias", C, false);
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
    /* tensor parallelism: the registry (zoo.c) checked tp_size, tp_rank, n_head and comm */
    g->tp = cfg->tp_size > 1 ? cfg->tp_size : 1;
    g->tpr = g->tp > 1 ? cfg->tp_rank : 0;
    g->comm = g->tp > 1 ? comm : NULL;
    g->Cl = g->C / g->tp;
    g->NHl = g->NH / g->tp;
    g->Vl = (g->V + g->tp - 1) / g->tp; /* the vocabulary padded to Vp = Vl * TP */
    g->v0 = g->tpr * g->Vl;
    g->nv = DT_MAX(0, DT_MIN(g->Vl, g->V - g->v0));
    g->sp = cfg->sequence_parallel;
    if (g->sp && g->tp == 1)
        return dt_err_set(err, -EINVAL, "gpt: sequence parallelism needs tensor parallelism "
                                        "(tp_size %d; parallel.tensor > 1 with "
                                        "parallel.sequence_parallel = true)",
                          cfg->tp_size);
    if (g->sp && g->Tmax % g->tp)
        return dt_err_set(err, -EINVAL, "gpt: sequence parallelism splits the %d tokens of a "
                                        "sequence over the %d tensor ranks: make data.seq_len a "
                                        "multiple of parallel.tensor, or set "
                                        "parallel.sequence_parallel = false",
                          g->Tmax, g->tp);
    g->sd = g->sp ? g->tp : 1;
    g->layers = calloc((size_t)g->L, sizeof *g->layers);
    if (!g->layers)
        return dt_err_set(err, -ENOMEM, "out of memory");
    const int C = g->C, L = g->L;
    int rc;
    /* the pipeline stage: blocks [lo, hi) */
    g->lo = 0;
    g->hi = L;
    if (cfg->pp_size > 1) {
        if (cfg->pp_rank < 0 || cfg->pp_rank >= cfg->pp_size || cfg->pp_first < 0 ||
            cfg->pp_count < 1 || cfg->pp_first + cfg->pp_count > L ||
            (cfg->pp_rank == 0) != (cfg->pp_first == 0) ||
            (cfg->pp_rank == cfg->pp_size - 1) != (cfg->pp_first + cfg->pp_count == L))
            return dt_err_set(err, -EINVAL, "gpt: pipeline stage %d of %d with blocks %d..%d of "
                                            "the model's %d (the first stage starts at h.0, the "
                                            "last ends at h.%d; parallel.stages)",
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

    char nm[DT_TENSOR_NAME_MAX];
    if (g->first &&
        ((rc = add_tensor(m, g, &g->wte, false, SPLIT_ROWS, g->V, C, "wte.weight", err)) ||
         (rc = add_tensor(m, g, &g->wpe, false, SPLIT_NONE, g->maxT, C, "wpe.weight", err))))
        return rc;
    for (int l = g->lo; l < g->hi; l++)
        for (size_t i = 0; i < DT_ARRAY_LEN(layer_tensors); i++) {
            snprintf(nm, sizeof nm, "h.%d.%s", l, layer_tensors[i].name);
            int *dst = (int *)((char *)&g->layers[l] + layer_tensors[i].at);
            if ((rc = add_tensor(m, g, dst, layer_tensors[i].no_decay, layer_tensors[i].split,
                                 (int64_t)layer_tensors[i].d0 * C,
                                 (int64_t)layer_tensors[i].d1 * C, nm, err)))
                return rc;
        }
    if (g->last &&
        ((rc = add_tensor(m, g, &g->lnfw, true, SPLIT_NONE, C, 0, "ln_f.weight", err)) ||
         (rc = add_tensor(m, g, &g->lnfb, true, SPLIT_NONE, C, 0, "ln_f.bias", err))))
        return rc;
    /* the last stage's copy of the tied wte, when stage 0 holds the other */
    if (g->last && !g->first &&
        (rc = add_tensor(m, g, &g->wte, false, SPLIT_ROWS, g->V, C, "wte.weight", err)))
        return rc;
    /* blocks (model.h): the embeddings (a second window per pass for the tied output
     * projection when this stage also has the head), each transformer block, ln_f, and the
     * last stage's own wte (the head) */
    int nb = 0;
    if (g->first && (rc = dt_models_add_block(m, g->wte, g->wpe, g->last ? 2 : 1, err,
                                              "embed")) < 0)
        return rc;
    nb += g->first;
    g->bl_h0 = nb;
    for (int l = g->lo; l < g->hi; l++, nb++)
        if ((rc = dt_models_add_block(m, g->layers[l].ln1w, g->layers[l].fcprojb, 1, err, "h.%d",
                                      l)) < 0)
            return rc;
    g->bl_lnf = nb;
    if (g->last && (rc = dt_models_add_block(m, g->lnfw, g->lnfb, 1, err, "ln_f")) < 0)
        return rc;
    nb += g->last;
    g->bl_head = g->first ? 0 : nb;
    if (g->last && !g->first && (rc = dt_models_add_block(m, g->wte, g->wte, 1, err, "head")) < 0)
        return rc;
    if ((rc = dt_models_alloc(m, err)))
        return rc;

    /* FLOPs: forward = the matmuls (12C^2 per token per layer, 2CV for the output projection)
     * plus causal attention (2*C*T*(T+1) per layer per sample); backward = 2x forward. Under
     * tensor parallelism this rank's share: 12C^2/TP per layer, 2C*Vp/TP for its logits (the
     * padding included: it is computed) and its heads' attention; the LayerNorms and the other
     * O(C) work every rank repeats are not counted, as they are not at TP = 1. A pipeline
     * stage: its layers, and the head on the last. */
    const double T = g->Tmax, tp = g->tp, Ls = g->Ls;
    double fwd = T * (2.0 * 12.0 * C * (double)C * Ls / tp +
                      (g->last ? 2.0 * C * (double)g->Vl : 0.0)) +
                 Ls * 2.0 * C * T * (T + 1) / tp;
    m->flops_per_sample = 3.0 * fwd;

    /* activations: recompute = block keeps one layer of intermediates (and every layer's
     * output res3, the next one's input); selective keeps all but the attention's saved state
     * (attention_sizes: the cpu's log-sum-exp, cuda's probabilities).
     * Under tensor parallelism the attention and MLP intermediates and the logits are this
     * rank's share (Cl = C/TP, NHl = NH/TP heads, Vl vocabulary rows); the residual stream and
     * the LayerNorms' are whole on every rank. Per slot: the stage's layers; the embeddings'
     * output and the tokens on the first stage, ln_f's, the logits and the targets on the
     * last. */
    const size_t NR = (size_t)g->Bmax * g->Tmax, NC = NR * C, NCl = NR * g->Cl;
    m->be->attention_sizes(m->be, g->Bmax, g->Tmax, g->Cl, g->NHl, &g->natt, &g->ndatt);
    const size_t NATT = g->natt;
    const size_t Lk = (size_t)g->Lk, La = (size_t)g->La;
    /* the residual stream's and the LayerNorms' rows: all, or this rank's under sequence
     * parallelism */
    const size_t NRs = NR / (size_t)g->sd, NCs = NRs * C;
    g->nslots = cfg->pp_size > 1 && cfg->pp_slots > 1 ? cfg->pp_slots : 1;
    if (!(g->slots = calloc((size_t)g->nslots, sizeof *g->slots)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    size_t before = m->activation_bytes;
    for (int k = 0; k < g->nslots; k++) {
        gpt_slot *sl = &g->slots[k];
        const size_t fst = g->first, lst = g->last;
        /* what backward recomputes is scratch between forward and backward: one copy serves
         * every slot (shared: slot 0's); block: a layer's intermediates; any recompute: the
         * attention's saved state */
        const bool rb = g->recompute == DT_RECOMPUTE_BLOCK, ra = g->La < g->Ls || rb;
        struct {
            float **p;
            size_t n;
            bool shared;
        } acts[] = {
            {&sl->encoded, fst * NCs, false},     {&sl->ln1, Lk * NCs, rb},
            {&sl->ln1_mean, Lk * NRs, rb},        {&sl->ln1_rstd, Lk * NRs, rb},
            {&sl->qkv, 3 * Lk * NCl, rb},         {&sl->atty, Lk * NCl, rb},
            {&sl->att, La * NATT, ra},            {&sl->res2, Lk * NCs, rb},
            {&sl->ln2, Lk * NCs, rb},             {&sl->ln2_mean, Lk * NRs, rb},
            {&sl->ln2_rstd, Lk * NRs, rb},        {&sl->fch, 4 * Lk * NCl, rb},
            {&sl->fch_gelu, 4 * Lk * NCl, rb},    {&sl->res3, (size_t)g->Ls * NCs, false},
            {&sl->lnf, lst * NCs, false},         {&sl->lnf_mean, lst * NRs, false},
            {&sl->lnf_rstd, lst * NRs, false},    {&sl->logits, lst * NR * g->Vl, false},
            {&sl->losses, lst * NR, false},
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
        if (k == 0) /* what each further slot adds */
            m->pp_slot_bytes = m->activation_bytes - before - shared_bytes;
    }
    struct {
        float **p;
        size_t n;
    } scratch[] = {
        {&g->dres, NCs}, {&g->dC, NC}, {&g->dqkv, 3 * NCl}, {&g->d4a, 4 * NCl},
        {&g->d4b, 4 * NCl}, {&g->datt, g->ndatt},
        /* sequence parallelism's: the gathered operand, a reduce-scattered gradient and
         * the LayerNorm gradients before their all-reduce */
        {&g->gat, g->sp ? NC : 0}, {&g->dCs, g->sp ? NCs : 0}, {&g->dln, g->sp ? 4 * C : 0},
    };
    for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++)
        if (scratch[i].n && (rc = dt_models_falloc(m, scratch[i].p, scratch[i].n, err)))
            return rc;
    if (g->tp > 1 && ((rc = dt_models_falloc(m, &g->xmax, NR, err)) ||
                      (rc = dt_models_falloc(m, &g->xsums, 2 * NR, err))))
        return rc;
    use_slot(g, 0);
    m->stage = &gpt_stage_ops;
    m->pp_in_numel = g->first ? 0 : (size_t)g->Tmax / (size_t)g->sd * C;
    m->pp_out_numel = g->last ? 0 : (size_t)g->Tmax / (size_t)g->sd * C;
    return init_params(m, g, err);
}

const float *dt_gpt_logits(const dt_model *m)
{
    if (!m || m->ops != &gpt_ops || !m->impl)
        return NULL;
    return ((const gpt *)m->impl)->logits;
}
