#!/usr/bin/env bash
# Per-kernel device times of decode steps on the GPU machine (after
# bench/gpu_visit.sh has built /tmp/cellm-build): runs `cellm bench` under
# Nsight Compute with one metric (gpu__time_duration) and writes one CSV row
# per kernel to $OUT/ncu_<preset>_b<B>.csv. bench/ncu_summary.py groups the
# rows of the last decode steps by kernel name.
#   bash bench/profile_decode.sh PRESET B [PP] [TG]
set -uo pipefail
preset=${1:?preset}
b=${2:?batch}
pp=${3:-128}
tg=${4:-6}
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
timeout 500 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
  /tmp/cellm-build/cellm bench --executor cuda --preset "$preset" -npp "$pp" -ntg "$tg" -npl "$b" \
  >"$OUT/ncu_${preset}_b${b}.csv" 2>"$OUT/ncu_${preset}_b${b}.log"
echo "ncu $preset B=$b: exit $?, $(wc -l <"$OUT/ncu_${preset}_b${b}.csv") rows"
