// The matrix product of a few rows, y = x · wᵀ (+ bias), for decode: at 1-8 rows a
// linear layer is bound by reading its bf16 weights, so this kernel reads each weight
// once, 16 bytes per load with several loads in flight per thread, in one launch (no
// split-K reduction kernel), and can compute the SwiGLU activation of its input while it
// stages it (so the MLP's down projection needs no separate activation kernel).
//
// Shapes (row-major, as PyTorch's Linear): x [m, k] (kPlain) or [m, 2k] (kSwiGLU: per row
// gate in columns [0, k), up in [k, 2k), as launch_swiglu takes it), w [n, k], bias [n]
// or null, y [m, n]. For kSwiGLU the product's input is x'[i, c] = bf16(silu(gate[i, c])
// * up[i, c]) computed exactly as launch_swiglu computes it (kernels/swiglu.h), so the
// fused product equals launch_swiglu followed by a kPlain product bit for bit.
//
// Arithmetic: products and sums in f32 (bf16 tensor-core MMAs with f32 accumulation);
// the bias is added in f32 and the result rounded once to TOut. The summation order
// depends on (n, k) and the kernel (and its split) only: a row of y is the same whatever
// m is, and every launch gives the same bits (no atomics).
//
// The launcher enqueues on `stream`, never allocates or synchronises (safe inside CUDA
// graph capture), and returns the launch error; a call outside the REQUIRES below
// returns cudaErrorInvalidValue and launches nothing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

enum class GemvInput {
  kPlain,   // x' = x
  kSwiGLU,  // x' = bf16(silu(gate) * up), x = [gate | up]
};

// Which kernel serves a launch. Both read each weight once, in one launch, and give a row
// of y the same bits for every m; they differ in how a warp walks the weights (so their
// bits differ from each other):
//   kTensorCores  a warp owns 16 weight rows and feeds 8 of their columns per lane
//                 straight into bf16 mma.m16n8k16 (x rows are the MMA's N), splitting k
//                 over up to 16 warps; cheap arithmetic at every m up to kGemvMaxRows.
//   kRows         a warp owns kGemvRowsPerWarp whole weight rows (or a share of their
//                 columns, when a narrow n leaves too few warps to keep HBM busy) and reads
//                 512 contiguous bytes of each per load, with CUDA-core FMAs and a warp
//                 reduction at the end; the simplest stream for m = 1-2.
enum class GemvKernel { kTensorCores, kRows };

// Weight rows per warp of the kRows kernel.
inline constexpr int kGemvRowsPerWarp = 4;

// The kRows kernel's split: how many warps of a block share a group of kGemvRowsPerWarp
// rows, each taking an interleaved share of its columns (their sums are added in warp
// order). 0 lets launch_gemv choose from (n, k, the SM count); otherwise one of 1, 2, 4, 8.
// A larger split makes more, shorter blocks: the grid's last partial wave is shorter, and
// more of each warp's loads are in flight before it waits for the previous kernel, but x
// is read by more warps. Which wins depends on the shape, so Gemm's tuner times each.
inline constexpr int kGemvRowsAutoSplit = 0;
inline constexpr int kGemvRowsMaxSplit = 8;
inline bool gemv_rows_split_valid(int split) {
  return split == kGemvRowsAutoSplit ||
         (split >= 1 && split <= kGemvRowsMaxSplit && (split & (split - 1)) == 0);
}

// The most rows (m) one launch serves.
inline constexpr int64_t kGemvMaxRows = 8;

// True when launch_gemv serves the shape: 1 <= m <= kGemvMaxRows, 0 < k < 2^24,
// k % 8 == 0, and x and w 16-byte aligned (each 8-element load of a row is then one
// aligned 16-byte access; column offsets within 8 rows fit 32 bits).
inline bool gemv_supports(int64_t m, int64_t k, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k < (int64_t{1} << 24) && k % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

// y[i, j] = TOut(sum_c x'[i, c] * w[j, c] (+ bias[j])) for i in [0, m), j in [0, n).
// TOut is __nv_bfloat16 or float. REQUIRES: gemv_supports(m, k, x, w), n > 0, input one
// of GemvInput's values; device pointers, y not overlapping x, w or bias.
//
// `rows_split` is the kRows kernel's split (gemv_rows_split_valid; kGemvRowsAutoSplit for
// kTensorCores). A row of y has one summation order per (n, k, kernel, split).
//
// Launched with programmatic dependent launch (kernels/launch.cuh): each warp puts its
// first weight loads in flight before it waits for the previous kernel of the stream, so
// the weight stream starts while that kernel finishes.
template <typename TOut>
cudaError_t launch_gemv(const __nv_bfloat16* x, int64_t m, int64_t k, GemvInput input,
                        const __nv_bfloat16* w, int64_t n, const __nv_bfloat16* bias, TOut* y,
                        cudaStream_t stream, GemvKernel kernel = GemvKernel::kTensorCores,
                        int rows_split = kGemvRowsAutoSplit);

}  // namespace cellm::cuda
