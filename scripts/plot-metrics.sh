#!/bin/sh
# plot-metrics.sh - turns a run's metrics.jsonl into a PNG: training and validation loss against
# the step (top), throughput against the step (bottom). Uses gnuplot; installs Debian's
# gnuplot-nox with apt-get when it is missing and this runs as root, else prints the command.
set -eu

usage() {
    cat <<'EOF'
usage: scripts/plot-metrics.sh [-o OUT.png] [--title TEXT] [--print] METRICS.jsonl | RUN_DIR

Plots a dtrain run: training loss and validation loss against the step, and tokens/s
(or samples/s) against the step, into one PNG.

  METRICS.jsonl   the file rank 0 writes, <job.output_dir>/metrics.jsonl (or the run
                  directory that holds it)
  -o OUT.png      output file (default: next to the metrics, metrics.png)
  --title TEXT    plot title (default: the run directory's name)
  --print         print what would be plotted ("train STEP LOSS RATE", "eval STEP
                  VAL_LOSS", by step) instead of plotting; needs no gnuplot
  -h, --help      this text

Needs gnuplot (Debian: gnuplot-nox); installed with apt-get when missing and run as root.
metrics.jsonl is appended to: by restarts (the same run, "attempt" counts them) and by
fresh starts into the same output directory (a new "run" id). Only the last run is
plotted, and of each of its steps the last record (a restart that resumed from an older
checkpoint trains some steps again). Records without a run id (older dtrain) count as one
run.
EOF
}

out="" title="" in="" print=0
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage; exit 0 ;;
    -o) [ $# -ge 2 ] || { echo "plot-metrics: -o needs a file name" >&2; exit 2; }
        out=$2; shift 2 ;;
    -o*) out=${1#-o}; shift ;;
    --title) [ $# -ge 2 ] || { echo "plot-metrics: --title needs text" >&2; exit 2; }
        title=$2; shift 2 ;;
    --title=*) title=${1#--title=}; shift ;;
    --print) print=1; shift ;;
    -*) echo "plot-metrics: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$in" ] || { echo "plot-metrics: one metrics file at a time" >&2; exit 2; }
        in=$1; shift ;;
    esac
done
[ -n "$in" ] || { usage >&2; exit 2; }
[ -d "$in" ] && in="$in/metrics.jsonl"
[ -r "$in" ] || { echo "plot-metrics: cannot read $in" >&2; exit 1; }
dir=$(dirname "$in")
[ -n "$out" ] || out="$dir/metrics.png"
[ -n "$title" ] || title=$(basename "$(cd "$dir" && pwd)")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# Pull "key":value pairs out of each JSON line (dtrain writes flat objects, numbers unquoted,
# the run id a string). Two passes: the last run id, then that run's records, the last of each
# step, in step order.
awk -v train="$tmp/train.dat" -v eval="$tmp/eval.dat" -v unit="$tmp/unit" '
function val(key,   i, s) {
    i = index($0, "\"" key "\":")
    if (!i) return ""
    s = substr($0, i + length(key) + 3)
    sub(/[,}].*/, "", s)
    gsub(/"/, "", s)
    return s
}
FNR == NR { if (/"type":/) last = val("run"); next }
val("run") != last { next }
/"type":"train"/ {
    r = val("tokens_per_s"); u = "tokens/s"
    if (r == "") { r = val("samples_per_s"); u = "samples/s" }
    s = val("step") + 0; tr[s] = s " " val("loss") " " r; if (s > maxs) maxs = s
    print u > unit
}
/"type":"eval"/ { s = val("step") + 0; ev[s] = s " " val("val_loss"); if (s > maxs) maxs = s }
END {
    for (s = 0; s <= maxs; s++) {
        if (s in tr) print tr[s] > train
        if (s in ev) print ev[s] > eval
    }
}
' "$in" "$in"

[ -s "$tmp/train.dat" ] || { echo "plot-metrics: no training records in $in" >&2; exit 1; }
if [ "$print" = 1 ]; then
    sed 's/^/train /' "$tmp/train.dat"
    [ -s "$tmp/eval.dat" ] && sed 's/^/eval /' "$tmp/eval.dat"
    exit 0
fi

if ! command -v gnuplot >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "plot-metrics: installing gnuplot-nox" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >&2 ||
            { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >&2; } ||
            { echo "plot-metrics: could not install gnuplot-nox" >&2; exit 1; }
    else
        echo "plot-metrics: gnuplot is missing; install it with:" >&2
        echo "    sudo apt-get install gnuplot-nox" >&2
        exit 1
    fi
fi

unit=$(tail -n 1 "$tmp/unit")
[ -s "$tmp/eval.dat" ] && evalplot=", '$tmp/eval.dat' using 1:2 with linespoints lw 2 pt 7 title 'val loss'" || evalplot=""
term=png
gnuplot -e "set terminal" 2>&1 | grep -q pngcairo && term="pngcairo"

gnuplot <<EOF
set terminal $term size 1000,800
set output '$out'
set multiplot layout 2,1 title "$title"
set grid
set xlabel 'step'
set ylabel 'loss'
plot '$tmp/train.dat' using 1:2 with lines lw 2 title 'train loss'$evalplot
set ylabel '$unit'
set yrange [0:*]
plot '$tmp/train.dat' using 1:3 with lines lw 2 title '$unit'
unset multiplot
EOF
echo "plot-metrics: wrote $out"
