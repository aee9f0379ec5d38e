/* rdzv_types.h - the rendezvous's data: what the agent asks for (dt_rdzv_opts), what a round
 * decided (dt_rdzv_round), a failure as the root-cause table shows it (dt_rdzv_failure), and the
 * state of a round (dt_rdzv_status). Types only: the functions are in rdzv.h (the contract the
 * agent codes against) and rdzv_backend.h (what each backend implements), which both use them.
 */
#ifndef DT_RDZV_TYPES_H
#define DT_RDZV_TYPES_H

#include <stdbool.h>
#include <stddef.h>

#define DT_RDZV_STR 256

/* The agent fills this from its launcher settings (rendezvous/ knows nothing of runtime/). */
typedef struct dt_rdzv_opts {
    char backend[32];              /* "static", "c10d" or "etcd" (rdzv.c lists the backends) */
    char nnodes[32];               /* "N" (static), or "MIN:MAX" (c10d) */
    int node_rank;                 /* static: this node's rank, 0 <= node_rank < N */
    char endpoint_host[DT_RDZV_STR]; /* the store's host as every node reaches it */
    int endpoint_port;             /* the store's port; 0 = any free port (one node only) */
    char endpoints[1024];          /* etcd: --rdzv-endpoint as given (HOST:PORT,HOST:PORT,...) */
    char cacert[DT_RDZV_STR];      /* etcd: TLS CA file, client certificate and key, user and */
    char cert[DT_RDZV_STR];        /* password file ("" = not used) */
    char key[DT_RDZV_STR];
    char user[DT_RDZV_STR];
    char password_file[DT_RDZV_STR];
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
    const char *job;               /* the settings every node must share, "key=value" lines
                                      (the agent's dt_job_shared_text; borrowed until
                                      dt_rdzv_close; NULL or "" = none, a command). The first
                                      node's defines the job; a node whose differ is refused
                                      (dt_rdzv_open: -EINVAL naming the keys) */
    bool ending;                   /* this node joins only to end the job (its own files failed
                                      the launcher's check, dt_rdzv_abort_config): its job is
                                      not compared with the job's, and as the first node it
                                      marks the job's settings so that nobody compares theirs */
    /* Called between bounded waits of dt_rdzv_open and dt_rdzv_next (about every 100 ms); when
     * it returns true the call gives up with -EINTR. NULL = never. */
    bool (*interrupted)(void *arg);
    /* Whether a world of `world` ranks is one the job can run on (the agent's: parallel.tensor
     * x parallel.pipeline divides it, and train.global_batch has a sample for each of its
     * data-parallel ranks). c10d: a round takes the largest prefix of its joiners (survivors
     * first, then newcomers by join order; at least MIN) whose world is usable, and the nodes
     * beyond it wait as spares, as beyond MAX; a newcomer ends a running round only when the
     * nodes then present make a larger usable world. When no prefix of MIN or more is usable
     * the round takes them all (and the agent refuses it, naming the layout). NULL = every
     * world. Called with arg, from the thread that calls dt_rdzv_next. */
    bool (*world_usable)(void *arg, int world);
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

#endif
