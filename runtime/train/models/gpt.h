/* gpt.h - the GPT-2 model of the zoo (gpt.c); created through the registry,
 * runtime/train/models/model.h (dt_model_create with cfg.arch = DT_ARCH_GPT). Internal to
 * runtime/train/models/ and its tests. */
#ifndef DT_MODELS_GPT_H
#define DT_MODELS_GPT_H

#include "runtime/train/models/model.h"

/* Fills m (already zeroed, cfg and be set) or returns an error; on error the caller frees m with
 * dt_model_free. comm: the tensor group when cfg.tp_size > 1 (borrowed; the registry checked
 * that it has tp_size ranks and that this is rank tp_rank), else unused. */
int dt_gpt_create(dt_model *m, dt_comm *comm, dt_err *err);

/* The logits (B,T,V) (device, row-major, rows b*T + t) of a gpt model's last evaluation forward
 * (a training forward replaces them with their gradient), valid until its next forward; NULL
 * when m is not a gpt. Under tensor parallelism this rank's columns only: (B,T,Vp/TP), the
 * vocabulary ids from tp_rank * Vp/TP, the padding's columns zero. For tests (causality). */
const float *dt_gpt_logits(const dt_model *m);

#endif
