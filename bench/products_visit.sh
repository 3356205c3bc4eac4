#!/usr/bin/env bash
# One GPU visit on the 128-row products of the long B = 128 row (docs/PERFORMANCE.md,
# session 16: they add 133.5 us a layer against 102.6 of weight bytes). Is a 128-row
# product bound by the L2 (at 128 rows every block reads as many bytes of x from the L2
# as of weights), by its tensor cores, or by neither (ramp, tail, split-K)? Builds
# gemv_bench alone, times the skinny GEMM and cuBLASLt at 16-128 rows on the o, q/k/v and
# down shapes, then profiles each shape's 128-row launches under ncu (Speed Of Light:
# DRAM, L2 and SM throughput as fractions of their peaks; L2 read sectors, DRAM bytes).
# Carry `.deps`; about 3 minutes.
#   bash bench/products_visit.sh
# Results under $OUT: products.txt (times) and ncu_products.txt (one block a launch).
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
B=/tmp/cellm-products
prefix=()
[ -d .deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCELLM_BUILD_TESTS=OFF "${prefix[@]}" \
  >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build $B -j "$(nproc)" --target gemv_bench >"$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/products.txt"
shapes=("4096,4096" "4096,6144" "14336,4096")  # o, q/k/v, down (K,N)
args=()
for s in "${shapes[@]}"; do args+=(--skinny-shape "$s"); done
$B/bench/gemv_bench "${args[@]}" | tee -a "$OUT/products.txt"
metrics=lts__t_sectors_op_read.sum,dram__bytes_read.sum
show="Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Grid Size|lts__|dram__bytes"
for s in "${shapes[@]}"; do
  # The m = 128 launches of gemv_bench --skinny-shape come first for the 128-row kernel
  # (its shared and whole-SM rings, eager, before any timing); cuBLASLt's kernels of every
  # m are listed with their grid sizes, the 128-row ones last of their m's.
  echo "== $s skinny, 128 rows (shared ring, then whole-SM ring)"
  timeout 150 ncu --clock-control none --kernel-name-base demangled \
    -k "regex:skinny_gemm_kernel<16" --launch-count 2 --section SpeedOfLight \
    --section LaunchStats --metrics "$metrics" $B/bench/gemv_bench --iters 1 \
    --skinny-shape "$s" 2>&1 | grep -E "$show"
  echo "== $s cuBLASLt, eager launches of every m (16, 32, 64, 128)"
  timeout 150 ncu --clock-control none -k "regex:nvjet|gemm|splitK" --launch-count 40 \
    --section SpeedOfLight --section LaunchStats --metrics "$metrics" $B/bench/gemv_bench \
    --iters 1 --skinny-shape "$s" 2>&1 | grep -E "^  [a-zA-Z_].*\(|$show"
done | tee "$OUT/ncu_products.txt"
