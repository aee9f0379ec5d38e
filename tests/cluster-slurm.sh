#!/usr/bin/env bash
# cluster-slurm.sh - a real Slurm (Debian's slurm-wlm with munge) on a simulated cluster
# (scripts/sim-cluster.sh), for tests/test_cluster_sched.c and for trying Slurm by hand.
#
#   tests/cluster-slurm.sh up CLUSTER DIR [CPUS]   munged, slurmctld in h0, slurmd in every host
#   tests/cluster-slurm.sh env DIR                 prints SLURM_CONF=... (for eval)
#
# Everything lives in DIR (a directory every host sees: not /tmp, which is each host's own):
# slurm.conf, the munge key and socket, state, spool (SlurmdSpoolDir=DIR/spool/%n), pid files
# (-%n), logs. The daemons run inside the cluster's hosts, so `sim-cluster.sh down` ends them.
# What is known to work here (issue #32): one munged for all hosts (its socket is a path every
# host's mount namespace sees), slurmctld in h0, `slurmd -N <host>` in each host with NodeAddr
# its address, proctrack/linuxproc and task/none (no cgroup plugins), and hosts entered with
# nsenter (sim-cluster.sh exec), which keeps /sys/fs/cgroup visible to slurmd.
set -eu

cmd=${1:-}
case "$cmd" in
up)
    cluster=${2:?cluster name}
    dir=${3:?directory}
    cpus=${4:-$(nproc)}
    ;;
env)
    echo "SLURM_CONF=${2:?directory}/slurm.conf"
    exit 0
    ;;
*)
    echo "usage: cluster-slurm.sh up CLUSTER DIR [CPUS] | env DIR" >&2
    exit 2
    ;;
esac

here=$(cd "$(dirname "$0")/.." && pwd)
sim=$here/scripts/sim-cluster.sh
for t in munged slurmctld slurmd sbatch srun scontrol sinfo; do
    command -v "$t" >/dev/null 2>&1 || {
        echo "cluster-slurm.sh: $t not found (install slurm-wlm and munge: scripts/install-deps.sh)" >&2
        exit 3
    }
done
mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
chmod 700 "$dir/munge"
# munged checks its key (a file only its user reads) and its socket directory.
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
hosts=$("$sim" hosts --name "$cluster")
n=$(echo "$hosts" | wc -l)
addr0=$(echo "$hosts" | awk '$1 == "h0" { print $2 }')
{
    echo "ClusterName=sim$cluster"
    echo "SlurmctldHost=h0($addr0)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    # A requeued job is held for cred_expire (+1 s): the last run's credentials stay revoked
    # that long, and a run started sooner is killed ("Job credential revoked"). 10 s, not 120.
    echo "AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "MpiDefault=none"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "ReturnToService=2"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=30"
    echo "InactiveLimit=0"
    echo "KillWait=10"
    echo "MinJobAge=300"
    echo "SlurmctldParameters=idle_on_node_suspend"
    echo "$hosts" | while read -r h a; do
        echo "NodeName=$h NodeAddr=$a CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=sim Nodes=h[0-$((n - 1))] Default=YES MaxTime=INFINITE State=UP"
} >"$dir/slurm.conf"
export SLURM_CONF=$dir/slurm.conf

run_in() { # host, log, command...: a daemon in a host, in the background
    local h=$1 log=$2
    shift 2
    "$sim" exec --name "$cluster" "$h" "$@" >"$log" 2>&1 </dev/null &
}
run_in h0 "$dir/log/munged.out" munged -F --force --key-file="$dir/munge/munge.key" \
    --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed"
for _ in $(seq 100); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$dir/munge/munge.socket" ] || { echo "cluster-slurm.sh: munged did not start:" >&2; cat "$dir/log/munged.out" "$dir/log/munged.log" >&2 2>/dev/null; exit 1; }
run_in h0 "$dir/log/slurmctld.out" slurmctld -D -i -f "$SLURM_CONF"
echo "$hosts" | while read -r h _; do
    mkdir -p "$dir/spool/$h"
    run_in "$h" "$dir/log/slurmd-$h.out" slurmd -D -N "$h" -f "$SLURM_CONF"
done
# Ready when every node is idle (sinfo from h0, which reaches slurmctld).
for _ in $(seq 300); do
    idle=$("$sim" exec --name "$cluster" h0 sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle" { c++ } END { print c + 0 }')
    [ "$idle" -eq "$n" ] && { echo "SLURM_CONF=$SLURM_CONF"; exit 0; }
    sleep 0.1
done
echo "cluster-slurm.sh: the nodes did not come up idle within 30 s:" >&2
"$sim" exec --name "$cluster" h0 sinfo -N >&2 || true
tail -n 20 "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log >&2 2>/dev/null || true
exit 1
