#!/bin/sh
# update-keys-doc.sh - regenerates docs/keys.md's job file reference from the key table in
# runtime/job/config.c (through `dtrain --help-config`), between the keys:begin/keys:end markers.
# tests/test_config.c fails when the two differ.
set -eu
case "${1:-}" in -h|--help) echo "usage: scripts/update-keys-doc.sh  (after make)"; exit 0;; esac
cd "$(dirname "$0")/.."
bin=${DTRAIN_BIN:-build/dtrain}
doc=docs/keys.md
[ -x "$bin" ] || { echo "update-keys-doc: $bin not built; run make first" >&2; exit 1; }
ref=$(mktemp)
trap 'rm -f "$ref" "$doc.tmp"' EXIT
"$bin" --help-config > "$ref"
awk -v ref="$ref" '
    /<!-- keys:begin -->/ { print; while ((getline line < ref) > 0) print line; skip = 1; next }
    /<!-- keys:end -->/   { skip = 0 }
    !skip { print }
' "$doc" > "$doc.tmp"
mv "$doc.tmp" "$doc"
echo "update-keys-doc: $doc reference regenerated ($(grep -c '^| `' "$ref") keys)"
