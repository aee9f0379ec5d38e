/* rdzv_c10d.h - the elastic (c10d) rendezvous backend (rdzv_c10d.c): MIN:MAX nodes, heartbeats,
 * node loss. See rdzv.h for what it does, rdzv_c10d.c for the design, rdzv_backend.h for the
 * table. */
#ifndef DT_RDZV_C10D_H
#define DT_RDZV_C10D_H

#include "rendezvous/rdzv_backend.h"

extern const dt_rdzv_ops dt_rdzv_c10d_ops;

#endif
