#!/usr/bin/env bash
# dtrain-retry.sh - re-launch a failed job until it finishes or a limit is hit.
#
# The agent's --max-restarts covers failures the agent survives (a worker crashing); this wrapper
# covers the ones it does not: the whole job exiting non-zero (budget spent, a node lost, the
# store host gone, preemption). Each try resumes from the job's latest checkpoint when the job
# file says `resume = auto` (the default). Usage errors (exit 2) are never retried.
set -u

usage() {
    cat <<'EOF'
usage: dtrain-retry.sh [--max-tries N] [--delay S] [--max-delay S] [--no-retry-on CODES] [--]
                       COMMAND [ARGS...]

Runs COMMAND (typically `dtrain ... JOB.ini` or `scripts/dtrain-ssh.sh ...`) until it exits 0
or N tries are used, waiting between tries (doubling each time, up to --max-delay).

  --max-tries N        tries in all, the first included; 0 = no limit (default 3)
  --delay S            seconds before the second try (default 10)
  --max-delay S        longest wait between tries (default 300)
  --no-retry-on CODES  comma-separated exit codes that end the loop at once (default 2: a usage
                       or job-file error, which a retry cannot fix)
  -h, --help           this help

Each try sees DTRAIN_RETRY_TRY (1, 2, ...) in its environment. SIGINT, SIGTERM and SIGHUP are
passed on to the running try and stop the loop. Exit code: 0 when a try succeeded, else the
last try's exit code (128+N when it was stopped by signal N).
EOF
}

max_tries=3 delay=10 max_delay=300 no_retry=2
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage; exit 0 ;;
    --max-tries) max_tries=${2:?--max-tries needs a value}; shift 2 ;;
    --max-tries=*) max_tries=${1#*=}; shift ;;
    --delay) delay=${2:?--delay needs a value}; shift 2 ;;
    --delay=*) delay=${1#*=}; shift ;;
    --max-delay) max_delay=${2:?--max-delay needs a value}; shift 2 ;;
    --max-delay=*) max_delay=${1#*=}; shift ;;
    --no-retry-on) no_retry=${2?--no-retry-on needs a value}; shift 2 ;;
    --no-retry-on=*) no_retry=${1#*=}; shift ;;
    --) shift; break ;;
    -*) echo "dtrain-retry.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
    esac
done
if [ $# -eq 0 ]; then
    echo "dtrain-retry.sh: no command given (see --help)" >&2
    exit 2
fi
case "$max_tries" in '' | *[!0-9]*) echo "dtrain-retry.sh: --max-tries must be a number" >&2; exit 2 ;; esac

# Job control: each try runs in its own process group, so a terminal's Ctrl-C reaches this
# script only, which passes it on exactly once (a second Ctrl-C, passed on too, makes the agent
# kill its workers at once).
set -m
stop=0 child=0
forward() {
    stop=1
    if [ "$child" -gt 0 ]; then kill -s "$1" "$child" 2>/dev/null; fi
}
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward HUP' HUP

try=1 rc=0 wait_s=$delay
while :; do
    of=""
    [ "$max_tries" -ne 0 ] && of=" of $max_tries"
    echo "dtrain-retry.sh: try $try$of: $*" >&2
    DTRAIN_RETRY_TRY=$try "$@" </dev/null &
    child=$!
    # wait returns early when a trapped signal arrives; wait again until the try has ended.
    while :; do
        wait "$child"
        rc=$?
        kill -0 "$child" 2>/dev/null || break
    done
    child=0
    if [ "$rc" -eq 0 ]; then
        echo "dtrain-retry.sh: try $try succeeded" >&2
        exit 0
    fi
    if [ "$stop" -eq 1 ]; then
        echo "dtrain-retry.sh: stopped by a signal during try $try (exit $rc); not retrying" >&2
        exit "$rc"
    fi
    case ",$no_retry," in
    *",$rc,"*)
        echo "dtrain-retry.sh: try $try exited $rc, which is not retried (--no-retry-on $no_retry)" >&2
        exit "$rc" ;;
    esac
    if [ "$max_tries" -ne 0 ] && [ "$try" -ge "$max_tries" ]; then
        echo "dtrain-retry.sh: try $try exited $rc; no tries left (--max-tries $max_tries)" >&2
        exit "$rc"
    fi
    echo "dtrain-retry.sh: try $try exited $rc; trying again in ${wait_s}s" >&2
    sleep "$wait_s" &
    child=$!
    wait "$child" 2>/dev/null
    child=0
    if [ "$stop" -eq 1 ]; then
        echo "dtrain-retry.sh: stopped by a signal; not retrying" >&2
        exit "$rc"
    fi
    try=$((try + 1))
    wait_s=$(awk -v d="$wait_s" -v m="$max_delay" 'BEGIN { d *= 2; print (d > m ? m : d) }')
done
