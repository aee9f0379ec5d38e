/* resnet.h - the CIFAR-style ResNet model of the zoo (resnet.c); created through the registry,
 * runtime/train/models/model.h (dt_model_create with cfg.arch = DT_ARCH_RESNET). Internal to
 * runtime/train/models/ and its tests. */
#ifndef DT_MODELS_RESNET_H
#define DT_MODELS_RESNET_H

#include "runtime/train/models/model.h"

/* Fills m (already zeroed, cfg and be set) or returns an error; on error the caller frees m with
 * dt_model_free. */
/* comm (may be NULL): the communicator SyncBatchNorm reduces its statistics over (borrowed for
 * the model's life). */
int dt_resnet_create(dt_model *m, dt_comm *comm, dt_err *err);

#endif
