#!/bin/sh
# run.sh - runs every test binary under BUILD/tests (each isolates its own tests with a timeout,
# captures their output and shows it only for those that fail) and prints one line per binary,
# what failed in full, the reasons of the skipped tests, and one summary line that CI parses:
#
#   TOTAL: N passed, N failed, N skipped
#
# `make test` calls it. Usage: tests/run.sh [BUILD_DIR] [name filters passed to every binary...]
# DT_TEST_VERBOSE=1 shows every test's output as it runs. DT_TEST_ONLY="test_a test_b" runs only
# those binaries; DT_TEST_EXCEPT="test_c" runs all but those (`make test` leaves out the slow
# cluster tests, which `make test-cluster` runs).
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
passed=0 failed=0 skipped=0 broken="" skipnotes=""
log=$(mktemp)
trap 'rm -f "$log"' EXIT
now() { date +%s.%N 2>/dev/null || date +%s; }
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.so|*.d) continue ;; esac
    name=$(basename "$t")
    if [ -n "${DT_TEST_ONLY:-}" ]; then
        case " $DT_TEST_ONLY " in *" $name "*) ;; *) continue ;; esac
    fi
    case " ${DT_TEST_EXCEPT:-} " in *" $name "*) continue ;; esac
    t0=$(now)
    "$t" "$@" >"$log" 2>&1
    rc=$?
    secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    line=$(grep -E "^$name: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped" "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$name: FAILED outside its tests (exit code $rc, no summary line); its output:"
        tail -n 60 "$log" | sed 's/^/    /'
        broken="$broken $name(rc=$rc)"
        failed=$((failed + 1))
        continue
    fi
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1/')
    f=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\2/')
    s=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\3/')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$f" -gt 0 ] || [ "$rc" -ne 0 ]; then
        echo "$line ($secs s) <-- FAILED; its failing tests and what they wrote:"
        grep -v -E "^  (ok|skip) " "$log" | grep -v -E "^$name: " | sed 's/^/  /'
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            broken="$broken $name(rc=$rc)"
            failed=$((failed + 1))
        fi
    else
        echo "$line ($secs s)"
    fi
    if [ "$s" -gt 0 ]; then
        # "  skip NAME   REASON": one line per reason, with how many tests it skipped.
        notes=$(grep -E "^  skip " "$log" | sed -E 's/^  skip +[^ ]+ *//' | sort | uniq -c |
                awk -v n="$name" '{ c = $1; $1 = ""; sub(/^ /, ""); printf "  %s: %d skipped: %s\n", n, c, ($0 == "" ? "(no reason given)" : $0) }')
        skipnotes="$skipnotes$notes
"
    fi
done
[ -n "$broken" ] && echo "test binaries that failed outside a test:$broken"
if [ "$skipped" -gt 0 ]; then
    echo "SKIPPED: $skipped test(s), and why:"
    printf '%s' "$skipnotes"
fi
echo "TOTAL: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
