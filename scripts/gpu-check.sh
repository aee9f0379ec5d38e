#!/usr/bin/env bash
# gpu-check.sh - one command that checks the GPU path of dtrain on this machine and prints one
# compact summary. Budget: under 8 minutes on one H200, about 9 on two or more GPUs (every step
# has its own time limit; step 6 runs with two GPUs only: two quickstart runs, 150 s each at most).
#
#   scripts/gpu-check.sh             build, op tests, training runs, NCCL on every GPU
#   scripts/gpu-check.sh --quick     build and op tests only
#   scripts/gpu-check.sh --require-gpu   exit non-zero when no GPU is usable (CI on GPU hosts)
#
# Steps
#   1. build: make (the CUDA backend libdtrain_cuda.so must build)
#   2. op tests: build/tests/test_gpu_ops with DTRAIN_REQUIRE_GPU=1 (every CUDA op against the
#      CPU reference, tolerances per precision; the arena, profiling, NCCL collectives, NCCL
#      timeout)
#   3. training, one GPU, through the launcher (dtrain --standalone JOB.ini overrides):
#        quickstart GPT (configs/quickstart.ini) fp32 and bf16, and the same job on the CPU:
#          loss at the first and last step against the CPU run, tokens/s, peak memory
#        gpt2-124m (synthetic tokens, T = 1024): a 2-step run on GPU (fp32) and CPU at batch 2
#          for the loss comparison, then fp32, bf16 and bf16 with the flash attention kernels
#          (DTRAIN_CUDA_ATTN=flash) at batch $GPT2_BATCH for tokens/s, MFU and peak memory
#      the zoo's other models (configs/bert-mlm.ini, llama.ini, resnet50.ini): ZOO_STEPS steps on
#      the GPU (fp32) and the CPU, losses at the first and last step against the CPU's,
#      throughput, peak memory
#   4. NCCL: the gpt2-124m bf16 run and quickstart on every GPU of the machine (one rank per
#      GPU, ddp.backend = nccl): tokens/s and scaling against one GPU; then the same gpt2-124m
#      bf16 run with ZeRO-3 and activation recomputation (parallel.zero = 3, train.recompute =
#      block): tokens/s and the peak memory by category (metrics.jsonl's
#      mem_peak_bytes: params, grads, optim, activations, comm, other (checkpoint staging); and
#      peak_mem_bytes) beside the DDP run's. On one GPU that run is one rank: stage 3 over one
#      rank shards nothing (its shard is the whole model) but still gathers every block into
#      the flat buffer before its forward and backward (an all-gather over one rank,
#      prefetched), gives it back after, and reduce-scatters each block's gradients into the
#      shard, so the row then measures the cost of that machinery and of recomputation, not a
#      saving: parameters and gradients are the shard plus what the flat buffers keep (all of
#      them where the cuda backend's granule is 0: DTRAIN_CUDA_VMM=0 or a driver without virtual
#      memory management; about a block each on kernels/cuda/vmm.cu's cuMemMap allocations),
#      and the checkpoint staging ("other") stays whole where the granule is 0; the row says so
#   5. DP (job.strategy = dp) on every GPU when there are two or more: quickstart driven by one
#      process, parameters and gradients through NCCL (dp_transport = collectives) and through
#      host memory (master); loss against the DDP run of step 4, tokens/s
#   6. tensor and pipeline parallelism on two GPUs (skipped, visibly, with fewer): quickstart at
#      parallel.tensor = 2 (Megatron splits, NCCL all-reduces inside the tensor group) and at
#      parallel.pipeline = 2 (4 micro-batches, 1F1B, NCCL send/recv between the stages), fp32,
#      the same global batch as the one-GPU fp32 run of step 3a: loss at the first and last step
#      against it, tokens/s, and rank 0's share of the parameters as the worker logs it
#
# MFU = tokens/s * FLOPs per token / peak. FLOPs per token = 6 N + 12 L C T (PaLM, appendix B;
# N = all parameters, tied embedding counted once, the attention term for the full T x T scores
# that the CUDA path computes). Peaks (dense, per GPU): H100/H200 SXM 989 TFLOP/s bf16, 495 tf32,
# 67 fp32; H100 PCIe 756 / 378 / 51; A100 312 / 156 / 19.5. fp32 runs are measured against the
# fp32 (non-tensor-core) peak, since precision = fp32 uses no TF32 unless DTRAIN_CUDA_TF32=1.
# Set GPU_PEAK_BF16 / GPU_PEAK_FP32 (TFLOP/s) for other GPUs.
#
# Without a GPU (no nvidia-smi, no driver, no device) it still builds and runs the op tests (which
# then skip, visibly) and says why nothing else ran; it exits 0 unless --require-gpu.
#
# Knobs (environment): GPT2_BATCH (16), GPT2_STEPS (30), QS_STEPS (100), ZOO_STEPS (20), KEEP=1 keeps the work
# directory. The gpt2-124m rows set DTRAIN_CUDA_GEMM (convert|fast: the bf16 GEMM strategy, see
# kernels/cuda) and DTRAIN_CUDA_ATTN (cublas|flash) themselves, one row per choice.
# GPU_CHECK_DEVICE=cpu smoke-tests this script itself on a machine without a GPU: every "GPU"
# run goes to the CPU (ddp.backend = cpu) as if there were one device; use it with small
# GPT2_PRESET=gpt-tiny GPT2_BATCH=2 GPT2_STEPS=3 QS_STEPS=5. Its figures mean nothing.
set -u
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)
quick=0 require=0
for a in "$@"; do
    case "$a" in
        --quick) quick=1 ;;
        --require-gpu) require=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument $a (see --help)" >&2; exit 2 ;;
    esac
done
GPT2_BATCH=${GPT2_BATCH:-16}
GPT2_STEPS=${GPT2_STEPS:-30}
QS_STEPS=${QS_STEPS:-100}
ZOO_STEPS=${ZOO_STEPS:-20}
GPT2_PRESET=${GPT2_PRESET:-gpt2-124m}
dev=${GPU_CHECK_DEVICE:-cuda}
comm=nccl
[ "$dev" = cpu ] && comm=cpu
t_start=$(date +%s)
work=$(mktemp -d /tmp/dtrain-gpu-check.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
ncpu=$(nproc 2>/dev/null || echo 4)
summary=()
status=0
say() { echo "gpu-check [$(( $(date +%s) - t_start ))s]: $*"; }
add() { summary+=("$1"); }
fail() { status=1; add "$1"; }

# ---- the GPU ---------------------------------------------------------------------------------
ngpu=0 gpu_name="" why_no_gpu=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
    why_no_gpu="nvidia-smi not found (no NVIDIA driver installed)"
elif ! out=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1); then
    why_no_gpu="nvidia-smi failed: $(echo "$out" | head -n 1)"
else
    ngpu=$(echo "$out" | grep -c .)
    gpu_name=$(echo "$out" | head -n 1)
    [ "$ngpu" -gt 0 ] || why_no_gpu="nvidia-smi lists no GPU"
fi
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "$ngpu" -gt 0 ]; then
    vis=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    [ "$vis" -lt "$ngpu" ] && ngpu=$vis
fi
if [ "$dev" = cpu ]; then
    ngpu=1 gpu_name="CPU (GPU_CHECK_DEVICE=cpu: a smoke test of this script)" why_no_gpu=""
fi
if [ "$ngpu" -gt 0 ]; then
    say "$ngpu GPU(s): $gpu_name"
else
    say "no GPU: $why_no_gpu"
fi

peak_bf16=${GPU_PEAK_BF16:-} peak_fp32=${GPU_PEAK_FP32:-}
case "$gpu_name" in
    *H100*PCIe*) : "${peak_bf16:=756}" "${peak_fp32:=51}" ;;
    *H100*|*H200*|*GH200*) : "${peak_bf16:=989}" "${peak_fp32:=67}" ;;
    *A100*) : "${peak_bf16:=312}" "${peak_fp32:=19.5}" ;;
esac

# ---- 1. build --------------------------------------------------------------------------------
say "building"
if ! timeout 300 make -s -j"$ncpu" >"$work/build.log" 2>&1; then
    tail -n 30 "$work/build.log"
    fail "build            FAILED (see above)"
    printf '%s\n' "${summary[@]}"
    exit 1
fi
if [ -f build/libdtrain_cuda.so ]; then
    add "build            ok (build/libdtrain_cuda.so)"
else
    fail "build            no build/libdtrain_cuda.so: $(grep 'CUDA backend' "$work/build.log" | head -n 1)"
fi

# ---- 2. op tests -----------------------------------------------------------------------------
say "op tests (every CUDA op against the CPU reference)"
req=0
[ "$ngpu" -gt 0 ] && [ "$dev" = cuda ] && req=1
if [ ! -x build/tests/test_gpu_ops ]; then
    timeout 120 make -s build/tests/test_gpu_ops >>"$work/build.log" 2>&1
fi
if [ -x build/tests/test_gpu_ops ]; then
    DTRAIN_REQUIRE_GPU=$req timeout 600 build/tests/test_gpu_ops >"$work/ops.log" 2>&1
    line=$(grep -E '^test_gpu_ops: [0-9]+ passed' "$work/ops.log" | tail -n 1)
    failed_names=$(grep -E '^  FAIL ' "$work/ops.log" | awk '{print $2}' | tr '\n' ' ')
    if [ -z "$line" ]; then
        tail -n 20 "$work/ops.log"
        fail "op tests         CRASHED (log above)"
    elif echo "$line" | grep -q ' 0 failed'; then
        add "op tests         ${line#test_gpu_ops: }"
    else
        grep -E '^    FAIL|^  FAIL' "$work/ops.log" | head -n 40
        fail "op tests         ${line#test_gpu_ops: }; failed: $failed_names"
    fi
else
    fail "op tests         build/tests/test_gpu_ops did not build"
fi

finish() {
    echo
    echo "== gpu-check summary: ${gpu_name:-no GPU} x$ngpu, $(( $(date +%s) - t_start )) s =="
    printf '%s\n' "${summary[@]}"
    exit "$status"
}

if [ "$ngpu" -eq 0 ]; then
    add "training, NCCL   skipped: no GPU ($why_no_gpu)"
    add "tensor, pipeline skipped: needs 2 GPUs (found 0)"
    [ "$require" = 1 ] && status=1
    finish
fi
[ "$quick" = 1 ] && finish

# ---- helpers for training runs ---------------------------------------------------------------
# run NAME TIMEOUT NPROC JOB overrides...: runs the launcher; output in $work/NAME.log, metrics in
# $work/NAME/metrics.jsonl. Returns the launcher's exit status (124 on timeout).
run() {
    local name=$1 limit=$2 nproc=$3 job=$4
    shift 4
    rm -rf "${work:?}/$name"
    timeout "$limit" build/dtrain --standalone --nproc-per-node="$nproc" "$job" \
        job.output_dir="$work/$name" checkpoint.resume=never "$@" >"$work/$name.log" 2>&1
}

missing_trainer() {
    grep -q "not available in this build yet" "$work/$1.log"
}

# field NAME KEY [first|last|median]: a numeric field of the "train" lines of metrics.jsonl.
field() {
    local f="$work/$1/metrics.jsonl" key=$2 which=${3:-last}
    [ -f "$f" ] || return 0
    grep '"type":"train"' "$f" | sed -n "s/.*\"$key\":\([-0-9.eE+]*\).*/\1/p" >"$work/.vals"
    case "$which" in
        first) head -n 1 "$work/.vals" ;;
        last) tail -n 1 "$work/.vals" ;;
        median) # skip the first value (warm-up), median of the rest
            tail -n +2 "$work/.vals" | sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]}' ;;
    esac
}

fmt() { awk -v v="${1:-}" -v d="${2:-4}" 'BEGIN { if (v == "") print "?"; else printf "%.*f", d, v }'; }
gib() { awk -v v="${1:-}" 'BEGIN { if (v == "") print "?"; else if (v < 1073741824) printf "%.0f MiB", v / 1048576; else printf "%.1f GiB", v / 1073741824 }'; }
ktok() { awk -v v="${1:-}" 'BEGIN { if (v == "") print "?"; else if (v >= 1e6) printf "%.2fM", v / 1e6; else printf "%.1fK", v / 1e3 }'; }
reldiff() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "") print "?"; else { d = a - b; if (d < 0) d = -d; printf "%.1e", d / (b < 0 ? -b : b) } }'; }
mfu() { # tokens/s flops_per_token peak_tflops
    awk -v t="${1:-}" -v f="$2" -v p="${3:-}" 'BEGIN { if (t == "" || p == "") print "?"; else printf "%.1f%%", 100 * t * f / (p * 1e12) }'
}

qs=configs/quickstart.ini
qs_common=(job.log_every=1 train.steps="$QS_STEPS" checkpoint.every=0 train.eval_every=0 train.eval_batches=1)

# ---- 3a. quickstart: CPU reference, GPU fp32 and bf16 ----------------------------------------
say "quickstart GPT on the CPU (reference, $QS_STEPS steps)"
run qs_cpu 240 1 "$qs" job.device=cpu train.threads="$ncpu" "${qs_common[@]}"
rc=$?
if missing_trainer qs_cpu; then
    add "training         MISSING: $(grep -m1 'not available' "$work/qs_cpu.log")"
    add "                 (the launcher's built-in trainer lands with the train issue; rerun then)"
    finish
fi
[ $rc -eq 0 ] || fail "quickstart cpu   FAILED (exit $rc): $(tail -n 3 "$work/qs_cpu.log" | tr '\n' ' ')"
cpu_first=$(field qs_cpu loss first) cpu_last=$(field qs_cpu loss last)

for prec in fp32 bf16 fp16; do
    say "quickstart GPT on the GPU, $prec"
    run "qs_$prec" 180 1 "$qs" job.device="$dev" train.precision="$prec" "${qs_common[@]}"
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "quickstart $prec  FAILED (exit $rc): $(grep -m3 -E 'ERROR|error' "$work/qs_$prec.log" | tr '\n' ' ')"
        continue
    fi
    first=$(field "qs_$prec" loss first) last=$(field "qs_$prec" loss last)
    skipped=$(field "qs_$prec" skipped_steps last)
    [ -n "$skipped" ] && skipped="  fp16 loss scale $(field "qs_$prec" loss_scale last), $skipped steps skipped"
    add "quickstart $prec  loss@1 $(fmt "$first") (cpu $(fmt "$cpu_first"), rel $(reldiff "$first" "$cpu_first"))  loss@$QS_STEPS $(fmt "$last") (cpu $(fmt "$cpu_last"))  $(ktok "$(field "qs_$prec" tokens_per_s median)") tok/s  peak $(gib "$(field "qs_$prec" peak_mem_bytes last)")${skipped}"
done

bind=$(grep -m1 -o 'job.cpu_bind = auto: .*' "$work/qs_fp32.log" | cut -c1-160)
add "cpu binding      ${bind:-not bound near the GPU (rerun with DTRAIN_LOG=debug to see why)}"

# ---- 3b. gpt2-124m ---------------------------------------------------------------------------
gpt2=$work/gpt2.ini
cat >"$gpt2" <<EOF
; written by scripts/gpu-check.sh
[job]
name = gpu-check-gpt2
seed = 1337
device = $dev
log_every = 1
[model]
type = gpt
preset = $GPT2_PRESET
block_size = 1024
[data]
type = synthetic
seq_len = 1024
vocab_size = 50257
synthetic_samples = 65536
[train]
batch_size = $GPT2_BATCH
steps = $GPT2_STEPS
optimizer = adamw
lr = 6e-4
weight_decay = 0.1
beta2 = 0.95
grad_clip = 1.0
eval_every = 0
eval_batches = 1
[checkpoint]
every = 0
EOF
L=12 C=768 T=1024 V=50257
nparams=$(( V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C ))
fpt=$(( 6 * nparams + 12 * L * C * T ))

say "gpt2-124m: 2 steps at batch 2 on the GPU (fp32) and the CPU, for the loss"
run g2_ref_gpu 180 1 "$gpt2" train.batch_size=2 train.steps=2
rc_g=$?
run g2_ref_cpu 240 1 "$gpt2" job.device=cpu train.threads="$ncpu" train.batch_size=2 train.steps=2
rc_c=$?
if [ $rc_g -eq 0 ] && [ $rc_c -eq 0 ]; then
    g1=$(field g2_ref_gpu loss first) g2=$(field g2_ref_gpu loss last)
    c1=$(field g2_ref_cpu loss first) c2=$(field g2_ref_cpu loss last)
    add "gpt2-124m loss   step1 gpu $(fmt "$g1") cpu $(fmt "$c1") (rel $(reldiff "$g1" "$c1"))  step2 gpu $(fmt "$g2") cpu $(fmt "$c2") (rel $(reldiff "$g2" "$c2"))"
else
    fail "gpt2-124m loss   FAILED (gpu exit $rc_g, cpu exit $rc_c): $(grep -h -m2 -E 'ERROR|error' "$work/g2_ref_gpu.log" "$work/g2_ref_cpu.log" | tr '\n' ' ')"
fi

declare -A tps
# bf16-fast: cuBLAS converts fp32 operands inside the GEMM (DTRAIN_CUDA_GEMM=fast) instead of
# dtrain converting every operand, weights included, before each GEMM (convert, the default)
for cfg in fp32 bf16 bf16-flash bf16-fast; do
    prec=${cfg%-*}
    attn=cublas gemm=convert
    [ "$cfg" = bf16-flash ] && attn=flash
    [ "$cfg" = bf16-fast ] && gemm=fast
    say "gpt2-124m on one GPU, $cfg, batch $GPT2_BATCH x 1024, $GPT2_STEPS steps"
    export DTRAIN_CUDA_ATTN=$attn DTRAIN_CUDA_GEMM=$gemm
    run "g2_$cfg" 240 1 "$gpt2" train.precision="$prec"
    rc=$?
    unset DTRAIN_CUDA_ATTN DTRAIN_CUDA_GEMM
    label=$(printf '%-10s' "$cfg")
    if [ $rc -ne 0 ]; then
        fail "gpt2-124m $label FAILED (exit $rc): $(grep -m3 -E 'ERROR|error' "$work/g2_$cfg.log" | tr '\n' ' ')"
        continue
    fi
    t=$(field "g2_$cfg" tokens_per_s median)
    tps[$cfg]=$t
    if [ "$prec" = bf16 ]; then peak=$peak_bf16; else peak=$peak_fp32; fi
    add "gpt2-124m $label $(ktok "$t") tok/s  MFU $(mfu "$t" "$fpt" "$peak") of ${peak:-?} TFLOP/s $prec  step $(fmt "$(field "g2_$cfg" step_time_s median)" 3) s  peak $(gib "$(field "g2_$cfg" peak_mem_bytes last)")  loss@$GPT2_STEPS $(fmt "$(field "g2_$cfg" loss last)")"
done
add "                 (MFU: $fpt FLOPs/token = 6N + 12LCT, N = $nparams)"

# ---- 3c. the rest of the zoo: BERT, Llama, ResNet-50 -----------------------------------------
# Each shipped config for ZOO_STEPS steps on the GPU (fp32) and on the CPU: the first and last
# losses against the CPU's (the same seed, data and batch: they should agree to float32 rounding
# at step 1 and stay close after), throughput and peak memory.
for name in bert-mlm llama resnet50; do
    say "$name: $ZOO_STEPS steps on the GPU (fp32) and the CPU"
    zoo_common=(job.log_every=1 train.steps="$ZOO_STEPS" train.warmup_steps=2 checkpoint.every=0
        train.eval_every=0 train.eval_batches=1)
    run "zoo_${name}_cpu" 240 1 "configs/$name.ini" job.device=cpu train.threads="$ncpu" "${zoo_common[@]}"
    rc_c=$?
    run "zoo_${name}_gpu" 240 1 "configs/$name.ini" job.device="$dev" train.precision=fp32 "${zoo_common[@]}"
    rc_g=$?
    label=$(printf '%-16s' "$name")
    if [ $rc_c -ne 0 ] || [ $rc_g -ne 0 ]; then
        fail "$label FAILED (gpu exit $rc_g, cpu exit $rc_c): $(grep -h -m2 -E 'ERROR|error' "$work/zoo_${name}_gpu.log" "$work/zoo_${name}_cpu.log" | tr '\n' ' ')"
        continue
    fi
    g1=$(field "zoo_${name}_gpu" loss first) gn=$(field "zoo_${name}_gpu" loss last)
    c1=$(field "zoo_${name}_cpu" loss first) cn=$(field "zoo_${name}_cpu" loss last)
    if [ "$name" = resnet50 ]; then
        rate="$(fmt "$(field "zoo_${name}_gpu" samples_per_s median)" 0) img/s (cpu $(fmt "$(field "zoo_${name}_cpu" samples_per_s median)" 0))"
    else
        rate="$(ktok "$(field "zoo_${name}_gpu" tokens_per_s median)") tok/s (cpu $(ktok "$(field "zoo_${name}_cpu" tokens_per_s median)"))"
    fi
    add "$label loss@1 $(fmt "$g1") (cpu $(fmt "$c1"), rel $(reldiff "$g1" "$c1"))  loss@$ZOO_STEPS $(fmt "$gn") (cpu $(fmt "$cn"), rel $(reldiff "$gn" "$cn"))  $rate  peak $(gib "$(field "zoo_${name}_gpu" peak_mem_bytes last)")"
done

# ---- 4. NCCL on every GPU --------------------------------------------------------------------
say "NCCL: quickstart and gpt2-124m bf16 on $ngpu GPU(s), one rank per GPU"
run qs_nccl 180 "$ngpu" "$qs" job.device="$dev" ddp.backend="$comm" "${qs_common[@]}"
rc=$?
if [ $rc -eq 0 ]; then
    add "nccl x$ngpu quickst. ok  loss@$QS_STEPS $(fmt "$(field qs_nccl loss last)")  $(ktok "$(field qs_nccl tokens_per_s median)") tok/s"
else
    fail "nccl x$ngpu quickst. FAILED (exit $rc): $(grep -m3 -E 'ERROR|error' "$work/qs_nccl.log" | tr '\n' ' ')"
fi
run g2_nccl 240 "$ngpu" "$gpt2" train.precision=bf16 ddp.backend="$comm" train.steps=$(( GPT2_STEPS / 2 > 5 ? GPT2_STEPS / 2 : 5 ))
rc=$?
if [ $rc -eq 0 ]; then
    t=$(field g2_nccl tokens_per_s median)
    scale=$(awk -v a="$t" -v b="${tps[bf16]:-}" -v n="$ngpu" 'BEGIN { if (a == "" || b == "") print "?"; else printf "%.2fx of %dx", a / b, n }')
    add "nccl x$ngpu gpt2 bf16 $(ktok "$t") tok/s ($scale one GPU)  comm $(fmt "$(field g2_nccl comm_time_s median)" 3) s/step  peak $(gib "$(field g2_nccl peak_mem_bytes last)")"
else
    fail "nccl x$ngpu gpt2    FAILED (exit $rc): $(grep -m3 -E 'ERROR|error' "$work/g2_nccl.log" | tr '\n' ' ')"
fi

# ZeRO-3 + recompute = block (issue 17), the same job and ranks as g2_nccl (one rank per GPU:
# dtrain binds LOCAL_RANK to its GPU, so a GPU never holds two ranks)
say "ZeRO-3 + recompute = block: gpt2-124m bf16 on $ngpu GPU(s)"
run g2_zero 300 "$ngpu" "$gpt2" train.precision=bf16 ddp.backend="$comm" parallel.zero=3 \
    train.recompute=block train.steps=$(( GPT2_STEPS / 2 > 5 ? GPT2_STEPS / 2 : 5 ))
rc=$?
if [ $rc -eq 0 ]; then
    t=$(field g2_zero tokens_per_s median)
    t0=$(field g2_nccl tokens_per_s median)
    what="zero3+block x$ngpu"
    rel=$(awk -v a="$t" -v b="$t0" 'BEGIN { if (a == "" || b == "") print "?"; else printf "%.2fx", a / b }')
    # memory by category: the last step's mem_peak_bytes (each category's peak over the steps;
    # stage 3's params and grads: the shard plus what the flat buffers held at once) and the
    # whole peak
    mem() { echo "$(gib "$(field g2_zero "$1" last)") (ddp $(gib "$(field g2_nccl "$1" last)"))"; }
    add "$what gpt2 bf16 $(ktok "$t") tok/s ($rel ddp)  peak $(mem peak_mem_bytes)  loss@end $(fmt "$(field g2_zero loss last)") (ddp $(fmt "$(field g2_nccl loss last)"))"
    add "                 peak by category: params $(mem params)  grads $(mem grads)  optim $(mem optim)  activations $(mem activations)  comm $(mem comm)  other $(mem other)"
    if [ "$ngpu" -eq 1 ]; then
        add "                 (one rank: stage 3 shards nothing, it still gathers and gives back every block: the row measures that cost and recomputation, not a saving)"
    fi
    if grep -q "cannot give the model's flat" "$work/g2_zero.log"; then
        add "                 (the backend's granule is 0: the flat buffers stay resident, params and grads include them whole)"
    fi
else
    fail "zero3+block x$ngpu gpt2 FAILED (exit $rc): $(grep -m3 -E 'ERROR|error' "$work/g2_zero.log" | tr '\n' ' ')"
fi

# ---- 5. DP: one process drives every GPU -----------------------------------------------------
dpn=$ngpu
[ "$dev" = cpu ] && dpn=2
if [ "$dpn" -lt 2 ]; then
    add "dp               skipped: one GPU (strategy = dp needs two or more)"
else
    for tr in collectives master; do
        say "DP: quickstart, one process driving $dpn replicas, dp_transport = $tr"
        run "qs_dp_$tr" 180 1 "$qs" job.device="$dev" job.strategy=dp job.dp_replicas="$dpn" \
            job.dp_transport="$tr" "${qs_common[@]}"
        rc=$?
        label=$(printf '%-11s' "$tr")
        if [ $rc -eq 0 ]; then
            add "dp x$dpn $label loss@$QS_STEPS $(fmt "$(field "qs_dp_$tr" loss last)") (ddp $(fmt "$(field qs_nccl loss last)"))  $(ktok "$(field "qs_dp_$tr" tokens_per_s median)") tok/s  master peak $(gib "$(field "qs_dp_$tr" peak_mem_bytes last)")"
        else
            fail "dp x$dpn $label FAILED (exit $rc): $(grep -m3 -E 'ERROR|error|WARN' "$work/qs_dp_$tr.log" | tr '\n' ' ')"
        fi
    done
fi

# ---- 6. tensor and pipeline parallelism on two GPUs ------------------------------------------
# quickstart (gpt-tiny: 4 heads, 4 blocks) on 2 ranks, one GPU each; D = 1, so the global batch
# is the one-GPU run's (qs_fp32) and its losses are the reference
mpn=$ngpu
[ "$dev" = cpu ] && mpn=2
if [ "$mpn" -lt 2 ]; then
    add "tensor x2        skipped: needs 2 GPUs (found $ngpu)"
    add "pipeline x2      skipped: needs 2 GPUs (found $ngpu)"
else
    for mp in tensor pipeline; do
        say "$mp parallelism: quickstart fp32 on 2 GPUs"
        extra=(parallel.tensor=2)
        [ "$mp" = pipeline ] && extra=(parallel.pipeline=2 parallel.micro_batches=4 parallel.schedule=1f1b)
        run "qs_$mp" 150 2 "$qs" job.device="$dev" ddp.backend="$comm" train.precision=fp32 \
            "${extra[@]}" "${qs_common[@]}"
        rc=$?
        label=$(printf '%-11s' "$mp x2")
        if [ $rc -ne 0 ]; then
            fail "$label      FAILED (exit $rc): $(grep -m3 -E 'ERROR|error' "$work/qs_$mp.log" | tr '\n' ' ')"
            continue
        fi
        first=$(field "qs_$mp" loss first) last=$(field "qs_$mp" loss last)
        ref1=$(field qs_fp32 loss first) refn=$(field qs_fp32 loss last)
        share=$(grep -m1 -o 'rank 0 holds [0-9]* ([0-9.]*%)' "$work/qs_$mp.log")
        add "$label      loss@1 $(fmt "$first") (1 GPU $(fmt "$ref1"), rel $(reldiff "$first" "$ref1"))  loss@$QS_STEPS $(fmt "$last") (1 GPU $(fmt "$refn"))  $(ktok "$(field "qs_$mp" tokens_per_s median)") tok/s  ${share:-share not logged}"
    done
fi

finish
