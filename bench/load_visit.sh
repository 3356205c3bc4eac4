#!/usr/bin/env bash
# One GPU visit on the serving load (`cellm bench --requests`): builds cellm for sm_90
# (bench/gpu_visit.sh none), runs every `gpu` test unless TESTS=0, then the 8B serving
# load at 16 and 64 clients with the step ahead and without it (`--no-overlap`),
# interleaved, PASSES times (default 1). Carry `.deps`; about 5 minutes.
#   bash bench/load_visit.sh
# Results under $OUT: gpu_tests.log, load.txt.
set -uo pipefail
B=/tmp/cellm-build
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
visit_build
visit_gpu_tests $B
for pass in $(seq "${PASSES:-1}"); do
  for v in overlap no-overlap; do
    extra=""
    [ $v = no-overlap ] && extra=" --no-overlap"
    bench_row $B/cellm "pass $pass load $v" \
      "load:--preset 8b -npl 16,64 --requests ${REQUESTS:-256}$extra" "$OUT/load.txt"
  done
done
