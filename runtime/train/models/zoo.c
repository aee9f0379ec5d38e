/* zoo.c - the model zoo's registry, the implementation of runtime/train/models/model.h: configuration
 * from a job, creation by type (dispatching to gpt.c, bert.c, mlp.c, resnet.c through their headers),
 * freeing, block hooks and sizes. The helpers the models share are models.c (models.h), the
 * tensor look-up and the tensor-parallel slices of model.h among them; they never call back into
 * this file, so the registry -> model -> helpers dependencies run one way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"
#include "runtime/train/models/bert.h"
#include "runtime/train/models/gpt.h"
#include "runtime/train/models/llama.h"
#include "runtime/train/models/mlp.h"
#include "runtime/train/models/models.h"
#include "runtime/train/models/resnet.h"

/* ------------------------------------------------------------------------------------------ */
/* configuration */

static int check_config(const dt_model_config *cfg, dt_err *err);

static const char *const arch_names[DT_ARCH_COUNT] = {
    [DT_ARCH_MLP] = "mlp", [DT_ARCH_RESNET] = "resnet", [DT_ARCH_GPT] = "gpt",
    [DT_ARCH_BERT] = "bert", [DT_ARCH_LLAMA] = "llama"};

const char *dt_model_arch_name(dt_model_arch arch)
{
    return (unsigned)arch < DT_ARCH_COUNT && arch_names[arch] ? arch_names[arch] : "?";
}

int dt_model_arch_parse(const char *name, dt_model_arch *out, dt_err *err)
{
    for (int a = 0; a < DT_ARCH_COUNT; a++)
        if (arch_names[a] && !strcmp(name, arch_names[a])) {
            *out = (dt_model_arch)a;
            return 0;
        }
    return dt_err_set(err, -EINVAL, "unknown model \"%s\" (mlp, resnet, gpt)", name);
}

int dt_model_config_from_job(dt_model_config *cfg, const struct dt_job *job,
                             const dt_sample_shape *shape, dt_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    switch (job->model_type) { /* config's model.type onto the zoo's architectures */
    case DT_MODEL_MLP:
        cfg->arch = DT_ARCH_MLP;
        break;
    case DT_MODEL_RESNET:
        cfg->arch = DT_ARCH_RESNET;
        break;
    case DT_MODEL_GPT:
        cfg->arch = DT_ARCH_GPT;
        break;
    case DT_MODEL_BERT:
        cfg->arch = DT_ARCH_BERT;
        break;
    case DT_MODEL_LLAMA:
        cfg->arch = DT_ARCH_LLAMA;
        break;
    default:
        return dt_err_set(err, -EINVAL, "model.type: not set (mlp, resnet, gpt, bert, llama)");
    }
    cfg->shape = *shape;
    cfg->max_batch = job->batch_size;
    cfg->seed = (uint64_t)job->seed;
    cfg->bn_momentum = 0.1f;
    cfg->bn_eps = 1e-5f;
    cfg->recompute = job->recompute == DT_RECOMP_BLOCK       ? DT_RECOMPUTE_BLOCK
                     : job->recompute == DT_RECOMP_SELECTIVE ? DT_RECOMPUTE_SELECTIVE
                                                             : DT_RECOMPUTE_NONE;
    if (dt_model_reads_tokens(job->model_type)) {
        cfg->n_layer = job->n_layer;
        cfg->n_head = job->n_head;
        cfg->n_embd = job->n_embd;
        cfg->block_size = job->block_size;
        cfg->nsp = job->model_type == DT_MODEL_BERT && job->nsp;
        cfg->n_kv_head = job->n_kv_head;
        cfg->ffn_hidden = job->intermediate_size;
        cfg->rope_theta = (float)job->rope_theta;
        cfg->norm_eps = (float)job->rms_norm_eps;
    } else if (job->model_type == DT_MODEL_MLP) {
        _Static_assert(DT_ARRAY_LEN(cfg->hidden) >= DT_MAX_HIDDEN, "room for model.hidden");
        int n = dt_job_mlp_widths(job->hidden, cfg->hidden, err); /* the job's one parser */
        if (n < 0)
            return n;
        cfg->n_hidden = n;
    } else if (job->model_type == DT_MODEL_RESNET) {
        cfg->depth = job->depth;
        cfg->width = job->width;
        cfg->sync_bn = job->sync_bn;
        cfg->imagenet = !strncmp(dt_preset_name(job->preset), "resnet", 6);
    }
    return check_config(cfg, err);
}

/* The llama model's settings (model.h's fields; the job's keys named in the messages). */
static int check_llama(const dt_model_config *cfg, dt_err *err)
{
    const dt_sample_shape *s = &cfg->shape;
    const int T = cfg->tp_size > 1 ? cfg->tp_size : 1;
    const int nkv = cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head;
    if (cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd <= 0 || cfg->block_size <= 0 ||
        cfg->ffn_hidden <= 0 || cfg->n_kv_head < 0)
        return dt_err_set(err, -EINVAL,
                          "model: llama needs n_layer, n_head, n_embd, intermediate_size and "
                          "block_size > 0 (or a preset: llama-tiny, llama3-8b, llama3-70b)");
    if (cfg->n_embd % cfg->n_head || (cfg->n_embd / cfg->n_head) % 2)
        return dt_err_set(err, -EINVAL,
                          "model: llama's head size n_embd / n_head (%d / %d) must be a whole, "
                          "even number (rotary embeddings turn pairs of channels)",
                          cfg->n_embd, cfg->n_head);
    if (cfg->n_head % nkv)
        return dt_err_set(err, -EINVAL,
                          "model.n_kv_head = %d must divide model.n_head = %d (grouped-query "
                          "attention: each key/value head serves n_head / n_kv_head query heads)",
                          nkv, cfg->n_head);
    if (!(cfg->rope_theta > 0) || cfg->norm_eps < 0)
        return dt_err_set(err, -EINVAL, "model: llama needs rope_theta > 0 and rms_norm_eps >= 0 "
                                        "(got %g and %g)",
                          (double)cfg->rope_theta, (double)cfg->norm_eps);
    if (s->kind != DT_SAMPLE_TOKENS)
        return dt_err_set(err, -EINVAL, "model llama needs token data (text or tokens)");
    if (s->seq_len <= 0 || s->seq_len > cfg->block_size)
        return dt_err_set(err, -EINVAL,
                          "model llama: the data's sequence length %d must be in 1..block_size "
                          "(%d): set data.seq_len or model.block_size",
                          s->seq_len, cfg->block_size);
    if (s->vocab_size <= 0)
        return dt_err_set(err, -EINVAL, "model llama: the data has no vocabulary size");
    if (T > 1 && (cfg->n_head % T || nkv % T || cfg->ffn_hidden % T))
        return dt_err_set(err, -EINVAL,
                          "model llama: parallel.tensor = %d must divide model.n_head (%d), "
                          "model.n_kv_head (%d) and model.intermediate_size (%d): each rank "
                          "holds whole query and key/value heads and an equal share of the MLP",
                          T, cfg->n_head, nkv, cfg->ffn_hidden);
    return 0;
}

static int check_config(const dt_model_config *cfg, dt_err *err)
{
    const dt_sample_shape *s = &cfg->shape;
    if (cfg->tp_size < 0 || (cfg->tp_size > 1 && (cfg->tp_rank < 0 || cfg->tp_rank >= cfg->tp_size)))
        return dt_err_set(err, -EINVAL,
                          "model: tensor-parallel rank %d of %d (tp_rank must be in 0..tp_size-1, "
                          "tp_size >= 0; 0 and 1 mean no tensor parallelism)",
                          cfg->tp_rank, cfg->tp_size);
    if (cfg->max_batch <= 0)
        return dt_err_set(err, -EINVAL, "model: batch size must be positive (got %d)",
                          cfg->max_batch);
    if (cfg->recompute != DT_RECOMPUTE_NONE && cfg->recompute != DT_RECOMPUTE_BLOCK &&
        cfg->recompute != DT_RECOMPUTE_SELECTIVE)
        return dt_err_set(err, -EINVAL, "model: unknown recompute mode %d", (int)cfg->recompute);
    if (cfg->arch == DT_ARCH_LLAMA)
        return check_llama(cfg, err);
    const bool transformer = cfg->arch == DT_ARCH_GPT || cfg->arch == DT_ARCH_BERT;
    if (cfg->recompute == DT_RECOMPUTE_SELECTIVE && !transformer)
        return dt_err_set(err, -EINVAL,
                          "train.recompute = selective recomputes attention, which only gpt, "
                          "bert and llama have (model %s: use none or block)",
                          dt_model_arch_name(cfg->arch));
    if (transformer) {
        const char *t = dt_model_arch_name(cfg->arch);
        const bool bert = cfg->arch == DT_ARCH_BERT;
        if (cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd <= 0 || cfg->block_size <= 0)
            return dt_err_set(err, -EINVAL,
                              "model: %s needs n_layer, n_head, n_embd and block_size > 0 (or a "
                              "preset: %s)",
                              t, bert ? "bert-tiny, bert-base, bert-large"
                                      : "gpt-tiny, gpt-mini, gpt2-124m");
        if (cfg->n_embd % cfg->n_head)
            return dt_err_set(err, -EINVAL, "model: n_embd (%d) must be divisible by n_head (%d)",
                              cfg->n_embd, cfg->n_head);
        if (s->kind != DT_SAMPLE_TOKENS)
            return dt_err_set(err, -EINVAL, "model %s needs token data (text, tokens or synthetic "
                                            "tokens)",
                              t);
        if (s->seq_len <= 0 || s->seq_len > cfg->block_size)
            return dt_err_set(err, -EINVAL,
                              "model %s: the data's sequence length %d must be in 1..block_size "
                              "(%d): set data.seq_len or model.block_size",
                              t, s->seq_len, cfg->block_size);
        if (s->vocab_size <= 0)
            return dt_err_set(err, -EINVAL, "model %s: the data has no vocabulary size", t);
        if (cfg->tp_size > 1 && cfg->n_head % cfg->tp_size)
            return dt_err_set(err, -EINVAL,
                              "model %s: parallel.tensor = %d must divide model.n_head (%d): "
                              "each rank holds n_head / tensor attention heads; choose a "
                              "divisor of n_head",
                              t, cfg->tp_size, cfg->n_head);
        if (cfg->nsp && !bert)
            return dt_err_set(err, -EINVAL, "model.nsp: the next-sentence head is bert's (model "
                                            "%s)",
                              t);
        return 0;
    }
    if (cfg->tp_size > 1)
        return dt_err_set(err, -EINVAL,
                          "parallel.tensor = %d: tensor parallelism splits gpt's, bert's and "
                          "llama's attention, MLP and vocabulary only; model %s has no "
                          "tensor-parallel form (set parallel.tensor = 1)",
                          cfg->tp_size, dt_model_arch_name(cfg->arch));
    if (cfg->arch == DT_ARCH_MLP) {
        if (s->kind == DT_SAMPLE_TOKENS)
            return dt_err_set(err, -EINVAL, "model mlp needs vector or image samples, not tokens");
        int in = s->kind == DT_SAMPLE_IMAGE && s->input_dim <= 0
                     ? s->channels * s->height * s->width
                     : s->input_dim;
        if (in <= 0 || s->n_classes <= 0)
            return dt_err_set(err, -EINVAL, "model mlp: the data has no input size or no classes");
        for (int i = 0; i < cfg->n_hidden; i++)
            if (cfg->hidden[i] <= 0)
                return dt_err_set(err, -EINVAL, "model.hidden: widths must be positive");
        if (cfg->n_hidden < 0 || cfg->n_hidden > (int)DT_ARRAY_LEN(cfg->hidden))
            return dt_err_set(err, -EINVAL, "model.hidden: 0 to 16 hidden layers");
        return 0;
    }
    if (cfg->arch == DT_ARCH_RESNET && cfg->imagenet) {
        const int d = cfg->depth;
        if (d != 18 && d != 26 && d != 34 && d != 50 && d != 101 && d != 152)
            return dt_err_set(err, -EINVAL,
                              "model resnet: torchvision's ImageNet ResNet has depth 18, 34, 50, "
                              "101 or 152 (model.preset = resnet18 ... resnet152), not %d",
                              d);
        if (cfg->width <= 0)
            return dt_err_set(err, -EINVAL, "model.width must be positive");
        if (s->kind != DT_SAMPLE_IMAGE || s->channels <= 0 || s->height <= 0 || s->width <= 0)
            return dt_err_set(err, -EINVAL, "model resnet needs image samples (C,H,W)");
        if (s->n_classes <= 0)
            return dt_err_set(err, -EINVAL, "model resnet: the data has no classes");
        return 0;
    }
    if (cfg->arch == DT_ARCH_RESNET) {
        if (cfg->depth < 8 || (cfg->depth - 2) % 6)
            return dt_err_set(err, -EINVAL,
                              "model.depth: %d is not 6n+2 with n >= 1 (use 20, 32, 44, 56 or 110)",
                              cfg->depth);
        if (cfg->width <= 0)
            return dt_err_set(err, -EINVAL, "model.width must be positive");
        if (s->kind != DT_SAMPLE_IMAGE || s->channels <= 0 || s->height <= 0 || s->width <= 0)
            return dt_err_set(err, -EINVAL, "model resnet needs image samples (C,H,W)");
        if (s->height < 4 || s->width < 4)
            return dt_err_set(err, -EINVAL,
                              "model resnet: images of %dx%d are too small (at least 4x4: two "
                              "stride-2 stages)",
                              s->height, s->width);
        if (s->n_classes <= 0)
            return dt_err_set(err, -EINVAL, "model resnet: the data has no classes");
        return 0;
    }
    return dt_err_set(err, -EINVAL,
                      "model.type: unknown model architecture %d (mlp, resnet, gpt, bert, llama)",
                      (int)cfg->arch);
}

/* ------------------------------------------------------------------------------------------ */
/* creation */

int dt_model_create(dt_model **out, const dt_model_config *cfg, dt_backend *be, dt_comm *comm,
                    dt_err *err)
{
    *out = NULL;
    int rc = check_config(cfg, err);
    if (rc)
        return rc;
    if (cfg->tp_size > 1 && !comm)
        return dt_err_set(err, -EINVAL,
                          "creating model %s: tensor parallelism (tp_size %d) needs the tensor "
                          "group's communicator, and none was given",
                          dt_model_arch_name(cfg->arch), cfg->tp_size);
    if (cfg->tp_size > 1 &&
        (dt_comm_world_size(comm) != cfg->tp_size || dt_comm_rank(comm) != cfg->tp_rank))
        return dt_err_set(err, -EINVAL,
                          "creating model %s: tensor-parallel rank %d of %d, but the communicator "
                          "given is rank %d of %d: pass the tensor group (dt_groups_open's tp), "
                          "not the world",
                          dt_model_arch_name(cfg->arch), cfg->tp_rank, cfg->tp_size,
                          dt_comm_rank(comm), dt_comm_world_size(comm));
    dt_model *m = calloc(1, sizeof *m);
    if (!m)
        return dt_err_set(err, -ENOMEM, "model: out of memory");
    m->cfg = *cfg;
    m->be = be;
    /* what a model allocates besides its parameters, gradients and buffers (dt_models_alloc
     * tags those) is what a step works in: activations, inputs, targets */
    dt_mem_cat old_cat = dt_mem_tag(be, DT_MEM_ACTS);
    switch (cfg->arch) {
    case DT_ARCH_GPT:
        rc = dt_gpt_create(m, comm, err);
        break;
    case DT_ARCH_BERT:
        rc = dt_bert_create(m, comm, err);
        break;
    case DT_ARCH_LLAMA:
        rc = dt_llama_create(m, comm, err);
        break;
    case DT_ARCH_MLP:
        rc = dt_mlp_create(m, err);
        break;
    default: /* check_config let only the zoo's through */
        rc = dt_resnet_create(m, comm, err);
        break;
    }
    dt_mem_tag(be, old_cat);
    if (!rc)
        rc = dt_models_check_blocks(m, err);
    if (rc) {
        dt_err_prefix(err, "creating model %s: ", dt_model_arch_name(cfg->arch));
        dt_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* freeing, block hooks and sizes (the tensor look-up and the tensor-parallel slices are
 * models.c's: the models call them) */

void dt_model_free(dt_model *m)
{
    if (!m)
        return;
    if (m->ops && m->ops->free)
        m->ops->free(m);
    if (m->be) {
        m->be->free(m->be, m->params);
        m->be->free(m->be, m->own_grads ? m->own_grads : m->grads); /* never lent memory */
        m->be->free(m->be, m->buffers);
    }
    free(m->tensors);
    free(m->buffer_tensors);
    free(m->blocks);
    free(m);
}

float *dt_model_lend_grads(dt_model *m, float *grads)
{
    float *own = m->own_grads ? m->own_grads : m->grads;
    m->grads = grads ? grads : own;
    m->own_grads = grads ? own : NULL;
    return own;
}

void dt_model_set_block_hook(dt_model *m, dt_block_hook_fn fn, void *ctx)
{
    m->block_hook = fn;
    m->block_hook_ctx = fn ? ctx : NULL;
}

size_t dt_model_activation_bytes(const dt_model *m)
{
    return m ? m->activation_bytes : 0;
}
