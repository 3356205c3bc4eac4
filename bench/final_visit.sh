#!/usr/bin/env bash
# A short GPU visit that checks a build and records the numbers of
# docs/PERFORMANCE.md, most important first (each step writes under $OUT at
# once, so a visit cut short by its time limit still brings back what ran):
# build, every `gpu` test, memcheck on the attention, the issue's bench rows (8b twice, 1b, 8b long
# context), then the GEMV bench.   bash bench/final_visit.sh
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
B=/tmp/cellm-build
bash "$(dirname "$0")/gpu_visit.sh" none >"$OUT/visit.log" 2>&1 || { tail -30 "$OUT/visit.log"; exit 1; }
ctest --test-dir $B -L gpu -j 8 --timeout 300 --output-on-failure >"$OUT/gpu_tests.log" 2>&1
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)" "$OUT/gpu_tests.log" | head -20
# The bf16 attention cases run the tensor-core kernel (cp.async gathers through the table).
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/cuda/cuda_attention_test \
  --gtest_filter='AttentionTest/1.CapturedGraph*:AttentionTest/1.BatchOfOne*' >"$OUT/memcheck.log" 2>&1
echo "attention memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"
run_bench() {  # name, args...
  local name=$1
  shift
  timeout 150 $B/cellm bench --executor cuda --peak-bandwidth 4250 --step-times "$@" \
    >"$OUT/bench_$name.txt" 2>&1
  echo "== $name: $*"
  grep -E "^\| +[0-9]" "$OUT/bench_$name.txt"
}
run_bench 8b_run1 --preset 8b -npp 128 -ntg 128 -npl 1,16,64,256
run_bench 1b --preset 1b -npp 128 -ntg 128 -npl 1,16,64,256
run_bench 8b_long --preset 8b -npp 1024 -ntg 256 -npl 1,128
run_bench 8b_run2 --preset 8b -npp 128 -ntg 128 -npl 1,16,64,256
timeout 60 $B/bench/attention_bench >"$OUT/attention_bench.txt" 2>&1 && tail -20 "$OUT/attention_bench.txt"
timeout 60 $B/bench/gemv_bench >"$OUT/gemv_bench.txt" 2>&1 && tail -6 "$OUT/gemv_bench.txt"
