#!/usr/bin/env bash
# Variants of one kernel source on the device, each a sed script applied to a copy:
# copies the tree to /tmp/kv, builds `cellm` once into /tmp/kvb (carry .deps), then for
# each "LABEL=SED" rewrites the copy's FILE, rebuilds (only that file and the link) and
# runs `cellm bench` for each "NAME:ARGS" row of ROWS (bench_row.sh's form).
#   FILE=src/cuda/kernels/decode_layers.cu ROWS="1b:--preset 1b -npl 1 --persistent-decode" \
#     bash bench/experiments/kernel_variants.sh "main=" "r2=s/kPreRounds = 4/kPreRounds = 2/"
# An empty SED builds the file unchanged; a SED of the form @PATH builds PATH in the file's
# place (e.g. the file as it was before a patch applied to the copy). Rows go to
# $OUT/variants.txt; a variant whose sed changes nothing is reported and skipped.
set -euo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
file=${FILE:-src/cuda/kernels/decode_layers.cu}
rows=${ROWS:-"1b:--preset 1b -npl 1 --persistent-decode"}
rm -rf /tmp/kv && cp -r . /tmp/kv && rm -rf /tmp/kv/build
cd /tmp/kv
. bench/bench_row.sh
cp "$file" /tmp/kv-original
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
cmake -S . -B /tmp/kvb -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" -DCELLM_BUILD_TESTS=OFF \
  >/tmp/kvb.log 2>&1
for v in "$@"; do
  label=${v%%=*}
  script=${v#*=}
  cp /tmp/kv-original "$file"
  if [[ $script == @* ]]; then
    cp "${script#@}" "$file"
  elif [ -n "$script" ]; then
    sed -i "$script" "$file"
    if cmp -s /tmp/kv-original "$file"; then echo "== $label: the sed changed nothing, skipped"; continue; fi
  fi
  cmake --build /tmp/kvb -j "$(nproc)" --target cellm >>/tmp/kvb.log 2>&1 ||
    { echo "== $label: build failed"; tail -20 /tmp/kvb.log; continue; }
  IFS=';' read -ra list <<<"$rows"
  for row in "${list[@]}"; do bench_row /tmp/kvb/cellm "$label ${row%%:*}" "$row" "$OUT/variants.txt"; done
done
