#!/usr/bin/env bash
# Builds, tests, benchmarks and profiles cellm on a machine with an NVIDIA GPU (sm_90a).
# Run from anywhere inside the repository; `bench/gpu.sh -h` prints the usage.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-/tmp/cellm-gpu-build}
ARCH=${ARCH:-90a}
# The memory bandwidth `cellm bench` sets the TG phase against (TG_BW%), in GB/s.
PEAK_GBS=${PEAK_GBS:-4250}

usage() {
  cat <<EOF
usage: bench/gpu.sh COMMAND [ARGS]
(test, bench and profile build first when \$BUILD holds no build)

  build                 configure and build a Release tree for sm_$ARCH in \$BUILD (installs
                        the Debian build dependencies with tools/install_deps.sh when missing;
                        uses the prefix .deps/ when present, see \`deps\`)
  test [--all] [--memcheck]
                        ctest -L 'gpu|cuda' on \$BUILD (tests skip without a GPU); --all runs
                        every other suite as well; --memcheck adds compute-sanitizer memcheck
                        on the executor and attention tests
  sanitize              compute-sanitizer memcheck and synccheck on every executor test,
                        racecheck on every kernel test (SANITIZE_TESTS: the test binaries
                        for every tool, SANITIZE_FILTER: a gtest filter for all of them,
                        SANITIZE_TOOLS: some of the three tools, SANITIZE_TIMEOUT: seconds
                        a run, default 300)
  bench [PRESET [B,...]] [CELLM BENCH FLAGS...]
                        \`cellm bench --executor cuda --step-times --peak-bandwidth \$PEAK_GBS\`
                        with -npp 128 -ntg 128 unless the flags give -npp; no PRESET runs
                        the standard rows: 1b and 8b at B = 1,16,64,256
                        e.g. bench/gpu.sh bench 8b 64 --clocks
  profile [timeline|ncu|nsys] PRESET B [CELLM BENCH FLAGS...]
                        where a decode step's time goes: timeline (default) traces every
                        kernel of the graphs with bench/kernel_trace.cpp (CUPTI) and prints
                        the last whole decode step (bench/timeline_summary.py; PREFILL=1:
                        each prefill step by kernel family instead); ncu times each kernel
                        under Nsight Compute (serialised; SKIP=N kernels skipped first) and
                        sums the last decode steps (bench/ncu_summary.py); nsys writes an
                        Nsight Systems report with graph node tracing
  deps                  copies the headers and static libraries the build needs from this
                        Debian machine into .deps/ (git-ignored, ~4 MB) and .deps.tar.xz
                        (~0.7 MB, unpacked by build), for a GPU machine whose image lacks
                        them and cannot install them

environment: BUILD (the build tree, default /tmp/cellm-gpu-build), ARCH (the CUDA
architecture, default 90a), PEAK_GBS (default 4250), OUT (where logs and results go,
default /tmp/cellm-gpu-out).
EOF
}

# Where results go: $OUT when set, else a scratch folder.
out_dir() {
  local dir=${OUT:-/tmp/cellm-gpu-out}
  mkdir -p "$dir"
  echo "$dir"
}

# Builds first when $BUILD holds no build yet.
need_build() {
  if [ ! -x "$BUILD/cellm" ] || [ ! -f "$BUILD/CTestTestfile.cmake" ]; then
    cmd_build
  fi
}

cmd_build() {
  local out prefix=() generator=()
  out=$(out_dir)
  if [ ! -d "$ROOT/.deps" ] && [ -f "$ROOT/.deps.tar.xz" ]; then
    tar -xJf "$ROOT/.deps.tar.xz" -C "$ROOT"
  fi
  if [ -d "$ROOT/.deps" ]; then
    prefix=(-DCMAKE_PREFIX_PATH="$ROOT/.deps")
  else
    bash "$ROOT/tools/install_deps.sh" || echo "gpu.sh: tools/install_deps.sh failed; trying the build" >&2
  fi
  command -v ninja >/dev/null && generator=(-G Ninja)
  command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
  local t0
  t0=$(date +%s)
  if ! cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCELLM_CUDA_ARCHITECTURES="$ARCH" "${prefix[@]}" >"$out/configure.log" 2>&1; then
    tail -40 "$out/configure.log"
    exit 1
  fi
  if ! cmake --build "$BUILD" -j "$(nproc)" >"$out/build.log" 2>&1; then
    grep -E "error|Error" "$out/build.log" | head -40
    exit 1
  fi
  echo "build: $BUILD in $(($(date +%s) - t0)) s"
}

cmd_test() {
  local all=0 memcheck=0 out rc=0
  while [ $# -gt 0 ]; do
    case $1 in
      --all) all=1 ;;
      --memcheck) memcheck=1 ;;
      *) echo "gpu.sh test: unknown option $1" >&2; exit 2 ;;
    esac
    shift
  done
  need_build
  out=$(out_dir)
  ctest --test-dir "$BUILD" -L 'gpu|cuda' -j 4 --timeout 300 --output-on-failure \
    >"$out/gpu_tests.log" 2>&1 || rc=1
  grep -E "tests passed|tests failed|\((Failed|Timeout|SEGFAULT)\)|Subprocess aborted" \
    "$out/gpu_tests.log" | head -40
  if [ $all = 1 ]; then
    ctest --test-dir "$BUILD" -LE 'gpu|cuda' -j "$(nproc)" --output-on-failure \
      >"$out/cpu_tests.log" 2>&1 || rc=1
    grep -E "tests passed|tests failed|\((Failed|Timeout|SEGFAULT)\)" "$out/cpu_tests.log" | head -40
  fi
  if [ $memcheck = 1 ]; then
    local t
    for t in cuda_cuda_executor_test cuda_attention_decode_test cuda_attention_prefill_test; do
      [ -x "$BUILD/tests/cuda/$t" ] || continue
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/cuda/$t" \
        >"$out/memcheck_$t.log" 2>&1
      local e=$?
      [ $e = 0 ] || rc=1
      echo "memcheck $t: exit $e ($(grep -c 'Invalid' "$out/memcheck_$t.log") invalid accesses)"
    done
  fi
  return $rc
}

# compute-sanitizer's memcheck, racecheck and synccheck over the executor tests (the
# tests that run whole steps: graphs, overlap, processors, the prefix cache), each
# tool on each test binary; a report or a non-zero exit fails it. One line a run.
cmd_sanitize() {
  need_build
  local out rc=0 t tool e
  out=$(out_dir)
  local executor_tests="cuda_cuda_executor_test cuda_cuda_runner_test cuda_cuda_prefix_test cuda_cuda_logits_processor_test cuda_overlap_decode_test cuda_cuda_gguf_test"
  # Racecheck (shared memory) runs a step 100-1,000x slower: by default it takes the kernel
  # tests, whose launches hold every shared-memory kernel of a step at small shapes.
  local kernel_tests="cuda_attention_decode_test cuda_attention_prefill_test cuda_attention_split_test cuda_gemv_test cuda_gemv_fp8_test cuda_skinny_gemm_test cuda_fp8_gemm_test cuda_sampling_test cuda_elementwise_kernels_test cuda_kv_write_test cuda_rope_kv_write_test cuda_kv_e4m3_test cuda_quantize_e4m3_test cuda_vocab_gather_test cuda_logit_adjust_test"
  local filter=()
  [ -n "${SANITIZE_FILTER:-}" ] && filter=(--gtest_filter="$SANITIZE_FILTER")
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    local tests=$executor_tests
    [ "$tool" = racecheck ] && tests=$kernel_tests
    tests=${SANITIZE_TESTS:-$tests}
    for t in $tests; do
      [ -x "$BUILD/tests/cuda/$t" ] || { echo "$tool $t: no such test binary"; rc=1; continue; }
      timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        "$BUILD/tests/cuda/$t" "${filter[@]}" >"$out/${tool}_$t.log" 2>&1
      e=$?
      [ $e = 0 ] || rc=1
      echo "$tool $t: exit $e, $(grep -E -m1 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/${tool}_$t.log" \
        || echo 'no summary'), $(grep -E -c '\[  PASSED  \]' "$out/${tool}_$t.log") gtest pass line"
    done
  done
  return $rc
}

# Runs `cellm bench` once: NAME, then its arguments.
bench_row() {
  local name=$1 out
  shift
  out=$(out_dir)
  local shape=(-npp 128 -ntg 128)
  case " $* " in *" -npp "*) shape=() ;; esac
  echo "== $name: $*" | tee -a "$out/bench.txt"
  timeout 600 "$BUILD/cellm" bench --executor cuda "${shape[@]}" --peak-bandwidth "$PEAK_GBS" \
    --step-times "$@" 2>&1 | tee -a "$out/bench.txt" | grep -E "^\|"
}

cmd_bench() {
  need_build
  local preset="" batches=""
  if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then preset=$1 && shift; fi
  if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then batches=$1 && shift; fi
  local npl=(-npl "${batches:-1,16,64,256}")
  case " $* " in *" -npl "*) [ -z "$batches" ] && npl=() ;; esac
  if [ -z "$preset" ]; then
    for p in 1b 8b; do bench_row "$p" --preset "$p" "${npl[@]}" "$@"; done
  else
    bench_row "$preset" --preset "$preset" "${npl[@]}" "$@"
  fi
}

cmd_profile() {
  need_build
  local mode=timeline
  case ${1:-} in timeline | ncu | nsys) mode=$1 && shift ;; esac
  [ $# -ge 2 ] || { usage >&2; exit 2; }
  local preset=$1 b=$2 out name
  shift 2
  out=$(out_dir)
  name=${preset}_b$b
  local shape=(-npp 128 -ntg 32)
  case " $* " in *" -npp "*) shape=() ;; esac
  local row=(--executor cuda --preset "$preset" -npl "$b" "${shape[@]}" "$@")
  case $mode in
    timeline)
      local lib=$BUILD/bench/libkernel_trace.so trace=$out/kernel_trace_$name.csv
      [ -f "$lib" ] || { echo "gpu.sh: no $lib (the toolkit has no CUPTI?)" >&2; exit 1; }
      CUDA_INJECTION64_PATH=$lib CELLM_KERNEL_TRACE=$trace timeout 300 \
        "$BUILD/cellm" bench "${row[@]}" --step-times >"$out/bench_$name.log" 2>&1 ||
        { tail -5 "$out/bench_$name.log"; exit 1; }
      grep -E "^\| +[0-9]" "$out/bench_$name.log"
      python3 "$ROOT/bench/timeline_summary.py" ${PREFILL:+--prefill} "$trace" |
        tee "$out/timeline_$name.txt"
      ;;
    ncu)
      # One metric, the kernel's duration; the GEMM tuner's timing means nothing under ncu,
      # which serialises and replays every kernel, so tuning is off.
      local csv=$out/ncu_$name.csv
      timeout 580 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        --launch-skip "${SKIP:-0}" "$BUILD/cellm" bench "${row[@]}" --no-gemm-tuning \
        >"$csv" 2>"$out/ncu_$name.log"
      echo "== ncu $preset B=$b (exit $?)"
      python3 "$ROOT/bench/ncu_summary.py" "$csv" 2 | tee "$out/ncu_$name.txt"
      gzip -f "$csv"
      ;;
    nsys)
      timeout 580 nsys profile --cuda-graph-trace=node --force-overwrite true \
        -o "$out/nsys_$name" "$BUILD/cellm" bench "${row[@]}" >"$out/nsys_$name.log" 2>&1
      echo "== nsys $preset B=$b (exit $?): $out/nsys_$name.nsys-rep"
      nsys stats --report cuda_gpu_kern_sum "$out/nsys_$name.nsys-rep" 2>/dev/null | head -40
      ;;
  esac
}

cmd_deps() {
  cd "$ROOT" || exit 1
  bash tools/install_deps.sh
  local lib=/usr/lib/x86_64-linux-gnu
  rm -rf .deps
  mkdir -p .deps/include .deps/lib/x86_64-linux-gnu/cmake .deps/lib/x86_64-linux-gnu/pkgconfig \
    .deps/share/cmake
  cp -r /usr/include/nlohmann /usr/include/gtest /usr/include/gmock /usr/include/pcre2.h \
    /usr/include/utf8proc.h .deps/include/
  cp $lib/libgtest*.a $lib/libgmock*.a $lib/libpcre2-8.a $lib/libutf8proc.a \
    .deps/lib/x86_64-linux-gnu/
  cp -r $lib/cmake/GTest .deps/lib/x86_64-linux-gnu/cmake/
  cp -r /usr/share/cmake/nlohmann_json .deps/share/cmake/
  # shellcheck disable=SC2016 # ${pcfiledir} is pkg-config's, not the shell's
  local pc
  for pc in libpcre2-8 libutf8proc; do
    sed 's|^prefix=/usr|prefix=${pcfiledir}/../../..|' "$lib/pkgconfig/$pc.pc" \
      >".deps/lib/x86_64-linux-gnu/pkgconfig/$pc.pc"
  done
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.deps/' "$exclude" 2>/dev/null || echo '/.deps/' >>"$exclude"
  # The same, compressed (~0.7 MB against ~4.4 MB): what to carry to a device machine when
  # the tree is near the carry limit; cmd_build unpacks it where .deps is missing.
  tar -cJf .deps.tar.xz .deps
  grep -qx '/.deps.tar.xz' "$exclude" 2>/dev/null || echo '/.deps.tar.xz' >>"$exclude"
  du -sh .deps .deps.tar.xz
}

case ${1:-} in
  build | test | sanitize | bench | profile | deps)
    command=$1
    shift
    "cmd_$command" "$@"
    ;;
  -h | --help | help)
    usage
    ;;
  *)
    usage >&2
    exit 2
    ;;
esac
