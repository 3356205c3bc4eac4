#!/usr/bin/env bash
# One GPU visit on a change that `cellm bench` can switch off with one flag: builds the
# tree (bench/gpu_visit.sh none, /tmp/cellm-build), runs every `gpu` test (TESTS=0 skips
# them) and memcheck on MEMCHECK_FILTER of cuda_attention_test when set, then, PASSES
# times (default 2), attention_bench at ATTN_SHAPES with and without ATTN_FLAG (when both
# are set; --budget 1280) and each bench row with and without FLAG, interleaved.
#   bash bench/flag_visit.sh FLAG "NAME:BENCH ARGS" ...   (carry .deps; ~6-8 minutes)
# e.g. ATTN_SHAPES=1x192,1x1152 ATTN_FLAG=--no-cluster-fold bash bench/flag_visit.sh \
#   --no-cluster-fold "long:--preset 8b -npp 1024 -ntg 256 -npl 1"
# Rows run as bench/bench_row.sh says. Results under $OUT: gpu_tests.log, flag.txt.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash bench/flag_visit.sh FLAG [\"NAME:BENCH ARGS\"]..."; exit 2; }
flag=$1
shift
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
B=/tmp/cellm-build
t0=$(date +%s)
visit_build
echo "build: $(( $(date +%s) - t0 )) s"
visit_gpu_tests
if [ -n "${MEMCHECK_FILTER:-}" ]; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    $B/tests/cuda/cuda_attention_test --gtest_filter="$MEMCHECK_FILTER" >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"
  tail -2 "$OUT/memcheck.log"
fi
for pass in $(seq "${PASSES:-2}"); do
  if [ -n "${ATTN_SHAPES:-}" ] && [ -n "${ATTN_FLAG:-}" ]; then
    for extra in "" "$ATTN_FLAG"; do
      echo "== pass $pass attention_bench ${extra:-(default)}" | tee -a "$OUT/flag.txt"
      # shellcheck disable=SC2086
      timeout 60 $B/bench/attention_bench --shapes "$ATTN_SHAPES" --budget 1280 --iters 50 \
        $extra 2>&1 | tee -a "$OUT/flag.txt" | grep -E "^ +[0-9]"
    done
  fi
  for row in "$@"; do
    bench_row $B/cellm "pass $pass ${row%%:*} default" "$row" "$OUT/flag.txt"
    bench_row $B/cellm "pass $pass ${row%%:*} $flag" "$row $flag" "$OUT/flag.txt"
  done
done
echo "total: $(( $(date +%s) - t0 )) s"
