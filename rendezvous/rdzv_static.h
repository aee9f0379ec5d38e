/* rdzv_static.h - the static rendezvous backend (rdzv_static.c): fixed nnodes, node ranks
 * given, node 0's agent hosts the store. See rdzv.h for what it does, rdzv_backend.h for the
 * table. */
#ifndef DT_RDZV_STATIC_H
#define DT_RDZV_STATIC_H

#include "rendezvous/rdzv_backend.h"

extern const dt_rdzv_ops dt_rdzv_static_ops;

#endif
