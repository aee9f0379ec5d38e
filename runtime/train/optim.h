/* optim.h - optimisers over the flat parameter buffer, learning-rate schedules, clipping.
 *
 * AdamW (decoupled weight decay) and SGD (momentum, Nesterov) with PyTorch semantics, applied
 * per run of tensors through the backend's adamw_update / sgd_update, so every backend updates
 * the same way. Tensors marked no_decay (biases, normalisation parameters) get no weight decay.
 * The optimiser owns its state: AdamW's exp_avg and exp_avg_sq, SGD's momentum_buffer, backend
 * buffers with the parameter buffer's layout, listed in dt_optim.states with PyTorch's names and
 * the tensor-name prefix a checkpoint saves them under ("exp_avg." + the parameter's name, in
 * optim.safetensors). Whoever saves or loads them walks that table; nobody else names them.
 *
 * Gradient accumulation and clipping are split between here and the trainer: the trainer zeroes
 * the gradients at the start of an accumulation and scales each micro-step's backward by
 * 1/grad_accum; dt_optim_clip measures the global norm and scales the gradients down to
 * grad_clip; dt_optim_step applies one update at the learning rate it is given.
 */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"

/* dt_optim_kind and dt_lr_kind are the job's (runtime/job/config.h): train.optimizer and
 * train.schedule decode straight into them. */

/* The learning rate as a function of the (0-based) optimiser step:
 *   warmup:  step < warmup_steps: lr * (step + 1) / warmup_steps
 *   then, with p = (step - warmup) / (total_steps - warmup) clamped to [0, 1]:
 *   constant: lr;  cosine: min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2;
 *   linear:   lr + (min_lr - lr) * p */
typedef struct dt_lr_schedule {
    dt_lr_kind kind;
    double lr, min_lr;
    int64_t warmup_steps;
    int64_t total_steps;
} dt_lr_schedule;

double dt_lr_at(const dt_lr_schedule *s, int64_t step);

typedef struct dt_optim_config {
    dt_optim_kind kind;
    double weight_decay;
    double beta1, beta2, eps; /* adamw */
    double momentum;          /* sgd; 0 = plain SGD (no buffer) */
    bool nesterov;            /* sgd */
    double grad_clip;         /* clip the global gradient norm to this (0 = off) */
} dt_optim_config;

/* The [train] keys of job as an optimiser config and a schedule over total_steps. */
void dt_optim_config_from_job(dt_optim_config *c, dt_lr_schedule *s, const dt_job *job,
                              int64_t total_steps);

/* One state tensor of the optimiser, per parameter (the parameter buffer's layout). */
typedef struct dt_optim_state {
    const char *name;   /* PyTorch's name: "exp_avg", "exp_avg_sq", "momentum_buffer" (static) */
    const char *prefix; /* its checkpoint tensors: prefix + parameter name, "exp_avg." (static) */
    float *buf;         /* (num_params) backend memory of the optimiser's backend, owned */
} dt_optim_state;

#define DT_OPTIM_MAX_STATES 2

/* A range of the parameter buffer an optimiser updates: params[off, off+n), whose gradient and
 * state live at [at, at+n) of the optimiser's state layout. A whole optimiser has one range
 * {0, num_params, 0}; a sharded one (ZeRO) the ranges its rank owns, packed one after the other
 * in its state buffers (state_numel elements, which may include gaps no range covers). */
typedef struct dt_optim_range {
    size_t off, n; /* in the parameter buffer */
    size_t at;     /* in the state layout (and the gradient passed to dt_optim_step) */
} dt_optim_range;

typedef struct dt_optim {
    dt_optim_config cfg;
    dt_backend *be;                /* borrowed */
    size_t num_params;
    const dt_tensor_info *tensors; /* borrowed (the model's table), (num_tensors) */
    int num_tensors;
    int64_t t;                     /* updates applied so far (AdamW's t is t+1 in the next) */
    /* The state tensors, states[0..num_states):
     *   adamw: exp_avg (m), exp_avg_sq (v);  sgd: momentum_buffer (none when momentum = 0) */
    dt_optim_state states[DT_OPTIM_MAX_STATES];
    int num_states;
    /* What this optimiser updates: ranges[0..num_ranges) (owned; one range over the whole
     * buffer unless created with dt_optim_create_ranges), and the elements of each state
     * buffer (num_params for a whole optimiser). */
    dt_optim_range *ranges;
    int num_ranges;
    size_t state_numel;
} dt_optim;

/* Creates the optimiser for a model's parameter layout (tensors must cover [0, num_params) in
 * order). State buffers start at zero. */
int dt_optim_create(dt_optim **out, const dt_optim_config *cfg, dt_backend *be,
                    const dt_tensor_info *tensors, int num_tensors, size_t num_params,
                    dt_err *err);

/* An optimiser of part of the parameters (ZeRO's shard): it updates params[r.off, r.off+r.n)
 * for each of ranges[0..num_ranges) (copied; disjoint, in any order, inside [0, num_params),
 * their [at, at+n) disjoint inside [0, state_numel)), with state buffers of state_numel
 * elements: the per-parameter state exists only for what this optimiser updates. Each tensor's
 * no_decay flag applies to its part of a range, exactly as for a whole optimiser, so the
 * elements a sharded optimiser updates change bit for bit as a whole one's would. */
int dt_optim_create_ranges(dt_optim **out, const dt_optim_config *cfg, dt_backend *be,
                           const dt_tensor_info *tensors, int num_tensors, size_t num_params,
                           const dt_optim_range *ranges, int num_ranges, size_t state_numel,
                           dt_err *err);

/* Gives the optimiser other ranges (as dt_optim_create_ranges) and the state buffers bufs[i]
 * (state_numel elements each, backend memory charged as optimiser state, holding the state in
 * the new layout: ZeRO's relayout moved it there; owned by the optimiser from here on). The
 * buffers it had are not freed: the caller freed them, or keeps them. t stays. On failure
 * nothing changed (bufs stay the caller's). */
int dt_optim_set_ranges(dt_optim *o, const dt_optim_range *ranges, int num_ranges,
                        size_t state_numel, float *const *bufs, dt_err *err);

/* Accepts NULL. */
void dt_optim_free(dt_optim *o);

/* L2 norm of grads (state_numel elements: the whole gradient of a whole optimiser; only this
 * rank's part for a sharded one, whose global norm the caller combines over ranks). */
double dt_optim_grad_norm(dt_optim *o, const float *grads);

/* Measures the norm of grads (as dt_optim_grad_norm) and, when cfg.grad_clip > 0 and the norm
 * exceeds it, scales grads by grad_clip / (norm + 1e-6) (PyTorch's clip_grad_norm_). Returns
 * the norm before clipping (non-finite when a gradient is; nothing is scaled then). */
double dt_optim_clip(dt_optim *o, float *grads);

/* One update at learning rate lr of the ranges this optimiser owns: params is the whole
 * parameter buffer (num_params), grads is laid out like the state (state_numel: for a whole
 * optimiser, the whole gradient buffer). Increments t. */
void dt_optim_step(dt_optim *o, float *params, const float *grads, double lr);

/* Dynamic loss scaling for train.precision = fp16, as torch's GradScaler: backward runs on
 * loss * scale so that small gradients survive 16-bit storage, the trainer divides the
 * gradients by scale again, and a step whose gradients hold inf or NaN (on every rank alike:
 * they are all-reduced first) is skipped and halves the scale, while `window` clean steps in a
 * row double it. */
typedef struct dt_loss_scaler {
    bool on;             /* off: scale 1, no step is ever skipped */
    double scale;
    int window;          /* clean steps in a row before the scale doubles */
    int clean;           /* clean steps since the scale last changed */
    int skipped_in_row;  /* overflowing steps in a row */
    int64_t skipped;     /* steps skipped in this run */
} dt_loss_scaler;

/* Gives up when this many steps in a row overflow: the gradients are not finite at any scale
 * (the scale is then 2^-32 of where it stood), so training has diverged. */
#define DT_LOSS_SCALER_MAX_SKIPS 32

void dt_loss_scaler_init(dt_loss_scaler *s, bool on, double scale, int window);

/* After a step's gradients are final and unscaled: finite = whether their norm is. Returns 1
 * when the optimiser should step, 0 when the step is skipped (the scale halved), -EDOM when
 * DT_LOSS_SCALER_MAX_SKIPS steps in a row overflowed (or the scaler is off and the gradients
 * are not finite). */
int dt_loss_scaler_update(dt_loss_scaler *s, bool finite);

#endif
