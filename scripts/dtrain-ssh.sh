#!/usr/bin/env bash
# dtrain-ssh.sh - start one dtrain agent per host over ssh, from a host list.
#
# Node ranks follow the list; the first host is node 0, which hosts the rendezvous store at
# --port. Every agent's output comes back here, prefixed with its host, and is saved to
# <log dir>/<host>.log. If this script dies (Ctrl-C, SIGTERM, even SIGKILL), every remote agent
# is sent SIGTERM: each ssh session's stdin is a pipe only this script holds open, and the
# remote side watches it.
set -u

usage() {
    cat <<'EOF'
usage: dtrain-ssh.sh (--hosts H1,H2,... | --hostfile FILE) [options] [--] DTRAIN_ARGS...

Starts `dtrain --nnodes N --node-rank K --master-addr FIRST_HOST --master-port PORT DTRAIN_ARGS`
on each of the N hosts over ssh (K = the host's position in the list, from 0) and waits for
all of them. DTRAIN_ARGS is what you would give dtrain on one node: JOB.ini [overrides], or
launcher options and `-- COMMAND`.

  --hosts LIST         comma-separated host names (user@host works)
  --hostfile FILE      one host per line; blank lines and # comments are skipped
  --port P             port of the rendezvous store on the first host (default 29500)
  --endpoint ADDR      address the other hosts use to reach the first one (default: its name
                       as listed, without user@)
  --dtrain PATH        dtrain on the remote hosts (default: dtrain)
  --workdir DIR        remote working directory (default: this directory)
  --log-dir DIR        where <host>.log files go here (default: dtrain-ssh-logs)
  --ssh CMD            ssh command (default: $DTRAIN_SSH or "ssh"; -o BatchMode=yes is added)
  -h, --help           this help

Exit code: 0 when every agent exited 0; 255 when ssh itself failed for a host (its sshd refused
the login, or the host cannot be reached: said at once, and the other agents are stopped); else
node 0's exit code if it failed, else the first failing host's.

Examples:
  scripts/dtrain-ssh.sh --hosts gpu1,gpu2 -- --nproc-per-node=8 configs/gpt2.ini
  scripts/dtrain-ssh.sh --hostfile hosts.txt --port 29600 -- --nproc-per-node=gpu -- python3 train.py
EOF
}

hosts=() port=29500 endpoint="" dtrain=dtrain workdir=$PWD logdir=dtrain-ssh-logs
ssh_cmd=${DTRAIN_SSH:-ssh}
add_hosts() { local IFS=,; for h in $1; do [ -n "$h" ] && hosts+=("$h"); done; }
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage; exit 0 ;;
    --hosts) add_hosts "${2:?--hosts needs a value}"; shift 2 ;;
    --hosts=*) add_hosts "${1#*=}"; shift ;;
    --hostfile | --hostfile=*)
        if [ "$1" = --hostfile ]; then f=${2:?--hostfile needs a file}; shift 2; else f=${1#*=}; shift; fi
        [ -r "$f" ] || { echo "dtrain-ssh.sh: cannot read host file $f" >&2; exit 2; }
        while read -r h _; do
            case "$h" in '' | '#'*) continue ;; esac
            hosts+=("$h")
        done <"$f" ;;
    --port) port=${2:?--port needs a value}; shift 2 ;;
    --port=*) port=${1#*=}; shift ;;
    --endpoint) endpoint=${2:?--endpoint needs a value}; shift 2 ;;
    --endpoint=*) endpoint=${1#*=}; shift ;;
    --dtrain) dtrain=${2:?--dtrain needs a value}; shift 2 ;;
    --dtrain=*) dtrain=${1#*=}; shift ;;
    --workdir) workdir=${2:?--workdir needs a value}; shift 2 ;;
    --workdir=*) workdir=${1#*=}; shift ;;
    --log-dir) logdir=${2:?--log-dir needs a value}; shift 2 ;;
    --log-dir=*) logdir=${1#*=}; shift ;;
    --ssh) ssh_cmd=${2:?--ssh needs a value}; shift 2 ;;
    --ssh=*) ssh_cmd=${1#*=}; shift ;;
    --) shift; break ;;
    *) break ;;
    esac
done
n=${#hosts[@]}
if [ "$n" -eq 0 ]; then
    echo "dtrain-ssh.sh: no hosts (give --hosts or --hostfile; see --help)" >&2
    exit 2
fi
if [ $# -eq 0 ]; then
    echo "dtrain-ssh.sh: nothing to run: give dtrain's arguments (a job file, or -- COMMAND)" >&2
    exit 2
fi
case "$port" in '' | *[!0-9]*) echo "dtrain-ssh.sh: --port must be a number" >&2; exit 2 ;; esac
first=${hosts[0]}
[ -n "$endpoint" ] || endpoint=${first#*@}
mkdir -p "$logdir" || exit 2

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-ssh.XXXXXX") || exit 2
mkfifo "$tmp/hold" || exit 2
exec 3<>"$tmp/hold" # the only writer: while this script lives, no remote agent sees EOF

# The remote side: run the agent, and SIGTERM it when our ssh session's stdin ends (this
# script died) or when the remote shell is told to stop.
# POSIX single quotes (the remote login shell may be any sh): ' becomes '\''.
quote() { local a out=""; for a in "$@"; do out+="'${a//\'/\'\\\'\'}' "; done; printf '%s' "$out"; }
remote_body='exec 3<&0
"$@" </dev/null &
pid=$!
( cat <&3 >/dev/null 2>&1; kill -TERM $pid 2>/dev/null ) >/dev/null 2>&1 &
trap "kill -TERM $pid 2>/dev/null" HUP INT TERM
while :; do wait $pid; rc=$?; kill -0 $pid 2>/dev/null || break; done
exit $rc'

pids=()
for ((k = 0; k < n; k++)); do
    h=${hosts[$k]}
    name=${h#*@}
    args=(--nnodes "$n" --node-rank "$k" --master-addr "$endpoint" --master-port "$port" "$@")
    remote="cd $(quote "$workdir")|| exit 2; sh -c $(quote "$remote_body") dtrain-ssh $(quote "$dtrain" "${args[@]}")"
    {
        exec 3>&- # only this script may hold the pipe's write end
        # shellcheck disable=SC2086 # ssh_cmd may carry options
        $ssh_cmd -o BatchMode=yes "$h" "$remote" <"$tmp/hold" 2>&1
        echo $? >"$tmp/rc.$k"
    } | tee "$logdir/$name.log" 3>&- | sed -u "s|^|$name: |" 3>&- &
    pids+=($!)
done
echo "dtrain-ssh.sh: $n agent(s) started; store at $endpoint:$port; logs in $logdir/" >&2

stopping=0
stop() {
    [ "$stopping" -eq 1 ] && return
    stopping=1
    echo "dtrain-ssh.sh: stopping the remote agents" >&2
    exec 3>&- # every remote watcher sees end of file and SIGTERMs its agent
}
trap stop INT TERM HUP

# Wait for every host, and say at once when ssh itself failed for one (exit 255: its sshd refused
# the login, the host is unreachable, the key is wrong): the other agents would otherwise wait
# for it until their join timeout. Their agents are stopped then.
said="" ssh_failed=0
while :; do
    running=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=1; done
    for ((k = 0; k < n; k++)); do
        case " $said " in *" $k "*) continue ;; esac
        [ -s "$tmp/rc.$k" ] || continue
        said="$said $k"
        if [ "$(cat "$tmp/rc.$k")" = 255 ] && [ "$stopping" -eq 0 ]; then
            h=${hosts[$k]}
            echo "dtrain-ssh.sh: cannot start the agent of node $k on $h: ssh failed (exit 255:" \
                 "the host refused the login or cannot be reached; ssh's message is above, after" \
                 "\"${h#*@}: \"); stopping the other agents" >&2
            ssh_failed=1
            stop
        fi
    done
    [ "$running" -eq 0 ] && break
    sleep 0.2
done

code=0
for ((k = 0; k < n; k++)); do
    rc=$(cat "$tmp/rc.$k" 2>/dev/null || echo 255)
    echo "dtrain-ssh.sh: node $k (${hosts[$k]}) exited $rc" >&2
    # Node 0 comes first: its code wins, else the first failing host's.
    if [ "$rc" -ne 0 ] && [ "$code" -eq 0 ]; then code=$rc; fi
done
[ "$ssh_failed" -eq 1 ] && code=255
rm -rf "$tmp"
exit "$code"
