/* rdzv.h - rendezvous: how the agents of one job find each other, agree on ranks, and stop and
 * restart together.
 *
 * The agent of every node opens a rendezvous, then loops: join the next round (which tells the
 * node its group rank, the world size and its first global rank), run its workers while polling
 * the round's state, and end the round with success, a failure, or an abort. A failure on any
 * node ends the round for every node: they all stop their workers and join the next round
 * together, until the job-wide restart budget (max_restarts of node 0, the same for everyone) is
 * spent. A configuration error that every restart would repeat ends the job on every node at
 * once instead (dt_rdzv_abort_config). Everything goes through the dtrain store
 * (rendezvous/store.h).
 *
 * Backends (rdzv.c picks one by name and forwards every call to its table, rdzv_backend.h;
 * what they share is rdzv_common.h):
 *   static  (rdzv_static.c)  nnodes fixed, node ranks given. Node 0's agent hosts the store at the endpoint (or
 *           uses a `dtrain store` already listening there); the others connect with retry until
 *           join_timeout. Ranks are contiguous per node: node k's first global rank is the sum of
 *           the local world sizes of nodes 0..k-1. Round r is attempt r.
 *   c10d    (rdzv_c10d.c) MIN:MAX nodes that join in any order; a round closes at once with MAX nodes (unless
 *           a survivor of the previous round is still missing), or with MIN or more once the
 *           last-call window has passed (or once every survivor of the previous round is back).
 *           Ranks are assigned by join order, survivors first and keeping their order (a
 *           newcomer never pushes a survivor out to spare). A node that arrives while a round runs ends it (DT_RDZV_REGROUP) so that the
 *           next round takes it in; beyond MAX it waits as a spare, and so does a node whose
 *           world the job's layout cannot use (opts.world_usable). A node that stops sending
 *           heartbeats is declared lost and the round ends (DT_RDZV_REGROUP) for the others. A
 *           membership change never spends the restart budget. See rdzv_c10d.c for the design.
 *
 * Store keys live under "dtrain/<rdzv id>/" and then "r<round>/": a round never reads state of an
 * earlier round, and two jobs with different ids never share a key. With an external store
 * (one that outlives jobs), every static job needs its own --rdzv-id; c10d adds a job instance
 * level ("dtrain/<rdzv id>/<instance>/r<round>/"), so a new job may reuse an id once the last
 * one has ended.
 *
 * Liveness: every agent increments a heartbeat counter every heartbeat_interval while its round
 * runs; a node whose counter has not moved for heartbeat_timeout (on the observer's own clock, so
 * clocks need not agree) is declared lost: static fails the round with it as the root cause,
 * c10d regroups without it (from a heartbeat thread of its own, with rank 0 watching everyone
 * and everyone watching rank 0). An agent that loses the store host ends its job (the store
 * cannot come back).
 *
 * Not thread-safe: one thread (the agent's) calls everything.
 */
#ifndef DT_RDZV_H
#define DT_RDZV_H

#include "rendezvous/rdzv_common.h" /* the helpers the agent and tests use too */
#include "rendezvous/rdzv_types.h"

typedef struct dt_rdzv dt_rdzv;


/* Opens the rendezvous: hosts or connects to the store (retrying until join_timeout). On
 * success *out owns it. -EINTR when interrupted, -ETIMEDOUT, -ECONNREFUSED, -EADDRINUSE... with
 * err saying what to check. */
int dt_rdzv_open(dt_rdzv **out, const dt_rdzv_opts *opts, dt_err *err);

/* Joins the next round (the first call joins the job's current round) and waits until it is
 * formed, up to join_timeout. Call it only after this node's workers of the previous round are
 * all stopped. Returns 0 with *round filled; -EINTR (interrupted), -ETIMEDOUT (not every node
 * came), -ECANCELED (the job was aborted elsewhere; status says by whom), -EINVAL (static: the
 * nodes disagree on --nnodes; every node still joining ends with -EINVAL, a node whose round
 * already runs sees ABORTED with setup_error; err names both values), or a store error.
 * c10d: -ECANCELED also when the job ended while this node waited (a spare, a late joiner):
 * status.state is SUCCEEDED (exit 0), FAILED (the budget is spent) or ABORTED, with the why.
 * c10d: -ENOTCONN when this agent hosts the store and was frozen (SIGSTOP, a hung host) past
 * heartbeat_timeout while a round of two or more ran: every other agent lost the store and
 * ended, so nobody is left to join (status FAILED, err says so). */
int dt_rdzv_next(dt_rdzv *r, dt_rdzv_round *round, dt_rdzv_status *status, dt_err *err);

/* Cheap check of the current round (one or two store round trips; heartbeats are sent and
 * checked here when due). Call it every monitor_interval while workers run. Once the round has
 * ended as FAILED (or REGROUP), a poll also looks (one store round trip) for an end of the whole
 * job recorded since, which then replaces it (ABORTED: a configuration error on another node,
 * see dt_rdzv_abort_config): poll once more after this node's workers are stopped, before
 * deciding to restart. */
int dt_rdzv_poll(dt_rdzv *r, dt_rdzv_status *status, dt_err *err);

/* This node's workers all exited 0. The round succeeds once every node said so (poll). */
int dt_rdzv_succeeded(dt_rdzv *r, dt_err *err);

/* Records this node's failures (in the order seen) and ends the round as failed, unless another
 * node ended it first (then the failures are still recorded). */
int dt_rdzv_failed(dt_rdzv *r, const dt_rdzv_failure *f, int n, dt_err *err);

/* This agent was stopped by signal sig: ends the round and the job for every node. */
int dt_rdzv_abort(dt_rdzv *r, int sig, dt_err *err);

/* This node's workers report a configuration error that every restart would repeat (the
 * built-in worker's exit 2: a bad checkpoint.resume path, a checkpoint directory of another
 * setup): records the failures f[0..n) as dt_rdzv_failed does, then ends the round and the job
 * for every node as a setup error, so that no node spends a restart on it. The other nodes see
 * DT_RDZV_ABORTED with setup_error and `why` (one line naming this node, for their logs): from
 * dt_rdzv_poll while their round runs (or, when another node ended the round as failed first,
 * from the poll after their workers stopped), and from dt_rdzv_next when they are already
 * joining the next round (-ECANCELED for c10d, -EINVAL for static, as for --nnodes). This node's
 * own poll says the same. One node alone: only this node's state. Accepts NULL (r). */
int dt_rdzv_abort_config(dt_rdzv *r, const dt_rdzv_failure *f, int n, const char *why,
                         dt_err *err);

/* The failures recorded for the current round by every node, earliest first (by time, then in
 * the order they were recorded). *out is malloc'd (caller frees), *n may be 0. */
int dt_rdzv_failures(dt_rdzv *r, dt_rdzv_failure **out, int *n, dt_err *err);

/* Simulates the sudden death of this agent, for benchmarks and tests (c10d; nothing for
 * static): heartbeats stop and the store connections are dropped without leaving the job. The
 * handle is then good for dt_rdzv_close only. */
void dt_rdzv_kill(dt_rdzv *r);

/* Leaves the job. The store host waits (up to close_timeout) until every node still alive has
 * left, so nobody loses the store while reading the outcome, then stops the store. A node whose
 * agent has been silent for heartbeat_timeout (its liveness is beaten by a thread from open to
 * close) is not waited for. c10d: every agent that opened counts (spares, and a node declared
 * lost that came back). Accepts NULL. */
void dt_rdzv_close(dt_rdzv *r);

#endif
