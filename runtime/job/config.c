/* config.c - the job table and its INI parser (inih); see config.h.
 *
 * The table below is the single source of every key: type, default, range, help. The parser, the
 * validator, --print-config and the README reference all walk it. Add a key here and nowhere
 * else (plus the field in dt_job).
 */
#include "runtime/job/config.h"

#include <ctype.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/util.h"
#include "rendezvous/rdzv.h"

#define J(f) offsetof(dt_job, f), sizeof(((dt_job *)0)->f)
#define L(f) offsetof(dt_job, launch.f), sizeof(((dt_job *)0)->launch.f)
#define BIG 1e18

/* The choices of each enum key, in the order of its enum in config.h. */
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const strategy_names[] = {"ddp", "dp", NULL};
static const char *const dp_transport_names[] = {"auto", "master", "collectives", NULL};
static const char *const cpu_bind_names[] = {"auto", "none", NULL};
static const char *const model_names[] = {"mlp", "resnet", "gpt", NULL};
static const char *const preset_names[] = {"none", "gpt-tiny", "gpt-mini", "gpt2-124m", NULL};
static const char *const data_names[] = {"synthetic", "text", "tokens", "cifar10", "mnist", NULL};
static const char *const optim_names[] = {"adamw", "sgd", NULL};
static const char *const lr_names[] = {"constant", "cosine", "linear", NULL};
static const char *const precision_names[] = {"fp32", "bf16", "fp16", NULL};
static const char *const recompute_names[] = {"none", "block", "selective", NULL};
static const char *const comm_backend_names[] = {"auto", "cpu", "nccl", NULL};
static const char *const compress_names[] = {"none", "bf16", "fp16", NULL};
static const char *const resume_names[] = {"auto", "never", "path", NULL};
static const char *const rdzv_backend_names[] = {"static", "c10d", "etcd", NULL};
static const char *const pp_schedule_names[] = {"1f1b", "gpipe", NULL};

static const char *name_of(const char *const *names, int v)
{
    for (int i = 0; names[i]; i++)
        if (i == v)
            return names[i];
    return "";
}

#define NAME_FN(fn, type, names)                                                                   \
    const char *fn(type v) { return name_of(names, (int)v); }
NAME_FN(dt_device_name, dt_device_kind, device_names)
NAME_FN(dt_strategy_name, dt_strategy_kind, strategy_names)
NAME_FN(dt_dp_transport_name, dt_dp_transport_kind, dp_transport_names)
NAME_FN(dt_cpu_bind_name, dt_cpu_bind_kind, cpu_bind_names)
NAME_FN(dt_model_name, dt_model_kind, model_names)
NAME_FN(dt_preset_name, dt_preset_kind, preset_names)
NAME_FN(dt_data_name, dt_data_kind, data_names)
NAME_FN(dt_optim_name, dt_optim_kind, optim_names)
NAME_FN(dt_lr_name, dt_lr_kind, lr_names)
NAME_FN(dt_precision_name, dt_precision_kind, precision_names)
NAME_FN(dt_recompute_name, dt_recompute_kind, recompute_names)
NAME_FN(dt_comm_backend_name, dt_comm_backend_kind, comm_backend_names)
NAME_FN(dt_compress_name, dt_compress_kind, compress_names)
NAME_FN(dt_resume_name, dt_resume_kind, resume_names)
NAME_FN(dt_rdzv_backend_name, dt_rdzv_backend_kind, rdzv_backend_names)
NAME_FN(dt_pp_schedule_name, dt_pp_schedule_kind, pp_schedule_names)

/* elastic.nproc_per_node's names, at their dt_nproc_kind; a number (index 0) has none. */
static const char *const nproc_names[] = {"", "auto", "cpu", "gpu", NULL};

const char *dt_nproc_name(dt_nproc_kind v)
{
    return name_of(nproc_names, (int)v);
}

const char *dt_nproc_format(const dt_nproc *v, char *buf, size_t cap)
{
    if (v->kind == DT_NPROC_NUMBER)
        snprintf(buf, cap, "%d", v->n);
    else
        snprintf(buf, cap, "%s", dt_nproc_name(v->kind));
    return buf;
}

/* A valid elastic.nproc_per_node, else fills why (the key and the value as given). */
static int check_nproc(const dt_nproc *v, const char *given, char *why, size_t cap)
{
    bool ok = v->kind == DT_NPROC_NUMBER ? v->n >= 1 && v->n <= DT_NPROC_MAX
                                         : dt_nproc_name(v->kind)[0] != '\0';
    if (!ok)
        snprintf(why, cap,
                 "elastic.nproc_per_node: \"%s\" must be a number from 1 to %d, auto, cpu or gpu",
                 given, DT_NPROC_MAX);
    return ok ? 0 : -EINVAL;
}

/* clang-format off */
const dt_cfg_field dt_cfg_fields[] = {
    /* [job] */
    {"job", "name", DT_CFG_STR, J(name), "dtrain", 0, 0, NULL, false, "name of the job; names output_dir by default"},
    {"job", "output_dir", DT_CFG_STR, J(output_dir), "", 0, 0, NULL, false, "where metrics.jsonl, checkpoints and logs go (\"\" = runs/<name>)"},
    {"job", "device", DT_CFG_ENUM, J(device), "auto", 0, 0, device_names, false, "compute device: cuda when a GPU and libdtrain_cuda.so are usable (auto), else cpu"},
    {"job", "strategy", DT_CFG_ENUM, J(strategy), "ddp", 0, 0, strategy_names, false, "ddp: one process per device, ring all-reduce; dp: one process drives all replicas"},
    {"job", "cpu_bind", DT_CFG_ENUM, J(cpu_bind), "auto", 0, 0, cpu_bind_names, false, "auto: on cpu each of a node's workers (strategy = dp: each replica thread) gets an equal share of the CPUs the launcher may use; on cuda each worker (each replica thread) runs on its share of the CPUs near its GPU (the GPU's NUMA node, from sysfs); none leaves placement to the scheduler"},
    {"job", "dp_replicas", DT_CFG_INT, J(dp_replicas), "2", 1, 1024, NULL, false, "strategy = dp: replicas the one process drives (threads on cpu, one GPU each on cuda); batch_size is per replica"},
    {"job", "dp_transport", DT_CFG_ENUM, J(dp_transport), "auto", 0, 0, dp_transport_names, false, "strategy = dp: how parameters reach the replicas and gradients come back. master: the master copies to and sums from each replica in turn (through host memory between GPUs); collectives: broadcast and reduce over a communicator of the replicas (NCCL between GPUs, shared memory on cpu), as torch DataParallel on GPUs; auto: collectives on cuda (master if NCCL is unusable, with a warning), master on cpu"},
    {"job", "seed", DT_CFG_I64, J(seed), "1337", 0, BIG, NULL, false, "seed of initialisation, data order and synthetic data"},
    {"job", "log_every", DT_CFG_INT, J(log_every), "10", 1, 1e9, NULL, false, "steps between log lines"},
    /* [model] */
    {"model", "type", DT_CFG_ENUM, J(model_type), "", 0, 0, model_names, true, "model from the zoo"},
    {"model", "preset", DT_CFG_ENUM, J(preset), "none", 0, 0, preset_names, false, "gpt size preset; explicit n_layer/n_head/n_embd/block_size win"},
    {"model", "n_layer", DT_CFG_INT, J(n_layer), "0", 0, 1000, NULL, false, "gpt: transformer blocks (0 = from preset)"},
    {"model", "n_head", DT_CFG_INT, J(n_head), "0", 0, 1024, NULL, false, "gpt: attention heads (0 = from preset)"},
    {"model", "n_embd", DT_CFG_INT, J(n_embd), "0", 0, 65536, NULL, false, "gpt: channels (0 = from preset)"},
    {"model", "block_size", DT_CFG_INT, J(block_size), "0", 0, 1048576, NULL, false, "gpt: maximum sequence length (0 = from preset)"},
    {"model", "hidden", DT_CFG_STR, J(hidden), "256,256", 0, 0, NULL, false, "mlp: comma-separated hidden widths"},
    {"model", "depth", DT_CFG_INT, J(depth), "20", 8, 1202, NULL, false, "resnet: depth 6n+2 (20, 32, 44, 56, 110)"},
    {"model", "width", DT_CFG_INT, J(width), "16", 1, 1024, NULL, false, "resnet: channels of the first stage (doubled per stage)"},
    {"model", "sync_bn", DT_CFG_BOOL, J(sync_bn), "false", 0, 0, NULL, false, "resnet: SyncBatchNorm (statistics all-reduced across ranks)"},
    /* [data] */
    {"data", "type", DT_CFG_ENUM, J(data_type), "synthetic", 0, 0, data_names, false, "dataset format"},
    {"data", "path", DT_CFG_STR, J(data_path), "", 0, 0, NULL, false, "file, directory or glob of the training data (not for synthetic)"},
    {"data", "val_path", DT_CFG_STR, J(val_path), "", 0, 0, NULL, false, "validation data (\"\" = split val_fraction off the training data)"},
    {"data", "val_fraction", DT_CFG_DOUBLE, J(val_fraction), "0.1", 0, 0.9, NULL, false, "share of the data held out for validation when val_path is empty"},
    {"data", "seq_len", DT_CFG_INT, J(seq_len), "0", 0, 1048576, NULL, false, "language modelling: tokens per sample (0 = model block_size)"},
    {"data", "vocab_size", DT_CFG_INT, J(vocab_size), "0", 0, 16777216, NULL, false, "language modelling: vocabulary (0 = 256 for text, 50257 for tokens)"},
    {"data", "shuffle", DT_CFG_BOOL, J(shuffle), "true", 0, 0, NULL, false, "new permutation every epoch (seeded by seed and epoch)"},
    {"data", "drop_last", DT_CFG_BOOL, J(drop_last), "true", 0, 0, NULL, false, "drop the tail that does not fill every rank (else pad by repeating)"},
    {"data", "synthetic_samples", DT_CFG_I64, J(synthetic_samples), "8192", 1, 1e12, NULL, false, "synthetic: number of samples"},
    {"data", "synthetic_dim", DT_CFG_INT, J(synthetic_dim), "64", 1, 1e8, NULL, false, "synthetic vector: features per sample"},
    {"data", "synthetic_classes", DT_CFG_INT, J(synthetic_classes), "10", 2, 1e6, NULL, false, "synthetic: classes"},
    {"data", "synthetic_shape", DT_CFG_SHAPE, J(synthetic_shape), "vector", 0, 0, NULL, false, "synthetic: vector, or an image shape CxHxW such as 3x32x32"},
    /* [train] */
    {"train", "batch_size", DT_CFG_INT, J(batch_size), "8", 1, 1e7, NULL, false, "samples per rank per micro-step"},
    {"train", "grad_accum", DT_CFG_INT, J(grad_accum), "1", 1, 1e5, NULL, false, "micro-steps per optimiser step (DDP synchronises on the last only)"},
    {"train", "global_batch", DT_CFG_I64, J(global_batch), "0", 0, 1e12, NULL, false, "samples per optimiser step over all data-parallel ranks, kept when the world changes: the micro-steps are derived from it at every start (0 = off: batch_size x grad_accum x world)"},
    {"train", "steps", DT_CFG_I64, J(steps), "100", 0, 1e15, NULL, false, "optimiser steps (0 = run `epochs` epochs)"},
    {"train", "epochs", DT_CFG_INT, J(epochs), "0", 0, 1e6, NULL, false, "epochs when steps = 0"},
    {"train", "optimizer", DT_CFG_ENUM, J(optimizer), "adamw", 0, 0, optim_names, false, "optimiser"},
    {"train", "lr", DT_CFG_DOUBLE, J(lr), "3e-4", 0, 100, NULL, false, "peak learning rate"},
    {"train", "min_lr", DT_CFG_DOUBLE, J(min_lr), "0", 0, 100, NULL, false, "learning rate at the end of cosine or linear decay"},
    {"train", "weight_decay", DT_CFG_DOUBLE, J(weight_decay), "0", 0, 10, NULL, false, "weight decay (never on biases and norm parameters)"},
    {"train", "beta1", DT_CFG_DOUBLE, J(beta1), "0.9", 0, 0.999999, NULL, false, "adamw beta1"},
    {"train", "beta2", DT_CFG_DOUBLE, J(beta2), "0.999", 0, 0.999999, NULL, false, "adamw beta2"},
    {"train", "eps", DT_CFG_DOUBLE, J(eps), "1e-8", 1e-30, 1, NULL, false, "adamw epsilon"},
    {"train", "momentum", DT_CFG_DOUBLE, J(momentum), "0.9", 0, 0.999999, NULL, false, "sgd momentum"},
    {"train", "nesterov", DT_CFG_BOOL, J(nesterov), "false", 0, 0, NULL, false, "sgd: Nesterov momentum"},
    {"train", "schedule", DT_CFG_ENUM, J(schedule), "constant", 0, 0, lr_names, false, "learning-rate schedule after warmup"},
    {"train", "warmup_steps", DT_CFG_I64, J(warmup_steps), "0", 0, 1e15, NULL, false, "linear warmup steps"},
    {"train", "grad_clip", DT_CFG_DOUBLE, J(grad_clip), "1.0", 0, 1e9, NULL, false, "clip by global gradient norm (0 = off)"},
    {"train", "eval_every", DT_CFG_INT, J(eval_every), "0", 0, 1e9, NULL, false, "steps between validation passes (0 = at the end only)"},
    {"train", "eval_batches", DT_CFG_INT, J(eval_batches), "8", 1, 1e9, NULL, false, "batches per validation pass"},
    {"train", "precision", DT_CFG_ENUM, J(precision), "fp32", 0, 0, precision_names, false, "GEMM precision on cuda (cpu is always fp32)"},
    {"train", "loss_scale", DT_CFG_DOUBLE, J(loss_scale), "65536", 1e-30, 1e38, NULL, false, "precision = fp16: the initial dynamic loss scale; a step with inf/NaN gradients is skipped and halves it"},
    {"train", "loss_scale_window", DT_CFG_INT, J(loss_scale_window), "2000", 1, 1e9, NULL, false, "precision = fp16: clean steps in a row before the loss scale doubles"},
    {"train", "threads", DT_CFG_INT, J(threads), "1", 1, 1024, NULL, false, "BLAS threads per worker (cpu)"},
    {"train", "recompute", DT_CFG_ENUM, J(recompute), "none", 0, 0, recompute_names, false, "activation recomputation in backward (same gradients): none; block (gpt, resnet: keep only each block's input, recompute the block's forward in its backward: far less activation memory for about one more forward); selective (gpt only: recompute only what attention saves for backward: cuda's probabilities; on the cpu, which keeps only a log-sum-exp per row, it saves little)"},
    {"train", "trace", DT_CFG_STR, J(trace), "off", 0, 0, NULL, false, "write a timeline of these steps (forward, backward, data, each DDP bucket's all-reduce, optimiser step, checkpoint, eval) per rank to <output_dir>/trace/rank<N>.json and all ranks to trace.json (Chrome trace: open in ui.perfetto.dev; scripts/trace-png.py draws it): off, on (every step, up to 100000 spans per rank), N, A-B (e.g. 10-12) or A- (from A on)"},
    /* [ddp] */
    {"ddp", "backend", DT_CFG_ENUM, J(comm_backend), "auto", 0, 0, comm_backend_names, false, "collectives: nccl on cuda, cpu otherwise (auto)"},
    {"ddp", "bucket_cap_mb", DT_CFG_DOUBLE, J(bucket_cap_mb), "25", 0.001, 1e6, NULL, false, "gradient bucket size (MiB)"},
    {"ddp", "first_bucket_mb", DT_CFG_DOUBLE, J(first_bucket_mb), "1", 0.001, 1e6, NULL, false, "size of the first bucket (MiB), launched earliest"},
    {"ddp", "compress", DT_CFG_ENUM, J(compress), "none", 0, 0, compress_names, false, "gradient payload compression for all-reduce"},
    {"ddp", "timeout", DT_CFG_DURATION, J(comm_timeout), "300", 0.001, 1e7, NULL, false, "seconds a collective may wait for a peer before it fails"},
    {"ddp", "broadcast_buffers", DT_CFG_BOOL, J(broadcast_buffers), "true", 0, 0, NULL, false, "broadcast buffers (BatchNorm statistics) from rank 0 every step"},
    {"ddp", "check_consistency", DT_CFG_BOOL, J(check_consistency), "true", 0, 0, NULL, false, "verify that every rank built the same model at start"},
    /* [parallel] */
    {"parallel", "zero", DT_CFG_INT, J(zero), "0", 0, 3, NULL, false, "ZeRO stage over the data-parallel ranks: 0 = DDP (every rank holds everything); 1 = optimiser state sharded (gradients reduce-scattered, each rank updates its shard, parameters all-gathered); 2 = gradients sharded as well (a bucket's gradient memory is given back once it is reduce-scattered); 3 = parameters sharded as well (FSDP full-shard: each block's parameters all-gathered before its forward and its backward, given back after; not with train.global_batch). One rank: stages 1 and 2 train as one process, stage 3 still gathers and gives back every block"},
    {"parallel", "tensor", DT_CFG_INT, J(tensor), "1", 1, 1024, NULL, false, "tensor-parallel degree T (Megatron-LM: attention heads and the MLP split over T ranks, vocab-parallel embedding and loss; model gpt only, with model.n_head divisible by T). The world is a grid data x tensor x pipeline: D = world / (T x P) data-parallel replicas, rank = (pp x D + dp) x T + tp, so a tensor group is T consecutive ranks (keep T <= nproc_per_node to stay inside a node); the world size must be a multiple of T x P. Needs job.strategy = ddp; parallel.zero 0-3 (DDP or ZeRO over each shard's data-parallel group; 3 on device = cpu)"},
    {"parallel", "pipeline", DT_CFG_INT, J(pipeline), "1", 1, DT_MAX_STAGES, NULL, false, "pipeline stages P: the model's blocks (gpt: transformer blocks; mlp: its Linear layers; not resnet) split over P ranks in order, activations passed between them; at most one stage per block. The data is sharded over the D = world / (T x P) data-parallel ranks only: every stage of a pipeline sees the same samples. Needs job.strategy = ddp; parallel.zero 0-3 (DDP or ZeRO over each stage's data-parallel group; 3 on device = cpu)"},
    {"parallel", "micro_batches", DT_CFG_INT, J(micro_batches), "1", 1, 1e6, NULL, false, "pipeline micro-batches M: each micro-step's batch (train.batch_size, which M must divide) is cut into M micro-batches that flow through the stages; the idle share of the pipeline (the bubble) is (P-1)/(M+P-1). When not given: 1 without a pipeline, else parallel.pipeline (resolved at load: --print-config shows the number)"},
    {"parallel", "schedule", DT_CFG_ENUM, J(pp_schedule), "1f1b", 0, 0, pp_schedule_names, false, "pipeline schedule: 1f1b (PipeDream-Flush: after a warm-up each stage alternates one forward and one backward, so at most P micro-batches' activations are kept) or gpipe (all forwards, then all backwards: M micro-batches' activations); the same gradients either way"},
    {"parallel", "stages", DT_CFG_STAGES, J(n_stage_blocks), "", 0, 0, NULL, false, "blocks per pipeline stage, comma-separated such as 4,4,2,2: exactly parallel.pipeline entries, each >= 1, summing to the model's blocks (gpt: model.n_layer; mlp: the model.hidden layers + 1). \"\" = balanced by cost: the split whose costliest stage is cheapest, gpt's embedding counted on the first stage and ln_f + the head (2*C*V FLOPs a token, a block 24*C^2 + 4*T*C) on the last; earlier stages take one more block on a tie (mlp: layers count alike)"},
    {"parallel", "sequence_parallel", DT_CFG_BOOL, J(sequence_parallel), "false", 0, 0, NULL, false, "Megatron-LM sequence parallelism on top of parallel.tensor = T > 1 (gpt): the residual stream, LayerNorms and residual adds hold 1/T of the tokens on each tensor rank instead of all of them, the all-reduces become reduce-scatters and all-gathers, so those activations take 1/T of the memory (same gradients, to rounding; about 1.25x the tensor group's traffic). Needs data.seq_len (or model.block_size) divisible by T; with parallel.pipeline > 1 the stages pass the 1/T shards"},
    /* [checkpoint] */
    {"checkpoint", "dir", DT_CFG_STR, J(ckpt_dir), "", 0, 0, NULL, false, "checkpoint directory (\"\" = <output_dir>/checkpoints)"},
    {"checkpoint", "every", DT_CFG_INT, J(ckpt_every), "0", 0, 1e9, NULL, false, "steps between checkpoints (0 = only at the end and on preemption)"},
    {"checkpoint", "keep", DT_CFG_INT, J(ckpt_keep), "3", 1, 1e6, NULL, false, "newest checkpoints kept"},
    {"checkpoint", "resume", DT_CFG_RESUME, J(resume), "auto", 0, 0, NULL, false, "auto (newest valid), never, or a checkpoint path"},
    {"checkpoint", "async", DT_CFG_BOOL, J(ckpt_async), "true", 0, 0, NULL, false, "write in the background after copying the buffers"},
    /* [elastic] */
    {"elastic", "nnodes", DT_CFG_STR, L(nnodes), "1", 0, 0, NULL, false, "nodes: N, or MIN:MAX for an elastic job"},
    {"elastic", "nproc_per_node", DT_CFG_NPROC, L(nproc_per_node), "1", 0, 0, NULL, false, "workers per node: N, auto, cpu or gpu"},
    {"elastic", "max_restarts", DT_CFG_INT, L(max_restarts), "0", 0, 1e6, NULL, false, "restarts of the whole job after a failure"},
    {"elastic", "monitor_interval", DT_CFG_DURATION, L(monitor_interval), "0.1", 0.001, 3600, NULL, false, "seconds between checks of remote state"},
    {"elastic", "stop_grace", DT_CFG_DURATION, L(stop_grace), "30", 0, 3600, NULL, false, "seconds between SIGTERM and SIGKILL when workers are stopped"},
    {"elastic", "role", DT_CFG_STR, L(role), "default", 0, 0, NULL, false, "the workers' ROLE_NAME (torchrun's --role)"},
    {"elastic", "log_dir", DT_CFG_STR, L(log_dir), "", 0, 0, NULL, false, "worker logs and events.jsonl (\"\" = <output_dir>/logs)"},
    {"elastic", "redirects", DT_CFG_STR, L(redirects), "0", 0, 0, NULL, false, "0 none, 1 stdout, 2 stderr, 3 both to files; or per local rank 0:3,1:1"},
    {"elastic", "tee", DT_CFG_STR, L(tee), "0", 0, 0, NULL, false, "like redirects, but also to the console"},
    {"elastic", "local_ranks_filter", DT_CFG_STR, L(local_ranks_filter), "", 0, 0, NULL, false, "local ranks whose output reaches the console, e.g. 0,2"},
    /* [rendezvous] */
    {"rendezvous", "backend", DT_CFG_ENUM, L(rdzv_backend), "static", 0, 0, rdzv_backend_names, false, "static: fixed nodes and node ranks; c10d: elastic; etcd: elastic on an etcd cluster"},
    {"rendezvous", "endpoint", DT_CFG_STR, L(rdzv_endpoint), "", 0, 0, NULL, false, "HOST[:PORT] of the store (etcd: HOST:PORT,HOST:PORT,... of the etcd members)"},
    {"rendezvous", "id", DT_CFG_STR, L(rdzv_id), "none", 0, 0, NULL, false, "run id shared by every node of a job"},
    {"rendezvous", "conf", DT_CFG_STR, L(rdzv_conf), "", 0, 0, NULL, false, "extra k=v,... (join_timeout or timeout, last_call_timeout, close_timeout, heartbeat_interval or keep_alive_interval, heartbeat_timeout, keep_alive_max_attempt, read_timeout, is_host; etcd: cacert, cert, key, user, password_file); folded into these keys where it is set"},
    {"rendezvous", "join_timeout", DT_CFG_DURATION, L(join_timeout), "600", 0.001, 1e7, NULL, false, "seconds to wait for enough nodes to join"},
    {"rendezvous", "last_call_timeout", DT_CFG_DURATION, L(last_call_timeout), "30", 0, 1e7, NULL, false, "seconds a round stays open after MIN nodes joined"},
    {"rendezvous", "close_timeout", DT_CFG_DURATION, L(close_timeout), "60", 0.001, 1e7, NULL, false, "seconds the store host waits for others to see the end of a job"},
    {"rendezvous", "read_timeout", DT_CFG_DURATION, L(read_timeout), "60", 0.001, 1e7, NULL, false, "the most seconds a rendezvous store call waits for its answer (capped by heartbeat_timeout)"},
    {"rendezvous", "heartbeat_interval", DT_CFG_DURATION, L(heartbeat_interval), "5", 0.001, 1e6, NULL, false, "seconds between agent heartbeats"},
    {"rendezvous", "heartbeat_timeout", DT_CFG_DURATION, L(heartbeat_timeout), "30", 0.001, 1e7, NULL, false, "seconds without a heartbeat before a node is declared dead"},
    {"rendezvous", "is_host", DT_CFG_BOOL, L(is_host), "false", 0, 0, NULL, false, "this node hosts the store (c10d; default: the node whose address is the endpoint)"},
    {"rendezvous", "cacert", DT_CFG_STR, L(rdzv_cacert), "", 0, 0, NULL, false, "etcd: CA certificate file for https:// members (TLS)"},
    {"rendezvous", "cert", DT_CFG_STR, L(rdzv_cert), "", 0, 0, NULL, false, "etcd: client certificate file (TLS client authentication)"},
    {"rendezvous", "key", DT_CFG_STR, L(rdzv_key), "", 0, 0, NULL, false, "etcd: the client certificate's private key file"},
    {"rendezvous", "user", DT_CFG_STR, L(rdzv_user), "", 0, 0, NULL, false, "etcd: user name (etcd authentication; needs password_file)"},
    {"rendezvous", "password_file", DT_CFG_STR, L(rdzv_password_file), "", 0, 0, NULL, false, "etcd: file whose first line is the user's password (not on the command line, where ps shows it)"},
    {"rendezvous", "node_rank", DT_CFG_INT, L(node_rank), "0", 0, 1e6, NULL, false, "static: rank of this node"},
    {"rendezvous", "standalone", DT_CFG_BOOL, L(standalone), "false", 0, 0, NULL, false, "one node, store on a free local port"},
    {"rendezvous", "master_addr", DT_CFG_STR, L(master_addr), "127.0.0.1", 0, 0, NULL, false, "static: address of node 0, which hosts the store"},
    {"rendezvous", "master_port", DT_CFG_INT, L(master_port), "29500", 0, 65535, NULL, false, "static: port of the store on node 0"},
    {"rendezvous", "local_addr", DT_CFG_STR, L(local_addr), "", 0, 0, NULL, false, "address of this node as others reach it (\"\" = host name)"},
};
/* clang-format on */
const int dt_cfg_fields_count = (int)(sizeof dt_cfg_fields / sizeof dt_cfg_fields[0]);

static const char *const sections[] = {"job",        "model",   "data",    "train",
                                       "ddp",        "parallel", "checkpoint", "elastic", "rendezvous"};

/* ---- errors ------------------------------------------------------------------------------ */

static void add_error(dt_config_errors *errs, const char *where, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add_error(dt_config_errors *errs, const char *where, int line, const char *fmt, ...)
{
    if (!errs)
        return;
    if (errs->count >= (int)DT_ARRAY_LEN(errs->lines)) {
        errs->count++;
        return;
    }
    char *dst = errs->lines[errs->count++];
    size_t cap = sizeof errs->lines[0];
    int n = line > 0 ? snprintf(dst, cap, "%s:%d: ", where, line) : snprintf(dst, cap, "%s: ", where);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < cap)
        vsnprintf(dst + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* ---- field access ------------------------------------------------------------------------ */

static const dt_cfg_field *find_field(const char *section, const char *key)
{
    for (int i = 0; i < dt_cfg_fields_count; i++)
        if (!strcasecmp(dt_cfg_fields[i].section, section) && !strcasecmp(dt_cfg_fields[i].key, key))
            return &dt_cfg_fields[i];
    return NULL;
}

static bool known_section(const char *s)
{
    for (size_t i = 0; i < DT_ARRAY_LEN(sections); i++)
        if (!strcasecmp(sections[i], s))
            return true;
    return false;
}

/* The position of v (case-insensitive) among the NULL-terminated names, else -1. */
static int enum_index(const char *const *names, const char *v)
{
    for (int i = 0; names[i]; i++)
        if (!strcasecmp(names[i], v))
            return i;
    return -1;
}

/* "a|b|c" of the names, for messages and the reference. */
static const char *choices_text(const char *const *names, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; names && names[i] && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "|" : "", names[i]);
    return buf;
}

/* A string a job file cannot hold: --print-config must read back to the same job. */
static int check_writable(const dt_cfg_field *f, const char *v, char *why, size_t cap)
{
    for (const char *p = v; *p; p++) {
        if (*p == '\n' || *p == '\r') {
            snprintf(why, cap, "%s.%s: the value contains a line break, which a job file cannot hold",
                     f->section, f->key);
            return -EINVAL;
        }
        if ((*p > 0 && *p < 0x20 && *p != '\t') || *p == 0x7f) {
            snprintf(why, cap,
                     "%s.%s: the value contains control character 0x%02x, which a job file "
                     "cannot hold",
                     f->section, f->key, (unsigned)*p);
            return -EINVAL;
        }
        if (*p == ';' && p > v && (p[-1] == ' ' || p[-1] == '\t')) {
            snprintf(why, cap,
                     "%s.%s: \"%s\" contains \" ;\", which starts a comment in a job file",
                     f->section, f->key, v);
            return -EINVAL;
        }
    }
    return 0;
}

static int check_std_spec(const char *s)
{
    int a, b;
    char tail;
    if (sscanf(s, "%d%c", &a, &tail) == 1)
        return a >= 0 && a <= 3 ? 0 : -EINVAL;
    char buf[DT_STR_MID], *save = NULL;
    int n = 0;
    dt_strlcpy(buf, s, sizeof buf);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), n++)
        if (sscanf(tok, "%d:%d%c", &a, &b, &tail) != 2 || a < 0 || b < 0 || b > 3)
            return -EINVAL;
    return n ? 0 : -EINVAL;
}

/* Checks a string key whose form is known (launcher settings, names); fills why. */
int dt_job_trace_steps(const char *spec, int64_t *first, int64_t *last)
{
    static const char *const off[] = {"off", "false", "no", "none", NULL};
    static const char *const all[] = {"on", "true", "yes", "all", NULL};
    *first = *last = 0;
    if (enum_index(off, spec) >= 0)
        return 0;
    if (enum_index(all, spec) >= 0) {
        *first = 1;
        *last = INT64_MAX;
        return 0;
    }
    char buf[DT_STR_SMALL], *dash;
    if (!dt_strlcpy(buf, spec, sizeof buf))
        return -EINVAL;
    int64_t a, b = 0;
    if ((dash = strchr(buf, '-')) && dash != buf) {
        *dash = '\0';
        if (dt_parse_i64(dt_trim(buf), &a))
            return -EINVAL;
        if (!*dt_trim(dash + 1))
            b = INT64_MAX;
        else if (dt_parse_i64(dt_trim(dash + 1), &b))
            return -EINVAL;
    } else if (dt_parse_i64(dt_trim(buf), &a)) {
        return -EINVAL;
    } else {
        b = a;
    }
    if (a < 1 || b < a)
        return -EINVAL;
    *first = a;
    *last = b;
    return 0;
}

static int check_str(const dt_cfg_field *f, const char *v, char *why, size_t cap)
{
    char k[64];
    int a, b;
    char tail;
    if (check_writable(f, v, why, cap))
        return -EINVAL;
    snprintf(k, sizeof k, "%s.%s", f->section, f->key);
    if (!strcmp(k, "elastic.nnodes")) {
        if (sscanf(v, "%d:%d%c", &a, &b, &tail) == 2) {
            if (a < 1 || b < a) {
                snprintf(why, cap, "%s: \"%s\" must be MIN:MAX with 1 <= MIN <= MAX", k, v);
                return -EINVAL;
            }
        } else if (sscanf(v, "%d%c", &a, &tail) != 1 || a < 1) {
            snprintf(why, cap, "%s: \"%s\" must be a number >= 1 or MIN:MAX", k, v);
            return -EINVAL;
        }
    } else if (!strcmp(k, "train.trace")) {
        int64_t first, last;
        if (dt_job_trace_steps(v, &first, &last)) {
            snprintf(why, cap, "%s: \"%s\" must be off, on, a step N, or steps A-B or A- "
                     "(steps count from 1), e.g. 10-12", k, v);
            return -EINVAL;
        }
    } else if (!strcmp(k, "elastic.redirects") || !strcmp(k, "elastic.tee")) {
        if (check_std_spec(v)) {
            snprintf(why, cap,
                     "%s: \"%s\" must be 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or "
                     "LOCAL_RANK:MODE,... such as 0:3,1:1",
                     k, v);
            return -EINVAL;
        }
    } else if (!strcmp(k, "elastic.local_ranks_filter") && v[0]) {
        char buf[DT_STR_MID], *save = NULL;
        dt_strlcpy(buf, v, sizeof buf);
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (sscanf(tok, "%d%c", &a, &tail) != 1 || a < 0) {
                snprintf(why, cap, "%s: \"%s\" must be local ranks such as 0,2", k, v);
                return -EINVAL;
            }
    } else if (!strcmp(k, "rendezvous.endpoint") && v[0]) {
        char host[DT_STR_MID];
        int port = 0;
        dt_err e = {0};
        /* A comma-separated list names the members of an etcd cluster: each one is checked. */
        char list[DT_STR_MID], *save = NULL;
        dt_strlcpy(list, v, sizeof list);
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (dt_rdzv_parse_endpoint(dt_trim(tok), host, sizeof host, &port, &e)) {
                snprintf(why, cap, "%s: %.300s (expected HOST[:PORT], e.g. node0:29400, or for "
                         "etcd HOST:PORT,HOST:PORT,...)", k, e.msg);
                return -EINVAL;
            }
    } else if (!strcmp(k, "job.name") || !strcmp(k, "rendezvous.id")) {
        if (!v[0] || strchr(v, '/')) {
            snprintf(why, cap, "%s: \"%s\" must be a non-empty name without '/'", k, v);
            return -EINVAL;
        }
    }
    return 0;
}

/* Parses value into the field of job; on failure fills why and returns -EINVAL. */
static int set_field(dt_job *job, const dt_cfg_field *f, const char *value, char *why, size_t cap)
{
    char *base = (char *)job + f->offset;
    double d = 0;
    int rc = 0;
    switch (f->type) {
    case DT_CFG_INT: {
        int v;
        rc = dt_parse_int(value, &v);
        if (rc == -ERANGE)
            goto range;
        if (rc) {
            snprintf(why, cap, "%s.%s: \"%s\" is not an integer", f->section, f->key, value);
            return -EINVAL;
        }
        d = v;
        if (d < f->min || d > f->max)
            goto range;
        *(int *)base = v;
        return 0;
    }
    case DT_CFG_I64: {
        int64_t v;
        rc = dt_parse_i64(value, &v);
        if (rc == -ERANGE)
            goto range;
        if (rc) {
            snprintf(why, cap, "%s.%s: \"%s\" is not an integer", f->section, f->key, value);
            return -EINVAL;
        }
        d = (double)v;
        if (d < f->min || d > f->max)
            goto range;
        *(int64_t *)base = v;
        return 0;
    }
    case DT_CFG_DOUBLE:
        if (dt_parse_double(value, &d)) {
            snprintf(why, cap, "%s.%s: \"%s\" is not a number", f->section, f->key, value);
            return -EINVAL;
        }
        if (d < f->min || d > f->max)
            goto range;
        *(double *)base = d;
        return 0;
    case DT_CFG_DURATION:
        if (dt_parse_duration(value, &d)) {
            snprintf(why, cap, "%s.%s: \"%s\" is not a duration (examples: 30, 30s, 500ms, 2m)",
                     f->section, f->key, value);
            return -EINVAL;
        }
        if (d < f->min || d > f->max)
            goto range;
        *(double *)base = d;
        return 0;
    case DT_CFG_BOOL: {
        bool b;
        if (dt_parse_bool(value, &b)) {
            snprintf(why, cap, "%s.%s: \"%s\" is not a boolean (use true or false)", f->section,
                     f->key, value);
            return -EINVAL;
        }
        *(bool *)base = b;
        return 0;
    }
    case DT_CFG_ENUM: {
        int v = enum_index(f->choices, value);
        if (v < 0) {
            char buf[256];
            size_t n = 0;
            while (f->choices[n])
                n++;
            const char *near = dt_nearest(value, f->choices, n);
            choices_text(f->choices, buf, sizeof buf);
            if (near)
                snprintf(why, cap, "%s.%s: \"%s\" is not one of %s; did you mean \"%s\"?",
                         f->section, f->key, value, buf, near);
            else
                snprintf(why, cap, "%s.%s: \"%s\" is not one of %s", f->section, f->key, value,
                         buf);
            return -EINVAL;
        }
        *(int *)base = v;
        return 0;
    }
    case DT_CFG_RESUME: {
        /* auto, never, or a path (which then goes to resume_path). */
        char *path = (char *)job + offsetof(dt_job, resume_path);
        int v = enum_index(resume_names, value);
        if (v == DT_RESUME_AUTO || v == DT_RESUME_NEVER) {
            *(int *)base = v;
            path[0] = '\0';
            return 0;
        }
        if (!value[0]) {
            snprintf(why, cap, "%s.%s: use auto, never or a checkpoint path", f->section, f->key);
            return -EINVAL;
        }
        if (strlen(value) >= sizeof job->resume_path) {
            snprintf(why, cap, "%s.%s: value is longer than %zu characters", f->section, f->key,
                     sizeof job->resume_path - 1);
            return -EINVAL;
        }
        if (check_writable(f, value, why, cap))
            return -EINVAL;
        *(int *)base = DT_RESUME_PATH;
        dt_strlcpy(path, value, sizeof job->resume_path);
        return 0;
    }
    case DT_CFG_SHAPE: {
        int *chw = (int *)base, c3, h, w;
        char tail;
        if (!strcasecmp(value, "vector")) {
            chw[0] = chw[1] = chw[2] = 0;
            return 0;
        }
        if (sscanf(value, "%dx%dx%d%c", &c3, &h, &w, &tail) != 3 || c3 < 1 || h < 1 || w < 1 ||
            c3 > 4096 || h > 65536 || w > 65536) {
            snprintf(why, cap, "%s.%s: \"%s\" must be vector or CxHxW such as 3x32x32",
                     f->section, f->key, value);
            return -EINVAL;
        }
        chw[0] = c3;
        chw[1] = h;
        chw[2] = w;
        return 0;
    }
    case DT_CFG_NPROC: {
        /* auto, cpu, gpu (as written: no other case), or a number (as the int keys read) */
        dt_nproc v = {DT_NPROC_NUMBER, 0};
        int k = 1;
        while (nproc_names[k] && strcmp(nproc_names[k], value))
            k++;
        if (nproc_names[k])
            v.kind = (dt_nproc_kind)k;
        else if (dt_parse_int(value, &v.n))
            v.n = 0; /* not a number: rejected below */
        if (check_nproc(&v, value, why, cap))
            return -EINVAL;
        *(dt_nproc *)base = v;
        return 0;
    }
    case DT_CFG_STAGES: {
        /* "" (balanced), or blocks per stage "4,4,2,2"; the count goes to n_stage_blocks (this
         * field), the numbers to stage_blocks. Their sum is checked against the model at load. */
        int *count = (int *)base, *blocks = (int *)((char *)job + offsetof(dt_job, stage_blocks));
        int v[DT_MAX_STAGES], n = 0;
        const char *p = value;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p) {
            char buf[DT_STR_MID], *save = NULL;
            bool ok = dt_strlcpy(buf, value, sizeof buf) != 0;
            for (char *tok = ok ? strtok_r(buf, ",", &save) : NULL; ok && tok;
                 tok = strtok_r(NULL, ",", &save)) {
                int b;
                if (n == DT_MAX_STAGES || dt_parse_int(dt_trim(tok), &b) || b < 1)
                    ok = false;
                else
                    v[n++] = b;
            }
            size_t len = strlen(value);
            while (len > 0 && (value[len - 1] == ' ' || value[len - 1] == '\t'))
                len--;
            /* strtok_r skips empty entries: ",4", "4," and "2,,2" are refused here */
            if (!ok || n == 0 || *p == ',' || value[len - 1] == ',' || strstr(value, ",,")) {
                snprintf(why, cap,
                         "%s.%s: \"%s\" must be blocks per stage such as 4,4,2,2 (whole numbers "
                         ">= 1, one per stage, at most %d stages), or \"\" for a balanced split",
                         f->section, f->key, value, DT_MAX_STAGES);
                return -EINVAL;
            }
        }
        *count = n;
        memset(blocks, 0, sizeof job->stage_blocks);
        memcpy(blocks, v, sizeof v[0] * (size_t)n);
        return 0;
    }
    case DT_CFG_STR:
        if (strlen(value) >= f->size) {
            snprintf(why, cap, "%s.%s: value is longer than %zu characters", f->section, f->key,
                     f->size - 1);
            return -EINVAL;
        }
        if (check_str(f, value, why, cap))
            return -EINVAL;
        dt_strlcpy(base, value, f->size);
        return 0;
    }
    return -EINVAL;
range:
    if (f->max >= BIG)
        snprintf(why, cap, "%s.%s: %s is out of range (min %.15g)", f->section, f->key, value,
                 f->min);
    else
        snprintf(why, cap, "%s.%s: %s is out of range (min %.15g, max %.15g)", f->section,
                 f->key, value, f->min, f->max);
    return -EINVAL;
}

void dt_launch_defaults(dt_launch *l)
{
    dt_job job;
    dt_job_defaults(&job);
    *l = job.launch;
}

void dt_job_defaults(dt_job *job)
{
    char why[256];
    memset(job, 0, sizeof *job);
    for (int i = 0; i < dt_cfg_fields_count; i++) {
        const dt_cfg_field *f = &dt_cfg_fields[i];
        if (f->def[0] || f->type == DT_CFG_STR)
            set_field(job, f, f->def, why, sizeof why);
        else if (f->type == DT_CFG_ENUM) /* a required choice: unset until given */
            *(int *)((char *)job + f->offset) = -1;
    }
}

/* ---- parsing ----------------------------------------------------------------------------- */

typedef struct parse_ctx {
    dt_job *job;
    dt_config_errors *errs;
    const char *where;    /* file name (or the source of a setting) for messages */
    int line;             /* current line (counted by the reader); 0 outside the file */
    FILE *fp;
    int seen_line[256];   /* line each field was set on (duplicate detection) */
    bool seen_required[256];
    char src[256][96];    /* where each field last got its value ("job.ini:12", "--nnodes") */
    int seq[256];         /* order of that assignment (0 = still the default) */
    bool bad[256];        /* the last value given for the field was rejected */
    bool derived_micro_batches; /* parallel.micro_batches not given: = parallel.pipeline */
    int nseq;
    char long_value[4096]; /* the value of a line too long for inih (see long_line) */
    char full[4096 + 256]; /* the line being read (line_reader) */
} parse_ctx;

/* What inih gets in place of a value too long for it; on_ini_entry swaps the value back. */
#define LONG_MARK "\x1f"

static void note_source(parse_ctx *c, int idx, bool ok)
{
    if (c->line > 0)
        snprintf(c->src[idx], sizeof c->src[idx], "%s:%d", c->where, c->line);
    else
        snprintf(c->src[idx], sizeof c->src[idx], "%s", c->where);
    c->seq[idx] = ++c->nseq;
    c->bad[idx] = !ok;
}

static void fold_rdzv_conf(parse_ctx *c, const char *value);

static void report_unknown_key(parse_ctx *c, const char *section, const char *key)
{
    const char *cands[256];
    int n = 0;
    for (int i = 0; i < dt_cfg_fields_count; i++)
        if (!strcasecmp(dt_cfg_fields[i].section, section))
            cands[n++] = dt_cfg_fields[i].key;
    const char *near = dt_nearest(key, cands, (size_t)n);
    if (near) {
        add_error(c->errs, c->where, c->line, "unknown key \"%s\" in [%s]; did you mean \"%s\"?",
                  key, section, near);
        return;
    }
    for (int i = 0; i < dt_cfg_fields_count; i++)
        if (!strcasecmp(dt_cfg_fields[i].key, key)) {
            add_error(c->errs, c->where, c->line,
                      "unknown key \"%s\" in [%s]; it belongs in [%s]", key, section,
                      dt_cfg_fields[i].section);
            return;
        }
    add_error(c->errs, c->where, c->line,
              "unknown key \"%s\" in [%s] (see the job file reference in README.md)", key,
              section);
}

static int assign(parse_ctx *c, const char *section, const char *key, const char *value)
{
    const dt_cfg_field *f = find_field(section, key);
    if (!f) {
        report_unknown_key(c, section, key);
        return 0;
    }
    int idx = (int)(f - dt_cfg_fields);
    c->seen_required[idx] = true; /* present, even if its value is wrong */
    if (c->seen_line[idx] > 0 && c->line) {
        add_error(c->errs, c->where, c->line, "%s.%s is set twice (also on line %d)", f->section,
                  f->key, c->seen_line[idx]);
        return 0;
    }
    /* "x y" stands for x y: quotes keep spaces at either end (--print-config writes them). */
    char unq[DT_PATH_MAX + 8];
    size_t len = strlen(value);
    if (len >= 1 && value[0] == '"' && (len == 1 || value[len - 1] != '"')) {
        add_error(c->errs, c->where, c->line,
                  "%s.%s: unterminated double quote in %.200s (end the value with \", or remove "
                  "the quote)",
                  f->section, f->key, value);
        c->seen_line[idx] = c->line > 0 ? c->line : -1;
        note_source(c, idx, false);
        return 0;
    }
    if (len >= 2 && value[0] == '"' && value[len - 1] == '"' && len - 2 < sizeof unq) {
        memcpy(unq, value + 1, len - 2);
        unq[len - 2] = '\0';
        value = unq;
    }
    c->seen_line[idx] = c->line > 0 ? c->line : -1;
    if (!strcmp(f->section, "rendezvous") && !strcmp(f->key, "conf")) {
        fold_rdzv_conf(c, value);
        return 0;
    }
    char why[512];
    if (set_field(c->job, f, value, why, sizeof why) != 0) {
        add_error(c->errs, c->where, c->line, "%s", why);
        note_source(c, idx, false);
        return 0;
    }
    note_source(c, idx, true);
    return 0;
}

static void report_unknown_section(parse_ctx *c, const char *section)
{
    const char *near = dt_nearest(section, sections, DT_ARRAY_LEN(sections));
    if (near)
        add_error(c->errs, c->where, c->line, "unknown section [%s]; did you mean [%s]?", section,
                  near);
    else
        add_error(c->errs, c->where, c->line,
                  "unknown section [%s] (sections: job, model, data, train, ddp, parallel, "
                  "checkpoint, elastic, rendezvous)",
                  section);
}

static int on_ini_entry(void *user, const char *section, const char *name, const char *value)
{
    parse_ctx *c = user;
    if (!name)
        return 1;
    if (!section[0]) {
        add_error(c->errs, c->where, c->line, "key \"%s\" is outside any [section]", name);
        return 1;
    }
    if (!known_section(section))
        return 1; /* reported at its header by line_reader */
    if (c->long_value[0] && !strcmp(value, LONG_MARK))
        value = c->long_value;
    assign(c, section, name, value);
    c->long_value[0] = '\0';
    return 1;
}

/* inih reads at most INI_MAX_LINE (200 on Debian) bytes per line, far less than a path may
 * take. A longer "key = value" line (full, len bytes) gets its value, trimmed as inih trims values
 * (leading and trailing blanks, an inline "; comment"), into c->long_value, and inih gets
 * "key=" LONG_MARK instead (in str, num bytes). Lines that are not a key at the start of the
 * line, or longer than long_value, are reported and reach inih blank. */
static void long_line(parse_ctx *c, char *full, bool over, char *str, int num)
{
    char *eq = strpbrk(full, "=:");
    bool key = !strchr(" \t;#[", full[0]) && eq && eq - full + 2 < num - 2;
    char *v = eq ? eq + 1 : full;
    while (*v == ' ' || *v == '\t')
        v++;
    for (char *p = v; *p; p++)
        if (*p == ';' && p > v && isspace((unsigned char)p[-1])) {
            *p = '\0';
            break;
        }
    size_t n = strlen(v);
    while (n && isspace((unsigned char)v[n - 1]))
        v[--n] = '\0';
    if (over || !key || n >= sizeof c->long_value) {
        add_error(c->errs, c->where, c->line, "line longer than %zu characters",
                  key ? sizeof c->long_value - 1 : (size_t)num - 2);
        snprintf(str, (size_t)num, "\n");
        return;
    }
    memcpy(c->long_value, v, n + 1);
    snprintf(str, (size_t)num, "%.*s=%s\n", (int)(eq - full), full, LONG_MARK);
}

/* inih's reader. Reads one whole line byte by byte (a NUL is a byte like any other, so it can
 * neither hide the rest of a line nor shift the numbers of the lines after it), counts it, and
 * hands inih (str, num bytes) what it can parse: the line itself; a blank line for a comment of
 * any length and for a line it reports (a control character, which no job file holds: NUL, ESC,
 * BEL, a CR that does not end the line, ...); "key=" LONG_MARK for a key line longer than num
 * (long_line). Reports too the lines inih would silently treat as errors. */
static char *line_reader(char *str, int num, void *stream)
{
    parse_ctx *c = stream;
    char *full = c->full;
    size_t len = 0, cols = 0, bad_col = 0;
    bool over = false;
    int ch, bad = -1;
    while ((ch = getc(c->fp)) != EOF && ch != '\n') {
        cols++;
        if (len + 1 < sizeof c->full)
            full[len++] = (char)ch;
        else
            over = true;
        if (bad < 0 && ((ch < 0x20 && ch != '\t' && ch != '\r') || ch == 0x7f)) {
            bad = ch;
            bad_col = cols;
        }
        if (bad < 0 && ch == '\r') { /* only as the end of a CRLF line */
            int next = getc(c->fp);
            if (next != '\n' && next != EOF) {
                bad = ch;
                bad_col = cols;
            }
            if (next != EOF)
                ungetc(next, c->fp);
        }
    }
    if (ch == EOF && cols == 0)
        return NULL;
    full[len] = '\0';
    c->line++;
    if (c->line == 1 && len >= 3 && !memcmp(full, "\xEF\xBB\xBF", 3)) { /* a UTF-8 BOM */
        memmove(full, full + 3, len - 2);
        len -= 3;
    }
    snprintf(str, (size_t)num, "\n");
    if (bad >= 0) {
        add_error(c->errs, c->where, c->line,
                  "control character 0x%02x at column %zu: a job file is plain text (remove it; "
                  "a value that needs spaces at either end goes in double quotes)",
                  (unsigned)bad, bad_col);
        return str;
    }
    const char *p = full;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0' || *p == '\r' || *p == ';' || *p == '#')
        return str; /* blank, or a comment: whatever its length */
    if (len + 2 > (size_t)num) {
        long_line(c, full, over, str, num);
        return str;
    }
    snprintf(str, (size_t)num, "%s\n", full);
    if (*p == '[') {
        const char *end = strchr(p, ']');
        if (!end) {
            add_error(c->errs, c->where, c->line, "section header without closing ']'");
            return str;
        }
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(end - p - 1), p + 1);
        dt_trim(name);
        if (!known_section(name))
            report_unknown_section(c, name);
        return str;
    }
    if (!strchr(p, '=') && !strchr(p, ':'))
        add_error(c->errs, c->where, c->line,
                  "expected \"key = value\" or \"[section]\", got \"%.60s\"", dt_trim(full));
    return str;
}

static void apply_presets(dt_job *job)
{
    static const struct {
        dt_preset_kind preset;
        int L, H, C, T;
    } presets[] = {
        {DT_PRESET_GPT_TINY, 4, 4, 128, 128},
        {DT_PRESET_GPT_MINI, 6, 6, 384, 256},
        {DT_PRESET_GPT2_124M, 12, 12, 768, 1024},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(presets); i++) {
        if (job->preset != presets[i].preset)
            continue;
        if (!job->n_layer)
            job->n_layer = presets[i].L;
        if (!job->n_head)
            job->n_head = presets[i].H;
        if (!job->n_embd)
            job->n_embd = presets[i].C;
        if (!job->block_size)
            job->block_size = presets[i].T;
    }
}

static int field_index(const char *section, const char *key)
{
    const dt_cfg_field *f = find_field(section, key);
    return f ? (int)(f - dt_cfg_fields) : -1;
}

/* Folds rendezvous.conf ("k=v,...") into the typed [rendezvous] keys now, at the position of its
 * source: what is set later beats it, what was set earlier loses. torchrun's names are mapped:
 * timeout -> join_timeout, keep_alive_interval -> heartbeat_interval, keep_alive_max_attempt ->
 * heartbeat_timeout = heartbeat_interval x attempts. */
static void fold_rdzv_conf(parse_ctx *c, const char *value)
{
    static const char *const allowed[] = {
        "join_timeout",      "last_call_timeout", "close_timeout",       "heartbeat_interval",
        "heartbeat_timeout", "is_host",           "read_timeout",        "timeout",
        "keep_alive_interval", "keep_alive_max_attempt", "cacert", "cert", "key", "user",
        "password_file"};
    char buf[DT_STR_MID], *save = NULL;
    int attempts = 0, attempts_bad = 0;
    if (!dt_strlcpy(buf, value, sizeof buf)) {
        add_error(c->errs, c->where, c->line, "rendezvous.conf: longer than %zu characters",
                  sizeof buf - 1);
        return;
    }
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = dt_trim(tok);
        char *eq = strchr(tok, '=');
        if (!*tok)
            continue;
        if (!eq) {
            add_error(c->errs, c->where, c->line, "rendezvous.conf: \"%s\" is not key=value", tok);
            continue;
        }
        *eq = '\0';
        char *k = dt_trim(tok), *v = dt_trim(eq + 1);
        bool ok = false;
        for (size_t i = 0; i < DT_ARRAY_LEN(allowed); i++)
            ok |= !strcmp(allowed[i], k);
        if (!ok) {
            const char *near = dt_nearest(k, allowed, DT_ARRAY_LEN(allowed));
            add_error(c->errs, c->where, c->line, "rendezvous.conf: unknown key \"%s\"%s%s%s", k,
                      near ? "; did you mean \"" : " (known: join_timeout, last_call_timeout, "
                                                   "close_timeout, heartbeat_interval, "
                                                   "heartbeat_timeout, read_timeout, is_host, "
                                                   "timeout, keep_alive_interval, "
                                                   "keep_alive_max_attempt; etcd: cacert, "
                                                   "cert, key, user, password_file)",
                      near ? near : "", near ? "\"?" : "");
            continue;
        }
        if (!strcmp(k, "keep_alive_max_attempt")) {
            if (dt_parse_int(v, &attempts) || attempts < 1 || attempts > 1000000) {
                add_error(c->errs, c->where, c->line,
                          "rendezvous.conf: keep_alive_max_attempt: \"%s\" must be a whole "
                          "number >= 1",
                          v);
                attempts = 0;
                attempts_bad = 1;
            }
            continue;
        }
        if (!strcmp(k, "timeout"))
            k = "join_timeout";
        else if (!strcmp(k, "keep_alive_interval"))
            k = "heartbeat_interval";
        char why[512];
        int idx = field_index("rendezvous", k);
        bool good = set_field(c->job, &dt_cfg_fields[idx], v, why, sizeof why) == 0;
        if (!good)
            add_error(c->errs, c->where, c->line, "rendezvous.conf: %s", why);
        note_source(c, idx, good);
    }
    int idx = field_index("rendezvous", "heartbeat_timeout");
    if (attempts > 0) {
        char v[64], why[512];
        snprintf(v, sizeof v, "%.17g", c->job->launch.heartbeat_interval * attempts);
        bool good = set_field(c->job, &dt_cfg_fields[idx], v, why, sizeof why) == 0;
        if (!good)
            add_error(c->errs, c->where, c->line,
                      "rendezvous.conf: keep_alive_interval x keep_alive_max_attempt: %s", why);
        note_source(c, idx, good);
    } else if (attempts_bad) {
        note_source(c, idx, false);
    }
}

/* The source of whichever of keys ("section.key", NULL-terminated) was set last, else w. */
static const char *where_of(const parse_ctx *c, const char *w, const char *const *keys)
{
    int best = 0;
    const char *src = w;
    for (; c && *keys; keys++) {
        char sec[32];
        const char *dot = strchr(*keys, '.');
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - *keys), *keys);
        int idx = field_index(sec, dot + 1);
        if (idx >= 0 && c->seq[idx] > best) {
            best = c->seq[idx];
            src = c->src[idx];
        }
    }
    return src;
}

/* True when one of keys had a rejected value (a cross-key check on it would only add noise). */
static bool any_bad(const parse_ctx *c, const char *const *keys)
{
    for (; c && *keys; keys++) {
        char sec[32];
        const char *dot = strchr(*keys, '.');
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - *keys), *keys);
        int idx = field_index(sec, dot + 1);
        if (idx >= 0 && c->bad[idx])
            return true;
    }
    return false;
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define AT(...) where_of(c, w, KEYS(__VA_ARGS__))
#define BAD(...) any_bad(c, KEYS(__VA_ARGS__))

static int launch_validate(const dt_launch *l, const parse_ctx *c, const char *w,
                           dt_config_errors *errs)
{
    int before = errs ? errs->count : 0;
    /* Per-key forms (already checked when a key is set; here for structs filled otherwise). */
    static const struct {
        const char *key;
        size_t off;
    } strs[] = {
        {"nnodes", offsetof(dt_launch, nnodes)},
        {"redirects", offsetof(dt_launch, redirects)},
        {"tee", offsetof(dt_launch, tee)},
        {"local_ranks_filter", offsetof(dt_launch, local_ranks_filter)},
        {"endpoint", offsetof(dt_launch, rdzv_endpoint)},
        {"id", offsetof(dt_launch, rdzv_id)},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(strs); i++) {
        const dt_cfg_field *f = find_field("elastic", strs[i].key);
        if (!f)
            f = find_field("rendezvous", strs[i].key);
        char why[512], k[64];
        if (f && check_str(f, (const char *)l + strs[i].off, why, sizeof why)) {
            snprintf(k, sizeof k, "%s.%s", f->section, f->key);
            add_error(errs, where_of(c, w, KEYS(k)), 0, "%s", why);
        }
    }
    char why[512], given[32];
    if (check_nproc(&l->nproc_per_node, dt_nproc_format(&l->nproc_per_node, given, sizeof given),
                    why, sizeof why))
        add_error(errs, AT("elastic.nproc_per_node"), 0, "%s", why);
    if (l->rdzv_backend != DT_RDZV_ETCD && strchr(l->rdzv_endpoint, ',') &&
        !BAD("rendezvous.endpoint"))
        add_error(errs, AT("rendezvous.endpoint", "rendezvous.backend"), 0,
                  "rendezvous.endpoint: a list (%s) names the members of an etcd cluster: it is "
                  "for --rdzv-backend=etcd; %s takes one HOST[:PORT]",
                  l->rdzv_endpoint, dt_rdzv_backend_name(l->rdzv_backend));
    if (l->rdzv_backend != DT_RDZV_ETCD &&
        (l->rdzv_cacert[0] || l->rdzv_cert[0] || l->rdzv_key[0] || l->rdzv_user[0] ||
         l->rdzv_password_file[0]))
        add_error(errs, AT("rendezvous.cacert", "rendezvous.cert", "rendezvous.key",
                           "rendezvous.user", "rendezvous.password_file"),
                  0, "rendezvous.cacert, cert, key, user and password_file are for "
                     "--rdzv-backend=etcd only (the dtrain store has --token instead)");
    if (l->rdzv_backend == DT_RDZV_ETCD && !l->rdzv_user[0] != !l->rdzv_password_file[0])
        add_error(errs, AT("rendezvous.user", "rendezvous.password_file"), 0,
                  "rendezvous.user and rendezvous.password_file go together (etcd "
                  "authentication)");
    if (l->rdzv_backend == DT_RDZV_ETCD && !l->rdzv_cert[0] != !l->rdzv_key[0])
        add_error(errs, AT("rendezvous.cert", "rendezvous.key"), 0,
                  "rendezvous.cert and rendezvous.key go together (a TLS client certificate "
                  "and its key)");
    if (l->heartbeat_timeout <= l->heartbeat_interval &&
        !BAD("rendezvous.heartbeat_timeout", "rendezvous.heartbeat_interval"))
        add_error(errs, AT("rendezvous.heartbeat_timeout", "rendezvous.heartbeat_interval"), 0,
                  "rendezvous.heartbeat_timeout (%g s) must be longer than heartbeat_interval "
                  "(%g s): a node would be declared lost between two heartbeats",
                  l->heartbeat_timeout, l->heartbeat_interval);
    int a, b, max_nodes = 0;
    char tail;
    if (sscanf(l->nnodes, "%d:%d%c", &a, &b, &tail) == 2)
        max_nodes = b;
    else if (sscanf(l->nnodes, "%d%c", &a, &tail) == 1)
        max_nodes = a;
    if (!l->standalone && max_nodes > 0 && l->node_rank >= max_nodes &&
        !BAD("rendezvous.node_rank", "elastic.nnodes"))
        add_error(errs, AT("rendezvous.node_rank", "elastic.nnodes"), 0,
                  "rendezvous.node_rank out of range (--node-rank=%d: must be 0..%d for "
                  "--nnodes=%s)",
                  l->node_rank, max_nodes - 1, l->nnodes);
    return errs && errs->count > before ? -EINVAL : 0;
}

int dt_launch_validate(const dt_launch *l, const char *w, dt_config_errors *errs)
{
    return launch_validate(l, NULL, w, errs);
}

/* ---- [parallel] ----------------------------------------------------------------------------- */

static void format_value(const dt_job *job, const dt_cfg_field *f, char *buf, size_t cap);

int dt_parallel_check_world(int world, int tensor, int pipeline, dt_err *err)
{
    if (world < 1 || tensor < 1 || pipeline < 1)
        return dt_err_set(err, -EINVAL,
                          "world size %d with parallel.tensor = %d and parallel.pipeline = %d: "
                          "all three must be >= 1",
                          world, tensor, pipeline);
    int tp = tensor * pipeline;
    if (world % tp == 0)
        return 0;
    char sizes[96];
    snprintf(sizes, sizeof sizes, "%d, %d, %d, ...", tp, 2 * tp, 3 * tp);
    return dt_err_set(err, -EINVAL,
                      "world size %d is not divisible by parallel.tensor x parallel.pipeline = "
                      "%d x %d = %d (the ranks of one data-parallel replica): run a multiple of "
                      "%d ranks (%s), or change parallel.tensor or parallel.pipeline",
                      world, tensor, pipeline, tp, tp, sizes);
}

/* model.hidden's widths (0 when it is not a list of widths). */
static int mlp_hidden_count(const char *hidden)
{
    char buf[DT_STR_MID], *save = NULL;
    int n = 0, w;
    dt_strlcpy(buf, hidden, sizeof buf);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), n++)
        if (dt_parse_int(dt_trim(tok), &w) || w < 1)
            return 0;
    return n;
}

int dt_job_pipeline_blocks(const dt_job *job)
{
    switch (job->model_type) {
    case DT_MODEL_GPT:
        return job->n_layer > 0 ? job->n_layer : 0;
    case DT_MODEL_MLP: {
        int h = mlp_hidden_count(job->hidden);
        return h > 0 ? h + 1 : 0;
    }
    case DT_MODEL_RESNET:
    case DT_MODEL_UNSET:
        break;
    }
    return 0;
}

/* What the blocks are called in messages. */
static const char *blocks_what(const dt_job *job)
{
    return job->model_type == DT_MODEL_GPT ? "transformer blocks (model.n_layer)"
                                           : "Linear layers (model.hidden's widths + 1)";
}

int dt_job_stage_costs(const dt_job *job, double *block, double *first, double *last)
{
    *block = 1;
    *first = *last = 0;
    if (job->model_type != DT_MODEL_GPT || job->n_embd <= 0)
        return 0; /* mlp: its widths come from the data; every Linear layer counts alike */
    const double C = job->n_embd;
    const double T = job->seq_len > 0 ? job->seq_len : job->block_size > 0 ? job->block_size : 64;
    const double V = job->vocab_size > 0 ? job->vocab_size
                     : job->data_type == DT_DATA_TOKENS ? 50257
                                                        : 256; /* as the data opens it */
    *block = 24 * C * C + 4 * T * C;
    *first = 0;         /* the embedding: a look-up */
    *last = 2 * C * V;  /* ln_f is O(C); the head's (C,V) GEMM */
    return 1;
}

/* The contiguous split of L blocks of cost b into P stages (each >= 1 block; stage 0 costs
 * first more, stage P-1 last more) whose costliest stage is the cheapest (that stage sets the
 * pipeline's pace), into blocks[0..P). Among the splits with that maximum, the one with the
 * least sum of squared stage costs (the other stages as even as they can be: a head that weighs
 * 28 blocks leaves the last stage one block and spreads the rest, rather than piling them on
 * stage 0); among those, the earlier stages take the more blocks (with first = last = 0: blocks
 * / P each, the first blocks % P stages one more). Two dynamic programmes over (stage s, first
 * block i) for the stages s..P-1 holding blocks i..L-1: MAXC their best maximum, then SQ their
 * least sum of squares within the overall best maximum. -ENOMEM only. */
static int balance_stages(int L, int P, double b, double first, double last, int *blocks)
{
    const size_t w = (size_t)L + 1;
    double *maxc = malloc(sizeof(double) * (size_t)(P + 1) * w);
    double *sq = malloc(sizeof(double) * (size_t)(P + 1) * w);
    if (!maxc || !sq) {
        free(maxc);
        free(sq);
        return -ENOMEM;
    }
#define MAXC(s, i) maxc[(size_t)(s) * w + (size_t)(i)]
#define SQ(s, i) sq[(size_t)(s) * w + (size_t)(i)]
#define COST(s, n) ((n) * b + ((s) == 0 ? first : 0) + ((s) == P - 1 ? last : 0))
#define MOST(s, i) (L - (i) - (P - 1 - (s))) /* blocks stage s may take from i */
    for (int i = 0; i <= L; i++)
        MAXC(P, i) = SQ(P, i) = i == L ? 0 : HUGE_VAL;
    for (int s = P - 1; s >= 0; s--)
        for (int i = 0; i <= L; i++) {
            double v = HUGE_VAL;
            for (int n = 1; n <= MOST(s, i); n++)
                v = fmin(v, fmax(COST(s, n), MAXC(s + 1, i + n)));
            MAXC(s, i) = v;
        }
    const double opt = MAXC(0, 0) * (1 + 1e-12); /* rounding: sums of the same terms */
    for (int s = P - 1; s >= 0; s--)
        for (int i = 0; i <= L; i++) {
            double v = HUGE_VAL;
            for (int n = 1; n <= MOST(s, i) && COST(s, n) <= opt; n++)
                v = fmin(v, COST(s, n) * COST(s, n) + SQ(s + 1, i + n));
            SQ(s, i) = v;
        }
    for (int s = 0, i = 0; s < P; s++) {
        const double target = SQ(s, i) * (1 + 1e-12);
        int n = MOST(s, i);
        while (n > 1 && (COST(s, n) > opt || COST(s, n) * COST(s, n) + SQ(s + 1, i + n) > target))
            n--;
        blocks[s] = n;
        i += n;
    }
#undef MOST
#undef COST
#undef SQ
#undef MAXC
    free(maxc);
    free(sq);
    return 0;
}

int dt_job_stage_blocks(const dt_job *job, int *blocks, dt_err *err)
{
    int P = job->pipeline, total = dt_job_pipeline_blocks(job);
    if (P < 1 || P > DT_MAX_STAGES)
        return dt_err_set(err, -EINVAL, "parallel.pipeline = %d: use 1 to %d", P, DT_MAX_STAGES);
    if (P > 1 && total == 0)
        return dt_err_set(err, -EINVAL,
                          "parallel.pipeline = %d: pipeline parallelism is not supported for "
                          "this model (%s); use parallel.pipeline = 1",
                          P, dt_model_name(job->model_type));
    if (total > 0 && P > total)
        return dt_err_set(err, -EINVAL,
                          "parallel.pipeline = %d is more than the model's %d %s: every stage "
                          "needs a block; use at most %d",
                          P, total, blocks_what(job), total);
    if (job->n_stage_blocks > 0) {
        int sum = 0;
        for (int i = 0; i < job->n_stage_blocks; i++)
            sum += job->stage_blocks[i];
        if (job->n_stage_blocks != P || (total > 0 && sum != total))
            return dt_err_set(err, -EINVAL,
                              "parallel.stages: %d stages of %d blocks in all, but "
                              "parallel.pipeline = %d and the model has %d",
                              job->n_stage_blocks, sum, P, total);
        memcpy(blocks, job->stage_blocks, sizeof blocks[0] * (size_t)P);
        return P;
    }
    double b, first, last;
    dt_job_stage_costs(job, &b, &first, &last);
    if (total < 1) { /* no blocks (a model not configured): nothing to balance */
        for (int i = 0; i < P; i++)
            blocks[i] = 0;
        return P;
    }
    if (balance_stages(total, P, b, first, last, blocks))
        return dt_err_set(err, -ENOMEM, "out of memory balancing %d blocks over %d stages",
                          total, P);
    return P;
}

/* The [parallel] keys against each other, the model, the strategy and a world size known at
 * load (fixed nodes x a number of workers per node). */
static void parallel_validate(const dt_job *job, const parse_ctx *c, const char *w,
                              dt_config_errors *errs)
{
    const int T = job->tensor, P = job->pipeline;
    const bool model_bad = BAD("model.type", "model.n_layer", "model.n_head", "model.preset",
                               "model.hidden");
    if (BAD("parallel.tensor", "parallel.pipeline"))
        return; /* every check below is about them */
    if (T > 1 && job->model_type != DT_MODEL_GPT && !model_bad)
        add_error(errs, AT("parallel.tensor", "model.type"), 0,
                  "parallel.tensor = %d: tensor parallelism (Megatron-LM's column and row "
                  "splits) is supported for model gpt only, not %s; use parallel.tensor = 1 "
                  "(and parallel.pipeline or more data-parallel ranks)",
                  T, dt_model_name(job->model_type));
    if (T > 1 && job->model_type == DT_MODEL_GPT && job->n_head > 0 && job->n_head % T &&
        !model_bad) {
        char divs[256];
        size_t n = 0;
        int k = 0, count = 0;
        for (int d = 1; d <= job->n_head; d++)
            count += job->n_head % d == 0;
        divs[0] = '\0';
        for (int d = 1; d <= job->n_head && n < sizeof divs; d++)
            if (job->n_head % d == 0) {
                k++;
                n += (size_t)snprintf(divs + n, sizeof divs - n, "%s%d",
                                      k == 1 ? "" : k == count ? " or " : ", ", d);
            }
        add_error(errs, AT("parallel.tensor", "model.n_head", "model.preset"), 0,
                  "model.n_head = %d is not divisible by parallel.tensor = %d (each tensor rank "
                  "takes whole attention heads): use %s",
                  job->n_head, T, divs);
    }
    int total = dt_job_pipeline_blocks(job);
    if (P > 1 && job->model_type == DT_MODEL_RESNET && !model_bad)
        add_error(errs, AT("parallel.pipeline", "model.type"), 0,
                  "parallel.pipeline = %d: pipeline parallelism is not supported for this model "
                  "(resnet); use parallel.pipeline = 1 (models gpt and mlp split into stages)",
                  P);
    else if (P > 1 && total > 0 && P > total && !model_bad)
        add_error(errs, AT("parallel.pipeline", "model.n_layer", "model.hidden", "model.preset"),
                  0,
                  "parallel.pipeline = %d is more than the model's %d %s: every stage needs at "
                  "least one; use parallel.pipeline = %d or fewer, or a deeper model",
                  P, total, blocks_what(job), total);
    if (job->n_stage_blocks > 0 && !BAD("parallel.stages") && !model_bad) {
        int sum = 0;
        char given[DT_STR_MID];
        format_value(job, &dt_cfg_fields[field_index("parallel", "stages")], given,
                     sizeof given);
        for (int i = 0; i < job->n_stage_blocks; i++)
            sum += job->stage_blocks[i];
        if (job->n_stage_blocks != P)
            add_error(errs, AT("parallel.stages", "parallel.pipeline"), 0,
                      "parallel.stages = %s gives %d stage%s but parallel.pipeline = %d: give "
                      "the blocks of each of the %d stages, or leave parallel.stages empty for "
                      "a balanced split",
                      given, job->n_stage_blocks, job->n_stage_blocks == 1 ? "" : "s", P, P);
        else if (job->model_type == DT_MODEL_RESNET)
            ; /* said above (P > 1), or one stage of a model that has no blocks to count */
        else if (total > 0 && sum != total)
            add_error(errs, AT("parallel.stages", "model.n_layer", "model.hidden",
                               "model.preset"),
                      0,
                      "parallel.stages = %s adds up to %d blocks, but the model has %d %s: "
                      "make the stages' blocks add up to %d",
                      given, sum, total, blocks_what(job), total);
    }
    const int M = job->micro_batches;
    /* derived at this load (not given: parallel.pipeline's value), or as given */
    bool derived = c && c->derived_micro_batches;
    if (M > 0 && job->batch_size % M && !BAD("parallel.micro_batches", "train.batch_size"))
        add_error(errs, AT("parallel.micro_batches", "train.batch_size", "parallel.pipeline"), 0,
                  "parallel.micro_batches = %d%s does not divide train.batch_size = %d (a rank's "
                  "batch is cut into micro-batches of equal size): set parallel.micro_batches "
                  "to a divisor of %d, or train.batch_size to a multiple of %d",
                  M, derived ? " (its default: parallel.pipeline)" : "", job->batch_size,
                  job->batch_size, M);
    if ((T > 1 || P > 1) && job->strategy == DT_STRATEGY_DP && !BAD("job.strategy"))
        add_error(errs, AT("job.strategy", "parallel.tensor", "parallel.pipeline"), 0,
                  "parallel.tensor = %d and parallel.pipeline = %d need one worker process per "
                  "device, but job.strategy = dp drives every replica from one process: use "
                  "job.strategy = ddp",
                  T, P);
    /* The world, where the job alone fixes it; else the agent checks it after the rendezvous. */
    const dt_launch *l = &job->launch;
    int lo, hi;
    char tail;
    if ((T > 1 || P > 1) && l->nproc_per_node.kind == DT_NPROC_NUMBER &&
        !BAD("elastic.nnodes", "elastic.nproc_per_node")) {
        int n = l->nproc_per_node.n;
        dt_err e = {0};
        if (sscanf(l->nnodes, "%d%c", &lo, &tail) == 1 && lo >= 1 &&
            dt_parallel_check_world(lo * n, T, P, &e))
            add_error(errs, AT("elastic.nnodes", "elastic.nproc_per_node", "parallel.tensor",
                               "parallel.pipeline"),
                      0, "elastic.nnodes = %d x elastic.nproc_per_node = %d: %s", lo, n, e.msg);
        else if (sscanf(l->nnodes, "%d:%d%c", &lo, &hi, &tail) == 2 && lo >= 1 && hi >= lo) {
            int k = lo;
            while (k <= hi && (k * n) % (T * P))
                k++;
            if (k > hi)
                add_error(errs, AT("elastic.nnodes", "elastic.nproc_per_node",
                                   "parallel.tensor", "parallel.pipeline"),
                          0,
                          "elastic.nnodes = %s x elastic.nproc_per_node = %d: none of the world "
                          "sizes %d to %d is a multiple of parallel.tensor x parallel.pipeline = "
                          "%d x %d = %d; change the node range, the workers per node, or "
                          "parallel.tensor or parallel.pipeline",
                          l->nnodes, n, lo * n, hi * n, T, P, T * P);
        }
    }
}

/* parallel.sequence_parallel against parallel.tensor and the sequence length (kept apart from
 * parallel_validate: it only reads those). */
static void sequence_parallel_validate(const dt_job *job, const parse_ctx *c, const char *w,
                                       dt_config_errors *errs)
{
    const int T = job->tensor;
    if (!job->sequence_parallel || BAD("parallel.sequence_parallel", "parallel.tensor"))
        return;
    if (T <= 1) {
        add_error(errs, AT("parallel.sequence_parallel", "parallel.tensor"), 0,
                  "parallel.sequence_parallel = true splits what tensor parallelism replicates, "
                  "but parallel.tensor = %d: set parallel.tensor > 1 (gpt), or "
                  "parallel.sequence_parallel = false",
                  T);
        return;
    }
    const int seq = job->seq_len > 0 ? job->seq_len : job->block_size; /* 0: the block size */
    if (job->model_type == DT_MODEL_GPT && seq > 0 && seq % T &&
        !BAD("data.seq_len", "model.block_size", "model.preset"))
        add_error(errs, AT("parallel.sequence_parallel", "parallel.tensor", "data.seq_len"), 0,
                  "parallel.sequence_parallel = true splits each sequence's %d tokens over the "
                  "parallel.tensor = %d ranks, which does not divide it: set data.seq_len to a "
                  "multiple of %d, or parallel.sequence_parallel = false",
                  seq, T, T);
}

static int job_validate(const dt_job *job, const parse_ctx *c, dt_config_errors *errs)
{
    int before = errs ? errs->count : 0;
    const char *w = job->path[0] ? job->path : "job";
    int a;
    launch_validate(&job->launch, c, w, errs);
    if (job->model_type == DT_MODEL_GPT &&
        !BAD("model.n_layer", "model.n_head", "model.n_embd", "model.block_size", "model.preset")) {
        if (job->n_layer <= 0 || job->n_head <= 0 || job->n_embd <= 0 || job->block_size <= 0)
            add_error(errs, AT("model.type", "model.preset"), 0,
                      "model: gpt needs n_layer, n_head, n_embd and block_size (or a preset: "
                      "gpt-tiny, gpt-mini, gpt2-124m)");
        else if (job->n_embd % job->n_head)
            add_error(errs, AT("model.n_embd", "model.n_head"), 0,
                      "model: n_embd (%d) must be divisible by n_head (%d)", job->n_embd,
                      job->n_head);
        if (job->seq_len > job->block_size && job->block_size > 0 && !BAD("data.seq_len"))
            add_error(errs, AT("data.seq_len", "model.block_size"), 0,
                      "data.seq_len (%d) must not exceed model.block_size (%d)", job->seq_len,
                      job->block_size);
    }
    if (job->model_type == DT_MODEL_RESNET && (job->depth - 2) % 6 && !BAD("model.depth"))
        add_error(errs, AT("model.depth"), 0, "model.depth: %d is not 6n+2 (use 20, 32, 44, 56 or 110)",
                  job->depth);
    if (job->model_type == DT_MODEL_MLP && !BAD("model.hidden")) {
        char buf[DT_STR_MID], *save = NULL;
        int n = 0, wrong = 0;
        dt_strlcpy(buf, job->hidden, sizeof buf);
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), n++)
            if (dt_parse_int(dt_trim(tok), &a) || a < 1)
                wrong = 1;
        if (wrong || n == 0)
            add_error(errs, AT("model.hidden"), 0,
                      "model.hidden: \"%s\" must be positive widths such as 256,256", job->hidden);
        if (n > 16)
            add_error(errs, AT("model.hidden"), 0, "model.hidden: at most 16 hidden layers");
    }
    if (job->data_type != DT_DATA_SYNTHETIC && !job->data_path[0] && !BAD("data.path"))
        add_error(errs, AT("data.type", "data.path"), 0, "data.path is required for data.type = %s",
                  dt_data_name(job->data_type));
    const int *chw = job->synthetic_shape;
    if (job->data_type == DT_DATA_SYNTHETIC && (chw[0] < 0 || chw[1] < 0 || chw[2] < 0 ||
                                                (chw[0] > 0) != (chw[1] > 0 && chw[2] > 0)))
        add_error(errs, AT("data.synthetic_shape"), 0,
                  "data.synthetic_shape: %dx%dx%d must be vector or CxHxW such as 3x32x32",
                  chw[0], chw[1], chw[2]);
    if (job->model_type == DT_MODEL_GPT &&
        (job->data_type == DT_DATA_CIFAR10 || job->data_type == DT_DATA_MNIST))
        add_error(errs, AT("model.type", "data.type"), 0,
                  "model gpt needs token data (text, tokens or synthetic), not %s",
                  dt_data_name(job->data_type));
    if ((job->model_type == DT_MODEL_MLP || job->model_type == DT_MODEL_RESNET) &&
        (job->data_type == DT_DATA_TEXT || job->data_type == DT_DATA_TOKENS))
        add_error(errs, AT("model.type", "data.type"), 0,
                  "model %s needs classification data (synthetic, cifar10, mnist), not %s",
                  dt_model_name(job->model_type), dt_data_name(job->data_type));
    if (job->steps == 0 && job->epochs == 0 && !BAD("train.steps", "train.epochs"))
        add_error(errs, AT("train.steps", "train.epochs"), 0, "train: set steps or epochs (both are 0)");
    if (job->min_lr > job->lr && !BAD("train.min_lr", "train.lr"))
        add_error(errs, AT("train.min_lr", "train.lr"), 0,
                  "train.min_lr (%g) must not exceed train.lr (%g)", job->min_lr, job->lr);
    /* global_batch derives the accumulation from the world size at every start: a fixed
     * grad_accum beside it would say two things about the same step */
    if (job->global_batch > 0 && job->grad_accum != 1 && !BAD("train.global_batch", "train.grad_accum"))
        add_error(errs, AT("train.global_batch", "train.grad_accum"), 0,
                  "train.grad_accum = %d and train.global_batch = %lld both set the samples per "
                  "step: with global_batch the micro-steps are derived from it, batch_size and the "
                  "world size at every start; drop train.grad_accum (or set it to 1)",
                  job->grad_accum, (long long)job->global_batch);
    if (job->zero > 0 && job->strategy == DT_STRATEGY_DP && !BAD("parallel.zero", "job.strategy"))
        add_error(errs, AT("parallel.zero", "job.strategy"), 0,
                  "parallel.zero = %d shards state across worker processes, but job.strategy = dp "
                  "drives all replicas from one process: use job.strategy = ddp (one worker per "
                  "device) with parallel.zero, or parallel.zero = 0 with dp", job->zero);
    if (job->zero == 3 && job->global_batch > 0 && !BAD("parallel.zero", "train.global_batch"))
        add_error(errs, AT("parallel.zero", "train.global_batch"), 0,
                  "parallel.zero = 3 gathers parameters in every micro-step, so every rank must "
                  "run as many micro-steps, which train.global_batch does not promise: use "
                  "train.grad_accum with parallel.zero = 3, or parallel.zero = 1 or 2 with "
                  "train.global_batch");
    parallel_validate(job, c, w, errs);
    sequence_parallel_validate(job, c, w, errs);
    if (job->resume == DT_RESUME_PATH && !job->resume_path[0])
        add_error(errs, AT("checkpoint.resume"), 0, "checkpoint.resume: use auto, never or a path");
    return errs && errs->count > before ? -EINVAL : 0;
}

int dt_job_validate(const dt_job *job, dt_config_errors *errs)
{
    return job_validate(job, NULL, errs);
}

static void derive(dt_job *job)
{
    apply_presets(job);
    if (!job->output_dir[0])
        snprintf(job->output_dir, sizeof job->output_dir, "runs/%.200s", job->name);
    if (job->model_type == DT_MODEL_GPT && job->seq_len == 0)
        job->seq_len = job->block_size;
}

static int parse_assignment(parse_ctx *c, const char *text)
{
    char buf[DT_PATH_MAX + 128];
    dt_strlcpy(buf, text, sizeof buf);
    char *eq = strchr(buf, '=');
    char *dot = strchr(buf, '.');
    if (!eq || !dot || dot > eq) {
        add_error(c->errs, c->where, 0, "\"%s\" is not section.key=value (example: train.lr=1e-3)",
                  text);
        return -EINVAL;
    }
    *eq = '\0';
    *dot = '\0';
    char *section = dt_trim(buf), *key = dt_trim(dot + 1), *value = dt_trim(eq + 1);
    if (!known_section(section)) {
        const char *near = dt_nearest(section, sections, DT_ARRAY_LEN(sections));
        add_error(c->errs, c->where, 0, "unknown section \"%s\" in \"%s\"%s%s%s", section, text,
                  near ? "; did you mean \"" : "", near ? near : "", near ? "\"?" : "");
        return -EINVAL;
    }
    int before = c->errs ? c->errs->count : 0;
    assign(c, section, key, value);
    return c->errs && c->errs->count > before ? -EINVAL : 0;
}

int dt_job_set(dt_job *job, const char *assignment, dt_err *err)
{
    dt_config_errors *errs = calloc(1, sizeof *errs);
    parse_ctx *c = calloc(1, sizeof *c); /* large (source tables) */
    int rc = 0;
    if (!errs || !c) {
        rc = dt_err_set(err, -ENOMEM, "out of memory setting %.60s", assignment);
        goto out;
    }
    c->job = job;
    c->errs = errs;
    c->where = "override";
    if (parse_assignment(c, assignment) != 0)
        rc = dt_err_set(err, -EINVAL, "%s", errs->lines[0]);
out:
    free(c);
    free(errs);
    return rc;
}

static void apply_settings(parse_ctx *c, const dt_setting *settings, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        char where[96];
        if (settings[i].source)
            snprintf(where, sizeof where, "%s", settings[i].source);
        else
            snprintf(where, sizeof where, "override %d (%.40s)", ++k, settings[i].text);
        c->where = where;
        c->line = 0;
        parse_assignment(c, settings[i].text);
    }
}

/* The parse context of a load, reset: job at its defaults, errors into errs. One, static: it is
 * large (seen tables), and loads are not re-entrant, like the command line. */
static parse_ctx *load_begin(dt_job *job, dt_config_errors *errs)
{
    static parse_ctx c;
    memset(&c, 0, sizeof c);
    dt_job_defaults(job);
    c.job = job;
    c.errs = errs;
    return &c;
}

/* "N error(s) <what><name>" when errs has any, else 0. */
static int load_end(const dt_config_errors *errs, const char *what, const char *name, dt_err *err)
{
    if (errs->count)
        return dt_err_set(err, -EINVAL, "%d error%s %s%s", errs->count, errs->count > 1 ? "s" : "",
                          what, name);
    return 0;
}

int dt_job_load_settings(dt_job *job, const char *path, const dt_setting *settings, int n,
                         dt_config_errors *errs, dt_err *err)
{
    dt_config_errors local = {0};
    if (!errs)
        errs = &local;
    parse_ctx *c = load_begin(job, errs);
    if (path) {
        struct stat st;
        dt_strlcpy(job->path, path, sizeof job->path);
        c->where = path;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            add_error(errs, path, 0, "cannot open job file: is a directory (give a .ini file)");
            return dt_err_set(err, -EISDIR, "no job loaded");
        }
        c->fp = fopen(path, "r");
        if (!c->fp) {
            add_error(errs, path, 0, "cannot open job file: %s", strerror(errno));
            return dt_err_set(err, -ENOENT, "no job loaded");
        }
        int rc = ini_parse_stream(line_reader, c, on_ini_entry, c);
        fclose(c->fp);
        if (rc < 0)
            add_error(errs, path, 0, "cannot read job file");
    }
    apply_settings(c, settings, n);
    char choices[256];
    for (int i = 0; i < dt_cfg_fields_count; i++)
        if (dt_cfg_fields[i].required && !c->seen_required[i])
            add_error(errs, path ? path : "job", 0,
                      "missing required key %s.%s (%s; one of %s)", dt_cfg_fields[i].section,
                      dt_cfg_fields[i].key, dt_cfg_fields[i].help,
                      dt_cfg_fields[i].choices
                          ? choices_text(dt_cfg_fields[i].choices, choices, sizeof choices)
                          : "see README");
    derive(job);
    /* parallel.micro_batches not given: one micro-batch per stage keeps the bubble at
     * (P-1)/(2P-1) without asking for a batch the user did not size */
    int mb = field_index("parallel", "micro_batches");
    c->derived_micro_batches = c->seq[mb] == 0 && job->pipeline > 1;
    if (c->derived_micro_batches)
        job->micro_batches = job->pipeline;
    job_validate(job, c, errs);
    return load_end(errs, "loading ", path ? path : "the job", err);
}

int dt_job_load(dt_job *job, const char *path, char *const *overrides, int n_overrides,
                dt_config_errors *errs, dt_err *err)
{
    dt_setting *s = n_overrides > 0 ? calloc((size_t)n_overrides, sizeof *s) : NULL;
    if (n_overrides > 0 && !s)
        return dt_err_set(err, -ENOMEM, "out of memory loading %s", path ? path : "the job");
    for (int i = 0; i < n_overrides; i++)
        s[i].text = overrides[i];
    int rc = dt_job_load_settings(job, path, s, n_overrides, errs, err);
    free(s);
    return rc;
}

int dt_launch_load(dt_job *job, const dt_setting *settings, int n, dt_config_errors *errs,
                   dt_err *err)
{
    dt_config_errors local = {0};
    if (!errs)
        errs = &local;
    parse_ctx *c = load_begin(job, errs);
    apply_settings(c, settings, n);
    launch_validate(&job->launch, c, "command line", errs);
    return load_end(errs, "on the command line", "", err);
}

/* ---- printing ---------------------------------------------------------------------------- */

static void format_value(const dt_job *job, const dt_cfg_field *f, char *buf, size_t cap)
{
    const char *base = (const char *)job + f->offset;
    switch (f->type) {
    case DT_CFG_INT:
        snprintf(buf, cap, "%d", *(const int *)base);
        break;
    case DT_CFG_I64:
        snprintf(buf, cap, "%lld", (long long)*(const int64_t *)base);
        break;
    case DT_CFG_DOUBLE:
    case DT_CFG_DURATION: {
        /* The shortest form that reads back to the same double. */
        double v = *(const double *)base;
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, cap, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
        break;
    }
    case DT_CFG_BOOL:
        snprintf(buf, cap, "%s", *(const bool *)base ? "true" : "false");
        break;
    case DT_CFG_ENUM:
        snprintf(buf, cap, "%s", name_of(f->choices, *(const int *)base));
        break;
    case DT_CFG_SHAPE: {
        const int *chw = (const int *)base;
        if (chw[0] > 0)
            snprintf(buf, cap, "%dx%dx%d", chw[0], chw[1], chw[2]);
        else
            snprintf(buf, cap, "vector");
        break;
    }
    case DT_CFG_NPROC:
        dt_nproc_format((const dt_nproc *)base, buf, cap);
        break;
    case DT_CFG_STAGES: {
        int n = *(const int *)base;
        size_t len = 0;
        buf[0] = '\0';
        for (int i = 0; i < n && i < DT_MAX_STAGES && len < cap; i++)
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "",
                                    job->stage_blocks[i]);
        break;
    }
    case DT_CFG_RESUME:
        if (*(const int *)base != DT_RESUME_PATH) {
            snprintf(buf, cap, "%s", name_of(resume_names, *(const int *)base));
            break;
        }
        base = job->resume_path;
        __attribute__((fallthrough)); /* a path is written as a string */
    case DT_CFG_STR: {
        /* Quoted when the file would otherwise lose spaces at either end or a pair of quotes. */
        size_t n = strlen(base);
        bool quote = n > 0 && (isspace((unsigned char)base[0]) ||
                               isspace((unsigned char)base[n - 1]) ||
                               (n >= 2 && base[0] == '"' && base[n - 1] == '"'));
        snprintf(buf, cap, quote ? "\"%s\"" : "%s", base);
        break;
    }
    }
}

void dt_job_print(const dt_job *job, FILE *out)
{
    char val[DT_PATH_MAX + 32];
    fprintf(out, "; dtrain job, fully resolved%s%s\n", job->path[0] ? " from " : "", job->path);
    for (size_t s = 0; s < DT_ARRAY_LEN(sections); s++) {
        fprintf(out, "\n[%s]\n", sections[s]);
        for (int i = 0; i < dt_cfg_fields_count; i++) {
            const dt_cfg_field *f = &dt_cfg_fields[i];
            if (strcmp(f->section, sections[s]) != 0)
                continue;
            /* rendezvous.conf is already folded into the typed keys below it. */
            if (!strcmp(f->section, "rendezvous") && !strcmp(f->key, "conf")) {
                fprintf(out, "conf =\n");
                continue;
            }
            format_value(job, f, val, sizeof val);
            fprintf(out, "%s = %s\n", f->key, val);
        }
    }
}

void dt_job_print_reference(FILE *out)
{
    fprintf(out, "| key | type | default | meaning |\n|---|---|---|---|\n");
    /* checkpoint.resume, data.synthetic_shape, elastic.nproc_per_node and parallel.stages read
     * as strings (auto/never/PATH, vector/CxHxW, N/auto/cpu/gpu, B,B,...: their help says
     * which). */
    static const char *const tnames[] = {"int",    "int",     "number", "bool",   "string",
                                         "choice", "seconds", "string", "string", "string",
                                         "string"};
    for (int i = 0; i < dt_cfg_fields_count; i++) {
        const dt_cfg_field *f = &dt_cfg_fields[i];
        char type[160];
        if (f->type == DT_CFG_ENUM)
            choices_text(f->choices, type, sizeof type);
        else
            snprintf(type, sizeof type, "%s", tnames[f->type]);
        for (char *p = type; *p; p++)
            if (*p == '|')
                *p = '/';
        fprintf(out, "| `%s.%s` | %s | %s | %s |\n", f->section, f->key, type,
                f->required ? "(required)" : (f->def[0] ? f->def : "\"\""), f->help);
    }
}
