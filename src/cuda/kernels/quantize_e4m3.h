// The activation side of the FP8 products (fp8_gemm.h): rows of bf16 activations
// quantized to float8_e4m3fn with one f32 scale per row, and the output step of the
// product's fallback path (per-row times per-column scale, plus bias).
//
// launch_quantize_rows_e4m3, arithmetic (all f32, IEEE round to nearest even):
//   x'[i, c]  = x[i, c] (GemvInput::kPlain), or bf16(silu(gate) * up) (kSwiGLU: x is
//               [m, 2k], gate | up, computed exactly as launch_swiglu computes it: f32
//               silu_mul of the two bf16 values, one rounding to bf16)
//   amax[i]   = max_c |x'[i, c]| (NaN ignored, as fmaxf)
//   scale[i]  = amax[i] / 448 (one rounding), or 1 when amax[i] == 0
//   x8[i, c]  = e4m3(x'[i, c] / scale[i]): the quotient rounded once to f32, then to
//               the nearest e4m3 value (ties to even mantissa), saturating to ±448 (the
//               quotient can exceed 448 by the rounding of scale); a NaN input gives the
//               NaN code 0x7f/0xff, which no caller should feed the product.
// So x'[i, c] ≈ decode(x8[i, c]) * scale[i], the relative error of each element at most
// 2^-4 (3 mantissa bits) for values above the e4m3 subnormal range (2^-6 * scale).
//
// launch_scale_outer_e4m3, arithmetic: y[i, j] = TOut(fmaf(acc[i, j], x_scale[i] *
// w_scale[j], bias[j] or 0)), the scale product rounded once to f32, the fma once, then
// one rounding to TOut.
//
// Launchers enqueue on `stream`, never allocate or synchronise (safe inside CUDA graph
// capture), use programmatic dependent launch (kernels/launch.cuh), and return the launch
// error; a call outside REQUIRES returns cudaErrorInvalidValue and launches nothing.
// m = 0 launches nothing (after the checks of the other arguments).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/gemv.h"

namespace cellm::cuda {

// The largest finite e4m3fn magnitude.
inline constexpr float kE4m3Max = 448.0f;

// True when launch_quantize_rows_e4m3 serves the call: m >= 0, 0 < k < 2^30, k % 16 == 0,
// input kPlain or kSwiGLU, x and x8 16-byte aligned and non-null, scale 4-byte aligned
// and non-null.
bool quantize_rows_e4m3_supports(int64_t m, int64_t k, GemvInput input, const void* x,
                                 const void* x8, const void* scale);

// x: [m, k] bf16 (kPlain) or [m, 2k] (kSwiGLU); x8: [m, k] e4m3 codes; scale: [m] f32.
// REQUIRES: quantize_rows_e4m3_supports(...); device pointers; outputs overlap no input.
cudaError_t launch_quantize_rows_e4m3(const __nv_bfloat16* x, int64_t m, int64_t k, GemvInput input,
                                      uint8_t* x8, float* scale, cudaStream_t stream);

// acc: [m, n] f32 with leading dimension ld_acc (>= n); x_scale [m], w_scale [n] f32;
// bias [n] bf16 or null; y: [m, n] TOut (__nv_bfloat16 or float), leading dimension n.
// REQUIRES: m >= 0, n > 0, ld_acc >= n, acc, x_scale, w_scale, y non-null (when m > 0)
// and naturally aligned; y overlaps no input.
template <typename TOut>
cudaError_t launch_scale_outer_e4m3(const float* acc, int64_t ld_acc, int64_t m, int64_t n,
                                    const float* x_scale, const float* w_scale,
                                    const __nv_bfloat16* bias, TOut* y, cudaStream_t stream);

}  // namespace cellm::cuda
