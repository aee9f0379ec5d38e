/* config.c - the job's key table and its values; see config.h.
 *
 * The table below is the single source of every key: type, default, range, help. The parser, the
 * validator, --print-config and the key reference (docs/keys.md) all walk it. Add a key here and nowhere
 * else (plus the field in dt_job). Here too: one value in and out of the job (dt_cfg_set,
 * dt_cfg_format), the defaults, the model's shape for the cost model (runtime/job/cost.h) and
 * the printing. Reading a job file and the checks at load are config_load.c, which uses this
 * file and is never used by it.
 */
#include "runtime/job/config.h"

#include <ctype.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
static const char *const model_names[] = {"mlp", "resnet", "gpt", "bert", "llama", NULL};
static const char *const preset_names[] = {
    "none",       "gpt-tiny",  "gpt-mini",   "gpt2-124m", "bert-tiny", "bert-base",
    "bert-large", "llama-tiny", "llama3-8b", "llama3-70b", "resnet18",  "resnet34",
    "resnet50",   "resnet101", "resnet152", NULL};
static const char *const data_names[] = {"synthetic", "text", "tokens", "cifar10", "mnist", NULL};
static const char *const optim_names[] = {"adamw", "sgd", NULL};
static const char *const lr_names[] = {"constant", "cosine", "linear", NULL};
static const char *const precision_names[] = {"fp32", "bf16", "fp16", NULL};
static const char *const recompute_names[] = {"none", "block", "selective", NULL};
static const char *const comm_backend_names[] = {"auto", "cpu", "nccl", NULL};
static const char *const compress_names[] = {"none", "bf16", "fp16", "int8", "1bit", NULL};
static const char *const resume_names[] = {"auto", "never", "path", NULL};
static const char *const rdzv_backend_names[] = {"static", "c10d", "etcd", NULL};
static const char *const pp_schedule_names[] = {"1f1b", "gpipe", NULL};
static const char *const layout_names[] = {"explicit", "auto", NULL};

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
NAME_FN(dt_layout_name, dt_layout_kind, layout_names)

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

int dt_nproc_check(const dt_nproc *v, const char *given, char *why, size_t cap)
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
    {"job", "device_memory", DT_CFG_BYTES, J(device_memory), "0", 0, 9e18, NULL, false, "memory budget of each worker's device in bytes, suffixes K M G T (1000s) and Ki Mi Gi Ti (1024s): the backend refuses an allocation that would take what it holds (every category) beyond it, and the worker fails with an out-of-memory message (0 = the device's own memory: unlimited on cpu; on cpu a value makes the backend behave as a device of that size)"},
    {"job", "strategy", DT_CFG_ENUM, J(strategy), "ddp", 0, 0, strategy_names, false, "ddp: one process per device, ring all-reduce; dp: one process drives all replicas"},
    {"job", "cpu_bind", DT_CFG_ENUM, J(cpu_bind), "auto", 0, 0, cpu_bind_names, false, "auto: on cpu each of a node's workers (strategy = dp: each replica thread) gets an equal share of the CPUs the launcher may use; on cuda each worker (each replica thread) runs on its share of the CPUs near its GPU (the GPU's NUMA node, from sysfs); none leaves placement to the scheduler"},
    {"job", "dp_replicas", DT_CFG_INT, J(dp_replicas), "2", 1, 1024, NULL, false, "strategy = dp: replicas the one process drives (threads on cpu, one GPU each on cuda); batch_size is per replica"},
    {"job", "dp_transport", DT_CFG_ENUM, J(dp_transport), "auto", 0, 0, dp_transport_names, false, "strategy = dp: how parameters reach the replicas and gradients come back. master: the master copies to and sums from each replica in turn (through host memory between GPUs); collectives: broadcast and reduce over a communicator of the replicas (NCCL between GPUs, shared memory on cpu), as torch DataParallel on GPUs; auto: collectives on cuda (master if NCCL is unusable, with a warning), master on cpu"},
    {"job", "seed", DT_CFG_I64, J(seed), "1337", 0, BIG, NULL, false, "seed of initialisation, data order and synthetic data"},
    {"job", "log_every", DT_CFG_INT, J(log_every), "10", 1, 1e9, NULL, false, "steps between log lines"},
    /* [model] */
    {"model", "type", DT_CFG_ENUM, J(model_type), "", 0, 0, model_names, true, "model from the zoo"},
    {"model", "preset", DT_CFG_ENUM, J(preset), "none", 0, 0, preset_names, false, "size preset, one of the model.type's: gpt-*, bert-* (bert-tiny 2x128x2, bert-base 12x768x12, bert-large 24x1024x16, block_size 512), llama-* (llama-tiny, the shapes of Llama 3 8B and 70B), resnet* (torchvision's ImageNet ResNet of that depth; model.depth is then ignored); explicit n_layer/n_head/n_embd/block_size (llama: n_kv_head, intermediate_size, rope_theta) win"},
    {"model", "n_layer", DT_CFG_INT, J(n_layer), "0", 0, 1000, NULL, false, "gpt: transformer blocks (0 = from preset)"},
    {"model", "n_head", DT_CFG_INT, J(n_head), "0", 0, 1024, NULL, false, "gpt: attention heads (0 = from preset)"},
    {"model", "n_embd", DT_CFG_INT, J(n_embd), "0", 0, 65536, NULL, false, "gpt: channels (0 = from preset)"},
    {"model", "block_size", DT_CFG_INT, J(block_size), "0", 0, 1048576, NULL, false, "gpt: maximum sequence length (0 = from preset)"},
    {"model", "n_kv_head", DT_CFG_INT, J(n_kv_head), "0", 0, 1024, NULL, false, "llama: key/value heads of grouped-query attention, dividing n_head (0 = from preset, else n_head)"},
    {"model", "intermediate_size", DT_CFG_INT, J(intermediate_size), "0", 0, 1048576, NULL, false, "llama: SwiGLU width (0 = from preset, else Meta's rule 256 * ceil(floor(8 n_embd / 3) / 256))"},
    {"model", "rope_theta", DT_CFG_DOUBLE, J(rope_theta), "0", 0, 1e12, NULL, false, "llama: rotary embedding base (0 = from preset, else 10000)"},
    {"model", "rms_norm_eps", DT_CFG_DOUBLE, J(rms_norm_eps), "1e-5", 0, 1, NULL, false, "llama: RMSNorm epsilon"},
    {"model", "hidden", DT_CFG_STR, J(hidden), "256,256", 0, 0, NULL, false, "mlp: comma-separated hidden widths"},
    {"model", "depth", DT_CFG_INT, J(depth), "20", 8, 1202, NULL, false, "resnet: depth 6n+2 (20, 32, 44, 56, 110)"},
    {"model", "width", DT_CFG_INT, J(width), "0", 0, 1024, NULL, false, "resnet: channels of the first stage, doubled per stage (0 = 16; with a resnet* preset torchvision's 64)"},
    {"model", "sync_bn", DT_CFG_BOOL, J(sync_bn), "false", 0, 0, NULL, false, "resnet: SyncBatchNorm (statistics all-reduced across ranks)"},
    {"model", "nsp", DT_CFG_BOOL, J(nsp), "false", 0, 0, NULL, false, "bert: the next-sentence head (pooler and cls.seq_relationship); the data then makes sentence pairs [CLS] A [SEP] B [SEP], B the segment after A or, half the time, a random one"},
    /* [data] */
    {"data", "type", DT_CFG_ENUM, J(data_type), "synthetic", 0, 0, data_names, false, "dataset format"},
    {"data", "path", DT_CFG_STR, J(data_path), "", 0, 0, NULL, false, "file, directory or glob of the training data (not for synthetic)"},
    {"data", "val_path", DT_CFG_STR, J(val_path), "", 0, 0, NULL, false, "validation data (\"\" = split val_fraction off the training data)"},
    {"data", "val_fraction", DT_CFG_DOUBLE, J(val_fraction), "0.1", 0, 0.9, NULL, false, "share of the data held out for validation when val_path is empty"},
    {"data", "seq_len", DT_CFG_INT, J(seq_len), "0", 0, 1048576, NULL, false, "language modelling: tokens per sample (0 = model block_size)"},
    {"data", "vocab_size", DT_CFG_INT, J(vocab_size), "0", 0, 16777216, NULL, false, "language modelling: vocabulary (0 = 256 for text, 50257 for tokens); bert's model adds 4 special tokens after it ([PAD] [CLS] [SEP] [MASK])"},
    {"data", "mlm_prob", DT_CFG_DOUBLE, J(mlm_prob), "0.15", 0.001, 1, NULL, false, "bert: share of each sample's content tokens chosen for the masked-LM loss (round, at least 1): 80% become [MASK], 10% a random token, 10% stay; a function of (job.seed, sample index, position), so every layout, world size and resume masks the same"},
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
    {"train", "recompute", DT_CFG_ENUM, J(recompute), "none", 0, 0, recompute_names, false, "activation recomputation in backward (same gradients): none; block (gpt, bert, llama, resnet: keep only each block's input, recompute the block's forward in its backward: far less activation memory for about one more forward); selective (gpt, bert, llama: recompute only what attention saves for backward: cuda's probabilities and bert's; the cpu's causal attention keeps only a log-sum-exp per row, so there it saves little for gpt and llama)"},
    {"train", "trace", DT_CFG_STR, J(trace), "off", 0, 0, NULL, false, "write a timeline of these steps (forward, backward, data, each DDP bucket's all-reduce, optimiser step, checkpoint, eval) per rank to <output_dir>/trace/rank<N>.json and all ranks to trace.json (Chrome trace: open in ui.perfetto.dev; scripts/trace-png.py draws it): off, on (every step, up to 100000 spans per rank), N, A-B (e.g. 10-12) or A- (from A on)"},
    {"train", "flight_records", DT_CFG_INT, J(flight_records), "2000", 1, 1000000, NULL, false, "collective and point-to-point calls each worker keeps in its flight records, which its agent reads for a hang verdict (docs/failures.md)"},
    {"train", "step_timeout", DT_CFG_DURATION, J(step_timeout), "0", 0, 1e7, NULL, false, "step watchdog: when no rank finished a step for this long (evaluation and checkpoints included), the agents gather the flight records, print a hang verdict and fail the attempt (0 = off; a stuck collective ends after ddp.timeout anyway)"},
    {"train", "straggler_ratio", DT_CFG_DOUBLE, J(straggler_ratio), "1.3", 0, 1e6, NULL, false, "a rank whose compute time per step is at least this many times the median rank's over a window is reported as a straggler (0 = no straggler scores)"},
    {"train", "straggler_window", DT_CFG_INT, J(straggler_window), "20", 1, 1000000, NULL, false, "steps per straggler window: ranks are scored once per window"},
    /* [ddp] */
    {"ddp", "backend", DT_CFG_ENUM, J(comm_backend), "auto", 0, 0, comm_backend_names, false, "collectives: nccl on cuda, cpu otherwise (auto)"},
    {"ddp", "bucket_cap_mb", DT_CFG_DOUBLE, J(bucket_cap_mb), "25", 0.001, 1e6, NULL, false, "gradient bucket size (MiB)"},
    {"ddp", "first_bucket_mb", DT_CFG_DOUBLE, J(first_bucket_mb), "1", 0.001, 1e6, NULL, false, "size of the first bucket (MiB), launched earliest"},
    {"ddp", "compress", DT_CFG_ENUM, J(compress), "none", 0, 0, compress_names, false, "gradient payload compression for all-reduce: bf16, fp16 (16-bit payloads); int8 (blocks of 256 with a float scale, round to nearest: reduce-scatter of quantised chunks, summed in float, the shard quantised again and all-gathered; about 0.25x fp32's bytes); 1bit (signs and a scale per block of 64, with error feedback, after ddp.compress_warmup_steps float32 steps; about 0.047x). int8 and 1bit: device = cpu, parallel.zero = 0 (docs/parallelism.md#gradient-compression)"},
    {"ddp", "compress_stochastic", DT_CFG_BOOL, J(compress_stochastic), "false", 0, 0, NULL, false, "ddp.compress = int8: round stochastically (unbiased: the expected value of what is sent is the gradient; error below one scale instead of half of one) instead of to nearest. The draws are a function of (job.seed, optimiser step, bucket, chunk, rank), so a resumed job rounds as one that ran through"},
    {"ddp", "compress_warmup_steps", DT_CFG_INT, J(compress_warmup_steps), "0", 0, 1000000000, NULL, false, "ddp.compress = 1bit: optimiser updates that all-reduce float32 gradients before the 1-bit all-reduce starts (1-bit Adam's warm-up; DeepSpeed uses 15-25% of the steps)"},
    {"ddp", "timeout", DT_CFG_DURATION, J(comm_timeout), "300", 0.001, 1e7, NULL, false, "seconds a collective may wait for a peer before it fails"},
    {"ddp", "broadcast_buffers", DT_CFG_BOOL, J(broadcast_buffers), "true", 0, 0, NULL, false, "broadcast buffers (BatchNorm statistics) from rank 0 every step"},
    {"ddp", "check_consistency", DT_CFG_BOOL, J(check_consistency), "true", 0, 0, NULL, false, "verify that every rank built the same model at start"},
    /* [parallel] */
    {"parallel", "zero", DT_CFG_INT, J(zero), "0", 0, 3, NULL, false, "ZeRO stage over the data-parallel ranks: 0 = DDP (every rank holds everything); 1 = optimiser state sharded (gradients reduce-scattered, each rank updates its shard, parameters all-gathered); 2 = gradients sharded as well (a bucket's gradient memory is given back once it is reduce-scattered); 3 = parameters sharded as well (FSDP full-shard: each block's parameters all-gathered before its forward and its backward, given back after; not with train.global_batch). One rank: stages 1 and 2 train as one process, stage 3 still gathers and gives back every block"},
    {"parallel", "tensor", DT_CFG_INT, J(tensor), "1", 1, 1024, NULL, false, "tensor-parallel degree T (Megatron-LM: attention heads and the MLP split over T ranks, vocab-parallel embedding and loss; models gpt and bert, with model.n_head divisible by T). The world is a grid data x tensor x pipeline: D = world / (T x P) data-parallel replicas, rank = (pp x D + dp) x T + tp, so a tensor group is T consecutive ranks (keep T <= nproc_per_node to stay inside a node); the world size must be a multiple of T x P. Needs job.strategy = ddp; parallel.zero 0-3 (DDP or ZeRO over each shard's data-parallel group; 3 on device = cpu)"},
    {"parallel", "pipeline", DT_CFG_INT, J(pipeline), "1", 1, DT_MAX_STAGES, NULL, false, "pipeline stages P: the model's blocks (gpt: transformer blocks; bert: encoder layers; mlp: its Linear layers; resnet: its residual blocks, the stem on the first stage and fc on the last) split over P ranks in order, activations passed between them; at most one stage per block. The data is sharded over the D = world / (T x P) data-parallel ranks only: every stage of a pipeline sees the same samples. Needs job.strategy = ddp; parallel.zero 0-3 (DDP or ZeRO over each stage's data-parallel group; 3 on device = cpu)"},
    {"parallel", "micro_batches", DT_CFG_INT, J(micro_batches), "1", 1, 1e6, NULL, false, "pipeline micro-batches M: each micro-step's batch (train.batch_size, which M must divide) is cut into M micro-batches that flow through the stages; the idle share of the pipeline (the bubble) is (P-1)/(M+P-1). When not given: 1 without a pipeline, else parallel.pipeline (resolved at load: --print-config shows the number)"},
    {"parallel", "schedule", DT_CFG_ENUM, J(pp_schedule), "1f1b", 0, 0, pp_schedule_names, false, "pipeline schedule: 1f1b (PipeDream-Flush: after a warm-up each stage alternates one forward and one backward, so at most P micro-batches' activations are kept) or gpipe (all forwards, then all backwards: M micro-batches' activations); the same gradients either way"},
    {"parallel", "stages", DT_CFG_STAGES, J(n_stage_blocks), "", 0, 0, NULL, false, "blocks per pipeline stage, comma-separated such as 4,4,2,2: exactly parallel.pipeline entries, each >= 1, summing to the model's blocks (gpt: model.n_layer; mlp: the model.hidden layers + 1; resnet: its residual blocks, (model.depth - 2) / 2, or resnet50's 16). \"\" = balanced by cost: the split whose costliest stage is cheapest, gpt's embedding counted on the first stage and ln_f + the head (2*C*V FLOPs a token, a block 24*C^2 + 4*T*C) on the last; earlier stages take one more block on a tie (mlp: layers count alike)"},
    {"parallel", "sequence_parallel", DT_CFG_BOOL, J(sequence_parallel), "false", 0, 0, NULL, false, "Megatron-LM sequence parallelism on top of parallel.tensor = T > 1 (gpt, bert): the residual stream, LayerNorms and residual adds hold 1/T of the tokens on each tensor rank instead of all of them, the all-reduces become reduce-scatters and all-gathers, so those activations take 1/T of the memory (same gradients, to rounding; about 1.25x the tensor group's traffic). Needs data.seq_len (or model.block_size) divisible by T; with parallel.pipeline > 1 the stages pass the 1/T shards"},
    {"parallel", "layout", DT_CFG_ENUM, J(layout), "explicit", 0, 0, layout_names, false, "explicit: the [parallel] keys and train.batch_size / grad_accum as given; auto: the launcher plans the layout at start (dtrain plan's best for the world: tensor, pipeline, zero, sequence_parallel, micro_batches, schedule, train.recompute, batch_size and grad_accum, keeping the global batch) and logs its choice, within job.device_memory; needs nproc_per_node a number and elastic.nnodes N, or MIN:MAX, where it plans again for every new world of the job's rounds"},
    /* [checkpoint] */
    {"checkpoint", "dir", DT_CFG_STR, J(ckpt_dir), "", 0, 0, NULL, false, "checkpoint directory (\"\" = <output_dir>/checkpoints)"},
    {"checkpoint", "every", DT_CFG_INT, J(ckpt_every), "0", 0, 1e9, NULL, false, "steps between checkpoints (0 = only at the end and on preemption)"},
    {"checkpoint", "keep", DT_CFG_INT, J(ckpt_keep), "3", 1, 1e6, NULL, false, "newest checkpoints kept"},
    {"checkpoint", "resume", DT_CFG_RESUME, J(resume), "auto", 0, 0, NULL, false, "auto (newest valid), never, or a checkpoint path"},
    {"checkpoint", "async", DT_CFG_BOOL, J(ckpt_async), "true", 0, 0, NULL, false, "write in the background: on cuda after copying the buffers to host memory; on the cpu backend from where they are while the next forward and backward run (the optimiser update waits for the write; checkpoint.host_copy copies them instead)"},
    {"checkpoint", "sharded", DT_CFG_BOOL, J(ckpt_sharded), "false", 0, 0, NULL, false, "every rank writes what it owns (its ZeRO shard, tensor slices, stage) to its own file in parallel, without gathering the model, and rank 0 commits the step once all are durable (format version 2; any layout resumes it); false: rank 0 writes whole tensors (job.strategy = dp always does)"},
    {"checkpoint", "host_copy", DT_CFG_BOOL, J(ckpt_host_copy), "false", 0, 0, NULL, false, "cpu backend: copy what a save writes to host memory at the save (training is then held only for the copy, at the cost of that copy's memory, counted as other) instead of writing it from where it is (false: nothing more than one write buffer, and with checkpoint.async the next optimiser update waits until the write is done)"},
    {"checkpoint", "io_buffer_mb", DT_CFG_INT, J(ckpt_io_buffer_mb), "64", 1, 65536, NULL, false, "MiB of the one I/O buffer a rank moves state through: a sharded checkpoint is read through it (each piece streamed, never a whole tensor held), ZeRO-1/2 move their optimiser shards through it after the first step and gather a whole-tensor save's state to rank 0 through it; it caps the 4 MiB write buffer"},
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

const char *const dt_cfg_sections[] = {"job",        "model",   "data",    "train",
                                       "ddp",        "parallel", "checkpoint", "elastic", "rendezvous"};
const int dt_cfg_sections_count = (int)DT_ARRAY_LEN(dt_cfg_sections);

/* ---- field access ------------------------------------------------------------------------ */

const dt_cfg_field *dt_cfg_find(const char *section, const char *key)
{
    for (int i = 0; i < dt_cfg_fields_count; i++)
        if (!strcasecmp(dt_cfg_fields[i].section, section) && !strcasecmp(dt_cfg_fields[i].key, key))
            return &dt_cfg_fields[i];
    return NULL;
}

bool dt_cfg_known_section(const char *s)
{
    for (int i = 0; i < dt_cfg_sections_count; i++)
        if (!strcasecmp(dt_cfg_sections[i], s))
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

const char *dt_cfg_choices_text(const char *const *names, char *buf, size_t cap)
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

int dt_cfg_check_str(const dt_cfg_field *f, const char *v, char *why, size_t cap)
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

int dt_cfg_set(dt_job *job, const dt_cfg_field *f, const char *value, char *why, size_t cap)
{
    char *base = (char *)job + f->offset;
    double d = 0;
    int rc = 0;
    /* A number is written alone: blanks around it (kept by quotes, "\" 2\"") are refused, not
     * read past; a sign (+2, -1) is accepted. Lists take blanks around their commas. */
    size_t vlen = strlen(value);
    bool numeric = f->type == DT_CFG_INT || f->type == DT_CFG_I64 || f->type == DT_CFG_DOUBLE ||
                   f->type == DT_CFG_DURATION || f->type == DT_CFG_NPROC ||
                   f->type == DT_CFG_BYTES;
    if (numeric && vlen && (isspace((unsigned char)value[0]) ||
                            isspace((unsigned char)value[vlen - 1]))) {
        snprintf(why, cap, "%s.%s: \"%s\" has blanks around it: write the value alone (quotes "
                 "keep blanks; a number has none)", f->section, f->key, value);
        return -EINVAL;
    }
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
    case DT_CFG_BYTES: {
        int64_t v;
        rc = dt_parse_bytes(value, &v);
        if (rc == -ERANGE)
            goto range;
        if (rc) {
            snprintf(why, cap, "%s.%s: \"%s\" is not a size in bytes (examples: 1073741824, "
                     "1GiB, 512Mi, 2G; suffixes K M G T are 1000s, Ki Mi Gi Ti 1024s)",
                     f->section, f->key, value);
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
            dt_cfg_choices_text(f->choices, buf, sizeof buf);
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
        char lower[64]; /* 3X32X32 as 3x32x32: values with fixed words are read in any case */
        size_t i = 0;
        for (; value[i] && i + 1 < sizeof lower; i++)
            lower[i] = (char)tolower((unsigned char)value[i]);
        lower[i] = '\0';
        if (sscanf(lower, "%dx%dx%d%c", &c3, &h, &w, &tail) != 3 || c3 < 1 || h < 1 || w < 1 ||
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
        /* auto, cpu, gpu (in any case, as the enums), or a number (as the int keys read) */
        dt_nproc v = {DT_NPROC_NUMBER, 0};
        int k = 1;
        while (nproc_names[k] && strcasecmp(nproc_names[k], value))
            k++;
        if (nproc_names[k])
            v.kind = (dt_nproc_kind)k;
        else if (dt_parse_int(value, &v.n))
            v.n = 0; /* not a number: rejected below */
        if (dt_nproc_check(&v, value, why, cap))
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
        if (dt_cfg_check_str(f, value, why, cap))
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
            dt_cfg_set(job, f, f->def, why, sizeof why);
        else if (f->type == DT_CFG_ENUM) /* a required choice: unset until given */
            *(int *)((char *)job + f->offset) = -1;
    }
}

/* ---- the model's shape and the pipeline's stages (runtime/job/cost.h) ------------------- */

int dt_job_mlp_widths(const char *text, int *widths, dt_err *err)
{
    int n = 0;
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v <= 0 || v > (1 << 24))
            return dt_err_set(err, -EINVAL,
                              "model.hidden: \"%s\" must be positive widths such as 256,256",
                              text);
        if (n == DT_MAX_HIDDEN)
            return dt_err_set(err, -EINVAL, "model.hidden: at most %d hidden layers",
                              DT_MAX_HIDDEN);
        widths[n++] = (int)v;
        p = end;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == ',')
            p++;
        else if (*p)
            return dt_err_set(err, -EINVAL,
                              "model.hidden: \"%s\" must be positive widths such as 256,256",
                              text);
    }
    return n;
}

void dt_job_cost_model(const dt_job *job, dt_cost_model *m)
{
    memset(m, 0, sizeof *m);
    m->family = job->model_type == DT_MODEL_GPT      ? DT_COST_GPT
                : job->model_type == DT_MODEL_BERT   ? DT_COST_BERT
                : job->model_type == DT_MODEL_LLAMA  ? DT_COST_LLAMA
                : job->model_type == DT_MODEL_MLP    ? DT_COST_MLP
                : job->model_type == DT_MODEL_RESNET ? DT_COST_RESNET
                                                     : DT_COST_OTHER;
    m->name = dt_model_name(job->model_type);
    m->n_layer = job->n_layer;
    m->n_embd = job->n_embd;
    m->n_head = job->n_head;
    m->n_kv_head = job->n_kv_head;
    m->intermediate_size = job->intermediate_size;
    m->depth = job->depth;
    m->imagenet = !strncmp(dt_preset_name(job->preset), "resnet", 6);
    m->seq_len = job->seq_len > 0 ? job->seq_len : job->block_size > 0 ? job->block_size : 64;
    m->vocab_size = job->vocab_size > 0 ? job->vocab_size
                    : job->data_type == DT_DATA_TOKENS ? 50257
                                                       : 256; /* as the data opens it */
    if (m->family == DT_COST_MLP) {
        int w[DT_MAX_HIDDEN];
        int n = dt_job_mlp_widths(job->hidden, w, NULL);
        m->n_hidden = n > 0 ? n : 0;
    }
}

int dt_job_pipeline_blocks(const dt_job *job)
{
    dt_cost_model m;
    dt_job_cost_model(job, &m);
    return dt_cost_blocks(&m);
}

int dt_job_stage_costs(const dt_job *job, double *block, double *first, double *last)
{
    dt_cost_model m;
    dt_job_cost_model(job, &m);
    return dt_cost_block_flops(&m, block, first, last);
}

int dt_job_stage_blocks(const dt_job *job, int *blocks, dt_err *err)
{
    int P = job->pipeline;
    if (P < 1 || P > DT_MAX_STAGES)
        return dt_err_set(err, -EINVAL, "parallel.pipeline = %d: use 1 to %d", P, DT_MAX_STAGES);
    dt_cost_model m;
    dt_job_cost_model(job, &m);
    return dt_cost_stage_blocks(&m, P, job->stage_blocks, job->n_stage_blocks, blocks, err);
}

/* ---- printing ---------------------------------------------------------------------------- */

void dt_cfg_format(const dt_job *job, const dt_cfg_field *f, char *buf, size_t cap)
{
    const char *base = (const char *)job + f->offset;
    switch (f->type) {
    case DT_CFG_INT:
        snprintf(buf, cap, "%d", *(const int *)base);
        break;
    case DT_CFG_I64:
        snprintf(buf, cap, "%lld", (long long)*(const int64_t *)base);
        break;
    case DT_CFG_BYTES: { /* exact: the largest binary suffix that divides it */
        static const char *const sfx[] = {"", "Ki", "Mi", "Gi", "Ti"};
        long long v = (long long)*(const int64_t *)base;
        int k = 0;
        while (v && k < 4 && v % 1024 == 0) {
            v /= 1024;
            k++;
        }
        snprintf(buf, cap, "%lld%s", v, sfx[k]);
        break;
    }
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
    for (int s = 0; s < dt_cfg_sections_count; s++) {
        fprintf(out, "\n[%s]\n", dt_cfg_sections[s]);
        for (int i = 0; i < dt_cfg_fields_count; i++) {
            const dt_cfg_field *f = &dt_cfg_fields[i];
            if (strcmp(f->section, dt_cfg_sections[s]) != 0)
                continue;
            /* rendezvous.conf is already folded into the typed keys below it. */
            if (!strcmp(f->section, "rendezvous") && !strcmp(f->key, "conf")) {
                fprintf(out, "conf =\n");
                continue;
            }
            dt_cfg_format(job, f, val, sizeof val);
            fprintf(out, "%s = %s\n", f->key, val);
        }
    }
}

/* ---- the settings the nodes agree on (the rendezvous's job digest) ---------------------- */

const char *const dt_job_node_local_keys[] = {
    "job.output_dir", /* where this node writes (DTRAIN_OUTPUT_DIR, a local disk) */
    "job.cpu_bind",   /* this host's CPUs */
    "train.threads",  /* this host's cores */
    "checkpoint.dir", /* a path on this node (each rank writes its own shards there) */
    "checkpoint.resume", /* auto, never, or a path on this node (checked by its own workers) */
    NULL,
};

bool dt_cfg_node_local(const dt_cfg_field *f)
{
    char k[64];
    if (!strcmp(f->section, "elastic") || !strcmp(f->section, "rendezvous"))
        return true;
    snprintf(k, sizeof k, "%s.%s", f->section, f->key);
    for (int i = 0; dt_job_node_local_keys[i]; i++)
        if (!strcmp(k, dt_job_node_local_keys[i]))
            return true;
    return false;
}

char *dt_job_shared_text(const dt_job *job)
{
    size_t cap = 8192, len = 0;
    char *out = malloc(cap), val[DT_PATH_MAX + 32];
    if (!out)
        return NULL;
    out[0] = '\0';
    for (int i = 0; i < dt_cfg_fields_count; i++) {
        const dt_cfg_field *f = &dt_cfg_fields[i];
        if (dt_cfg_node_local(f))
            continue;
        dt_cfg_format(job, f, val, sizeof val);
        for (char *p = val; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
        size_t need = strlen(f->section) + strlen(f->key) + strlen(val) + 4;
        if (len + need > cap) {
            char *g = realloc(out, cap = 2 * (len + need));
            if (!g) {
                free(out);
                return NULL;
            }
            out = g;
        }
        len += (size_t)snprintf(out + len, cap - len, "%s.%s=%s\n", f->section, f->key, val);
    }
    return out;
}

void dt_job_print_reference(FILE *out)
{
    fprintf(out, "| key | type | default | meaning |\n|---|---|---|---|\n");
    /* checkpoint.resume, data.synthetic_shape, elastic.nproc_per_node and parallel.stages read
     * as strings (auto/never/PATH, vector/CxHxW, N/auto/cpu/gpu, B,B,...: their help says
     * which). */
    static const char *const tnames[] = {"int",    "int",     "number", "bool",   "string",
                                         "choice", "seconds", "string", "string", "string",
                                         "string", "bytes"};
    _Static_assert(sizeof tnames / sizeof tnames[0] == DT_CFG_BYTES + 1,
                   "a name for every dt_cfg_type");
    for (int i = 0; i < dt_cfg_fields_count; i++) {
        const dt_cfg_field *f = &dt_cfg_fields[i];
        char type[160];
        if (f->type == DT_CFG_ENUM)
            dt_cfg_choices_text(f->choices, type, sizeof type);
        else
            snprintf(type, sizeof type, "%s", tnames[f->type]);
        for (char *p = type; *p; p++)
            if (*p == '|')
                *p = '/';
        fprintf(out, "| `%s.%s` | %s | %s | %s |\n", f->section, f->key, type,
                f->required ? "(required)" : (f->def[0] ? f->def : "\"\""), f->help);
    }
}
