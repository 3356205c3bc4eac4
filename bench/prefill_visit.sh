#!/usr/bin/env bash
# One GPU visit on a single prompt's prefill: builds cellm, runs every `gpu` test (TESTS=0
# skips them), then one-row prefills of the 8B and the 1B with a fresh executor per row,
# with the prefill GEMMs' warm-up (the default) and without it (--no-prefill-warm: each
# cuBLASLt kernel then loads at the first prefill that meets it, ~3.5 ms each).
#   bash bench/prefill_visit.sh   (carry .deps; ~6 minutes)
# Results under $OUT: prefill.txt (rows and startup notes), gpu_tests.log.
set -uo pipefail
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
visit_build
visit_gpu_tests
C=/tmp/cellm-build/cellm
for row in "8b:--preset 8b -npp 128,512,128,1024 -ntg 4 -npl 1" \
  "8b4:--preset 8b -npp 128 -ntg 4 -npl 4" "1b:--preset 1b -npp 128 -ntg 4 -npl 1"; do
  for warm in "" "--no-prefill-warm"; do
    bench_row $C "${row%%:*} $warm" "${row%%:*}:${row#*:} $warm" "$OUT/prefill.txt"
    grep "^startup" "$OUT/prefill.txt" | tail -1 | grep -oE "B=[0-9]+ [0-9.]+ s, [0-9]+ prefill GEMM kernels warmed"
  done
done
