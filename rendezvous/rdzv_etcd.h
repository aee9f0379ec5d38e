/* rdzv_etcd.h - the elastic rendezvous on an etcd cluster (rdzv_etcd.c): c10d's semantics
 * (MIN:MAX nodes, rounds, spares, node loss, the job-wide restart budget) with no single host
 * as a point of failure. See rdzv_etcd.c for the design, rdzv_backend.h for the table. */
#ifndef DT_RDZV_ETCD_H
#define DT_RDZV_ETCD_H

#include "rendezvous/rdzv_backend.h"

extern const dt_rdzv_ops dt_rdzv_etcd_ops;

#endif
