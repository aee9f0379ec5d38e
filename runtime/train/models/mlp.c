/* mlp.c - `mlp`: a multi-layer perceptron classifier (Linear, ReLU, ..., Linear, softmax
 * cross-entropy), on vectors or flattened images, whole or as one pipeline stage.
 *
 * Parameters, in buffer order: fc.0.weight (H0,D), fc.0.bias (H0), fc.1.weight (H1,H0), ...,
 * fc.K.weight (classes,H_{K-1}), fc.K.bias. Hidden layers are He-initialised (normal, std
 * sqrt(2/fan_in)) for ReLU; the classifier uses PyTorch's default, uniform(+-1/sqrt(fan_in));
 * biases start at zero. Blocks (model.h): one per Linear, "fc.i". Backward reports each layer
 * (weight and bias) as soon as it is done, last layer first.
 *
 * Pipeline stages (model.h, cfg.pp_size > 1): the stage holds Linear layers [lo, hi) under
 * their usual names; a stage boundary is a hidden layer's ReLU output (B, dims[hi]), so a
 * stage's output gradient goes through that ReLU first, and its input gradient is the first
 * Linear's. Initialisation draws every layer of the whole model (into scratch for the layers
 * other stages hold), so each stage starts with exactly the one-process values. The whole model
 * is the one stage of one with one slot: forward/backward are stage_forward/stage_backward of
 * slot 0, the same ops in the same order as ever.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/models/mlp.h"
#include "runtime/train/models/models.h"

#define MLP_MAX_LAYERS 17

/* One micro-batch's activations (model.h's slots). */
typedef struct mlp_slot {
    float *x;                     /* (B,D) input, device (stage 0) */
    const float *in;              /* (B,dims[lo]) borrowed input of a later stage */
    int32_t *targets;             /* (B) labels, device (last stage) */
    float *act[MLP_MAX_LAYERS];   /* act[i] (B,dims[i+1]) for lo <= i < hi: ReLU output (hidden)
                                     or logits (last) */
    int B, valid;                 /* of the slot's last training forward */
    bool can_backward;
} mlp_slot;

typedef struct mlp {
    int L;                        /* linear layers of the whole model (n_hidden + 1) */
    int lo, hi;                   /* this stage's layers [lo, hi) (the whole model: 0, L) */
    int dims[MLP_MAX_LAYERS + 1]; /* dims[0] input, dims[i+1] output of layer i */
    int w[MLP_MAX_LAYERS], b[MLP_MAX_LAYERS]; /* tensor indices of layer i (lo <= i < hi) */
    int nslots;
    mlp_slot *slots;              /* (nslots) */
    int32_t *targets_host;        /* (B) host copy (for accuracy) */
    float *losses;                /* (B) */
    float *dbuf[2];               /* (B, max width) backward scratch */
} mlp;

static float *P(dt_model *m, int t) { return m->params + m->tensors[t].offset; }
static float *G(dt_model *m, int t) { return m->grads + m->tensors[t].offset; }

static int mlp_stage_forward(dt_model *m, int slot, const dt_batch *batch, const float *in,
                             bool training, float **out, float *loss, dt_err *err)
{
    mlp *n = m->impl;
    dt_backend *be = m->be;
    const int B = batch->B, D = n->dims[0], K = n->dims[n->L];
    const bool first = n->lo == 0, last = n->hi == n->L;
    if (slot < 0 || slot >= n->nslots)
        return dt_err_set(err, -EINVAL, "mlp forward: slot %d of %d", slot, n->nslots);
    mlp_slot *sl = &n->slots[slot];
    sl->can_backward = false;
    if (B <= 0 || B > m->cfg.max_batch || (first && !batch->x) || (!first && !in) ||
        (last && !batch->targets))
        return dt_err_set(err, -EINVAL, "mlp forward: batch of %d samples (1..%d, with %s%s "
                                        "expected)",
                          B, m->cfg.max_batch, first ? "inputs" : "the previous stage's output",
                          last ? " and labels" : "");
    if (last)
        for (int i = 0; i < B; i++)
            if (batch->targets[i] >= K)
                return dt_err_set(err, -EINVAL, "mlp forward: label %d of sample %d is not < %d "
                                                "classes",
                                  batch->targets[i], i, K);
    if (first)
        be->memcpy_h2d(be, sl->x, batch->x, (size_t)B * D * sizeof(float));
    if (last) {
        be->memcpy_h2d(be, sl->targets, batch->targets, (size_t)B * sizeof(int32_t));
        memcpy(n->targets_host, batch->targets, (size_t)B * sizeof(int32_t));
    }
    sl->in = first ? sl->x : in;
    for (int i = n->lo; i < n->hi; i++) {
        const float *x = i == n->lo ? sl->in : sl->act[i - 1];
        // act[i] (B,dims[i+1]) = x (B,dims[i]) @ W^T + b
        dt_models_event(m, i - n->lo, DT_BLOCK_BEFORE_FORWARD);
        be->matmul_fwd(be, sl->act[i], x, P(m, n->w[i]), P(m, n->b[i]), B, n->dims[i],
                       n->dims[i + 1]);
        dt_models_event(m, i - n->lo, DT_BLOCK_AFTER_FORWARD);
        if (i < n->L - 1)
            be->relu_fwd(be, sl->act[i], sl->act[i], (size_t)B * n->dims[i + 1]);
    }
    int valid = 0;
    *loss = 0;
    if (out)
        *out = last ? NULL : sl->act[n->hi - 1];
    if (last) {
        float *logits = sl->act[n->L - 1];
        be->xent_fwd_bwd(be, n->losses, NULL, logits, sl->targets, B, K, 1.0f, &valid);
        *loss = dt_models_mean_loss(m, n->losses, B, valid);
        m->last_correct = dt_models_count_correct(m, logits, n->targets_host, B, K);
    }
    sl->B = B;
    sl->valid = valid;
    sl->can_backward = training;
    return 0;
}

static int mlp_stage_backward(dt_model *m, int slot, float dloss_scale, const float *dout_in,
                              float *din, dt_grad_ready_fn ready, void *ctx, dt_err *err)
{
    mlp *n = m->impl;
    dt_backend *be = m->be;
    const bool last = n->hi == n->L;
    if (slot < 0 || slot >= n->nslots)
        return dt_err_set(err, -EINVAL, "mlp backward: slot %d of %d", slot, n->nslots);
    mlp_slot *sl = &n->slots[slot];
    if (!sl->can_backward)
        return dt_err_set(err, -EINVAL, "mlp backward: no training forward to differentiate in "
                                        "slot %d (call forward with training = true before)",
                          slot);
    if (!last && !dout_in)
        return dt_err_set(err, -EINVAL, "mlp backward: stage %d of %d needs the next stage's "
                                        "gradient",
                          m->cfg.pp_rank, m->cfg.pp_size);
    sl->can_backward = false;
    const int B = sl->B, K = n->dims[n->L];
    float *dout;
    if (last) {
        dout = sl->act[n->L - 1]; /* dlogits, in place of the logits */
        float dl = sl->valid > 0 ? dloss_scale / (float)sl->valid : 0.0f;
        be->xent_fwd_bwd(be, n->losses, dout, dout, sl->targets, B, K, dl, NULL);
    } else {
        /* through the ReLU of the stage's last (hidden) layer */
        size_t cnt = (size_t)B * n->dims[n->hi];
        be->memset_zero(be, n->dbuf[1], cnt * sizeof(float));
        be->relu_bwd(be, n->dbuf[1], sl->act[n->hi - 1], dout_in, cnt);
        dout = n->dbuf[1];
    }
    for (int i = n->hi - 1; i >= n->lo; i--) {
        const float *x = i == n->lo ? sl->in : sl->act[i - 1];
        float *dinp = i > n->lo ? n->dbuf[0] : din;
        if (dinp)
            be->memset_zero(be, dinp, (size_t)B * n->dims[i] * sizeof(float));
        dt_models_event(m, i - n->lo, DT_BLOCK_BEFORE_BACKWARD);
        be->matmul_bwd(be, dinp, G(m, n->w[i]), G(m, n->b[i]), dout, x, P(m, n->w[i]), B,
                       n->dims[i], n->dims[i + 1]);
        dt_models_ready(m, n->w[i], n->b[i], ready, ctx);
        dt_models_event(m, i - n->lo, DT_BLOCK_AFTER_BACKWARD);
        if (i > n->lo) {
            size_t cnt = (size_t)B * n->dims[i];
            be->memset_zero(be, n->dbuf[1], cnt * sizeof(float));
            be->relu_bwd(be, n->dbuf[1], sl->act[i - 1], dinp, cnt);
            dout = n->dbuf[1];
        }
    }
    return 0;
}

static int mlp_forward(dt_model *m, const dt_batch *batch, bool training, float *loss, dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "mlp forward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return mlp_stage_forward(m, 0, batch, NULL, training, NULL, loss, err);
}

static int mlp_backward(dt_model *m, float dloss_scale, dt_grad_ready_fn ready, void *ctx,
                        dt_err *err)
{
    if (m->cfg.pp_size > 1)
        return dt_err_set(err, -EINVAL, "mlp backward: this model is pipeline stage %d of %d: "
                                        "drive it with its stage ops",
                          m->cfg.pp_rank, m->cfg.pp_size);
    return mlp_stage_backward(m, 0, dloss_scale, NULL, NULL, ready, ctx, err);
}

static void mlp_free(dt_model *m)
{
    mlp *n = m->impl;
    if (!n)
        return;
    dt_backend *be = m->be;
    for (int s = 0; s < n->nslots && n->slots; s++) {
        mlp_slot *sl = &n->slots[s];
        be->free(be, sl->x);
        be->free(be, sl->targets);
        for (int i = 0; i < MLP_MAX_LAYERS; i++)
            be->free(be, sl->act[i]);
    }
    free(n->slots);
    be->free(be, n->losses);
    be->free(be, n->dbuf[0]);
    be->free(be, n->dbuf[1]);
    free(n->targets_host);
    free(n);
    m->impl = NULL;
}

static const dt_model_ops mlp_ops = {mlp_forward, mlp_backward, mlp_free};
static const dt_model_stage_ops mlp_stage_ops = {mlp_stage_forward, mlp_stage_backward};

/* Layer i's weight drawn as the whole model draws it: into host (m's buffer) when this stage
 * holds the layer, else into scratch (at least dims[i] x dims[i+1] floats) and dropped. */
static void init_weight(dt_model *m, mlp *n, int i, float *host, float *scratch, dt_rng *r)
{
    float std = sqrtf(2.0f / (float)n->dims[i]), bound = 1.0f / sqrtf((float)n->dims[i]);
    dt_tensor_info t;
    if (i >= n->lo && i < n->hi) {
        t = m->tensors[n->w[i]];
    } else {
        memset(&t, 0, sizeof t);
        t.numel = (size_t)n->dims[i] * (size_t)n->dims[i + 1];
        host = scratch;
    }
    if (i < n->L - 1)
        dt_models_init_normal(host, &t, r, std);
    else
        dt_models_init_uniform(host, &t, r, bound);
}

int dt_mlp_create(dt_model *m, dt_err *err)
{
    const dt_model_config *cfg = &m->cfg;
    mlp *n = calloc(1, sizeof *n);
    if (!n)
        return dt_err_set(err, -ENOMEM, "out of memory");
    m->impl = n;
    m->ops = &mlp_ops;
    m->stage = &mlp_stage_ops;
    const dt_sample_shape *s = &cfg->shape;
    n->L = cfg->n_hidden + 1;
    n->dims[0] = s->input_dim > 0 ? s->input_dim : s->channels * s->height * s->width;
    for (int i = 0; i < cfg->n_hidden; i++)
        n->dims[i + 1] = cfg->hidden[i];
    n->dims[n->L] = s->n_classes;
    n->lo = 0;
    n->hi = n->L;
    if (cfg->pp_size > 1) {
        if (cfg->pp_rank < 0 || cfg->pp_rank >= cfg->pp_size || cfg->pp_first < 0 ||
            cfg->pp_count < 1 || cfg->pp_first + cfg->pp_count > n->L)
            return dt_err_set(err, -EINVAL, "mlp: pipeline stage %d of %d with layers %d..%d "
                                            "of the model's %d (parallel.stages)",
                              cfg->pp_rank, cfg->pp_size, cfg->pp_first,
                              cfg->pp_first + cfg->pp_count - 1, n->L);
        if ((cfg->pp_rank == 0) != (cfg->pp_first == 0) ||
            (cfg->pp_rank == cfg->pp_size - 1) != (cfg->pp_first + cfg->pp_count == n->L))
            return dt_err_set(err, -EINVAL, "mlp: pipeline stage %d of %d holds layers %d..%d: "
                                            "the first stage must start at layer 0 and the "
                                            "last end at layer %d",
                              cfg->pp_rank, cfg->pp_size, cfg->pp_first,
                              cfg->pp_first + cfg->pp_count - 1, n->L - 1);
        n->lo = cfg->pp_first;
        n->hi = cfg->pp_first + cfg->pp_count;
    }
    const bool first = n->lo == 0, last = n->hi == n->L;
    m->pp_in_numel = first ? 0 : (size_t)n->dims[n->lo];
    m->pp_out_numel = last ? 0 : (size_t)n->dims[n->hi];
    int rc = 0, maxw = 0, maxin = 0;
    double flops = 0;
    for (int i = n->lo; i < n->hi; i++) {
        int64_t wshape[2] = {n->dims[i + 1], n->dims[i]}, bshape[1] = {n->dims[i + 1]};
        rc = n->w[i] = dt_models_add(m, false, 2, wshape, err, "fc.%d.weight", i);
        if (rc < 0)
            return rc;
        rc = n->b[i] = dt_models_add(m, true, 1, bshape, err, "fc.%d.bias", i);
        if (rc < 0)
            return rc;
        flops += 6.0 * n->dims[i] * n->dims[i + 1];
        if (n->dims[i + 1] > maxw)
            maxw = n->dims[i + 1];
    }
    for (int i = 0; i < n->L; i++)
        if ((size_t)n->dims[i] * n->dims[i + 1] > (size_t)maxin)
            maxin = n->dims[i] * n->dims[i + 1];
    m->flops_per_sample = flops;
    for (int i = n->lo; i < n->hi; i++) /* blocks (model.h): one per Linear */
        if ((rc = dt_models_add_block(m, n->w[i], n->b[i], 1, err, "fc.%d", i)) < 0)
            return rc;
    if ((rc = dt_models_alloc(m, err)))
        return rc;

    const size_t B = (size_t)cfg->max_batch;
    n->nslots = cfg->pp_size > 1 && cfg->pp_slots > 1 ? cfg->pp_slots : 1;
    if (!(n->slots = calloc((size_t)n->nslots, sizeof *n->slots)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    size_t before = m->activation_bytes;
    for (int k = 0; k < n->nslots && !rc; k++) {
        mlp_slot *sl = &n->slots[k];
        if (first)
            rc = dt_models_falloc(m, &sl->x, B * n->dims[0], err);
        if (!rc && last)
            rc = dt_models_ialloc(m, &sl->targets, B, err);
        for (int i = n->lo; i < n->hi && !rc; i++)
            rc = dt_models_falloc(m, &sl->act[i], B * n->dims[i + 1], err);
        if (k == 0)
            m->pp_slot_bytes = m->activation_bytes - before;
    }
    if (!rc)
        rc = dt_models_falloc(m, &n->losses, B, err);
    /* dbuf[0]: the gradient of a hidden layer's output inside the stage; dbuf[1]: after its
     * ReLU (and the stage output's, dims[hi]): widths of this stage's outputs, at most maxw */
    if (!rc)
        rc = dt_models_falloc(m, &n->dbuf[0], B * maxw, err);
    if (!rc)
        rc = dt_models_falloc(m, &n->dbuf[1], B * maxw, err);
    if (rc)
        return rc;
    n->targets_host = malloc(B * sizeof(int32_t));
    float *host = calloc(m->num_params, sizeof(float));
    float *scratch = cfg->pp_size > 1 ? malloc((size_t)maxin * sizeof(float)) : NULL;
    if (!n->targets_host || !host || (cfg->pp_size > 1 && !scratch)) {
        free(host);
        free(scratch);
        return dt_err_set(err, -ENOMEM, "out of memory");
    }
    dt_rng r;
    dt_rng_seed(&r, cfg->seed);
    for (int i = 0; i < n->L; i++) /* the whole model's stream, whatever this stage holds */
        init_weight(m, n, i, host, scratch, &r);
    dt_models_upload(m, host);
    free(host);
    free(scratch);
    return 0;
}
