#!/usr/bin/env bash
# One GPU visit on an experiment kept as a patch (`git diff > bench/experiments/X.patch`,
# then the tree put back): builds main (`cellm` and attention_bench) and a copy of the
# tree with the patch applied (everything, tests included), runs every `gpu` test on the
# patched build (TESTS=0 skips them), then, interleaved PASSES times (default 2),
# attention_bench at ATTN_SHAPES (when set; --budget 1280) and each bench row on both.
#   bash bench/patch_visit.sh PATCH "NAME:BENCH ARGS" ...   (carry .deps; ~6-9 minutes)
# e.g. ATTN_SHAPES=1x192,1x1152,1x1280 bash bench/patch_visit.sh \
#   bench/experiments/attention_merge_stride.patch "long:--preset 8b -npp 1024 -ntg 256 -npl 1"
# Rows run as bench/bench_row.sh says. Results under $OUT: gpu_tests.log, patch.txt.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash bench/patch_visit.sh PATCH [\"NAME:BENCH ARGS\"]..."; exit 2; }
patch=$1
shift
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
src=/tmp/cellm-patch-src
rm -rf $src && mkdir -p $src && cp -r . $src/
(cd $src && git apply "$patch") || { echo "$patch does not apply"; exit 1; }
build() {  # name, source dir, targets...
  local name=$1 dir=/tmp/cellm-v-$1 from=$2
  shift 2
  cmake -S "$from" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" >"$OUT/configure_$name.log" 2>&1 &&
    cmake --build "$dir" -j "$(nproc)" "$@" >"$OUT/build_$name.log" 2>&1 ||
    { grep -E "error" "$OUT/build_$name.log" | head -30; exit 1; }
}
t0=$(date +%s)
build patched $src
build main . --target cellm attention_bench
echo "builds: $(( $(date +%s) - t0 )) s"
visit_gpu_tests /tmp/cellm-v-patched
for pass in $(seq "${PASSES:-2}"); do
  for v in patched main; do
    if [ -n "${ATTN_SHAPES:-}" ]; then
      echo "== pass $pass $v attention_bench" | tee -a "$OUT/patch.txt"
      timeout 60 /tmp/cellm-v-$v/bench/attention_bench --shapes "$ATTN_SHAPES" --budget 1280 \
        --iters 50 2>&1 | tee -a "$OUT/patch.txt" | grep -E "^ +[0-9]"
    fi
    for row in "$@"; do
      bench_row /tmp/cellm-v-$v/cellm "pass $pass ${row%%:*} $v" "$row" "$OUT/patch.txt"
    done
  done
done
