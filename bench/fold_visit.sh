#!/usr/bin/env bash
# One GPU visit on bench/experiments/fold_loads_in_flight.patch (the attention fold
# loading 8 chunks' partials before their FMAs): builds main (`cellm` and attention_bench)
# and a patched copy of the tree (everything, tests included), runs every `gpu` test and
# memcheck on the attention with the patch, then attention_bench at one row of 192-1,280
# keys and the long one-row bench row on both, interleaved, PASSES times (default 2).
# Carry `.deps`; about 9 minutes.
#   bash bench/fold_visit.sh
# Results under $OUT: gpu_tests.log, memcheck.log, fold.txt.
set -uo pipefail
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
src=/tmp/cellm-fold-src
rm -rf $src && mkdir -p $src && cp -r . $src/
(cd $src && git apply bench/experiments/fold_loads_in_flight.patch) || { echo "the patch does not apply"; exit 1; }
build() {  # name, source dir, targets...
  local name=$1 dir=/tmp/cellm-v-$1 from=$2
  shift 2
  cmake -S "$from" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" >"$OUT/configure_$name.log" 2>&1 &&
    cmake --build "$dir" -j "$(nproc)" "$@" >"$OUT/build_$name.log" 2>&1 ||
    { grep -E "error" "$OUT/build_$name.log" | head -30; exit 1; }
}
t0=$(date +%s)
build fold $src
build main . --target cellm attention_bench
echo "builds: $(( $(date +%s) - t0 )) s"
F=/tmp/cellm-v-fold
visit_gpu_tests $F
# The folds: every chunk edge at one row, rows of different chunk counts (both paths).
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $F/tests/cuda/cuda_attention_test \
  --gtest_filter='AttentionTest/*.BatchOfOne*:AttentionTest/*.RowsWithDifferentChunkCounts*' \
  >"$OUT/memcheck.log" 2>&1
echo "attention memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"
for pass in $(seq "${PASSES:-2}"); do
  for v in fold main; do
    echo "== pass $pass $v attention_bench" | tee -a "$OUT/fold.txt"
    timeout 60 /tmp/cellm-v-$v/bench/attention_bench --shapes 1x192,1x1024,1x1152,1x1280,4x1152 \
      --budget 1280 --iters 50 2>&1 | tee -a "$OUT/fold.txt" | grep -E "^ +[0-9]"
    bench_row /tmp/cellm-v-$v/cellm "pass $pass $v long" "long:--preset 8b -npp 1024 -ntg 256 -npl 1" \
      "$OUT/fold.txt"
  done
done
