#!/usr/bin/env bash
# One GPU visit for a change to the skinny GEMM (src/cuda/kernels/skinny_gemm.cu): builds
# the tree as bench/gpu_visit.sh does, runs its own test first (a wrong change shows as
# wrong sums there, in seconds), then its tables (`gemv_bench --skinny-only`, and
# `--skinny-shape` for SHAPES), then, per variant, `gemv_bench` alone built with other
# CUDA flags and the same tables, and last the `gpu` tests and the bench rows. Carry `.deps`.
#   bash bench/skinny_visit.sh [NAME=CUDA FLAGS]... [-- "ROWNAME:BENCH ARGS"...]
# e.g. bash bench/skinny_visit.sh "unroll1=-DCELLM_SKINNY_SUM_UNROLL=1" -- \
#        "8b:--preset 8b -npl 16,64" "long:--preset 8b -npp 1024 -ntg 256 -npl 128"
# Environment: SHAPES (default "4096,8448 4096,16896"), TESTS=0 to skip the `gpu` tests,
# NCU="K,N M RING" to profile one launch of that shape at M rows (RING 0 shared, 1
# whole-SM) with `ncu --set full` and source-level stall sampling (the report in $OUT).
# Results under $OUT: skinny_test.log, tables_NAME.txt, gpu_tests.log, bench.txt.
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
B=/tmp/cellm-build
variants=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do variants+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
t0=$(date +%s)
elapsed() { echo "[$(($(date +%s) - t0)) s]"; }

OUT=/tmp/cellm-build-logs bash "$(dirname "$0")/gpu_visit.sh" none >"$OUT/visit.log" 2>&1 ||
  { tail -30 "$OUT/visit.log"; exit 1; }
echo "build $(elapsed)"
timeout 200 $B/tests/cuda/cuda_skinny_gemm_test >"$OUT/skinny_test.log" 2>&1
rc=$?
echo "cuda_skinny_gemm_test exit $rc $(elapsed)"
grep -E "^\[ +(OK|FAILED) +\]|PASSED|FAILED" "$OUT/skinny_test.log" | tail -8
[ $rc = 0 ] || exit 1

# The skinny tables of one gemv_bench binary, into tables_NAME.txt.
tables() {
  local exe=$1 name=$2 shape_args=() s
  for s in ${SHAPES:-4096,8448 4096,16896}; do shape_args+=(--skinny-shape "$s"); done
  echo "== $name"
  {
    timeout 100 "$exe" --skinny-only
    timeout 100 "$exe" "${shape_args[@]}"
  } 2>&1 | tee "$OUT/tables_$name.txt" | grep -E "^[a-z0-9_]+ |^[0-9]+->"
}
tables $B/bench/gemv_bench main
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
for v in "${variants[@]}"; do
  name=${v%%=*} flags=${v#*=} dir=/tmp/cellm-v-${v%%=*}
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" -DCELLM_BUILD_TESTS=OFF \
    -DCMAKE_CUDA_FLAGS="$flags" >"$OUT/configure_$name.log" 2>&1 &&
    cmake --build "$dir" -j "$(nproc)" --target gemv_bench >"$OUT/build_$name.log" 2>&1 ||
    { echo "variant $name ($flags) did not build"; grep -E "error" "$OUT/build_$name.log" | head; continue; }
  echo "built $name ($flags) $(elapsed)"
  tables "$dir/bench/gemv_bench" "$name"
done

if [ -n "${NCU:-}" ]; then
  read -r shape rows ring <<<"$NCU"
  # gemv_bench launches each ring twice untimed, then six times per timing graph, for
  # each of 16, 32, 64, 128 rows in turn: skip to the untimed launch of (rows, ring).
  row_index=3
  [ "$rows" = 16 ] && row_index=0
  [ "$rows" = 32 ] && row_index=1
  [ "$rows" = 64 ] && row_index=2
  skip=$((row_index * 14 + ring))
  timeout 200 ncu --clock-control none --set full --import-source yes \
    --section SourceCounters --section WarpStateStats -k regex:skinny_gemm_kernel \
    --launch-skip "$skip" --launch-count 1 -o "$OUT/ncu_skinny" \
    $B/bench/gemv_bench --iters 1 --skinny-shape "$shape" >"$OUT/ncu.log" 2>&1
  echo "ncu $shape at $rows rows, ring $ring: exit $? $(elapsed)"
  ncu --import "$OUT/ncu_skinny.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>&1
  ncu --import "$OUT/ncu_skinny.ncu-rep" --page raw --csv >"$OUT/ncu_raw.csv" 2>&1
  grep -E "Duration|DRAM Throughput|SM Active|Warp Cycles Per Issued|Est. Speedup" \
    "$OUT/ncu_details.txt" | head -20
  # Where the warps wait: the stall reasons, largest first.
  python3 - "$OUT/ncu_raw.csv" <<'PY' | head -12
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((r for r in rows if "Kernel Name" in r), None)
data = rows[rows.index(head) + 2] if head else []
def number(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None
stalls = [(number(v), h) for h, v in zip(head or [], data)
          if "issue_stalled" in h and number(v) is not None]
for value, name in sorted(stalls, reverse=True):
    print(f"{value:8.2f}  {name}")
PY
fi

# shellcheck source=bench/bench_row.sh
. "$(dirname "$0")/bench_row.sh"
if [ "${TESTS:-1}" = 1 ]; then
  visit_gpu_tests $B
  echo "gpu tests $(elapsed)"
fi
for row in "$@"; do
  bench_row "$B/cellm" "${row%%:*}" "$row" "$OUT/bench.txt"
done
echo "done $(elapsed)"
