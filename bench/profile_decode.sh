#!/usr/bin/env bash
# Per-kernel device times of the last decode steps on the GPU machine (after
# bench/gpu_visit.sh has built /tmp/cellm-build): runs `cellm bench` under
# Nsight Compute with one metric (gpu__time_duration), skipping the first SKIP
# kernels (warm-up, graph captures, prefill: they run unprofiled, at full
# speed), and summarizes the last decode steps with bench/ncu_summary.py.
#   bash bench/profile_decode.sh PRESET B SKIP [PP] [TG] [BENCH ARGS...]
# e.g. `bash bench/profile_decode.sh 8b 64 0 32 4 --no-gemm-tuning` (the tuner's timing
# means nothing under ncu, which serializes and replays every kernel).
set -uo pipefail
preset=${1:?preset}
b=${2:?batch}
skip=${3:?kernels to skip}
pp=${4:-128}
tg=${5:-10}
shift $(($# < 5 ? $# : 5))
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
csv="$OUT/ncu_${preset}_b${b}.csv"
timeout 500 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
  --launch-skip "$skip" /tmp/cellm-build/cellm bench --executor cuda --preset "$preset" \
  -npp "$pp" -ntg "$tg" -npl "$b" "$@" >"$csv" 2>"$OUT/ncu_${preset}_b${b}.log"
echo "== ncu $preset B=$b (exit $?)"
python3 "$(dirname "$0")/ncu_summary.py" "$csv" 2 | tee "$OUT/ncu_${preset}_b${b}.txt"
gzip -f "$csv"
