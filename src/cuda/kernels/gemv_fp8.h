// The decode GEMV over 8-bit float weights: y = scale · (x · w8ᵀ) (+ bias) for 1-8 rows,
// where w8 holds float8_e4m3fn codes (1 sign, 4 exponent bits with bias 7, 3 mantissa
// bits; no infinities) and scale one f32 per output channel. At 1-8 rows a linear layer
// is bound by reading its weights, so one byte per weight halves the bytes of the bf16
// GEMV (kernels/gemv.h) per step.
//
// Shapes (row-major, as PyTorch's Linear): x [m, k] (GemvInput::kPlain) or [m, 2k]
// (kSwiGLU: gate | up, x' = bf16(silu(gate) * up) exactly as launch_swiglu computes it),
// w8 [n, k] bytes, scale [n] f32 (a per-tensor scale is the same array filled with one
// value), bias [n] bf16 or null, y [m, n].
//
// Arithmetic: every e4m3 value is a bf16 value, so each weight is decoded to bf16 exactly
// (sign, exponent rebias and mantissa shift with integer operations, then an exact bf16
// multiply by 2^120 that also turns the e4m3 subnormals into normal bf16 values) and fed
// with x' to the bf16 tensor-core mma.m16n8k16 with f32 accumulation, as the bf16 GEMV's
// kTensorCores kernel does. The f32 sum s is then scaled and biased with one rounding,
// fma(s, scale[j], bias[j]), and rounded once to TOut. The summation order depends on
// (n, k, the SM count) only: a row of y is the same whatever m is, and every launch gives
// the same bits (no atomics).
//
// The two NaN codes of e4m3fn (0x7f, 0xff) are not weights: the decode maps them to ±480
// (not NaN), so a caller must refuse checkpoints that hold them (e4m3_is_nan).
//
// The launcher enqueues on `stream`, never allocates or synchronises (safe inside CUDA
// graph capture) and returns the launch error; a call outside the REQUIRES below returns
// cudaErrorInvalidValue and launches nothing. Launched with programmatic dependent launch
// (kernels/launch.cuh): each warp puts its first weight loads in flight before it waits
// for the previous kernel of the stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/gemv.h"

namespace cellm::cuda {

// True for the two NaN codes of float8_e4m3fn.
inline constexpr bool e4m3_is_nan(uint8_t code) {
  return (code & 0x7f) == 0x7f;
}

// True when launch_gemv_fp8 serves the shape: 1 <= m <= kGemvMaxRows, 0 < k < 2^24,
// k % 16 == 0, and x and w8 16-byte aligned (each 16-byte load of a weight row is then
// one aligned access of 16 whole columns, and each row of x starts 32-byte aligned).
inline bool gemv_fp8_supports(int64_t m, int64_t k, const void* x, const void* w8) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k < (int64_t{1} << 24) && k % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w8) % 16 == 0;
}

// y[i, j] = TOut(fma(sum_c x'[i, c] * decode(w8[j, c]), scale[j], bias[j] or 0)) for i in
// [0, m), j in [0, n). TOut is __nv_bfloat16 or float. REQUIRES: gemv_fp8_supports(m, k,
// x, w8), n > 0, input one of GemvInput's values, scale non-null; device pointers, y not
// overlapping x, w8, scale or bias; w8 free of NaN codes.
template <typename TOut>
cudaError_t launch_gemv_fp8(const __nv_bfloat16* x, int64_t m, int64_t k, GemvInput input,
                            const uint8_t* w8, const float* scale, int64_t n,
                            const __nv_bfloat16* bias, TOut* y, cudaStream_t stream);

// out[i] = the kernel's bf16 decode of codes[i], i in [0, count), with the same device
// function launch_gemv_fp8 uses (for tests). REQUIRES: count > 0, count % 4 == 0, codes
// 4-byte and out 8-byte aligned; device pointers.
cudaError_t launch_decode_e4m3(const uint8_t* codes, int64_t count, __nv_bfloat16* out,
                               cudaStream_t stream);

}  // namespace cellm::cuda
