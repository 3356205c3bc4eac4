#!/usr/bin/env bash
# A GPU visit comparing builds that differ only in compile definitions (experiments
# behind a macro; the flags go to both the CUDA and the C++ compiler): every `gpu` test on the first variant's full build, then `cellm` alone
# for the others, then each bench row set on every variant, interleaved.
#   bash bench/variant_visit.sh "NAME=CUDA FLAGS" ... -- "ROWNAME:BENCH ARGS" ...   (carry .deps)
# e.g. bash bench/variant_visit.sh "new=-DMY_EXPERIMENT=1" "base=" -- "8b:--preset 8b -npl 1,16"
# (session 5 compared PDL trigger placements this way before they became a runtime choice).
# Results in $OUT/variants.txt (and gpu_tests.log); rows run as bench/bench_row.sh says;
# PASSES=2 runs them twice. TESTS=0 skips the `gpu` tests: a later call on a machine still
# warm, whose builds in /tmp/cellm-v-* are up to date, then goes straight to its rows.
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
variants=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do variants+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
first=1
for v in "${variants[@]}"; do
  name=${v%%=*} flags=${v#*=} dir=/tmp/cellm-v-${v%%=*}
  t0=$(date +%s)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" \
    -DCELLM_BUILD_TESTS="$([ $first = 1 ] && echo ON || echo OFF)" -DCMAKE_CUDA_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    >"$OUT/configure_$name.log" 2>&1 || { tail -20 "$OUT/configure_$name.log"; exit 1; }
  target=(--target cellm)
  [ $first = 1 ] && target=()
  cmake --build "$dir" -j "$(nproc)" "${target[@]}" >"$OUT/build_$name.log" 2>&1 ||
    { grep -E "error" "$OUT/build_$name.log" | head -30; exit 1; }
  echo "build $name ($flags): $(( $(date +%s) - t0 )) s"
  if [ $first = 1 ] && [ "${TESTS:-1}" != 0 ]; then
    visit_gpu_tests "$dir"
  fi
  first=0
done
for pass in $(seq "${PASSES:-1}"); do
  for row in "$@"; do
    for v in "${variants[@]}"; do
      name=${v%%=*}
      bench_row "/tmp/cellm-v-$name/cellm" "pass $pass ${row%%:*} $name" "$row" "$OUT/variants.txt"
    done
  done
done
