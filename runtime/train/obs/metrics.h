/* metrics.h - what a run reports while it trains: metrics.jsonl, log lines, a progress line.
 *
 * Rank 0 appends one JSON object per logged step to <output_dir>/metrics.jsonl (appended, so a
 * restarted job continues the same file; "attempt" tells the attempts apart, "run" the runs: a
 * fresh start from step 0 draws a new run id, a resume continues the run of its checkpoint, so
 * a fresh start into a used directory is told apart from what is there; readers such as
 * scripts/plot-metrics.sh take the last run, and within it the last record of each step):
 *
 *   {"type":"train","step":20,"epoch":0,"loss":4.91,"loss_steps":10,"lr":0.0015,"grad_norm":1.8,
 *    "tokens_per_s":20480,"step_time_s":0.025,"comm_time_s":0,"peak_mem_bytes":12345678,
 *    "max_rss_bytes":45678912,"mem_peak_bytes":{"params":..,"grads":..,"optim":..,
 *    "activations":..,"comm":..,"other":..},"time":1700000000.1,"attempt":0,"run":"3f9c..."}
 *   {"type":"eval","step":50,"val_loss":3.2,"val_acc":0.51,"time":...,"attempt":0,"run":"3f9c..."}
 *
 * Each attempt's records start with its layout (dt_metrics_layout; an elastic job's data
 * degree changes with its world): the world size and the degrees of the data x tensor x
 * pipeline grid (runtime/train/parallel/grid.h), dp x tp x pp = world_size:
 *
 *   {"type":"layout","world_size":8,"dp":2,"tp":2,"pp":2,"time":...,"attempt":0}
 *
 * "loss" (like step_time_s and comm_time_s) is a mean over the "loss_steps" steps since the
 * previous record (job.log_every of them, fewer at the first and the last), and so is the loss
 * of the log line ("loss 2.3074 (mean of 10 steps)"); a checkpoint keeps the loss of its step
 * alone (`dtrain ckpt list`'s STEP_LOSS), so the two differ.
 *
 * peak_mem_bytes is the backend allocator's peak of all categories together (the largest total
 * resident since the previous record: the trainer resets the statistics' peaks after each,
 * kernels/backend_ops.h's dt_mem_stats.total_peak); mem_peak_bytes is each
 * category's own peak (they need not add up to peak_mem_bytes: the peaks may come at different
 * times). mem_peak_bytes is left out for a backend without accounting.
 *
 * Classification jobs report samples_per_s instead of tokens_per_s, and val_acc. On a terminal
 * stderr also shows one progress line that rewrites itself; otherwise (logs, pipes, the agent)
 * plain INFO lines are written every log_every steps. Other ranks write nothing.
 */
#ifndef DT_METRICS_H
#define DT_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "kernels/backend.h" /* dt_mem_stats */

typedef struct dt_step_record {
    int64_t step;         /* optimiser steps completed (1-based for the step just done) */
    int64_t total_steps;
    int64_t epoch;
    double loss;          /* mean training loss over the loss_steps steps up to this one (each
                           * step's loss a mean over its micro-steps and ranks) */
    int64_t loss_steps;   /* steps that loss, step_time_s and comm_time_s average over: those
                           * since the last record (job.log_every; fewer at the first and the
                           * last); 0 = not said */
    double lr;
    double grad_norm;     /* before clipping */
    double loss_scale;    /* fp16's dynamic loss scale after the step; 0 when not used */
    int64_t skipped_steps;/* steps skipped for inf/NaN gradients so far (fp16) */
    double items_per_s;   /* tokens/s (language models) or samples/s, all ranks together */
    double step_time_s;   /* mean wall time per step over the logged window */
    double comm_time_s;   /* time waiting for gradient synchronisation per step */
    double comm_bytes;    /* bytes this rank sent for gradients per step (mean over the
                           * window), as its communicator counted them; < 0: not known (no
                           * reducer: one process, DP, ZeRO-3) */
    size_t peak_mem_bytes;/* backend allocations, the process's peak (set-up included; written
                           * as run_peak_mem_bytes, and as peak_mem_bytes when mem is not filled:
                           * mem.total_peak is, the record's window) */
    dt_mem_stats mem;     /* the backend's accounting by category (dt_mem_read); all zero: none */
    size_t max_rss_bytes; /* process resident set, peak */
} dt_step_record;

typedef struct dt_eval_record {
    int64_t step;
    double val_loss;
    double val_acc;       /* classification accuracy; < 0 when not applicable */
} dt_eval_record;

typedef struct dt_metrics dt_metrics;

/* Opens the writer. enabled = false (ranks other than 0) gives a writer that only keeps time.
 * output_dir is created. tokens: label throughput as tokens/s (else samples/s). attempt is
 * recorded in every line. */
int dt_metrics_open(dt_metrics **out, const char *output_dir, bool enabled, bool tokens,
                    int attempt, dt_err *err);

/* The run id every record from now on carries as "run" (copied, at most 31 characters; NULL
 * or "": none). Accepts NULL. */
void dt_metrics_set_run(dt_metrics *m, const char *run);

/* The run's layout (world size and the grid's data, tensor and pipeline degrees), recorded
 * once, just before the first train or eval record of this open. Accepts NULL. */
void dt_metrics_layout(dt_metrics *m, int world, int dp, int tp, int pp);

/* Appends a train record and shows it (progress line or log line). */
void dt_metrics_step(dt_metrics *m, const dt_step_record *r);

/* Appends an eval record and logs it. */
void dt_metrics_eval(dt_metrics *m, const dt_eval_record *r);

/* Ends the progress line (if any) so that what follows starts on a new line. */
void dt_metrics_finish_line(dt_metrics *m);

/* Path of metrics.jsonl ("" when disabled). */
const char *dt_metrics_path(const dt_metrics *m);

/* Records that could not be appended to metrics.jsonl (a full disk, an I/O error) since open;
 * 0 when all were written, when disabled, and for NULL. The first loss is logged when it
 * happens; the count belongs in the run's summary (dt_metrics_print_summary). */
int64_t dt_metrics_lost(const dt_metrics *m);

/* The summary's line about metrics, to out: "dtrain: metrics in <path>" when every record was
 * written; else a warning (also logged) with how many of how many records were lost, where,
 * and why, and no claim that the metrics are there. Nothing when disabled or NULL. */
void dt_metrics_print_summary(const dt_metrics *m, FILE *out);

/* Accepts NULL. */
void dt_metrics_close(dt_metrics *m);

/* Peak resident set size of this process in bytes (getrusage). */
size_t dt_metrics_max_rss(void);

#endif
