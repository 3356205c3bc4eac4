#!/usr/bin/env bash
# Installs what cellm needs to build and test on a fresh Debian machine: the
# toolchain and libraries from Debian, and the Python packages the tests use.
# Installs nothing that is already there. Run as root (or with sudo available).
set -euo pipefail

debs=(cmake ninja-build g++ pkg-config libgtest-dev nlohmann-json3-dev libpcre2-dev)
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
