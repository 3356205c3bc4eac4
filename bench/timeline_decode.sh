#!/usr/bin/env bash
# Where a decode step's time goes inside its CUDA graph, kernel by kernel, on the GPU
# machine (after bench/gpu_visit.sh has built /tmp/cellm-build): runs one `cellm bench` row
# under Nsight Systems with graph node tracing (kernels run as in any replay, overlapped by
# programmatic launch, unlike under ncu), then bench/timeline_summary.py prints the last
# whole decode step: each kernel's start, duration and the time it adds to the step's
# span, and the span split by kernel family.
#   bash bench/timeline_decode.sh NAME "BENCH ARGS"...   (results in $OUT/timeline_NAME.txt)
# e.g. bash bench/timeline_decode.sh 1b1 "--preset 1b -npp 128 -ntg 32 -npl 1"
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
CELLM=/tmp/cellm-build/tools/cellm/cellm
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "nsys not found"; exit 1; }
while [ $# -ge 2 ]; do
  name=$1 args=$2
  shift 2
  rep=/tmp/timeline_$name
  # shellcheck disable=SC2086
  timeout 300 "$NSYS" profile -o "$rep" --force-overwrite true -t cuda --sample none \
    --cpuctxsw none --cuda-graph-trace node "$CELLM" bench --executor cuda $args \
    >"$OUT/nsys_$name.log" 2>&1 || { tail -5 "$OUT/nsys_$name.log"; continue; }
  "$NSYS" export --type sqlite --force-overwrite true -o "$rep.sqlite" "$rep.nsys-rep" \
    >>"$OUT/nsys_$name.log" 2>&1
  python3 "$(dirname "$0")/timeline_summary.py" "$rep.sqlite" >"$OUT/timeline_$name.txt" 2>&1
  echo "== $name ($args)"
  grep -A40 "^by family" "$OUT/timeline_$name.txt"
done
