#!/bin/sh
# run.sh - builds the frame-parser fuzz target with clang's libFuzzer (plus ASan and UBSan) and
# runs it, seeded with tests/fuzz/corpus/ (hand-written seeds from make_corpus.py, plus found-*
# files: a merged, deduplicated set the fuzzer found). New inputs go to build/fuzz/corpus/; crashes to
# build/fuzz/. Not part of `make` or `make test` (which replay the committed corpus instead);
# `make fuzz` runs it for FUZZ_SECONDS (10).
# Usage: tests/fuzz/run.sh [SECONDS (60)] [extra libFuzzer flags...]
set -eu
cd "$(dirname "$0")/../.."
secs=${1:-60}
[ $# -gt 0 ] && shift
CC=${FUZZ_CC:-clang}
# Without clang or its libFuzzer runtime: an error, or (DT_FUZZ_SKIP_OK=1, as `make fuzz` sets)
# a visible skip.
skip() {
    if [ "${DT_FUZZ_SKIP_OK:-0}" = 1 ]; then
        echo "fuzz: SKIPPED: $1 (apt-get install clang)"; exit 0
    fi
    echo "run.sh: $1 (apt-get install clang)" >&2; exit 1
}
command -v "$CC" >/dev/null || skip "$CC not found"
mkdir -p build/fuzz
probe=build/fuzz/probe.c
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
    'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' \
    > "$probe"
"$CC" -fsanitize=fuzzer "$probe" -o build/fuzz/probe >/dev/null 2>&1 ||
    skip "$CC cannot build a libFuzzer target (-fsanitize=fuzzer)"
rm -f "$probe" build/fuzz/probe
mkdir -p build/fuzz/corpus
"$CC" -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined tests/fuzz/fuzz_frame.c rendezvous/protocol.c \
    -o build/fuzz/fuzz_frame
exec build/fuzz/fuzz_frame -max_total_time="$secs" -max_len=8192 -artifact_prefix=build/fuzz/ \
    "$@" build/fuzz/corpus tests/fuzz/corpus
