#!/usr/bin/env bash
# One GPU visit on the decode attention's K/V gather (docs/PERFORMANCE.md, session 14):
# builds kv_read_bench and attention_bench only, times them at SHAPE, then counts what
# the L2 and the DRAM see for each under ncu. Carry `.deps`.
#   bash bench/kv_read_visit.sh [ROWS CONTEXT]        (default 128 1152: the long B = 128 row)
# Results under $OUT: kv_read.txt (times) and ncu.txt (sectors, bytes, durations).
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
rows=${1:-128} context=${2:-1152}
B=/tmp/cellm-kv-read
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCELLM_BUILD_TESTS=OFF "${prefix[@]}" \
  >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build $B -j "$(nproc)" --target kv_read_bench attention_bench >"$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/kv_read.txt"
$B/bench/kv_read_bench --rows "$rows" --context "$context" | tee -a "$OUT/kv_read.txt"
$B/bench/attention_bench --shapes "${rows}x$context" --budget "$((context + 128))" |
  tail -n 2 | tee -a "$OUT/kv_read.txt"
metrics=lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_op_read.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum
metrics=$metrics,gpu__time_duration.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed
for k in read_tile read_pair read_ldg read_bulk read_efbulk; do
  timeout 120 ncu --clock-control none -k "regex:$k" --launch-count 1 --metrics "$metrics" \
    $B/bench/kv_read_bench --rows "$rows" --context "$context" --iters 2 2>&1 |
    grep -E "^\s+(lts__|dram__|gpu__)" | sed "s/^/$k /"
done | tee "$OUT/ncu.txt"
timeout 120 ncu --clock-control none -k regex:attention_mma --launch-skip 5 --launch-count 1 \
  --metrics "$metrics" $B/bench/attention_bench --shapes "${rows}x$context" \
  --budget "$((context + 128))" 2>&1 | grep -E "^\s+(lts__|dram__|gpu__)" | sed "s/^/attention /" |
  tee -a "$OUT/ncu.txt"
