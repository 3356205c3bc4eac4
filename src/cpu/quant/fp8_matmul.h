// fp8_matmul: y = x · (s ⊙ W)ᵀ (+ bias) for W in float8_e4m3fn with one f32 scale per
// output row, the CPU executor's linear layer for FP8 weights (DType::kF8E4M3).
//
// Shapes (row-major): x [m, k] f32, w [n, k] e4m3 bytes, scales [n] f32, bias [n] in
// any float DType or absent, y [m, n] f32. y[i, j] = scales[j] * sum_c x[i, c] *
// e4m3(w[j, c]) + bias[j]: the row scale multiplies the f32 dot product once.
// Every e4m3 code decodes exactly (to f32 and to bf16), so the only rounding is the
// f32 sums' (and, with bf16_dot, x's rounding to bf16, as bf16 weights get).
//   m == 1 (decode): each thread streams its band of W rows once, 1 byte a weight,
//     decoding 16 codes at a time in registers into 16-lane f32 sums per row of x:
//     with AVX-512 or AVX2+F16C the codes' bits become f16 bits (exact, subnormals
//     included, widened by the f16 -> f32 conversion), else a portable loop (exponent
//     rebias for normals, m * 2^-9 for subnormals: no denormal arithmetic). The
//     instruction set is the one this file is compiled for (-march).
//   m >= 2: each thread streams its band of W once in cache tiles (64 rows by 512
//     columns): a tile's codes are decoded once into f32 (exact; 128 KiB, held in L2)
//     and every row of x meets it there in 4 x 4 register tiles (the f32 FMAs of
//     cpu::matmul's bf16 path); the row scale multiplies each output once, after the
//     last column block. With bf16_dot (and AVX-512 BF16): blocks of 256 W rows are
//     decoded to bf16 and multiplied by bf16_dot_matmul (x rounded to bf16).
// fp8_matmul_scalar is the twin: table decode, f32 sums in order.
// Thread-safety: reentrant except that calls from one thread share its decode buffers
// (not reentrant from inside a pool task); runs on `pool`.
#pragma once

#include <cstdint>

#include "cpu/kernels/convert.h"
#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu::quant {

// A weight [rows, cols] of e4m3 codes with one f32 scale per row, non-owning.
struct Fp8Weights {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t rows = 0;  // output features (n)
  int64_t cols = 0;  // input features (k)
};

// y[i, j] = scales[j] * sum_c x[i, c] * e4m3(w[j, c]) + (bias.data ? bias[j] : 0).
// bf16_dot: round x to bf16 for the m >= 2 products (bf16_dot_matmul) where the CPU
// has AVX-512 BF16. REQUIRES: m >= 0; no NaN codes in w; y does not overlap x or w.
void fp8_matmul(ThreadPool& pool, const float* x, int64_t m, const Fp8Weights& w, TypedPtr bias,
                float* y, bool bf16_dot = false);

// The scalar twin of fp8_matmul (x exact, single thread).
void fp8_matmul_scalar(const float* x, int64_t m, const Fp8Weights& w, TypedPtr bias, float* y);

}  // namespace cellm::cpu::quant
