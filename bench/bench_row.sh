# shellcheck shell=bash
# Sourced by the visit scripts (ab_visit.sh, variant_visit.sh, ...): one `cellm bench` row set.
#   bench_row CELLM LABEL "NAME:BENCH ARGS" LOG
# runs CELLM bench --executor cuda with --peak-bandwidth 4250 --step-times, and -npp 128
# -ntg 128 unless the arguments give -npp; words like NAME=VALUE go to its environment.
# Appends "== LABEL: ..." and the whole output to LOG, and prints the table rows.
# Sourcing it also gives OUT its default (/tmp/cellm-out, the device tool's $OUT
# elsewhere) and creates it.
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
bench_row() {
  local cellm=$1 label=$2 row=$3 log=$4
  local words args=() envs=() shape=(-npp 128 -ntg 128) w
  # shellcheck disable=SC2206
  words=(${row#*:})
  for w in "${words[@]}"; do
    if [[ $w =~ ^[A-Z_]+= ]]; then envs+=("$w"); else args+=("$w"); fi
  done
  case " ${args[*]} " in *" -npp "*) shape=() ;; esac
  echo "== $label: ${envs[*]} ${args[*]}" | tee -a "$log"
  env "${envs[@]}" timeout 200 "$cellm" bench --executor cuda "${shape[@]}" \
    --peak-bandwidth 4250 --step-times "${args[@]}" 2>&1 | tee -a "$log" | grep -E "^\| +[0-9]"
}

# Builds cellm for a visit (bench/gpu_visit.sh none, into /tmp/cellm-build) with its logs
# kept aside, since the device tool brings back a handful of files; on failure prints
# the log's tail, copies it to $OUT/visit.log and exits the calling script.
visit_build() {
  OUT=/tmp/cellm-build-logs bash "$(dirname "${BASH_SOURCE[0]}")/gpu_visit.sh" none \
    >/tmp/cellm-visit.log 2>&1 ||
    { tail -30 /tmp/cellm-visit.log; cp /tmp/cellm-visit.log "$OUT/visit.log"; exit 1; }
}

# Runs every `gpu` test of the build in DIR (default /tmp/cellm-build) into
# $OUT/gpu_tests.log and prints its summary and the tests that did not pass; TESTS=0
# skips them.
visit_gpu_tests() {
  local dir=${1:-/tmp/cellm-build}
  [ "${TESTS:-1}" != 0 ] || return 0
  ctest --test-dir "$dir" -L gpu -j 8 --timeout 300 --output-on-failure >"$OUT/gpu_tests.log" 2>&1
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)" "$OUT/gpu_tests.log" | head -20
}
