// quant_matmul: y = x · Wᵀ (+ bias) with W in any GGUF weight type, the CPU
// executor's linear layer for quantized weights.
//
// Shapes (row-major): x [m, cols] f32, W [rows, cols] in `w.type`'s blocks (each
// row row_bytes(type, cols) bytes, as a GGUF tensor of ggml shape {cols, rows}
// lies in its file), bias [rows] in any DType or absent, y [m, rows] f32.
//
// The block types (Q4_0 .. Q8_0, Q4_K, Q5_K, Q6_K) stay in their blocks in
// memory. x is quantized once per call to 8 bits per value in blocks that line
// up with W's (32 values per f32 scale for Q4_0 .. Q8_0; 256 values per scale
// with per-16 sums, Q8_K-style, for the K-quants) and every row of W is dotted
// with every quantized row in integer arithmetic, scaled to f32 per block. The
// result differs from an f32 matmul of the dequantized W by the activations'
// rounding (about 0.4% of a block's largest value per value), as llama.cpp's does.
// BF16 weights go to bf16_dot_matmul (x rounded to bf16, AVX-512 BF16 dot
// products) on the AVX-512 path where the CPU has AVX-512 BF16; otherwise, and for
// F32 and F16, to cpu::matmul unchanged (x exact).
//
// Paths, chosen at run time from cpuid: AVX-512 VNNI, AVX2, or the portable
// scalar twin (every path computes the same integer sums; they differ only in
// the order of the f32 additions). Work is split over W's rows as cpu::matmul's
// is: each thread streams its own band of W once, every activation row meets each
// W tile while it is in L1.
// Thread-safety: reentrant; runs on `pool` and returns when y is complete.
#pragma once

#include <cstdint>
#include <span>

#include "cpu/kernels/convert.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/quant/block_formats.h"

namespace cellm::cpu::quant {

// A weight matrix [rows, cols] in one GGUF type, non-owning.
struct QuantWeights {
  const void* data = nullptr;
  QuantType type = QuantType::kF32;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features; a whole number of the type's blocks
};

// The instruction-set paths of the block-type kernels.
enum class QuantIsa { kScalar, kAvx2, kAvx512Vnni };
const char* to_string(QuantIsa isa);
bool isa_supported(QuantIsa isa);  // the CPU can run it
QuantIsa best_isa();               // the fastest supported path

// Whether quant_matmul accepts weights of `type` with `cols` columns; an error
// naming the type and the block size otherwise (Q8_K is not a weight type).
Status check_weights(QuantType type, int64_t cols);

// y[i, j] = sum_k x[i, k] * W[j, k] + (bias.data ? bias[j] : 0), on best_isa().
// REQUIRES: m >= 0; check_weights(w.type, w.cols) ok; y does not overlap x or W.
void quant_matmul(ThreadPool& pool, const float* x, int64_t m, const QuantWeights& w, TypedPtr bias,
                  float* y);

// The same on a chosen path (tests and benchmarks). REQUIRES: isa_supported(isa).
void quant_matmul(ThreadPool& pool, const float* x, int64_t m, const QuantWeights& w, TypedPtr bias,
                  float* y, QuantIsa isa);

// y[i, j] += bias[j] for i < m, j < n; nothing without a bias.
void add_bias(int64_t m, int64_t n, TypedPtr bias, float* y);

// One product of quant_matmul_shared: y [m, w.rows] = x · Wᵀ (+ bias).
struct QuantProduct {
  QuantWeights w;
  TypedPtr bias;
  float* y = nullptr;
};

// Several products of one x [m, cols] (a layer's q, k and v; gate and up): x quantized
// once per activation format the block types need, and the products' weight rows split
// over the pool's threads in one pass. Each y has the bits quant_matmul gives it alone;
// float-type weights go through quant_matmul one by one.
// REQUIRES: every w.cols equal, check_weights ok, no y overlapping x, a W or another y.
void quant_matmul_shared(ThreadPool& pool, const float* x, int64_t m,
                         std::span<const QuantProduct> products);
void quant_matmul_shared(ThreadPool& pool, const float* x, int64_t m,
                         std::span<const QuantProduct> products, QuantIsa isa);

}  // namespace cellm::cpu::quant
