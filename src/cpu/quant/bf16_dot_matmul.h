// bf16_dot_matmul: y = bf16(x) · Wᵀ for bf16 weights with the AVX-512 BF16 dot
// product (vdpbf16ps: 32 bf16 products per instruction summed into 16 f32 lanes,
// twice the multiply-adds of an f32 FMA), the weight layout of cpu::matmul.
//
// Shapes (row-major): x [m, k] f32, w [n, k] bf16, y [m, n] f32.
// Unlike cpu::matmul (which widens W and keeps x exact), x is rounded to bf16
// (nearest even) once per call, as llama.cpp does for bf16 weights: each product
// carries x's rounding, at most 2^-8 of it. That is quant_matmul's contract (it rounds
// activations for every block type), so quant_matmul sends BF16 weights here
// where the CPU has AVX-512 BF16; cpu::matmul's exact path stays for callers that
// need it.
// Work is split over n as cpu::matmul's: up to 16 rows of x (decode, bound by
// streaming W) each thread streams one band of W once; above that (prefill,
// compute-bound) the threads claim 32 W rows at a time. A tile of 4 W rows stays
// in L1 while a block of x rows passes over it.
// Thread-safety: reentrant; runs on `pool` and returns when y is complete.
#pragma once

#include <cstdint>
#include <span>

#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu::quant {

// Whether the CPU has AVX-512 BF16 (and the AVX-512 it builds on).
bool bf16_dot_supported();

// y[i, j] = sum_k bf16(x[i, k]) * w[j, k], in f32 by vdpbf16ps, or by the scalar
// twin (f32 sums of the same exact products) when `simd` is false.
// REQUIRES: m, k, n >= 0; bf16_dot_supported() when simd; y does not overlap x or w.
void bf16_dot_matmul(ThreadPool& pool, const float* x, int64_t m, int64_t k, const uint16_t* w,
                     int64_t n, float* y, bool simd = true);

// One product of bf16_dot_matmul_shared: y [m, n] = bf16(x) · wᵀ, w [n, k] bf16.
struct Bf16Product {
  const uint16_t* w = nullptr;
  int64_t n = 0;
  float* y = nullptr;
};

// Up to four products of one x [m, k] (a layer's q, k and v; gate and up): x rounded
// to bf16 once and the products' W rows split over the pool's threads in one pass, so
// the threads meet once rather than once a product. Each y has the bits
// bf16_dot_matmul gives it alone.
// REQUIRES: as bf16_dot_matmul's, for each product; at most four products; no y
// overlapping x, a w or another y.
void bf16_dot_matmul_shared(ThreadPool& pool, const float* x, int64_t m, int64_t k,
                            std::span<const Bf16Product> products, bool simd = true);

}  // namespace cellm::cpu::quant
