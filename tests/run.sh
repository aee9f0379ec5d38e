#!/bin/sh
# run.sh - runs every test binary under BUILD/tests (each isolates its own tests with a timeout)
# and prints one summary line for the whole suite. `make test` calls it.
# Usage: tests/run.sh [BUILD_DIR] [name filters passed to every binary...]
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
passed=0 failed=0 skipped=0 broken=""
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "== $name"
    "$t" "$@" >"$log" 2>&1
    rc=$?
    cat "$log"
    line=$(grep -E "^$name: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped" "$log" | tail -n 1)
    if [ -z "$line" ]; then
        broken="$broken $name(rc=$rc)"
        failed=$((failed + 1))
        continue
    fi
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1/')
    f=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\2/')
    s=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\3/')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        broken="$broken $name(rc=$rc)"
        failed=$((failed + 1))
    fi
done
[ -n "$broken" ] && echo "test binaries that failed outside a test:$broken"
echo "TOTAL: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
