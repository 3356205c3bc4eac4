// Rotary position embedding in Hugging Face's "rotate_half" (GPT-NeoX) layout:
// dimension i of the first half pairs with dimension i + rotary_dim/2.
//
//   cos[i] = cos(pos * inv_freq[i]), sin[i] = sin(pos * inv_freq[i])   (f32)
//   out[i]        = x[i] * cos[i] - x[i + half] * sin[i]
//   out[i + half] = x[i + half] * cos[i] + x[i] * sin[i]      for i < half
//
// with half = inv_freq.size() and rotary_dim = 2 * half <= head_dim; dimensions
// past rotary_dim pass through (HF's partial rotary). `rope_inv_freq` builds
// inv_freq once per model exactly as transformers does.
// Thread-safety: reentrant; `rope` runs on `pool`.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu {

// rope_scaling / rope_parameters of rope_type "llama3" (Llama 3.1 and later).
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// inv_freq[i] for i in [0, rotary_dim / 2), as transformers'
// `_compute_default_rope_parameters` (and, given llama3, `_compute_llama3_parameters`)
// compute it in f32: 1 / theta^(2i / rotary_dim), then the llama3 wavelength bands.
// REQUIRES: theta > 0, rotary_dim > 0 and even.
std::vector<float> rope_inv_freq(double theta, int64_t rotary_dim,
                                 const std::optional<Llama3RopeScaling>& llama3 = std::nullopt);

// Rotates q [m, n_heads, head_dim] and k [m, n_kv_heads, head_dim] in place, row i
// at position positions[i]. Either of q / k may be null (with its head count 0).
// REQUIRES: positions.size() == m, 2 * inv_freq.size() <= head_dim.
void rope(ThreadPool& pool, float* q, int64_t n_heads, float* k, int64_t n_kv_heads, int64_t m,
          int64_t head_dim, std::span<const int32_t> positions, std::span<const float> inv_freq);

}  // namespace cellm::cpu
