// The gated-MLP activation of Llama-family models on the fused gate_up projection:
//   out[i, j] = silu(gate[i, j]) * up[i, j],  silu(g) = g / (1 + expf(-g))   (f32)
// CPU twin: cpu::silu_mul (src/cpu/kernels/activation.h).
//
// The launcher enqueues on `stream`, never allocates or synchronises (safe inside CUDA
// graph capture), and returns the launch error (cudaErrorInvalidValue for bad arguments).
// m = 0 launches nothing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

// gate_up: [m, 2 * ff] T, gate in columns [0, ff), up in [ff, 2 ff); out: [m, ff] T.
// REQUIRES: m >= 0, ff > 0; out does not overlap gate_up.
template <typename T>
cudaError_t launch_swiglu(const T* gate_up, int64_t m, int64_t ff, T* out, cudaStream_t stream);

}  // namespace cellm::cuda
