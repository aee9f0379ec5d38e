/* models.c - the helpers every model of the zoo shares (see models.h): the tensor tables, the
 * flat parameter / gradient / buffer storage, host-side initialisation and upload, and the
 * loss and accuracy read-backs, the tensor look-up by name, the tensor-parallel slices
 * (dt_tensor_tp_copy) and batch views (dt_batch_slice). Nothing here knows a particular model, and nothing here calls the
 * registry (zoo.c), which includes every model: what a model calls lives here, so no model
 * and the registry include each other in a loop. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/train/models/models.h"

static int add_to(dt_tensor_info **table, int *count, size_t *total, bool no_decay, int ndim,
                  const int64_t *shape, dt_err *err, const char *fmt, va_list ap)
{
    if (ndim < 1 || ndim > DT_TENSOR_MAX_DIMS)
        return dt_err_set(err, -EINVAL, "tensor with %d dimensions", ndim);
    dt_tensor_info *t = realloc(*table, sizeof **table * (size_t)(*count + 1));
    if (!t)
        return dt_err_set(err, -ENOMEM, "model: out of memory for the tensor table");
    *table = t;
    t += *count;
    memset(t, 0, sizeof *t);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->whole_shape[i] = shape[i]; /* replicated until a model says otherwise */
        t->numel *= (size_t)shape[i];
    }
    t->offset = *total;
    t->no_decay = no_decay;
    *total += t->numel;
    return (*count)++;
}

int dt_models_add(dt_model *m, bool no_decay, int ndim, const int64_t *shape, dt_err *err,
                  const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = add_to(&m->tensors, &m->num_tensors, &m->num_params, no_decay, ndim, shape, err, fmt,
                    ap);
    va_end(ap);
    return rc;
}

int dt_models_add_buffer(dt_model *m, int ndim, const int64_t *shape, dt_err *err,
                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = add_to(&m->buffer_tensors, &m->num_buffer_tensors, &m->num_buffers, true, ndim,
                    shape, err, fmt, ap);
    va_end(ap);
    return rc;
}

/* n floats charged to memory category cat (kernels/backend_ops.h). */
static int falloc_as(dt_model *m, float **p, size_t n, dt_mem_cat cat, dt_err *err)
{
    dt_mem_cat old = dt_mem_tag(m->be, cat);
    int rc = m->be->alloc(m->be, (void **)p, (n ? n : 1) * sizeof(float), err);
    dt_mem_tag(m->be, old);
    return rc;
}

int dt_models_falloc(dt_model *m, float **p, size_t n, dt_err *err)
{
    int rc = falloc_as(m, p, n, DT_MEM_ACTS, err);
    if (!rc)
        m->activation_bytes += (n ? n : 1) * sizeof(float);
    return rc;
}

int dt_models_ialloc(dt_model *m, int32_t **p, size_t n, dt_err *err)
{
    size_t bytes = (n ? n : 1) * sizeof(int32_t);
    dt_mem_cat old = dt_mem_tag(m->be, DT_MEM_ACTS);
    int rc = m->be->alloc(m->be, (void **)p, bytes, err);
    dt_mem_tag(m->be, old);
    if (!rc)
        m->activation_bytes += bytes;
    return rc;
}

int dt_models_alloc(dt_model *m, dt_err *err)
{
    int rc = falloc_as(m, &m->params, m->num_params, DT_MEM_PARAMS, err);
    if (!rc)
        rc = falloc_as(m, &m->grads, m->num_params, DT_MEM_GRADS, err);
    if (!rc && m->num_buffers) /* BatchNorm running statistics: not model state ZeRO counts */
        rc = falloc_as(m, &m->buffers, m->num_buffers, DT_MEM_OTHER, err);
    return rc;
}

int dt_models_add_block(dt_model *m, int first, int last, int windows, dt_err *err,
                        const char *fmt, ...)
{
    if (first < 0 || last < first || last >= m->num_tensors || windows < 1)
        return dt_err_set(err, -EINVAL, "model: block of tensors %d..%d (of %d)", first, last,
                          m->num_tensors);
    size_t off = m->tensors[first].offset;
    size_t end = m->tensors[last].offset + m->tensors[last].numel;
    const dt_block *prev = m->num_blocks ? &m->blocks[m->num_blocks - 1] : NULL;
    if (prev ? first != prev->last_tensor + 1 : first != 0)
        return dt_err_set(err, -EINVAL, "model: block from tensor %d does not follow the "
                                        "previous one",
                          first);
    dt_block *b = realloc(m->blocks, sizeof *b * (size_t)(m->num_blocks + 1));
    if (!b)
        return dt_err_set(err, -ENOMEM, "model: out of memory for the block table");
    m->blocks = b;
    b += m->num_blocks;
    memset(b, 0, sizeof *b);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->name, sizeof b->name, fmt, ap);
    va_end(ap);
    b->offset = off;
    b->numel = end - off;
    b->first_tensor = first;
    b->last_tensor = last;
    b->windows = windows;
    return m->num_blocks++;
}

int dt_models_check_blocks(const dt_model *m, dt_err *err)
{
    if (m->num_blocks < 1 || m->blocks[m->num_blocks - 1].last_tensor != m->num_tensors - 1)
        return dt_err_set(err, -EINVAL, "model: its %d blocks do not cover its %d tensors",
                          m->num_blocks, m->num_tensors);
    return 0;
}

void dt_models_init_normal(float *host, const dt_tensor_info *t, dt_rng *r, float std)
{
    dt_rng_fill_normal(r, host + t->offset, t->numel, 0.0f, std);
}

void dt_models_init_uniform(float *host, const dt_tensor_info *t, dt_rng *r, float bound)
{
    for (size_t i = 0; i < t->numel; i++)
        host[t->offset + i] = (2.0f * dt_rng_uniform(r) - 1.0f) * bound;
}

void dt_models_init_const(float *host, const dt_tensor_info *t, float v)
{
    for (size_t i = 0; i < t->numel; i++)
        host[t->offset + i] = v;
}

void dt_models_upload(dt_model *m, const float *host)
{
    m->be->memcpy_h2d(m->be, m->params, host, m->num_params * sizeof(float));
}

float dt_models_mean_loss(dt_model *m, const float *losses, int n, int valid)
{
    if (valid <= 0)
        return 0.0f;
    /* one read-back (each is a device synchronisation), in pieces only without the memory */
    float small[1024], *buf = n > 1024 ? malloc((size_t)n * sizeof *buf) : NULL;
    int piece = buf ? n : 1024;
    if (!buf)
        buf = small;
    double sum = 0;
    for (int i = 0; i < n; i += piece) {
        int k = DT_MIN(piece, n - i);
        m->be->memcpy_d2h(m->be, buf, losses + i, (size_t)k * sizeof(float));
        for (int j = 0; j < k; j++)
            sum += buf[j];
    }
    if (buf != small)
        free(buf);
    return (float)(sum / valid);
}

int64_t dt_models_count_correct(dt_model *m, const float *logits, const int32_t *targets, int N,
                                int V)
{
    float *host = malloc((size_t)N * V * sizeof(float));
    if (!host) /* accuracy is a statistic: without memory it is reported as 0 */
        return 0;
    m->be->memcpy_d2h(m->be, host, logits, (size_t)N * V * sizeof(float));
    int64_t correct = 0;
    for (int i = 0; i < N; i++) {
        if (targets[i] < 0)
            continue;
        const float *row = host + (size_t)i * V;
        int best = 0;
        for (int j = 1; j < V; j++)
            if (row[j] > row[best])
                best = j;
        correct += best == targets[i];
    }
    free(host);
    return correct;
}

void dt_models_ready(const dt_model *m, int first, int last, dt_grad_ready_fn ready, void *ctx)
{
    if (!ready)
        return;
    size_t off = m->tensors[first].offset;
    size_t end = m->tensors[last].offset + m->tensors[last].numel;
    ready(ctx, off, end - off);
}

/* ------------------------------------------------------------------------------------------ */
/* look-up (model.h; here, not in the registry zoo.c, because the models call it) */

int dt_model_find_tensor(const dt_model *m, const char *name)
{
    for (int i = 0; i < m->num_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return i;
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* tensor-parallel slices (model.h; gpt slices its tensors with them, the strategies gather
 * and slice checkpoints) */

size_t dt_tensor_whole_numel(const dt_tensor_info *t)
{
    if (t->tp_parts <= 0)
        return t->numel;
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->whole_shape[i];
    return n;
}

void dt_tensor_tp_copy(const dt_tensor_info *t, int tp_rank, float *whole, float *local,
                       bool to_whole)
{
    if (t->tp_parts <= 0) {
        if (to_whole)
            memcpy(whole, local, t->numel * sizeof(float));
        else
            memcpy(local, whole, t->numel * sizeof(float));
        return;
    }
    /* rows of `inner` contiguous elements: outer x (tp_dim) x inner, the same outer and inner
     * in the whole and the local tensor, which differ along tp_dim only */
    const int d = t->tp_dim;
    size_t outer = 1, inner = 1;
    for (int i = 0; i < d; i++)
        outer *= (size_t)t->shape[i];
    for (int i = d + 1; i < t->ndim; i++)
        inner *= (size_t)t->shape[i];
    const size_t parts = (size_t)t->tp_parts;
    const size_t chunk = (size_t)t->shape[d] / parts;      /* per part, on this rank */
    const size_t part = (size_t)t->whole_shape[d] / parts; /* per part, whole */
    const size_t first = (size_t)tp_rank * chunk;          /* this rank's offset in a part */
    const size_t ldim = (size_t)t->shape[d], wdim = (size_t)t->whole_shape[d];
    for (size_t o = 0; o < outer; o++)
        for (size_t p = 0; p < parts; p++)
            for (size_t k = 0; k < chunk; k++) {
                float *l = local + ((o * ldim) + p * chunk + k) * inner;
                if (first + k >= part) { /* padding: not in the whole tensor */
                    if (!to_whole)
                        memset(l, 0, inner * sizeof(float));
                    continue;
                }
                float *w = whole + ((o * wdim) + p * part + first + k) * inner;
                if (to_whole)
                    memcpy(w, l, inner * sizeof(float));
                else
                    memcpy(l, w, inner * sizeof(float));
            }
}

/* ------------------------------------------------------------------------------------------ */
/* batches (model.h) */

dt_batch dt_batch_slice(const dt_batch *b, int from, int count, size_t per)
{
    dt_batch o = *b;
    const size_t T = b->T > 0 ? (size_t)b->T : 1, f = (size_t)from;
    o.B = count;
    o.tokens = b->tokens ? b->tokens + f * T : NULL;
    o.targets = b->targets ? b->targets + f * T : NULL;
    o.x = b->x ? b->x + f * per : NULL;
    o.types = b->types ? b->types + f * T : NULL;
    o.mask = b->mask ? b->mask + f * T : NULL;
    o.labels = b->labels ? b->labels + f : NULL;
    return o;
}
