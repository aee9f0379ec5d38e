/* config.h - the job: one typed, validated struct with a default for every key.
 *
 * runtime/job/ is the contract the launcher (runtime/launch) and the trainer (runtime/train)
 * share: the job (this file), the worker's environment (workenv.h: what the agent sets, what
 * the worker reads, the exit codes), the error file (errfile.h) and the worker's guard against
 * outliving its agent (worker_guard.h). Both sides include it; it includes only common/,
 * rendezvous/rdzv.h (the rendezvous backends' names and endpoint form) and the pipeline cost
 * model below it (cost.h), never launch/, comm/, train/ or kernels/, so either side can change
 * without the other. config.c holds the key table and single values, config_load.c the reading
 * of a job file and the checks at load.
 *
 * A job file is INI (parsed with inih). Sections: [job] [model] [data] [train] [ddp] [parallel]
 * [checkpoint] [elastic] [rendezvous]. Precedence, lowest first: the defaults of the table in
 * config.c, the file, PET_* variables and DTRAIN_OUTPUT_DIR (job.output_dir), `section.key=value`
 * overrides, then launcher flags (the order of dt_setting arrays, which cmd/args.c makes; among
 * settings of one kind the last one given wins). rendezvous.conf entries take effect where the
 * conf itself is set (a later explicit key beats them; they beat earlier ones). That table is
 * the single source of keys, types, defaults, ranges and help: the parser, --print-config and the
 * README's key reference (tested against it) all come from it.
 *
 * The job is decoded once, here: every key with a fixed set of values is a C enum below (the
 * *_name functions give the names back for messages), checkpoint.resume is an enum plus a path,
 * data.synthetic_shape three numbers. No other module compares the job's strings, and nobody
 * edits a job after loading: the launcher resolves it once and writes it with dt_job_print to
 * a private file (cmd/dtrain.c: $TMPDIR/dtrain-job-XXXXXX/job.ini, removed when the agent ends);
 * every worker of every attempt runs `dtrain worker` on that file, which dt_job_load reads
 * back to the same job (tested). The workers never read the user's job file or the
 * environment's settings again.
 *
 * A value in double quotes has them removed ("my job" is my job; quotes keep spaces at either
 * end, and --print-config writes them where needed); a UTF-8 BOM at the start is skipped.
 *
 * Errors are collected, not stopped at: an unknown section or key (with the nearest valid name),
 * a wrong type, a value out of range, a required key missing; each with file:line.
 */
#ifndef DT_CONFIG_H
#define DT_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "runtime/job/cost.h"

#define DT_STR_SMALL 32
#define DT_STR_MID 256
#define DT_PATH_MAX 1024

/* ---- the job's choices, decoded once ------------------------------------------------------
 * Every key with a fixed set of values is one of these enums in dt_job / dt_launch. The value
 * of each constant is the position of its name in the key's list of choices (config.c's table);
 * the *_name functions give the name back (for log lines), "" for a value out of range.
 * Nothing outside config.c compares a job's strings to decode them again. */

typedef enum dt_device_kind { DT_DEVICE_AUTO, DT_DEVICE_CPU, DT_DEVICE_CUDA } dt_device_kind;
typedef enum dt_strategy_kind { DT_STRATEGY_DDP, DT_STRATEGY_DP } dt_strategy_kind;
typedef enum dt_dp_transport_kind {
    DT_DP_TRANSPORT_AUTO, DT_DP_TRANSPORT_MASTER, DT_DP_TRANSPORT_COLLECTIVES
} dt_dp_transport_kind;
typedef enum dt_cpu_bind_kind { DT_CPU_BIND_AUTO, DT_CPU_BIND_NONE } dt_cpu_bind_kind;
/* model.type is required: DT_MODEL_UNSET only before a job file set it. */
typedef enum dt_model_kind {
    DT_MODEL_UNSET = -1, DT_MODEL_MLP, DT_MODEL_RESNET, DT_MODEL_GPT,
    DT_MODEL_BERT, DT_MODEL_LLAMA
} dt_model_kind;
typedef enum dt_preset_kind {
    DT_PRESET_NONE, DT_PRESET_GPT_TINY, DT_PRESET_GPT_MINI, DT_PRESET_GPT2_124M,
    DT_PRESET_BERT_TINY, DT_PRESET_BERT_BASE, DT_PRESET_BERT_LARGE,
    DT_PRESET_LLAMA_TINY, DT_PRESET_LLAMA3_8B, DT_PRESET_LLAMA3_70B,
    DT_PRESET_RESNET18, DT_PRESET_RESNET34, DT_PRESET_RESNET50, DT_PRESET_RESNET101,
    DT_PRESET_RESNET152
} dt_preset_kind;
typedef enum dt_data_kind {
    DT_DATA_SYNTHETIC, DT_DATA_TEXT, DT_DATA_TOKENS, DT_DATA_CIFAR10, DT_DATA_MNIST
} dt_data_kind;
/* train.optimizer and train.schedule: the optimiser's own types (runtime/train/optim.h). */
typedef enum dt_optim_kind { DT_OPTIM_ADAMW = 0, DT_OPTIM_SGD = 1 } dt_optim_kind;
typedef enum dt_lr_kind { DT_LR_CONSTANT = 0, DT_LR_COSINE = 1, DT_LR_LINEAR = 2 } dt_lr_kind;
/* train.precision (the trainer maps it to kernels/backend.h's dt_precision). */
typedef enum dt_precision_kind {
    DT_PRECISION_FP32, DT_PRECISION_BF16, DT_PRECISION_FP16
} dt_precision_kind;
/* train.recompute (models/zoo.c maps it to runtime/train/models/model.h's dt_recompute). */
typedef enum dt_recompute_kind {
    DT_RECOMP_NONE, DT_RECOMP_BLOCK, DT_RECOMP_SELECTIVE
} dt_recompute_kind;
typedef enum dt_comm_backend_kind {
    DT_COMM_BACKEND_AUTO, DT_COMM_BACKEND_CPU, DT_COMM_BACKEND_NCCL
} dt_comm_backend_kind;
/* ddp.compress (DDP maps it to comm.h's dt_dtype of the payload). */
typedef enum dt_compress_kind {
    DT_COMPRESS_NONE, DT_COMPRESS_BF16, DT_COMPRESS_FP16, DT_COMPRESS_INT8, DT_COMPRESS_1BIT
} dt_compress_kind;
/* parallel.schedule: the order of a pipeline's micro-batches (1F1B = PipeDream-Flush). */
typedef enum dt_pp_schedule_kind { DT_PP_1F1B = 0, DT_PP_GPIPE = 1 } dt_pp_schedule_kind;
/* parallel.layout: the [parallel] keys as given, or the launcher's plan (cmd/plan.h). */
typedef enum dt_layout_kind { DT_LAYOUT_EXPLICIT = 0, DT_LAYOUT_AUTO = 1 } dt_layout_kind;
#define DT_MAX_STAGES 64
#define DT_MAX_HIDDEN 16 /* model.hidden: widths at most */
/* checkpoint.resume: auto, never, or a path (then in dt_job.resume_path). */
typedef enum dt_resume_kind { DT_RESUME_AUTO, DT_RESUME_NEVER, DT_RESUME_PATH } dt_resume_kind;
/* rendezvous.backend (the names rendezvous/rdzv.h's dt_rdzv_opts.backend takes). */
typedef enum dt_rdzv_backend_kind { DT_RDZV_STATIC, DT_RDZV_C10D, DT_RDZV_ETCD } dt_rdzv_backend_kind;
/* elastic.nproc_per_node: a number of workers, or one the agent counts when it starts (auto:
 * the GPUs if any, else the CPUs, as torchrun; cpu: the CPUs; gpu: the GPUs, an error when
 * there are none); runtime/launch/agent_env.h's dt_agent_resolve_nproc does the counting. */
typedef enum dt_nproc_kind { DT_NPROC_NUMBER, DT_NPROC_AUTO, DT_NPROC_CPU, DT_NPROC_GPU } dt_nproc_kind;
#define DT_NPROC_MAX 4096
typedef struct dt_nproc {
    dt_nproc_kind kind;
    int n; /* DT_NPROC_NUMBER: 1..DT_NPROC_MAX; 0 for the others */
} dt_nproc;

const char *dt_device_name(dt_device_kind v);
const char *dt_strategy_name(dt_strategy_kind v);
const char *dt_dp_transport_name(dt_dp_transport_kind v);
const char *dt_cpu_bind_name(dt_cpu_bind_kind v);
const char *dt_model_name(dt_model_kind v);
/* The model reads token sequences (gpt, bert, llama), not vectors or images. */
static inline bool dt_model_reads_tokens(dt_model_kind k)
{
    return k == DT_MODEL_GPT || k == DT_MODEL_BERT || k == DT_MODEL_LLAMA;
}
const char *dt_preset_name(dt_preset_kind v);
const char *dt_data_name(dt_data_kind v);
const char *dt_optim_name(dt_optim_kind v);
const char *dt_lr_name(dt_lr_kind v);
const char *dt_precision_name(dt_precision_kind v);
const char *dt_recompute_name(dt_recompute_kind v);
const char *dt_comm_backend_name(dt_comm_backend_kind v);
const char *dt_compress_name(dt_compress_kind v);
const char *dt_resume_name(dt_resume_kind v);
const char *dt_rdzv_backend_name(dt_rdzv_backend_kind v);
const char *dt_pp_schedule_name(dt_pp_schedule_kind v);
const char *dt_layout_name(dt_layout_kind v);
/* "auto", "cpu", "gpu"; "" for DT_NPROC_NUMBER (a number has no name) and out of range. */
const char *dt_nproc_name(dt_nproc_kind v);
/* The value as a job file writes it ("4", "auto"): into buf (cap bytes), which it returns. */
const char *dt_nproc_format(const dt_nproc *v, char *buf, size_t cap);

/* Launcher settings: from [elastic] and [rendezvous] in a job file, or from launcher flags. */
typedef struct dt_launch {
    /* [elastic] */
    char nnodes[DT_STR_SMALL];         /* "N" or "MIN:MAX" */
    dt_nproc nproc_per_node;           /* N, auto, cpu, gpu */
    int max_restarts;                  /* job-wide restart budget */
    double monitor_interval;           /* seconds: bound on how long a remote failure is unseen */
    double stop_grace;                 /* seconds between SIGTERM and SIGKILL when stopping */
    char log_dir[DT_PATH_MAX];         /* "" = <job.output_dir>/logs, or a temp dir for commands */
    char redirects[DT_STR_MID];        /* 0-3 or "0:3,1:1" per local rank */
    char tee[DT_STR_MID];              /* same forms */
    char local_ranks_filter[DT_STR_MID]; /* "" = all; "0,2" shows only those on the console */
    /* [rendezvous] */
    dt_rdzv_backend_kind rdzv_backend;
    char rdzv_endpoint[DT_STR_MID];    /* HOST[:PORT] */
    char rdzv_id[DT_STR_MID];          /* run id */
    char role[DT_STR_SMALL];           /* ROLE_NAME of the workers (torchrun's --role) */
    char rdzv_conf[DT_STR_MID];        /* always "" once loaded: a conf "k=v,..." is folded into
                                          the typed keys below where it is set */
    double join_timeout, last_call_timeout, close_timeout;
    double read_timeout;               /* seconds a store read waits (torchrun's read_timeout) */
    double heartbeat_interval, heartbeat_timeout;
    bool is_host;                      /* this agent hosts the store (c10d) */
    /* etcd backend: TLS and authentication, passed to libcurl ("" = not used) */
    char rdzv_cacert[DT_STR_MID];      /* CA bundle that signed the etcd members' certificates */
    char rdzv_cert[DT_STR_MID];        /* client certificate (PEM) */
    char rdzv_key[DT_STR_MID];         /* its private key (PEM) */
    char rdzv_user[DT_STR_MID];        /* etcd user (a token from /v3/auth/authenticate) */
    char rdzv_password_file[DT_STR_MID]; /* file holding that user's password */
    /* flags only (no file key) */
    int node_rank;                     /* -1 = assigned by the rendezvous */
    bool standalone;
    char master_addr[DT_STR_MID];
    int master_port;                   /* 0 = choose */
    char local_addr[DT_STR_MID];
} dt_launch;

typedef struct dt_job {
    char path[DT_PATH_MAX];            /* the job file ("" when none) */

    /* [job] */
    char name[DT_STR_MID];
    char output_dir[DT_PATH_MAX];      /* metrics.jsonl, checkpoints, logs */
    dt_device_kind device;
    dt_strategy_kind strategy;
    int dp_replicas;                   /* strategy = dp: replicas driven by the one process */
    dt_dp_transport_kind dp_transport; /* runtime/train/parallel/dp.h */
    dt_cpu_bind_kind cpu_bind;         /* shares of the CPUs per worker / replica, or none */
    int64_t seed;
    int log_every;                     /* steps between log lines / metrics records */

    /* [model] */
    dt_model_kind model_type;          /* required */
    dt_preset_kind preset;
    int n_layer, n_head, n_embd, block_size;
    int n_kv_head, intermediate_size;  /* llama: key/value heads, SwiGLU width */
    double rope_theta, rms_norm_eps;   /* llama */
    char hidden[DT_STR_MID];           /* mlp: "512,256" */
    int depth, width;                  /* resnet (a resnet* preset: torchvision's depth) */
    bool sync_bn;
    bool nsp;                          /* bert: the next-sentence head and sentence pairs */

    /* [data] */
    dt_data_kind data_type;
    char data_path[DT_PATH_MAX];       /* file, directory or glob */
    char val_path[DT_PATH_MAX];        /* "" = split off val_fraction of the training data */
    double val_fraction;
    int seq_len;                       /* language modelling: T */
    int vocab_size;                    /* 0 = from the data (256 for text, 50257 for tokens) */
    double mlm_prob;                   /* bert: share of each sample's tokens masked */
    bool shuffle;
    bool drop_last;
    int64_t synthetic_samples;         /* synthetic: dataset size */
    int synthetic_dim;                 /* synthetic: features per sample */
    int synthetic_classes;             /* synthetic: classes */
    int synthetic_shape[3];            /* synthetic: image C,H,W ("3x32x32"); 0,0,0 = vector */

    /* [train] */
    int batch_size;                    /* per rank, per micro-step */
    int grad_accum;                    /* micro-steps per optimiser step */
    int64_t global_batch;              /* samples per optimiser step over all data-parallel
                                          ranks, kept whatever the world size (0 = off: the
                                          step is batch_size x grad_accum x world) */
    int64_t steps;                     /* optimiser steps (0 = from epochs) */
    int epochs;
    dt_optim_kind optimizer;
    double lr, min_lr;
    double weight_decay, beta1, beta2, eps, momentum;
    bool nesterov;
    dt_lr_kind schedule;
    int64_t warmup_steps;
    double grad_clip;                  /* 0 = off */
    int eval_every;                    /* 0 = only at the end */
    int eval_batches;
    dt_precision_kind precision;
    double loss_scale;                 /* fp16: initial dynamic loss scale */
    int loss_scale_window;             /* fp16: clean steps before the scale doubles */
    int threads;                       /* BLAS threads per worker */
    int64_t device_memory;             /* job.device_memory: the device's budget in bytes (0 =
                                          the device's own: cpu unlimited) */
    dt_recompute_kind recompute;       /* activation recomputation in backward */
    char trace[DT_STR_SMALL];          /* steps traced (runtime/train/obs/trace.h): "off", "on",
                                          "N", "A-B" or "A-"; see dt_job_trace_steps */
    int flight_records;                /* calls kept per worker (runtime/job/flightrec.h) */
    double step_timeout;               /* s without a finished step before the agent's
                                          watchdog asks for a hang verdict; 0 = off */
    double straggler_ratio;            /* a rank's compute over the median's that is flagged;
                                          0 = no straggler scores */
    int straggler_window;              /* steps per straggler window (K) */

    /* [ddp] */
    dt_comm_backend_kind comm_backend;
    double bucket_cap_mb, first_bucket_mb;
    dt_compress_kind compress;
    int compress_warmup_steps;         /* ddp.compress = 1bit: float32 updates before it */
    bool compress_stochastic;          /* ddp.compress = int8: stochastic rounding */
    double comm_timeout;               /* seconds per collective */
    bool broadcast_buffers;
    bool check_consistency;

    /* [parallel] */
    int zero;                          /* ZeRO stage 0..3 (0 = DDP) */
    int tensor;                        /* tensor-parallel degree T (>= 1; gpt only) */
    bool sequence_parallel;            /* Megatron-SP over the tensor group (T > 1) */
    int pipeline;                      /* pipeline stages P (>= 1) */
    int micro_batches;                 /* pipeline micro-batches M per rank batch (>= 1; not
                                          given: P, resolved at load; 1 in dt_job_defaults) */
    dt_pp_schedule_kind pp_schedule;   /* pipeline schedule */
    dt_layout_kind layout;             /* auto: the launcher plans the keys above at start */
    int n_stage_blocks;                /* parallel.stages: 0 = balanced, else P entries */
    int stage_blocks[DT_MAX_STAGES];   /* blocks per stage (gpt: transformer blocks) */

    /* [checkpoint] */
    char ckpt_dir[DT_PATH_MAX];        /* "" = <output_dir>/checkpoints */
    int ckpt_every;                    /* steps; 0 = only at the end and on preemption */
    int ckpt_keep;
    dt_resume_kind resume;
    char resume_path[DT_PATH_MAX];     /* resume = DT_RESUME_PATH: the checkpoint, else "" */
    bool ckpt_async;
    bool ckpt_sharded;                 /* every rank writes its own shard (format version 2) */
    int ckpt_io_buffer_mb;             /* read and write buffer of sharded checkpoints, MiB */
    bool ckpt_host_copy;               /* a save copies what it writes to host memory even on
                                          a host-memory backend (held less, more memory) */

    /* [elastic] and [rendezvous] */
    dt_launch launch;
} dt_job;

/* Fills job with every default of the table (and launch with the launcher defaults). */
void dt_job_defaults(dt_job *job);
void dt_launch_defaults(dt_launch *l);

/* A list of collected errors. Each entry is one line: "FILE:LINE: message". */
typedef struct dt_config_errors {
    int count;
    char lines[64][DT_ERR_MSG_MAX / 2];
} dt_config_errors;

/* Loads defaults, then the file at path, then overrides ("section.key=value"), validates and
 * derives (presets, dependent defaults). Returns 0, or -EINVAL with every error in errs (and a
 * summary in err). The job is complete even on error (for diagnostics only). */
int dt_job_load(dt_job *job, const char *path, char *const *overrides, int n_overrides,
                dt_config_errors *errs, dt_err *err);

/* One command-line setting, for dt_job_load_settings / dt_launch_load. */
typedef struct dt_setting {
    const char *text;   /* "section.key=value" (borrowed) */
    const char *source; /* names it in messages: "--nnodes", "environment PET_NNODES"; NULL =
                           "override N (text)" */
} dt_setting;

/* dt_job_load with settings that carry their source; applied in array order (later wins).
 * Cross-key errors name the source (file:line, flag or override) of the key set last. */
int dt_job_load_settings(dt_job *job, const char *path, const dt_setting *settings, int n,
                         dt_config_errors *errs, dt_err *err);

/* For `dtrain -- COMMAND` (no job file): defaults, then settings, then dt_launch_validate with
 * the same sources in messages. Returns 0 or -EINVAL with every error in errs. */
int dt_launch_load(dt_job *job, const dt_setting *settings, int n, dt_config_errors *errs,
                   dt_err *err);

/* Where section.key got its value at the last dt_job_load / dt_job_load_settings /
 * dt_launch_load of this process ("job.ini:12", "--nnodes", "override 2 (data.path=...)"), or
 * NULL when it kept its default (or no load ran). Valid until the next load. For messages about
 * a loaded job (runtime/job/preflight.h). */
const char *dt_job_source(const char *section, const char *key);

/* Applies one "section.key=value" to an already loaded job (validates that key only). */
int dt_job_set(dt_job *job, const char *assignment, dt_err *err);

/* Validates cross-key constraints (e.g. n_embd divisible by n_head), launcher settings included.
 * Appends to errs; returns -EINVAL when it added any. */
int dt_job_validate(const dt_job *job, dt_config_errors *errs);

/* Validates the launcher settings only (for `dtrain -- COMMAND`, which has no job). `where` names
 * the source in messages. */
int dt_launch_validate(const dt_launch *l, const char *where, dt_config_errors *errs);

/* ---- the [parallel] layout -----------------------------------------------------------------
 * The world is a grid data x tensor x pipeline (runtime/train/parallel/grid.h): D = world / (T x P) with
 * T = parallel.tensor, P = parallel.pipeline. A loaded job has been checked against what it
 * knows: the model (T divides gpt's n_head; P at most the model's blocks; parallel.stages sums to
 * them) and, when both are fixed numbers, elastic.nnodes x elastic.nproc_per_node. Where the
 * world is only known after the rendezvous (MIN:MAX nodes, nproc auto/cpu/gpu) the agent checks
 * it with dt_parallel_check_world before it starts any worker (exit DT_EXIT_CONFIG), and the
 * workers' dt_grid_init once more. */

/* 0 when world ranks (>= 1) can be laid out with tensor x pipeline ranks per data-parallel
 * replica (tensor x pipeline divides world), else -EINVAL with a message naming
 * parallel.tensor, parallel.pipeline and the valid world sizes (the multiples of their product).
 * The launcher, the agent and the workers all say it with this one message. */
int dt_parallel_check_world(int world, int tensor, int pipeline, dt_err *err);

/* model.hidden's widths into widths[0..DT_MAX_HIDDEN): comma-separated whole numbers 1 to 2^24
 * ("512, 256,64"; "" gives none). Returns how many, or -EINVAL with a message naming
 * model.hidden. The one parser of the key: the load's check and the model's configuration
 * (runtime/train/models) both read the text through it. */
int dt_job_mlp_widths(const char *text, int *widths, dt_err *err);

/* The job's model as the cost model (runtime/job/cost.h) reads it: gpt's n_layer and n_embd, T =
 * data.seq_len (else model.block_size, else 64) and V as the data opens it (data.vocab_size,
 * else 50257 for tokens, 256 otherwise); mlp's widths (none when model.hidden is not valid). */
void dt_job_cost_model(const dt_job *job, dt_cost_model *m);

/* The model's blocks that parallel.pipeline splits into stages (dt_cost_blocks): gpt's n_layer
 * transformer blocks, mlp's Linear layers (model.hidden's widths + 1), resnet's residual blocks;
 * 0 for a model not configured yet. */
int dt_job_pipeline_blocks(const dt_job *job);

/* What the balanced split weighs (dt_cost_block_flops of the job's model): *block one of the
 * blocks, *first what the first stage holds besides its blocks, *last what the last one does;
 * gpt's from its shape, other models' 1, 0, 0 (mlp's widths come from the data, unknown before
 * it opens: its layers count alike). Returns 1 when the costs are the model's, 0 for the
 * uniform fallback. */
int dt_job_stage_costs(const dt_job *job, double *block, double *first, double *last);

/* The blocks of each of the job's parallel.pipeline stages into blocks[0..P)
 * (dt_cost_stage_blocks): parallel.stages as given, else the balanced split: the contiguous
 * split whose costliest stage (its blocks, plus the embedding on the first and the head on the
 * last: dt_job_stage_costs) is the cheapest, earlier stages taking the more blocks on a tie (so
 * with equal costs: blocks / P each, the first blocks % P stages one more).
 * Returns P, or -EINVAL (with a message) when the job's model cannot be split so (the load's
 * validation refuses such jobs). */
int dt_job_stage_blocks(const dt_job *job, int *blocks, dt_err *err);

/* Writes the fully resolved job as INI that dt_job_load reads back to the same job. */
void dt_job_print(const dt_job *job, FILE *out);

/* The settings every node of a job must share, agreed at the rendezvous (the first node's job
 * defines the run; a node whose job differs is refused, naming the keys): one "section.key=value"
 * line per key in the key table's order, every key but the launcher's sections ([elastic],
 * [rendezvous]: each node's own flags, of which the rendezvous agrees on what matters itself)
 * and the node-local keys of dt_job_node_local_keys. Control characters in a value are written
 * as '?'. Returns a malloc'd string (caller frees), NULL when out of memory. */
char *dt_job_shared_text(const dt_job *job);

/* The keys that may differ from node to node (paths on this node, this host's CPUs), as
 * "section.key" (NULL-terminated); docs/launcher.md lists them. */
extern const char *const dt_job_node_local_keys[];


/* Writes the key reference as a Markdown table (docs/keys.md, "Every key"). */
void dt_job_print_reference(FILE *out);

/* train.trace's steps: off (also false, no, none); on (also true, yes, all: every step, up to
 * the trace's cap on spans); N (step N alone); A-B (steps A to B, inclusive); A- (step A to the
 * end). Steps count from 1, as the logs and metrics.jsonl do. 0 and *first = *last = 0 when off;
 * else 0 and the range (*last = INT64_MAX to the end); -EINVAL when spec is none of these. */
int dt_job_trace_steps(const char *spec, int64_t *first, int64_t *last);

/* A field of the table, for tools that walk it (tests, --print-config). */
/* DT_CFG_ENUM: one of the enums above (an int), its choices in `choices`. DT_CFG_RESUME:
 * checkpoint.resume (dt_resume_kind, and the path in resume_path). DT_CFG_SHAPE: int[3]
 * (C, H, W; 0,0,0 written "vector"). DT_CFG_NPROC: a dt_nproc (elastic.nproc_per_node).
 * DT_CFG_STAGES: parallel.stages, the count in n_stage_blocks (the field's offset) and the
 * blocks in stage_blocks (written "4,4,2,2"; "" when the count is 0). DT_CFG_BYTES: an int64_t
 * of bytes, written with a suffix (dt_parse_bytes: 1GiB, 512M). */
typedef enum dt_cfg_type { DT_CFG_INT, DT_CFG_I64, DT_CFG_DOUBLE, DT_CFG_BOOL, DT_CFG_STR,
                           DT_CFG_ENUM, DT_CFG_DURATION, DT_CFG_RESUME,
                           DT_CFG_SHAPE, DT_CFG_NPROC, DT_CFG_STAGES, DT_CFG_BYTES } dt_cfg_type;

typedef struct dt_cfg_field {
    const char *section;
    const char *key;
    dt_cfg_type type;
    size_t offset;         /* into dt_job */
    size_t size;           /* of a string field */
    const char *def;       /* default, as text */
    double min, max;       /* numeric range (inclusive) */
    const char *const *choices; /* enum: the names, in the enum's order, NULL-terminated */
    bool required;
    const char *help;
} dt_cfg_field;

extern const dt_cfg_field dt_cfg_fields[];
extern const int dt_cfg_fields_count;
/* The sections, in the order dt_job_print writes them. */
extern const char *const dt_cfg_sections[];
extern const int dt_cfg_sections_count;

/* One key's value, for the reader (config_load.c) and tools. config.c holds the table and these;
 * config_load.c the reading, the checks at load and the loaders above, through these only. */

/* The field of section.key (case-insensitive), or NULL. */
const dt_cfg_field *dt_cfg_find(const char *section, const char *key);
/* Whether s names a section (case-insensitive). */
bool dt_cfg_known_section(const char *s);
/* Parses value into f's field of job (a string key's form checked by dt_cfg_check_str). 0, or
 * -EINVAL with why ("section.key: ...") filled and the field possibly changed. */
int dt_cfg_set(dt_job *job, const dt_cfg_field *f, const char *value, char *why, size_t cap);
/* f's value in job as a job file writes it (what dt_cfg_set reads back to the same value). */
void dt_cfg_format(const dt_job *job, const dt_cfg_field *f, char *buf, size_t cap);

/* Whether f is one of the keys dt_job_shared_text leaves out (the launcher's sections and
 * dt_job_node_local_keys). */
bool dt_cfg_node_local(const dt_cfg_field *f);
/* Checks a string key whose form is known (launcher settings, names) and that a job file can
 * hold v; 0, or -EINVAL with why filled. */
int dt_cfg_check_str(const dt_cfg_field *f, const char *v, char *why, size_t cap);
/* "a|b|c" of the NULL-terminated names (a field's choices), for messages and the reference. */
const char *dt_cfg_choices_text(const char *const *names, char *buf, size_t cap);
/* 0 for a valid elastic.nproc_per_node, else -EINVAL with why filled (the key and given, the
 * value as given). */
int dt_nproc_check(const dt_nproc *v, const char *given, char *why, size_t cap);

#endif
