// RoPE inverse frequencies: model math every executor shares (the CPU executor
// rotates with them on the host, the CUDA executor uploads them once).
//
// inv_freq[i], i in [0, rotary_dim / 2), is computed exactly as transformers'
// `_compute_default_rope_parameters` (and, for rope type "llama3",
// `_compute_llama3_parameters`) compute it in f32, op by op, so that rotated q/k
// match the reference bit for bit.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "cellm/model_config.h"

namespace cellm {

// 1 / theta^(2i / rotary_dim), then, when scaling.type is kLlama3, the llama3
// wavelength bands (long wavelengths divided by factor, a smooth blend between).
// REQUIRES: theta > 0, rotary_dim > 0 and even.
std::vector<float> rope_inv_freq(double theta, int64_t rotary_dim,
                                 const RopeScaling& scaling = RopeScaling{});

// The model's: rope_theta over head_dim, with its rope_scaling.
std::vector<float> rope_inv_freq_for(const ModelConfig& config);

}  // namespace cellm
