#!/bin/sh
# update-readme-keys.sh - regenerates README.md's job file reference from the key table in
# runtime/job/config.c (through `dtrain --help-config`), between the keys:begin/keys:end markers.
# tests/test_config.c fails when the two differ.
set -eu
case "${1:-}" in -h|--help) echo "usage: scripts/update-readme-keys.sh  (after make)"; exit 0;; esac
cd "$(dirname "$0")/.."
bin=${DTRAIN_BIN:-build/dtrain}
[ -x "$bin" ] || { echo "update-readme-keys: $bin not built; run make first" >&2; exit 1; }
ref=$(mktemp)
trap 'rm -f "$ref" README.md.tmp' EXIT
"$bin" --help-config > "$ref"
awk -v ref="$ref" '
    /<!-- keys:begin -->/ { print; while ((getline line < ref) > 0) print line; skip = 1; next }
    /<!-- keys:end -->/   { skip = 0 }
    !skip { print }
' README.md > README.md.tmp
mv README.md.tmp README.md
echo "update-readme-keys: README.md reference regenerated ($(grep -c '^| `' "$ref") keys)"
