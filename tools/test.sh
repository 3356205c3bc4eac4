#!/usr/bin/env bash
# Builds cellm and runs the whole test suite:
#   1. a release build and every test (GPU tests skip without a GPU);
#   2. the core, model, text, grammar, CPU and tools suites under AddressSanitizer + UndefinedBehaviorSanitizer
#      (the tools suite runs the sanitized `cellm` command as a child process);
#   3. the core suite under ThreadSanitizer.
# Each stage prints a ctest summary; the script fails on the first failing stage.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
jobs=$(nproc)

echo "== release build: all tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== ASan + UBSan: core, model, text, grammar, cpu and tools suites"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCELLM_SANITIZE=address >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L 'core|model|text|grammar|cpu|tools'

echo "== TSan: core suite"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCELLM_SANITIZE=thread >/dev/null
cmake --build build-tsan -j "$jobs" --target core_tests
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan --output-on-failure -j "$jobs" -L core
