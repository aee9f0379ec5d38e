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
 * Backends:
 *   static  nnodes fixed, node ranks given. Node 0's agent hosts the store at the endpoint (or
 *           uses a `dtrain store` already listening there); the others connect with retry until
 *           join_timeout. Ranks are contiguous per node: node k's first global rank is the sum of
 *           the local world sizes of nodes 0..k-1. Round r is attempt r.
 *   c10d    MIN:MAX nodes that join in any order; a round closes at once with MAX nodes (unless
 *           a survivor of the previous round is still missing), or with MIN or more once the
 *           last-call window has passed (or once every survivor of the previous round is back).
 *           Ranks are assigned by join order, survivors first and keeping their order (a
 *           newcomer never pushes a survivor out to spare). A node that arrives while a round runs ends it (DT_RDZV_REGROUP) so that the
 *           next round takes it in; beyond MAX it waits as a spare. A node that stops sending
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

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define DT_RDZV_STR 256

typedef struct dt_rdzv dt_rdzv;

/* The agent fills this from its launcher settings (rendezvous/ knows nothing of runtime/). */
typedef struct dt_rdzv_opts {
    char backend[32];              /* "static" ("c10d": issue #5) */
    char nnodes[32];               /* "N" (static), or "MIN:MAX" (c10d) */
    int node_rank;                 /* static: this node's rank, 0 <= node_rank < N */
    char endpoint_host[DT_RDZV_STR]; /* the store's host as every node reaches it */
    int endpoint_port;             /* the store's port; 0 = any free port (one node only) */
    char run_id[DT_RDZV_STR];      /* --rdzv-id; "none" or "" = node 0 makes a fresh one */
    char local_addr[DT_RDZV_STR];  /* this node's address for others; "" = the route to node 0 */
    int local_world_size;          /* workers this node runs (--nproc-per-node resolved) */
    int max_restarts;              /* this node's budget; node 0's is the job's */
    double join_timeout;           /* s: how long a round waits for every node */
    double close_timeout;          /* s: how long the store host waits for the others to leave */
    double heartbeat_interval;     /* s between heartbeats */
    double heartbeat_timeout;      /* s without a heartbeat before a node is declared lost */
    double last_call_timeout;      /* s (c10d): how long a round stays open after MIN joined */
    double read_timeout;           /* s: the most a store call waits for its answer (torchrun's
                                      read_timeout; also at most heartbeat_timeout); 0 = no cap */
    bool is_host;                  /* c10d: host the store here even if the endpoint host is not
                                      an address of this machine (false = decide by address) */
    /* Called between bounded waits of dt_rdzv_open and dt_rdzv_next (about every 100 ms); when
     * it returns true the call gives up with -EINTR. NULL = never. */
    bool (*interrupted)(void *arg);
    void *arg;
} dt_rdzv_opts;

/* What a round decided. Every node of the round got the same values except the per-node ones. */
typedef struct dt_rdzv_round {
    int round;               /* round number of the job: 0, 1, ... */
    int attempt;             /* restarts spent so far, job-wide (TORCHELASTIC_RESTART_COUNT) */
    int max_restarts;        /* the job-wide budget (node 0's --max-restarts) */
    int group_rank;          /* this node's rank (GROUP_RANK) */
    int group_world_size;    /* nodes in the round (GROUP_WORLD_SIZE) */
    int rank_base;           /* global rank of this node's local rank 0 */
    int local_world_size;    /* workers on this node */
    int world_size;          /* workers in the job */
    char run_id[DT_RDZV_STR]; /* the run id workers see: the rdzv id, or a fresh one when "none" */
    char master_addr[DT_RDZV_STR]; /* MASTER_ADDR: node 0's address */
    int master_port;              /* MASTER_PORT: free port on node 0, new every round */
    char store_addr[DT_RDZV_STR];  /* where workers reach the store (DTRAIN_STORE_ADDR) */
    int store_port;               /* DTRAIN_STORE_PORT */
    char local_addr[DT_RDZV_STR];  /* this node's address as others reach it */
    bool elastic;                 /* membership may change while the round runs (c10d): poll it
                                     even when this node is alone */
} dt_rdzv_round;

/* One failed worker (or a lost node), as the root-cause table shows it. Shared through the store
 * so that every node prints the whole job's failures. */
typedef struct dt_rdzv_failure {
    double time;             /* wall clock (s): the error file's timestamp, else when it exited */
    char host[64];           /* host name of the node */
    int node;                /* group rank of that node */
    int rank;                /* global rank; -1 for a node-level failure */
    int local_rank;          /* -1 for a node-level failure */
    int pid;                 /* worker pid (0 when not known) */
    int exit_code;           /* exit status (when signal == 0) */
    int signal;              /* the signal that killed it, 0 if it exited */
    char message[512];       /* the error file's message, or what happened */
    char error_file[512];    /* path of the error file, "" when none was written */
} dt_rdzv_failure;

typedef enum dt_rdzv_state {
    DT_RDZV_RUNNING = 0, /* nothing to do */
    DT_RDZV_SUCCEEDED,   /* every node reported success: the job is done */
    DT_RDZV_FAILED,      /* some node reported a failure (or was lost): stop, then next round */
    DT_RDZV_ABORTED,     /* some agent was stopped by a signal: stop and end the job */
    DT_RDZV_REGROUP,     /* (c10d) membership changes: stop, next round, budget unchanged */
} dt_rdzv_state;

typedef struct dt_rdzv_status {
    dt_rdzv_state state;
    int node;            /* the node that ended the round (-1 unknown) */
    int signal;          /* DT_RDZV_ABORTED: the signal that stopped it */
    char why[256];       /* one line for the log */
    bool setup_error;    /* DT_RDZV_ABORTED because the nodes' settings disagree (static: their
                            --nnodes), or a node's workers report a configuration error
                            (dt_rdzv_abort_config): a usage error that a restart would repeat,
                            not a worker's failure (exit code 2) */
} dt_rdzv_status;

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
 * status.state is SUCCEEDED (exit 0), FAILED (the budget is spent) or ABORTED, with the why. */
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
 * left, so nobody loses the store while reading the outcome, then stops the store. c10d: every
 * agent that opened counts (spares, and a node declared lost that came back) until it has left
 * or has been silent for heartbeat_timeout. Accepts NULL. */
void dt_rdzv_close(dt_rdzv *r);

/* ---- helpers shared by the backends and the tests ---------------------------------------- */

/* Encodes / decodes one failure as a single-line JSON object (no newline). */
char *dt_rdzv_failure_to_json(const dt_rdzv_failure *f);
int dt_rdzv_failure_from_json(const char *text, size_t len, dt_rdzv_failure *f);

/* A TCP port that was free on all interfaces a moment ago (bind to port 0, read it, close). */
int dt_rdzv_free_port(int *port, dt_err *err);

/* The address this host uses to reach host:port (a UDP connect, no packet sent), e.g. the
 * interface toward node 0. Falls back to the host name. Never fails. */
void dt_rdzv_route_addr(const char *host, int port, char *out, size_t cap);

/* Splits "HOST[:PORT]" ("[v6]:port" too). *port is left unchanged when there is none. */
int dt_rdzv_parse_endpoint(const char *ep, char *host, size_t cap, int *port, dt_err *err);

#endif
