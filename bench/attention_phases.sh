#!/usr/bin/env bash
# Where one launch of the tensor-core attention spends its time, block by block, on the GPU
# machine: builds attention_bench with -DCELLM_ATTENTION_PHASES=1 (thread 0 of every block
# stamps clock64 at entry, after its wait, after its tiles, after its stores and after the
# fold: kernels/attention_mma.h) into /tmp/cellm-phases, then runs it at SHAPES (default
# the one-row rows of the long bench row and a short one) with --budget 1280. Before each
# shape's timed line, one line of means over the blocks of a launch that ran alone (with
# the cluster fold, "count in" is every block's barriers and share of the merge).
#   bash bench/attention_phases.sh [SHAPES]   (carry .deps; ~2 minutes)
# Results under $OUT: attention_phases.txt.
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
shapes=${1:-1x192,1x1024,1x1152,1x1280,4x1152}
B=/tmp/cellm-phases
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
flags=-DCELLM_ATTENTION_PHASES=1
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" -DCELLM_BUILD_TESTS=OFF \
  -DCMAKE_CUDA_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >"$OUT/phases_configure.log" 2>&1 &&
  cmake --build $B -j "$(nproc)" --target attention_bench >"$OUT/phases_build.log" 2>&1 ||
  { grep -E "error" "$OUT/phases_build.log" | head -20; exit 1; }
for pass in 1 2; do
  echo "== pass $pass" | tee -a "$OUT/attention_phases.txt"
  timeout 60 $B/bench/attention_bench --shapes "$shapes" --budget 1280 --iters 50 2>&1 |
    tee -a "$OUT/attention_phases.txt" | grep -E "^ +[0-9]|phases:"
done
