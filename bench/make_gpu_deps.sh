#!/usr/bin/env bash
# Builds .deps/ (git-ignored): the headers and static libraries cellm needs
# (GoogleTest, nlohmann-json, PCRE2), copied from this Debian machine's packages
# with their CMake/pkg-config files, for the GPU machine's image, which lacks
# them. bench/gpu_visit.sh uses it when present; pass `.deps` in the device
# tool's `carry`. About 4 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
lib=/usr/lib/x86_64-linux-gnu
rm -rf .deps
mkdir -p .deps/include .deps/lib/x86_64-linux-gnu/cmake .deps/lib/x86_64-linux-gnu/pkgconfig \
  .deps/share/cmake
cp -r /usr/include/nlohmann /usr/include/gtest /usr/include/gmock /usr/include/pcre2.h .deps/include/
cp $lib/libgtest*.a $lib/libgmock*.a $lib/libpcre2-8.a .deps/lib/x86_64-linux-gnu/
cp -r $lib/cmake/GTest .deps/lib/x86_64-linux-gnu/cmake/
cp -r /usr/share/cmake/nlohmann_json .deps/share/cmake/
sed 's|^prefix=/usr|prefix=${pcfiledir}/../../..|' $lib/pkgconfig/libpcre2-8.pc \
  >.deps/lib/x86_64-linux-gnu/pkgconfig/libpcre2-8.pc
grep -qx '/.deps/' .git/info/exclude 2>/dev/null || echo '/.deps/' >>.git/info/exclude
du -sh .deps
