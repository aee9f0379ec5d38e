/* agent_env.h - what the agent finds out about its node: the number of workers for
 * --nproc-per-node auto|gpu|cpu. (What it gives each worker, the environment, is the contract in
 * runtime/job/workenv.h: dt_worker_env, written by dt_workenv_export.)
 *
 * Nothing here initialises CUDA: GPUs are counted from /dev/nvidiaN, /proc/driver/nvidia/gpus or,
 * when neither exists, NVML loaded with dlopen (which does not create a CUDA context). A process
 * that touched CUDA must never fork a CUDA child, and the agent forks every worker.
 */
#ifndef DT_AGENT_ENV_H
#define DT_AGENT_ENV_H

#include <stddef.h>

#include "common/err.h"
#include "runtime/job/config.h"
#include "runtime/job/workenv.h"

/* GPUs visible to this process without initialising CUDA (CUDA_VISIBLE_DEVICES applied). *how
 * (may be NULL) gets where the count came from. Never fails: 0 when nothing is found. */
int dt_agent_count_gpus(char *how, size_t cap);

/* How many of `physical` GPUs a CUDA_VISIBLE_DEVICES value leaves visible, as the CUDA runtime
 * reads it: a comma list cut at the first invalid entry; an index must be below the physical
 * count; UUIDs (GPU-..., MIG-...) count as given. "" leaves none. */
int dt_agent_visible_gpus(const char *vis, int physical);

/* CPUs this process may run on (its affinity mask). */
int dt_agent_count_cpus(void);

/* Resolves --nproc-per-node (elastic.nproc_per_node, decoded by runtime/job/config.c): a number
 * (-EINVAL outside 1..DT_NPROC_MAX); gpu (GPUs, -ENODEV when there are none); cpu (CPUs); auto
 * (GPUs if any, else CPUs, as torchrun). *why (may be NULL) gets a phrase for the log
 * ("2 GPUs (from /dev/nvidia*)"). */
int dt_agent_resolve_nproc(const dt_nproc *spec, int *nproc, char *why, size_t cap, dt_err *err);

/* Sets each "NAME=value" of extra (NULL-terminated; NULL: nothing) in env unless env has NAME
 * already: what the caller asked workers to get (dt_agent_spec.worker_env) never overrides what
 * the user or the machine set (an OPENBLAS_CORETYPE stays as it is). 0, or -ENOMEM / -EINVAL (a
 * string without '=') with err set. */
int dt_agent_env_defaults(dt_envb *env, char *const *extra, dt_err *err);

#endif
