/* llama.h - the Llama-style decoder of the zoo (llama.c); created through the registry,
 * runtime/train/models/model.h (dt_model_create with cfg.type = "llama"). Internal to
 * runtime/train/models/ and its tests. */
#ifndef DT_MODELS_LLAMA_H
#define DT_MODELS_LLAMA_H

#include "runtime/train/models/model.h"

/* Fills m (already zeroed, cfg and be set) or returns an error; on error the caller frees m with
 * dt_model_free. comm: the tensor group when cfg.tp_size > 1 (borrowed; the registry checked
 * that it has tp_size ranks and that this is rank tp_rank), else unused. */
int dt_llama_create(dt_model *m, dt_comm *comm, dt_err *err);

#endif
