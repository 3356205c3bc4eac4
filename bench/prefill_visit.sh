#!/usr/bin/env bash
# One GPU visit on where a single prompt's prefill spends its time: builds cellm (no `gpu`
# tests unless TESTS=1), runs one-row prefills of the 8B and the 1B with a fresh executor
# per row (a repeated prompt length shows what the second executor of the process still
# pays), with CUDA's lazy module loading and without (CUDA_MODULE_LOADING=EAGER), then
# records every kernel of one 128-token prefill with bench/kernel_trace.cpp.
#   bash bench/prefill_visit.sh   (carry .deps; ~5 minutes)
# Results under $OUT: prefill.txt (rows), trace_pp128.csv.gz (start_ns, end_ns, stream,
# graph_node, name of every kernel of the process).
set -uo pipefail
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
TESTS=${TESTS:-0}
visit_build
visit_gpu_tests
C=/tmp/cellm-build/cellm
for loading in LAZY EAGER; do
  for row in "8b:--preset 8b -npp 128,512,128,1024,128 -ntg 4 -npl 1" \
    "1b:--preset 1b -npp 128,128 -ntg 4 -npl 1" "8b4:--preset 8b -npp 128,128 -ntg 4 -npl 4"; do
    bench_row $C "$loading ${row%%:*}" "${row%%:*}:CUDA_MODULE_LOADING=$loading ${row#*:}" \
      "$OUT/prefill.txt"
  done
done
trace=/tmp/trace_pp128.csv
CUDA_INJECTION64_PATH=/tmp/cellm-build/bench/libkernel_trace.so CELLM_KERNEL_TRACE=$trace \
  timeout 200 $C bench --executor cuda --preset 8b -npp 128,128 -ntg 2 -npl 1 --step-times \
  >"$OUT/trace_bench.log" 2>&1
tail -12 "$OUT/trace_bench.log"
gzip -c $trace >"$OUT/trace_pp128.csv.gz"
ls -la "$OUT"
