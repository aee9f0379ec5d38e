/* models.h - the helpers shared by the model zoo (mlp.c, resnet.c, gpt.c), implemented in
 * models.c; everyone else uses runtime/train/models/model.h. Each model's create function is in its own
 * header (gpt.h, mlp.h, resnet.h), which only the registry (zoo.c) and tests include.
 *
 * A model is built in three steps: its create function declares every parameter tensor in
 * buffer order with dt_models_add (the same for buffers with dt_models_add_buffer), then
 * dt_models_alloc allocates the flat parameter, gradient and buffer storage, and the model
 * initialises its parameters on the host (one dt_rng seeded with cfg.seed, tensors in table
 * order) and uploads them with dt_models_upload. Activations are the model's own business.
 */
#ifndef DT_MODELS_H
#define DT_MODELS_H

#include <stdarg.h>

#include "common/rng.h"
#include "runtime/train/models/model.h"

/* Appends a parameter tensor "fmt..." of ndim dims (shape) to m's table; no_decay for biases
 * and normalisation parameters. It is replicated (tp_parts 0, whole_shape = shape): a model
 * that splits it for tensor parallelism sets tp_dim, tp_parts and whole_shape afterwards.
 * Returns its index, or a negative error. */
int dt_models_add(dt_model *m, bool no_decay, int ndim, const int64_t *shape, dt_err *err,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The same for a non-trained buffer (BatchNorm running statistics). */
int dt_models_add_buffer(dt_model *m, int ndim, const int64_t *shape, dt_err *err,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Allocates m->params, m->grads (zeroed) and m->buffers for the tables built so far, charged to
 * the memory categories params, grads and other. */
int dt_models_alloc(dt_model *m, dt_err *err);

/* Allocates n floats of zeroed backend memory into *p (for activations): charged to
 * DT_MEM_ACTS and counted in m->activation_bytes. */
int dt_models_falloc(dt_model *m, float **p, size_t n, dt_err *err);
/* The same for n int32 (tokens, targets). */
int dt_models_ialloc(dt_model *m, int32_t **p, size_t n, dt_err *err);

/* Appends block "fmt..." = tensors [first, last] (inclusive; it must start where the previous
 * block ended) with `windows` windows per pass (see dt_block in model.h). Call after the tensor
 * table is complete; the blocks must end up tiling the parameter buffer. */
int dt_models_add_block(dt_model *m, int first, int last, int windows, dt_err *err,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Checks that the blocks tile the parameter buffer (a programming error otherwise). */
int dt_models_check_blocks(const dt_model *m, dt_err *err);

/* Emits block event ev for block b through m's hook, if any. */
static inline void dt_models_event(dt_model *m, int b, dt_block_event ev)
{
    if (m->block_hook)
        m->block_hook(m->block_hook_ctx, b, ev);
}

/* Host-side initialisation helpers over a host copy of the parameter buffer (num_params). */
void dt_models_init_normal(float *host, const dt_tensor_info *t, dt_rng *r, float std);
void dt_models_init_uniform(float *host, const dt_tensor_info *t, dt_rng *r, float bound);
void dt_models_init_const(float *host, const dt_tensor_info *t, float v);

/* Copies host (num_params floats) into m->params. */
void dt_models_upload(dt_model *m, const float *host);

/* Mean of losses (n, device) over valid targets, on the host. */
float dt_models_mean_loss(dt_model *m, const float *losses, int n, int valid);

/* Count of rows of logits (N,V) (device) whose argmax equals targets[i] (host; < 0 ignored). */
int64_t dt_models_count_correct(dt_model *m, const float *logits, const int32_t *targets, int N,
                                int V);

/* Reports the parameter range of tensors [first, last] (inclusive, contiguous) to ready. */
void dt_models_ready(const dt_model *m, int first, int last, dt_grad_ready_fn ready, void *ctx);

#endif
