// Element-type conversion on the device, for uploading weights: dst[i] = T(src[i]).
// f32 -> bf16 rounds to nearest even (as cpu::f32_to_bf16 and torch's .to(bfloat16));
// T = float is a copy.
//
// The launcher enqueues on `stream`, never allocates or synchronises (safe inside CUDA
// graph capture), and returns the launch error (cudaErrorInvalidValue for bad arguments).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

// src: [n] f32; dst: [n] T. REQUIRES: n >= 0; dst does not overlap src.
template <typename T>
cudaError_t launch_f32_to(const float* src, int64_t n, T* dst, cudaStream_t stream);

}  // namespace cellm::cuda
