#!/usr/bin/env bash
# A GPU visit that compares configurations: build, every `gpu` test, then one `cellm
# bench` row set per argument, then the kernel benches. Results in three files under
# $OUT (gpu_tests.log, bench.txt, micro.txt): the device tool brings back a handful.
#   bash bench/ab_visit.sh [--no-tests] [--no-micro] "NAME:BENCH ARGS" ...   (carry .deps)
# e.g. "8b:--preset 8b -npl 1,16,64,256" "8b_nopdl:--preset 8b -npl 1,16 --no-pdl".
# Every row runs as bench/bench_row.sh says: --peak-bandwidth 4250 --step-times, -npp 128
# -ntg 128 unless its arguments give -npp, words like NAME=VALUE in its environment.
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
B=/tmp/cellm-build
tests=1 micro=1
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do
  case $1 in
    --no-tests) tests=0 ;;
    --no-micro) micro=0 ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
  shift
done
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
visit_build
if [ $tests = 1 ]; then
  visit_gpu_tests $B
fi
for row in "$@"; do
  bench_row "$B/cellm" "${row%%:*}" "$row" "$OUT/bench.txt"
done
if [ $micro = 1 ]; then
  timeout 90 $B/bench/gemv_bench >>"$OUT/micro.txt" 2>&1
  timeout 60 $B/bench/attention_bench >>"$OUT/micro.txt" 2>&1
  cat "$OUT/micro.txt"
fi
