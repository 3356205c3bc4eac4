#!/usr/bin/env bash
# One GPU visit on the step ahead (CudaExecutorOptions::overlap_decode): builds cellm for
# sm_90 (bench/gpu_visit.sh none), runs every `gpu` test, memcheck on the overlap test,
# then the one-row and B = 16 rows with the overlap and without (`--no-overlap`),
# interleaved, PASSES times (default 2); MEMCHECK=0 skips memcheck. Carry `.deps`; about 8
# minutes.
#   bash bench/overlap_visit.sh
# Results under $OUT: gpu_tests.log, memcheck.log, overlap.txt.
set -uo pipefail
B=/tmp/cellm-build
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
visit_build
if [ "${TESTS:-1}" != 0 ]; then
  visit_gpu_tests $B
  [ "${MEMCHECK:-1}" = 0 ] || timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
    $B/tests/cuda/cuda_overlap_decode_test --gtest_filter='*llama3*:*Teardown*' >"$OUT/memcheck.log" 2>&1
  [ "${MEMCHECK:-1}" = 0 ] ||
    echo "overlap memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"
fi
for pass in $(seq "${PASSES:-2}"); do
  for row in "1b:--preset 1b -npl 1" "8b:--preset 8b -npl 1,16"; do
    for v in overlap no-overlap; do
      extra=""
      [ $v = no-overlap ] && extra=" --no-overlap"
      bench_row $B/cellm "pass $pass ${row%%:*} $v" "$row$extra" "$OUT/overlap.txt"
    done
  done
done
