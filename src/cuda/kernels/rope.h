// Rotary position embedding in Hugging Face's rotate_half (GPT-NeoX) layout, applied in
// place to the q and k heads of fused projection rows. For each row i, head, and
// j in [0, half) with half = head_dim / 2:
//   angle = float(positions[i]) * inv_freq[j]           (one f32 product, as transformers)
//   c = cosf(angle), s = sinf(angle)                    (precise, not the __cosf intrinsics)
//   x[j]        = x[j] * c - x[j + half] * s
//   x[j + half] = x[j + half] * c + x[j] * s
// with each product rounded to f32 before the sum (no FMA contraction), as torch's
// q * cos + rotate_half(q) * sin. CPU twin: cpu::rope (src/cpu/kernels/rope.h); build
// inv_freq with rope_inv_freq (model/rope.h).
//
// Launchers enqueue on `stream`, never allocate or synchronise (safe inside CUDA graph
// capture), and return the launch error (cudaErrorInvalidValue for bad arguments).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

// x: [m, row_stride] T, in place. Row i holds n_q_heads q heads of head_dim elements at
// [q_offset, q_offset + n_q_heads * head_dim) and n_kv_heads k heads at
// [k_offset, k_offset + n_kv_heads * head_dim). positions: [m] int32 (device);
// inv_freq: [head_dim / 2] f32 (device).
// REQUIRES: m >= 0, head counts >= 0, head_dim > 0 and even, the q and k ranges inside the
//           row and not overlapping.
template <typename T>
cudaError_t launch_rope(T* x, int64_t m, int64_t row_stride, int64_t q_offset, int64_t n_q_heads,
                        int64_t k_offset, int64_t n_kv_heads, int64_t head_dim,
                        const int32_t* positions, const float* inv_freq, cudaStream_t stream);

}  // namespace cellm::cuda
