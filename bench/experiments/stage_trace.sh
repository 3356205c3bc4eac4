#!/usr/bin/env bash
# The persistent one-row kernel's stage trace on the device: copies the tree to
# /tmp/trace, adds the trace to its decode_layers.cu (stage_trace_edit.py), builds
# `cellm` into /tmp/tb (carry .deps) and runs `cellm bench --persistent-decode` at one
# row for each preset.
#   bash bench/experiments/stage_trace.sh [PRESET ...]     (default: 1b 8b)
# Prints (and appends to $OUT/trace.txt) the "dltrace" lines (when the blocks of layer 8
# of the 100th launch leave each stage's wait and finish it), the "dlwait" lines (cycles a
# block waits a layer, by product: the producer for free ring stages, consumer warp 0 for
# landed ones) and the bench row.
set -euo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
rm -rf /tmp/trace && cp -r . /tmp/trace && rm -rf /tmp/trace/build
cd /tmp/trace
python3 bench/experiments/stage_trace_edit.py src/cuda/kernels/decode_layers.cu
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
cmake -S . -B /tmp/tb -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" -DCELLM_BUILD_TESTS=OFF \
  >/tmp/tb.log 2>&1
cmake --build /tmp/tb -j "$(nproc)" --target cellm >>/tmp/tb.log 2>&1 || { tail -20 /tmp/tb.log; exit 1; }
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(1b 8b)
for preset in "${presets[@]}"; do
  echo "== $preset" | tee -a "$OUT/trace.txt"
  /tmp/tb/cellm bench --executor cuda --preset "$preset" -npp 128 -ntg 128 -npl 1 \
    --persistent-decode 2>&1 | grep -E "dltrace|dlwait|dlbusy|dlsync|^\| +[0-9]" | tee -a "$OUT/trace.txt"
done
