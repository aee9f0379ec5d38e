#!/usr/bin/env bash
# metrics-identity.sh - are two builds of dtrain bit for bit the same trainer? Runs a fixed set
# of short jobs with the real binary, keeps each job's metrics.jsonl and the checksums of its
# last checkpoint, and compares two such records field by field.
#
#   scripts/metrics-identity.sh record DIR [DTRAIN]    run the jobs with DTRAIN (build/dtrain)
#                                                      and keep what they wrote under DIR
#   scripts/metrics-identity.sh compare BEFORE AFTER   compare two records; exit 1 on any
#                                                      difference, naming job, record and field
#   scripts/metrics-identity.sh check BEFORE [DTRAIN]  record into a temporary directory and
#                                                      compare it with BEFORE
#   scripts/metrics-identity.sh jobs                   list the jobs
#
# A refactor of the trainer records BEFORE from a build of the base commit (a `git worktree add
# /tmp/base <commit>` built with make), then runs `check BEFORE` after each step. About a minute
# on two idle cores (four 8-worker jobs, eight 2- or 4-worker jobs, two one-process ones).
#
# The jobs (every one logs every step, job.log_every = 1; the gpt of configs/quickstart.ini):
#   quickstart     configs/quickstart.ini, 30 steps, one process
#   ddp2           the same on 2 workers (DDP)
#   zero1x2 zero2x2 zero3x2   ZeRO stages 1, 2, 3 on 2 workers (zero2x2 with train.grad_accum = 2)
#   zero3x1        ZeRO-3 over one rank (it still gathers and gives back every block)
#   d2t2p2         D2 x T2 x P2 on 8 workers, n_embd 64, 2 micro-batches, 8 steps, DDP over dp
#   d2t2p2-z1 d2t2p2-z3   the same with ZeRO-1 and ZeRO-3 over the data-parallel groups
#   d2t2-z2        D2 x T2 (the tensor layout) on 4 workers, ZeRO-2, 12 steps
#   d2p2-z2        D2 x P2 on 4 workers (GPipe), ZeRO-2, 12 steps
#   resume-z2      resumes ddp2's checkpoint of step 20 under ZeRO-2 on 2 workers to step 30
#   resume-3d      resumes d2t2p2's checkpoint of step 4 with D2 x T2 x P2 at ZeRO-3 to step 8
# Each job checkpoints (checkpoint.every) and evaluates along the way, so saves, loads and eval
# passes are covered as well as steps.
#
# What is compared: every record of metrics.jsonl (train, eval, layout, ...), every field, as
# parsed JSON values (numbers compared exactly: 64-bit doubles print round-trip), except these
# that measure time or the process rather than the computation:
#   tokens_per_s samples_per_s step_time_s comm_time_s time   timing
#   max_rss_bytes          the process's resident set: threads, allocator arenas, page cache
#                          of the files it read; it moves by pages from run to run
#   run                    the run id every record carries: drawn afresh by every fresh start
# Memory by category (peak_mem_bytes, mem_peak_bytes) is the backend allocator's own count, the
# same in every run of one build, and is compared. And the last checkpoint: the sha256 of its
# model.safetensors and optim.safetensors (the tensors' bytes and the header); state.json holds
# wall-clock times and the run id, so only its step, epoch, sample position and loss are
# compared.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cfg=$here/configs/quickstart.ini
common=(job.log_every=1)

# name | nproc | overrides (space-separated) | resume-from job (or -)
jobs() {
    cat <<'EOF'
quickstart|1|train.steps=30|-
ddp2|2|train.steps=30 checkpoint.every=20|-
zero1x2|2|train.steps=20 parallel.zero=1 checkpoint.every=10|-
zero2x2|2|train.steps=20 parallel.zero=2 train.grad_accum=2 checkpoint.every=10|-
zero3x2|2|train.steps=30 parallel.zero=3 checkpoint.every=15|-
zero3x1|1|train.steps=20 parallel.zero=3|-
d2t2p2|8|train.steps=8 parallel.tensor=2 parallel.pipeline=2 parallel.micro_batches=2 model.n_embd=64 train.eval_every=4 checkpoint.every=4|-
d2t2p2-z1|8|train.steps=8 parallel.tensor=2 parallel.pipeline=2 parallel.micro_batches=2 model.n_embd=64 parallel.zero=1 train.eval_every=4 checkpoint.every=4|-
d2t2p2-z3|8|train.steps=8 parallel.tensor=2 parallel.pipeline=2 parallel.micro_batches=2 model.n_embd=64 parallel.zero=3 train.eval_every=4 checkpoint.every=4|-
d2t2-z2|4|train.steps=12 parallel.tensor=2 model.n_embd=64 parallel.zero=2 train.eval_every=6 checkpoint.every=6|-
d2p2-z2|4|train.steps=12 parallel.pipeline=2 parallel.micro_batches=4 parallel.schedule=gpipe model.n_embd=64 parallel.zero=2 train.eval_every=6 checkpoint.every=6|-
resume-z2|2|train.steps=30 parallel.zero=2 checkpoint.resume=auto|ddp2@step_20
resume-3d|8|train.steps=8 parallel.tensor=2 parallel.pipeline=2 parallel.micro_batches=2 model.n_embd=64 parallel.zero=3 train.eval_every=4 checkpoint.resume=auto|d2t2p2@step_4
EOF
}

record() {
    local dir=$1 dtrain=${2:-$here/build/dtrain}
    [ -x "$dtrain" ] || { echo "metrics-identity: no dtrain binary at $dtrain (run make)" >&2; exit 2; }
    mkdir -p "$dir"
    local name nproc ov from
    while IFS='|' read -r name nproc ov from; do
        local out=$dir/$name
        rm -rf "$out"
        mkdir -p "$out"
        if [ "$from" != "-" ]; then
            local src=${from%@*} step=${from#*@}
            [ -d "$dir/$src/run/checkpoints/$step" ] ||
                { echo "metrics-identity: $name needs $src's $step" >&2; exit 1; }
            mkdir -p "$out/run/checkpoints"
            cp -r "$dir/$src/run/checkpoints/$step" "$out/run/checkpoints/"
        fi
        # shellcheck disable=SC2086
        if ! timeout 300 "$dtrain" --nproc-per-node="$nproc" "$cfg" "${common[@]}" $ov \
                job.output_dir="$out/run" >"$out/log" 2>&1; then
            echo "metrics-identity: job $name failed; its log: $out/log" >&2
            tail -20 "$out/log" >&2
            exit 1
        fi
        cp "$out/run/metrics.jsonl" "$out/metrics.jsonl"
        local last
        last=$(ls -d "$out"/run/checkpoints/step_* 2>/dev/null | sort -t_ -k2 -n | tail -1)
        : >"$out/ckpt"
        if [ -n "$last" ]; then
            (cd "$last" && sha256sum model.safetensors optim.safetensors) >>"$out/ckpt"
            python3 -c 'import json,sys; s=json.load(open(sys.argv[1]));
print(" ".join("%s=%r" % (k, s.get(k)) for k in ("step","epoch","sample_pos","samples_seen","loss")))' \
                "$last/state.json" >>"$out/ckpt"
        fi
        echo "metrics-identity: $name ($nproc worker$([ "$nproc" = 1 ] || echo s)): $(grep -c '"train"' "$out/metrics.jsonl") train records"
    done < <(jobs)
}

compare() {
    python3 - "$1" "$2" <<'EOF'
import json, os, sys
IGNORED = {"tokens_per_s", "samples_per_s", "step_time_s", "comm_time_s", "time", "max_rss_bytes",
           "run"}
before, after = sys.argv[1], sys.argv[2]
bad = 0
jobs = sorted(d for d in os.listdir(before) if os.path.isdir(os.path.join(before, d)))
if not jobs:
    print(f"metrics-identity: nothing recorded under {before}")
    sys.exit(2)
def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]
def diff(job, where, a, b):
    global bad
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in IGNORED:
                continue
            if k not in a or k not in b:
                bad += 1
                print(f"{job}: {where}: field {k} only {'after' if k in b else 'before'}")
                continue
            diff(job, f"{where}.{k}", a[k], b[k])
    elif type(a) != type(b) or a != b:
        bad += 1
        print(f"{job}: {where}: before {a!r}, after {b!r}")
fields = 0
for job in jobs:
    pa, pb = os.path.join(before, job), os.path.join(after, job)
    if not os.path.isdir(pb):
        bad += 1
        print(f"{job}: not in {after}")
        continue
    ra, rb = load(os.path.join(pa, "metrics.jsonl")), load(os.path.join(pb, "metrics.jsonl"))
    if len(ra) != len(rb):
        bad += 1
        print(f"{job}: {len(ra)} records before, {len(rb)} after")
    for i, (a, b) in enumerate(zip(ra, rb)):
        fields += sum(1 for k in a if k not in IGNORED)
        diff(job, f"record {i + 1} ({a.get('type')} step {a.get('step', '-')})", a, b)
    ca, cb = open(os.path.join(pa, "ckpt")).read(), open(os.path.join(pb, "ckpt")).read()
    if ca != cb:
        bad += 1
        print(f"{job}: last checkpoint differs:\n  before {ca.strip()}\n  after  {cb.strip()}")
print(f"metrics-identity: {len(jobs)} jobs, {fields} fields and {len(jobs)} checkpoints compared: "
      + ("identical" if not bad else f"{bad} differences"))
sys.exit(1 if bad else 0)
EOF
}

case ${1:-} in
record) [ $# -ge 2 ] || { echo "usage: $0 record DIR [DTRAIN]" >&2; exit 2; }; record "$2" "${3:-}" ;;
compare) [ $# -eq 3 ] || { echo "usage: $0 compare BEFORE AFTER" >&2; exit 2; }; compare "$2" "$3" ;;
check)
    [ $# -ge 2 ] || { echo "usage: $0 check BEFORE [DTRAIN]" >&2; exit 2; }
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/metrics-identity.XXXXXX")
    record "$tmp" "${3:-}"
    rc=0
    compare "$2" "$tmp" || rc=$?
    [ "$rc" = 0 ] && rm -rf "$tmp" || echo "metrics-identity: this run's record kept in $tmp"
    exit "$rc" ;;
jobs) jobs | cut -d'|' -f1,2,3 | tr '|' '\t' ;;
*) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
