#!/bin/sh
# install-deps.sh - installs what dtrain needs to build on Debian: a C compiler and make
# (build-essential), pkg-config, the libraries it builds against, and etcd (etcd-server: the
# etcd rendezvous backend's tests start a three-member cluster on 127.0.0.1).
# Run by `make deps`, and by `make`, `make test` and `make run` when a pkg-config check fails;
# on a fresh machine run it directly first, as root (`scripts/install-deps.sh` in a root shell,
# or `sudo scripts/install-deps.sh` where sudo exists; minimal Debian has no sudo): make itself
# may be missing. As root it installs with apt-get (no sudo needed); otherwise it prints the
# exact command (with sudo when sudo is installed, else for a root shell) and fails.
set -eu
libs="libuv1-dev libcjson-dev libinih-dev libopenblas-dev libcurl4-openssl-dev"
pkgs="build-essential pkg-config $libs etcd-server"
case "${1:-}" in
    -h|--help)
        echo "usage: scripts/install-deps.sh   (installs: $pkgs)"
        exit 0 ;;
esac
missing=""
# Tools count as present when they run (however they were installed); libraries by package.
{ command -v make >/dev/null 2>&1 && { command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1; }; } ||
    missing=" build-essential"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
command -v etcd >/dev/null 2>&1 || missing="$missing etcd-server"
for p in $libs; do
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
# shellcheck disable=SC2086
apt-get install -y -qq $missing || { echo "install-deps: apt-get install$missing failed" >&2; exit 1; }
echo "install-deps: installed:$missing"
