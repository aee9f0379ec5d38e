/* optim.c - AdamW, SGD, schedules and clipping; see optim.h.
 *
 * An update walks the tensor table and merges neighbouring tensors with the same no_decay flag
 * into one range, so a GPT-2 update is a handful of backend calls, not one per tensor. */
#include "runtime/train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double dt_lr_at(const dt_lr_schedule *s, int64_t step)
{
    if (step < s->warmup_steps)
        return s->lr * (double)(step + 1) / (double)s->warmup_steps;
    if (s->kind == DT_LR_CONSTANT)
        return s->lr;
    int64_t span = s->total_steps - s->warmup_steps;
    double p = span > 0 ? (double)(step - s->warmup_steps) / (double)span : 1.0;
    if (p > 1.0)
        p = 1.0;
    if (p < 0.0)
        p = 0.0;
    if (s->kind == DT_LR_COSINE)
        return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
    return s->lr + (s->min_lr - s->lr) * p;
}

void dt_optim_config_from_job(dt_optim_config *c, dt_lr_schedule *s, const dt_job *job,
                              int64_t total_steps)
{
    memset(c, 0, sizeof *c);
    c->kind = job->optimizer;
    c->weight_decay = job->weight_decay;
    c->beta1 = job->beta1;
    c->beta2 = job->beta2;
    c->eps = job->eps;
    c->momentum = job->momentum;
    c->nesterov = job->nesterov;
    c->grad_clip = job->grad_clip;
    memset(s, 0, sizeof *s);
    s->kind = job->schedule;
    s->lr = job->lr;
    s->min_lr = job->min_lr;
    s->warmup_steps = job->warmup_steps;
    s->total_steps = total_steps;
}

int dt_optim_create(dt_optim **out, const dt_optim_config *cfg, dt_backend *be,
                    const dt_tensor_info *tensors, int num_tensors, size_t num_params,
                    dt_err *err)
{
    dt_optim_range all = {0, num_params, 0};
    return dt_optim_create_ranges(out, cfg, be, tensors, num_tensors, num_params, &all, 1,
                                  num_params, err);
}

int dt_optim_create_ranges(dt_optim **out, const dt_optim_config *cfg, dt_backend *be,
                           const dt_tensor_info *tensors, int num_tensors, size_t num_params,
                           const dt_optim_range *ranges, int num_ranges, size_t state_numel,
                           dt_err *err)
{
    size_t covered = 0;
    for (int i = 0; i < num_tensors; i++) {
        if (tensors[i].offset != covered)
            return dt_err_set(err, -EINVAL,
                              "optimiser: tensor %s starts at %zu, expected %zu (the table must "
                              "cover the parameter buffer in order)",
                              tensors[i].name, tensors[i].offset, covered);
        covered += tensors[i].numel;
    }
    if (covered != num_params)
        return dt_err_set(err, -EINVAL, "optimiser: tensors cover %zu of %zu parameters", covered,
                          num_params);
    if (cfg->kind == DT_OPTIM_SGD && cfg->nesterov && cfg->momentum <= 0)
        return dt_err_set(err, -EINVAL, "train.nesterov needs train.momentum > 0");
    for (int k = 0; k < num_ranges; k++) {
        const dt_optim_range *r = &ranges[k];
        if (r->off + r->n > num_params || r->at + r->n > state_numel)
            return dt_err_set(err, -EINVAL,
                              "optimiser: range %d [%zu, %zu) at %zu is outside the %zu "
                              "parameters or %zu state elements",
                              k, r->off, r->off + r->n, r->at, num_params, state_numel);
    }
    dt_optim *o = calloc(1, sizeof *o);
    if (!o)
        return dt_err_set(err, -ENOMEM, "out of memory");
    o->cfg = *cfg;
    o->be = be;
    o->num_params = num_params;
    o->tensors = tensors;
    o->num_tensors = num_tensors;
    o->state_numel = state_numel;
    o->num_ranges = num_ranges;
    if (num_ranges && !(o->ranges = malloc(sizeof *ranges * (size_t)num_ranges))) {
        free(o);
        return dt_err_set(err, -ENOMEM, "out of memory");
    }
    if (num_ranges)
        memcpy(o->ranges, ranges, sizeof *ranges * (size_t)num_ranges);
    if (cfg->kind == DT_OPTIM_ADAMW) {
        o->states[o->num_states++] = (dt_optim_state){"exp_avg", "exp_avg.", NULL};
        o->states[o->num_states++] = (dt_optim_state){"exp_avg_sq", "exp_avg_sq.", NULL};
    } else if (cfg->momentum > 0) {
        o->states[o->num_states++] = (dt_optim_state){"momentum_buffer", "momentum_buffer.", NULL};
    }
    for (int i = 0; i < o->num_states; i++) {
        dt_mem_cat old_cat = dt_mem_tag(be, DT_MEM_OPTIM);
        int rc = be->alloc(be, (void **)&o->states[i].buf, sizeof(float) * state_numel, err);
        dt_mem_tag(be, old_cat);
        if (rc) {
            dt_err_prefix(err, "optimiser state (%s, %zu parameters): ", o->states[i].name,
                          state_numel);
            dt_optim_free(o);
            return rc;
        }
    }
    *out = o;
    return 0;
}

int dt_optim_set_ranges(dt_optim *o, const dt_optim_range *ranges, int num_ranges,
                        size_t state_numel, float *const *bufs, dt_err *err)
{
    for (int k = 0; k < num_ranges; k++)
        if (ranges[k].off + ranges[k].n > o->num_params || ranges[k].at + ranges[k].n > state_numel)
            return dt_err_set(err, -EINVAL, "optimiser: range %d [%zu, %zu) at %zu is outside "
                              "the %zu parameters or %zu state elements", k, ranges[k].off,
                              ranges[k].off + ranges[k].n, ranges[k].at, o->num_params,
                              state_numel);
    dt_optim_range *r = malloc(sizeof *r * (size_t)(num_ranges ? num_ranges : 1));
    if (!r)
        return dt_err_set(err, -ENOMEM, "out of memory");
    memcpy(r, ranges, sizeof *r * (size_t)num_ranges);
    free(o->ranges);
    o->ranges = r;
    o->num_ranges = num_ranges;
    o->state_numel = state_numel;
    for (int i = 0; i < o->num_states; i++)
        o->states[i].buf = bufs[i];
    return 0;
}

void dt_optim_free(dt_optim *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->num_states; i++)
        if (o->states[i].buf)
            o->be->free(o->be, o->states[i].buf);
    free(o->ranges);
    free(o);
}

double dt_optim_grad_norm(dt_optim *o, const float *grads)
{
    return sqrt(o->be->sumsq(o->be, grads, o->state_numel));
}

double dt_optim_clip(dt_optim *o, float *grads)
{
    double norm = dt_optim_grad_norm(o, grads);
    if (o->cfg.grad_clip > 0 && isfinite(norm) && norm > o->cfg.grad_clip)
        o->be->scale(o->be, grads, o->state_numel, (float)(o->cfg.grad_clip / (norm + 1e-6)));
    return norm;
}

/* Updates params[off, off+n) from grads and state at [at, at+n), with or without weight decay. */
static void update_range(dt_optim *o, float *params, const float *grads, size_t off, size_t at,
                         size_t n, bool decay, double lr)
{
    const dt_optim_config *c = &o->cfg;
    double wd = decay ? c->weight_decay : 0.0;
    if (c->kind == DT_OPTIM_ADAMW)
        o->be->adamw_update(o->be, params + off, grads + at, o->states[0].buf + at,
                            o->states[1].buf + at, n, lr, c->beta1, c->beta2, c->eps, wd,
                            o->t + 1);
    else
        o->be->sgd_update(o->be, params + off, grads + at,
                          o->num_states ? o->states[0].buf + at : NULL,
                          n, (float)lr, (float)c->momentum, c->nesterov, (float)wd, o->t == 0);
}

/* One range: the tensors it crosses, neighbours with the same no_decay flag merged into one
 * update. */
static void step_range(dt_optim *o, float *params, const float *grads, const dt_optim_range *r,
                       double lr)
{
    size_t start = 0, len = 0, end = r->off + r->n;
    bool decay = true;
    for (int i = 0; i < o->num_tensors; i++) {
        const dt_tensor_info *ti = &o->tensors[i];
        size_t lo = ti->offset > r->off ? ti->offset : r->off;
        size_t hi = ti->offset + ti->numel < end ? ti->offset + ti->numel : end;
        if (lo >= hi)
            continue;
        bool d = !ti->no_decay;
        if (len && d != decay) {
            update_range(o, params, grads, start, r->at + (start - r->off), len, decay, lr);
            len = 0;
        }
        if (!len) {
            start = lo;
            decay = d;
        }
        len += hi - lo;
    }
    if (len)
        update_range(o, params, grads, start, r->at + (start - r->off), len, decay, lr);
}

void dt_optim_step(dt_optim *o, float *params, const float *grads, double lr)
{
    for (int k = 0; k < o->num_ranges; k++)
        if (o->ranges[k].n)
            step_range(o, params, grads, &o->ranges[k], lr);
    o->t++;
}

void dt_loss_scaler_init(dt_loss_scaler *s, bool on, double scale, int window)
{
    memset(s, 0, sizeof *s);
    s->on = on;
    s->scale = on ? scale : 1.0;
    s->window = window > 0 ? window : 1;
}

int dt_loss_scaler_update(dt_loss_scaler *s, bool finite)
{
    if (finite) {
        s->skipped_in_row = 0;
        if (s->on && ++s->clean >= s->window) {
            s->scale *= 2.0;
            s->clean = 0;
        }
        return 1;
    }
    if (!s->on || ++s->skipped_in_row >= DT_LOSS_SCALER_MAX_SKIPS)
        return -EDOM;
    s->scale *= 0.5;
    s->clean = 0;
    s->skipped++;
    return 0;
}
