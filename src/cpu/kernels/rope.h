// Rotary position embedding in Hugging Face's "rotate_half" (GPT-NeoX) layout:
// dimension i of the first half pairs with dimension i + rotary_dim/2.
//
//   cos[i] = cos(pos * inv_freq[i]), sin[i] = sin(pos * inv_freq[i])   (f32)
//   out[i]        = x[i] * cos[i] - x[i + half] * sin[i]
//   out[i + half] = x[i + half] * cos[i] + x[i] * sin[i]      for i < half
//
// with half = inv_freq.size() and rotary_dim = 2 * half <= head_dim; dimensions
// past rotary_dim pass through (HF's partial rotary). inv_freq comes from the model
// layer (model/rope.h: rope_inv_freq, as transformers computes it).
// Thread-safety: reentrant; `rope` runs on `pool`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu {

// Rotates q [m, n_heads, head_dim] and k [m, n_kv_heads, head_dim] in place, row i
// at position positions[i]. Either of q / k may be null (with its head count 0).
// REQUIRES: positions.size() == m, 2 * inv_freq.size() <= head_dim.
void rope(ThreadPool& pool, float* q, int64_t n_heads, float* k, int64_t n_kv_heads, int64_t m,
          int64_t head_dim, std::span<const int32_t> positions, std::span<const float> inv_freq);

}  // namespace cellm::cpu
