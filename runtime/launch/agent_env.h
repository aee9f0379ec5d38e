/* agent_env.h - what the agent finds out about its node and gives each worker: the worker's
 * environment (torchrun's variables plus DTRAIN_*), the number of workers for
 * --nproc-per-node auto|gpu|cpu.
 *
 * Nothing here initialises CUDA: GPUs are counted from /dev/nvidiaN, /proc/driver/nvidia/gpus or,
 * when neither exists, NVML loaded with dlopen (which does not create a CUDA context). A process
 * that touched CUDA must never fork a CUDA child, and the agent forks every worker.
 */
#ifndef DT_AGENT_ENV_H
#define DT_AGENT_ENV_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* A growable environment: "NAME=value" strings, NULL-terminated for execve. */
typedef struct dt_envb {
    char **v;   /* owned strings, v[n] == NULL */
    size_t n, cap;
} dt_envb;

/* Copies base (NULL-terminated, e.g. environ; NULL = empty). */
int dt_envb_init(dt_envb *b, char *const *base, dt_err *err);
/* Sets name=value, replacing an existing entry. */
int dt_envb_set(dt_envb *b, const char *name, const char *value, dt_err *err);
int dt_envb_setf(dt_envb *b, dt_err *err, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The value of name, or NULL. */
const char *dt_envb_get(const dt_envb *b, const char *name);
void dt_envb_free(dt_envb *b);

/* Everything that differs between workers and attempts. Strings are borrowed. */
typedef struct dt_worker_env {
    int rank;              /* RANK, ROLE_RANK */
    int local_rank;        /* LOCAL_RANK */
    int world_size;        /* WORLD_SIZE, ROLE_WORLD_SIZE */
    int local_world_size;  /* LOCAL_WORLD_SIZE */
    int group_rank;        /* GROUP_RANK: this node's rank */
    int group_world_size;  /* GROUP_WORLD_SIZE: nodes */
    int restart_count;     /* TORCHELASTIC_RESTART_COUNT, DTRAIN_ATTEMPT */
    int max_restarts;      /* TORCHELASTIC_MAX_RESTARTS */
    const char *run_id;    /* TORCHELASTIC_RUN_ID, DTRAIN_RUN_ID */
    const char *role;        /* ROLE_NAME (NULL = "default") */
    const char *master_addr; /* MASTER_ADDR */
    int master_port;         /* MASTER_PORT */
    const char *store_addr;  /* DTRAIN_STORE_ADDR ("" or NULL = no store: left unset) */
    int store_port;          /* DTRAIN_STORE_PORT */
    const char *error_file;  /* DTRAIN_ERROR_FILE, TORCHELASTIC_ERROR_FILE */
    const char *local_addr;  /* DTRAIN_LOCAL_ADDR */
    bool omp_one;            /* set OMP_NUM_THREADS=1 (the caller checked it is unset) */
    int agent_pid;           /* DTRAIN_AGENT_PID (for the worker guard) */
    int round;               /* DTRAIN_ROUND: the rendezvous round (new on every restart and
                                every membership change; restart_count is not) */
} dt_worker_env;

/* Builds a worker's environment: base (the agent's environ) with the variables of w set on top.
 * b is initialised here; free with dt_envb_free. */
int dt_agent_env_build(dt_envb *b, char *const *base, const dt_worker_env *w, dt_err *err);

/* GPUs visible to this process without initialising CUDA (CUDA_VISIBLE_DEVICES applied). *how
 * (may be NULL) gets where the count came from. Never fails: 0 when nothing is found. */
int dt_agent_count_gpus(char *how, size_t cap);

/* How many of `physical` GPUs a CUDA_VISIBLE_DEVICES value leaves visible, as the CUDA runtime
 * reads it: a comma list cut at the first invalid entry; an index must be below the physical
 * count; UUIDs (GPU-..., MIG-...) count as given. "" leaves none. */
int dt_agent_visible_gpus(const char *vis, int physical);

/* CPUs this process may run on (its affinity mask). */
int dt_agent_count_cpus(void);

/* Resolves --nproc-per-node: a number; gpu (GPUs, an error when there are none); cpu (CPUs);
 * auto (GPUs if any, else CPUs, as torchrun). *why (may be NULL) gets a phrase for the log
 * ("2 GPUs (from /dev/nvidia*)"). */
int dt_agent_resolve_nproc(const char *spec, int *nproc, char *why, size_t cap, dt_err *err);

#endif
