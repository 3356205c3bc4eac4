#!/usr/bin/env bash
# What the persistent one-row kernel's weight ring streams on its own, on the device:
# copies the tree to /tmp/rs, builds `cellm` once into /tmp/rsb (carry .deps), then for
# each variant rewrites the copy's decode_layers.cu (ring_stream_edit.py), rebuilds and
# runs `cellm bench --persistent-decode` at one row for each preset.
#   bash bench/experiments/ring_stream.sh "MODE [STAGE_BYTES [STAGES]]" ...
# (default: "0" "1" "2" "1 8192 24" "1 32768"; modes in ring_stream_edit.py). Appends
# the bench rows to $OUT/ring_stream.txt.
set -euo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
rm -rf /tmp/rs && cp -r . /tmp/rs && rm -rf /tmp/rs/build
cd /tmp/rs
kernel=src/cuda/kernels/decode_layers.cu
cp "$kernel" /tmp/rs-kernel.cu
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
cmake -S . -B /tmp/rsb -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" -DCELLM_BUILD_TESTS=OFF \
  >/tmp/rsb.log 2>&1
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=("0" "1" "2" "1 8192 24" "1 32768")
for v in "${variants[@]}"; do
  cp /tmp/rs-kernel.cu "$kernel"
  # shellcheck disable=SC2086
  python3 bench/experiments/ring_stream_edit.py "$kernel" $v
  cmake --build /tmp/rsb -j "$(nproc)" --target cellm >>/tmp/rsb.log 2>&1 ||
    { tail -20 /tmp/rsb.log; exit 1; }
  for preset in ${PRESETS:-1b 8b}; do
    echo "== mode $v, $preset" | tee -a "$OUT/ring_stream.txt"
    timeout 300 /tmp/rsb/cellm bench --executor cuda --preset "$preset" -npp 128 -ntg 128 -npl 1 \
      --peak-bandwidth 4250 --step-times --persistent-decode 2>&1 |
      grep -E "^\| +[0-9]" | tee -a "$OUT/ring_stream.txt"
  done
done
