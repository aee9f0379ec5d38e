#!/bin/sh
# run.sh - builds the frame-parser fuzz target with clang's libFuzzer (plus ASan and UBSan) and
# runs it, seeded with tests/fuzz/corpus/ (hand-written seeds from make_corpus.py, plus found-*
# files: a merged, deduplicated set the fuzzer found). New inputs go to build/fuzz/corpus/; crashes to
# build/fuzz/. Not part of `make` or `make test` (which replay the committed corpus instead).
# Usage: tests/fuzz/run.sh [SECONDS (60)] [extra libFuzzer flags...]
set -eu
cd "$(dirname "$0")/../.."
secs=${1:-60}
[ $# -gt 0 ] && shift
CC=${FUZZ_CC:-clang}
command -v "$CC" >/dev/null || { echo "run.sh: $CC not found (apt-get install clang)" >&2; exit 1; }
mkdir -p build/fuzz/corpus
"$CC" -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined tests/fuzz/fuzz_frame.c rendezvous/protocol.c \
    -o build/fuzz/fuzz_frame
exec build/fuzz/fuzz_frame -max_total_time="$secs" -max_len=8192 -artifact_prefix=build/fuzz/ \
    "$@" build/fuzz/corpus tests/fuzz/corpus
