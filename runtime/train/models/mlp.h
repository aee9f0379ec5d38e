/* mlp.h - the multi-layer perceptron model of the zoo (mlp.c); created through the registry,
 * runtime/train/models/model.h (dt_model_create with cfg.arch = DT_ARCH_MLP). Internal to
 * runtime/train/models/ and its tests. */
#ifndef DT_MODELS_MLP_H
#define DT_MODELS_MLP_H

#include "runtime/train/models/model.h"

/* Fills m (already zeroed, cfg and be set) or returns an error; on error the caller frees m with
 * dt_model_free. */
int dt_mlp_create(dt_model *m, dt_err *err);

#endif
