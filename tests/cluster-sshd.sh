#!/usr/bin/env bash
# cluster-sshd.sh - OpenSSH's sshd in every host of a simulated cluster (scripts/sim-cluster.sh),
# with keys made here, for tests/test_cluster_sched.c and for trying dtrain-ssh.sh by hand.
#
#   tests/cluster-sshd.sh up CLUSTER DIR [REFUSE_HOST...]
#
# DIR (seen by every host) gets a host key, a client key (DIR/id) and authorized_keys; each
# host's sshd listens on port 22 of its own address (its own network namespace: nothing else
# can hold the port) and lets root in with that key only. A REFUSE_HOST's sshd knows no key, so
# it refuses every login (Permission denied). Prints the ssh command to use:
#   ssh -i DIR/id -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no ...
# The daemons run inside the hosts: `sim-cluster.sh down` ends them.
set -eu
[ "${1:-}" = up ] || { echo "usage: cluster-sshd.sh up CLUSTER DIR [REFUSE_HOST...]" >&2; exit 2; }
cluster=${2:?cluster}
dir=${3:?directory}
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
sim=$here/scripts/sim-cluster.sh
sshd=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$sshd" ] && command -v ssh-keygen >/dev/null 2>&1 && command -v ssh >/dev/null 2>&1 || {
    echo "cluster-sshd.sh: sshd, ssh or ssh-keygen not found (install openssh-server: scripts/install-deps.sh)" >&2
    exit 3
}
mkdir -p "$dir" /run/sshd
chmod 700 "$dir"
[ -f "$dir/hostkey" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/hostkey"
[ -f "$dir/id" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/id"
cp "$dir/id.pub" "$dir/authorized_keys"
: >"$dir/no_keys"
chmod 600 "$dir/authorized_keys" "$dir/no_keys"
"$sim" hosts --name "$cluster" | while read -r h a; do
    keys=$dir/authorized_keys
    for r in "$@"; do [ "$r" = "$h" ] && keys=$dir/no_keys; done
    cat >"$dir/sshd-$h.conf" <<EOF
Port 22
ListenAddress $a
HostKey $dir/hostkey
PidFile $dir/sshd-$h.pid
AuthorizedKeysFile $keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
EOF
    "$sim" exec --name "$cluster" "$h" "$sshd" -D -e -f "$dir/sshd-$h.conf" \
        >"$dir/sshd-$h.log" 2>&1 </dev/null &
done
ssh_cmd="ssh -i $dir/id -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR -o ConnectTimeout=10"
# Ready when every sshd answers (a login on each allowed host, a refusal on the others).
for _ in $(seq 100); do
    ok=1
    while read -r h _; do
        "$sim" exec --name "$cluster" h0 $ssh_cmd -o BatchMode=yes "$h" true </dev/null >/dev/null 2>"$dir/probe.err" ||
            grep -q "Permission denied" "$dir/probe.err" || ok=0
    done < <("$sim" hosts --name "$cluster")
    [ "$ok" = 1 ] && { echo "$ssh_cmd"; exit 0; }
    sleep 0.1
done
echo "cluster-sshd.sh: sshd did not answer on every host:" >&2
cat "$dir"/sshd-*.log "$dir/probe.err" >&2
exit 1
