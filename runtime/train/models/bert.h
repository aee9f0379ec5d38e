/* bert.h - the BERT pre-training model of the zoo (bert.c); created through the registry,
 * runtime/train/models/model.h (dt_model_create with cfg.arch = DT_ARCH_BERT). Internal to
 * runtime/train/models/ and its tests. */
#ifndef DT_MODELS_BERT_H
#define DT_MODELS_BERT_H

#include "runtime/train/models/model.h"

/* Fills m (already zeroed, cfg and be set) or returns an error; on error the caller frees m with
 * dt_model_free. comm: the tensor group when cfg.tp_size > 1 (borrowed; the registry checked
 * that it has tp_size ranks and that this is rank tp_rank), else unused. */
int dt_bert_create(dt_model *m, dt_comm *comm, dt_err *err);

/* The masked-LM logits (B,T,V) (device, rows b*T + t) of a bert model's last evaluation forward
 * (a training forward replaces them with their gradient), valid until its next forward; NULL
 * when m is not a bert or not its last stage. Under tensor parallelism this rank's columns
 * only, (B,T,Vp/TP), as dt_gpt_logits. For tests. */
const float *dt_bert_logits(const dt_model *m);

#endif
