#!/bin/sh
# install-deps.sh - installs what dtrain needs to build on Debian: a C compiler and make
# (build-essential), pkg-config, the libraries it builds against, and etcd (etcd-server: the
# etcd rendezvous backend's tests start a three-member cluster on 127.0.0.1).
# With --cluster also what the simulated-cluster tests run inside their hosts (tests/
# test_cluster_*.c, `make test-cluster`, .ci/run): Slurm (slurm-wlm, munge) and OpenSSH's server
# (openssh-server), and gnuplot-nox (the plot test of scripts/plot-metrics.sh). The daemons are
# installed with a policy-rc.d that keeps Debian from starting them on this machine (the tests
# start their own, inside network namespaces).
# Run by `make deps`, and by `make`, `make test` and `make run` when a pkg-config check fails;
# on a fresh machine run it directly first, as root (`scripts/install-deps.sh` in a root shell,
# or `sudo scripts/install-deps.sh` where sudo exists; minimal Debian has no sudo): make itself
# may be missing. As root it installs with apt-get (no sudo needed); otherwise it prints the
# exact command (with sudo when sudo is installed, else for a root shell) and fails.
set -eu
libs="libuv1-dev libcjson-dev libinih-dev libopenblas-dev libcurl4-openssl-dev"
pkgs="build-essential pkg-config $libs etcd-server"
daemons="slurm-wlm munge openssh-server gnuplot-nox"
cluster=0
case "${1:-}" in
    -h|--help)
        echo "usage: scripts/install-deps.sh [--cluster]   (installs: $pkgs; --cluster also: $daemons)"
        exit 0 ;;
    --cluster) cluster=1; pkgs="$pkgs $daemons" ;;
    '') ;;
    *) echo "install-deps: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
missing=""
# Tools count as present when they run (however they were installed); libraries by package.
{ command -v make >/dev/null 2>&1 && { command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1; }; } ||
    missing=" build-essential"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
command -v etcd >/dev/null 2>&1 || missing="$missing etcd-server"
for p in $libs $([ "$cluster" -eq 1 ] && echo "$daemons"); do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "install-deps: all present:$(echo " $pkgs")"
    exit 0
fi
echo "install-deps: missing:$missing"
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        echo "install-deps: not root; run this, then make again:" >&2
        echo "    sudo apt-get update && sudo apt-get install -y$missing" >&2
    else
        echo "install-deps: not root (and no sudo here); as root (su -), run this, then make again:" >&2
        echo "    apt-get update && apt-get install -y$missing" >&2
    fi
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || { echo "install-deps: apt-get update failed" >&2; exit 1; }
policy=""
if [ "$cluster" -eq 1 ] && [ ! -e /usr/sbin/policy-rc.d ]; then
    # Daemons installed for the tests are not started here (exit 101: "action forbidden").
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" || policy=""
fi
# shellcheck disable=SC2086
apt-get install -y -qq $missing || {
    [ -n "$policy" ] && rm -f "$policy"
    echo "install-deps: apt-get install$missing failed" >&2
    exit 1
}
[ -n "$policy" ] && rm -f "$policy"
echo "install-deps: installed:$missing"
