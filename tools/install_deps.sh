#!/usr/bin/env bash
# Installs what cellm needs to build and test on a fresh Debian machine: the
# toolchain and libraries from Debian, and the Python packages the tests use.
# Installs nothing that is already there. Run as root (or with sudo available).
set -euo pipefail

debs=(cmake ninja-build g++ pkg-config libgtest-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
      libcpp-httplib-dev)
# The fuzz targets (CELLM_FUZZ=ON): Debian's default clang and its runtime
# libraries (libclang-rt-dev: the sanitizer runtimes and libFuzzer).
debs+=(clang libclang-rt-dev)
missing=()
for p in "${debs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install_deps: apt-get install ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The serve tests (tests/serve, ctest -L serve) drive the server with the
# official OpenAI client under pytest; they skip themselves without it.
py_missing=()
for m in openai pytest; do
  python3 -c "import $m" >/dev/null 2>&1 || py_missing+=("$m")
done
if ((${#py_missing[@]})); then
  echo "install_deps: pip install ${py_missing[*]}"
  python3 -m pip install -q "${py_missing[@]}"
fi
