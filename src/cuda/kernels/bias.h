// Adds a bias row to every row of a matrix product's output: y[i, j] = TOut(y[i, j] +
// bias[j]) in f32. Gemm uses it when cuBLASLt's BIAS epilogue cannot serve a call (the
// bias type differs from the output type, or no epilogue algorithm was found).
//
// The launcher enqueues on `stream`, never allocates or synchronises (safe inside CUDA
// graph capture), and returns the launch error (cudaErrorInvalidValue for bad arguments).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

// y: [m, n] TOut, row-major, in place; bias: [n] TBias.
// Instantiated for (TOut, TBias) = (float, float), (float, bf16), (bf16, bf16).
// REQUIRES: m >= 0, n > 0.
template <typename TOut, typename TBias>
cudaError_t launch_add_bias(TOut* y, int64_t m, int64_t n, const TBias* bias, cudaStream_t stream);

}  // namespace cellm::cuda
