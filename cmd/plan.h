/* plan.h - `dtrain plan`: every legal layout of a job on a world, its per-rank memory by
 * category and its step time predicted, ranked; the planner behind it (cmd/plan.c) and the
 * check of its predictions against the real trainer (cmd/plan_check.c).
 *
 * Memory is the backend's own accounting, not a formula of it: for every distinct shape of
 * rank a layout makes (tensor degree T and rank 0's slice, sequence parallelism, pipeline
 * stage, recomputation) the planner builds that model on the cpu backend at micro-batches of
 * 1 and 2 samples and reads what the allocator charged to parameters, gradients and
 * activations (kernels/backend_ops.h's dt_mem_stats), so it is exact for every model of the
 * zoo and moves with them; activations are linear in the micro-batch (a + b x samples) and
 * each activation slot a pipeline schedule keeps beyond the first adds the model's
 * pp_slot_bytes. What the data-parallel sync adds on top follows what `dtrain bench memory`
 * measures of it (Ψ this rank's parameters, D the data degree, k the optimiser's bytes a
 * parameter: AdamW 8, SGD with momentum 4, plain SGD 0; blk 4 x the largest block):
 *   zero 0:    params 4Ψ, grads 4Ψ, optim kΨ
 *   zero 1, 2: params 4Ψ, grads 4Ψ + 4Ψ/D (the shard the optimiser steps), optim kΨ/D, and
 *              in the first step full-size staging (other): ZeRO-1 kΨ, ZeRO-2 4Ψ
 *   zero 3:    params 4Ψ/D + 2 blk (the block computed and the one prefetched), grads 4Ψ/D +
 *              blk, optim kΨ/D, comm 2 blk
 * and the peak is the largest over the pipeline's stages.
 *
 * Step time: compute is the model's FLOPs (the rank's share: its stage, its tensor slice;
 * block recomputation one more forward) at the GEMM rate measured on this host for the
 * layout's shapes, shared by the node's ranks when they outnumber its CPUs; communication is
 * each layout's volume at a link's bandwidth and latency (shared memory inside a node, TCP
 * between nodes): tensor parallelism's 4 all-reduces a block and 2 more of (b, seq, C) per
 * micro-batch, not overlapped; the data-parallel all-reduce (ZeRO 1-2: reduce-scatter plus
 * all-gather, the same volume; ZeRO-3 1.5 x) overlapped with the last micro-batch's backward;
 * the pipeline's activations between stages; and the pipeline's step is the replay of its
 * schedule (pp_schedule.h's dt_pp_simulate_stages) with each stage's predicted forward and
 * backward.
 */
#ifndef DT_PLAN_H
#define DT_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "kernels/backend_ops.h" /* DT_MEM_CAT_COUNT */
#include "runtime/job/config.h"

/* The rates the step time is predicted with. */
typedef struct dt_plan_rates {
    double gemm_flops;      /* FLOP/s of one rank's GEMMs at the model's shapes (0: measure) */
    double shm_bw, shm_lat; /* all-reduce bus bandwidth (bytes/s) and latency (s) in a node */
    double net_bw, net_lat; /* the same between nodes (TCP) */
    double optim_s;         /* optimiser seconds a parameter a step */
    int cpus;               /* CPUs of a node (compute is shared when ranks outnumber them) */
} dt_plan_rates;

/* Fills r with this host's defaults (gemm_flops 0: measured at the first plan). */
void dt_plan_rates_default(dt_plan_rates *r);

/* One layout and what is predicted of it. */
typedef struct dt_plan_layout {
    int data, tensor, pipeline, zero;
    dt_recompute_kind recompute;
    bool sequence_parallel;
    int micro_batches;             /* pipeline micro-batches M (1 without a pipeline) */
    dt_pp_schedule_kind schedule;
    int batch_size, grad_accum;    /* per rank: batch_size x grad_accum x data = global batch */
    double mem[DT_MEM_CAT_COUNT];  /* bytes per category of the costliest rank */
    double peak_bytes;             /* their sum: the predicted per-rank peak */
    double compute_s, comm_s, bubble_s, step_s; /* step_s = the predicted step */
    bool fits;
    char why[200];                 /* !fits: why not ("optim state 3.1 GiB > budget ...") */
} dt_plan_layout;

/* The request. */
typedef struct dt_plan_req {
    int nnodes, nproc;             /* the world: nnodes x nproc ranks */
    double device_memory;          /* bytes a rank may hold; 0: no budget */
    int64_t global_batch;          /* samples a step; 0: the job's (global_batch, else
                                      batch_size x grad_accum x its data degree) */
} dt_plan_req;

typedef struct dt_plan {
    dt_plan_layout *v;             /* (n) owned; sorted: those that fit, fastest first, then
                                      the others, the nearest to the budget first */
    int n, n_fit;
    int chosen;                    /* index of the pick (0), or -1 when nothing fits */
    int64_t global_batch;
    int world;
    char model[64];                /* "gpt (preset gpt-tiny)" */
    dt_plan_rates rates;           /* the rates used (gemm measured) */
    int excluded;                  /* layouts that could not be built at all (below) */
    char excluded_why[8][200];     /* the distinct reasons, up to 8 */
    int n_excluded_why;
} dt_plan;

/* Plans job (loaded) for req: enumerates every layout, predicts and ranks them. rates NULL:
 * the defaults, the GEMM rate measured here. Returns 0, or -EINVAL (a request that cannot be
 * planned: world < 1, a global batch the world does not divide for any layout) / -ENOMEM with
 * err set. plan is filled on success; dt_plan_free it. */
int dt_plan_make(dt_plan *plan, const dt_job *job, const dt_plan_req *req,
                 const dt_plan_rates *rates, dt_err *err);
void dt_plan_free(dt_plan *plan);

/* The overrides that run layout l ("parallel.tensor=2 parallel.pipeline=1 ..."), into
 * av[0..) of cap strings of size DT_PLAN_OV_LEN each. Returns how many. */
#define DT_PLAN_OV_LEN 64
#define DT_PLAN_OV_MAX 10
int dt_plan_overrides(const dt_plan_layout *l, char (*av)[DT_PLAN_OV_LEN]);

/* l in one short line: "D2 T1 P2 z1 block M4 1f1b b16x1". */
void dt_plan_layout_name(const dt_plan_layout *l, char *buf, size_t cap);

/* The table (stdout form) and the JSON form of a plan. */
void dt_plan_print(const dt_plan *p, int top, FILE *out);
/* The JSON object; close false leaves it open for more members (--check's). */
void dt_plan_print_json(const dt_plan *p, bool close, FILE *out);

/* A size as job.device_memory takes it (dt_parse_bytes: K, M, G, T powers of 1000, Ki, Mi, Gi,
 * Ti of 1024, an optional B: "512Mi", "1.5G", "1GiB"), above 0, into *bytes. 0, or -EINVAL. */
int dt_plan_parse_bytes(const char *s, double *bytes);

/* --check: what one layout measured. */
typedef struct dt_plan_measure {
    double peak_bytes;             /* the largest peak_mem_bytes of its records (the run's) */
    double mem[DT_MEM_CAT_COUNT];  /* mem_peak_bytes by category, the same way */
    double step_s;                 /* step_time_s of its last record (steps after the first) */
} dt_plan_measure;

/* Runs layout l of job_path (with the user's overrides ov[0..n_ov)) through the launcher
 * (the dtrain binary at bin, NULL: this one; --nnodes 1 --nproc-per-node l's world, `steps` steps, a fresh output
 * directory under dir) and reads what its metrics.jsonl says. 0, or an error with err set. */
int dt_plan_measure_layout(const char *bin, const char *job_path, char *const *ov, int n_ov,
                           const dt_plan_layout *l, int world, int steps, const char *dir,
                           dt_plan_measure *out, dt_err *err);

/* The device memory a rank of job may hold, for parallel.layout = auto (0: no budget): the job's
 * job.device_memory (on cuda without it the device's own, which the launcher cannot read
 * without initialising CUDA: no budget). The one place the budget is read (dtrain plan's
 * --device-memory is its own flag). */
double dt_plan_job_budget(const dt_job *job);

/* Whether job plans its layout per round (parallel.layout = auto on an elastic --nnodes
 * MIN:MAX with --nproc-per-node a number): the world is known only once a round has gathered,
 * so the agent asks for the layout at every round whose world is new (dt_plan_auto_round). */
bool dt_plan_auto_elastic(const dt_job *job);

/* parallel.layout = auto (cmd/dtrain.c, before the agent starts): plans job for its fixed
 * elastic.nnodes x nproc_per_node and sets the chosen layout's keys in it (dt_job_set), logging
 * the choice, its predicted peak and step, and the runner-up. 0 (also when layout is
 * explicit, or elastic: dt_plan_auto_elastic, nothing done); -EINVAL with err set when the
 * world is not numbers or nothing fits (the nearest layouts named); another error from the
 * planner. */
int dt_plan_apply_auto(dt_job *job, dt_err *err);

/* The state of an elastic parallel.layout = auto job, for the agent's round hook. */
typedef struct dt_plan_auto {
    const dt_job *job;             /* the job as loaded, layout not planned (borrowed) */
    const char *path;              /* the resolved job the workers load, rewritten per plan */
    int64_t global_batch;          /* the first plan's global batch (0 until then), which every
                                      later plan keeps: a membership change keeps the step */
} dt_plan_auto;

/* The layout of a round of nnodes x nproc ranks: given NULL, plans it (as dt_plan_apply_auto
 * does, at the first plan's global batch) from a->job; else applies given, what group rank 0's
 * plan gave ("plan.global_batch=16 parallel.tensor=1 ...": the plan's global batch, which this
 * node's later plans keep, then the keys; only parallel.* and train.* keys). Either way writes the
 * job with that layout to a->path (renamed into place), *tensor and *pipeline its T and P, and
 * choice (cap bytes; may be NULL) the keys, space-separated. 0, or -EINVAL (nothing fits, a bad
 * given) / another error with err set; a->path unchanged on failure. */
int dt_plan_auto_round(dt_plan_auto *a, int nnodes, int nproc, const char *given, char *choice,
                       size_t cap, int *tensor, int *pipeline, dt_err *err);

/* Spearman's rank correlation of x and y (n >= 2; ties get their mean rank). */
double dt_plan_spearman(const double *x, const double *y, int n);

#endif
