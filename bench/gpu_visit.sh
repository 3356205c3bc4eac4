#!/usr/bin/env bash
# One visit to the GPU machine (see docs/PERFORMANCE.md): builds cellm for sm_90
# in /tmp, runs the `gpu` tests, compute-sanitizer memcheck on the executor
# tests, and `cellm bench --executor cuda` on the 1b and 8b presets. Logs go to
# $OUT. A `.deps` prefix (headers and static libraries copied from the Debian
# machine: gtest, nlohmann-json, pcre2) is used when present, for images that
# lack them; bench/make_gpu_deps.sh makes it. Carry `.deps` in the call.
#   bash bench/gpu_visit.sh [none|tests|micro|bench|all]   (none: build only; micro: kernel benches)
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
B=/tmp/cellm-build
prefix=()
if [ -d .deps ]; then
  prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
if ! cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" >"$OUT/configure.log" 2>&1; then
  tail -40 "$OUT/configure.log"; exit 1
fi
if ! cmake --build $B -j "$(nproc)" >"$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -40; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"

if [ "$what" = tests ] || [ "$what" = all ]; then
  ctest --test-dir $B -L gpu -j 4 --timeout 300 --output-on-failure >"$OUT/gpu_tests.log" 2>&1
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Subprocess aborted" "$OUT/gpu_tests.log" | head -40
  compute-sanitizer --tool memcheck --error-exitcode 9 \
    $B/tests/cuda/cuda_cuda_executor_test --gtest_filter='*mistral*:CudaExecutorTest.*' \
    >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"; tail -3 "$OUT/memcheck.log"
fi
if [ "$what" = micro ] || [ "$what" = all ]; then
  $B/bench/gemv_bench 2>&1 | tee "$OUT/gemv_bench.txt" | tail -40
  $B/bench/sample_bench --iters 200 2>&1 | tee "$OUT/sample_bench.txt" | tail -20
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for preset in 1b 8b; do
    timeout 200 $B/cellm bench --executor cuda --preset $preset -npp 128 -ntg 128 -npl 1,16,64,256 \
      --peak-bandwidth 4250 --step-times 2>&1 | tee "$OUT/bench_$preset.txt" | tail -7
  done
fi
