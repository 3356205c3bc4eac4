#!/usr/bin/env bash
# A short GPU visit that checks a build and records the numbers of
# docs/PERFORMANCE.md, most important first (each step writes under $OUT at
# once, so a visit cut short by its time limit still brings back what ran):
# build, every `gpu` test, memcheck on the attention, the bench rows of the
# issue (each twice: 8b, 1b, 8b long context, interleaved), then the kernel benches.
#   bash bench/final_visit.sh   (carry .deps)
set -uo pipefail
B=/tmp/cellm-build
# The results go in four files (gpu_tests.log, memcheck.log, bench.txt, micro.txt).
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
visit_build
visit_gpu_tests $B
# The bf16 attention cases run the tensor-core kernel (cp.async gathers through the table).
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/cuda/cuda_attention_test \
  --gtest_filter='AttentionTest/1.CapturedGraph*:AttentionTest/1.BatchOfOne*' >"$OUT/memcheck.log" 2>&1
echo "attention memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"
run_bench() {  # name, args...
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$OUT/bench.txt"
  timeout 150 $B/cellm bench --executor cuda --peak-bandwidth 4250 --step-times "$@" 2>&1 |
    tee -a "$OUT/bench.txt" | grep -E "^\| +[0-9]"
}
for run in 1 2; do
  run_bench "8b_run$run" --preset 8b -npp 128 -ntg 128 -npl 1,16,64,256
  run_bench "1b_run$run" --preset 1b -npp 128 -ntg 128 -npl 1,256
  run_bench "8b_long_run$run" --preset 8b -npp 1024 -ntg 256 -npl 1,128
done
timeout 60 $B/bench/attention_bench >>"$OUT/micro.txt" 2>&1
timeout 60 $B/bench/gemv_bench >>"$OUT/micro.txt" 2>&1
tail -50 "$OUT/micro.txt"
