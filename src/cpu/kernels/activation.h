// The gated-MLP activation of Llama-family models: out = silu(gate) * up, with
// silu(x) = x / (1 + exp(-x)) as torch computes it, in f32.
// Thread-safety: reentrant; runs on `pool`.
#pragma once

#include <cstdint>

#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu {

// out[i] = silu(gate[i]) * up[i] for i in [0, n). out may equal gate or up.
// REQUIRES: n >= 0.
void silu_mul(ThreadPool& pool, const float* gate, const float* up, int64_t n, float* out);

// exp(x) for one f32, by the same polynomial silu_mul uses in its vector loop
// (within 2 ulp of std::exp over the f32 range); exposed for its test.
float fast_exp(float x);

// out[i] = fast_exp(x[i]) for i in [0, n), a vector at a time (the attention's
// softmax). out may equal x. REQUIRES: n >= 0.
void exp_array(const float* x, int64_t n, float* out);

}  // namespace cellm::cpu
