#!/usr/bin/env bash
# sim-cluster.sh - a cluster of N hosts on one Linux machine, out of namespaces (root needed).
#
# Each host is a network namespace (its own loopback and one address on a private /24), a UTS
# namespace (its own host name) and a mount namespace (its own /dev/shm and /tmp, and an
# /etc/hosts that names every host of the cluster). The hosts' links meet on a bridge that lives
# in a namespace of its own (the "switch"): it is connected to nothing outside, the hosts have no
# default route, and the machine's own network namespace gets no interface and no route, so the
# hosts can reach each other and nothing else. A link can be shaped (tc tbf, both directions) and
# cut: a cut puts the host's port on the switch into the disabled state, so frames vanish in both
# directions and nothing is reset or signalled (the host's interface stays up with carrier, as
# when a switch further along dies), which is the partition TCP only notices by timeouts.
#
# Nothing leaks: `down` removes the namespaces (with every interface in them), the processes in
# them and the state; `up` also starts a watcher that runs `down` when the process that brought
# the cluster up (its parent, or --owner PID) ends, even by SIGKILL. Clusters with different
# --name live side by side (default name: sim).
#
# Hard-won notes (issue #32): enter hosts with nsenter and the namespace files, not
# `ip netns exec`, which remounts /sys and hides /sys/fs/cgroup (slurmd needs it); a persistent
# mount namespace must be bind-mounted on a private mount, hence the private bind of the state
# root; tc here has tbf and htb but no netem and no tc actions (so no "drop" filter: the bridge
# port state is the cut).
set -u

usage() {
    cat <<'EOF'
usage: sim-cluster.sh up N [--rate RATE] [--name NAME] [--owner PID]
       sim-cluster.sh exec [--name NAME] HOST CMD...
       sim-cluster.sh link [--name NAME] HOST down|up
       sim-cluster.sh rate [--name NAME] HOST RATE|none
       sim-cluster.sh hosts [--name NAME]
       sim-cluster.sh down [--name NAME]
       sim-cluster.sh list

  up      N hosts h0..h(N-1); prints "HOST ADDRESS" per host on stdout, nothing else.
          --rate shapes every host's link (both directions) to RATE (tc units: 100mbit, 1gbit,
          10gbit). The cluster is removed when the owner process ends (default: this script's
          parent; --owner 0 keeps it until `down`).
  exec    runs CMD inside HOST (its network, host name and mounts), in the current directory
          (which must exist there: /tmp is the host's own) with the current environment.
  link    cuts (down) or restores (up) HOST's link: packets vanish, nothing is reset.
  rate    shapes HOST's link to RATE (none: unshaped).
  hosts   prints "HOST ADDRESS" per host of a running cluster.
  down    removes the cluster: processes in its hosts, namespaces, links, state.
  list    names of the clusters that exist.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), ip (iproute2), tc, nsenter and unshare.
EOF
}

die() { echo "sim-cluster.sh: $*" >&2; exit 1; }
say() { echo "sim-cluster.sh: $*" >&2; }

RUN_ROOT=${SIM_CLUSTER_ROOT:-/run/sim-cluster}

# ---- names -------------------------------------------------------------------------------------

check_name() {
    case "$1" in
    '' | *[!A-Za-z0-9_]* | [!A-Za-z]*) die "--name $1: use letters, digits and _ (starting with a letter)" ;;
    esac
    [ ${#1} -le 10 ] || die "--name $1: at most 10 characters (namespace and interface names)"
}
state_dir() { echo "$RUN_ROOT/$1"; }
netns_of() { echo "$1-$2"; }   # cluster, host -> network namespace name (/run/netns/...)
switch_of() { echo "$1-sw"; }
# The /24 of a cluster: 10.77.X.0 with X from the name, so that two clusters' addresses differ
# in logs (they could not collide anyway: each bridge is its own segment, routed nowhere).
subnet_of() {
    local sum
    sum=$(printf '%s' "$1" | cksum | cut -d' ' -f1)
    echo "10.77.$((sum % 250 + 1))"
}

host_index() {
    local name=$1 h=$2 n
    n=$(wc -l <"$(state_dir "$name")/hosts")
    case "$h" in
    h[0-9] | h[0-9][0-9]) [ "${h#h}" -lt "$n" ] || die "no host $h in cluster $name (hosts h0..h$((n - 1)))" ;;
    *) die "no host $h in cluster $name (hosts are h0..h$((n - 1)))" ;;
    esac
    echo "${h#h}"
}

require_cluster() {
    [ -f "$(state_dir "$1")/hosts" ] || die "no cluster named $1 (start one: sim-cluster.sh up N --name $1)"
}

check_rate() {
    case "$1" in
    none) ;;
    [0-9]*[kmgt]bit | [0-9]*bit | [0-9]*[kmgt]bps) ;;
    *) die "rate $1: give a tc rate such as 100mbit, 1gbit or 10gbit (or none)" ;;
    esac
}

# ---- shaping -------------------------------------------------------------------------------------

# shape NETNS DEV RATE: tbf on DEV's egress (none: remove it). The bucket holds 2 ms at the rate
# (at least 256 KiB: veth hands tbf 64 KiB GSO segments) so that TCP's bursts pass at line rate;
# packets queue at most 20 ms before they are dropped, as a switch buffer would.
shape() {
    local ns=$1 dev=$2 rate=$3
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    [ "$rate" = none ] && return 0
    local bits
    bits=$(echo "$rate" | awk '{ v = $0 + 0; u = $0; sub(/^[0-9.]+/, "", u);
        m = 1; if (u ~ /^k/) m = 1e3; else if (u ~ /^m/) m = 1e6; else if (u ~ /^g/) m = 1e9; else if (u ~ /^t/) m = 1e12;
        if (u ~ /bps$/) m *= 8; printf "%.0f", v * m }')
    local burst=$((bits / 8 / 500))
    [ "$burst" -ge 262144 ] || burst=262144
    tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms ||
        die "tc tbf rate $rate on $dev in $ns failed"
}

# ---- up / down -----------------------------------------------------------------------------------

# The state root is bind-mounted on itself and made private: a mount namespace can only be
# kept (bind-mounted to a file) on a mount that does not propagate.
prepare_root() {
    mkdir -p "$RUN_ROOT" || die "cannot create $RUN_ROOT"
    (
        flock 9
        if ! mountpoint -q "$RUN_ROOT"; then
            mount --bind "$RUN_ROOT" "$RUN_ROOT" || exit 1
        fi
        mount --make-private "$RUN_ROOT" || exit 1
    ) 9>"$RUN_ROOT/.lock" || die "cannot make $RUN_ROOT a private mount (need root with CAP_SYS_ADMIN)"
}

# Kills every process inside the cluster's hosts (found by their network namespace), first
# politely, then with SIGKILL, and waits until none is left (at most about 5 s).
kill_inside() {
    local name=$1 dir tries pids ns
    dir=$(state_dir "$name")
    for tries in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25; do
        pids=""
        for ns in "$dir"/netns.*; do
            [ -e "$ns" ] || continue
            pids="$pids $(ip netns pids "$(cat "$ns")" 2>/dev/null)"
        done
        pids=$(echo $pids)
        [ -n "$pids" ] || return 0
        if [ "$tries" -le 4 ]; then
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null
        else
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null
        fi
        sleep 0.2
    done
    say "cluster $name: processes still inside: $pids"
}

do_down() {
    local name=$1 dir wpid ns f
    dir=$(state_dir "$name")
    [ -d "$dir" ] || { say "no cluster named $name"; return 0; }
    exec 8>"$dir/.lock"
    flock 8
    if [ -f "$dir/watcher.pid" ] && [ "${SIM_CLUSTER_WATCHER:-}" != "$name" ]; then
        wpid=$(cat "$dir/watcher.pid")
        kill -TERM "$wpid" 2>/dev/null
    fi
    kill_inside "$name"
    for ns in "$dir"/netns.*; do
        [ -e "$ns" ] || continue
        ip netns del "$(cat "$ns")" 2>/dev/null
        rm -f "$ns"
    done
    for f in "$dir"/*.uts "$dir"/*.mnt; do
        [ -e "$f" ] || continue
        umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null
        rm -f "$f"
    done
    rm -rf "$dir"
    exec 8>&-
    say "cluster $name: down"
}

# Start time of a process (clock ticks since boot), so that a pid reused by another process is
# not taken for the owner.
proc_start() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null; }

watch_owner() {
    local name=$1 owner=$2 start=$3 dir
    dir=$(state_dir "$name")
    trap 'exit 0' TERM
    while [ -d "$dir" ] && [ "$(proc_start "$owner")" = "$start" ]; do
        sleep 0.3
    done
    [ -d "$dir" ] || exit 0
    SIM_CLUSTER_WATCHER=$name do_down "$name" 2>/dev/null
}

do_up() {
    local n=$1 rate=$2 name=$3 owner=$4 dir sub sw k ns addr
    dir=$(state_dir "$name")
    [ "$(id -u)" -eq 0 ] || die "needs root (network, UTS and mount namespaces)"
    for t in ip tc nsenter unshare flock mountpoint; do
        command -v "$t" >/dev/null 2>&1 || die "needs $t (iproute2, util-linux)"
    done
    [ -e "$dir" ] && die "cluster $name exists already (sim-cluster.sh down --name $name, or pick another --name)"
    prepare_root
    mkdir -p "$dir" || die "cannot create $dir"
    trap 'say "up failed; removing what was made"; do_down "$name"; exit 1' ERR
    set -E
    sub=$(subnet_of "$name")
    sw=$(switch_of "$name")
    echo "$sw" >"$dir/netns.sw"
    ip netns add "$sw" || false
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge stp_state 0 forward_delay 0
    ip -n "$sw" link set br0 up
    : >"$dir/hosts"
    {
        echo "127.0.0.1 localhost"
        for ((k = 0; k < n; k++)); do echo "$sub.$((k + 1)) h$k"; done
    } >"$dir/etc-hosts"
    for ((k = 0; k < n; k++)); do
        ns=$(netns_of "$name" "h$k")
        addr="$sub.$((k + 1))"
        echo "$ns" >"$dir/netns.h$k"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip link add "h$k" netns "$sw" type veth peer name eth0 netns "$ns"
        ip -n "$sw" link set "h$k" master br0
        ip -n "$sw" link set "h$k" up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        if [ "$rate" != none ]; then
            shape "$ns" eth0 "$rate"
            shape "$sw" "h$k" "$rate"
        fi
        # Host name and mounts: a UTS and a mount namespace kept in files, entered by exec.
        touch "$dir/h$k.uts" "$dir/h$k.mnt"
        unshare --uts="$dir/h$k.uts" --mount="$dir/h$k.mnt" --propagation slave \
            sh -c 'hostname "$1" && mount -t tmpfs -o mode=1777,size=50% tmpfs /dev/shm &&
                   mount -t tmpfs -o mode=1777,size=25% tmpfs /tmp &&
                   mount --bind "$2" /etc/hosts' sim "h$k" "$dir/etc-hosts"
        echo "h$k $addr" >>"$dir/hosts"
        echo "$rate" >"$dir/rate.h$k"
    done
    trap - ERR
    set +E
    if [ "$owner" != 0 ]; then
        local start
        start=$(proc_start "$owner")
        [ -n "$start" ] || { do_down "$name"; die "--owner $owner: no such process"; }
        setsid "$0" __watch "$name" "$owner" "$start" </dev/null >/dev/null 2>&1 &
        echo $! >"$dir/watcher.pid"
    fi
    cat "$dir/hosts"
}

# ---- exec / link / rate --------------------------------------------------------------------------

do_exec() {
    local name=$1 h=$2 k dir
    shift 2
    require_cluster "$name"
    k=$(host_index "$name" "$h") || exit 1
    dir=$(state_dir "$name")
    [ $# -gt 0 ] || die "exec $h: no command given"
    exec nsenter --net="/run/netns/$(cat "$dir/netns.h$k")" --uts="$dir/h$k.uts" \
        --mount="$dir/h$k.mnt" --wd="$PWD" -- "$@"
}

do_link() {
    local name=$1 h=$2 what=$3 k dir
    require_cluster "$name"
    k=$(host_index "$name" "$h") || exit 1
    dir=$(state_dir "$name")
    case "$what" in
    down) bridge -n "$(cat "$dir/netns.sw")" link set dev "h$k" state 0 || die "link $h down failed" ;;
    up) bridge -n "$(cat "$dir/netns.sw")" link set dev "h$k" state 3 || die "link $h up failed" ;;
    *) die "link $h $what: say down or up" ;;
    esac
}

do_rate() {
    local name=$1 h=$2 rate=$3 k dir
    require_cluster "$name"
    check_rate "$rate"
    k=$(host_index "$name" "$h") || exit 1
    dir=$(state_dir "$name")
    shape "$(cat "$dir/netns.h$k")" eth0 "$rate"
    shape "$(cat "$dir/netns.sw")" "h$k" "$rate"
    echo "$rate" >"$dir/rate.h$k"
}

# ---- command line --------------------------------------------------------------------------------

cmd=${1:-}
[ $# -gt 0 ] && shift
name=sim
case "$cmd" in
-h | --help | help) usage; exit 0 ;;
'') usage >&2; exit 2 ;;
__watch) watch_owner "$@"; exit 0 ;;
up)
    n="" rate=none owner=$PPID
    while [ $# -gt 0 ]; do
        case "$1" in
        --rate) rate=${2:?--rate needs a value}; shift 2 ;;
        --rate=*) rate=${1#*=}; shift ;;
        --name) name=${2:?--name needs a value}; shift 2 ;;
        --name=*) name=${1#*=}; shift ;;
        --owner) owner=${2:?--owner needs a pid}; shift 2 ;;
        --owner=*) owner=${1#*=}; shift ;;
        [0-9]*) n=$1; shift ;;
        *) echo "sim-cluster.sh up: unknown argument $1 (see --help)" >&2; exit 2 ;;
        esac
    done
    case "$n" in '' | *[!0-9]*) echo "sim-cluster.sh up: give the number of hosts (1-99)" >&2; exit 2 ;; esac
    [ "$n" -ge 1 ] && [ "$n" -le 99 ] || { echo "sim-cluster.sh up: 1 to 99 hosts" >&2; exit 2; }
    case "$owner" in *[!0-9]*) echo "sim-cluster.sh up: --owner takes a pid (0: none)" >&2; exit 2 ;; esac
    check_name "$name"
    check_rate "$rate"
    do_up "$n" "$rate" "$name" "$owner"
    ;;
exec | link | rate | hosts | down)
    while [ $# -gt 0 ]; do
        case "$1" in
        --name) name=${2:?--name needs a value}; shift 2 ;;
        --name=*) name=${1#*=}; shift ;;
        *) break ;;
        esac
    done
    check_name "$name"
    case "$cmd" in
    exec) [ $# -ge 1 ] || die "exec: give a host and a command"; do_exec "$name" "$@" ;;
    link) [ $# -eq 2 ] || die "link: give a host and down|up"; do_link "$name" "$1" "$2" ;;
    rate) [ $# -eq 2 ] || die "rate: give a host and a rate"; do_rate "$name" "$1" "$2" ;;
    hosts) require_cluster "$name"; cat "$(state_dir "$name")/hosts" ;;
    down) [ $# -eq 0 ] || die "down: unexpected $1"; do_down "$name" ;;
    esac
    ;;
list) [ -d "$RUN_ROOT" ] && for d in "$RUN_ROOT"/*/; do [ -f "$d/hosts" ] && basename "$d"; done; exit 0 ;;
*) echo "sim-cluster.sh: unknown command $cmd (see --help)" >&2; exit 2 ;;
esac
