/* rdzv_c10d_hb.h - the c10d backend's heartbeat thread (rdzv_c10d_hb.c): beats this agent's
 * liveness and its round's counter, watches the others' (group rank 0 watches all, everyone
 * watches rank 0), and declares the silent ones lost by ending the round (REGROUP). It notes
 * too when it was itself frozen past heartbeat_timeout. One per agent, from open to close; the
 * round logic (rdzv_c10d.c) tells it which round to beat for.
 */
#ifndef DT_RDZV_C10D_HB_H
#define DT_RDZV_C10D_HB_H

#include "common/err.h"
#include "rendezvous/rdzv_types.h"
#include "rendezvous/store.h"

typedef struct dt_rdzv_c10d_hb dt_rdzv_c10d_hb;

/* Connects to the store at host:port (its own connection, keys under prefix: the job
 * instance's) and starts the thread, which beats a/<id> and "pulse" until told the agent left.
 * On success *out runs (free with dt_rdzv_c10d_hb_free). */
int dt_rdzv_c10d_hb_start(dt_rdzv_c10d_hb **out, const dt_rdzv_opts *o, const char *host,
                          int port, const char *prefix, const char *id, dt_err *err);

/* Tells the thread which round to beat for and watch (R < 0: none; g this node's group rank,
 * n the round's nodes, tag its closer tag). */
void dt_rdzv_c10d_hb_assign(dt_rdzv_c10d_hb *h, int R, int g, int n, const char *tag);

/* This agent (node id `id`) has seen the job's end: sets a/<id> to "left" and l/<id> (which
 * the store host waits for server-side) on ns in one request, ordered after the thread's last
 * beat of a/<id>, which it beats no more. h may be NULL (no thread). Returns the store's
 * answer. */
int dt_rdzv_c10d_hb_leave(dt_rdzv_c10d_hb *h, dt_store *ns, const char *id, dt_err *err);

/* The longest the thread went without a tick past heartbeat_timeout while it beat for a round
 * of two or more nodes (s), 0 = never. Accepts NULL. */
double dt_rdzv_c10d_hb_gap(dt_rdzv_c10d_hb *h);

/* Stops and joins the thread (beats end; h stays usable for _leave). Accepts NULL. */
void dt_rdzv_c10d_hb_stop(dt_rdzv_c10d_hb *h);

/* Stops the thread, drops its connection and frees. Accepts NULL. */
void dt_rdzv_c10d_hb_free(dt_rdzv_c10d_hb *h);

#endif
