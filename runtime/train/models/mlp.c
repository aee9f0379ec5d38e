/* mlp.c - `mlp`: a multi-layer perceptron classifier (Linear, ReLU, ..., Linear, softmax
 * cross-entropy), on vectors or flattened images.
 *
 * Parameters, in buffer order: fc.0.weight (H0,D), fc.0.bias (H0), fc.1.weight (H1,H0), ...,
 * fc.K.weight (classes,H_{K-1}), fc.K.bias. Hidden layers are He-initialised (normal, std
 * sqrt(2/fan_in)) for ReLU; the classifier uses PyTorch's default, uniform(+-1/sqrt(fan_in));
 * biases start at zero. Blocks (model.h): one per Linear, "fc.i". Backward reports each layer
 * (weight and bias) as soon as it is done, last layer first.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/models/mlp.h"
#include "runtime/train/models/models.h"

#define MLP_MAX_LAYERS 17

typedef struct mlp {
    int L;                        /* linear layers (n_hidden + 1) */
    int dims[MLP_MAX_LAYERS + 1]; /* dims[0] input, dims[i+1] output of layer i */
    int w[MLP_MAX_LAYERS], b[MLP_MAX_LAYERS]; /* tensor indices */
    float *x;                     /* (B,D) input, device */
    int32_t *targets;             /* (B) labels, device */
    int32_t *targets_host;        /* (B) host copy (for accuracy) */
    float *act[MLP_MAX_LAYERS];   /* act[i] (B,dims[i+1]): ReLU output (hidden) or logits (last) */
    float *losses;                /* (B) */
    float *dbuf[2];               /* (B, max width) backward scratch */
    int B, valid;                 /* of the last training forward */
    bool can_backward;
} mlp;

static float *P(dt_model *m, int t) { return m->params + m->tensors[t].offset; }
static float *G(dt_model *m, int t) { return m->grads + m->tensors[t].offset; }

static int mlp_forward(dt_model *m, const dt_batch *batch, bool training, float *loss, dt_err *err)
{
    mlp *n = m->impl;
    dt_backend *be = m->be;
    const int B = batch->B, D = n->dims[0], K = n->dims[n->L];
    n->can_backward = false;
    if (B <= 0 || B > m->cfg.max_batch || !batch->x || !batch->targets)
        return dt_err_set(err, -EINVAL, "mlp forward: batch of %d samples (1..%d, with inputs "
                                        "and labels expected)",
                          B, m->cfg.max_batch);
    for (int i = 0; i < B; i++)
        if (batch->targets[i] >= K)
            return dt_err_set(err, -EINVAL, "mlp forward: label %d of sample %d is not < %d "
                                            "classes",
                              batch->targets[i], i, K);
    be->memcpy_h2d(be, n->x, batch->x, (size_t)B * D * sizeof(float));
    be->memcpy_h2d(be, n->targets, batch->targets, (size_t)B * sizeof(int32_t));
    memcpy(n->targets_host, batch->targets, (size_t)B * sizeof(int32_t));
    for (int i = 0; i < n->L; i++) {
        const float *in = i == 0 ? n->x : n->act[i - 1];
        // act[i] (B,dims[i+1]) = in (B,dims[i]) @ W^T + b
        dt_models_event(m, i, DT_BLOCK_BEFORE_FORWARD);
        be->matmul_fwd(be, n->act[i], in, P(m, n->w[i]), P(m, n->b[i]), B, n->dims[i],
                       n->dims[i + 1]);
        dt_models_event(m, i, DT_BLOCK_AFTER_FORWARD);
        if (i < n->L - 1)
            be->relu_fwd(be, n->act[i], n->act[i], (size_t)B * n->dims[i + 1]);
    }
    float *logits = n->act[n->L - 1];
    int valid = 0;
    be->xent_fwd_bwd(be, n->losses, NULL, logits, n->targets, B, K, 1.0f, &valid);
    *loss = dt_models_mean_loss(m, n->losses, B, valid);
    m->last_correct = dt_models_count_correct(m, logits, n->targets_host, B, K);
    n->B = B;
    n->valid = valid;
    n->can_backward = training;
    return 0;
}

static int mlp_backward(dt_model *m, float dloss_scale, dt_grad_ready_fn ready, void *ctx,
                        dt_err *err)
{
    mlp *n = m->impl;
    dt_backend *be = m->be;
    if (!n->can_backward)
        return dt_err_set(err, -EINVAL, "mlp backward: no training forward to differentiate "
                                        "(call forward with training = true just before)");
    n->can_backward = false;
    const int B = n->B, K = n->dims[n->L];
    float *dout = n->act[n->L - 1]; /* dlogits, in place of the logits */
    float dl = n->valid > 0 ? dloss_scale / (float)n->valid : 0.0f;
    be->xent_fwd_bwd(be, n->losses, dout, dout, n->targets, B, K, dl, NULL);
    for (int i = n->L - 1; i >= 0; i--) {
        const float *in = i == 0 ? n->x : n->act[i - 1];
        float *dinp = NULL;
        if (i > 0) {
            dinp = n->dbuf[0];
            be->memset_zero(be, dinp, (size_t)B * n->dims[i] * sizeof(float));
        }
        dt_models_event(m, i, DT_BLOCK_BEFORE_BACKWARD);
        be->matmul_bwd(be, dinp, G(m, n->w[i]), G(m, n->b[i]), dout, in, P(m, n->w[i]), B,
                       n->dims[i], n->dims[i + 1]);
        dt_models_ready(m, n->w[i], n->b[i], ready, ctx);
        dt_models_event(m, i, DT_BLOCK_AFTER_BACKWARD);
        if (i > 0) {
            size_t cnt = (size_t)B * n->dims[i];
            be->memset_zero(be, n->dbuf[1], cnt * sizeof(float));
            be->relu_bwd(be, n->dbuf[1], n->act[i - 1], dinp, cnt);
            dout = n->dbuf[1];
        }
    }
    return 0;
}

static void mlp_free(dt_model *m)
{
    mlp *n = m->impl;
    if (!n)
        return;
    dt_backend *be = m->be;
    be->free(be, n->x);
    be->free(be, n->targets);
    be->free(be, n->losses);
    for (int i = 0; i < MLP_MAX_LAYERS; i++)
        be->free(be, n->act[i]);
    be->free(be, n->dbuf[0]);
    be->free(be, n->dbuf[1]);
    free(n->targets_host);
    free(n);
    m->impl = NULL;
}

static const dt_model_ops mlp_ops = {mlp_forward, mlp_backward, mlp_free};

int dt_mlp_create(dt_model *m, dt_err *err)
{
    const dt_model_config *cfg = &m->cfg;
    mlp *n = calloc(1, sizeof *n);
    if (!n)
        return dt_err_set(err, -ENOMEM, "out of memory");
    m->impl = n;
    m->ops = &mlp_ops;
    const dt_sample_shape *s = &cfg->shape;
    n->L = cfg->n_hidden + 1;
    n->dims[0] = s->input_dim > 0 ? s->input_dim : s->channels * s->height * s->width;
    for (int i = 0; i < cfg->n_hidden; i++)
        n->dims[i + 1] = cfg->hidden[i];
    n->dims[n->L] = s->n_classes;
    int rc = 0, maxw = 0;
    double flops = 0;
    for (int i = 0; i < n->L; i++) {
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
    m->flops_per_sample = flops;
    for (int i = 0; i < n->L; i++) /* blocks (model.h): one per Linear */
        if ((rc = dt_models_add_block(m, n->w[i], n->b[i], 1, err, "fc.%d", i)) < 0)
            return rc;
    if ((rc = dt_models_alloc(m, err)))
        return rc;

    const size_t B = (size_t)cfg->max_batch;
    rc = dt_models_falloc(m, &n->x, B * n->dims[0], err);
    if (!rc)
        rc = dt_models_ialloc(m, &n->targets, B, err);
    if (!rc)
        rc = dt_models_falloc(m, &n->losses, B, err);
    for (int i = 0; i < n->L && !rc; i++)
        rc = dt_models_falloc(m, &n->act[i], B * n->dims[i + 1], err);
    if (!rc)
        rc = dt_models_falloc(m, &n->dbuf[0], B * maxw, err);
    if (!rc)
        rc = dt_models_falloc(m, &n->dbuf[1], B * maxw, err);
    if (rc)
        return rc;
    n->targets_host = malloc(B * sizeof(int32_t));
    float *host = calloc(m->num_params, sizeof(float));
    if (!n->targets_host || !host) {
        free(host);
        return dt_err_set(err, -ENOMEM, "out of memory");
    }
    dt_rng r;
    dt_rng_seed(&r, cfg->seed);
    for (int i = 0; i < n->L; i++) {
        const dt_tensor_info *w = &m->tensors[n->w[i]];
        if (i < n->L - 1)
            dt_models_init_normal(host, w, &r, sqrtf(2.0f / (float)n->dims[i]));
        else
            dt_models_init_uniform(host, w, &r, 1.0f / sqrtf((float)n->dims[i]));
    }
    dt_models_upload(m, host);
    free(host);
    return 0;
}
