#!/usr/bin/env bash
# One GPU visit for bench/sync_stream_bench.cu: builds it alone and runs its table (and a
# second, deeper ring). Carry `.deps`. Results under $OUT/sync_stream.txt.
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
B=/tmp/cellm-sync-stream
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCELLM_BUILD_TESTS=OFF "${prefix[@]}" \
  >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build $B -j "$(nproc)" --target sync_stream_bench >"$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/sync_stream.txt"
timeout 240 $B/bench/sync_stream_bench "$@" 2>&1 | tee -a "$OUT/sync_stream.txt"
