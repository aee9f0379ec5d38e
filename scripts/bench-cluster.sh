#!/usr/bin/env bash
# bench-cluster.sh - dtrain's benches across the hosts of a simulated cluster (sim-cluster.sh):
# the figures of docs/cluster.md. Root needed (namespaces); one cluster per run, removed after.
#
#   scripts/bench-cluster.sh allreduce HOSTS RATE TRANSPORT [bench allreduce options...]
#   scripts/bench-cluster.sh train HOSTS RATE JOB.ini [overrides...]
#
# HOSTS hosts with 2 ranks each (DTRAIN_BENCH_NPROC to change), each host's link shaped to RATE
# (none, 1gbit, 10gbit, ...). allreduce: `dtrain bench allreduce --transport TRANSPORT` (auto:
# shared memory in a host and a TCP ring between hosts; tcp: one flat TCP ring over all ranks),
# rank 0's table on stdout, with --link RATE added so the summary gives busbw / link rate.
# train: the built-in trainer on the job; rank 0's last metrics record (tokens/s, step and
# communication time) on stdout. HOSTS=1 runs on one host (no link between ranks).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
sim=$here/scripts/sim-cluster.sh
dtrain=${DTRAIN:-$here/build/dtrain}
nproc=${DTRAIN_BENCH_NPROC:-2}
what=${1:-}
case "$what" in allreduce | train) ;; *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 2 ;;
esac
hosts=${2:?HOSTS}
rate=${3:?RATE}
shift 3
name=bc$$
work=$(mktemp -d /var/tmp/bench-cluster.XXXXXX)
trap '"$sim" down --name "$name" >/dev/null 2>&1; rm -rf "$work"' EXIT
if [ "$rate" = none ]; then
    "$sim" up "$hosts" --name "$name" >/dev/null
else
    "$sim" up "$hosts" --rate "$rate" --name "$name" >/dev/null
fi
addr0=$("$sim" hosts --name "$name" | awk '$1 == "h0" { print $2 }')
if [ "$what" = allreduce ]; then
    transport=${1:?TRANSPORT}
    shift
    args=(-- "$dtrain" bench allreduce --transport "$transport" "$@")
    [ "$rate" = none ] || args+=(--link "$rate")
else
    args=("$@" "job.output_dir=$work/run")
fi
cd "$here"
"$sim" exec --name "$name" h0 "$dtrain" --nnodes "$hosts" --node-rank 0 --master-addr "$addr0" \
    --master-port 0 --nproc-per-node "$nproc" "${args[@]}" >"$work/n0.out" 2>&1 &
port=""
[ "$hosts" -gt 1 ] || port=none
for _ in $(seq 100); do
    [ "$hosts" -gt 1 ] || break
    port=$(grep -o "rendezvous store at [0-9.]*:[0-9]*" "$work/n0.out" | sed 's/.*://' || true)
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || { cat "$work/n0.out" >&2; echo "bench-cluster.sh: node 0 did not start" >&2; exit 1; }
for ((k = 1; k < hosts; k++)); do
    "$sim" exec --name "$name" "h$k" "$dtrain" --nnodes "$hosts" --node-rank "$k" \
        --master-addr "$addr0" --master-port "$port" --nproc-per-node "$nproc" "${args[@]}" \
        >"$work/n$k.out" 2>&1 &
done
rc=0
wait || rc=$?
for ((k = 0; k < hosts; k++)); do
    if grep -q "ERROR" "$work/n$k.out"; then
        grep "ERROR" "$work/n$k.out" | head -5 >&2
        rc=1
    fi
done
echo "# bench-cluster.sh: $hosts host(s) x $nproc ranks, links: $rate"
if [ "$what" = allreduce ]; then
    grep -v " INFO\| WARN\|^dtrain" "$work/n0.out" | sed 's/^\[0\]://'
else
    # Means over the train records after the first quarter (warm-up): tokens (or samples) per
    # second, step time, and the time a step waited for its communication (comm_time_s).
    awk 'function num(k,   m) { if (match($0, "\"" k "\": *[-0-9.eE+]+")) { m = substr($0, RSTART, RLENGTH);
            sub(/^[^:]*: */, "", m); return m + 0 } return -1 }
         /"type": *"train"/ { n++; tp[n] = num("tokens_per_s"); if (tp[n] < 0) tp[n] = num("samples_per_s");
            st[n] = num("step_time_s"); ct[n] = num("comm_time_s") }
         END { if (n == 0) { print "# no train records"; exit 1 }
            for (i = int(n / 4) + 1; i <= n; i++) { k++; a += tp[i]; b += st[i]; c += ct[i] }
            printf "items/s %.0f  step %.1f ms  comm wait %.1f ms  (%.1f%% of the step)  over %d steps\n",
                   a / k, 1e3 * b / k, 1e3 * c / k, 100 * c / b, k }' "$work/run/metrics.jsonl"
fi
exit "$rc"
