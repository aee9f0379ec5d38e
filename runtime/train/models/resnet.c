/* resnet.c - `resnet`: the CIFAR ResNet of He et al. (2016), depth 6n+2, and torchvision's
 * ImageNet ResNet-18/34/50/101/152, with BatchNorm or SyncBatchNorm.
 *
 * CIFAR form (cfg.imagenet false):
 *   stem    conv3x3(C_in -> w) BN ReLU
 *   stage 1 n BasicBlocks of width w        (stride 1)
 *   stage 2 n BasicBlocks of width 2w       (the first with stride 2)
 *   stage 3 n BasicBlocks of width 4w       (the first with stride 2)
 *   head    global average pool, fc(4w -> classes), softmax cross-entropy
 * ImageNet form (cfg.imagenet, torchvision.models.resnet{18,34,50,101,152}, v1.5):
 *   stem    conv7x7 stride 2 pad 3 (C_in -> w) BN ReLU, max-pool 3x3 stride 2 pad 1
 *   layer1..layer4: [2,2,2,2] (18) or [3,4,6,3] (34) BasicBlocks, [3,4,6,3] (50), [3,4,23,3]
 *           (101) or [3,8,36,3] (152) Bottlenecks (and [2,2,2,2], timm's resnet26, which the
 *           tests use: the Bottleneck at half ResNet-50's depth) of planes w, 2w, 4w, 8w (w = 64 in
 *           torchvision), the first block of layer2..4 with stride 2
 *   head    global average pool, fc(8w x expansion -> classes), softmax cross-entropy
 * Any input size works (the spatial size halves five times, never below 1x1) and any class
 * count the data gives.
 *
 * BasicBlock (expansion 1): out = ReLU(BN(conv3x3(ReLU(BN(conv3x3(x, stride))))) + shortcut(x)).
 * Bottleneck (expansion 4, the stride on the 3x3 as torchvision v1.5): out = ReLU(BN3(conv1x1(
 * ReLU(BN2(conv3x3(ReLU(BN1(conv1x1(x))), stride))))) + shortcut(x)). The shortcut is the
 * identity, or BN(conv1x1(x, stride)) when the shape changes (option B). Convolutions have no
 * bias (BN follows). Names follow torchvision (conv1.weight, bn1.weight, layer2.0.conv1.weight,
 * layer2.0.conv3.weight, layer2.0.downsample.0.weight, layer2.0.downsample.1.bias, fc.weight,
 * ...); BN running statistics are buffers (bn1.running_mean, ...; torchvision's
 * num_batches_tracked counters are not kept: BatchNorm's load_state_dict fills them in).
 * Initialisation as torchvision: convolutions He-normal over fan_out, BN weight 1 and bias 0, fc
 * uniform(+-1/sqrt(fan_in)) (zero_init_residual = False).
 *
 * SyncBatchNorm (cfg.sync_bn with a communicator of more than one rank): the batch statistics
 * (per rank: sum, centred sum of squares and the sample count, 2C+1 floats, one all-gather)
 * are merged exactly with dt_bn_stats_combine (as PyTorch's SyncBatchNorm gathers mean, var and
 * count: summing E[x^2] would lose the variance when |mean| >> std) and, in backward,
 * sum(dy) and sum(dy*xhat) (2C floats) are all-reduced, so every rank normalises with the
 * statistics of the global batch; the BN weight and bias gradients stay local (DDP averages
 * them). With one rank or no communicator it is plain BatchNorm.
 *
 * Activations: each block keeps its convolutions' outputs, the ReLU(BN) between them, the
 * shortcut conv's output and its output. cfg.recompute = block keeps only each block's output
 * (the next one's input) and one shared set of the others, recomputed at the start of the
 * block's backward (inside its backward window) by the same convolutions and bn_fwd_apply on
 * the statistics saved by forward, so no SyncBatchNorm collective runs again and running
 * statistics move once.
 *
 * Blocks (model.h): 0 "stem" (conv1, bn1), 1+i "layer{s}.{j}" (one residual block), nblocks+1
 * "fc". Backward reports gradients as final per block, in backward order: fc, then each
 * residual block from the last to the first, then the stem.
 *
 * Pipeline stages (model.h, cfg.pp_size > 1): the stage holds residual blocks [lo, hi) (the
 * units parallel.pipeline splits: 3n of the CIFAR form, ResNet-50's 16), the stem (and the
 * max-pool) on the first stage, the pool and fc on the last, under their usual names; a stage
 * boundary is a block's output after its ReLU, (B, C, H, W). Its tensors and blocks are the
 * stage's only; initialisation draws every convolution of the whole model in order (the other
 * stages' into scratch), so every stage starts with the one-process values. Per slot: what
 * forward keeps for backward (the input and the stem's outputs, each block's intermediates
 * and output, the pool and the logits), and each BatchNorm's batch statistics (sum, sumsq,
 * mean, 1/std, count) of that slot's micro-batch, which its backward differentiates through;
 * scratch, the recomputed intermediates (recompute = block) and SyncBN's buffers are shared.
 * The running statistics are the stage's buffers, moved by each training forward as it runs
 * (micro-batch 0, 1, ... in both schedules), so a pipeline of M micro-batches is one process
 * with train.grad_accum = M micro-steps of the same samples: BatchNorm normalises each
 * micro-batch by its own statistics either way. The whole model is the one stage of one with
 * one slot: forward/backward are stage_forward/stage_backward of slot 0, the same ops as ever.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/train/models/resnet.h"
#include "runtime/train/models/models.h"

/* A convolution's draw at initialisation, in the whole model's order. */
typedef struct conv_draw {
    size_t numel;
    float std;
    int tensor;        /* this stage's tensor, or -1: another stage's (drawn and dropped) */
} conv_draw;

typedef struct conv_layer {
    int w;             /* tensor index of the weight (K,C,R,S) */
    dt_conv2d_shape s; /* with N = max_batch; set per call */
} conv_layer;

typedef struct bn_layer {
    int w, b;       /* tensor indices of weight and bias (C) */
    int rm, rv;     /* buffer tensor indices of running_mean and running_var (C) */
    int C, HW;
    /* the saved batch statistics of the slot in use (use_slot): */
    float *stats;   /* (2C+1) sum | sumsq (centred) | count, device */
    float *mean;    /* (C) saved for backward */
    float *rstd;    /* (C) */
    double *count;  /* samples*HW behind the statistics of the slot's last training forward */
    /* shared by the slots: */
    float *gath;    /* (world * (2C+1)) every rank's stats, device; SyncBN only, else NULL */
    float *red;     /* (2C) sum_dy | sum_dy_xhat */
} bn_layer;

/* One BatchNorm's batch statistics of one micro-batch, kept from its forward for its backward
 * (a pipeline's slots: model.h). */
typedef struct bn_saved {
    float *stats, *mean, *rstd; /* (2C+1), (C), (C) device, owned */
    double count;
} bn_saved;

#define UNITS_MAX 3 /* conv + BN pairs on a block's main path: 2 (BasicBlock), 3 (Bottleneck) */

typedef struct block {
    int nu;              /* units on the main path */
    conv_layer c[UNITS_MAX], cd;
    bn_layer b[UNITS_MAX], bd;
    bool down;           /* projection shortcut */
    int stage, index;    /* layer{stage+1}.{index} */
    /* the slot in use's (use_slot): */
    const float *x;      /* (B,Cin,H,W) input: the previous block's out, or the stage's input */
    float *co[UNITS_MAX];     /* conv u's output */
    float *act[UNITS_MAX - 1]; /* ReLU(BN u) for u < nu - 1: conv u+1's input */
    float *cdo;          /* shortcut conv output (down only) */
    float *out;          /* (B,Cout,P,Q) block output, always kept (the next block's input) */
    int first, last;     /* tensor index range (this stage's blocks only) */
} block;

/* A block's activations in one slot: owned per slot, or with recompute = block the co, act and
 * cdo borrowed from resnet.shared (one set for every block and slot) and only out owned. */
typedef struct block_acts {
    float *co[UNITS_MAX], *act[UNITS_MAX - 1], *cdo, *out;
} block_acts;

/* One micro-batch's activations (model.h's slots); the whole model has one. */
typedef struct rslot {
    float *x, *c0, *a0, *mp; /* first stage: the input, the stem's conv and ReLU(BN) outputs,
                              * the max-pool's (imagenet) */
    int32_t *mp_idx;
    const float *in;     /* later stages: the previous stage's output (borrowed) */
    block_acts *blk;     /* (hi - lo) this stage's blocks */
    bn_saved *bn;        /* (nbn) this stage's BatchNorms */
    float *pooled, *logits; /* last stage: (B,C_last), (B,K) */
    int32_t *targets;    /* (B) device, last stage */
    int B, valid;
    bool can_backward;
} rslot;

typedef struct resnet {
    dt_comm *comm;       /* borrowed, may be NULL */
    bool sync;
    bool imagenet;       /* torchvision's ImageNet form: 7x7 stem and max-pool */
    float *hgath;        /* (world * (2*C_last+1)) host, owned; SyncBN only */
    float *hmerged;      /* (2*C_last) host, owned; SyncBN only */
    conv_layer stem;
    bn_layer stem_bn;
    int stem_last;       /* last tensor of the stem (conv1, bn1) */
    int mp_C, mp_H, mp_W, mp_P, mp_Q; /* the stem's max-pool (imagenet): input and output */
    int nblocks;         /* residual blocks of the whole model */
    block *blocks;       /* (nblocks) owned: every block's shapes; tensors only for [lo, hi) */
    /* pipeline stage (model.h): residual blocks [lo, hi), the stem on the first stage, the
     * pool and fc on the last (the whole model: 0, nblocks, both) */
    int lo, hi;
    bool first, last;
    int nbn;             /* BatchNorms of this stage */
    bn_layer **bns;      /* (nbn) owned array of borrowed pointers: the stem's (first stage),
                          * then each block's main path and shortcut; bn_layer.si indexes it */
    int fc_w, fc_b;
    int C_last, HW_last, K;
    /* the slot in use's (use_slot): */
    float *x;            /* (B,C,H,W) input */
    float *c0, *a0;      /* (B,w,H0,W0) stem conv output, ReLU(BN) */
    float *mp;           /* (B,w,P,Q) the max-pool's output (imagenet), the first block's input */
    int32_t *mp_idx;     /* (B,w,P,Q) its argmax positions */
    float *pooled;       /* (B,C_last) */
    float *logits;       /* (B,K) */
    int32_t *targets;    /* (B) device */
    int nslots;
    rslot *slots;        /* (nslots) owned */
    /* shared by the slots: */
    float *losses;       /* (B) */
    int32_t *targets_host;
    float *tmp;          /* (max_act) forward scratch */
    float *g[5];         /* (max_act) backward scratch */
    float *dpooled;      /* (B,C_last) */
    bool recompute;      /* cfg.recompute == DT_RECOMPUTE_BLOCK */
    int nshared;         /* 4 (BasicBlocks: co0, act0, co1, cdo) or 6 (Bottlenecks) */
    float *shared[6];    /* (max_act) intermediates of whichever block runs; recompute only */
    float *run_scratch;  /* (2*C_last) running statistics a recomputed BN updates, discarded */
    conv_draw *draws;    /* (ndraws) owned: every convolution of the whole model */
    int ndraws;
} resnet;

static float *P(dt_model *m, int t) { return m->params + m->tensors[t].offset; }
static float *G(dt_model *m, int t) { return m->grads + m->tensors[t].offset; }
static float *BUF(dt_model *m, int t) { return m->buffers + m->buffer_tensors[t].offset; }

static bool sync_active(const resnet *r)
{
    return r->sync && r->comm && dt_comm_world_size(r->comm) > 1;
}

/* ------------------------------------------------------------------------------------------ */
/* layers */

static void conv_fwd(dt_model *m, conv_layer *c, float *out, const float *in, int B)
{
    dt_conv2d_shape s = c->s;
    s.N = B;
    m->be->conv2d_fwd(m->be, out, in, P(m, c->w), NULL, &s);
}

static void conv_bwd(dt_model *m, conv_layer *c, float *dinp, const float *dout, const float *in,
                     int B)
{
    dt_conv2d_shape s = c->s;
    s.N = B;
    m->be->conv2d_bwd(m->be, dinp, G(m, c->w), NULL, dout, in, P(m, c->w), &s);
}

static int bn_fwd(dt_model *m, resnet *r, bn_layer *bn, float *out, const float *in, int B,
                  bool training, dt_err *err)
{
    dt_backend *be = m->be;
    const dt_model_config *cfg = &m->cfg;
    if (!training) {
        be->bn_fwd_eval(be, out, in, BUF(m, bn->rm), BUF(m, bn->rv), P(m, bn->w), P(m, bn->b), B,
                        bn->C, bn->HW, cfg->bn_eps);
        return 0;
    }
    float *sum = bn->stats, *sumsq = bn->stats + bn->C;
    be->bn_stats(be, sum, sumsq, in, B, bn->C, bn->HW);
    double count = (double)B * bn->HW;
    if (sync_active(r)) {
        const int R = dt_comm_world_size(r->comm);
        const size_t per = 2 * (size_t)bn->C + 1;
        float c = (float)count;
        be->memcpy_h2d(be, bn->stats + 2 * bn->C, &c, sizeof c);
        int rc = dt_comm_allgather(r->comm, bn->stats, bn->gath, per, DT_FLOAT32, NULL, err);
        if (rc)
            return dt_err_prefix(err, "SyncBatchNorm statistics: ");
        be->memcpy_d2h(be, r->hgath, bn->gath, (size_t)R * per * sizeof(float));
        count = dt_bn_stats_combine(r->hgath, R, bn->C, r->hmerged, r->hmerged + bn->C);
        be->memcpy_h2d(be, bn->stats, r->hmerged, 2 * (size_t)bn->C * sizeof(float));
    }
    *bn->count = count;
    be->bn_fwd_apply(be, out, bn->mean, bn->rstd, BUF(m, bn->rm), BUF(m, bn->rv), in, P(m, bn->w),
                     P(m, bn->b), sum, sumsq, count, B, bn->C, bn->HW, cfg->bn_momentum,
                     cfg->bn_eps);
    return 0;
}

/* dinp (zeroed by the caller) += gradient of BN from dout; accumulates dw and db. */
static int bn_bwd(dt_model *m, resnet *r, bn_layer *bn, float *dinp, const float *dout,
                  const float *in, int B, dt_err *err)
{
    dt_backend *be = m->be;
    float *sdy = bn->red, *sdyx = bn->red + bn->C;
    be->bn_bwd_reduce(be, G(m, bn->w), G(m, bn->b), sdy, sdyx, dout, in, bn->mean, bn->rstd, B,
                      bn->C, bn->HW);
    if (sync_active(r)) {
        int rc = dt_comm_allreduce(r->comm, bn->red, 2 * (size_t)bn->C, DT_FLOAT32, DT_SUM, NULL,
                                   err);
        if (rc)
            return dt_err_prefix(err, "SyncBatchNorm backward: ");
    }
    be->bn_bwd_apply(be, dinp, dout, in, P(m, bn->w), bn->mean, bn->rstd, sdy, sdyx, *bn->count, B,
                     bn->C, bn->HW);
    return 0;
}

static size_t act_size(const conv_layer *c, int B) { return (size_t)B * c->s.K * c->s.P * c->s.Q; }

static void zero(dt_model *m, float *p, size_t n) { m->be->memset_zero(m->be, p, n * sizeof(float)); }

/* BN's training output again, from the statistics of the last training forward (bn->stats,
 * merged over ranks with SyncBN, and bn->count): the same bn_fwd_apply on the same inputs, so
 * the same bits; no collective, and the real running statistics are left alone. */
static void bn_refwd(dt_model *m, resnet *r, bn_layer *bn, float *out, const float *in, int B)
{
    m->be->bn_fwd_apply(m->be, out, bn->mean, bn->rstd, r->run_scratch, r->run_scratch + bn->C,
                        in, P(m, bn->w), P(m, bn->b), bn->stats, bn->stats + bn->C, *bn->count, B,
                        bn->C, bn->HW, m->cfg.bn_momentum, m->cfg.bn_eps);
}

/* Recomputes block k's intermediates (co, act, cdo) from its input, as its forward made them;
 * its output is kept from forward. */
static void block_refwd(dt_model *m, resnet *r, block *k, int B)
{
    const float *in = k->x;
    for (int u = 0; u < k->nu; u++) {
        conv_fwd(m, &k->c[u], k->co[u], in, B);
        if (u == k->nu - 1)
            break;
        bn_refwd(m, r, &k->b[u], k->act[u], k->co[u], B);
        m->be->relu_fwd(m->be, k->act[u], k->act[u], act_size(&k->c[u], B));
        in = k->act[u];
    }
    if (k->down)
        conv_fwd(m, &k->cd, k->cdo, k->x, B);
}

/* ------------------------------------------------------------------------------------------ */
/* forward and backward */

static size_t in_size(const conv_layer *c, int B) { return (size_t)B * c->s.C * c->s.H * c->s.W; }

/* Points the layers' activations and saved statistics at slot k's, and each block's input at
 * what it reads in that slot. */
static void use_slot(resnet *r, int k)
{
    rslot *sl = &r->slots[k];
    r->x = sl->x;
    r->c0 = sl->c0;
    r->a0 = sl->a0;
    r->mp = sl->mp;
    r->mp_idx = sl->mp_idx;
    r->pooled = sl->pooled;
    r->logits = sl->logits;
    r->targets = sl->targets;
    const float *cur = r->first ? (r->imagenet ? sl->mp : sl->a0) : sl->in;
    for (int i = r->lo; i < r->hi; i++) {
        block *b = &r->blocks[i];
        const block_acts *a = &sl->blk[i - r->lo];
        memcpy(b->co, a->co, sizeof b->co);
        memcpy(b->act, a->act, sizeof b->act);
        b->cdo = a->cdo;
        b->out = a->out;
        b->x = cur;
        cur = b->out;
    }
    for (int i = 0; i < r->nbn; i++) {
        bn_saved *sv = &sl->bn[i];
        bn_layer *bn = r->bns[i];
        bn->stats = sv->stats;
        bn->mean = sv->mean;
        bn->rstd = sv->rstd;
        bn->count = &sv->count;
    }
}

/* Block events: this stage's blocks are numbered from 0 (model.h): the stem (first stage),
 * its residual blocks, fc (last stage). */
static int ev_block(const resnet *r, int i) { return (r->first ? 1 : 0) + i - r->lo; }
static int ev_fc(const resnet *r) { return ev_block(r, r->hi); }

static int resnet_stage_forward(dt_model *m, int slot, const dt_batch *batch, const float *in,
                                bool training, float **out, float *loss, dt_err *err)
{
    resnet *r = m->impl;
    dt_backend *be = m->be;
    const int B = batch->B;
    const dt_sample_shape *sh = &m->cfg.shape;
    int rc;
    if (slot < 0 || slot >= r->nslots)
        return dt_err_set(err, -EINVAL, "resnet forward: slot %d of %d", slot, r->nslots);
    rslot *sl = &r->slots[slot];
    sl->can_backward = false;
    if (B <= 0 || B > m->cfg.max_batch || (r->first && !batch->x) || (!r->first && !in) ||
        (r->last && !batch->targets))
        return dt_err_set(err, -EINVAL, "resnet forward: batch of %d images (1..%d, with %s%s "
                                        "expected)",
                          B, m->cfg.max_batch, r->first ? "pixels" : "the previous stage's output",
                          r->last ? " and labels" : "");
    for (int i = 0; r->last && i < B; i++)
        if (batch->targets[i] >= r->K)
            return dt_err_set(err, -EINVAL, "resnet forward: label %d of sample %d is not < %d "
                                            "classes",
                              batch->targets[i], i, r->K);
    sl->in = in;
    use_slot(r, slot);
    const float *cur = in;
    if (r->first) {
        be->memcpy_h2d(be, r->x, batch->x,
                       (size_t)B * sh->channels * sh->height * sh->width * sizeof(float));
        dt_models_event(m, 0, DT_BLOCK_BEFORE_FORWARD);
        conv_fwd(m, &r->stem, r->c0, r->x, B);
        if ((rc = bn_fwd(m, r, &r->stem_bn, r->a0, r->c0, B, training, err)))
            return rc;
        dt_models_event(m, 0, DT_BLOCK_AFTER_FORWARD);
        be->relu_fwd(be, r->a0, r->a0, act_size(&r->stem, B));
        cur = r->a0;
        if (r->imagenet) { /* the stem's max-pool: 3x3, stride 2, pad 1 */
            be->maxpool_fwd(be, r->mp, r->mp_idx, r->a0, B, r->mp_C, r->mp_H, r->mp_W, 3, 2, 1);
            cur = r->mp;
        }
    }
    if (r->last) {
        be->memcpy_h2d(be, r->targets, batch->targets, (size_t)B * sizeof(int32_t));
        memcpy(r->targets_host, batch->targets, (size_t)B * sizeof(int32_t));
    }
    for (int i = r->lo; i < r->hi; i++) {
        block *k = &r->blocks[i];
        const int last = k->nu - 1;
        size_t n = act_size(&k->c[last], B);
        dt_models_event(m, ev_block(r, i), DT_BLOCK_BEFORE_FORWARD);
        const float *x = cur;
        for (int u = 0; u < k->nu; u++) {
            conv_fwd(m, &k->c[u], k->co[u], x, B);
            float *o = u == last ? k->out : k->act[u];
            if ((rc = bn_fwd(m, r, &k->b[u], o, k->co[u], B, training, err)))
                return rc;
            if (u < last) {
                be->relu_fwd(be, o, o, act_size(&k->c[u], B));
                x = o;
            }
        }
        if (k->down) {
            conv_fwd(m, &k->cd, k->cdo, cur, B);
            if ((rc = bn_fwd(m, r, &k->bd, r->tmp, k->cdo, B, training, err)))
                return rc;
            be->accumulate(be, k->out, r->tmp, n);
        } else {
            be->accumulate(be, k->out, cur, n);
        }
        dt_models_event(m, ev_block(r, i), DT_BLOCK_AFTER_FORWARD);
        be->relu_fwd(be, k->out, k->out, n);
        cur = k->out;
    }
    int valid = 0;
    *loss = 0;
    if (out)
        *out = r->last ? NULL : (float *)cur;
    if (r->last) {
        be->avgpool_fwd(be, r->pooled, cur, B, r->C_last, r->HW_last);
        // logits (B,K) = pooled (B,C_last) @ fc^T + b
        dt_models_event(m, ev_fc(r), DT_BLOCK_BEFORE_FORWARD);
        be->matmul_fwd(be, r->logits, r->pooled, P(m, r->fc_w), P(m, r->fc_b), B, r->C_last,
                       r->K);
        dt_models_event(m, ev_fc(r), DT_BLOCK_AFTER_FORWARD);
        be->xent_fwd_bwd(be, r->losses, NULL, r->logits, r->targets, B, r->K, 1.0f, &valid);
        *loss = dt_models_mean_loss(m, r->losses, B, valid);
        m->last_correct = dt_models_count_correct(m, r->logits, r->targets_host, B, r->K);
    }
    sl->B = B;
    sl->valid = valid;
    sl->can_backward = training;
    return 0;
}

static int resnet_stage_backward(dt_model *m, int slot, float dloss_scale, const float *dout_in,
                                 float *din, dt_grad_ready_fn ready, void *ctx, dt_err *err)
{
    resnet *r = m->impl;
    dt_backend *be = m->be;
    int rc;
    if (slot < 0 || slot >= r->nslots)
        return dt_err_set(err, -EINVAL, "resnet backward: slot %d of %d", slot, r->nslots);
    rslot *sl = &r->slots[slot];
    if (!sl->can_backward)
        return dt_err_set(err, -EINVAL, "resnet backward: no training forward to differentiate "
                                        "in slot %d (call forward with training = true just "
                                        "before)",
                          slot);
    if (!r->last && !dout_in)
        return dt_err_set(err, -EINVAL, "resnet backward: stage %d of %d needs the next stage's "
                                        "gradient",
                          m->cfg.pp_rank, m->cfg.pp_size);
    sl->can_backward = false;
    use_slot(r, slot);
    const int B = sl->B;
    int cur = 0; /* r->g[cur] holds the gradient of the current block output; cur is 0 or 4 */
    if (r->last) {
        float dl = sl->valid > 0 ? dloss_scale / (float)sl->valid : 0.0f;
        be->xent_fwd_bwd(be, r->losses, r->logits, r->logits, r->targets, B, r->K, dl, NULL);
        zero(m, r->dpooled, (size_t)B * r->C_last);
        dt_models_event(m, ev_fc(r), DT_BLOCK_BEFORE_BACKWARD);
        be->matmul_bwd(be, r->dpooled, G(m, r->fc_w), G(m, r->fc_b), r->logits, r->pooled,
                       P(m, r->fc_w), B, r->C_last, r->K);
        dt_models_ready(m, r->fc_w, r->fc_b, ready, ctx);
        dt_models_event(m, ev_fc(r), DT_BLOCK_AFTER_BACKWARD);
        zero(m, r->g[0], (size_t)B * r->C_last * r->HW_last);
        be->avgpool_bwd(be, r->g[0], r->dpooled, B, r->C_last, r->HW_last);
    } else { /* the gradient of the stage's output: its last block's */
        be->memcpy_d2d(be, r->g[0], dout_in, sizeof(float) * (size_t)B * m->pp_out_numel);
    }
    for (int i = r->hi - 1; i >= r->lo; i--) {
        block *k = &r->blocks[i];
        const int last = k->nu - 1;
        size_t n = act_size(&k->c[last], B), nin = in_size(&k->c[0], B);
        float *dout = r->g[cur], *dx = r->g[4 - cur];
        float *dsum = r->g[1], *X = r->g[2], *Y = r->g[3];
        dt_models_event(m, ev_block(r, i), DT_BLOCK_BEFORE_BACKWARD);
        if (r->recompute)
            block_refwd(m, r, k, B);
        zero(m, dsum, n);
        be->relu_bwd(be, dsum, k->out, dout, n);
        /* the main path from its last unit down: dg, the gradient of unit u's BN output, goes
         * through BN (into tA: the gradient of conv u's output), conv u (into tB: the gradient
         * of its input, ReLU(BN u-1)) and that ReLU (into tA's buffer again); X and Y alternate */
        const float *dg = dsum;
        for (int u = last, p = 0; u >= 0; u--, p ^= 1) {
            float *tA = p ? Y : X, *tB = p ? X : Y;
            size_t nu_out = act_size(&k->c[u], B);
            zero(m, tA, nu_out);
            if ((rc = bn_bwd(m, r, &k->b[u], tA, dg, k->co[u], B, err)))
                return rc;
            if (u == 0) {
                zero(m, dx, nin);
                conv_bwd(m, &k->c[0], dx, tA, k->x, B);
                break;
            }
            size_t nu_in = act_size(&k->c[u - 1], B);
            zero(m, tB, nu_in);
            conv_bwd(m, &k->c[u], tB, tA, k->act[u - 1], B);
            zero(m, tA, nu_in);
            be->relu_bwd(be, tA, k->act[u - 1], tB, nu_in);
            dg = tA;
        }
        if (k->down) {
            zero(m, X, n); /* dcd */
            if ((rc = bn_bwd(m, r, &k->bd, X, dsum, k->cdo, B, err)))
                return rc;
            conv_bwd(m, &k->cd, dx, X, k->x, B);
        } else {
            be->accumulate(be, dx, dsum, nin);
        }
        dt_models_ready(m, k->first, k->last, ready, ctx);
        dt_models_event(m, ev_block(r, i), DT_BLOCK_AFTER_BACKWARD);
        cur = 4 - cur;
    }
    if (!r->first) { /* the gradient of the stage's input, for the previous stage */
        if (din)
            be->memcpy_d2d(be, din, r->g[cur], sizeof(float) * (size_t)B * m->pp_in_numel);
        return 0;
    }
    size_t n0 = act_size(&r->stem, B);
    const float *dstem = r->g[cur]; /* the gradient of the stem's ReLU output */
    if (r->imagenet) { /* back through the max-pool */
        zero(m, r->g[3], n0);
        be->maxpool_bwd(be, r->g[3], r->g[cur], r->mp_idx, B, r->mp_C, r->mp_H, r->mp_W, r->mp_P,
                        r->mp_Q);
        dstem = r->g[3];
    }
    zero(m, r->g[1], n0);
    be->relu_bwd(be, r->g[1], r->a0, dstem, n0);
    zero(m, r->g[2], n0);
    dt_models_event(m, 0, DT_BLOCK_BEFORE_BACKWARD);
    if ((rc = bn_bwd(m, r, &r->stem_bn, r->g[2], r->g[1], r->c0, B, err)))
        return rc;
    conv_bwd(m, &r->stem, NULL, r->g[2], r->x, B);
    dt_models_ready(m, 0, r->stem_last, ready, ctx);
    dt_models_event(m, 0, DT_BLOCK_AFTER_BACKWARD);
    return 0;
}

static int resnet_forward(dt_model *m, const dt_batch *batch, bool training, float *loss,
                          dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "resnet forward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return resnet_stage_forward(m, 0, batch, NULL, training, NULL, loss, err);
}

static int resnet_backward(dt_model *m, float dloss_scale, dt_grad_ready_fn ready, void *ctx,
                           dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "resnet backward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return resnet_stage_backward(m, 0, dloss_scale, NULL, NULL, ready, ctx, err);
}

/* ------------------------------------------------------------------------------------------ */
/* construction */

static void bn_free(dt_backend *be, bn_layer *bn)
{
    be->free(be, bn->red);
    be->free(be, bn->gath);
}

static void slot_free(dt_backend *be, const resnet *r, rslot *sl)
{
    be->free(be, sl->x);
    be->free(be, sl->c0);
    be->free(be, sl->a0);
    be->free(be, sl->mp);
    be->free(be, sl->mp_idx);
    be->free(be, sl->pooled);
    be->free(be, sl->logits);
    be->free(be, sl->targets);
    for (int i = 0; sl->blk && i < r->hi - r->lo; i++) {
        block_acts *a = &sl->blk[i];
        if (!r->recompute) {
            for (int u = 0; u < UNITS_MAX; u++)
                be->free(be, a->co[u]);
            for (int u = 0; u < UNITS_MAX - 1; u++)
                be->free(be, a->act[u]);
            be->free(be, a->cdo);
        }
        be->free(be, a->out);
    }
    for (int i = 0; sl->bn && i < r->nbn; i++) {
        be->free(be, sl->bn[i].stats);
        be->free(be, sl->bn[i].mean);
        be->free(be, sl->bn[i].rstd);
    }
    free(sl->blk);
    free(sl->bn);
}

static void resnet_free(dt_model *m)
{
    resnet *r = m->impl;
    if (!r)
        return;
    dt_backend *be = m->be;
    for (int k = 0; r->slots && k < r->nslots; k++)
        slot_free(be, r, &r->slots[k]);
    free(r->slots);
    for (int i = 0; r->bns && i < r->nbn; i++)
        bn_free(be, r->bns[i]);
    free(r->bns);
    for (int i = 0; i < 6; i++)
        be->free(be, r->shared[i]);
    be->free(be, r->run_scratch);
    free(r->blocks);
    be->free(be, r->losses);
    free(r->hgath);
    free(r->hmerged);
    be->free(be, r->tmp);
    for (int i = 0; i < 5; i++)
        be->free(be, r->g[i]);
    be->free(be, r->dpooled);
    free(r->targets_host);
    free(r->draws);
    free(r);
    m->impl = NULL;
}

static const dt_model_ops resnet_ops = {resnet_forward, resnet_backward, resnet_free};
static const dt_model_stage_ops resnet_stage_ops = {resnet_stage_forward, resnet_stage_backward};

/* Declares a conv weight "<prefix>.weight" (K,C,R,R) with its shape for input (C,H,W) (padding
 * R/2: torchvision's 7x7 pad 3, 3x3 pad 1, 1x1 pad 0), and its draw at initialisation (in the
 * whole model's order). keep false: a conv of another pipeline stage: its shape and its draw
 * only, no tensor (returns 0). */
static int add_conv(dt_model *m, conv_layer *c, const char *name, int C, int H, int W, int K,
                    int R, int stride, bool keep, dt_err *err)
{
    resnet *r = m->impl;
    dt_conv2d_shape_init(&c->s, m->cfg.max_batch, C, H, W, K, R, R, stride, R / 2);
    c->w = -1;
    conv_draw *d = &r->draws[r->ndraws++];
    d->numel = (size_t)K * C * R * R;
    d->std = (float)sqrt(2.0 / ((double)K * R * R)); /* kaiming_normal_, fan_out, relu */
    d->tensor = -1;
    if (!keep)
        return 0;
    int64_t shape[4] = {K, C, R, R};
    int rc = dt_models_add(m, false, 4, shape, err, "%s.weight", name);
    if (rc < 0)
        return rc;
    c->w = d->tensor = rc;
    m->flops_per_sample += 6.0 * K * (double)C * R * R * c->s.P * c->s.Q;
    return rc;
}

/* keep false: a BatchNorm of another pipeline stage: its shape only (returns 0). */
static int add_bn(dt_model *m, bn_layer *bn, const char *name, int C, int HW, bool keep,
                  dt_err *err)
{
    int64_t shape[1] = {C};
    int rc;
    bn->C = C;
    bn->HW = HW;
    if (!keep)
        return 0;
    if ((rc = dt_models_add(m, true, 1, shape, err, "%s.weight", name)) < 0)
        return rc;
    bn->w = rc;
    if ((rc = dt_models_add(m, true, 1, shape, err, "%s.bias", name)) < 0)
        return rc;
    bn->b = rc;
    if ((rc = dt_models_add_buffer(m, 1, shape, err, "%s.running_mean", name)) < 0)
        return rc;
    bn->rm = rc;
    if ((rc = dt_models_add_buffer(m, 1, shape, err, "%s.running_var", name)) < 0)
        return rc;
    bn->rv = rc;
    return bn->b;
}

/* The scratch every slot shares (SyncBN's gather, backward's reductions). */
static int bn_alloc(dt_model *m, bn_layer *bn, dt_err *err)
{
    const resnet *r = m->impl;
    int rc = 0;
    if (sync_active(r))
        rc = dt_models_falloc(m, &bn->gath,
                              (size_t)dt_comm_world_size(r->comm) * (2 * (size_t)bn->C + 1), err);
    if (!rc)
        rc = dt_models_falloc(m, &bn->red, 2 * (size_t)bn->C, err);
    return rc;
}

/* Slot sl's activations and saved statistics, for micro-batches of up to B samples. */
static int slot_alloc(dt_model *m, resnet *r, rslot *sl, size_t B, dt_err *err)
{
    const dt_sample_shape *sh = &m->cfg.shape;
    int rc = 0;
    sl->blk = calloc((size_t)(r->hi - r->lo), sizeof *sl->blk);
    sl->bn = calloc((size_t)(r->nbn ? r->nbn : 1), sizeof *sl->bn);
    if (!sl->blk || !sl->bn)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if (r->first) {
        rc = dt_models_falloc(m, &sl->x, B * sh->channels * sh->height * sh->width, err);
        if (!rc)
            rc = dt_models_falloc(m, &sl->c0, act_size(&r->stem, (int)B), err);
        if (!rc)
            rc = dt_models_falloc(m, &sl->a0, act_size(&r->stem, (int)B), err);
        if (!rc && r->imagenet)
            rc = dt_models_falloc(m, &sl->mp, B * r->mp_C * r->mp_P * r->mp_Q, err);
        if (!rc && r->imagenet)
            rc = dt_models_ialloc(m, &sl->mp_idx, B * r->mp_C * r->mp_P * r->mp_Q, err);
    }
    for (int i = r->lo; i < r->hi && !rc; i++) {
        block *k = &r->blocks[i];
        block_acts *a = &sl->blk[i - r->lo];
        if (r->recompute) { /* co0, act0, co1, [act1, co2,] cdo */
            int s = 0;
            for (int u = 0; u < k->nu; u++) {
                a->co[u] = r->shared[s++];
                if (u < k->nu - 1)
                    a->act[u] = r->shared[s++];
            }
            a->cdo = k->down ? r->shared[s] : NULL;
        } else {
            for (int u = 0; u < k->nu && !rc; u++) {
                size_t n = act_size(&k->c[u], (int)B);
                rc = dt_models_falloc(m, &a->co[u], n, err);
                if (!rc && u < k->nu - 1)
                    rc = dt_models_falloc(m, &a->act[u], n, err);
            }
            if (!rc && k->down)
                rc = dt_models_falloc(m, &a->cdo, act_size(&k->cd, (int)B), err);
        }
        if (!rc)
            rc = dt_models_falloc(m, &a->out, act_size(&k->c[k->nu - 1], (int)B), err);
    }
    for (int i = 0; i < r->nbn && !rc; i++) {
        const size_t C = (size_t)r->bns[i]->C;
        rc = dt_models_falloc(m, &sl->bn[i].stats, 2 * C + 1, err);
        if (!rc)
            rc = dt_models_falloc(m, &sl->bn[i].mean, C, err);
        if (!rc)
            rc = dt_models_falloc(m, &sl->bn[i].rstd, C, err);
    }
    if (!rc && r->last)
        rc = dt_models_falloc(m, &sl->pooled, B * r->C_last, err);
    if (!rc && r->last)
        rc = dt_models_falloc(m, &sl->logits, B * r->K, err);
    if (!rc && r->last)
        rc = dt_models_ialloc(m, &sl->targets, B, err);
    return rc;
}

/* The architecture: blocks per stage and the block kind. */
typedef struct arch {
    int stages, per[4];
    bool bottleneck;
} arch;

static int arch_of(const dt_model_config *cfg, arch *a, dt_err *err)
{
    memset(a, 0, sizeof *a);
    if (!cfg->imagenet) { /* CIFAR: 3 stages of n BasicBlocks */
        const int n = (cfg->depth - 2) / 6;
        *a = (arch){3, {n, n, n, 0}, false};
        return 0;
    }
    static const struct {
        int depth, per[4];
        bool bottleneck;
    } tv[] = {
        {18, {2, 2, 2, 2}, false},  {26, {2, 2, 2, 2}, true}, /* timm's resnet26: tests */
        {34, {3, 4, 6, 3}, false},  {50, {3, 4, 6, 3}, true},
        {101, {3, 4, 23, 3}, true}, {152, {3, 8, 36, 3}, true},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(tv); i++)
        if (tv[i].depth == cfg->depth) {
            *a = (arch){4, {tv[i].per[0], tv[i].per[1], tv[i].per[2], tv[i].per[3]},
                        tv[i].bottleneck};
            return 0;
        }
    return dt_err_set(err, -EINVAL, "resnet: torchvision's ImageNet ResNet has depth 18, 34, 50, "
                                    "101 or 152 (or timm's 26), not %d",
                      cfg->depth);
}

int dt_resnet_create(dt_model *m, dt_comm *comm, dt_err *err)
{
    const dt_model_config *cfg = &m->cfg;
    const dt_sample_shape *sh = &cfg->shape;
    resnet *r = calloc(1, sizeof *r);
    if (!r)
        return dt_err_set(err, -ENOMEM, "out of memory");
    m->impl = r;
    m->ops = &resnet_ops;
    m->stage = &resnet_stage_ops;
    r->comm = comm;
    r->sync = cfg->sync_bn;
    r->imagenet = cfg->imagenet;
    r->recompute = cfg->recompute == DT_RECOMPUTE_BLOCK;
    arch ar;
    int rc = arch_of(cfg, &ar, err);
    if (rc)
        return rc;
    const int w = cfg->width, expansion = ar.bottleneck ? 4 : 1;
    r->nblocks = ar.per[0] + ar.per[1] + ar.per[2] + ar.per[3];
    r->nshared = ar.bottleneck ? 6 : 4;
    r->blocks = calloc((size_t)r->nblocks, sizeof *r->blocks);
    r->draws = calloc(1 + 4 * (size_t)r->nblocks, sizeof *r->draws);
    if (!r->blocks || !r->draws)
        return dt_err_set(err, -ENOMEM, "out of memory");
    /* the pipeline stage: residual blocks [lo, hi) */
    r->lo = 0;
    r->hi = r->nblocks;
    if (cfg->pp_size > 1) {
        if (cfg->pp_rank < 0 || cfg->pp_rank >= cfg->pp_size || cfg->pp_first < 0 ||
            cfg->pp_count < 1 || cfg->pp_first + cfg->pp_count > r->nblocks ||
            (cfg->pp_rank == 0) != (cfg->pp_first == 0) ||
            (cfg->pp_rank == cfg->pp_size - 1) != (cfg->pp_first + cfg->pp_count == r->nblocks))
            return dt_err_set(err, -EINVAL, "resnet: pipeline stage %d of %d with residual "
                                            "blocks %d..%d of the model's %d (the first stage "
                                            "starts at block 0, the last ends at block %d; "
                                            "parallel.stages)",
                              cfg->pp_rank, cfg->pp_size, cfg->pp_first,
                              cfg->pp_first + cfg->pp_count - 1, r->nblocks, r->nblocks - 1);
        r->lo = cfg->pp_first;
        r->hi = cfg->pp_first + cfg->pp_count;
    }
    r->first = r->lo == 0;
    r->last = r->hi == r->nblocks;
    char name[64];

    /* the tensor table, in torchvision's order (this stage's tensors) */
    int H = sh->height, W = sh->width;
    if ((rc = add_conv(m, &r->stem, "conv1", sh->channels, H, W, w, r->imagenet ? 7 : 3,
                       r->imagenet ? 2 : 1, r->first, err)) < 0)
        return rc;
    H = r->stem.s.P;
    W = r->stem.s.Q;
    if ((rc = add_bn(m, &r->stem_bn, "bn1", w, H * W, r->first, err)) < 0)
        return rc;
    r->stem_last = rc;
    size_t max_act = (size_t)w * H * W;
    if (r->imagenet) { /* the max-pool 3x3, stride 2, pad 1 */
        r->mp_C = w;
        r->mp_H = H;
        r->mp_W = W;
        r->mp_P = (H + 2 - 3) / 2 + 1;
        r->mp_Q = (W + 2 - 3) / 2 + 1;
        H = r->mp_P;
        W = r->mp_Q;
    }
    int C = w, bi = 0;
    for (int stage = 0; stage < ar.stages; stage++) {
        const int planes = w << stage, K = planes * expansion;
        for (int j = 0; j < ar.per[stage]; j++, bi++) {
            block *k = &r->blocks[bi];
            const bool keep = bi >= r->lo && bi < r->hi;
            const int stride = (stage > 0 && j == 0) ? 2 : 1;
            k->stage = stage;
            k->index = j;
            k->nu = ar.bottleneck ? 3 : 2;
            /* BasicBlock: 3x3 (stride), 3x3; Bottleneck: 1x1, 3x3 (stride), 1x1 (x4) */
            const int ks[3] = {ar.bottleneck ? 1 : 3, 3, 1};
            const int strides[3] = {ar.bottleneck ? 1 : stride, ar.bottleneck ? stride : 1, 1};
            const int outs[3] = {planes, ar.bottleneck ? planes : K, K};
            int cin = C, h = H, wd = W;
            for (int u = 0; u < k->nu; u++) {
                snprintf(name, sizeof name, "layer%d.%d.conv%d", stage + 1, j, u + 1);
                if ((rc = add_conv(m, &k->c[u], name, cin, h, wd, outs[u], ks[u], strides[u],
                                   keep, err)) < 0)
                    return rc;
                if (u == 0)
                    k->first = rc;
                h = k->c[u].s.P;
                wd = k->c[u].s.Q;
                cin = outs[u];
                snprintf(name, sizeof name, "layer%d.%d.bn%d", stage + 1, j, u + 1);
                if ((rc = add_bn(m, &k->b[u], name, cin, h * wd, keep, err)) < 0)
                    return rc;
                k->last = rc;
                max_act = DT_MAX(max_act, (size_t)cin * h * wd);
            }
            k->down = stride != 1 || C != K;
            if (k->down) {
                snprintf(name, sizeof name, "layer%d.%d.downsample.0", stage + 1, j);
                if ((rc = add_conv(m, &k->cd, name, C, H, W, K, 1, stride, keep, err)) < 0)
                    return rc;
                snprintf(name, sizeof name, "layer%d.%d.downsample.1", stage + 1, j);
                if ((rc = add_bn(m, &k->bd, name, K, h * wd, keep, err)) < 0)
                    return rc;
                k->last = rc;
            }
            C = K;
            H = h;
            W = wd;
        }
    }
    r->C_last = C;
    r->HW_last = H * W;
    r->K = sh->n_classes;
    if (r->last) {
        int64_t fw[2] = {r->K, C}, fb[1] = {r->K};
        if ((rc = dt_models_add(m, false, 2, fw, err, "fc.weight")) < 0)
            return rc;
        r->fc_w = rc;
        if ((rc = dt_models_add(m, true, 1, fb, err, "fc.bias")) < 0)
            return rc;
        r->fc_b = rc;
        m->flops_per_sample += 6.0 * r->K * C;
    }
    /* blocks (model.h): the stem, each residual block, the classifier (this stage's) */
    if (r->first && (rc = dt_models_add_block(m, 0, r->stem_last, 1, err, "stem")) < 0)
        return rc;
    for (int i = r->lo; i < r->hi; i++)
        if ((rc = dt_models_add_block(m, r->blocks[i].first, r->blocks[i].last, 1, err,
                                      "layer%d.%d", r->blocks[i].stage + 1,
                                      r->blocks[i].index)) < 0)
            return rc;
    if (r->last && (rc = dt_models_add_block(m, r->fc_w, r->fc_b, 1, err, "fc")) < 0)
        return rc;
    if ((rc = dt_models_alloc(m, err)))
        return rc;
    /* what a stage receives and sends: a block's input and output, per sample */
    m->pp_in_numel = r->first ? 0 : in_size(&r->blocks[r->lo].c[0], 1);
    m->pp_out_numel =
        r->last ? 0 : act_size(&r->blocks[r->hi - 1].c[r->blocks[r->hi - 1].nu - 1], 1);
    r->nbn = 0;
    int nbn_max = 1 + UNITS_MAX * r->nblocks + r->nblocks;
    if (!(r->bns = calloc((size_t)nbn_max, sizeof *r->bns)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    if (r->first)
        r->bns[r->nbn++] = &r->stem_bn;
    for (int i = r->lo; i < r->hi; i++) {
        block *k = &r->blocks[i];
        for (int u = 0; u < k->nu; u++)
            r->bns[r->nbn++] = &k->b[u];
        if (k->down)
            r->bns[r->nbn++] = &k->bd;
    }

    /* activations: shared scratch, then per slot (model.h) */
    const size_t B = (size_t)cfg->max_batch;
    max_act *= B;
    for (int i = 0; i < r->nbn && !rc; i++)
        rc = bn_alloc(m, r->bns[i], err);
    /* recompute = block: one set of intermediates for all blocks (sized for the largest) */
    for (int i = 0; i < r->nshared && r->recompute && !rc; i++)
        rc = dt_models_falloc(m, &r->shared[i], max_act, err);
    if (!rc && r->recompute)
        rc = dt_models_falloc(m, &r->run_scratch, 2 * (size_t)r->C_last, err);
    if (!rc)
        rc = dt_models_falloc(m, &r->dpooled, B * r->C_last, err);
    if (!rc)
        rc = dt_models_falloc(m, &r->losses, B, err);
    if (!rc)
        rc = dt_models_falloc(m, &r->tmp, max_act, err);
    for (int i = 0; i < 5 && !rc; i++)
        rc = dt_models_falloc(m, &r->g[i], max_act, err);
    if (rc)
        return rc;
    r->nslots = cfg->pp_size > 1 && cfg->pp_slots > 1 ? cfg->pp_slots : 1;
    if (!(r->slots = calloc((size_t)r->nslots, sizeof *r->slots)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    for (int k = 0; k < r->nslots && !rc; k++) {
        size_t before = m->activation_bytes;
        rc = slot_alloc(m, r, &r->slots[k], B, err);
        if (k == 0)
            m->pp_slot_bytes = m->activation_bytes - before;
    }
    if (rc)
        return rc;
    r->targets_host = malloc(B * sizeof(int32_t));
    if (!r->targets_host)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if (sync_active(r)) { /* C_last is the widest BN */
        size_t world = (size_t)dt_comm_world_size(r->comm);
        r->hgath = malloc(world * (2 * (size_t)r->C_last + 1) * sizeof(float));
        r->hmerged = malloc(2 * (size_t)r->C_last * sizeof(float));
        if (!r->hgath || !r->hmerged)
            return dt_err_set(err, -ENOMEM, "out of memory");
    }
    use_slot(r, 0);

    /* initialisation: the whole model's stream (the convolutions of other stages drawn into
     * scratch and dropped), so every stage starts with the one-process values */
    size_t most = 1;
    for (int i = 0; i < r->ndraws; i++)
        most = DT_MAX(most, r->draws[i].numel);
    float *host = calloc(m->num_params, sizeof(float));
    float *hbuf = calloc(m->num_buffers ? m->num_buffers : 1, sizeof(float));
    float *scratch = malloc(most * sizeof(float));
    if (!host || !hbuf || !scratch) {
        free(host);
        free(hbuf);
        free(scratch);
        return dt_err_set(err, -ENOMEM, "out of memory");
    }
    dt_rng rng;
    dt_rng_seed(&rng, cfg->seed);
    for (int i = 0; i < r->ndraws; i++) { /* conv: kaiming_normal_(fan_out, relu) */
        const conv_draw *d = &r->draws[i];
        dt_tensor_info t = {.numel = d->numel};
        float *dst = scratch;
        if (d->tensor >= 0) {
            t = m->tensors[d->tensor];
            dst = host;
        }
        dt_models_init_normal(dst, &t, &rng, d->std);
    }
    if (r->last) {
        dt_models_init_uniform(host, &m->tensors[r->fc_w], &rng, 1.0f / sqrtf((float)r->C_last));
        dt_models_init_uniform(host, &m->tensors[r->fc_b], &rng, 1.0f / sqrtf((float)r->C_last));
    }
    for (int i = 0; i < r->nbn; i++) /* BN: weight 1, bias 0 */
        dt_models_init_const(host, &m->tensors[r->bns[i]->w], 1.0f);
    for (int i = 0; i < m->num_buffer_tensors; i++)
        if (strstr(m->buffer_tensors[i].name, "running_var"))
            dt_models_init_const(hbuf, &m->buffer_tensors[i], 1.0f);
    dt_models_upload(m, host);
    if (m->num_buffers)
        m->be->memcpy_h2d(m->be, m->buffers, hbuf, m->num_buffers * sizeof(float));
    free(host);
    free(hbuf);
    free(scratch);
    return 0;
}
