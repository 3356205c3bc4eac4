// fp8_matmul: y = x · (s ⊙ W)ᵀ (+ bias) for W in float8_e4m3fn with one f32 scale per
// output row, the CPU executor's linear layer for FP8 weights (DType::kF8E4M3).
//
// Shapes (row-major): x [m, k] f32, w [n, k] e4m3 bytes, scales [n] f32, bias [n] in
// any float DType or absent, y [m, n] f32. y[i, j] = scales[j] * sum_c x[i, c] *
// e4m3(w[j, c]) + bias[j]: the row scale multiplies the f32 dot product once.
// Every e4m3 code decodes exactly (to f32 and to bf16), so the only rounding is the
// f32 sums' (and, with bf16_dot, x's rounding to bf16, as bf16 weights get).
//   m <= 4 (decode): each thread streams its band of W rows once, 1 byte a weight,
//     decoding each code once in registers and multiplying it into every row of x
//     (16-lane f32 sums). With AVX-512 VBMI 64 codes at a time by table: two
//     128-entry byte lookups (vpermi2b) give each code's bf16 bytes, one masked byte
//     permute per 16 values widens them to f32; with AVX-512 or AVX2+F16C 16 at a
//     time through f16 bits (exact, subnormals included); else a portable loop
//     (exponent rebias for normals, m * 2^-9 for subnormals). The instruction set is
//     the one this file is compiled for (-march).
//   m >= 5: each thread streams its band of W once in cache tiles (64 rows by 512
//     columns): a tile's codes are decoded once into f32 (exact; 128 KiB, held in L2)
//     and every row of x meets it there in 4 x 4 register tiles (the f32 FMAs of
//     cpu::matmul's bf16 path); the row scale multiplies each output once, after the
//     last column block.
//   bf16_dot (m >= 2, AVX-512 BF16): blocks of 256 W rows decoded to bf16 and
//     multiplied by bf16_dot_matmul (x rounded to bf16).
// Where W sits in cache the decode, not the bytes, bounds the product: about 1.5-1.7
// times bf16's time at m = 1-4 (bf16 widens with 2 instructions per 16 values), the
// same from m = 5; from memory the halved bytes win (a 49152 x 576 LM head: 0.9x).
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
