#!/usr/bin/env bash
# Where a decode step's time goes inside its CUDA graph, kernel by kernel, on the GPU
# machine (after bench/gpu_visit.sh has built /tmp/cellm-build): runs one `cellm bench` row
# with bench/kernel_trace.cpp injected (CUPTI records every kernel's start and end, kernels
# of graphs included, overlapped by programmatic launch as in any replay, unlike under
# ncu), then bench/timeline_summary.py prints the last whole decode step: each kernel's
# start, duration and the time it adds to the step's span, and the span by kernel family.
#   bash bench/timeline_decode.sh NAME "BENCH ARGS" [NAME "BENCH ARGS"]...
# e.g. bash bench/timeline_decode.sh 1b1 "--preset 1b -npp 128 -ntg 32 -npl 1"
# PREFILL=1 summarises each prefill step by kernel family instead (timeline_summary.py
# --prefill), e.g. PREFILL=1 bash bench/timeline_decode.sh pp1024 "--preset 8b -npp 1024
# -ntg 2 -npl 1".
# Results under $OUT: timeline_NAME.txt (and the bench's output, bench_NAME.log).
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
B=/tmp/cellm-build
[ -f $B/bench/libkernel_trace.so ] || { echo "no $B/bench/libkernel_trace.so (CUPTI?)"; exit 1; }
while [ $# -ge 2 ]; do
  name=$1 args=$2
  shift 2
  trace=/tmp/kernel_trace_$name.csv
  # shellcheck disable=SC2086
  CUDA_INJECTION64_PATH=$B/bench/libkernel_trace.so CELLM_KERNEL_TRACE=$trace timeout 300 \
    $B/cellm bench --executor cuda --peak-bandwidth 4250 --step-times $args \
    >"$OUT/bench_$name.log" 2>&1 || { tail -5 "$OUT/bench_$name.log"; continue; }
  python3 "$(dirname "$0")/timeline_summary.py" ${PREFILL:+--prefill} "$trace" \
    >"$OUT/timeline_$name.txt" 2>&1
  echo "== $name ($args)"
  grep -E "^\| +[0-9]" "$OUT/bench_$name.log"
  if [ -n "${PREFILL:-}" ]; then
    cat "$OUT/timeline_$name.txt"
  else
    head -1 "$OUT/timeline_$name.txt"
    sed -n '/^by family/,$p' "$OUT/timeline_$name.txt"
  fi
done
